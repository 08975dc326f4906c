//! The node's units, driven by kernel events: which cgroup is which container, which process is
//! its init, and what each instance's start, stop and exit mean under the kubelet's rules.
//!
//! Pure: events, runtime metadata and times go in; container views and counters come out. No
//! I/O and no clock — the agent's `owner.rs` hands it commands (`command.rs`,
//! [`NodeTracker::handle`]) and serves what it holds.
//!
//! One container *instance* is one container cgroup (runtimes create a fresh cgroup per container
//! id). Instances are linked to a *unit* — (pod uid, container name) in Kubernetes, the cgroup path
//! on a plain host — once its identity is known; restarts are new instances of the same unit, and
//! the unit's status, back-off and termination history span them. When the runtime's metadata
//! arrives after an instance already ran (a crash loop exits in milliseconds), the instance's
//! evidence is kept and replayed into the unit on linking, so nothing is judged with defaults.
//!
//! Submodules: `events` (what each kernel record changes, and a container cgroup's life),
//! `unit` (a unit and its counters, linking), `finish` (judging an exited instance and applying
//! the verdict to its unit), `causes` (why a stop happened), `instance` (one container cgroup and
//! what its processes mean for it), `instances` (every instance, by cgroup, and the questions
//! asked of them all), `processes` (the node's processes, by pid and by cgroup), `sidecar`
//! (sidecars and their stop order), `view` (the read-only views exporters and the API use),
//! `pods` (the API's pod facts), `oom` (OOM victims joined with the kernel's log), `resync`
//! (repairs after lost records), `history` (past stops), `probed` (the probes' facts).

mod bounds;
mod causes;
mod command;
mod disagree;
mod events;
mod finish;
mod history;
mod instance;
mod instances;
mod naming;
mod oom;
mod outcome;
mod phase;
mod pods;
mod pressure;
mod probed;
mod processes;
mod resync;
mod shared;
mod sidecar;
mod snapshot;
// Tests apply events for their effect on the state they then examine; most have no use for
// the outcome, and those about it read it.
#[cfg(test)]
#[expect(unused_must_use, reason = "most tests examine the state, not the outcome")]
mod tests;
mod unit;
mod view;
mod warning;

use std::collections::{BTreeMap, HashMap};

use lifecycle_common::CgroupCounters;

use crate::{
    backoff::Tolerance,
    container_state::RestartPolicy,
    event::{Detail, Event},
    identity::{classify, CgroupIdentity},
    kubelet::KubeletPolicy,
    metadata::ContainerMeta,
    spec::StopCause,
    termination::{ProcessAtStop, Retention, SignalSender},
    time::BootTime,
};

pub use bounds::{DroppedCounts, DroppedKind};
pub use command::{Command, DepartingCounters, FoundCgroup, FoundProcess, ResyncLook};
pub use disagree::{Disagreement, DisagreementKind};
pub use history::{PastStop, MAX_BYTES as MAX_HISTORY_BYTES, MAX_STOPS as MAX_HISTORY_STOPS};
pub use instance::SeedProcess;
use instance::{ExecFacts, Instance, InstanceKind};
pub use outcome::{Ended, Outcome};
pub use phase::{PodConditions, PodPhase, PodView};
pub use pods::NoticeFor;
pub use pressure::{MemoryReading, MemoryTarget};
pub use probed::{
    ListenerSample, PortSample, ProbeChanges, ProbeFacts, ProbeKey, ProbeSample, ProbeWatch, WatchKept,
    MAX_TRACKED_PORTS, MAX_WATCHES as MAX_PROBE_WATCHES,
};
pub use snapshot::NodeSnapshot;
pub use unit::{Judgement, PortStats, Unit, UnitCounters, UnitKey, UnitLabels, MAX_PORTS_PER_UNIT};
pub use view::{AnswerInputs, ContainerView, RunningContainer};
pub use warning::{PodWarning, WarningReason};

/// Settings for the model; defaults are the kubelet's.
#[derive(Clone, Debug)]
pub struct TrackerConfig {
    /// What the node's kubelet is expected to do (its back-off, its gates), until
    /// [`NodeTracker::set_kubelet`] says otherwise.
    pub kubelet: KubeletPolicy,
    pub tolerance: Tolerance,
    /// The pod restartPolicy assumed (the CRI does not carry it): Always, the API default.
    pub restart_policy: RestartPolicy,
    /// Whether a CRI runtime answers at start; while none does, containers are named by pod uid
    /// and container id (see `naming.rs`), and named when it answers.
    pub cri_available: bool,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            kubelet: KubeletPolicy::default(),
            tolerance: Tolerance::default(),
            restart_policy: RestartPolicy::Always,
            cri_available: false,
        }
    }
}

