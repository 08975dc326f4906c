//! `xtask/x.sh bench load`: Debian's wrk against the agent's listeners, on loopback.
//!
//! 1. The agent (this tree's release build, no Kubernetes credentials) tracking N kubepods-style
//!    units (real cgroups, one process each, as `bench memory` makes them): wrk on `/healthz`
//!    (the baseline: the same listener, connection handling and HTTP stack, an answer of three
//!    bytes) then on `/metrics`, each for `--seconds`.
//! 2. On the same units, one client scraping `/metrics` back to back while another asks, in
//!    turns, for one container by its whole id (`/api/v1/containers?container_id=`, as a
//!    follower of one container does) and for `/healthz`: each answer's time, p50/p90/p99. With
//!    `--baseline-agent`, that binary first, then this tree's, on the same units.
//! 3. A declared probe (`/probe/tcp?port=...`, the pod listener's event loop, answering from the
//!    state of a real listener, as in `bench probes`) for `--seconds`.
//!
//! Per run: requests/s, latency p50/p99 (wrk's), socket errors and non-2xx answers, and the
//! server's CPU (its threads' schedstat) and RSS at the end. wrk runs with 2 threads, as many
//! as this machine has CPUs: wrk and the agent share them, which is the ceiling of every figure.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    free_port,
    memory::{cgroup2_root, get, read_memory, FakeNode},
    plain_host_agent, sample_values, Tracer,
};
use crate::{
    bench_probes::{process_cpu_ns, ProbeServer},
    cargo, packages, shell, workspace_root,
};

/// What one wrk run measured.
struct WrkRun {
    target: String,
    requests_per_s: f64,
    p50: String,
    p99: String,
    requests: u64,
    socket_errors: u64,
    non_2xx: u64,
    cpu_percent: f64,
    rss_kib: u64,
}

pub fn run(seconds: u64, units: usize, connections: usize, baseline: Option<&Path>) -> Result<()> {
    packages::ensure(&["wrk"])?;
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let load_before = super::loadavg();
    let mut runs = Vec::new();
    let mut beside = Vec::new();

    let mut node = FakeNode::new(&cgroup2_root()?)?;
    node.start(units)?;
    if let Some(binary) = baseline {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let agent = Tracer::spawn("the baseline agent", &mut plain_host_agent(binary, &addr))?;
        wait_listed(&addr, units, &node.uid_prefix)?;
        beside.push((format!("baseline {}", binary.display()), beside_a_scraper(&addr)?));
        drop(agent);
    }
    let addr = format!("127.0.0.1:{}", free_port()?);
    let binary = workspace_root().join("target/release/lifecycle-agent");
    let agent = Tracer::spawn("the agent", &mut plain_host_agent(&binary, &addr))?;
    wait_listed(&addr, units, &node.uid_prefix)?;
    let body = get(&addr, "/metrics")?;
    eprintln!("xtask: {units} units tracked; /metrics is {} bytes", body.len());
    for path in ["/healthz", "/metrics"] {
        let target = format!("agent {path}, {units} units");
        runs.push(wrk(&target, &format!("http://{addr}{path}"), agent.pid(), seconds, connections)?);
    }
    let turned_away = rejected_by_source(&get(&addr, "/metrics")?);
    beside.push(("this tree".to_owned(), beside_a_scraper(&addr)?));
    drop(agent);
    drop(node);

    let app = std::net::TcpListener::bind("127.0.0.1:0").context("binding the probed listener")?;
    let port = app.local_addr()?.port();
    std::thread::spawn(move || app.incoming().for_each(drop));
    let path = format!("/probe/tcp?port={port}&stall=5s");
    let server = ProbeServer::start(&path).context("starting the probe server")?;
    let target = "declared probe /probe/tcp (pod listener)".to_owned();
    runs.push(wrk(&target, &format!("http://{}{path}", server.addr), server.pid, seconds, connections)?);
    drop(server);

    println!("\nwrk -t2 -c{connections} -d{seconds}s --latency, loopback:\n");
    println!("| target | requests/s | p50 | p99 | requests | socket errors | non-2xx | server CPU | server RSS |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {:.0} % | {:.1} MiB |",
            r.target,
            r.requests_per_s,
            r.p50,
            r.p99,
            r.requests,
            r.socket_errors,
            r.non_2xx,
            r.cpu_percent,
            r.rss_kib as f64 / 1024.0
        );
    }
    println!(
        "\nconnections the agent turned away for their source during the wrk runs: {turned_away} \
         (lifecycle_http_connections_rejected_total{{reason=\"source\"}}; 32 places per source address)"
    );
    println!("\nbeside one client scraping /metrics back to back, {BESIDE_ASKS} asks of each, in turns:\n");
    println!("| agent | scrapes meanwhile | answer | p50 | p90 | p99 |");
    println!("|---|---|---|---|---|---|");
    for (agent, measured) in &mut beside {
        for (answer, times) in [("one container by its id", &mut measured.one), ("/healthz", &mut measured.health)] {
            times.sort_by(f64::total_cmp);
            let at =
                |q: f64| times.get(((times.len() as f64 * q) as usize).min(times.len() - 1)).copied().unwrap_or(0.0);
            println!(
                "| {agent} | {} | {answer} | {:.3} ms | {:.3} ms | {:.3} ms |",
                measured.scrapes,
                at(0.5),
                at(0.9),
                at(0.99)
            );
        }
    }
    if let (Some(base), Some(metrics)) = (runs.first(), runs.get(1)) {
        println!(
            "\n/metrics serves {:.3}x the requests/s of /healthz on the same listener (the baseline of this run)",
            metrics.requests_per_s / base.requests_per_s.max(1.0)
        );
    }
    println!(
        "load average before {load_before}, after {}\ncommand: xtask/x.sh bench load --seconds {seconds} --units {units} --connections {connections}{}",
        super::loadavg(),
        baseline.map(|b| format!(" --baseline-agent {}", b.display())).unwrap_or_default()
    );
    Ok(())
}

