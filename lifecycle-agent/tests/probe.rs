//! Privileged tier for the probes: real apps in real network namespaces and a real runc
//! container; the tcp state is driven only by the real kernel programs' events (the agent never
//! connects to the app) and by /proc. Every check asked is declared first, as a pod does with
//! its `lifecycle.dev/probes` annotation; the surface tests at the end attack the real listener
//! (issue 10). Skips with a printed reason when not root.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    ops::Deref,
    os::unix::fs::MetadataExt as _,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use lifecycle_agent::{
    discovery::{
        clock::boottime_ns,
        proc::{self as observe, ObserveError},
    },
    model::{
        event::{Detail, Event},
        node::{NodeTracker, TrackerConfig, UnitLabels},
    },
    probe::{
        check::CheckSpec,
        container::ProbedContainer,
        declaration::{Declaration, RefusalReason},
        feeds::ProbeFeeds,
        files::FileReaders,
        listener::{ListenerLimits, ProbeListener},
        metrics::{ConnectionCounters, ProbeMetrics},
        server::{bind_in_netns, PodRouter, ProbeAnswer},
        source::{AllowFrom, SourceFilter},
        NodeProbes, PodProbe,
    },
};
use lifecycle_testkit::{
    hub::Hub,
    netns::{netns_skip_reason, runc_skip_reason, Proc, RuncContainer, TestNetns},
    require_privileges,
};
use prometheus::Encoder as _;

const PYTHON: &str = "/usr/bin/python3";
const APP_PORT: u16 = 8080;
const S: u64 = 1_000_000_000;

/// The app: listens on a port; mode `accept` accepts forever, `never` never accepts, `close`
/// closes its listener (staying alive) when a line arrives on stdin.
const APP: &str = r#"
import socket, sys, threading
mode, port = sys.argv[1], int(sys.argv[2])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", port)); l.listen(16)
print("listening", flush=True)
if mode == "accept":
    def loop():
        while True:
            s, _ = l.accept(); s.close()
    threading.Thread(target=loop, daemon=True).start()
sys.stdin.readline()
if mode == "close":
    l.close(); print("closed", flush=True); sys.stdin.readline()
"#;

/// Connects n clients inside the netns, reports, and holds them until stdin closes.
const CLIENTS: &str = r#"
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
cs = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
print("connected", len(cs), flush=True)
sys.stdin.read()
"#;

/// An HTTP GET the way the kubelet's httpGet does it, from inside the netns: prints code|body.
const HTTP_GET: &str = r#"
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status, r.read().decode().strip(), sep="|")
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip(), sep="|")
"#;

