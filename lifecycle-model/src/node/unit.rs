//! A unit: one container over its restarts (or a plain-host cgroup), with its status, back-off,
//! termination history and counters. Linking attaches an instance to its unit once its identity
//! is known (finishing, which judges an exited instance and applies the verdict to the unit, is
//! `finish.rs`).

use std::collections::BTreeMap;

use lifecycle_common::CgroupCounters;
use serde::{Deserialize, Serialize};

use super::{
    bounds::DroppedKind,
    disagree::{DisagreementKind, StatusCheck},
    instance::InstanceKind,
    warning::WarningReason,
    NodeTracker, Notice,
};
use crate::{
    backoff::{BackoffTracker, Observation, Verdict},
    container_state::{ContainerState, ContainerStatus, ContainerStatusSnapshot, RestartSpec, TerminatedReason},
    memory::{MemoryHistory, MemorySample},
    metadata::ContainerMeta,
    spec::{ContainerKind, StopCause},
    systemd::{RestartTracker, SystemdUnit},
    termination::{OutcomeKind, PreStopHandler, SenderKind, TerminationReport, TerminationSettings},
    time::{seconds, BootTime},
};

/// Who a unit is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UnitKey {
    /// A Kubernetes container: the kubelet's back-off key without the spec hash.
    Container { pod_uid: String, container: String },
    /// A cgroup on a plain host, named by its path.
    Host { path: String },
}

/// Labels as kube-state-metrics spells them, so series join.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UnitLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
}

/// Per-port TCP facts of a unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStats {
    /// Listening sockets open now.
    pub listeners: i64,
    pub established: u64,
    pub accepts: u64,
    /// When the app last accepted a connection on this port (boot ns).
    pub last_accept_ns: Option<u64>,
    /// When anything last happened on this port (boot ns): closed ports idle for the series
    /// retention expire, and the idlest closed port makes room for a new one.
    #[serde(skip)]
    pub last_change_ns: u64,
}

/// Ports kept per unit (each is four series). A container can listen on every port there is;
/// past this, a new port takes the place of the closed port idle longest, else it is not kept
/// (counted in `lifecycle_state_dropped_total{kind="port"}`).
pub const MAX_PORTS_PER_UNIT: usize = 32;

/// The entry for `port` in a unit's table, made if there is room (see [`MAX_PORTS_PER_UNIT`]);
/// `None` when the table is full of open ports.
pub(super) fn port_entry(tcp: &mut BTreeMap<u16, PortStats>, port: u16) -> Option<&mut PortStats> {
    if !tcp.contains_key(&port) && tcp.len() >= MAX_PORTS_PER_UNIT {
        let idlest_closed = tcp
            .iter()
            .filter(|(_, stats)| stats.listeners <= 0)
            .min_by_key(|(_, stats)| stats.last_change_ns)
            .map(|(port, _)| *port)?;
        tcp.remove(&idlest_closed);
    }
    Some(tcp.entry(port).or_default())
}

/// Counters kept per unit across its instances.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitCounters {
    /// (reason, exit code, signal) -> exits of the init.
    pub exits: BTreeMap<(TerminatedReason, i32, Option<u8>), u64>,
    /// (termination outcome, stop cause) -> count.
    pub terminations: BTreeMap<(OutcomeKind, Option<StopCause>), u64>,
    /// SIGKILLs after the grace period ran out.
    pub grace_violations: u64,
    /// Back-off verdict -> restarts judged so.
    pub backoff_verdicts: BTreeMap<Verdict, u64>,
    /// (signal, sender kind) -> signals received by the unit's processes.
    pub signals: BTreeMap<(u32, SenderKind), u64>,
    /// Processes of the unit the OOM killer chose.
    pub oom_kills: u64,
    /// Processes started into the container by the runtime (exec probes, kubectl exec).
    pub exec_sessions: u64,
    /// CPU those processes and their children used.
    pub exec_session_cpu_ns: u64,
    /// Disagreements with the kubelet's reported status, by kind.
    pub disagreements: BTreeMap<DisagreementKind, u64>,
}

/// Kernel counters carried over from cgroups that are gone (a unit's departed instances, or an
/// instance's when it changes units). Most units and instances carry none, so the sum is boxed
/// and absent until the first: inline, its few hundred bytes were a third of every unit and
/// instance (heaptrack of the agent with 1,000 units, BENCHMARKS.md).
#[derive(Clone, Debug, Default)]
pub(crate) struct CarriedCounters(Option<Box<CgroupCounters>>);

