//! Tests of the listeners: places, per-source limits, lifetimes, health, the gate, TLS and the
//! turns whole-node answers take.
use super::*;
use crate::agent::sources::Turns;
use parking_lot::Mutex;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::Semaphore,
};

/// Plain routes (no API, no gate) with `gate` and `probe_sources` as given.
fn routes(gate: Option<ApiGate>, probe_sources: Option<crate::probe::source::SourceFilter>) -> Routes {
    Routes { metrics: Metrics::bare(), api: None, gate, health: None, probe_sources, tls: None, rejections: None }
}

/// Four places in all and per source, with these deadlines.
fn four_places(head_timeout: Duration, lifetime: Duration) -> Limits {
    Limits { max_connections: 4, per_source: 4, head_timeout, lifetime }
}

/// Serves `routes` on a loopback port within `limits` until the sender is dropped.
async fn serving(routes: Routes, limits: Limits) -> (SocketAddr, watch::Sender<bool>) {
    let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(serve_within(listener, Arc::new(routes), stopped, limits));
    (addr, stop)
}

/// A plain listener within `limits`, and its `lifecycle_http_connections_rejected_total`
/// counters (registered nowhere).
async fn listener_with(limits: Limits) -> (SocketAddr, watch::Sender<bool>, prometheus::IntCounterVec) {
    let counts = crate::export::metrics::vec_of(
        crate::export::families::AgentFamily::HttpConnectionsRejected,
        prometheus::IntCounterVec::new,
    )
    .expect("counters");
    let routes = Routes { rejections: Some(Rejections::of(&counts, "listen")), ..routes(None, None) };
    let (addr, stop) = serving(routes, limits).await;
    (addr, stop, counts)
}

