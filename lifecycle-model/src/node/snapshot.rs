//! An immutable picture of the node model, published by its owner after each change and read
//! without a lock by the API, the scrapes, the probe supervisor and the verdict log.
//!
//! It shares the tracker's units, pod table and history (`shared.rs`): taking one copies a
//! pointer per unit and the few facts a reader needs from the instances (each unit's running
//! main process, the pods with a live process), nothing else.

use std::sync::Arc;

use super::{history::History, instance::InstanceKind, shared::Pods, DroppedCounts, NodeTracker, Unit};

/// The node as it was when the snapshot was taken (see the module header).
#[derive(Default)]
pub struct NodeSnapshot {
    /// Every unit in key order, with the main process of its instance when that runs.
    pub(super) units: Vec<(Arc<Unit>, Option<u32>)>,
    /// The pods with a cgroup (the sandbox's included) whose init lives, sorted.
    pub(super) pods_with_process: Vec<Arc<str>>,
    pub(super) pods: Pods,
    pub(super) history: Arc<History>,
    pub(super) dropped: DroppedCounts,
}

impl NodeSnapshot {
    /// Every unit, in key order.
    pub fn units(&self) -> impl Iterator<Item = &Unit> {
        self.units.iter().map(|(unit, _)| &**unit)
    }

    /// What was dropped to stay within the bounds, by kind (see `bounds.rs`).
    pub fn dropped(&self) -> &DroppedCounts {
        &self.dropped
    }
}

impl NodeTracker {
    /// The model as it is now, for readers (see the module header).
    pub fn snapshot(&self) -> NodeSnapshot {
        let live_init = |cgroup_id: u64| {
            let instance = self.instances.get(&cgroup_id)?;
            let running = matches!(instance.kind, InstanceKind::Container { .. }) && instance.exit.is_none();
            running.then_some(instance.init?.tgid)
        };
        let units = self
            .units
            .shared()
            .map(|unit| {
                let main_pid = unit.cgroup_id.and_then(live_init);
                (unit.clone(), main_pid)
            })
            .collect();
        let mut pods_with_process: Vec<Arc<str>> = self
            .instances
            .values()
            .filter(|i| i.init.is_some() && i.exit.is_none())
            .filter_map(|i| match &i.kind {
                InstanceKind::Container { pod_uid, .. } => Some(pod_uid.clone()),
                InstanceKind::Host { .. } => None,
            })
            .collect();
        pods_with_process.sort_unstable();
        pods_with_process.dedup();
        NodeSnapshot {
            units,
            pods_with_process,
            pods: self.pods.clone(),
            history: self.history.clone(),
            dropped: self.dropped,
        }
    }
}
