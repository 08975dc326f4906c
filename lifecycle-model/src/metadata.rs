//! Runtime metadata: who a container is (pod, namespace, uid, name) and what the kubelet told
//! the runtime about it (restart count, spec hash, grace periods, preStop hook, ports), decoded
//! from the labels and annotations the kubelet writes, plus what the runtime says happened to it.
//!
//! Pure: string maps in, typed values out. The CRI client in `discovery::cri` fills the maps.
//!
//! The kubelet writes the keys below in `pkg/kubelet/kuberuntime/labels.go`: grace periods as
//! decimal seconds, the spec hash as hex, the preStop handler and ports as JSON. A malformed value
//! leaves that one field `None` and is reported as an [`AnnotationProblem`]; it never fails a
//! listing, because one odd container must not blind the agent to every other one.
//!
//! Sidecars: the kubelet marks init containers `init` whether or not their `restartPolicy` is
//! `Always`, and the restart policy itself is not written to the runtime, so a sidecar cannot be
//! told apart from a plain init container from CRI metadata alone (it needs the pod spec, or the
//! observation that an `init` container is still running while regular containers run).

use std::{collections::HashMap, fmt};

/// Label and annotation keys the kubelet sets on every container it creates.
pub mod keys {
    /// Label: pod name.
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    /// Label: pod namespace.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// Label: pod UID.
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    /// Label: container name within the pod.
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// Annotation: restart count, decimal.
    pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    /// Annotation: hash of the container spec, hex (the back-off key includes it).
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    /// Annotation: `init`, `container` or `ephemeral` (kubelets before 1.30 do not write it).
    pub const CONTAINER_TYPE: &str = "io.kubernetes.container.type";
    /// Annotation: preStop handler as JSON (`v1.LifecycleHandler`).
    pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
    /// Annotation: container ports as JSON (`[]v1.ContainerPort`).
    pub const PORTS: &str = "io.kubernetes.container.ports";
    /// Annotation: pod spec terminationGracePeriodSeconds, decimal seconds.
    pub const TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    /// Pod annotation (on the sandbox, set by the pod's author): the agent probes the pod
    /// declares, one probe path per line (`/probe/tcp?port=8080&stall=5s`). Only these are
    /// answered when the agent has no pod spec from the API.
    pub const PROBE_DECLARATION: &str = "lifecycle.dev/probes";
    /// Annotation: pod deletionGracePeriodSeconds, decimal seconds; set once deletion started.
    pub const DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
}

/// What the runtime reports a container is doing (CRI `ContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ContainerState {
    /// Created, not started yet.
    Created,
    /// PID 1 is running.
    Running,
    /// PID 1 exited; exit code and reason are known.
    Exited,
    /// The runtime lost track of it (or sent a value this build does not know).
    Unknown,
}

/// Where in the pod spec the container comes from (annotation `io.kubernetes.container.type`).
///
/// Sidecars (init containers with `restartPolicy: Always`) are reported as [`Self::Init`]: the
/// kubelet does not pass the restart policy to the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ContainerType {
    /// `spec.initContainers` (including sidecars).
    Init,
    /// `spec.containers`.
    Regular,
    /// `spec.ephemeralContainers` (kubectl debug).
    Ephemeral,
}

impl ContainerType {
    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "init" => Some(Self::Init),
            "container" => Some(Self::Regular),
            "ephemeral" => Some(Self::Ephemeral),
            _ => None,
        }
    }
}

