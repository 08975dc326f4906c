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
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use lifecycle_common::{
    defaults, signal_always_recorded, signal_default_ends_or_stops, signals::SIGCHLD, CgroupCounters, CgroupEvent,
    EventHeader, EventKind, ExecEvent, ExitEvent, KernelOffsets, KindStats, OomVictimEvent, ProgramSettings,
    SignalEvent, TcpEvent, EVENT_KIND_COUNT, EXEC_FLAG_CHILD_PID_NAMESPACE, EXEC_FLAG_NAMESPACE_INIT, SIGNAL_SLOTS,
    TASK_COMM_LEN,
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

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: *const u8, offset: usize) -> Result<T, i64> {
    if base.is_null() {
        return Err(-1);
    }
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset) as *const T) }.map_err(|e| e as i64)
}

#[inline(always)]
fn read_ptr(base: *const u8, offset: usize) -> Result<*const u8, i64> {
    read::<*const u8>(base, offset)
}

/// cgroup v2 id of a task: `task->cgroups->dfl_cgrp->kn->id`.
#[inline(always)]
fn task_cgroup_id(task: *const u8) -> Result<u64, i64> {
    let css_set = read_ptr(task, off!(task_cgroups))?;
    let cgroup = read_ptr(css_set, off!(css_set_dfl_cgrp))?;
    cgroup_id(cgroup)
}

#[inline(always)]
fn cgroup_id(cgroup: *const u8) -> Result<u64, i64> {
    let kn = read_ptr(cgroup, off!(cgroup_kn))?;
    read::<u64>(kn, off!(kernfs_node_id))
}

#[inline(always)]
fn task_comm(task: *const u8) -> [u8; TASK_COMM_LEN] {
    read::<[u8; TASK_COMM_LEN]>(task, off!(task_comm)).unwrap_or([0; TASK_COMM_LEN])
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

#[inline(always)]
fn lost(kind: EventKind, cgroup: u64) {
    stat(kind, offset_of!(KindStats, lost));
    bump(cgroup, offset_of!(CgroupCounters, events_lost), kind);
}

// ---- process exec -------------------------------------------------------------------------

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    let _ = try_exec();
    0
}

fn try_exec() -> Result<(), i64> {
    if is_agent() {
        return Ok(());
    }
    let header = current_header(EventKind::Exec);
    bump(header.cgroup_id, offset_of!(CgroupCounters, execs), EventKind::Exec);
    // SAFETY: helper without preconditions; the task pointer is only read through probe_read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let parent = read_ptr(task, off!(task_real_parent))?;
    let record = ExecEvent {
        header,
        parent_tgid: read::<u32>(parent, off!(task_tgid))?,
        flags: pid_namespace_flags(task),
        start_time_ns: read::<u64>(task, off!(task_start_boottime))?,
        parent_cgroup_id: task_cgroup_id(parent)?,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    send(EventKind::Exec, header.cgroup_id, record);
    Ok(())
}

// ---- process exit -------------------------------------------------------------------------

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    let _ = try_exit();
    0
}

fn try_exit() -> Result<(), i64> {
    if is_agent() {
        return Ok(());
    }
    let header = current_header(EventKind::Exit);
    // SAFETY: see try_exec.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let signal = read_ptr(task, off!(task_signal))?;
    // do_exit decrements signal->live before this tracepoint: 0 means the last thread is leaving.
    let group_dead = read::<i32>(signal, off!(signal_live))? == 0;
    if group_dead {
        bump(header.cgroup_id, offset_of!(CgroupCounters, process_exits), EventKind::Exit);
    }
    // A worker thread's exit says nothing about the container's lifecycle and thread pools churn;
    // record the last thread of a process and any exit of a group leader.
    if !group_dead && header.pid != header.tgid {
        return Ok(());
    }
    let mut cpu_time_ns = read::<u64>(task, off!(task_utime))? + read::<u64>(task, off!(task_stime))?;
    if group_dead {
        cpu_time_ns += read::<u64>(signal, off!(signal_utime))? + read::<u64>(signal, off!(signal_stime))?;
    }
    let parent = read_ptr(task, off!(task_real_parent))?;
    let record = ExitEvent {
        header,
        exit_code: read::<u32>(task, off!(task_exit_code))?,
        group_dead: group_dead as u32,
        parent_tgid: read::<u32>(parent, off!(task_tgid))?,
        _pad: 0,
        start_time_ns: read::<u64>(task, off!(task_start_boottime))?,
        cpu_time_ns,
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    };
    // A pid namespace's init exiting is a container ending: the one event worth an immediate
    // wake-up (rare, and the state users wait for). Everything else rides the next batch.
    let urgent = group_dead && is_namespace_init(task);
    send_waking(EventKind::Exit, header.cgroup_id, record, urgent);
    Ok(())
}

