//! Stops that had no cause before issue 40 (item 5) and the memory pressure before a stop
//! (item 4): a liveness kill under `restartPolicy: Never`, a sidecar stopped once the main
//! containers exited, a graceful node shutdown judged with its group's grace, a restart for a
//! changed definition after the kubelet started again, and a liveness failure under pressure.

use super::spec::{pod_facts, tracker_with_pod};
use super::*;
use crate::{
    container_state::RestartPolicy,
    kubelet::{
        config::{effective, CommandLine, ConfigFile},
        KubeletFacts, KubeletOverrides, KubeletPolicy, KubeletSource,
    },
    memory::{MemoryEvents, MemorySample, StallTotals},
    spec::{ContainerKind, Disruption, KillNotice, LivenessFailure, PodRef, StopCause},
    time::MILLISECOND,
};

const SHIM: (u32, u64, &str) = (50, SHIM_CGROUP, "containerd-shim");

fn liveness_failure() -> LivenessFailure {
    let pod = PodRef { namespace: "shop".into(), name: "web-1".into(), uid: POD_UID.into() };
    LivenessFailure { pod, container: "app".into() }
}

/// TERM from the runtime at `stop` s, the exit through a trap 0.2 s later.
fn stopped(tracker: &mut NodeTracker, cg: u64, stop: u64) {
    tracker.apply(&signal(stop * SECOND, SHIM, (100, cg), 15));
    tracker.apply(&exit(stop * SECOND + 200_000_000, 100, cg, Some(143), None));
}

#[test]
fn a_liveness_kill_under_never_is_named_from_the_kubelets_unhealthy_event() {
    // The kubelet kills the whole pod ("Stopping container app"): before, `runtime_or_unknown`.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    let _ = tracker.apply_liveness_failure(liveness_failure(), 9 * SECOND, 9 * SECOND);
    stopped(&mut tracker, cg, 10);
    let report = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::LivenessProbe));
    // The pod's kill: the pod's grace, not the probe's own 5 s (`killContainer` with reason Unknown).
    assert_eq!(report.grace_ns, 30 * SECOND);

    // The event after the stop (its watch is slower than the kernel): the stop is named then.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    stopped(&mut tracker, cg, 10);
    let before = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!(before.cause, Some(StopCause::RuntimeOrUnknown));
    let _ = tracker.apply_liveness_failure(liveness_failure(), 10 * SECOND, 11 * SECOND);
    let after = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!(after.cause, Some(StopCause::LivenessProbe));
    let causes: Vec<_> =
        tracker.units().next().expect("present").counters().terminations.keys().map(|(_, c)| *c).collect();
    assert_eq!(causes, vec![Some(StopCause::LivenessProbe)], "the count moved with the cause");

    // One naming this pod's uid under another pod's name is forged: ignored.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    let mut forged = liveness_failure();
    forged.pod.name = "other".into();
    let _ = tracker.apply_liveness_failure(forged, 9 * SECOND, 9 * SECOND);
    stopped(&mut tracker, cg, 10);
    let report = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::RuntimeOrUnknown));

    // A failure long before the stop (an old event replayed by a relist) explains nothing.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    let _ = tracker.apply_liveness_failure(liveness_failure(), SECOND, 2 * SECOND);
    stopped(&mut tracker, cg, 30);
    let report = only_view(&tracker, 31 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::RuntimeOrUnknown));
}

