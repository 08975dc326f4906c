//! Where a pod ran once it is gone from the API: the cluster keeps the kubelet's Events for it
//! (an hour by default), and each names the node in `source.host` and `reportingInstance`. The
//! plugin asks those nodes' agents only; asking every node is for when the user says so
//! (`--all-nodes`): on a cluster of a thousand nodes a lookup miss, a typo included, must not cost
//! a thousand requests.

use k8s_openapi::api::core::v1::Event;
use kube::{api::ListParams, Api, Client};

use crate::cluster::words;

/// Most nodes one gone pod is looked for on: a pod name reused by successive pods (a StatefulSet's)
/// may have run on a few, newest first.
pub const MAX_NODES: usize = 4;

/// Why the Events could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot list the Events of pod {namespace}/{pod}: {said}")]
pub struct EventsError {
    namespace: String,
    pod: String,
    said: String,
}

/// The nodes whose kubelet reported Events about pod `namespace/pod`, the most recent first
/// (at most [`MAX_NODES`]); empty when the cluster kept none.
pub async fn nodes_of(client: &Client, namespace: &str, pod: &str) -> Result<Vec<String>, EventsError> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("involvedObject.kind=Pod,involvedObject.name={pod}"));
    let listed = events.list(&params).await.map_err(|err| EventsError {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        said: words(&err),
    })?;
    Ok(kubelet_nodes(&listed.items))
}

/// The nodes named by the kubelet's Events among `events`, newest Event first, each once.
pub fn kubelet_nodes(events: &[Event]) -> Vec<String> {
    let mut named: Vec<(Option<k8s_openapi::jiff::Timestamp>, String)> = events
        .iter()
        .filter_map(|event| {
            // The kubelet writes its node in both places (`reportingInstance` since 1.19);
            // other components' Events (the scheduler's) name no node they ran on.
            let from_kubelet = event.reporting_component.as_deref() == Some("kubelet")
                || event.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet");
            let node = event
                .reporting_instance
                .clone()
                .filter(|n| !n.is_empty() && event.reporting_component.as_deref() == Some("kubelet"))
                .or_else(|| event.source.as_ref().and_then(|s| s.host.clone()))
                .filter(|n| !n.is_empty())?;
            from_kubelet.then(|| (when(event), node))
        })
        .collect();
    named.sort_by_key(|named| std::cmp::Reverse(named.0));
    let mut nodes: Vec<String> = Vec::new();
    for (_, node) in named {
        if !nodes.contains(&node) && nodes.len() < MAX_NODES {
            nodes.push(node);
        }
    }
    nodes
}

/// When an Event last happened (None sorts oldest).
fn when(event: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    event
        .last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(component: &str, host: Option<&str>, reporting: Option<(&str, &str)>, at: &str) -> Event {
        let mut value = serde_json::json!({
            "metadata": {"name": "web-1.17f", "namespace": "shop"},
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "shop"},
            "source": {"component": component},
            "lastTimestamp": at,
        });
        if let Some(host) = host {
            value["source"]["host"] = host.into();
        }
        if let Some((component, instance)) = reporting {
            value["reportingComponent"] = component.into();
            value["reportingInstance"] = instance.into();
        }
        serde_json::from_value(value).expect("an Event")
    }

    #[test]
    fn the_kubelets_events_name_the_nodes_newest_first() {
        // Issue 41: `explain` of a pod gone from the API asked every node.
        let events = [
            event("default-scheduler", None, None, "2026-11-29T03:00:00Z"),
            event("kubelet", Some("node-7"), None, "2026-11-29T03:00:01Z"),
            event("kubelet", Some("node-7"), Some(("kubelet", "node-7")), "2026-11-29T03:00:05Z"),
            // The pod's name reused later on another node (a StatefulSet's).
            event("kubelet", Some("node-9"), Some(("kubelet", "node-9")), "2026-11-29T03:10:00Z"),
            // Only the new field, as events.k8s.io writers fill it.
            event("", None, Some(("kubelet", "node-3")), "2026-11-29T02:00:00Z"),
        ];
        assert_eq!(kubelet_nodes(&events), ["node-9", "node-7", "node-3"]);
        assert!(kubelet_nodes(&events[..1]).is_empty(), "the scheduler names no node it ran on");
    }
}
