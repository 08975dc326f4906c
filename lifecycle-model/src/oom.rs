//! Which memory limit an OOM kill answered, from the kernel's own account of it: the line
//! `oom-kill:constraint=...,oom_memcg=<cgroup>,task_memcg=<cgroup>,task=<comm>,pid=<pid>,uid=<uid>`
//! that `dump_oom_victim` (mm/oom_kill.c) logs for each kill it reports. `oom_memcg` is the
//! cgroup whose limit was hit (absent, with `global_oom`, when the machine itself ran out);
//! `task_memcg` the victim's. Nothing else tells them apart: the `mark_victim` tracepoint names
//! only the victim, and a pod whose containers share a pod-level limit (or whose pod cgroup
//! holds the sandbox's memory too) is killed at the pod's limit while its container's own limit
//! was never reached.
//!
//! The kernel logs this line within its OOM report's rate limit (10 per 5 s): a kill past it
//! has no line, and its limit stays unknown.

use serde::{Deserialize, Serialize};

/// What the kernel logged about one OOM kill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelOomKill {
    /// The victim's thread-group id (the host's pid).
    pub pid: u32,
    /// The victim's command name.
    pub comm: String,
    /// The cgroup whose memory limit was hit; None when the machine ran out (`global_oom`).
    pub oom_memcg: Option<String>,
    /// The victim's memory cgroup.
    pub task_memcg: String,
}

/// Where the limit that fired sits, seen from the victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomScope {
    /// The victim's own cgroup: the container's memory limit.
    Container,
    /// The pod's cgroup (`.../pod<uid>` or `...-pod<uid>.slice`): a pod-level limit, or the
    /// sum of the containers' limits the kubelet sets there, which the sandbox's memory counts
    /// against too.
    Pod,
    /// Another cgroup above the victim: the QoS class's or `kubepods` (the node's allocatable
    /// memory), a systemd slice on a plain host.
    Ancestor,
    /// No cgroup limit: the machine ran out of memory.
    Node,
}

impl OomScope {
    /// The scope as one word, as serde writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            OomScope::Container => "container",
            OomScope::Pod => "pod",
            OomScope::Ancestor => "ancestor",
            OomScope::Node => "node",
        }
    }
}

/// The limit an OOM kill answered, as a termination report carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomLimit {
    pub scope: OomScope,
    /// The cgroup whose limit fired, as the kernel names it (empty for [`OomScope::Node`]).
    pub memcg: String,
    /// The victim's pid (host) and command name.
    pub victim_pid: u32,
    pub victim_comm: String,
}

/// Longest line taken apart: the kernel's records are shorter (1 KiB).
const MAX_LINE: usize = 4096;

impl KernelOomKill {
    /// Reads the kernel's `oom-kill:` line (the message of a `/dev/kmsg` record, or a `dmesg`
    /// line); None for any other line. The fields are found by their keys in the kernel's order,
    /// so that commas inside values (`mems_allowed=0-1,3`) do not split them; `pid` and `uid`
    /// from the end, because the victim's command name before them is the pod's to choose
    /// (`prctl(PR_SET_NAME, "x,pid=1,uid=0")`) while the cgroup paths are the kubelet's.
    pub fn parse(line: &str) -> Option<Self> {
        if line.len() > MAX_LINE {
            return None;
        }
        let line = line.trim_end();
        let rest = &line[line.find("oom-kill:constraint=")?..];
        let (head, uid) = rest.rsplit_once(",uid=")?;
        uid.parse::<u32>().ok()?;
        let (head, pid) = head.rsplit_once(",pid=")?;
        let pid = pid.parse().ok()?;
        let (memcgs, comm) = head.split_once(",task_memcg=").and_then(|(before, after)| {
            let (task_memcg, comm) = after.split_once(",task=")?;
            Some(((before, task_memcg), comm))
        })?;
        let (before, task_memcg) = memcgs;
        let oom_memcg = match before.rsplit_once(",oom_memcg=") {
            Some((_, memcg)) => Some(memcg.to_owned()),
            None if before.ends_with(",global_oom") => None,
            None => return None,
        };
        Some(Self { pid, comm: comm.to_owned(), oom_memcg, task_memcg: task_memcg.to_owned() })
    }

