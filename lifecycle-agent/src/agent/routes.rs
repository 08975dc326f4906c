//! The agent's JSON API on `--listen`: `/api/v1/containers` (every unit's view, or those a
//! `namespace`, `pod` or `container_id` parameter selects), `/api/v1/history` (a pod's past
//! stops, kept after it is gone) and
//! `/api/v1/probe/<namespace>/<pod>/<container>` (the probe answer for people, scripts and
//! host-network pods: declared checks only, 403 otherwise). `/metrics` and `/healthz` are served
//! by `http.rs`.
//!
//! A `/api/v1/containers` request with `wait_seconds` is a long poll: it is answered when the
//! containers it selects (or their pods) may have changed from the `resource_version` it gives
//! (from an earlier answer; without one, from the node as the request finds it), or after
//! `wait_seconds` with the answer as it stands. "May": a change of a selected container's counters
//! alone can answer it too, when something else on the node changed at the same time. A client that
//! follows a container this way learns of its exit as soon as the model has it, and costs the agent
//! nothing between changes: polling for the same, one request every 200 µs was most of the agent's
//! CPU and the tail of its exit -> API latency (BENCHMARKS.md, "Waiting for a change"). At most
//! [`MAX_WAITING`] requests wait at once; past that, one is answered at once (a wait may always end
//! early), and each way a wait ended is counted in `lifecycle_api_waits_total{result}`.

use std::{sync::Arc, time::Duration};

use hyper::StatusCode;
use prometheus::{IntCounterVec, Registry};
use serde::Serialize;
use tokio::sync::{watch, Semaphore};

use super::http::{ApiHandler, Later};
use crate::{
    discovery::clock::{boottime, wall_clock},
    export::{explain, explain_html, families::AgentFamily, metrics::vec_of},
    model::{
        node::{ContainerView, NodeSnapshot, PodView, Unit},
        time::BootTime,
        wire::{at::WallClock, ContainersResponse, HistoryResponse},
    },
    probe::{metrics::ProbeTarget, query::Query, CheckSpec, NodeProbes},
};

/// Requests that may wait for a change at once. Each also holds one of the API listener's
/// connections (128, 32 per source address: `http::Limits`), so waiters alone cannot take every
/// connection from the other clients.
pub(super) const MAX_WAITING: usize = 64;
/// The longest wait a request may ask for: well inside the listener's 60 s connection life.
pub(super) const MAX_WAIT_SECONDS: u64 = 30;

pub(super) struct ContainersApi {
    pub(super) snapshots: watch::Receiver<Arc<NodeSnapshot>>,
    pub(super) probes: Arc<NodeProbes>,
    /// The node's name, for the `/explain` page's title.
    pub(super) node: String,
    pub(super) waits: Arc<Waits>,
}

/// The requests waiting for a change: their bound and how each wait ended.
pub(super) struct Waits {
    slots: Arc<Semaphore>,
    /// Written into every `resource_version` beside the model's generation: the boot-clock time
    /// this agent started, so a version from an earlier agent (whose generations started over)
    /// never matches one of this agent's.
    epoch: u64,
    results: IntCounterVec,
}

impl Waits {
    /// The waits of this agent, counted in `lifecycle_api_waits_total{result}` when a registry
    /// is given.
    pub(super) fn new(registry: Option<&Registry>) -> Result<Self, prometheus::Error> {
        let results = vec_of(AgentFamily::ApiWaits, IntCounterVec::new)?;
        for result in WaitEnd::ALL {
            results.with_label_values(&[result.as_str()]).inc_by(0);
        }
        if let Some(registry) = registry {
            registry.register(Box::new(results.clone()))?;
        }
        Ok(Self { slots: Arc::new(Semaphore::new(MAX_WAITING)), epoch: boottime().ns(), results })
    }

    fn resource_version(&self, snapshot: &NodeSnapshot) -> String {
        format!("{}-{}", self.epoch, snapshot.generation())
    }

    fn count(&self, end: WaitEnd) {
        self.results.with_label_values(&[end.as_str()]).inc();
    }
}