/// Something the plumbing should know or act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// An event named a cgroup the tracker has never seen (its mkdir record was lost): rescan.
    UnknownCgroup(u64),
    /// A container cgroup appeared whose runtime metadata is not known yet: refresh from the CRI.
    MetadataNeeded { container_id: String },
    /// A cgroup path under kubepods follows no layout the agent knows: it is a unit named by
    /// its path, as a host cgroup is (counted as `DroppedKind::CgroupLayout`).
    BadCgroupPath { path: String, error: String },
    /// The OOM killer took `pid`: the kernel logged which limit fired, just before (see
    /// [`NodeTracker::apply_oom_log`]).
    OomLimitWanted { pid: u32 },
    /// A host cgroup of systemd unit `unit` runs (again): ask systemd for its settings (see
    /// [`NodeTracker::set_systemd_unit`]).
    SystemdUnitWanted { path: String, unit: String },
    /// A kubelet process started (its exec, outside any container): read its configuration and
    /// release again (see [`NodeTracker::set_kubelet`]); a restarted kubelet may run with
    /// another.
    KubeletStarted { pid: u32 },
    /// A repair after lost records, or a rescan, found what it reports (counted, and logged
    /// when it repaired something).
    Repaired(Resync),
    /// A probed container could not be watched: past [`MAX_PROBE_WATCHES`] (counted as
    /// `DroppedKind::ProbeWatch`).
    ProbeWatchRefused { key: ProbeKey },
    /// An Event named a pod of this node by its uid under another namespace or name: ignored
    /// (forged?).
    ForgedNotice { namespace: String, name: String },
}

/// Containers gone before the runtime named them, kept for the next metadata (a crash loop on a
/// node whose runtime answers slowly); more than this and the oldest are dropped.
const MAX_DEPARTED_WAITING: usize = 1024;
/// Departed units (their containers or cgroups gone) kept for `--series-retention` at most; past
/// this many, the oldest go first (see [`NodeTracker::expire`]).
pub const MAX_DEPARTED_UNITS: usize = 4096;

/// What [`NodeTracker::resync`] repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resync {
    pub exits_unseen: usize,
    pub cgroups_removed_unseen: usize,
    pub cgroups_created_unseen: usize,
}

/// The kubelet's process name as the kernel records it.
const KUBELET_COMM: &str = "kubelet";

/// Everything the tracker knows about the node.
pub struct NodeTracker {
    config: TrackerConfig,
    cgroups: HashMap<u64, String>,
    processes: processes::Processes,
    instances: instances::Instances,
    units: shared::Units,
    metadata: HashMap<String, ContainerMeta>,
    /// What the public call in progress changed, handed back when it returns (`outcome.rs`):
    /// empty between calls.
    staged: Outcome,
    /// What was dropped to stay within the bounds (see `bounds.rs`).
    dropped: DroppedCounts,
    /// The runtime answered the last time it was asked (see `naming.rs`).
    runtime_reachable: bool,
    /// Pods from the API by uid (see `pods.rs`).
    pods: shared::Pods,
    /// Judged stops, kept after their containers and pods are gone (`history.rs`).
    history: std::sync::Arc<history::History>,
    /// Deleted pods kept past their object's removal, oldest first (`pods.rs`, `pod_gone`).
    pods_gone: std::collections::VecDeque<(u64, String)>,
    /// When the last scan of cgroupfs and /proc (start-up, or a rescan) was made: instances it
    /// found were running, unseen, before it.
    watching_since: u64,
    /// (pod uid, container) -> the cause of a kill the kubelet announced and that has not
    /// happened yet.
    kill_notices: BTreeMap<(String, String), StopCause>,
    /// Pods the kubelet announced it evicts (at most the pods known: a notice for an unknown
    /// pod is not kept, and a pod's entry goes with it), with when (see `pods::EvictionNotice`).
    evicted_by_kubelet: HashMap<String, pods::EvictionNotice>,
    api: pods::ApiState,
    /// OOM victims and the kernel's log lines about them, until they meet (`oom.rs`).
    oom: oom::OomJoin,
    /// The container cgroups whose init lives, as snapshots list them: listed at the first
    /// snapshot after one started, exited, was replaced by an heir or went (each of those empties
    /// it), shared by the snapshots until then (`snapshot.rs`).
    live_inits: std::sync::OnceLock<std::sync::Arc<[snapshot::LiveInit]>>,
    /// The facts the probes read, for the containers the probe layer watches (`probed.rs`).
    probed: probed::Probed,
    /// When a kubelet last started on the host (the kernel's exec record): stops soon after
    /// are told so (`TerminationReport::kubelet_started_before_ns`).
    kubelet_started_at: Option<BootTime>,
    /// (pod uid, container) -> when this node's kubelet last reported a failed liveness probe of
    /// it (its `Unhealthy` event): the evidence for a kill its `Killing` event does not name
    /// (`pods.rs`, `stop_cause`).
    liveness_failures: BTreeMap<(String, String), BootTime>,
    /// Advanced by every call that may change the containers, their states, names or pods: all
    /// but an event that only counted and the probe layer's own calls (`NodeSnapshot::generation`).
    generation: u64,
    /// What the last repair's look did not find, for the next look to confirm (`command.rs`).
    suspects: Option<command::Suspects>,
}

