//! The pod spec and status from the API, applied to units: restart expectations from the pod's
//! and container's restart policies, sidecars from the spec, the grace period and stop signal the
//! kubelet really used, and the cause of each stop. Without the API, the runtime's labels and
//! annotations stand in, and verdicts say so (`SpecSource`).

use super::bounds::DroppedKind;
use super::{causes::liveness_failure_explains, unit::termination_settings, InstanceKind, NodeTracker, Unit, UnitKey};
use crate::{
    container_state::{ContainerState, RestartRuleAction, RestartSpec},
    kubelet::{shutdown::node_shutdown_grace_ns, Gate},
    metadata::{ContainerMeta, ContainerType},
    spec::{
        grace_used_ns, pod_level_cause, ContainerFacts, ContainerKind, Disruption, KillNotice, LivenessFailure,
        PodFacts, PodRef, SpecSource, StopCause,
    },
    termination::{TerminationSettings, SIGTERM},
    time::BootTime,
};

/// How long after a stop a late kill notice still names its cause.
pub(super) const LATE_NOTICE_NS: u64 = 10_000_000_000;
/// How long a deleted pod's facts outlive its object (see `pod_gone`): the kubelet's stops after
/// a forced deletion take at most its 2 s floor and a second StopContainer call.
const GONE_POD_KEPT_NS: u64 = 60_000_000_000;

/// Gives `unit`'s last stop `cause` when it was judged without one (`RuntimeOrUnknown`) in the
/// last [`LATE_NOTICE_NS`] before `now`, moving its count; whether it did.
pub(super) fn name_a_recent_unknown_stop(unit: &mut Unit, cause: StopCause, now: BootTime) -> bool {
    let Some(report) = unit.last_termination.as_mut() else { return false };
    let recent = now.since(report.exit_time) <= LATE_NOTICE_NS;
    if !recent || report.cause != Some(StopCause::RuntimeOrUnknown) {
        return false;
    }
    let outcome = report.outcome.kind();
    report.cause = Some(cause);
    let counts = &mut unit.counters.terminations;
    if let Some(n) = counts.get_mut(&(outcome, Some(StopCause::RuntimeOrUnknown))) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(&(outcome, Some(StopCause::RuntimeOrUnknown)));
        }
    }
    *counts.entry((outcome, Some(cause))).or_default() += 1;
    true
}

/// How long the kubelet's `Evicted` event stands for the eviction before the Pod's status says
/// so: the eviction manager records it and kills at once (1 s grace, the runtime's 2 s floor);
/// its status write follows the stopped containers.
pub(super) const EVICTION_NOTICE_NS: u64 = 10_000_000_000;

/// An `Evicted` event from (what names itself) this node's kubelet.
#[derive(Clone, Copy, Debug)]
pub(super) struct EvictionNotice {
    /// When it came (boot ns).
    pub(super) at: u64,
    /// The Pod's status said `Evicted` since.
    pub(super) confirmed: bool,
}

impl EvictionNotice {
    fn in_force(&self, now: u64) -> bool {
        self.confirmed || now.saturating_sub(self.at) <= EVICTION_NOTICE_NS
    }
}

/// Whose pod an Event's `involvedObject` names ([`NodeTracker::notice_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeFor {
    /// A pod of this node: namespace, name and uid all its own.
    ThisPod,
    /// No pod of this node has the uid (another node's, or one not seen yet).
    UnknownPod,
    /// A pod of this node's uid under another namespace or name: forged.
    OtherPod,
}

/// Pods kept per node at most (a node runs at most a few hundred).
const MAX_PODS: usize = 4096;

impl NodeTracker {
    /// The Kubernetes API is the spec source from now on (it may still be unreachable).
    pub fn set_api_configured(&mut self) {
        self.api.configured = true;
    }

    /// Whether the API watch works now. While it does not, verdicts are marked as made without
    /// a current spec.
    pub fn set_api_reachable(&mut self, reachable: bool) {
        self.api.reachable = reachable;
    }

