//! The node's memory of stops: every judged termination of a named container, kept after its
//! container and pod are gone, so "why did my pod die?" has an answer for a pod deleted an hour
//! ago (`explain`, `/api/v1/history`), and so each verdict can be logged once as it settles.
//!
//! Bounded three ways, oldest first: [`MAX_STOPS`] stops, [`MAX_BYTES`] of estimated size, and
//! [`MAX_STOPS_PER_POD`] per pod (a crash-looping or churning pod cannot push every other pod's
//! history out). What goes is counted (`lifecycle_state_dropped_total{kind="history"}`).

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use super::{bounds::DroppedKind, DroppedCounts, NodeSnapshot};
use crate::{spec::StopCause, termination::TerminationReport, time::BootTime};

/// Stops kept on the node.
pub const MAX_STOPS: usize = 4096;
/// Estimated bytes of the stops kept.
pub const MAX_BYTES: usize = 8 * 1024 * 1024;
/// Stops kept per pod (per cgroup for a plain host's units).
pub const MAX_STOPS_PER_POD: usize = 64;
/// Stops of a plain host's units kept on the node: a host that runs a short job every second
/// (a timer, cron) cannot push the pods' stops out.
pub const MAX_HOST_STOPS: usize = MAX_STOPS / 4;

/// One judged stop of a container, as kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PastStop {
    /// Its place in the node's history (increasing; for readers that follow it).
    pub seq: u64,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub container: String,
    pub container_id: Option<String>,
    /// The kubelet's restart count of the container when it stopped.
    pub restart_count: u32,
    /// The verdict, as `last_termination` had it (and its cause, if named later).
    pub last_termination: TerminationReport,
}

impl PastStop {
    /// A fair estimate of the memory the stop holds (strings and lists, plus the fixed part).
    fn estimated_bytes(&self) -> usize {
        let scene = &self.last_termination.scene;
        let processes =
            scene.running_at_stop.iter().chain(&scene.alive_at_kill).map(|p| 48 + p.comm.len()).sum::<usize>();
        512 + self.namespace.len()
            + self.pod.len()
            + self.uid.len()
            + self.container.len()
            + self.container_id.as_ref().map_or(0, String::len)
            + self.last_termination.oom_limit.as_ref().map_or(0, |l| l.memcg.len() + l.victim_comm.len())
            + processes
    }
}

impl PastStop {
    /// Whether it is a plain host's unit's (no pod).
    fn is_host(&self) -> bool {
        self.uid.is_empty()
    }

    /// What [`MAX_STOPS_PER_POD`] bounds: the pod, or a host unit's cgroup.
    fn bucket(&self) -> String {
        if self.is_host() {
            format!("host:{}", self.container)
        } else {
            self.uid.clone()
        }
    }
}

/// The stops kept, oldest first.
/// Cloned for a snapshot when a stop is kept after one was published (`shared.rs`): each stop
/// is shared, so that copies pointers, not reports.
#[derive(Clone, Debug, Default)]
pub struct History {
    stops: VecDeque<Arc<PastStop>>,
    bytes: usize,
    per_pod: HashMap<String, usize>,
    /// Stops of host units among `stops`.
    host_stops: usize,
    next_seq: u64,
}

impl History {
    /// Keeps `stop` (its `seq` is assigned here), dropping the oldest past the bounds.
    pub(super) fn record(&mut self, mut stop: PastStop, dropped: &mut DroppedCounts) {
        stop.seq = self.next_seq;
        self.next_seq += 1;
        let bucket = stop.bucket();
        if self.per_pod.get(&bucket).is_some_and(|n| *n >= MAX_STOPS_PER_POD) {
            if let Some(at) = self.stops.iter().position(|s| s.bucket() == bucket) {
                self.remove(at);
                dropped.add(DroppedKind::History, 1);
            }
        }
        if stop.is_host() && self.host_stops >= MAX_HOST_STOPS {
            if let Some(at) = self.stops.iter().position(|s| s.is_host()) {
                self.remove(at);
                dropped.add(DroppedKind::History, 1);
            }
        }
        self.bytes += stop.estimated_bytes();
        *self.per_pod.entry(bucket).or_default() += 1;
        self.host_stops += usize::from(stop.is_host());
        self.stops.push_back(Arc::new(stop));
        while self.stops.len() > MAX_STOPS || self.bytes > MAX_BYTES {
            self.remove(0);
            dropped.add(DroppedKind::History, 1);
        }
    }