/// The task's place in the pid namespace tree: [`EXEC_FLAG_CHILD_PID_NAMESPACE`] when it lives
/// below the host's namespace, plus [`EXEC_FLAG_NAMESPACE_INIT`] when it is PID 1 there
/// (`task->thread_pid->numbers[level].nr == 1`).
#[inline(always)]
fn pid_namespace_flags(task: *const u8) -> u32 {
    let Ok(pid) = read_ptr(task, off!(task_thread_pid)) else { return 0 };
    let Ok(level) = read::<u32>(pid, off!(pid_level)) else { return 0 };
    // The kernel nests at most 32 pid namespaces.
    if level == 0 || level > 32 {
        return 0;
    }
    let slot = off!(pid_numbers) + level as usize * off!(upid_size) + off!(upid_nr);
    match read::<i32>(pid, slot) {
        Ok(1) => EXEC_FLAG_CHILD_PID_NAMESPACE | EXEC_FLAG_NAMESPACE_INIT,
        _ => EXEC_FLAG_CHILD_PID_NAMESPACE,
    }
}

#[inline(always)]
fn is_namespace_init(task: *const u8) -> bool {
    pid_namespace_flags(task) & EXEC_FLAG_NAMESPACE_INIT != 0
}

// ---- signals ------------------------------------------------------------------------------

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task, int group,
/// int result)`; the sender is `current`.
#[btf_tracepoint(function = "signal_generate")]
pub fn signal_generate(ctx: BtfTracePointContext) -> i32 {
    let _ = try_signal(&ctx);
    0
}

fn try_signal(ctx: &BtfTracePointContext) -> Result<(), i64> {
    // The hot path (a process signalling itself, handled, counted only) costs one helper or read
    // per line here; the record's own fields (time, names, target pid) are read only to send it.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let agent = setting!(agent_tgid);
    if agent != 0 && tgid == agent {
        return Ok(());
    }
    let signal = ctx.arg::<u64>(0) as u32;
    let target = ctx.arg::<u64>(2) as *const u8;
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // raise(), a signal to a single-threaded self: the target is the running task.
    // SAFETY: helper without preconditions; the pointer is only compared.
    let to_self_task = target == unsafe { bpf_get_current_task() } as *const u8;
    let target_tgid = if to_self_task { tgid } else { read::<u32>(target, off!(task_tgid))? };
    let to_self = target_tgid == tgid;
    // A process signalling itself is in its own cgroup: skip the walk to the target's cgroup.
    let target_cgroup_id = if to_self { cgroup_id } else { task_cgroup_id(target)? };
    let (sent, received) = (offset_of!(CgroupCounters, signals_sent), offset_of!(CgroupCounters, signals_received));
    if target_cgroup_id != cgroup_id {
        bump(cgroup_id, sent, EventKind::Signal);
        bump(target_cgroup_id, received, EventKind::Signal);
    } else {
        // Inside one cgroup, only what a verdict or a death can hang on is recorded (see
        // `lifecycle_common::signal_is_recorded`); the rest is counted by number, both sides and
        // the number with one map lookup. Every child exit generates SIGCHLD to its parent: the
        // exit record already says it all, so it is never recorded (nor given a slot).
        let recorded = signal == SIGCHLD || recorded_inside_cgroup(signal, target, to_self);
        let slot = if recorded || signal as usize >= SIGNAL_SLOTS {
            NO_FIELD
        } else {
            offset_of!(CgroupCounters, unrecorded_signals) + signal as usize * core::mem::size_of::<u64>()
        };
        bump_fields(cgroup_id, [sent, received, slot], EventKind::Signal);
        if slot != NO_FIELD {
            return Ok(());
        }
    }
    if signal == SIGCHLD {
        return Ok(());
    }
    let record = SignalEvent {
        header: EventHeader {
            kind: EventKind::Signal as u32,
            pid: pid_tgid as u32,
            tgid,
            _pad: 0,
            // SAFETY: helper without preconditions.
            time_ns: unsafe { bpf_ktime_get_boot_ns() },
            cgroup_id,
        },
        signal,
        result: ctx.arg::<u64>(4) as i32,
        target_pid: read::<u32>(target, off!(task_pid))?,
        target_tgid,
        target_cgroup_id,
        group: (ctx.arg::<u64>(3) as u32 != 0) as u32,
        _pad: 0,
        sender_comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        target_comm: task_comm(target),
    };
    send(EventKind::Signal, target_cgroup_id, record);
    Ok(())
}

