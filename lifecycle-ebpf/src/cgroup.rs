//! Cgroup creation and removal (`cgroup_mkdir`, `cgroup_rmdir`).

use super::*;

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
