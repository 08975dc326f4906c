//! The container runtime as a metadata source: who a container is (pod, namespace, uid, name),
//! what the kubelet told the runtime about it (restart count, spec hash, grace periods, preStop
//! hook, ports) and what the runtime says happened to it (state, exit code, reason, times).
//!
//! It speaks the CRI v1 `RuntimeService` (protos from the `k8s-cri` crate) with tonic over the
//! runtime's unix socket; containerd 1.6+ and CRI-O serve it. One `ListContainers` call returns
//! labels and annotations for every container, which is all identity needs; `ContainerStatus`
//! is only needed for the outcome of a single container (exit code, reason, start/finish).
//!
//! The kubelet writes the keys below in `pkg/kubelet/kuberuntime/labels.go`: grace periods as
//! decimal seconds, the spec hash as hex, the preStop handler and ports as JSON. A malformed value
//! leaves that one field `None` and is logged; it never fails a listing, because one odd
//! container must not blind the agent to every other one.
//!
//! Sidecars: the kubelet marks init containers `init` whether or not their `restartPolicy` is
//! `Always`, and the restart policy itself is not written to the runtime, so a sidecar cannot be
//! told apart from a plain init container from CRI metadata alone (it needs the pod spec, or the
//! observation that an `init` container is still running while regular containers run).

use std::{
    collections::HashMap,
    fmt, io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as proto;
use proto::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::{
    transport::{Channel, Endpoint, Uri},
    Code,
};

/// containerd's default CRI socket.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// CRI-O's default CRI socket.
pub const CRIO_SOCKET: &str = "/var/run/crio/crio.sock";

/// How long connecting plus the first `Version` call may take before the socket is declared dead.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound for any single CRI call; a wedged runtime must not wedge the agent.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Annotation: pod deletionGracePeriodSeconds, decimal seconds; set once deletion started.
    pub const DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
}

