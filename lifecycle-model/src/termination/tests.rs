//! Termination verdicts over hand-made evidence.

use super::*;
use crate::time::BootTime;

const S: u64 = SECOND;
const MS: u64 = crate::time::MILLISECOND;

fn runtime() -> SignalSender {
    SignalSender::Runtime
}

fn tracker_with(settings: TerminationSettings) -> TerminationTracker {
    TerminationTracker::new(settings)
}

fn exec_pre_stop(command: &[&str]) -> Option<PreStopHandler> {
    Some(PreStopHandler::Exec { command: command.iter().map(|s| (*s).to_owned()).collect() })
}

#[test]
fn senders_are_named_from_comm_and_cgroup() {
    assert_eq!(SignalSender::from_comm("containerd-shim", false, 7), SignalSender::Runtime);
    assert_eq!(SignalSender::from_comm("runc", false, 7), SignalSender::Runtime);
    assert_eq!(SignalSender::from_comm("crun", false, 7), SignalSender::Runtime);
    assert_eq!(SignalSender::from_comm("conmon", false, 7), SignalSender::Runtime);
    assert_eq!(SignalSender::from_comm("containerd", false, 7), SignalSender::Runtime);
    assert_eq!(SignalSender::from_comm("kubelet", false, 7), SignalSender::Kubelet);
    assert_eq!(SignalSender::from_comm("runc", true, 7), SignalSender::SameContainer);
    assert_eq!(
        SignalSender::from_comm("bash", false, 7),
        SignalSender::OtherProcess { comm: "bash".into(), pid: Some(7) }
    );
}

