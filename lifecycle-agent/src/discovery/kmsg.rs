//! The kernel log, read for one kind of line: the OOM killer's account of each kill
//! (`oom-kill:...`), the only place that names the cgroup whose memory limit fired
//! ([`crate::model::oom`]). Read on demand, when the kernel's `mark_victim` record says a kill
//! happened: the line is logged just before it. `syslog(2)`'s non-destructive read of the log's
//! tail takes CAP_SYSLOG and nothing else (no `/dev/kmsg` device, which a container's device
//! rules refuse), and takes nothing from the host's own log readers.

use std::io;

use crate::model::oom::KernelOomKill;

/// How much of the log's tail is read: the line comes after the kill's report (task list and
/// memory summary of the cgroup, usually a few KiB), so the newest 128 KiB hold it.
const TAIL_BYTES: usize = 128 * 1024;

/// Whether this process may read the kernel log (CAP_SYSLOG, or `kernel.dmesg_restrict` 0).
pub(crate) fn readable() -> io::Result<()> {
    crate::sys::kernel_log_size().map(drop).map_err(|error| error.source)
}

/// The kernel's lines about the OOM kills of `pids`, from the log's tail.
pub(crate) fn oom_kills_of(pids: &[u32]) -> io::Result<Vec<KernelOomKill>> {
    let mut buffer = vec![0u8; TAIL_BYTES];
    let read = crate::sys::read_kernel_log_tail(&mut buffer).map_err(|error| error.source)?;
    Ok(oom_kills_in(&buffer[..read], pids))
}

/// The OOM kill lines of `pids` in a piece of the log, newest last.
fn oom_kills_in(log: &[u8], pids: &[u32]) -> Vec<KernelOomKill> {
    String::from_utf8_lossy(log)
        .lines()
        .filter(|line| line.contains("oom-kill:"))
        .filter_map(KernelOomKill::parse)
        .filter(|kill| pids.contains(&kill.pid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_of_the_asked_pids_are_found_in_the_logs_tail() {
        let log = b"<6>[20820.4] Tasks state (memory values in pages):\n\
<6>[20820.4] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,\
task_memcg=/user.slice,task=big,pid=77,uid=0\n\
<3>[20820.5] Memory cgroup out of memory: Killed process 77 (big)\n\
<6>[20821.0] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,oom_memcg=/a,\
task_memcg=/a/b,task=sh,pid=78,uid=0\n<6>[20821";
        let kills = oom_kills_in(log, &[77]);
        assert_eq!(kills.len(), 1);
        assert_eq!((kills[0].pid, kills[0].oom_memcg.as_deref()), (77, None));
        assert_eq!(oom_kills_in(log, &[78])[0].oom_memcg.as_deref(), Some("/a"));
        assert!(oom_kills_in(log, &[79]).is_empty());
    }
}