impl CarriedCounters {
    /// Adds a departed cgroup's final counters.
    pub(crate) fn add(&mut self, counters: CgroupCounters) {
        match &mut self.0 {
            Some(sum) => **sum += counters,
            None => self.0 = Some(Box::new(counters)),
        }
    }

    /// Adds everything `other` carried.
    pub(crate) fn add_all(&mut self, other: CarriedCounters) {
        if let Some(counters) = other.0 {
            self.add(*counters);
        }
    }

    /// The sum carried (zero when nothing was).
    pub(crate) fn total(&self) -> CgroupCounters {
        self.0.as_deref().copied().unwrap_or_default()
    }
}

/// One unit: a container over its restarts, or a host cgroup.
#[derive(Clone, Debug)]
///
/// Only the tracker changes a unit; everyone else reads it through the accessors below.
pub struct Unit {
    pub(super) key: UnitKey,
    pub(super) labels: UnitLabels,
    pub(super) status: ContainerStatus,
    pub(super) backoff: BackoffTracker,
    pub(super) restart: RestartSpec,
    pub(super) counters: UnitCounters,
    pub(super) tcp: BTreeMap<u16, PortStats>,
    /// Boxed: a report is about 320 bytes, and most units (running, never stopped) have none.
    pub(super) last_termination: Option<Box<TerminationReport>>,
    pub(super) last_backoff: Option<Observation>,
    /// The instance (cgroup) the unit runs as now.
    pub(super) cgroup_id: Option<u64>,
    pub(super) container_id: Option<String>,
    /// Last time anything changed (boot ns); departed units expire from it.
    pub(super) last_change_ns: u64,
    /// The kernel's counters of this unit's instances whose cgroups are gone.
    pub(super) departed_kernel_counters: CarriedCounters,
    /// An init container (per the runtime's metadata).
    pub(super) init_container: bool,
    /// An init container seen running beside a main container: a sidecar (restartPolicy Always;
    /// the runtime does not report the policy, so the agent recognises it by that).
    pub(super) sidecar: bool,
    /// When the current instance's init started (orders sidecars as the kubelet started them).
    pub(super) started_at: Option<u64>,
    /// Named by pod uid + container id: the runtime could not name it (yet).
    pub(super) named_by_id: bool,
    /// The pod's probe declaration, from the runtime's metadata.
    pub(super) probe_declaration: Option<String>,
    /// Instance ends and disagreements with the kubelet's reported status.
    pub(super) status_check: StatusCheck,
    /// Warnings not taken yet (see `warning.rs`).
    pub(super) pending_warnings: Vec<(WarningReason, String)>,
    /// A systemd unit's settings and its restarts, once systemd told them (host units only;
    /// boxed: most units are containers).
    pub(super) systemd: Option<Box<SystemdRules>>,
    /// The memory readings of its current instance (`memory.rs`; `pressure.rs` records them).
    pub(super) memory: MemoryHistory,
    /// Moves each time the tracker takes the unit to change it, and never comes back to an
    /// earlier value on this node (`shared.rs`): the same version is the same unit.
    pub(super) version: u64,
}

/// What judges a systemd unit: its settings as systemd reported them, and its restarts so far.
#[derive(Clone, Debug)]
pub(super) struct SystemdRules {
    pub(super) unit: SystemdUnit,
    pub(super) restarts: RestartTracker,
}

/// One judged termination, for the exporters' distributions (the model keeps no histograms).
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// The unit's namespace (`host` on a plain host).
    pub namespace: String,
    pub outcome: OutcomeKind,
    /// Stop signal to exit, when there was a stop signal.
    pub stop_to_exit_seconds: Option<f64>,
    /// Share of the grace period used, for exits within grace.
    pub grace_used_ratio: Option<f64>,
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

impl Unit {
    /// Who the unit is.
    pub fn key(&self) -> &UnitKey {
        &self.key
    }

    /// Its labels, as kube-state-metrics spells them.
    pub fn labels(&self) -> &UnitLabels {
        &self.labels
    }

    /// Counters over all its instances.
    pub fn counters(&self) -> &UnitCounters {
        &self.counters
    }

    /// TCP facts per local port.
    pub fn tcp(&self) -> &BTreeMap<u16, PortStats> {
        &self.tcp
    }

    /// The last judged termination.
    pub fn last_termination(&self) -> Option<&TerminationReport> {
        self.last_termination.as_deref()
    }