#[test]
fn a_sidecar_stopped_after_the_main_containers_exited_is_named_so() {
    let mut pod = pod_facts(30, RestartPolicy::Never);
    let mut sidecar = pod.containers[0].clone();
    sidecar.name = "proxy".into();
    sidecar.kind = ContainerKind::Sidecar;
    sidecar.restart.is_init_container = true;
    sidecar.restart.container_restart_policy = Some(RestartPolicy::Always);
    pod.containers.push(sidecar);
    let mut tracker = tracker_with_cri();
    tracker.set_api_configured();
    tracker.set_api_reachable(true);
    let _ = tracker.apply_pod(pod, 0);
    let mut proxy = meta(2, 30);
    (proxy.container_name, proxy.kubelet.container_type) = ("proxy".into(), Some(ContainerType::Init));
    tracker.set_metadata(vec![meta(1, 30), proxy]);
    let app = container_cgroup(&mut tracker, 0, 1);
    let side = container_cgroup(&mut tracker, 0, 2);
    tracker.apply(&exec(SECOND, 100, app, SHIM_CGROUP, "app"));
    tracker.apply(&exec(SECOND, 200, side, SHIM_CGROUP, "proxy"));
    // `app` completes; the kubelet then stops `proxy`.
    tracker.apply(&exit(6 * SECOND, 100, app, Some(0), None));
    tracker.apply(&signal(6 * SECOND + 300_000_000, SHIM, (200, side), 15));
    tracker.apply(&exit(6 * SECOND + 500_000_000, 200, side, Some(0), None));
    let views = tracker.snapshot().containers(at(7 * SECOND));
    let cause = |name: &str| {
        views.iter().find(|v| v.labels.container == name).and_then(|v| v.last_termination.as_ref()).map(|r| r.cause)
    };
    assert_eq!(cause("app"), Some(None), "it exited: nothing stopped it");
    assert_eq!(cause("proxy"), Some(Some(StopCause::MainContainersExited)));
}

