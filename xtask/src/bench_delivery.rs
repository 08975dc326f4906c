//! The agent's delivery latency on a quiet node, for `bench overhead`: how long after a short
//! process is reaped the ring reader has its exit record, per poll interval.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{median, min_max, Tracer, START_TIMEOUT};

pub(super) struct LatencyStats {
    pub(super) p50: f64,
    pub(super) p90: f64,
    pub(super) max: f64,
    pub(super) samples: usize,
}

/// Delivery latency on a quiet node: how long after a short process is reaped the agent's reader
/// (`lifecycle-agent events`, the same ring reader as `run`) has its exit record. Spawn times are
/// spread so they do not lock onto the poll ticks.
pub(super) fn latency(agent: &Path, poll_ms: u64, samples: usize) -> Result<LatencyStats> {
    let mut tracer = Tracer::spawn(
        format!("lifecycle-agent events --poll-ms {poll_ms}"),
        Command::new(agent)
            .args(["events", "--poll-ms", &poll_ms.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped()),
    )?;
    let (tx, rx) = mpsc::channel();
    tracer.forward_stdout(tx)?;
    // One process, reaped; then how long until its exit record was read (None: not within `wait`).
    let mut probe = |rx: &mpsc::Receiver<(Instant, String)>, wait: Duration| -> Result<Option<f64>> {
        let mut child = Command::new("/bin/true").spawn().context("spawning /bin/true")?;
        let needle = format!("\"pid\":{},", child.id());
        child.wait()?;
        let reaped = Instant::now();
        let deadline = reaped + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((at, line)) if line.contains(&needle) && line.contains("\"kind\":\"exit\"") => {
                    return Ok(Some(at.saturating_duration_since(reaped).as_secs_f64() * 1000.0));
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    tracer.check_alive()?;
                    bail!("the agent's event stream closed");
                }
            }
        }
    };
    // Warm-up: the agent is ready once it reports a process we started.
    let deadline = Instant::now() + START_TIMEOUT;
    while probe(&rx, Duration::from_millis(500))?.is_none() {
        if Instant::now() > deadline {
            bail!("lifecycle-agent events never reported a probe process");
        }
    }
    let mut values = Vec::with_capacity(samples);
    for i in 0..samples {
        // 20-61 ms apart, stepping by a prime so the phase against the poll timer varies.
        std::thread::sleep(Duration::from_millis(20 + (i as u64 * 17) % 42));
        match probe(&rx, Duration::from_secs(5))? {
            Some(ms) => values.push(ms),
            None => bail!("no exit record within 5 s for a probe process (--poll-ms {poll_ms})"),
        }
    }
    drop(rx);
    drop(tracer);
    values.sort_by(|a, b| a.total_cmp(b));
    let p90 = values[((values.len() * 9) / 10).min(values.len() - 1)];
    Ok(LatencyStats { p50: median(&values), p90, max: min_max(&values).1, samples: values.len() })
}
