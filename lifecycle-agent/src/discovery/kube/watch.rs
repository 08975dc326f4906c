//! The watches: this node's pods (field selector `spec.nodeName=<node>`, kept in a reflector
//! store) and the kubelet's `Killing` events, whose message names the probe that failed.
//!
//! Credentials come from the in-cluster service account, else `--kubeconfig`/`KUBECONFIG`. The
//! watches resume by themselves with back-off after the API server goes away; the caller is told
//! through [`PodChange::Unreachable`] so that verdicts made meanwhile say they lacked the spec.

use std::{path::PathBuf, time::Duration};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Event as ApiEvent, Node, Pod};
use kube::{
    api::{Api, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{watcher, WatchStreamExt as _},
    Client, Config,
};

use crate::model::spec::{
    container_of_field_path, is_liveness_failure, kill_cause_from_message, KillNotice, LivenessFailure, PodRef,
};

/// How long the first contact may take before the agent goes on without the API.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the API cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    /// No in-cluster service account, no `--kubeconfig` and no `KUBECONFIG`.
    #[error("no Kubernetes credentials (not in a pod, and no --kubeconfig or KUBECONFIG)")]
    NotConfigured,
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from the configuration.
    #[error("cannot build a Kubernetes client")]
    Client(#[source] kube::Error),
    /// The API server did not answer the first list of this node's pods.
    #[error("the Kubernetes API did not answer listing the pods of node {node}")]
    Unreachable {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The first list took longer than allowed.
    #[error("the Kubernetes API did not answer within {0:?}")]
    Timeout(Duration),
    /// The Node object could not be read (`get nodes`, deploy/rbac.yaml).
    #[error("cannot read node {node} from the Kubernetes API")]
    Node {
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// A connected API client for one node.
#[derive(Clone)]
pub(crate) struct KubeSource {
    client: Client,
    node: String,
}

/// What the pod watch reports.
#[derive(Debug)]
pub(crate) enum PodChange {
    /// A (re)list starts: pods not re-announced before [`PodChange::Listed`] are gone.
    Relisting,
    /// A pod as it is now.
    Pod(Box<Pod>),
    /// The relist is complete.
    Listed,
    /// A pod left (deleted, or moved off the node).
    Gone(Box<Pod>),
    /// The watch failed; it resumes with back-off by itself.
    Unreachable(String),
}

impl KubeSource {
    /// The node's name: `--node-name`, else `NODE_NAME` (the DaemonSet sets it from the
    /// downward API), else the hostname.
    pub(crate) fn node_name(flag: Option<String>) -> String {
        flag.or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
            .unwrap_or_default()
    }

    /// Connects with in-cluster credentials, else the kubeconfig given or in `KUBECONFIG`, and
    /// proves the API answers by listing one pod of `node`.
    pub(crate) async fn connect(kubeconfig: Option<PathBuf>, node: String) -> Result<Self, KubeError> {
        let source = Self::configure(kubeconfig, node).await?;
        source.check().await?;
        Ok(source)
    }

    /// A client from the kubeconfig given, else in-cluster credentials, else the kubeconfig in
    /// `KUBECONFIG` (kubectl's order: a file named on the command line wins), without asking the
    /// API anything: the watches retry with back-off until it answers.
    pub(crate) async fn configure(kubeconfig: Option<PathBuf>, node: String) -> Result<Self, KubeError> {
        let config = match kubeconfig {
            Some(path) => from_kubeconfig(path).await?,
            None => match Config::incluster() {
                Ok(config) => config,
                Err(_) => match std::env::var_os("KUBECONFIG").filter(|path| !path.is_empty()) {
                    Some(path) => from_kubeconfig(PathBuf::from(path)).await?,
                    None => return Err(KubeError::NotConfigured),
                },
            },
        };
        let client = Client::try_from(config).map_err(KubeError::Client)?;
        Ok(Self { client, node })
    }

    /// Lists one pod of the node, within `CONNECT_TIMEOUT`: whether the API answers now.
    pub(crate) async fn check(&self) -> Result<(), KubeError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&self.node_selector()).limit(1);
        match tokio::time::timeout(CONNECT_TIMEOUT, pods.list(&params)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(KubeError::Unreachable { node: self.node.clone(), source }),
            Err(_) => Err(KubeError::Timeout(CONNECT_TIMEOUT)),
        }
    }

    /// The client, for writers (the event recorder).
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The node this source watches.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The kubelet's release as its Node object reports it (`status.nodeInfo.kubeletVersion`);
    /// None when the node has not reported one yet. Needs `get nodes`.
    pub(crate) async fn kubelet_version(&self) -> Result<Option<String>, KubeError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(CONNECT_TIMEOUT, nodes.get(&self.node)).await;
        let node = match answer {
            Ok(Ok(node)) => node,
            Ok(Err(source)) => return Err(KubeError::Node { node: self.node.clone(), source }),
            Err(_) => return Err(KubeError::Timeout(CONNECT_TIMEOUT)),
        };
        Ok(node.status.and_then(|s| s.node_info).map(|info| info.kubelet_version).filter(|v| !v.is_empty()))
    }

    fn node_selector(&self) -> String {
        format!("spec.nodeName={}", self.node)
    }

    /// This node's pods, as changes. No store of Pod objects is kept: each change is turned into
    /// the few facts the model uses and dropped (a pod's managedFields, env and annotations
    /// would otherwise stay pinned in memory for as long as it runs).
    pub(crate) fn pods(&self) -> impl Stream<Item = PodChange> + Send + 'static {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&self.node_selector());
        watcher(api, config).default_backoff().map(|event| match event {
            Ok(watcher::Event::Init) => PodChange::Relisting,
            Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod)) => PodChange::Pod(Box::new(pod)),
            Ok(watcher::Event::InitDone) => PodChange::Listed,
            Ok(watcher::Event::Delete(pod)) => PodChange::Gone(Box::new(pod)),
            Err(err) => PodChange::Unreachable(super::words::ApiWords(&err).to_string()),
        })
    }

    /// The kubelet's `Killing` events that name a failed probe, as kill notices. Events of pods
    /// on other nodes come too (events cannot be selected by node): the tracker ignores pods it
    /// does not know.
    pub(crate) fn kill_notices(&self) -> impl Stream<Item = Result<KillNotice, String>> + Send + 'static {
        let api: Api<ApiEvent> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields("involvedObject.kind=Pod,reason=Killing");
        let node = self.node.clone();
        watcher(api, config).default_backoff().applied_objects().filter_map(move |event| {
            let notice = match event {
                Ok(event) => kill_notice(&event, &node).map(Ok),
                Err(err) => Some(Err(super::words::ApiWords(&err).to_string())),
            };
            async move { notice }
        })
    }
}

