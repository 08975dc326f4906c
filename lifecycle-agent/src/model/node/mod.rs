//! The node's units, driven by kernel events: which cgroup is which container, which process is
//! its init, and what each instance's start, stop and exit mean under the kubelet's rules.
//!
//! Pure: events, runtime metadata and times go in; container views and counters come out. No
//! I/O and no clock — the plumbing in `agent.rs` feeds it and serves what it holds.
//!
//! One container *instance* is one container cgroup (runtimes create a fresh cgroup per container
//! id). Instances are linked to a *unit* — (pod uid, container name) in Kubernetes, the cgroup path
//! on a plain host — once its identity is known; restarts are new instances of the same unit, and
//! the unit's status, back-off and termination history span them. When the runtime's metadata
//! arrives after an instance already ran (a crash loop exits in milliseconds), the instance's
//! evidence is kept and replayed into the unit on linking, so nothing is judged with defaults.

use std::collections::{BTreeMap, HashMap};

use lifecycle_common::CgroupCounters;
use serde::Serialize;

use crate::{
    model::backoff::{BackoffPolicy, BackoffTracker, Observation, Tolerance, Verdict},
    model::container_state::{
        ContainerState, ContainerStatus, ContainerStatusSnapshot, RestartPolicy, RestartSpec, TerminatedReason,
    },
    model::event::{Detail, Event},
    model::identity::{classify, CgroupIdentity},
    model::metadata::{ContainerMeta, ContainerType},
    model::termination::{
        sidecar_order, PreStopHandler, SidecarOrder, SignalSender, TerminationOutcome, TerminationReport,
        TerminationSettings, TerminationTracker,
    },
};

/// Settings for the model; defaults are the kubelet's.
#[derive(Clone, Debug)]
pub struct TrackerConfig {
    pub backoff: BackoffPolicy,
    pub tolerance: Tolerance,
    /// The pod restartPolicy assumed (the CRI does not carry it): Always, the API default.
    pub restart_policy: RestartPolicy,
    /// Whether a CRI runtime answers; without one, containers are named by their id.
    pub cri_available: bool,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            backoff: BackoffPolicy::default(),
            tolerance: Tolerance::default(),
            restart_policy: RestartPolicy::Always,
            cri_available: false,
        }
    }
}

/// Who a unit is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UnitKey {
    /// A Kubernetes container: the kubelet's back-off key without the spec hash.
    Container { pod_uid: String, container: String },
    /// A cgroup on a plain host, named by its path.
    Host { path: String },
}

/// Labels as kube-state-metrics spells them, so series join.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UnitLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
}

/// Something the plumbing should know or act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// An event named a cgroup the tracker has never seen (its mkdir record was lost): rescan.
    UnknownCgroup(u64),
    /// A container cgroup appeared whose runtime metadata is not known yet: refresh from the CRI.
    MetadataNeeded { container_id: String },
    /// A cgroup path under kubepods did not parse.
    BadCgroupPath { path: String, error: String },
}

/// A histogram kept as bucket counts (upper bounds in seconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

/// Bucket upper bounds for termination durations, seconds.
pub const TERMINATION_BUCKETS: [f64; 12] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0];
/// Bucket upper bounds for the share of the grace period used.
pub const GRACE_RATIO_BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0];

impl Histogram {
    /// Adds another histogram with the same bounds.
    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (into, from) in self.counts.iter_mut().zip(&other.counts) {
            *into += from;
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (count, bound) in self.counts.iter_mut().zip(bounds) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// Per-port TCP facts of a unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortStats {
    /// Listening sockets open now.
    pub listeners: i64,
    pub established: u64,
    pub accepts: u64,
    /// When the app last accepted a connection on this port (boot ns).
    pub last_accept_ns: Option<u64>,
}

/// Counters kept per unit across its instances.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UnitCounters {
    /// (reason, exit code, signal) -> exits of the init.
    pub exits: BTreeMap<(String, i32, Option<u8>), u64>,
    /// Termination outcome -> count.
    pub terminations: BTreeMap<&'static str, u64>,
    pub grace_violations: u64,
    pub backoff_verdicts: BTreeMap<&'static str, u64>,
    /// (signal, sender kind) -> signals received by the unit's processes.
    pub signals: BTreeMap<(u32, &'static str), u64>,
    pub oom_kills: u64,
    pub exec_sessions: u64,
    pub exec_session_cpu_ns: u64,
    pub termination_seconds: BTreeMap<&'static str, Histogram>,
    pub grace_used_ratio: Histogram,
}

/// One unit: a container over its restarts, or a host cgroup.
#[derive(Clone, Debug)]
pub struct Unit {
    pub key: UnitKey,
    pub labels: UnitLabels,
    status: ContainerStatus,
    backoff: BackoffTracker,
    restart: RestartSpec,
    pub counters: UnitCounters,
    pub tcp: BTreeMap<u16, PortStats>,
    pub last_termination: Option<TerminationReport>,
    pub last_backoff: Option<Observation>,
    /// The instance (cgroup) the unit runs as now.
    pub cgroup_id: Option<u64>,
    pub container_id: Option<String>,
    /// Last time anything changed (boot ns); departed units expire from it.
    pub last_change_ns: u64,
    /// The kernel's counters of this unit's instances whose cgroups are gone.
    pub departed_kernel_counters: CgroupCounters,
    /// An init container (per the runtime's metadata).
    pub init_container: bool,
    /// An init container seen running beside a main container: a sidecar (restartPolicy Always;
    /// the runtime does not report the policy, so the agent recognises it by that).
    pub sidecar: bool,
    /// When the current instance's init started (orders sidecars as the kubelet started them).
    pub started_at: Option<u64>,
}

#[derive(Clone, Debug)]
struct ProcessEntry {
    cgroup_id: u64,
    start_time_ns: u64,
    /// Started into the container by the runtime without descending from its init.
    exec_session: bool,
    comm: String,
}

#[derive(Clone, Copy, Debug)]
struct InitProcess {
    tgid: u32,
    started_at: u64,
    /// Started from outside but in the host's pid namespace: the runtime's own setup process
    /// (runc re-executing itself inside the new cgroup), or the init of a hostPID container. A
    /// process in the container's pid namespace replaces it; its exit ends the instance only if
    /// none comes before the cgroup goes.
    provisional: bool,
}

#[derive(Clone, Copy, Debug)]
struct InitExit {
    time: u64,
    exit_status: Option<u8>,
    signal: Option<u8>,
}

#[derive(Clone, Debug)]
enum InstanceKind {
    Container { container_id: String, pod_uid: String },
    Host { path: String },
}

#[derive(Clone, Debug)]
struct Instance {
    kind: InstanceKind,
    unit: Option<UnitKey>,
    /// The runtime lists no such container: a pod sandbox (pause) or not the kubelet's.
    ignored: bool,
    created_at: u64,
    init: Option<InitProcess>,
    exit: Option<InitExit>,
    /// The exit was applied to the unit (it is linked and judged).
    finished: bool,
    /// A provisional init's exit, applied only if no real init shows up before the cgroup goes.
    provisional_exit: Option<InitExit>,
    termination: TerminationTracker,
    spec_hash: Option<String>,
    /// Counted before the instance was linked; merged into the unit on linking.
    pending_counters: UnitCounters,
    pending_tcp: BTreeMap<u16, PortStats>,
}

/// A process found in /proc at start.
#[derive(Clone, Copy, Debug)]
pub struct SeedProcess<'a> {
    pub tgid: u32,
    pub cgroup_id: u64,
    pub parent_cgroup_id: u64,
    /// In a pid namespace below the host's (NSpid has more than one entry).
    pub child_pid_namespace: bool,
    pub start_time_ns: u64,
    pub comm: &'a str,
}