    /// The API's current view of a pod on this node.
    /// The pod as the API shows it at `now` (boot ns). A cause the Pod shows only after its
    /// containers stopped (the kubelet writes `DeadlineExceeded` or `Evicted` into the status
    /// while it stops them) names the stops judged in the last `LATE_NOTICE_NS` without one.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_pod(&mut self, pod: PodFacts, now: u64) -> super::Outcome {
        self.record_pod(pod, now);
        self.outcome()
    }

    fn record_pod(&mut self, mut pod: PodFacts, now: u64) {
        let uid = pod.uid.clone();
        if !self.pods.contains_key(&uid) && self.pods.len() >= MAX_PODS {
            self.dropped.add(DroppedKind::Pod, 1);
            return;
        }
        // The kubelet's Evicted event came before the status it writes once the pod is stopped.
        if let Some(notice) = self.evicted_by_kubelet.get_mut(&uid) {
            if pod.disruption == Some(Disruption::EvictedByKubelet) {
                notice.confirmed = true;
            } else if pod.disruption.is_none() && notice.in_force(now) {
                pod.disruption = Some(Disruption::EvictedByKubelet);
            }
        }
        self.check_reported_status(&pod);
        // Only causes the kubelet writes while it stops the containers; a deletion (forced too)
        // is in the API before the kubelet acts on it.
        let late_cause = pod_level_cause(&pod).filter(|cause| {
            matches!(cause, StopCause::DeadlineExceeded | StopCause::Evicted | StopCause::NodeShutdown)
        });
        self.pods.insert(uid.clone(), pod);
        self.apply_spec(&uid);
        if let Some(cause) = late_cause {
            let keys: Vec<UnitKey> = self
                .units
                .keys()
                .filter(|k| matches!(k, UnitKey::Container { pod_uid, .. } if *pod_uid == uid))
                .cloned()
                .collect();
            for key in keys {
                if let Some(unit) = self.units.get_mut(&key) {
                    if name_a_recent_unknown_stop(unit, cause, BootTime::from_ns(now)) {
                        let exit_time = unit.last_termination.as_ref().map(|r| r.exit_time).unwrap_or_default();
                        std::sync::Arc::make_mut(&mut self.history).name_cause(
                            &unit.labels.uid,
                            &unit.labels.container,
                            exit_time,
                            cause,
                        );
                    }
                }
            }
        }
    }

    /// A pod left the API: `last` is its final object. A pod leaves this node's watch only by
    /// its deletion (`spec.nodeName` never changes), and its facts are kept
    /// `GONE_POD_KEPT_NS`: after a forced deletion (`--grace-period=0 --force`) the object is
    /// gone at once while the kubelet still stops the containers, and those stops are the
    /// deletion's, with its grace (0 when the final object carries none).
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn pod_gone(&mut self, mut last: PodFacts, now: u64) -> super::Outcome {
        last.deletion_grace_ns.get_or_insert(0);
        let uid = last.uid.clone();
        self.record_pod(last, now);
        if self.pods.contains_key(&uid) {
            self.pods_gone.retain(|(_, gone)| *gone != uid);
            self.pods_gone.push_back((now, uid));
        }
        self.outcome()
    }

    /// Whether an Event's `involvedObject` is a pod of this node: its namespace, name and uid
    /// all the pod's. [`NoticeFor::OtherPod`] is a uid of this node's pod under another name:
    /// an Event forged in another namespace (the API server checks only that an Event's
    /// namespace is its object's), ignored by every `apply_*_notice`.
    pub fn notice_for(&self, pod: &PodRef) -> NoticeFor {
        match self.pods.get(&pod.uid) {
            None => NoticeFor::UnknownPod,
            Some(known) if known.namespace == pod.namespace && known.name == pod.name => NoticeFor::ThisPod,
            Some(_) => NoticeFor::OtherPod,
        }
    }

    /// The kubelet announced that it evicts `pod` (its `Evicted` event, recorded before it
    /// kills the containers): they are stopped with the eviction's grace, which the Pod object
    /// shows only once they are stopped. Ignored unless `pod` is a pod of this node by
    /// namespace, name and uid ([`Self::notice_for`]).
    ///
    /// Anyone allowed to create Events in the pod's namespace can write one that names this
    /// node's kubelet, so a notice holds only 10 s (`EVICTION_NOTICE_NS`) unless the Pod's status
    /// (which only the kubelet writes) confirms it: a forged one cannot shorten the grace a
    /// later stop is judged with.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_eviction_notice(&mut self, pod: &PodRef, now: u64) -> super::Outcome {
        if self.notice_for(pod) == NoticeFor::ThisPod {
            self.record_eviction_notice(&pod.uid, now);
        }
        self.outcome()
    }

    fn record_eviction_notice(&mut self, uid: &str, now: u64) {
        let Some(pod) = self.pods.get_mut(uid) else { return };
        if pod.disruption.is_none() {
            pod.disruption = Some(Disruption::EvictedByKubelet);
        }
        let confirmed = self.evicted_by_kubelet.get(uid).is_some_and(|n| n.confirmed);
        self.evicted_by_kubelet.insert(uid.to_owned(), EvictionNotice { at: now, confirmed });
        self.apply_spec(uid);
    }

    /// Drops the eviction notices the Pod's status has not confirmed within
    /// [`EVICTION_NOTICE_NS`]; the pod's stops are judged with its own grace again.
    pub(super) fn expire_eviction_notices(&mut self, now: u64) {
        let stale: Vec<String> = self
            .evicted_by_kubelet
            .iter()
            .filter(|(_, notice)| !notice.confirmed && !notice.in_force(now))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            self.evicted_by_kubelet.remove(&uid);
            let Some(pod) = self.pods.get_mut(&uid) else { continue };
            if pod.disruption == Some(Disruption::EvictedByKubelet) {
                pod.disruption = None;
                self.apply_spec(&uid);
            }
        }
    }

    /// A pod left the API (deleted, or no longer on this node).
    pub fn forget_pod(&mut self, uid: &str) {
        self.evicted_by_kubelet.remove(uid);
        self.pods.remove(uid);
        self.pods_gone.retain(|(_, gone)| gone != uid);
        self.kill_notices.retain(|(pod, _), _| pod != uid);
        self.liveness_failures.retain(|(pod, _), _| pod != uid);
    }

    /// Forgets the pods gone from the API more than [`GONE_POD_KEPT_NS`] before `now`.
    pub(super) fn expire_gone_pods(&mut self, now: u64) {
        while let Some((gone_at, uid)) = self.pods_gone.front().cloned() {
            if now.saturating_sub(gone_at) < GONE_POD_KEPT_NS {
                break;
            }
            self.pods_gone.pop_front();
            self.pods.remove(&uid);
            self.evicted_by_kubelet.remove(&uid);
            self.kill_notices.retain(|(pod, _), _| *pod != uid);
            self.liveness_failures.retain(|(pod, _), _| *pod != uid);
        }
    }

    /// Whether the API told about pod `uid` (a pod of this node).
    pub fn knows_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// The uids of the pods known from the API (for a watch relist to drop the vanished).
    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// The kubelet announced why it kills a container (a failed liveness or startup probe), at
    /// `now` (boot ns). The kubelet records the event and stops the container at the same
    /// time, so the event often arrives after the exit: a stop judged in the last
    /// `LATE_NOTICE_NS` without a known cause takes it; otherwise the notice waits for the stop.
    /// Ignored unless the notice's pod is a pod of this node by namespace, name and uid
    /// ([`Self::notice_for`]).
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_kill_notice(&mut self, notice: KillNotice, now: u64) -> super::Outcome {
        if self.notice_for(&notice.pod) == NoticeFor::ThisPod {
            self.record_kill_notice(notice, now);
        }
        self.outcome()
    }

    fn record_kill_notice(&mut self, notice: KillNotice, now: u64) {
        let KillNotice { pod: PodRef { uid: pod_uid, .. }, container, cause } = notice;
        let unit_key = UnitKey::Container { pod_uid: pod_uid.clone(), container: container.clone() };
        if let Some(unit) = self.units.get_mut(&unit_key) {
            if name_a_recent_unknown_stop(unit, cause, BootTime::from_ns(now)) {
                let exit_time = unit.last_termination.as_ref().map(|r| r.exit_time).unwrap_or_default();
                std::sync::Arc::make_mut(&mut self.history).name_cause(&pod_uid, &container, exit_time, cause);
                return;
            }
        }
        self.kill_notices.insert((pod_uid.clone(), container), cause);
        if self.kill_notices.len() > MAX_PODS {
            // Notices are consumed by the stop they announce; stale ones are dropped first.
            if let Some(stale) = self.kill_notices.keys().next().cloned() {
                self.kill_notices.remove(&stale);
                self.dropped.add(DroppedKind::KillNotice, 1);
            }
        }
        self.apply_spec(&pod_uid);
    }

    /// The pod and container spec of a unit, when the API told.
    pub(super) fn spec_of(&self, key: &UnitKey) -> Option<(&PodFacts, &ContainerFacts)> {
        let UnitKey::Container { pod_uid, container } = key else { return None };
        let pod = self.pods.get(pod_uid)?;
        Some((pod, pod.container(container)?))
    }

    /// When and how the kubelet restarts the container: from the spec, else from the runtime's
    /// container type and the configured default policy.
    pub(super) fn restart_spec(&self, key: &UnitKey, meta: Option<&ContainerMeta>) -> RestartSpec {
        if let Some((pod, container)) = self.spec_of(key) {
            // Sidecars run while the main containers do: once those are done for good, the kubelet
            // stops the sidecars and restarts none (`pkg/kubelet/kuberuntime`, the pod's
            // termination once no regular container is left to keep or start).
            let main_done = container.kind == ContainerKind::Sidecar && self.main_containers_done(pod);
            return RestartSpec {
                pod_terminating: pod.deletion_grace_ns.is_some() || main_done,
                ..self.restart_as_applied(container)
            };
        }
        RestartSpec {
            pod_restart_policy: self.config.restart_policy,
            container_restart_policy: None,
            restart_policy_rules: Vec::new(),
            is_init_container: meta.is_some_and(|m| m.kubelet.container_type == Some(ContainerType::Init)),
            pod_terminating: false,
        }
    }

    /// Whether this node's kubelet applies what `gate` guards: not when the gate is known to be
    /// off (its configuration says so, or its release predates or does not enable it). When the
    /// agent cannot tell, the spec is followed: the API server took the field, which a kubelet of
    /// another release is the rare skew.
    pub(super) fn kubelet_applies(&self, gate: Gate) -> bool {
        self.config.kubelet.gate(gate).is_none_or(|state| state.enabled != Some(false))
    }

    /// The restart rules of `container` as this node's kubelet applies them: without
    /// ContainerRestartRules it ignores a regular container's own `restartPolicy` and its
    /// `restartPolicyRules` (the pod's policy holds); without RestartAllContainersOnContainerExits
    /// it ignores the RestartAllContainers action (`pkg/api/v1/pod/util.go`
    /// `ContainerShouldRestart` checks both gates).
    pub(super) fn restart_as_applied(&self, container: &ContainerFacts) -> RestartSpec {
        let mut restart = container.restart.clone();
        if container.kind != ContainerKind::Sidecar && !self.kubelet_applies(Gate::ContainerRestartRules) {
            restart.container_restart_policy = None;
            restart.restart_policy_rules.clear();
        }
        if !self.kubelet_applies(Gate::RestartAllContainersOnContainerExits) {
            restart.restart_policy_rules.retain(|rule| rule.action != RestartRuleAction::RestartAllContainers);
        }
        restart
    }

    /// How the container is stopped: the spec's grace (the deletion's, or a probe's for a probe
    /// kill), stop signal and preStop hook when the API told; the runtime's labels otherwise.
    pub(super) fn settings_for(&self, key: &UnitKey, meta: Option<&ContainerMeta>) -> TerminationSettings {
        if let UnitKey::Host { .. } = key {
            // systemd's rules once it told them; until then (or for a cgroup it does not
            // manage) no grace was promised.
            return self
                .units
                .get(key)
                .and_then(|unit| unit.systemd.as_ref())
                .map_or_else(TerminationSettings::unmanaged, |rules| rules.unit.termination_settings());
        }
        let base = meta.map(termination_settings).unwrap_or_default();
        let Some((pod, container)) = self.spec_of(key) else { return base };
        let notice = self.kill_notices.get(&(pod.uid.clone(), container.name.clone())).copied();
        let reported_signal = pod.reported(&container.name).and_then(|r| r.stop_signal);
        // A graceful node shutdown kills with its priority group's grace, whatever a later
        // deletion says; without the kubelet's configuration the pod's own stands.
        let shutdown_grace = (pod.disruption == Some(Disruption::NodeShutdown))
            .then_some(self.config.kubelet.facts.config.as_ref())
            .flatten()
            .and_then(|config| node_shutdown_grace_ns(config, pod.priority, pod.grace_ns));
        TerminationSettings {
            grace_period_ns: shutdown_grace
                .or_else(|| grace_used_ns(pod, container, notice))
                .unwrap_or(base.grace_period_ns),
            // grace_used_ns already chose the deletion's grace when there is one.
            deletion_grace_ns: None,
            pre_stop: container.pre_stop.clone().or(base.pre_stop),
            // The pod's own, else what the kubelet reported the runtime uses, else the image's
            // (a runtime that does not report it, or a kubelet before 1.33, still sends it).
            // A kubelet without ContainerStopSignals passes the pod's signal to no runtime.
            stop_signal: container
                .stop_signal
                .filter(|_| self.kubelet_applies(Gate::ContainerStopSignals))
                .or(reported_signal)
                .or(meta.and_then(|m| m.image_stop_signal))
                .unwrap_or(SIGTERM),
            is_sidecar: container.kind == ContainerKind::Sidecar,
            ..base
        }
    }

    /// Whether every regular container of `pod` ended and will not be restarted.
    pub(super) fn main_containers_done(&self, pod: &PodFacts) -> bool {
        let mut regular = pod.containers.iter().filter(|c| c.kind == ContainerKind::Regular).peekable();
        regular.peek().is_some()
            && regular.all(|c| {
                let key = UnitKey::Container { pod_uid: pod.uid.clone(), container: c.name.clone() };
                self.units.get(&key).is_some_and(|unit| match unit.status.state() {
                    ContainerState::Terminated { exit_code, .. } => !unit.restart.should_restart(*exit_code),
                    _ => false,
                })
            })
    }

    /// Re-applies the spec of pod `uid` to its units and their live instances.
    pub(super) fn apply_spec(&mut self, uid: &str) {
        let keys: Vec<UnitKey> = self
            .units
            .keys()
            .filter(|k| matches!(k, UnitKey::Container { pod_uid, .. } if pod_uid == uid))
            .cloned()
            .collect();
        for key in keys {
            let meta = self.units.get(&key).and_then(|u| u.container_id.as_ref()).and_then(|id| self.metadata.get(id));
            let restart = self.restart_spec(&key, meta);
            let settings = self.settings_for(&key, meta);
            let sidecar = self.spec_of(&key).map(|(_, c)| c.kind == ContainerKind::Sidecar);
            let Some(unit) = self.units.get_mut(&key) else { continue };
            unit.init_container = restart.is_init_container;
            unit.restart = restart;
            if let Some(sidecar) = sidecar {
                unit.sidecar = sidecar;
            }
            let live = unit.cgroup_id;
            if let Some(instance) = live.and_then(|id| self.instances.get_mut(id)) {
                if matches!(instance.kind, InstanceKind::Container { .. }) && !instance.finished {
                    instance.termination.set_settings(settings);
                }
            }
        }
    }

    /// This node's kubelet reported a failed liveness probe of a container (its `Unhealthy`
    /// event), recorded at `at` (boot ns; the event's own time, a second wide), seen at `now`.
    /// A stop of it judged in the last 10 s without a cause that the failure
    /// explains takes the cause `liveness_probe`; otherwise the failure waits for a stop.
    /// Ignored unless its pod is a pod of this node by namespace, name and uid
    /// ([`Self::notice_for`]): anyone allowed to create Events in a namespace can write one.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_liveness_failure(&mut self, failure: LivenessFailure, at: u64, now: u64) -> super::Outcome {
        if self.notice_for(&failure.pod) == NoticeFor::ThisPod {
            self.record_liveness_failure(failure, BootTime::from_ns(at), now);
        }
        self.outcome()
    }

    fn record_liveness_failure(&mut self, failure: LivenessFailure, at: BootTime, now: u64) {
        let uid = failure.pod.uid;
        let unit_key = UnitKey::Container { pod_uid: uid.clone(), container: failure.container.clone() };
        if let Some(unit) = self.units.get_mut(&unit_key) {
            let explained = unit.last_termination.as_ref().is_some_and(|report| {
                let stopped_at = report.stop_signal.as_ref().map_or(report.exit_time, |stop| stop.time);
                liveness_failure_explains(at, stopped_at)
            });
            if explained && name_a_recent_unknown_stop(unit, StopCause::LivenessProbe, BootTime::from_ns(now)) {
                let exit_time = unit.last_termination.as_ref().map(|r| r.exit_time).unwrap_or_default();
                std::sync::Arc::make_mut(&mut self.history).name_cause(
                    &uid,
                    &failure.container,
                    exit_time,
                    StopCause::LivenessProbe,
                );
                return;
            }
        }
        let key = (uid, failure.container);
        if !self.liveness_failures.contains_key(&key) && self.liveness_failures.len() >= MAX_PODS {
            self.dropped.add(DroppedKind::LivenessFailure, 1);
            return;
        }
        self.liveness_failures.insert(key, at);
    }

    /// Where a verdict's facts come from now.
    pub(super) fn spec_source(&self, key: &UnitKey) -> SpecSource {
        match (self.api.configured, self.api.reachable, self.spec_of(key).is_some()) {
            (false, _, _) => SpecSource::Runtime,
            (true, true, true) => SpecSource::Api,
            (true, _, _) => SpecSource::ApiUnreachable,
        }
    }
}

/// The API connection as the tracker knows it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ApiState {
    pub(super) configured: bool,
    pub(super) reachable: bool,
}
