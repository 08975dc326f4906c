//! The probe HTTP listeners: one inside each pod's network namespace, so the kubelet's
//! `httpGet` reaches `<podIP>:<port>` like any container port; and the host-network fallback,
//! one node-side router at `/probe/<namespace>/<pod>/<container>/<kind>`.
//!
//! Namespaces: [`bind_in_netns`] enters the pod's netns on a short-lived dedicated thread, binds
//! there, and hands the socket back; a socket keeps the netns it was created in, so the agent's
//! own threads never change namespace and one tokio runtime serves every pod.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use super::{check::CheckSpec, metrics::ProbeTarget, pod::PodProbe, query::Query};
use crate::{
    discovery::netns::{self, NetnsError},
    model::event::Event,
};

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
    /// The pod's network namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The address is taken or not available inside that namespace.
    #[error("cannot listen on {addr} in network namespace {path}")]
    Bind {
        addr: SocketAddr,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The std listener could not be handed to tokio.
    #[error("cannot register the probe listener with tokio")]
    Register(#[source] io::Error),
}

/// Binds `addr` inside the network namespace at `netns` (e.g. `/proc/<pid>/ns/net` or
/// `/var/run/netns/<name>`), returning a listener that stays in that namespace.
pub fn bind_in_netns(netns: &Path, addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    let path = netns.to_path_buf();
    netns::run_in(netns, "probe-netns-bind", move || std::net::TcpListener::bind(addr))?
        .map_err(|source| ServerError::Bind { addr, path, source })
}

/// A probe listener served by its own thread with blocking I/O: accept, read, answer, close.
/// Probes arrive one at a time, every few seconds, so a thread parked in `accept` costs nothing,
/// and blocking calls are the cheapest way through one request: no event loop, no task, no
/// extra wake-ups. Dropping the handle (or [`BlockingServer::stop`]) shuts the socket down,
/// which wakes the parked `accept`, and joins the thread.
pub struct BlockingServer {
    listener: Arc<std::net::TcpListener>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockingServer {
    /// Starts serving `listener` on a new thread.
    pub fn start(listener: std::net::TcpListener, answer: Arc<dyn ProbeAnswer>) -> Result<Self, ServerError> {
        listener.set_nonblocking(false).map_err(ServerError::Register)?;
        defer_accept(&listener);
        let listener = Arc::new(listener);
        let serving = Arc::clone(&listener);
        let thread = std::thread::Builder::new()
            .name("probe-listener".into())
            .spawn(move || serve_blocking(&serving, answer.as_ref()))
            .map_err(ServerError::Register)?;
        Ok(Self { listener, thread: Some(thread) })
    }

    /// Stops accepting and waits for the serving thread.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        // SAFETY: shutdown on the listener's own fd; it only wakes the thread blocked in accept.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for BlockingServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn serve_blocking(listener: &std::net::TcpListener, answer: &dyn ProbeAnswer) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(err) = answer_one_blocking(stream, answer) {
                    log::debug!("probe connection ended with an error: {err}");
                }
            }
            // Shut down (EINVAL after shutdown) or the socket is gone: stop serving.
            Err(err) if err.kind() == io::ErrorKind::InvalidInput => return,
            Err(err) => {
                log::warn!("accept on a probe listener failed: {err}");
                // EMFILE and friends: do not spin.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

/// Answers one probe request and closes the connection.
///
/// Probe requests are one GET each on a fresh connection (the kubelet disables keep-alive), so
/// this reads the request head, answers and closes. A full HTTP stack on an event loop cost
/// 114-170 µs of CPU per probe here against ~70 µs for this, and the point of these probes is
/// that they cost almost nothing next to an exec probe. HTTP/1.0 and 1.1 GET/HEAD are served;
/// anything else gets 400 or 405.
fn answer_one_blocking(mut stream: std::net::TcpStream, answer: &dyn ProbeAnswer) -> io::Result<()> {
    use std::io::{Read as _, Write as _};
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 || head.len() + n > MAX_REQUEST_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request head missing or too long"));
        }
        head.extend_from_slice(&chunk[..n]);
    }
    stream.write_all(response(&head, answer).as_bytes())
}

/// The whole response to a raw request head.
fn response(head: &[u8], answer: &dyn ProbeAnswer) -> String {
    let (status, body, send_body) = respond(head, answer);
    let mut response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason_phrase(status),
        body.len()
    );
    if send_body {
        response.push_str(&body);
    }
    response
}

/// Asks the kernel to complete accept only once the request has arrived (TCP_DEFER_ACCEPT):
/// one wake-up per probe instead of one for the handshake and another for the request. Best
/// effort; without it probes are answered all the same.
fn defer_accept(listener: &std::net::TcpListener) {
    let seconds: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        log::debug!("TCP_DEFER_ACCEPT not set on a probe listener: {}", io::Error::last_os_error());
    }
}

/// Longest request head a probe may send (the kubelet's are ~200 bytes).
const MAX_REQUEST_HEAD: usize = 4096;
/// A client that has not sent its request head by then is dropped.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Status, body and whether to send the body (not for HEAD) for a raw request head.
pub fn respond(head: &[u8], answer: &dyn ProbeAnswer) -> (u16, String, bool) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return (400, "malformed request line\n".to_owned(), true);
    };
    if !version.starts_with("HTTP/1.") {
        return (400, "only HTTP/1.x is served\n".to_owned(), true);
    }
    let send_body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        return (405, "only GET is served\n".to_owned(), true);
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let (code, body) = answer.answer(path, query);
    (code, body, send_body)
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "",
    }
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

impl NodeProbes {
    /// Judges `spec` for the container `target`; 404 when no such container has probes here.
    pub fn answer_check(&self, target: &ProbeTarget, spec: &CheckSpec) -> (u16, String) {
        match self.get(target) {
            Some(probe) => probe.answer_check(spec),
            None => {
                (404, format!("no probes for {}/{}/{} on this node\n", target.namespace, target.pod, target.container))
            }
        }
    }
}

impl ProbeAnswer for NodeProbes {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let mut parts = path.strip_prefix("/probe/").unwrap_or("").splitn(4, '/');
        let (Some(namespace), Some(pod), Some(container), Some(kind)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return (404, "host-network probes live at /probe/<namespace>/<pod>/<container>/<kind>\n".to_owned());
        };
        let target = ProbeTarget { namespace: namespace.into(), pod: pod.into(), container: container.into() };
        match Query::parse(query).and_then(|q| CheckSpec::from_query(kind, &q)) {
            Ok(spec) => self.answer_check(&target, &spec),
            Err(err) => (400, format!("{err}\n")),
        }
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;

    struct Echo;

    impl ProbeAnswer for Echo {
        fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
            (200, format!("{path}|{}", query.unwrap_or("-")))
        }
    }

    #[test]
    fn request_lines_are_split_into_path_and_query() {
        let head = b"GET /probe/tcp?port=8080 HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(respond(head, &Echo), (200, "/probe/tcp|port=8080".to_owned(), true));
        assert_eq!(
            respond(b"HEAD /probe/process HTTP/1.0\r\n\r\n", &Echo),
            (200, "/probe/process|-".to_owned(), false)
        );
    }

    #[test]
    fn other_methods_and_garbage_are_refused() {
        assert_eq!(respond(b"POST /probe/tcp HTTP/1.1\r\n\r\n", &Echo).0, 405);
        assert_eq!(respond(b"GET /probe/tcp SPDY/3\r\n\r\n", &Echo).0, 400);
        assert_eq!(respond(b"nonsense\r\n\r\n", &Echo).0, 400);
    }
}