/// `lifecycle_common::signal_is_recorded` for a signal sent inside the target's cgroup, cheapest
/// test first. A field that cannot be read counts as "record it".
#[inline(always)]
fn recorded_inside_cgroup(signal: u32, target: *const u8, to_self: bool) -> bool {
    if signal_always_recorded(signal) {
        return true;
    }
    if signal_default_ends_or_stops(signal) && handler(target, signal).is_none_or(|handler| handler == SIG_DFL) {
        return true;
    }
    // Another process's signal to a pid namespace's init (the process, so ask of the target's
    // group leader). An init signalling itself (a Go runtime as PID 1 preempting its threads
    // with SIGURG, timers) is no request to stop.
    !to_self && read_ptr(target, off!(task_group_leader)).map_or(true, is_namespace_init)
}

/// The target's handler for standard signal `signal` (1-31): `task->sighand->action[signal - 1]
/// .sa.sa_handler` (`SIG_DFL` 0, `SIG_IGN` 1, else a function).
#[inline(always)]
fn handler(task: *const u8, signal: u32) -> Option<u64> {
    if signal == 0 || signal as usize >= SIGNAL_SLOTS {
        return None;
    }
    let sighand = read_ptr(task, off!(task_sighand)).ok()?;
    let at = off!(sighand_action_handler) + (signal as usize - 1) * off!(k_sigaction_size);
    read::<u64>(sighand, at).ok()
}

// ---- OOM victims --------------------------------------------------------------------------

/// `mark_victim(struct task_struct *task, uid_t uid)`; `current` is whoever hit the limit.
#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim(ctx: BtfTracePointContext) -> i32 {
    let _ = try_oom(&ctx);
    0
}

fn try_oom(ctx: &BtfTracePointContext) -> Result<(), i64> {
    let victim = ctx.arg::<u64>(0) as *const u8;
    let header = current_header(EventKind::OomVictim);
    let victim_cgroup_id = task_cgroup_id(victim)?;
    bump(victim_cgroup_id, offset_of!(CgroupCounters, oom_kills), EventKind::OomVictim);
    let record = OomVictimEvent {
        header,
        victim_pid: read::<u32>(victim, off!(task_pid))?,
        victim_tgid: read::<u32>(victim, off!(task_tgid))?,
        victim_cgroup_id,
        victim_comm: task_comm(victim),
    };
    send(EventKind::OomVictim, victim_cgroup_id, record);
    Ok(())
}

// ---- TCP ----------------------------------------------------------------------------------

/// Socket identity the TCP records share.
struct SocketFacts {
    cgroup_id: u64,
    netns: u32,
    family: u16,
    local_port: u16,
    remote_port: u16,
}

#[inline(always)]
fn socket_facts(sk: *const u8) -> Result<SocketFacts, i64> {
    let cgroup = read_ptr(sk, off!(sock_cgroup))?;
    let net = read_ptr(sk, off!(sock_net))?;
    Ok(SocketFacts {
        cgroup_id: cgroup_id(cgroup)?,
        netns: read::<u32>(net, off!(net_ns_inum))?,
        family: read::<u16>(sk, off!(sock_family))?,
        local_port: read::<u16>(sk, off!(sock_num))?,
        remote_port: u16::from_be(read::<u16>(sk, off!(sock_dport))?),
    })
}

#[inline(always)]
fn tcp_record(kind: EventKind, facts: &SocketFacts, fd: i32) -> TcpEvent {
    TcpEvent {
        header: current_header(kind),
        socket_cgroup_id: facts.cgroup_id,
        netns: facts.netns,
        family: facts.family,
        local_port: facts.local_port,
        remote_port: facts.remote_port,
        _pad: 0,
        fd,
    }
}

/// `inet_sock_set_state(const struct sock *sk, const int oldstate, const int newstate)`.
/// Handshakes finish in softirq on whatever task runs, so everything is charged to the socket's
/// own cgroup, never to `current`.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sock_state(&ctx);
    0
}