#[test]
fn pre_stop_annotations_parse() {
    assert_eq!(
        PreStopHandler::from_annotation(r#"{"exec":{"command":["/bin/sh","-c","sleep 5"]}}"#).expect("exec"),
        PreStopHandler::Exec { command: vec!["/bin/sh".into(), "-c".into(), "sleep 5".into()] }
    );
    assert_eq!(
        PreStopHandler::from_annotation(r#"{"httpGet":{"path":"/quit","port":8080,"scheme":"HTTP"}}"#).expect("http"),
        PreStopHandler::HttpGet
    );
    assert_eq!(
        PreStopHandler::from_annotation(r#"{"sleep":{"seconds":7}}"#).expect("sleep"),
        PreStopHandler::Sleep { seconds: 7 }
    );
}

#[test]
fn malformed_pre_stop_annotations_are_clear_errors() {
    let bad_json = PreStopHandler::from_annotation(r#"{"exec":{"command":["sh""#);
    assert!(matches!(bad_json, Err(TerminationError::PreStopJson { .. })));
    assert!(bad_json.map_err(|e| e.to_string()).err().is_some_and(|text| text.contains("not a lifecycle handler")));
    assert!(matches!(PreStopHandler::from_annotation("{}"), Err(TerminationError::PreStopNoAction { .. })));
    assert!(matches!(
        PreStopHandler::from_annotation(r#"{"exec":{"command":[]}}"#),
        Err(TerminationError::PreStopEmptyCommand { .. })
    ));
    assert!(matches!(
        PreStopHandler::from_annotation(r#"{"exec":{"command":["a"]},"sleep":{"seconds":1}}"#),
        Err(TerminationError::PreStopSeveralActions { .. })
    ));
    assert!(matches!(
        PreStopHandler::from_annotation(r#"{"sleep":{"seconds":-1}}"#),
        Err(TerminationError::PreStopNegativeSleep { seconds: -1 })
    ));
    assert!(matches!(
        PreStopHandler::from_annotation(r#"{"exec":{"command":"sh"}}"#),
        Err(TerminationError::PreStopJson { .. })
    ));
}

#[test]
fn exec_comm_is_the_basename_cut_to_15_bytes() {
    assert_eq!(exec_pre_stop(&["/bin/sh", "-c", "x"]).and_then(|h| h.exec_comm()), Some("sh".into()));
    assert_eq!(exec_pre_stop(&["nginx"]).and_then(|h| h.exec_comm()), Some("nginx".into()));
    assert_eq!(
        exec_pre_stop(&["/usr/local/bin/graceful-shutdown-helper"]).and_then(|h| h.exec_comm()),
        Some("graceful-shutdo".into())
    );
    assert_eq!(PreStopHandler::HttpGet.exec_comm(), None);
}

#[test]
fn exit_within_grace() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(103 * S, None, Some(SIGTERM)).clone();
    assert_eq!(report.expected_kill_after_ns, 30 * S);
    assert!(report.expected_kill_exact);
    assert_eq!(
        report.stop_signal.as_ref().map(|s| (s.time.ns(), s.signal, s.matches_configured)),
        Some((100 * S, 15, true))
    );
    match report.outcome {
        TerminationOutcome::ExitedWithinGrace { duration_ns, grace_used_ratio } => {
            assert_eq!(duration_ns, 3 * S);
            assert!((grace_used_ratio - 0.1).abs() < 1e-9);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sigterm_exit_143_with_earlier_child_oom_is_not_oom_killed() {
    // A child was OOM-killed earlier (the cgroup's oom_kill counter is non-zero); the init
    // then exits 143 on SIGTERM. Runtimes reading the counter call this OOMKilled (#140718).
    let mut t = tracker_with(TerminationSettings::default());
    t.on_oom_kill(50 * S, false);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(101 * S, Some(143), None);
    assert!(matches!(report.outcome, TerminationOutcome::ExitedWithinGrace { .. }));
    assert_eq!(report.oom_kills, 1);
    assert_eq!(report.oom_victim, Some(OomVictim::Child), "the kernel knows it was a child");
}

#[test]
fn sigkill_at_grace_is_a_violation() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_listen(10 * S);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    t.on_listener_accept(99 * S);
    t.on_listener_accept(101 * S);
    t.on_listener_accept(120 * S);
    t.on_signal(130 * S + 90 * MS, SIGKILL, runtime(), true);
    let report = t.on_init_exit(130 * S + 91 * MS, None, Some(SIGKILL));
    assert_eq!(
        report.outcome,
        TerminationOutcome::SigkilledAfterGrace {
            grace_ns: 30 * S,
            stop_to_kill_ns: 30 * S + 90 * MS,
            expected_kill_after_ns: 30 * S,
            sender: Some(SignalSender::Runtime),
            accepts_after_stop: 2,
            still_listening: true,
        }
    );
}

#[test]
fn deletion_grace_wins_and_early_kills_are_flagged() {
    let settings = TerminationSettings { deletion_grace_ns: Some(10 * S), ..Default::default() };
    let mut t = tracker_with(settings);
    t.on_listen(S);
    t.on_listen_close(99 * S);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    t.on_signal(105 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(105 * S, None, Some(SIGKILL));
    assert_eq!(report.grace_ns, 10 * S);
    match &report.outcome {
        TerminationOutcome::SigkilledEarly {
            still_listening, expected_kill_after_ns, stop_to_kill_ns, sender, ..
        } => {
            assert_eq!(*expected_kill_after_ns, 10 * S);
            assert_eq!(*stop_to_kill_ns, 5 * S);
            assert_eq!(sender, &Some(SignalSender::Runtime), "who killed it early");
            assert!(!*still_listening);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pre_stop_elapsed_whole_seconds_are_subtracted() {
    let settings = TerminationSettings { pre_stop: exec_pre_stop(&["/bin/sh", "-c", "sleep 5"]), ..Default::default() };
    let mut t = tracker_with(settings);
    // An exec probe running the same program earlier must not be taken for the hook.
    t.on_exec_session(80 * S, Some(80 * S + 20 * MS), "sh");
    t.on_exec_session(90 * S, None, "sh");
    t.on_exec_session(90 * S, Some(95 * S + 800 * MS), "sh");
    t.on_signal(95 * S + 900 * MS, SIGTERM, runtime(), true);
    t.on_signal(95 * S + 900 * MS + 25 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(95 * S + 900 * MS + 25 * S, None, Some(SIGKILL)).clone();
    let pre_stop = report.pre_stop.expect("preStop seen");
    assert_eq!(pre_stop.started_at.ns(), 90 * S);
    assert_eq!(pre_stop.duration_ns, Some(5 * S + 800 * MS));
    assert!(!pre_stop.overran_grace);
    // 5.9 s elapsed counts as 5 s: 30 - 5 = 25 s.
    assert_eq!(report.expected_kill_after_ns, 25 * S);
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }));
}

#[test]
fn a_pre_stop_hook_still_running_when_the_grace_ran_out_overran() {
    // Seen on a real kubelet: preStop `sleep 8` with grace 5. The kubelet's timer starts before
    // runc has the hook's process running, so at the stop signal the session is just under 5 s
    // old; it was still running, so the kubelet gave up on it.
    let settings =
        TerminationSettings { grace_period_ns: 5 * S, pre_stop: exec_pre_stop(&["sleep", "8"]), ..Default::default() };
    let mut t = tracker_with(settings);
    t.on_exec_session(100 * S + 60 * MS, None, "sleep");
    t.on_signal(105 * S + 2 * MS, SIGTERM, runtime(), true);
    let report = t.on_init_exit(105 * S + 300 * MS, None, Some(SIGTERM));
    let pre_stop = report.pre_stop.as_ref().expect("the hook was seen");
    assert!(pre_stop.overran_grace, "{pre_stop:?}");
    assert_eq!(report.expected_kill_after_ns, MINIMUM_GRACE_NS);
}

#[test]
fn pre_stop_overrun_leaves_the_two_second_floor() {
    let settings = TerminationSettings {
        grace_period_ns: 10 * S,
        pre_stop: exec_pre_stop(&["sleep", "3600"]),
        ..Default::default()
    };
    let mut t = tracker_with(settings);
    t.on_exec_session(100 * S, None, "sleep");
    t.on_signal(110 * S + 5 * MS, SIGTERM, runtime(), true);
    t.on_signal(112 * S + 10 * MS, SIGKILL, runtime(), true);
    let report = t.on_init_exit(112 * S + 11 * MS, None, Some(SIGKILL));
    assert_eq!(report.expected_kill_after_ns, MINIMUM_GRACE_NS);
    assert!(report.pre_stop.as_ref().is_some_and(|p| p.overran_grace));
    match &report.outcome {
        TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, .. } => {
            assert_eq!(*stop_to_kill_ns, 2 * S + 5 * MS);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pre_stop_that_ate_most_of_the_grace_gets_the_floor() {
    let settings = TerminationSettings { pre_stop: exec_pre_stop(&["/bin/drain"]), ..Default::default() };
    let mut t = tracker_with(settings);
    t.on_exec_session(100 * S, Some(129 * S + 500 * MS), "drain");
    t.on_signal(129 * S + 510 * MS, SIGTERM, runtime(), true);
    t.on_signal(131 * S + 520 * MS, SIGKILL, runtime(), true);
    let report = t.on_init_exit(131 * S + 520 * MS, None, Some(SIGKILL));
    // 29 whole seconds elapsed: 30 - 29 = 1 s, raised to the 2 s floor.
    assert_eq!(report.expected_kill_after_ns, 2 * S);
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }));
}

#[test]
fn sleep_hook_and_invisible_hooks() {
    let sleep = TerminationSettings { pre_stop: Some(PreStopHandler::Sleep { seconds: 5 }), ..Default::default() };
    let mut t = tracker_with(sleep);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(101 * S, Some(0), None);
    assert_eq!((report.expected_kill_after_ns, report.expected_kill_exact), (25 * S, true));

    let http = TerminationSettings { pre_stop: Some(PreStopHandler::HttpGet), ..Default::default() };
    let mut t = tracker_with(http);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(101 * S, Some(0), None);
    assert_eq!((report.expected_kill_after_ns, report.expected_kill_exact), (2 * S, false));
}

#[test]
fn sigkill_without_stop_signal() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(100 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
    assert_eq!(report.outcome, TerminationOutcome::KilledWithoutGrace { sender: Some(SignalSender::Runtime) });

    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(100 * S, SIGKILL, SignalSender::other("kill", 99), true);
    let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
    assert_eq!(
        report.outcome,
        TerminationOutcome::KilledWithoutGrace { sender: Some(SignalSender::other("kill", 99)) }
    );
}

#[test]
fn a_sigkill_within_a_grace_period_of_the_agents_start_may_follow_an_unseen_stop_signal() {
    // Default grace 30 s; the agent began watching at 100 s (it restarted mid-termination).
    let kill_at = |at: u64| {
        let mut t = tracker_with(TerminationSettings::default());
        t.watched_since(100 * S);
        t.on_signal(at, SIGKILL, runtime(), true);
        t.on_init_exit(at + MS, None, Some(SIGKILL)).clone()
    };
    let early = kill_at(120 * S);
    assert_eq!(early.outcome, TerminationOutcome::StopSignalNotObserved { sender: Some(runtime()) });
    assert_eq!(early.watched_since.map(BootTime::ns), Some(100 * S));
    // Long after the start, no stop signal before watching can explain it.
    assert_eq!(kill_at(200 * S).outcome, TerminationOutcome::KilledWithoutGrace { sender: Some(runtime()) });
    // A stop signal seen after the start is judged as always.
    let mut t = tracker_with(TerminationSettings::default());
    t.watched_since(100 * S);
    t.on_signal(101 * S, SIGTERM, runtime(), true);
    t.on_signal(131 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(131 * S + MS, None, Some(SIGKILL));
    assert_eq!(report.outcome.kind(), OutcomeKind::SigkilledAfterGrace);
}

#[test]
fn oom_kill_of_the_init() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_oom_kill(100 * S, true);
    t.on_signal(100 * S, SIGKILL, SignalSender::SameContainer, true);
    let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
    assert_eq!(report.outcome, TerminationOutcome::OomKilled);
    assert_eq!(report.oom_kills, 1);
    assert_eq!(report.oom_victim, Some(OomVictim::Init));

    // The event names another victim, but nothing else sent the init a SIGKILL: the OOM
    // killer (a group kill the caller did not attribute) is the only candidate.
    let mut t = tracker_with(TerminationSettings::default());
    t.on_oom_kill(100 * S, false);
    let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
    assert_eq!(report.outcome, TerminationOutcome::OomKilled);
}

#[test]
fn exit_137_without_an_oom_event_is_not_oom() {
    let mut t = tracker_with(TerminationSettings::default());
    let report = t.on_init_exit(100 * S, Some(137), None);
    assert_eq!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(137), signal: None });
}

#[test]
fn child_oom_then_grace_kill_is_a_grace_kill() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_oom_kill(90 * S, false);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    t.on_signal(130 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(130 * S, None, Some(SIGKILL));
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }));
}

#[test]
fn crash_and_completion_have_no_stop_signal() {
    let mut t = tracker_with(TerminationSettings::default());
    // The app signalling itself is not a stop.
    t.on_signal(99 * S, SIGTERM, SignalSender::SameContainer, true);
    let report = t.on_init_exit(100 * S, None, Some(11));
    assert_eq!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: None, signal: Some(11) });
    let mut t = tracker_with(TerminationSettings::default());
    let report = t.on_init_exit(100 * S, Some(0), None);
    assert_eq!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(0), signal: None });
}

#[test]
fn signals_to_other_processes_and_after_exit_do_not_count() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(90 * S, SIGTERM, runtime(), false);
    t.on_signal(101 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(100 * S, Some(1), None);
    assert!(report.stop_signal.is_none());
    // The report is fixed at the first exit.
    let again = t.on_init_exit(200 * S, Some(0), None);
    assert_eq!(again.exit_time.ns(), 100 * S);
}

#[test]
fn an_unexpected_stop_signal_is_reported() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(100 * S, 3, runtime(), true);
    let report = t.on_init_exit(100 * S + 10 * MS, None, Some(3));
    assert_eq!(report.stop_signal.as_ref().map(|s| s.matches_configured), Some(false));
}