impl NodeTracker {
    pub fn new(config: TrackerConfig) -> Self {
        let runtime_reachable = config.cri_available;
        Self {
            config,
            cgroups: HashMap::new(),
            processes: processes::Processes::default(),
            instances: instances::Instances::default(),
            units: shared::Units::default(),
            metadata: HashMap::new(),
            staged: Outcome::default(),
            dropped: DroppedCounts::default(),
            runtime_reachable,
            pods: shared::Pods::default(),
            pods_gone: std::collections::VecDeque::new(),
            history: Default::default(),
            watching_since: 0,
            kill_notices: BTreeMap::new(),
            evicted_by_kubelet: HashMap::new(),
            api: pods::ApiState::default(),
            oom: oom::OomJoin::default(),
            live_inits: std::sync::OnceLock::new(),
            probed: probed::Probed::default(),
            kubelet_started_at: None,
            liveness_failures: BTreeMap::new(),
            generation: 0,
            suspects: None,
        }
    }

    /// What the call that is returning changed (every public mutator ends with this).
    fn outcome(&mut self) -> Outcome {
        self.generation += 1;
        std::mem::take(&mut self.staged)
    }

    /// The outcome of a call that changed at most counters and the probes' facts, unless it
    /// says a state changed: the generation moves only then.
    fn counted_outcome(&mut self) -> Outcome {
        let outcome = std::mem::take(&mut self.staged);
        if outcome.states_changed || !outcome.ended.is_empty() {
            self.generation += 1;
        }
        outcome
    }

    /// A cgroup that existed before the agent started (from the initial scan).
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn seed_cgroup(&mut self, id: u64, path: &str, now: u64) -> Outcome {
        self.found_cgroup(id, path, now);
        self.outcome()
    }

    /// A cgroup found on disk rather than seen created (start-up, or a repair).
    fn found_cgroup(&mut self, id: u64, path: &str, now: u64) {
        self.watching_since = now;
        if !self.cgroups.contains_key(&id) {
            self.on_cgroup_created(id, path, now);
            // It existed before the agent saw it: what happened in it before now was not seen.
            if let Some(instance) = self.instances.get_mut(id) {
                instance.termination.watched_since(now);
            }
        }
    }

