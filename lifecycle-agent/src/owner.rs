//! The node model's one owner and its doors. The ring reader's thread holds the
//! [`NodeTracker`]; nothing else does.
//!
//! - **In: commands.** The agent's loops (the runtime link, the Kubernetes watches, expiry,
//!   repairs, the probes, systemd, the kubelet, the memory sampler) send a
//!   [`Command`], data, through a [`ModelHandle`] on a bounded
//!   channel that the owner drains beside the ring, woken by the same eventfd; the reader hands it
//!   the ring's events as commands too. Each is applied by the model's one call,
//!   `NodeTracker::handle`.
//! - **Out: outcomes to sinks.** What a command changed that others act on goes to the sinks
//!   `agent::run` registers ([`Sinks`]): judgements into the termination distributions before the
//!   snapshot that shows the stop is published (a scrape never sees a judged stop without its
//!   distributions), the facts of the probed containers it touched onto their feeds at once,
//!   notices and warnings to the agent's handlers. The owner knows them by their traits only.
//! - **Out: snapshots to readers.** The API, scrapes, the probe supervisor, the verdict log and
//!   the loops read the last published [`NodeSnapshot`] without waiting for the owner; nothing
//!   reads the model through the command door.
//!
//! With `LIFECYCLE_RECORD_COMMANDS=<file>` in its environment the agent writes every command it
//! handles, with its time, to that file (one JSON object a line, written by a thread of its own),
//! for a test to replay (`lifecycle-model/tests/replay.rs`).

use std::{
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    discovery::clock::boottime_ns,
    model::{
        node::{Command, Ended, Judgement, NodeSnapshot, NodeTracker, Notice, Outcome, PodWarning, ProbeChanges},
        node::{ProbeFacts, ProbeKey},
        time::BootTime,
    },
};

/// Commands queued for the owner before a sender waits: the senders are the agent's own loops,
/// a handful of commands a second each, and a pod watch relisting a full node (110 pods) fits.
const QUEUED_COMMANDS: usize = 1024;
/// Commands run in one pass before the ring is read again: a burst from the API cannot hold a
/// container's exit back by more than this many.
const COMMANDS_PER_PASS: usize = 64;
/// A pass that only counted (execs, signals, accepts) publishes at most this often. One that
/// changed a container's state (created, named, started, ended), or ran a loop's command,
/// publishes at once: counters may lag a reader by this (a scrape is seconds apart), states do
/// not. A snapshot costs a pointer per unit, and each unit changed since the last one is copied
/// once; a node whose containers exec every 200 ms wakes the reader a thousand times a second
/// (`bench scale`: at 5 ms the agent used 3x the CPU of the lock it replaced, BENCHMARKS.md).
const COUNTING_PUBLISH_EVERY: Duration = Duration::from_millis(500);

/// Where the termination judgements go (the distributions, `export/units.rs`).
pub(crate) trait JudgementSink: Send + Sync {
    fn record_judgements(&self, judged: Vec<Judgement>);
}

/// Where the facts of probed containers go as each command changes them (their feeds,
/// `probe/feeds.rs`); `facts` tells a container's facts now.
pub(crate) trait ProbeSink: Send + Sync {
    fn publish(&self, changes: ProbeChanges, facts: &mut dyn FnMut(&ProbeKey) -> Option<ProbeFacts>);
}

/// Where notices and warnings go (the agent's handlers, `agent/notices.rs`). Called on the
/// owner's thread: it hands work to other tasks and never waits.
pub(crate) trait NoticeSink: Send {
    fn notices(&mut self, notices: Vec<Notice>);
    fn warnings(&mut self, warnings: Vec<PodWarning>);
}

/// The sinks of outcomes, registered by `agent::run` (see the module header).
pub(crate) struct Sinks {
    pub(crate) judgements: Arc<dyn JudgementSink>,
    pub(crate) probes: Arc<dyn ProbeSink>,
    pub(crate) notices: Box<dyn NoticeSink>,
}

/// Takes a cgroup's last counts from the kernel's map, freeing its entry.
pub(crate) type TakeCounters = Box<dyn FnMut(u64) -> Option<lifecycle_common::CgroupCounters> + Send>;

/// A command in the owner's queue, and who waits for the snapshot that shows it (none for a
/// command told, not waited for).
struct Queued {
    command: Command,
    published: Option<oneshot::Sender<()>>,
}

/// How the agent's loops reach the model: commands to its owner, snapshots from it.
#[derive(Clone)]
pub(crate) struct ModelHandle {
    commands: mpsc::Sender<Queued>,
    wake: Arc<OwnedFd>,
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
}

