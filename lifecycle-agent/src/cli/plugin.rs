//! `kubectl lifecycle`: the agents' answers from anywhere in the cluster, with the user's own
//! kubeconfig. It finds the pod's node and the agent pod on that node through the API, and
//! reaches that agent through the API server's pod proxy (`pods/proxy`, over HTTPS to the
//! agent), so what a user may do is decided twice with their own identity: by the API server
//! (`get pods/proxy` on the agent pods) and by the agent's `--api-auth kubernetes` (RBAC on
//! `lifecycle.dev`, from the user's token).
//!
//! The API server drops the `Authorization` header once it has authenticated a request, so the
//! token goes in `X-Lifecycle-Authorization`, which it passes on and the agent reads the same
//! way: the kubeconfig's token, token file or exec credential plugin's token, obtained by kube's
//! own auth layer. A kubeconfig that authenticates with a client certificate has no token to
//! pass: the plugin says so and takes `--token`/`--token-file`.

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{api::ListParams, Api, Client};
use serde_json::Value;
use tokio::sync::Semaphore;

use lifecycle_model::{
    explain,
    wire::{ContainersResponse, HistoryResponse},
};

use crate::cli::status::{percent_encoded, Selection};

/// The header that carries the user's bearer token through the API server's proxy.
pub(crate) const FORWARDED_AUTHORIZATION: &str = "x-lifecycle-authorization";

/// Where the agents run (deploy/daemonset.yaml).
#[derive(Clone, Debug)]
pub struct AgentLocation {
    pub namespace: String,
    /// Label selector of the agent pods.
    pub selector: String,
    pub port: u16,
}

impl Default for AgentLocation {
    fn default() -> Self {
        Self {
            namespace: "lifecycle-system".into(),
            selector: "app.kubernetes.io/name=lifecycle-agent".into(),
            port: 9890,
        }
    }
}

/// Why the plugin could not answer.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot reach the Kubernetes API with your kubeconfig")]
    Kube(#[from] kube::Error),
    #[error("cannot read {path}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "your kubeconfig has no bearer token to pass to the agent (a client certificate cannot be \
         passed through the API server's proxy): give one with --token or --token-file (for example \
         `kubectl create token <service-account>`; add `--audience lifecycle-agent` only when the \
         agents run with `--api-auth-audience lifecycle-agent`)"
    )]
    NoToken,
    #[error("your kubeconfig's credential plugin gave no token: {0}")]
    Credential(String),
    #[error("pod {namespace}/{pod} is not scheduled on a node yet")]
    NotScheduled { namespace: String, pod: String },
    #[error("no agent pod runs on node {node} (looked in namespace {namespace} for {selector})")]
    NoAgent { node: String, namespace: String, selector: String },
    #[error("the agent {agent} on node {node} did not answer")]
    Agent {
        agent: String,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the agent {agent} answered something that is not JSON")]
    NotJson { agent: String },
    #[error("the agents know no container or stop of pod {namespace}/{pod}")]
    Unknown { namespace: String, pod: String },
}

/// The bearer token to pass on: `--token`, `--token-file`, else the kubeconfig's.
pub async fn token(given: Option<String>, file: Option<PathBuf>) -> Result<String, PluginError> {
    if let Some(token) = given {
        return Ok(token);
    }
    if let Some(path) = file {
        return std::fs::read_to_string(&path)
            .map(|t| t.trim().to_owned())
            .map_err(|source| PluginError::TokenFile { path, source });
    }
    let config = kube::Config::infer().await.map_err(|err| PluginError::Kube(kube::Error::InferConfig(err)))?;
    kubeconfig_token(&config).await
}

