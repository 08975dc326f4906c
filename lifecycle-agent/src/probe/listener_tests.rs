//! The listener on loopback, with a stand-in for the pod's answer that serves exactly the
//! declared checks (the real one, `PodProbe`, is driven in the kernel tier's `tests/probe.rs`).

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
};

use super::*;
use crate::probe::{
    declaration::{parse_request, Declaration},
    source::AllowFrom,
};

/// Answers 200 `ok` for declared checks of container `app`, 403 `forbidden` for anything else.
struct Declared(Declaration);

impl ProbeAnswer for Declared {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        match parse_request(path, query) {
            Ok((None | Some(_), spec)) if self.0.checks_for("app").contains(&spec) => (200, "ok\n".to_owned()),
            _ => (403, "forbidden\n".to_owned()),
        }
    }
}

fn serve(sources: SourceFilter, limits: ListenerLimits) -> (ProbeListener, ConnectionCounters) {
    let (declaration, refusals) = Declaration::from_annotation("/probe/tcp?port=8080\n/probe/process\n");
    assert!(refusals.is_empty());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let counters = ConnectionCounters::unregistered();
    let server = ProbeListener::start(listener, Arc::new(Declared(declaration)), sources, counters.clone(), limits)
        .expect("start");
    (server, counters)
}

fn any() -> SourceFilter {
    SourceFilter::new(&[AllowFrom::Any])
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    stream
}

/// One request on a fresh connection: (status, body), or None when closed without an answer.
fn get(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut stream = connect(addr);
    stream.write_all(format!("GET {target} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    read_answer(&mut stream)
}

fn read_answer(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut response = Vec::new();
    // A reset (the server closed with our bytes unread) reads as an error: no answer either.
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8(response).ok()?;
    let code = response.get(9..12)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

/// A client that sent part of a request head and holds the connection.
fn half_sent(addr: SocketAddr) -> TcpStream {
    let mut stream = connect(addr);
    stream.write_all(b"GET /probe/tc").expect("partial head");
    stream
}

/// Whether the server closed `stream` within `within` (EOF or reset), without answering.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("unexpected answer: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(err) => !matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
    }
}

#[test]
fn declared_checks_are_answered_and_anything_else_is_forbidden() {
    let (server, _) = serve(any(), ListenerLimits::default());
    let addr = server.local_addr();
    assert_eq!(get(addr, "/probe/tcp?port=8080"), Some((200, "ok\n".into())));
    assert_eq!(get(addr, "/probe/tcp?stall=5s&port=8080"), Some((200, "ok\n".into())), "the same check");
    assert_eq!(get(addr, "/probe/process"), Some((200, "ok\n".into())));
    for undeclared in [
        "/probe/tcp?port=22",
        "/probe/file?path=/proc/1/environ&contains=X",
        "/probe/tcp?port=80a",
        "/healthz",
        "/probe/process?container=other&junk",
    ] {
        assert_eq!(get(addr, undeclared), Some((403, "forbidden\n".into())), "{undeclared}");
    }
    let mut post = connect(addr);
    post.write_all(b"POST /probe/process HTTP/1.1\r\n\r\n").expect("write");
    assert_eq!(read_answer(&mut post).map(|a| a.0), Some(405));
    server.stop();
}

#[test]
fn a_slow_request_head_is_closed_at_the_deadline_without_delaying_others() {
    let limits = ListenerLimits { head_deadline: Duration::from_millis(250), ..ListenerLimits::default() };
    let (server, counters) = serve(any(), limits);
    let addr = server.local_addr();
    let started = Instant::now();
    let mut slow = half_sent(addr);
    // Others are answered at once while it waits.
    for _ in 0..5 {
        let asked = Instant::now();
        assert_eq!(get(addr, "/probe/process"), Some((200, "ok\n".into())));
        assert!(asked.elapsed() < Duration::from_millis(200), "{:?}", asked.elapsed());
    }
    assert!(closed_within(&mut slow, Duration::from_secs(2)), "the slow client is closed");
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(240) && held < Duration::from_millis(900), "closed after {held:?}");
    assert_eq!((counters.timeout.get(), counters.busy.get(), counters.source.get()), (1, 0, 0));
    // The rest of its request, too late, changes nothing.
    let _ = slow.write_all(b"p?port=8080 HTTP/1.1\r\n\r\n");
    assert_eq!(get(addr, "/probe/tcp?port=8080"), Some((200, "ok\n".into())));
}

