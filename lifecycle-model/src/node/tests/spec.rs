//! The tracker with pod specs from the API: grace, restarts, causes, disagreements, phases and
//! warnings.

use super::*;

pub(in crate::node) fn pod_facts(
    grace_s: u64,
    restart_policy: crate::container_state::RestartPolicy,
) -> crate::spec::PodFacts {
    use crate::spec::{ContainerFacts, ContainerKind, PodFacts};
    PodFacts {
        uid: POD_UID.into(),
        namespace: "shop".into(),
        name: "web-1".into(),
        restart_policy,
        grace_ns: Some(grace_s * SECOND),
        deletion_grace_ns: None,
        disruption: None,
        restarting_all_containers: false,
        priority: None,
        containers: vec![ContainerFacts {
            name: "app".into(),
            kind: ContainerKind::Regular,
            restart: crate::container_state::RestartSpec { pod_restart_policy: restart_policy, ..Default::default() },
            stop_signal: None,
            pre_stop: None,
            liveness_grace_ns: Some(5 * SECOND),
            startup_grace_ns: None,
            http_probes: Vec::new(),
        }],
        reported_phase: Some("Running".into()),
        reported: Vec::new(),
        reported_status: Default::default(),
    }
}

/// The pod of [`pod_facts`] as an Event's `involvedObject` names it.
fn web_1() -> crate::spec::PodRef {
    crate::spec::PodRef { namespace: "shop".into(), name: "web-1".into(), uid: POD_UID.into() }
}

/// A running container of the pod above, with the API as its spec source.
pub(super) fn tracker_with_pod(pod: crate::spec::PodFacts) -> (NodeTracker, u64) {
    let mut tracker = tracker_with_cri();
    tracker.set_api_configured();
    tracker.set_api_reachable(true);
    tracker.apply_pod(pod, 0);
    tracker.set_metadata(vec![meta(1, 30)]);
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    (tracker, cg)
}

#[test]
fn a_deletion_shorter_than_the_spec_is_judged_with_the_deletions_grace() {
    use crate::{
        container_state::RestartPolicy,
        spec::{SpecSource, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    let mut deleted = pod_facts(30, RestartPolicy::Always);
    deleted.deletion_grace_ns = Some(3 * SECOND);
    tracker.apply_pod(deleted, 9 * SECOND);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(13 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(13 * SECOND + 1000, 100, cg, None, Some(9)));
    let view = only_view(&tracker, 14 * SECOND);
    let report = view.last_termination.expect("judged");
    assert!(
        matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, .. } if grace_ns == 3 * SECOND),
        "the runtime's SIGKILL at 3 s is right, not early: {report:?}"
    );
    assert_eq!((report.cause, report.spec), (Some(StopCause::Deleted), SpecSource::Api));
    assert!(!view.status.restart_expected, "a deleted pod expects no restart");
}

