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

use super::http::{ApiHandler, Build, Later};
use lifecycle_model::explain;

use crate::{
    discovery::clock::{boottime, wall_clock},
    export::{explain_html, families::AgentFamily, metrics::vec_of},
    model::{
        node::{ContainerView, NodeSnapshot, PodView, Unit},
        time::BootTime,
        wire::{at::WallClock, with_clock::WithClock, ContainersResponse, HistoryResponse},
    },
    probe::{check::ParseError, query::Query, CheckSpec, NodeProbes},
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
        let (selection, _) = match parse_containers_request(query) {
            Ok(request) => request,
            Err(reason) => return Some((StatusCode::BAD_REQUEST, serde_json::json!({ "error": reason }).to_string())),
        };
        Some(containers_answer(&self.snapshot(), &selection, &self.waits))
    }

    fn is_narrow(&self, path: &str, query: Option<&str>) -> bool {
        path == "/api/v1/containers"
            && parse_containers_request(query).is_ok_and(|(selection, _)| selection.is_one_container())
    }

    fn wait(&self, path: &str, query: Option<&str>) -> Option<Later> {
        if path != "/api/v1/containers" {
            return None;
        }
        // A malformed request is refused by `get`.
        let Ok((selection, Some(wait))) = parse_containers_request(query) else { return None };
        let Ok(slot) = Arc::clone(&self.waits.slots).try_acquire_owned() else {
            self.waits.count(WaitEnd::Busy);
            return None;
        };
        let mut snapshots = self.snapshots.clone();
        let waits = Arc::clone(&self.waits);
        Some(Box::pin(async move {
            let (end, snapshot) = changed_within(&mut snapshots, &selection, &wait, &waits).await;
            if let Some(end) = end {
                waits.count(end);
            }
            // Made in the request's turn; the waiting place is held until it is.
            Box::new(move || {
                let _slot = slot;
                containers_answer(&snapshot, &selection, &waits)
            }) as Build
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
    match serde_json::to_string(&WithClock::new(body, clock)) {
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

/// The digits of a whole container id (see [`Selection::is_one_container`]).
const CONTAINER_ID_DIGITS: usize = 64;

/// How long a `/api/v1/containers` request waits for a change, and from which version.
#[derive(Debug, PartialEq, Eq)]
struct Wait {
    timeout: Duration,
    /// None: from the node as the request finds it.
    resource_version: Option<String>,
}

/// A `/api/v1/containers` request: what it selects, and whether it waits for a change.
fn parse_containers_request(query: Option<&str>) -> Result<(Selection, Option<Wait>), String> {
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

    /// Whether it selects one container at most: by its whole id. The ids are the runtime's 64
    /// hex digits (the model takes no other, `identity.rs`), one per container; a prefix, even
    /// of the 12 or 13 digits `docker ps` and crictl print, may be shared by many when whoever
    /// names containers (root, not a pod) chooses ids alike.
    fn is_one_container(&self) -> bool {
        self.container_id.as_ref().is_some_and(|id| id.len() == CONTAINER_ID_DIGITS)
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
    /// `GET /explain/<namespace>/<pod>`: the pod's stories as a page (each container's last stop,
    /// or, for a pod whose containers are gone, every stop the node kept). A plain host's unit is
    /// `/explain/host/<its cgroup path>`.
    fn pod_page(&self, target: &str) -> (StatusCode, String) {
        let now = boottime();
        let clock = wall_clock();
        if let Some(path) = target.strip_prefix("host/").map(host_unit_path) {
            let snapshot = self.snapshot();
            let current = snapshot.containers_where(now, |unit| {
                let labels = unit.labels();
                labels.namespace == explain::HOST_NAMESPACE && labels.pod.is_empty() && labels.container == path
            });
            let mut stories = explain::explain(&current, explain::HOST_NAMESPACE, "", Some(&path));
            if stories.iter().all(|s| s.timeline.is_empty()) {
                stories = explain::explain_history(&snapshot.history_of_host_unit(&path), None);
            }
            return (StatusCode::OK, explain_html::pod_page(explain::HOST_NAMESPACE, &path, &stories, clock));
        }
        // Namespaces and pod names are DNS labels and subdomains: no encoding to undo.
        let Some((namespace, pod)) = target.split_once('/').filter(|(n, p)| !n.is_empty() && !p.contains('/')) else {
            return (StatusCode::NOT_FOUND, explain_html::pod_page("?", "?", &[], clock));
        };
        let snapshot = self.snapshot();
        let containers = snapshot.containers_where(now, |unit| {
            let labels = unit.labels();
            labels.namespace == namespace && labels.pod == pod
        });
        let mut stories = explain::explain(&containers, namespace, pod, None);
        if stories.is_empty() {
            stories = explain::explain_history(&snapshot.history_of_pod(namespace, pod), None);
        }
        (StatusCode::OK, explain_html::pod_page(namespace, pod, &stories, clock))
    }

    /// `GET /explain`: the node's recent stops, newest first.
    fn node_page(&self) -> (StatusCode, String) {
        let recent = self.snapshot().recent_stops(NODE_PAGE_STOPS);
        let stories = explain::explain_history(&recent, None);
        (StatusCode::OK, explain_html::node_page(&self.node, &stories, wall_clock()))
    }

    /// `GET /api/v1/history?namespace=<ns>&pod=<name>`: every stop of the pod's containers the
    /// node kept, for a pod deleted long ago too; a plain host's unit is `namespace=host&
    /// container=<its cgroup path>`. Both parameters are needed (the history of a whole node is
    /// what the verdict log is for).
    fn history(&self, query: Option<&str>) -> (StatusCode, String) {
        let bad = |reason: &str| (StatusCode::BAD_REQUEST, serde_json::json!({ "error": reason }).to_string());
        let selection = match Selection::parse(query) {
            Ok(selection) => selection,
            Err(reason) => return bad(&reason),
        };
        let stops = match (&selection.namespace, &selection.pod, &selection.container, &selection.container_id) {
            (Some(namespace), Some(pod), _, None) => self.snapshot().history_of_pod(namespace, pod),
            (Some(namespace), None, Some(path), None) if namespace == explain::HOST_NAMESPACE => {
                self.snapshot().history_of_host_unit(&host_unit_path(path))
            }
            _ => {
                return bad("history needs namespace and pod, or namespace=host and container=<cgroup path> (and no \
                     container_id)")
            }
        };
        let clock = wall_clock();
        answer(clock, &HistoryResponse { boot_to_unix_seconds: clock.offset_seconds(), stops })
    }

    /// `GET /api/v1/probe/<namespace>/<pod>/<container>?check=<tcp|process|file|all>&...`: the same
    /// answer the pod's own probe listener gives, for people, scripts and host-network pods.
    fn probe(&self, target: &str, query: Option<&str>) -> (StatusCode, String) {
        // Only a declared check of a known container answers: the rest is 403 with no detail,
        // like the pod listener's. A request without check= is a usage error (400), and so is
        // a query past its bounds, refused before it is decoded (a declared check never is).
        let mut query = match Query::parse(query) {
            Ok(query) => query,
            Err(err @ ParseError::QueryTooLarge { .. }) => return (StatusCode::BAD_REQUEST, format!("{err}\n")),
            Err(_) => return forbidden(self.probes.forbidden()),
        };
        let Some(check) = query.take("check") else {
            return (StatusCode::BAD_REQUEST, "add check=tcp|process|file|all to the query\n".to_owned());
        };
        let mut parts = target.trim_end_matches('/').splitn(3, '/');
        let (Some(namespace), Some(pod), Some(container)) = (parts.next(), parts.next(), parts.next()) else {
            return forbidden(self.probes.forbidden());
        };
        let Ok(spec) = CheckSpec::from_query(&check, &query) else { return forbidden(self.probes.forbidden()) };
        let (code, body) = self.probes.answer_check(namespace, pod, container, &spec);
        (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
    }
}

/// A host unit's cgroup path as the model names it (one leading `/`), however a URL gave it
/// (percent-encoded or not).
fn host_unit_path(path: &str) -> String {
    let decoded = crate::probe::query::decode(path).unwrap_or_else(|_| path.to_owned());
    format!("/{}", decoded.trim_start_matches('/'))
}

fn forbidden((_, body): (u16, String)) -> (StatusCode, String) {
    (StatusCode::FORBIDDEN, body)
}

// The tests feed the tracker events for the state they then render; the outcomes (routed by the
// agent, `owner.rs`) are not what they examine.
#[cfg(test)]
#[expect(unused_must_use, reason = "the tests examine the state, not the outcomes")]
#[path = "routes_tests.rs"]
mod tests;
