//! Memory readings of the running containers, recorded on their units: the agent's sampler
//! reads each container's memory files off the owner's thread and sends what it read here, with
//! the cgroup it read them from, so a reading taken just before a restart never lands on the
//! next instance.

use super::{bounds::DroppedKind, NodeTracker, Outcome, UnitKey};
use crate::{memory::MemorySample, time::BootTime};

/// One container's memory files as read at one moment.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryReading {
    pub key: UnitKey,
    /// The v2 cgroup (its directory's inode) the files were read from.
    pub cgroup_id: u64,
    pub at: BootTime,
    pub sample: MemorySample,
}

/// A container the sampler reads: its unit, cgroup and main process (whose
/// `/proc/<pid>/cgroup` names its v1 memory cgroup on a hybrid host).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryTarget {
    pub key: UnitKey,
    pub cgroup_id: u64,
    pub main_pid: u32,
}

impl NodeTracker {
    /// Records readings on their units. A reading of a cgroup that is not its unit's current
    /// one (the container restarted since) is not kept; one for a unit the model does not know
    /// is counted as dropped (`memory_reading`), as are the `left_out` containers the sampler
    /// did not read (past its bound). Only counters move: no state changes.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_memory_readings(&mut self, readings: Vec<MemoryReading>, left_out: usize) -> Outcome {
        self.dropped.add(DroppedKind::MemoryReading, left_out as u64);
        for reading in readings {
            let current = match self.units.get(&reading.key) {
                None => {
                    self.dropped.add(DroppedKind::MemoryReading, 1);
                    continue;
                }
                // Unchanged readings are the common case: the unit is not copied for them.
                Some(unit) => unit.cgroup_id == Some(reading.cgroup_id) && unit.memory() != Some(&reading.sample),
            };
            if current {
                if let Some(unit) = self.units.get_mut(&reading.key) {
                    unit.memory.record(reading.at, reading.sample);
                }
            }
        }
        self.counted_outcome()
    }
}