/// One container as the runtime knows it, with the kubelet's identity and settings decoded.
///
/// Identity strings are empty when the label is absent (a container the kubelet did not
/// create); every decoded annotation is `None` when absent or malformed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerMeta {
    /// Full runtime container id (64 hex digits for containerd and CRI-O).
    pub container_id: String,
    /// Id of the pod sandbox the container belongs to.
    pub pod_sandbox_id: String,
    /// `io.kubernetes.pod.name`.
    pub pod_name: String,
    /// `io.kubernetes.pod.namespace`.
    pub pod_namespace: String,
    /// `io.kubernetes.pod.uid`.
    pub pod_uid: String,
    /// `io.kubernetes.container.name`, else the CRI metadata name.
    pub container_name: String,
    /// CRI metadata attempt: how many times the kubelet created this container before.
    pub attempt: u32,
    /// What the kubelet wrote in the container's annotations.
    pub kubelet: KubeletAnnotations,
    /// The pod's [`keys::PROBE_DECLARATION`] annotation, raw (at most
    /// [`MAX_PROBE_DECLARATION_BYTES`]; a longer one is dropped as malformed).
    pub probe_declaration: Option<String>,
    /// Runtime state.
    pub state: ContainerState,
    /// Exit code; only known from a status call on an exited container.
    pub exit_code: Option<i32>,
    /// Runtime reason (`Completed`, `Error`, `OOMKilled`, ...); status calls only.
    pub reason: Option<String>,
    /// Runtime message accompanying the reason; status calls only.
    pub message: Option<String>,
    /// Creation time, ns since the epoch.
    pub created_ns: i64,
    /// Start time, ns since the epoch; status calls only.
    pub started_ns: Option<i64>,
    /// Finish time, ns since the epoch; status calls only.
    pub finished_ns: Option<i64>,
    /// The image the container runs (the runtime's `image_ref`: its id or digest).
    pub image_ref: String,
    /// The stop signal the image's configuration names (`STOPSIGNAL`), as the runtime reports
    /// it in the image's status; None when it names none or the runtime did not say. The
    /// runtime sends it unless the pod names its own (`lifecycle.stopSignal`), whether or not
    /// the kubelet reports it in the Pod's status (1.20 and containerd 1.6 do not).
    pub image_stop_signal: Option<u8>,
}

impl ContainerMeta {
    /// A container `container` of pod `namespace/pod` (uid `pod_uid`, sandbox `pod_sandbox_id`)
    /// as the runtime lists a running one: first attempt, no kubelet annotations, no probe
    /// declaration, no status-call fields, created at the epoch. Tests and fuzz targets start
    /// from it and change what they are about.
    pub fn running(
        container_id: String,
        pod_sandbox_id: String,
        namespace: &str,
        pod: &str,
        pod_uid: &str,
        container: &str,
    ) -> Self {
        ContainerMeta {
            container_id,
            pod_sandbox_id,
            pod_name: pod.into(),
            pod_namespace: namespace.into(),
            pod_uid: pod_uid.into(),
            container_name: container.into(),
            attempt: 0,
            kubelet: KubeletAnnotations::default(),
            probe_declaration: None,
            state: ContainerState::Running,
            exit_code: None,
            reason: None,
            message: None,
            created_ns: 0,
            started_ns: None,
            finished_ns: None,
            image_ref: String::new(),
            image_stop_signal: None,
        }
    }

    /// Whether the kubelet created this container (it carries the pod UID label).
    pub fn is_kubelet_managed(&self) -> bool {
        !self.pod_uid.is_empty()
    }
}

/// An annotation the kubelet should have written in a known format but did not.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnnotationProblem {
    /// Annotation key.
    pub key: &'static str,
    /// The value found.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl fmt::Display for AnnotationProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {}={:?}: {}", self.key, self.value, self.why)
    }
}

/// Longest probe declaration accepted: a pod declares a handful of probe paths.
pub const MAX_PROBE_DECLARATION_BYTES: usize = 4096;

/// The pod's probe declaration from its annotations, if present and not over the size bound.
pub fn probe_declaration(pod_annotations: &HashMap<String, String>) -> Result<Option<String>, AnnotationProblem> {
    match pod_annotations.get(keys::PROBE_DECLARATION) {
        None => Ok(None),
        Some(text) if text.len() > MAX_PROBE_DECLARATION_BYTES => Err(AnnotationProblem {
            key: keys::PROBE_DECLARATION,
            value: text.chars().take(64).collect(),
            why: "longer than 4096 bytes",
        }),
        Some(text) => Ok(Some(text.clone())),
    }
}

/// Who a container is, from the kubelet's labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodIdentity {
    /// `io.kubernetes.pod.name`.
    pub pod_name: String,
    /// `io.kubernetes.pod.namespace`.
    pub pod_namespace: String,
    /// `io.kubernetes.pod.uid`.
    pub pod_uid: String,
    /// `io.kubernetes.container.name`, else the runtime's own name for the container.
    pub container_name: String,
}

impl PodIdentity {
    /// Identity from the kubelet's labels; `runtime_name` stands in for a missing container label.
    pub fn from_labels(labels: &HashMap<String, String>, runtime_name: Option<&str>) -> Self {
        let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
        Self {
            pod_name: label(keys::POD_NAME),
            pod_namespace: label(keys::POD_NAMESPACE),
            pod_uid: label(keys::POD_UID),
            container_name: labels
                .get(keys::CONTAINER_NAME)
                .cloned()
                .or_else(|| runtime_name.map(str::to_owned))
                .unwrap_or_default(),
        }
    }
}

