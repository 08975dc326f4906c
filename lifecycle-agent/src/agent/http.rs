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
//! The kubelet's liveness probe of the agent has a listener of its own (`--health-listen`,
//! [`Routes::health_only`]): nothing a client of `--listen` does can take its places, and it
//! answers from the loops' progress ([`super::health`]), not a constant.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
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
use tokio::{
    net::TcpListener,
    sync::{watch, Semaphore},
};

use super::{
    auth::{ApiGate, Verdict},
    health::Heartbeats,
};
use crate::export::metrics::Metrics;

/// Something that answers JSON API paths (everything under `/api/`).
pub trait ApiHandler: Send + Sync + 'static {
    /// Returns the status and JSON body for `path` (with query), or None for an unknown path.
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)>;
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
    /// Serve `/healthz` alone (the health listener).
    pub health_only: bool,
    /// Serve HTTPS with this (`--tls-cert-file`); None: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Routes {
    /// Whether `/metrics` goes through the gate too (`--metrics-auth kubernetes`).
    fn metrics_gated(&self) -> bool {
        self.gate.as_ref().is_some_and(ApiGate::covers_metrics)
    }
}

impl Routes {
    /// The health listener's routes: `/healthz` from `health`, nothing else.
    pub fn health_only(health: Arc<Heartbeats>) -> Self {
        Self {
            metrics: Metrics::bare(),
            api: None,
            gate: None,
            health: Some(health),
            probe_sources: None,
            health_only: true,
            tls: None,
        }
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

/// Binds `addr` with `SO_REUSEPORT`; serving starts with [`serve`]. During a rolling update the
/// next agent starts while this one still runs (see `probe/handoff.rs`): both bind the node's
/// port and the kernel spreads connections over them until the old one exits. Only a process of
/// the same user (root) can bind beside it.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    let bind = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        socket.listen(1024)
    };
    bind().map_err(|source| HttpError::Bind { addr, source })
}

/// Bounds on the connections of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
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

impl Limits {
    /// The health listener's: a probe's request comes at once and its answer is a few bytes, so
    /// a place is held a second at most.
    pub fn health() -> Self {
        Self {
            max_connections: 64,
            per_source: 16,
            head_timeout: Duration::from_secs(1),
            lifetime: Duration::from_secs(2),
        }
    }
}

/// Connections open per source address; an entry exists only while its source has one open, so
/// the map holds at most `max_connections` entries.
struct PerSource {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`PerSource`], given back when dropped.
struct SourcePlace {
    sources: Arc<PerSource>,
    ip: IpAddr,
}