fn kubelet_with(config: serde_json::Value) -> KubeletPolicy {
    let mut content =
        serde_json::json!({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"});
    content.as_object_mut().expect("present").extend(config.as_object().expect("present").clone());
    let file = ConfigFile { path: "/var/lib/kubelet/config.yaml".into(), content };
    let facts = KubeletFacts {
        source: KubeletSource::Node,
        pid: Some(4242),
        version: Some(crate::kubelet::KubeletVersion::new(1, 37, 2)),
        config: Some(effective(Some(&file), &[], &CommandLine::default()).expect("valid")),
        origin: "/var/lib/kubelet/config.yaml".into(),
    };
    KubeletPolicy::derive(facts, KubeletOverrides::default())
}

/// A pod with `grace_s` shut down by the node at 10 s; its app ignores TERM and is killed at
/// `kill_s`.
fn shut_down(
    tracker_kubelet: Option<KubeletPolicy>,
    priority: Option<i32>,
    kill_s: u64,
) -> crate::termination::TerminationReport {
    let (mut tracker, cg) = tracker_with_pod(pod_facts(60, RestartPolicy::Always));
    if let Some(policy) = tracker_kubelet {
        let _ = tracker.set_kubelet(policy);
    }
    let mut pod = pod_facts(60, RestartPolicy::Always);
    pod.priority = priority;
    pod.disruption = Some(Disruption::NodeShutdown);
    let _ = tracker.apply_pod(pod, 10 * SECOND);
    tracker.apply(&signal(10 * SECOND, SHIM, (100, cg), 15));
    tracker.apply(&signal(kill_s * SECOND, SHIM, (100, cg), 9));
    tracker.apply(&exit(kill_s * SECOND + 1000, 100, cg, None, Some(9)));
    only_view(&tracker, (kill_s + 1) * SECOND).last_termination.expect("judged")
}

#[test]
fn a_graceful_node_shutdown_is_judged_with_the_grace_of_the_pods_priority_group() {
    let node =
        || kubelet_with(serde_json::json!({"shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"}));
    // An ordinary pod asking for 60 s gets 30 - 10 = 20 s: its SIGKILL at 20 s is the rule.
    let ordinary = shut_down(Some(node()), None, 30);
    assert_eq!(ordinary.cause, Some(StopCause::NodeShutdown));
    assert!(
        matches!(ordinary.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, .. } if grace_ns == 20 * SECOND),
        "{:?}",
        ordinary.outcome
    );
    // A system-critical pod gets the critical 10 s.
    let critical = shut_down(Some(node()), Some(2_000_000_000), 20);
    assert_eq!(critical.grace_ns, 10 * SECOND);
    // Without the kubelet's configuration the pod's own 60 s stands, and the kill looks early.
    let unread = shut_down(None, None, 30);
    assert!(matches!(unread.outcome, TerminationOutcome::SigkilledEarly { .. }), "{:?}", unread.outcome);
}

#[test]
fn a_restart_for_a_changed_definition_after_the_kubelet_started_says_both() {
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    tracker.apply(&mkdir(0, 300, "/system.slice/kubelet.service"));
    let mut exec_kubelet = exec(8 * SECOND, 4343, 300, 300, "kubelet");
    if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut exec_kubelet.detail {
        (*child_pid_namespace, *namespace_init) = (false, false);
    }
    tracker.apply(&exec_kubelet);
    let notice =
        KillNotice { pod: liveness_failure().pod, container: "app".into(), cause: StopCause::DefinitionChanged };
    let _ = tracker.apply_kill_notice(notice, 10 * SECOND);
    stopped(&mut tracker, cg, 10);
    let views = tracker.snapshot().containers(at(11 * SECOND));
    let app = views.iter().find(|v| v.labels.container == "app").expect("app");
    let report = app.last_termination.clone().expect("judged");
    assert_eq!(report.cause, Some(StopCause::DefinitionChanged));
    assert_eq!(report.kubelet_started_before_ns, Some(2 * SECOND));
    let stories = crate::explain::explain(&tracker.snapshot().containers(at(11 * SECOND)), "shop", "web-1", None);
    let text = crate::explain::render_text(&stories, None);
    assert!(
        text.contains("[definition_changed]") && text.contains("the kubelet started 2.0s before this stop"),
        "{text}"
    );
}

#[test]
fn a_liveness_kill_under_memory_pressure_is_explained_with_it() {
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    let key = UnitKey::Container { pod_uid: POD_UID.into(), container: "app".into() };
    let reading = |s: u64, high: u64, stall_ms: u64| MemoryReading {
        key: key.clone(),
        cgroup_id: cg,
        at: at(s * SECOND),
        sample: MemorySample {
            events: MemoryEvents { high: Some(high), max: Some(0), oom: Some(0), oom_kill: Some(0) },
            stalls: Some(StallTotals { some_ns: stall_ms * MILLISECOND, full_ns: 0 }),
        },
    };
    let _ = tracker.apply_memory_readings(vec![reading(2, 0, 0), reading(40, 120, 4_000)], 0);
    // A reading of another cgroup (the container restarted since it was read) is not kept.
    let _ = tracker.apply_memory_readings(vec![MemoryReading { cgroup_id: 999, ..reading(60, 999, 99_000) }], 0);
    let _ = tracker.apply_memory_readings(vec![reading(61, 340, 12_400)], 0);
    assert_eq!(tracker.units().next().expect("present").memory().and_then(|m| m.events.high), Some(340));
    let _ = tracker.apply_liveness_failure(liveness_failure(), 62 * SECOND, 62 * SECOND);
    stopped(&mut tracker, cg, 62);
    let report = only_view(&tracker, 63 * SECOND).last_termination.expect("judged");
    let memory = report.memory.expect("read before the stop");
    assert_eq!((memory.window_ns, memory.events.high), (60 * SECOND, Some(340)));
    let stories = crate::explain::explain(&tracker.snapshot().containers(at(63 * SECOND)), "shop", "web-1", None);
    let text = crate::explain::render_text(&stories, None);
    assert!(
        text.contains(
            "memory: throttled at memory.high (340 times) and stalled on memory 12.4s of the 60.0s before the liveness failure"
        ),
        "{text}"
    );
    // A reading for a unit the model does not know is counted.
    let unknown = UnitKey::Container { pod_uid: "gone".into(), container: "x".into() };
    let _ = tracker.apply_memory_readings(vec![MemoryReading { key: unknown, ..reading(64, 0, 0) }], 0);
    assert_eq!(tracker.dropped().get(crate::node::DroppedKind::MemoryReading), 1);
}
