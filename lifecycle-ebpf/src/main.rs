//! lifecycle's kernel programs. They capture and count; every decision is the agent's.
//!
//! Each program is a thin attach-point wrapper over a `try_*` function. Records go to one ring
//! buffer; when a record cannot be reserved the loss is counted per kind and per cgroup, never
//! dropped silently. Per-cgroup counters are kept in a hash map so counts stay exact whatever the
//! ring loses. Kernel struct offsets arrive from the agent (computed from BTF at load) through the
//! `KERNEL_OFFSETS` global, so nothing here depends on one kernel build's layout.
//!
//! Program types: BTF tracepoints (no tracefs needed) for exec, exit, signals, OOM victims, socket
//! state and cgroup mkdir/rmdir; classic syscall tracepoints for accept, which have no BTF form.
//!
//! This file holds what every program shares (offsets, settings, maps, reading kernel memory,
//! counting, sending); each family of programs has its module: [`process`] (exec, exit),
//! [`signals`], [`oom`], [`tcp`] (socket state, accept) and [`cgroup`] (mkdir, rmdir).

#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic_xadd is the only atomic add the bpf target offers")]

use core::intrinsics::{atomic_xadd, AtomicOrdering};
use core::mem::offset_of;

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_boot_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use lifecycle_common::{
    defaults, signal_always_recorded, signal_default_ends_or_stops, signals::SIGCHLD, CgroupCounters, CgroupEvent,
    EventHeader, EventKind, ExecEvent, ExitEvent, KernelOffsets, KindStats, OomKillSignal, OomVictimEvent,
    ProgramSettings, SignalBudgetKey, SignalEvent, TcpEvent, EVENT_KIND_COUNT, EXEC_FLAG_CHILD_PID_NAMESPACE,
    EXEC_FLAG_NAMESPACE_INIT, ROOT_CGROUP_ID, SIGNAL_FROM_KERNEL, SIGNAL_SLOTS, TASK_COMM_LEN,
};

/// Struct member offsets; overwritten by the agent before load.
#[no_mangle]
static KERNEL_OFFSETS: KernelOffsets = KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_real_parent: 0,
    task_comm: 0,
    task_exit_code: 0,
    task_signal: 0,
    task_utime: 0,
    task_stime: 0,
    task_start_boottime: 0,
    task_cgroups: 0,
    task_files: 0,
    signal_live: 0,
    signal_utime: 0,
    signal_stime: 0,
    css_set_dfl_cgrp: 0,
    cgroup_kn: 0,
    cgroup_root: 0,
    cgroup_root_hierarchy_id: 0,
    kernfs_node_id: 0,
    sock_num: 0,
    sock_dport: 0,
    sock_family: 0,
    sock_net: 0,
    sock_protocol: 0,
    sock_cgroup: 0,
    net_ns_inum: 0,
    files_fdt: 0,
    fdtable_max_fds: 0,
    fdtable_fd: 0,
    file_private_data: 0,
    socket_sk: 0,
    task_thread_pid: 0,
    pid_level: 0,
    pid_numbers: 0,
    upid_nr: 0,
    upid_size: 0,
    task_group_leader: 0,
    task_sighand: 0,
    sighand_action_handler: 0,
    k_sigaction_size: 0,
    css_set_nr_tasks: 0,
    siginfo_code: 0,
    _pad: 0,
};

/// Run-time settings; overwritten by the agent before load.
#[no_mangle]
static PROGRAM_SETTINGS: ProgramSettings = ProgramSettings { wakeup_bytes: 256 * 1024, agent_tgid: 0, _pad: 0 };

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(defaults::RING_BYTES, 0);

#[map]
static CGROUP_COUNTERS: HashMap<u64, CgroupCounters> = HashMap::with_max_entries(defaults::COUNTER_ENTRIES, 0);

/// Listening sockets -> their port. By the time LISTEN -> CLOSE is traced the kernel has already
/// released the port (skc_num reads 0), so the close event takes the port remembered at listen.
#[map]
static LISTENER_PORTS: HashMap<u64, u16> = HashMap::with_max_entries(defaults::LISTENER_ENTRIES, 0);

#[map]
static KIND_STATS: PerCpuArray<KindStats> = PerCpuArray::with_max_entries(EVENT_KIND_COUNT as u32, 0);

/// Listening sockets each cgroup has in LISTENER_PORTS now (entries exist while non-zero), for
/// the per-cgroup quota.
#[map]
static LISTENERS_PER_CGROUP: HashMap<u64, u64> = HashMap::with_max_entries(defaults::LISTENER_ENTRIES, 0);

/// Per (sending cgroup, target cgroup), the signal-record budget as a GCRA "theoretical arrival
/// time" (boot ns): one u64, no division on the hot path. LRU: a pair idle long enough to be
/// evicted has its whole burst again anyway.
#[map]
static SIGNAL_BUDGET: LruHashMap<SignalBudgetKey, u64> = LruHashMap::with_max_entries(defaults::COUNTER_ENTRIES, 0);

