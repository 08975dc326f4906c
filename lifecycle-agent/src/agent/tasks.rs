//! The agent's background work: seeding from cgroupfs and /proc at start, the runtime's
//! metadata (connect, refresh on demand and on a timer), rescans on notices, repairs after lost
//! records, and expiry.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::{collections::HashSet, sync::Arc, time::Duration};

use prometheus::IntCounterVec;
use tokio::sync::watch;

use super::owner::ModelHandle;
use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns, proc},
    kernel::SensorMaps,
    model::node::{NodeTracker, Outcome, Resync, SeedProcess},
};

/// Cgroups and processes that existed before the programs were attached. What seeding changed
/// is returned for routing once the model's owner exists (`owner.rs`).
pub(super) fn seed(tracker: &mut NodeTracker, root: &CgroupRoot) -> Outcome {
    let cgroups = root.scan();
    let by_path: std::collections::HashMap<&str, u64> = cgroups.iter().map(|(id, path)| (path.as_str(), *id)).collect();
    let now = boottime_ns();
    let processes = proc::processes_at_start(&by_path);
    let mut outcome = Outcome::default();
    for (id, path) in &cgroups {
        outcome.extend(tracker.seed_cgroup(*id, path, now));
    }
    outcome.extend(seed_processes(tracker, &processes));
    log::info!("found {} cgroups at start", cgroups.len());
    outcome
}

/// Hands processes found in /proc (oldest first) to the tracker; it skips those it knows.
fn seed_processes(tracker: &mut NodeTracker, processes: &[proc::StartProcess]) -> Outcome {
    let cgroup_of: std::collections::HashMap<u32, u64> = processes.iter().map(|p| (p.tgid, p.cgroup_id)).collect();
    let mut outcome = Outcome::default();
    for process in processes {
        let parent_cgroup_id = cgroup_of.get(&process.ppid).copied().unwrap_or(0);
        outcome.extend(tracker.seed_process(SeedProcess {
            tgid: process.tgid,
            cgroup_id: process.cgroup_id,
            parent_cgroup_id,
            child_pid_namespace: process.child_pid_namespace,
            start_time_ns: process.start_time_ns,
            comm: &process.comm,
        }));
    }
    outcome
}

pub(super) async fn expiry_loop(tracker: ModelHandle, retention: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(30).min(retention.max(Duration::from_secs(1))));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let retention_ns = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
        tracker.update(move |tracker| tracker.expire(boottime_ns(), retention_ns)).await;
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
    tracker: ModelHandle,
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
        let Some((processes, cgroups)) = tracker
            .update_with(|tracker| ((tracker.tracked_processes(), tracker.tracked_cgroups()), Outcome::default()))
            .await
        else {
            return;
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
        let maps_now = maps.clone();
        let repaired = tracker
            .update_with(move |tracker| {
                let (report, mut outcome) = tracker.resync(
                    &confirmed_dead,
                    &confirmed_gone,
                    &on_disk,
                    |id| maps_now.take_counters(id),
                    boottime_ns(),
                );
                // Processes whose exec records were lost (in cgroups found now, or in known ones).
                outcome.extend(seed_processes(tracker, &running));
                (report, outcome)
            })
            .await;
        let Some(report) = repaired else { return };
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
    let repairs = vec_of(AgentFamily::StateRepairs, IntCounterVec::new)?;
    for kind in ["exit", "cgroup_removed", "cgroup_created"] {
        repairs.with_label_values(&[kind]).inc_by(0);
    }
    registry.register(Box::new(repairs.clone()))?;
    Ok(repairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::node::TrackerConfig;

    fn process(tgid: u32, ppid: u32, cgroup_id: u64, start_time_ns: u64, comm: &str) -> proc::StartProcess {
        proc::StartProcess { tgid, ppid, cgroup_id, child_pid_namespace: false, start_time_ns, comm: comm.into() }
    }

    #[test]
    fn processes_found_in_proc_seed_the_host_units_they_run_in_once() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        let _ = tracker.seed_cgroup(50, "/system.slice/nginx.service", 1);
        // Oldest first, as /proc is read: the first process of the cgroup is its init; its
        // child (parent in the same cgroup) is not a second unit.
        let found = [process(500, 1, 50, 10, "nginx"), process(501, 500, 50, 20, "nginx")];
        let _ = seed_processes(&mut tracker, &found);
        let units: Vec<String> = tracker.units().map(|u| u.labels().container.clone()).collect();
        assert_eq!(units, ["/system.slice/nginx.service"]);
        assert_eq!(tracker.tracked_processes().len(), 2);
        // A repair finds the same processes again: nothing is added twice.
        let _ = seed_processes(&mut tracker, &found);
        assert_eq!(tracker.tracked_processes().len(), 2);
        assert_eq!(tracker.units().count(), 1);
    }
}
