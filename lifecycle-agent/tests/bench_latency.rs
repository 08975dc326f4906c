//! Benchmark (not a test; `#[ignore]`d, run by `xtask/x.sh bench latency`): from a container
//! process's exit, as the kernel timestamps it, to the state change visible in the agent's
//! `/api/v1/containers` — and, in the same run, to the runtime's own notice of that exit in CRI
//! ContainerStatus. Both are measured against the same kernel timestamp. An answer counts as
//! read once its `Content-Length` of body has arrived.
//!
//! Exits take turns between three followers, one per exit: CRI `ContainerStatus` polled, the
//! agent's API polled, and one API request at a time that waits for the container to change
//! (`wait_seconds` with the last answer's `resource_version`). An agent that does not serve
//! waits (a baseline from before them) takes turns between the first two. Until 2026-11-27 the
//! CRI poller ran beside the agent's client on every exit: its calls kept containerd busy on one
//! of this machine's two CPUs in the very window measured (BENCHMARKS.md).
//!
//! Each poller pauses 200 µs between polls (`LIFECYCLE_BENCH_POLL_US`): polling flat out, and
//! the agent or containerd answering, kept both CPUs busy, so the tail measured the poller's own
//! load more than the agent. The pause adds at most 0.2 ms to a polled exit.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    time::{Duration, Instant},
};

use k8s_cri::v1 as cri;
use lifecycle_testkit::containerd::{start_or_skip, Containerd, KubeletAnnotations};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");

/// The agent measured: this tree's, or the one `xtask/x.sh bench ... --baseline-agent` names.
fn agent() -> String {
    std::env::var("LIFECYCLE_BENCH_AGENT").unwrap_or_else(|_| AGENT.to_owned())
}

fn boot_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The body of `GET path`, read up to its `Content-Length`: a client has the answer once its
/// bytes are there, not when the agent's close of the connection arrives after them.
fn get(addr: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let read = stream.read(&mut chunk).ok()?;
        response.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&response);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
            });
            if read == 0 || length.is_some_and(|length| body.len() >= length) {
                return Some(body.to_owned());
            }
        }
        if read == 0 {
            return None;
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is the agent we started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "benchmark: run with xtask/x.sh bench latency"]
fn exit_to_visible_state_latency() {
    let exits: usize = std::env::var("LIFECYCLE_BENCH_EXITS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let Some(mut h) = start_or_skip("exit_to_visible_state_latency") else { return };
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let addr = format!("127.0.0.1:{port}");
    let socket = h.socket().to_string_lossy().into_owned();
    let _agent = KillOnDrop(
        Command::new(agent())
            .args(["run", "--listen", &addr, "--cri-socket", &socket, "--handoff-dir", "none"])
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("agent"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "agent not up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pause = Duration::from_micros(
        std::env::var("LIFECYCLE_BENCH_POLL_US").ok().and_then(|v| v.parse().ok()).unwrap_or(200),
    );
    // An agent from before waits were served refuses the parameters; it is measured polling only.
    let waits_served = get(&addr, "/api/v1/containers?container_id=none&wait_seconds=1&resource_version=0-0")
        .and_then(|body| serde_json::from_str::<Value>(&body).ok())
        .is_some_and(|answer| answer.get("error").is_none());
    let pod = h.new_pod("latency").expect("pod");
    let (mut polled_ms, mut waited_ms, mut runtime_ms) = (Vec::new(), Vec::new(), Vec::new());
    // For the waiting exits: from the exit to the answer's own `now` (made in the agent).
    let mut answered_ms = Vec::new();
    // For the waiting exits: how many waits ended before the one that showed the exit (each a
    // round trip the client made while the container ran).
    let mut early_wakes = Vec::new();
    for attempt in 0..exits {
        // The container waits on a fifo-less sleep so the poller is already running at exit.
        let annotations = KubeletAnnotations { restart_count: attempt as u32, ..KubeletAnnotations::default() };
        let id =
            h.run_container(&pod, "blink", &["sh", "-c", "sleep 0.2; exit 3"], &annotations, None).expect("container");
        // Exits take turns between the followers, so each sees the same conditions on the host,
        // and only one follows each exit: the CRI poller's calls kept containerd and a CPU busy
        // in the very window measured.
        let follower = match (waits_served, attempt % if waits_served { 3 } else { 2 }) {
            (_, 0) => Follower::Runtime,
            (_, 1) => Follower::Polling,
            _ => Follower::Waiting,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let ms = |later: u64, earlier: u64| later.saturating_sub(earlier) as f64 / 1e6;
        match follower {
            Follower::Runtime => {
                let seen = runtime_sees_exit(&h, &id, pause, deadline).expect("the runtime saw the exit");
                // The exit's kernel time, from the agent once the runtime has it (not timed).
                let (_, finished, _, _) =
                    agent_sees_exit(&addr, &id, false, pause, deadline).expect("the agent saw the exit");
                runtime_ms.push(ms(seen, finished));
            }
            Follower::Polling | Follower::Waiting => {
                let waiting = follower == Follower::Waiting;
                let (agent_seen, finished, answered, waits) =
                    agent_sees_exit(&addr, &id, waiting, pause, deadline).expect("the agent saw the exit");
                if waiting {
                    answered_ms.push(ms(answered, finished));
                    early_wakes.push(waits.saturating_sub(1));
                    waited_ms.push(ms(agent_seen, finished));
                } else {
                    polled_ms.push(ms(agent_seen, finished));
                }
            }
        }
        h.remove_container(&id).expect("remove");
    }
    for samples in [&mut polled_ms, &mut waited_ms, &mut answered_ms, &mut runtime_ms] {
        samples.sort_by(f64::total_cmp);
    }
    let internal = get(&addr, "/metrics").unwrap_or_default();
    println!(
        "\npolled every {} µs (the agent's poller and the CRI side); exits take turns between the CRI poller, polling and waiting, one follower each\n",
        pause.as_micros()
    );
    println!("| path | exits | p50 | p90 | p99 | max | p99 vs CRI |");
    println!("|---|---|---|---|---|---|---|");
    let runtime_p99 = percentile(&runtime_ms, 0.99);
    for (name, v) in [
        ("kernel exit -> agent, polling /api/v1/containers?container_id=", &polled_ms),
        ("kernel exit -> agent, one request waiting for the change (&wait_seconds=)", &waited_ms),
        ("  of which kernel exit -> the answer made (its `now`)", &answered_ms),
        ("kernel exit -> CRI ContainerStatus (containerd)", &runtime_ms),
    ] {
        if v.is_empty() {
            println!("| {name} | 0 | - | - | - | - | - (not served by this agent) |");
            continue;
        }
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.3} |",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.9),
            percentile(v, 0.99),
            v[v.len() - 1],
            percentile(v, 0.99) / runtime_p99
        );
    }
    if !early_wakes.is_empty() {
        let woken = early_wakes.iter().filter(|&&n| n > 0).count();
        println!(
            "\nwaits answered before the exit, while the container ran: {} in all, for {woken} of {} waiting exits",
            early_wakes.iter().sum::<usize>(),
            early_wakes.len()
        );
    }
    let histogram: Vec<&str> = internal.lines().filter(|l| l.starts_with("lifecycle_event_to_state_seconds")).collect();
    println!("\nagent's own lifecycle_event_to_state_seconds:\n{}", histogram.join("\n"));
    for (way, v) in [("polling", &polled_ms), ("waiting", &waited_ms)] {
        if let Some(p99) = (!v.is_empty()).then(|| percentile(v, 0.99)) {
            println!("target p99 <= 2 ms, {way}: {} (p99 {p99:.2} ms)", if p99 <= 2.0 { "met" } else { "NOT met" });
        }
    }
}

/// When the agent's API first showed this container's exit (boot ns), the exit's own time and
/// the time the agent made that answer (its `now`) and how many waiting requests were answered,
/// asking as a client following one container does: polling every `pause`, or (`waiting`) one
/// request at a time that waits for the change from the version the last answer gave.
/// How one exit is followed: through the runtime's CRI, or through the agent's API.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Follower {
    /// CRI `ContainerStatus` polled every `pause`.
    Runtime,
    /// `/api/v1/containers?container_id=` polled every `pause`.
    Polling,
    /// One request at a time waiting for the change.
    Waiting,
}

