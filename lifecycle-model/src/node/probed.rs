//! The facts the probes of the node's containers read, kept by the model from the same events
//! as everything else: accept progress per listening port of each watched network namespace,
//! and each probed container's main process. The probe layer (the agent's `probe/`) says which
//! containers it probes ([`ProbeWatch`]: their netns, main pid and declared ports), feeds back
//! what only /proc tells ([`ProbeSample`]: queue depths, drop counters, the process's scheduler
//! state) and reads the result per container ([`ProbeFacts`]); it never sees a kernel event.
//!
//! A call that changes a probed container's facts names it in its [`ProbeChanges`] (part of the
//! call's `Outcome`), so its owner publishes those facts, and only those, at once: a listener
//! that closes fails its check in the next answer, without waiting for the node's snapshot.
//!
//! Bounded: at most [`MAX_WATCHES`] probed containers (more are refused and counted as
//! `kind="probe_watch"`), and per network namespace the declared ports plus
//! [`MAX_TRACKED_PORTS`] others (more are counted in `ProbeChanges::untracked_ports`).

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use super::UnitLabels;
use crate::{
    event::{Detail, Event},
    probe::{AcceptFacts, AcceptProgress, ProcessFacts, ProcessSample, ProcessState, QueueSample},
};

/// A probed container: its pod's uid and its name (a pod recreated under the same name is
/// another pod, with other facts).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProbeKey {
    pub uid: String,
    pub container: String,
}

impl ProbeKey {
    /// The key of the container the model labels `labels`.
    pub fn of(labels: &UnitLabels) -> Self {
        Self { uid: labels.uid.clone(), container: labels.container.clone() }
    }
}

/// What the probe layer watches for one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeWatch {
    /// Inode of the pod's network namespace (the `netns` of the kernel's TCP events); 0 when
    /// the main process had none left (it already exited): no TCP event matches it.
    pub netns: u32,
    pub main_pid: u32,
    /// When probing began (boot ns): older events belong to whoever had this netns inode or pid
    /// before (the kernel reuses both); the first sample saw everything until then.
    pub since_ns: u64,
    /// The ports the container's declared checks name: always tracked.
    pub ports: BTreeSet<u16>,
}

/// The listeners of one port, as sampled from the kernel (sock_diag, else /proc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortSample {
    pub port: u16,
    /// Listening sockets on the port (v4 and v6, SO_REUSEPORT groups).
    pub count: u32,
    /// Connections in their accept queues.
    pub depth: u32,
    /// The sum of their backlogs, when every one is known (sock_diag; /proc lacks it).
    pub backlog: Option<u32>,
}

/// The listeners of a network namespace and its drop counter, sampled together.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerSample {
    pub ports: Vec<PortSample>,
    /// TcpExt ListenDrops of the netns, cumulative.
    pub netns_drops: u64,
}

/// What one /proc pass found for a probed container.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeSample {
    pub at_ns: u64,
    /// The main process's `stat`; None when the pid is gone.
    pub process: Option<ProcessSample>,
    /// None when the netns could not be read (a vanished process has no `/proc/<pid>/net`):
    /// the last tcp facts stay.
    pub listeners: Option<ListenerSample>,
}

/// What the checks of one container read: published per container on each change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeFacts {
    pub netns: u32,
    /// The main process; None until first sampled.
    pub process: Option<ProcessFacts>,
    /// The listeners of the pod's netns by port; shared by the pod's probed containers.
    pub tcp: Arc<HashMap<u16, AcceptFacts>>,
}

/// What a call changed for the probes (part of its `Outcome`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeChanges {
    /// The containers whose facts changed, in no order, possibly repeated.
    pub changed: Vec<ProbeKey>,
    /// TCP events and samples of ports past a netns's cap, left out.
    pub untracked_ports: u64,
}

impl ProbeChanges {
    pub fn extend(&mut self, other: ProbeChanges) {
        self.changed.extend(other.changed);
        self.untracked_ports += other.untracked_ports;
    }
}

