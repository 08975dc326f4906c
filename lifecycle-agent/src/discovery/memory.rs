//! A container's memory files: `memory.events` and `memory.pressure` of its cgroup v2
//! directory, and on a hybrid host (the memory controller on cgroup v1) `memory.oom_control` of
//! its v1 memory cgroup, found through its main process's `/proc/<pid>/cgroup`. What the files
//! say is read by `model::memory`; this module only finds and reads them.
//!
//! Each read is a few small files of the kernel's (no pod writes them): never blocking for long,
//! but still file I/O, so the sampler runs it on a blocking thread, never on the model's owner.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::cgroupfs::CgroupRoot;
use crate::model::memory::{parse_memory_events, parse_oom_control, parse_pressure, MemoryEvents, MemorySample};

/// Where this host's memory counts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MemoryLayout {
    /// cgroup v2 with the memory controller: `memory.events` in each container's directory.
    V2,
    /// The memory controller on cgroup v1, mounted here: only `oom_kill` of
    /// `memory.oom_control` (no `memory.high` exists there).
    V1 { mount: PathBuf },
    /// No memory controller found: PSI only.
    None,
}

impl MemoryLayout {
    /// The layout of this host: v2's root lists `memory` in `cgroup.controllers` when the
    /// controller is bound there; else a v1 `memory` mount from mountinfo.
    pub(crate) fn detect(root: &CgroupRoot) -> Self {
        let controllers = std::fs::read_to_string(root.mount().join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            return MemoryLayout::V2;
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        match v1_memory_mount(&mountinfo) {
            Some(mount) => MemoryLayout::V1 { mount },
            None => MemoryLayout::None,
        }
    }

    /// In words, for the log and `lifecycle_feature_enabled`.
    pub(crate) fn describe(&self) -> String {
        match self {
            MemoryLayout::V2 => "cgroup v2 memory controller: memory.events and PSI".into(),
            MemoryLayout::V1 { mount } => format!(
                "the memory controller is cgroup v1's ({}): no memory.events or memory.high, only v1's oom_kill \
                 count; PSI from cgroup v2",
                mount.display()
            ),
            MemoryLayout::None => "no memory controller mounted: PSI only".into(),
        }
    }
}

/// The mount point of a v1 hierarchy with the `memory` controller, from mountinfo text.
pub(crate) fn v1_memory_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = right.split_whitespace();
        let (fstype, _source, options) = (fields.next()?, fields.next()?, fields.next()?);
        let mountpoint = left.split_whitespace().nth(4)?;
        (fstype == "cgroup" && options.split(',').any(|o| o == "memory")).then(|| PathBuf::from(mountpoint))
    })
}

/// The v1 memory cgroup of a process, from its `/proc/<pid>/cgroup` text (`N:memory:/path`).
pub(crate) fn v1_memory_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "memory").then_some(path)
    })
}

/// The v2 cgroup of a process, from its `/proc/<pid>/cgroup` text (`0::/path`).
fn v2_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| line.strip_prefix("0::"))
}

/// Reads the memory files of the container whose main process is `pid` and whose v2 cgroup is
/// `cgroup_id`. None when the process is gone or is in another cgroup now (its pid reused, or
/// the container restarted): a reading must be of the cgroup it is recorded for.
pub(crate) fn read(root: &CgroupRoot, layout: &MemoryLayout, pid: u32, cgroup_id: u64) -> Option<MemorySample> {
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let dir = root.dir_of(v2_path(&proc_cgroup)?);
    if std::fs::metadata(&dir).ok()?.ino() != cgroup_id {
        return None;
    }
    let file = |dir: &Path, name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let events = match layout {
        MemoryLayout::V2 => file(&dir, "memory.events").map(|text| parse_memory_events(&text)).unwrap_or_default(),
        MemoryLayout::V1 { mount } => v1_memory_path(&proc_cgroup)
            .and_then(|path| file(&mount.join(path.trim_start_matches('/')), "memory.oom_control"))
            .map(|text| parse_oom_control(&text))
            .unwrap_or_default(),
        MemoryLayout::None => MemoryEvents::default(),
    };
    let stalls = file(&dir, "memory.pressure").and_then(|text| parse_pressure(&text));
    Some(MemorySample { events, stalls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_memory_hierarchy_and_a_processs_cgroups_are_found() {
        let mountinfo = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
";
        assert_eq!(v1_memory_mount(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(v1_memory_mount("31 30 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"), None);
        let proc_cgroup =
            "12:memory:/kubepods/burstable/podu/abc\n3:cpu,cpuacct:/kubepods\n0::/kubepods/burstable/podu/abc\n";
        assert_eq!(v1_memory_path(proc_cgroup), Some("/kubepods/burstable/podu/abc"));
        assert_eq!(v2_path(proc_cgroup), Some("/kubepods/burstable/podu/abc"));
        assert_eq!(v1_memory_path("0::/x\n"), None);
    }
}
