//! The maps other tasks read at scrape time (the per-cgroup counters, the delivery statistics)
//! and the kernel's accounting of the programs' runs, held by the [`SensorMaps`] the sensor
//! hands out.

use std::{
    collections::HashSet,
    io,
    os::fd::{AsFd as _, OwnedFd},
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, IterableMap as _, MapData, PerCpuArray};
use lifecycle_common::{CgroupCounters, KindStats, EVENT_KIND_COUNT};
use parking_lot::Mutex;

use super::batch;
#[cfg(doc)]
use super::SensorConfig;

/// How a whole map was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapRead {
    /// In batches (a few syscalls).
    Batched,
    /// Entry by entry (this kernel has no batch lookup, or the batch failed).
    Iterated,
}

/// Maps read at scrape time by other tasks.
pub struct SensorMaps {
    pub(super) counters: Mutex<BpfHashMap<MapData, u64, CgroupCounters>>,
    pub(super) batch_buffers: Mutex<batch::BatchBuffers>,
    pub(super) stats: PerCpuArray<MapData, KindStats>,
    /// The entry count of the last whole read, and when it was made (see
    /// [`SensorMaps::counter_entries`]).
    pub(super) last_read: Mutex<Option<(Instant, usize)>>,
    /// Each attached program, for its run statistics.
    pub(super) programs: Vec<(&'static str, aya::programs::ProgramFd)>,
    /// `BPF_ENABLE_STATS` while held (closing it stops the kernel's accounting), or why not.
    pub(super) accounting: Result<OwnedFd, Arc<StatsError>>,
}

/// Why the kernel does not account the programs' runs.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// Turned off with `--kernel-stats off`.
    #[error("turned off (--kernel-stats off)")]
    Off,
    /// The kernel refused (`BPF_ENABLE_STATS` is 5.8+).
    #[error("BPF_ENABLE_STATS refused")]
    Refused(#[source] io::Error),
}

/// One program's cost, as the kernel accounts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramCost {
    /// The program's name in the object (`sched_process_exit`).
    pub program: &'static str,
    /// Nanoseconds spent in it since the agent started holding `BPF_ENABLE_STATS`.
    pub run_time_ns: u64,
    /// Its runs since then.
    pub runs: u64,
}

/// How recent a whole read of the counter map must be for its entry count to answer
/// [`SensorMaps::counter_entries`]. A scrape reads the map once for the per-container families
/// and then asks for the count: a second whole read (a thousand entries) was a fifth of a
/// scrape's CPU (`perf` of the agent with 1,000 units, BENCHMARKS.md).
const ENTRIES_FRESH_FOR: Duration = Duration::from_secs(1);

impl SensorMaps {
    /// Every cgroup's counters, as the kernel holds them now, handed to `each`; how they were read.
    pub fn each_cgroup_counters(&self, mut each: impl FnMut(u64, CgroupCounters)) -> MapRead {
        let counters = self.counters.lock();
        let mut buffers = self.batch_buffers.lock();
        match batch::read_counters(counters.map().fd().as_fd(), &mut buffers, &mut each) {
            Ok(read) => {
                self.note_read(read);
                return MapRead::Batched;
            }
            Err(batch::BatchError::Io(error)) => {
                log::debug!("batch read of the counter map failed ({error}); iterating it");
            }
            Err(batch::BatchError::Unsupported) => {}
        }
        // Each entry once: the ones a failed batch read handed over already are skipped.
        let handed: HashSet<u64> = buffers.handed().iter().copied().collect();
        let mut read = handed.len();
        // An entry deleted between iteration steps yields an error for that key; skip it.
        counters.iter().filter_map(Result::ok).filter(|(id, _)| !handed.contains(id)).for_each(|(id, c)| {
            read += 1;
            each(id, c)
        });
        self.note_read(read);
        MapRead::Iterated
    }

    fn note_read(&self, entries: usize) {
        *self.last_read.lock() = Some((Instant::now(), entries));
    }

    /// Entries in use in the counter map: the count of a whole read made within
    /// [`ENTRIES_FRESH_FOR`] (a scrape's own, made a moment before), else of a new one.
    pub fn counter_entries(&self) -> usize {
        let last = *self.last_read.lock();
        match last {
            Some((at, entries)) if at.elapsed() < ENTRIES_FRESH_FOR => entries,
            _ => {
                let mut entries = 0;
                self.each_cgroup_counters(|_, _| entries += 1);
                entries
            }
        }
    }

    /// Each attached program's runs and time, when the kernel accounts them (see
    /// [`SensorConfig::kernel_stats`]); empty otherwise.
    pub fn program_costs(&self) -> Vec<ProgramCost> {
        if self.accounting.is_err() {
            return Vec::new();
        }
        self.programs
            .iter()
            .filter_map(|(program, fd)| {
                let stats = crate::sys::bpf_prog_run_stats(fd.as_fd()).ok()?;
                Some(ProgramCost { program, run_time_ns: stats.run_time_ns, runs: stats.run_count })
            })
            .collect()
    }

    /// Whether the kernel accounts the programs' runs, or why not.
    pub fn kernel_stats(&self) -> Result<(), Arc<StatsError>> {
        self.accounting.as_ref().map(|_| ()).map_err(Arc::clone)
    }

    /// Counters of one cgroup, if it has any.
    pub fn counters_of(&self, cgroup_id: u64) -> Option<CgroupCounters> {
        let counters = self.counters.lock();
        counters.get(&cgroup_id, 0).ok()
    }

    /// Removes a departed cgroup's entry, returning its final counts.
    pub(crate) fn take_counters(&self, cgroup_id: u64) -> Option<CgroupCounters> {
        let mut counters = self.counters.lock();
        let last = counters.get(&cgroup_id, 0).ok()?;
        let _ = counters.remove(&cgroup_id);
        Some(last)
    }

    /// Delivery statistics per event kind, summed over CPUs.
    pub fn kind_stats(&self) -> [KindStats; EVENT_KIND_COUNT] {
        let mut out = [KindStats::default(); EVENT_KIND_COUNT];
        for (index, slot) in out.iter_mut().enumerate() {
            if let Ok(per_cpu) = self.stats.get(&(index as u32), 0) {
                for cpu in per_cpu.iter() {
                    slot.submitted += cpu.submitted;
                    slot.lost += cpu.lost;
                    slot.counter_map_full += cpu.counter_map_full;
                    slot.rate_limited += cpu.rate_limited;
                    slot.listener_ports_full += cpu.listener_ports_full;
                }
            }
        }
        out
    }
}