/// How a wait ended: the `result` label of `lifecycle_api_waits_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitEnd {
    /// The selection changed from the version given.
    Changed,
    /// Nothing changed within `wait_seconds`.
    Timeout,
    /// The version given is not the node's current one: answered at once.
    Behind,
    /// [`MAX_WAITING`] requests were waiting already: answered at once.
    Busy,
}

impl WaitEnd {
    const ALL: [WaitEnd; 4] = [WaitEnd::Changed, WaitEnd::Timeout, WaitEnd::Behind, WaitEnd::Busy];

    fn as_str(self) -> &'static str {
        match self {
            WaitEnd::Changed => "changed",
            WaitEnd::Timeout => "timeout",
            WaitEnd::Behind => "behind",
            WaitEnd::Busy => "busy",
        }
    }
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
        // A request that could wait and did not (`wait` found it busy) is answered here, now.
        let (selection, _) = match ContainersRequest::parse(query) {
            Ok(request) => request,
            Err(reason) => return Some((StatusCode::BAD_REQUEST, serde_json::json!({ "error": reason }).to_string())),
        };
        Some(containers_answer(&self.snapshot(), &selection, &self.waits))
    }

    fn wait(&self, path: &str, query: Option<&str>) -> Option<Later> {
        if path != "/api/v1/containers" {
            return None;
        }
        // A malformed request is refused by `get`.
        let Ok((selection, Some(wait))) = ContainersRequest::parse(query) else { return None };
        let Ok(slot) = Arc::clone(&self.waits.slots).try_acquire_owned() else {
            self.waits.count(WaitEnd::Busy);
            return None;
        };
        let mut snapshots = self.snapshots.clone();
        let waits = Arc::clone(&self.waits);
        Some(Box::pin(async move {
            let _slot = slot;
            let (end, snapshot) = changed_within(&mut snapshots, &selection, &wait, &waits).await;
            if let Some(end) = end {
                waits.count(end);
            }
            containers_answer(&snapshot, &selection, &waits)
        }))
    }
}

/// The body of `GET /api/v1/containers` for `selection` in `snapshot`.
fn containers_answer(snapshot: &NodeSnapshot, selection: &Selection, waits: &Waits) -> (StatusCode, String) {
    let now = boottime();
    let (containers, pods) = selection.view(snapshot, now);
    let clock = wall_clock();
    let resource_version = waits.resource_version(snapshot);
    answer(
        clock,
        &ContainersResponse { boot_to_unix_seconds: clock.offset_seconds(), now, resource_version, containers, pods },
    )
}

/// Waits until the answer for `selection` may differ from what it was at the version `wait`
/// gives, or `wait` runs out: how the wait ended (None: the model's owner stopped) and the
/// snapshot to answer from. Only a snapshot whose generation moved (a state, a name or a pod
/// changed somewhere) is looked at, and then only for what the answer is made from
/// ([`NodeSnapshot::answer_inputs`]: a version per unit, no view), so a waiter costs a pass over
/// the units per change on the node, whatever it selects. It keeps those inputs, not the
/// snapshot, while it waits: no unit is kept alive by a waiter.
async fn changed_within(
    snapshots: &mut watch::Receiver<Arc<NodeSnapshot>>,
    selection: &Selection,
    wait: &Wait,
    waits: &Waits,
) -> (Option<WaitEnd>, Arc<NodeSnapshot>) {
    let inputs = |snapshot: &NodeSnapshot| snapshot.answer_inputs(|unit| selection.selects(unit));
    let (at_first, mut generation) = {
        let first = snapshots.borrow_and_update().clone();
        if wait.resource_version.as_ref().is_some_and(|version| *version != waits.resource_version(&first)) {
            return (Some(WaitEnd::Behind), first);
        }
        (inputs(&first), first.generation())
    };
    let deadline = tokio::time::sleep(wait.timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                let latest = snapshots.borrow_and_update().clone();
                if changed.is_err() {
                    return (None, latest);
                }
                if latest.generation() == generation {
                    continue;
                }
                generation = latest.generation();
                if inputs(&latest) != at_first {
                    return (Some(WaitEnd::Changed), latest);
                }
            }
            () = &mut deadline => return (Some(WaitEnd::Timeout), snapshots.borrow().clone()),
        }
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

