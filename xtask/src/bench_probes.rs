//! `cargo xtask bench probes`: the cost of a liveness check three ways, same run, interleaved.
//!
//! (a) exec, the kubelet's way: `runc exec <id> cat /tmp/healthy` on a real runc container;
//! (b) tcpSocket: connect to a listener and close;
//! (c) the agent's httpGet answer: a fresh HTTP/1.1 connection per probe (the kubelet disables
//!     keep-alive) to a probe server answering a declared `/probe/tcp` from cached state;
//! (d) the same while 50 clients each hold a half-sent request (issue 10: no client may delay
//!     another). Each comes back with another as soon as the server cuts it at its head
//!     deadline. Latency only: the server's CPU then also pays for the stallers.
//!
//! CPU is counted for every process involved: (a) the runc exec tree via getrusage(
//! RUSAGE_CHILDREN) deltas (runc reaps `runc init` and the command, so their time lands there;
//! plain runc has no shim) plus the prober thread; (b) the prober thread plus the app's accept
//! thread; (c) the probe server's whole process (all threads, its periodic /proc refresh
//! included) over the run, plus the prober thread. Thread CPU is schedstat's
//! sum_exec_runtime (ns).
//!
//! The probe server is the ignored test `bench_probe_server` of lifecycle-agent's `probe` test
//! binary (xtask does not link the agent), built in release mode.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{bench::children_cpu_ns, cargo};