/// When the runtime's `ContainerStatus` first showed the container exited (boot ns), polled
/// every `pause`.
fn runtime_sees_exit(h: &Containerd, id: &str, pause: Duration, deadline: Instant) -> Option<u64> {
    while Instant::now() < deadline {
        std::thread::sleep(pause);
        let status = h.container_status(id).expect("status");
        if status.state == cri::ContainerState::ContainerExited as i32 {
            return Some(boot_ns());
        }
    }
    None
}

fn agent_sees_exit(
    addr: &str,
    id: &str,
    waiting: bool,
    pause: Duration,
    deadline: Instant,
) -> Option<(u64, u64, u64, usize)> {
    let mut version: Option<String> = None;
    let mut waits = 0;
    while Instant::now() < deadline {
        let path = match &version {
            Some(version) => format!("/api/v1/containers?container_id={id}&wait_seconds=5&resource_version={version}"),
            None => {
                std::thread::sleep(pause);
                format!("/api/v1/containers?container_id={id}")
            }
        };
        let Some(body) = get(addr, &path) else { continue };
        waits += usize::from(version.is_some());
        let now = boot_ns();
        let value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let c = value["containers"].as_array().and_then(|all| all.iter().find(|c| c["container_id"] == id).cloned());
        // This instance's exit: Terminated, or CrashLoopBackOff whose last state is it (the
        // previous instance's termination also sits in last_state while the new one runs, so
        // Running with a terminated last_state does not count).
        let exited = c.as_ref().and_then(|c| match c["state"]["state"].as_str() {
            Some("terminated") => c["state"]["finished_at_boot_ns"].as_u64(),
            Some("waiting") if c["state"]["reason"] == "CrashLoopBackOff" => {
                c["last_state"]["finished_at_boot_ns"].as_u64()
            }
            _ => None,
        });
        if let Some(finished) = exited {
            return Some((now, finished, value["now"].as_u64().unwrap_or(now), waits));
        }
        if waiting {
            version = value["resource_version"].as_str().map(str::to_owned);
        }
    }
    None
}