    /// A process that existed before the agent started (from /proc). Seed in start-time order:
    /// the first process of a container whose parent is outside it becomes its init.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn seed_process(&mut self, process: SeedProcess<'_>) -> Outcome {
        if self.processes.contains(process.tgid) || !self.cgroups.contains_key(&process.cgroup_id) {
            return self.outcome();
        }
        let start = process.start_time_ns;
        let exec = ExecFacts {
            tgid: process.tgid,
            parent_tgid: None,
            cgroup_id: process.cgroup_id,
            parent_cgroup_id: process.parent_cgroup_id,
            child_pid_namespace: process.child_pid_namespace,
            exec_time: None,
            start_time_ns: start,
        };
        self.exec(exec, start, process.comm);
        // Its instance's start was not seen if this process is its init (found, not exec'd).
        if let Some(instance) =
            self.instances.get_mut(process.cgroup_id).filter(|i| i.init.is_some_and(|init| init.tgid == process.tgid))
        {
            instance.termination.watched_since(self.watching_since);
        }
        self.outcome()
    }

    /// Runtime metadata for every container the runtime lists now. Instances still unlinked whose
    /// id the runtime does not list are sandboxes or foreign containers and are ignored.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn set_metadata(&mut self, containers: Vec<ContainerMeta>) -> Outcome {
        self.metadata = containers.into_iter().map(|m| (m.container_id.clone(), m)).collect();
        self.runtime_reachable = true;
        self.name_units_named_by_id();
        for cgroup_id in self.instances.unlinked() {
            let Some(instance) = self.instances.get_mut(cgroup_id) else { continue };
            if let InstanceKind::Container { container_id, .. } = &instance.kind {
                if !self.metadata.contains_key(container_id) {
                    instance.ignored = true;
                    continue;
                }
            }
            self.link(cgroup_id);
        }
        // Metadata can change (a deletion grace period appears when the pod is deleted).
        for (cgroup_id, container_id, key) in self.instances.linked_unfinished_containers() {
            let Some(meta) = self.metadata.get(&container_id) else { continue };
            let settings = self.settings_for(&key, Some(meta));
            if let Some(instance) = self.instances.get_mut(cgroup_id) {
                instance.termination.set_settings(settings);
            }
            // A pod's annotations can change while it runs (its probe declaration). The unit is
            // written only when it did: a write copies a unit the snapshots share, and the
            // runtime is asked again every few seconds.
            let declared = &meta.probe_declaration;
            if self.units.get(&key).is_some_and(|unit| unit.probe_declaration != *declared) {
                if let Some(unit) = self.units.get_mut(&key) {
                    unit.probe_declaration = declared.clone();
                }
            }
        }
        self.drop_departed();
        self.outcome()
    }

    /// What systemd says of the unit whose cgroup is `path` (on a plain host): its stops are
    /// judged by its `TimeoutStopSec=` and `KillSignal=`, its restarts by its `Restart=` and
    /// `RestartSec=`. A run in progress takes the stop settings at once.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn set_systemd_unit(&mut self, path: &str, facts: crate::systemd::SystemdUnit) -> Outcome {
        let key = UnitKey::Host { path: path.to_owned() };
        let settings = facts.termination_settings();
        if let Some(unit) = self.units.get_mut(&key) {
            match unit.systemd.as_deref_mut() {
                // Settings can change (`daemon-reload`); the restarts seen so far stand.
                Some(rules) => rules.unit = facts,
                None => unit.systemd = Some(Box::new(unit::SystemdRules { unit: facts, restarts: Default::default() })),
            }
            if let Some(instance) = unit.cgroup_id.and_then(|id| self.instances.get_mut(id)).filter(|i| !i.finished) {
                instance.termination.set_settings(settings);
            }
        }
        self.outcome()
    }

    /// The processes running in cgroup `cgroup_id` now, as a stop's scene lists them.
    fn processes_of(&self, cgroup_id: u64, init: Option<u32>) -> Vec<ProcessAtStop> {
        self.processes
            .in_cgroup(cgroup_id)
            .map(|(pid, p)| ProcessAtStop {
                pid,
                init: Some(pid) == init,
                comm: p.comm.clone(),
                started_at: BootTime::from_ns(p.start_time_ns),
                got_stop_signal: false,
                exec_session: p.exec_session,
            })
            .collect()
    }

    /// Applies one kernel event.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn apply(&mut self, event: &Event) -> Outcome {
        self.apply_event(event);
        self.probed.apply(event, &mut self.staged.probes);
        self.counted_outcome()
    }

    /// Watches the container `key` for its probes (see `probed.rs`), replacing an earlier
    /// watch of it; `first` is the sample taken when probing began. Past the cap the watch is
    /// refused and counted.
    #[must_use = "the outcome names the probed containers whose facts changed"]
    pub fn watch_probe(
        &mut self,
        key: ProbeKey,
        watch: ProbeWatch,
        first: Option<&ProbeSample>,
    ) -> (WatchKept, Outcome) {
        let kept = self.probed.watch(key.clone(), watch, &mut self.staged.probes);
        match kept {
            WatchKept::Kept => {
                if let Some(first) = first {
                    self.probed.sample(&key, first, &mut self.staged.probes);
                }
            }
            WatchKept::Refused => self.dropped.add(DroppedKind::ProbeWatch, 1),
        }
        (kept, self.counted_outcome())
    }

    /// Stops watching `key`: its facts go.
    #[must_use = "the outcome names the probed containers whose facts changed"]
    pub fn unwatch_probe(&mut self, key: &ProbeKey) -> Outcome {
        self.probed.unwatch(key, &mut self.staged.probes);
        self.counted_outcome()
    }

    /// Applies what a /proc pass found for the probed container `key`.
    #[must_use = "the outcome names the probed containers whose facts changed"]
    pub fn sample_probe(&mut self, key: &ProbeKey, sample: &ProbeSample) -> Outcome {
        self.probed.sample(key, sample, &mut self.staged.probes);
        self.counted_outcome()
    }

    /// What the checks of the probed container `key` read now; None when it is not watched.
    pub fn probe_facts(&mut self, key: &ProbeKey) -> Option<ProbeFacts> {
        self.probed.facts(key)
    }

    /// The final kernel counters of a cgroup about to disappear, kept with its unit.
    pub fn absorb_kernel_counters(&mut self, cgroup_id: u64, counters: CgroupCounters) {
        if let Some(unit) = self.unit_of(cgroup_id) {
            unit.departed_kernel_counters.add(counters);
        }
    }

    /// Forgets units that have not run for `retention_ns` and have no live instance.
    /// Closed ports idle as long expire too (a port's four series must not outlive its use).
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn expire(&mut self, now: u64, retention_ns: u64) -> Outcome {
        self.expire_gone_pods(now);
        self.expire_eviction_notices(now);
        let live = self.instances.live_units();
        self.units.retain(|key, unit| live.contains(key) || now.saturating_sub(unit.last_change_ns) < retention_ns);
        let stale = |port: &PortStats| port.listeners == 0 && now.saturating_sub(port.last_change_ns) >= retention_ns;
        for unit in self.units.changing(|unit| unit.tcp.values().any(stale)) {
            unit.tcp.retain(|_, port| !stale(port));
        }
        // Churn (cgroups created and removed by the thousand) must not grow memory and series
        // for the whole retention: past the cap, the departed units that changed longest ago go.
        let mut departed: Vec<(u64, UnitKey)> = self
            .units
            .iter()
            .filter(|(key, _)| !live.contains(*key))
            .map(|(key, unit)| (unit.last_change_ns, key.clone()))
            .collect();
        if departed.len() > MAX_DEPARTED_UNITS {
            departed.sort_unstable_by_key(|(changed, _)| *changed);
            let excess = departed.len() - MAX_DEPARTED_UNITS;
            for (_, key) in &departed[..excess] {
                self.units.remove(key);
            }
            self.dropped.add(DroppedKind::DepartedUnit, excess as u64);
        }
        self.outcome()
    }

    /// What the node's kubelet is expected to do from now on: every container's restarts are
    /// judged by its back-off (none, when it is not known), and its release and gates decide the
    /// rules that changed between releases.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn set_kubelet(&mut self, policy: KubeletPolicy) -> Outcome {
        let backoff = policy.backoff.policy();
        for unit in self
            .units
            .changing(|unit| matches!(unit.key, UnitKey::Container { .. }) && unit.backoff.policy() != backoff)
        {
            unit.backoff.set_policy(backoff);
        }
        let gates_changed = policy.gates != self.config.kubelet.gates;
        let shutdown =
            |policy: &KubeletPolicy| policy.facts.config.as_ref().map(crate::kubelet::shutdown::shutdown_groups);
        let shutdown_changed = shutdown(&policy) != shutdown(&self.config.kubelet);
        self.config.kubelet = policy;
        // What the pods' specs mean depends on the kubelet's gates, and a shutdown's grace on
        // its shutdown settings: read them again when those changed (a read that found the same
        // kubelet copies no unit).
        if gates_changed || shutdown_changed {
            let pods: Vec<String> = self.pods.keys().cloned().collect();
            for pod_uid in pods {
                self.apply_spec(&pod_uid);
            }
        }
        self.outcome()
    }

    /// What the node's kubelet is expected to do (see [`Self::set_kubelet`]).
    pub fn kubelet(&self) -> &KubeletPolicy {
        &self.config.kubelet
    }

    /// What was dropped to stay within the bounds, by kind (see `bounds.rs`).
    pub fn dropped(&self) -> &DroppedCounts {
        &self.dropped
    }

    fn record_judgement(&mut self, judgement: Judgement) {
        self.staged.judgements.push(judgement);
    }

    fn unit_of(&mut self, cgroup_id: u64) -> Option<&mut Unit> {
        let key = self.instances.get(cgroup_id)?.unit.clone()?;
        self.units.get_mut(&key)
    }
}