impl KubeSource {
    /// The pods this node's kubelet announced it evicts (its `Evicted` Warning events, recorded
    /// before it kills the containers: node pressure, ephemeral storage, emptyDir `sizeLimit`).
    pub(crate) fn eviction_notices(&self) -> impl Stream<Item = Result<PodRef, String>> + Send + 'static {
        let api: Api<ApiEvent> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields("involvedObject.kind=Pod,reason=Evicted");
        let node = self.node.clone();
        watcher(api, config).default_backoff().applied_objects().filter_map(move |event| {
            let notice = match event {
                Ok(event) => eviction_notice(&event, &node).map(Ok),
                Err(err) => Some(Err(super::words::ApiWords(&err).to_string())),
            };
            async move { notice }
        })
    }
}

impl KubeSource {
    /// The kubelet's `Unhealthy` events that report a failed liveness probe, with the time the
    /// kubelet recorded the failure (the event's `lastTimestamp`, else its `eventTime`). Every
    /// failed probe of the cluster is such an event (readiness ones are dropped here, after the
    /// API sent them): the watch costs what the cluster's probe failures cost, which the
    /// kubelets' event rate limits bound (docs/kubelet-behaviour.md).
    pub(crate) fn liveness_failures(
        &self,
    ) -> impl Stream<Item = Result<(LivenessFailure, Option<std::time::SystemTime>), String>> + Send + 'static {
        let api: Api<ApiEvent> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields("involvedObject.kind=Pod,reason=Unhealthy");
        let node = self.node.clone();
        watcher(api, config).default_backoff().applied_objects().filter_map(move |event| {
            let failure = match event {
                Ok(event) => liveness_failure(&event, &node).map(|failure| {
                    let recorded = event
                        .last_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .or_else(|| event.event_time.as_ref().map(|t| t.0))
                        .map(std::time::SystemTime::from);
                    Ok((failure, recorded))
                }),
                Err(err) => Some(Err(super::words::ApiWords(&err).to_string())),
            };
            async move { failure }
        })
    }
}

