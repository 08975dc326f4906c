//! `bench overhead`: the agent's cost on fork/exec/exit, signal and accept loops against no
//! tracing and an equivalent bpftrace script, the tracers' own CPU, and the delivery latency per
//! poll interval.

use std::{
    os::fd::{FromRawFd as _, OwnedFd},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    children_cpu_ns, clock_ticks_per_second, free_port, latency, loadavg, median, min_max, wait_http, TempFile, Tracer,
    PYTHON, SETTLE, START_TIMEOUT,
};
use crate::{cargo, packages, shell, workspace_root};

/// A workload: a command whose wall time is measured.
pub(super) struct Workload {
    /// What `--workloads` calls it.
    pub(super) key: &'static str,
    name: &'static str,
    program: &'static str,
    args: &'static [&'static str],
}

pub(super) const WORKLOADS: &[Workload] = &[
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

/// How long to wait for another job's agent or bpftrace to end before running a condition.
const FOREIGN_WAIT: Duration = Duration::from_secs(120);

/// Attempts at one condition run before one with foreign tracers around is kept anyway.
const MAX_ATTEMPTS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Baseline,
    /// This tree's agent, or with `baseline` the `--baseline-agent` binary; with `accounted`,
    /// while the kernel accounts BPF programs' run time (what `--kernel-stats on` costs is the
    /// difference from the same agent without it).
    Agent {
        poll_ms: u64,
        baseline: bool,
        accounted: bool,
    },
    Bpftrace,
}