#[test]
fn a_forced_deletion_is_the_deletions_stop_with_the_kubelets_two_second_floor() {
    // Issue 19: after `kubectl delete --force --grace-period=0` the object is gone at once, the
    // kubelet still sends TERM and kills (its 2 s floor; the runtime ~1.3 s after TERM here).
    // The verdict was `runtime_or_unknown` with the spec's grace.
    use crate::{
        container_state::RestartPolicy,
        spec::{SpecSource, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    let mut last = pod_facts(30, RestartPolicy::Always);
    last.deletion_grace_ns = Some(0);
    tracker.pod_gone(last, 10 * SECOND);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(11 * SECOND + 300_000_000, shim, (100, cg), 9));
    tracker.apply(&exit(11 * SECOND + 301_000_000, 100, cg, None, Some(9)));
    let report = only_view(&tracker, 12 * SECOND).last_termination.expect("judged");
    assert_eq!((report.cause, report.spec), (Some(StopCause::Deleted), SpecSource::Api));
    match &report.outcome {
        TerminationOutcome::SigkilledEarly { grace_ns, expected_kill_after_ns, .. } => {
            assert_eq!((*grace_ns, *expected_kill_after_ns), (0, 2 * SECOND), "the kubelet's floor, not 30 s");
        }
        other => panic!("killed 1.3 s into a 2 s floor is early: {other:?}"),
    }
    // Kept a minute past the object's removal, then forgotten.
    tracker.expire(10 * SECOND + 59 * SECOND, u64::MAX);
    assert!(tracker.knows_pod(POD_UID));
    tracker.expire(10 * SECOND + 61 * SECOND, u64::MAX);
    assert!(!tracker.knows_pod(POD_UID));
}

#[test]
fn a_pod_past_its_active_deadline_names_the_stops_judged_before_the_status_came() {
    // Issue 19: a pod past `activeDeadlineSeconds` was `runtime_or_unknown`. The kubelet writes
    // `status.reason: DeadlineExceeded` while it stops the containers, so the status may come
    // after the stop was judged.
    use crate::{
        container_state::RestartPolicy,
        spec::{Disruption, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(3, RestartPolicy::Always));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(11 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(11 * SECOND + 1000, 100, cg, None, Some(9)));
    let before = only_view(&tracker, 11 * SECOND + 2000).last_termination.expect("judged");
    assert_eq!(before.cause, Some(StopCause::RuntimeOrUnknown), "nothing says why yet");
    let mut failed = pod_facts(3, RestartPolicy::Always);
    failed.disruption = Some(Disruption::DeadlineExceeded);
    tracker.apply_pod(failed, 12 * SECOND);
    let after = only_view(&tracker, 12 * SECOND).last_termination.expect("judged");
    assert_eq!(after.cause, Some(StopCause::DeadlineExceeded));
    assert!(matches!(after.outcome, TerminationOutcome::SigkilledEarly { .. }), "{:?}", after.outcome);
    let unit = tracker.units().next().expect("unit");
    let causes: Vec<_> = unit.counters().terminations.keys().map(|(_, cause)| *cause).collect();
    assert_eq!(causes, vec![Some(StopCause::DeadlineExceeded)], "the count moved with the cause");
    // A stop older than the late-notice window keeps what it was judged.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(3, RestartPolicy::Always));
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(11 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(11 * SECOND + 1000, 100, cg, None, Some(9)));
    let mut failed = pod_facts(3, RestartPolicy::Always);
    failed.disruption = Some(Disruption::DeadlineExceeded);
    tracker.apply_pod(failed, 60 * SECOND);
    let old = only_view(&tracker, 60 * SECOND).last_termination.expect("judged");
    assert_eq!(old.cause, Some(StopCause::RuntimeOrUnknown));
}

#[test]
fn a_shell_entrypoint_that_keeps_the_stop_signal_from_its_child_shows_in_the_scene() {
    // Issue 20 (kubernetes#119884, #67126): PID 1 `sh` got SIGTERM and did not pass it on;
    // `java` never got it and was SIGKILLed with it after the grace.
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(2, RestartPolicy::Always));
    // pid 100 is the init (`app`, started at 1 s); `java` (pid 107) and `logger` (pid 108) run
    // beside it, and the init passes TERM on to `logger` only.
    tracker.apply(&exec(2 * SECOND, 107, cg, cg, "java"));
    tracker.apply(&exec(3 * SECOND, 108, cg, cg, "logger"));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(10 * SECOND + 1000, (100, cg, "sh"), (108, cg), 15));
    tracker.apply(&exit(10 * SECOND + 2000, 108, cg, Some(0), None));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(12 * SECOND + 1000, 107, cg, None, Some(9)));
    tracker.apply(&exit(12 * SECOND + 2000, 100, cg, None, Some(9)));
    let report = only_view(&tracker, 13 * SECOND).last_termination.expect("judged");
    let listed = |processes: &[crate::termination::ProcessAtStop]| -> Vec<(u32, bool, bool)> {
        processes.iter().map(|p| (p.pid, p.init, p.got_stop_signal)).collect()
    };
    assert_eq!(
        listed(&report.scene.running_at_stop),
        vec![(100, true, true), (107, false, false), (108, false, true)],
        "the init got TERM and passed it to 108 only"
    );
    assert_eq!(listed(&report.scene.alive_at_kill), vec![(100, true, true), (107, false, false)], "108 had exited");
    assert_eq!(report.scene.alive_at_kill[1].comm, "java");
    assert_eq!(report.scene.left_out, 0);
    // The Event tells the owner what to fix, with the cause.
    let warnings = tracker.take_warnings();
    let note = &warnings.iter().find(|w| w.reason == WarningReason::GracePeriodExceeded).expect("a warning").note;
    assert!(
        note.ends_with(
            "; PID 1 `app` got the stop signal and did not pass it on: `java` (pid 107) never got it; stopped \
             because: runtime_or_unknown"
        ),
        "{note}"
    );
}