    /// Where the limit that fired sits, from the two cgroup paths.
    pub fn limit(&self) -> OomLimit {
        let scope = match &self.oom_memcg {
            None => OomScope::Node,
            Some(memcg) if *memcg == self.task_memcg => OomScope::Container,
            Some(memcg) => {
                let last = memcg.rsplit('/').next().unwrap_or_default();
                // cgroupfs: `pod<uid>`; systemd: `kubepods-<qos>-pod<uid>.slice`.
                let pod = last.starts_with("pod") || (last.contains("-pod") && last.ends_with(".slice"));
                if pod {
                    OomScope::Pod
                } else {
                    OomScope::Ancestor
                }
            }
        };
        OomLimit {
            scope,
            memcg: self.oom_memcg.clone().unwrap_or_default(),
            victim_pid: self.pid,
            victim_comm: self.comm.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "/kubepods/burstable/pod8bbfeee4-a7fd-45d1-89be-f7b189ac01cf";
    const CONTAINER: &str = "713d30948fd617780ec07c7e8c8607c8a6da28976251a36bcec8fa339c4bdd56";

    fn line(oom_memcg: &str) -> String {
        // As the kernel logged it on the test node (6.18), with the memcg parts varied.
        format!(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={CONTAINER},mems_allowed=0-1,3,\
             {oom_memcg}task_memcg={POD}/{CONTAINER},task=sh,pid=23645,uid=0"
        )
    }

    #[test]
    fn the_limit_that_fired_is_the_container_the_pod_an_ancestor_or_the_node() {
        let pod = KernelOomKill::parse(&line(&format!("oom_memcg={POD},"))).expect("parses");
        assert_eq!(pod.pid, 23645);
        assert_eq!(pod.comm, "sh");
        assert_eq!(pod.task_memcg, format!("{POD}/{CONTAINER}"));
        assert_eq!(pod.limit().scope, OomScope::Pod);
        assert_eq!(pod.limit().memcg, POD);
        let container = KernelOomKill::parse(&line(&format!("oom_memcg={POD}/{CONTAINER},"))).expect("parses");
        assert_eq!(container.limit().scope, OomScope::Container);
        let qos = KernelOomKill::parse(&line("oom_memcg=/kubepods/burstable,")).expect("parses");
        assert_eq!(qos.limit().scope, OomScope::Ancestor);
        let systemd = KernelOomKill::parse(&line(
            "oom_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8bbf.slice,",
        ))
        .expect("parses");
        assert_eq!(systemd.limit().scope, OomScope::Pod);
        let global = KernelOomKill::parse(&line("global_oom,")).expect("parses");
        assert_eq!((global.limit().scope, global.limit().memcg.as_str()), (OomScope::Node, ""));
    }

    #[test]
    fn other_lines_and_broken_ones_are_not_kills() {
        assert_eq!(KernelOomKill::parse("Out of memory: Killed process 23645 (sh)"), None);
        assert_eq!(KernelOomKill::parse("oom-kill:constraint=CONSTRAINT_MEMCG,task=sh"), None);
        let no_pid = line(&format!("oom_memcg={POD},")).replace("pid=23645", "pid=x");
        assert_eq!(KernelOomKill::parse(&no_pid), None);
        assert_eq!(KernelOomKill::parse(&"oom-kill:constraint=".repeat(1000)), None);
    }

    #[test]
    fn a_command_name_cannot_pass_for_another_pid() {
        let named = line(&format!("oom_memcg={POD},")).replace("task=sh,", "task=x,pid=1,uid=0,");
        let kill = KernelOomKill::parse(&named).expect("parses");
        assert_eq!((kill.pid, kill.comm.as_str()), (23645, "x,pid=1,uid=0"));
    }
}