/// Failures talking to the runtime's CRI socket.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// Nothing exists at the socket path (runtime not installed or not running).
    #[error("CRI socket {path} does not exist (is the container runtime running?)")]
    SocketMissing { path: PathBuf },
    /// The path exists but is a regular file, directory or other non-socket.
    #[error("{path} exists but is not a unix socket, so it cannot be a CRI endpoint")]
    NotASocket { path: PathBuf },
    /// The path could not be inspected.
    #[error("cannot inspect CRI socket {path}: {source}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The socket exists but the connection failed (nobody listening: a stale socket file).
    #[error("cannot connect to CRI socket {path} (stale socket, or the runtime is not listening)")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// Connecting, or a call, took longer than allowed (a wedged runtime).
    #[error("CRI socket {path}: {call} did not complete within {after:?}")]
    Timeout { path: PathBuf, call: &'static str, after: Duration },
    /// Something accepted the connection but did not answer the CRI v1 `Version` call.
    #[error("{path} accepted a connection but is not a CRI v1 runtime (Version call failed)")]
    NotCri {
        path: PathBuf,
        #[source]
        source: tonic::Status,
    },
    /// A CRI call failed.
    #[error("CRI call {call} on {path} failed")]
    Call {
        path: PathBuf,
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
    /// The runtime does not know this container (removed, or never existed).
    #[error("the runtime at {path} has no container {container_id}")]
    NotFound { path: PathBuf, container_id: String },
}

/// What the runtime reports a container is doing (CRI `ContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

impl ContainerState {
    fn from_proto(raw: i32) -> Self {
        match proto::ContainerState::try_from(raw) {
            Ok(proto::ContainerState::ContainerCreated) => Self::Created,
            Ok(proto::ContainerState::ContainerRunning) => Self::Running,
            Ok(proto::ContainerState::ContainerExited) => Self::Exited,
            Ok(proto::ContainerState::ContainerUnknown) | Err(_) => Self::Unknown,
        }
    }
}

/// Where in the pod spec the container comes from (annotation `io.kubernetes.container.type`).
///
/// Sidecars (init containers with `restartPolicy: Always`) are reported as [`Self::Init`]: the
/// kubelet does not pass the restart policy to the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

impl ContainerMeta {
    /// Whether the kubelet created this container (it carries the pod UID label).
    pub fn is_kubelet_managed(&self) -> bool {
        !self.pod_uid.is_empty()
    }
}

/// An annotation the kubelet should have written in a known format but did not.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// The kubelet's annotations on one container, decoded field by field.
#[derive(Debug, Default)]
struct KubeletAnnotations {
    restart_count: Option<u32>,
    container_type: Option<ContainerType>,
    spec_hash: Option<u64>,
    termination_grace_period_ns: Option<u64>,
    deletion_grace_period_ns: Option<u64>,
    pre_stop_handler: Option<String>,
    ports: Option<String>,
}

impl KubeletAnnotations {
    fn parse(annotations: &HashMap<String, String>, problems: &mut Vec<AnnotationProblem>) -> Self {
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
    seconds.checked_mul(1_000_000_000).ok_or("too many seconds to express in nanoseconds")
}

fn checked_json(raw: &str) -> Result<String, &'static str> {
    serde_json::from_str::<serde::de::IgnoredAny>(raw).map_err(|_| "not valid JSON")?;
    Ok(raw.to_owned())
}

/// Identity from the kubelet's labels, falling back to CRI metadata for the container name.
fn identity(
    labels: &HashMap<String, String>,
    metadata: Option<&proto::ContainerMetadata>,
) -> (String, String, String, String) {
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let container_name =
        labels.get(keys::CONTAINER_NAME).cloned().or_else(|| metadata.map(|m| m.name.clone())).unwrap_or_default();
    (label(keys::POD_NAME), label(keys::POD_NAMESPACE), label(keys::POD_UID), container_name)
}

fn nonzero(ns: i64) -> Option<i64> {
    (ns != 0).then_some(ns)
}

fn nonempty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Decodes a `ListContainers` entry. Outcome fields (exit code, reason, start/finish) stay
/// `None`: the list does not carry them.
pub fn meta_from_list_entry(container: &proto::Container) -> (ContainerMeta, Vec<AnnotationProblem>) {
    let mut problems = Vec::new();
    let a = KubeletAnnotations::parse(&container.annotations, &mut problems);
    let (pod_name, pod_namespace, pod_uid, container_name) = identity(&container.labels, container.metadata.as_ref());
    let meta = ContainerMeta {
        container_id: container.id.clone(),
        pod_sandbox_id: container.pod_sandbox_id.clone(),
        pod_name,
        pod_namespace,
        pod_uid,
        container_name,
        attempt: container.metadata.as_ref().map_or(0, |m| m.attempt),
        restart_count: a.restart_count,
        container_type: a.container_type,
        spec_hash: a.spec_hash,
        termination_grace_period_ns: a.termination_grace_period_ns,
        deletion_grace_period_ns: a.deletion_grace_period_ns,
        pre_stop_handler: a.pre_stop_handler,
        ports: a.ports,
        state: ContainerState::from_proto(container.state),
        exit_code: None,
        reason: None,
        message: None,
        created_ns: container.created_at,
        started_ns: None,
        finished_ns: None,
    };
    (meta, problems)
}

/// Decodes a `ContainerStatus` answer. The status message has no sandbox id, so the caller
/// supplies it (from a list entry).
pub fn meta_from_status(
    status: &proto::ContainerStatus,
    pod_sandbox_id: String,
) -> (ContainerMeta, Vec<AnnotationProblem>) {
    let mut problems = Vec::new();
    let a = KubeletAnnotations::parse(&status.annotations, &mut problems);
    let (pod_name, pod_namespace, pod_uid, container_name) = identity(&status.labels, status.metadata.as_ref());
    let state = ContainerState::from_proto(status.state);
    let meta = ContainerMeta {
        container_id: status.id.clone(),
        pod_sandbox_id,
        pod_name,
        pod_namespace,
        pod_uid,
        container_name,
        attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
        restart_count: a.restart_count,
        container_type: a.container_type,
        spec_hash: a.spec_hash,
        termination_grace_period_ns: a.termination_grace_period_ns,
        deletion_grace_period_ns: a.deletion_grace_period_ns,
        pre_stop_handler: a.pre_stop_handler,
        ports: a.ports,
        state,
        // The CRI reports 0 for containers that have not exited; only an exited one has a code.
        exit_code: (state == ContainerState::Exited).then_some(status.exit_code),
        reason: nonempty(&status.reason),
        message: nonempty(&status.message),
        created_ns: status.created_at,
        started_ns: nonzero(status.started_at),
        finished_ns: nonzero(status.finished_at),
    };
    (meta, problems)
}

fn log_problems(container_id: &str, problems: &[AnnotationProblem]) {
    for problem in problems {
        log::warn!("container {container_id}: {problem}; leaving that field unset");
    }
}

/// Version information the runtime reported on connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// e.g. `containerd`, `cri-o`.
    pub runtime_name: String,
    /// e.g. `1.6.20~ds1`.
    pub runtime_version: String,
    /// CRI API version the runtime speaks, e.g. `v1`.
    pub runtime_api_version: String,
}