#[test]
fn a_stop_outlives_its_unit_and_pod_in_the_history() {
    // Issue 20: "explain" answers for a pod deleted 20 minutes earlier: units expire with their
    // series, the history does not.
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(2, RestartPolicy::Always));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&exit(11 * SECOND, 100, cg, Some(0), None));
    tracker.apply(&event(
        12 * SECOND,
        0,
        0,
        Detail::CgroupRmdir(CgroupDetail { id: cg, path: String::new(), truncated: false }),
    ));
    tracker.forget_pod(POD_UID);
    tracker.expire(20 * 60 * SECOND, 60 * SECOND);
    assert!(tracker.snapshot().containers(at(20 * 60 * SECOND)).is_empty(), "the unit expired");
    let kept = tracker.snapshot().history_of_pod("shop", "web-1");
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].container, "app");
    assert!(matches!(kept[0].last_termination.outcome, TerminationOutcome::ExitedWithinGrace { .. }));
}

#[test]
fn a_scene_lists_at_most_its_bound_the_init_first() {
    use crate::{container_state::RestartPolicy, termination::MAX_SCENE_PROCESSES};
    let (mut tracker, cg) = tracker_with_pod(pod_facts(2, RestartPolicy::Always));
    for pid in 200..300u32 {
        tracker.apply(&exec(2 * SECOND + u64::from(pid), pid, cg, cg, "worker"));
    }
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(12 * SECOND + 2000, 100, cg, None, Some(9)));
    let report = only_view(&tracker, 13 * SECOND).last_termination.expect("judged");
    assert_eq!(report.scene.running_at_stop.len(), MAX_SCENE_PROCESSES);
    assert!(report.scene.running_at_stop[0].init && report.scene.alive_at_kill[0].init, "the init is never left out");
    assert_eq!(report.scene.left_out, 2 * (101 - MAX_SCENE_PROCESSES as u32));
}

#[test]
fn a_never_pod_that_exited_is_final() {
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    tracker.apply(&exit(2 * SECOND, 100, cg, Some(2), None));
    let view = only_view(&tracker, 60 * SECOND);
    assert!(!view.status.restart_expected);
    assert!(
        matches!(view.status.state, ContainerState::Terminated { reason: TerminatedReason::Error, exit_code: 2, .. }),
        "no CrashLoopBackOff for a Never pod: {:?}",
        view.status.state
    );
    assert_eq!(view.last_termination.expect("judged").cause, None, "nothing stopped it");
}