impl PerSource {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<SourcePlace> {
        let mut open = self.open.lock().unwrap_or_else(|poison| poison.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(SourcePlace { sources: Arc::clone(self), ip })
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut open = self.sources.open.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves until `shutdown` turns true, within the default [`Limits`].
pub async fn serve(listener: TcpListener, routes: Arc<Routes>, shutdown: watch::Receiver<bool>) {
    serve_within(listener, routes, shutdown, Limits::default()).await;
}

/// Serves until `shutdown` turns true, within `limits`.
pub async fn serve_within(
    listener: TcpListener,
    routes: Arc<Routes>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let sources = Arc::new(PerSource { limit: limits.per_source.max(1), open: Mutex::new(HashMap::new()) });
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
        let Some(place) = sources.take(peer.ip()) else {
            log::debug!("{peer}: {} connections from {} open already; closed", limits.per_source, peer.ip());
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            log::debug!("{peer}: {} connections open already; closed", limits.max_connections);
            continue;
        };
        let routes = Arc::clone(&routes);
        let tls = routes.tls.clone();
        tokio::spawn(async move {
            let _slot = (slot, place);
            // With TLS on, the first byte tells a handshake from a plain request, so one port
            // serves HTTPS to clients with credentials and plain HTTP to Prometheus and
            // host-network pods' probes. The wait counts against the request head's time.
            let tls = match tls {
                None => None,
                Some(acceptor) => match tokio::time::timeout(limits.head_timeout, opens_tls(&stream)).await {
                    Ok(Ok(true)) => Some(acceptor),
                    Ok(Ok(false)) => None,
                    Ok(Err(_)) | Err(_) => return,
                },
            };
            let encrypted = tls.is_some();
            let service = service_fn(move |request| {
                let routes = Arc::clone(&routes);
                async move {
                    if let Some(refusal) = check_access(&routes, &request, peer.ip(), encrypted).await {
                        return Ok::<_, Infallible>(refusal);
                    }
                    let response = route(&routes, &request);
                    // A scrape reuses its buffers (see `Metrics::render`); what an API answer
                    // was built from is left free.
                    let leaves_free = request.uri().path() != "/metrics";
                    if leaves_free && response.body().size_hint().exact().is_some_and(|len| len >= TRIM_AFTER_BYTES) {
                        // Off the async workers: the answer is sent meanwhile.
                        drop(tokio::task::spawn_blocking(release_free_memory));
                    }
                    Ok::<_, Infallible>(response)
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
                            Ok(())
                        }
                    },
                }
            };
            match tokio::time::timeout(limits.lifetime, served).await {
                Ok(Err(err)) => log::debug!("HTTP connection from {peer} ended with an error: {err}"),
                Err(_) => log::debug!("HTTP connection from {peer} cut after {:?}", limits.lifetime),
                Ok(Ok(())) => {}
            }
        });
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
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas (taking their locks); no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
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
        .or_else(|| request.headers().get(crate::cli::plugin::FORWARDED_AUTHORIZATION))
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

fn route(routes: &Routes, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
    }
    let path = request.uri().path();
    if routes.health_only && path != "/healthz" && path != "/readyz" {
        return text(StatusCode::NOT_FOUND, "this listener serves /healthz and /readyz only\n");
    }
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
            // A page of the agent's own making: no script, nothing from elsewhere, never sniffed.
            Some((status, body)) => Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
                .header(
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'",
                )
                .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response build failed\n")),
            None => text(StatusCode::NOT_FOUND, "no such page\n"),
        },
        _ if path.starts_with("/api/") => {
            match routes.api.as_ref().and_then(|api| api.get(path, request.uri().query())) {
                Some((status, body)) => Response::builder()
                    .status(status)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response build failed\n")),
                None => text(StatusCode::NOT_FOUND, "no such API path\n"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "try /metrics, /healthz, /api/v1/containers or /explain\n"),
    }
}

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
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Plain routes (no API, no gate) with `gate` and `probe_sources` as given.
    fn routes(gate: Option<ApiGate>, probe_sources: Option<crate::probe::source::SourceFilter>) -> Routes {
        Routes { metrics: Metrics::bare(), api: None, gate, health: None, probe_sources, health_only: false, tls: None }
    }

    /// Serves `routes` on a loopback port within `limits` until the sender is dropped.
    async fn serving(routes: Routes, limits: Limits) -> (SocketAddr, watch::Sender<bool>) {
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve_within(listener, Arc::new(routes), stopped, limits));
        (addr, stop)
    }

    async fn listener_with(limits: Limits) -> (SocketAddr, watch::Sender<bool>) {
        serving(routes(None, None), limits).await
    }

