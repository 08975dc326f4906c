//! The container runtime's CRI socket: a CRI v1 `RuntimeService` client (protos from the
//! `k8s-cri` crate) with tonic over the runtime's unix socket; containerd 1.6+ and CRI-O serve it.
//! One `ListContainers` call returns labels and annotations for every container, which is all
//! identity needs; `ContainerStatus` is only needed for the outcome of a single container (exit
//! code, reason, start/finish). The `ImageService`'s `ImageStatus` (verbose) tells each image's
//! configured stop signal, once per image (cached, bounded). Decoding into the model's types is
//! in `convert`.

mod convert;

use std::{
    collections::HashMap,
    io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as proto;
use proto::{image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient};
use tokio::net::UnixStream;
use tonic::{
    transport::{Channel, Endpoint, Uri},
    Code,
};

use convert::{image_stop_signal, log_problems};
pub(crate) use convert::{meta_from_list_entry, meta_from_status};

use crate::model::metadata::{probe_declaration, ContainerMeta};

/// containerd's default CRI socket.
pub(crate) const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// CRI-O's default CRI socket.
pub(crate) const CRIO_SOCKET: &str = "/var/run/crio/crio.sock";

/// How long connecting plus the first `Version` call may take before the socket is declared dead.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound for any single CRI call; a wedged runtime must not wedge the agent.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer taken from the runtime. tonic's default (4 MiB) is a few pods with large label
/// sets: past it `ListPodSandbox` failed on every refresh and the whole node lost its names,
/// declarations and grace periods. 32 MiB is thousands of fat pods; the kubelet's own CRI client
/// allows 16 MiB.
pub(crate) const MAX_CRI_MESSAGE_BYTES: usize = 32 << 20;
/// Images whose stop signal is kept; past this the cache starts over (a node runs far fewer).
const MAX_IMAGES: usize = 1024;
/// Images asked about in one listing: a node starting many pods at once names the rest at the
/// next refresh.
const IMAGES_PER_LISTING: usize = 64;

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
    #[error("cannot inspect CRI socket {path}")]
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
    images: ImageServiceClient<Channel>,
    /// Image ref -> the stop signal its configuration names (None: none), as `ImageStatus`
    /// said; an image's configuration never changes under its ref.
    image_stop_signals: Arc<parking_lot::Mutex<HashMap<String, Option<u8>>>>,
    version: RuntimeVersion,
    /// The probe declarations of the last `ListPodSandbox` that answered: used when one fails,
    /// so a sandbox listing that breaks does not take the containers' names with it.
    last_declarations: Arc<parking_lot::Mutex<HashMap<String, String>>>,
}

impl CriClient {
    /// Connects and proves the peer is a CRI v1 runtime with a `Version` call.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, CriError> {
        let socket = path.as_ref().to_owned();
        let channel = connect_channel(&socket).await?;
        let images = ImageServiceClient::new(channel.clone()).max_decoding_message_size(MAX_CRI_MESSAGE_BYTES);
        let mut runtime = RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_CRI_MESSAGE_BYTES);
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
        Ok(Self {
            socket,
            runtime,
            images,
            image_stop_signals: Arc::default(),
            version,
            last_declarations: Arc::default(),
        })
    }

    /// The socket this client talks to.
    pub(crate) fn socket(&self) -> &Path {
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
        let declarations = match self.probe_declarations().await {
            Ok(declarations) => {
                *self.last_declarations.lock() = declarations.clone();
                declarations
            }
            Err(err) => {
                log::warn!("{}; probe declarations as of the last listing that answered", crate::ErrorChain(&err));
                self.last_declarations.lock().clone()
            }
        };
        let mut metas: Vec<ContainerMeta> = containers
            .iter()
            .map(|container| {
                let (mut meta, problems) = meta_from_list_entry(container);
                log_problems(&meta.container_id, &problems);
                meta.probe_declaration = declarations.get(&meta.pod_sandbox_id).cloned();
                meta
            })
            .collect();
        let signals = self.image_stop_signals(metas.iter().map(|m| m.image_ref.as_str())).await;
        for meta in &mut metas {
            meta.image_stop_signal = signals.get(&meta.image_ref).copied().flatten();
        }
        Ok(metas)
    }

    /// The configured stop signal of each of `images` the runtime told (asked once per image;
    /// an image it could not tell about is asked again at the next listing).
    async fn image_stop_signals<'a>(&self, images: impl Iterator<Item = &'a str>) -> HashMap<String, Option<u8>> {
        let unknown: Vec<String> = {
            let known = self.image_stop_signals.lock();
            let mut unknown: Vec<String> =
                images.filter(|image| !image.is_empty() && !known.contains_key(*image)).map(str::to_owned).collect();
            unknown.sort();
            unknown.dedup();
            unknown.truncate(IMAGES_PER_LISTING);
            unknown
        };
        for image in unknown {
            let mut client = self.images.clone();
            let spec = proto::ImageSpec { image: image.clone(), ..Default::default() };
            let request = proto::ImageStatusRequest { image: Some(spec), verbose: true };
            match self.call("ImageStatus", client.image_status(request)).await {
                Ok(answer) => {
                    let signal = image_stop_signal(&answer.info);
                    let mut known = self.image_stop_signals.lock();
                    if known.len() >= MAX_IMAGES {
                        known.clear();
                    }
                    known.insert(image, signal);
                }
                Err(err) => log::debug!("{}", crate::ErrorChain(&err)),
            }
        }
        self.image_stop_signals.lock().clone()
    }

    /// Sandbox id -> the pod's probe declaration, for the ready pods that have one (pod
    /// annotations live on the sandbox, not on its containers; a stopped sandbox's containers
    /// are no longer probed).
    async fn probe_declarations(&self) -> Result<HashMap<String, String>, CriError> {
        let mut runtime = self.runtime.clone();
        let ready = proto::PodSandboxStateValue { state: proto::PodSandboxState::SandboxReady as i32 };
        let filter = proto::PodSandboxFilter { state: Some(ready), ..Default::default() };
        let request = proto::ListPodSandboxRequest { filter: Some(filter) };
        let sandboxes = self.call("ListPodSandbox", runtime.list_pod_sandbox(request)).await?.items;
        let mut out = HashMap::new();
        for sandbox in sandboxes {
            match probe_declaration(&sandbox.annotations) {
                Ok(Some(text)) => {
                    out.insert(sandbox.id, text);
                }
                Ok(None) => {}
                Err(problem) => log::warn!("pod sandbox {}: {problem}; no probes declared", sandbox.id),
            }
        }
        Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

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