#[test]
fn a_liveness_kill_uses_the_probes_grace_and_names_the_cause() {
    use crate::{
        container_state::RestartPolicy,
        spec::{KillNotice, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    tracker.apply_kill_notice(
        KillNotice { pod: web_1(), container: "app".into(), cause: StopCause::LivenessProbe },
        9 * SECOND,
    );
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(15 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(15 * SECOND + 1000, 100, cg, None, Some(9)));
    let report = only_view(&tracker, 16 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::LivenessProbe));
    assert!(
        matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, .. } if grace_ns == 5 * SECOND),
        "{report:?}"
    );
    let unit = tracker.units().next().expect("unit");
    let counted: Vec<_> = unit.counters().terminations.keys().collect();
    assert_eq!(counted, vec![&(crate::termination::OutcomeKind::SigkilledAfterGrace, Some(StopCause::LivenessProbe))]);
}

#[test]
fn verdicts_made_while_the_api_is_away_say_so() {
    use crate::{
        container_state::RestartPolicy,
        spec::{SpecSource, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    tracker.set_api_reachable(false);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&exit(10 * SECOND + 1000, 100, cg, None, Some(15)));
    let report = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!((report.spec, report.cause), (SpecSource::ApiUnreachable, Some(StopCause::RuntimeOrUnknown)));
}

#[test]
fn sidecars_come_from_the_spec() {
    use crate::{container_state::RestartPolicy, spec::ContainerKind};
    let mut pod = pod_facts(30, RestartPolicy::Always);
    pod.containers[0].kind = ContainerKind::Sidecar;
    pod.containers[0].restart.is_init_container = true;
    pod.containers[0].restart.container_restart_policy = Some(RestartPolicy::Always);
    let (tracker, _) = tracker_with_pod(pod);
    assert!(only_view(&tracker, 2 * SECOND).sidecar, "declared, not guessed from running beside a main container");
}

#[test]
fn a_pid_1_oom_kill_the_kubelet_reports_as_error_is_a_disagreement() {
    use crate::{
        container_state::RestartPolicy,
        spec::{ReportedContainer, ReportedState},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    let oom = Detail::OomVictim { victim_pid: 100, victim_tgid: 100, victim_cgroup_id: cg, victim_comm: "app".into() };
    tracker.apply(&event(5 * SECOND, 1, 1, oom));
    tracker.apply(&exit(5 * SECOND + 1000, 100, cg, None, Some(9)));
    let mut reported = pod_facts(30, RestartPolicy::Never);
    reported.reported = vec![ReportedContainer {
        name: "app".into(),
        restart_count: 0,
        state: Some(ReportedState::Terminated {
            reason: "Error".into(),
            exit_code: 137,
            signal: None,
            container_id: Some(container_id(1)),
        }),
        ..ReportedContainer::default()
    }];
    tracker.apply_pod(reported.clone(), 6 * SECOND);
    tracker.apply_pod(reported, 6 * SECOND);
    let view = only_view(&tracker, 6 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Terminated { reason: TerminatedReason::OomKilled, .. }));
    let kinds: Vec<_> = view.disagreements.iter().map(|d| (d.kind, d.kubelet.as_str(), d.kernel.as_str())).collect();
    assert_eq!(kinds, vec![(DisagreementKind::OomNotReported, "Error (137)", "OOMKilled (137)")]);
    let unit = tracker.units().next().expect("unit");
    assert_eq!(unit.counters().disagreements.get(&DisagreementKind::OomNotReported), Some(&1), "counted once");
}

#[test]
fn a_sigkill_after_grace_is_a_warning_for_the_pod() {
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(2, RestartPolicy::Always));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(12 * SECOND + 1000, 100, cg, None, Some(9)));
    let warnings = tracker.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert_eq!(
        (warning.reason, warning.pod.as_str(), warning.container.as_str()),
        (WarningReason::GracePeriodExceeded, "web-1", "app")
    );
    assert!(warning.note.contains("2s grace period"), "{}", warning.note);
    assert!(tracker.take_warnings().is_empty(), "taken once");
}

