//! The stories told of stops the model judged: a shell entrypoint, an early kill, a preStop hook,
//! an operator's `kill`, `systemctl stop` on a plain host.

use super::*;
use crate::{
    node::PastStop,
    spec::StopCause,
    termination::{SignalSender, StopSignalSeen, SIGTERM},
    time::SECOND,
};

fn at(s: f64) -> BootTime {
    BootTime::from_ns((s * SECOND as f64) as u64)
}

fn proc(pid: u32, init: bool, comm: &str, started: f64, got: bool) -> ProcessAtStop {
    ProcessAtStop { pid, init, comm: comm.into(), started_at: at(started), got_stop_signal: got, exec_session: false }
}

/// A TERM-ignoring `java` behind a shell entrypoint, SIGKILLed at its 30 s grace after a deletion.
fn shell_entrypoint() -> PastStop {
    let mut report = TerminationReport::for_tests(0);
    report.cause = Some(StopCause::Deleted);
    report.exit_time = at(130.002);
    report.exit_status = None;
    report.exit_signal = Some(SIGKILL);
    report.stop_signal = Some(StopSignalSeen {
        time: at(100.0),
        signal: SIGTERM,
        sender: SignalSender::Runtime,
        matches_configured: true,
    });
    report.outcome = TerminationOutcome::SigkilledAfterGrace {
        grace_ns: 30 * SECOND,
        stop_to_kill_ns: 30_001_000_000,
        expected_kill_after_ns: 30 * SECOND,
        sender: Some(SignalSender::Runtime),
        accepts_after_stop: 0,
        still_listening: false,
    };
    let scene = vec![proc(4100, true, "sh", 10.0, true), proc(4107, false, "java", 11.0, false)];
    report.scene.running_at_stop = scene.clone();
    report.scene.alive_at_kill = scene;
    PastStop {
        seq: 0,
        namespace: "shop".into(),
        pod: "web-1".into(),
        uid: "uid".into(),
        container: "app".into(),
        container_id: None,
        restart_count: 0,
        last_termination: report,
    }
}

#[test]
fn a_shell_entrypoint_that_kept_term_from_java_is_said_in_the_verdict_and_the_timeline() {
    let stories = explain_history(&[shell_entrypoint()], None);
    let story = &stories[0];
    assert_eq!(
        story.verdict,
        "SIGKILLed 30.0s after SIGTERM: it did not exit within its 30.0s grace; PID 1 `sh` got SIGTERM and did \
         not pass it on: `java` (pid 4107) never got it"
    );
    assert_eq!(story.cause.as_deref(), Some("deleted"));
    let kill = story.timeline.iter().find(|l| l.text.starts_with("SIGKILL")).expect("the SIGKILL line");
    assert_eq!(kill.offset_ms, Some(30_001.0));
    assert_eq!(
        kill.text,
        "SIGKILL from the container runtime; alive: PID 1 `sh`, up 120.0s, `java` (pid 4107), up 119.0s"
    );
    let text = render_text(&stories, Some(1_700_000_000.0));
    assert!(text.contains("never got it: `java` (pid 4107)"), "{text}");
    assert!(text.contains("PID 1 killed by SIGKILL (exit code 137)"), "{text}");
    // The stop signal's wall time: 1,700,000,000 s + 100 s of boot clock.
    assert!(text.contains("at 2023-11-14T22:15:00Z"), "{text}");
}

#[test]
fn an_early_kill_is_the_killers_doing_and_says_who() {
    let mut stop = shell_entrypoint();
    let report = &mut stop.last_termination;
    report.grace_ns = 3 * SECOND;
    report.expected_kill_after_ns = 3 * SECOND;
    report.outcome = TerminationOutcome::SigkilledEarly {
        grace_ns: 3 * SECOND,
        stop_to_kill_ns: SECOND,
        expected_kill_after_ns: 3 * SECOND,
        sender: Some(SignalSender::other("bash", 812)),
        accepts_after_stop: 0,
        still_listening: false,
    };
    assert_eq!(
        of_stop(&stop).verdict,
        "SIGKILLed by `bash` (pid 812) 1.0s after SIGTERM, 2.0s before its 3.0s grace ran out: killed early, not \
         the app's doing"
    );
}

