//! Asks systemd for the settings of the host units the model meets, and hands them to the model
//! (`NodeTracker::set_systemd_unit`): a unit's stops are then judged by its `TimeoutStopSec=`
//! and its restarts by its `Restart=` and `RestartSec=`.
//!
//! The model names a unit when it starts a run (`Notice::SystemdUnitWanted`); the owner queues
//! the request here without waiting (no D-Bus call runs on the ring thread). Requests are
//! bounded ([`QUEUED`]; past it they are dropped and counted, and the unit's next run asks
//! again), one at a time, and a unit asked for again while queued is asked once. Without systemd
//! (a container host with another init, or `/run/systemd` not mounted into the pod) the first
//! failure is logged and connecting is retried at most every [`RETRY`]: host units are judged by
//! no grace meanwhile, which is what they are without a manager.

use std::{
    collections::HashSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use prometheus::{IntCounterVec, Registry};
use tokio::sync::{mpsc, watch};

use crate::{discovery::systemd::SystemdClient, export::families::AgentFamily, ErrorChain};
use crate::{model::node::Command, owner::ModelHandle};

/// Requests waiting to be asked; a node starting a thousand units at once asks for each in turn.
pub(crate) const QUEUED: usize = 1024;
/// Shortest gap between two attempts to connect while systemd does not answer.
const RETRY: Duration = Duration::from_secs(30);

/// A unit to ask for: its cgroup path (the model's key) and its name.
pub(crate) type Request = (String, String);

/// `lifecycle_systemd_unit_reads_total{result}`.
#[derive(Clone)]
pub(crate) struct SystemdCounts(IntCounterVec);

impl SystemdCounts {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let family = AgentFamily::SystemdUnitReads.family();
        let counts = IntCounterVec::new(family.opts(), family.labels)?;
        registry.register(Box::new(counts.clone()))?;
        for result in ["read", "failed", "unreachable", "dropped"] {
            counts.with_label_values(&[result]);
        }
        Ok(Self(counts))
    }

    pub(crate) fn count(&self, result: &str) {
        self.0.with_label_values(&[result]).inc();
    }
}

/// The queue's sending side, for the model's owner: never waits.
#[derive(Clone)]
pub(crate) struct SystemdRequests {
    queue: mpsc::Sender<Request>,
    counts: SystemdCounts,
}

impl SystemdRequests {
    pub(crate) fn new(counts: SystemdCounts) -> (Self, mpsc::Receiver<Request>) {
        let (queue, requests) = mpsc::channel(QUEUED);
        (Self { queue, counts }, requests)
    }

    /// Queues a request; when the queue is full it is dropped and counted.
    pub(crate) fn ask(&self, path: String, unit: String) {
        if self.queue.try_send((path, unit)).is_err() {
            self.counts.count("dropped");
        }
    }
}

/// Answers requests until shutdown. The D-Bus calls block, so each batch runs on a blocking
/// thread with the client, which comes back with it.
pub(crate) async fn systemd_loop(
    mut requests: mpsc::Receiver<Request>,
    model: ModelHandle,
    counts: SystemdCounts,
    root: Option<PathBuf>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client: Option<SystemdClient> = None;
    let mut last_attempt: Option<Instant> = None;
    let mut said_unreachable = false;
    loop {
        let first = tokio::select! {
            request = requests.recv() => match request { Some(request) => request, None => return },
            _ = shutdown.changed() => return,
        };
        // Whatever else waits now, each unit once.
        let mut batch = vec![first];
        while let Ok(request) = requests.try_recv() {
            batch.push(request);
        }
        let mut seen = HashSet::new();
        batch.retain(|(path, _)| seen.insert(path.clone()));
        if client.is_none() && last_attempt.is_none_or(|at| at.elapsed() >= RETRY) {
            last_attempt = Some(Instant::now());
            let root = root.clone();
            match tokio::task::spawn_blocking(move || SystemdClient::connect(root.as_deref())).await {
                Ok(Ok(connected)) => {
                    log::info!("reading host units' stop and restart settings from systemd");
                    said_unreachable = false;
                    client = Some(connected);
                }
                Ok(Err(err)) if !said_unreachable => {
                    log::info!("host units are judged without a grace period: {}", ErrorChain(&err));
                    said_unreachable = true;
                }
                Ok(Err(_)) => {}
                Err(err) => log::warn!("connecting to systemd: {err}"),
            }
        }
        let Some(connected) = client.take() else {
            batch.iter().for_each(|_| counts.count("unreachable"));
            continue;
        };
        let asked = tokio::task::spawn_blocking(move || {
            let mut answers = Vec::with_capacity(batch.len());
            let mut broken = false;
            for (path, unit) in batch {
                if broken {
                    answers.push((path, Err(None)));
                    continue;
                }
                let answer = connected.unit(&unit);
                if let Err(err) = &answer {
                    log::debug!("{}", ErrorChain(err));
                    broken = !err.keeps_connection();
                }
                answers.push((path, answer.map_err(Some)));
            }
            (answers, (!broken).then_some(connected))
        })
        .await;
        let Ok((answers, kept)) = asked else {
            log::warn!("asking systemd for unit settings stopped");
            continue;
        };
        client = kept;
        for (path, answer) in answers {
            match answer {
                Ok(facts) => {
                    counts.count("read");
                    model.update(Command::SystemdUnit { path, facts }).await;
                }
                Err(Some(_)) => counts.count("failed"),
                // Not asked: the connection broke on an earlier unit of the batch.
                Err(None) => counts.count("unreachable"),
            }
        }
        if client.is_none() {
            // A broken connection is tried again at the next request, not after RETRY: systemd
            // re-executing (`daemon-reexec`) drops every client.
            last_attempt = None;
        }
    }
}