#[test]
fn a_sigkill_before_the_grace_ran_out_is_told_as_early_everywhere() {
    // Issue 19: a forced deletion's SIGKILL 1 s after TERM (the kubelet's second StopContainer)
    // was judged `killed_early` in the API while the Event blamed the app for its grace.
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(3, RestartPolicy::Always));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(11 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(11 * SECOND + 1000, 100, cg, None, Some(9)));
    let view = only_view(&tracker, 12 * SECOND);
    let report = view.last_termination.expect("judged");
    assert!(
        matches!(&report.outcome, TerminationOutcome::SigkilledEarly { stop_to_kill_ns, sender: Some(SignalSender::Runtime), .. }
            if *stop_to_kill_ns == SECOND),
        "{:?}",
        report.outcome
    );
    let unit = tracker.units().next().expect("unit");
    assert_eq!(unit.counters().grace_violations, 0, "not the app's overrun");
    let warnings = tracker.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].reason, WarningReason::KilledBeforeGracePeriod);
    let note = &warnings[0].note;
    for said in
        ["the container runtime", "1.0s after the stop signal", "2.0s before its 3s grace period", "killed early"]
    {
        assert!(note.contains(said), "{said:?} in {note}");
    }
    assert!(!note.contains("did not exit within"), "{note}");
}

#[test]
fn a_kill_notice_after_the_exit_names_the_cause_of_that_stop() {
    use crate::{
        container_state::RestartPolicy,
        spec::{KillNotice, StopCause},
    };
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Always));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&exit(10 * SECOND + 1000, 100, cg, None, Some(15)));
    let notice = || KillNotice { pod: web_1(), container: "app".into(), cause: StopCause::LivenessProbe };
    tracker.apply_kill_notice(notice(), 10 * SECOND + 300_000_000);
    let report = only_view(&tracker, 11 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::LivenessProbe));
    let unit = tracker.units().next().expect("unit");
    let causes: Vec<_> = unit.counters().terminations.keys().map(|(_, cause)| *cause).collect();
    assert_eq!(causes, vec![Some(StopCause::LivenessProbe)], "counted under the right cause only");
    // Much later, a notice is for the next stop, not this one.
    tracker.apply_kill_notice(notice(), 60 * SECOND);
    assert_eq!(tracker.kill_notices.len(), 1);
}

#[test]
fn pods_show_their_phase_and_the_conditions_the_kernel_can_tell() {
    let mut tracker = tracker_with_cri();
    let mut init = meta(1, 30);
    (init.container_name, init.kubelet.container_type) = ("migrate".into(), Some(ContainerType::Init));
    tracker.set_metadata(vec![init, meta(2, 30)]);
    let migrate = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, migrate, SHIM_CGROUP, "migrate"));
    let pod = |tracker: &NodeTracker| tracker.snapshot().pods(at(5 * SECOND)).into_iter().next().expect("one pod");
    let running_init = pod(&tracker);
    assert!(running_init.conditions.ready_to_start_containers);
    assert!(!running_init.conditions.initialized);
    assert_eq!(running_init.phase, crate::node::PodPhase::Pending);
    tracker.apply(&exit(2 * SECOND, 100, migrate, Some(0), None));
    let app = container_cgroup(&mut tracker, 3 * SECOND, 2);
    tracker.apply(&exec(3 * SECOND, 200, app, SHIM_CGROUP, "app"));
    let running = pod(&tracker);
    assert!(running.conditions.initialized && running.conditions.ready_to_start_containers);
    assert_eq!((running.phase, running.running_containers, running.containers), (crate::node::PodPhase::Running, 1, 1));
}

/// The kernel's log line about an OOM kill, with the victim `pid` and the limit at `oom_memcg`.
fn oom_line(pid: u32, oom_memcg: &str) -> crate::oom::KernelOomKill {
    crate::oom::KernelOomKill {
        pid,
        comm: "app".into(),
        oom_memcg: Some(oom_memcg.into()),
        task_memcg: "/kubepods/pod-u/c".into(),
    }
}

