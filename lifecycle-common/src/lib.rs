//! Types shared by the kernel programs (`lifecycle-ebpf`) and the agent (`lifecycle-agent`).
//!
//! Everything here crosses the kernel/user boundary as raw bytes, so every type is `#[repr(C)]`,
//! `Copy`, and laid out with explicit padding: a compile-time assert pins each size, and the agent's
//! decoder checks the record length before it reads one. The crate is `no_std` and has no
//! dependencies unless the `user` feature asks for `aya::Pod` impls.
//!
//! Names of maps and programs live here too, so the loader and the kernel object cannot drift.

#![no_std]

/// Length of `task_struct::comm`, including the terminating NUL.
pub const TASK_COMM_LEN: usize = 16;
/// Bytes kept of a cgroup path in a [`CgroupEvent`]. Kubelet systemd-driver paths are ~200 bytes;
/// a longer path is truncated and flagged, and the agent then resolves it from cgroupfs instead.
pub const CGROUP_PATH_LEN: usize = 512;

/// What a ring-buffer record is. The discriminant is the first `u32` of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A task replaced its program image (`sched_process_exec`).
    Exec = 0,
    /// A task exited (`sched_process_exit`).
    Exit = 1,
    /// A signal was generated for a task (`signal_generate`).
    Signal = 2,
    /// The OOM killer picked a victim (`mark_victim`).
    OomVictim = 3,
    /// A TCP socket entered LISTEN.
    TcpListen = 4,
    /// A TCP listening socket left LISTEN (closed or shut down).
    TcpListenClose = 5,
    /// A passive TCP connection completed its handshake and sits in a listener's accept queue.
    TcpEstablished = 6,
    /// The application took a connection off an accept queue (`accept`/`accept4` returned).
    TcpAccept = 7,
    /// A cgroup directory appeared on the v2 hierarchy.
    CgroupMkdir = 8,
    /// A cgroup directory was removed from the v2 hierarchy.
    CgroupRmdir = 9,
}

/// Number of [`EventKind`] values; sizes the per-kind statistics array.
pub const EVENT_KIND_COUNT: usize = 10;

impl EventKind {
    /// Every kind, in discriminant order.
    pub const ALL: [EventKind; EVENT_KIND_COUNT] = [
        EventKind::Exec,
        EventKind::Exit,
        EventKind::Signal,
        EventKind::OomVictim,
        EventKind::TcpListen,
        EventKind::TcpListenClose,
        EventKind::TcpEstablished,
        EventKind::TcpAccept,
        EventKind::CgroupMkdir,
        EventKind::CgroupRmdir,
    ];

    /// The kind for a raw discriminant read from a record.
    pub fn from_u32(raw: u32) -> Option<Self> {
        Self::ALL.get(raw as usize).copied()
    }

    /// Stable snake_case name, used as a metric label value and in JSON output.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::Exec => "exec",
            EventKind::Exit => "exit",
            EventKind::Signal => "signal",
            EventKind::OomVictim => "oom_victim",
            EventKind::TcpListen => "tcp_listen",
            EventKind::TcpListenClose => "tcp_listen_close",
            EventKind::TcpEstablished => "tcp_established",
            EventKind::TcpAccept => "tcp_accept",
            EventKind::CgroupMkdir => "cgroup_mkdir",
            EventKind::CgroupRmdir => "cgroup_rmdir",
        }
    }
}

/// Fields every record starts with. `pid`/`tgid`/`cgroup_id` describe the task that was running
/// when the event fired (`current`); records whose subject is another task or a socket carry that
/// subject's identity in their own fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] discriminant.
    pub kind: u32,
    /// Thread id of `current`.
    pub pid: u32,
    /// Thread-group (process) id of `current`.
    pub tgid: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
    /// `CLOCK_BOOTTIME` nanoseconds when the event fired.
    pub time_ns: u64,
    /// cgroup v2 id (the directory's inode number) of `current`.
    pub cgroup_id: u64,
}

