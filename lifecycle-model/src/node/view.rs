//! Read-only views of the node for the exporters and the API: a unit's JSON view, the running
//! containers with their main process, and the units still tracked.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use super::{Disagreement, NodeSnapshot, NodeTracker, PortStats, ProbeKey, Unit, UnitKey, UnitLabels};
use crate::{
    backoff::Observation,
    container_state::ContainerStatusSnapshot,
    spec::{HttpProbe, ReportedPodStatus},
    systemd::SystemdUnit,
    termination::{SidecarOrder, TerminationReport},
    time::BootTime,
};

/// A container as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Named by pod uid + container id: the runtime has not named it (yet).
    pub named_by_id: bool,
    /// Where the kubelet's reported status disagreed with the kernel (the last few).
    pub disagreements: Vec<Disagreement>,
    /// For a sidecar whose pod terminated: whether it was stopped in its turn.
    pub sidecar_order: Option<SidecarOrder>,
    /// For a host unit under systemd, once read: the settings its stops and restarts are
    /// judged by (`KillSignal=`, `TimeoutStopSec=`, `Restart=`, ...). Absent before the agent
    /// has read them: a stop judged then has no grace (`rules: none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systemd: Option<SystemdUnit>,
}

/// A container running now, as the probe supervisor needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningContainer {
    pub labels: UnitLabels,
    /// The container's init, as the host sees it.
    pub main_pid: u32,
    /// The pod's declared probes (raw annotation text; see `metadata::keys::PROBE_DECLARATION`).
    pub probe_declaration: Option<String>,
    /// The `httpGet` probes of every container of the pod, by container name, from the pod spec
    /// (empty without the Kubernetes API): those aimed at the probe port declare checks too.
    pub spec_probes: Vec<(String, HttpProbe)>,
}

impl NodeTracker {
    /// Every unit.
    pub fn units(&self) -> impl Iterator<Item = &Unit> {
        self.units.values()
    }
}

/// What the API's answer about some units is made from (see [`NodeSnapshot::answer_inputs`]):
/// equal inputs make the same answer. Kept by a reader instead of the snapshot, it holds no unit:
/// a version per unit and a few values per pod.
#[derive(Debug, PartialEq, Eq)]
pub struct AnswerInputs {
    /// The version of each unit the answer reads, in key order.
    units: Vec<u64>,
    /// Per pod the answer shows, in uid order: what the API reported of its phase and status,
    /// and whether a process of it lives.
    pods: Vec<(Option<String>, Option<ReportedPodStatus>, bool)>,
}

impl NodeSnapshot {
    /// What the answer about the units `wanted` selects is made from: their views, and the views
    /// of their pods, which read every unit of the pod (its phase, its sidecars' order), the
    /// pod's reported phase and status, and whether a process of the pod lives. Two snapshots
    /// with equal inputs give the same answer; unequal inputs may still give the same one (a
    /// unit's version moves with its counters too). Costs a lookup per unit, no view.
    pub fn answer_inputs(&self, wanted: impl Fn(&Unit) -> bool) -> AnswerInputs {
        fn pod_of(unit: &Unit) -> Option<&str> {
            match &unit.key {
                UnitKey::Container { pod_uid, .. } => Some(pod_uid.as_str()),
                UnitKey::Host { .. } => None,
            }
        }
        let pods: BTreeSet<&str> = self.units().filter(|unit| wanted(unit)).filter_map(pod_of).collect();
        let units = self
            .units()
            .filter(|unit| wanted(unit) || pod_of(unit).is_some_and(|uid| pods.contains(uid)))
            .map(|unit| unit.version)
            .collect();
        let with_process = self.pods_with_process();
        let pods = pods
            .into_iter()
            .map(|uid| {
                let facts = self.pods.get(uid);
                (
                    facts.and_then(|facts| facts.reported_phase.clone()),
                    facts.map(|facts| facts.reported_status.clone()),
                    with_process.contains(uid),
                )
            })
            .collect();
        AnswerInputs { units, pods }
    }

    /// The API view of every unit at `now`.
    pub fn containers(&self, now: BootTime) -> Vec<ContainerView> {
        self.containers_where(now, |_| true)
    }

