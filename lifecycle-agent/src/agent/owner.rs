//! The node model's one owner. The ring reader's thread holds the [`NodeTracker`]; nothing else
//! does. The agent's other loops (the runtime link, the Kubernetes watches, expiry, repairs,
//! Events) change it by sending a [`Change`] on a bounded channel that the owner drains beside
//! the ring, woken by the same eventfd; the readers (the API, scrapes, the probe supervisor,
//! the verdict log) read the last published [`NodeSnapshot`] without waiting for the owner.
//!
//! Every change's outcome is routed here: judgements go into the termination distributions
//! before the snapshot that shows the stop is published (a scrape never sees a judged stop
//! without its distributions), then notices go to their handlers (ask the runtime, rescan
//! cgroupfs, read the kernel's OOM line), whose own changes are routed the same way; the facts
//! of the probed containers a change touched go out on their feeds (`probe/feeds.rs`) at once.

use std::{
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus::IntCounterVec;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::{kubelet::KubeletStarts, systemd::SystemdRequests};
use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns},
    export::units::UnitMetrics,
    model::node::{Ended, NodeSnapshot, NodeTracker, Notice, Outcome},
    probe::feeds::ProbeFeeds,
};

/// One change to the model, run by its owner; what it returns is routed (see the module header).
pub(crate) type Change = Box<dyn FnOnce(&mut NodeTracker) -> Outcome + Send>;

/// A change in the owner's queue, and who waits for the snapshot that shows it (none for a
/// change told, not waited for).
struct Queued {
    change: Change,
    published: Option<oneshot::Sender<()>>,
}

/// Changes queued for the owner before a sender waits: the senders are the agent's own loops,
/// a handful of changes a second each, and a pod watch relisting a full node (110 pods) fits.
const QUEUED_CHANGES: usize = 1024;
/// Changes run in one pass before the ring is read again: a burst from the API cannot hold a
/// container's exit back by more than this many changes.
const CHANGES_PER_PASS: usize = 64;
/// A pass that only counted (execs, signals, accepts) publishes at most this often. One that
/// changed a container's state (created, named, started, ended), or ran a loop's change,
/// publishes at once: counters may lag a reader by this (a scrape is seconds apart), states do
/// not. A snapshot costs a pointer per unit, and each unit changed since the last one is copied
/// once; a node whose containers exec every 200 ms wakes the reader a thousand times a second
/// (`bench scale`: at 5 ms the agent used 3x the CPU of the lock it replaced, BENCHMARKS.md).
const COUNTING_PUBLISH_EVERY: Duration = Duration::from_millis(500);
/// A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
/// events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// How the agent's loops reach the model: changes to its owner, snapshots from it.
#[derive(Clone)]
pub(crate) struct ModelHandle {
    changes: mpsc::Sender<Queued>,
    wake: Arc<OwnedFd>,
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
}

impl ModelHandle {
    /// The published snapshots, for a reader of its own.
    pub(crate) fn snapshots(&self) -> watch::Receiver<Arc<NodeSnapshot>> {
        self.snapshots.clone()
    }

    /// Queues `change` for the owner (waiting while the queue is full), wakes it, and returns
    /// once a snapshot that shows the change is published: what the caller does next (wake the
    /// probe supervisor, answer a request) sees it. A change sent before the owner's thread runs
    /// waits for it; one sent after the owner stopped is dropped (the agent is shutting down).
    pub(crate) async fn update(&self, change: impl FnOnce(&mut NodeTracker) -> Outcome + Send + 'static) {
        let (published, shown) = oneshot::channel();
        if self.changes.send(Queued { change: Box::new(change), published: Some(published) }).await.is_ok() {
            wake(self.wake.as_fd());
            let _ = shown.await;
        }
    }

    /// Queues `change` for the owner (waiting only while the queue is full) and wakes it,
    /// without waiting for a snapshot: for a change whose effect its sender reads elsewhere
    /// (a probe's sample, whose facts the owner publishes on the probe's feed as it runs it).
    /// Nothing forces a snapshot for it; it shows in the next one.
    pub(crate) async fn tell(&self, change: impl FnOnce(&mut NodeTracker) -> Outcome + Send + 'static) {
        if self.changes.send(Queued { change: Box::new(change), published: None }).await.is_ok() {
            wake(self.wake.as_fd());
        }
    }

    /// [`update`](Self::update) for a change that also answers: its report (None if the owner
    /// stopped first).
    pub(crate) async fn update_with<T: Send + 'static>(
        &self,
        change: impl FnOnce(&mut NodeTracker) -> (T, Outcome) + Send + 'static,
    ) -> Option<T> {
        let (reply, report) = oneshot::channel();
        self.update(move |tracker| {
            let (answer, outcome) = change(tracker);
            let _ = reply.send(answer);
            outcome
        })
        .await;
        report.await.ok()
    }
}

