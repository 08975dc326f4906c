//! Container states over hand-made instance histories.

use super::*;
use crate::backoff::{BackoffPolicy, Tolerance};

const S: u64 = crate::time::SECOND;

fn at(ns: u64) -> BootTime {
    BootTime::from_ns(ns)
}
const UID: &str = "0b0f2e4b-2d44-4d2a-9a5f-3c1b6a7e8f90";

fn status() -> ContainerStatus {
    ContainerStatus::new(UID, "app")
}

fn backoff() -> BackoffTracker {
    BackoffTracker::new(Some(BackoffPolicy::default()), Tolerance::default())
}

fn always() -> RestartSpec {
    RestartSpec::default()
}

fn terminated(
    reason: TerminatedReason,
    exit_code: i32,
    signal: Option<u8>,
    started: u64,
    finished: u64,
) -> ContainerState {
    ContainerState::Terminated { reason, exit_code, signal, started_at: Some(at(started)), finished_at: at(finished) }
}

#[test]
fn created_then_running_then_completed() {
    let mut c = status();
    assert_eq!(c.state(), &ContainerState::creating());
    c.on_instance_created(at(S));
    assert_eq!(c.state(), &ContainerState::creating());
    c.on_init_started(at(2 * S));
    assert_eq!(c.state(), &ContainerState::Running { started_at: at(2 * S) });
    c.on_init_started(at(3 * S)); // a later exec is not a start
    assert_eq!(c.state(), &ContainerState::Running { started_at: at(2 * S) });
    c.on_init_exited(at(10 * S), Some(0), None, false);
    assert_eq!(c.state(), &terminated(TerminatedReason::Completed, 0, None, 2 * S, 10 * S));
    assert_eq!(c.restart_count(), 0);
}

#[test]
fn exit_reasons_and_codes() {
    let cases = [
        (Some(1), None, false, TerminatedReason::Error, 1, None),
        (Some(143), None, false, TerminatedReason::Error, 143, None),
        (None, Some(15), false, TerminatedReason::Error, 143, Some(15)),
        (None, Some(9), false, TerminatedReason::Error, 137, Some(9)),
        (None, Some(9), true, TerminatedReason::OomKilled, 137, Some(9)),
        (None, None, false, TerminatedReason::Unknown, -1, None),
    ];
    for (status, signal, oom, reason, code, want_signal) in cases {
        let mut c = status_running();
        c.on_init_exited(at(10 * S), status, signal, oom);
        assert_eq!(c.state(), &terminated(reason, code, want_signal, S, 10 * S), "{status:?} {signal:?} {oom}");
    }
}

fn status_running() -> ContainerStatus {
    let mut c = status();
    c.on_instance_created(at(0));
    c.on_init_started(at(S));
    c
}

#[test]
fn sigterm_exit_is_never_oom_killed() {
    let mut c = status_running();
    c.on_init_exited(at(10 * S), None, Some(15), false);
    assert!(matches!(c.state(), ContainerState::Terminated { reason: TerminatedReason::Error, exit_code: 143, .. }));
}

#[test]
fn a_restart_moves_the_termination_to_last_state() {
    let mut c = status_running();
    c.on_init_exited(at(10 * S), Some(1), None, false);
    c.on_instance_created(at(11 * S));
    assert_eq!(c.restart_count(), 1);
    assert_eq!(c.state(), &ContainerState::creating());
    assert_eq!(c.last_state(), Some(&terminated(TerminatedReason::Error, 1, None, S, 10 * S)));
    c.on_init_started(at(12 * S));
    assert_eq!(c.state(), &ContainerState::Running { started_at: at(12 * S) });
    assert_eq!(c.last_state(), Some(&terminated(TerminatedReason::Error, 1, None, S, 10 * S)));
}

#[test]
fn missed_events_still_count_instances() {
    // The new cgroup was not seen: the start after a termination is the new instance.
    let mut c = status_running();
    c.on_init_exited(at(10 * S), Some(1), None, false);
    c.on_init_started(at(20 * S));
    assert_eq!(c.restart_count(), 1);
    assert_eq!(c.state(), &ContainerState::Running { started_at: at(20 * S) });
    // The exit was not seen: a new cgroup while running is still a new instance.
    c.on_instance_created(at(30 * S));
    assert_eq!(c.restart_count(), 2);
    assert_eq!(c.state(), &ContainerState::creating());
    // An exit without a seen start.
    c.on_init_exited(at(31 * S), Some(2), None, false);
    assert!(matches!(c.state(), ContainerState::Terminated { started_at: None, exit_code: 2, .. }));
    // A duplicate exit changes nothing.
    c.on_init_exited(at(32 * S), Some(0), None, false);
    assert!(matches!(c.state(), ContainerState::Terminated { finished_at, .. } if *finished_at == at(31 * S)));
}

