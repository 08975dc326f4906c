//! The agent's JSON API on `--listen`: `/api/v1/containers` (every unit's view, or those a
//! `namespace`, `pod` or `container_id` parameter selects), `/api/v1/history` (a pod's past
//! stops, kept after it is gone) and
//! `/api/v1/probe/<namespace>/<pod>/<container>` (the probe answer for people, scripts and
//! host-network pods: declared checks only, 403 otherwise). `/metrics` and `/healthz` are served
//! by `http.rs`.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Serialize;
use tokio::sync::watch;

use super::http::ApiHandler;
use crate::{
    discovery::clock::{boottime, wall_clock},
    export::{explain, explain_html},
    model::{
        node::{NodeSnapshot, Unit},
        wire::{at::WallClock, ContainersResponse, HistoryResponse},
    },
    probe::{metrics::ProbeTarget, query::Query, CheckSpec, NodeProbes},
};

pub(super) struct ContainersApi {
    pub(super) snapshots: watch::Receiver<Arc<NodeSnapshot>>,
    pub(super) probes: Arc<NodeProbes>,
    /// The node's name, for the `/explain` page's title.
    pub(super) node: String,
}

impl ContainersApi {
    /// The model as last published; held for one answer, never across an await.
    fn snapshot(&self) -> Arc<NodeSnapshot> {
        self.snapshots.borrow().clone()
    }
}

/// Stops the `/explain` node page lists at most (newest first).
const NODE_PAGE_STOPS: usize = 200;

impl ApiHandler for ContainersApi {
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)> {
        if let Some(target) = path.strip_prefix("/api/v1/probe/") {
            return Some(self.probe(target, query));
        }
        if path == "/api/v1/history" {
            return Some(self.history(query));
        }
        if path == "/explain" {
            return Some(self.node_page());
        }
        if let Some(target) = path.strip_prefix("/explain/") {
            return Some(self.pod_page(target));
        }
        if path != "/api/v1/containers" {
            return None;
        }
        let selection = match Selection::parse(query) {
            Ok(selection) => selection,
            Err(reason) => return Some((StatusCode::BAD_REQUEST, serde_json::json!({ "error": reason }).to_string())),
        };
        let now = boottime();
        let snapshot = self.snapshot();
        let containers = snapshot.containers_where(now, |unit| selection.selects(unit));
        let pods = match selection.is_everything() {
            true => snapshot.pods(now),
            false => {
                let uids: std::collections::HashSet<&str> = containers.iter().map(|c| c.labels.uid.as_str()).collect();
                snapshot.pods_where(now, |uid| uids.contains(uid))
            }
        };
        drop(snapshot);
        let clock = wall_clock();
        Some(answer(clock, &ContainersResponse { boot_to_unix_seconds: clock.offset_seconds(), now, containers, pods }))
    }
}

/// `body` as the API writes it (times in `clock`), or the error that kept it from being written.
fn answer(clock: WallClock, body: &impl Serialize) -> (StatusCode, String) {
    match clock.writing(|| serde_json::to_string(body)) {
        Ok(json) => (StatusCode::OK, json),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, serde_json::json!({ "error": err.to_string() }).to_string()),
    }
}

/// What a `/api/v1/containers` request selects: the units of one `namespace`, one `pod` (with
/// `namespace`, or by name in any), the containers of one name (`container`, as `kubectl -c`),
/// or one container by `container_id` (the full id or a prefix,
/// as crictl takes it). Without parameters, every unit: a client after one container need not
/// be sent the whole node. The pods listed are those of the containers selected.
#[derive(Debug, Default, PartialEq, Eq)]
struct Selection {
    namespace: Option<String>,
    pod: Option<String>,
    container: Option<String>,
    container_id: Option<String>,
}

impl Selection {
    fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut query = Query::parse(query).map_err(|err| err.to_string())?;
        let selection = Selection {
            namespace: query.take("namespace"),
            pod: query.take("pod"),
            container: query.take("container"),
            container_id: query.take("container_id"),
        };
        if let Some((unknown, _)) = query.params().first() {
            return Err(format!(
                "unknown parameter {unknown:?}; namespace, pod, container and container_id select containers"
            ));
        }
        for (name, value) in [
            ("namespace", &selection.namespace),
            ("pod", &selection.pod),
            ("container", &selection.container),
            ("container_id", &selection.container_id),
        ] {
            if value.as_deref().is_some_and(str::is_empty) {
                return Err(format!("{name} is empty"));
            }
        }
        Ok(selection)
    }

    fn is_everything(&self) -> bool {
        *self == Selection::default()
    }

    fn selects(&self, unit: &Unit) -> bool {
        let is = |wanted: &Option<String>, have: &str| wanted.as_deref().is_none_or(|w| w == have);
        let labels = unit.labels();
        is(&self.namespace, &labels.namespace)
            && is(&self.pod, &labels.pod)
            && is(&self.container, &labels.container)
            && self
                .container_id
                .as_deref()
                .is_none_or(|wanted| unit.container_id().is_some_and(|id| id.starts_with(wanted)))
    }
}

