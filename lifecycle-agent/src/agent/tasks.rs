//! The agent's background work: seeding from cgroupfs and /proc at start, the runtime's
//! metadata (connect, refresh on demand and on a timer), rescans on notices, repairs after lost
//! records, and expiry.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus::IntCounterVec;
use tokio::sync::{watch, Notify};

use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns, proc},
    kernel::SensorMaps,
    model::node::{NodeTracker, Notice, Resync, SeedProcess},
};

pub(super) fn handle_notices(
    notices: Vec<Notice>,
    kernel_log: bool,
    tracker: &Mutex<NodeTracker>,
    root: &CgroupRoot,
    metadata_wanted: &Notify,
    last_rescan: &mut Option<std::time::Instant>,
    repairs: &IntCounterVec,
) {
    let mut rescan = false;
    let mut oom_victims = Vec::new();
    for notice in notices {
        match notice {
            Notice::MetadataNeeded { .. } => metadata_wanted.notify_one(),
            Notice::UnknownCgroup(_) => rescan = true,
            Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
            Notice::OomLimitWanted { pid } => oom_victims.push(pid),
        }
    }
    // One read of the log's tail for the batch's kills, however many (it costs microseconds).
    if kernel_log && !oom_victims.is_empty() {
        match crate::discovery::kmsg::oom_kills_of(&oom_victims) {
            Ok(kills) => {
                let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
                for kill in kills {
                    tracker.apply_oom_log(kill, boottime_ns());
                }
            }
            Err(err) => log::warn!("reading the kernel log for an OOM kill: {err}"),
        }
    }
    // A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
    // events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
    if rescan && last_rescan.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
        *last_rescan = Some(std::time::Instant::now());
        // A cgroup's mkdir record was lost (ring overflow, counted): learn it from cgroupfs.
        let on_disk: Vec<(u64, String)> = root.scan().into_iter().collect();
        let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        let report = tracker.resync(&[], &[], &on_disk, |_| None, boottime_ns());
        repairs.with_label_values(&["cgroup_created"]).inc_by(report.cgroups_created_unseen as u64);
    }
}

/// Cgroups and processes that existed before the programs were attached.
pub(super) fn seed(tracker: &Mutex<NodeTracker>, root: &CgroupRoot) {
    let cgroups = root.scan();
    let by_path: std::collections::HashMap<&str, u64> = cgroups.iter().map(|(id, path)| (path.as_str(), *id)).collect();
    let now = boottime_ns();
    let processes = proc::processes_at_start(&by_path);
    {
        let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        for (id, path) in &cgroups {
            tracker.seed_cgroup(*id, path, now);
        }
    }
    seed_processes(tracker, &processes);
    log::info!("found {} cgroups at start", cgroups.len());
}

/// Hands processes found in /proc (oldest first) to the tracker; it skips those it knows.
fn seed_processes(tracker: &Mutex<NodeTracker>, processes: &[proc::StartProcess]) {
    let cgroup_of: std::collections::HashMap<u32, u64> = processes.iter().map(|p| (p.tgid, p.cgroup_id)).collect();
    let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
    for process in processes {
        let parent_cgroup_id = cgroup_of.get(&process.ppid).copied().unwrap_or(0);
        tracker.seed_process(SeedProcess {
            tgid: process.tgid,
            cgroup_id: process.cgroup_id,
            parent_cgroup_id,
            child_pid_namespace: process.child_pid_namespace,
            start_time_ns: process.start_time_ns,
            comm: &process.comm,
        });
    }
}

pub(super) async fn expiry_loop(
    tracker: Arc<Mutex<NodeTracker>>,
    retention: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(30).min(retention.max(Duration::from_secs(1))));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let retention_ns = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
        tracker.lock().unwrap_or_else(|poison| poison.into_inner()).expire(boottime_ns(), retention_ns);
    }
}

/// Whether the kernel log can be read for the limit of OOM kills; one line when it cannot.
pub(super) fn kernel_log_readable() -> bool {
    match crate::discovery::kmsg::readable() {
        Ok(()) => true,
        Err(err) => {
            log::info!("the kernel log is not readable ({err}; CAP_SYSLOG): OOM kills are reported without the limit that fired");
            false
        }
    }
}

