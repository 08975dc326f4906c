//! Benchmarks. Each runs its conditions interleaved in one run (this machine is shared and noisy)
//! and reports medians with ratios against the baseline measured in that same run.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, packages, shell, workspace_root};

#[derive(Clone, Copy, Debug, clap::Subcommand)]
pub enum Bench {
    /// Cost of the agent on fork/exec/exit, signal and accept loops, against no tracing and
    /// against an equivalent bpftrace script.
    Overhead {
        /// Interleaved rounds (each runs every condition once).
        #[arg(long, default_value_t = 7)]
        rounds: usize,
    },
}

pub fn run(which: Bench) -> Result<()> {
    match which {
        Bench::Overhead { rounds } => overhead(rounds),
    }
}

/// A workload: a command whose wall time is measured.
struct Workload {
    name: &'static str,
    program: &'static str,
    args: &'static [&'static str],
}

const PYTHON: &str = "/usr/bin/python3";

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "exit loop (2000 x fork/exec/exit /bin/true)",
        program: "/bin/sh",
        args: &["-c", "i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done"],
    },
    Workload {
        name: "signal loop (200000 x SIGUSR1 to self)",
        program: PYTHON,
        args: &[
            "-c",
            "import os,signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\npid=os.getpid()\nfor _ in range(200000): os.kill(pid, signal.SIGUSR1)",
        ],
    },
    Workload {
        name: "accept loop (20000 x connect/accept/close on loopback)",
        program: PYTHON,
        args: &[
            "-c",
            "import socket\nl=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(128)\naddr=l.getsockname()\nfor _ in range(20000):\n  c=socket.create_connection(addr); s,_=l.accept(); s.close(); c.close()",
        ],
    },
];

/// The bpftrace peer: counts the same tracepoints per cgroup, nothing more.
const BPFTRACE_SCRIPT: &str = r#"
tracepoint:sched:sched_process_exec { @exec[cgroup] = count(); }
tracepoint:sched:sched_process_exit { @exit[cgroup] = count(); }
tracepoint:signal:signal_generate { @signal[cgroup] = count(); }
tracepoint:oom:mark_victim { @oom[cgroup] = count(); }
tracepoint:sock:inet_sock_set_state { @sock[cgroup] = count(); }
tracepoint:syscalls:sys_exit_accept4, tracepoint:syscalls:sys_exit_accept { @accept[cgroup] = count(); }
tracepoint:cgroup:cgroup_mkdir, tracepoint:cgroup:cgroup_rmdir { @cgroup[cgroup] = count(); }
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Baseline,
    Agent,
    Bpftrace,
}

impl Condition {
    fn name(self) -> &'static str {
        match self {
            Condition::Baseline => "no tracing",
            Condition::Agent => "lifecycle-agent",
            Condition::Bpftrace => "bpftrace",
        }
    }
}

/// A running tracer, stopped (by pid, SIGINT then wait) on drop.
struct Tracer(Option<Child>);

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

fn start(condition: Condition, agent: &std::path::Path, script: &std::path::Path) -> Result<Tracer> {
    match condition {
        Condition::Baseline => Ok(Tracer(None)),
        Condition::Agent => {
            let port = "127.0.0.1:19890";
            let child = Command::new(agent)
                .args(["run", "--listen", port])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .context("starting the agent")?;
            let tracer = Tracer(Some(child));
            wait_http(port)?;
            Ok(tracer)
        }
        Condition::Bpftrace => {
            let mut child = Command::new("bpftrace")
                .arg(script)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting bpftrace")?;
            let stdout = child.stdout.take().context("bpftrace stdout")?;
            let tracer = Tracer(Some(child));
            // bpftrace prints "Attaching N probes..." once everything is attached.
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if !line.starts_with("Attaching") {
                bail!("bpftrace did not attach: {line:?}");
            }
            Ok(tracer)
        }
    }
}

/// Waits until the agent answers /healthz (its programs are attached before it listens).
fn wait_http(addr: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(addr) {
            use std::io::{Read as _, Write as _};
            let _ = stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
            let mut body = String::new();
            let _ = stream.read_to_string(&mut body);
            if body.contains("200 OK") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("agent did not answer on {addr} within 30 s")
}

fn time(workload: &Workload) -> Result<Duration> {
    let started = Instant::now();
    shell::run(Command::new(workload.program).args(workload.args).stdout(Stdio::null()))?;
    Ok(started.elapsed())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 0 { (values[mid - 1] + values[mid]) / 2.0 } else { values[mid] }
}

fn overhead(rounds: usize) -> Result<()> {
    packages::ensure(packages::BENCH)?;
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let agent = workspace_root().join("target/release/lifecycle-agent");
    let script = std::env::temp_dir().join(format!("lifecycle-bench-{}.bt", std::process::id()));
    std::fs::write(&script, BPFTRACE_SCRIPT)?;
    let conditions = [Condition::Baseline, Condition::Agent, Condition::Bpftrace];
    // samples[condition][workload]
    let mut samples = vec![vec![Vec::new(); WORKLOADS.len()]; conditions.len()];
    for round in 0..rounds {
        // Rotate the order each round so drift on the machine does not favour one condition.
        for offset in 0..conditions.len() {
            let index = (round + offset) % conditions.len();
            let condition = conditions[index];
            let tracer = start(condition, &agent, &script)?;
            for (w, workload) in WORKLOADS.iter().enumerate() {
                let elapsed = time(workload)?;
                samples[index][w].push(elapsed.as_secs_f64());
            }
            drop(tracer);
        }
        eprintln!("xtask: round {}/{rounds} done", round + 1);
    }
    let _ = std::fs::remove_file(&script);
    println!("\n| workload | {} | {} | {} | agent / none | bpftrace / none |", conditions[0].name(), conditions[1].name(), conditions[2].name());
    println!("|---|---|---|---|---|---|");
    for (w, workload) in WORKLOADS.iter().enumerate() {
        let medians: Vec<f64> = (0..conditions.len()).map(|c| median(&mut samples[c][w].clone())).collect();
        println!(
            "| {} | {:.3} s | {:.3} s | {:.3} s | {:.3} | {:.3} |",
            workload.name,
            medians[0],
            medians[1],
            medians[2],
            medians[1] / medians[0],
            medians[2] / medians[0]
        );
    }
    println!("\n{rounds} interleaved rounds, medians; command: xtask/x.sh bench overhead --rounds {rounds}");
    Ok(())
}
