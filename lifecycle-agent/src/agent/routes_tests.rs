//! Tests of the JSON API's routes: selections, refusals, and requests that wait for a change.
use super::*;

use lifecycle_testkit::fixtures::{main_exec, main_exit, running_container};

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
        let event =
            |time, tgid, cgroup_id, detail| Event { at: BootTime::from_ns(time), pid: tgid, tgid, cgroup_id, detail };
        tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(CgroupDetail { id: cgroup, path, truncated: false })));
        let exec = main_exec("app");
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
fn only_a_request_for_one_container_by_its_id_is_answered_without_a_turn() {
    let api = api();
    let narrow = |query: &str| api.is_narrow("/api/v1/containers", Some(query));
    let (a, b) = ("a".repeat(64), "b".repeat(64));
    assert!(narrow(&format!("container_id={a}")));
    assert!(narrow(&format!("container_id={a}&wait_seconds=5")));
    assert!(narrow(&format!("namespace=shop&container_id={b}")));
    // A prefix, even crictl's 13 digits, may select many containers; the other selections, a
    // pod's or more.
    assert!(!narrow("container_id=aaaaaaaaaaaaa"));
    assert!(!narrow(&format!("container_id={a}a")));
    assert!(!narrow("namespace=shop&pod=web"));
    assert!(!narrow("container=web-main"));
    assert!(!narrow(&format!("container_id={a}&unknown=1")), "a refused request is not made as one");
    assert!(!api.is_narrow("/api/v1/containers", None));
    assert!(!api.is_narrow("/api/v1/history", Some(&format!("container_id={a}"))));
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
        typed.containers.iter().all(|c| c.status.state == ContainerState::Running { started_at: BootTime::from_ns(2) }),
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

#[test]
fn a_probe_query_past_its_bounds_is_refused_before_it_is_parsed() {
    // Issue 37: `check=all&file=/a&file=/a&...` (8,000 pairs, 60 KB) took 48 ms of an async
    // worker, quadratic in the pairs, without a token from a node address.
    let api = api();
    let probe = "/api/v1/probe/shop/web/main";
    let huge = format!("check=all&{}", "file=/a&".repeat(7_500));
    assert!(huge.len() > 60_000);
    let began = std::time::Instant::now();
    let (status, body) = api.get(probe, Some(&huge)).expect("served");
    let refused_in = began.elapsed();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body, "query too large: at most 4096 bytes\n");
    // Many short pairs are refused by their count.
    let many = format!("check=all&{}", "file=/a&".repeat(40));
    assert_eq!(api.get(probe, Some(&many)).expect("served").0, StatusCode::BAD_REQUEST);
    // The largest query read (32 pairs): an undeclared check, so 403 with no detail.
    let largest = format!("check=all&{}", vec!["file=/a"; 31].join("&"));
    let began = std::time::Instant::now();
    let (status, _) = api.get(probe, Some(&largest)).expect("served");
    let largest_in = began.elapsed();
    assert_eq!(status, StatusCode::FORBIDDEN);
    eprintln!(
        "a {}-byte probe query refused in {refused_in:?}; the largest one read ({} bytes, 32 pairs) answered in {largest_in:?}",
        huge.len(),
        largest.len()
    );
}

/// The main process of the `which`th container (from 0) of [`node_of`] exits with `status`, and
/// the snapshot is published.
fn exits_and_publishes(tracker: &mut NodeTracker, publish: &watch::Sender<Arc<NodeSnapshot>>, which: u32, status: u8) {
    let (tgid, cgroup_id) = (1001 + which, 101 + u64::from(which));
    tracker.apply(&Event { at: BootTime::from_ns(10), pid: tgid, tgid, cgroup_id, detail: main_exit(status, "app") });
    publish.send_replace(Arc::new(tracker.snapshot()));
}

/// Polls `later` once: its answer, made, if its wait is over already (the wait has read the
/// snapshots published so far either way).
async fn poll_once(later: &mut Later) -> Option<(StatusCode, String)> {
    tokio::time::timeout(Duration::ZERO, later).await.ok().map(|build| build())
}

/// The `result` counts of `lifecycle_api_waits_total`.
fn ends(api: &ContainersApi) -> Vec<(&'static str, u64)> {
    WaitEnd::ALL.iter().map(|end| (end.as_str(), api.waits.results.with_label_values(&[end.as_str()]).get())).collect()
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
    exits_and_publishes(&mut tracker, &publish, 1, 1);
    assert_eq!(poll_once(&mut later).await, None, "another container's exit does not answer this wait");
    exits_and_publishes(&mut tracker, &publish, 0, 3);
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
    exits_and_publishes(&mut tracker, &publish, 0, 3);
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
    exits_and_publishes(&mut tracker, &publish, 1, 1);
    let (status, body) = (later.await)();
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
    exits_and_publishes(&mut tracker, &publish, 1, 1);
    assert_eq!(poll_once(&mut later).await, None, "another pod's container");
    exits_and_publishes(&mut tracker, &publish, 2, 1);
    let (_, body) = poll_once(&mut later).await.expect("its pod's other container ended");
    let answer: ContainersResponse = serde_json::from_str(&body).expect("the API's type");
    assert_eq!(answer.containers.len(), 1, "{body}");
    assert_eq!(answer.pods.len(), 1, "{body}");
    assert_eq!(answer.pods[0].running_containers, 1, "the pod now runs one of its two: {body}");
}
