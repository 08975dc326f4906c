//! What only the pod spec and the API tell (the CRI does not carry it), decoded into the facts
//! the verdicts need: each container's restart rules, stop signal, preStop hook and probe
//! grace periods; the pod's deletion and its grace; what disrupted it; and what the kubelet
//! reported, to compare with what the kernel saw.
//!
//! Pure types and rules. `discovery::kube` fills them from Pod and Event objects.

use serde::{Deserialize, Serialize};

use super::{
    container_state::{RestartPolicy, RestartSpec},
    termination::PreStopHandler,
};

/// Where a container came from in the pod spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerKind {
    /// `initContainers`, run to completion before the others.
    Init,
    /// `initContainers` with `restartPolicy: Always`: runs beside the main containers.
    Sidecar,
    /// `containers`.
    Regular,
    /// `ephemeralContainers` (kubectl debug).
    Ephemeral,
}

/// One container's spec, as far as verdicts need it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerFacts {
    pub name: String,
    pub kind: ContainerKind,
    /// restartPolicy of the pod, the container's own and its `restartPolicyRules`.
    pub restart: RestartSpec,
    /// `lifecycle.stopSignal` (1.33+), as a signal number.
    pub stop_signal: Option<u8>,
    pub pre_stop: Option<PreStopHandler>,
    /// `livenessProbe.terminationGracePeriodSeconds`, when set.
    pub liveness_grace_ns: Option<u64>,
    /// `startupProbe.terminationGracePeriodSeconds`, when set.
    pub startup_grace_ns: Option<u64>,
    /// `httpGet` paths of the container's probes aimed at `port` numbers (for declared probes).
    pub http_probes: Vec<HttpProbe>,
}

/// An `httpGet` probe of a container.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HttpProbe {
    /// The numeric port (named ports are resolved against the container's ports).
    pub port: u16,
    /// Path with query, as the kubelet sends it.
    pub path: String,
}

/// A state the kubelet reported in `status.containerStatuses[]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ReportedState {
    Waiting {
        reason: String,
    },
    Running,
    Terminated {
        reason: String,
        exit_code: i32,
        signal: Option<i32>,
        /// The runtime's id without its `containerd://`-style prefix.
        container_id: Option<String>,
    },
}

/// What the kubelet reported for one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedContainer {
    pub name: String,
    pub restart_count: u32,
    pub state: Option<ReportedState>,
    pub last_state: Option<ReportedState>,
    /// `status.containerStatuses[].stopSignal` (1.33+): the signal the runtime will use.
    pub stop_signal: Option<u8>,
    pub container_id: Option<String>,
}

/// Why a pod is being stopped, when the Pod object says (status, conditions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disruption {
    /// Condition DisruptionTarget with reason EvictionByEvictionAPI: a deletion through the
    /// Eviction API (`kubectl drain`), with the deletion's grace.
    Evicted,
    /// The kubelet's own eviction: `status.reason: Evicted` (node pressure, or a pod past its
    /// ephemeral-storage or emptyDir `sizeLimit`), or condition DisruptionTarget with reason
    /// TerminationByKubelet. Its grace is the kubelet's override, [`KUBELET_EVICTION_GRACE_NS`].
    EvictedByKubelet,
    /// Condition DisruptionTarget reason PreemptionByScheduler, or a `Preempting` event.
    Preempted,
    /// Node shutdown: `status.reason: Terminated` with the kubelet's shutdown message.
    NodeShutdown,
    /// The pod ran past `spec.activeDeadlineSeconds`: `status.reason: DeadlineExceeded` (phase
    /// Failed), and the kubelet stops every container with the pod's grace.
    DeadlineExceeded,
}

/// One pod as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodFacts {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub restart_policy: RestartPolicy,
    /// `spec.terminationGracePeriodSeconds` (None: the API default, 30 s).
    pub grace_ns: Option<u64>,
    /// `metadata.deletionGracePeriodSeconds`, set once the pod is being deleted.
    pub deletion_grace_ns: Option<u64>,
    pub disruption: Option<Disruption>,
    /// Condition AllContainersRestarting (RestartAllContainers, 1.35 alpha).
    pub restarting_all_containers: bool,
    /// `spec.priority` (from its PriorityClass): a graceful node shutdown's group.
    pub priority: Option<i32>,
    pub containers: Vec<ContainerFacts>,
    /// `status.phase` as the kubelet reported it.
    pub reported_phase: Option<String>,
    pub reported: Vec<ReportedContainer>,
    /// What the API says beside the kernel's view: the conditions the kernel can tell too, and
    /// whether the kubelet has seen the pod's latest spec.
    pub reported_status: ReportedPodStatus,
}