fn report_of(is_sidecar: bool, stop_at: Option<u64>, exit_at: u64) -> TerminationReport {
    let mut t = tracker_with(TerminationSettings { is_sidecar, ..Default::default() });
    if let Some(at) = stop_at {
        t.on_signal(at, SIGTERM, runtime(), true);
    }
    t.on_init_exit(exit_at, None, Some(SIGTERM)).clone()
}

#[test]
fn sidecars_stopped_after_mains_in_reverse_order_comply() {
    let proxy = report_of(true, Some(112 * S), 113 * S);
    let logs = report_of(true, Some(110 * S), 111 * S);
    let app = report_of(false, Some(100 * S), 105 * S);
    let worker = report_of(false, Some(100 * S), 109 * S);
    let order = sidecar_order([("proxy", &proxy), ("logs", &logs), ("app", &app), ("worker", &worker)]);
    assert_eq!(order.len(), 2);
    assert!(order.iter().all(|o| o.verdict == SidecarVerdict::InOrder), "{order:?}");
    assert_eq!(order[0].last_main_exit.map(BootTime::ns), Some(109 * S));
}

#[test]
fn sidecar_signalled_with_the_mains_is_a_violation() {
    let proxy = report_of(true, Some(100 * S), 101 * S);
    let app = report_of(false, Some(100 * S), 105 * S);
    let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
    assert_eq!(order[0].verdict, SidecarVerdict::SignalledBeforeMainExited { main_container: "app".into() });
}

