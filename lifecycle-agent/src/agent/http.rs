//! The agent's HTTP listener: `/metrics`, `/healthz` and the JSON API.
//!
//! hyper 1 on a tokio listener, one connection task each. Handlers answer from in-memory state
//! (and kernel maps, for metrics); nothing here blocks on I/O beyond the socket, except the
//! gate in front of `/api/*` when it must ask the API server about a token (`auth.rs`), which
//! holds only that request's task.
//!
//! Any client that reaches `--listen` is served, so connections are bounded ([`Limits`]): how
//! many at once (each may hold an answer of a megabyte until it is read), how many from one
//! source address, how long a request head may take, and how long a connection may live. A
//! client that opens connections and sends nothing, or reads an answer slowly, gives its place
//! up instead of keeping it, and one source cannot take every place.
//!
//! An answer made from the whole node (a scrape, the API's containers and history, the explain
//! pages) costs CPU in proportion to the node: milliseconds at a thousand containers, on one
//! thread. While one is made, the worker's other tasks go to another thread, and such answers
//! take turns (`sources.rs`): one is made at a time on a listener, in the order asked, and the
//! requests of one source address one after another. A client asking on all its connections at
//! once gets its answers in turn, uses one CPU at most, and delays another source's by one
//! answer at most; the cheap requests (`/healthz`, the probe answers of host-network pods) take
//! no turn and are never behind one.
//!
//! The kubelet's liveness probe of the agent has a listener of its own (`--health-listen`,
//! served by [`super::health::HealthAnswer`] on an event loop of its own, not here): nothing a
//! client of `--listen` does can delay it, and it answers from the loops' progress
//! ([`super::health`]), not a constant.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::{Body as _, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch};

use super::{
    auth::{ApiGate, Verdict},
    sources::{Busy, Places, Refused, Turns},
};
use crate::{export::metrics::Metrics, heartbeats::Heartbeats};

/// The making of an answer: the status and JSON body, made when the request's turn comes
/// (`sources.rs`).
pub type Build = Box<dyn FnOnce() -> (StatusCode, String) + Send>;

/// An answer that comes later: a request that waits for a change, ready to be made when its wait
/// ends (made in its turn).
pub type Later = std::pin::Pin<Box<dyn std::future::Future<Output = Build> + Send>>;

/// Something that answers JSON API paths (everything under `/api/`).
pub trait ApiHandler: Send + Sync + 'static {
    /// Returns the status and JSON body for `path` (with query), or None for an unknown path.
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)>;

    /// The answer of a request that waits for a change (a long poll), or None when `path` and
    /// `query` are to be answered now, by [`Self::get`]. The connection stays within the
    /// listener's [`Limits`] while it waits.
    fn wait(&self, _path: &str, _query: Option<&str>) -> Option<Later> {
        None
    }

    /// Whether the answer to `path` and `query` is made from one container whatever the node
    /// holds: made at once on the async worker, without a turn, like a probe answer (see
    /// [`costs_the_node`]). By default, none is.
    fn is_narrow(&self, _path: &str, _query: Option<&str>) -> bool {
        false
    }
}

/// What the listener serves.
pub struct Routes {
    pub metrics: Metrics,
    pub api: Option<Arc<dyn ApiHandler>>,
    /// Checks every `/api/*` request's bearer token first (`--api-auth kubernetes`); None: open.
    pub gate: Option<ApiGate>,
    /// What `/healthz` answers from; None: always ok (tests of the other routes).
    pub health: Option<Arc<Heartbeats>>,
    /// Sources whose `/api/v1/probe/...` requests the gate lets through without a token: the
    /// kubelet probes host-network pods from the node's own addresses and sends no token. The
    /// same rule as the pod probe listeners (`--probe-allow-from`); only declared checks answer.
    pub probe_sources: Option<crate::probe::source::SourceFilter>,
    /// Serve HTTPS with this (`--tls-cert-file`); None: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Where connections closed without an answer are counted; None: not counted (tests).
    pub rejections: Option<Rejections>,
}