/// An eventfd counts what is written to it: one write wakes the owner's poll. It cannot fail
/// short of the counter's overflow, and a wake-up is then pending anyway.
fn wake(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Where outcomes go besides the model (see the module header).
pub(crate) struct Routes {
    pub(crate) units: Arc<UnitMetrics>,
    pub(crate) metadata_wanted: Arc<Notify>,
    pub(crate) root: CgroupRoot,
    /// `lifecycle_state_repairs_total{kind}`: a rescan counts the cgroups it found.
    pub(crate) repairs: IntCounterVec,
    /// Whether the kernel log can be read for the limit of OOM kills.
    pub(crate) kernel_log: bool,
    /// Where the facts of probed containers are published, as each change makes them.
    pub(crate) probe_feeds: Arc<ProbeFeeds>,
    /// Where host units' settings are asked of systemd (never waited for here).
    pub(crate) systemd: SystemdRequests,
    /// Where a kubelet's start is told, for its configuration to be read again (never waited
    /// for here).
    pub(crate) kubelet: KubeletStarts,
}

/// The model and its owner's state; moved onto the ring reader's thread.
pub(crate) struct Owner {
    tracker: NodeTracker,
    changes: mpsc::Receiver<Queued>,
    /// Senders of changes run since the last snapshot, told when it is published.
    waiting: Vec<oneshot::Sender<()>>,
    wake: Arc<OwnedFd>,
    snapshots: watch::Sender<Arc<NodeSnapshot>>,
    routes: Routes,
    last_rescan: Option<Instant>,
    published_at: Instant,
    /// Changes made since the last snapshot.
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
    routes: Routes,
) -> std::io::Result<(Owner, ModelHandle)> {
    use rustix::event::{eventfd, EventfdFlags};
    let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
    let (changes_sender, changes) = mpsc::channel(QUEUED_CHANGES);
    snapshots.send_replace(Arc::new(tracker.snapshot()));
    let snapshot_receiver = snapshots.subscribe();
    let owner = Owner {
        tracker,
        changes,
        waiting: Vec::new(),
        wake: wake.clone(),
        snapshots,
        routes,
        last_rescan: None,
        published_at: Instant::now(),
        unpublished: false,
        states_changed: false,
    };
    Ok((owner, ModelHandle { changes: changes_sender, wake, snapshots: snapshot_receiver }))
}

impl Owner {
    /// The fd that wakes the owner (changes queued, or a stop).
    pub(crate) fn wake_fd(&self) -> Arc<OwnedFd> {
        self.wake.clone()
    }

    /// Clears the wake-ups counted so far; called before the queue is drained, so a change
    /// queued meanwhile wakes the next poll.
    pub(crate) fn clear_wake(&self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(self.wake.as_fd(), &mut count);
    }

    /// Runs queued changes (at most [`CHANGES_PER_PASS`]; if more wait, the next poll returns at
    /// once); the next [`publish`](Self::publish) publishes them. Returns whether any ran.
    pub(crate) fn run_changes(&mut self) -> bool {
        let mut ran = 0;
        while ran < CHANGES_PER_PASS {
            let Ok(queued) = self.changes.try_recv() else { return ran > 0 };
            self.change(queued.change);
            self.waiting.extend(queued.published);
            ran += 1;
        }
        if !self.changes.is_empty() {
            wake(self.wake.as_fd());
        }
        true
    }

    /// Runs `change` on the model and routes its outcome; returns the instances it ended.
    pub(crate) fn change(&mut self, change: impl FnOnce(&mut NodeTracker) -> Outcome) -> Vec<Ended> {
        let outcome = change(&mut self.tracker);
        self.unpublished = true;
        self.route(outcome)
    }

    fn route(&mut self, outcome: Outcome) -> Vec<Ended> {
        let Outcome { ended, states_changed, judgements, notices, probes } = outcome;
        self.states_changed |= states_changed || !ended.is_empty();
        // A probe's facts go out at once, on its own feed: the node's snapshot may wait.
        let tracker = &mut self.tracker;
        self.routes.probe_feeds.publish(probes, |key| tracker.probe_facts(key));
        self.routes.units.record_judgements(judgements);
        self.handle_notices(notices);
        ended
    }

    /// Publishes a snapshot if there are changes and a container's state changed, a loop's
    /// change waits for it, or the counting interval passed; returns how long until a pending
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

    /// Acts on notices.
    fn handle_notices(&mut self, notices: Vec<Notice>) {
        let mut rescan = false;
        let mut oom_victims = Vec::new();
        for notice in notices {
            match notice {
                Notice::MetadataNeeded { .. } => self.routes.metadata_wanted.notify_one(),
                Notice::UnknownCgroup(_) => rescan = true,
                Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
                Notice::OomLimitWanted { pid } => oom_victims.push(pid),
                Notice::SystemdUnitWanted { path, unit } => self.routes.systemd.ask(path, unit),
                Notice::KubeletStarted { pid } => self.routes.kubelet.started(pid),
            }
        }
        // One read of the log's tail for the batch's kills, however many (it costs microseconds).
        if self.routes.kernel_log && !oom_victims.is_empty() {
            match crate::discovery::kmsg::oom_kills_of(&oom_victims) {
                Ok(kills) => {
                    self.change(|tracker| {
                        let mut outcome = Outcome::default();
                        for kill in kills {
                            outcome.extend(tracker.apply_oom_log(kill, boottime_ns()));
                        }
                        outcome
                    });
                }
                Err(err) => log::warn!("reading the kernel log for an OOM kill: {err}"),
            }
        }
        if rescan && self.rescan_due() {
            // A cgroup's mkdir record was lost (ring overflow, counted): learn it from cgroupfs.
            let on_disk: Vec<(u64, String)> = self.routes.root.scan().into_iter().collect();
            let (report, outcome) = self.tracker.resync(&[], &[], &on_disk, |_| None, boottime_ns());
            self.change(|_| outcome);
            self.routes.repairs.with_label_values(&["cgroup_created"]).inc_by(report.cgroups_created_unseen as u64);
        }
    }

    /// Whether a rescan may run now (at most one per [`RESCAN_EVERY`]); if so, it is noted.
    fn rescan_due(&mut self) -> bool {
        if self.last_rescan.is_some_and(|at| at.elapsed() < RESCAN_EVERY) {
            return false;
        }
        self.last_rescan = Some(Instant::now());
        true
    }
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