/// Issue 40: the pod's grace (10 s) runs out while `app` ignores TERM. The kubelet stops the
/// sidecar at the deadline with the 2 s floor; its TERM lands 5 ms before `app`'s SIGKILL exit.
#[test]
fn a_sidecar_stopped_when_the_pods_grace_ran_out_is_the_kubelets_rule_with_its_two_seconds() {
    let turn = SidecarTurn { waited_ns: 10 * S - 5_000_000, pod_grace_ns: 10 * S };
    assert_eq!(turn.remaining_grace_ns(), 2 * S, "10 s less 9 whole seconds waited, raised to the 2 s floor");
    let mut t = tracker_with(TerminationSettings { is_sidecar: true, grace_period_ns: 10 * S, ..Default::default() });
    t.on_signal(110 * S - 5_000_000, SIGTERM, runtime(), true);
    t.on_sidecar_turn(turn);
    // It ignores TERM too: the runtime kills it 2 s later, as the kubelet asked.
    t.on_signal(112 * S - 5_000_000, SIGKILL, runtime(), true);
    let proxy = t.on_init_exit(112 * S - 4_000_000, None, Some(SIGKILL)).clone();
    assert_eq!((proxy.grace_ns, proxy.expected_kill_after_ns, proxy.expected_kill_exact), (2 * S, 2 * S, true));
    assert!(matches!(proxy.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, .. } if grace_ns == 2 * S));
    let mut a = tracker_with(TerminationSettings { grace_period_ns: 10 * S, ..Default::default() });
    a.on_signal(100 * S, SIGTERM, runtime(), true);
    a.on_signal(110 * S, SIGKILL, runtime(), true);
    let app = a.on_init_exit(110 * S, None, Some(SIGKILL)).clone();
    let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
    assert_eq!(order[0].verdict, SidecarVerdict::AtGraceDeadline { main_container: "app".into() });

    // The same early TERM half-way through the grace is still a violation.
    let early = SidecarTurn { waited_ns: 5 * S, pod_grace_ns: 10 * S };
    let mut t = tracker_with(TerminationSettings { is_sidecar: true, grace_period_ns: 10 * S, ..Default::default() });
    t.on_signal(105 * S, SIGTERM, runtime(), true);
    t.on_sidecar_turn(early);
    let proxy = t.on_init_exit(105 * S + S / 10, None, Some(SIGTERM)).clone();
    assert_eq!(proxy.grace_ns, 5 * S, "10 s less the 5 whole seconds it waited");
    let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
    assert_eq!(order[0].verdict, SidecarVerdict::SignalledBeforeMainExited { main_container: "app".into() });
}