/// Connections one listener closed without an answer, by reason:
/// `lifecycle_http_connections_rejected_total{listener, reason}`.
#[derive(Clone)]
pub struct Rejections {
    counts: prometheus::IntCounterVec,
    listener: &'static str,
}

impl Rejections {
    /// Why a connection was closed unanswered.
    const REASONS: [&'static str; 6] = ["source", "busy", "timeout", "lifetime", "evicted", "rate"];

    /// The counters of the agent's listeners, registered in `registry`; [`Self::of`] names one.
    pub(crate) fn register(registry: &prometheus::Registry) -> Result<prometheus::IntCounterVec, prometheus::Error> {
        let counts = crate::export::metrics::vec_of(
            crate::export::families::AgentFamily::HttpConnectionsRejected,
            prometheus::IntCounterVec::new,
        )?;
        registry.register(Box::new(counts.clone()))?;
        Ok(counts)
    }

    /// The counts of `listener` (`listen` or `health`), each reason shown from the start.
    pub(crate) fn of(counts: &prometheus::IntCounterVec, listener: &'static str) -> Self {
        for reason in Self::REASONS {
            counts.with_label_values(&[listener, reason]).inc_by(0);
        }
        Self { counts: counts.clone(), listener }
    }

    fn count(rejections: Option<&Self>, reason: &'static str) {
        if let Some(rejections) = rejections {
            rejections.counts.with_label_values(&[rejections.listener, reason]).inc();
        }
    }
}

impl Routes {
    /// Whether `/metrics` goes through the gate too (`--metrics-auth kubernetes`).
    fn metrics_gated(&self) -> bool {
        self.gate.as_ref().is_some_and(ApiGate::covers_metrics)
    }
}

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address is in use or not ours to bind.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `addr` for this process alone (no `SO_REUSEPORT`); serving starts with [`serve`]. The
/// agent itself gets `--listen` through `handoff` (from its keeper, the running agent, or bound
/// so); this is for tests and benches.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    let bind = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    };
    bind().map_err(|source| HttpError::Bind { addr, source })
}

/// Bounds on the connections of one listener.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections served at once; one more is closed as soon as it is accepted. Prometheus, the
    /// `status` command and host-network pods' probes need a handful.
    pub max_connections: usize,
    /// Connections served at once from one source address: one client cannot take every place.
    pub per_source: usize,
    /// Time for a request head to arrive (also how long an idle keep-alive connection is kept).
    pub head_timeout: Duration,
    /// A connection's whole life, however busy: a reader too slow to take its answer in this time
    /// is cut off.
    pub lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 128,
            per_source: 32,
            head_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Makes a whole-node answer with the async worker's other tasks, and the I/O it may drive, handed
/// to another thread meanwhile (`block_in_place`). Made on the worker as is, it held up every task
/// queued there and, when that worker was the one driving I/O, every connection's progress: a
/// health check waited for the answer in the making
/// (`tests::a_whole_node_answer_in_the_making_...`). On the blocking pool instead, the hop there
/// and back put 0.1-0.3 ms on every API answer (`bench latency`). A runtime with one thread (the
/// unit tests') has no other thread to hand to: the answer is made in place.
fn off_the_workers<T>(make: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|runtime| runtime.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(make),
        _ => make(),
    }
}

/// Whether the answer to `request` is made from the whole node (it takes a turn, `sources.rs`).
/// The probe answers of host-network pods, the API's answers about one container
/// ([`ApiHandler::is_narrow`]) and the health checks are not: they read one container or
/// nothing. In a turn, such an answer waited behind a scrape in the making (`bench load`,
/// BENCHMARKS.md).
fn costs_the_node(routes: &Routes, request: &Request<Incoming>) -> bool {
    let path = request.uri().path();
    let api = path.starts_with("/api/")
        && !path.starts_with("/api/v1/probe/")
        && !routes.api.as_ref().is_some_and(|api| api.is_narrow(path, request.uri().query()));
    path == "/metrics" || api || is_page(path)
}

