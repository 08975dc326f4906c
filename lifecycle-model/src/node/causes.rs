//! Why a stop happened: the cause a judged stop is given, from the strongest evidence to the
//! weakest — the Pod's own status (written by the API server and the kubelet only), then a
//! kill notice from an Event, the pod-level cause, the kernel's proof of a restart of all
//! containers, the sidecar rule, a liveness failure under `restartPolicy: Never` — and
//! `RuntimeOrUnknown` when nothing names one.

use super::{
    pods::{name_a_recent_unknown_stop, LATE_NOTICE_NS},
    NodeTracker, UnitKey,
};
use crate::{
    spec::{pod_level_cause, ContainerKind, Disruption, StopCause},
    termination::{TerminationOutcome, TerminationReport},
    time::BootTime,
};

/// An event's time has whole seconds (`lastTimestamp`): a failure recorded up to this long
/// after the stop began may still be the one before it.
const EVENT_TIME_SLACK_NS: u64 = 1_000_000_000;

/// Whether a liveness failure the kubelet recorded at `failed_at` explains a stop that began at
/// `stopped_at`: the kubelet kills at its next sync after the failure that reached the
/// threshold, so the failure comes first, within [`LATE_NOTICE_NS`] (and the event's time is a
/// second wide).
pub(super) fn liveness_failure_explains(failed_at: BootTime, stopped_at: BootTime) -> bool {
    failed_at <= stopped_at.after(EVENT_TIME_SLACK_NS) && stopped_at.since(failed_at) <= LATE_NOTICE_NS
}

impl NodeTracker {
    /// Why the container stopped, for a report: a probe kill the kubelet announced, else what
    /// the Pod object says (eviction, preemption, shutdown, deletion, restart-all), else the
    /// runtime's own doing. None when nothing stopped it (it exited, or was OOM-killed).
    pub(super) fn stop_cause(&mut self, key: &UnitKey, report: &TerminationReport) -> Option<StopCause> {
        let stopped = report.stop_signal.is_some()
            || matches!(
                report.outcome,
                TerminationOutcome::SigkilledAfterGrace { .. } | TerminationOutcome::SigkilledEarly { .. }
            )
            || matches!(
                &report.outcome,
                TerminationOutcome::KilledWithoutGrace { sender: Some(sender) }
                    | TerminationOutcome::StopSignalNotObserved { sender: Some(sender) }
                    if sender.is_kubelet_side()
            );
        // A plain host's unit has no Kubernetes cause: its stop is told by its sender and, under
        // systemd, the unit's own settings.
        if !stopped || matches!(key, UnitKey::Host { .. }) {
            return None;
        }
        let Some((pod, container)) = self.spec_of(key).map(|(p, c)| (p.uid.clone(), c.name.clone())) else {
            return Some(StopCause::RuntimeOrUnknown);
        };
        // The Pod's own status (written by the API server and the kubelet only) first; then an
        // Event, which anyone allowed to create Events in the namespace can write.
        let notice = self.kill_notices.remove(&(pod.clone(), container));
        if let Some(cause) = self.status_cause(&pod) {
            return Some(cause);
        }
        if let Some(cause) = notice {
            return Some(cause);
        }
        if let Some(cause) = self.pods.get(&pod).and_then(pod_level_cause) {
            return Some(cause);
        }
        // The kubelet may set and clear AllContainersRestarting between two status syncs, so
        // the API never shows it; the sibling's exit that fired the rule is the kernel's proof.
        let stopped_at = report.stop_signal.as_ref().map_or(report.exit_time, |stop| stop.time);
        if self.restart_all_fired_before(&pod, stopped_at) {
            return Some(StopCause::RestartAllContainers);
        }
        // A sidecar stopped once no main container is left to run: the kubelet's own rule,
        // which neither the Pod nor an Event names (its `Killing` says "Stopping container").
        let sidecar = self.spec_of(key).is_some_and(|(_, c)| c.kind == ContainerKind::Sidecar);
        if sidecar && self.pods.get(&pod).is_some_and(|p| self.main_containers_done(p)) {
            return Some(StopCause::MainContainersExited);
        }
        // A liveness failure under `restartPolicy: Never` stops the whole pod with a plain
        // "Stopping container" (`computePodActions` sets KillPod when nothing is left to keep or
        // start): the kubelet's `Unhealthy` event just before is the evidence.
        if let UnitKey::Container { pod_uid, container } = key {
            let failed = self.liveness_failures.get(&(pod_uid.clone(), container.clone()));
            if failed.is_some_and(|&at| liveness_failure_explains(at, stopped_at)) {
                return Some(StopCause::LivenessProbe);
            }
        }
        Some(StopCause::RuntimeOrUnknown)
    }