/// What an exec (seen or seeded) says about the process.
#[derive(Clone, Copy, Debug)]
struct ExecFacts {
    tgid: u32,
    parent_tgid: Option<u32>,
    cgroup_id: u64,
    parent_cgroup_id: u64,
    child_pid_namespace: bool,
    exec_time: Option<u64>,
    start_time_ns: u64,
}

/// Everything the tracker knows about the node.
pub struct NodeTracker {
    config: TrackerConfig,
    cgroups: HashMap<u64, String>,
    processes: HashMap<u32, ProcessEntry>,
    instances: HashMap<u64, Instance>,
    units: BTreeMap<UnitKey, Unit>,
    metadata: HashMap<String, ContainerMeta>,
    notices: Vec<Notice>,
}

/// A container as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerView {
    #[serde(flatten)]
    pub labels: UnitLabels,
    pub container_id: Option<String>,
    pub cgroup_id: Option<u64>,
    #[serde(flatten)]
    pub status: ContainerStatusSnapshot,
    pub last_termination: Option<TerminationReport>,
    pub last_backoff: Option<Observation>,
    pub exec_sessions: u64,
    pub exec_session_cpu_seconds: f64,
    pub tcp: BTreeMap<u16, PortStats>,
    pub sidecar: bool,
    /// For a sidecar whose pod terminated: whether it was stopped in its turn.
    pub sidecar_order: Option<SidecarOrder>,
}

impl NodeTracker {
    pub fn new(config: TrackerConfig) -> Self {
        Self {
            config,
            cgroups: HashMap::new(),
            processes: HashMap::new(),
            instances: HashMap::new(),
            units: BTreeMap::new(),
            metadata: HashMap::new(),
            notices: Vec::new(),
        }
    }

    /// Notices since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// A cgroup that existed before the agent started (from the initial scan).
    pub fn seed_cgroup(&mut self, id: u64, path: &str, now: u64) {
        if !self.cgroups.contains_key(&id) {
            self.on_cgroup_created(id, path, now);
        }
    }

