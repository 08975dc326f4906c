//! The tracker as the agent's loops share it. Every change to the model goes through
//! [`SharedTracker::update`] (the ring reader's batches too), which routes what the change returned: judgements into the termination distributions while
//! the tracker's lock is still held (a scrape never sees a judged stop without its
//! distributions), then notices to their handlers (ask the runtime, rescan cgroupfs, read the
//! kernel's OOM line), whose own changes are routed the same way. Readers (the API, scrapes, the
//! probe supervisor) hold the same `Arc<Mutex<NodeTracker>>` and only read through it.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use prometheus::IntCounterVec;
use tokio::sync::Notify;

use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns},
    export::units::UnitMetrics,
    model::node::{NodeTracker, Notice, Outcome},
};

/// A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
/// events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// The tracker and where its outcomes go (see the module header).
pub(crate) struct SharedTracker {
    tracker: Arc<Mutex<NodeTracker>>,
    units: Arc<UnitMetrics>,
    metadata_wanted: Arc<Notify>,
    root: CgroupRoot,
    /// `lifecycle_state_repairs_total{kind}`: a rescan counts the cgroups it found.
    repairs: IntCounterVec,
    /// Whether the kernel log can be read for the limit of OOM kills.
    kernel_log: bool,
    last_rescan: Mutex<Option<Instant>>,
}

impl SharedTracker {
    pub(crate) fn new(
        tracker: Arc<Mutex<NodeTracker>>,
        units: Arc<UnitMetrics>,
        metadata_wanted: Arc<Notify>,
        root: CgroupRoot,
        repairs: IntCounterVec,
        kernel_log: bool,
    ) -> Self {
        Self { tracker, units, metadata_wanted, root, repairs, kernel_log, last_rescan: Mutex::new(None) }
    }

    /// The tracker, locked: for reading, and for the calls that return no outcome (they judge
    /// nothing and raise no notice, so there is nothing to route).
    pub(crate) fn lock(&self) -> MutexGuard<'_, NodeTracker> {
        self.tracker.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Runs `change` on the tracker and routes the outcome it returns.
    pub(crate) fn update(&self, change: impl FnOnce(&mut NodeTracker) -> Outcome) {
        self.update_with(|tracker| ((), change(tracker)));
    }

    /// [`update`](Self::update) for a change that also returns a report of its own.
    pub(crate) fn update_with<T>(&self, change: impl FnOnce(&mut NodeTracker) -> (T, Outcome)) -> T {
        let (report, notices) = {
            let mut tracker = self.lock();
            let (report, outcome) = change(&mut tracker);
            self.units.record_judgements(outcome.judgements);
            (report, outcome.notices)
        };
        self.handle_notices(notices);
        report
    }

    /// Acts on notices; called with the tracker unlocked.
    fn handle_notices(&self, notices: Vec<Notice>) {
        let mut rescan = false;
        let mut oom_victims = Vec::new();
        for notice in notices {
            match notice {
                Notice::MetadataNeeded { .. } => self.metadata_wanted.notify_one(),
                Notice::UnknownCgroup(_) => rescan = true,
                Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
                Notice::OomLimitWanted { pid } => oom_victims.push(pid),
            }
        }
        // One read of the log's tail for the batch's kills, however many (it costs microseconds).
        if self.kernel_log && !oom_victims.is_empty() {
            match crate::discovery::kmsg::oom_kills_of(&oom_victims) {
                Ok(kills) => self.update(|tracker| {
                    let mut outcome = Outcome::default();
                    for kill in kills {
                        outcome.extend(tracker.apply_oom_log(kill, boottime_ns()));
                    }
                    outcome
                }),
                Err(err) => log::warn!("reading the kernel log for an OOM kill: {err}"),
            }
        }
        if rescan && self.rescan_due() {
            // A cgroup's mkdir record was lost (ring overflow, counted): learn it from cgroupfs.
            let on_disk: Vec<(u64, String)> = self.root.scan().into_iter().collect();
            let report = self.update_with(|tracker| tracker.resync(&[], &[], &on_disk, |_| None, boottime_ns()));
            self.repairs.with_label_values(&["cgroup_created"]).inc_by(report.cgroups_created_unseen as u64);
        }
    }