#[test]
fn the_limit_an_oom_kill_answered_joins_its_victim_in_either_order() {
    use crate::{container_state::RestartPolicy, oom::OomScope};
    let victim =
        |cg| Detail::OomVictim { victim_pid: 100, victim_tgid: 100, victim_cgroup_id: cg, victim_comm: "app".into() };
    // The log line first (the kernel logs before it kills), then the victim, then the exit.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    tracker.apply_oom_log(oom_line(100, "/kubepods/pod-u"), 5 * SECOND);
    tracker.apply(&event(5 * SECOND, 1, 1, victim(cg)));
    tracker.apply(&exit(5 * SECOND + 1000, 100, cg, None, Some(9)));
    let limit = only_view(&tracker, 6 * SECOND).last_termination.and_then(|r| r.oom_limit).expect("the limit");
    assert_eq!((limit.scope, limit.memcg.as_str(), limit.victim_pid), (OomScope::Pod, "/kubepods/pod-u", 100));
    // The line after the container ended: the report (and the kept history) learns it late.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    tracker.apply(&event(5 * SECOND, 1, 1, victim(cg)));
    tracker.apply(&exit(5 * SECOND + 1000, 100, cg, None, Some(9)));
    assert_eq!(only_view(&tracker, 6 * SECOND).last_termination.and_then(|r| r.oom_limit), None, "not yet");
    tracker.apply_oom_log(oom_line(100, "/kubepods/pod-u/c"), 6 * SECOND);
    let report = only_view(&tracker, 6 * SECOND).last_termination.expect("report");
    assert_eq!(report.oom_limit.map(|l| l.scope), Some(OomScope::Container));
    // A line for a pid no victim had, or one older than the late window, changes nothing.
    let (mut tracker, cg) = tracker_with_pod(pod_facts(30, RestartPolicy::Never));
    tracker.apply_oom_log(oom_line(4242, "/kubepods/pod-u"), SECOND);
    tracker.apply(&event(5 * SECOND, 1, 1, victim(cg)));
    tracker.apply(&exit(5 * SECOND + 1000, 100, cg, None, Some(9)));
    tracker.apply_oom_log(oom_line(100, "/kubepods/pod-u"), 60 * SECOND);
    assert_eq!(only_view(&tracker, 60 * SECOND).last_termination.and_then(|r| r.oom_limit), None);
}

#[test]
fn the_kubelets_eviction_notice_sets_its_grace_before_the_pod_shows_it() {
    // Issue 19: the eviction manager records `Evicted` and kills with a 1 s override (2 s with
    // the runtime's floor); the Pod's `status.reason: Evicted` comes after the containers
    // stopped. Judged with the pod's 20 s, the SIGKILL 2 s after TERM read as an early kill.
    use crate::{container_state::RestartPolicy, spec::StopCause};
    let (mut tracker, cg) = tracker_with_pod(pod_facts(20, RestartPolicy::Always));
    tracker.apply_eviction_notice(&web_1(), 8 * SECOND);
    // A pod update without the reason yet keeps what the event said.
    tracker.apply_pod(pod_facts(20, RestartPolicy::Always), 9 * SECOND);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(12 * SECOND + 1000, 100, cg, None, Some(9)));
    let report = only_view(&tracker, 13 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::Evicted));
    assert_eq!((report.grace_ns, report.expected_kill_after_ns), (SECOND, 2 * SECOND));
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }), "{report:?}");
}