macro_rules! require {
    () => {
        require_privileges!();
        if let Some(reason) = netns_skip_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// Container `container` of pod `default/<pod>`, whose uid is `uid-of-<pod>`.
fn labels_of(pod: &str, container: &str) -> UnitLabels {
    UnitLabels {
        namespace: "default".into(),
        pod: pod.into(),
        container: container.into(),
        uid: format!("uid-of-{pod}"),
    }
}

/// Container `app` of pod `default/<name>`.
fn app_of(name: &str) -> UnitLabels {
    labels_of(name, "app")
}

/// One container's probe with a node model of its own, as the agent runs it: the model applies
/// the kernel's events and the probe's /proc samples and publishes the container's facts on its
/// feed, which the probe answers from. Each test's probe has its own model: the kernel reuses
/// netns inodes, and another test's watch of the same inode would share its facts.
struct Probe {
    probe: Arc<PodProbe>,
    model: Mutex<NodeTracker>,
    feeds: ProbeFeeds,
}

impl Deref for Probe {
    type Target = PodProbe;
    fn deref(&self) -> &PodProbe {
        &self.probe
    }
}

impl ProbeAnswer for Probe {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        self.probe.answer(path, query)
    }
}

impl Probe {
    /// Probes the container the model labels `labels` whose main process is `pid`: the model
    /// watches it, with a first sample, as the supervisor does.
    fn new(labels: UnitLabels, pid: u32, metrics: Option<Arc<ProbeMetrics>>) -> Result<Self, ObserveError> {
        let container = ProbedContainer::new(labels);
        let feeds = ProbeFeeds::new(metrics.clone());
        let facts = feeds.open(container.key());
        let readers = FileReaders::unregistered(lifecycle_agent::probe::files::MAX_FILE_READERS);
        let probe = Arc::new(PodProbe::new(container, pid, metrics, facts, readers)?);
        let first = probe.sample(boottime_ns())?;
        let this = Self { probe, model: Mutex::new(NodeTracker::new(TrackerConfig::default())), feeds };
        this.commit(|tracker, probe| tracker.watch_probe(probe.key().clone(), probe.watch(), Some(&first)).1);
        Ok(this)
    }

    /// Runs `change` on the model and publishes what it changed, as the agent's owner does;
    /// returns whether this container's facts changed.
    fn commit(
        &self,
        change: impl FnOnce(&mut NodeTracker, &PodProbe) -> lifecycle_agent::model::node::Outcome,
    ) -> bool {
        let mut tracker = self.model.lock().expect("model");
        let outcome = change(&mut tracker, &self.probe);
        let concerned = outcome.probes.changed.contains(self.probe.key());
        self.feeds.publish(outcome.probes, |key| tracker.probe_facts(key));
        concerned
    }

    /// Applies one kernel event; returns whether it concerned this container.
    fn on_event(&self, event: &Event) -> bool {
        self.commit(|tracker, _| tracker.apply(event))
    }

    /// Samples /proc (files included) into the model, as the refresher does.
    fn refresh(&self, now: u64) -> Result<(), ObserveError> {
        self.probe.refresh_files();
        let sample = self.probe.sample(now)?;
        self.commit(|tracker, probe| tracker.sample_probe(probe.key(), &sample));
        Ok(())
    }

    /// Declares `checks` and tells the model their ports, as the supervisor does, and reads
    /// the files they name, as the probe's refresher then does at once.
    fn declare(&self, checks: Vec<CheckSpec>) {
        self.probe.declare(checks);
        self.probe.refresh_files();
        self.commit(|tracker, probe| tracker.watch_probe(probe.key().clone(), probe.watch(), None).1);
    }

    fn arc(&self) -> Arc<PodProbe> {
        self.probe.clone()
    }
}

/// Hands the pod every TCP event of its netns since it was made, in order, until `done` holds
/// (the kernel reuses netns inodes: earlier events of the same inode were another test's).
struct Feeder {
    fed: usize,
}

impl Feeder {
    fn feed_until(&mut self, probe: &Probe, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let (netns, since) = (probe.netns(), probe.created_ns());
        let events = Hub::get().wait_for(
            what,
            |e| e.at.ns() >= since && tcp_of(e).is_some_and(|(n, port)| n == netns && port == APP_PORT),
            done,
        );
        for event in &events[self.fed..] {
            assert!(probe.on_event(event));
        }
        self.fed = events.len();
        events
    }
}

fn tcp_of(e: &Event) -> Option<(u32, u16)> {
    match &e.detail {
        Detail::TcpListen(t) | Detail::TcpListenClose(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => {
            Some((t.netns, t.local_port))
        }
        _ => None,
    }
}

fn count(events: &[Event], kind: fn(&Detail) -> bool) -> usize {
    events.iter().filter(|e| kind(&e.detail)).count()
}

/// A netns with a holder process standing in for the pod sandbox (its pid is the probe's main
/// pid), so the probe exists before the app starts and sees its listen as an event.
fn pod_in_netns(name: &str) -> (TestNetns, Proc, Probe) {
    // Load the sensor first: events from before it attached are never seen.
    Hub::get();
    let mut netns = TestNetns::new();
    let mut holder = netns.spawn(PYTHON, &["-c", "import sys; print('up', flush=True); sys.stdin.read()"]);
    assert_eq!(holder.read_line(), "up");
    let probe = Probe::new(app_of(name), holder.pid, None).expect("probe");
    assert_eq!(probe.netns(), netns.inode);
    (netns, holder, probe)
}

fn tcp_check(stall: &str) -> CheckSpec {
    CheckSpec::parse("/tcp", Some(&format!("port={APP_PORT}&stall={stall}"))).expect("spec")
}

/// Declares `entries` (annotation lines) for the probe's container, as the supervisor does.
fn declare(probe: &Probe, entries: &[&str]) {
    let (declaration, refusals) = Declaration::from_annotation(&entries.join("\n"));
    assert_eq!(refusals, vec![], "the test declares only valid checks");
    probe.declare(declaration.checks_for(&probe.key().container));
}

/// A listener serving `answer` inside `netns`, on `port`, letting in what `sources` allows.
fn listen_in(
    netns: &TestNetns,
    port: u16,
    answer: Arc<dyn ProbeAnswer>,
    sources: SourceFilter,
) -> (ProbeListener, ConnectionCounters) {
    let listener = bind_in_netns(&netns.path, SocketAddr::from(([0, 0, 0, 0], port))).expect("bind in netns");
    let counters = ConnectionCounters::unregistered();
    let server =
        ProbeListener::start(listener, answer, sources, counters.clone(), ListenerLimits::default()).expect("serve");
    (server, counters)
}

/// The default `--probe-allow-from node`, with this (the host's) namespace's addresses.
fn node_sources() -> SourceFilter {
    let sources = SourceFilter::new(&[AllowFrom::Node]);
    sources.refresh_node_addresses().expect("read the node's addresses");
    sources
}

/// One GET on a fresh connection from this (the host's) namespace, as the kubelet sends it:
/// (status, body), or None when the connection was closed without an answer.
/// Waits until a TCP connection to `addr` over a fresh veth goes through (its first SYNs can be
/// dropped until the link's carrier is up). A bare connection sends no request, so with
/// TCP_DEFER_ACCEPT the listener never even accepts it.
fn wait_link_up(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{addr} unreachable over the test link");
    }
}

fn kubelet_get(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let request =
        format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.30\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8(response).ok()?;
    let code = response.get(9..12)?.parse().ok()?;
    Some((code, response.split_once("\r\n\r\n")?.1.to_owned()))
}
#[test]
fn a_listener_that_accepts_passes() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("accepting");
    let mut feeder = Feeder { fed: 0 };
    let spec = tcp_check("1s");
    declare(&probe, &["/probe/tcp?port=8080&stall=1s"]);
    assert_eq!(spec.evaluate(&probe.snapshot(), boottime_ns()).reason, "no listener on port 8080");

    let mut app = netns.spawn(PYTHON, &["-c", APP, "accept", &APP_PORT.to_string()]);
    assert_eq!(app.read_line(), "listening");
    feeder.feed_until(&probe, "listen", |m| count(m, |d| matches!(d, Detail::TcpListen(_))) == 1);
    let out = netns.output(
        PYTHON,
        &["-c", "import socket\nfor _ in range(5): socket.create_connection(('127.0.0.1', 8080)).close()"],
    );
    assert_eq!(out, "");
    let events = feeder.feed_until(&probe, "5 accepts", |m| count(m, |d| matches!(d, Detail::TcpAccept(_))) == 5);
    assert_eq!(count(&events, |d| matches!(d, Detail::TcpEstablished(_))), 5);
    let now = boottime_ns();
    let verdict = probe.evaluate(&spec, now + 10 * S);
    assert!(verdict.pass, "{verdict:?}");
    assert_eq!(verdict.reason, "port 8080 accepting (0 waiting)");
    assert_eq!(probe.reevaluate(now), None, "nothing waiting: no deadline to re-check at");
}