/// The pod-level status the kubelet reported that the kernel's view can be set beside.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedPodStatus {
    /// Condition `PodReadyToStartContainers` (GA 1.37; absent on older kubelets).
    pub ready_to_start_containers: Option<bool>,
    /// Condition `Initialized`.
    pub initialized: Option<bool>,
    /// `metadata.generation`: bumped by every spec change (a resize too).
    pub generation: Option<i64>,
    /// `status.observedGeneration` (GA 1.35): the generation the kubelet last acted on.
    pub observed_generation: Option<i64>,
}

impl PodFacts {
    /// The spec of container `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerFacts> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// What the kubelet reported for container `name`.
    pub fn reported(&self, name: &str) -> Option<&ReportedContainer> {
        self.reported.iter().find(|c| c.name == name)
    }
}

/// Why a container was stopped, as one bounded word (a metric label value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StopCause {
    /// The pod was deleted (the grace used is the deletion's).
    Deleted,
    /// The kubelet killed it after its liveness probe failed.
    LivenessProbe,
    /// The kubelet killed it after its startup probe failed.
    StartupProbe,
    /// The pod was evicted.
    Evicted,
    /// The pod was preempted by a higher-priority pod.
    Preempted,
    /// The node shut down.
    NodeShutdown,
    /// A RestartAllContainers rule fired.
    RestartAllContainers,
    /// An in-place resize of a resource whose `resizePolicy` is `RestartContainer`: restarted by
    /// design, not a crash.
    Resize,
    /// The pod ran past its `activeDeadlineSeconds` (status reason `DeadlineExceeded`).
    DeadlineExceeded,
    /// A native sidecar stopped because every main container of its pod exited and none will
    /// be restarted: the kubelet stops the pod ("all other containers are dead",
    /// `kuberuntime_manager.go`; sidecars "wait for all main containers to exit",
    /// `kuberuntime_termination_order.go`). Neither the Pod nor an Event says so: the kernel's
    /// exits and the spec's restart rules do.
    MainContainersExited,
    /// The kubelet found the container's definition changed (its spec hash differs from the
    /// one it started it with: an image changed in the spec, or a kubelet whose hash of the
    /// same spec differs after an upgrade) and restarts it: its `Killing` event says "Container
    /// app definition changed, will be restarted" (`computePodActions`).
    DefinitionChanged,
    /// The runtime stopped it, and neither the Pod nor its Events say why (or the API is not
    /// available).
    RuntimeOrUnknown,
}

crate::spelling::spelling!(StopCause {
    Deleted => "deleted",
    LivenessProbe => "liveness_probe",
    StartupProbe => "startup_probe",
    Evicted => "evicted",
    Preempted => "preempted",
    NodeShutdown => "node_shutdown",
    RestartAllContainers => "restart_all_containers",
    Resize => "resize",
    DeadlineExceeded => "deadline_exceeded",
    MainContainersExited => "main_containers_exited",
    DefinitionChanged => "definition_changed",
    RuntimeOrUnknown => "runtime_or_unknown",
});

/// The pod an Event is about, as its `involvedObject` names it. The API server checks only that
/// an Event's namespace is its object's namespace, not that the uid is that object's: a notice
/// counts for a pod only when all three are the pod's ([`crate::node::NodeTracker::notice_for`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A container-level kill the kubelet announced in an Event.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KillNotice {
    pub pod: PodRef,
    pub container: String,
    pub cause: StopCause,
}