fn try_sock_state(ctx: &BtfTracePointContext) -> Result<(), i64> {
    let old_state = ctx.arg::<u64>(1) as i32;
    let new_state = ctx.arg::<u64>(2) as i32;
    let (kind, field) = if new_state == TCP_LISTEN {
        (EventKind::TcpListen, offset_of!(CgroupCounters, tcp_listens))
    } else if old_state == TCP_LISTEN && new_state == TCP_CLOSE {
        // Only LISTEN -> CLOSE: a child socket is cloned in LISTEN and moved to SYN_RECV, which
        // is a handshake, not the listener going away.
        (EventKind::TcpListenClose, usize::MAX)
    } else if old_state == TCP_SYN_RECV && new_state == TCP_ESTABLISHED {
        (EventKind::TcpEstablished, offset_of!(CgroupCounters, tcp_established))
    } else {
        return Ok(());
    };
    let sk = ctx.arg::<u64>(0) as *const u8;
    if read::<u16>(sk, off!(sock_protocol))? != IPPROTO_TCP {
        return Ok(());
    }
    let mut facts = socket_facts(sk)?;
    let key = sk as u64;
    match kind {
        EventKind::TcpListen => {
            // A full map only costs the port on the close record; the listen is still counted.
            let _ = LISTENER_PORTS.insert(&key, &facts.local_port, 0);
        }
        EventKind::TcpListenClose => {
            // SAFETY: the value is copied out immediately; the entry is removed right after.
            if let Some(port) = unsafe { LISTENER_PORTS.get(&key) } {
                facts.local_port = *port;
            }
            let _ = LISTENER_PORTS.remove(&key);
        }
        _ => {}
    }
    if field != usize::MAX {
        bump(facts.cgroup_id, field, kind);
    }
    send(kind, facts.cgroup_id, tcp_record(kind, &facts, -1));
    Ok(())
}

/// `syscalls/sys_exit_accept4` and `sys_exit_accept`: `long ret` sits at offset 16 of the record
/// (8 bytes of common fields, then the 4-byte syscall number padded to 8).
#[tracepoint(category = "syscalls", name = "sys_exit_accept4")]
pub fn sys_exit_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_accept(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_accept")]
pub fn sys_exit_accept(ctx: TracePointContext) -> u32 {
    let _ = try_accept(&ctx);
    0
}

const SYSCALL_RET_OFFSET: usize = 16;

fn try_accept(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: the offset is inside the syscall-exit record layout (see above).
    let ret = unsafe { ctx.read_at::<i64>(SYSCALL_RET_OFFSET) }.map_err(|e| e as i64)?;
    if ret < 0 || is_agent() {
        return Ok(());
    }
    let fd = ret as u32;
    // The new fd -> struct file -> struct socket -> struct sock: the accepted socket inherited the
    // listener's port, netns and cgroup, which is what ties this accept to its listener.
    // SAFETY: see try_exec.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files = read_ptr(task, off!(task_files))?;
    let fdt = read_ptr(files, off!(files_fdt))?;
    if fd >= read::<u32>(fdt, off!(fdtable_max_fds))? {
        return Err(-1);
    }
    let fd_array = read_ptr(fdt, off!(fdtable_fd))?;
    let file = read_ptr(fd_array, fd as usize * core::mem::size_of::<u64>())?;
    let socket = read_ptr(file, off!(file_private_data))?;
    let sk = read_ptr(socket, off!(socket_sk))?;
    let facts = socket_facts(sk)?;
    bump(facts.cgroup_id, offset_of!(CgroupCounters, tcp_accepts), EventKind::TcpAccept);
    send(EventKind::TcpAccept, facts.cgroup_id, tcp_record(EventKind::TcpAccept, &facts, fd as i32));
    Ok(())
}

// ---- cgroups ------------------------------------------------------------------------------

/// `cgroup_mkdir(struct cgroup *cgrp, const char *path)`.
#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> i32 {
    let _ = try_cgroup(&ctx, EventKind::CgroupMkdir);
    0
}

/// `cgroup_rmdir(struct cgroup *cgrp, const char *path)`.
#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: BtfTracePointContext) -> i32 {
    let _ = try_cgroup(&ctx, EventKind::CgroupRmdir);
    0
}

fn try_cgroup(ctx: &BtfTracePointContext, kind: EventKind) -> Result<(), i64> {
    let cgroup = ctx.arg::<u64>(0) as *const u8;
    let path = ctx.arg::<u64>(1) as *const u8;
    let root = read_ptr(cgroup, off!(cgroup_root))?;
    // v1 hierarchies (hybrid hosts) fire too; identity is v2 only.
    if read::<i32>(root, off!(cgroup_root_hierarchy_id))? != DEFAULT_HIERARCHY_ID {
        return Ok(());
    }
    let id = cgroup_id(cgroup)?;
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        lost(kind, id);
        return Ok(());
    };
    // The record is larger than the 512-byte bpf stack: fill it in place.
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at a reserved, exclusively owned CgroupEvent-sized ring slot.
    unsafe {
        (*record).header = current_header(kind);
        (*record).id = id;
        let copied = bpf_probe_read_kernel_str_bytes(path, &mut (*record).path).map_or(0, |s| s.len());
        (*record).path_len = copied as u32;
        // The helper copies at most len-1 bytes plus a NUL; a full buffer means the path was cut.
        (*record).truncated = (copied + 1 >= (*record).path.len()) as u32;
    }
    entry.submit(wakeup_flags(core::mem::size_of::<CgroupEvent>()));
    stat(kind, offset_of!(KindStats, submitted));
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