const ZERO_COUNTERS: CgroupCounters = CgroupCounters {
    execs: 0,
    process_exits: 0,
    signals_received: 0,
    signals_sent: 0,
    oom_kills: 0,
    tcp_listens: 0,
    tcp_established: 0,
    tcp_accepts: 0,
    events_lost: 0,
    unrecorded_signals: [0; SIGNAL_SLOTS],
};

/// `SIG_DFL`: no handler installed, the signal's default action applies.
const SIG_DFL: u64 = 0;
const IPPROTO_TCP: u16 = 6;
const TCP_ESTABLISHED: i32 = 1;
const TCP_SYN_RECV: i32 = 3;
const TCP_CLOSE: i32 = 7;
const TCP_LISTEN: i32 = 10;
/// `cgrp_dfl_root`, the v2 hierarchy, always gets hierarchy id 0.
const DEFAULT_HIERARCHY_ID: i32 = 0;

/// Reads one offset from the global. Volatile so the compiler cannot fold the zero placeholder.
macro_rules! off {
    ($field:ident) => {
        // SAFETY: reading a field of a static; volatile only defeats constant folding.
        unsafe { core::ptr::read_volatile(&KERNEL_OFFSETS.$field) } as usize
    };
}

macro_rules! setting {
    ($field:ident) => {
        // SAFETY: as in `off!`.
        unsafe { core::ptr::read_volatile(&PROGRAM_SETTINGS.$field) }
    };
}

/// How a program reads kernel memory at `base + offset`.
///
/// [`Probe`] calls `bpf_probe_read_kernel` for each read: any pointer, a helper call each.
/// [`Direct`] makes a plain load, which the verifier checks against the kernel's BTF when the
/// pointer is BTF-typed (a `tp_btf` argument, or a pointer member loaded from one): the load
/// becomes a fault-tolerant one that reads 0 instead of faulting, at the cost of a load. The exec
/// and exit programs run on every process of the node, so they read directly; each also exists
/// reading with helpers, which the agent loads where a kernel's verifier refuses the direct one.
trait Memory {
    fn get<T: Copy>(base: *const u8, offset: usize) -> Result<T, i64>;

    #[inline(always)]
    fn ptr(base: *const u8, offset: usize) -> Result<*const u8, i64> {
        Self::get::<*const u8>(base, offset)
    }
}

/// Reads with `bpf_probe_read_kernel` (see [`Memory`]).
struct Probe;

impl Memory for Probe {
    #[inline(always)]
    fn get<T: Copy>(base: *const u8, offset: usize) -> Result<T, i64> {
        if base.is_null() {
            return Err(-1);
        }
        // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
        unsafe { bpf_probe_read_kernel(base.wrapping_add(offset) as *const T) }.map_err(|e| e as i64)
    }
}

/// Reads with plain loads from BTF-typed pointers (see [`Memory`]).
struct Direct;

impl Memory for Direct {
    #[inline(always)]
    fn get<T: Copy>(base: *const u8, offset: usize) -> Result<T, i64> {
        if base.is_null() {
            return Err(-1);
        }
        // SAFETY: `base` is BTF-typed, so the verifier checks the access against the kernel's
        // BTF and makes it a load that cannot fault (see [`Memory`]).
        Ok(unsafe { core::ptr::read_volatile(base.wrapping_add(offset) as *const T) })
    }
}

/// Reads a `T` at `base + offset` in kernel memory with a helper call (any pointer).
#[inline(always)]
fn read<T: Copy>(base: *const u8, offset: usize) -> Result<T, i64> {
    Probe::get(base, offset)
}

#[inline(always)]
fn read_ptr(base: *const u8, offset: usize) -> Result<*const u8, i64> {
    Probe::ptr(base, offset)
}

/// cgroup v2 id of a task: `task->cgroups->dfl_cgrp->kn->id`.
#[inline(always)]
fn task_cgroup_id(task: *const u8) -> Result<u64, i64> {
    task_cgroup_id_with::<Probe>(task)
}

#[inline(always)]
fn task_cgroup_id_with<M: Memory>(task: *const u8) -> Result<u64, i64> {
    let css_set = M::ptr(task, off!(task_cgroups))?;
    let cgroup = M::ptr(css_set, off!(css_set_dfl_cgrp))?;
    cgroup_id_with::<M>(cgroup)
}

#[inline(always)]
fn cgroup_id(cgroup: *const u8) -> Result<u64, i64> {
    cgroup_id_with::<Probe>(cgroup)
}

#[inline(always)]
fn cgroup_id_with<M: Memory>(cgroup: *const u8) -> Result<u64, i64> {
    let kn = M::ptr(cgroup, off!(cgroup_kn))?;
    M::get::<u64>(kn, off!(kernfs_node_id))
}

#[inline(always)]
fn task_comm(task: *const u8) -> [u8; TASK_COMM_LEN] {
    task_comm_with::<Probe>(task)
}

#[inline(always)]
fn task_comm_with<M: Memory>(task: *const u8) -> [u8; TASK_COMM_LEN] {
    M::get::<[u8; TASK_COMM_LEN]>(task, off!(task_comm)).unwrap_or([0; TASK_COMM_LEN])
}