    /// The cause pod `uid`'s own object shows (a disruption, its deletion, a restart of all its
    /// containers), leaving out an eviction only an unconfirmed `Evicted` Event tells.
    fn status_cause(&self, uid: &str) -> Option<StopCause> {
        let pod = self.pods.get(uid)?;
        let unconfirmed = self.evicted_by_kubelet.get(uid).is_some_and(|notice| !notice.confirmed);
        if unconfirmed && pod.disruption == Some(Disruption::EvictedByKubelet) {
            return match () {
                () if pod.restarting_all_containers => Some(StopCause::RestartAllContainers),
                () if pod.deletion_grace_ns.is_some() => Some(StopCause::Deleted),
                () => None,
            };
        }
        pod_level_cause(pod)
    }

    /// Whether a container of pod `pod_uid` exited, in the [`LATE_NOTICE_NS`] up to `at`, with
    /// an exit code its RestartAllContainers rule matches.
    fn restart_all_fired_before(&self, pod_uid: &str, at: BootTime) -> bool {
        let Some(pod) = self.pods.get(pod_uid) else { return false };
        self.units.iter().any(|(key, unit)| {
            let UnitKey::Container { pod_uid: owner, container } = key else { return false };
            let Some(exit) = unit.last_termination.as_ref() else { return false };
            owner == pod_uid
                && exit.exit_time <= at
                && at.since(exit.exit_time) <= LATE_NOTICE_NS
                && exit
                    .exit_status
                    .zip(pod.container(container))
                    .is_some_and(|(code, spec)| self.restart_as_applied(spec).restarts_all_containers(i32::from(code)))
        })
    }

    /// `key`'s container exited at `exit_time` with `exit_status`: when that fired a
    /// RestartAllContainers rule, the stops of its siblings from then on already judged without
    /// a cause (seen first, say because this container was linked to its pod late) are the
    /// rule's.
    pub(super) fn name_stops_of_a_restart_all(&mut self, key: &UnitKey, exit_status: Option<u8>, exit_time: BootTime) {
        let Some((pod, spec)) = self.spec_of(key) else { return };
        let fired =
            exit_status.is_some_and(|code| self.restart_as_applied(spec).restarts_all_containers(i32::from(code)));
        if !fired {
            return;
        }
        let pod_uid = pod.uid.clone();
        let siblings: Vec<UnitKey> = self
            .units
            .keys()
            .filter(|k| k != &key && matches!(k, UnitKey::Container { pod_uid: owner, .. } if *owner == pod_uid))
            .cloned()
            .collect();
        for sibling in siblings {
            let Some(unit) = self.units.get_mut(&sibling) else { continue };
            let after_the_exit = unit
                .last_termination
                .as_ref()
                .is_some_and(|r| r.stop_signal.as_ref().map_or(r.exit_time, |stop| stop.time) >= exit_time);
            // Judged at most LATE_NOTICE_NS after the exit that fired the rule.
            if after_the_exit && name_a_recent_unknown_stop(unit, StopCause::RestartAllContainers, exit_time) {
                let exit_time = unit.last_termination.as_ref().map(|r| r.exit_time).unwrap_or_default();
                std::sync::Arc::make_mut(&mut self.history).name_cause(
                    &unit.labels.uid,
                    &unit.labels.container,
                    exit_time,
                    StopCause::RestartAllContainers,
                );
            }
        }
    }
}
