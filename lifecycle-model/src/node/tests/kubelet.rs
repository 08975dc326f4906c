//! The tracker and what the node's kubelet makes: restarts judged by its back-off as it was read
//! (its cap, an unknown back-off, a kubelet that starts again with another configuration), and the
//! cgroup layouts it lays pods out in.

use super::*;
use crate::kubelet::{
    config::{effective, go_duration_ns, CommandLine},
    KubeletFacts, KubeletOverrides, KubeletPolicy, KubeletSource, KubeletVersion,
};

/// What the agent derives for a kubelet `v1.<minor>.0` whose configuration sets `cap` (None:
/// nothing), or whose configuration could not be read (`readable` false).
fn kubelet(minor: u32, cap: Option<&str>, readable: bool) -> KubeletPolicy {
    let mut config = effective(None, &[], &CommandLine::default()).expect("valid");
    config.max_container_restart_period_ns = cap.map(|c| go_duration_ns(c).expect("duration"));
    let facts = KubeletFacts {
        source: if readable { KubeletSource::Node } else { KubeletSource::Unreadable },
        pid: Some(4242),
        version: Some(KubeletVersion::new(1, minor, 2)),
        config: readable.then_some(config),
        origin: "/var/lib/kubelet/config.yaml".into(),
    };
    KubeletPolicy::derive(facts, KubeletOverrides::default())
}

/// Runs instance `n` of the crash loop: created and started at `start` s, exited 0.5 s later.
fn crash(tracker: &mut NodeTracker, n: u64, start: f64) {
    let at = |s: f64| (s * SECOND as f64) as u64;
    let cg = container_cgroup(tracker, at(start), n);
    tracker.apply(&exec(at(start) + 1, 100 + n as u32, cg, SHIM_CGROUP, "app"));
    tracker.apply(&exit(at(start + 0.5), 100 + n as u32, cg, Some(3), None));
}

fn container_unit(tracker: &NodeTracker) -> &Unit {
    tracker.units().find(|u| matches!(u.key(), UnitKey::Container { .. })).expect("the container's unit")
}

/// Five runs whose restarts come when a kubelet capped at 20 s makes them: at once, then 10 s,
/// 20 s and 20 s after each exit (plus 1 s of the kubelet's own latency).
fn capped_loop(tracker: &mut NodeTracker) {
    tracker.set_metadata((1..=5).map(|n| meta(n, 30)).collect());
    let mut start = 0.0;
    for (n, delay) in [0.0, 1.0, 11.0, 21.0, 21.0].iter().enumerate() {
        start += delay;
        crash(tracker, n as u64 + 1, start);
        start += 0.5;
    }
}

#[test]
fn a_crash_loop_under_the_nodes_cap_is_within_tolerance_at_every_restart() {
    let mut tracker = tracker_with_cri();
    tracker.set_kubelet(kubelet(37, Some("20s"), true));
    capped_loop(&mut tracker);
    let unit = container_unit(&tracker);
    assert_eq!(unit.restart_count(), 4);
    assert_eq!(unit.counters().backoff_verdicts, BTreeMap::from([(Verdict::WithinTolerance, 4)]));
    let last = unit.last_backoff().expect("judged");
    assert_eq!(last.expected_delay_ns, Some(20 * SECOND), "the node's cap, not 40 s");
    assert!(tracker.take_warnings().is_empty(), "no deviation to tell");

    // The same loop judged by the default back-off: the fourth restart is "too early".
    let mut default = tracker_with_cri();
    capped_loop(&mut default);
    let unit = container_unit(&default);
    assert_eq!(unit.counters().backoff_verdicts.get(&Verdict::TooEarly), Some(&1));
}

#[test]
fn an_unknown_back_off_judges_the_first_restart_and_claims_nothing_after() {
    let mut tracker = tracker_with_cri();
    // A 1.37 kubelet whose configuration could not be read: its cap could be anything.
    let policy = kubelet(37, None, false);
    assert_eq!(policy.backoff.policy(), None, "{:?}", policy.backoff);
    tracker.set_kubelet(policy);
    capped_loop(&mut tracker);
    let unit = container_unit(&tracker);
    assert_eq!(
        unit.counters().backoff_verdicts,
        BTreeMap::from([(Verdict::WithinTolerance, 1), (Verdict::NotJudged, 3)])
    );
    assert_eq!(unit.last_backoff().and_then(|b| b.expected_delay_ns), None);
    assert!(tracker.take_warnings().is_empty(), "not judged is no deviation");
    // The back-off's remaining time is not known either; the container still waits.
    let view = only_view(&tracker, 76 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Waiting { .. }), "{:?}", view.status.state);
    assert_eq!(view.status.back_off_remaining_ns, None);
}

