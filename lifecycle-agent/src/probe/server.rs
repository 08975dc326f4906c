//! The probe HTTP listeners: one inside each pod's network namespace, so the kubelet's
//! `httpGet` reaches `<podIP>:<port>` like any container port; and the host-network fallback,
//! one node-side router at `/probe/<namespace>/<pod>/<container>/<kind>`.
//!
//! Namespaces: [`bind_in_netns`] enters the pod's netns on a short-lived dedicated thread, binds
//! there, and hands the socket back; a socket keeps the netns it was created in, so the agent's
//! own threads never change namespace and one tokio runtime serves every pod.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    fs::File,
    io,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{header, server::conn::http1, service::service_fn, Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::{metrics::ProbeTarget, pod::PodProbe};
use crate::event::Event;

/// Port of the per-pod probe listener unless configured otherwise.
pub const DEFAULT_POD_PORT: u16 = 9891;

/// Answers probe requests from cached state. Must not block.
pub trait ProbeAnswer: Send + Sync {
    /// Status code and body for a GET of `path` with `query`.
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String);
}

/// Why a probe listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The netns file (e.g. /proc/<pid>/ns/net) could not be opened.
    #[error("cannot open network namespace {path}: {source}")]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// setns(CLONE_NEWNET) was refused (needs CAP_SYS_ADMIN) or the file is not a netns.
    #[error("cannot enter network namespace {path}: {source}")]
    Setns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The address is taken or not available inside that namespace.
    #[error("cannot listen on {addr} in network namespace {path}: {source}")]
    Bind {
        addr: SocketAddr,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The binding thread could not be started or panicked.
    #[error("the thread binding in {path} failed")]
    Thread { path: PathBuf },
    /// The std listener could not be handed to tokio.
    #[error("cannot register the probe listener with tokio: {0}")]
    Register(#[source] io::Error),
}

/// Binds `addr` inside the network namespace at `netns` (e.g. `/proc/<pid>/ns/net` or
/// `/var/run/netns/<name>`), returning a listener that stays in that namespace.
pub fn bind_in_netns(netns: &Path, addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    let path = netns.to_path_buf();
    let file = File::open(&path).map_err(|source| ServerError::OpenNetns { path: path.clone(), source })?;
    let thread_path = path.clone();
    std::thread::Builder::new()
        .name("probe-netns-bind".into())
        .spawn(move || {
            // SAFETY: setns on an fd we own; it changes only this thread's netns, and this thread
            // ends right after binding, so no other code ever runs in the pod's namespace.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(ServerError::Setns { path: thread_path, source: io::Error::last_os_error() });
            }
            std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind { addr, path: thread_path, source })
        })
        .map_err(|_| ServerError::Thread { path: path.clone() })?
        .join()
        .map_err(|_| ServerError::Thread { path })?
}

/// Serves probe requests on `listener` until `shutdown` turns true. Call inside a tokio runtime.
pub async fn serve(
    listener: std::net::TcpListener,
    answer: Arc<dyn ProbeAnswer>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    listener.set_nonblocking(true).map_err(ServerError::Register)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServerError::Register)?;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return Ok(()),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                log::warn!("accept on a probe listener failed: {err}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let answer = Arc::clone(&answer);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let answer = Arc::clone(&answer);
                async move { Ok::<_, Infallible>(respond(answer.as_ref(), &request)) }
            });
            if let Err(err) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                log::debug!("probe connection ended with an error: {err}");
            }
        });
    }
}

fn respond(answer: &dyn ProbeAnswer, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let (code, body) = if request.method() == Method::GET || request.method() == Method::HEAD {
        answer.answer(request.uri().path(), request.uri().query())
    } else {
        (405, "only GET is served\n".to_owned())
    };
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"response build failed\n"))))
}

/// The host-network fallback and the event fan-out: every tracked container by identity.
///
/// Pods with `hostNetwork: true` share the node's netns, so they cannot each have a listener on
/// the same port there. Their probes are served by the node-side listener (the agent's own, on a
/// configurable port) at `/probe/<namespace>/<pod>/<container>/<kind>?...`; point the pod's
/// `httpGet` at that path with `port:` set to the agent's probe port (the pod IP is the node IP).
#[derive(Default)]
pub struct NodeProbes {
    pods: RwLock<BTreeMap<ProbeTarget, Arc<PodProbe>>>,
}

impl NodeProbes {
    pub fn insert(&self, probe: Arc<PodProbe>) {
        self.pods.write().unwrap_or_else(|p| p.into_inner()).insert(probe.target().clone(), probe);
    }

    pub fn remove(&self, target: &ProbeTarget) -> Option<Arc<PodProbe>> {
        self.pods.write().unwrap_or_else(|p| p.into_inner()).remove(target)
    }

    pub fn get(&self, target: &ProbeTarget) -> Option<Arc<PodProbe>> {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).get(target).cloned()
    }

    /// Names of the containers of one pod that have probes.
    pub fn containers_of(&self, namespace: &str, pod: &str) -> Vec<String> {
        self.pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|t| t.namespace == namespace && t.pod == pod)
            .map(|t| t.container.clone())
            .collect()
    }

    /// Hands a kernel event to every container it concerns.
    pub fn on_event(&self, event: &Event) {
        for probe in self.pods.read().unwrap_or_else(|p| p.into_inner()).values() {
            probe.on_event(event);
        }
    }
}

impl ProbeAnswer for NodeProbes {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let mut parts = path.strip_prefix("/probe/").unwrap_or("").splitn(4, '/');
        let (Some(namespace), Some(pod), Some(container), Some(kind)) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return (404, "host-network probes live at /probe/<namespace>/<pod>/<container>/<kind>\n".to_owned());
        };
        let target = ProbeTarget { namespace: namespace.into(), pod: pod.into(), container: container.into() };
        match self.get(&target) {
            Some(probe) => probe.answer(&format!("/probe/{kind}"), query),
            None => (404, format!("no probes for {namespace}/{pod}/{container} on this node\n")),
        }
    }
}
