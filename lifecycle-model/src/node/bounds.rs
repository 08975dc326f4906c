//! What the node model drops to stay within its bounds, counted by kind.
//!
//! Every pod on the node may be hostile: it controls its processes, signals and sockets, so
//! everything the model keeps per container has a bound (see the table in `docs/security.md`),
//! and what is dropped to keep it is counted here and exported as
//! `lifecycle_state_dropped_total{kind}`. A verdict never depends on a dropped record: the records
//! judging needs are pinned (see `termination/judge.rs`).

use crate::termination::Retention;

/// What was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DroppedKind {
    /// A signal record of an instance (the pinned stop signal and SIGKILL are never dropped).
    Signal,
    /// An OOM kill's time (the kill is still counted).
    OomKill,
    /// An exec session of an instance (the oldest ended one goes first).
    ExecSession,
    /// A listener open/close after a stop began (folded into the running total).
    ListenerChange,
    /// An accept's time after a stop began (the accept is still counted).
    Accept,
    /// A port of a unit past its cap (its counts are not kept).
    Port,
    /// A gone instance that waited for its name from the runtime.
    DepartedInstance,
    /// A departed unit past the cap on departed units.
    DepartedUnit,
    /// A pod from the API past the cap on pods.
    Pod,
    /// A kill notice (the cause of a stop announced by the kubelet) past the cap.
    KillNotice,
    /// A past stop kept for `explain` past the history's bounds (`history.rs`).
    History,
    /// An OOM victim or a kernel OOM log line that waited for its other half past the bound
    /// (`oom.rs`): that kill's limit stays unknown.
    OomLog,
    /// A probed container past the cap on probed containers (`probed.rs`): its checks fail
    /// "not observed yet".
    ProbeWatch,
    /// The pod and container names of a cgroup under kubepods whose path follows no layout the
    /// kubelet makes (`identity.rs`): it is kept as a unit named by its path, as a host unit is.
    CgroupLayout,
    /// A memory reading for a container the model no longer knows (`pressure.rs`).
    MemoryReading,
    /// A liveness failure the kubelet reported past the cap on kept failures (`pods.rs`).
    LivenessFailure,
}

crate::spelling::spelling!(DroppedKind {
    Signal => "signal",
    OomKill => "oom_kill",
    ExecSession => "exec_session",
    ListenerChange => "listener_change",
    Accept => "accept",
    Port => "port",
    DepartedInstance => "departed_instance",
    DepartedUnit => "departed_unit",
    Pod => "pod",
    KillNotice => "kill_notice",
    History => "history",
    OomLog => "oom_log",
    ProbeWatch => "probe_watch",
    CgroupLayout => "cgroup_layout",
    MemoryReading => "memory_reading",
    LivenessFailure => "liveness_failure",
});

/// Counts of what was dropped, by kind, since the agent started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DroppedCounts([u64; DroppedKind::ALL.len()]);

impl DroppedCounts {
    /// Counts `n` more of `kind`.
    pub fn add(&mut self, kind: DroppedKind, n: u64) {
        self.0[kind as usize] = self.0[kind as usize].saturating_add(n);
    }

    /// Counts one of `kind` if `retention` says something was dropped.
    pub fn note(&mut self, kind: DroppedKind, retention: Retention) {
        if retention == Retention::DroppedOne {
            self.add(kind, 1);
        }
    }

    /// How many of `kind` were dropped.
    pub fn get(&self, kind: DroppedKind) -> u64 {
        self.0[kind as usize]
    }

    /// (kind, count) for every kind, zeros included (series exist from the start).
    pub fn iter(&self) -> impl Iterator<Item = (DroppedKind, u64)> + '_ {
        DroppedKind::ALL.iter().map(|&kind| (kind, self.get(kind)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_declaration_order_so_indexing_is_sound() {
        for (index, &kind) in DroppedKind::ALL.iter().enumerate() {
            assert_eq!(kind as usize, index);
            assert_eq!(serde_json::to_value(kind).expect("serializes"), kind.as_str());
        }
    }

    #[test]
    fn counts_only_what_was_dropped() {
        let mut counts = DroppedCounts::default();
        counts.note(DroppedKind::Signal, Retention::Kept);
        counts.note(DroppedKind::Signal, Retention::DroppedOne);
        counts.add(DroppedKind::Port, 3);
        assert_eq!(counts.get(DroppedKind::Signal), 1);
        assert_eq!(counts.get(DroppedKind::Port), 3);
        assert_eq!(counts.iter().map(|(_, n)| n).sum::<u64>(), 4);
    }
}