/// A task replaced its program image.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// Thread-group id of the task's parent (`real_parent->tgid`).
    pub parent_tgid: u32,
    /// [`EXEC_FLAG_NAMESPACE_INIT`] and friends.
    pub flags: u32,
    /// The task's start time, `CLOCK_BOOTTIME` ns (`task_struct::start_boottime`); with the pid it
    /// identifies a process across pid reuse, and it matches field 22 of `/proc/<pid>/stat`.
    pub start_time_ns: u64,
    /// cgroup v2 id of the parent: a process whose parent sits outside its container was started
    /// into it by the runtime (the init, an exec probe, a hook), not forked by the app.
    pub parent_cgroup_id: u64,
    /// The new program's `comm`.
    pub comm: [u8; TASK_COMM_LEN],
}

/// [`ExecEvent::flags`]: the task is PID 1 of its own (non-initial) pid namespace — a
/// container's init, as opposed to the runtime's setup processes that pass through its cgroup.
pub const EXEC_FLAG_NAMESPACE_INIT: u32 = 1;
/// [`ExecEvent::flags`]: the task lives in a pid namespace below the host's. A container's
/// processes do (unless it shares the host's); the runtime's setup processes that pass through the
/// container's cgroup before its pid namespace exists do not.
pub const EXEC_FLAG_CHILD_PID_NAMESPACE: u32 = 2;

/// A task exited. One record per thread; `group_dead` marks the last thread of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// Raw `task_struct::exit_code`: `(status & 0xff) << 8` for a normal exit, or the terminating
    /// signal in the low 7 bits with bit 7 set when a core was dumped.
    pub exit_code: u32,
    /// 1 when this thread was the last live thread of its thread group, else 0.
    pub group_dead: u32,
    /// Thread-group id of the task's parent at exit.
    pub parent_tgid: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
    /// The task's start time, `CLOCK_BOOTTIME` ns; see [`ExecEvent::start_time_ns`].
    pub start_time_ns: u64,
    /// User plus system CPU time in ns: this thread's, plus the already-exited threads of its group
    /// when `group_dead` is 1.
    pub cpu_time_ns: u64,
    /// `comm` of the exiting task.
    pub comm: [u8; TASK_COMM_LEN],
}

/// A signal was generated. The header's task is the sender (`current`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalEvent {
    pub header: EventHeader,
    /// Signal number.
    pub signal: u32,
    /// The tracepoint's result: 0 delivered, 1 ignored, 2 already pending, 3 overflow (RT),
    /// 4 lost info.
    pub result: i32,
    /// Thread id of the target.
    pub target_pid: u32,
    /// Thread-group id of the target.
    pub target_tgid: u32,
    /// cgroup v2 id of the target.
    pub target_cgroup_id: u64,
    /// 1 when the signal was sent to the whole thread group (kill) rather than one thread (tkill).
    pub group: u32,
    /// [`SIGNAL_FROM_KERNEL`] when the kernel generated it (`SEND_SIG_PRIV`, or a positive
    /// `si_code`: SIGIO/SIGURG for a file's owner, a fault, the OOM killer), whoever `current`
    /// was; 0 when a process sent it (kill, tgkill, sigqueue, a parent's death signal).
    pub origin: u32,
    /// `comm` of the sender.
    pub sender_comm: [u8; TASK_COMM_LEN],
    /// `comm` of the target.
    pub target_comm: [u8; TASK_COMM_LEN],
}

/// [`SignalEvent::origin`]: the kernel generated the signal; `current` did not ask for it.
pub const SIGNAL_FROM_KERNEL: u32 = 1;

/// The key of the signal-record budgets: the sending cgroup and the target's. A budget per
/// pair, so that no cgroup spends another pair's: a tenant that makes the runtime's shim signal
/// it (SIGIO on a pipe the shim reads) spends the (shim, tenant) budget, never the runtime's
/// budget for other containers' stop signals. Kernel-generated signals use sender 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalBudgetKey {
    pub sender_cgroup_id: u64,
    pub target_cgroup_id: u64,
}

/// The OOM killer chose a victim. The header's task is whoever triggered the kill.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomVictimEvent {
    pub header: EventHeader,
    /// Thread id of the victim.
    pub victim_pid: u32,
    /// Thread-group id of the victim.
    pub victim_tgid: u32,
    /// cgroup v2 id of the victim.
    pub victim_cgroup_id: u64,
    /// `comm` of the victim.
    pub victim_comm: [u8; TASK_COMM_LEN],
}