#[test]
fn a_listener_that_never_accepts_fails_after_the_stall_while_connects_still_succeed() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("stalled");
    let mut feeder = Feeder { fed: 0 };
    let mut app = netns.spawn(PYTHON, &["-c", APP, "never", &APP_PORT.to_string()]);
    assert_eq!(app.read_line(), "listening");
    const N: usize = 4;
    let mut clients = netns.spawn(PYTHON, &["-c", CLIENTS, &N.to_string(), &APP_PORT.to_string()]);
    // What a tcpSocket probe sees: every connect succeeds.
    assert_eq!(clients.read_line(), format!("connected {N}"));
    let events =
        feeder.feed_until(&probe, "established", |m| count(m, |d| matches!(d, Detail::TcpEstablished(_))) == N);
    assert_eq!(count(&events, |d| matches!(d, Detail::TcpAccept(_))), 0);
    let first_established = events.iter().find(|e| matches!(e.detail, Detail::TcpEstablished(_))).expect("one").at.ns();

    let spec = tcp_check("1s");
    // Declared, so the pod re-evaluates this check at its deadline.
    declare(&probe, &["/probe/tcp?port=8080&stall=1s"]);
    let now = boottime_ns();
    assert!(probe.evaluate(&spec, now).pass, "fresh connections are not a stall yet");
    let deadline = probe.reevaluate(now).expect("a stall deadline");
    assert_eq!(deadline, first_established + S, "the deadline is the oldest connection's wait reaching the limit");
    assert!(spec.evaluate(&probe.snapshot(), deadline - 1).pass);
    std::thread::sleep(Duration::from_nanos(deadline.saturating_sub(boottime_ns())));
    let verdict = probe.evaluate(&spec, boottime_ns());
    assert!(!verdict.pass);
    assert!(
        verdict.reason.starts_with(&format!("port 8080: {N} connections waiting unaccepted for 1"))
            && verdict.reason.ends_with("(stall limit 1s)"),
        "{}",
        verdict.reason
    );
    // The kernel's own queue agrees, and a plain connect still succeeds after the verdict.
    let listeners = observe::listeners(app.pid).expect("listeners");
    let ours = listeners.iter().find(|l| l.port == APP_PORT).expect("listener in /proc");
    assert_eq!((ours.queue_depth, ours.backlog), (N as u32, Some(16)));
    let one_more = netns.output(
        PYTHON,
        &["-c", "import socket; socket.create_connection(('127.0.0.1', 8080), timeout=2); print('ok')"],
    );
    assert_eq!(one_more.trim(), "ok");
    eprintln!("stall verdict: {}", verdict.reason);
}

