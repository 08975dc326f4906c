//! The agent's background work: seeding from cgroupfs and /proc at start, rescans on notices,
//! the kernel log's OOM lines, repairs after lost records, and expiry. Each reads the node off
//! the model owner's thread and sends what it found as a command.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::time::{Duration, Instant};

use prometheus::IntCounterVec;
use tokio::sync::{mpsc, watch, Notify};

use crate::owner::ModelHandle;
use crate::{
    discovery::{cgroupfs::CgroupRoot, proc},
    model::node::{Command, FoundCgroup, ResyncLook},
};

/// Cgroups and processes that existed before the programs were attached, as the command that
/// seeds the model with them.
pub(super) fn seed(root: &CgroupRoot) -> Command {
    let (cgroups, processes) = look_at_node(root);
    log::info!("found {} cgroups at start", cgroups.len());
    Command::Seed { cgroups, processes }
}

/// Every cgroup on disk, and every process in one of them (oldest first).
fn look_at_node(root: &CgroupRoot) -> (Vec<FoundCgroup>, Vec<crate::model::node::FoundProcess>) {
    let on_disk = root.scan();
    let by_path: std::collections::HashMap<&str, u64> = on_disk.iter().map(|(id, path)| (path.as_str(), *id)).collect();
    let processes = proc::processes_at_start(&by_path);
    let cgroups = on_disk.iter().map(|(id, path)| FoundCgroup { id: *id, path: path.clone() }).collect();
    (cgroups, processes)
}

pub(super) async fn expiry_loop(model: ModelHandle, retention: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(30).min(retention.max(Duration::from_secs(1))));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        model.update(Command::Expire { retention }).await;
    }
}

/// A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
/// events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
const RESCAN_EVERY: Duration = Duration::from_secs(1);

/// Walks cgroupfs when an event named a cgroup the model did not know (its mkdir record was
/// lost: ring overflow, counted), at most once per [`RESCAN_EVERY`], and sends what is on disk.
pub(super) async fn rescan_loop(
    model: ModelHandle,
    root: CgroupRoot,
    wanted: std::sync::Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = wanted.notified() => {}
            _ = shutdown.changed() => return,
        }
        if let Some(wait) = rescan_wait(last, Instant::now()) {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
        last = Some(Instant::now());
        let root = root.clone();
        let Ok(on_disk) = tokio::task::spawn_blocking(move || root.scan()).await else { continue };
        let cgroups = on_disk.into_iter().map(|(id, path)| FoundCgroup { id, path }).collect();
        model.update(Command::Rescan { cgroups }).await;
    }
}

/// How long a rescan asked for at `now` waits, the last one having run at `last`.
fn rescan_wait(last: Option<Instant>, now: Instant) -> Option<Duration> {
    let since = now.saturating_duration_since(last?);
    (since < RESCAN_EVERY).then(|| RESCAN_EVERY - since)
}

/// Reads the kernel log's `oom-kill:` lines for the OOM victims the model names (one read for
/// all those waiting; it costs microseconds) and sends them: the model joins each with its
/// victim, also after the stop was judged (`model::node::oom`).
pub(super) async fn oom_log_loop(
    model: ModelHandle,
    mut victims: mpsc::UnboundedReceiver<u32>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            victim = victims.recv() => victim,
            _ = shutdown.changed() => return,
        };
        let Some(first) = first else { return };
        let mut pids = vec![first];
        while let Ok(pid) = victims.try_recv() {
            pids.push(pid);
        }
        let read = tokio::task::spawn_blocking(move || crate::discovery::kmsg::oom_kills_of(&pids)).await;
        match read {
            Ok(Ok(kills)) => {
                for kill in kills {
                    model.update(Command::OomLog(kill)).await;
                }
            }
            Ok(Err(err)) => log::warn!("reading the kernel log for an OOM kill: {err}"),
            Err(_) => {}
        }
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
/// itself: every second the kernel's loss counters are read; when they grew, the node is looked
/// at (/proc and cgroupfs, off the async workers) and the look sent to the model, which repairs
/// what two looks in a row do not find (`model::node::ResyncLook`), so that a record still in the
/// ring is applied first with its real facts; cgroups and processes found are seeded at once.
/// Looks go on while the model suspects something (`NodeSnapshot::repair_pending`).
pub(super) async fn resync_loop(
    model: ModelHandle,
    maps: std::sync::Arc<crate::kernel::SensorMaps>,
    root: CgroupRoot,
    mut shutdown: watch::Receiver<bool>,
) {
    let lost = || maps.kind_stats().iter().map(|k| k.lost).sum::<u64>();
    let mut seen_lost = lost();
    let snapshots = model.snapshots();
    let mut rounds_left = 0u32;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start_tolerance = proc::start_tolerance();
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
        if rounds_left == 0 && !snapshots.borrow().repair_pending() {
            continue;
        }
        rounds_left = rounds_left.saturating_sub(1);
        let root = root.clone();
        let Ok((cgroups, processes)) = tokio::task::spawn_blocking(move || look_at_node(&root)).await else {
            continue;
        };
        let look = ResyncLook { cgroups, processes, start_tolerance, departing: Vec::new() };
        model.update(Command::Resync(look)).await;
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

    #[test]
    fn rescans_are_at_most_one_a_second() {
        let start = Instant::now();
        assert_eq!(rescan_wait(None, start), None, "the first runs at once");
        let soon = start + Duration::from_millis(300);
        assert_eq!(rescan_wait(Some(start), soon), Some(Duration::from_millis(700)), "a second notice waits");
        assert_eq!(rescan_wait(Some(start), start + RESCAN_EVERY), None);
    }
}