/// Probed containers kept at most: the containers of a full node (110 pods by default) many
/// times over; a watch past it is refused (`kind="probe_watch"`).
pub const MAX_WATCHES: usize = 4096;
/// Ports tracked per network namespace beyond the declared ones. A pod can listen on every port
/// there is; only a declared check reads a port's progress.
pub const MAX_TRACKED_PORTS: usize = 64;

/// One watched container.
#[derive(Debug)]
struct Watched {
    watch: ProbeWatch,
    /// Start time of the main process when first sampled; a different one means the pid was
    /// reused.
    start_ticks: Option<u64>,
    process: Option<ProcessFacts>,
}

/// One watched network namespace.
#[derive(Debug, Default)]
struct Netns {
    /// The earliest `since_ns` of its watchers.
    since_ns: u64,
    watchers: BTreeSet<ProbeKey>,
    /// Ports its watchers declared: tracked whatever the cap.
    declared: BTreeSet<u16>,
    ports: HashMap<u16, AcceptProgress>,
    /// The facts last published, until a port's progress changes.
    published: Option<Arc<HashMap<u16, AcceptFacts>>>,
}

impl Netns {
    /// The progress of `port`, made with `new` if there is room for it (see
    /// [`MAX_TRACKED_PORTS`]).
    fn port_progress(&mut self, port: u16, new: impl FnOnce() -> AcceptProgress) -> Option<&mut AcceptProgress> {
        if !self.ports.contains_key(&port) && !self.declared.contains(&port) {
            // Only undeclared ports count against the cap (at most 64 + declared to look at).
            let undeclared = self.ports.keys().filter(|p| !self.declared.contains(p)).count();
            if undeclared >= MAX_TRACKED_PORTS {
                return None;
            }
        }
        self.published = None;
        Some(self.ports.entry(port).or_insert_with(new))
    }

    fn facts(&mut self) -> Arc<HashMap<u16, AcceptFacts>> {
        self.published
            .get_or_insert_with(|| Arc::new(self.ports.iter().map(|(port, p)| (*port, p.facts())).collect()))
            .clone()
    }

    /// Applies a sample of the namespace's listeners taken at `t`; returns the ports past the cap.
    fn observe(&mut self, t: u64, sample: &ListenerSample) -> u64 {
        let mut untracked = 0;
        self.published = None;
        let sole_listener = sample.ports.len() == 1;
        // Ports tracked but no longer listed by the kernel were closed unseen (a lost record).
        for (port, progress) in self.ports.iter_mut() {
            if !sample.ports.iter().any(|p| p.port == *port) {
                progress.reconcile_listeners(t, 0);
            }
        }
        for listed in &sample.ports {
            let Some(progress) = self.port_progress(listed.port, || AcceptProgress::already_listening(listed.count))
            else {
                untracked += 1;
                continue;
            };
            progress.reconcile_listeners(t, listed.count);
            if progress.is_listening() {
                let queue = QueueSample {
                    depth: listed.depth,
                    backlog: listed.backlog,
                    netns_drops: sample.netns_drops,
                    sole_listener,
                };
                progress.observe_queue(t, queue);
            }
        }
        untracked
    }
}

/// The probed containers' facts (see the module header).
#[derive(Debug, Default)]
pub(super) struct Probed {
    watches: HashMap<ProbeKey, Watched>,
    netns: HashMap<u32, Netns>,
    /// Watched containers by main pid: an exit costs a lookup.
    by_pid: HashMap<u32, Vec<ProbeKey>>,
}

/// Whether a watch was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchKept {
    Kept,
    /// Past [`MAX_WATCHES`]: counted, and the container's checks fail "not observed".
    Refused,
}