#[test]
fn a_closed_listener_flips_the_check_at_the_close_event() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("closing");
    let mut feeder = Feeder { fed: 0 };
    let mut app = netns.spawn(PYTHON, &["-c", APP, "close", &APP_PORT.to_string()]);
    assert_eq!(app.read_line(), "listening");
    feeder.feed_until(&probe, "listen", |m| count(m, |d| matches!(d, Detail::TcpListen(_))) == 1);
    let spec = tcp_check("5s");
    declare(&probe, &["/probe/tcp?port=8080&stall=5s"]);
    assert!(probe.evaluate(&spec, boottime_ns()).pass);

    app.write_line("close");
    assert_eq!(app.read_line(), "closed");
    let events =
        feeder.feed_until(&probe, "listen close", |m| count(m, |d| matches!(d, Detail::TcpListenClose(_))) == 1);
    let closed_at = events.iter().find(|e| matches!(e.detail, Detail::TcpListenClose(_))).expect("close").at.ns();
    let seen_after = boottime_ns() - closed_at;
    // No /proc refresh happened: the event alone flipped it, effective at the event's own time.
    let verdict = probe.evaluate(&spec, closed_at);
    assert_eq!((verdict.pass, verdict.reason.as_str()), (false, "listener on 8080 closed"));
    eprintln!("close seen {:.1} ms after the kernel event", seen_after as f64 / 1e6);
}

#[test]
fn an_http_client_inside_the_netns_gets_200_then_503_from_the_probe_listener() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("http");
    let probe = Arc::new(probe);
    let mut feeder = Feeder { fed: 0 };
    let mut app = netns.spawn(PYTHON, &["-c", APP, "close", &APP_PORT.to_string()]);
    assert_eq!(app.read_line(), "listening");
    feeder.feed_until(&probe, "listen", |m| count(m, |d| matches!(d, Detail::TcpListen(_))) == 1);

    let own_netns = || std::fs::metadata("/proc/thread-self/ns/net").expect("netns").ino();
    let before = own_netns();
    let listener = bind_in_netns(&netns.path, SocketAddr::from(([0, 0, 0, 0], 9891))).expect("bind in netns");
    assert_eq!(own_netns(), before, "the calling thread never changed namespace");
    declare(&probe, &["/probe/tcp?port=8080&stall=5s", "/probe/process", "/probe/all?process&tcp=8080"]);
    let answer: Arc<dyn ProbeAnswer> = probe.clone();
    // This client runs inside the pod's namespace: let its loopback in explicitly (the default,
    // node addresses only, refuses it; see the source tests below).
    let loopback = SourceFilter::new(&["127.0.0.0/8".parse().expect("cidr")]);
    let counters = ConnectionCounters::unregistered();
    let server = ProbeListener::start(listener, answer, loopback, counters, ListenerLimits::default()).expect("serve");

    let get = |query: &str| {
        netns.output(PYTHON, &["-c", HTTP_GET, &format!("http://127.0.0.1:9891{query}")]).trim().to_owned()
    };
    assert_eq!(get("/probe/tcp?port=8080&stall=5s"), "200|ok");
    // Unparsable is not declared: refused, and the refusal says nothing.
    assert_eq!(get("/probe/tcp?port=80a"), "403|forbidden");
    assert_eq!(get("/probe/process"), "200|ok");
    // Answered from the cached snapshot, the same answer every time (its cost is measured by
    // `xtask/x.sh bench probes`, not here).
    const CALLS: u32 = 10_000;
    let started = std::time::Instant::now();
    for _ in 0..CALLS {
        assert_eq!(probe.answer("/probe/tcp", Some("port=8080&stall=5s")).0, 200);
    }
    eprintln!("answer() from cache: {:?} per call", started.elapsed() / CALLS);

    app.write_line("close");
    assert_eq!(app.read_line(), "closed");
    feeder.feed_until(&probe, "listen close", |m| count(m, |d| matches!(d, Detail::TcpListenClose(_))) == 1);
    assert_eq!(get("/probe/tcp?port=8080&stall=5s"), "503|listener on 8080 closed");
    assert_eq!(get("/probe/all?process&tcp=8080"), "503|listener on 8080 closed");
    server.stop();
}