    /// A process that existed before the agent started (from /proc). Seed in start-time order:
    /// the first process of a container whose parent is outside it becomes its init.
    pub fn seed_process(&mut self, process: SeedProcess<'_>) {
        if self.processes.contains_key(&process.tgid) || !self.cgroups.contains_key(&process.cgroup_id) {
            return;
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
    }

    /// Runtime metadata for every container the runtime lists now. Instances still unlinked whose
    /// id the runtime does not list are sandboxes or foreign containers and are ignored.
    pub fn set_metadata(&mut self, containers: Vec<ContainerMeta>) {
        self.metadata = containers.into_iter().map(|m| (m.container_id.clone(), m)).collect();
        let pending: Vec<u64> =
            self.instances.iter().filter(|(_, i)| i.unit.is_none() && !i.ignored).map(|(id, _)| *id).collect();
        for cgroup_id in pending {
            let Some(instance) = self.instances.get_mut(&cgroup_id) else { continue };
            if let InstanceKind::Container { container_id, .. } = &instance.kind {
                if !self.metadata.contains_key(container_id) {
                    instance.ignored = true;
                    continue;
                }
            }
            self.link(cgroup_id);
        }
        // Metadata can change (a deletion grace period appears when the pod is deleted).
        let linked: Vec<(u64, String)> = self
            .instances
            .iter()
            .filter_map(|(id, i)| match &i.kind {
                InstanceKind::Container { container_id, .. } if i.unit.is_some() && !i.finished => {
                    Some((*id, container_id.clone()))
                }
                _ => None,
            })
            .collect();
        for (cgroup_id, container_id) in linked {
            if let (Some(meta), Some(instance)) = (self.metadata.get(&container_id), self.instances.get_mut(&cgroup_id))
            {
                instance.termination.set_settings(termination_settings(meta));
            }
        }
    }

    /// Applies one kernel event.
    pub fn apply(&mut self, event: &Event) {
        match &event.detail {
            Detail::CgroupMkdir(c) => self.on_cgroup_created(c.id, &c.path, event.time_ns),
            Detail::CgroupRmdir(c) => {
                self.cgroups.remove(&c.id);
                self.on_instance_gone(c.id);
            }
            Detail::Exec { parent_tgid, parent_cgroup_id, start_time_ns, comm, child_pid_namespace, .. } => {
                if self.known_cgroup(event.cgroup_id) {
                    let exec = ExecFacts {
                        tgid: event.tgid,
                        parent_tgid: Some(*parent_tgid),
                        cgroup_id: event.cgroup_id,
                        parent_cgroup_id: *parent_cgroup_id,
                        child_pid_namespace: *child_pid_namespace,
                        exec_time: Some(event.time_ns),
                        start_time_ns: *start_time_ns,
                    };
                    self.exec(exec, event.time_ns, comm);
                }
            }
            Detail::Exit { exit_status, signal, group_dead, cpu_time_ns, .. } => {
                if *group_dead {
                    self.exit(event.tgid, event.cgroup_id, event.time_ns, *exit_status, *signal, *cpu_time_ns);
                }
            }
            Detail::Signal { signal, target_tgid, target_cgroup_id, sender_comm, .. } => {
                let same = event.cgroup_id == *target_cgroup_id;
                let sender = SignalSender::from_comm(sender_comm, same);
                let kind = sender_kind(&sender);
                if let Some(instance) = self.instances.get_mut(target_cgroup_id) {
                    let to_init = instance.init.is_some_and(|i| i.tgid == *target_tgid);
                    instance.termination.on_signal(event.time_ns, *signal as u8, sender, to_init);
                }
                if let Some((counters, _)) = self.counters_of(*target_cgroup_id) {
                    *counters.signals.entry((*signal, kind)).or_default() += 1;
                }
            }
            Detail::OomVictim { victim_tgid, victim_cgroup_id, .. } => {
                if let Some(instance) = self.instances.get_mut(victim_cgroup_id) {
                    let is_init = instance.init.is_some_and(|i| i.tgid == *victim_tgid);
                    instance.termination.on_oom_kill(event.time_ns, is_init);
                }
                if let Some((counters, _)) = self.counters_of(*victim_cgroup_id) {
                    counters.oom_kills += 1;
                }
            }
            Detail::TcpListen(t) | Detail::TcpListenClose(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => {
                let time = event.time_ns;
                if let Some(instance) = self.instances.get_mut(&t.socket_cgroup_id) {
                    match event.detail {
                        Detail::TcpListen(_) => instance.termination.on_listen(time),
                        Detail::TcpListenClose(_) => instance.termination.on_listen_close(time),
                        Detail::TcpAccept(_) => instance.termination.on_listener_accept(time),
                        _ => {}
                    }
                }
                if let Some((_, tcp)) = self.counters_of(t.socket_cgroup_id) {
                    let port = tcp.entry(t.local_port).or_default();
                    match event.detail {
                        Detail::TcpListen(_) => port.listeners += 1,
                        Detail::TcpListenClose(_) => port.listeners = (port.listeners - 1).max(0),
                        Detail::TcpEstablished(_) => port.established += 1,
                        _ => {
                            port.accepts += 1;
                            port.last_accept_ns = Some(time);
                        }
                    }
                }
            }
        }
    }

    /// The final kernel counters of a cgroup about to disappear, kept with its unit.
    pub fn absorb_kernel_counters(&mut self, cgroup_id: u64, counters: CgroupCounters) {
        if let Some(unit) = self.unit_of(cgroup_id) {
            unit.departed_kernel_counters += counters;
        }
    }

    /// Forgets units that have not run for `retention_ns` and have no live instance.
    pub fn expire(&mut self, now: u64, retention_ns: u64) {
        let live: Vec<UnitKey> =
            self.instances.values().filter(|i| i.exit.is_none()).filter_map(|i| i.unit.clone()).collect();
        self.units.retain(|key, unit| live.contains(key) || now.saturating_sub(unit.last_change_ns) < retention_ns);
    }

    /// Every unit.
    pub fn units(&self) -> impl Iterator<Item = &Unit> {
        self.units.values()
    }

    /// The API view of every unit at `now`.
    pub fn containers(&self, now: u64) -> Vec<ContainerView> {
        let mut views: Vec<ContainerView> = self.units.values().map(|unit| self.view(unit, now)).collect();
        let orders = self.sidecar_orders();
        for view in &mut views {
            if view.sidecar {
                view.sidecar_order = orders.get(&(view.labels.uid.clone(), view.labels.container.clone())).cloned();
            }
        }
        views
    }

    /// Sidecar stop order for every pod with a terminated sidecar: sidecars in the order they
    /// started (their definition order), main containers after, as `sidecar_order` expects.
    fn sidecar_orders(&self) -> HashMap<(String, String), SidecarOrder> {
        let mut pods: BTreeMap<&str, Vec<&Unit>> = BTreeMap::new();
        for unit in self.units.values() {
            if let UnitKey::Container { pod_uid, .. } = &unit.key {
                pods.entry(pod_uid.as_str()).or_default().push(unit);
            }
        }
        let mut out = HashMap::new();
        for (pod_uid, mut units) in pods {
            if !units.iter().any(|u| u.sidecar && u.last_termination.is_some()) {
                continue;
            }
            units.sort_by_key(|u| (!u.sidecar, u.started_at));
            let reports = units
                .iter()
                .filter(|u| u.sidecar || !u.init_container)
                .filter_map(|u| u.last_termination.as_ref().map(|r| (u.labels.container.as_str(), r)));
            for order in sidecar_order(reports) {
                out.insert((pod_uid.to_owned(), order.container.clone()), order);
            }
        }
        out
    }

    /// Marks init containers running beside a main container of their pod as sidecars.
    fn recognise_sidecars(&mut self, pod_uid: &str) {
        let in_pod = |u: &Unit| matches!(&u.key, UnitKey::Container { pod_uid: p, .. } if p == pod_uid);
        let running = |u: &Unit| matches!(u.status.state(), ContainerState::Running { .. });
        let main_running = self.units.values().any(|u| in_pod(u) && !u.init_container && running(u));
        if !main_running {
            return;
        }
        for unit in self.units.values_mut() {
            if in_pod(unit) && unit.init_container && running(unit) {
                unit.sidecar = true;
            }
        }
    }

    /// The API view of one unit at `now`.
    pub fn view(&self, unit: &Unit, now: u64) -> ContainerView {
        ContainerView {
            labels: unit.labels.clone(),
            container_id: unit.container_id.clone(),
            cgroup_id: unit.cgroup_id,
            status: unit.status.state_at(now, &unit.restart, &unit.backoff),
            last_termination: unit.last_termination.clone(),
            last_backoff: unit.last_backoff.clone(),
            exec_sessions: unit.counters.exec_sessions,
            exec_session_cpu_seconds: unit.counters.exec_session_cpu_ns as f64 / 1e9,
            tcp: unit.tcp.clone(),
            sidecar: unit.sidecar,
            sidecar_order: None,
        }
    }

    /// Kubernetes containers running now, with their main process.
    pub fn running_containers(&self) -> Vec<(UnitLabels, u32)> {
        self.instances
            .values()
            .filter(|i| matches!(i.kind, InstanceKind::Container { .. }) && i.exit.is_none())
            .filter_map(|i| {
                let unit = self.units.get(i.unit.as_ref()?)?;
                Some((unit.labels.clone(), i.init?.tgid))
            })
            .collect()
    }

    /// (namespace, pod, container) of every unit still tracked.
    pub fn unit_targets(&self) -> Vec<(String, String, String)> {
        self.units
            .values()
            .map(|u| (u.labels.namespace.clone(), u.labels.pod.clone(), u.labels.container.clone()))
            .collect()
    }

    fn known_cgroup(&mut self, id: u64) -> bool {
        if self.cgroups.contains_key(&id) {
            return true;
        }
        self.notices.push(Notice::UnknownCgroup(id));
        false
    }

    fn unit_of(&mut self, cgroup_id: u64) -> Option<&mut Unit> {
        let key = self.instances.get(&cgroup_id)?.unit.clone()?;
        self.units.get_mut(&key)
    }

    /// Where a cgroup's counts go: its unit's, or the instance's own until it is linked.
    fn counters_of(&mut self, cgroup_id: u64) -> Option<(&mut UnitCounters, &mut BTreeMap<u16, PortStats>)> {
        let instance = self.instances.get_mut(&cgroup_id)?;
        match instance.unit.clone() {
            Some(key) => self.units.get_mut(&key).map(|u| (&mut u.counters, &mut u.tcp)),
            None => Some((&mut instance.pending_counters, &mut instance.pending_tcp)),
        }
    }

    fn on_cgroup_created(&mut self, id: u64, path: &str, time: u64) {
        self.cgroups.insert(id, path.to_owned());
        match classify(path) {
            Ok(CgroupIdentity::Container { pod_uid, container_id, .. }) => {
                self.instances.insert(id, Instance::new(InstanceKind::Container { container_id, pod_uid }, time));
                self.link(id);
            }
            // Host cgroups become units when a process runs in them; the rest hold no container.
            Ok(_) => {}
            Err(error) => self.notices.push(Notice::BadCgroupPath { path: path.to_owned(), error: error.to_string() }),
        }
    }

    /// Links an instance to its unit if its identity is known, replaying what it already did.
    fn link(&mut self, cgroup_id: u64) {
        let Some(instance) = self.instances.get(&cgroup_id) else { return };
        if instance.unit.is_some() || instance.ignored {
            return;
        }
        let (key, labels, meta) = match &instance.kind {
            InstanceKind::Host { path } => (
                UnitKey::Host { path: path.clone() },
                UnitLabels {
                    namespace: "host".into(),
                    pod: String::new(),
                    container: path.clone(),
                    uid: String::new(),
                },
                None,
            ),
            InstanceKind::Container { container_id, pod_uid } => match self.metadata.get(container_id) {
                Some(meta) => (
                    UnitKey::Container { pod_uid: meta.pod_uid.clone(), container: meta.container_name.clone() },
                    UnitLabels {
                        namespace: meta.pod_namespace.clone(),
                        pod: meta.pod_name.clone(),
                        container: meta.container_name.clone(),
                        uid: meta.pod_uid.clone(),
                    },
                    Some(meta.clone()),
                ),
                None if !self.config.cri_available => {
                    let short: String = container_id.chars().take(12).collect();
                    (
                        UnitKey::Container { pod_uid: pod_uid.clone(), container: short.clone() },
                        UnitLabels {
                            namespace: String::new(),
                            pod: String::new(),
                            container: short,
                            uid: pod_uid.clone(),
                        },
                        None,
                    )
                }
                None => {
                    self.notices.push(Notice::MetadataNeeded { container_id: container_id.clone() });
                    return;
                }
            },
        };
        let restart = RestartSpec {
            pod_restart_policy: self.config.restart_policy,
            container_restart_policy: None,
            restart_policy_rules: Vec::new(),
            is_init_container: meta.as_ref().is_some_and(|m| m.container_type == Some(ContainerType::Init)),
        };
        let (backoff_policy, tolerance) = (self.config.backoff.clone(), self.config.tolerance.clone());
        let unit = self.units.entry(key.clone()).or_insert_with(|| Unit {
            key: key.clone(),
            labels: labels.clone(),
            status: match &key {
                UnitKey::Container { pod_uid, container } => ContainerStatus::new(pod_uid.clone(), container.clone()),
                UnitKey::Host { path } => ContainerStatus::new(String::new(), path.clone()),
            },
            backoff: BackoffTracker::new(backoff_policy, tolerance),
            restart: restart.clone(),
            counters: UnitCounters::default(),
            tcp: BTreeMap::new(),
            last_termination: None,
            last_backoff: None,
            cgroup_id: None,
            container_id: None,
            last_change_ns: 0,
            departed_kernel_counters: CgroupCounters::default(),
            init_container: false,
            sidecar: false,
            started_at: None,
        });
        unit.labels = labels;
        unit.init_container = restart.is_init_container;
        unit.restart = restart;
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        instance.unit = Some(key.clone());
        if let Some(meta) = &meta {
            instance.termination.set_settings(termination_settings(meta));
            instance.spec_hash = meta.spec_hash.map(|h| format!("{h:x}"));
        }
        unit.cgroup_id = Some(cgroup_id);
        unit.container_id = match &instance.kind {
            InstanceKind::Container { container_id, .. } => Some(container_id.clone()),
            InstanceKind::Host { .. } => None,
        };
        unit.tcp.values_mut().for_each(|p| p.listeners = 0);
        unit.counters.merge(std::mem::take(&mut instance.pending_counters));
        for (port, stats) in std::mem::take(&mut instance.pending_tcp) {
            let into = unit.tcp.entry(port).or_default();
            into.listeners += stats.listeners;
            into.established += stats.established;
            into.accepts += stats.accepts;
            into.last_accept_ns = into.last_accept_ns.max(stats.last_accept_ns);
        }
        unit.status.on_instance_created(instance.created_at);
        unit.last_change_ns = unit.last_change_ns.max(instance.created_at);
        if let Some(init) = instance.init {
            start_unit(unit, init.started_at, instance.spec_hash.clone());
        }
        let exited = instance.exit.is_some();
        if let UnitKey::Container { pod_uid, .. } = &key {
            self.recognise_sidecars(&pod_uid.clone());
        }
        if exited {
            self.finish(cgroup_id);
        }
    }

    fn exec(&mut self, facts: ExecFacts, time: u64, comm: &str) {
        let ExecFacts { tgid, parent_tgid, cgroup_id, parent_cgroup_id, child_pid_namespace, exec_time, start_time_ns } =
            facts;
        // A process that execs again (sh -c exec ...) keeps its role; only its name changes.
        if let Some(known) = self.processes.get_mut(&tgid) {
            if known.cgroup_id == cgroup_id && known.start_time_ns == start_time_ns {
                known.comm = comm.to_owned();
                return;
            }
        }
        if !self.instances.contains_key(&cgroup_id) {
            // A plain-host cgroup becomes a unit when something runs in it.
            let Some(path) = self.cgroups.get(&cgroup_id).cloned() else { return };
            if !matches!(classify(&path), Ok(CgroupIdentity::HostUnit { .. })) {
                return;
            }
            self.instances.insert(cgroup_id, Instance::new(InstanceKind::Host { path }, time));
            self.link(cgroup_id);
        }
        let from_outside = parent_cgroup_id != cgroup_id;
        self.restart_host_unit_if_over(cgroup_id, time);
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        let is_container = matches!(instance.kind, InstanceKind::Container { .. });
        let no_real_init = instance.init.is_none_or(|init| init.provisional);
        let mut exec_session = false;
        if is_container
            && from_outside
            && instance.exit.is_none()
            && (instance.init.is_none() || (no_real_init && child_pid_namespace))
        {
            // The container's init: started by the runtime, in the container's pid namespace
            // (provisionally when it shares the host's, see InitProcess::provisional).
            let replaces_provisional = instance.init.is_some();
            let started_at = exec_time.unwrap_or(start_time_ns);
            instance.init = Some(InitProcess { tgid, started_at, provisional: !child_pid_namespace });
            instance.provisional_exit = None;
            let (unit_key, spec_hash) = (instance.unit.clone(), instance.spec_hash.clone());
            if !replaces_provisional {
                if let Some(key) = unit_key {
                    if let Some(unit) = self.units.get_mut(&key) {
                        start_unit(unit, started_at, spec_hash);
                    }
                    if let UnitKey::Container { pod_uid, .. } = &key {
                        self.recognise_sidecars(&pod_uid.clone());
                    }
                }
            }
        } else if !is_container && instance.init.is_none() && instance.exit.is_none() {
            let started_at = exec_time.unwrap_or(start_time_ns);
            instance.init = Some(InitProcess { tgid, started_at, provisional: false });
            let (unit_key, spec_hash) = (instance.unit.clone(), instance.spec_hash.clone());
            if let Some(unit) = unit_key.and_then(|k| self.units.get_mut(&k)) {
                start_unit(unit, started_at, spec_hash);
            }
        } else if from_outside && is_container {
            // Started into the container by the runtime without descending from its init.
            exec_session = true;
            instance.termination.on_exec_session(start_time_ns, None, comm);
            if let Some((counters, _)) = self.counters_of(cgroup_id) {
                counters.exec_sessions += 1;
            }
        } else {
            // Forked by something inside: part of an exec session if its parent was.
            exec_session = parent_tgid
                .and_then(|parent| self.processes.get(&parent))
                .is_some_and(|parent| parent.cgroup_id == cgroup_id && parent.exec_session);
        }
        self.processes.insert(tgid, ProcessEntry { cgroup_id, start_time_ns, exec_session, comm: comm.to_owned() });
    }

    fn exit(
        &mut self,
        tgid: u32,
        cgroup_id: u64,
        time: u64,
        exit_status: Option<u8>,
        signal: Option<u8>,
        cpu_time_ns: u64,
    ) {
        let process = self.processes.remove(&tgid);
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        if let Some(process) = &process {
            if process.exec_session {
                instance.termination.on_exec_session(process.start_time_ns, Some(time), &process.comm);
                if let Some((counters, _)) = self.counters_of(cgroup_id) {
                    counters.exec_session_cpu_ns += cpu_time_ns;
                }
            }
        }
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        let Some(init) = instance.init.filter(|init| init.tgid == tgid) else { return };
        if instance.exit.is_some() {
            return;
        }
        if init.provisional {
            // Wait for the container's real init, or for the cgroup to go (see on_instance_gone).
            instance.provisional_exit = Some(InitExit { time, exit_status, signal });
            return;
        }
        if matches!(instance.kind, InstanceKind::Host { .. }) {
            // On a plain host the unit runs while any of its processes does: hand the main role
            // to the oldest remaining process instead of ending the unit.
            let heir = self
                .processes
                .iter()
                .filter(|(_, p)| p.cgroup_id == cgroup_id)
                .min_by_key(|(_, p)| p.start_time_ns)
                .map(|(pid, p)| InitProcess { tgid: *pid, started_at: p.start_time_ns, provisional: false });
            if let Some(heir) = heir {
                let started_at = instance.init.map_or(heir.started_at, |i| i.started_at);
                instance.init = Some(InitProcess { tgid: heir.tgid, started_at, provisional: false });
                return;
            }
        }
        instance.exit = Some(InitExit { time, exit_status, signal });
        if instance.unit.is_some() {
            self.finish(cgroup_id);
        }
    }

    /// A plain-host cgroup whose processes all ended and that runs something again: a new run.
    fn restart_host_unit_if_over(&mut self, cgroup_id: u64, time: u64) {
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        let InstanceKind::Host { path } = &instance.kind else { return };
        if instance.exit.is_none() {
            return;
        }
        let mut fresh = Instance::new(InstanceKind::Host { path: path.clone() }, time);
        fresh.unit = instance.unit.clone();
        *instance = fresh;
        if let Some(unit) = self.unit_of(cgroup_id) {
            unit.status.on_instance_created(time);
        }
    }

    /// Judges an exited, linked instance and applies the result to its unit (once).
    fn finish(&mut self, cgroup_id: u64) {
        let Some(instance) = self.instances.get_mut(&cgroup_id) else { return };
        let (Some(exit), Some(key)) = (instance.exit, instance.unit.clone()) else { return };
        if instance.finished {
            return;
        }
        instance.finished = true;
        if self.units.get(&key).is_some_and(|u| u.sidecar) && !instance.termination.settings().is_sidecar {
            let settings = TerminationSettings { is_sidecar: true, ..instance.termination.settings().clone() };
            instance.termination.set_settings(settings);
        }
        let report = instance.termination.on_init_exit(exit.time, exit.exit_status, exit.signal).clone();
        let host = matches!(instance.kind, InstanceKind::Host { .. });
        // A host instance is over with its last process; the next process starts a new one.
        if host {
            instance.init = None;
        }
        let tolerance = self.config.tolerance.clone();
        let Some(unit) = self.units.get_mut(&key) else { return };
        let oom_killed = matches!(report.outcome, TerminationOutcome::OomKilled);
        unit.status.on_init_exited(exit.time, exit.exit_status, exit.signal, oom_killed);
        unit.backoff.on_finished(exit.time);
        if let ContainerState::Terminated { reason, exit_code, signal, .. } = unit.status.state() {
            *unit.counters.exits.entry((reason_name(*reason).to_owned(), *exit_code, *signal)).or_default() += 1;
        }
        let outcome = outcome_name(&report.outcome);
        *unit.counters.terminations.entry(outcome).or_default() += 1;
        if let Some(stop) = &report.stop_signal {
            let seconds = exit.time.saturating_sub(stop.time) as f64 / 1e9;
            unit.counters.termination_seconds.entry(outcome).or_default().observe(&TERMINATION_BUCKETS, seconds);
        }
        match &report.outcome {
            TerminationOutcome::SigkilledAfterGrace { .. } => unit.counters.grace_violations += 1,
            TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } => {
                unit.counters.grace_used_ratio.observe(&GRACE_RATIO_BUCKETS, *grace_used_ratio);
            }
            _ => {}
        }
        unit.last_termination = Some(report);
        unit.last_change_ns = exit.time;
        if host {
            // Host units have no kubelet: a new process is a new run, not a restart to judge.
            unit.backoff = BackoffTracker::new(unit.backoff.policy().clone(), tolerance);
        }
    }

    fn on_instance_gone(&mut self, cgroup_id: u64) {
        // A provisional init (hostPID container) whose exit no real init followed: that was it.
        if let Some(instance) = self.instances.get_mut(&cgroup_id) {
            if instance.exit.is_none() {
                if let Some(exit) = instance.provisional_exit.take() {
                    instance.exit = Some(exit);
                    self.finish(cgroup_id);
                }
            }
        }
        let Some(instance) = self.instances.remove(&cgroup_id) else { return };
        if let Some(unit) = instance.unit.and_then(|k| self.units.get_mut(&k)) {
            if unit.cgroup_id == Some(cgroup_id) {
                unit.cgroup_id = None;
                unit.tcp.values_mut().for_each(|p| p.listeners = 0);
            }
        }
        self.processes.retain(|_, p| p.cgroup_id != cgroup_id);
    }
}

impl UnitCounters {
    /// Adds counts gathered elsewhere (an instance before it was linked).
    fn merge(&mut self, other: UnitCounters) {
        for (k, v) in other.exits {
            *self.exits.entry(k).or_default() += v;
        }
        for (k, v) in other.signals {
            *self.signals.entry(k).or_default() += v;
        }
        self.oom_kills += other.oom_kills;
        self.exec_sessions += other.exec_sessions;
        self.exec_session_cpu_ns += other.exec_session_cpu_ns;
    }
}

impl Instance {
    fn new(kind: InstanceKind, created_at: u64) -> Self {
        Self {
            kind,
            unit: None,
            ignored: false,
            created_at,
            init: None,
            exit: None,
            finished: false,
            provisional_exit: None,
            termination: TerminationTracker::new(TerminationSettings::default()),
            spec_hash: None,
            pending_counters: UnitCounters::default(),
            pending_tcp: BTreeMap::new(),
        }
    }
}

fn start_unit(unit: &mut Unit, started_at: u64, spec_hash: Option<String>) {
    unit.started_at = Some(started_at);
    unit.status.on_init_started(started_at);
    if let Some(observation) = unit.backoff.on_started(started_at, spec_hash) {
        *unit.counters.backoff_verdicts.entry(verdict_name(observation.verdict)).or_default() += 1;
        unit.last_backoff = Some(observation);
    }
    unit.last_change_ns = unit.last_change_ns.max(started_at);
}

fn termination_settings(meta: &ContainerMeta) -> TerminationSettings {
    let defaults = TerminationSettings::default();
    TerminationSettings {
        grace_period_ns: meta.termination_grace_period_ns.unwrap_or(defaults.grace_period_ns),
        deletion_grace_ns: meta.deletion_grace_period_ns,
        pre_stop: meta.pre_stop_handler.as_deref().and_then(|json| PreStopHandler::from_annotation(json).ok()),
        ..defaults
    }
}

/// Label value for a signal's sender.
pub fn sender_kind(sender: &SignalSender) -> &'static str {
    match sender {
        SignalSender::Runtime => "runtime",
        SignalSender::Kubelet => "kubelet",
        SignalSender::SameContainer => "same_container",
        SignalSender::OtherProcess { .. } => "other_process",
    }
}

