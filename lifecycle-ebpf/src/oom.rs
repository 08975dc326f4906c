//! OOM kills (`mark_victim`): the victim, whoever's allocation hit the limit.
//!
//! The tracepoint changed its arguments in 6.1.130 (and 6.2): before, it carried only the
//! victim's pid; since, the victim's task. Both programs are in the object and the agent attaches
//! the one whose arguments match the running kernel's BTF prototype. With the pid form the
//! victim's process and cgroup come from the SIGKILL the OOM killer sends it just before marking
//! it ([`oom_kill_signal`]).

use super::*;

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

/// Entries of [`OOM_KILL_SIGNALS`]: the kernel's own SIGKILLs of the last moment. The OOM killer
/// marks its victim right after signalling it, so a handful would do; the LRU bound only keeps
/// other kernel SIGKILLs (a process group's killing) from growing it.
const OOM_KILL_SIGNAL_ENTRIES: u32 = 256;

/// SIGKILLs sent by the kernel itself, by target thread id (see [`oom_kill_signal`]).
#[map]
static OOM_KILL_SIGNALS: LruHashMap<u32, OomKillSignal> = LruHashMap::with_max_entries(OOM_KILL_SIGNAL_ENTRIES, 0);

/// `SEND_SIG_PRIV`: the `kernel_siginfo` pointer of a signal the kernel sends on its own behalf.
const SEND_SIG_PRIV: u64 = 1;
const SIGKILL: u64 = 9;

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task, ...)`, only
/// where `mark_victim` has the pid form: keeps each kernel-sent SIGKILL's target for it.
#[btf_tracepoint(function = "signal_generate")]
pub fn oom_kill_signal(ctx: BtfTracePointContext) -> i32 {
    let _ = try_oom_kill_signal(&ctx);
    0
}

fn try_oom_kill_signal(ctx: &BtfTracePointContext) -> Result<(), i64> {
    if ctx.arg::<u64>(0) != SIGKILL || ctx.arg::<u64>(1) != SEND_SIG_PRIV {
        return Ok(());
    }
    let target = ctx.arg::<u64>(2) as *const u8;
    let tid = read::<u32>(target, off!(task_pid))?;
    let signal = OomKillSignal {
        tgid: read::<u32>(target, off!(task_tgid))?,
        _pad: 0,
        cgroup_id: task_cgroup_id(target)?,
        comm: task_comm(target),
    };
    let _ = OOM_KILL_SIGNALS.insert(&tid, &signal, 0);
    Ok(())
}

/// `mark_victim(int pid)`: the victim is the target of the kernel's SIGKILL just before, or the
/// running task itself (an allocation by a task that is already exiting marks itself).
#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim_pid(ctx: BtfTracePointContext) -> i32 {
    let _ = try_oom_by_pid(&ctx);
    0
}

fn try_oom_by_pid(ctx: &BtfTracePointContext) -> Result<(), i64> {
    let victim_pid = ctx.arg::<u64>(0) as u32;
    let header = current_header(EventKind::OomVictim);
    let victim = if victim_pid == header.pid {
        // SAFETY: helper without preconditions; the task is only read through probe_read.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        OomKillSignal { tgid: header.tgid, _pad: 0, cgroup_id: header.cgroup_id, comm: task_comm(task) }
    } else {
        // SAFETY: the value is copied out at once; the entry is removed right after.
        match unsafe { OOM_KILL_SIGNALS.get(&victim_pid) } {
            Some(signal) => {
                let signal = *signal;
                let _ = OOM_KILL_SIGNALS.remove(&victim_pid);
                signal
            }
            None => {
                // Not signalled by the kernel a moment ago: nothing tells whose it is. Counted
                // as a lost record of its kind, never attributed to a wrong cgroup.
                stat(EventKind::OomVictim, offset_of!(KindStats, lost));
                return Ok(());
            }
        }
    };
    bump(victim.cgroup_id, offset_of!(CgroupCounters, oom_kills), EventKind::OomVictim);
    let record = OomVictimEvent {
        header,
        victim_pid,
        victim_tgid: victim.tgid,
        victim_cgroup_id: victim.cgroup_id,
        victim_comm: victim.comm,
    };
    send(EventKind::OomVictim, victim.cgroup_id, record);
    Ok(())
}