/// How long a `/api/v1/containers` request waits for a change, and from which version.
#[derive(Debug, PartialEq, Eq)]
struct Wait {
    timeout: Duration,
    /// None: from the node as the request finds it.
    resource_version: Option<String>,
}

/// A `/api/v1/containers` request: what it selects, and whether it waits for a change.
struct ContainersRequest;

impl ContainersRequest {
    fn parse(query: Option<&str>) -> Result<(Selection, Option<Wait>), String> {
        let mut query = Query::parse(query).map_err(|err| err.to_string())?;
        let wait_seconds = query.take("wait_seconds");
        let resource_version = query.take("resource_version");
        let selection = Selection::take(query)?;
        let Some(seconds) = wait_seconds else {
            if resource_version.is_some() {
                return Err("resource_version is a version to wait from: give wait_seconds too".into());
            }
            return Ok((selection, None));
        };
        let seconds = seconds
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=MAX_WAIT_SECONDS).contains(s))
            .ok_or_else(|| format!("wait_seconds is whole seconds from 1 to {MAX_WAIT_SECONDS}"))?;
        if resource_version.as_deref().is_some_and(str::is_empty) {
            return Err("resource_version is empty".into());
        }
        Ok((selection, Some(Wait { timeout: Duration::from_secs(seconds), resource_version })))
    }
}

impl Selection {
    fn parse(query: Option<&str>) -> Result<Self, String> {
        Self::take(Query::parse(query).map_err(|err| err.to_string())?)
    }