/// Serves until `shutdown` turns true, within the default [`Limits`].
pub async fn serve(listener: TcpListener, routes: Arc<Routes>, shutdown: watch::Receiver<bool>) {
    serve_within(listener, routes, shutdown, Limits::default()).await;
}

/// Serves until `shutdown` turns true, within `limits`.
pub(crate) async fn serve_within(
    listener: TcpListener,
    routes: Arc<Routes>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) {
    let places = Arc::new(Places::new(limits.max_connections, limits.per_source));
    let turns = Arc::new(Turns::new());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // EMFILE and friends: log and keep serving; the next accept may succeed.
                log::warn!("accept on the metrics listener failed: {err}");
                continue;
            }
        };
        let place = match places.take(peer.ip()) {
            Ok((place, evicted)) => {
                if evicted {
                    // An idle connection (silent, or kept alive between requests) gave its place.
                    Rejections::count(routes.rejections.as_ref(), "evicted");
                }
                Arc::new(place)
            }
            Err(refused) => {
                let reason = match refused {
                    Refused::Source => "source",
                    Refused::Busy => "busy",
                    Refused::Rate => "rate",
                };
                log::debug!("{peer}: no place ({reason}); closed");
                Rejections::count(routes.rejections.as_ref(), reason);
                continue;
            }
        };
        let routes = Arc::clone(&routes);
        let rejections = routes.rejections.clone();
        let tls = routes.tls.clone();
        let (turns, source_turn) = (Arc::clone(&turns), Arc::clone(&place.turn));
        let held = Arc::clone(&place.held);
        tokio::spawn(async move {
            // With TLS on, the first byte tells a handshake from a plain request, so one port
            // serves HTTPS to clients with credentials and plain HTTP to Prometheus and
            // host-network pods' probes. The wait counts against the request head's time.
            let tls = match tls {
                None => None,
                Some(acceptor) => match tokio::time::timeout(limits.head_timeout, opens_tls(&stream)).await {
                    Ok(Ok(true)) => Some(acceptor),
                    Ok(Ok(false)) => None,
                    Ok(Err(_)) => return,
                    Err(_) => {
                        Rejections::count(rejections.as_ref(), "timeout");
                        return;
                    }
                },
            };
            let encrypted = tls.is_some();
            // Whether a request on this connection was answered: an idle keep-alive connection
            // closed at the head deadline (Prometheus' between scrapes) is not a rejection.
            let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let answering = Arc::clone(&answered);
            let service = service_fn(move |request| {
                let routes = Arc::clone(&routes);
                let (turns, source_turn) = (Arc::clone(&turns), Arc::clone(&source_turn));
                answering.store(true, std::sync::atomic::Ordering::Relaxed);
                // Not idle (its place not given to a newcomer) until its answer is written.
                let busy = place.busy();
                async move {
                    if let Some(refusal) = check_access(&routes, &request, peer.ip(), encrypted).await {
                        return Ok::<_, Infallible>(Answer::of(refusal, busy));
                    }
                    let costly = costs_the_node(&routes, &request);
                    // A scrape reuses its buffers (see `Metrics::render`); what an API answer
                    // was built from is left free.
                    let leaves_free = request.uri().path() != "/metrics";
                    let response = match waiting(&routes, &request) {
                        Some(later) if costly => {
                            let build = later.await;
                            let _turn = turns.take(&source_turn).await;
                            off_the_workers(|| json(build()))
                        }
                        Some(later) => json((later.await)()),
                        None if costly => {
                            let _turn = turns.take(&source_turn).await;
                            off_the_workers(|| route(&routes, &request))
                        }
                        None => route(&routes, &request),
                    };
                    if leaves_free && response.body().size_hint().exact().is_some_and(|len| len >= TRIM_AFTER_BYTES) {
                        // Off the async workers: the answer is sent meanwhile.
                        drop(tokio::task::spawn_blocking(release_free_memory));
                    }
                    Ok::<_, Infallible>(Answer::of(response, busy))
                }
            });
            let builder = {
                let mut builder = http1::Builder::new();
                builder.timer(TokioTimer::new()).header_read_timeout(limits.head_timeout);
                builder
            };
            let served = async {
                match tls {
                    None => builder.serve_connection(TokioIo::new(stream), service).await,
                    // The handshake counts against the connection's life like the request head.
                    Some(acceptor) => match tokio::time::timeout(limits.head_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => builder.serve_connection(TokioIo::new(stream), service).await,
                        Ok(Err(err)) => {
                            log::debug!("TLS handshake with {peer} failed: {err}");
                            Ok(())
                        }
                        Err(_) => {
                            log::debug!("TLS handshake with {peer} not done within {:?}", limits.head_timeout);
                            Rejections::count(rejections.as_ref(), "timeout");
                            Ok(())
                        }
                    },
                }
            };
            let lived = tokio::select! {
                lived = tokio::time::timeout(limits.lifetime, served) => lived,
                // Its place went to a newcomer while it was idle: counted when taken.
                () = held.evicted.notified() => return,
            };
            match lived {
                Ok(Err(err)) => {
                    log::debug!("HTTP connection from {peer} ended with an error: {err}");
                    if err.is_timeout() && !answered.load(std::sync::atomic::Ordering::Relaxed) {
                        Rejections::count(rejections.as_ref(), "timeout");
                    }
                }
                Err(_) => {
                    log::debug!("HTTP connection from {peer} cut after {:?}", limits.lifetime);
                    Rejections::count(rejections.as_ref(), "lifetime");
                }
                Ok(Ok(())) => {}
            }
        });
    }
}

