//! Privileged tier for the probes: real apps in real network namespaces and a real runc
//! container; the tcp state is driven only by the real kernel programs' events (the agent never
//! connects to the app) and by /proc. Skips with a printed reason when not root.

use std::{
    io::{Read as _, Write as _},
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    sync::Arc,
    time::{Duration, SystemTime},
};

use lifecycle_agent::{
    discovery::{clock::boottime_ns, proc as observe},
    model::event::{Detail, Event},
    probe::{
        check::CheckSpec,
        metrics::ProbeTarget,
        server::{bind_in_netns, BlockingServer, ProbeAnswer},
        PodProbe,
    },
};
use lifecycle_testkit::{
    hub::Hub,
    netns::{netns_skip_reason, runc_skip_reason, Proc, RuncContainer, TestNetns},
    require_privileges,
};

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

fn target(name: &str) -> ProbeTarget {
    ProbeTarget { namespace: "default".into(), pod: name.into(), container: "app".into() }
}

/// Hands the pod every TCP event of its netns, in order, until `done` holds.
struct Feeder {
    fed: usize,
}

impl Feeder {
    fn feed_until(&mut self, probe: &PodProbe, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let netns = probe.netns();
        let events =
            Hub::get().wait_for(what, |e| tcp_of(e).is_some_and(|(n, port)| n == netns && port == APP_PORT), done);
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
fn pod_in_netns(name: &str) -> (TestNetns, Proc, PodProbe) {
    // Load the sensor first: events from before it attached are never seen.
    Hub::get();
    let mut netns = TestNetns::new();
    let mut holder = netns.spawn(PYTHON, &["-c", "import sys; print('up', flush=True); sys.stdin.read()"]);
    assert_eq!(holder.read_line(), "up");
    let probe = PodProbe::new(target(name), holder.pid, None).expect("probe");
    assert_eq!(probe.netns(), netns.inode);
    (netns, holder, probe)
}

fn tcp_check(stall: &str) -> CheckSpec {
    CheckSpec::parse("/tcp", Some(&format!("port={APP_PORT}&stall={stall}"))).expect("spec")
}

#[test]
fn a_listener_that_accepts_passes() {
    require!();
    let (mut netns, _holder, probe) = pod_in_netns("accepting");
    let mut feeder = Feeder { fed: 0 };
    let spec = tcp_check("1s");
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
    let first_established = events.iter().find(|e| matches!(e.detail, Detail::TcpEstablished(_))).expect("one").time_ns;

    let spec = tcp_check("1s");
    let now = boottime_ns();
    // Ask once so the pod re-evaluates this check at its deadline.
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
    assert!(probe.evaluate(&spec, boottime_ns()).pass);

    app.write_line("close");
    assert_eq!(app.read_line(), "closed");
    let events =
        feeder.feed_until(&probe, "listen close", |m| count(m, |d| matches!(d, Detail::TcpListenClose(_))) == 1);
    let closed_at = events.iter().find(|e| matches!(e.detail, Detail::TcpListenClose(_))).expect("close").time_ns;
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
    let answer: Arc<dyn ProbeAnswer> = probe.clone();
    let server = BlockingServer::start(listener, answer).expect("serve");

    let get = |query: &str| {
        netns.output(PYTHON, &["-c", HTTP_GET, &format!("http://127.0.0.1:9891{query}")]).trim().to_owned()
    };
    assert_eq!(get("/probe/tcp?port=8080&stall=5s"), "200|ok");
    assert_eq!(get("/probe/tcp?port=80a"), "400|bad port \"80a\": expected 1-65535");
    assert_eq!(get("/probe/process"), "200|ok");
    // The request path's own cost: parse, lock, evaluate, format (no /proc, no syscalls).
    const CALLS: u32 = 10_000;
    let started = std::time::Instant::now();
    for _ in 0..CALLS {
        assert_eq!(probe.answer("/probe/tcp", Some("port=8080&stall=5s")).0, 200);
    }
    let per_call = started.elapsed() / CALLS;
    eprintln!("answer() from cache: {per_call:?} per call");
    assert!(per_call < Duration::from_micros(200), "{per_call:?}");

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

    let probe = PodProbe::new(target("files"), container.pid, None).expect("probe");
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

    // Escapes. `..` is refused by the URL parser outright...
    assert_eq!(ask("path=../../etc/hostname").0, 400);
    assert_eq!(ask("path=/tmp/../../etc/hostname").0, 400);
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
    let probe = PodProbe::new(target("process"), container.pid, None).expect("probe");
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
    let zombie = PodProbe::new(target("zombie"), child.id(), None).expect("probe");
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

/// Not a test: the probe server `cargo xtask bench probes` measures. Serves a pod probe for
/// LIFECYCLE_BENCH_PID's netns on 127.0.0.1 (ephemeral port) until stdin closes; prints
/// `PROBE_SERVER <addr> <pid>` first.
#[test]
#[ignore = "run by cargo xtask bench probes"]
fn bench_probe_server() {
    let pid: u32 = std::env::var("LIFECYCLE_BENCH_PID").expect("LIFECYCLE_BENCH_PID").parse().expect("pid");
    let probe = Arc::new(PodProbe::new(target("bench"), pid, None).expect("probe"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    println!("PROBE_SERVER {addr} {}", std::process::id());
    std::io::stdout().flush().expect("flush");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let refresher = probe.clone();
    let answer: Arc<dyn ProbeAnswer> = probe;
    runtime.spawn(refresher.run_refresher(Duration::from_secs(2), stopped));
    // The listener as the agent runs it: its own thread, blocking I/O.
    let server = BlockingServer::start(listener, answer).expect("serve");
    // The refresher runs on this runtime until stdin closes (the bench's signal to stop).
    let refreshing = std::thread::spawn(move || runtime.block_on(std::future::pending::<()>()));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let _ = stop.send(true);
    server.stop();
    drop(refreshing);
}
