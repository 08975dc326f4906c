//! The processes a benchmark starts and measures (agents, bpftrace, tracers of any kind): started
//! with their output drained, stopped by pid only (SIGINT, then SIGKILL), their CPU read from
//! /proc; and the small helpers around them (a free port, waiting for an HTTP listener).

use std::{
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{START_TIMEOUT, STOP_TIMEOUT};
use crate::shell;

/// A temporary file removed on drop (also when the benchmark fails half-way).
pub(super) struct TempFile(pub(super) PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A process the benchmark started. On drop it is stopped by its pid only: SIGINT, then SIGKILL
/// if it has not exited within `STOP_TIMEOUT`; its output-draining threads are joined.
pub(super) struct Tracer {
    child: Child,
    what: String,
    stderr: Arc<Mutex<String>>,
    threads: Vec<JoinHandle<()>>,
}

impl Tracer {
    pub(super) fn spawn(what: impl Into<String>, command: &mut Command) -> Result<Self> {
        let what = what.into();
        let mut child = command
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {what}: {command:?}"))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut threads = Vec::new();
        if let Some(pipe) = child.stderr.take() {
            let sink = Arc::clone(&stderr);
            threads.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut text) = sink.lock() {
                        // Keep the tail only: enough to explain a failure.
                        if text.len() > 8192 {
                            let cut = text.len() - 4096;
                            let cut = (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                            text.drain(..cut);
                        }
                        text.push_str(&line);
                        text.push('\n');
                    }
                }
            }));
        }
        Ok(Self { child, what, stderr, threads })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has exited already, with what it printed on stderr.
    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            // Give the stderr thread a moment to collect the last lines.
            std::thread::sleep(Duration::from_millis(100));
            bail!("{} exited early ({status}); stderr:\n{}", self.what, self.stderr_tail());
        }
        Ok(())
    }

    pub(super) fn stderr_tail(&self) -> String {
        self.stderr.lock().map(|text| text.clone()).unwrap_or_default()
    }

    /// Drains stdout in a thread, handing each line (with the instant it was read) to `lines`.
    pub(super) fn forward_stdout(&mut self, lines: mpsc::Sender<(Instant, String)>) -> Result<()> {
        let pipe = self.child.stdout.take().with_context(|| format!("{} stdout is not piped", self.what))?;
        self.threads.push(std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = String::new();
            let mut forwarding = true;
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        // Once nobody listens, keep draining so the process never blocks on a
                        // full pipe (bpftrace prints its maps on exit).
                        if forwarding && lines.send((Instant::now(), line.trim_end().to_owned())).is_err() {
                            forwarding = false;
                        }
                    }
                }
            }
        }));
        Ok(())
    }

    /// utime + stime of the whole process (all threads, live and exited) in clock ticks.
    pub(super) fn cpu_ticks(&self) -> Result<u64> {
        cpu_ticks(self.pid())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let pid = self.child.id().to_string();
            let _ = Command::new("kill").args(["-INT", &pid]).stderr(Stdio::null()).status();
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                eprintln!("xtask: {} (pid {pid}) ignored SIGINT for {STOP_TIMEOUT:?}; killing it", self.what);
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// utime + stime (fields 14 and 15 of `/proc/<pid>/stat`) in clock ticks.
pub(super) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// CPU (user + system) of this process's children that have been waited for, in ns: around one
/// workload, the workload's own CPU including everything the kernel programs charge to it.
/// Unlike wall time it barely moves when other jobs share the machine.
pub(crate) fn children_cpu_ns() -> Result<u64> {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the valid rusage we pass.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        bail!("getrusage: {}", std::io::Error::last_os_error());
    }
    let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    Ok(ns(usage.ru_utime) + ns(usage.ru_stime))
}

pub(super) fn clock_ticks_per_second() -> f64 {
    shell::capture(Command::new("getconf").arg("CLK_TCK"))
        .ok()
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|&hz| hz > 0.0)
        .unwrap_or(100.0)
}

/// A free loopback port for the agent's listener (a fixed one could answer for another agent).
pub(super) fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Waits until the agent answers /healthz (its programs are attached before it listens).
pub(super) fn wait_http(tracer: &mut Tracer, addr: &str) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        tracer.check_alive()?;
        if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
            use std::io::Write as _;
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
            let mut body = String::new();
            let _ = stream.read_to_string(&mut body);
            if body.starts_with("HTTP/1.") && body.contains(" 200 ") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not answer on {addr} within {START_TIMEOUT:?}; stderr:\n{}", tracer.what, tracer.stderr_tail())
}

/// Waits for load producers that each print one line (a count or a rate) before exiting; their
/// lines, trimmed. Fails if one of them fails.
pub(super) fn producer_lines(children: Vec<Child>) -> Result<Vec<String>> {
    let mut lines = Vec::with_capacity(children.len());
    for mut child in children {
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        if !child.wait()?.success() {
            bail!("a producer failed");
        }
        lines.push(line.trim().to_owned());
    }
    Ok(lines)
}

/// `lifecycle-agent run --listen <addr>` as the benches start it: warnings only, stdout dropped,
/// and no Kubernetes credentials, so the API client stays idle and only the node is measured.
pub(super) fn plain_host_agent(binary: &Path, addr: &str) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["run", "--listen", addr])
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdout(Stdio::null());
    command
}