#[test]
fn sidecars_out_of_reverse_order_are_flagged() {
    let first = report_of(true, Some(110 * S), 111 * S);
    let second = report_of(true, Some(110 * S), 112 * S);
    let app = report_of(false, Some(100 * S), 105 * S);
    let order = sidecar_order([("first", &first), ("second", &second), ("app", &app)]);
    assert_eq!(order[0].verdict, SidecarVerdict::SignalledBeforeLaterSidecarExited { sidecar: "second".into() });
    assert_eq!(order[1].verdict, SidecarVerdict::InOrder);
}

#[test]
fn sidecar_killed_in_an_emergency_was_not_signalled() {
    let mut t = tracker_with(TerminationSettings { is_sidecar: true, ..Default::default() });
    t.on_signal(130 * S, SIGKILL, runtime(), true);
    let proxy = t.on_init_exit(130 * S, None, Some(SIGKILL)).clone();
    assert!(!proxy.expected_kill_exact);
    let app = report_of(false, Some(100 * S), 130 * S);
    let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
    assert_eq!(order[0].verdict, SidecarVerdict::NotSignalled);
}

#[test]
fn reports_serialize() {
    let report = report_of(false, Some(100 * S), 101 * S);
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["outcome"]["kind"], "exited_within_grace");
    assert_eq!(json["stop_signal"]["sender"]["kind"], "runtime");
}