#[inline(always)]
fn current_header(kind: EventKind) -> EventHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    EventHeader {
        kind: kind as u32,
        pid: pid_tgid as u32,
        tgid: (pid_tgid >> 32) as u32,
        _pad: 0,
        // SAFETY: helper without preconditions.
        time_ns: unsafe { bpf_ktime_get_boot_ns() },
        // SAFETY: helper without preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
    }
}

/// True when the running task is the agent itself, whose own activity is not recorded.
#[inline(always)]
fn is_agent() -> bool {
    let agent = setting!(agent_tgid);
    agent != 0 && (bpf_get_current_pid_tgid() >> 32) as u32 == agent
}

#[inline(always)]
fn stat(kind: EventKind, field: usize) {
    if let Some(stats) = KIND_STATS.get_ptr_mut(kind as u32) {
        // SAFETY: `field` is an offset of a u64 inside KindStats and the pointer is the map value.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((stats as *mut u8).add(field) as *mut u64, 1) };
    }
}

/// Adds one to a per-cgroup counter, creating the cgroup's entry on first use.
#[inline(always)]
fn bump(cgroup: u64, field: usize, kind: EventKind) {
    bump_fields(cgroup, [field, NO_FIELD, NO_FIELD], kind)
}

/// A `bump_fields` slot that counts nothing.
const NO_FIELD: usize = usize::MAX;

/// As [`bump`], for up to three counters of the same cgroup with a single map lookup
/// ([`NO_FIELD`] for unused slots).
#[inline(always)]
fn bump_fields(cgroup: u64, fields: [usize; 3], kind: EventKind) {
    let mut entry = CGROUP_COUNTERS.get_ptr_mut(&cgroup);
    if entry.is_none() {
        // Another CPU may insert first; NOEXIST makes that harmless and the lookup below finds it.
        let _ = CGROUP_COUNTERS.insert(&cgroup, &ZERO_COUNTERS, BPF_NOEXIST as u64);
        entry = CGROUP_COUNTERS.get_ptr_mut(&cgroup);
    }
    let Some(counters) = entry else {
        stat(kind, offset_of!(KindStats, counter_map_full));
        return;
    };
    for field in fields {
        if field > core::mem::size_of::<CgroupCounters>() - core::mem::size_of::<u64>() {
            continue;
        }
        // SAFETY: `field` is an offset of a u64 inside CgroupCounters (checked just above, which
        // also bounds it for the verifier); the pointer is the map value.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((counters as *mut u8).add(field) as *mut u64, 1);
        }
    }
}

/// Wake-up policy: only once enough bytes wait, so a busy node costs one wake-up per batch.
#[inline(always)]
fn wakeup_flags(record_bytes: usize) -> u64 {
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA as u64) + record_bytes as u64;
    if waiting >= setting!(wakeup_bytes) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Sends a small record, or counts it lost against `kind` and `cgroup`.
#[inline(always)]
fn send<T: 'static>(kind: EventKind, cgroup: u64, record: T) {
    send_waking(kind, cgroup, record, false)
}

/// As [`send`]; `urgent` wakes the reader at once instead of waiting for a batch.
#[inline(always)]
fn send_waking<T: 'static>(kind: EventKind, cgroup: u64, record: T, urgent: bool) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(record);
            let flags = if urgent { BPF_RB_FORCE_WAKEUP as u64 } else { wakeup_flags(core::mem::size_of::<T>()) };
            entry.submit(flags);
            stat(kind, offset_of!(KindStats, submitted));
        }
        None => lost(kind, cgroup),
    }
}

/// Whether the pair `key` may send one more record of its budget at `now` (GCRA: a record every
/// `1 s / SIGNAL_RECORDS_PER_SECOND` on average, `SIGNAL_RECORDS_BURST` at once). Two CPUs
/// updating the same pair at once may each pass: the bound is approximate by a record or two.
#[inline(always)]
fn within_signal_budget(key: &SignalBudgetKey, now: u64) -> bool {
    const INTERVAL_NS: u64 = 1_000_000_000 / defaults::SIGNAL_RECORDS_PER_SECOND;
    const TOLERANCE_NS: u64 = INTERVAL_NS * (defaults::SIGNAL_RECORDS_BURST - 1);
    // SAFETY: the value is copied out at once.
    let tat = unsafe { SIGNAL_BUDGET.get(key) }.copied().unwrap_or(0).max(now);
    if tat - now > TOLERANCE_NS {
        return false;
    }
    let _ = SIGNAL_BUDGET.insert(key, &(tat + INTERVAL_NS), 0);
    true
}

#[inline(always)]
fn lost(kind: EventKind, cgroup: u64) {
    stat(kind, offset_of!(KindStats, lost));
    bump(cgroup, offset_of!(CgroupCounters, events_lost), kind);
}

// One module per program family; the maps, offsets and helpers above are theirs to share.
mod cgroup;
mod oom;
mod process;
mod signals;
mod tcp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