impl Probed {
    /// Watches `key` as `watch` says (replacing an earlier watch of it), with the first sample
    /// taken when probing began.
    pub(super) fn watch(&mut self, key: ProbeKey, watch: ProbeWatch, changes: &mut ProbeChanges) -> WatchKept {
        if let Some(known) = self.watches.get(&key) {
            if known.watch.netns == watch.netns && known.watch.main_pid == watch.main_pid {
                // Same process: only the declared ports can differ.
                let netns = watch.netns;
                self.watches.get_mut(&key).expect("known").watch.ports = watch.ports;
                self.redeclare(netns);
                changes.changed.push(key);
                return WatchKept::Kept;
            }
            self.unwatch(&key, changes);
        } else if self.watches.len() >= MAX_WATCHES {
            return WatchKept::Refused;
        }
        let netns =
            self.netns.entry(watch.netns).or_insert_with(|| Netns { since_ns: watch.since_ns, ..Netns::default() });
        netns.since_ns = netns.since_ns.min(watch.since_ns);
        netns.watchers.insert(key.clone());
        self.by_pid.entry(watch.main_pid).or_default().push(key.clone());
        let netns_inode = watch.netns;
        self.watches.insert(key.clone(), Watched { watch, start_ticks: None, process: None });
        self.redeclare(netns_inode);
        changes.changed.push(key);
        WatchKept::Kept
    }

    /// Forgets `key`; its netns goes with its last watcher.
    pub(super) fn unwatch(&mut self, key: &ProbeKey, changes: &mut ProbeChanges) {
        let Some(gone) = self.watches.remove(key) else { return };
        if let Some(keys) = self.by_pid.get_mut(&gone.watch.main_pid) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_pid.remove(&gone.watch.main_pid);
            }
        }
        if let Some(netns) = self.netns.get_mut(&gone.watch.netns) {
            netns.watchers.remove(key);
            if netns.watchers.is_empty() {
                self.netns.remove(&gone.watch.netns);
            } else {
                self.redeclare(gone.watch.netns);
            }
        }
        changes.changed.push(key.clone());
    }

    fn redeclare(&mut self, netns: u32) {
        let Some(entry) = self.netns.get_mut(&netns) else { return };
        entry.declared = entry
            .watchers
            .iter()
            .filter_map(|k| self.watches.get(k))
            .flat_map(|w| w.watch.ports.iter().copied())
            .collect();
    }

    /// Applies a sample of `key`'s main process and netns.
    pub(super) fn sample(&mut self, key: &ProbeKey, sample: &ProbeSample, changes: &mut ProbeChanges) {
        let Some(watched) = self.watches.get_mut(key) else { return };
        watched.apply_process(sample.process, sample.at_ns);
        changes.changed.push(key.clone());
        let Some(listeners) = &sample.listeners else { return };
        let netns_inode = watched.watch.netns;
        if let Some(netns) = self.netns.get_mut(&netns_inode) {
            changes.untracked_ports += netns.observe(sample.at_ns, listeners);
            changes.changed.extend(netns.watchers.iter().cloned());
        }
    }

    /// Applies one kernel event: TCP events of a watched netns, the exit of a watched main
    /// process.
    pub(super) fn apply(&mut self, event: &Event, changes: &mut ProbeChanges) {
        let t = event.at.ns();
        match &event.detail {
            Detail::TcpListen(tcp)
            | Detail::TcpListenClose(tcp)
            | Detail::TcpEstablished(tcp)
            | Detail::TcpAccept(tcp) => {
                let Some(netns) = self.netns.get_mut(&tcp.netns).filter(|n| t >= n.since_ns) else { return };
                let Some(progress) = netns.port_progress(tcp.local_port, AcceptProgress::default) else {
                    changes.untracked_ports += 1;
                    return;
                };
                match event.detail {
                    Detail::TcpListen(_) => progress.on_listen(t),
                    Detail::TcpListenClose(_) => progress.on_close(t),
                    Detail::TcpEstablished(_) => progress.on_established(t),
                    _ => progress.on_accept(t),
                }
                changes.changed.extend(netns.watchers.iter().cloned());
            }
            Detail::Exit { group_dead: true, .. } => {
                let Some(keys) = self.by_pid.get(&event.tgid) else { return };
                for key in keys {
                    let Some(watched) = self.watches.get_mut(key).filter(|w| t >= w.watch.since_ns) else { continue };
                    let previous = watched.process.take();
                    watched.process = Some(ProcessFacts::after_sample(
                        previous.as_ref(),
                        watched.watch.main_pid,
                        ProcessState::Dead,
                        t,
                    ));
                    changes.changed.push(key.clone());
                }
            }
            _ => {}
        }
    }

    /// What `key`'s checks read now; None when it is not watched.
    pub(super) fn facts(&mut self, key: &ProbeKey) -> Option<ProbeFacts> {
        let watched = self.watches.get(key)?;
        let tcp = self.netns.get_mut(&watched.watch.netns).map(Netns::facts).unwrap_or_default();
        Some(ProbeFacts { netns: watched.watch.netns, process: watched.process.clone(), tcp })
    }
}

