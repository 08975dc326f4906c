//! `xtask/x.sh bench ring`: which ring buffer size loses records under a storm, to size
//! `--ring-bytes` from a measurement.
//!
//! For each size (interleaved over rounds), the agent runs with `--ring-bytes <size>` and its
//! defaults otherwise; `--producers` processes each send `--signals` SIGTERMs, as fast as they
//! can, to a child of their own that handles it. A stop request is always recorded (one 120-byte
//! record each), so this is the densest stream of records a process can make. The agent's
//! /metrics then gives the records sent and lost; the producers print their rate.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{free_port, loadavg, median, plain_host_agent, producer_lines, wait_http, Tracer, PYTHON, SETTLE};
use crate::{cargo, shell, workspace_root};

/// One producer: forks a child handling SIGTERM, sends it `argv[1]` of them, prints its rate.
const PRODUCER: &str = r#"
import os, signal, sys, time
n = int(sys.argv[1])
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, lambda *a: None)
    os.write(w, b"x")
    while True:
        signal.pause()
os.read(r, 1)
started = time.monotonic()
for _ in range(n):
    os.kill(pid, signal.SIGTERM)
elapsed = time.monotonic() - started
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
print(n / elapsed, flush=True)
"#;

/// One size, one round.
struct Sample {
    sent: u64,
    lost: u64,
    /// Records per second, all producers together.
    rate: f64,
}

pub fn run(sizes: &[u32], producers: usize, signals: usize, rounds: usize) -> Result<()> {
    if sizes.is_empty() || producers == 0 || signals == 0 || rounds == 0 {
        bail!("--sizes, --producers, --signals and --rounds must not be empty or 0");
    }
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let agent = workspace_root().join("target/release/lifecycle-agent");
    let load_before = loadavg();
    let started = Instant::now();
    let mut samples: Vec<Vec<Sample>> = sizes.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for offset in 0..sizes.len() {
            let index = (round + offset) % sizes.len();
            let sample = storm(&agent, sizes[index], producers, signals)
                .with_context(|| format!("--ring-bytes {} in round {}", sizes[index], round + 1))?;
            eprintln!(
                "xtask: round {}/{rounds} --ring-bytes {}: {} of {} records lost at {:.0}/s",
                round + 1,
                sizes[index],
                sample.lost,
                sample.sent + sample.lost,
                sample.rate
            );
            samples[index].push(sample);
        }
    }
    println!();
    println!("| --ring-bytes | records/s (median) | lost (median) | lost (max) | of records | lost fraction (max) |");
    println!("|---|---|---|---|---|---|");
    for (size, runs) in sizes.iter().zip(&samples) {
        let rate = median(&runs.iter().map(|s| s.rate).collect::<Vec<_>>());
        let lost = median(&runs.iter().map(|s| s.lost as f64).collect::<Vec<_>>());
        let worst = runs.iter().max_by_key(|s| s.lost).context("no sample")?;
        let total = worst.sent + worst.lost;
        println!(
            "| {} KiB | {rate:.0} | {lost:.0} | {} | {total} | {:.2} % |",
            size / 1024,
            worst.lost,
            worst.lost as f64 * 100.0 / total.max(1) as f64
        );
    }
    let size_list = sizes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    println!(
        "\n{rounds} rounds, {producers} producers x {signals} recorded signals each; load average before {load_before}, \
         after {}; {:.0} s\ncommand: xtask/x.sh bench ring --sizes {size_list} --producers {producers} --signals {signals} \
         --rounds {rounds}",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn storm(agent: &std::path::Path, ring_bytes: u32, producers: usize, signals: usize) -> Result<Sample> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let mut tracer = Tracer::spawn(
        format!("lifecycle-agent --ring-bytes {ring_bytes}"),
        plain_host_agent(agent, &addr).args(["--ring-bytes", &ring_bytes.to_string()]),
    )?;
    wait_http(&mut tracer, &addr)?;
    std::thread::sleep(SETTLE);
    let before = signal_records(&addr)?;
    let mut children = Vec::new();
    for _ in 0..producers {
        let child = Command::new(PYTHON)
            .args(["-c", PRODUCER, &signals.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a producer")?;
        children.push(child);
    }
    let mut rate = 0.0;
    for line in producer_lines(children)? {
        rate += line.parse::<f64>().context("a producer's rate")?;
    }
    // Let the agent drain what is left (the next poll at the latest).
    std::thread::sleep(Duration::from_millis(500));
    let after = signal_records(&addr)?;
    tracer.check_alive()?;
    drop(tracer);
    Ok(Sample { sent: after.0 - before.0, lost: after.1 - before.1, rate })
}

/// (sent, lost) signal records so far, from the agent's /metrics.
fn signal_records(addr: &str) -> Result<(u64, u64)> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    let value = |family: &str| {
        body.lines()
            .find(|l| l.starts_with(family) && l.contains("kind=\"signal\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .with_context(|| format!("{family}{{kind=\"signal\"}} missing from /metrics"))
    };
    Ok((value("lifecycle_events_total{")?, value("lifecycle_events_lost_total{")?))
}
