//! The agents: which pod is the agent on a node, checked before anything is sent to it, and
//! asking it through the API server's pod proxy (`pods/proxy`, HTTPS to the agent).
//!
//! What is sent is the token minted for the agents (`token.rs`), in `X-Lifecycle-Authorization`
//! (the API server keeps `Authorization` for itself): never the user's credential. It goes only
//! to pods that are the agents' DaemonSet's own on the node asked about: controlled by that
//! DaemonSet (its uid in the pod's controller reference), carrying its selector's labels and
//! service account, bound to that node and running. The API server's proxy does not check the
//! agent's certificate (as for every pod), so this is where the plugin checks who it talks to.
//! Several nodes are asked only when the user asks for them (`-A`, `--all-nodes`, a namespace's
//! nodes), at most [`CONCURRENCY`] at a time, each within the request timeout.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
use kube::{api::ListParams, Api, Client};
use serde_json::Value;
use tokio::sync::Semaphore;

use lifecycle_model::wire::FORWARDED_AUTHORIZATION;

use crate::cluster::{code, words};

/// Agents asked at once when several nodes are.
pub const CONCURRENCY: usize = 8;

/// Where the agents run (deploy/daemonset.yaml).
#[derive(Clone, Debug)]
pub struct Location {
    pub namespace: String,
    /// The agents' DaemonSet.
    pub daemonset: String,
    /// The agents' `--listen` port.
    pub port: u16,
}

/// Why the agents could not be found or asked.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    /// The agents' DaemonSet could not be read: nothing proves which pods are the agents.
    #[error(
        "cannot read the agents' DaemonSet {namespace}/{name}, which says which pods are the agents: {said} (you need \
         `get daemonsets` there: the lifecycle-plugin-user Role in deploy/rbac.yaml)"
    )]
    DaemonSet { namespace: String, name: String, said: String },
    /// Listing the agent pods failed.
    #[error("cannot list the agent pods in {namespace}: {said}")]
    List { namespace: String, said: String },
    /// No pod of the DaemonSet runs on the node.
    #[error("no agent runs on node {node} (no running pod of DaemonSet {namespace}/{daemonset} there)")]
    NoAgent { node: String, namespace: String, daemonset: String },
    /// The agent (or the proxy) answered with an error: its words, and what to do.
    #[error("the agent on node {node} ({agent}) answered {said}{}", hint(*.code))]
    Refused { agent: String, node: String, said: String, code: Option<u16> },
    /// No answer within the request timeout.
    #[error("the agent on node {node} ({agent}) did not answer within {}s", timeout.as_secs_f64())]
    Timeout { agent: String, node: String, timeout: Duration },
    /// The answer is not the agent's API.
    #[error("the agent on node {node} ({agent}) answered something that is not the agent's API")]
    NotTheApi { agent: String, node: String },
}

/// What to do about a refusal, per status (401, 403, 503 are the agent's; the proxy's own are
/// said in its words).
fn hint(code: Option<u16>) -> &'static str {
    match code {
        Some(401) => {
            " (the agent took no token from this request: do the agents run with --api-auth-audience lifecycle-agent, \
             and does --agent-audience match it?)"
        }
        Some(403) => {
            " (the API server or the agent refused: you need `get pods/proxy` on the agent pods, and the reader \
             account needs the lifecycle-api-reader ClusterRole: deploy/rbac.yaml)"
        }
        Some(503) => " (the agent cannot reach the Kubernetes API server to check the token; try again shortly)",
        _ => "",
    }
}

/// One agent pod, checked to be the DaemonSet's on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent {
    pub pod: String,
    pub node: String,
}

/// Finds and asks the agents.
#[derive(Clone)]
pub struct Agents {
    client: Client,
    location: Location,
    token: Arc<str>,
    timeout: Duration,
}

impl Agents {
    pub fn new(client: Client, location: Location, token: String, timeout: Duration) -> Self {
        Self { client, location, token: token.into(), timeout }
    }