/// An answer's body: it keeps its connection busy (its place not given to a newcomer, see
/// `sources.rs`) until hyper has written it whole and drops it.
pub(crate) struct Answer {
    body: Full<Bytes>,
    _busy: Busy,
}

impl Answer {
    fn of(response: Response<Full<Bytes>>, busy: Busy) -> Response<Self> {
        response.map(|body| Self { body, _busy: busy })
    }
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// API answers at least this large (a few hundred containers) leave about as much freed heap
/// behind as they are long: the per-container pieces they were built from.
const TRIM_AFTER_BYTES: u64 = 64 * 1024;

/// Returns freed heap pages to the kernel. glibc keeps freed memory in the middle of its heap
/// resident: with 1,000 containers, ten scrapes and API reads left ~7 MB of it (14.6 MB of
/// anonymous memory, 7.4 MB after a trim; xtask/x.sh bench memory). Not after scrapes: a trim
/// there made the next scrape fault its pages in again, ~1.2-1.8 ms of a 2.5 ms scrape of 1,000
/// containers (xtask/x.sh bench scrape), while a scrape now leaves little free.
fn release_free_memory() {
    crate::sys::release_free_heap();
}

/// Whether a connection opens with a TLS handshake record (content type 22), read without
/// taking the byte; an error when the client closed before sending anything.
async fn opens_tls(stream: &tokio::net::TcpStream) -> std::io::Result<bool> {
    const HANDSHAKE: u8 = 0x16;
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(first[0] == HANDSHAKE),
    }
}