/// Label value for a termination outcome.
pub fn outcome_name(outcome: &TerminationOutcome) -> &'static str {
    match outcome {
        TerminationOutcome::ExitedWithinGrace { .. } => "exited_within_grace",
        TerminationOutcome::SigkilledAfterGrace { .. } => "sigkilled_after_grace",
        TerminationOutcome::KilledWithoutGrace { .. } => "killed_without_grace",
        TerminationOutcome::OomKilled => "oom_killed",
        TerminationOutcome::ExitedWithoutStopSignal { .. } => "exited_without_stop_signal",
    }
}

/// Label value for a back-off verdict.
pub fn verdict_name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::WithinTolerance => "within_tolerance",
        Verdict::TooEarly => "too_early",
        Verdict::TooLate => "too_late",
    }
}

/// The API's spelling of a terminated reason.
pub fn reason_name(reason: TerminatedReason) -> &'static str {
    match reason {
        TerminatedReason::Completed => "Completed",
        TerminatedReason::Error => "Error",
        TerminatedReason::OomKilled => "OOMKilled",
        TerminatedReason::Signal => "Signal",
        TerminatedReason::Unknown => "Unknown",
    }
}

impl Unit {
    /// The unit's current status (without back-off projection).
    pub fn state(&self) -> &ContainerState {
        self.status.state()
    }