/// The failed liveness probe in an `Unhealthy` event, if this node's kubelet reported it.
pub(crate) fn liveness_failure(event: &ApiEvent, node: &str) -> Option<LivenessFailure> {
    if !from_kubelet_of(event, node) || event.reason.as_deref() != Some("Unhealthy") {
        return None;
    }
    if !is_liveness_failure(event.message.as_deref()?) {
        return None;
    }
    let container = container_of_field_path(event.involved_object.field_path.as_deref()?)?;
    Some(LivenessFailure { pod: involved_pod(event)?, container: container.to_owned() })
}

/// A client configuration from a kubeconfig file (its current context).
async fn from_kubeconfig(path: PathBuf) -> Result<Config, KubeError> {
    let file = Kubeconfig::read_from(&path).map_err(|source| KubeError::Kubeconfig { path: path.clone(), source })?;
    Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|source| KubeError::Kubeconfig { path, source })
}

/// The pod in an `Evicted` event, if this node's kubelet reported it.
pub(crate) fn eviction_notice(event: &ApiEvent, node: &str) -> Option<PodRef> {
    if !from_kubelet_of(event, node) || event.reason.as_deref() != Some("Evicted") {
        return None;
    }
    involved_pod(event)
}

/// The pod an Event is about, by namespace, name and uid: all three must be a pod's for the
/// notice to count (the API server checks only the namespace against the Event's own, so the
/// uid alone could be any pod's).
fn involved_pod(event: &ApiEvent) -> Option<PodRef> {
    let object = &event.involved_object;
    Some(PodRef { namespace: object.namespace.clone()?, name: object.name.clone()?, uid: object.uid.clone()? })
}

/// Whether `event` was reported by the kubelet of `node`. Anyone allowed to create Events can
/// write a `Killing` event; one that does not name this node's kubelet as its reporter (the
/// events.k8s.io fields, else the core `source`) is not taken as the cause of a stop.
fn from_kubelet_of(event: &ApiEvent, node: &str) -> bool {
    let (component, host) = match event.reporting_component.as_deref().filter(|c| !c.is_empty()) {
        Some(component) => (Some(component), event.reporting_instance.as_deref()),
        None => {
            let source = event.source.as_ref();
            (source.and_then(|s| s.component.as_deref()), source.and_then(|s| s.host.as_deref()))
        }
    };
    component == Some("kubelet") && host == Some(node)
}