/// Opens a gRPC channel to a unix socket, after checking the path is a socket.
///
/// Shared by [`CriClient::connect`] and test harnesses that need the raw generated clients.
pub async fn connect_channel(path: impl AsRef<Path>) -> Result<Channel, CriError> {
    let path = path.as_ref().to_owned();
    match std::fs::metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => return Err(CriError::NotASocket { path }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(CriError::SocketMissing { path }),
        Err(source) => return Err(CriError::Inspect { path, source }),
    }
    // The URI is required by tonic but unused: every connection goes to the socket below.
    // No channel-wide request timeout: StopContainer legitimately takes as long as the grace
    // period, so deadlines are set per call by the callers that know what they wait for.
    let endpoint = Endpoint::from_static("http://cri.invalid").connect_timeout(CONNECT_TIMEOUT);
    let socket = path.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
    });
    match tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(CriError::Connect { path, source }),
        Err(_) => Err(CriError::Timeout { path, call: "connect", after: CONNECT_TIMEOUT }),
    }
}

/// A connection to a CRI v1 runtime.
#[derive(Clone, Debug)]
pub struct CriClient {
    socket: PathBuf,
    runtime: RuntimeServiceClient<Channel>,
    version: RuntimeVersion,
}

impl CriClient {
    /// Connects and proves the peer is a CRI v1 runtime with a `Version` call.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, CriError> {
        let socket = path.as_ref().to_owned();
        let mut runtime = RuntimeServiceClient::new(connect_channel(&socket).await?);
        let request = proto::VersionRequest { version: "v1".to_owned() };
        let answer = match tokio::time::timeout(CONNECT_TIMEOUT, runtime.version(request)).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(source)) => return Err(CriError::NotCri { path: socket, source }),
            Err(_) => return Err(CriError::Timeout { path: socket, call: "Version", after: CONNECT_TIMEOUT }),
        };
        let version = RuntimeVersion {
            runtime_name: answer.runtime_name,
            runtime_version: answer.runtime_version,
            runtime_api_version: answer.runtime_api_version,
        };
        Ok(Self { socket, runtime, version })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What the runtime reported on connect.
    pub fn version(&self) -> &RuntimeVersion {
        &self.version
    }

    /// The generated `RuntimeService` client on the same channel, for calls this module does
    /// not wrap (tests use it to create pods and containers).
    pub fn runtime_service(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// Runs one call under [`CALL_TIMEOUT`], naming the call in any error.
    async fn call<T>(
        &self,
        call: &'static str,
        future: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(CALL_TIMEOUT, future).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(source)) => Err(CriError::Call { path: self.socket.clone(), call, source }),
            Err(_) => Err(CriError::Timeout { path: self.socket.clone(), call, after: CALL_TIMEOUT }),
        }
    }

    async fn list(&self, filter: Option<proto::ContainerFilter>) -> Result<Vec<proto::Container>, CriError> {
        let mut runtime = self.runtime.clone();
        let request = proto::ListContainersRequest { filter };
        Ok(self.call("ListContainers", runtime.list_containers(request)).await?.containers)
    }

    /// Every container the runtime knows, in any state, from one `ListContainers` call.
    ///
    /// Outcome fields (exit code, reason, start/finish times) are `None`; ask
    /// [`Self::container_status`] for those.
    pub async fn list_containers(&self) -> Result<Vec<ContainerMeta>, CriError> {
        let containers = self.list(None).await?;
        Ok(containers
            .iter()
            .map(|container| {
                let (meta, problems) = meta_from_list_entry(container);
                log_problems(&meta.container_id, &problems);
                meta
            })
            .collect())
    }

    /// Every container, as a lookup table.
    pub async fn snapshot(&self) -> Result<MetadataSnapshot, CriError> {
        Ok(self.list_containers().await?.into_iter().collect())
    }

    /// One container with its outcome: state, exit code, reason, start and finish times.
    ///
    /// Two calls: `ContainerStatus` carries no sandbox id, so a `ListContainers` filtered to
    /// this id supplies it.
    pub async fn container_status(&self, container_id: &str) -> Result<ContainerMeta, CriError> {
        let not_found = || CriError::NotFound { path: self.socket.clone(), container_id: container_id.to_owned() };
        let mut runtime = self.runtime.clone();
        let request = proto::ContainerStatusRequest { container_id: container_id.to_owned(), verbose: false };
        let status = match self.call("ContainerStatus", runtime.container_status(request)).await {
            Ok(answer) => answer.status.ok_or_else(not_found)?,
            Err(CriError::Call { source, .. }) if source.code() == Code::NotFound => return Err(not_found()),
            Err(e) => return Err(e),
        };
        let filter = proto::ContainerFilter { id: status.id.clone(), ..Default::default() };
        let sandbox = self
            .list(Some(filter))
            .await?
            .into_iter()
            .find(|c| c.id == status.id)
            .map(|c| c.pod_sandbox_id)
            .ok_or_else(not_found)?;
        let (meta, problems) = meta_from_status(&status, sandbox);
        log_problems(&meta.container_id, &problems);
        Ok(meta)
    }
}