/// The bearer token `config` authenticates with, obtained as kube's own client does: a token,
/// a token file, or an exec credential plugin (`aws eks get-token`, `gke-gcloud-auth-plugin`,
/// `kubelogin`: how most managed clusters' kubeconfigs authenticate). Basic auth and client
/// certificates give no bearer token.
pub(crate) async fn kubeconfig_token(config: &kube::Config) -> Result<String, PluginError> {
    use kube::client::ConfigExt as _;
    use tower::{Layer as _, ServiceExt as _};
    let Some(layer) = config.auth_layer().map_err(PluginError::Kube)? else {
        return Err(PluginError::NoToken);
    };
    // kube's auth layer sets `Authorization` on a request (running the exec plugin when one is
    // configured); a service that only keeps that header reads what it set.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let keep = seen.clone();
    let keeper = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
        let keep = keep.clone();
        async move {
            let header = request.headers().get(hyper::header::AUTHORIZATION).cloned();
            *keep.lock().unwrap_or_else(|poison| poison.into_inner()) = header;
            Ok::<_, tower::BoxError>(hyper::Response::new(()))
        }
    });
    layer
        .layer(keeper)
        .oneshot(hyper::Request::new(kube::client::Body::empty()))
        .await
        .map_err(|err| PluginError::Credential(err.to_string()))?;
    let header = seen.lock().unwrap_or_else(|poison| poison.into_inner()).take();
    let header = header.as_ref().and_then(|v| v.to_str().ok());
    match header.and_then(|v| v.strip_prefix("Bearer ")) {
        Some(token) if !token.trim().is_empty() => Ok(token.trim().to_owned()),
        _ => Err(PluginError::NoToken),
    }
}

/// The agent pod on `node`.
async fn agent_on(client: &Client, location: &AgentLocation, node: &str) -> Result<String, PluginError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &location.namespace);
    let params =
        ListParams::default().labels(&location.selector).fields(&format!("spec.nodeName={node},status.phase=Running"));
    let found = pods.list(&params).await?;
    found.items.into_iter().find_map(|p| p.metadata.name).ok_or_else(|| PluginError::NoAgent {
        node: node.to_owned(),
        namespace: location.namespace.clone(),
        selector: location.selector.clone(),
    })
}

/// GET `path_and_query` of agent pod `agent` through the API server's proxy, as JSON.
async fn ask(
    client: &Client,
    location: &AgentLocation,
    agent: &str,
    node: &str,
    path_and_query: &str,
    token: &str,
) -> Result<Value, PluginError> {
    let url =
        format!("/api/v1/namespaces/{}/pods/https:{agent}:{}/proxy{path_and_query}", location.namespace, location.port);
    let request = hyper::Request::get(url)
        .header(FORWARDED_AUTHORIZATION, format!("Bearer {token}"))
        .body(Vec::new())
        .map_err(|err| PluginError::Kube(kube::Error::HttpError(err)))?;
    let text = client.request_text(request).await.map_err(|source| PluginError::Agent {
        agent: agent.to_owned(),
        node: node.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|_| PluginError::NotJson { agent: agent.to_owned() })
}

/// What `kubectl lifecycle explain` asks about.
#[derive(Clone, Debug, Default)]
pub struct ExplainRequest {
    pub namespace: String,
    pub pod: String,
    /// The node the pod ran on, for a pod that is gone from the API (the verdict log or an
    /// Event says which); else looked up.
    pub node: Option<String>,
    pub container: Option<String>,
    /// Every stop the node kept, not only each container's last.
    pub all_instances: bool,
}

/// `kubectl lifecycle explain`: the stories of the pod, from the agent on its node.
pub async fn explain_pod(
    client: &Client,
    location: &AgentLocation,
    request: &ExplainRequest,
    token: &str,
) -> Result<Vec<explain::ContainerStory>, PluginError> {
    let (namespace, pod) = (request.namespace.as_str(), request.pod.as_str());
    let (node, container, all_instances) =
        (request.node.as_deref(), request.container.as_deref(), request.all_instances);
    let query = format!("namespace={}&pod={}", percent_encoded(namespace), percent_encoded(pod));
    let node = match node {
        Some(node) => node.to_owned(),
        None => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let Some(found) = pods.get_opt(pod).await? else {
                // Gone from the API, and with it the name of its node: every node's history.
                return explain_gone_pod(client, location, request, &query, token).await;
            };
            found
                .spec
                .and_then(|s| s.node_name)
                .ok_or_else(|| PluginError::NotScheduled { namespace: namespace.to_owned(), pod: pod.to_owned() })?
        }
    };
    let agent = agent_on(client, location, &node).await?;
    let mut stories = Vec::new();
    if !all_instances {
        let answer = ask(client, location, &agent, &node, &format!("/api/v1/containers?{query}"), token).await?;
        let answer: ContainersResponse = typed(answer, &agent)?;
        stories = explain::explain(&answer.containers, namespace, pod, container);
    }
    if stories.is_empty() {
        let answer = ask(client, location, &agent, &node, &format!("/api/v1/history?{query}"), token).await?;
        let answer: HistoryResponse = typed(answer, &agent)?;
        stories = explain::explain_history(&answer.stops, container);
    }
    if stories.is_empty() {
        return Err(PluginError::Unknown { namespace: namespace.to_owned(), pod: pod.to_owned() });
    }
    Ok(stories)
}