/// The kubelet's annotations on one container, decoded field by field; each is `None` when
/// absent or malformed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KubeletAnnotations {
    /// `io.kubernetes.container.restartCount`.
    pub restart_count: Option<u32>,
    /// `io.kubernetes.container.type`.
    pub container_type: Option<ContainerType>,
    /// `io.kubernetes.container.hash` (hex in the annotation).
    pub spec_hash: Option<u64>,
    /// `io.kubernetes.pod.terminationGracePeriod`, converted from seconds.
    pub termination_grace_period_ns: Option<u64>,
    /// `io.kubernetes.pod.deletionGracePeriod`, converted from seconds.
    pub deletion_grace_period_ns: Option<u64>,
    /// `io.kubernetes.container.preStopHandler`, raw JSON (checked to be well-formed).
    pub pre_stop_handler: Option<String>,
    /// `io.kubernetes.container.ports`, raw JSON (checked to be well-formed).
    pub ports: Option<String>,
}

impl KubeletAnnotations {
    /// Decodes every known annotation; malformed ones are `None` and pushed to `problems`.
    pub fn parse(annotations: &HashMap<String, String>, problems: &mut Vec<AnnotationProblem>) -> Self {
        Self {
            restart_count: decode(annotations, keys::RESTART_COUNT, parse_restart_count, problems),
            container_type: decode(annotations, keys::CONTAINER_TYPE, parse_container_type, problems),
            spec_hash: decode(annotations, keys::CONTAINER_HASH, parse_hash, problems),
            termination_grace_period_ns: decode(annotations, keys::TERMINATION_GRACE_PERIOD, seconds_to_ns, problems),
            deletion_grace_period_ns: decode(annotations, keys::DELETION_GRACE_PERIOD, seconds_to_ns, problems),
            pre_stop_handler: decode(annotations, keys::PRE_STOP_HANDLER, checked_json, problems),
            ports: decode(annotations, keys::PORTS, checked_json, problems),
        }
    }
}

/// One annotation: `None` when absent; `None` plus a recorded problem when malformed.
fn decode<T>(
    annotations: &HashMap<String, String>,
    key: &'static str,
    parse: fn(&str) -> Result<T, &'static str>,
    problems: &mut Vec<AnnotationProblem>,
) -> Option<T> {
    let value = annotations.get(key)?;
    parse(value).map_err(|why| problems.push(AnnotationProblem { key, value: value.clone(), why })).ok()
}

fn parse_container_type(raw: &str) -> Result<ContainerType, &'static str> {
    ContainerType::parse(raw).ok_or("not one of init, container, ephemeral")
}

fn parse_restart_count(raw: &str) -> Result<u32, &'static str> {
    raw.parse().map_err(|_| "not a non-negative decimal integer")
}

fn parse_hash(raw: &str) -> Result<u64, &'static str> {
    u64::from_str_radix(raw, 16).map_err(|_| "not a 64-bit hex number")
}

fn seconds_to_ns(raw: &str) -> Result<u64, &'static str> {
    let seconds: u64 = raw.parse().map_err(|_| "not a non-negative decimal number of seconds")?;
    seconds.checked_mul(crate::time::SECOND).ok_or("too many seconds to express in nanoseconds")
}

fn checked_json(raw: &str) -> Result<String, &'static str> {
    serde_json::from_str::<serde::de::IgnoredAny>(raw).map_err(|_| "not valid JSON")?;
    Ok(raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_declarations_are_bounded() {
        let with = |text: String| HashMap::from([(keys::PROBE_DECLARATION.to_owned(), text)]);
        assert_eq!(probe_declaration(&HashMap::new()), Ok(None));
        let one = "/probe/tcp?port=8080".to_owned();
        assert_eq!(probe_declaration(&with(one.clone())), Ok(Some(one)));
        let long = "x".repeat(MAX_PROBE_DECLARATION_BYTES + 1);
        let problem = probe_declaration(&with(long)).expect_err("too long");
        assert_eq!((problem.key, problem.value.len()), (keys::PROBE_DECLARATION, 64));
    }

    #[test]
    fn grace_seconds_that_overflow_nanoseconds_are_rejected() {
        assert_eq!(seconds_to_ns("18446744073"), Ok(18_446_744_073_000_000_000));
        assert!(seconds_to_ns("18446744074").is_err());
    }
}