/// The connections `--listen` turned away for their source address, from a scrape's text.
fn rejected_by_source(metrics: &str) -> u64 {
    let labels = ["listener=\"listen\"", "reason=\"source\""];
    sample_values(metrics, "lifecycle_http_connections_rejected_total", &labels).sum::<f64>() as u64
}

/// Asks of each kind beside the scraper.
const BESIDE_ASKS: usize = 1000;

/// What [`beside_a_scraper`] measured: each answer's time (ms), and the scrapes made meanwhile.
struct Beside {
    one: Vec<f64>,
    health: Vec<f64>,
    scrapes: usize,
}

/// While one client scrapes `/metrics` back to back, asks in turns for one container by its
/// whole id (the first unit the API lists) and for `/healthz`, 2 ms apart, each on a fresh
/// connection; times each whole answer.
fn beside_a_scraper(addr: &str) -> Result<Beside> {
    let listed = get(addr, "/api/v1/containers")?;
    let id_at = listed.find("\"container_id\":\"").context("no unit with a container id is listed")? + 16;
    let id = listed.get(id_at..id_at + 64).context("a container id of 64 digits")?.to_owned();
    let one = format!("/api/v1/containers?container_id={id}");
    let scraping = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let scraper = scope.spawn(|| {
            let mut scrapes = 0;
            while scraping.load(Ordering::Relaxed) {
                if timed_get(addr, "/metrics").is_ok() {
                    scrapes += 1;
                }
            }
            scrapes
        });
        let result = (|| -> Result<(Vec<f64>, Vec<f64>)> {
            let (mut one_ms, mut health_ms) = (Vec::new(), Vec::new());
            for _ in 0..BESIDE_ASKS {
                one_ms.push(timed_get(addr, &one)?);
                std::thread::sleep(Duration::from_millis(2));
                health_ms.push(timed_get(addr, "/healthz")?);
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok((one_ms, health_ms))
        })();
        scraping.store(false, Ordering::Relaxed);
        let scrapes = scraper.join().unwrap_or(0);
        let (one, health) = result?;
        Ok(Beside { one, health, scrapes })
    })
}

/// `GET path` on a fresh connection, the whole answer read (`get`): milliseconds, or why it
/// failed.
fn timed_get(addr: &str, path: &str) -> Result<f64> {
    let began = Instant::now();
    get(addr, path)?;
    Ok(began.elapsed().as_secs_f64() * 1e3)
}

/// Runs wrk on `url` for `seconds` and reads its report; `pid` is the server measured.
fn wrk(target: &str, url: &str, pid: u32, seconds: u64, connections: usize) -> Result<WrkRun> {
    eprintln!("xtask: wrk on {url} for {seconds} s");
    let cpu0 = process_cpu_ns(pid)?;
    let began = Instant::now();
    let output = Command::new("wrk")
        .args(["-t2", &format!("-c{connections}"), &format!("-d{seconds}s"), "--timeout", "5s", "--latency", url])
        .stderr(Stdio::inherit())
        .output()
        .context("running wrk")?;
    let wall = began.elapsed();
    let cpu = process_cpu_ns(pid)? - cpu0;
    if !output.status.success() {
        bail!("wrk failed: {}", output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let after = |prefix: &str| text.lines().find_map(|l| l.trim_start().strip_prefix(prefix).map(str::trim));
    let percentile = |p: &str| after(p).unwrap_or("?").to_owned();
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("wrk printed no request count")?;
    let socket_errors = after("Socket errors:")
        .map(|rest| rest.split(',').filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Ok(WrkRun {
        target: target.to_owned(),
        requests_per_s: after("Requests/sec:").and_then(|v| v.parse().ok()).context("wrk printed no rate")?,
        p50: percentile("50%"),
        p99: percentile("99%"),
        requests,
        socket_errors,
        non_2xx: after("Non-2xx or 3xx responses:").and_then(|v| v.parse().ok()).unwrap_or(0),
        cpu_percent: cpu as f64 / wall.as_nanos() as f64 * 100.0,
        rss_kib: read_memory(pid)?.rss,
    })
}

fn wait_listed(addr: &str, units: usize, uid_prefix: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(body) = get(addr, "/api/v1/containers") {
            if body.matches(&format!("\"pod_uid\":\"{uid_prefix}")).count() >= units {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the agent did not list {units} units within 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