impl ContainersApi {
    /// A JSON value as the API writes it (times as RFC 3339 with their `_boot_ns` beside):
    /// `build` serializes with the wall clock set.
    fn api_json(build: impl FnOnce() -> serde_json::Value) -> serde_json::Value {
        wall_clock().writing(build)
    }

    /// `GET /explain/<namespace>/<pod>`: the pod's stories as a page (each container's last stop,
    /// or, for a pod whose containers are gone, every stop the node kept).
    fn pod_page(&self, target: &str) -> (StatusCode, String) {
        // Namespaces and pod names are DNS labels and subdomains: no encoding to undo.
        let Some((namespace, pod)) = target.split_once('/').filter(|(n, p)| !n.is_empty() && !p.contains('/')) else {
            return (StatusCode::NOT_FOUND, explain_html::pod_page("?", "?", &[]));
        };
        let (namespace, pod) = (namespace.to_owned(), pod.to_owned());
        let now = boottime();
        let (containers, past) = {
            let snapshot = self.snapshot();
            let containers = snapshot.containers_where(now, |unit| {
                let labels = unit.labels();
                labels.namespace == namespace && labels.pod == pod
            });
            (containers, snapshot.history_of_pod(&namespace, &pod))
        };
        let current = Self::api_json(|| serde_json::json!({ "containers": containers }));
        let mut stories = explain::explain(&current, &namespace, &pod, None);
        if stories.is_empty() {
            stories = explain::explain_history(&Self::api_json(|| serde_json::json!({ "stops": past })), None);
        }
        (StatusCode::OK, explain_html::pod_page(&namespace, &pod, &stories))
    }

    /// `GET /explain`: the node's recent stops, newest first.
    fn node_page(&self) -> (StatusCode, String) {
        let recent = self.snapshot().recent_stops(NODE_PAGE_STOPS);
        let stories = explain::explain_history(&Self::api_json(|| serde_json::json!({ "stops": recent })), None);
        (StatusCode::OK, explain_html::node_page(&self.node, &stories))
    }

    /// `GET /api/v1/history?namespace=<ns>&pod=<name>`: every stop of the pod's containers the
    /// node kept, for a pod deleted long ago too. Both parameters are needed (the history of a
    /// whole node is what the verdict log is for).
    fn history(&self, query: Option<&str>) -> (StatusCode, String) {
        let bad = |reason: &str| (StatusCode::BAD_REQUEST, serde_json::json!({ "error": reason }).to_string());
        let selection = match Selection::parse(query) {
            Ok(selection) => selection,
            Err(reason) => return bad(&reason),
        };
        let (Some(namespace), Some(pod), None) = (&selection.namespace, &selection.pod, &selection.container_id) else {
            return bad("history needs namespace and pod (and no container_id)");
        };
        let stops = self.snapshot().history_of_pod(namespace, pod);
        let clock = wall_clock();
        answer(clock, &HistoryResponse { boot_to_unix_seconds: clock.offset_seconds(), stops })
    }

    /// `GET /api/v1/probe/<namespace>/<pod>/<container>?check=<tcp|process|file|all>&...`: the same
    /// answer the pod's own probe listener gives, for people, scripts and host-network pods.
    fn probe(&self, target: &str, query: Option<&str>) -> (StatusCode, String) {
        // Only a declared check of a known container answers: the rest is 403 with no detail,
        // like the pod listener's. A request without check= is the one usage error (400).
        let Ok(mut query) = Query::parse(query) else { return forbidden(self.probes.forbidden()) };
        let Some(check) = query.take("check") else {
            return (StatusCode::BAD_REQUEST, "add check=tcp|process|file|all to the query\n".to_owned());
        };
        let mut parts = target.trim_end_matches('/').splitn(3, '/');
        let (Some(namespace), Some(pod), Some(container)) = (parts.next(), parts.next(), parts.next()) else {
            return forbidden(self.probes.forbidden());
        };
        let Ok(spec) = CheckSpec::from_query(&check, &query) else { return forbidden(self.probes.forbidden()) };
        let target = ProbeTarget { namespace: namespace.into(), pod: pod.into(), container: container.into() };
        let (code, body) = self.probes.answer_check(&target, &spec);
        (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
    }
}

fn forbidden((_, body): (u16, String)) -> (StatusCode, String) {
    (StatusCode::FORBIDDEN, body)
}

// The tests feed the tracker events for the state they then render; the outcomes (routed by the
// agent, `agent/owner.rs`) are not what they examine.
#[cfg(test)]
#[allow(unused_must_use)]
mod tests {
    use super::*;

    use lifecycle_testkit::fixtures::running_container;

    use crate::model::{
        event::{CgroupDetail, Detail, Event},
        node::{NodeTracker, TrackerConfig},
    };

