//! A plain host's units: stops judged whoever sent the stop signal, by systemd's rules for its
//! units and by none for a cgroup nobody manages, their restarts against `Restart=`, and every
//! stop kept to be explained (issue 41).

use super::*;
use crate::systemd::{RestartPolicy, SystemdUnit};
use crate::termination::{StopRules, SIGKILL, SIGTERM};

/// A host cgroup with one process, `pid`, started at 1 s.
fn host_unit(path: &str, cgroup: u64, pid: u32) -> NodeTracker {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, cgroup, path));
    tracker.apply(&exec(SECOND, pid, cgroup, 1, "app"));
    tracker
}

fn last_termination(tracker: &NodeTracker, now: u64) -> crate::termination::TerminationReport {
    only_view(tracker, now).last_termination.expect("judged")
}

#[test]
fn a_process_killed_by_an_operators_kill_shows_the_signal_and_who_sent_it() {
    let mut tracker = host_unit("/t", 40, 100);
    tracker.apply(&signal(5 * SECOND, (900, 1, "bash"), (100, 40), u32::from(SIGTERM)));
    tracker.apply(&exit(5 * SECOND + 1000, 100, 40, None, Some(SIGTERM)));
    let report = last_termination(&tracker, 6 * SECOND);
    let stop = report.stop_signal.as_ref().expect("the kill's SIGTERM is the stop signal");
    assert_eq!((stop.signal, &stop.sender), (SIGTERM, &SignalSender::other("bash", 900)));
    assert_eq!(report.rules, StopRules::Unmanaged, "nobody promised this cgroup a grace");
    assert_eq!(report.outcome, TerminationOutcome::ExitedAfterStopSignal { duration_ns: 1000 });
}

#[test]
fn a_term_ignored_then_a_kill_on_a_plain_cgroup_is_reported_not_judged() {
    let mut tracker = host_unit("/t", 40, 100);
    tracker.apply(&signal(5 * SECOND, (900, 1, "bash"), (100, 40), u32::from(SIGTERM)));
    tracker.apply(&signal(8 * SECOND, (901, 1, "bash"), (100, 40), u32::from(SIGKILL)));
    tracker.apply(&exit(8 * SECOND, 100, 40, None, Some(SIGKILL)));
    let report = last_termination(&tracker, 9 * SECOND);
    assert_eq!(report.stop_signal.as_ref().map(|s| s.signal), Some(SIGTERM), "{report:?}");
    assert_eq!(
        report.outcome,
        TerminationOutcome::SigkilledAfterStopSignal {
            stop_to_kill_ns: 3 * SECOND,
            sender: Some(SignalSender::other("bash", 901))
        }
    );
    // Kept, so `explain host/t` has it after the cgroup is gone.
    let kept = tracker.snapshot().history_of_host_unit("/t");
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].last_termination.outcome, report.outcome);
}

#[test]
fn a_signal_that_kills_is_the_stop_signal_even_when_it_is_no_usual_one() {
    let mut tracker = host_unit("/t", 40, 100);
    const SIGUSR1: u8 = 10;
    tracker.apply(&signal(5 * SECOND, (900, 1, "bash"), (100, 40), u32::from(SIGUSR1)));
    tracker.apply(&exit(5 * SECOND, 100, 40, None, Some(SIGUSR1)));
    let report = last_termination(&tracker, 6 * SECOND);
    assert_eq!(report.stop_signal.as_ref().map(|s| s.signal), Some(SIGUSR1), "never 'no stop signal': {report:?}");
    // A reload request the process survives is no stop: a later crash is its own.
    let mut tracker = host_unit("/t", 40, 100);
    tracker.apply(&signal(5 * SECOND, (900, 1, "logrotate"), (100, 40), 1));
    tracker.apply(&exit(9 * SECOND, 100, 40, Some(1), None));
    let report = last_termination(&tracker, 10 * SECOND);
    assert!(matches!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { .. }), "{report:?}");
}

fn service(timeout_stop_s: u64, restart: RestartPolicy) -> SystemdUnit {
    SystemdUnit {
        name: "web.service".into(),
        timeout_stop_ns: Some(timeout_stop_s * SECOND),
        restart,
        restart_ns: 2 * SECOND,
        ..SystemdUnit::default()
    }
}