#[test]
fn crash_loop_back_off_is_shown_while_the_back_off_holds() {
    let mut c = status();
    let mut b = backoff();
    c.on_instance_created(at(0));
    c.on_init_started(at(S));
    b.on_started(at(S), None);
    // First crash: restarted at once, so no CrashLoopBackOff.
    c.on_init_exited(at(2 * S), Some(1), None, false);
    b.on_finished(at(2 * S));
    let first = c.state_at(at(2 * S), &always(), &b);
    assert!(matches!(first.state, ContainerState::Terminated { .. }));
    assert!(first.restart_expected);
    assert_eq!(first.back_off_remaining_ns, None);
    c.on_instance_created(at(3 * S));
    c.on_init_started(at(3 * S));
    b.on_started(at(3 * S), None);
    // Second crash: 10 s back-off.
    c.on_init_exited(at(4 * S), Some(1), None, false);
    b.on_finished(at(4 * S));
    let waiting = c.state_at(at(6 * S), &always(), &b);
    assert_eq!(
        waiting.state,
        ContainerState::Waiting {
            reason: WaitingReason::CrashLoopBackOff,
            message: format!("back-off 10s restarting failed container=app pod={UID}"),
        }
    );
    assert_eq!(waiting.last_state, Some(terminated(TerminatedReason::Error, 1, None, 3 * S, 4 * S)));
    assert_eq!(waiting.back_off_remaining_ns, Some(8 * S));
    assert_eq!(waiting.restart_count, 1);
    // Elapsed but not yet restarted: the kubelet still shows CrashLoopBackOff.
    let due = c.state_at(at(20 * S), &always(), &b);
    assert!(matches!(due.state, ContainerState::Waiting { reason: WaitingReason::CrashLoopBackOff, .. }));
    assert_eq!(due.back_off_remaining_ns, Some(0));
    // Restarted.
    c.on_instance_created(at(15 * S));
    c.on_init_started(at(15 * S));
    b.on_started(at(15 * S), None);
    let running = c.state_at(at(16 * S), &always(), &b);
    assert_eq!(running.state, ContainerState::Running { started_at: at(15 * S) });
    assert_eq!(running.restart_count, 2);
}

#[test]
fn whether_the_back_off_is_shown_does_not_move_with_time_alone() {
    // Readers keep what they derive from a status until the status changes (the agent's scrape
    // cache): what `state_at` shows, apart from the time remaining, must not depend on `now`.
    let never = RestartSpec { pod_restart_policy: RestartPolicy::Never, ..Default::default() };
    let (c, b) = second_crash(Some(1), None);
    let mut first = status_running();
    let mut first_b = backoff();
    first_b.on_started(at(S), None);
    first.on_init_exited(at(2 * S), Some(1), None, false);
    first_b.on_finished(at(2 * S));
    let cases = [(&c, &always(), &b, Some(10 * S)), (&c, &never, &b, None), (&first, &always(), &first_b, None)];
    for (status, restart, backoff, delay) in cases {
        assert_eq!(status.pending_back_off_ns(restart, backoff), delay);
        let shown = status.state_at(at(0), restart, backoff);
        for now in [S, 4 * S, 13 * S, 14 * S, 15 * S, 3600 * S, u64::MAX / 2] {
            let later = status.state_at(at(now), restart, backoff);
            assert_eq!(later.state, shown.state, "at {now}");
            assert_eq!(later.last_state, shown.last_state, "at {now}");
            assert_eq!(shows_back_off(&later), delay.is_some(), "at {now}");
        }
    }
}

/// Drives a container to its second crash, so a restart would be held by a 10 s back-off.
fn second_crash(exit_status: Option<u8>, signal: Option<u8>) -> (ContainerStatus, BackoffTracker) {
    let mut c = status();
    let mut b = backoff();
    c.on_instance_created(at(0));
    c.on_init_started(at(S));
    b.on_started(at(S), None);
    c.on_init_exited(at(2 * S), Some(1), None, false);
    b.on_finished(at(2 * S));
    c.on_instance_created(at(3 * S));
    c.on_init_started(at(3 * S));
    b.on_started(at(3 * S), None);
    c.on_init_exited(at(4 * S), exit_status, signal, false);
    b.on_finished(at(4 * S));
    (c, b)
}

fn shows_back_off(snapshot: &ContainerStatusSnapshot) -> bool {
    matches!(snapshot.state, ContainerState::Waiting { reason: WaitingReason::CrashLoopBackOff, .. })
}

#[test]
fn restart_policies() {
    let on_failure = RestartSpec { pod_restart_policy: RestartPolicy::OnFailure, ..Default::default() };
    let never = RestartSpec { pod_restart_policy: RestartPolicy::Never, ..Default::default() };

    let (c, b) = second_crash(Some(0), None);
    assert!(shows_back_off(&c.state_at(at(5 * S), &always(), &b)), "Always restarts a success");
    let done = c.state_at(at(5 * S), &on_failure, &b);
    assert!(!done.restart_expected);
    assert_eq!(done.state, terminated(TerminatedReason::Completed, 0, None, 3 * S, 4 * S));

    let (c, b) = second_crash(Some(3), None);
    assert!(shows_back_off(&c.state_at(at(5 * S), &on_failure, &b)));
    let failed = c.state_at(at(5 * S), &never, &b);
    assert!(!failed.restart_expected);
    assert!(matches!(failed.state, ContainerState::Terminated { exit_code: 3, .. }));
}