/// The count of connections `listener_with`'s listener rejected for `reason`, once it reaches
/// `at_least` (the count follows the close the client sees), or what it is after 10 s.
async fn rejected(counts: &prometheus::IntCounterVec, reason: &str, at_least: u64) -> u64 {
    let counter = counts.with_label_values(&["listen", reason]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while counter.get() < at_least && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    counter.get()
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

/// A connection from `source` (a loopback address) to `addr`.
async fn connect_from(source: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(source.parse().expect("ip"), 0)).expect("bind the source");
    socket.connect(addr).await.expect("connect")
}

/// The whole answer to `GET /healthz` from `source`.
async fn healthz_from(source: &str, addr: SocketAddr) -> String {
    let mut stream = connect_from(source, addr).await;
    stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.expect("write");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    answer
}

#[tokio::test]
async fn clients_holding_connections_give_their_places_up_and_others_are_served() {
    // Issue 37: four sources holding places kept everyone else out of --listen until their
    // heads timed out (live: `/metrics` answered 2 of 55). A newcomer now takes the place of
    // the oldest idle connection; the rest are still cut at their head deadline.
    let limits = four_places(Duration::from_millis(300), Duration::from_secs(30));
    let (addr, _stop, counts) = listener_with(limits).await;
    // Four clients that connect and say nothing take every place.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A fifth is served at once, in the place of the oldest silent one, which is closed.
    assert!(healthz(addr).await.starts_with("HTTP/1.0 200"), "the newcomer is served");
    assert_eq!(rejected(&counts, "evicted", 1).await, 1, "the closed one is counted");
    assert_eq!(closed_within_10s(&mut silent[0]).await, 0, "the oldest gave its place up");
    assert_eq!((rejected(&counts, "source", 0).await, rejected(&counts, "busy", 0).await), (0, 0));
    // The others are cut when their head does not come.
    for stream in &mut silent[1..] {
        assert_eq!(closed_within_10s(stream).await, 0);
    }
    assert_eq!(rejected(&counts, "timeout", 3).await, 3, "each cut at its head deadline is counted");
    assert!(healthz(addr).await.starts_with("HTTP/1.0 200"), "served once the places are free");
}

#[tokio::test]
async fn five_sources_holding_every_place_keep_no_other_source_out() {
    // Issue 37: `--listen` held from 4-5 addresses. The source holding the most places gives
    // one up to another source's newcomer, at most 20 times a second per newcomer's source.
    let limits = Limits {
        max_connections: 10,
        per_source: 2,
        head_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(30),
    };
    let (addr, _stop, counts) = listener_with(limits).await;
    let mut held = Vec::new();
    for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"] {
        for _ in 0..2 {
            held.push(connect_from(source, addr).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..20 {
        let answer = healthz_from("127.0.0.7", addr).await;
        assert!(answer.starts_with("HTTP/1.0 200"), "request {i} of another source: {answer:?}");
    }
    // One place was taken for the first; each answered request left its place free again.
    assert_eq!(rejected(&counts, "evicted", 1).await, 1);
    // A flood from one more source takes at most its own bound of places from the others, then
    // only its own.
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(connect_from("127.0.0.8", addr).await);
    }
    assert_eq!(rejected(&counts, "evicted", 0).await, 1 + 1 + 98, "one more of theirs, then its own");
    drop((held, flood));
}

#[tokio::test]
async fn a_connection_lives_no_longer_than_its_lifetime() {
    let limits = four_places(Duration::from_secs(30), Duration::from_millis(300));
    let (addr, _stop, counts) = listener_with(limits).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Half a head, then nothing: only the lifetime ends it.
    stream.write_all(b"GET /healthz HTTP/1.1\r\n").await.expect("write");
    assert_eq!(closed_within_10s(&mut stream).await, 0);
    assert_eq!(rejected(&counts, "lifetime", 1).await, 1, "the cut is counted");
}

#[tokio::test]
async fn one_source_cannot_take_every_place() {
    let limits = Limits {
        max_connections: 8,
        per_source: 2,
        head_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(30),
    };
    let counts = crate::export::metrics::vec_of(
        crate::export::families::AgentFamily::HttpConnectionsRejected,
        prometheus::IntCounterVec::new,
    )
    .expect("counters");
    let release = Arc::new(tokio::sync::Notify::new());
    let api: Arc<dyn ApiHandler> = Arc::new(WaitingApi { release: Arc::clone(&release) });
    let routes = Routes { api: Some(api), rejections: Some(Rejections::of(&counts, "listen")), ..routes(None, None) };
    let (addr, _stop) = serving(routes, limits).await;
    // 127.0.0.1 holds its two places with requests in the making: not idle, so not given up.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(b"GET /api/v1/wait HTTP/1.0\r\n\r\n").await.expect("write");
        held.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(healthz(addr).await.is_empty(), "a third connection from the same source is closed");
    assert!(rejected(&counts, "source", 1).await >= 1, "the refusal is counted");
    // Another loopback address is another source: it is served.
    assert!(healthz_from("127.0.0.2", addr).await.starts_with("HTTP/1.0 200"));
    drop(held);
}

#[tokio::test]
async fn a_source_at_its_bound_gives_its_own_idle_place_to_its_newcomer() {
    // A client sharing the kubelet's address (a hostNetwork pod) holding that address's
    // places with silent connections cannot keep the kubelet's next request out.
    let limits = Limits {
        max_connections: 8,
        per_source: 2,
        head_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(30),
    };
    let (addr, _stop, counts) = listener_with(limits).await;
    let silent: Vec<_> = futures::future::join_all((0..2).map(|_| tokio::net::TcpStream::connect(addr))).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..5 {
        assert!(healthz(addr).await.starts_with("HTTP/1.0 200"));
    }
    // The oldest gave its place to the first; each answered request then left its place free.
    assert_eq!(rejected(&counts, "evicted", 1).await, 1);
    let mut silent: Vec<_> = silent.into_iter().flatten().collect();
    assert_eq!(closed_within_10s(&mut silent[0]).await, 0, "the oldest is closed");
    let mut byte = [0u8; 1];
    let kept = tokio::time::timeout(Duration::from_millis(100), silent[1].read(&mut byte)).await;
    assert!(kept.is_err(), "the other keeps its place: its source is within its bound");
}

#[tokio::test]
async fn a_flood_from_one_source_takes_others_places_at_its_rate_only() {
    let limits = Limits {
        max_connections: 100,
        per_source: 100,
        head_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(30),
    };
    let (addr, _stop, counts) = listener_with(limits).await;
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(connect_from("127.0.0.2", addr).await);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = std::time::Instant::now();
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(connect_from("127.0.0.3", addr).await);
    }
    assert!(rejected(&counts, "rate", 1).await >= 1, "past its burst the flood takes no more places");
    let taken = rejected(&counts, "evicted", 0).await;
    // The burst (40) and 20 a second after it.
    let allowed = 40 + (began.elapsed().as_secs_f64() * 20.0).ceil() as u64 + 1;
    assert!((40..=allowed).contains(&taken), "{taken} places taken, at most {allowed}");
    drop((held, flood));
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
    let generated = crate::agent::tls::generate(crate::agent::tls::serving_names("0.0.0.0".parse().expect("ip"), None))
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

/// An API whose every `/api/v1/wait` request waits until [`Self::release`] is notified.
struct WaitingApi {
    release: Arc<tokio::sync::Notify>,
}

impl ApiHandler for WaitingApi {
    fn get(&self, path: &str, _query: Option<&str>) -> Option<(StatusCode, String)> {
        (path == "/api/v1/now").then(|| (StatusCode::OK, "{\"now\":true}".to_owned()))
    }

    fn wait(&self, path: &str, _query: Option<&str>) -> Option<Later> {
        let release = Arc::clone(&self.release);
        (path == "/api/v1/wait").then(|| -> Later {
            Box::pin(async move {
                release.notified().await;
                Box::new(|| (StatusCode::OK, "{\"changed\":true}".to_owned())) as Build
            })
        })
    }
}

#[tokio::test]
async fn a_waiting_request_is_answered_when_its_wait_ends_and_holds_up_no_other() {
    let release = Arc::new(tokio::sync::Notify::new());
    let api: Arc<dyn ApiHandler> = Arc::new(WaitingApi { release: Arc::clone(&release) });
    let (addr, _stop) = serving(Routes { api: Some(api), ..routes(None, None) }, Limits::default()).await;
    let mut waiting = tokio::net::TcpStream::connect(addr).await.expect("connect");
    waiting.write_all(b"GET /api/v1/wait HTTP/1.0\r\n\r\n").await.expect("send");
    // Served meanwhile, on other connections: the API, the health check.
    assert!(exchange(addr, "GET /api/v1/now HTTP/1.0\r\n\r\n").await.ends_with("{\"now\":true}"));
    assert!(healthz(addr).await.starts_with("HTTP/1.0 200"));
    let mut first = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(50), waiting.read(&mut first)).await;
    assert!(early.is_err(), "the waiting request is not answered before its wait ends");
    release.notify_one();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), waiting.read_to_string(&mut answer))
        .await
        .expect("answered once the wait ends")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.contains("application/json") && answer.ends_with("{\"changed\":true}"), "{answer}");
}