    /// The checked agents on `nodes`, or on every node when `nodes` is None, sorted by node. A
    /// node named without an agent is an error; pods that are not the DaemonSet's are left out.
    pub async fn on(&self, nodes: Option<&[String]>) -> Result<Vec<Agent>, AgentsError> {
        let location = &self.location;
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), &location.namespace);
        let daemonset = daemonsets.get(&location.daemonset).await.map_err(|err| AgentsError::DaemonSet {
            namespace: location.namespace.clone(),
            name: location.daemonset.clone(),
            said: words(&err),
        })?;
        let selector = selector(&daemonset);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &location.namespace);
        let mut params = ListParams::default().labels(&selector);
        if let Some([node]) = nodes {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        let listed = pods
            .list(&params)
            .await
            .map_err(|err| AgentsError::List { namespace: location.namespace.clone(), said: words(&err) })?;
        let mut by_node: BTreeMap<String, Agent> = BTreeMap::new();
        for pod in &listed.items {
            if let Some(agent) = checked(pod, &daemonset) {
                by_node.entry(agent.node.clone()).or_insert(agent);
            }
        }
        match nodes {
            None => Ok(by_node.into_values().collect()),
            Some(nodes) => nodes
                .iter()
                .map(|node| {
                    by_node.get(node).cloned().ok_or_else(|| AgentsError::NoAgent {
                        node: node.clone(),
                        namespace: location.namespace.clone(),
                        daemonset: location.daemonset.clone(),
                    })
                })
                .collect(),
        }
    }

    /// GET `path_and_query` of `agent` through the API server's proxy, within the timeout, as
    /// JSON.
    pub async fn ask(&self, agent: &Agent, path_and_query: &str) -> Result<Value, AgentsError> {
        let location = &self.location;
        let url = format!(
            "/api/v1/namespaces/{}/pods/https:{}:{}/proxy{path_and_query}",
            location.namespace, agent.pod, location.port
        );
        let refused = |err: kube::Error| AgentsError::Refused {
            agent: agent.pod.clone(),
            node: agent.node.clone(),
            said: words(&err),
            code: code(&err),
        };
        let request = hyper_request(&url, &self.token).map_err(|err| refused(kube::Error::HttpError(err)))?;
        let text = match tokio::time::timeout(self.timeout, self.client.request_text(request)).await {
            Ok(answer) => answer.map_err(refused)?,
            Err(_) => {
                return Err(AgentsError::Timeout {
                    agent: agent.pod.clone(),
                    node: agent.node.clone(),
                    timeout: self.timeout,
                })
            }
        };
        serde_json::from_str(&text)
            .map_err(|_| AgentsError::NotTheApi { agent: agent.pod.clone(), node: agent.node.clone() })
    }

    /// GET `path` of each of `agents`, [`CONCURRENCY`] at a time; sorted by node.
    pub async fn ask_each(&self, agents: Vec<Agent>, path: &str) -> Vec<(Agent, Result<Value, AgentsError>)> {
        let path: Arc<str> = path.into();
        let limit = Arc::new(Semaphore::new(CONCURRENCY));
        let mut asks = tokio::task::JoinSet::new();
        for agent in agents {
            let (this, limit, path) = (self.clone(), limit.clone(), path.clone());
            asks.spawn(async move {
                let _turn = limit.acquire_owned().await;
                let answer = this.ask(&agent, &path).await;
                (agent, answer)
            });
        }
        let mut answers = Vec::new();
        while let Some(done) = asks.join_next().await {
            if let Ok(answer) = done {
                answers.push(answer);
            }
        }
        answers.sort_by(|a, b| a.0.node.cmp(&b.0.node));
        answers
    }
}

/// A GET of `url` on the API server carrying the minted token for the agent.
fn hyper_request(url: &str, token: &str) -> Result<http::Request<Vec<u8>>, http::Error> {
    http::Request::get(url).header(FORWARDED_AUTHORIZATION, format!("Bearer {token}")).body(Vec::new())
}

/// The DaemonSet's pod selector as a label selector (`key=value,...`).
fn selector(daemonset: &DaemonSet) -> String {
    let labels = daemonset.spec.selector.match_labels.clone().unwrap_or_default();
    labels.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
}

