//! The verdict log: every judged stop, once it has settled, as one JSON line on stdout, so log
//! pipelines (`kubectl logs`, Loki, Elasticsearch) keep the history for as long as they keep
//! logs. The line holds the same fields as the API's past stop (`/api/v1/history`) plus the
//! verdict in words, as `explain` says it.
//!
//! A stop settles when its cause is known, or [`SETTLE`] after its exit (a cause the kubelet
//! writes while it stops the containers can come that late; see `lifecycle-model/src/node/pods.rs`).

use std::{io::Write as _, sync::Arc, time::Duration};

use tokio::sync::watch;

use lifecycle_model::{explain, wire::with_clock::WithClock};

use crate::{
    discovery::clock::{boottime, wall_clock},
    model::node::NodeSnapshot,
};

/// How long after its exit a stop without a cause waits for one before it is written.
const SETTLE: Duration = Duration::from_secs(11);
/// Lines written per pass at most (a burst of stops is written over a few seconds).
const PER_PASS: usize = 256;

/// Writes every settled stop once, each pass a second apart, until shutdown.
pub(super) async fn verdict_log_loop(
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut next = 0u64;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let stops =
            snapshots.borrow().clone().settled_stops_since(next, boottime(), SETTLE.as_nanos() as u64, PER_PASS);
        let Some(last) = stops.last() else { continue };
        next = last.seq + 1;
        // Off the async workers: a reader of stdout that stalls (a full pipe) would hold the
        // worker that answers the API and probes. This loop alone waits for it.
        let written = tokio::task::spawn_blocking(move || write_lines(stops)).await;
        if written.is_err() {
            log::warn!("the verdict log's writer failed; the verdicts stay in the API");
        }
    }
}

/// Writes each stop as one JSON line: the API's fields, `msg: "verdict"` and the verdict in words.
fn write_lines(stops: Vec<crate::model::node::PastStop>) {
    let clock = wall_clock();
    let mut out = std::io::stdout().lock();
    for stop in stops {
        let verdict = explain::of_stop(&stop).verdict;
        let Ok(mut line) = serde_json::to_value(WithClock::new(&stop, clock)) else { continue };
        if let Some(fields) = line.as_object_mut() {
            fields.insert("msg".into(), "verdict".into());
            fields.insert("verdict".into(), verdict.into());
        }
        // A closed stdout must not stop the agent: the verdicts stay in the API.
        let _ = writeln!(out, "{line}");
    }
}