#[test]
fn held_connections_are_bounded_and_the_one_kept_longest_makes_room() {
    // Issue 18: refusing newcomers once the bound was reached let a client on a node address
    // that held every place fail the kubelet's probes; now the connection kept longest goes.
    let limits =
        ListenerLimits { head_deadline: Duration::from_secs(30), max_connections: 4, ..ListenerLimits::default() };
    let (server, counters) = serve(any(), limits);
    let addr = server.local_addr();
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        held.push(half_sent(addr));
        // Kept in order: each has a later deadline than the one before.
        std::thread::sleep(Duration::from_millis(5));
    }
    // The fifth that needs holding is kept, and the first is closed for it...
    let mut fifth = half_sent(addr);
    assert!(closed_within(&mut held[0], Duration::from_secs(2)), "the oldest makes room");
    assert!(!closed_within(&mut fifth, Duration::from_millis(20)), "the newest is kept");
    assert_eq!(counters.busy.get(), 1);
    // ...and a request that is all there is answered, bound or not.
    assert_eq!(get(addr, "/probe/process"), Some((200, "ok\n".into())));
    for stream in &mut held[1..] {
        assert!(!closed_within(stream, Duration::from_millis(20)), "the other three are kept");
    }
    fifth.write_all(b"p?port=8080 HTTP/1.1\r\n\r\n").expect("rest of the head");
    assert_eq!(read_answer(&mut fifth), Some((200, "ok\n".into())), "answered once complete");
    // One leaves: its slot is free again, nobody is evicted.
    drop(held.pop());
    std::thread::sleep(Duration::from_millis(100));
    let mut again = half_sent(addr);
    assert!(!closed_within(&mut again, Duration::from_millis(100)), "kept: a slot was free");
    again.write_all(b"p?port=8080 HTTP/1.1\r\n\r\n").expect("rest of the head");
    assert_eq!(read_answer(&mut again), Some((200, "ok\n".into())), "answered once complete");
    assert_eq!((counters.busy.get(), counters.timeout.get()), (1, 0));
    server.stop();
    for stream in &mut held[1..] {
        assert!(closed_within(stream, Duration::from_secs(2)), "stopping closes held connections");
    }
}