#[test]
fn a_prestop_hooks_processes_are_not_the_apps_that_missed_the_signal() {
    let mut stop = shell_entrypoint();
    let hook = ProcessAtStop { exec_session: true, ..proc(4200, false, "sleep", 99.0, false) };
    stop.last_termination.scene.running_at_stop = vec![proc(4100, true, "sh", 10.0, true), hook];
    let story = of_stop(&stop);
    assert_eq!(story.verdict, "SIGKILLed 30.0s after SIGTERM: it did not exit within its 30.0s grace");
    let running = story.timeline.iter().find(|l| l.text.starts_with("running:")).expect("who ran");
    assert_eq!(running.text, "running: PID 1 `sh`, `sleep` (pid 4200, exec session); got SIGTERM: PID 1 `sh`");
}

#[test]
fn names_from_a_pod_cannot_write_to_the_terminal() {
    let mut stop = shell_entrypoint();
    stop.last_termination.scene.running_at_stop[1].comm = "ja\u{1b}[2Jva".into();
    let text = render_text(&[of_stop(&stop)], None);
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("ja\\u{1b}[2Jva"), "{text}");
}

#[test]
fn no_field_of_an_answer_can_write_to_the_terminal() {
    // Issue 37: only process names were escaped; the rest of an answer was printed raw.
    let mut stop = shell_entrypoint();
    stop.container = "app\u{1b}[2J".into();
    let mut stories = vec![of_stop(&stop)];
    stories[0].namespace = "shop\u{1b}]0;x\u{7}".into();
    stories[0].cause = Some("deleted\u{9b}2J".into());
    stories[0].verdict = "killed\nforged line".into();
    let text = render_text(&stories, None);
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
    assert!(text.contains("killed\\u{a}forged line"), "{text}");
    assert!(text.contains("[deleted\\u{9b}2J]"), "{text}");
}

fn host_stop(path: &str, report: TerminationReport) -> PastStop {
    PastStop {
        seq: 0,
        namespace: HOST_NAMESPACE.into(),
        pod: String::new(),
        uid: String::new(),
        container: path.into(),
        container_id: None,
        restart_count: 0,
        last_termination: report,
    }
}

#[test]
fn a_unit_killed_by_an_operators_kill_is_killed_by_that_signal_from_that_process() {
    let mut report = TerminationReport::for_tests(0);
    report.rules = StopRules::Unmanaged;
    report.exit_status = None;
    report.exit_signal = Some(SIGTERM);
    report.stop_signal = Some(StopSignalSeen {
        time: at(5.0),
        signal: SIGTERM,
        sender: SignalSender::other("bash", 900),
        matches_configured: true,
    });
    report.outcome = TerminationOutcome::ExitedAfterStopSignal { duration_ns: 1000 };
    let story = of_stop(&host_stop("/t", report));
    assert_eq!(story.verdict, "killed by SIGTERM from `bash` (pid 900)");
    let text = render_text(&[story], None);
    assert!(text.starts_with("host unit /t: killed by SIGTERM from `bash` (pid 900)\n"), "{text}");
    assert!(text.contains("SIGTERM to the main process from `bash` (pid 900)"), "{text}");
    assert!(!text.contains("on its own") && !text.contains("no stop signal"), "{text}");
}

#[test]
fn systemctl_stop_escalated_is_told_against_timeout_stop_sec() {
    let mut report = TerminationReport::for_tests(0);
    report.rules = StopRules::Systemd;
    report.grace_ns = 2 * SECOND;
    report.expected_kill_after_ns = 2 * SECOND;
    report.exit_status = None;
    report.exit_signal = Some(SIGKILL);
    let systemd = SignalSender::other("systemd", 1);
    report.stop_signal =
        Some(StopSignalSeen { time: at(5.0), signal: SIGTERM, sender: systemd.clone(), matches_configured: true });
    report.outcome = TerminationOutcome::SigkilledAfterGrace {
        grace_ns: 2 * SECOND,
        stop_to_kill_ns: 2 * SECOND,
        expected_kill_after_ns: 2 * SECOND,
        sender: Some(systemd),
        accepts_after_stop: 0,
        still_listening: false,
    };
    let story = of_stop(&host_stop("/system.slice/web.service", report));
    assert_eq!(
        story.verdict,
        "SIGKILLed 2.0s after SIGTERM from `systemd` (pid 1): it did not exit within its 2.0s TimeoutStopSec"
    );
}