#[test]
fn a_flood_of_ignored_signals_to_the_init_is_bounded_and_the_verdict_still_right() {
    // The attack of issue 18: the app's own children send SIGHUP to PID 1 (which ignores it) in
    // a loop, for months. Before the bound every one was kept.
    let settings = TerminationSettings { deletion_grace_ns: Some(10 * S), ..Default::default() };
    let mut t = tracker_with(settings);
    let mut dropped = 0;
    for i in 0..100_000 {
        if t.on_signal(i * MS, 1, SignalSender::SameContainer, true) == Retention::DroppedOne {
            dropped += 1;
        }
    }
    t.on_signal(200 * S, SIGTERM, runtime(), true);
    // The flood goes on through the grace period.
    for i in 0..10_000 {
        let _ = t.on_signal(200 * S + i * MS, 1, SignalSender::SameContainer, true);
        let _ = t.on_listener_accept(200 * S + i * MS + 1);
    }
    t.on_signal(210 * S + 5 * MS, SIGKILL, runtime(), true);
    assert!(t.records_held() <= 4 * MAX_KEPT_RECORDS, "held {}", t.records_held());
    assert_eq!(dropped, 100_000 - MAX_KEPT_RECORDS as u64);
    let report = t.on_init_exit(210 * S + 6 * MS, None, Some(SIGKILL));
    match &report.outcome {
        TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, accepts_after_stop, .. } => {
            assert_eq!(*stop_to_kill_ns, 10 * S + 5 * MS, "the pinned stop and kill are the first ones");
            assert_eq!(*accepts_after_stop, 10_000, "accepts past the kept times are still counted");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(report.stop_signal.as_ref().map(|s| s.time.ns()), Some(200 * S));
}

#[test]
fn the_earliest_stop_signal_is_pinned_even_when_records_arrive_out_of_order() {
    let mut t = tracker_with(TerminationSettings::default());
    t.on_signal(101 * S, SIGTERM, runtime(), true);
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    let report = t.on_init_exit(102 * S, Some(143), None);
    assert_eq!(report.stop_signal.as_ref().map(|s| s.time.ns()), Some(100 * S));
}

#[test]
fn oom_kills_exec_sessions_and_listener_changes_are_bounded() {
    let mut t = tracker_with(TerminationSettings::default());
    for i in 0..10_000 {
        let _ = t.on_oom_kill(i * MS, false);
        // Sessions that never end: before the bound only ended ones made room.
        let _ = t.on_exec_session(i * MS, None, "sh");
    }
    t.on_signal(100 * S, SIGTERM, runtime(), true);
    for i in 0..10_000 {
        let _ = t.on_listen(100 * S + 2 * i * MS);
        let _ = t.on_listen_close(100 * S + (2 * i + 1) * MS);
    }
    let _ = t.on_listen(200 * S);
    assert!(t.records_held() <= 4 * MAX_KEPT_RECORDS, "held {}", t.records_held());
    t.on_signal(210 * S, SIGKILL, runtime(), true);
    let report = t.on_init_exit(210 * S, None, Some(SIGKILL));
    assert_eq!(report.oom_kills, 10_000, "every kill is counted");
    match &report.outcome {
        TerminationOutcome::SigkilledAfterGrace { still_listening, .. } => {
            assert!(*still_listening, "the folded changes leave the last listener open")
        }
        other => panic!("{other:?}"),
    }
}
