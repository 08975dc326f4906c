//! Reads the whole per-cgroup counter map in a few syscalls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6).
//!
//! Hand-written because aya (0.14) reads a hash map one entry at a time: iterating costs two
//! syscalls per entry (next key, then lookup). With 1,000 containers a `/metrics` scrape made
//! about 3,000 `bpf()` calls, a quarter of the agent's time in the scrape (perf, BENCHMARKS.md
//! "Scrape"); batches of 256 make it four calls. Kernels without batch lookup (before 5.6), or a
//! bucket too full for one batch, fall back to aya's iteration: same answer, slower.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use lifecycle_common::CgroupCounters;

/// What the kernel returns for a map type without batch operations (`ENOTSUPP`, kernel-internal,
/// not in libc).
const KERNEL_ENOTSUPP: i32 = 524;

/// Entries asked for per call. A hash map's batch stops at a bucket boundary, so a call may
/// return fewer; a bucket holding more than this gives ENOSPC (and the caller falls back).
const ENTRIES_PER_CALL: usize = 256;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Why a batch read did not give the whole map.
#[derive(Debug)]
pub(crate) enum BatchError {
    /// This kernel (or this map) cannot do it; iterate instead.
    Unsupported,
    /// The kernel refused for another reason.
    Io(io::Error),
}

/// Buffers of the batch calls, kept between reads: a read that allocates its buffers anew faults
/// their pages in at every scrape.
pub(crate) struct BatchBuffers {
    keys: Vec<u64>,
    values: Vec<CgroupCounters>,
    /// The keys handed over by the current (or last) read, so that a caller falling back to
    /// iteration after an error skips them. Keys only: keeping every entry's counters here as
    /// well held a second copy of the map (a third of a megabyte at 1,000 cgroups).
    handed: Vec<u64>,
}

impl Default for BatchBuffers {
    fn default() -> Self {
        Self {
            keys: vec![0; ENTRIES_PER_CALL],
            values: vec![CgroupCounters::default(); ENTRIES_PER_CALL],
            handed: Vec::new(),
        }
    }
}

impl BatchBuffers {
    /// The keys the last read handed over, whether or not it then failed.
    pub(crate) fn handed(&self) -> &[u64] {
        &self.handed
    }
}

/// Every entry of a `u64 -> CgroupCounters` hash map, handed to `each` batch by batch; how many.
/// On an error some entries may have been handed over already: [`BatchBuffers::handed`] names
/// them.
pub(crate) fn read_counters(
    map: BorrowedFd<'_>,
    buffers: &mut BatchBuffers,
    each: &mut impl FnMut(u64, CgroupCounters),
) -> Result<usize, BatchError> {
    let BatchBuffers { keys, values, handed } = buffers;
    handed.clear();
    let mut hand = |keys: &[u64], values: &[CgroupCounters]| {
        for (key, value) in keys.iter().zip(values) {
            handed.push(*key);
            each(*key, *value);
        }
    };
    // The kernel's position token for hash maps is a bucket index (u32); none on the first call.
    let mut position: Option<u32> = None;
    loop {
        let mut next: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: position.as_ref().map_or(0, |p| p as *const u32 as u64),
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: ENTRIES_PER_CALL as u32,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at buffers of `count` keys (8 bytes) and `count` values (the map's
        // value size, which is CgroupCounters' repr(C) size) that outlive the call, and at two
        // u32 position tokens; the kernel writes no further than that.
        let error = unsafe { crate::sys::bpf_map_lookup_batch(&mut attr) }.err();
        // The kernel sets `count` to what it filled, including on the last call (ENOENT).
        let filled = (attr.count as usize).min(ENTRIES_PER_CALL);
        match error.as_ref().and_then(crate::sys::SysError::errno) {
            None => {}
            Some(libc::ENOENT) => {
                hand(&keys[..filled], &values[..filled]);
                return Ok(handed.len());
            }
            Some(libc::EINVAL | libc::EOPNOTSUPP | KERNEL_ENOTSUPP | libc::ENOSPC) => {
                return Err(BatchError::Unsupported)
            }
            Some(_) => return Err(BatchError::Io(error.map_or_else(io::Error::last_os_error, |error| error.source))),
        }
        hand(&keys[..filled], &values[..filled]);
        position = Some(next);
    }
}
