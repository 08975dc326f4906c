//! Naming containers the runtime cannot name (yet). While the runtime's CRI socket does not
//! answer (a runtime restart, a stale mount), a container cgroup is still a container: it is
//! linked at once to a unit named by pod uid + container id and judged like any other. When the
//! runtime answers again, each such instance is re-linked to its real unit by replaying what it
//! did, so its verdicts and counts join the named unit instead of staying behind.

use super::{instance::InstanceKind, NodeTracker, UnitCounters};

impl NodeTracker {
    /// Whether the runtime answers. Going unreachable names every waiting container by id.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn set_runtime_reachable(&mut self, reachable: bool) -> super::Outcome {
        self.note_runtime_reachable(reachable);
        self.outcome()
    }

    fn note_runtime_reachable(&mut self, reachable: bool) {
        if self.runtime_reachable == reachable {
            return;
        }
        self.runtime_reachable = reachable;
        if !reachable {
            let waiting: Vec<u64> =
                self.instances.unlinked().into_iter().filter(|id| self.instances.is_container(*id)).collect();
            for cgroup_id in waiting {
                self.link(cgroup_id);
            }
            self.drop_departed();
        }
    }

    /// Whether the runtime answered the last time it was asked.
    pub fn runtime_reachable(&self) -> bool {
        self.runtime_reachable
    }

    /// Units named by id, re-linked now that metadata is known (called from `set_metadata`).
    /// Oldest first, so restarts replay in order. An instance the runtime does not list and that
    /// still runs is a pod sandbox (a running container is always listed): it is dropped. One
    /// that exited keeps its name by id and its verdict.
    pub(super) fn name_units_named_by_id(&mut self) {
        for cgroup_id in self.instances.named_by_id_oldest_first() {
            let Some(instance) = self.instances.get(cgroup_id) else { continue };
            let InstanceKind::Container { container_id, .. } = &instance.kind else { continue };
            let listed = self.metadata.contains_key(container_id);
            if !listed && instance.exit.is_some() {
                continue;
            }
            self.unlink_named_by_id(cgroup_id);
            if listed {
                self.link(cgroup_id);
            } else if let Some(instance) = self.instances.get_mut(cgroup_id) {
                instance.ignored = true;
            }
        }
    }

    /// Takes an instance off its unit named by id, keeping what its events counted so that
    /// linking it again replays them into the real unit.
    fn unlink_named_by_id(&mut self, cgroup_id: u64) {
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let Some(key) = instance.unit.take() else { return };
        instance.named_by_id = false;
        instance.finished = false;
        instance.termination.forget_report();
        let Some(unit) = self.units.remove(&key) else { return };
        // What events counted comes along; what judging produced (exits, terminations,
        // verdicts) is produced again when the instance is judged under its real name.
        instance.pending_counters = UnitCounters {
            signals: unit.counters.signals,
            oom_kills: unit.counters.oom_kills,
            exec_sessions: unit.counters.exec_sessions,
            exec_session_cpu_ns: unit.counters.exec_session_cpu_ns,
            ..UnitCounters::default()
        };
        instance.pending_tcp = unit.tcp;
        instance.pending_kernel_counters = unit.departed_kernel_counters;
    }
}
