//! Process exec and exit (`sched_process_exec`, `sched_process_exit`): who runs in which cgroup,
//! whether it is a pid namespace's init, and how each process ended.

use super::*;

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`, reading
/// the task directly (see [`Memory`]).
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let _ = try_exec::<Direct>(&ctx);
    0
}

/// The same, reading with helpers.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec_probe(ctx: BtfTracePointContext) -> i32 {
    let _ = try_exec::<Probe>(&ctx);
    0
}

#[inline(always)]
fn try_exec<M: Memory>(ctx: &BtfTracePointContext) -> Result<(), i64> {
    if is_agent() {
        return Ok(());
    }
    let header = current_header(EventKind::Exec);
    bump(header.cgroup_id, offset_of!(CgroupCounters, execs), EventKind::Exec);
    // The task that execs, as the tracepoint's typed argument: `current`.
    let task = ctx.arg::<*const u8>(0);
    let parent = M::ptr(task, off!(task_real_parent))?;
    let record = ExecEvent {
        header,
        parent_tgid: M::get::<u32>(parent, off!(task_tgid))?,
        flags: pid_namespace_flags::<M>(task),
        start_time_ns: M::get::<u64>(task, off!(task_start_boottime))?,
        parent_cgroup_id: task_cgroup_id_with::<M>(parent)?,
        comm: task_comm_with::<M>(task),
    };
    send(EventKind::Exec, header.cgroup_id, record);
    Ok(())
}

// ---- process exit -------------------------------------------------------------------------

/// `sched_process_exit(struct task_struct *p, ...)`, reading the task directly (see [`Memory`]).
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let _ = try_exit::<Direct>(&ctx);
    0
}

/// The same, reading with helpers.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_probe(ctx: BtfTracePointContext) -> i32 {
    let _ = try_exit::<Probe>(&ctx);
    0
}

#[inline(always)]
fn try_exit<M: Memory>(ctx: &BtfTracePointContext) -> Result<(), i64> {
    if is_agent() {
        return Ok(());
    }
    let header = current_header(EventKind::Exit);
    // The exiting task, as the tracepoint's typed argument: `current`.
    let task = ctx.arg::<*const u8>(0);
    let signal = M::ptr(task, off!(task_signal))?;
    // do_exit decrements signal->live before this tracepoint: 0 means the last thread is leaving.
    let group_dead = M::get::<i32>(signal, off!(signal_live))? == 0;
    if group_dead {
        bump(header.cgroup_id, offset_of!(CgroupCounters, process_exits), EventKind::Exit);
    }
    // A worker thread's exit says nothing about the container's lifecycle and thread pools churn;
    // record the last thread of a process and any exit of a group leader.
    if !group_dead && header.pid != header.tgid {
        return Ok(());
    }
    let mut cpu_time_ns = M::get::<u64>(task, off!(task_utime))? + M::get::<u64>(task, off!(task_stime))?;
    if group_dead {
        cpu_time_ns += M::get::<u64>(signal, off!(signal_utime))? + M::get::<u64>(signal, off!(signal_stime))?;
    }
    let parent = M::ptr(task, off!(task_real_parent))?;
    let record = ExitEvent {
        header,
        exit_code: M::get::<u32>(task, off!(task_exit_code))?,
        group_dead: group_dead as u32,
        parent_tgid: M::get::<u32>(parent, off!(task_tgid))?,
        _pad: 0,
        start_time_ns: M::get::<u64>(task, off!(task_start_boottime))?,
        cpu_time_ns,
        comm: task_comm_with::<M>(task),
    };
    // A pid namespace's init exiting is a container ending, and a cgroup's last process exiting
    // ends a plain-host unit: the events worth an immediate wake-up (rare, and the state users
    // wait for). Everything else rides the next batch.
    let urgent = group_dead && (is_namespace_init_with::<M>(task) || is_last_of_its_cgroups::<M>(task));
    send_waking(EventKind::Exit, header.cgroup_id, record, urgent);
    Ok(())
}

/// The task's place in the pid namespace tree: [`EXEC_FLAG_CHILD_PID_NAMESPACE`] when it lives
/// below the host's namespace, plus [`EXEC_FLAG_NAMESPACE_INIT`] when it is PID 1 there
/// (`task->thread_pid->numbers[level].nr == 1`). The array is indexed by the level, a variable:
/// that one read always goes through a helper (a direct load needs an offset the verifier knows).
#[inline(always)]
fn pid_namespace_flags<M: Memory>(task: *const u8) -> u32 {
    let Ok(pid) = M::ptr(task, off!(task_thread_pid)) else { return 0 };
    let Ok(level) = M::get::<u32>(pid, off!(pid_level)) else { return 0 };
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

/// Whether the exiting task is the last one in its set of cgroups (`task->cgroups->nr_tasks`
/// still counts it here: it leaves the set after this tracepoint, in `cgroup_exit`). A css_set is
/// one combination of cgroups across hierarchies, so on a host with v1 controllers mounted another
/// set may still hold processes of the same v2 cgroup: the wake-up is then early, never missed.
#[inline(always)]
fn is_last_of_its_cgroups<M: Memory>(task: *const u8) -> bool {
    M::ptr(task, off!(task_cgroups)).and_then(|set| M::get::<i32>(set, off!(css_set_nr_tasks))).is_ok_and(|n| n == 1)
}

#[inline(always)]
pub(crate) fn is_namespace_init(task: *const u8) -> bool {
    is_namespace_init_with::<Probe>(task)
}

#[inline(always)]
fn is_namespace_init_with<M: Memory>(task: *const u8) -> bool {
    pid_namespace_flags::<M>(task) & EXEC_FLAG_NAMESPACE_INIT != 0
}
