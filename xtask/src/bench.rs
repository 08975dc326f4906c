//! Benchmarks. Each runs its conditions interleaved in one run (this machine is shared and noisy)
//! and reports medians with ratios against the baseline measured in that same run.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, packages, shell, workspace_root};

#[path = "bench_delivery.rs"]
mod delivery;
#[path = "bench_fresh.rs"]
mod fresh;
#[path = "bench_load.rs"]
mod load;
#[path = "bench_memory.rs"]
mod memory;
#[path = "bench_rate.rs"]
mod rate;
#[path = "bench_ring.rs"]
mod ring;
#[path = "bench_tracer.rs"]
mod tracer;

use delivery::latency;
pub(crate) use tracer::children_cpu_ns;
use tracer::{clock_ticks_per_second, free_port, plain_host_agent, producer_lines, wait_http, TempFile, Tracer};

#[derive(Clone, Debug, clap::Subcommand)]
pub enum Bench {
    /// Cost of the agent on fork/exec/exit, signal and accept loops, against no tracing and
    /// against an equivalent bpftrace script. Also the tracers' own CPU time, and the agent's
    /// event delivery latency on a quiet node for each poll interval tried.
    Overhead {
        /// Interleaved rounds (each runs every condition once). `--rounds 1` is a smoke run.
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// Agent poll intervals to compare, comma-separated (e.g. 5,20,50); each is a condition
        /// of its own (`lifecycle-agent run --poll-ms N`, every other flag at its default).
        #[arg(long, value_delimiter = ',', default_values_t = [50u64])]
        poll_ms: Vec<u64>,
        /// Delivery-latency samples per poll interval (0 skips the latency phase).
        #[arg(long, default_value_t = 40)]
        latency_samples: usize,
        /// Workloads to run, comma-separated: exit, signal, accept (default: all three).
        #[arg(long, value_delimiter = ',', value_parser = ["exit", "signal", "accept"])]
        workloads: Vec<String>,
        /// Another lifecycle-agent binary (e.g. an older commit's build), run as a condition of its
        /// own beside this tree's at each poll interval: before/after in the same run.
        #[arg(long)]
        baseline_agent: Option<PathBuf>,
    },
    /// From a container's exit (kernel timestamp) to the state change in /api/v1/containers,
    /// beside the runtime's own notice (CRI ContainerStatus), on a real containerd.
    Latency {
        /// Container exits to measure.
        #[arg(long, default_value_t = 200)]
        exits: usize,
    },
    /// The cost of a liveness check: exec (runc exec), tcpSocket connect, the agent's httpGet;
    /// and the httpGet's latency while 50 clients hold half-sent requests.
    Probes {
        /// Probes of each kind.
        #[arg(long, default_value_t = 500)]
        count: usize,
    },
    /// The agent's resident memory idle and while it tracks N units (real cgroups, each with a
    /// process), without Kubernetes credentials; `--baseline` measures another agent binary (e.g.
    /// an older commit's build) in the same run.
    Memory {
        /// Container cgroups to create, one process each.
        #[arg(long, default_value_t = 1000)]
        units: usize,
        /// Rounds (each measures every agent once, alternating the order).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Another lifecycle-agent binary to measure beside this tree's release build.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// Records lost by ring buffers of several sizes under a storm of recorded signals (what
    /// `--ring-bytes` is sized from).
    Ring {
        /// Ring sizes in bytes, comma-separated (powers of two, multiples of the page size).
        #[arg(long, value_delimiter = ',', default_values_t = [524_288u32, 1_048_576, 2_097_152, 4_194_304])]
        sizes: Vec<u32>,
        /// Processes sending signals at once (more than the CPUs: the agent must compete).
        #[arg(long, default_value_t = 4)]
        producers: usize,
        /// Recorded signals each producer sends.
        #[arg(long, default_value_t = 300_000)]
        signals: usize,
        /// Rounds (each tries every size once, rotating the order).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The record rate the agent drains without loss (recorded signals from processes of one
    /// cgroup, paced at each rate for a while), and beyond it that every record sent was either
    /// received or counted lost.
    Rate {
        /// Records per second to try, comma-separated (0: as fast as the producers can).
        #[arg(long, value_delimiter = ',', default_values_t = [250_000u64, 500_000, 1_000_000, 0])]
        rates: Vec<u64>,
        /// Seconds each rate is held.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Processes sending, together making the rate.
        #[arg(long, default_value_t = 1)]
        producers: usize,
        /// Extra flags for `lifecycle-agent run`, e.g. `--agent-flag=--ring-bytes=65536` to see
        /// loss on purpose. Repeatable.
        #[arg(long = "agent-flag", allow_hyphen_values = true)]
        agent_flags: Vec<String>,
    },
    /// One producer of `bench rate` (run by it, not by hand).
    #[command(hide = true)]
    SignalProducer {
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: u64,
    },
    /// wrk (Debian's) on the agent's /healthz (the baseline) and /metrics while it tracks N
    /// units, and on a declared probe: requests/s, p50/p99, errors, the server's CPU and RSS.
    Load {
        /// Seconds per wrk run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Container cgroups to track, one process each.
        #[arg(long, default_value_t = 1000)]
        units: usize,
        /// wrk's open connections.
        #[arg(long, default_value_t = 50)]
        connections: usize,
    },
    /// A thousand real units on this machine: 900 host cgroups and 100 containers through
    /// containerd + runc; the agent's CPU, RSS and map memory against its idle baseline, records
    /// lost, exit -> state latency and scrapes under a restart churn, and a 100-container stop
    /// storm whose every verdict must be right.
    Scale,
    /// The README's `xtask/x.sh run` on a fresh machine: a clone with empty RUSTUP_HOME and
    /// CARGO_HOME, timed until /metrics answers, with when each step began.
    FreshRun {
        /// Another commit to time first in the same run (the ratio's baseline).
        #[arg(long)]
        baseline: Option<String>,
    },
    /// /metrics of an agent tracking many containers: scrape time and body size.
    Scrape {
        #[arg(long, default_value_t = 1000)]
        containers: usize,
        #[arg(long, default_value_t = 200)]
        scrapes: usize,
    },
}

pub fn run(which: Bench) -> Result<()> {
    match which {
        Bench::Overhead { rounds, poll_ms, latency_samples, workloads, baseline_agent } => {
            let workloads: Vec<&Workload> =
                WORKLOADS.iter().filter(|w| workloads.is_empty() || workloads.iter().any(|k| k == w.key)).collect();
            overhead(rounds, &poll_ms, latency_samples, &workloads, baseline_agent.as_deref())
        }
        Bench::Latency { exits } => {
            packages::ensure(packages::TEST)?;
            ignored_test("bench_latency", &[("LIFECYCLE_BENCH_EXITS", exits.to_string())])
        }
        Bench::Probes { count } => {
            packages::ensure(packages::TEST)?;
            crate::bench_probes::run(count)
        }
        Bench::Memory { units, rounds, baseline } => memory::run(units, rounds, baseline),
        Bench::Load { seconds, units, connections } => {
            packages::ensure(packages::TEST)?;
            load::run(seconds, units, connections)
        }
        Bench::Ring { sizes, producers, signals, rounds } => ring::run(&sizes, producers, signals, rounds),
        Bench::Rate { rates, seconds, producers, agent_flags } => rate::run(&rates, seconds, producers, &agent_flags),
        Bench::SignalProducer { rate, seconds } => rate::produce(rate, seconds),
        Bench::Scale => {
            packages::ensure(packages::TEST)?;
            ignored_test("bench_scale", &[])
        }
        Bench::FreshRun { baseline } => fresh::run(baseline.as_deref()),
        Bench::Scrape { containers, scrapes } => ignored_test(
            "bench_scrape",
            &[("LIFECYCLE_BENCH_CONTAINERS", containers.to_string()), ("LIFECYCLE_BENCH_SCRAPES", scrapes.to_string())],
        ),
    }
}

/// Runs a benchmark kept as an ignored test of the agent crate (it reuses the test harnesses),
/// in release mode, printing its table.
fn ignored_test(name: &str, env: &[(&str, String)]) -> Result<()> {
    let mut command = cargo();
    command.args(["test", "--release", "-p", "lifecycle-agent", "--test", name, "--", "--ignored", "--nocapture"]);
    for (key, value) in env {
        command.env(key, value);
    }
    shell::run(&mut command)
}

/// A workload: a command whose wall time is measured.
struct Workload {
    /// What `--workloads` calls it.
    key: &'static str,
    name: &'static str,
    program: &'static str,
    args: &'static [&'static str],
}

const PYTHON: &str = "/usr/bin/python3";

const WORKLOADS: &[Workload] = &[
    Workload {
        key: "exit",
        name: "exit loop (2000 x fork/exec/exit /bin/true)",
        program: "/bin/sh",
        args: &["-c", "i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done"],
    },
    Workload {
        key: "signal",
        name: "signal loop (200000 x SIGUSR1 to self)",
        program: PYTHON,
        args: &[
            "-c",
            "import os,signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\npid=os.getpid()\nfor _ in range(200000): os.kill(pid, signal.SIGUSR1)",
        ],
    },
    Workload {
        key: "accept",
        name: "accept loop (20000 x connect/accept/close on loopback)",
        program: PYTHON,
        args: &[
            "-c",
            "import socket\nl=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(128)\naddr=l.getsockname()\nfor _ in range(20000):\n  c=socket.create_connection(addr); s,_=l.accept(); s.close(); c.close()",
        ],
    },
];

/// The bpftrace peer: counts the same tracepoints per cgroup, nothing more. BEGIN fires only
/// once every probe is attached (bpftrace 0.17 prints "Attaching N probes..." *before* it
/// attaches), so its line is the readiness signal.
const BPFTRACE_SCRIPT: &str = r#"
tracepoint:sched:sched_process_exec { @exec[cgroup] = count(); }
tracepoint:sched:sched_process_exit { @exit[cgroup] = count(); }
tracepoint:signal:signal_generate { @signal[cgroup] = count(); }
tracepoint:oom:mark_victim { @oom[cgroup] = count(); }
tracepoint:sock:inet_sock_set_state { @sock[cgroup] = count(); }
tracepoint:syscalls:sys_exit_accept4, tracepoint:syscalls:sys_exit_accept { @accept[cgroup] = count(); }
tracepoint:cgroup:cgroup_mkdir, tracepoint:cgroup:cgroup_rmdir { @cgroup[cgroup] = count(); }
BEGIN { printf("lifecycle-bench-ready\n"); }
"#;
const BPFTRACE_READY: &str = "lifecycle-bench-ready";

/// How long a tracer gets to become ready, and to exit after SIGINT before it is killed.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to wait for another job's agent or bpftrace to end before running a condition.
const FOREIGN_WAIT: Duration = Duration::from_secs(120);
/// Attempts at one condition run before one with foreign tracers around is kept anyway.
const MAX_ATTEMPTS: usize = 10;
/// Quiet time after a tracer is ready (and for the baseline), so start-up work is not measured.
const SETTLE: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Baseline,
    /// This tree's agent, or with `baseline` the `--baseline-agent` binary.
    Agent {
        poll_ms: u64,
        baseline: bool,
    },
    Bpftrace,
}