#[test]
fn an_eviction_notice_the_pods_status_never_confirms_lapses() {
    // Anyone allowed to create Events can write an `Evicted` one naming this node's kubelet.
    // Unconfirmed by the Pod's status, it must not shorten the grace of a later stop (a
    // deletion 30 s on, judged with its 20 s, not the eviction's 1 s).
    use crate::{container_state::RestartPolicy, spec::StopCause};
    let (mut tracker, cg) = tracker_with_pod(pod_facts(20, RestartPolicy::Always));
    let uid = pod_facts(20, RestartPolicy::Always).uid;
    tracker.apply_eviction_notice(&web_1(), 2 * SECOND);
    tracker.apply_pod(pod_facts(20, RestartPolicy::Always), 5 * SECOND);
    tracker.expire(11 * SECOND, u64::MAX);
    assert!(tracker.evicted_by_kubelet.contains_key(&uid), "still in force 9 s on");
    tracker.expire(13 * SECOND, u64::MAX);
    assert!(tracker.evicted_by_kubelet.is_empty(), "lapsed, unconfirmed");
    let mut deleted = pod_facts(20, RestartPolicy::Always);
    deleted.deletion_grace_ns = Some(20 * SECOND);
    tracker.apply_pod(deleted, 30 * SECOND);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(31 * SECOND, shim, (100, cg), 15));
    tracker.apply(&exit(36 * SECOND, 100, cg, Some(0), None));
    let report = only_view(&tracker, 37 * SECOND).last_termination.expect("judged");
    assert_eq!(report.cause, Some(StopCause::Deleted));
    assert_eq!(report.grace_ns, 20 * SECOND, "{report:?}");
    assert!(matches!(report.outcome, TerminationOutcome::ExitedWithinGrace { .. }), "{report:?}");

    // Confirmed by the status (`status.reason: Evicted`), a notice stays.
    let (mut tracker, _) = tracker_with_pod(pod_facts(20, RestartPolicy::Always));
    tracker.apply_eviction_notice(&web_1(), 2 * SECOND);
    let mut evicted = pod_facts(20, RestartPolicy::Always);
    evicted.disruption = Some(crate::spec::Disruption::EvictedByKubelet);
    tracker.apply_pod(evicted, 5 * SECOND);
    tracker.expire(60 * SECOND, u64::MAX);
    assert!(tracker.evicted_by_kubelet.get(&uid).is_some_and(|n| n.confirmed));
}

#[test]
fn a_deleted_pods_stop_is_explained_long_after_its_series_expired() {
    // Issue 20: `explain` of a pod deleted 20 minutes earlier. Its unit, its pod facts and its
    // series are gone after the retention (10 minutes); the node's history keeps the stop.
    use crate::container_state::RestartPolicy;
    let (mut tracker, cg) = tracker_with_pod(pod_facts(2, RestartPolicy::Always));
    let mut deleted = pod_facts(2, RestartPolicy::Always);
    deleted.deletion_grace_ns = Some(2 * SECOND);
    tracker.apply_pod(deleted.clone(), 9 * SECOND);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(12 * SECOND + 1000, 100, cg, None, Some(9)));
    tracker.apply(&event(
        13 * SECOND,
        1,
        1,
        Detail::CgroupRmdir(CgroupDetail { id: cg, path: String::new(), truncated: false }),
    ));
    tracker.pod_gone(deleted, 14 * SECOND);
    let twenty_minutes = 20 * 60 * SECOND;
    tracker.expire(twenty_minutes, 10 * 60 * SECOND);
    assert!(tracker.units().next().is_none(), "the unit and its series are gone");
    let past = tracker.snapshot().history_of_pod("shop", "web-1");
    assert_eq!(past.len(), 1, "{past:?}");
    assert_eq!(past[0].last_termination.cause, Some(crate::spec::StopCause::Deleted));
    assert!(matches!(past[0].last_termination.outcome, TerminationOutcome::SigkilledAfterGrace { .. }));
}

