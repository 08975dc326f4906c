//! Finishing: an exited instance, once linked to its unit, is judged (its stop's cause, the
//! rules it was stopped by, the kubelet's restart), and the judgement is applied to the unit:
//! its status and back-off, its counters, the warnings an Event carries, the copy kept in the
//! node's history, and the restart a sidecar's pod no longer makes.

use super::{
    disagree::InstanceEnd,
    history::PastStop,
    instance::InstanceKind,
    unit::{Judgement, UnitKey},
    warning::WarningReason,
    NodeTracker,
};
use crate::{
    backoff::BackoffTracker,
    container_state::ContainerState,
    systemd::MainEnd,
    termination::{SignalSender, TerminationOutcome, TerminationSettings, KUBELET_RESTART_WINDOW_NS},
    time::{seconds, BootTime},
};

impl NodeTracker {
    /// Judges an exited, linked instance and applies the result to its unit (once).
    pub(super) fn finish(&mut self, cgroup_id: u64) {
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let (Some(exit), Some(key)) = (instance.exit, instance.unit.clone()) else { return };
        if instance.finished {
            return;
        }
        instance.finished = true;
        if self.units.get(&key).is_some_and(|u| u.sidecar) && !instance.termination.settings().is_sidecar {
            let settings = TerminationSettings { is_sidecar: true, ..instance.termination.settings().clone() };
            instance.termination.set_settings(settings);
        }
        let mut report = instance.termination.on_init_exit(exit.time, exit.exit_status, exit.signal).clone();
        let host = matches!(instance.kind, InstanceKind::Host { .. });
        // A host instance is over with its last process; the next process starts a new one.
        if host {
            instance.init = None;
        }
        report.cause = self.stop_cause(&key, &report);
        report.spec = self.spec_source(&key);
        let stopped_at = report.stop_signal.as_ref().map_or(report.exit_time, |stop| stop.time);
        report.kubelet_started_before_ns = self
            .kubelet_started_at
            .filter(|started| report.cause.is_some() && *started <= stopped_at)
            .map(|started| stopped_at.since(started))
            .filter(|before| *before <= KUBELET_RESTART_WINDOW_NS);
        let tolerance = self.config.tolerance;
        let Some(unit) = self.units.get_mut(&key) else { return };
        report.memory = unit.memory.before(stopped_at);
        let oom_killed = matches!(report.outcome, TerminationOutcome::OomKilled);
        unit.status.on_init_exited(BootTime::from_ns(exit.time), exit.exit_status, exit.signal, oom_killed);
        unit.backoff.on_finished(BootTime::from_ns(exit.time));
        if let ContainerState::Terminated { reason, exit_code, signal, .. } = unit.status.state() {
            *unit.counters.exits.entry((*reason, *exit_code, *signal)).or_default() += 1;
            if let Some(container_id) = &unit.container_id {
                unit.status_check.on_end(InstanceEnd {
                    container_id: container_id.clone(),
                    reason: *reason,
                    exit_code: *exit_code,
                    oom_init: oom_killed,
                });
            }
        }
        let outcome = report.outcome.kind();
        *unit.counters.terminations.entry((outcome, report.cause)).or_default() += 1;
        let mut judgement = Judgement {
            namespace: unit.labels.namespace.clone(),
            outcome,
            stop_to_exit_seconds: report
                .stop_signal
                .as_ref()
                .map(|stop| seconds(BootTime::from_ns(exit.time).since(stop.time))),
            grace_used_ratio: None,
        };
        match &report.outcome {
            TerminationOutcome::SigkilledAfterGrace { grace_ns, stop_to_kill_ns, .. } => {
                unit.counters.grace_violations += 1;
                let mut note = format!(
                    "SIGKILLed {:.1}s after the stop signal: it did not exit within its {:.0}s grace period",
                    seconds(*stop_to_kill_ns),
                    seconds(*grace_ns)
                );
                // What the app's owner must fix, when the kernel saw it: a shell as PID 1 that
                // keeps the stop signal from the app.
                if let Some((init, app, pid)) = report.scene.stop_signal_kept_from() {
                    note.push_str(&format!(
                        "; PID 1 `{}` got the stop signal and did not pass it on: `{}` (pid {pid}) never got it",
                        init.escape_debug(),
                        app.escape_debug()
                    ));
                }
                if let Some(cause) = report.cause {
                    note.push_str(&format!("; stopped because: {}", cause.as_str()));
                }
                unit.warn(WarningReason::GracePeriodExceeded, note);
            }
            // The same story as the API's `sigkilled_early`: the app was cut short, and by whom.
            TerminationOutcome::SigkilledEarly {
                grace_ns, stop_to_kill_ns, expected_kill_after_ns, sender, ..
            } => {
                // Counted in `terminations` by its outcome; not a grace violation.
                let by = sender.as_ref().map_or_else(|| "an unseen sender".to_owned(), SignalSender::describe);
                let note = format!(
                    "SIGKILLed by {by} {:.1}s after the stop signal, {:.1}s before its {:.0}s grace period \
                     ran out: killed early, not an overrun by the app",
                    seconds(*stop_to_kill_ns),
                    seconds(expected_kill_after_ns.saturating_sub(*stop_to_kill_ns)),
                    seconds(*grace_ns)
                );
                unit.warn(WarningReason::KilledBeforeGracePeriod, note);
            }
            TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } => {
                judgement.grace_used_ratio = Some(*grace_used_ratio);
            }
            _ => {}
        }
        if let Some(rules) = unit.systemd.as_deref_mut() {
            let end = match (exit.signal, exit.exit_status) {
                (Some(signal), _) => MainEnd::Killed(signal),
                (None, status) => MainEnd::Exited(status.unwrap_or(0)),
            };
            // `systemctl stop` (systemd's own stop signal, or its SIGKILL at the timeout)
            // restarts nothing; a `kill` from anyone else is a death systemd may restart after.
            let by_systemd = |sender: &SignalSender| matches!(sender, SignalSender::OtherProcess { comm, .. } if comm == SYSTEMD_COMM);
            let stopped_by_systemd = report.stop_signal.as_ref().is_some_and(|stop| by_systemd(&stop.sender));
            rules.restarts.on_ended(&rules.unit, BootTime::from_ns(exit.time), end, stopped_by_systemd);
        }
        if !unit.named_by_id {
            let stop = PastStop {
                seq: 0,
                namespace: unit.labels.namespace.clone(),
                pod: unit.labels.pod.clone(),
                uid: unit.labels.uid.clone(),
                container: unit.labels.container.clone(),
                container_id: unit.container_id.clone(),
                restart_count: unit.status.restart_count(),
                last_termination: report.clone(),
            };
            std::sync::Arc::make_mut(&mut self.history).record(stop, &mut self.dropped);
        }
        unit.last_termination = Some(Box::new(report));
        unit.last_change_ns = exit.time;
        if host {
            // Host units have no kubelet: a new process is a new run, not a restart to judge.
            unit.backoff = BackoffTracker::new(unit.backoff.policy(), tolerance);
        }
        // A unit named by id has no namespace yet; it is judged again once named (see naming.rs).
        if !unit.named_by_id {
            self.record_judgement(judgement);
        }
        self.name_stops_of_a_restart_all(&key, exit.exit_status, BootTime::from_ns(exit.time));
        // The last main container done: the pod's sidecars will not be restarted any more.
        if let UnitKey::Container { pod_uid, .. } = &key {
            if !self.units.get(&key).is_some_and(|u| u.sidecar || u.init_container) {
                let pod_uid = pod_uid.clone();
                self.apply_spec(&pod_uid);
            }
        }
    }
}

/// systemd's process name as the kernel records it (PID 1 on a host it manages).
const SYSTEMD_COMM: &str = "systemd";