    /// Two running containers: `aaaa…` in shop/web, `bbbb…` in shop/db.
    fn api() -> ContainersApi {
        let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
        let pods = [("a", "web", 1u64), ("b", "db", 2)];
        let metas = pods
            .iter()
            .map(|(digit, pod, n)| {
                let uid = format!("00000000-0000-0000-0000-{n:012}");
                running_container(&digit.repeat(64), &uid, "shop", pod, &format!("{pod}-main"))
            })
            .collect();
        tracker.set_metadata(metas);
        for (digit, _, n) in pods {
            let cgroup = 100 + n;
            let path = format!("/kubepods/besteffort/pod00000000-0000-0000-0000-{n:012}/{}", digit.repeat(64));
            let event = |time, tgid, cgroup_id, detail| Event { time_ns: time, pid: tgid, tgid, cgroup_id, detail };
            tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(CgroupDetail { id: cgroup, path, truncated: false })));
            let exec = Detail::Exec {
                parent_tgid: 1,
                parent_cgroup_id: 1,
                namespace_init: true,
                child_pid_namespace: true,
                start_time_ns: 2,
                comm: "app".into(),
            };
            tracker.apply(&event(2, 1000 + n as u32, cgroup, exec));
        }
        ContainersApi {
            snapshots: watch::channel(Arc::new(tracker.snapshot())).1,
            probes: Arc::new(NodeProbes::new(None)),
            node: "node-a".into(),
        }
    }

    /// (status, container ids, pod names) of a `/api/v1/containers` answer.
    fn ask(api: &ContainersApi, query: Option<&str>) -> (StatusCode, Vec<String>, Vec<String>) {
        let (status, body) = api.get("/api/v1/containers", query).expect("served");
        let json: serde_json::Value = serde_json::from_str(&body).expect("json");
        let strings = |list: &str, field: &str| -> Vec<String> {
            json[list].as_array().into_iter().flatten().filter_map(|v| v[field].as_str().map(str::to_owned)).collect()
        };
        (status, strings("containers", "container_id"), strings("pods", "pod"))
    }

    #[test]
    fn a_request_selects_containers_by_namespace_pod_container_or_id_prefix() {
        let api = api();
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let everything = ask(&api, None);
        assert_eq!(everything.0, StatusCode::OK);
        assert_eq!(everything.1.len(), 2, "{everything:?}");
        assert_eq!(ask(&api, Some("container_id=aaaaaaaaaaaa")), (StatusCode::OK, vec![a.clone()], vec!["web".into()]));
        assert_eq!(ask(&api, Some("namespace=shop&pod=db")), (StatusCode::OK, vec![b.clone()], vec!["db".into()]));
        assert_eq!(ask(&api, Some("pod=web")), (StatusCode::OK, vec![a], vec!["web".into()]));
        assert_eq!(ask(&api, Some("namespace=other")), (StatusCode::OK, vec![], vec![]));
        assert_eq!(ask(&api, Some("container=db-main")), (StatusCode::OK, vec![b.clone()], vec!["db".into()]));
        assert_eq!(ask(&api, Some("namespace=shop&pod=db&container=web-main")), (StatusCode::OK, vec![], vec![]));
    }

    #[test]
    fn an_answer_has_its_times_in_rfc3339_and_reads_back_as_the_apis_types() {
        use crate::model::{container_state::ContainerState, time::BootTime};
        let (status, body) = api().get("/api/v1/containers", None).expect("served");
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).expect("json");
        let state = &json["containers"][0]["state"];
        assert_eq!(state["started_at_boot_ns"], 2, "{state}");
        let text = state["started_at"].as_str().expect("a time as text");
        let wall: jiff::Timestamp = text.parse().expect("RFC 3339");
        let offset = json["boot_to_unix_seconds"].as_f64().expect("the offset");
        assert!((wall.as_nanosecond() as f64 / 1e9 - offset).abs() < 1e-3, "{text} is boot + 2 ns, not {offset}");
        let typed: ContainersResponse = serde_json::from_str(&body).expect("the API's types read the API");
        assert_eq!(typed.containers.len(), 2);
        assert!(
            typed
                .containers
                .iter()
                .all(|c| c.status.state == ContainerState::Running { started_at: BootTime::from_ns(2) }),
            "{typed:?}"
        );
    }

    #[test]
    fn a_malformed_selection_is_refused_with_the_reason() {
        let api = api();
        for (query, reason) in [
            ("containerid=aaaa", "unknown parameter \"containerid\""),
            ("container_id=", "container_id is empty"),
            ("container=", "container is empty"),
            ("pod=%zz", "encoding"),
        ] {
            let (status, body) = api.get("/api/v1/containers", Some(query)).expect("served");
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
            let json: serde_json::Value = serde_json::from_str(&body).expect("the refusal is JSON");
            let error = json["error"].as_str().expect("an error");
            assert!(error.contains(reason), "{query}: {error}");
        }
    }
}
