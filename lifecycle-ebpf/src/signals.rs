//! Signals (`signal_generate`): every signal counted per target cgroup; recorded only when a
//! verdict or a timeline may use it (from outside the cgroup; inside it, stop requests and
//! signals fatal to their target, but never another process's signal to the container's init
//! that it handles or ignores), and within the sending cgroup's budget.

use super::*;
use crate::process::is_namespace_init;

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
    let origin = signal_origin(ctx.arg::<u64>(1) as *const u8);
    // SAFETY: helper without preconditions.
    let time_ns = unsafe { bpf_ktime_get_boot_ns() };
    // Each (sender, target) pair has a budget of records: a container flooding signals (at its
    // own PID 1, at a neighbour in a shared pid namespace) is counted beyond it, not recorded,
    // and cannot crowd out the runtime's or the kubelet's stop signals to another container,
    // which spend budgets of their own pairs. What the kernel generates (SIGIO for a file's
    // owner, whoever's read woke it) is charged to the target alone.
    let sender_cgroup_id = if origin == SIGNAL_FROM_KERNEL { 0 } else { cgroup_id };
    let budget = SignalBudgetKey { sender_cgroup_id, target_cgroup_id };
    if !within_signal_budget(&budget, time_ns) {
        stat(EventKind::Signal, offset_of!(KindStats, rate_limited));
        return Ok(());
    }
    let record = SignalEvent {
        header: EventHeader { kind: EventKind::Signal as u32, pid: pid_tgid as u32, tgid, _pad: 0, time_ns, cgroup_id },
        signal,
        result: ctx.arg::<u64>(4) as i32,
        target_pid: read::<u32>(target, off!(task_pid))?,
        target_tgid,
        target_cgroup_id,
        group: (ctx.arg::<u64>(3) as u32 != 0) as u32,
        origin,
        sender_comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
        target_comm: task_comm(target),
    };
    send(EventKind::Signal, target_cgroup_id, record);
    Ok(())
}

/// `SEND_SIG_PRIV`: the `kernel_siginfo` pointer of a signal the kernel sends on its own behalf.
const SEND_SIG_PRIV: *const u8 = 1 as *const u8;

/// Who asked for the signal: [`SIGNAL_FROM_KERNEL`] when the kernel generated it
/// (`SEND_SIG_PRIV`, or `si_code > 0`: `SI_FROMKERNEL`), else 0 (a process's kill, tgkill or
/// sigqueue, or no info: `SEND_SIG_NOINFO`, which the kernel treats as `SI_USER` from current).
#[inline(always)]
fn signal_origin(info: *const u8) -> u32 {
    if info == SEND_SIG_PRIV {
        return SIGNAL_FROM_KERNEL;
    }
    match read::<i32>(info, off!(siginfo_code)) {
        Ok(code) if code > 0 => SIGNAL_FROM_KERNEL,
        _ => 0,
    }
}

/// `lifecycle_common::signal_is_recorded` for a signal sent inside the target's cgroup, cheapest
/// test first. A field that cannot be read counts as "record it".
#[inline(always)]
fn recorded_inside_cgroup(signal: u32, target: *const u8, to_self: bool) -> bool {
    // Another process's signal to the container's PID 1 (the process, so ask of the target's
    // group leader): the container doing something to itself. The verdicts only weigh signals to
    // the init from outside the container, and the kernel ignores a signal the init has no
    // handler for when it comes from inside its namespace; a child flooding its init with
    // SIGHUPs it ignores must cost a count, not a record (issue 18). Counted by number.
    if !to_self && read_ptr(target, off!(task_group_leader)).is_ok_and(is_namespace_init) {
        return false;
    }
    // The target dies or stops of it: the record says by whom.
    if signal_default_ends_or_stops(signal) && handler(target, signal).is_none_or(|handler| handler == SIG_DFL) {
        return true;
    }
    // Handled or ignored: counted, except a stop request the container's PID 1 passes on to
    // another process (whether a shell entrypoint forwards SIGTERM to the app is what people
    // ask). A process's own handled stop signals are no request to stop anything (issue 18).
    // SAFETY: helper without preconditions; the pointer is only read through `read_ptr`.
    let sender = unsafe { bpf_get_current_task() } as *const u8;
    signal_always_recorded(signal) && !to_self && read_ptr(sender, off!(task_group_leader)).is_ok_and(is_namespace_init)
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