/// The stories of a pod the API no longer has, from the history of every node's agent (its
/// node is not known any more; the agents that never ran it answer nothing). A node that did not
/// answer is said on stderr; the stories found are the answer.
async fn explain_gone_pod(
    client: &Client,
    location: &AgentLocation,
    request: &ExplainRequest,
    query: &str,
    token: &str,
) -> Result<Vec<explain::ContainerStory>, PluginError> {
    let path = format!("/api/v1/history?{query}");
    let answers = ask_agents(client, location, None, &path, token, GONE_POD_TIMEOUT).await?;
    let mut stories = Vec::new();
    for NodeAnswer { node, answer } in answers {
        match answer {
            Ok(answer) => match typed::<HistoryResponse>(answer, &node) {
                Ok(answer) => stories.extend(explain::explain_history(&answer.stops, request.container.as_deref())),
                Err(err) => eprintln!("warning: node {node}: {}", crate::ErrorChain(&err)),
            },
            Err(err) => eprintln!("warning: node {node}: {}", crate::ErrorChain(&err)),
        }
    }
    if stories.is_empty() {
        return Err(PluginError::Unknown { namespace: request.namespace.clone(), pod: request.pod.clone() });
    }
    Ok(stories)
}

/// An agent's JSON answer read into the API's own types.
fn typed<T: serde::de::DeserializeOwned>(answer: Value, agent: &str) -> Result<T, PluginError> {
    serde_json::from_value(answer).map_err(|_| PluginError::NotJson { agent: agent.to_owned() })
}

/// How long each agent has to answer for a pod gone from the API.
const GONE_POD_TIMEOUT: Duration = Duration::from_secs(10);

/// One node's answer to `status`.
pub struct NodeAnswer {
    pub node: String,
    pub answer: Result<Value, PluginError>,
}

/// Agents asked at once by `status` across nodes.
pub(crate) const STATUS_CONCURRENCY: usize = 8;

/// What `kubectl lifecycle status` asks about.
#[derive(Clone, Debug, Default)]
pub struct StatusRequest {
    /// The containers to list (namespace, pod, container), as the agents filter them.
    pub selection: Selection,
    /// Only the agent of this node. A pod given without it is looked up: only its node's agent
    /// is asked.
    pub node: Option<String>,
}

/// `kubectl lifecycle status`: the selected containers from the agent on the pod's (or the
/// given) node, or from every agent, `STATUS_CONCURRENCY` at a time, each within `timeout`; a
/// node that did not answer says why. Sorted by node.
pub async fn status(
    client: &Client,
    location: &AgentLocation,
    request: &StatusRequest,
    token: &str,
    timeout: Duration,
) -> Result<Vec<NodeAnswer>, PluginError> {
    let node = match (&request.node, &request.selection) {
        (Some(node), _) => Some(node.clone()),
        (None, Selection { namespace: Some(namespace), pod: Some(pod), .. }) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let found = pods.get(pod).await?;
            let node = found.spec.and_then(|s| s.node_name);
            Some(node.ok_or_else(|| PluginError::NotScheduled { namespace: namespace.clone(), pod: pod.clone() })?)
        }
        (None, _) => None,
    };
    ask_agents(client, location, node, &request.selection.path(), token, timeout).await
}