impl Condition {
    fn name(self) -> String {
        match self {
            Condition::Baseline => "no tracing".into(),
            Condition::Agent { poll_ms, baseline: false, accounted: true } => {
                format!("lifecycle-agent --poll-ms {poll_ms}")
            }
            Condition::Agent { poll_ms, baseline: false, accounted: false } => {
                format!("lifecycle-agent --poll-ms {poll_ms} --kernel-stats off")
            }
            Condition::Agent { poll_ms, baseline: true, .. } => format!("baseline agent --poll-ms {poll_ms}"),
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

/// A started condition: its tracer (none for the untraced baseline).
struct Started {
    tracer: Option<Tracer>,
}

/// Keeps the kernel's run-time accounting of BPF programs on while alive (`BPF_ENABLE_STATS`):
/// every agent the run compares is accounted alike, a baseline built before the agent held it
/// itself included. Hand-written: a single bpf(2) command that no crate in xtask's tree wraps
/// (aya does, but building aya into xtask would add it to every `x.sh` first build).
struct KernelAccounting(#[expect(dead_code, reason = "held, not read: closing it ends the accounting")] OwnedFd);

impl KernelAccounting {
    fn enable() -> Result<Self> {
        /// `union bpf_attr`'s `enable_stats` member: `__u32 type`.
        #[repr(C)]
        struct EnableStats {
            kind: u32,
        }
        const BPF_ENABLE_STATS: libc::c_long = 32;
        const BPF_STATS_RUN_TIME: u32 = 0;
        let attr = EnableStats { kind: BPF_STATS_RUN_TIME };
        // SAFETY: `attr` is a valid `bpf_attr` prefix of the size passed; the kernel zero-fills
        // the rest and returns a new fd or -1.
        let fd = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, &raw const attr, std::mem::size_of::<EnableStats>())
        };
        if fd < 0 {
            bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).context("bpf(2) returned an fd out of range")?;
        // SAFETY: a new fd this process owns and nothing else closes.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

/// Each of the programs process `pid` holds: (name, runs, kernel ns), as the kernel accounts
/// them (bpftool reads `run_cnt` and `run_time_ns`; the ids come from the process's fdinfo).
fn kernel_costs(pid: u32) -> Result<Vec<(String, f64, f64)>> {
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).with_context(|| format!("fdinfo of {pid}"))? {
        let Ok(info) = std::fs::read_to_string(entry?.path()) else { continue };
        if let Some(id) =
            info.lines().find_map(|l| l.strip_prefix("prog_id:")).and_then(|id| id.trim().parse::<u64>().ok())
        {
            ids.insert(id);
        }
    }
    let listing = shell::capture(Command::new("bpftool").args(["-j", "prog", "show"]))?;
    let programs: serde_json::Value = serde_json::from_str(&listing).context("bpftool's JSON")?;
    let mut costs = Vec::new();
    for program in programs.as_array().into_iter().flatten() {
        if !program["id"].as_u64().is_some_and(|id| ids.contains(&id)) {
            continue;
        }
        let name = program["name"].as_str().unwrap_or("?").to_owned();
        // bpftool leaves both out while a program has not run.
        let runs = program["run_cnt"].as_f64().unwrap_or(0.0);
        let ns = program["run_time_ns"].as_f64().unwrap_or(0.0);
        costs.push((name, runs, ns));
    }
    Ok(costs)
}

fn start(condition: Condition, agents: &Agents<'_>, script: &Path) -> Result<Started> {
    match condition {
        Condition::Baseline => Ok(Started { tracer: None }),
        Condition::Agent { poll_ms, baseline, accounted } => {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let stats = if accounted || baseline { None } else { Some(["--kernel-stats", "off"]) };
            let mut tracer = Tracer::spawn(
                condition.name(),
                Command::new(agents.binary(baseline)?)
                    .args(["run", "--listen", &addr, "--poll-ms", &poll_ms.to_string()])
                    .args(stats.iter().flatten())
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null()),
            )?;
            wait_http(&mut tracer, &addr)?;
            Ok(Started { tracer: Some(tracer) })
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
            Ok(Started { tracer: Some(tracer) })
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
    /// The agent's programs while the workload ran, as the kernel accounted them: (program,
    /// runs, ns), summed over rounds.
    programs: Vec<(String, f64, f64)>,
}

impl Samples {
    fn add_programs(&mut self, before: &[(String, f64, f64)], after: &[(String, f64, f64)]) {
        for (program, runs, ns) in after {
            let Some((_, runs_before, ns_before)) = before.iter().find(|(p, _, _)| p == program) else { continue };
            let (runs, ns) = (runs - runs_before, ns - ns_before);
            match self.programs.iter_mut().find(|(p, _, _)| p == program) {
                Some(entry) => {
                    entry.1 += runs;
                    entry.2 += ns;
                }
                None => self.programs.push((program.clone(), runs, ns)),
            }
        }
    }
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
    // The kernel accounts every program while anyone holds the switch: held for the agents
    // measured per program, released for the rest (the untraced baseline, bpftrace, and this
    // tree's agent with --kernel-stats off, whose wall times against the accounted run are what
    // the accounting costs).
    let _accounting = match condition {
        Condition::Agent { accounted: true, .. } => {
            Some(KernelAccounting::enable().context("turning on the kernel's BPF accounting")?)
        }
        _ => None,
    };
    let Started { tracer } = start(condition, agents, script)?;
    std::thread::sleep(SETTLE);
    let own = tracer.as_ref().map(Tracer::pid);
    let mut clean = true;
    for (slot, workload) in run.iter_mut().zip(workloads) {
        clean &= foreign_tracers(own).is_empty();
        let programs_before = own.map(kernel_costs).transpose()?.unwrap_or_default();
        let cpu_before = tracer.as_ref().map(Tracer::cpu_ticks).transpose()?;
        let (wall, cpu) = time(workload).with_context(|| format!("{} under {}", workload.name, condition.name()))?;
        let cpu_after = tracer.as_ref().map(Tracer::cpu_ticks).transpose()?;
        let programs_after = own.map(kernel_costs).transpose()?.unwrap_or_default();
        slot.add_programs(&programs_before, &programs_after);
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

pub(super) fn overhead(
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
            conditions.push(Condition::Agent { poll_ms, baseline: true, accounted: true });
        }
        conditions.push(Condition::Agent { poll_ms, baseline: false, accounted: true });
        conditions.push(Condition::Agent { poll_ms, baseline: false, accounted: false });
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
                for (program, runs, ns) in sample.programs {
                    match slot.programs.iter_mut().find(|(p, _, _)| *p == program) {
                        Some(entry) => {
                            entry.1 += runs;
                            entry.2 += ns;
                        }
                        None => slot.programs.push((program, runs, ns)),
                    }
                }
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
    // The kernel's own accounting of each program under the workloads (BPF_ENABLE_STATS, held by
    // this run): what each event costs in the kernel, per program, for both builds.
    let mut program_rows = Vec::new();
    for (c, condition) in conditions.iter().enumerate() {
        for (w, workload) in workloads.iter().enumerate() {
            for (program, runs, ns) in &samples[c][w].programs {
                if *runs >= 1.0 {
                    program_rows.push(format!(
                        "| {} | {} | {program} | {runs:.0} | {:.0} ns |",
                        workload.name,
                        condition.name(),
                        ns / runs
                    ));
                }
            }
        }
    }
    if !program_rows.is_empty() {
        println!();
        println!("| workload | condition | program | runs (all rounds) | kernel time per run |");
        println!("|---|---|---|---|---|");
        for row in program_rows {
            println!("{row}");
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