#[test]
fn file_checks_in_a_runc_container_stay_inside_its_root() {
    require!();
    if let Some(reason) = runc_skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let container = RuncContainer::start("file");
    let rootfs = &container.rootfs;
    std::fs::write(rootfs.join("etc/hostname"), "inside-the-container\n").expect("hostname");
    std::fs::write(rootfs.join("etc/shadow"), "container-shadow\n").expect("shadow");
    std::fs::write(rootfs.join("tmp/healthy"), "status: ok\n").expect("healthy");
    std::os::unix::fs::symlink("/etc/shadow", rootfs.join("tmp/evil")).expect("absolute symlink");
    std::os::unix::fs::symlink("../../../../../../etc/hostname", rootfs.join("tmp/climb")).expect("relative symlink");
    let host_hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert_ne!(host_hostname, "inside-the-container\n");

    let probe = Probe::new(app_of("files"), container.pid, None).expect("probe");
    declare(
        &probe,
        &[
            "/probe/file?path=/tmp/healthy&fresh=30s&contains=ok",
            "/probe/file?path=/tmp/healthy&contains=broken",
            "/probe/file?path=/tmp/healthy&fresh=30s",
            "/probe/file?path=/tmp/missing",
            "/probe/file?path=/tmp/evil&contains=container-shadow",
        ],
    );
    let ask = |query: &str| probe.answer("/probe/file", Some(query));
    assert_eq!(ask("path=/tmp/healthy&fresh=30s&contains=ok"), (200, "ok\n".into()));
    assert_eq!(
        ask("path=/tmp/healthy&contains=broken"),
        (503, "file /tmp/healthy does not contain \"broken\" in its first 4096 bytes\n".into())
    );
    // Make it stale: a minute old; the next refresh sees the new mtime.
    let file = std::fs::File::options().write(true).open(rootfs.join("tmp/healthy")).expect("open");
    file.set_modified(SystemTime::now() - Duration::from_secs(60)).expect("set mtime");
    probe.refresh(boottime_ns()).expect("refresh");
    let (code, body) = ask("path=/tmp/healthy&fresh=30s");
    assert_eq!(code, 503);
    assert!(
        body.starts_with("file /tmp/healthy last modified 60") && body.ends_with("ago (fresh limit 30s)\n"),
        "{body}"
    );
    assert_eq!(ask("path=/tmp/missing").0, 503);

    // Escapes. `..` is refused by the URL parser outright (so it can never be declared)...
    assert_eq!(ask("path=../../etc/hostname"), (403, "forbidden\n".into()));
    assert_eq!(ask("path=/tmp/../../etc/hostname"), (403, "forbidden\n".into()));
    // ...and the kernel keeps every resolution inside the root even when asked directly.
    let read = |path: &str| {
        observe::read_file_in_root(container.pid, path, 4096).map(|r| String::from_utf8_lossy(&r.head).into_owned())
    };
    assert_eq!(read("../../etc/hostname").expect("clamped at the root"), "inside-the-container\n");
    assert_eq!(read("/tmp/evil").expect("absolute symlink inside the root"), "container-shadow\n");
    assert_eq!(read("/tmp/climb").expect("relative symlink clamped"), "inside-the-container\n");
    assert_eq!(ask("path=/tmp/evil&contains=container-shadow"), (200, "ok\n".into()));
    for magic in ["/proc/self/root/etc/hostname", "/proc/1/root/etc/hostname", "/proc/1/cwd/etc/hostname"] {
        let err = read(magic).expect_err(magic);
        eprintln!("{magic}: {err}");
        assert!(err.to_string().contains("cannot open"), "{err}");
    }
    let magic = read("/proc/1/root/etc/hostname").expect_err("magic link");
    assert!(std::error::Error::source(&magic).is_some_and(|s| s.to_string().contains("symbolic links")), "{magic}");
    // Non-regular files are refused, never read (a FIFO would block).
    assert!(read("/dev/null").is_err() || read("/tmp").is_err());
}

#[test]
fn process_checks_see_running_stopped_and_zombie() {
    require!();
    if let Some(reason) = runc_skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let container = RuncContainer::start("process");
    let probe = Probe::new(app_of("process"), container.pid, None).expect("probe");
    declare(&probe, &["/probe/process"]);
    let ask = || probe.answer("/probe/process", None);
    assert_eq!(ask(), (200, "ok\n".into()));
    // SAFETY: kill has no memory-safety preconditions; the pid is our container's init.
    assert_eq!(unsafe { libc::kill(container.pid as i32, libc::SIGSTOP) }, 0);
    wait_state(container.pid, 'T');
    probe.refresh(boottime_ns()).expect("refresh");
    assert_eq!(ask(), (503, format!("main process {} is stopped\n", container.pid)));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(container.pid as i32, libc::SIGCONT) }, 0);
    wait_state(container.pid, 'S');
    probe.refresh(boottime_ns()).expect("refresh");
    assert_eq!(ask(), (200, "ok\n".into()));

    // A zombie: our own child, exited and not yet reaped.
    let mut child = std::process::Command::new("/bin/true").spawn().expect("spawn true");
    wait_state(child.id(), 'Z');
    let zombie = Probe::new(app_of("zombie"), child.id(), None).expect("probe");
    declare(&zombie, &["/probe/process"]);
    assert_eq!(zombie.answer("/probe/process", None), (503, format!("main process {} is a zombie\n", child.id())));
    child.wait().expect("reap");
    zombie.refresh(boottime_ns()).expect("refresh");
    assert_eq!(zombie.answer("/probe/process", None), (503, format!("main process {} is gone\n", child.id())));
}