impl Condition {
    fn name(self) -> String {
        match self {
            Condition::Baseline => "no tracing".into(),
            Condition::Agent { poll_ms, baseline: false } => format!("lifecycle-agent --poll-ms {poll_ms}"),
            Condition::Agent { poll_ms, baseline: true } => format!("baseline agent --poll-ms {poll_ms}"),
            Condition::Bpftrace => "bpftrace".into(),
        }
    }
}

/// The agent binaries a run compares.
struct Agents<'a> {
    this: &'a Path,
    baseline: Option<&'a Path>,
}

impl Agents<'_> {
    fn binary(&self, baseline: bool) -> Result<&Path> {
        match (baseline, self.baseline) {
            (false, _) => Ok(self.this),
            (true, Some(path)) => Ok(path),
            (true, None) => bail!("no --baseline-agent given"),
        }
    }
}

fn start(condition: Condition, agents: &Agents<'_>, script: &Path) -> Result<Option<Tracer>> {
    match condition {
        Condition::Baseline => Ok(None),
        Condition::Agent { poll_ms, baseline } => {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut tracer = Tracer::spawn(
                condition.name(),
                Command::new(agents.binary(baseline)?)
                    .args(["run", "--listen", &addr, "--poll-ms", &poll_ms.to_string()])
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null()),
            )?;
            wait_http(&mut tracer, &addr)?;
            Ok(Some(tracer))
        }
        Condition::Bpftrace => {
            let mut tracer = Tracer::spawn("bpftrace", Command::new("bpftrace").arg(script).stdout(Stdio::piped()))?;
            let (tx, rx) = mpsc::channel();
            tracer.forward_stdout(tx)?;
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok((_, line)) if line.contains(BPFTRACE_READY) => break,
                    Ok(_) => {}
                    Err(mpsc::RecvTimeoutError::Timeout) => tracer.check_alive()?,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        tracer.check_alive()?;
                        bail!("bpftrace closed its stdout without attaching; stderr:\n{}", tracer.stderr_tail());
                    }
                }
                if Instant::now() > deadline {
                    bail!("bpftrace did not attach within {START_TIMEOUT:?}; stderr:\n{}", tracer.stderr_tail());
                }
            }
            Ok(Some(tracer))
        }
    }
}