/// Reads the kubelet's `Killing` event message: "Container app failed liveness probe, will be
/// restarted" (and the startup probe's), "Container app resize requires restart"
/// (`computePodResizeAction` in `kuberuntime_manager.go`), "Container app definition changed,
/// will be restarted", and the same of a sidecar as "Init container proxy ..."
/// (`computeInitContainerActions`). Other kills (deletion, "Stopping container app") say
/// nothing about a cause.
pub fn kill_cause_from_message(message: &str) -> Option<(String, StopCause)> {
    let rest = message.strip_prefix("Container ").or_else(|| message.strip_prefix("Init container "))?;
    let (container, tail) = rest.split_once(' ')?;
    let cause = if tail.starts_with("failed liveness probe") {
        StopCause::LivenessProbe
    } else if tail.starts_with("failed startup probe") {
        StopCause::StartupProbe
    } else if tail.starts_with("resize requires restart") {
        StopCause::Resize
    } else if tail.starts_with("definition changed") {
        StopCause::DefinitionChanged
    } else {
        return None;
    };
    Some((container.to_owned(), cause))
}

/// Whether an `Unhealthy` event's message reports a failed liveness probe: "Liveness probe
/// failed: ..." or "Liveness probe errored and resulted in failure state: ..." (`prober.go`).
/// The kubelet writes one per failed probe, killing at the `failureThreshold`th.
pub fn is_liveness_failure(message: &str) -> bool {
    message.starts_with("Liveness probe failed") || message.starts_with("Liveness probe errored")
}

/// The container an event's `involvedObject.fieldPath` names: `spec.containers{app}`,
/// `spec.initContainers{proxy}`.
pub fn container_of_field_path(field_path: &str) -> Option<&str> {
    let inside = field_path
        .strip_prefix("spec.containers{")
        .or_else(|| field_path.strip_prefix("spec.initContainers{"))?
        .strip_suffix('}')?;
    (!inside.is_empty()).then_some(inside)
}

/// The kubelet reported a failed liveness probe of a container (its `Unhealthy` event).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LivenessFailure {
    pub pod: PodRef,
    pub container: String,
}

/// Where the facts a verdict used came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecSource {
    /// The Pod object from the API, current when the container stopped.
    Api,
    /// The API was configured but not reachable: the verdict used the last known spec, or the
    /// runtime's labels. It may be wrong where only the API tells (a deletion's grace).
    ApiUnreachable,
    /// The runtime's labels and annotations only (no API configured).
    #[default]
    Runtime,
}

/// The grace period the kubelet used to stop a container: a deletion's, else a probe's own
/// `terminationGracePeriodSeconds` for a probe kill, else the pod's (None: unknown here, the
/// runtime's labels apply).
pub fn grace_used_ns(pod: &PodFacts, container: &ContainerFacts, cause: Option<StopCause>) -> Option<u64> {
    // The kubelet's eviction kills with its own override, whatever the pod says; a deletion of
    // the evicted pod comes after its containers stopped.
    if pod.disruption == Some(Disruption::EvictedByKubelet) {
        return Some(KUBELET_EVICTION_GRACE_NS);
    }
    if let Some(deletion) = pod.deletion_grace_ns {
        return Some(deletion);
    }
    let probe_grace = match cause {
        Some(StopCause::LivenessProbe) => container.liveness_grace_ns,
        Some(StopCause::StartupProbe) => container.startup_grace_ns,
        _ => None,
    };
    probe_grace.or(pod.grace_ns)
}

/// The grace the kubelet's eviction manager gives (`immediateEvictionGracePeriodSeconds` in
/// `pkg/kubelet/eviction/eviction_manager.go`): for hard thresholds and for pods past their
/// ephemeral-storage or emptyDir limits; the runtime then applies the 2 s floor. A soft
/// threshold's `evictionMaxPodGracePeriod` is not known here (not in the Pod object).
pub const KUBELET_EVICTION_GRACE_NS: u64 = crate::time::SECOND;

