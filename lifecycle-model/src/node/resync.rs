//! Repairs after lost ring records: what the tracker believes alive, for the agent to check
//! against /proc and cgroupfs, and [`NodeTracker::resync`], which applies what those found.

use super::*;

impl NodeTracker {
    /// Every process the tracker believes alive: (tgid, start time ns on the boot clock), for a
    /// resync's check against /proc.
    pub fn tracked_processes(&self) -> Vec<(u32, u64)> {
        self.processes.iter().map(|(tgid, p)| (tgid, p.start_time_ns)).collect()
    }

    /// Every cgroup the tracker believes exists.
    pub fn tracked_cgroups(&self) -> Vec<u64> {
        self.cgroups.keys().copied().collect()
    }

    /// Brings the tracker back in line with the node after the ring lost records (each loss is
    /// counted; this repairs the state the missing records would have changed), at `now`:
    /// - `dead`: tracked processes that no longer run: their exit records were lost. An init's
    ///   exit ends its instance, with exit status and signal unknown (null) at `now`;
    /// - `gone`: tracked cgroups no longer on disk: removed unseen. Their kernel counts are taken
    ///   with `take_counters` first, as for a seen removal;
    /// - `on_disk`: every cgroup there is now; those the tracker did not know were created
    ///   unseen, and are seeded as at start-up (with `watched_since`).
    ///
    /// The caller confirms `dead` and `gone` over two looks a second apart, so that a record
    /// still on its way through the ring is applied first, with its real facts.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn resync(
        &mut self,
        dead: &[u32],
        gone: &[u64],
        on_disk: &[(u64, String)],
        mut take_counters: impl FnMut(u64) -> Option<CgroupCounters>,
        now: u64,
    ) -> (Resync, super::Outcome) {
        let mut report = Resync::default();
        for tgid in dead {
            if let Some(cgroup_id) = self.processes.get(*tgid).map(|p| p.cgroup_id) {
                // Its exit record was lost, and with it the CPU time it used: none is counted.
                self.exit(*tgid, cgroup_id, now, None, None, std::time::Duration::ZERO);
                report.exits_unseen += 1;
            }
        }
        for &id in gone {
            if self.cgroups.remove(&id).is_none() {
                continue;
            }
            if let Some(last) = take_counters(id) {
                self.absorb_kernel_counters(id, last);
            }
            self.on_instance_gone(id);
            report.cgroups_removed_unseen += 1;
        }
        for (id, path) in on_disk {
            if !self.cgroups.contains_key(id) {
                self.found_cgroup(*id, path, now);
                report.cgroups_created_unseen += 1;
            }
        }
        (report, self.outcome())
    }
}