    pub fn restart_count(&self) -> u32 {
        self.status.restart_count()
    }

    /// The status at `now`, with CrashLoopBackOff projected from the back-off.
    pub fn snapshot(&self, now: u64) -> ContainerStatusSnapshot {
        self.status.state_at(now, &self.restart, &self.backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{CgroupDetail, SignalResult};
    use crate::model::metadata::ContainerState as CriState;

    const SECOND: u64 = 1_000_000_000;
    const POD_UID: &str = "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e";
    const POD_CGROUP: u64 = 500;
    const SHIM_CGROUP: u64 = 7;

    fn container_id(n: u64) -> String {
        format!("{n:064x}")
    }

    fn meta(n: u64, grace_s: u64) -> ContainerMeta {
        ContainerMeta {
            container_id: container_id(n),
            pod_sandbox_id: "sandbox".into(),
            pod_name: "web-1".into(),
            pod_namespace: "shop".into(),
            pod_uid: POD_UID.into(),
            container_name: "app".into(),
            attempt: 0,
            restart_count: None,
            container_type: Some(ContainerType::Regular),
            spec_hash: Some(0xabc),
            termination_grace_period_ns: Some(grace_s * SECOND),
            deletion_grace_period_ns: None,
            pre_stop_handler: None,
            ports: None,
            state: CriState::Running,
            exit_code: None,
            reason: None,
            message: None,
            created_ns: 0,
            started_ns: None,
            finished_ns: None,
        }
    }

    fn event(time: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
        Event { time_ns: time, pid: tgid, tgid, cgroup_id, detail }
    }

    fn mkdir(time: u64, id: u64, path: &str) -> Event {
        event(time, 1, 1, Detail::CgroupMkdir(CgroupDetail { id, path: path.into(), truncated: false }))
    }

    fn container_cgroup(tracker: &mut NodeTracker, time: u64, n: u64) -> u64 {
        let id = 1000 + n;
        tracker.apply(&mkdir(time, id, &format!("/kubepods/burstable/pod{POD_UID}/{}", container_id(n))));
        id
    }

    fn exec(time: u64, tgid: u32, cgroup_id: u64, parent_cgroup_id: u64, comm: &str) -> Event {
        let detail = Detail::Exec {
            parent_tgid: 1,
            parent_cgroup_id,
            namespace_init: parent_cgroup_id != cgroup_id,
            child_pid_namespace: true,
            start_time_ns: time,
            comm: comm.into(),
        };
        event(time, tgid, cgroup_id, detail)
    }

    fn exit(time: u64, tgid: u32, cgroup_id: u64, status: Option<u8>, signal: Option<u8>) -> Event {
        let detail = Detail::Exit {
            exit_status: status,
            signal,
            core_dumped: false,
            group_dead: true,
            parent_tgid: 1,
            start_time_ns: 0,
            cpu_time_ns: 5_000_000,
            comm: "app".into(),
        };
        event(time, tgid, cgroup_id, detail)
    }

    fn signal(time: u64, from: (u32, u64, &str), to: (u32, u64), sig: u32) -> Event {
        let detail = Detail::Signal {
            signal: sig,
            result: SignalResult::Delivered,
            group: true,
            target_pid: to.0,
            target_tgid: to.0,
            target_cgroup_id: to.1,
            sender_comm: from.2.into(),
            target_comm: "app".into(),
        };
        event(time, from.0, from.1, detail)
    }

    fn tracker_with_cri() -> NodeTracker {
        let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
        tracker.apply(&mkdir(0, POD_CGROUP, &format!("/kubepods/burstable/pod{POD_UID}")));
        tracker
    }

    fn only_view(tracker: &NodeTracker, now: u64) -> ContainerView {
        let views = tracker.containers(now);
        assert_eq!(views.len(), 1, "{views:#?}");
        views.into_iter().next().expect("one")
    }

    #[test]
    fn a_sidecar_signalled_before_the_main_container_exited_is_flagged() {
        let mut tracker = tracker_with_cri();
        let mut sidecar = meta(1, 30);
        (sidecar.container_name, sidecar.container_type) = ("proxy".into(), Some(ContainerType::Init));
        tracker.set_metadata(vec![sidecar, meta(2, 30)]);
        let proxy = container_cgroup(&mut tracker, 0, 1);
        tracker.apply(&exec(SECOND, 100, proxy, SHIM_CGROUP, "proxy"));
        let app = container_cgroup(&mut tracker, 2 * SECOND, 2);
        tracker.apply(&exec(3 * SECOND, 200, app, SHIM_CGROUP, "app"));
        // The runtime signals both at once (the rule: the sidecar only after the app exited).
        let shim = (50, SHIM_CGROUP, "containerd-shim");
        tracker.apply(&signal(10 * SECOND, shim, (200, app), 15));
        tracker.apply(&signal(10 * SECOND, shim, (100, proxy), 15));
        tracker.apply(&exit(10 * SECOND + 1000, 100, proxy, None, Some(15)));
        tracker.apply(&exit(12 * SECOND, 200, app, Some(0), None));
        let views = tracker.containers(13 * SECOND);
        let proxy = views.iter().find(|v| v.labels.container == "proxy").expect("proxy");
        assert!(proxy.sidecar);
        let order = proxy.sidecar_order.clone().expect("judged");
        assert_eq!(
            order.verdict,
            crate::model::termination::SidecarVerdict::SignalledBeforeMainExited { main_container: "app".into() }
        );
        let app = views.iter().find(|v| v.labels.container == "app").expect("app");
        assert!(!app.sidecar && app.sidecar_order.is_none());
    }

    #[test]
    fn a_container_runs_and_completes_with_kubelet_names() {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata(vec![meta(1, 30)]);
        let cg = container_cgroup(&mut tracker, SECOND, 1);
        tracker.apply(&exec(2 * SECOND, 100, cg, SHIM_CGROUP, "app"));
        let view = only_view(&tracker, 3 * SECOND);
        assert_eq!(
            (
                view.labels.namespace.as_str(),
                view.labels.pod.as_str(),
                view.labels.container.as_str(),
                view.labels.uid.as_str()
            ),
            ("shop", "web-1", "app", POD_UID)
        );
        assert_eq!(view.status.state, ContainerState::Running { started_at: 2 * SECOND });
        tracker.apply(&exit(4 * SECOND, 100, cg, Some(0), None));
        let view = only_view(&tracker, 5 * SECOND);
        assert!(matches!(
            view.status.state,
            ContainerState::Terminated { reason: TerminatedReason::Completed, exit_code: 0, .. }
        ));
        assert!(matches!(
            view.last_termination.map(|r| r.outcome),
            Some(TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(0), signal: None })
        ));
    }

    #[test]
    fn late_metadata_links_the_instance_and_judges_with_its_grace_period() {
        let mut tracker = tracker_with_cri();
        let cg = container_cgroup(&mut tracker, SECOND, 1);
        assert_eq!(tracker.take_notices(), vec![Notice::MetadataNeeded { container_id: container_id(1) }]);
        tracker.apply(&exec(2 * SECOND, 100, cg, SHIM_CGROUP, "app"));
        tracker.apply(&signal(10 * SECOND, (50, SHIM_CGROUP, "containerd-shim"), (100, cg), 15));
        tracker.apply(&signal(13 * SECOND, (50, SHIM_CGROUP, "containerd-shim"), (100, cg), 9));
        tracker.apply(&exit(13 * SECOND + 1000, 100, cg, None, Some(9)));
        assert!(tracker.containers(14 * SECOND).is_empty(), "nothing shown before the runtime names it");
        tracker.set_metadata(vec![meta(1, 3)]);
        let view = only_view(&tracker, 14 * SECOND);
        let report = view.last_termination.expect("judged on linking");
        assert_eq!(report.grace_ns, 3 * SECOND, "the annotation's grace period, not the 30 s default");
        assert!(
            matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, killed_early: false, .. } if stop_to_kill_ns == 3 * SECOND)
        );
        let unit = tracker.units().next().expect("unit");
        assert_eq!(unit.counters.grace_violations, 1);
        assert_eq!(unit.counters.signals.get(&(15, "runtime")), Some(&1));
        assert_eq!(unit.counters.exits.get(&("Signal".to_owned(), 137, Some(9))), Some(&1));
    }

    #[test]
    fn a_crash_loop_is_compared_with_the_kubelet_back_off() {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata((1..=4).map(|n| meta(n, 30)).collect());
        // (created, started, exited) per instance, seconds. Restarts: immediate, +10 s (due),
        // then +5 s where 20 s were due.
        let runs = [(0.0, 0.1, 1.0), (1.1, 1.2, 2.0), (12.0, 12.1, 13.0), (17.9, 18.0, 19.0)];
        for (n, (created, started, exited)) in runs.iter().enumerate() {
            let at = |s: f64| (s * SECOND as f64) as u64;
            let cg = container_cgroup(&mut tracker, at(*created), n as u64 + 1);
            tracker.apply(&exec(at(*started), 100 + n as u32, cg, SHIM_CGROUP, "app"));
            tracker.apply(&exit(at(*exited), 100 + n as u32, cg, Some(1), None));
        }
        let unit = tracker.units().next().expect("unit");
        assert_eq!(unit.restart_count(), 3);
        assert_eq!(unit.counters.backoff_verdicts.get("within_tolerance"), Some(&2));
        assert_eq!(unit.counters.backoff_verdicts.get("too_early"), Some(&1));
        let last = unit.last_backoff.clone().expect("observation");
        assert_eq!((last.expected_delay_ns, last.verdict), (20 * SECOND, Verdict::TooEarly));
        // Right after the fourth exit the kubelet would hold the restart for 40 s.
        let view = only_view(&tracker, 20 * SECOND);
        assert!(matches!(view.status.state, ContainerState::Waiting { .. }), "{:?}", view.status.state);
        assert_eq!(view.status.back_off_remaining_ns, Some(39 * SECOND));
    }

    #[test]
    fn the_runtimes_setup_process_in_the_new_cgroup_is_not_the_init() {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata(vec![meta(1, 30)]);
        let cg = container_cgroup(&mut tracker, 0, 1);
        // runc re-executes itself after being moved into the container's cgroup, still in the
        // host's pid namespace, then exits once the container's init is set up.
        let mut setup = exec(SECOND / 10, 90, cg, SHIM_CGROUP, "runc");
        if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut setup.detail {
            (*child_pid_namespace, *namespace_init) = (false, false);
        }
        tracker.apply(&setup);
        tracker.apply(&exit(SECOND / 5, 90, cg, Some(0), None));
        tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
        let view = only_view(&tracker, 2 * SECOND);
        assert!(matches!(view.status.state, ContainerState::Running { .. }), "{:?}", view.status.state);
        assert_eq!(view.exec_sessions, 0);
        tracker.apply(&exit(3 * SECOND, 100, cg, Some(3), None));
        let view = only_view(&tracker, 4 * SECOND);
        assert!(matches!(view.status.state, ContainerState::Terminated { exit_code: 3, .. }));
    }

    #[test]
    fn a_host_pid_container_ends_with_its_cgroup_when_no_namespaced_init_follows() {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata(vec![meta(1, 30)]);
        let cg = container_cgroup(&mut tracker, 0, 1);
        let mut init = exec(SECOND, 100, cg, SHIM_CGROUP, "agent");
        if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut init.detail {
            (*child_pid_namespace, *namespace_init) = (false, false);
        }
        tracker.apply(&init);
        assert!(matches!(only_view(&tracker, 2 * SECOND).status.state, ContainerState::Running { .. }));
        tracker.apply(&exit(3 * SECOND, 100, cg, Some(1), None));
        tracker.apply(&event(
            4 * SECOND,
            1,
            1,
            Detail::CgroupRmdir(CgroupDetail { id: cg, path: String::new(), truncated: false }),
        ));
        let view = only_view(&tracker, 5 * SECOND);
        assert!(
            matches!(view.status.state, ContainerState::Terminated { exit_code: 1, finished_at, .. } if finished_at == 3 * SECOND)
        );
    }

    #[test]
    fn runtime_started_processes_are_exec_sessions_with_their_cpu() {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata(vec![meta(1, 30)]);
        let cg = container_cgroup(&mut tracker, 0, 1);
        tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
        // The app forks a helper: not a session.
        tracker.apply(&exec(2 * SECOND, 101, cg, cg, "helper"));
        // Two exec probes from the runtime, one forking a child of its own.
        tracker.apply(&exec(3 * SECOND, 200, cg, SHIM_CGROUP, "sh"));
        let mut child = exec(3 * SECOND + 10, 201, cg, cg, "cat");
        if let Detail::Exec { parent_tgid, .. } = &mut child.detail {
            *parent_tgid = 200;
        }
        tracker.apply(&child);
        tracker.apply(&exit(3 * SECOND + 20, 201, cg, Some(0), None));
        tracker.apply(&exit(3 * SECOND + 30, 200, cg, Some(0), None));
        tracker.apply(&exec(4 * SECOND, 300, cg, SHIM_CGROUP, "true"));
        tracker.apply(&exit(4 * SECOND + 10, 300, cg, Some(0), None));
        tracker.apply(&exit(5 * SECOND, 101, cg, Some(0), None));
        let unit = tracker.units().next().expect("unit");
        assert_eq!(unit.counters.exec_sessions, 2);
        assert_eq!(unit.counters.exec_session_cpu_ns, 3 * 5_000_000, "sh, its cat, and true; not the helper");
        assert!(matches!(unit.state(), ContainerState::Running { .. }));
    }

    #[test]
    fn containers_the_runtime_does_not_list_are_sandboxes_and_ignored() {
        let mut tracker = tracker_with_cri();
        let cg = container_cgroup(&mut tracker, 0, 9);
        tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "pause"));
        tracker.set_metadata(vec![meta(1, 30)]);
        assert!(tracker.containers(2 * SECOND).is_empty());
    }

    #[test]
    fn without_a_runtime_containers_are_named_by_id() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        let cg = container_cgroup(&mut tracker, 0, 1);
        tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
        let view = only_view(&tracker, 2 * SECOND);
        assert_eq!((view.labels.container.as_str(), view.labels.uid.as_str()), ("000000000000", POD_UID));
    }

    #[test]
    fn host_cgroups_are_units_that_run_while_any_process_does() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        tracker.apply(&mkdir(0, 42, "/system.slice/web.service"));
        assert!(tracker.containers(0).is_empty(), "a cgroup becomes a unit when something runs in it");
        tracker.apply(&exec(SECOND, 10, 42, 1, "web"));
        tracker.apply(&exec(2 * SECOND, 11, 42, 42, "worker"));
        tracker.apply(&exit(3 * SECOND, 10, 42, Some(0), None));
        let view = only_view(&tracker, 4 * SECOND);
        assert_eq!(
            (view.labels.namespace.as_str(), view.labels.container.as_str()),
            ("host", "/system.slice/web.service")
        );
        assert!(matches!(view.status.state, ContainerState::Running { .. }), "the worker still runs");
        tracker.apply(&exit(5 * SECOND, 11, 42, Some(2), None));
        let view = only_view(&tracker, 6 * SECOND);
        assert!(matches!(view.status.state, ContainerState::Terminated { exit_code: 2, .. }));
        tracker.apply(&exec(7 * SECOND, 12, 42, 1, "web"));
        let view = only_view(&tracker, 8 * SECOND);
        assert!(matches!(view.status.state, ContainerState::Running { started_at } if started_at == 7 * SECOND));
        assert_eq!(view.status.restart_count, 1);
    }

    #[test]
    fn events_for_unknown_cgroups_ask_for_a_rescan_and_departed_units_expire() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        tracker.apply(&exec(SECOND, 10, 77, 1, "x"));
        assert_eq!(tracker.take_notices(), vec![Notice::UnknownCgroup(77)]);
        tracker.seed_cgroup(77, "/batch/job", SECOND);
        tracker.apply(&exec(2 * SECOND, 10, 77, 1, "x"));
        tracker.apply(&exit(3 * SECOND, 10, 77, Some(0), None));
        tracker.apply(&event(
            4 * SECOND,
            1,
            1,
            Detail::CgroupRmdir(CgroupDetail { id: 77, path: "/batch/job".into(), truncated: false }),
        ));
        tracker.expire(5 * SECOND, 10 * SECOND);
        assert_eq!(tracker.containers(5 * SECOND).len(), 1, "kept during the retention");
        tracker.expire(20 * SECOND, 10 * SECOND);
        assert!(tracker.containers(20 * SECOND).is_empty());
    }
}