#[test]
fn sources_outside_the_filter_are_closed_before_reading() {
    // `node` never includes loopback: a client on 127.0.0.1 is refused, complete request or not.
    let node_only = SourceFilter::new(&[AllowFrom::Node]);
    node_only.set_node_addresses(vec!["127.0.0.1".parse().expect("ip"), "192.0.2.1".parse().expect("ip")]);
    let (server, counters) = serve(node_only, ListenerLimits::default());
    assert_eq!(get(server.local_addr(), "/probe/process"), None);
    assert_eq!(get(server.local_addr(), "/probe/tcp?port=8080"), None);
    assert_eq!((counters.source.get(), counters.timeout.get()), (2, 0));
    // The same client is let in by a rule that names it.
    let loopback = SourceFilter::new(&[AllowFrom::Node, "127.0.0.0/8".parse().expect("cidr")]);
    let (server, counters) = serve(loopback, ListenerLimits::default());
    assert_eq!(get(server.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
    assert_eq!(counters.source.get(), 0);
}

#[test]
fn oversized_heads_and_early_closes_get_no_answer() {
    let (server, counters) = serve(any(), ListenerLimits::default());
    let addr = server.local_addr();
    let mut big = connect(addr);
    let junk = format!("GET /probe/process?{} HTTP/1.1\r\n", "a".repeat(MAX_REQUEST_HEAD));
    let _ = big.write_all(junk.as_bytes());
    assert!(closed_within(&mut big, Duration::from_secs(2)));
    drop(half_sent(addr));
    assert_eq!(get(addr, "/probe/process"), Some((200, "ok\n".into())));
    assert_eq!(counters.timeout.get(), 0);
}

#[test]
fn one_loop_serves_every_pod_and_a_pod_holding_its_places_takes_none_of_anothers() {
    // Issue 17: every pod listener is served by one loop; the bounds stay per pod.
    let limits =
        ListenerLimits { head_deadline: Duration::from_secs(30), max_connections: 4, ..ListenerLimits::default() };
    let serving = ProbeListeners::start(limits).expect("loop");
    let (declaration, _) = Declaration::from_annotation("/probe/tcp?port=8080\n/probe/process\n");
    let answer: Arc<dyn ProbeAnswer> = Arc::new(Declared(declaration));
    let serve = |counters: &ConnectionCounters| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        serving.serve(listener, answer.clone(), any(), counters.clone()).expect("serve")
    };
    let (hostile_counters, quiet_counters) = (ConnectionCounters::unregistered(), ConnectionCounters::unregistered());
    let (hostile, quiet) = (serve(&hostile_counters), serve(&quiet_counters));
    // The quiet pod's kubelet has a connection of its own waiting for the rest of its head.
    let mut pending = half_sent(quiet.local_addr());
    // The hostile pod's clients hold four times its places.
    let mut held: Vec<TcpStream> = (0..16).map(|_| half_sent(hostile.local_addr())).collect();
    assert!(closed_within(&mut held[0], Duration::from_secs(2)), "the hostile pod's own oldest make room");
    assert_eq!(get(hostile.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
    // The quiet pod lost nothing: its waiting connection is kept and answered, and new ones too.
    assert!(!closed_within(&mut pending, Duration::from_millis(20)), "another pod's place is not taken");
    pending.write_all(b"p?port=8080 HTTP/1.1\r\n\r\n").expect("rest of the head");
    assert_eq!(read_answer(&mut pending), Some((200, "ok\n".into())));
    for _ in 0..20 {
        assert_eq!(get(quiet.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
    }
    assert_eq!(quiet_counters.busy.get(), 0);
    assert!(hostile_counters.busy.get() >= 12, "{}", hostile_counters.busy.get());
    // Closing one pod's listener closes its connections; the other's loop goes on.
    drop(hostile);
    for stream in &mut held[12..] {
        assert!(closed_within(stream, Duration::from_secs(2)), "closing the listener closes what it held");
    }
    assert_eq!(get(quiet.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
}

/// Panics for `/probe/boom` (a bug an input found), answers 200 otherwise.
struct Panicky;

impl ProbeAnswer for Panicky {
    fn answer(&self, path: &str, _: Option<&str>) -> (u16, String) {
        assert_ne!(path, "/probe/boom", "a bug an input found");
        (200, "ok\n".to_owned())
    }
}

#[test]
fn an_answer_that_panics_closes_its_connection_and_the_loop_serves_on() {
    let serving = ProbeListeners::start(ListenerLimits::default()).expect("loop");
    let serve = |answer: Arc<dyn ProbeAnswer>| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        serving.serve(listener, answer, any(), ConnectionCounters::unregistered()).expect("serve")
    };
    let (hostile, other) = (serve(Arc::new(Panicky)), serve(Arc::new(Panicky)));
    assert_eq!(get(hostile.local_addr(), "/probe/boom"), None, "closed without an answer");
    assert_eq!(get(hostile.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
    assert_eq!(get(other.local_addr(), "/probe/process"), Some((200, "ok\n".into())));
    drop(hostile);
    drop(other);
}

#[test]
fn a_source_keeps_connections_at_its_rate_and_its_whole_requests_are_answered_past_it() {
    // Issue 37: per-source connection rates on every listener. A client on the kubelet's own
    // address (a hostNetwork pod) must not spend the kubelet's turn: only connections that have
    // to be kept are rated, and the kubelet's request comes whole.
    let limits = ListenerLimits {
        head_deadline: Duration::from_secs(30),
        max_connections: 8,
        keep_rate: Rate { per_second: 0.1, burst: 2.0 },
    };
    let (server, counters) = serve(any(), limits);
    let addr = server.local_addr();
    // Four kept freely (half the places), two on the burst, four closed for their rate.
    let mut held: Vec<TcpStream> = (0..10)
        .map(|_| {
            let stream = half_sent(addr);
            // In order: each is kept or closed before the next comes.
            std::thread::sleep(Duration::from_millis(20));
            stream
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while counters.rate.get() < 4 {
        assert!(Instant::now() < deadline, "rated: {}", counters.rate.get());
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..20 {
        assert_eq!(get(addr, "/probe/process"), Some((200, "ok\n".into())), "whole requests are answered");
    }
    assert_eq!(counters.rate.get(), 4, "six kept, four closed, none of the whole requests");
    assert_eq!(counters.busy.get(), 0);
    let closed = held.iter_mut().map(|stream| closed_within(stream, Duration::from_millis(20))).filter(|c| *c).count();
    assert_eq!(closed, 4);
    server.stop();
}
