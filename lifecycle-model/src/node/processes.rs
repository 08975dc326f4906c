//! The node's processes as the model knows them, by pid and by cgroup. A container's processes
//! are listed (a stop's scene, a host unit's heir) and dropped (its cgroup went) by their cgroup,
//! without a walk over every process of the node: a stop signal or a cgroup's removal costs the
//! container's processes, not the node's.
//!
//! Bounded by the kernel: a process is kept from its exec (or the start-up scan) to its exit, so
//! there are never more than the pids the node has (`kernel.pid_max`); a lost exit record is
//! repaired by a resync (`resync.rs`).

use std::collections::{HashMap, HashSet};

/// One process the model knows.
#[derive(Clone, Debug)]
pub(super) struct ProcessEntry {
    pub(super) cgroup_id: u64,
    pub(super) start_time_ns: u64,
    /// Started into the container by the runtime without descending from its init.
    pub(super) exec_session: bool,
    pub(super) comm: String,
}

/// Every process the model knows, with an index by cgroup.
#[derive(Debug, Default)]
pub(super) struct Processes {
    by_pid: HashMap<u32, ProcessEntry>,
    /// The pids of each cgroup that has processes (a cgroup's entry goes with its last one).
    by_cgroup: HashMap<u64, HashSet<u32>>,
}

impl Processes {
    pub(super) fn get(&self, pid: u32) -> Option<&ProcessEntry> {
        self.by_pid.get(&pid)
    }

    pub(super) fn contains(&self, pid: u32) -> bool {
        self.by_pid.contains_key(&pid)
    }

    /// The same process (same cgroup, same start) exec'd a new program: it keeps its role and
    /// takes the new name. False when `pid` is not that process (unknown, or a reused pid).
    pub(super) fn renamed(&mut self, pid: u32, cgroup_id: u64, start_time_ns: u64, comm: &str) -> bool {
        match self.by_pid.get_mut(&pid) {
            Some(known) if known.cgroup_id == cgroup_id && known.start_time_ns == start_time_ns => {
                known.comm = comm.to_owned();
                true
            }
            _ => false,
        }
    }

    /// Keeps `process` as `pid`, in place of a process the pid named before (whose exit was not
    /// seen).
    pub(super) fn insert(&mut self, pid: u32, process: ProcessEntry) {
        let cgroup_id = process.cgroup_id;
        if let Some(before) = self.by_pid.insert(pid, process) {
            self.unindex(pid, before.cgroup_id);
        }
        self.by_cgroup.entry(cgroup_id).or_default().insert(pid);
    }

    /// The process `pid` exited.
    pub(super) fn remove(&mut self, pid: u32) -> Option<ProcessEntry> {
        let process = self.by_pid.remove(&pid)?;
        self.unindex(pid, process.cgroup_id);
        Some(process)
    }

    /// The processes of cgroup `cgroup_id`, in no order.
    pub(super) fn in_cgroup(&self, cgroup_id: u64) -> impl Iterator<Item = (u32, &ProcessEntry)> {
        self.by_cgroup
            .get(&cgroup_id)
            .into_iter()
            .flatten()
            .filter_map(|pid| self.by_pid.get(pid).map(|process| (*pid, process)))
    }

    /// Cgroup `cgroup_id` went: its processes are gone with it.
    pub(super) fn remove_cgroup(&mut self, cgroup_id: u64) {
        for pid in self.by_cgroup.remove(&cgroup_id).into_iter().flatten() {
            self.by_pid.remove(&pid);
        }
    }

    /// Every process, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &ProcessEntry)> {
        self.by_pid.iter().map(|(pid, process)| (*pid, process))
    }

    fn unindex(&mut self, pid: u32, cgroup_id: u64) {
        if let Some(pids) = self.by_cgroup.get_mut(&cgroup_id) {
            pids.remove(&pid);
            if pids.is_empty() {
                self.by_cgroup.remove(&cgroup_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(cgroup_id: u64, start_time_ns: u64) -> ProcessEntry {
        ProcessEntry { cgroup_id, start_time_ns, exec_session: false, comm: "app".into() }
    }

    fn pids(processes: &Processes, cgroup_id: u64) -> Vec<u32> {
        let mut pids: Vec<u32> = processes.in_cgroup(cgroup_id).map(|(pid, _)| pid).collect();
        pids.sort_unstable();
        pids
    }

    #[test]
    fn a_cgroups_processes_are_listed_and_dropped_by_their_cgroup_only() {
        let mut processes = Processes::default();
        processes.insert(10, process(1, 100));
        processes.insert(11, process(1, 101));
        processes.insert(20, process(2, 200));
        assert_eq!(pids(&processes, 1), [10, 11]);
        assert_eq!(pids(&processes, 2), [20]);
        processes.remove_cgroup(1);
        assert!(pids(&processes, 1).is_empty());
        assert!(!processes.contains(10) && !processes.contains(11));
        assert_eq!(processes.iter().map(|(pid, _)| pid).collect::<Vec<_>>(), [20]);
        assert!(!processes.by_cgroup.contains_key(&1), "no index left for a cgroup without processes");
    }

    #[test]
    fn a_reused_pid_moves_to_its_new_cgroup_and_an_exit_leaves_no_index() {
        let mut processes = Processes::default();
        processes.insert(10, process(1, 100));
        // Its exit was lost, and the pid came back in another container.
        processes.insert(10, process(2, 500));
        assert!(pids(&processes, 1).is_empty());
        assert_eq!(pids(&processes, 2), [10]);
        assert!(!processes.renamed(10, 1, 100, "old"), "not the process the pid names now");
        assert!(processes.renamed(10, 2, 500, "new"));
        assert_eq!(processes.get(10).map(|p| p.comm.as_str()), Some("new"));
        assert_eq!(processes.remove(10).map(|p| p.cgroup_id), Some(2));
        assert!(processes.by_cgroup.is_empty() && processes.by_pid.is_empty());
    }
}