#[tokio::test]
async fn an_answered_keep_alive_connection_closed_when_idle_is_not_counted_as_rejected() {
    let limits = four_places(Duration::from_millis(300), Duration::from_secs(30));
    let (addr, _stop, counts) = listener_with(limits).await;
    // Prometheus' way: HTTP/1.1, the connection kept between scrapes; idle, it is closed at the
    // head deadline.
    let mut kept = tokio::net::TcpStream::connect(addr).await.expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut answer = [0u8; 15];
    kept.read_exact(&mut answer).await.expect("answered");
    assert_eq!(&answer, b"HTTP/1.1 200 OK");
    assert!(closed_within_10s(&mut kept).await > 0, "the rest of the answer, then the close");
    // A connection that never sends a head is cut the same way, and counted.
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert_eq!(closed_within_10s(&mut silent).await, 0);
    assert_eq!(rejected(&counts, "timeout", 1).await, 1, "the silent one only");
}

#[tokio::test]
async fn with_tls_on_a_connection_that_sends_nothing_is_counted_at_its_head_deadline() {
    // The DaemonSet serves TLS: a silent connection then ends waiting for its first byte (or its
    // handshake), before any request head, and still counts.
    let counts = crate::export::metrics::vec_of(
        crate::export::families::AgentFamily::HttpConnectionsRejected,
        prometheus::IntCounterVec::new,
    )
    .expect("counters");
    let generated =
        crate::agent::tls::generate(crate::agent::tls::serving_names("127.0.0.1".parse().expect("ip"), None))
            .expect("a certificate");
    let routes = Routes {
        tls: Some(generated.acceptor),
        rejections: Some(Rejections::of(&counts, "listen")),
        ..routes(None, None)
    };
    let limits = four_places(Duration::from_millis(300), Duration::from_secs(30));
    let (addr, _stop) = serving(routes, limits).await;
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert_eq!(closed_within_10s(&mut silent).await, 0);
    // A handshake begun and never finished: the first byte says TLS, then nothing.
    let mut half = tokio::net::TcpStream::connect(addr).await.expect("connect");
    half.write_all(&[0x16, 0x03, 0x01]).await.expect("write");
    assert_eq!(closed_within_10s(&mut half).await, 0);
    assert_eq!(rejected(&counts, "timeout", 2).await, 2, "both cut at the deadline, both counted");
}