/// Where the rest of the agent looks containers up; the seam that lets tests use a table.
pub trait MetadataSource {
    /// The container with this full runtime id, if known.
    fn container(&self, container_id: &str) -> Option<&ContainerMeta>;
}

/// Containers at one point in time, by id.
#[derive(Clone, Debug, Default)]
pub struct MetadataSnapshot {
    by_id: HashMap<String, ContainerMeta>,
}

impl MetadataSnapshot {
    /// Number of containers.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// All containers, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &ContainerMeta> {
        self.by_id.values()
    }
}

impl FromIterator<ContainerMeta> for MetadataSnapshot {
    fn from_iter<I: IntoIterator<Item = ContainerMeta>>(iter: I) -> Self {
        Self { by_id: iter.into_iter().map(|m| (m.container_id.clone(), m)).collect() }
    }
}

impl MetadataSource for MetadataSnapshot {
    fn container(&self, container_id: &str) -> Option<&ContainerMeta> {
        self.by_id.get(container_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn kubelet_labels() -> HashMap<String, String> {
        map(&[
            (keys::POD_NAME, "web-0"),
            (keys::POD_NAMESPACE, "shop"),
            (keys::POD_UID, "7d2c0a8e-1111-2222-3333-444455556666"),
            (keys::CONTAINER_NAME, "nginx"),
        ])
    }

    fn entry(annotations: HashMap<String, String>) -> proto::Container {
        proto::Container {
            id: "c0ffee".to_owned(),
            pod_sandbox_id: "5a4d".to_owned(),
            metadata: Some(proto::ContainerMetadata { name: "nginx".to_owned(), attempt: 3 }),
            state: proto::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_000_000_000,
            labels: kubelet_labels(),
            annotations,
            ..Default::default()
        }
    }

    #[test]
    fn decodes_what_the_kubelet_writes() {
        let (meta, problems) = meta_from_list_entry(&entry(map(&[
            (keys::RESTART_COUNT, "3"),
            (keys::CONTAINER_HASH, "a1b2c3d4"),
            (keys::CONTAINER_TYPE, "init"),
            (keys::TERMINATION_GRACE_PERIOD, "30"),
            (keys::DELETION_GRACE_PERIOD, "0"),
            (keys::PRE_STOP_HANDLER, r#"{"exec":{"command":["sleep","5"]}}"#),
            (keys::PORTS, r#"[{"containerPort":80,"protocol":"TCP"}]"#),
        ])));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(meta.container_id, "c0ffee");
        assert_eq!(meta.pod_sandbox_id, "5a4d");
        assert_eq!(
            (meta.pod_name.as_str(), meta.pod_namespace.as_str(), meta.container_name.as_str()),
            ("web-0", "shop", "nginx")
        );
        assert_eq!(meta.pod_uid, "7d2c0a8e-1111-2222-3333-444455556666");
        assert!(meta.is_kubelet_managed());
        assert_eq!(meta.attempt, 3);
        assert_eq!(meta.restart_count, Some(3));
        assert_eq!(meta.spec_hash, Some(0xa1b2_c3d4));
        assert_eq!(meta.container_type, Some(ContainerType::Init));
        assert_eq!(meta.termination_grace_period_ns, Some(30_000_000_000));
        assert_eq!(meta.deletion_grace_period_ns, Some(0));
        assert_eq!(meta.pre_stop_handler.as_deref(), Some(r#"{"exec":{"command":["sleep","5"]}}"#));
        assert_eq!(meta.ports.as_deref(), Some(r#"[{"containerPort":80,"protocol":"TCP"}]"#));
        assert_eq!(meta.state, ContainerState::Running);
        assert_eq!(meta.created_ns, 1_700_000_000_000_000_000);
        assert_eq!((meta.exit_code, meta.started_ns, meta.finished_ns), (None, None, None));
    }

    #[test]
    fn absent_annotations_are_none_without_problems() {
        let (meta, problems) = meta_from_list_entry(&entry(HashMap::new()));
        assert!(problems.is_empty());
        assert_eq!(meta.restart_count, None);
        assert_eq!(meta.container_type, None);
        assert_eq!(meta.termination_grace_period_ns, None);
        assert_eq!(meta.pre_stop_handler, None);
    }

    #[test]
    fn malformed_annotations_unset_only_their_field() {
        let (meta, problems) = meta_from_list_entry(&entry(map(&[
            (keys::RESTART_COUNT, "-1"),
            (keys::CONTAINER_HASH, "not-hex"),
            (keys::CONTAINER_TYPE, "sidecar"),
            (keys::TERMINATION_GRACE_PERIOD, "thirty"),
            (keys::DELETION_GRACE_PERIOD, "99999999999999999999"),
            (keys::PRE_STOP_HANDLER, "{exec:"),
            (keys::PORTS, r#"[{"containerPort":8080}]"#),
        ])));
        let keys_hit: Vec<_> = problems.iter().map(|p| p.key).collect();
        assert_eq!(
            keys_hit,
            [
                keys::RESTART_COUNT,
                keys::CONTAINER_TYPE,
                keys::CONTAINER_HASH,
                keys::TERMINATION_GRACE_PERIOD,
                keys::DELETION_GRACE_PERIOD,
                keys::PRE_STOP_HANDLER,
            ]
        );
        assert_eq!(meta.restart_count, None);
        assert_eq!(meta.spec_hash, None);
        assert_eq!(meta.container_type, None);
        assert_eq!(meta.termination_grace_period_ns, None);
        assert_eq!(meta.deletion_grace_period_ns, None);
        assert_eq!(meta.pre_stop_handler, None);
        // The well-formed neighbour and the identity survive.
        assert_eq!(meta.ports.as_deref(), Some(r#"[{"containerPort":8080}]"#));
        assert_eq!(meta.pod_name, "web-0");
        assert!(problems[3].to_string().contains("\"thirty\""), "{}", problems[3]);
    }

    #[test]
    fn grace_seconds_that_overflow_nanoseconds_are_rejected() {
        assert_eq!(seconds_to_ns("18446744073"), Ok(18_446_744_073_000_000_000));
        assert!(seconds_to_ns("18446744074").is_err());
    }

    #[test]
    fn unlabelled_containers_fall_back_to_the_metadata_name() {
        let mut container = entry(HashMap::new());
        container.labels.clear();
        let (meta, _) = meta_from_list_entry(&container);
        assert_eq!(meta.container_name, "nginx");
        assert!(meta.pod_uid.is_empty());
        assert!(!meta.is_kubelet_managed());
    }

    #[test]
    fn status_outcome_fields() {
        let mut status = proto::ContainerStatus {
            id: "c0ffee".to_owned(),
            metadata: Some(proto::ContainerMetadata { name: "nginx".to_owned(), attempt: 0 }),
            state: proto::ContainerState::ContainerExited as i32,
            created_at: 10,
            started_at: 20,
            finished_at: 30,
            exit_code: 137,
            reason: "OOMKilled".to_owned(),
            labels: kubelet_labels(),
            annotations: map(&[(keys::TERMINATION_GRACE_PERIOD, "2")]),
            ..Default::default()
        };
        let (meta, problems) = meta_from_status(&status, "5a4d".to_owned());
        assert!(problems.is_empty());
        assert_eq!(meta.pod_sandbox_id, "5a4d");
        assert_eq!(meta.state, ContainerState::Exited);
        assert_eq!(meta.exit_code, Some(137));
        assert_eq!(meta.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(meta.message, None);
        assert_eq!((meta.created_ns, meta.started_ns, meta.finished_ns), (10, Some(20), Some(30)));
        assert_eq!(meta.termination_grace_period_ns, Some(2_000_000_000));

        // A running container's 0 exit code and 0 finish time mean "not yet", not "exit 0 at 1970".
        status.state = proto::ContainerState::ContainerRunning as i32;
        status.exit_code = 0;
        status.finished_at = 0;
        status.reason.clear();
        let (meta, _) = meta_from_status(&status, String::new());
        assert_eq!((meta.exit_code, meta.finished_ns, meta.reason), (None, None, None));
    }

    #[test]
    fn unknown_state_values_map_to_unknown() {
        assert_eq!(ContainerState::from_proto(42), ContainerState::Unknown);
        assert_eq!(ContainerState::from_proto(2), ContainerState::Exited);
    }

    #[test]
    fn snapshot_looks_up_by_id() {
        let (meta, _) = meta_from_list_entry(&entry(HashMap::new()));
        let snapshot: MetadataSnapshot = [meta].into_iter().collect();
        assert_eq!(snapshot.len(), 1);
        assert_eq!(snapshot.container("c0ffee").map(|m| m.pod_name.as_str()), Some("web-0"));
        assert!(snapshot.container("other").is_none());
    }

    /// A private directory under the temp dir for one socket test (no root needed).
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("lifecycle-cri-{test}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create scratch dir");
            Self(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn connect_names_a_missing_socket() {
        let scratch = Scratch::new("missing");
        let path = scratch.path("missing.sock");
        let err = CriClient::connect(&path).await.expect_err("no socket there");
        assert!(matches!(err, CriError::SocketMissing { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }

    #[tokio::test]
    async fn connect_rejects_a_regular_file() {
        let scratch = Scratch::new("file");
        let path = scratch.path("file.sock");
        std::fs::write(&path, b"").expect("write file");
        let err = CriClient::connect(&path).await.expect_err("not a socket");
        assert!(matches!(err, CriError::NotASocket { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn connect_reports_a_stale_socket() {
        let scratch = Scratch::new("stale");
        let path = scratch.path("stale.sock");
        // Binding creates the socket file; dropping the listener leaves it behind unanswered,
        // exactly what a crashed runtime leaves.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        let err = CriClient::connect(&path).await.expect_err("nobody listening");
        assert!(matches!(err, CriError::Connect { .. }), "{err:?}");
        assert!(err.to_string().contains("stale"), "{err}");
    }

    #[tokio::test]
    async fn connect_rejects_a_server_that_is_not_grpc() {
        use tokio::io::AsyncWriteExt;
        let scratch = Scratch::new("http");
        let path = scratch.path("http.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                // Not HTTP/2: the client's handshake fails and Version never gets an answer.
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let err = CriClient::connect(&path).await.expect_err("not a CRI server");
        assert!(matches!(err, CriError::NotCri { .. }), "{err:?}");
        server.abort();
    }
}