    /// The whole answer to the raw `request` on a fresh connection, or what came before the close.
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = stream.write_all(request.as_bytes()).await;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        answer
    }

    /// The whole answer to `GET /healthz` on a fresh connection, or what came before the close.
    async fn healthz(addr: SocketAddr) -> String {
        exchange(addr, "GET /healthz HTTP/1.0\r\n\r\n").await
    }

    /// Reads until the server closes the connection (failing, not hanging, if it does not); the
    /// bytes it sent.
    async fn closed_within_10s(stream: &mut tokio::net::TcpStream) -> usize {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection")
            .expect("read")
    }

    #[tokio::test]
    async fn clients_holding_connections_give_their_places_up_and_others_are_served() {
        let limits = Limits {
            max_connections: 4,
            per_source: 4,
            head_timeout: Duration::from_millis(300),
            lifetime: Duration::from_secs(30),
        };
        let (addr, _stop) = listener_with(limits).await;
        // Four clients that connect and say nothing take every place.
        let mut silent = Vec::new();
        for _ in 0..4 {
            silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        // Wait until the server has accepted them all: a fifth is then closed unanswered.
        let mut refused = false;
        for _ in 0..100 {
            if healthz(addr).await.is_empty() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused, "a fifth connection is closed while four are held");
        // The silent ones are cut when their head does not come; the place is free again.
        for stream in &mut silent {
            assert_eq!(closed_within_10s(stream).await, 0);
        }
        assert!(healthz(addr).await.starts_with("HTTP/1.0 200"), "served once the places are free");
    }

    #[tokio::test]
    async fn a_connection_lives_no_longer_than_its_lifetime() {
        let limits = Limits {
            max_connections: 4,
            per_source: 4,
            head_timeout: Duration::from_secs(30),
            lifetime: Duration::from_millis(300),
        };
        let (addr, _stop) = listener_with(limits).await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        // Half a head, then nothing: only the lifetime ends it.
        stream.write_all(b"GET /healthz HTTP/1.1\r\n").await.expect("write");
        assert_eq!(closed_within_10s(&mut stream).await, 0);
    }

    #[tokio::test]
    async fn one_source_cannot_take_every_place() {
        let limits = Limits {
            max_connections: 8,
            per_source: 2,
            head_timeout: Duration::from_secs(30),
            lifetime: Duration::from_secs(30),
        };
        let (addr, _stop) = listener_with(limits).await;
        // 127.0.0.1 holds its two places with silent connections.
        let held: Vec<_> = futures::future::join_all((0..2).map(|_| tokio::net::TcpStream::connect(addr))).await;
        let mut refused = false;
        for _ in 0..100 {
            if healthz(addr).await.is_empty() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused, "a third connection from the same source is closed");
        // Another loopback address is another source: it is served.
        let other = std::net::SocketAddr::new("127.0.0.2".parse().expect("ip"), 0);
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(other).expect("bind 127.0.0.2");
        let mut stream = socket.connect(addr).await.expect("connect");
        stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.expect("write");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        drop(held);
    }

    #[tokio::test]
    async fn the_health_listener_answers_from_the_heartbeats_and_serves_nothing_else() {
        let beats = Arc::new(Heartbeats::new(Duration::from_millis(50), Duration::from_secs(10)));
        let (addr, _stop) = serving(Routes::health_only(beats.clone()), Limits::health()).await;
        beats.beat(super::super::health::Loop::RingReader);
        assert!(healthz(addr).await.starts_with("HTTP/1.0 200"));
        // The reader stops beating: the kubelet is told, with the reason.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answer = healthz(addr).await;
        assert!(answer.starts_with("HTTP/1.0 503"), "{answer}");
        assert!(answer.contains("ring reader made no progress"), "{answer}");
        let answer = exchange(addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.0 404"), "{answer}");
    }

    #[tokio::test]
    async fn the_kubelets_probes_of_host_network_pods_need_no_token_from_a_node_address() {
        // Issue 18: with --api-auth kubernetes, host-network pods' probes through /api/v1/probe
        // could not work (the kubelet sends no token).
        // No Kubernetes API: every request that needs a token fails closed.
        let serve_with =
            |sources| serving(routes(Some(ApiGate::new(None, None).expect("gate")), sources), Limits::default());
        let get = |addr, path: &str| {
            let request = format!("GET {path} HTTP/1.0\r\n\r\n");
            async move { exchange(addr, &request).await }
        };
        let loopback = crate::probe::source::SourceFilter::new(&["127.0.0.0/8".parse().expect("cidr")]);
        let (addr, _stop) = serve_with(Some(loopback)).await;
        // From an allowed source the probe path passes the gate (and, with no API here, is 404).
        assert!(get(addr, "/api/v1/probe/ns/pod/app?check=process").await.starts_with("HTTP/1.0 404"));
        // Everything else still needs a token.
        assert!(get(addr, "/api/v1/containers").await.starts_with("HTTP/1.0 401"));
        let (addr, _stop) = serve_with(None).await;
        assert!(get(addr, "/api/v1/probe/ns/pod/app?check=process").await.starts_with("HTTP/1.0 401"));
    }

    #[tokio::test]
    async fn metrics_auth_puts_metrics_behind_the_gate_and_leaves_health_open() {
        let gate = ApiGate::new(None, None).expect("gate").with_metrics();
        let (addr, _stop) = serving(routes(Some(gate), None), Limits::default()).await;
        let get = |request: &'static str| exchange(addr, request);
        assert!(get("GET /metrics HTTP/1.0\r\n\r\n").await.starts_with("HTTP/1.0 401"));
        // A token, but no API server to ask here: fails closed.
        let with_token = get("GET /metrics HTTP/1.0\r\nAuthorization: Bearer t\r\n\r\n").await;
        assert!(with_token.starts_with("HTTP/1.0 503"), "{with_token}");
        assert!(get("GET /healthz HTTP/1.0\r\n\r\n").await.starts_with("HTTP/1.0 200"));
    }

    #[tokio::test]
    async fn with_tls_one_port_takes_credentials_over_https_only_and_serves_the_rest_plain() {
        // Issue 18: with --api-auth kubernetes the agent served /api/* in clear unless given a
        // certificate. Now it makes one, and a credential in clear from off the host is refused.
        use rustls_pki_types::{pem::PemObject as _, CertificateDer, ServerName};
        let node_address = if_addrs::get_if_addrs()
            .expect("interfaces")
            .into_iter()
            .map(|i| i.ip())
            .find(|ip| ip.is_ipv4() && !ip.is_loopback())
            .expect("this host has a non-loopback IPv4 address");
        let generated =
            crate::agent::tls::generate(crate::agent::tls::serving_names("0.0.0.0".parse().expect("ip"), None))
                .expect("a certificate");
        let mut routes = routes(Some(ApiGate::new(None, None).expect("gate")), None);
        routes.tls = Some(generated.acceptor);
        let listener = bind("0.0.0.0:0".parse().expect("addr")).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (_stop, stopped) = watch::channel(false);
        tokio::spawn(serve_within(listener, Arc::new(routes), stopped, Limits::default()));
        let off_host = SocketAddr::new(node_address, port);
        let on_host = SocketAddr::from(([127, 0, 0, 1], port));
        const WITH_TOKEN: &str = "GET /api/v1/containers HTTP/1.0\r\nAuthorization: Bearer t\r\n\r\n";

        // Plain HTTP still serves what needs no credential, to anyone.
        assert!(exchange(off_host, "GET /metrics HTTP/1.0\r\n\r\n").await.starts_with("HTTP/1.0 200"));
        // A token in clear from off the host is refused before the gate sees it.
        let refused = exchange(off_host, WITH_TOKEN).await;
        assert!(refused.starts_with("HTTP/1.0 403") && refused.contains("HTTPS only"), "{refused}");
        // From this host it reaches the gate (no API server here: unavailable).
        assert!(exchange(on_host, WITH_TOKEN).await.starts_with("HTTP/1.0 503"));

        // Over TLS, trusting only the CA the agent wrote out, at the node's address: the
        // certificate names it, and the request reaches the gate.
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(generated.ca_pem.as_bytes()) {
            roots.add(ca.expect("CA certificate")).expect("a usable CA");
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(off_host).await.expect("connect");
        let mut tls = connector.connect(ServerName::IpAddress(node_address.into()), tcp).await.expect("TLS handshake");
        tls.write_all(WITH_TOKEN.as_bytes()).await.expect("send");
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer).await;
        assert!(answer.starts_with("HTTP/1.0 503"), "{answer}");
    }
}