/// The cause the Pod object itself shows (disruption, deletion, restart-all), if any.
pub fn pod_level_cause(pod: &PodFacts) -> Option<StopCause> {
    match pod.disruption {
        Some(Disruption::Evicted | Disruption::EvictedByKubelet) => Some(StopCause::Evicted),
        Some(Disruption::Preempted) => Some(StopCause::Preempted),
        Some(Disruption::NodeShutdown) => Some(StopCause::NodeShutdown),
        Some(Disruption::DeadlineExceeded) => Some(StopCause::DeadlineExceeded),
        None if pod.restarting_all_containers => Some(StopCause::RestartAllContainers),
        None if pod.deletion_grace_ns.is_some() => Some(StopCause::Deleted),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn pod() -> PodFacts {
        PodFacts {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            restart_policy: RestartPolicy::Always,
            grace_ns: Some(30 * S),
            deletion_grace_ns: None,
            disruption: None,
            restarting_all_containers: false,
            priority: None,
            containers: vec![container()],
            reported_phase: None,
            reported: Vec::new(),
            reported_status: ReportedPodStatus::default(),
        }
    }

    fn container() -> ContainerFacts {
        ContainerFacts {
            name: "app".into(),
            kind: ContainerKind::Regular,
            restart: RestartSpec::default(),
            stop_signal: None,
            pre_stop: None,
            liveness_grace_ns: Some(5 * S),
            startup_grace_ns: None,
            http_probes: Vec::new(),
        }
    }

    #[test]
    fn the_grace_used_is_the_deletions_then_the_probes_then_the_pods() {
        let (mut p, c) = (pod(), container());
        assert_eq!(grace_used_ns(&p, &c, None), Some(30 * S));
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::LivenessProbe)), Some(5 * S));
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::StartupProbe)), Some(30 * S), "no startup override");
        p.deletion_grace_ns = Some(3 * S);
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::LivenessProbe)), Some(3 * S));
    }

    #[test]
    fn kill_events_name_the_container_and_the_probe() {
        assert_eq!(
            kill_cause_from_message("Container app failed liveness probe, will be restarted"),
            Some(("app".into(), StopCause::LivenessProbe))
        );
        assert_eq!(
            kill_cause_from_message("Container db failed startup probe, will be restarted"),
            Some(("db".into(), StopCause::StartupProbe))
        );
        assert_eq!(
            kill_cause_from_message("Container app resize requires restart"),
            Some(("app".into(), StopCause::Resize))
        );
        assert_eq!(
            kill_cause_from_message("Container app definition changed, will be restarted"),
            Some(("app".into(), StopCause::DefinitionChanged))
        );
        assert_eq!(
            kill_cause_from_message("Init container proxy failed liveness probe"),
            Some(("proxy".into(), StopCause::LivenessProbe))
        );
        assert_eq!(kill_cause_from_message("Stopping container app"), None);
        assert_eq!(kill_cause_from_message(""), None);
    }

    #[test]
    fn unhealthy_events_name_a_liveness_failure_and_its_container() {
        assert!(is_liveness_failure("Liveness probe failed: HTTP probe failed with statuscode: 500"));
        assert!(is_liveness_failure("Liveness probe errored and resulted in Failure state: timeout"));
        assert!(!is_liveness_failure("Readiness probe failed: connection refused"));
        assert!(!is_liveness_failure("Startup probe failed: x"));
        assert_eq!(container_of_field_path("spec.containers{app}"), Some("app"));
        assert_eq!(container_of_field_path("spec.initContainers{proxy}"), Some("proxy"));
        assert_eq!(container_of_field_path("spec.containers{}"), None);
        assert_eq!(container_of_field_path("spec.ephemeralContainers{x}"), None);
    }

    #[test]
    fn the_pod_object_names_disruptions_before_deletion() {
        let mut p = pod();
        assert_eq!(pod_level_cause(&p), None);
        p.deletion_grace_ns = Some(0);
        assert_eq!(pod_level_cause(&p), Some(StopCause::Deleted));
        p.disruption = Some(Disruption::Evicted);
        assert_eq!(pod_level_cause(&p), Some(StopCause::Evicted));
        p.disruption = Some(Disruption::EvictedByKubelet);
        assert_eq!(pod_level_cause(&p), Some(StopCause::Evicted));
    }

    #[test]
    fn the_kubelets_own_eviction_uses_its_override_not_the_pods_grace() {
        let (mut p, c) = (pod(), container());
        p.disruption = Some(Disruption::EvictedByKubelet);
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::Evicted)), Some(KUBELET_EVICTION_GRACE_NS));
        p.deletion_grace_ns = Some(30 * S);
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::Evicted)), Some(KUBELET_EVICTION_GRACE_NS), "killed before");
        p.disruption = Some(Disruption::Evicted);
        assert_eq!(grace_used_ns(&p, &c, Some(StopCause::Evicted)), Some(30 * S), "the Eviction API's deletion");
    }
}
