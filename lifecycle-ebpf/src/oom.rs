//! OOM kills (`mark_victim`): the victim, whoever's allocation hit the limit.

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
