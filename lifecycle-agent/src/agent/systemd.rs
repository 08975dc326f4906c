//! Asks systemd for the settings of the host units the model meets, and hands them to the model
//! (`NodeTracker::set_systemd_unit`): a unit's stops are then judged by its `TimeoutStopSec=`
//! and its restarts by its `Restart=` and `RestartSec=`.
//!
//! The model names a unit when it starts a run (`Notice::SystemdUnitWanted`); the owner queues
//! the request here without waiting (no D-Bus call runs on the ring thread). Requests are
//! bounded ([`QUEUED`]; past it they are dropped and counted, and the unit's next run asks
//! again), one at a time, and a unit asked for again while queued is asked once. A call the link
//! lost (systemd did not answer within its timeout, or re-executed) is asked again on a new
//! connection, up to [`ATTEMPTS`] times, and so are the units behind it in the batch: a systemd
//! busy for a few seconds (a node starting many units at once) must not leave a unit's first run
//! judged without its `TimeoutStopSec=`. Without systemd (a container host with another init, or
//! `/run/systemd` not mounted into the pod) the first failure is logged and connecting is retried
//! at most every [`RETRY`]: host units are judged by no grace meanwhile, which is what they are
//! without a manager.

use std::{
    collections::{HashSet, VecDeque},
    path::PathBuf,
    time::{Duration, Instant},
};

use prometheus::{IntCounterVec, Registry};
use tokio::sync::{mpsc, watch};

use crate::{
    discovery::systemd::{SystemdClient, SystemdError},
    export::families::AgentFamily,
    model::systemd::SystemdUnit,
    ErrorChain,
};
use crate::{model::node::Command, owner::ModelHandle};

/// Requests waiting to be asked; a node starting a thousand units at once asks for each in turn.
pub(crate) const QUEUED: usize = 1024;
/// Shortest gap between two attempts to connect while systemd does not answer.
const RETRY: Duration = Duration::from_secs(30);
/// Times one unit is asked when the link fails under its call, each on a new connection.
const ATTEMPTS: u8 = 3;

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
    // Units the link failed under, with the attempts they had: asked before anything new.
    let mut again: VecDeque<(Request, u8)> = VecDeque::new();
    loop {
        let first = match again.pop_front() {
            Some(retry) => retry,
            None => tokio::select! {
                request = requests.recv() => match request { Some(request) => (request, 0), None => return },
                _ = shutdown.changed() => return,
            },
        };
        // Whatever else waits now, each unit once.
        let mut batch = vec![first];
        batch.extend(again.drain(..));
        while let Ok(request) = requests.try_recv() {
            batch.push((request, 0));
        }
        let mut seen = HashSet::new();
        batch.retain(|((path, _), _)| seen.insert(path.clone()));
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
        let asked = tokio::task::spawn_blocking(move || ask_batch(connected, batch)).await;
        let Ok((answers, kept)) = asked else {
            log::warn!("asking systemd for unit settings stopped");
            continue;
        };
        client = kept;
        for answer in answers {
            match answer {
                Answer::Read { path, facts } => {
                    counts.count("read");
                    model.update(Command::SystemdUnit { path, facts }).await;
                }
                Answer::Refused => counts.count("failed"),
                Answer::LinkLost { request, attempts } if attempts < ATTEMPTS => again.push_back((request, attempts)),
                Answer::LinkLost { .. } => counts.count("failed"),
            }
        }
        if client.is_none() {
            // A broken connection is tried again at once, not after RETRY: systemd re-executing
            // (`daemon-reexec`) drops every client.
            last_attempt = None;
        }
    }
}

/// What asking for one unit came to.
enum Answer {
    Read {
        path: String,
        facts: SystemdUnit,
    },
    /// systemd answered with an error (the unit is gone, or it refused): not asked again.
    Refused,
    /// The link failed under this call, or before it: asked again on a new connection, with the
    /// attempts it has had.
    LinkLost {
        request: Request,
        attempts: u8,
    },
}

