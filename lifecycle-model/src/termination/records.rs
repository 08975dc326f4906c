//! The bounded records a judge keeps of one instance: its signals (the ones judging needs
//! pinned, the most recent [`MAX_KEPT_RECORDS`] besides), its OOM kills and its exec sessions;
//! each `record` says whether it dropped an older one ([`Retention`]).

use std::collections::VecDeque;

use super::{SignalSender, TerminationSettings, SIGKILL};

#[derive(Clone, Debug)]
pub(super) struct SignalRecord {
    pub time: u64,
    pub signal: u8,
    pub sender: SignalSender,
    pub to_init: bool,
}

#[derive(Clone, Debug)]
pub(super) struct ExecSession {
    pub start: u64,
    pub end: Option<u64>,
    pub comm: String,
}

/// Records of each kind kept per instance beyond the pinned ones (see `docs/security.md`, the
/// table of bounds): enough for a timeline of a stop, small enough that a container flooding its
/// own PID 1 with ignored signals costs a few kilobytes.
pub const MAX_KEPT_RECORDS: usize = 64;

/// Whether recording something made room by dropping an older record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Nothing was dropped.
    Kept,
    /// An older record (or this one) was dropped to stay within the bound.
    DroppedOne,
}

impl Retention {
    pub(super) fn dropped_if(dropped: bool) -> Self {
        if dropped {
            Retention::DroppedOne
        } else {
            Retention::Kept
        }
    }
}

/// Signals to the instance's processes: what judging needs, pinned, and the most recent.
#[derive(Clone, Debug, Default)]
pub(super) struct SignalLog {
    /// The earliest non-KILL signal to the init from the runtime or the kubelet: the stop signal
    /// of a stop the kubelet made.
    pub first_stop: Option<SignalRecord>,
    /// The earliest stop request ([`TerminationSettings::is_stop_request`]) to the init from
    /// outside the container, whoever sent it (an operator's `kill`, systemd, a process of
    /// another container sharing the process namespace): the stop signal when the kubelet sent
    /// none.
    pub first_outside_stop: Option<SignalRecord>,
    /// The earliest SIGKILL to the init a process outside the container sent (the kernel drops
    /// those from inside: init is immune to signals from its own namespace; the kernel's own, the
    /// OOM killer's, are told by the OOM event).
    pub first_kill: Option<SignalRecord>,
    pub recent: VecDeque<SignalRecord>,
}

impl SignalLog {
    /// The stop signal so far: the kubelet's when it sent one (an operator's signal before a
    /// deletion does not start the kubelet's grace), else the first from outside.
    pub(super) fn stop(&self) -> Option<&SignalRecord> {
        self.first_stop.as_ref().or(self.first_outside_stop.as_ref())
    }

    /// The stop signal of a stop that ended at `exit_time` with `exit_signal`: as [`Self::stop`]
    /// among the records before the exit; failing those, when the init died of a signal that
    /// came from outside (a `kill -USR1`), that signal.
    pub(super) fn stop_before(&self, exit_time: u64, exit_signal: Option<u8>) -> Option<&SignalRecord> {
        let before = |record: &&SignalRecord| record.time <= exit_time;
        self.first_stop.as_ref().filter(before).or(self.first_outside_stop.as_ref().filter(before)).or_else(|| {
            let fatal = exit_signal.filter(|&signal| signal != SIGKILL)?;
            self.recent
                .iter()
                .find(|r| r.to_init && r.signal == fatal && r.sender.is_from_outside() && r.time <= exit_time)
        })
    }

    pub(super) fn record(&mut self, record: SignalRecord, settings: &TerminationSettings) -> Retention {
        let earlier = |kept: &Option<SignalRecord>| kept.as_ref().is_none_or(|k| record.time < k.time);
        if record.to_init && record.signal != SIGKILL && record.sender.is_kubelet_side() && earlier(&self.first_stop) {
            self.first_stop = Some(record.clone());
        }
        if record.to_init
            && record.sender.is_from_outside()
            && settings.is_stop_request(record.signal)
            && earlier(&self.first_outside_stop)
        {
            self.first_outside_stop = Some(record.clone());
        }
        if record.to_init && record.signal == SIGKILL && record.sender.is_from_outside() && earlier(&self.first_kill) {
            self.first_kill = Some(record.clone());
        }
        let full = self.recent.len() >= MAX_KEPT_RECORDS;
        if full {
            self.recent.pop_front();
        }
        self.recent.push_back(record);
        Retention::dropped_if(full)
    }
}

/// OOM kills in the instance: how many, and whether (and first when) the init was a victim.
#[derive(Clone, Debug, Default)]
pub(super) struct OomLog {
    /// Times of the first [`MAX_KEPT_RECORDS`] kills; later ones are only counted.
    pub times: Vec<u64>,
    pub beyond_kept: u32,
    pub first_init_victim: Option<u64>,
}

impl OomLog {
    pub(super) fn record(&mut self, time: u64, victim_is_init: bool) -> Retention {
        if victim_is_init && self.first_init_victim.is_none_or(|first| time < first) {
            self.first_init_victim = Some(time);
        }
        if self.times.len() >= MAX_KEPT_RECORDS {
            self.beyond_kept = self.beyond_kept.saturating_add(1);
            return Retention::DroppedOne;
        }
        self.times.push(time);
        Retention::Kept
    }

    /// Kills at or before `time`. Kills past the kept ones came after them, so before an exit
    /// judged later than the last kept one.
    pub(super) fn count_until(&self, time: u64) -> u32 {
        let kept = self.times.iter().filter(|&&t| t <= time).count();
        let beyond = if self.times.last().is_some_and(|&last| last <= time) { self.beyond_kept } else { 0 };
        u32::try_from(kept).unwrap_or(u32::MAX).saturating_add(beyond)
    }
}