/// A SIGKILL the kernel sent (`SEND_SIG_PRIV`), kept for a moment by its target's thread id:
/// where `mark_victim` carries only the victim's pid, this is how the victim's process and cgroup
/// are found (the OOM killer signals the victim, then marks it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomKillSignal {
    /// Thread-group id of the target.
    pub tgid: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
    /// cgroup v2 id of the target.
    pub cgroup_id: u64,
    /// `comm` of the target.
    pub comm: [u8; TASK_COMM_LEN],
}

/// The cgroup v2 root's id (its kernfs node id; `stat -c %i` of the cgroup2 mount says 1 too):
/// what a socket is charged to when the kernel keeps no cgroup for it (5.10's tagged
/// `sock_cgroup_data` while net_prio or net_cls data is set, or no cgroup at all).
pub const ROOT_CGROUP_ID: u64 = 1;

/// A TCP socket event: listen open/close, a passive connection established, or an accept.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpEvent {
    pub header: EventHeader,
    /// cgroup v2 id the socket is charged to (`sk->sk_cgrp_data`): the cgroup of the task that
    /// created the listening socket. Accept-queue accounting uses this, never `current`, because
    /// handshakes complete in softirq context on whatever task happened to run.
    pub socket_cgroup_id: u64,
    /// Inode number of the socket's network namespace.
    pub netns: u32,
    /// Address family (AF_INET = 2, AF_INET6 = 10).
    pub family: u16,
    /// Local port, host byte order.
    pub local_port: u16,
    /// Remote port, host byte order; 0 for listen events.
    pub remote_port: u16,
    /// Explicit padding; always 0.
    pub _pad: u16,
    /// File descriptor returned by accept; -1 for other kinds.
    pub fd: i32,
}

/// A cgroup directory was created or removed on the v2 hierarchy.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupEvent {
    pub header: EventHeader,
    /// Id of the created/removed cgroup (its kernfs inode number).
    pub id: u64,
    /// Length of the path the kernel reported, including the NUL, or the copy's length if it was
    /// truncated to [`CGROUP_PATH_LEN`].
    pub path_len: u32,
    /// 1 when the path did not fit in `path`.
    pub truncated: u32,
    /// NUL-terminated path relative to the hierarchy's root, starting with `/`.
    pub path: [u8; CGROUP_PATH_LEN],
}

/// Per-cgroup counters kept in the kernel, so counts are exact even when the ring loses records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCounters {
    pub execs: u64,
    /// Thread-group exits (the last thread of a process), not thread exits.
    pub process_exits: u64,
    pub signals_received: u64,
    pub signals_sent: u64,
    pub oom_kills: u64,
    pub tcp_listens: u64,
    pub tcp_established: u64,
    pub tcp_accepts: u64,
    /// Records about this cgroup (any kind) that could not be reserved in the ring.
    pub events_lost: u64,
    /// Signals counted here and not recorded, by number (index = signal; standard signals only):
    /// sent inside this cgroup, not to a pid namespace's init, and neither a stop request nor a
    /// signal that would end or stop its target (see [`signal_is_recorded`]). The agent adds them
    /// to the recorded ones, so per-signal counts stay exact. SIGCHLD is never counted here.
    pub unrecorded_signals: [u64; SIGNAL_SLOTS],
}

impl core::ops::AddAssign for CgroupCounters {
    fn add_assign(&mut self, other: Self) {
        self.execs += other.execs;
        self.process_exits += other.process_exits;
        self.signals_received += other.signals_received;
        self.signals_sent += other.signals_sent;
        self.oom_kills += other.oom_kills;
        self.tcp_listens += other.tcp_listens;
        self.tcp_established += other.tcp_established;
        self.tcp_accepts += other.tcp_accepts;
        self.events_lost += other.events_lost;
        for (mine, theirs) in self.unrecorded_signals.iter_mut().zip(other.unrecorded_signals) {
            *mine += theirs;
        }
    }
}

/// Slots of [`CgroupCounters::unrecorded_signals`]: one per standard signal number (1-31; slot 0
/// is unused). Real-time signals (32 and up) are always recorded.
pub const SIGNAL_SLOTS: usize = 32;