/// Takes a turn from `source` and notes `who` once it has it; holds it until `go` is notified.
fn turn_of(
    turns: &Arc<Turns>,
    source: &Arc<Semaphore>,
    who: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
    go: &Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    let (turns, source, order, go) = (Arc::clone(turns), Arc::clone(source), Arc::clone(order), Arc::clone(go));
    tokio::spawn(async move {
        let _turn = turns.take(&source).await;
        order.lock().push(who);
        go.notified().await;
    })
}

/// Lets every spawned task run until it waits (the test runtime has one thread).
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn one_sources_requests_take_their_turns_one_after_another_and_delay_another_source_by_one_answer_at_most() {
    let turns = Arc::new(Turns::new());
    let (a, b) = (Arc::new(Semaphore::new(1)), Arc::new(Semaphore::new(1)));
    let order = Arc::new(Mutex::new(Vec::new()));
    let go = Arc::new(tokio::sync::Notify::new());
    // Source a asks three times, then source b once; a's first answer is being made.
    let a1 = turn_of(&turns, &a, "a1", &order, &go);
    settle().await;
    let rest: Vec<_> = [("a2", &a), ("a3", &a), ("b1", &b)]
        .into_iter()
        .map(|(who, source)| turn_of(&turns, source, who, &order, &go))
        .collect();
    settle().await;
    assert_eq!(*order.lock(), ["a1"], "one answer is made at a time");
    for _ in 0..3 {
        go.notify_one();
        settle().await;
    }
    go.notify_one();
    a1.await.expect("a1");
    for task in rest {
        task.await.expect("turn");
    }
    // b asked after a2 and a3, and waited for a's answer in the making only.
    assert_eq!(*order.lock(), ["a1", "b1", "a2", "a3"]);
}

/// An API whose `/api/v1/containers` answers are made only as the test lets them (standing for
/// an answer made from a large node), and which answers `/api/v1/probe/` and one container's
/// `/api/v1/containers?one` at once.
struct SlowApi {
    making: std::sync::mpsc::SyncSender<()>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl ApiHandler for SlowApi {
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)> {
        if path.starts_with("/api/v1/probe/") {
            return Some((StatusCode::OK, "{\"probe\":true}".to_owned()));
        }
        if self.is_narrow(path, query) {
            return Some((StatusCode::OK, "{\"one\":true}".to_owned()));
        }
        (path == "/api/v1/containers").then(|| {
            let _ = self.making.send(());
            let _ = self.release.lock().recv_timeout(Duration::from_secs(10));
            (StatusCode::OK, "{\"containers\":[]}".to_owned())
        })
    }