#[test]
fn a_kubelet_that_starts_again_is_asked_about_and_its_new_back_off_applies() {
    let mut tracker = tracker_with_cri();
    tracker.set_kubelet(kubelet(37, Some("20s"), true));
    tracker.set_metadata((1..=6).map(|n| meta(n, 30)).collect());
    tracker.apply(&mkdir(0, 300, "/system.slice/kubelet.service"));
    let mut start = 0.0;
    for (n, delay) in [0.0, 1.0, 11.0].iter().enumerate() {
        start += delay;
        crash(&mut tracker, n as u64 + 1, start);
        start += 0.5;
    }
    // The kubelet starts again (with another configuration): the model asks for it.
    let mut exec_kubelet = exec(40 * SECOND, 4343, 300, 300, "kubelet");
    if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut exec_kubelet.detail {
        (*child_pid_namespace, *namespace_init) = (false, false);
    }
    let outcome = tracker.apply(&exec_kubelet);
    assert!(outcome.notices.contains(&Notice::KubeletStarted { pid: 4343 }), "{:?}", outcome.notices);
    tracker.set_kubelet(kubelet(37, None, true));
    assert_eq!(tracker.kubelet().backoff.policy(), Some(crate::backoff::BackoffPolicy::default()));
    // The new kubelet restarts at once (its back-off is in memory), then 10 s, then 20 s.
    for (n, delay) in [(4, 40.5), (5, 11.0), (6, 21.0)] {
        start += delay;
        crash(&mut tracker, n, start);
        start += 0.5;
    }
    let unit = container_unit(&tracker);
    assert_eq!(unit.counters().backoff_verdicts, BTreeMap::from([(Verdict::WithinTolerance, 5)]));
    // Due next: 40 s, the default doubling the 20 s cap would have stopped.
    assert_eq!(unit.backoff.pending_delay_ns(), Some(40 * SECOND));
}

#[test]
fn a_pod_in_the_system_partition_is_named() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    tracker.apply(&mkdir(0, 600, &format!("/kubepods/system/burstable/pod{POD_UID}")));
    let cg = 1001;
    tracker.apply(&mkdir(SECOND, cg, &format!("/kubepods/system/burstable/pod{POD_UID}/{}", container_id(1))));
    tracker.apply(&exec(2 * SECOND, 100, cg, SHIM_CGROUP, "app"));
    let view = only_view(&tracker, 3 * SECOND);
    assert_eq!(
        (view.labels.namespace.as_str(), view.labels.pod.as_str(), view.labels.container.as_str()),
        ("shop", "web-1", "app")
    );
    assert!(matches!(view.status.state, ContainerState::Running { .. }), "{:?}", view.status.state);
    assert_eq!(tracker.dropped().get(DroppedKind::CgroupLayout), 0);
}

#[test]
fn a_cgroup_in_an_unknown_layout_under_kubepods_is_a_unit_named_by_its_path_and_counted() {
    let mut tracker = tracker_with_cri();
    let path = format!("/kubepods/realtime/pod{POD_UID}/{}", container_id(9));
    let created = tracker.apply(&mkdir(0, 900, &path));
    assert!(
        created.notices.iter().any(|n| matches!(n, Notice::BadCgroupPath { path: p, .. } if *p == path)),
        "{:?}",
        created.notices
    );
    assert_eq!(tracker.dropped().get(DroppedKind::CgroupLayout), 1);
    // Its processes are watched: a run and its exit, under its path.
    tracker.apply(&exec(SECOND, 300, 900, SHIM_CGROUP, "app"));
    tracker.apply(&exit(2 * SECOND, 300, 900, Some(1), None));
    let unit = tracker.units().find(|u| *u.key() == UnitKey::Host { path: path.clone() }).expect("named by its path");
    assert_eq!(unit.labels().container, path);
    assert!(matches!(unit.state(), ContainerState::Terminated { exit_code: 1, .. }), "{:?}", unit.state());
    assert!(unit.last_termination().is_some(), "its end is judged");
}

