//! The node's instances by cgroup: one per container cgroup, and one per plain-host cgroup that
//! runs something (see `instance.rs` for what one instance is and what its processes mean for
//! it). This part answers what the tracker asks of the instances as a whole: which wait for a
//! name, which run, which went and may be forgotten, which inits live.

use std::collections::{HashMap, HashSet};

use super::{
    instance::{Instance, InstanceKind},
    snapshot::LiveInit,
    UnitKey,
};

/// Every instance the model keeps, by cgroup id.
#[derive(Debug, Default)]
pub(super) struct Instances {
    /// Boxed: an instance is about 1.5 KB, and a table of them inline holds that much for each
    /// of its spare slots too (up to as many again as entries): 3.0 MB for 1,000 cgroups against
    /// 1.5 MB boxed (heaptrack of the agent with 1,000 units, BENCHMARKS.md).
    by_cgroup: HashMap<u64, Box<Instance>>,
}

impl Instances {
    pub(super) fn get(&self, cgroup_id: u64) -> Option<&Instance> {
        self.by_cgroup.get(&cgroup_id).map(|instance| &**instance)
    }

    pub(super) fn get_mut(&mut self, cgroup_id: u64) -> Option<&mut Instance> {
        self.by_cgroup.get_mut(&cgroup_id).map(|instance| &mut **instance)
    }

    pub(super) fn contains(&self, cgroup_id: u64) -> bool {
        self.by_cgroup.contains_key(&cgroup_id)
    }

    /// `instance` runs in cgroup `cgroup_id`, in place of one whose end was lost (a reused id).
    pub(super) fn insert(&mut self, cgroup_id: u64, instance: Instance) {
        self.by_cgroup.insert(cgroup_id, Box::new(instance));
    }

    pub(super) fn remove(&mut self, cgroup_id: u64) -> Option<Instance> {
        self.by_cgroup.remove(&cgroup_id).map(|instance| *instance)
    }

    /// Whether `cgroup_id` holds a container (not a plain-host unit, and known).
    pub(super) fn is_container(&self, cgroup_id: u64) -> bool {
        self.get(cgroup_id).is_some_and(|i| matches!(i.kind, InstanceKind::Container { .. }))
    }

    /// Instances not linked to a unit and not ignored: what the runtime's metadata may name.
    pub(super) fn unlinked(&self) -> Vec<u64> {
        self.by_cgroup.iter().filter(|(_, i)| i.unit.is_none() && !i.ignored).map(|(id, _)| *id).collect()
    }

    /// Container instances linked to a unit and not judged yet: (cgroup, container id, unit).
    /// Their termination settings follow the metadata (a deletion's grace period).
    pub(super) fn linked_unfinished_containers(&self) -> Vec<(u64, String, UnitKey)> {
        self.by_cgroup
            .iter()
            .filter_map(|(id, i)| match (&i.kind, &i.unit) {
                (InstanceKind::Container { container_id, .. }, Some(key)) if !i.finished => {
                    Some((*id, container_id.clone(), key.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Instances linked to a unit named by pod uid and container id, oldest first (so that
    /// restarts replay in order when they are named).
    pub(super) fn named_by_id_oldest_first(&self) -> Vec<u64> {
        let mut named: Vec<(u64, u64)> = self
            .by_cgroup
            .iter()
            .filter(|(_, i)| i.named_by_id && i.unit.is_some())
            .map(|(id, i)| (i.created_at, *id))
            .collect();
        named.sort_unstable();
        named.into_iter().map(|(_, id)| id).collect()
    }

    /// The units with an instance that has not ended.
    pub(super) fn live_units(&self) -> HashSet<UnitKey> {
        self.by_cgroup.values().filter(|i| i.exit.is_none()).filter_map(|i| i.unit.clone()).collect()
    }

    /// Instances whose cgroup went and that were linked or ignored since: finished with.
    pub(super) fn departed_and_done(&self) -> Vec<u64> {
        self.by_cgroup
            .iter()
            .filter(|(_, i)| i.departed && (i.unit.is_some() || i.ignored))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The departed instances past the `keep` newest, oldest first: the ones to forget.
    pub(super) fn departed_beyond(&self, keep: usize) -> Vec<u64> {
        let mut departed: Vec<(u64, u64)> =
            self.by_cgroup.iter().filter(|(_, i)| i.departed).map(|(id, i)| (i.created_at, *id)).collect();
        if departed.len() <= keep {
            return Vec::new();
        }
        departed.sort_unstable();
        let excess = departed.len() - keep;
        departed.into_iter().take(excess).map(|(_, id)| id).collect()
    }

    /// The container cgroups (a pod's sandbox's too) whose init lives.
    pub(super) fn live_inits(&self) -> Vec<LiveInit> {
        self.by_cgroup
            .iter()
            .filter(|(_, i)| i.exit.is_none())
            .filter_map(|(id, i)| match (&i.kind, i.init) {
                (InstanceKind::Container { pod_uid, .. }, Some(init)) => {
                    Some(LiveInit { cgroup_id: *id, tgid: init.tgid, pod_uid: pod_uid.clone() })
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(n: u64, created_at: u64) -> Instance {
        let kind = InstanceKind::Container { container_id: format!("c{n}"), pod_uid: "pod".into() };
        Instance::new(kind, created_at)
    }

    #[test]
    fn the_oldest_departed_instances_past_the_bound_are_the_ones_to_forget() {
        let mut instances = Instances::default();
        for (n, created_at) in [(1, 30), (2, 10), (3, 20), (4, 40)] {
            let mut instance = container(n, created_at);
            instance.departed = n != 4;
            instances.insert(n, instance);
        }
        assert!(instances.departed_beyond(3).is_empty(), "three departed, three kept");
        assert_eq!(instances.departed_beyond(1), [2, 3], "created at 10 and 20 go; 30 stays");
        assert!(instances.departed_and_done().is_empty(), "none linked or ignored yet");
        instances.get_mut(1).expect("kept").ignored = true;
        assert_eq!(instances.departed_and_done(), [1]);
        assert_eq!(instances.unlinked().len(), 3, "the ignored one waits for no name");
    }
}