impl Watched {
    fn apply_process(&mut self, sample: Option<ProcessSample>, now: u64) {
        let pid = self.watch.main_pid;
        let previous = self.process.take();
        let state = match sample {
            None => ProcessState::Dead,
            Some(s) => match self.start_ticks {
                Some(start) if start != s.start_ticks => ProcessState::Dead,
                _ => {
                    self.start_ticks = Some(s.start_ticks);
                    s.state
                }
            },
        };
        // Once dead, a pid stays dead for this watch (a reused pid is another process).
        let state =
            if previous.as_ref().is_some_and(|p| p.state == ProcessState::Dead) { ProcessState::Dead } else { state };
        self.process = Some(ProcessFacts::after_sample(previous.as_ref(), pid, state, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event::TcpDetail, time::BootTime};

    const S: u64 = 1_000_000_000;

    fn key(container: &str) -> ProbeKey {
        ProbeKey { uid: "u".into(), container: container.into() }
    }

    fn watch(netns: u32, pid: u32, ports: &[u16]) -> ProbeWatch {
        ProbeWatch { netns, main_pid: pid, since_ns: 10 * S, ports: ports.iter().copied().collect() }
    }

    fn tcp(netns: u32, port: u16, t: u64, detail: fn(TcpDetail) -> Detail) -> Event {
        let tcp = TcpDetail { socket_cgroup_id: 1, netns, family: 2, local_port: port, remote_port: 0, fd: None };
        Event { at: BootTime::from_ns(t), pid: 1, tgid: 1, cgroup_id: 1, detail: detail(tcp) }
    }

    fn exit(tgid: u32, t: u64) -> Event {
        let detail = Detail::Exit {
            exit_status: Some(0),
            signal: None,
            core_dumped: false,
            group_dead: true,
            parent_tgid: 1,
            started: BootTime::from_ns(0),
            cpu_time: std::time::Duration::ZERO,
            comm: "app".into(),
        };
        Event { at: BootTime::from_ns(t), pid: tgid, tgid, cgroup_id: 1, detail }
    }

    #[test]
    fn a_netns_listening_on_every_port_keeps_a_bounded_state_and_its_declared_ports() {
        // Issue 18: a pod listening on every port grew the probe's per-port state without bound.
        let mut probed = Probed::default();
        let mut changes = ProbeChanges::default();
        probed.watch(key("app"), watch(7, 100, &[8080, 9090]), &mut changes);
        for port in 1..=20_000u16 {
            probed.apply(&tcp(7, port, 11 * S, Detail::TcpListen), &mut changes);
        }
        let facts = probed.facts(&key("app")).expect("watched");
        assert_eq!(facts.tcp.len(), MAX_TRACKED_PORTS + 2, "the declared ports are tracked beyond the 64 others");
        assert!(facts.tcp.contains_key(&8080) && facts.tcp.contains_key(&9090));
        assert_eq!(changes.untracked_ports, 20_000 - MAX_TRACKED_PORTS as u64 - 2);
    }

    #[test]
    fn events_reach_every_container_of_the_netns_and_none_from_before_probing() {
        let mut probed = Probed::default();
        let mut changes = ProbeChanges::default();
        probed.watch(key("app"), watch(7, 100, &[8080]), &mut changes);
        probed.watch(key("side"), watch(7, 200, &[]), &mut changes);
        let mut changes = ProbeChanges::default();
        probed.apply(&tcp(7, 8080, 5 * S, Detail::TcpListen), &mut changes);
        assert!(changes.changed.is_empty(), "an event older than the watch is another netns's");
        probed.apply(&tcp(8, 8080, 11 * S, Detail::TcpListen), &mut changes);
        assert!(changes.changed.is_empty(), "another netns");
        probed.apply(&tcp(7, 8080, 11 * S, Detail::TcpListen), &mut changes);
        changes.changed.sort();
        assert_eq!(changes.changed, [key("app"), key("side")]);
        assert!(probed.facts(&key("side")).expect("watched").tcp[&8080].listening, "the pod's netns is shared");

        let mut changes = ProbeChanges::default();
        probed.apply(&exit(200, 12 * S), &mut changes);
        assert_eq!(changes.changed, [key("side")]);
        let side = probed.facts(&key("side")).expect("watched").process.expect("known");
        assert_eq!((side.pid, side.state, side.state_since_ns), (200, ProcessState::Dead, 12 * S));
        assert_eq!(probed.facts(&key("app")).expect("watched").process, None, "not sampled yet");
    }

    #[test]
    fn a_reused_pid_stays_dead_and_the_last_watcher_takes_the_netns_along() {
        let mut probed = Probed::default();
        let mut changes = ProbeChanges::default();
        probed.watch(key("app"), watch(7, 100, &[]), &mut changes);
        let running = ProcessSample { state: ProcessState::Running, start_ticks: 5 };
        let sample = |process, at_ns| ProbeSample { at_ns, process, listeners: None };
        probed.sample(&key("app"), &sample(Some(running), 11 * S), &mut changes);
        assert_eq!(probed.facts(&key("app")).and_then(|f| f.process).map(|p| p.state), Some(ProcessState::Running));
        let reused = ProcessSample { state: ProcessState::Running, start_ticks: 9 };
        probed.sample(&key("app"), &sample(Some(reused), 12 * S), &mut changes);
        assert_eq!(probed.facts(&key("app")).and_then(|f| f.process).map(|p| p.state), Some(ProcessState::Dead));
        probed.sample(&key("app"), &sample(Some(running), 13 * S), &mut changes);
        assert_eq!(
            probed.facts(&key("app")).and_then(|f| f.process).map(|p| (p.state, p.state_since_ns)),
            Some((ProcessState::Dead, 12 * S)),
            "once dead, dead"
        );
        probed.unwatch(&key("app"), &mut changes);
        assert!(probed.facts(&key("app")).is_none());
        assert!(probed.netns.is_empty() && probed.by_pid.is_empty(), "nothing kept for a container not probed");
    }

    #[test]
    fn watches_past_the_cap_are_refused_and_a_container_not_probed_keeps_nothing() {
        use crate::node::{DroppedKind, NodeTracker, TrackerConfig};
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        for n in 0..MAX_WATCHES {
            let (kept, outcome) = tracker.watch_probe(key(&format!("c{n}")), watch(n as u32, n as u32, &[]), None);
            assert_eq!((kept, outcome.probes.changed.len()), (WatchKept::Kept, 1));
        }
        let (kept, outcome) = tracker.watch_probe(key("one-more"), watch(1, 99_999, &[]), None);
        assert_eq!(kept, WatchKept::Refused);
        assert!(outcome.probes.changed.is_empty());
        assert_eq!(tracker.probe_facts(&key("one-more")), None);
        assert_eq!(tracker.snapshot().dropped().get(DroppedKind::ProbeWatch), 1);
        // Watching a container again (its ports changed) is not a new watch.
        let (kept, _) = tracker.watch_probe(key("c0"), watch(0, 0, &[80]), None);
        assert_eq!(kept, WatchKept::Kept);
        // A container no longer probed frees its place.
        let _ = tracker.unwatch_probe(&key("c1"));
        let (kept, _) = tracker.watch_probe(key("one-more"), watch(1, 99_999, &[]), None);
        assert_eq!(kept, WatchKept::Kept);
    }
}