/// Runs a workload; returns its wall time and its CPU time (the whole process tree), in s.
fn time(workload: &Workload) -> Result<(f64, f64)> {
    let cpu_before = children_cpu_ns()?;
    let started = Instant::now();
    shell::run(Command::new(workload.program).args(workload.args).stdin(Stdio::null()).stdout(Stdio::null()))?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = children_cpu_ns()?.saturating_sub(cpu_before) as f64 / 1e9;
    Ok((wall, cpu))
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Tracers this benchmark did not start (another agent or bpftrace on the shared machine): their
/// kernel programs run on every workload event, whatever the condition. Returns their pids.
fn foreign_tracers(own: Option<u32>) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| Some(pid) != own)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| matches!(comm.trim(), "lifecycle-agent" | "bpftrace"))
        })
        .collect()
}

/// Waits (up to `limit`) until no foreign tracer runs; the round is checked again anyway.
fn wait_until_no_foreign_tracers(limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut told = false;
    loop {
        let foreign = foreign_tracers(None);
        if foreign.is_empty() || Instant::now() > deadline {
            return;
        }
        if !told {
            eprintln!("xtask: waiting for tracers this benchmark did not start to end: pids {foreign:?}");
            told = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// bpftrace's tracepoints need tracefs; the agent mounts it itself, bpftrace does not.
fn ensure_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(());
    }
    eprintln!("xtask: mounting tracefs on /sys/kernel/tracing (bpftrace needs it)");
    shell::run(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]))
}

