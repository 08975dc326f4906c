//! Benchmarks. Each runs its conditions interleaved in one run (this machine is shared and noisy)
//! and reports medians with ratios against the baseline measured in that same run.

use std::{path::PathBuf, time::Duration};

use anyhow::Result;

use crate::{cargo, packages, shell};

#[path = "bench_delivery.rs"]
mod delivery;
#[path = "bench_fresh.rs"]
mod fresh;
#[path = "bench_load.rs"]
mod load;
#[path = "bench_memory.rs"]
mod memory;
#[path = "bench_overhead.rs"]
mod overhead;
#[path = "bench_plugin.rs"]
mod plugin;
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
    /// `kubectl lifecycle explain` of a pod gone from the API against N agents on loopback (a
    /// stand-in API server): requests that reach agents and time, with the node found from the
    /// kubelet's Events and with `--all-nodes`; fails if an agent receives any credential but the
    /// token minted for the agents.
    Plugin {
        /// Agents (nodes).
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// Runs of each command (the median and the max are reported).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
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
        /// Another lifecycle-agent binary (e.g. an older commit's build), measured first in the
        /// same run: before/after.
        #[arg(long)]
        baseline_agent: Option<PathBuf>,
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
        /// wrk's open connections. They all come from one address, and the agent's API listener
        /// keeps 32 places per source address (issue 18): past 32, wrk's connections are turned
        /// away and counted as its socket errors.
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Another lifecycle-agent binary, measured first in the same run on the same units for
        /// the answers beside a scraper (step 2): before/after.
        #[arg(long)]
        baseline_agent: Option<PathBuf>,
    },
    /// A thousand real units on this machine: 900 host cgroups and 100 containers through
    /// containerd + runc; the agent's CPU, RSS and map memory against its idle baseline, records
    /// lost, exit -> state latency and scrapes under a restart churn, and a 100-container stop
    /// storm whose every verdict must be right.
    Scale {
        /// Another lifecycle-agent binary (e.g. an older commit's build), measured first in the
        /// same run: before/after.
        #[arg(long)]
        baseline_agent: Option<PathBuf>,
    },
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
            let workloads: Vec<&overhead::Workload> = overhead::WORKLOADS
                .iter()
                .filter(|w| workloads.is_empty() || workloads.iter().any(|k| k == w.key))
                .collect();
            overhead::overhead(rounds, &poll_ms, latency_samples, &workloads, baseline_agent.as_deref())
        }
        Bench::Latency { exits, baseline_agent } => {
            packages::ensure(packages::TEST)?;
            with_baseline(baseline_agent.as_deref(), "bench_latency", &[("LIFECYCLE_BENCH_EXITS", exits.to_string())])
        }
        Bench::Probes { count } => {
            packages::ensure(packages::TEST)?;
            crate::bench_probes::run(count)
        }
        Bench::Memory { units, rounds, baseline } => memory::run(units, rounds, baseline),
        Bench::Plugin { nodes, rounds } => plugin::run(nodes, rounds),
        Bench::Load { seconds, units, connections, baseline_agent } => {
            packages::ensure(packages::TEST)?;
            load::run(seconds, units, connections, baseline_agent.as_deref())
        }
        Bench::Ring { sizes, producers, signals, rounds } => ring::run(&sizes, producers, signals, rounds),
        Bench::Rate { rates, seconds, producers, agent_flags } => rate::run(&rates, seconds, producers, &agent_flags),
        Bench::SignalProducer { rate, seconds } => rate::produce(rate, seconds),
        Bench::Scale { baseline_agent } => {
            packages::ensure(packages::TEST)?;
            with_baseline(baseline_agent.as_deref(), "bench_scale", &[])
        }
        Bench::FreshRun { baseline } => fresh::run(baseline.as_deref()),
        Bench::Scrape { containers, scrapes } => ignored_test(
            "bench_scrape",
            &[("LIFECYCLE_BENCH_CONTAINERS", containers.to_string()), ("LIFECYCLE_BENCH_SCRAPES", scrapes.to_string())],
        ),
    }
}

/// The agent binary a benchmark test runs instead of this tree's (`LIFECYCLE_BENCH_AGENT`).
const BENCH_AGENT_ENV: &str = "LIFECYCLE_BENCH_AGENT";

/// [`ignored_test`], first with `baseline` as the agent when given, then with this tree's.
fn with_baseline(baseline: Option<&std::path::Path>, name: &str, env: &[(&str, String)]) -> Result<()> {
    if let Some(baseline) = baseline {
        println!("== baseline: {}", baseline.display());
        let mut with_agent = env.to_vec();
        with_agent.push((BENCH_AGENT_ENV, baseline.display().to_string()));
        ignored_test(name, &with_agent)?;
        println!("== this tree");
    }
    ignored_test(name, env)
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

const PYTHON: &str = "/usr/bin/python3";

/// How long a tracer gets to become ready, and to exit after SIGINT before it is killed.
const START_TIMEOUT: Duration = Duration::from_secs(60);

const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Quiet time after a tracer is ready (and for the baseline), so start-up work is not measured.
const SETTLE: Duration = Duration::from_millis(300);

/// The values of `family`'s samples in a `/metrics` text whose labels contain every one of
/// `labels` (written as they appear: `kind="signal"`), in the order they come.
fn sample_values<'a>(metrics: &'a str, family: &'a str, labels: &'a [&str]) -> impl Iterator<Item = f64> + 'a {
    metrics
        .lines()
        .filter(move |line| {
            line.strip_prefix(family).is_some_and(|rest| rest.starts_with('{'))
                && labels.iter().all(|label| line.contains(label))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
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