    /// The last judged restart.
    pub fn last_backoff(&self) -> Option<&Observation> {
        self.last_backoff.as_ref()
    }

    /// Whether the unit is named by pod uid + container id because the runtime's metadata is
    /// missing; it takes its real name when the metadata arrives.
    pub fn named_by_id(&self) -> bool {
        self.named_by_id
    }

    /// The runtime's id of its current (or last) container, if it has one.
    pub fn container_id(&self) -> Option<&str> {
        self.container_id.as_deref()
    }

    /// The cgroup it runs in now, if any.
    pub fn cgroup_id(&self) -> Option<u64> {
        self.cgroup_id
    }

    /// The last reading of its current instance's memory files (`memory.events`, PSI).
    pub fn memory(&self) -> Option<&MemorySample> {
        self.memory.latest()
    }

    /// The kernel's counters of its instances whose cgroups are gone.
    pub fn departed_kernel_counters(&self) -> CgroupCounters {
        self.departed_kernel_counters.total()
    }

    /// The unit's current status (without back-off projection).
    pub fn state(&self) -> &ContainerState {
        self.status.state()
    }

    /// The unit's previous state, as its status keeps it (without back-off projection).
    pub fn last_state(&self) -> Option<&ContainerState> {
        self.status.last_state()
    }

    /// The back-off delay before a restart while the status shows Waiting/CrashLoopBackOff; a
    /// fact of the unit, not of the time (see [`ContainerStatus::pending_back_off_ns`]).
    pub fn pending_back_off_ns(&self) -> Option<u64> {
        self.status.pending_back_off_ns(&self.restart, &self.backoff)
    }

    /// Whether the unit waits on a back-off (Waiting/CrashLoopBackOff), its delay known or not;
    /// a fact of the unit, as [`Self::pending_back_off_ns`] is.
    pub fn held_by_back_off(&self) -> bool {
        self.status.held_by_back_off(&self.restart, &self.backoff)
    }

    pub fn restart_count(&self) -> u32 {
        self.status.restart_count()
    }

    /// The status at `now`, with CrashLoopBackOff projected from the back-off.
    pub fn snapshot(&self, now: BootTime) -> ContainerStatusSnapshot {
        self.status.state_at(now, &self.restart, &self.backoff)
    }
}

impl NodeTracker {
    /// Links an instance to its unit if its identity is known, replaying what it already did.
    pub(super) fn link(&mut self, cgroup_id: u64) {
        let Some(instance) = self.instances.get(cgroup_id) else { return };
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
                None if !self.runtime_reachable => {
                    // Named by id now; the plumbing keeps asking the runtime for the name.
                    self.staged.notices.push(Notice::MetadataNeeded { container_id: container_id.clone() });
                    // Keyed by the full id (unique); labelled with the short one, as crictl shows it.
                    let short: String = container_id.chars().take(12).collect();
                    (
                        UnitKey::Container { pod_uid: pod_uid.to_string(), container: container_id.clone() },
                        UnitLabels {
                            namespace: String::new(),
                            pod: String::new(),
                            container: short,
                            uid: pod_uid.to_string(),
                        },
                        None,
                    )
                }
                None => {
                    self.staged.notices.push(Notice::MetadataNeeded { container_id: container_id.clone() });
                    return;
                }
            },
        };
        if let UnitKey::Host { path } = &key {
            if let Some(unit) = crate::systemd::unit_of_path(path) {
                self.staged.notices.push(Notice::SystemdUnitWanted { path: path.clone(), unit: unit.to_owned() });
            }
        }
        let restart = self.restart_spec(&key, meta.as_ref());
        let settings = self.settings_for(&key, meta.as_ref());
        let sidecar_in_spec = self.spec_of(&key).map(|(_, c)| c.kind == ContainerKind::Sidecar);
        let (backoff_policy, tolerance) = (self.config.kubelet.backoff.policy(), self.config.tolerance);
        let unit = self.units.get_or_insert_with(&key, || Unit {
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
            departed_kernel_counters: CarriedCounters::default(),
            init_container: false,
            sidecar: false,
            started_at: None,
            named_by_id: false,
            probe_declaration: None,
            status_check: StatusCheck::default(),
            pending_warnings: Vec::new(),
            systemd: None,
            memory: MemoryHistory::default(),
            version: 0,
        });
        unit.labels = labels;
        if unit.status_check.restart_base.is_none() {
            // The kubelet's count on the first instance seen; later ones the agent counts itself.
            unit.status_check.restart_base = meta.as_ref().and_then(|m| m.kubelet.restart_count);
        }
        unit.probe_declaration = meta.as_ref().and_then(|m| m.probe_declaration.clone());
        unit.init_container = restart.is_init_container;
        unit.restart = restart;
        if let Some(sidecar) = sidecar_in_spec {
            unit.sidecar = sidecar;
        }
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        instance.unit = Some(key.clone());
        self.staged.states_changed = true;
        let named_by_id = meta.is_none() && matches!(instance.kind, InstanceKind::Container { .. });
        instance.named_by_id = named_by_id;
        unit.named_by_id = named_by_id;
        unit.departed_kernel_counters.add_all(std::mem::take(&mut instance.pending_kernel_counters));
        instance.termination.set_settings(settings);
        if let Some(meta) = &meta {
            instance.spec_hash = meta.kubelet.spec_hash.map(|h| format!("{h:x}"));
        }
        if unit.cgroup_id != Some(cgroup_id) {
            // Another cgroup counts from zero: its readings start over.
            unit.memory.restart(BootTime::from_ns(instance.created_at));
        }
        unit.cgroup_id = Some(cgroup_id);
        unit.container_id = match &instance.kind {
            InstanceKind::Container { container_id, .. } => Some(container_id.clone()),
            InstanceKind::Host { .. } => None,
        };
        unit.tcp.values_mut().for_each(|p| p.listeners = 0);
        unit.counters.merge(std::mem::take(&mut instance.pending_counters));
        for (port, stats) in std::mem::take(&mut instance.pending_tcp) {
            let Some(into) = port_entry(&mut unit.tcp, port) else {
                self.dropped.add(DroppedKind::Port, 1);
                continue;
            };
            into.listeners += stats.listeners;
            into.established += stats.established;
            into.accepts += stats.accepts;
            into.last_accept_ns = into.last_accept_ns.max(stats.last_accept_ns);
            into.last_change_ns = into.last_change_ns.max(stats.last_change_ns);
        }
        unit.status.on_instance_created(BootTime::from_ns(instance.created_at));
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
}