/// Samples for one condition and workload, one per round.
#[derive(Clone, Default)]
struct Samples {
    wall_s: Vec<f64>,
    /// CPU of the workload's process tree, in s.
    cpu_s: Vec<f64>,
    /// Tracer CPU (utime + stime) spent while the workload ran, in ms (whole clock ticks).
    tracer_cpu_ms: Vec<f64>,
}

/// One condition: start its tracer, run every workload once, stop it. Also says whether no
/// foreign tracer was seen around any workload.
fn run_condition(
    condition: Condition,
    workloads: &[&Workload],
    agents: &Agents<'_>,
    script: &Path,
    hz: f64,
) -> Result<(Vec<Samples>, bool)> {
    let mut run = vec![Samples::default(); workloads.len()];
    let tracer = start(condition, agents, script)?;
    std::thread::sleep(SETTLE);
    let own = tracer.as_ref().map(Tracer::pid);
    let mut clean = true;
    for (slot, workload) in run.iter_mut().zip(workloads) {
        clean &= foreign_tracers(own).is_empty();
        let cpu_before = tracer.as_ref().map(Tracer::cpu_ticks).transpose()?;
        let (wall, cpu) = time(workload).with_context(|| format!("{} under {}", workload.name, condition.name()))?;
        let cpu_after = tracer.as_ref().map(Tracer::cpu_ticks).transpose()?;
        clean &= foreign_tracers(own).is_empty();
        slot.wall_s.push(wall);
        slot.cpu_s.push(cpu);
        if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
            slot.tracer_cpu_ms.push(after.saturating_sub(before) as f64 * 1000.0 / hz);
        }
    }
    drop(tracer);
    Ok((run, clean))
}