/// The report of a stop of [`tracker_with_pod`]'s container by the runtime: SIGTERM at 10 s,
/// SIGKILL at 15 s, after `before` ran on the tracker at 9 s and `after` at 15.3 s.
fn stopped_after(
    pod: crate::spec::PodFacts,
    before: impl FnOnce(&mut NodeTracker),
    after: impl FnOnce(&mut NodeTracker),
) -> crate::termination::TerminationReport {
    let (mut tracker, cg) = tracker_with_pod(pod);
    before(&mut tracker);
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(15 * SECOND, shim, (100, cg), 9));
    tracker.apply(&exit(15 * SECOND + 1000, 100, cg, None, Some(9)));
    after(&mut tracker);
    only_view(&tracker, 16 * SECOND).last_termination.expect("judged")
}

#[test]
fn a_forged_killing_or_evicted_event_from_another_namespace_changes_no_verdict() {
    // Issue 37: a notice was matched to its pod by `involvedObject.uid` alone, and the API
    // server checks only that an Event's namespace is its object's: a tenant in `tenant` could
    // write "Container app failed liveness probe" about shop/web-1 by its uid.
    use crate::{
        container_state::RestartPolicy,
        node::NoticeFor,
        spec::{KillNotice, PodRef, StopCause},
    };
    let pod = || pod_facts(30, RestartPolicy::Always);
    let untouched = stopped_after(pod(), |_| {}, |_| {});
    assert_eq!(untouched.cause, Some(StopCause::RuntimeOrUnknown));
    let forged = [
        PodRef { namespace: "tenant".into(), ..web_1() },
        PodRef { name: "web-2".into(), ..web_1() },
        PodRef { namespace: "tenant".into(), name: "evil".into(), ..web_1() },
    ];
    for pod_ref in forged {
        let (tracker, _) = tracker_with_pod(pod());
        assert_eq!(tracker.notice_for(&pod_ref), NoticeFor::OtherPod, "{pod_ref:?}");
        let notice = || KillNotice { pod: pod_ref.clone(), container: "app".into(), cause: StopCause::LivenessProbe };
        let early = |t: &mut NodeTracker| {
            t.apply_kill_notice(notice(), 9 * SECOND);
            t.apply_eviction_notice(&pod_ref, 9 * SECOND);
        };
        assert_eq!(stopped_after(pod(), early, |_| {}), untouched, "before the stop: {pod_ref:?}");
        let late = |t: &mut NodeTracker| {
            t.apply_kill_notice(notice(), 15 * SECOND + 300_000_000);
        };
        assert_eq!(stopped_after(pod(), |_| {}, late), untouched, "after the stop: {pod_ref:?}");
    }
    // The pod's own names, and its uid, make the notice count.
    let (tracker, _) = tracker_with_pod(pod());
    assert_eq!(tracker.notice_for(&web_1()), NoticeFor::ThisPod);
    assert_eq!(tracker.notice_for(&PodRef { uid: "another".into(), ..web_1() }), NoticeFor::UnknownPod);
    let notice = KillNotice { pod: web_1(), container: "app".into(), cause: StopCause::LivenessProbe };
    let named = stopped_after(pod(), |t| drop(t.apply_kill_notice(notice, 9 * SECOND)), |_| {});
    assert_eq!(named.cause, Some(StopCause::LivenessProbe));
}

#[test]
fn the_pods_own_status_is_taken_over_a_killing_event() {
    // Issue 37: the Pod's status is written by the API server and the kubelet only; an Event by
    // anyone allowed to create Events in the namespace. A deletion the Pod shows is the cause,
    // whatever a `Killing` Event says.
    use crate::{
        container_state::RestartPolicy,
        spec::{KillNotice, StopCause},
    };
    let mut deleted = pod_facts(30, RestartPolicy::Always);
    deleted.deletion_grace_ns = Some(5 * SECOND);
    let notice = KillNotice { pod: web_1(), container: "app".into(), cause: StopCause::LivenessProbe };
    let report = stopped_after(deleted, |t| drop(t.apply_kill_notice(notice, 9 * SECOND)), |_| {});
    assert_eq!(report.cause, Some(StopCause::Deleted));
    assert_eq!(report.grace_ns, 5 * SECOND);
}
