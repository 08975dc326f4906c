//! An immutable picture of the node model, published by its owner after each change and read
//! without a lock by the API, the scrapes, the probe supervisor and the verdict log.
//!
//! It shares the tracker's units, pod table and history (`shared.rs`): taking one copies a
//! pointer per unit and the one fact readers need from the instances (which container cgroups
//! have a live init), nothing else.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use super::{history::History, shared::Pods, DroppedCounts, NodeTracker, Unit};

/// The node as it was when the snapshot was taken (see the module header).
pub struct NodeSnapshot {
    /// Every unit, in key order.
    pub(super) units: Vec<Arc<Unit>>,
    /// The container cgroups (a pod's sandbox's too) whose init lives, in no order: joined with
    /// the units only when a reader asks (`running_containers`, `pods`), not at every publish.
    pub(super) live_inits: Arc<[LiveInit]>,
    pub(super) pods: Pods,
    pub(super) history: Arc<History>,
    pub(super) dropped: DroppedCounts,
    pub(super) generation: u64,
    pub(super) repair_pending: bool,
}

/// A container cgroup whose init is alive.
pub(super) struct LiveInit {
    pub(super) cgroup_id: u64,
    pub(super) tgid: u32,
    pub(super) pod_uid: Arc<str>,
}

impl NodeSnapshot {
    /// Every unit, in key order.
    pub fn units(&self) -> impl Iterator<Item = &Unit> {
        self.units.iter().map(|unit| &**unit)
    }

    /// Every unit as the model shares it, in key order. A unit the model changes is replaced by a
    /// new `Arc` (copy on write), so a reader that keeps one and finds the same pointer in a later
    /// snapshot knows the unit did not change in between (the scrape's cache, `export/units.rs`
    /// in the agent); keeping the `Arc` is what rules out a freed unit's address coming back.
    pub fn shared_units(&self) -> impl Iterator<Item = &Arc<Unit>> {
        self.units.iter()
    }

    /// What was dropped to stay within the bounds, by kind (see `bounds.rs`).
    pub fn dropped(&self) -> &DroppedCounts {
        &self.dropped
    }

    /// Changes when the node's containers, their states, names or pods may have changed; stays
    /// when only counters moved (an exec, a signal, an accept). A reader that follows what runs
    /// (the probe supervisor) skips the snapshots that keep it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a repair's last look left something suspect, for the next look to confirm
    /// (`command.rs`, `ResyncLook`): the repair loop looks again while it is so.
    pub fn repair_pending(&self) -> bool {
        self.repair_pending
    }

    /// The init of each container cgroup that has a live one, by cgroup.
    pub(super) fn main_pids(&self) -> HashMap<u64, u32> {
        self.live_inits.iter().map(|init| (init.cgroup_id, init.tgid)).collect()
    }

    /// The pods with a cgroup (their sandbox's included) whose init lives.
    pub(super) fn pods_with_process(&self) -> HashSet<&str> {
        self.live_inits.iter().map(|init| &*init.pod_uid).collect()
    }
}

impl NodeTracker {
    /// The model as it is now, for readers (see the module header). Taking one costs a pointer
    /// per unit; the live inits are listed again only after one changed. A lookup per unit, and
    /// a pass over the instances at every snapshot, were most of a busy agent's CPU (`bench
    /// scale` with 1,000 units, BENCHMARKS.md).
    pub fn snapshot(&self) -> NodeSnapshot {
        let live_inits = self.live_inits.get_or_init(|| self.instances.live_inits().into());
        NodeSnapshot {
            units: self.units.shared().cloned().collect(),
            live_inits: live_inits.clone(),
            pods: self.pods.clone(),
            history: self.history.clone(),
            dropped: self.dropped,
            generation: self.generation,
            repair_pending: self.suspects.is_some(),
        }
    }
}