/// After the ring lost records, the state they would have changed is repaired from the node
/// itself: every second the kernel's loss counters are read; when they grew, tracked processes
/// are checked against /proc and tracked cgroups against cgroupfs. What looks gone is repaired
/// only if it still looks gone a second later, so that a record still in the ring is applied
/// first with its real facts (exit status, time); cgroups found are seeded at once.
pub(super) async fn resync_loop(
    tracker: Arc<Mutex<NodeTracker>>,
    maps: Arc<SensorMaps>,
    root: CgroupRoot,
    repairs: IntCounterVec,
    mut shutdown: watch::Receiver<bool>,
) {
    let lost = || maps.kind_stats().iter().map(|k| k.lost).sum::<u64>();
    let mut seen_lost = lost();
    // What looked gone at the last look: processes (tgid, start) and cgroups.
    type Suspects = (HashSet<(u32, u64)>, HashSet<u64>);
    let mut suspects: Option<Suspects> = None;
    let mut rounds_left = 0u32;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now_lost = lost();
        if now_lost != seen_lost {
            seen_lost = now_lost;
            // Three looks: the first seeds what was created unseen and notes what looks gone,
            // the second confirms that (and notes anything seeded that ended meanwhile, whose
            // exit record was applied before its seeding), the third confirms the rest.
            rounds_left = 3;
        }
        if rounds_left == 0 && suspects.is_none() {
            continue;
        }
        rounds_left = rounds_left.saturating_sub(1);
        let (processes, cgroups) = {
            let tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
            (tracker.tracked_processes(), tracker.tracked_cgroups())
        };
        let root = root.clone();
        // /proc and cgroupfs reads block: off the async workers.
        let looked = tokio::task::spawn_blocking(move || {
            let dead: HashSet<(u32, u64)> =
                processes.into_iter().filter(|&(tgid, start)| !proc::still_runs(tgid, start)).collect();
            let on_disk = root.scan();
            let present: HashSet<u64> = on_disk.keys().copied().collect();
            let gone: HashSet<u64> = cgroups.into_iter().filter(|id| !present.contains(id)).collect();
            let by_path: std::collections::HashMap<&str, u64> =
                on_disk.iter().map(|(id, path)| (path.as_str(), *id)).collect();
            let running = proc::processes_at_start(&by_path);
            (dead, gone, on_disk, running)
        })
        .await;
        let Ok((dead, gone, on_disk, running)) = looked else { continue };
        let (confirmed_dead, confirmed_gone): (Vec<u32>, Vec<u64>) = match suspects.take() {
            Some((was_dead, was_gone)) => (
                dead.intersection(&was_dead).map(|&(tgid, _)| tgid).collect(),
                gone.intersection(&was_gone).copied().collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        if !dead.is_empty() || !gone.is_empty() {
            suspects = Some((dead, gone));
        }
        let on_disk: Vec<(u64, String)> = on_disk.into_iter().collect();
        let report = tracker.lock().unwrap_or_else(|poison| poison.into_inner()).resync(
            &confirmed_dead,
            &confirmed_gone,
            &on_disk,
            |id| maps.take_counters(id),
            boottime_ns(),
        );
        // Processes whose exec records were lost (in cgroups found now, or in known ones).
        seed_processes(&tracker, &running);
        repairs.with_label_values(&["exit"]).inc_by(report.exits_unseen as u64);
        repairs.with_label_values(&["cgroup_removed"]).inc_by(report.cgroups_removed_unseen as u64);
        repairs.with_label_values(&["cgroup_created"]).inc_by(report.cgroups_created_unseen as u64);
        if report != Resync::default() {
            log::warn!(
                "records were lost (lifecycle_events_lost_total): repaired from /proc and cgroupfs: {} exits, {} cgroups removed, {} created",
                report.exits_unseen,
                report.cgroups_removed_unseen,
                report.cgroups_created_unseen
            );
        }
    }
}

/// `lifecycle_state_repairs_total{kind}`: what [`resync_loop`] repaired.
pub(super) fn register_repairs(registry: &prometheus::Registry) -> Result<IntCounterVec, prometheus::Error> {
    let repairs = IntCounterVec::new(
        prometheus::Opts::new(
            "state_repairs_total",
            "State repaired from /proc and cgroupfs after ring records were lost, by kind: exit (a process found gone), cgroup_removed, cgroup_created.",
        )
        .namespace(crate::export::metrics::NAMESPACE),
        &["kind"],
    )?;
    for kind in ["exit", "cgroup_removed", "cgroup_created"] {
        repairs.with_label_values(&[kind]).inc_by(0);
    }
    registry.register(Box::new(repairs.clone()))?;
    Ok(repairs)
}