fn overhead(
    rounds: usize,
    poll_ms: &[u64],
    latency_samples: usize,
    workloads: &[&Workload],
    baseline_agent: Option<&Path>,
) -> Result<()> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    packages::ensure(packages::BENCH)?;
    ensure_tracefs()?;
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let agent = workspace_root().join("target/release/lifecycle-agent");
    let script = TempFile(std::env::temp_dir().join(format!("lifecycle-bench-{}.bt", std::process::id())));
    std::fs::write(&script.0, BPFTRACE_SCRIPT)?;
    let hz = clock_ticks_per_second();

    let mut conditions = vec![Condition::Baseline];
    for &poll_ms in poll_ms {
        if baseline_agent.is_some() {
            conditions.push(Condition::Agent { poll_ms, baseline: true });
        }
        conditions.push(Condition::Agent { poll_ms, baseline: false });
    }
    conditions.push(Condition::Bpftrace);
    // samples[condition][workload]
    let agents = Agents { this: &agent, baseline: baseline_agent };
    let mut samples = vec![vec![Samples::default(); workloads.len()]; conditions.len()];
    let load_before = loadavg();
    let started = Instant::now();
    eprintln!("xtask: load average before: {load_before}");
    // Another agent or bpftrace (other jobs on this machine run the e2e tier) puts its own programs
    // on every workload event: a condition run that saw one is thrown away and run again.
    let (mut discarded, mut kept_dirty) = (0usize, 0usize);
    for round in 0..rounds {
        // Rotate the order each round so drift on the machine does not favour one condition.
        for offset in 0..conditions.len() {
            let index = (round + offset) % conditions.len();
            let condition = conditions[index];
            let mut attempt = 0;
            let run = loop {
                attempt += 1;
                wait_until_no_foreign_tracers(FOREIGN_WAIT);
                let (run, clean) = run_condition(condition, workloads, &agents, &script.0, hz)?;
                if clean || attempt >= MAX_ATTEMPTS {
                    if !clean {
                        kept_dirty += 1;
                        eprintln!(
                            "xtask: warning: keeping a {} run with foreign tracers after {attempt} attempts",
                            condition.name()
                        );
                    }
                    break run;
                }
                discarded += 1;
                eprintln!(
                    "xtask: {} run discarded: a tracer this benchmark did not start was running",
                    condition.name()
                );
            };
            for (slot, sample) in samples[index].iter_mut().zip(run) {
                slot.wall_s.extend(sample.wall_s);
                slot.cpu_s.extend(sample.cpu_s);
                slot.tracer_cpu_ms.extend(sample.tracer_cpu_ms);
            }
        }
        eprintln!(
            "xtask: round {}/{rounds} done ({:.0} s, load {})",
            round + 1,
            started.elapsed().as_secs_f64(),
            loadavg()
        );
    }
    let load_after = loadavg();

    let latencies = if latency_samples > 0 {
        poll_ms
            .iter()
            .map(|&poll| latency(&agent, poll, latency_samples).map(|stats| (poll, stats)))
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };

    println!();
    println!(
        "| workload | condition | wall (median) | wall min - max | wall vs none | workload CPU (median) | \
         workload CPU vs none | tracer CPU (mean) | (workload + tracer) CPU vs none |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (w, workload) in workloads.iter().enumerate() {
        let base_wall = median(&samples[0][w].wall_s);
        let base_cpu = median(&samples[0][w].cpu_s);
        for (c, condition) in conditions.iter().enumerate() {
            let slot = &samples[c][w];
            let wall = median(&slot.wall_s);
            let (lo, hi) = min_max(&slot.wall_s);
            let cpu = median(&slot.cpu_s);
            // Mean, not median: the tracer samples are whole clock ticks, the mean averages that.
            let tracer_ms = if slot.tracer_cpu_ms.is_empty() {
                0.0
            } else {
                slot.tracer_cpu_ms.iter().sum::<f64>() / slot.tracer_cpu_ms.len() as f64
            };
            let tracer = if slot.tracer_cpu_ms.is_empty() {
                "-".to_owned()
            } else {
                format!("{tracer_ms:.0} ms ({:.1} % of wall)", tracer_ms / (wall * 1000.0) * 100.0)
            };
            let ratio = |value: f64, base: f64| if c == 0 { "1".to_owned() } else { format!("{:.3}", value / base) };
            println!(
                "| {} | {} | {wall:.3} s | {lo:.3} - {hi:.3} | {} | {cpu:.3} s | {} | {tracer} | {} |",
                if c == 0 { workload.name } else { "" },
                condition.name(),
                ratio(wall, base_wall),
                ratio(cpu, base_cpu),
                ratio(cpu + tracer_ms / 1000.0, base_cpu),
            );
        }
    }
    if !latencies.is_empty() {
        println!();
        println!("| agent poll interval | delivery latency p50 | p90 | max | samples |");
        println!("|---|---|---|---|---|");
        for (poll, stats) in &latencies {
            println!(
                "| --poll-ms {poll} | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
                stats.p50, stats.p90, stats.max, stats.samples
            );
        }
    }
    println!(
        "\n{discarded} condition runs discarded and run again (an agent or bpftrace this benchmark did not start was running); \
         {kept_dirty} kept anyway after {MAX_ATTEMPTS} attempts"
    );
    let poll_list = poll_ms.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    println!(
        "\n{rounds} interleaved rounds, medians; workload CPU = user+system of the workload's \
         process tree (getrusage); tracer CPU = utime+stime of the tracer process (/proc/<pid>/stat) while the \
         workload ran (mean over rounds, {hz:.0} Hz ticks); load average before {load_before}, after {load_after}; {:.0} s\n\
         command: xtask/x.sh bench overhead --rounds {rounds} --poll-ms {poll_list} --latency-samples {latency_samples} \
         --workloads {}{}",
        started.elapsed().as_secs_f64(),
        workloads.iter().map(|w| w.key).collect::<Vec<_>>().join(","),
        baseline_agent.map(|path| format!(" --baseline-agent {}", path.display())).unwrap_or_default(),
    );
    Ok(())
}