    fn remove(&mut self, at: usize) {
        let Some(stop) = self.stops.remove(at) else { return };
        self.bytes = self.bytes.saturating_sub(stop.estimated_bytes());
        self.host_stops -= usize::from(stop.is_host());
        let bucket = stop.bucket();
        if let Some(n) = self.per_pod.get_mut(&bucket) {
            *n -= 1;
            if *n == 0 {
                self.per_pod.remove(&bucket);
            }
        }
    }

    /// A stop judged without a cause got one later (see `pods.rs`): the kept copy follows.
    pub(super) fn name_cause(&mut self, uid: &str, container: &str, exit_time: BootTime, cause: StopCause) {
        if let Some(stop) = self
            .stops
            .iter_mut()
            .rev()
            .find(|s| s.uid == uid && s.container == container && s.last_termination.exit_time == exit_time)
        {
            Arc::make_mut(stop).last_termination.cause = Some(cause);
        }
    }

    /// Changes the kept report of the stop of `container` of pod `uid` that ended at
    /// `exit_time`: a fact that arrived after the verdict (the limit an OOM kill answered).
    pub(super) fn amend(
        &mut self,
        uid: &str,
        container: &str,
        exit_time: BootTime,
        change: impl FnOnce(&mut crate::termination::TerminationReport),
    ) {
        if let Some(stop) = self
            .stops
            .iter_mut()
            .rev()
            .find(|s| s.uid == uid && s.container == container && s.last_termination.exit_time == exit_time)
        {
            let stop = Arc::make_mut(stop);
            let before = stop.estimated_bytes();
            change(&mut stop.last_termination);
            self.bytes = (self.bytes + stop.estimated_bytes()).saturating_sub(before);
        }
    }

    /// The stops of pod `pod` in `namespace` (any uid: a pod recreated under the same name
    /// too), newest first.
    pub fn of_pod(&self, namespace: &str, pod: &str) -> Vec<PastStop> {
        self.stops
            .iter()
            .rev()
            .filter(|s| s.namespace == namespace && s.pod == pod)
            .map(|s| PastStop::clone(s))
            .collect()
    }

    /// The stops of the plain host's unit whose cgroup is `path`, newest first.
    pub fn of_host_unit(&self, path: &str) -> Vec<PastStop> {
        self.stops.iter().rev().filter(|s| s.is_host() && s.container == path).map(|s| PastStop::clone(s)).collect()
    }

    /// The last `limit` stops of the node, newest first.
    pub fn recent(&self, limit: usize) -> Vec<PastStop> {
        self.stops.iter().rev().take(limit).map(|s| PastStop::clone(s)).collect()
    }

    /// Stops with `seq >= from` whose exit is at least `settle_ns` before `now` or whose cause
    /// is known (a cause can arrive up to then), oldest first, at most `limit`.
    pub fn settled_since(&self, from: u64, now: BootTime, settle_ns: u64, limit: usize) -> Vec<PastStop> {
        self.stops
            .iter()
            .filter(|s| s.seq >= from)
            .take_while(|s| {
                s.last_termination.cause.is_none_or(|c| c != StopCause::RuntimeOrUnknown)
                    || now.since(s.last_termination.exit_time) >= settle_ns
            })
            .take(limit)
            .map(|s| PastStop::clone(s))
            .collect()
    }

    /// How many stops are kept, and their estimated bytes.
    #[cfg(test)]
    pub fn size(&self) -> (usize, usize) {
        (self.stops.len(), self.bytes)
    }
}

/// The node's history, as its readers (the API, `explain`, the verdict log) ask for it.
impl NodeSnapshot {
    /// The stops kept of pod `pod` in `namespace`, newest first (its containers may be gone).
    pub fn history_of_pod(&self, namespace: &str, pod: &str) -> Vec<PastStop> {
        self.history.of_pod(namespace, pod)
    }

    /// The stops kept of the plain host's unit whose cgroup is `path`, newest first.
    pub fn history_of_host_unit(&self, path: &str) -> Vec<PastStop> {
        self.history.of_host_unit(path)
    }

    /// The node's last `limit` stops kept, newest first.
    pub fn recent_stops(&self, limit: usize) -> Vec<PastStop> {
        self.history.recent(limit)
    }

