//! `xtask/x.sh bench load`: Debian's wrk against the agent's listeners, on loopback.
//!
//! 1. The agent (this tree's release build, no Kubernetes credentials) tracking N kubepods-style
//!    units (real cgroups, one process each, as `bench memory` makes them): wrk on `/healthz`
//!    (the baseline: the same listener, connection handling and HTTP stack, an answer of three
//!    bytes) then on `/metrics`, each for `--seconds`.
//! 2. A declared probe (`/probe/tcp?port=...`, the pod listener's event loop, answering from the
//!    state of a real listener, as in `bench probes`) for `--seconds`.
//!
//! Per run: requests/s, latency p50/p99 (wrk's), socket errors and non-2xx answers, and the
//! server's CPU (its threads' schedstat) and RSS at the end. wrk runs with 2 threads, as many
//! as this machine has CPUs: wrk and the agent share them, which is the ceiling of every figure.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    free_port,
    memory::{cgroup2_root, get, read_memory, FakeNode},
    plain_host_agent,
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

pub fn run(seconds: u64, units: usize, connections: usize) -> Result<()> {
    packages::ensure(&["wrk"])?;
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let load_before = super::loadavg();
    let mut runs = Vec::new();

    let addr = format!("127.0.0.1:{}", free_port()?);
    let binary = workspace_root().join("target/release/lifecycle-agent");
    let mut agent = plain_host_agent(&binary, &addr).spawn().context("starting the agent")?;
    let result = (|| -> Result<()> {
        wait_listed(&addr, 0, "")?;
        let mut node = FakeNode::new(&cgroup2_root()?)?;
        node.start(units)?;
        wait_listed(&addr, units, &node.uid_prefix)?;
        let body = get(&addr, "/metrics")?;
        eprintln!("xtask: {units} units tracked; /metrics is {} bytes", body.len());
        for path in ["/healthz", "/metrics"] {
            let target = format!("agent {path}, {units} units");
            runs.push(wrk(&target, &format!("http://{addr}{path}"), agent.id(), seconds, connections)?);
        }
        drop(node);
        Ok(())
    })();
    let _ = agent.kill();
    let _ = agent.wait();
    result?;

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
    if let (Some(base), Some(metrics)) = (runs.first(), runs.get(1)) {
        println!(
            "\n/metrics serves {:.3}x the requests/s of /healthz on the same listener (the baseline of this run)",
            metrics.requests_per_s / base.requests_per_s.max(1.0)
        );
    }
    println!(
        "load average before {load_before}, after {}\ncommand: xtask/x.sh bench load --seconds {seconds} --units {units} --connections {connections}",
        super::loadavg()
    );
    Ok(())
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