/// The refusal for an `/api/*` request the gate does not let through; None to serve it.
/// `encrypted`: the request came over TLS.
async fn check_access(
    routes: &Routes,
    request: &Request<Incoming>,
    peer: IpAddr,
    encrypted: bool,
) -> Option<Response<Full<Bytes>>> {
    let gate = routes.gate.as_ref()?;
    let path = request.uri().path();
    let gated = path.starts_with("/api/") || is_page(path) || (path == "/metrics" && routes.metrics_gated());
    if !gated {
        return None;
    }
    if path.starts_with("/api/v1/probe/") && routes.probe_sources.as_ref().is_some_and(|s| s.allows(peer)) {
        return None;
    }
    // A credential in clear across the network is given away whatever the answer: with TLS
    // served, one from off this host is not even looked at, so no client can come to rely on
    // sending it that way (`status` and the kubectl plugin never do).
    if !encrypted && routes.tls.is_some() && !peer.to_canonical().is_loopback() {
        return Some(text(StatusCode::FORBIDDEN, "this agent takes credentials over HTTPS only (same port)\n"));
    }
    // Through the API server's pod proxy the user's token comes in the plugin's header (the API
    // server keeps `Authorization` for itself); it is checked the same way.
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .or_else(|| request.headers().get(lifecycle_model::wire::FORWARDED_AUTHORIZATION))
        .map(|value| value.as_bytes());
    match gate.check(authorization, path).await {
        Verdict::Pass => None,
        Verdict::Unauthenticated => {
            let mut response = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"lifecycle-agent\""));
            Some(response)
        }
        Verdict::Forbidden => Some(text(StatusCode::FORBIDDEN, "forbidden\n")),
        Verdict::Unavailable => Some(text(StatusCode::SERVICE_UNAVAILABLE, "authorization unavailable\n")),
    }
}

/// The answer to come of an API request that waits for a change (see [`ApiHandler::wait`]).
fn waiting(routes: &Routes, request: &Request<Incoming>) -> Option<Later> {
    let path = request.uri().path();
    if request.method() != Method::GET || !path.starts_with("/api/") {
        return None;
    }
    routes.api.as_ref()?.wait(path, request.uri().query())
}

/// A JSON API answer as a response; kept by no cache (it may need a credential to read).
fn json((status, body): (StatusCode, String)) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response build failed\n"))
}

fn route(routes: &Routes, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
    }
    let path = request.uri().path();
    match path {
        "/metrics" => Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(routes.metrics.render()))
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response build failed\n")),
        "/healthz" | "/readyz" => {
            match routes.health.as_ref().map_or(
                Ok(()),
                |health| {
                    if path == "/readyz" {
                        health.ready()
                    } else {
                        health.check()
                    }
                },
            ) {
                Ok(()) => text(StatusCode::OK, "ok\n"),
                Err(why) => {
                    let mut response = Response::new(Full::new(Bytes::from(format!("unhealthy: {why}\n"))));
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    response
                }
            }
        }
        _ if is_page(path) => match routes.api.as_ref().and_then(|api| api.get(path, request.uri().query())) {
            // A page of the agent's own making: no script, nothing from elsewhere, never sniffed,
            // never framed by another site (clickjacking), never kept by a cache or a browser's
            // history (it is as confidential as the API it is made from).
            Some((status, body)) => Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
                .header(header::CONTENT_SECURITY_POLICY, PAGE_POLICY)
                .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
                .header(header::X_FRAME_OPTIONS, "DENY")
                .header(header::CACHE_CONTROL, "no-store")
                .header(header::REFERRER_POLICY, "no-referrer")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response build failed\n")),
            None => text(StatusCode::NOT_FOUND, "no such page\n"),
        },
        _ if path.starts_with("/api/") => {
            match routes.api.as_ref().and_then(|api| api.get(path, request.uri().query())) {
                Some(answer) => json(answer),
                None => text(StatusCode::NOT_FOUND, "no such API path\n"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "try /metrics, /healthz, /api/v1/containers or /explain\n"),
    }
}

/// What an explain page may do: style itself and show its own images; no script, no frame
/// around it, no form, no base.
const PAGE_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The `explain` pages (HTML): `/explain` and `/explain/<namespace>/<pod>`.
fn is_page(path: &str) -> bool {
    path == "/explain" || path.starts_with("/explain/")
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
