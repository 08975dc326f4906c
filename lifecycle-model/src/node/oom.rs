//! Joins the kernel's two accounts of an OOM kill: the `mark_victim` record (victim pid and
//! cgroup, through the ring) and the `oom-kill:` log line (the limit that fired, from the kernel
//! log, which the agent reads when the record asks for it: [`super::Notice::OomLimitWanted`]).
//! Either may come first, so each side waits a while for the other: the victims seen lately,
//! and the log lines whose victim has not been seen yet.
//! The limit then goes to the instance's evidence, or, when its container already ended, into
//! its report (and the node's history) as a late fact.

use std::collections::VecDeque;

use super::{pods::LATE_NOTICE_NS, DroppedKind, NodeTracker};
use crate::{
    oom::{KernelOomKill, OomLimit},
    time::BootTime,
};

/// Victims and log lines kept waiting for their other half. The kernel logs at most 10 OOM
/// reports per 5 s; more waiting than this means the other half is not coming.
const MAX_WAITING: usize = 64;

/// The two sides, each waiting for the other.
#[derive(Clone, Debug, Default)]
pub(super) struct OomJoin {
    /// (time, victim tgid, victim cgroup id) from `mark_victim`, oldest first.
    victims: VecDeque<(u64, u32, u64)>,
    /// (time, the kernel's line) whose victim was not seen yet, oldest first.
    lines: VecDeque<(u64, KernelOomKill)>,
}

impl NodeTracker {
    /// The kernel's `oom-kill:` line for a kill, at `now` (boot ns).
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply_oom_log(&mut self, kill: KernelOomKill, now: u64) -> super::Outcome {
        self.join_oom_log(kill, now);
        self.outcome()
    }

    fn join_oom_log(&mut self, kill: KernelOomKill, now: u64) {
        self.oom.expire(now);
        let victim = self.oom.victims.iter().rev().find(|(_, tgid, _)| *tgid == kill.pid).map(|(_, _, cgroup)| *cgroup);
        match victim {
            Some(cgroup_id) => self.attach_oom_limit(cgroup_id, kill.limit(), now),
            None => {
                if self.oom.lines.len() >= MAX_WAITING {
                    self.oom.lines.pop_front();
                    self.dropped.add(DroppedKind::OomLog, 1);
                }
                self.oom.lines.push_back((now, kill));
            }
        }
    }

    /// `mark_victim` chose `tgid` in cgroup `cgroup_id` at `time`: its log line may be waiting.
    pub(super) fn oom_victim_seen(&mut self, time: u64, tgid: u32, cgroup_id: u64) {
        self.oom.expire(time);
        if let Some(at) = self.oom.lines.iter().rposition(|(_, kill)| kill.pid == tgid) {
            if let Some((_, kill)) = self.oom.lines.remove(at) {
                self.attach_oom_limit(cgroup_id, kill.limit(), time);
            }
            return;
        }
        if self.oom.victims.len() >= MAX_WAITING {
            self.oom.victims.pop_front();
            self.dropped.add(DroppedKind::OomLog, 1);
        }
        self.oom.victims.push_back((time, tgid, cgroup_id));
        self.staged.notices.push(super::Notice::OomLimitWanted { pid: tgid });
    }

    /// Gives `limit` to the instance in `cgroup_id`: to its evidence while it runs, else to the
    /// report of its end when that came less than [`LATE_NOTICE_NS`] before `now`.
    fn attach_oom_limit(&mut self, cgroup_id: u64, limit: OomLimit, now: u64) {
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        if !instance.finished {
            instance.termination.on_oom_limit(limit);
            return;
        }
        let Some(key) = instance.unit.clone() else { return };
        let Some(unit) = self.units.get_mut(&key) else { return };
        let Some(report) = unit.last_termination.as_mut() else { return };
        if report.oom_kills == 0 || BootTime::from_ns(now).since(report.exit_time) > LATE_NOTICE_NS {
            return;
        }
        report.oom_limit = Some(limit.clone());
        let exit_time = report.exit_time;
        let (uid, container) = (unit.labels.uid.clone(), unit.labels.container.clone());
        std::sync::Arc::make_mut(&mut self.history)
            .amend(&uid, &container, exit_time, |stop| stop.oom_limit = Some(limit));
    }
}

impl OomJoin {
    /// Forgets what waited longer than [`LATE_NOTICE_NS`].
    fn expire(&mut self, now: u64) {
        let fresh = |time: u64| now.saturating_sub(time) <= LATE_NOTICE_NS;
        while self.victims.front().is_some_and(|(time, _, _)| !fresh(*time)) {
            self.victims.pop_front();
        }
        while self.lines.front().is_some_and(|(time, _)| !fresh(*time)) {
            self.lines.pop_front();
        }
    }
}