    /// Whether a rescan may run now (at most one per [`RESCAN_EVERY`]); if so, it is noted.
    fn rescan_due(&self) -> bool {
        let mut last = self.last_rescan.lock().unwrap_or_else(|poison| poison.into_inner());
        if last.is_some_and(|at| at.elapsed() < RESCAN_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use futures::FutureExt as _;
    use lifecycle_common::CgroupCounters;

    use super::*;
    use crate::{
        export::units::KernelCounters,
        model::{
            event::{CgroupDetail, Detail, Event, SignalResult},
            metadata::{ContainerMeta, ContainerState, KubeletAnnotations},
            node::TrackerConfig,
        },
    };

    const SECOND: u64 = 1_000_000_000;
    const CGROUP: u64 = 4242;
    const POD_UID: &str = "00000000-0000-0000-0000-000000000001";

    struct NoKernel;

    impl KernelCounters for NoKernel {
        fn read_all(&self, _: &mut HashMap<u64, CgroupCounters>) {}
    }

    fn container_id() -> String {
        "ab".repeat(32)
    }

    fn event(time_ns: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
        Event { time_ns, pid: tgid, tgid, cgroup_id, detail }
    }

    fn meta() -> ContainerMeta {
        ContainerMeta {
            container_id: container_id(),
            pod_sandbox_id: "sandbox".into(),
            pod_name: "web-1".into(),
            pod_namespace: "shop".into(),
            pod_uid: POD_UID.into(),
            container_name: "app".into(),
            attempt: 0,
            kubelet: KubeletAnnotations { termination_grace_period_ns: Some(30 * SECOND), ..Default::default() },
            probe_declaration: None,
            state: ContainerState::Running,
            exit_code: None,
            reason: None,
            message: None,
            created_ns: 0,
            started_ns: None,
            finished_ns: None,
        }
    }

    /// A shared tracker with the routes the agent gives it, and the pieces a test looks at.
    fn shared() -> (SharedTracker, Arc<UnitMetrics>, Arc<Notify>, IntCounterVec) {
        let tracker =
            Arc::new(Mutex::new(NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() })));
        let units =
            Arc::new(UnitMetrics::new(tracker.clone(), Arc::new(NoKernel), Box::new(|| 10 * SECOND), Box::new(|| 0.0)));
        let wanted = Arc::new(Notify::new());
        let repairs = IntCounterVec::new(prometheus::Opts::new("repairs", "test"), &["kind"]).expect("counter");
        let root = CgroupRoot::at("/nonexistent-cgroupfs-for-a-test");
        let shared = SharedTracker::new(tracker, units.clone(), wanted.clone(), root, repairs.clone(), false);
        (shared, units, wanted, repairs)
    }

    fn duration_count(units: &UnitMetrics) -> Option<String> {
        let mut text = String::new();
        units.render(&mut text);
        text.lines().find(|l| l.starts_with("lifecycle_termination_duration_seconds_count{")).map(str::to_owned)
    }

    #[test]
    fn a_changes_judgements_reach_the_distributions_and_its_notices_their_handlers() {
        let (shared, units, wanted, _) = shared();
        let path = format!("/kubepods/burstable/pod{POD_UID}/{}", container_id());
        let mkdir = Detail::CgroupMkdir(CgroupDetail { id: CGROUP, path, truncated: false });
        shared.update(|tracker| tracker.apply(&event(SECOND, 1, 1, mkdir)));
        // A container the runtime has not named yet: the runtime is asked at once.
        assert!(wanted.notified().now_or_never().is_some(), "MetadataNeeded woke the runtime link");

        shared.update(|tracker| tracker.set_metadata(vec![meta()]));
        let exec = Detail::Exec {
            parent_tgid: 1,
            parent_cgroup_id: 1,
            namespace_init: true,
            child_pid_namespace: true,
            start_time_ns: 2 * SECOND,
            comm: "app".into(),
        };
        shared.update(|tracker| tracker.apply(&event(2 * SECOND, 100, CGROUP, exec)));
        let term = Detail::Signal {
            signal: 15,
            result: SignalResult::Delivered,
            group: true,
            target_pid: 100,
            target_tgid: 100,
            target_cgroup_id: CGROUP,
            sender_comm: "containerd-shim".into(),
            target_comm: "app".into(),
        };
        shared.update(|tracker| tracker.apply(&event(3 * SECOND, 7, 7, term)));
        assert_eq!(duration_count(&units), None, "nothing judged yet");
        let exit = Detail::Exit {
            exit_status: Some(0),
            signal: None,
            core_dumped: false,
            group_dead: true,
            parent_tgid: 1,
            start_time_ns: 2 * SECOND,
            cpu_time_ns: 1,
            comm: "app".into(),
        };
        shared.update(|tracker| tracker.apply(&event(4 * SECOND, 100, CGROUP, exit)));
        let count = duration_count(&units).expect("the stop is in the distributions");
        assert!(count.contains("namespace=\"shop\"") && count.ends_with(" 1"), "{count}");
        // A scrape reads; it takes nothing from the model (a second one says the same).
        assert_eq!(duration_count(&units), Some(count));
    }

    #[test]
    fn rescans_are_at_most_one_a_second() {
        let (shared, _, _, _) = shared();
        assert!(shared.rescan_due());
        assert!(!shared.rescan_due(), "a second notice within the second waits");
    }
}