    /// The API view at `now` of the units `wanted` selects. Only those are viewed: a client
    /// after one container costs that container, not the node (a poll of one container on a
    /// node of 1,000 was a view of each).
    pub fn containers_where(&self, now: BootTime, wanted: impl Fn(&Unit) -> bool) -> Vec<ContainerView> {
        let mut views: Vec<ContainerView> =
            self.units().filter(|unit| wanted(unit)).map(|unit| self.view(unit, now)).collect();
        if views.iter().any(|view| view.sidecar) {
            let pods: HashSet<&str> =
                views.iter().filter(|view| view.sidecar).map(|view| view.labels.uid.as_str()).collect();
            let orders = self.sidecar_orders(|pod_uid| pods.contains(pod_uid));
            for view in &mut views {
                if view.sidecar {
                    view.sidecar_order = orders.get(&(view.labels.uid.clone(), view.labels.container.clone())).cloned();
                }
            }
        }
        views
    }

    pub fn view(&self, unit: &Unit, now: BootTime) -> ContainerView {
        ContainerView {
            labels: unit.labels.clone(),
            container_id: unit.container_id.clone(),
            cgroup_id: unit.cgroup_id,
            status: unit.status.state_at(now, &unit.restart, &unit.backoff),
            last_termination: unit.last_termination.as_deref().cloned(),
            last_backoff: unit.last_backoff.clone(),
            exec_sessions: unit.counters.exec_sessions,
            exec_session_cpu_seconds: crate::time::seconds(unit.counters.exec_session_cpu_ns),
            tcp: unit.tcp.clone(),
            sidecar: unit.sidecar,
            named_by_id: unit.named_by_id,
            disagreements: unit.status_check.recent.iter().cloned().collect(),
            sidecar_order: None,
            systemd: unit.systemd.as_deref().map(|rules| rules.unit.clone()),
        }
    }

    /// Kubernetes containers running now (each unit's current instance), with their main
    /// process and their pod's probe declaration.
    pub fn running_containers(&self) -> Vec<RunningContainer> {
        let main_pids = self.main_pids();
        self.units()
            .filter(|unit| matches!(unit.key, UnitKey::Container { .. }))
            .filter_map(|unit| {
                Some(RunningContainer {
                    labels: unit.labels.clone(),
                    main_pid: *main_pids.get(&unit.cgroup_id?)?,
                    probe_declaration: unit.probe_declaration.clone(),
                    spec_probes: self
                        .pods
                        .get(&unit.labels.uid)
                        .into_iter()
                        .flat_map(|pod| &pod.containers)
                        .flat_map(|c| c.http_probes.iter().map(|probe| (c.name.clone(), probe.clone())))
                        .collect(),
                })
            })
            .collect()
    }

    /// The containers whose memory files the sampler reads: every Kubernetes container whose
    /// init lives, at most `limit` (the rest are counted by the caller).
    pub fn memory_targets(&self, limit: usize) -> (Vec<super::MemoryTarget>, usize) {
        let main_pids = self.main_pids();
        let mut targets = Vec::new();
        let mut left_out = 0;
        for unit in self.units().filter(|unit| matches!(unit.key, UnitKey::Container { .. })) {
            let Some((cgroup_id, main_pid)) = unit.cgroup_id.and_then(|id| Some((id, *main_pids.get(&id)?))) else {
                continue;
            };
            if targets.len() >= limit {
                left_out += 1;
                continue;
            }
            targets.push(super::MemoryTarget { key: unit.key.clone(), cgroup_id, main_pid });
        }
        (targets, left_out)
    }

    /// Whether a container of the node declares probes: in its pod's annotation, or as an
    /// `httpGet` probe of its pod's spec aimed at `probe_port`. Reads without allocating, so a
    /// reader can skip the work of [`Self::running_containers`] on a node that probes nothing.
    pub fn declares_probes(&self, probe_port: Option<u16>) -> bool {
        self.units().filter(|unit| matches!(unit.key, UnitKey::Container { .. })).any(|unit| {
            unit.probe_declaration.is_some()
                || probe_port.is_some_and(|port| {
                    self.pods.get(&unit.labels.uid).is_some_and(|pod| {
                        pod.containers.iter().any(|c| c.http_probes.iter().any(|probe| probe.port == port))
                    })
                })
        })
    }

    /// The probe key (pod uid, container name) of every Kubernetes container still tracked,
    /// running or not: a probe lives as long as its own container's unit, whoever else has its
    /// pod's name meanwhile.
    pub fn tracked_probe_keys(&self) -> HashSet<ProbeKey> {
        self.units()
            .filter(|unit| matches!(unit.key, UnitKey::Container { .. }))
            .map(|unit| ProbeKey::of(&unit.labels))
            .collect()
    }
}