/// The kill notice in a `Killing` event, if this node's kubelet reported it and its message
/// names a probe.
pub(crate) fn kill_notice(event: &ApiEvent, node: &str) -> Option<KillNotice> {
    if !from_kubelet_of(event, node) {
        return None;
    }
    let (container, cause) = kill_cause_from_message(event.message.as_deref()?)?;
    Some(KillNotice { pod: involved_pod(event)?, container, cause })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::spec::StopCause;

    #[test]
    fn killing_events_for_probes_become_notices() {
        let event: ApiEvent = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1.17a", "namespace": "shop"},
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "shop", "uid": "u1",
                               "fieldPath": "spec.containers{app}"},
            "reason": "Killing",
            "message": "Container app failed liveness probe, will be restarted",
            "type": "Normal",
            "source": {"component": "kubelet", "host": "node-a"}
        }))
        .expect("an Event");
        assert_eq!(
            kill_notice(&event, "node-a"),
            Some(KillNotice {
                pod: PodRef { namespace: "shop".into(), name: "web-1".into(), uid: "u1".into() },
                container: "app".into(),
                cause: StopCause::LivenessProbe
            })
        );
        let mut deletion = event.clone();
        deletion.message = Some("Stopping container app".into());
        assert_eq!(kill_notice(&deletion, "node-a"), None);
    }

    #[test]
    fn killing_events_not_reported_by_this_nodes_kubelet_are_not_trusted() {
        // Issue 18: a `Killing` Event anyone can create rewrote a pod's stop cause.
        let forged = |source: serde_json::Value| -> ApiEvent {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-1.17a", "namespace": "shop"},
                "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "shop", "uid": "u1"},
                "reason": "Killing",
                "message": "Container app failed liveness probe, will be restarted",
                "source": source
            }))
            .expect("an Event")
        };
        assert_eq!(kill_notice(&forged(serde_json::json!({})), "node-a"), None, "no reporter");
        assert_eq!(kill_notice(&forged(serde_json::json!({"component": "tenant"})), "node-a"), None);
        let other_node = forged(serde_json::json!({"component": "kubelet", "host": "node-b"}));
        assert_eq!(kill_notice(&other_node, "node-a"), None, "another node's kubelet");
        let mut reported = forged(serde_json::json!({}));
        reported.reporting_component = Some("kubelet".into());
        reported.reporting_instance = Some("node-a".into());
        assert!(kill_notice(&reported, "node-a").is_some(), "the events.k8s.io reporter fields count too");
    }

    #[test]
    fn the_kubelets_liveness_failures_name_the_container() {
        let event = |message: &str, host: &str| -> ApiEvent {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "e"},
                "involvedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "u1", "fieldPath": "spec.containers{app}"},
                "reason": "Unhealthy",
                "message": message,
                "source": {"component": "kubelet", "host": host},
            }))
            .expect("event")
        };
        let pod = PodRef { namespace: "shop".into(), name: "web-1".into(), uid: "u1".into() };
        let failure = LivenessFailure { pod, container: "app".into() };
        assert_eq!(liveness_failure(&event("Liveness probe failed: HTTP 500", "node-a"), "node-a"), Some(failure));
        assert_eq!(liveness_failure(&event("Readiness probe failed: HTTP 500", "node-a"), "node-a"), None);
        assert_eq!(
            liveness_failure(&event("Liveness probe failed: HTTP 500", "node-b"), "node-a"),
            None,
            "another kubelet"
        );
    }

    #[test]
    fn the_kubelets_evicted_events_name_the_pod() {
        let event = |reason: &str, host: &str| -> ApiEvent {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "hog.17b", "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": "hog", "namespace": "default", "uid": "u9"},
                "reason": reason,
                "message": "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ",
                "source": {"component": "kubelet", "host": host}
            }))
            .expect("an Event")
        };
        assert_eq!(
            eviction_notice(&event("Evicted", "node-a"), "node-a"),
            Some(PodRef { namespace: "default".into(), name: "hog".into(), uid: "u9".into() })
        );
        assert_eq!(eviction_notice(&event("Evicted", "node-b"), "node-a"), None, "another node's kubelet");
        assert_eq!(eviction_notice(&event("Killing", "node-a"), "node-a"), None);
    }

    #[test]
    fn the_node_name_comes_from_the_flag_first() {
        assert_eq!(KubeSource::node_name(Some("node-a".into())), "node-a");
        assert!(!KubeSource::node_name(None).is_empty(), "NODE_NAME or the hostname");
    }
}