pub(super) fn start_unit(unit: &mut Unit, started_at: u64, spec_hash: Option<String>) {
    unit.started_at = Some(started_at);
    unit.status.on_init_started(BootTime::from_ns(started_at));
    // A systemd unit's restarts are judged against its own Restart= and RestartSec=.
    let systemd_restart =
        unit.systemd.as_deref_mut().and_then(|rules| rules.restarts.on_started(BootTime::from_ns(started_at)));
    if let Some(observation) = systemd_restart {
        *unit.counters.backoff_verdicts.entry(observation.verdict).or_default() += 1;
        if let (true, Some(expected)) = (observation.verdict.is_deviation(), observation.expected_delay_ns) {
            unit.warn(
                WarningReason::BackOffDeviation,
                format!(
                    "restart {} came {:.1}s after the exit; the unit's RestartSec= allows {:.1}s",
                    observation.restart_number,
                    seconds(observation.observed_delay_ns),
                    seconds(expected)
                ),
            );
        }
        unit.last_backoff = Some(observation);
    }
    if let Some(observation) = unit.backoff.on_started(BootTime::from_ns(started_at), spec_hash) {
        *unit.counters.backoff_verdicts.entry(observation.verdict).or_default() += 1;
        if let (true, Some(expected)) = (observation.verdict.is_deviation(), observation.expected_delay_ns) {
            unit.warn(
                WarningReason::BackOffDeviation,
                format!(
                    "restart {} came {:.1}s after the exit; the kubelet's back-off allows {:.1}s",
                    observation.restart_number,
                    seconds(observation.observed_delay_ns),
                    seconds(expected)
                ),
            );
        }
        unit.last_backoff = Some(observation);
    }
    unit.last_change_ns = unit.last_change_ns.max(started_at);
}

pub(super) fn termination_settings(meta: &ContainerMeta) -> TerminationSettings {
    let defaults = TerminationSettings::default();
    TerminationSettings {
        grace_period_ns: meta.kubelet.termination_grace_period_ns.unwrap_or(defaults.grace_period_ns),
        deletion_grace_ns: meta.kubelet.deletion_grace_period_ns,
        pre_stop: meta.kubelet.pre_stop_handler.as_deref().and_then(|json| PreStopHandler::from_annotation(json).ok()),
        // The runtime sends the image's STOPSIGNAL when the pod names none.
        stop_signal: meta.image_stop_signal.unwrap_or(defaults.stop_signal),
        ..defaults
    }
}