    /// The selection in `query`, which has no other parameter.
    fn take(mut query: Query) -> Result<Self, String> {
        let selection = Selection {
            namespace: query.take("namespace"),
            pod: query.take("pod"),
            container: query.take("container"),
            container_id: query.take("container_id"),
        };
        if let Some((unknown, _)) = query.params().first() {
            return Err(format!(
                "unknown parameter {unknown:?}; namespace, pod, container and container_id select containers \
                 (and wait_seconds with resource_version waits for a change in them)"
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

    /// The containers this selects in `snapshot`, viewed at `now`, and their pods.
    fn view(&self, snapshot: &NodeSnapshot, now: BootTime) -> (Vec<ContainerView>, Vec<PodView>) {
        let containers = snapshot.containers_where(now, |unit| self.selects(unit));
        let pods = match self.is_everything() {
            true => snapshot.pods(now),
            false => {
                let uids: std::collections::HashSet<&str> = containers.iter().map(|c| c.labels.uid.as_str()).collect();
                snapshot.pods_where(now, |uid| uids.contains(uid))
            }
        };
        (containers, pods)
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

    /// An API over two running containers (see [`node`]).
    fn api() -> ContainersApi {
        serving(&node()).0
    }

    /// An API over `tracker`'s snapshot, and the sender that publishes the next one.
    fn serving(tracker: &NodeTracker) -> (ContainersApi, watch::Sender<Arc<NodeSnapshot>>) {
        let (publish, snapshots) = watch::channel(Arc::new(tracker.snapshot()));
        let api = ContainersApi {
            snapshots,
            probes: Arc::new(NodeProbes::new(None)),
            node: "node-a".into(),
            waits: Arc::new(Waits::new(None).expect("counters")),
        };
        (api, publish)
    }

    /// Two running containers: `aaaa…` in shop/web (main pid 1001), `bbbb…` in shop/db (1002).
    fn node() -> NodeTracker {
        node_of(&[("a", "web", 1, "main"), ("b", "db", 2, "main")])
    }

    /// Running containers, each (id digit, pod, pod number, name): the `i`th (from 0) has
    /// cgroup `101 + i` and main pid `1001 + i`.
    fn node_of(containers: &[(&str, &str, u64, &str)]) -> NodeTracker {
        let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
        let metas = containers
            .iter()
            .map(|(digit, pod, n, name)| {
                let uid = format!("00000000-0000-0000-0000-{n:012}");
                running_container(&digit.repeat(64), &uid, "shop", pod, &format!("{pod}-{name}"))
            })
            .collect();
        tracker.set_metadata(metas);
        for (i, (digit, _, n, _)) in containers.iter().enumerate() {
            let cgroup = 101 + i as u64;
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
            tracker.apply(&event(2, 1001 + i as u32, cgroup, exec));
        }
        tracker
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
            ("wait_seconds=0", "wait_seconds is whole seconds from 1 to 30"),
            ("wait_seconds=31", "wait_seconds is whole seconds from 1 to 30"),
            ("wait_seconds=1.5", "wait_seconds is whole seconds"),
            ("wait_seconds", "wait_seconds is whole seconds"),
            ("resource_version=1-2", "give wait_seconds too"),
            ("wait_seconds=5&resource_version=", "resource_version is empty"),
        ] {
            assert!(api.wait("/api/v1/containers", Some(query)).is_none(), "{query}: refused, not waited on");
            let (status, body) = api.get("/api/v1/containers", Some(query)).expect("served");
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
            let json: serde_json::Value = serde_json::from_str(&body).expect("the refusal is JSON");
            let error = json["error"].as_str().expect("an error");
            assert!(error.contains(reason), "{query}: {error}");
        }
    }

    /// The main process of the `which`th container (from 0) of [`node_of`] exits with `status`.
    fn main_exits(tracker: &mut NodeTracker, which: u32, status: u8) {
        let detail = Detail::Exit {
            exit_status: Some(status),
            signal: None,
            core_dumped: false,
            group_dead: true,
            parent_tgid: 1,
            start_time_ns: 2,
            cpu_time_ns: 1,
            comm: "app".into(),
        };
        let (tgid, cgroup_id) = (1001 + which, 101 + u64::from(which));
        tracker.apply(&Event { time_ns: 10, pid: tgid, tgid, cgroup_id, detail });
    }

    /// Polls `later` once: its answer if it has one already (the wait has read the snapshots
    /// published so far either way).
    async fn poll_once(later: &mut Later) -> Option<(StatusCode, String)> {
        tokio::time::timeout(Duration::ZERO, later).await.ok()
    }

    /// The `result` counts of `lifecycle_api_waits_total`.
    fn ends(api: &ContainersApi) -> Vec<(&'static str, u64)> {
        WaitEnd::ALL
            .iter()
            .map(|end| (end.as_str(), api.waits.results.with_label_values(&[end.as_str()]).get()))
            .collect()
    }

    fn state_of(body: &str) -> (String, String) {
        let answer: ContainersResponse = serde_json::from_str(body).expect("the API's type");
        let json: serde_json::Value = serde_json::from_str(body).expect("json");
        (json["containers"][0]["state"]["state"].as_str().unwrap_or("none").to_owned(), answer.resource_version)
    }

    #[tokio::test]
    async fn a_wait_is_answered_when_its_container_changes_and_not_before() {
        let mut tracker = node();
        let (api, publish) = serving(&tracker);
        let (_, body) = api.get("/api/v1/containers", Some("container_id=aaaa")).expect("served");
        let (state, version) = state_of(&body);
        assert_eq!(state, "running");
        let mut later = api
            .wait("/api/v1/containers", Some(&format!("container_id=aaaa&wait_seconds=30&resource_version={version}")))
            .expect("waits");
        assert_eq!(poll_once(&mut later).await, None, "nothing changed yet");
        // The other container's exit moves the node's version but not this selection.
        main_exits(&mut tracker, 1, 1);
        publish.send_replace(Arc::new(tracker.snapshot()));
        assert_eq!(poll_once(&mut later).await, None, "another container's exit does not answer this wait");
        main_exits(&mut tracker, 0, 3);
        publish.send_replace(Arc::new(tracker.snapshot()));
        let (status, body) = poll_once(&mut later).await.expect("its container's exit answers the wait");
        assert_eq!(status, StatusCode::OK);
        let (state, after) = state_of(&body);
        assert_eq!(state, "terminated", "{body}");
        assert_ne!(after, version);
        assert_eq!(ends(&api), [("changed", 1), ("timeout", 0), ("behind", 0), ("busy", 0)]);
    }

    #[tokio::test]
    async fn a_wait_from_a_version_the_node_has_left_is_answered_at_once() {
        let mut tracker = node();
        let (api, publish) = serving(&tracker);
        let (_, body) = api.get("/api/v1/containers", Some("container_id=aaaa")).expect("served");
        let (_, version) = state_of(&body);
        // The exit lands between the client's two requests: the wait must not take the node as
        // it finds it for what the client saw.
        main_exits(&mut tracker, 0, 3);
        publish.send_replace(Arc::new(tracker.snapshot()));
        for stale in [version, "1-1".to_owned()] {
            let query = format!("container_id=aaaa&wait_seconds=30&resource_version={stale}");
            let mut later = api.wait("/api/v1/containers", Some(&query)).expect("waits");
            let (_, body) = poll_once(&mut later).await.expect("answered at once");
            assert_eq!(state_of(&body).0, "terminated", "{body}");
        }
        assert_eq!(ends(&api), [("changed", 0), ("timeout", 0), ("behind", 2), ("busy", 0)]);
    }

    #[tokio::test]
    async fn a_wait_with_nothing_changing_ends_at_its_timeout_with_the_answer_as_it_stands() {
        let mut tracker = node();
        let (api, publish) = serving(&tracker);
        let started = tokio::time::Instant::now();
        let mut later = api.wait("/api/v1/containers", Some("pod=web&wait_seconds=1")).expect("waits");
        assert_eq!(poll_once(&mut later).await, None);
        main_exits(&mut tracker, 1, 1);
        publish.send_replace(Arc::new(tracker.snapshot()));
        let (status, body) = later.await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(state_of(&body).0, "running");
        assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
        assert_eq!(ends(&api), [("changed", 0), ("timeout", 1), ("behind", 0), ("busy", 0)]);
    }

    #[tokio::test]
    async fn past_the_bound_a_request_is_answered_at_once_and_a_stopped_model_ends_every_wait() {
        let tracker = node();
        let (api, publish) = serving(&tracker);
        let mut waiting: Vec<Later> =
            (0..MAX_WAITING).map(|_| api.wait("/api/v1/containers", Some("wait_seconds=30")).expect("waits")).collect();
        for later in &mut waiting {
            assert_eq!(poll_once(later).await, None);
        }
        assert!(api.wait("/api/v1/containers", Some("wait_seconds=30")).is_none(), "one past the bound waits not");
        let (status, _) = api.get("/api/v1/containers", Some("wait_seconds=30")).expect("answered now instead");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ends(&api), [("changed", 0), ("timeout", 0), ("behind", 0), ("busy", 1)]);
        // The owner of the model stops (the agent is shutting down): nothing will change again.
        drop(publish);
        for later in &mut waiting {
            assert_eq!(poll_once(later).await.map(|(status, _)| status), Some(StatusCode::OK));
        }
        drop(waiting);
        assert!(api.wait("/api/v1/containers", Some("wait_seconds=30")).is_some(), "their places are free again");
    }

    #[tokio::test]
    async fn a_wait_on_one_container_is_answered_when_its_pods_other_container_changes() {
        // The answer shows the container's pod, whose phase reads every container of it.
        let mut tracker = node_of(&[("a", "web", 1, "main"), ("b", "db", 2, "main"), ("c", "web", 1, "side")]);
        let (api, publish) = serving(&tracker);
        let mut later = api.wait("/api/v1/containers", Some("container_id=aaaa&wait_seconds=30")).expect("waits");
        assert_eq!(poll_once(&mut later).await, None);
        main_exits(&mut tracker, 1, 1);
        publish.send_replace(Arc::new(tracker.snapshot()));
        assert_eq!(poll_once(&mut later).await, None, "another pod's container");
        main_exits(&mut tracker, 2, 1);
        publish.send_replace(Arc::new(tracker.snapshot()));
        let (_, body) = poll_once(&mut later).await.expect("its pod's other container ended");
        let answer: ContainersResponse = serde_json::from_str(&body).expect("the API's type");
        assert_eq!(answer.containers.len(), 1, "{body}");
        assert_eq!(answer.pods.len(), 1, "{body}");
        assert_eq!(answer.pods[0].running_containers, 1, "the pod now runs one of its two: {body}");
    }
}