/// Runs `count` probes of each kind and prints a markdown table.
pub fn run(count: usize) -> Result<()> {
    for tool in ["/usr/sbin/runc", "/bin/busybox"] {
        if !Path::new(tool).exists() {
            bail!("{tool} is missing: apt-get install runc busybox-static");
        }
    }
    let container = Container::start().context("starting the runc container")?;
    let app = TcpListener::bind("127.0.0.1:0").context("binding the app listener")?;
    let port = app.local_addr()?.port();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tid_tx.send(own_tid());
        for stream in app.incoming() {
            drop(stream);
        }
    });
    let app_tid = tid_rx.recv().context("app thread")??;
    let path = format!("/probe/tcp?port={port}&stall=5s");
    let server = ProbeServer::start(&path).context("starting the probe server")?;
    // Warm up each path once (page cache, runc binary, first connection).
    exec_probe(&container.id)?;
    http_get(&server.addr, &path)?;

    let mut a = Samples::default();
    let mut b = Samples::default();
    let mut c = Samples::default();
    let app_cpu0 = thread_cpu_ns(std::process::id(), app_tid)?;
    let server_cpu0 = process_cpu_ns(server.pid)?;
    for _ in 0..count {
        // (a) exec
        let (children0, me0) = (children_cpu_ns()?, own_cpu_ns()?);
        let started = Instant::now();
        exec_probe(&container.id)?;
        a.latency.push(started.elapsed());
        a.probed_ns += children_cpu_ns()? - children0;
        a.prober_ns += own_cpu_ns()? - me0;
        // (b) tcp connect
        let me0 = own_cpu_ns()?;
        let started = Instant::now();
        drop(TcpStream::connect(("127.0.0.1", port)).context("tcp probe")?);
        b.latency.push(started.elapsed());
        b.prober_ns += own_cpu_ns()? - me0;
        // (c) the agent's answer
        let me0 = own_cpu_ns()?;
        let started = Instant::now();
        let (code, _) = http_get(&server.addr, &path)?;
        c.latency.push(started.elapsed());
        c.prober_ns += own_cpu_ns()? - me0;
        if code != 200 {
            bail!("probe server answered {code} for {path}");
        }
    }
    b.probed_ns += thread_cpu_ns(std::process::id(), app_tid)? - app_cpu0;
    c.probed_ns += process_cpu_ns(server.pid)? - server_cpu0;

    // (d) the agent's answer beside 50 stalled clients, one probe every 2 ms so the run spans
    // several of the server's head deadlines (the stallers are cut and come back meanwhile).
    let mut d = Samples::default();
    let stallers = Stallers::start(&server.addr, STALLERS)?;
    for _ in 0..count {
        let me0 = own_cpu_ns()?;
        let started = Instant::now();
        let (code, _) = http_get(&server.addr, &path)?;
        d.latency.push(started.elapsed());
        d.prober_ns += own_cpu_ns()? - me0;
        if code != 200 {
            bail!("probe server answered {code} for {path} beside the stallers");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let cut = stallers.stop();

    println!("\n{count} probes each, interleaved (runc {}, container {}):\n", runc_version(), container.id);
    println!(
        "| probe | p50 latency | p99 latency | CPU/probe, probed side | CPU/probe, prober side | CPU/probe, total |"
    );
    println!("|---|---|---|---|---|---|");
    let per = |ns: u64| fmt_ns(ns as f64 / count as f64);
    for (name, s) in [
        ("(a) exec: runc exec cat /tmp/healthy", &mut a),
        ("(b) tcpSocket: connect + close", &mut b),
        ("(c) agent httpGet /probe/tcp", &mut c),
    ] {
        let (p50, p99) = (fmt_duration(s.percentile(0.50)), fmt_duration(s.percentile(0.99)));
        println!("| {name} | {p50} | {p99} | {} | {} | {} |", per(s.probed_ns), per(s.prober_ns), per(s.total()));
    }
    let (p50, p99) = (fmt_duration(d.percentile(0.50)), fmt_duration(d.percentile(0.99)));
    println!(
        "| (d) agent httpGet /probe/tcp, {STALLERS} clients holding half-sent requests | {p50} | {p99} | - | {} | - |",
        per(d.prober_ns)
    );
    let ratio = |x: u64, y: u64| x as f64 / y.max(1) as f64;
    println!(
        "\nCPU (a)/(c): {:.0}x total, {:.0}x probed side (target >= 100x); (c) p99 {} (target <= 1 ms)",
        ratio(a.total(), c.total()),
        ratio(a.probed_ns, c.probed_ns),
        fmt_duration(c.percentile(0.99))
    );
    // What an application pays to accept a loopback connection and close it, (b)'s app side:
    // what a probe over TCP costs at least with a plain server, to set (c) against.
    println!(
        "CPU (a)/(b) probed side: {:.0}x (exec against a plain accept + close); (c)/(b) probed side: {:.2}",
        ratio(a.probed_ns, b.probed_ns),
        c.probed_ns as f64 / b.probed_ns.max(1) as f64
    );
    println!(
        "(d) p99 {} beside {STALLERS} stalled clients (target < 10 ms), max {}; {cut} stalled connections cut at the head deadline",
        fmt_duration(d.percentile(0.99)),
        fmt_duration(d.percentile(1.0))
    );
    Ok(())
}

/// Clients that each hold a half-sent request.
const STALLERS: usize = 50;

/// `n` threads, each keeping one connection to `addr` open with part of a request head sent;
/// when the server closes it, a new one replaces it.
struct Stallers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Stallers {
    fn start(addr: &str, n: usize) -> Result<Self> {
        use std::sync::{atomic::Ordering, Arc};
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cut = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads = (0..n)
            .map(|_| {
                let (addr, stop, cut, holding) = (addr.to_owned(), stop.clone(), cut.clone(), holding.clone());
                std::thread::spawn(move || {
                    let mut first = true;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut stream) = TcpStream::connect(&addr) else { continue };
                        let _ = stream.write_all(b"GET /probe/tc");
                        if std::mem::take(&mut first) {
                            holding.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
                        let mut buf = [0u8; 64];
                        loop {
                            match stream.read(&mut buf) {
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                    if stop.load(Ordering::Relaxed) {
                                        return;
                                    }
                                }
                                // Closed (or answered, which a half-sent request never is).
                                _ => break,
                            }
                        }
                        cut.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while holding.load(Ordering::Relaxed) < n {
            if Instant::now() > deadline {
                bail!("only {} of {n} stalled clients connected", holding.load(Ordering::Relaxed));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Self { stop, cut, threads })
    }

    /// Stops every staller; how many of their connections the server cut.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.cut.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Samples {
    latency: Vec<Duration>,
    /// CPU of the probing side (the prober thread: what the kubelet itself spends).
    prober_ns: u64,
    /// CPU of the probed side (runc exec tree / app accept thread / probe server process).
    probed_ns: u64,
}

impl Samples {
    fn total(&self) -> u64 {
        self.prober_ns + self.probed_ns
    }
}

impl Samples {
    fn percentile(&mut self, q: f64) -> Duration {
        self.latency.sort_unstable();
        let index = ((self.latency.len() as f64 - 1.0) * q).round() as usize;
        self.latency.get(index).copied().unwrap_or_default()
    }
}

fn fmt_duration(d: Duration) -> String {
    fmt_ns(d.as_nanos() as f64)
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

fn exec_probe(id: &str) -> Result<()> {
    let out = Command::new("runc").args(["exec", id, "cat", "/tmp/healthy"]).stdin(Stdio::null()).output()?;
    if !out.status.success() || out.stdout != b"ok\n" {
        bail!("runc exec failed: {} {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// One GET on a fresh connection, closed after (what the kubelet's prober does).
fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    // One write, as the kubelet's buffered client sends the request head; `write!` on the bare
    // stream would send every formatted piece as its own segment.
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.30\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response.get(9..12).and_then(|c| c.parse().ok()).context("malformed HTTP response")?;
    Ok((code, response))
}

/// The runc container the exec probes run in; deleted on drop.
struct Container {
    id: String,
    bundle: PathBuf,
}

impl Container {
    fn start() -> Result<Self> {
        let id = format!("lifecycle-bench-probes-{}", std::process::id());
        let bundle = std::env::temp_dir().join(&id);
        let rootfs = bundle.join("rootfs");
        let _ = std::fs::remove_dir_all(&bundle);
        for dir in ["bin", "tmp", "proc", "dev", "sys", "etc"] {
            std::fs::create_dir_all(rootfs.join(dir))?;
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
        for applet in ["sh", "sleep", "cat"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
        }
        std::fs::write(rootfs.join("tmp/healthy"), "ok\n")?;
        let status = Command::new("runc").arg("spec").current_dir(&bundle).status()?;
        if !status.success() {
            bail!("runc spec: {status}");
        }
        // Edit the generated spec with plain text substitutions (xtask has no JSON dependency).
        let config_path = bundle.join("config.json");
        let config = std::fs::read_to_string(&config_path)?
            .replace("\"terminal\": true", "\"terminal\": false")
            .replace("\"sh\"\n", "\"/bin/sleep\", \"100000\"\n")
            .replace("\"linux\": {", &format!("\"linux\": {{\n\t\t\"cgroupsPath\": \"/{id}\","));
        std::fs::write(&config_path, config)?;
        let container = Self { id: id.clone(), bundle: bundle.clone() };
        let status = Command::new("runc")
            .args(["run", "-d", &id])
            .current_dir(&bundle)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()?;
        if !status.success() {
            bail!("runc run -d {id}: {status}");
        }
        Ok(container)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("runc").args(["delete", "-f", &self.id]).status();
        let _ = std::fs::remove_dir_all(&self.bundle);
    }
}

/// The agent's probe server in its own process; stopped (stdin closed, then waited) on drop.
pub(crate) struct ProbeServer {
    child: Child,
    pub(crate) addr: String,
    pub(crate) pid: u32,
}

impl ProbeServer {
    /// Starts the server with `declared` (one probe path) as the pod's declaration.
    pub(crate) fn start(declared: &str) -> Result<Self> {
        eprintln!("xtask: building and starting the probe server (release test binary)");
        let mut child = cargo()
            .args(["test", "--release", "-p", "lifecycle-agent", "--test", "probe", "--", "--ignored", "--exact"])
            .args(["bench_probe_server", "--nocapture"])
            .env("LIFECYCLE_BENCH_PID", std::process::id().to_string())
            .env("LIFECYCLE_BENCH_PROBES", declared)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cargo test")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next() {
            let line = line?;
            if let Some(rest) = line.strip_prefix("PROBE_SERVER ") {
                let (addr, pid) = rest.split_once(' ').context("PROBE_SERVER line")?;
                let pid = pid.trim().parse().context("server pid")?;
                let addr = addr.to_owned();
                // Keep draining: libtest reports on stdout when the server stops.
                std::thread::spawn(move || lines.for_each(drop));
                return Ok(Self { child, addr, pid });
            }
        }
        let status = child.wait()?;
        bail!("the probe server exited before announcing itself: {status}")
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn own_tid() -> Result<u32> {
    let link = std::fs::read_link("/proc/thread-self")?;
    link.file_name().and_then(|t| t.to_str()).and_then(|t| t.parse().ok()).context("tid from /proc/thread-self")
}

fn own_cpu_ns() -> Result<u64> {
    schedstat(Path::new("/proc/thread-self/schedstat"))
}

fn thread_cpu_ns(pid: u32, tid: u32) -> Result<u64> {
    schedstat(&PathBuf::from(format!("/proc/{pid}/task/{tid}/schedstat")))
}

/// Sum over every thread of `pid` (threads that ended are not counted; the server's persist).
pub(crate) fn process_cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        total += schedstat(&entry?.path().join("schedstat")).unwrap_or(0);
    }
    Ok(total)
}

fn schedstat(path: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.split_whitespace().next().and_then(|v| v.parse().ok()).with_context(|| format!("parsing {}", path.display()))
}

fn runc_version() -> String {
    Command::new("runc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim_start_matches("runc version ").to_owned()))
        .unwrap_or_default()
}
