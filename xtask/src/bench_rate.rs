//! `xtask/x.sh bench rate`: the record rate the agent drains without loss, and that beyond it
//! every record is either delivered or counted lost.
//!
//! For each target rate, a fresh agent (defaults) watches `--producers` processes in a cgroup of
//! their own, each sending itself SIGTERM (ignored) as fast as the rate allows for `--seconds`.
//! A stop request is always recorded, and a process signalling itself is the kernel program's
//! cheapest recorded path, so this is the densest record stream (120-byte records) a process can
//! make. The producers count what they sent; the agent's /metrics gives what it received for
//! their unit (`lifecycle_signals_received_total`) and what the kernel counted lost
//! (`lifecycle_events_lost_total{kind="signal"}`). Sent = received + lost, exactly, is the claim.
//! The lowest rate is the baseline of the run (agent CPU per million records).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    free_port, loadavg,
    memory::{cgroup2_root, get},
    plain_host_agent, producer_lines, sample_values, wait_http, Tracer, SETTLE,
};
use crate::{bench_probes::process_cpu_ns, cargo, shell, workspace_root};

/// The producers' cgroup, under the v2 root (its path is the unit's `container` label).
const CGROUP: &str = "lifecycle-bench-rate";

/// One rate, one run.
struct Level {
    /// Records per second asked for (0: as fast as the producers can).
    target: u64,
    sent: u64,
    /// Records per second the producers reached, together.
    achieved: f64,
    received: u64,
    lost: u64,
    /// Agent CPU over the sending window, % of one CPU.
    agent_cpu: f64,
}