#[test]
fn systemctl_stop_escalated_to_sigkill_is_judged_against_timeout_stop_sec() {
    let path = "/system.slice/web.service";
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, path));
    let first = tracker.apply(&exec(SECOND, 100, 42, 1, "web"));
    assert!(
        first.notices.contains(&Notice::SystemdUnitWanted { path: path.into(), unit: "web.service".into() }),
        "{:?}",
        first.notices
    );
    // The view says which settings will judge its stops, once they are read.
    assert_eq!(only_view(&tracker, 2 * SECOND).systemd, None);
    let _ = tracker.set_systemd_unit(path, service(2, RestartPolicy::No));
    let shown = only_view(&tracker, 3 * SECOND).systemd.expect("the settings read");
    assert_eq!((shown.name.as_str(), shown.timeout_stop_ns), ("web.service", Some(2 * SECOND)));
    tracker.apply(&signal(5 * SECOND, (1, 1, "systemd"), (100, 42), u32::from(SIGTERM)));
    tracker.apply(&signal(7 * SECOND, (1, 1, "systemd"), (100, 42), u32::from(SIGKILL)));
    tracker.apply(&exit(7 * SECOND, 100, 42, None, Some(SIGKILL)));
    let report = last_termination(&tracker, 8 * SECOND);
    assert_eq!(report.rules, StopRules::Systemd);
    assert_eq!(report.stop_signal.as_ref().map(|s| &s.sender), Some(&SignalSender::other("systemd", 1)));
    assert!(
        matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, stop_to_kill_ns, .. }
            if grace_ns == 2 * SECOND && stop_to_kill_ns == 2 * SECOND),
        "it ignored SIGTERM for its whole TimeoutStopSec=: {:?}",
        report.outcome
    );
}

#[test]
fn a_crash_looping_service_is_judged_against_its_restart_sec() {
    let path = "/system.slice/web.service";
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, path));
    tracker.apply(&exec(SECOND, 100, 42, 1, "web"));
    let _ = tracker.set_systemd_unit(path, service(90, RestartPolicy::OnFailure));
    tracker.apply(&exit(10 * SECOND, 100, 42, Some(1), None));
    tracker.apply(&exec(12 * SECOND, 101, 42, 1, "web"));
    let view = only_view(&tracker, 13 * SECOND);
    let judged = view.last_backoff.expect("a restart systemd was due to make");
    assert_eq!((judged.expected_delay_ns, judged.verdict), (Some(2 * SECOND), Verdict::WithinTolerance));
    // Restarted at once instead of after RestartSec=2s: not what systemd does.
    tracker.apply(&exit(20 * SECOND, 101, 42, Some(1), None));
    tracker.apply(&exec(20 * SECOND + 1000, 102, 42, 1, "web"));
    let view = only_view(&tracker, 21 * SECOND);
    assert_eq!(view.last_backoff.map(|b| (b.restart_number, b.verdict)), Some((2, Verdict::TooEarly)));
    // A plain cgroup restarted by a shell loop gets no verdict: no rule says when.
    let mut tracker = host_unit("/loop", 43, 200);
    tracker.apply(&exit(2 * SECOND, 200, 43, Some(1), None));
    tracker.apply(&exec(3 * SECOND, 201, 43, 1, "app"));
    let view = only_view(&tracker, 4 * SECOND);
    assert_eq!((view.status.restart_count, view.last_backoff), (1, None));
}

#[test]
fn a_kubelet_stop_after_an_operators_signal_starts_the_grace_at_the_kubelets() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let app = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, app, SHIM_CGROUP, "app"));
    tracker.apply(&signal(5 * SECOND, (900, 1, "bash"), (100, app), u32::from(SIGTERM)));
    tracker.apply(&signal(50 * SECOND, (300, SHIM_CGROUP, "containerd-shim"), (100, app), u32::from(SIGTERM)));
    tracker.apply(&signal(80 * SECOND, (300, SHIM_CGROUP, "containerd-shim"), (100, app), u32::from(SIGKILL)));
    tracker.apply(&exit(80 * SECOND, 100, app, None, Some(SIGKILL)));
    let report = last_termination(&tracker, 81 * SECOND);
    assert_eq!(report.stop_signal.as_ref().map(|s| s.time), Some(at(50 * SECOND)), "{report:?}");
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }), "{:?}", report.outcome);
}

#[test]
fn a_sigterm_the_kernel_generated_from_the_shims_read_is_no_stop_signal() {
    // Issue 37: F_SETOWN + O_ASYNC + F_SETSIG(SIGTERM) on its stdout made every read of the
    // runtime's shim a "SIGTERM to PID 1 from the container runtime".
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let app = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, app, SHIM_CGROUP, "app"));
    let mut forged = signal(5 * SECOND, (300, SHIM_CGROUP, "containerd-shim"), (100, app), u32::from(SIGTERM));
    if let Detail::Signal { from_kernel, .. } = &mut forged.detail {
        *from_kernel = true;
    }
    tracker.apply(&forged);
    tracker.apply(&exit(9 * SECOND, 100, app, Some(1), None));
    let report = last_termination(&tracker, 10 * SECOND);
    assert_eq!(report.stop_signal, None, "{report:?}");
    assert!(matches!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { .. }), "{:?}", report.outcome);
}
