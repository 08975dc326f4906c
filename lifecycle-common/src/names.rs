//! Names shared by the kernel object and the loader.

/// The ring buffer carrying event records.
pub const EVENTS_MAP: &str = "EVENTS";
/// `HashMap<u64 cgroup id, CgroupCounters>`.
pub const COUNTERS_MAP: &str = "CGROUP_COUNTERS";
/// `PerCpuArray<KindStats>` indexed by event kind.
pub const STATS_MAP: &str = "KIND_STATS";
/// The `.rodata` global holding [`super::KernelOffsets`].
pub const OFFSETS_GLOBAL: &str = "KERNEL_OFFSETS";
/// The `.rodata` global holding [`super::ProgramSettings`].
pub const SETTINGS_GLOBAL: &str = "PROGRAM_SETTINGS";

/// Reads the task directly (BTF-checked loads); `_probe` reads it with helpers, for a kernel
/// whose verifier refuses that.
pub const PROG_EXEC: &str = "sched_process_exec";
pub const PROG_EXEC_PROBE: &str = "sched_process_exec_probe";
pub const PROG_EXIT: &str = "sched_process_exit";
pub const PROG_EXIT_PROBE: &str = "sched_process_exit_probe";
pub const PROG_SIGNAL: &str = "signal_generate";
/// `mark_victim(struct task_struct *, uid_t)`, the prototype of 6.1.130 and later.
pub const PROG_OOM: &str = "mark_victim";
/// `mark_victim(int pid)`, the prototype up to 6.1.129 (5.10, 5.15, early 6.1): the victim
/// is found in [`OOM_KILLS_MAP`], filled by [`PROG_OOM_KILL_SIGNAL`].
pub const PROG_OOM_BY_PID: &str = "mark_victim_pid";
/// On `signal_generate`: remembers each SIGKILL the kernel itself sends (the OOM killer's
/// comes just before `mark_victim`), for [`PROG_OOM_BY_PID`].
pub const PROG_OOM_KILL_SIGNAL: &str = "oom_kill_signal";
/// `LruHashMap<u32 victim thread id, OomKillSignal>`.
pub const OOM_KILLS_MAP: &str = "OOM_KILL_SIGNALS";
pub const PROG_SOCK_STATE: &str = "inet_sock_set_state";
pub const PROG_ACCEPT4: &str = "sys_exit_accept4";
pub const PROG_ACCEPT: &str = "sys_exit_accept";
pub const PROG_CGROUP_MKDIR: &str = "cgroup_mkdir";
pub const PROG_CGROUP_RMDIR: &str = "cgroup_rmdir";