/// `pod` as an agent, if it is one of `daemonset`'s: controlled by it (kind, name and uid), with
/// its selector's labels and its service account, bound to a node and running.
pub fn checked(pod: &Pod, daemonset: &DaemonSet) -> Option<Agent> {
    let meta = &pod.metadata;
    let controlled = meta.owner_references.iter().flatten().any(|owner| {
        owner.controller == Some(true)
            && owner.kind == "DaemonSet"
            && owner.api_version == "apps/v1"
            && Some(&owner.name) == daemonset.metadata.name.as_ref()
            && Some(&owner.uid) == daemonset.metadata.uid.as_ref()
    });
    let wanted = daemonset.spec.selector.match_labels.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    let labelled = !wanted.is_empty() && wanted.iter().all(|(key, value)| labels.get(key) == Some(value));
    let spec = pod.spec.as_ref()?;
    let account = |name: &Option<String>| name.clone().unwrap_or_else(|| "default".to_owned());
    let template_account = daemonset.spec.template.spec.as_ref().map(|spec| account(&spec.service_account_name));
    let same_account = template_account.is_some_and(|wanted| account(&spec.service_account_name) == wanted);
    let running = pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running");
    let deleting = meta.deletion_timestamp.is_some();
    match (controlled && labelled && same_account && running && !deleting, &meta.name, &spec.node_name) {
        (true, Some(name), Some(node)) => Some(Agent { pod: name.clone(), node: node.clone() }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemonset() -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lifecycle-agent", "namespace": "lifecycle-system", "uid": "ds-uid"},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "lifecycle-agent"}},
                "template": {"spec": {"serviceAccountName": "lifecycle-agent", "containers": []}}
            }
        }))
        .expect("a DaemonSet")
    }

    fn agent_pod() -> Value {
        serde_json::json!({
            "metadata": {
                "name": "lifecycle-agent-x7k2p", "namespace": "lifecycle-system",
                "labels": {"app.kubernetes.io/name": "lifecycle-agent"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lifecycle-agent",
                                     "uid": "ds-uid", "controller": true}]
            },
            "spec": {"nodeName": "node-1", "serviceAccountName": "lifecycle-agent", "containers": []},
            "status": {"phase": "Running"}
        })
    }

    fn check(pod: Value) -> Option<Agent> {
        checked(&serde_json::from_value(pod).expect("a Pod"), &daemonset())
    }

    #[test]
    fn only_the_daemonsets_own_running_pod_on_a_node_is_an_agent() {
        // Issue 37 item 1: the plugin sent the user's token to whatever pod carried the label.
        assert_eq!(check(agent_pod()), Some(Agent { pod: "lifecycle-agent-x7k2p".into(), node: "node-1".into() }));
        let mutated = |change: &dyn Fn(&mut Value)| {
            let mut pod = agent_pod();
            change(&mut pod);
            check(pod)
        };
        // A pod anyone labelled so, with no controller, or another DaemonSet's of the same name.
        assert_eq!(mutated(&|p| p["metadata"]["ownerReferences"] = serde_json::json!([])), None);
        assert_eq!(mutated(&|p| p["metadata"]["ownerReferences"][0]["uid"] = "other".into()), None);
        assert_eq!(mutated(&|p| p["metadata"]["ownerReferences"][0]["controller"] = false.into()), None);
        assert_eq!(mutated(&|p| p["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet".into()), None);
        // Without the selector's labels, with another identity, not running, being deleted, unbound.
        assert_eq!(mutated(&|p| p["metadata"]["labels"] = serde_json::json!({})), None);
        assert_eq!(mutated(&|p| p["spec"]["serviceAccountName"] = "default".into()), None);
        assert_eq!(mutated(&|p| p["status"]["phase"] = "Pending".into()), None);
        assert_eq!(mutated(&|p| p["metadata"]["deletionTimestamp"] = "2026-11-29T03:00:00Z".into()), None);
        assert_eq!(mutated(&|p| p["spec"]["nodeName"] = Value::Null), None);
    }

    #[test]
    fn the_selector_is_the_daemonsets() {
        assert_eq!(selector(&daemonset()), "app.kubernetes.io/name=lifecycle-agent");
    }
}
