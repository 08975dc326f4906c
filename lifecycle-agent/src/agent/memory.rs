//! The memory sampler: every second, the memory files of every running container are read on a
//! blocking thread (never on the model's owner, whose thread also drains the ring) and the
//! readings sent to the owner; it keeps a reading only when it changed, and the next stop's
//! verdict carries what the last minute's readings say (`model::memory`).
//!
//! Bounded: at most [`MAX_READ_PER_PASS`] containers are read in a pass; the rest are counted
//! (`lifecycle_state_dropped_total{kind="memory_reading"}`, with the readings the model could
//! not place). A pass that takes longer than the period delays the next one, never stacks.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use crate::owner::ModelHandle;
use crate::{
    discovery::{cgroupfs::CgroupRoot, clock::boottime_ns, memory},
    model::{
        node::{Command, MemoryReading},
        time::BootTime,
    },
};

/// How often the running containers' memory files are read: the evidence's edges are this wide.
pub(super) const PERIOD: Duration = Duration::from_secs(1);
/// Containers read in one pass: a node runs a few hundred; past this, the rest wait.
pub(super) const MAX_READ_PER_PASS: usize = 4096;

/// Reads and sends until shutdown.
pub(super) async fn memory_loop(
    model: ModelHandle,
    root: CgroupRoot,
    layout: memory::MemoryLayout,
    mut shutdown: watch::Receiver<bool>,
) {
    let context = Arc::new((root, layout));
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let snapshots = model.snapshots();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let (targets, left_out) = snapshots.borrow().memory_targets(MAX_READ_PER_PASS);
        if targets.is_empty() && left_out == 0 {
            continue;
        }
        let context = context.clone();
        let read = tokio::task::spawn_blocking(move || {
            let (root, layout) = &*context;
            targets
                .into_iter()
                .filter_map(|target| {
                    let sample = memory::read(root, layout, target.main_pid, target.cgroup_id)?;
                    let at = BootTime::from_ns(boottime_ns());
                    Some(MemoryReading { key: target.key, cgroup_id: target.cgroup_id, at, sample })
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(readings) = read else { continue };
        model.tell(Command::MemoryReadings { readings, left_out }).await;
    }
}