    /// Stops from `seq` on that have settled by `now` (their cause known, or
    /// `settle_ns` passed since the exit), oldest first, at most `limit`: what a verdict log
    /// writes once each.
    pub fn settled_stops_since(&self, seq: u64, now: BootTime, settle_ns: u64, limit: usize) -> Vec<PastStop> {
        self.history.settled_since(seq, now, settle_ns, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> BootTime {
        BootTime::from_ns(ns)
    }

    fn stop(pod: &str, n: u64) -> PastStop {
        PastStop {
            seq: 0,
            namespace: "ns".into(),
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            container: "app".into(),
            container_id: Some(format!("{n:064x}")),
            restart_count: n as u32,
            last_termination: TerminationReport::for_tests(n),
        }
    }

    #[test]
    fn history_is_bounded_by_count_by_pod_and_by_bytes_and_counts_what_goes() {
        let mut history = History::default();
        let mut dropped = DroppedCounts::default();
        for n in 0..200 {
            history.record(stop("churner", n), &mut dropped);
        }
        history.record(stop("quiet", 0), &mut dropped);
        assert_eq!(history.of_pod("ns", "churner").len(), MAX_STOPS_PER_POD, "one pod keeps its last 64");
        assert_eq!(history.of_pod("ns", "churner")[0].restart_count, 199, "newest first");
        assert_eq!(history.of_pod("ns", "quiet").len(), 1, "and cannot push another pod out");
        assert_eq!(dropped.get(DroppedKind::History), 200 - MAX_STOPS_PER_POD as u64);
        for n in 0..(MAX_STOPS as u64 + 10) {
            history.record(stop(&format!("p{n}"), n), &mut dropped);
        }
        let (count, bytes) = history.size();
        assert_eq!(count, MAX_STOPS);
        assert!(bytes <= MAX_BYTES);
        assert!(history.of_pod("ns", "quiet").is_empty(), "the oldest went first");
    }

    fn host_stop(path: &str, n: u64) -> PastStop {
        PastStop {
            namespace: "host".into(),
            pod: String::new(),
            uid: String::new(),
            container: path.into(),
            container_id: None,
            ..stop("", n)
        }
    }

    #[test]
    fn host_units_are_kept_per_cgroup_and_cannot_push_the_pods_out() {
        let mut history = History::default();
        let mut dropped = DroppedCounts::default();
        history.record(stop("pod", 0), &mut dropped);
        history.record(host_stop("system.slice/quiet.service", 0), &mut dropped);
        for n in 0..(MAX_HOST_STOPS as u64 * 2) {
            history.record(host_stop(&format!("system.slice/job-{n}.service"), n), &mut dropped);
        }
        for n in 0..100 {
            history.record(host_stop("system.slice/crashloop.service", n), &mut dropped);
        }
        assert_eq!(history.of_pod("ns", "pod").len(), 1, "a host flood leaves the pods' stops");
        assert_eq!(history.of_host_unit("system.slice/crashloop.service").len(), MAX_STOPS_PER_POD);
        assert!(history.of_host_unit("system.slice/quiet.service").is_empty(), "the oldest host stop went first");
        assert_eq!(history.stops.iter().filter(|s| s.is_host()).count(), MAX_HOST_STOPS);
        assert_eq!(history.host_stops, MAX_HOST_STOPS);
    }

    #[test]
    fn a_stop_settles_once_its_cause_is_known_or_the_window_passed() {
        let mut history = History::default();
        let mut dropped = DroppedCounts::default();
        let mut unknown = stop("a", 1);
        unknown.last_termination.cause = Some(StopCause::RuntimeOrUnknown);
        unknown.last_termination.exit_time = at(100);
        history.record(unknown, &mut dropped);
        history.record(stop("b", 2), &mut dropped);
        assert!(history.settled_since(0, at(105), 10, 10).is_empty(), "in order: the first is not settled");
        history.name_cause("uid-a", "app", at(100), StopCause::DeadlineExceeded);
        let settled = history.settled_since(0, at(105), 10, 10);
        assert_eq!(settled.len(), 2);
        assert_eq!(settled[0].last_termination.cause, Some(StopCause::DeadlineExceeded));
        assert_eq!(history.settled_since(1, at(105), 10, 10).len(), 1);
    }
}