/// Issue 40: on a node whose kubelet reports no stop signal (1.20 with containerd 1.6), the
/// runtime sends the image's `STOPSIGNAL`; the agent reads it from the image's status and
/// calls that signal the configured one.
#[test]
fn an_image_only_stop_signal_is_the_configured_one_where_the_kubelet_reports_none() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![ContainerMeta { image_stop_signal: Some(2), ..meta(1, 30) }]);
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    tracker.apply(&signal(5 * SECOND, (50, SHIM_CGROUP, "containerd-shim"), (100, cg), 2));
    tracker.apply(&exit(5 * SECOND + SECOND / 10, 100, cg, Some(0), None));
    let report = only_view(&tracker, 6 * SECOND).last_termination.expect("judged");
    let stop = report.stop_signal.clone().expect("the stop signal");
    assert_eq!((stop.signal, stop.matches_configured), (2, true), "{report:#?}");
    assert!(matches!(report.outcome, TerminationOutcome::ExitedWithinGrace { .. }), "{:?}", report.outcome);
}

/// Issue 40: the rules that changed between releases follow the kubelet's gates. A kubelet
/// without ContainerStopSignals sends no pod stop signal (the image's, else SIGTERM), and one
/// without ContainerRestartRules keeps the pod's `restartPolicy` over a container's own.
#[test]
fn a_spec_field_the_kubelets_release_does_not_apply_is_not_expected() {
    use crate::{
        container_state::{ExitCodeOperator, RestartPolicy, RestartRule, RestartRuleAction},
        kubelet::{KubeletFacts, KubeletOverrides},
    };
    let mut pod = super::spec::pod_facts(30, RestartPolicy::Never);
    pod.containers[0].stop_signal = Some(10);
    pod.containers[0].restart.container_restart_policy = Some(RestartPolicy::Never);
    pod.containers[0].restart.restart_policy_rules =
        vec![RestartRule { action: RestartRuleAction::Restart, operator: ExitCodeOperator::In, values: vec![42] }];
    let on_release = |minor: u32, gates: &[(&str, bool)]| {
        let mut config = effective(None, &[], &CommandLine::default()).expect("valid");
        config.feature_gates = gates.iter().map(|(g, on)| ((*g).to_owned(), *on)).collect();
        let facts = KubeletFacts {
            source: KubeletSource::Node,
            pid: Some(1),
            version: Some(KubeletVersion::new(1, minor, 0)),
            config: Some(config),
            origin: "test".into(),
        };
        let (mut tracker, cg) = super::spec::tracker_with_pod(pod.clone());
        tracker.set_kubelet(KubeletPolicy::derive(facts, KubeletOverrides::default()));
        let shim = (50, SHIM_CGROUP, "containerd-shim");
        tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
        tracker.apply(&exit(10 * SECOND + SECOND / 10, 100, cg, Some(42), None));
        only_view(&tracker, 11 * SECOND)
    };
    // 1.34: both gates alpha and off. The runtime's SIGTERM is what was configured, and exit 42
    // restarts nothing under the pod's Never.
    let old = on_release(34, &[]);
    let stop = old.last_termination.as_ref().and_then(|r| r.stop_signal.clone()).expect("stop signal");
    assert_eq!((stop.signal, stop.matches_configured), (15, true), "{old:#?}");
    assert!(!old.status.restart_expected, "the pod's Never: {:?}", old.status);
    // 1.37 with ContainerStopSignals named on (ContainerRestartRules is beta, on): the pod's
    // SIGUSR1 was due, and exit 42 restarts.
    let new = on_release(37, &[("ContainerStopSignals", true)]);
    let stop = new.last_termination.as_ref().and_then(|r| r.stop_signal.clone()).expect("stop signal");
    assert_eq!((stop.signal, stop.matches_configured), (15, false), "{new:#?}");
    assert!(new.status.restart_expected, "the container's rule: {:?}", new.status);
}