/// Signal numbers the kernel programs treat specially (the generic Linux numbering: x86, arm64).
pub mod signals {
    pub const SIGHUP: u32 = 1;
    pub const SIGINT: u32 = 2;
    pub const SIGQUIT: u32 = 3;
    pub const SIGKILL: u32 = 9;
    pub const SIGTERM: u32 = 15;
    pub const SIGCHLD: u32 = 17;
    pub const SIGCONT: u32 = 18;
    pub const SIGSTOP: u32 = 19;
    pub const SIGURG: u32 = 23;
    pub const SIGWINCH: u32 = 28;
}

/// Signals recorded whatever their target does with them: the stop requests a runtime or a
/// supervisor sends (SIGTERM, SIGINT, SIGQUIT, SIGHUP: the usual STOPSIGNALs), the two that
/// cannot be caught (SIGKILL, SIGSTOP), and every real-time signal (no slot; rare).
pub const fn signal_always_recorded(signal: u32) -> bool {
    use signals::*;
    matches!(signal, SIGHUP | SIGINT | SIGQUIT | SIGKILL | SIGTERM | SIGSTOP) || signal as usize >= SIGNAL_SLOTS
}

/// True when the default action of standard signal `signal` ends the process (Term, Core) or
/// stops it (Stop): all but SIGCHLD, SIGCONT, SIGURG and SIGWINCH (the kernel's
/// `SIG_KERNEL_IGNORE_MASK` plus SIGCONT). Such a signal is fatal to a target that has not
/// installed a handler for it.
pub const fn signal_default_ends_or_stops(signal: u32) -> bool {
    use signals::*;
    signal != 0 && !matches!(signal, SIGCHLD | SIGCONT | SIGURG | SIGWINCH)
}

/// Whether the kernel programs send a ring record for a signal (SIGCHLD aside: never recorded,
/// the exit record says it all), budget permitting (a sending cgroup gets
/// [`defaults::SIGNAL_RECORDS_PER_SECOND`]). Only these reach the agent's termination judge; the
/// rest are counted per cgroup and number. Recorded: a signal from outside the target's cgroup
/// (runtime, kubelet, another container or host process); inside it, one whose default action
/// ends or stops the target while the target has no handler installed (it is about to die or
/// stop of it), every real-time signal (no slot to count it in), and one of
/// [`signal_always_recorded`] that a pid namespace's init sends to
/// another process (a shell entrypoint passing the stop on, or not: the question "did my app
/// get the SIGTERM?"). Never recorded inside: another process's signal to the container's PID 1,
/// and what a container does to itself without consequence (handled or ignored signals, stop
/// requests included, a child flooding its init with SIGHUPs it ignores, timer and profiling
/// ticks, Go's SIGURG preemption, a JVM's handled SIGSEGV): the termination verdicts only weigh
/// signals to the init from outside the container, and the kernel ignores a signal without a
/// handler that an init gets from inside its namespace.
pub const fn signal_is_recorded(
    signal: u32,
    from_outside: bool,
    to_other_process_namespace_init: bool,
    default_handler: bool,
    from_namespace_init: bool,
) -> bool {
    from_outside
        || (!to_other_process_namespace_init
            && ((default_handler && signal_default_ends_or_stops(signal))
                || signal as usize >= SIGNAL_SLOTS
                || (from_namespace_init && signal_always_recorded(signal))))
}

/// Per-CPU, per-kind delivery statistics (index = [`EventKind`] discriminant).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Records submitted to the ring.
    pub submitted: u64,
    /// Records that found the ring full and were counted instead of sent.
    pub lost: u64,
    /// Counter updates that failed because the per-cgroup map was full.
    pub counter_map_full: u64,
    /// Records not sent because their cgroup had spent its budget (signals: see
    /// [`defaults::SIGNAL_RECORDS_PER_SECOND`]); the counts stay exact.
    pub rate_limited: u64,
    /// Listening sockets whose port could not be remembered for their close record: the
    /// listener map was full, or their cgroup had its quota of entries
    /// ([`defaults::LISTENERS_PER_CGROUP`]).
    pub listener_ports_full: u64,
}