impl ModelHandle {
    /// The published snapshots, for a reader of its own.
    pub(crate) fn snapshots(&self) -> watch::Receiver<Arc<NodeSnapshot>> {
        self.snapshots.clone()
    }

    /// Queues `command` for the owner (waiting while the queue is full), wakes it, and returns
    /// once a snapshot that shows it is published: what the caller does next (wake the probe
    /// supervisor, answer a request) sees it. A command sent before the owner's thread runs
    /// waits for it; one sent after the owner stopped is dropped (the agent is shutting down).
    pub(crate) async fn update(&self, command: Command) {
        let (published, shown) = oneshot::channel();
        if self.commands.send(Queued { command, published: Some(published) }).await.is_ok() {
            wake(self.wake.as_fd());
            let _ = shown.await;
        }
    }

    /// Queues `command` for the owner (waiting only while the queue is full) and wakes it,
    /// without waiting for a snapshot: for a command whose effect its sender reads elsewhere
    /// (a probe's sample, whose facts the owner publishes on the probe's feed as it runs it).
    /// Nothing forces a snapshot for it; it shows in the next one.
    pub(crate) async fn tell(&self, command: Command) {
        if self.commands.send(Queued { command, published: None }).await.is_ok() {
            wake(self.wake.as_fd());
        }
    }

    /// [`update`](Self::update) of each of `commands`, in order, from a thread outside the
    /// runtime (the probe supervisor's pass on the blocking pool); returns once a snapshot that
    /// shows the last is published (the owner runs them in the order queued).
    pub(crate) fn update_all_blocking(&self, commands: Vec<Command>) {
        let count = commands.len();
        let (published, shown) = oneshot::channel();
        let mut published = Some(published);
        for (n, command) in commands.into_iter().enumerate() {
            let waits = if n + 1 == count { published.take() } else { None };
            if self.commands.blocking_send(Queued { command, published: waits }).is_err() {
                return;
            }
            wake(self.wake.as_fd());
        }
        if count > 0 {
            let _ = shown.blocking_recv();
        }
    }
}