fn wait_state(pid: u32, letter: char) {
    for _ in 0..500 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit(')').next().and_then(|s| s.trim_start().chars().next()) == Some(letter) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("pid {pid} never reached state {letter}");
}

/// Prints `answered`, `closed` (EOF or reset before any byte) or `timeout` for one GET sent to
/// argv[1]:argv[2] from wherever it runs.
const RAW_GET: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"GET /probe/process HTTP/1.1\r\nHost: pod\r\n\r\n")
try:
    print("answered" if s.recv(100) else "closed")
except ConnectionResetError:
    print("closed")
except socket.timeout:
    print("timeout")
"#;

fn render(registry: &prometheus::Registry) -> String {
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut out).expect("encode");
    String::from_utf8(out).expect("utf8")
}

#[test]
fn the_file_content_oracle_gets_403_and_leaves_no_series() {
    require!();
    let registry = prometheus::Registry::new();
    let metrics = ProbeMetrics::register(&registry).expect("metrics");
    let (mut netns, holder, _) = pod_in_netns("oracle");
    let probe = Arc::new(Probe::new(app_of("oracle"), holder.pid, Some(metrics)).expect("probe"));
    // The pod declares a process check, and tries to declare the oracle itself: refused.
    let (declaration, refusals) =
        Declaration::from_annotation("/probe/process\n/probe/file?path=/proc/1/environ&contains=X\n");
    assert_eq!(refusals.iter().map(|r| r.reason).collect::<Vec<_>>(), vec![RefusalReason::ForbiddenPath]);
    assert!(refusals[0].to_string().contains("/proc, /sys or /dev"), "{}", refusals[0]);
    probe.declare(declaration.checks_for("app"));
    let (_host, inside) = netns.link_to_host();
    let (server, counters) = listen_in(&netns, 9891, probe.clone(), node_sources());
    let addr = SocketAddr::from((inside, 9891));
    assert_eq!(kubelet_get(addr, "/probe/process"), Some((200, "ok\n".into())));
    // Even from the kubelet's own address the oracle learns nothing: one answer for every guess.
    let guesses = ["X", "PATH=", "HOME=/root", ""];
    for guess in guesses {
        let path = format!("/probe/file?path=/proc/1/environ&contains={guess}");
        assert_eq!(kubelet_get(addr, &path), Some((403, "forbidden\n".into())), "{path}");
    }
    assert_eq!(kubelet_get(addr, "/probe/file?path=/proc/1/cmdline"), Some((403, "forbidden\n".into())));
    assert_eq!(kubelet_get(addr, "/probe/tcp?port=22"), Some((403, "forbidden\n".into())));
    // No state: no file was read or kept, and the declared set is what it was.
    assert!(probe.snapshot().files.is_empty(), "{:?}", probe.snapshot().files);
    assert_eq!(probe.declared(), vec![CheckSpec::Process { max_uninterruptible_ns: None }]);
    // No series: the only check series is the declared one; the refusals are one fixed counter.
    let text = render(&registry);
    let results: Vec<&str> = text.lines().filter(|l| l.starts_with("lifecycle_probe_result{")).collect();
    assert_eq!(
        results,
        vec![
            r#"lifecycle_probe_result{check="process",container="app",namespace="default",pod="oracle",uid="uid-of-oracle"} 1"#
        ]
    );
    for leaked in ["environ", "cmdline", "file:", "tcp:22"] {
        assert!(!text.contains(leaked), "{leaked} in\n{text}");
    }
    assert!(text.contains(&format!("lifecycle_probe_requests_forbidden_total {}\n", guesses.len() + 2)), "{text}");
    assert_eq!((counters.source.get(), counters.busy.get()), (0, 0));
    server.stop();
}