    fn is_narrow(&self, path: &str, query: Option<&str>) -> bool {
        path == "/api/v1/containers" && query == Some("one")
    }
}

/// Sends `GET path` from the loopback address `from` and reads the whole answer, on a thread of
/// its own.
fn ask_from(from: &str, addr: SocketAddr, path: &str) -> std::thread::JoinHandle<String> {
    use std::io::{Read as _, Write as _};
    let (from, path) = (from.to_owned(), path.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("runtime");
        let connected = runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.bind(format!("{from}:0").parse().expect("source")).expect("bind the source address");
            socket.connect(addr).await.expect("connect")
        });
        let mut stream = connected.into_std().expect("std stream");
        stream.set_nonblocking(false).expect("blocking");
        stream.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_node_answer_in_the_making_holds_up_no_cheap_request_and_the_next_waits_its_turn() {
    let (making, made) = std::sync::mpsc::sync_channel(8);
    let (release, released) = std::sync::mpsc::channel();
    let api: Arc<dyn ApiHandler> = Arc::new(SlowApi { making, release: Mutex::new(released) });
    let (addr, _stop) = serving(Routes { api: Some(api), ..routes(None, None) }, Limits::default()).await;
    let first = ask_from("127.0.0.1", addr, "/api/v1/containers");
    made.recv_timeout(Duration::from_secs(10)).expect("the first answer is being made");
    // Another source's whole-node request waits for its turn; the cheap ones do not.
    let second = ask_from("127.0.0.2", addr, "/api/v1/containers");
    let probe = ask_from("127.0.0.3", addr, "/api/v1/probe/default/web/app?check=tcp");
    assert!(probe.join().expect("probe").ends_with("{\"probe\":true}"), "a probe answer is not held up");
    assert!(healthz(addr).await.starts_with("HTTP/1.0 200"), "the health check is not held up");
    let one = ask_from("127.0.0.4", addr, "/api/v1/containers?one");
    assert!(one.join().expect("one").ends_with("{\"one\":true}"));
    assert!(!first.is_finished(), "an answer about one container is not held up either");
    assert!(made.recv_timeout(Duration::from_millis(200)).is_err(), "one whole-node answer is made at a time");
    release.send(()).expect("release the first");
    assert!(first.join().expect("first").ends_with("{\"containers\":[]}"));
    made.recv_timeout(Duration::from_secs(10)).expect("the second is made in its turn");
    release.send(()).expect("release the second");
    assert!(second.join().expect("second").ends_with("{\"containers\":[]}"));
}

/// Answers every API path and page with a fixed body.
struct Pages;

impl ApiHandler for Pages {
    fn get(&self, _path: &str, _query: Option<&str>) -> Option<(StatusCode, String)> {
        Some((StatusCode::OK, "<p>web-1</p>".to_owned()))
    }
}

#[tokio::test]
async fn explain_pages_are_never_framed_nor_stored_and_api_answers_never_stored() {
    // Issue 37: the explain pages had a CSP without frame-ancestors and no cache directive.
    let routes = Routes { api: Some(Arc::new(Pages)), ..routes(None, None) };
    let (addr, _stop) = serving(routes, Limits::default()).await;
    let page = exchange(addr, "GET /explain/shop/web-1 HTTP/1.0\r\n\r\n").await;
    let head = page.split("\r\n\r\n").next().expect("a head").to_ascii_lowercase();
    assert!(head.starts_with("http/1.0 200"), "{page}");
    let policy = head.lines().find_map(|l| l.strip_prefix("content-security-policy: ")).expect("a CSP");
    assert!(policy.contains("frame-ancestors 'none'") && policy.contains("default-src 'none'"), "{policy}");
    assert!(head.contains("\r\ncache-control: no-store"), "{head}");
    assert!(head.contains("\r\nx-frame-options: deny"), "{head}");
    let api = exchange(addr, "GET /api/v1/containers HTTP/1.0\r\n\r\n").await.to_ascii_lowercase();
    assert!(api.contains("\r\ncache-control: no-store"), "{api}");
}