/// What answers for a unit's settings: systemd over D-Bus ([`SystemdClient`]), or a test's
/// stand-in.
trait UnitSettings {
    fn unit(&self, name: &str) -> Result<SystemdUnit, SystemdError>;
}

impl UnitSettings for SystemdClient {
    fn unit(&self, name: &str) -> Result<SystemdUnit, SystemdError> {
        SystemdClient::unit(self, name)
    }
}

/// Asks for each unit of `batch` in turn on `connected` (blocking); the connection comes back
/// unless the link failed. A call that lost the link counts an attempt of its unit; the units
/// after it are not asked on this connection and keep theirs.
fn ask_batch<C: UnitSettings>(connected: C, batch: Vec<(Request, u8)>) -> (Vec<Answer>, Option<C>) {
    let mut answers = Vec::with_capacity(batch.len());
    let mut broken = false;
    for ((path, unit), attempts) in batch {
        if broken {
            answers.push(Answer::LinkLost { request: (path, unit), attempts });
            continue;
        }
        match connected.unit(&unit) {
            Ok(facts) => answers.push(Answer::Read { path, facts }),
            Err(err) => {
                log::debug!("{}", ErrorChain(&err));
                if err.keeps_connection() {
                    answers.push(Answer::Refused);
                } else {
                    broken = true;
                    answers.push(Answer::LinkLost { request: (path, unit), attempts: attempts + 1 });
                }
            }
        }
    }
    (answers, (!broken).then_some(connected))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Answers from a script, one per call, in order.
    struct Scripted(RefCell<VecDeque<Result<(), &'static str>>>);

    impl UnitSettings for Scripted {
        fn unit(&self, name: &str) -> Result<SystemdUnit, SystemdError> {
            let source = |error: &str| dbus::Error::new_custom(error, "scripted");
            match self.0.borrow_mut().pop_front().expect("a scripted answer") {
                Ok(()) => Ok(SystemdUnit { name: name.to_owned(), ..SystemdUnit::default() }),
                Err(error) if error.starts_with("org.freedesktop.DBus.") => {
                    Err(SystemdError::Broken { call: "GetAll", unit: name.to_owned(), source: source(error) })
                }
                Err(error) => Err(SystemdError::Call { call: "GetUnit", unit: name.to_owned(), source: source(error) }),
            }
        }
    }

    fn request(name: &str, attempts: u8) -> (Request, u8) {
        ((format!("/system.slice/{name}"), name.to_owned()), attempts)
    }

    fn summary(answers: &[Answer]) -> Vec<String> {
        answers
            .iter()
            .map(|answer| match answer {
                Answer::Read { facts, .. } => format!("read {}", facts.name),
                Answer::Refused => "refused".to_owned(),
                Answer::LinkLost { request: (_, unit), attempts } => format!("again {unit} after {attempts}"),
            })
            .collect()
    }

    #[test]
    fn a_lost_link_sends_its_unit_and_those_behind_it_round_again() {
        // systemd too slow for the second call: that unit has had one attempt, the third none,
        // and the connection is not kept.
        let script = Scripted(RefCell::new(VecDeque::from([Ok(()), Err("org.freedesktop.DBus.Error.NoReply")])));
        let batch = vec![request("a.service", 0), request("stop.service", 0), request("c.service", 2)];
        let (answers, kept) = ask_batch(script, batch);
        assert_eq!(summary(&answers), ["read a.service", "again stop.service after 1", "again c.service after 2"]);
        assert!(kept.is_none());
    }

    #[test]
    fn systemds_refusal_keeps_the_connection_and_is_not_asked_again() {
        let script = Scripted(RefCell::new(VecDeque::from([Err("org.freedesktop.systemd1.NoSuchUnit"), Ok(())])));
        let (answers, kept) = ask_batch(script, vec![request("gone.service", 0), request("web.service", 0)]);
        assert_eq!(summary(&answers), ["refused", "read web.service"]);
        assert!(kept.is_some());
    }
}