/// An eventfd counts what is written to it: one write wakes the owner's poll. It cannot fail
/// short of the counter's overflow, and a wake-up is then pending anyway.
fn wake(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// The model and its owner's state; moved onto the ring reader's thread.
pub(crate) struct Owner {
    tracker: NodeTracker,
    commands: mpsc::Receiver<Queued>,
    /// Senders of commands run since the last snapshot, told when it is published.
    waiting: Vec<oneshot::Sender<()>>,
    wake: Arc<OwnedFd>,
    snapshots: watch::Sender<Arc<NodeSnapshot>>,
    sinks: Sinks,
    /// Takes a cgroup's last counts from the kernel's map (`SensorMaps::take_counters`), for a
    /// repair that removes cgroups whose removal the ring lost.
    counters: Option<TakeCounters>,
    /// Where handled commands are written, when recording (see the module header).
    recorder: Option<std::sync::mpsc::Sender<(BootTime, Command)>>,
    published_at: Instant,
    /// Commands handled since the last snapshot.
    unpublished: bool,
    /// Among them, a container's state changed: the next pass publishes at once.
    states_changed: bool,
}

/// The channel snapshots are published on, starting with `tracker`'s (made before the owner:
/// the scrapes' exporter reads it, and the owner routes judgements to that exporter).
pub(crate) fn snapshots_of(tracker: &NodeTracker) -> watch::Sender<Arc<NodeSnapshot>> {
    watch::Sender::new(Arc::new(tracker.snapshot()))
}

/// Makes the owner of `tracker` and the handle to reach it; snapshots go to `snapshots`, the
/// first at once.
pub(crate) fn own(
    tracker: NodeTracker,
    snapshots: watch::Sender<Arc<NodeSnapshot>>,
    sinks: Sinks,
) -> std::io::Result<(Owner, ModelHandle)> {
    use rustix::event::{eventfd, EventfdFlags};
    let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
    let (commands_sender, commands) = mpsc::channel(QUEUED_COMMANDS);
    snapshots.send_replace(Arc::new(tracker.snapshot()));
    let snapshot_receiver = snapshots.subscribe();
    let owner = Owner {
        tracker,
        commands,
        waiting: Vec::new(),
        wake: wake.clone(),
        snapshots,
        sinks,
        counters: None,
        recorder: None,
        published_at: Instant::now(),
        unpublished: false,
        states_changed: false,
    };
    Ok((owner, ModelHandle { commands: commands_sender, wake, snapshots: snapshot_receiver }))
}

impl Owner {
    /// Writes every command handled from now on to `path` (see the module header), on a thread
    /// of its own: the owner's thread does no file I/O.
    pub(crate) fn record_to(&mut self, path: std::path::PathBuf) -> std::io::Result<()> {
        use std::io::Write as _;
        let file = std::fs::File::create(&path)?;
        let (sender, received) = std::sync::mpsc::channel::<(BootTime, Command)>();
        std::thread::Builder::new().name("command-recorder".into()).spawn(move || {
            let mut out = std::io::BufWriter::new(file);
            for (at, command) in received {
                let line = serde_json::json!({ "at": at, "command": command });
                if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                    log::warn!("recording commands to {} stopped: the file cannot be written", path.display());
                    return;
                }
            }
        })?;
        self.recorder = Some(sender);
        Ok(())
    }

    /// Where a repair's departing cgroups' counts are taken from (see [`TakeCounters`]).
    pub(crate) fn take_counters_with(&mut self, take: TakeCounters) {
        self.counters = Some(take);
    }

    /// The fd that wakes the owner (commands queued, or a stop).
    pub(crate) fn wake_fd(&self) -> Arc<OwnedFd> {
        self.wake.clone()
    }

    /// Clears the wake-ups counted so far; called before the queue is drained, so a command
    /// queued meanwhile wakes the next poll.
    pub(crate) fn clear_wake(&self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(self.wake.as_fd(), &mut count);
    }

    /// Runs queued commands (at most [`COMMANDS_PER_PASS`]; if more wait, the next poll returns
    /// at once); the next [`publish`](Self::publish) publishes them. Returns whether any ran.
    pub(crate) fn run_queued(&mut self) -> bool {
        let mut ran = 0;
        let now = BootTime::from_ns(boottime_ns());
        while ran < COMMANDS_PER_PASS {
            let Ok(queued) = self.commands.try_recv() else { return ran > 0 };
            self.handle_all([queued.command], now);
            self.waiting.extend(queued.published);
            ran += 1;
        }
        if !self.commands.is_empty() {
            wake(self.wake.as_fd());
        }
        true
    }

    /// Applies `commands` at `now` in order and routes what they changed, at once for all of
    /// them; returns the instances they ended.
    pub(crate) fn handle_all(&mut self, commands: impl IntoIterator<Item = Command>, now: BootTime) -> Vec<Ended> {
        let mut outcome = Outcome::default();
        for mut command in commands {
            if let Command::Resync(look) = &mut command {
                // The counts of the cgroups this look removes, as the reader takes those of a
                // cgroup whose removal it saw (the map entry is freed for reuse after).
                look.departing = self.departing_counters(self.tracker.cgroups_a_look_removes(look));
            }
            if let Some(recorder) = &self.recorder {
                let _ = recorder.send((now, command.clone()));
            }
            outcome.extend(self.tracker.handle(command, now));
        }
        self.unpublished = true;
        self.route(outcome)
    }

    /// The kernel's last counts of `cgroups`, taken from its map (see [`TakeCounters`]).
    fn departing_counters(&mut self, cgroups: Vec<u64>) -> Vec<crate::model::node::DepartingCounters> {
        let Some(take) = self.counters.as_mut() else { return Vec::new() };
        cgroups
            .into_iter()
            .filter_map(|cgroup_id| {
                take(cgroup_id).map(|counters| crate::model::node::DepartingCounters { cgroup_id, counters })
            })
            .collect()
    }

    fn route(&mut self, outcome: Outcome) -> Vec<Ended> {
        let Outcome { ended, states_changed, judgements, notices, probes, warnings } = outcome;
        self.states_changed |= states_changed || !ended.is_empty();
        // A probe's facts go out at once, on its own feed: the node's snapshot may wait.
        let tracker = &mut self.tracker;
        self.sinks.probes.publish(probes, &mut |key| tracker.probe_facts(key));
        if !judgements.is_empty() {
            self.sinks.judgements.record_judgements(judgements);
        }
        if !notices.is_empty() {
            self.sinks.notices.notices(notices);
        }
        if !warnings.is_empty() {
            self.sinks.notices.warnings(warnings);
        }
        ended
    }

    /// Publishes a snapshot if there are changes and a container's state changed, a loop's
    /// command waits for it, or the counting interval passed; returns how long until a pending
    /// one is due.
    pub(crate) fn publish(&mut self) -> Option<Duration> {
        if !self.unpublished {
            return None;
        }
        let since = self.published_at.elapsed();
        if !self.states_changed && self.waiting.is_empty() && since < COUNTING_PUBLISH_EVERY {
            return Some(COUNTING_PUBLISH_EVERY - since);
        }
        self.snapshots.send_replace(Arc::new(self.tracker.snapshot()));
        self.published_at = Instant::now();
        self.unpublished = false;
        self.states_changed = false;
        for waiting in self.waiting.drain(..) {
            let _ = waiting.send(());
        }
        None
    }
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
