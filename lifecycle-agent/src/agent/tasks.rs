//! The agent's background work: seeding from cgroupfs and /proc at start, the runtime's
//! metadata (connect, refresh on demand and on a timer), rescans on notices, and expiry.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{watch, Notify};

use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns, proc},
    model::node::{NodeTracker, Notice, SeedProcess},
};

pub(super) fn handle_notices(
    notices: Vec<Notice>,
    tracker: &Mutex<NodeTracker>,
    root: &CgroupRoot,
    metadata_wanted: &Notify,
    last_rescan: &mut Option<std::time::Instant>,
) {
    let mut rescan = false;
    for notice in notices {
        match notice {
            Notice::MetadataNeeded { .. } => metadata_wanted.notify_one(),
            Notice::UnknownCgroup(_) => rescan = true,
            Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
        }
    }
    // A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
    // events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
    if rescan && last_rescan.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
        *last_rescan = Some(std::time::Instant::now());
        // A cgroup's mkdir record was lost (ring overflow, counted): learn it from cgroupfs.
        let found = root.scan();
        let now = boottime_ns();
        let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        for (id, path) in found {
            tracker.seed_cgroup(id, &path, now);
        }
    }
}

/// Cgroups and processes that existed before the programs were attached.
pub(super) fn seed(tracker: &Mutex<NodeTracker>, root: &CgroupRoot) {
    let cgroups = root.scan();
    let by_path: std::collections::HashMap<&str, u64> = cgroups.iter().map(|(id, path)| (path.as_str(), *id)).collect();
    let now = boottime_ns();
    let processes = proc::processes_at_start(&by_path);
    let cgroup_of: std::collections::HashMap<u32, u64> = processes.iter().map(|p| (p.tgid, p.cgroup_id)).collect();
    let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
    for (id, path) in &cgroups {
        tracker.seed_cgroup(*id, path, now);
    }
    for process in &processes {
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
    log::info!("found {} cgroups at start", cgroups.len());
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