#[test]
fn init_containers_and_sidecars() {
    let init_always = RestartSpec { is_init_container: true, ..Default::default() };
    assert!(init_always.should_restart(1));
    assert!(!init_always.should_restart(0), "a regular init container that succeeded is done");
    let init_never =
        RestartSpec { is_init_container: true, pod_restart_policy: RestartPolicy::Never, ..Default::default() };
    assert!(!init_never.should_restart(1));
    let sidecar = RestartSpec {
        is_init_container: true,
        pod_restart_policy: RestartPolicy::Never,
        container_restart_policy: Some(RestartPolicy::Always),
        ..Default::default()
    };
    assert!(sidecar.is_sidecar());
    assert!(sidecar.should_restart(0) && sidecar.should_restart(1));
    assert!(!always().is_sidecar());
}

#[test]
fn restart_rules_come_before_restart_policies() {
    let retry_on_42 = RestartSpec {
        pod_restart_policy: RestartPolicy::Always,
        container_restart_policy: Some(RestartPolicy::Never),
        restart_policy_rules: vec![RestartRule {
            action: RestartRuleAction::Restart,
            operator: ExitCodeOperator::In,
            values: vec![42],
        }],
        is_init_container: false,
        pod_terminating: false,
    };
    assert!(retry_on_42.should_restart(42));
    let deleted = RestartSpec { pod_terminating: true, ..retry_on_42.clone() };
    assert!(!deleted.should_restart(42), "a pod being deleted restarts nothing");
    assert!(!retry_on_42.should_restart(1), "no rule matched: the container's Never applies");
    assert!(!retry_on_42.should_restart(0));

    let retry_unless_done = RestartSpec {
        pod_restart_policy: RestartPolicy::Never,
        container_restart_policy: Some(RestartPolicy::Never),
        restart_policy_rules: vec![RestartRule {
            action: RestartRuleAction::Restart,
            operator: ExitCodeOperator::NotIn,
            values: vec![0, 2],
        }],
        is_init_container: false,
        pod_terminating: false,
    };
    assert!(retry_unless_done.should_restart(1));
    assert!(retry_unless_done.should_restart(137));
    assert!(!retry_unless_done.should_restart(0));
    assert!(!retry_unless_done.should_restart(2));

    // The rule applies to the exit code as runtimes report it (128 + signal).
    let (c, b) = second_crash(None, Some(9));
    let retry_on_kill = RestartSpec {
        pod_restart_policy: RestartPolicy::Never,
        container_restart_policy: Some(RestartPolicy::Never),
        restart_policy_rules: vec![RestartRule {
            action: RestartRuleAction::Restart,
            operator: ExitCodeOperator::In,
            values: vec![137],
        }],
        is_init_container: false,
        pod_terminating: false,
    };
    assert!(shows_back_off(&c.state_at(at(5 * S), &retry_on_kill, &b)));
}

#[test]
fn a_tracker_waiting_on_another_exit_is_not_trusted() {
    let (c, _) = second_crash(Some(1), None);
    let mut other = backoff();
    other.on_started(at(0), None);
    other.on_finished(at(S));
    other.on_started(at(2 * S), None);
    other.on_finished(at(99 * S));
    let snapshot = c.state_at(at(100 * S), &always(), &other);
    assert!(snapshot.restart_expected);
    assert!(matches!(snapshot.state, ContainerState::Terminated { .. }));
}

#[test]
fn go_durations() {
    assert_eq!(go_duration(10 * S), "10s");
    assert_eq!(go_duration(80 * S), "1m20s");
    assert_eq!(go_duration(300 * S), "5m0s");
    assert_eq!(go_duration(3600 * S), "1h0m0s");
    assert_eq!(go_duration(S + S / 2), "1.5s");
    assert_eq!(go_duration(S / 2), "500ms");
    assert_eq!(go_duration(0), "0s");
}

#[test]
fn snapshots_serialize_like_the_api() {
    let (c, b) = second_crash(None, Some(9));
    let json = serde_json::to_value(c.state_at(at(5 * S), &always(), &b)).expect("json");
    assert_eq!(json["state"]["state"], "waiting");
    assert_eq!(json["state"]["reason"], "CrashLoopBackOff");
    assert_eq!(json["last_state"]["reason"], "Error");
    assert_eq!(json["last_state"]["exit_code"], 137);
    let mut oom = status_running();
    oom.on_init_exited(at(2 * S), None, Some(9), true);
    let json = serde_json::to_value(oom.state()).expect("json");
    assert_eq!(json["reason"], "OOMKilled");
}