/// Byte offsets of the kernel struct members the programs read, computed by the agent from
/// `/sys/kernel/btf/vmlinux` at load time and written into the object's `.rodata` before loading.
/// Kernel layouts differ between builds; nothing here is hard-coded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_real_parent: u32,
    pub task_comm: u32,
    pub task_exit_code: u32,
    pub task_signal: u32,
    pub task_utime: u32,
    pub task_stime: u32,
    pub task_start_boottime: u32,
    pub task_cgroups: u32,
    pub task_files: u32,
    pub signal_live: u32,
    pub signal_utime: u32,
    pub signal_stime: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub cgroup_root: u32,
    pub cgroup_root_hierarchy_id: u32,
    pub kernfs_node_id: u32,
    pub sock_num: u32,
    pub sock_dport: u32,
    pub sock_family: u32,
    pub sock_net: u32,
    pub sock_protocol: u32,
    /// `sock.sk_cgrp_data`'s first word: the `cgroup` pointer from 5.15 on; in 5.10 the union's
    /// `val`, the same pointer unless its low bits tag net_prio/net_cls data (then the socket
    /// counts as the root cgroup's, as the kernel's own `sock_cgroup_ptr` says).
    pub sock_cgroup: u32,
    pub net_ns_inum: u32,
    pub files_fdt: u32,
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
    pub task_thread_pid: u32,
    pub pid_level: u32,
    pub pid_numbers: u32,
    pub upid_nr: u32,
    /// `sizeof(struct upid)`, the stride of `pid->numbers[]`.
    pub upid_size: u32,
    pub task_group_leader: u32,
    pub task_sighand: u32,
    /// `offsetof(struct sighand_struct, action) + offsetof(struct k_sigaction, sa.sa_handler)`.
    pub sighand_action_handler: u32,
    /// `sizeof(struct k_sigaction)`, the stride of `sighand->action[]`.
    pub k_sigaction_size: u32,
    pub css_set_nr_tasks: u32,
    /// `kernel_siginfo.si_code`.
    pub siginfo_code: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}

/// Run-time settings for the kernel programs (a `.rodata` global set at load).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramSettings {
    /// Wake the reader only once this many bytes wait in the ring; below it the reader finds the
    /// records on its next poll tick. Per-record wake-ups cost 12-22% on an exec/exit loop.
    pub wakeup_bytes: u64,
    /// Thread-group id of the agent itself; its own events are not recorded (0 = record all).
    pub agent_tgid: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}

impl Default for ProgramSettings {
    fn default() -> Self {
        Self { wakeup_bytes: 256 * 1024, agent_tgid: 0, _pad: 0 }
    }
}

pub mod defaults;
pub mod names;

// Sizes are part of the ABI: the decoder checks record lengths against these.
const _: () = assert!(core::mem::size_of::<EventHeader>() == 32);
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 32 + 8 + 8 + 8 + 16);
const _: () = assert!(core::mem::size_of::<ExitEvent>() == 32 + 16 + 16 + 16);
const _: () = assert!(core::mem::size_of::<SignalEvent>() == 32 + 16 + 8 + 8 + 32);
const _: () = assert!(core::mem::size_of::<OomVictimEvent>() == 32 + 8 + 8 + 16);
const _: () = assert!(core::mem::size_of::<TcpEvent>() == 32 + 8 + 4 + 8 + 4);
const _: () = assert!(core::mem::size_of::<OomKillSignal>() == 8 + 8 + TASK_COMM_LEN);
const _: () = assert!(core::mem::size_of::<CgroupEvent>() == 32 + 8 + 8 + CGROUP_PATH_LEN);
const _: () = assert!(core::mem::size_of::<CgroupCounters>() == 9 * 8 + SIGNAL_SLOTS * 8);
const _: () = assert!(core::mem::size_of::<KindStats>() == 5 * 8);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 43 * 4);
const _: () = assert!(core::mem::size_of::<SignalBudgetKey>() == 16);
const _: () = assert!(core::mem::size_of::<ProgramSettings>() == 16);
// Every record starts with the header, so the kind can be read before the type is known.
const _: () = assert!(core::mem::offset_of!(ExecEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(ExitEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(SignalEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(OomVictimEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(TcpEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(CgroupEvent, header) == 0);
const _: () = assert!(core::mem::offset_of!(ExitEvent, start_time_ns) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(SignalEvent, target_cgroup_id) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(TcpEvent, socket_cgroup_id) % 8 == 0);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is #[repr(C)], Copy, built only of integers and integer arrays, and has no
    // implicit padding (the size asserts above would fail if it had), so any bit pattern is valid.
    unsafe impl aya::Pod for super::CgroupCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KindStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProgramSettings {}
}

#[cfg(test)]
mod tests;