#[test]
fn fifty_half_sent_requests_do_not_delay_a_declared_probe() {
    require!();
    const STALLERS: usize = 50;
    const PROBES: usize = 200;
    let (mut netns, _holder, probe) = pod_in_netns("stall");
    let mut app = netns.spawn(PYTHON, &["-c", APP, "accept", &APP_PORT.to_string()]);
    assert_eq!(app.read_line(), "listening");
    probe.refresh(boottime_ns()).expect("refresh: sees the app's listener");
    let path = "/probe/tcp?port=8080&stall=5s";
    declare(&probe, &[path]);
    let (_host, inside) = netns.link_to_host();
    let (server, counters) = listen_in(&netns, 9891, Arc::new(probe), node_sources());
    let addr = SocketAddr::from((inside, 9891));
    assert_eq!(kubelet_get(addr, path), Some((200, "ok\n".into())));

    // Each staller sends a piece of a request head and holds the connection; when the listener
    // cuts it at the head deadline, it comes straight back with another.
    let stop = Arc::new(AtomicBool::new(false));
    let holding = Arc::new(AtomicUsize::new(0));
    let stallers: Vec<_> = (0..STALLERS)
        .map(|_| {
            let (stop, holding) = (stop.clone(), holding.clone());
            std::thread::spawn(move || {
                let mut first = true;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = TcpStream::connect(addr) else { continue };
                    let _ = stream.write_all(b"GET /probe/tc");
                    if std::mem::take(&mut first) {
                        holding.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
                    let mut buf = [0u8; 16];
                    loop {
                        match stream.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => panic!("a half-sent request was answered"),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                if stop.load(Ordering::Relaxed) {
                                    return;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    while holding.load(Ordering::Relaxed) < STALLERS {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Spread over several head deadlines (250 ms), so the stallers are cut and come back meanwhile.
    let mut worst = Duration::ZERO;
    for i in 0..PROBES {
        let asked = Instant::now();
        let answer = kubelet_get(addr, path);
        let took = asked.elapsed();
        assert_eq!(answer, Some((200, "ok\n".into())), "probe {i} after {took:?}");
        assert!(took < Duration::from_secs(1), "probe {i} took {took:?}: past the kubelet's timeout");
        worst = worst.max(took);
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for staller in stallers {
        staller.join().expect("staller");
    }
    assert!(counters.timeout.get() >= STALLERS as u64, "stallers cut at the deadline: {}", counters.timeout.get());
    assert_eq!((counters.busy.get(), counters.source.get()), (0, 0));
    eprintln!(
        "{PROBES} probes beside {STALLERS} stalled clients: slowest {worst:?}; {} stalls cut",
        counters.timeout.get()
    );
    server.stop();
}

#[test]
fn four_hundred_held_connections_from_a_node_address_do_not_fail_a_declared_probe() {
    // Issue 18: from a node address (host-network pods share it), 400 connections held open on a
    // pod's probe listener made the kubelet's next probe fail at once.
    require!();
    const HELD: usize = 400;
    let (mut netns, _holder, probe) = pod_in_netns("held");
    declare(&probe, &["/probe/process"]);
    let (_host, inside) = netns.link_to_host();
    let (server, counters) = listen_in(&netns, 9891, Arc::new(probe), node_sources());
    let addr = SocketAddr::from((inside, 9891));
    wait_link_up(addr);
    assert_eq!(kubelet_get(addr, "/probe/process"), Some((200, "ok\n".into())));
    // Half of them silent, half with a piece of a request head; all held, none closed.
    let mut held = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { continue };
        if i % 2 == 1 {
            let _ = stream.write_all(b"GET /probe/pro");
        }
        held.push(stream);
    }
    assert!(held.len() >= HELD / 2, "only {} connections opened", held.len());
    let mut worst = Duration::ZERO;
    for i in 0..100 {
        let asked = Instant::now();
        let answer = kubelet_get(addr, "/probe/process");
        let took = asked.elapsed();
        assert_eq!(
            answer,
            Some((200, "ok\n".into())),
            "probe {i} after {took:?} beside {} held connections",
            held.len()
        );
        assert!(took < Duration::from_secs(1), "probe {i} took {took:?}: past the kubelet's timeout");
        worst = worst.max(took);
    }
    eprintln!(
        "100 probes beside {} held connections: slowest {worst:?}; {} cut at the deadline, {} made room",
        held.len(),
        counters.timeout.get(),
        counters.busy.get()
    );
    drop(held);
    server.stop();
}

#[test]
fn connections_from_inside_the_pod_are_refused() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("sources");
    declare(&probe, &["/probe/process"]);
    let (host, inside) = netns.link_to_host();
    let sources = node_sources();
    assert!(sources.allows(IpAddr::V4(host)), "the host end of the link is a node address");
    let (server, counters) = listen_in(&netns, 9891, Arc::new(probe), sources);
    // The kubelet's way in: from the node's side of the link.
    wait_link_up(SocketAddr::from((inside, 9891)));
    assert_eq!(kubelet_get(SocketAddr::from((inside, 9891)), "/probe/process"), Some((200, "ok\n".into())));
    // The pod itself, by loopback and by its own address: closed before a byte is read.
    for own in ["127.0.0.1".to_owned(), inside.to_string()] {
        assert_eq!(netns.output(PYTHON, &["-c", RAW_GET, &own, "9891"]).trim(), "closed", "from {own}");
    }
    assert_eq!(counters.source.get(), 2);
    server.stop();
}

#[test]
fn a_pod_listener_routes_each_request_to_the_one_container_that_declared_it() {
    require!();
    let (mut netns, holder, app) = pod_in_netns("routed");
    let sidecar = Probe::new(labels_of("routed", "sidecar"), holder.pid, None).expect("probe");
    // One declaration for the pod: a pod-wide tcp check, a process check of `app` only, a
    // max_d_state process check of `sidecar` only.
    let (declaration, refusals) = Declaration::from_annotation(
        "/probe/tcp?port=8080\n/probe/process?container=app\n/probe/process?max_d_state=10s&container=sidecar\n",
    );
    assert_eq!(refusals, vec![]);
    app.declare(declaration.checks_for("app"));
    sidecar.declare(declaration.checks_for("sidecar"));
    let probes = Arc::new(NodeProbes::default());
    probes.insert(app.arc());
    probes.insert(sidecar.arc());
    let (_host, inside) = netns.link_to_host();
    let router = Arc::new(PodRouter::new(probes, "default", "routed"));
    let (server, _) = listen_in(&netns, 9891, router, node_sources());
    wait_link_up(SocketAddr::from((inside, 9891)));
    let get = |target: &str| kubelet_get(SocketAddr::from((inside, 9891)), target);
    let forbidden = Some((403, "forbidden\n".to_owned()));
    // Named, or declared by exactly one container: answered.
    assert_eq!(get("/probe/process"), Some((200, "ok\n".into())), "only app declared it");
    assert_eq!(get("/probe/process?container=app"), Some((200, "ok\n".into())));
    assert_eq!(get("/probe/process?max_d_state=10s"), Some((200, "ok\n".into())), "only sidecar declared it");
    assert_eq!(get("/probe/tcp?port=8080&container=sidecar"), Some((503, "no listener on port 8080\n".into())));
    // Declared by both and not named: ambiguous. Another container's check, or nobody's: refused.
    assert_eq!(get("/probe/tcp?port=8080"), forbidden);
    assert_eq!(get("/probe/process?container=sidecar"), forbidden);
    assert_eq!(get("/probe/process?container=ghost"), forbidden);
    assert_eq!(get("/probe/process?container=app&container=sidecar"), forbidden);
    server.stop();
}

/// Not a test: the probe server `cargo xtask bench probes` measures. Serves a pod probe for
/// LIFECYCLE_BENCH_PID's netns on 127.0.0.1 (ephemeral port) until stdin closes; prints
/// `PROBE_SERVER <addr> <pid>` first.
#[test]
#[ignore = "run by cargo xtask bench probes"]
fn bench_probe_server() {
    let pid: u32 = std::env::var("LIFECYCLE_BENCH_PID").expect("LIFECYCLE_BENCH_PID").parse().expect("pid");
    let declared = std::env::var("LIFECYCLE_BENCH_PROBES").expect("LIFECYCLE_BENCH_PROBES: the declared probe paths");
    let probe = Arc::new(Probe::new(app_of("bench"), pid, None).expect("probe"));
    let (declaration, refusals) = Declaration::from_annotation(&declared);
    assert_eq!(refusals, vec![]);
    probe.declare(declaration.checks_for("app"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    println!("PROBE_SERVER {addr} {}", std::process::id());
    std::io::stdout().flush().expect("flush");
    let stop = Arc::new(AtomicBool::new(false));
    let refresher = probe.clone();
    let stopped = stop.clone();
    let answer: Arc<dyn ProbeAnswer> = probe;
    // The listener as the agent runs it: its own thread and event loop, the default bounds; the
    // bench's clients are on loopback, so loopback is let in.
    let sources = SourceFilter::new(&["127.0.0.0/8".parse().expect("cidr")]);
    let server =
        ProbeListener::start(listener, answer, sources, ConnectionCounters::unregistered(), ListenerLimits::default())
            .expect("serve");
    // Samples /proc into the model every 2 s, as the agent's refresher does, until stdin closes
    // (the bench's signal to stop).
    let refreshing = std::thread::spawn(move || {
        while !stopped.load(Ordering::Acquire) {
            let _ = refresher.refresh(boottime_ns());
            std::thread::park_timeout(Duration::from_secs(2));
        }
    });
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    stop.store(true, Ordering::Release);
    refreshing.thread().unpark();
    server.stop();
    let _ = refreshing.join();
}