/// GET `path` of the agent on `node`, or of every agent, `STATUS_CONCURRENCY` at a time, each
/// within `timeout`; sorted by node.
async fn ask_agents(
    client: &Client,
    location: &AgentLocation,
    node: Option<String>,
    path: &str,
    token: &str,
    timeout: Duration,
) -> Result<Vec<NodeAnswer>, PluginError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &location.namespace);
    let mut params = ListParams::default().labels(&location.selector);
    if let Some(node) = &node {
        params = params.fields(&format!("spec.nodeName={node}"));
    }
    let agents = pods.list(&params).await?;
    if agents.items.is_empty() {
        if let Some(node) = node {
            return Err(PluginError::NoAgent {
                node,
                namespace: location.namespace.clone(),
                selector: location.selector.clone(),
            });
        }
    }
    let path = Arc::new(path.to_owned());
    let limit = Arc::new(Semaphore::new(STATUS_CONCURRENCY));
    let mut asks = tokio::task::JoinSet::new();
    for agent in agents.items {
        let (Some(name), Some(node)) = (agent.metadata.name, agent.spec.and_then(|s| s.node_name)) else { continue };
        let (client, location, token, limit, path) =
            (client.clone(), location.clone(), token.to_owned(), limit.clone(), path.clone());
        asks.spawn(async move {
            let _turn = limit.acquire_owned().await;
            let answer = match tokio::time::timeout(timeout, ask(&client, &location, &name, &node, &path, &token)).await
            {
                Ok(answer) => answer,
                Err(_) => Err(PluginError::Agent {
                    agent: name.clone(),
                    node: node.clone(),
                    source: kube::Error::Service(format!("no answer within {timeout:?}").into()),
                }),
            };
            NodeAnswer { node, answer }
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = asks.join_next().await {
        if let Ok(answer) = done {
            answers.push(answer);
        }
    }
    answers.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig for a server that is never contacted, with `user` as its one user.
    async fn config_with_user(user: &str) -> kube::Config {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:1'}}}}]\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n\
             users: [{{name: u, user: {user}}}]\n"
        );
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("a kubeconfig");
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .expect("a config")
    }

    #[tokio::test]
    async fn the_token_comes_from_the_kubeconfig_as_kube_would_send_it() {
        // Managed clusters' kubeconfigs (EKS, GKE, AKS) name an exec credential plugin; the
        // token it prints is the one to pass on.
        let credential = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}"#;
        let exec = format!(
            "{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: sh, \
             args: ['-c', 'printf %s ''{credential}'''], interactiveMode: Never}}}}"
        );
        assert_eq!(kubeconfig_token(&config_with_user(&exec).await).await.expect("a token"), "from-exec");
        let token = config_with_user("{token: plain-token}").await;
        assert_eq!(kubeconfig_token(&token).await.expect("a token"), "plain-token");
        // Basic auth has no bearer token to pass on.
        let basic = config_with_user("{username: a, password: b}").await;
        assert!(matches!(kubeconfig_token(&basic).await, Err(PluginError::NoToken)));
        // A plugin that fails says so.
        let failing = "{exec: {apiVersion: client.authentication.k8s.io/v1, command: sh, \
                       args: ['-c', 'exit 3'], interactiveMode: Never}}";
        let err = kubeconfig_token(&config_with_user(failing).await).await.expect_err("no token");
        assert!(matches!(err, PluginError::Credential(_) | PluginError::Kube(_)), "{err}");
    }
}