pub fn run(rates: &[u64], seconds: u64, producers: usize, agent_flags: &[String]) -> Result<()> {
    if rates.is_empty() || seconds == 0 || producers == 0 {
        bail!("--rates, --seconds and --producers must not be empty or 0");
    }
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let agent = workspace_root().join("target/release/lifecycle-agent");
    let cgroup = cgroup2_root()?.join(CGROUP);
    let load_before = loadavg();
    let started = Instant::now();
    let mut levels = Vec::new();
    for &target in rates {
        let level = level(&agent, agent_flags, &cgroup, target, seconds, producers)
            .with_context(|| format!("at {target} records/s"))?;
        eprintln!(
            "xtask: {} records/s asked, {:.0} reached: {} sent, {} received, {} lost",
            target, level.achieved, level.sent, level.received, level.lost
        );
        levels.push(level);
    }
    let baseline = &levels[0];
    let per_million = |l: &Level| l.agent_cpu / (l.achieved / 1e6).max(1e-9);
    println!();
    println!(
        "| asked (records/s) | reached (records/s) | sent | received by the agent | counted lost | \
         unaccounted | agent CPU | agent CPU per 1 M records/s vs {:.0}/s |",
        baseline.achieved
    );
    println!("|---|---|---|---|---|---|---|---|");
    for l in &levels {
        let asked = if l.target == 0 { "as fast as possible".to_owned() } else { l.target.to_string() };
        let unaccounted = l.sent as i64 - (l.received + l.lost) as i64;
        println!(
            "| {asked} | {:.0} | {} | {} | {} | {unaccounted} | {:.1} % | {:.2} |",
            l.achieved,
            l.sent,
            l.received,
            l.lost,
            l.agent_cpu,
            per_million(l) / per_million(baseline)
        );
    }
    let rate_list = rates.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let flags: String = agent_flags.iter().map(|f| format!(" --agent-flag={f}")).collect();
    println!(
        "\n{producers} producers x {seconds} s per rate; load average before {load_before}, after {}; {:.0} s\n\
         command: xtask/x.sh bench rate --rates {rate_list} --seconds {seconds} --producers {producers}{flags}",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn level(agent: &Path, flags: &[String], cgroup: &Path, target: u64, seconds: u64, producers: usize) -> Result<Level> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let mut tracer =
        Tracer::spawn("lifecycle-agent", plain_host_agent(agent, &addr).args(["--pod-probe-port", "0"]).args(flags))?;
    wait_http(&mut tracer, &addr)?;
    let group = Cgroup::create(cgroup)?;
    std::thread::sleep(SETTLE);
    let before = read(&addr)?;
    let cpu0 = process_cpu_ns(tracer.pid())?;
    let began = Instant::now();
    let me = std::env::current_exe().context("finding the xtask binary")?;
    let per_producer = target / producers as u64;
    let children: Vec<Child> = (0..producers)
        .map(|_| {
            // The shell moves itself into the cgroup ("0": the writing process) and execs the
            // producer, as a runtime starts a container's process: the exec is the unit's first.
            Command::new("sh")
                .args([
                    "-c",
                    r#"echo 0 > "$1/cgroup.procs" && exec "$2" bench signal-producer --rate "$3" --seconds "$4""#,
                ])
                .arg("sh")
                .arg(&group.path)
                .arg(&me)
                .args([per_producer.to_string(), seconds.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a producer")
        })
        .collect::<Result<_>>()?;
    let mut sent = 0;
    for line in producer_lines(children)? {
        sent += line.parse::<u64>().context("a producer's count")?;
    }
    let window = began.elapsed().as_secs_f64();
    let agent_cpu = (process_cpu_ns(tracer.pid())? - cpu0) as f64 / 1e9 / window * 100.0;
    // The agent drains what is left at its next poll; wait until everything is accounted for,
    // or until the counts stop moving.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = read(&addr)?;
    while after.received - before.received + after.lost - before.lost < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let next = read(&addr)?;
        if next == after {
            break;
        }
        after = next;
    }
    tracer.check_alive()?;
    drop(tracer);
    drop(group);
    Ok(Level {
        target,
        sent,
        achieved: sent as f64 / window,
        received: after.received - before.received,
        lost: after.lost - before.lost,
        agent_cpu,
    })
}

/// What the agent says: signal records it received for the producers' unit, and signal records
/// the kernel counted lost.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Counts {
    received: u64,
    lost: u64,
}

fn read(addr: &str) -> Result<Counts> {
    let body = get(addr, "/metrics")?;
    // One label each: the per-container label set (`uid` after `container`) sits between them.
    let container = format!("container=\"/{CGROUP}\"");
    let unit = [container.as_str(), "signal=\"15\"", "sender=\"same_container\""];
    let received = sample_values(&body, "lifecycle_signals_received_total", &unit).next().unwrap_or(0.0) as u64;
    let lost = sample_values(&body, "lifecycle_events_lost_total", &["kind=\"signal\""])
        .next()
        .context("lifecycle_events_lost_total{kind=\"signal\"} missing from /metrics")? as u64;
    Ok(Counts { received, lost })
}

/// The producers' cgroup; removed on drop (the producers have exited by then).
struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    fn create(path: &Path) -> Result<Self> {
        match std::fs::create_dir(path) {
            Ok(()) => {}
            // Left by an interrupted run: reuse it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
        Ok(Self { path: path.to_owned() })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The producer (`xtask bench signal-producer`, started by [`level`] in the bench's cgroup):
/// ignores SIGTERM, sends it to itself `rate` times a second (0: as fast as it can) for
/// `seconds`, and prints how many it sent.
pub fn produce(rate: u64, seconds: u64) -> Result<()> {
    // SAFETY: installs SIG_IGN for SIGTERM; no handler code runs.
    if unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) } == libc::SIG_ERR {
        bail!("ignoring SIGTERM: {}", std::io::Error::last_os_error());
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let window = Duration::from_secs(seconds);
    let began = Instant::now();
    let mut sent: u64 = 0;
    // Paced in chunks: the clock is read once per chunk, and a producer ahead of its rate sleeps.
    const CHUNK: u64 = 256;
    while began.elapsed() < window {
        for _ in 0..CHUNK {
            // SAFETY: kill has no memory-safety preconditions; the signal is ignored.
            unsafe { libc::kill(me, libc::SIGTERM) };
        }
        sent += CHUNK;
        if rate > 0 {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(ahead) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
    println!("{sent}");
    Ok(())
}
