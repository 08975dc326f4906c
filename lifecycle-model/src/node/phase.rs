//! Pod phase from what the kernel saw, as the kubelet computes it (`getPhase`): Pending until
//! the main containers run, Running while one runs or will be restarted, Succeeded when all
//! ended with exit 0 for good, Failed when all ended for good and one failed. Sidecars and init
//! containers do not decide completion. Shown beside the phase the API reports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{NodeSnapshot, UnitKey};
use crate::{container_state::ContainerState, spec::ReportedPodStatus, time::BootTime};

/// `PodPhase` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

crate::spelling::spelling!(PodPhase {
    Pending => "Pending",
    Running => "Running",
    Succeeded => "Succeeded",
    Failed => "Failed",
});

/// One pod as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodView {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// From the kernel's view of the pod's containers.
    pub phase: PodPhase,
    /// What the kubelet reported (`status.phase`), when the API is watched.
    pub api_phase: Option<String>,
    /// Main containers running now, of all main containers seen.
    pub running_containers: usize,
    pub containers: usize,
    /// The pod conditions the kernel can tell (readiness needs the probes' results, which the
    /// kubelet keeps: `Ready`/`ContainersReady` are the API's).
    pub conditions: PodConditions,
    /// The same conditions as the kubelet reported them, and the generation it observed, when
    /// the API is watched.
    pub api_status: Option<ReportedPodStatus>,
}

/// `PodReadyToStartContainers` and `Initialized`, from what ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodConditions {
    /// The sandbox (or any container of the pod) has a process running: the runtime set the
    /// pod up (`PodReadyToStartContainers`).
    pub ready_to_start_containers: bool,
    /// Every init container seen (sidecars aside) completed with exit 0, or there is none
    /// (`Initialized`).
    pub initialized: bool,
}

/// One main container's part in the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Waiting,
    Running,
    /// Ended, and will be restarted.
    Restarting,
    /// Ended for good, with this exit code.
    Done(i32),
}

fn phase(parts: &[Part]) -> PodPhase {
    if parts.iter().any(|p| matches!(p, Part::Running | Part::Restarting)) {
        return PodPhase::Running;
    }
    if parts.is_empty() || parts.contains(&Part::Waiting) {
        return PodPhase::Pending;
    }
    if parts.iter().any(|p| matches!(p, Part::Done(code) if *code != 0)) {
        PodPhase::Failed
    } else {
        PodPhase::Succeeded
    }
}

impl NodeSnapshot {
    /// Every Kubernetes pod with a unit, with its phase at `now`.
    pub fn pods(&self, now: BootTime) -> Vec<PodView> {
        self.pods_where(now, |_| true)
    }

    /// The pods (by uid) `wanted` selects, with their phase at `now`; only those are viewed.
    pub fn pods_where(&self, now: BootTime, wanted: impl Fn(&str) -> bool) -> Vec<PodView> {
        let with_process = self.pods_with_process();
        let mut pods: BTreeMap<&str, (PodView, Vec<Part>)> = BTreeMap::new();
        for unit in self.units() {
            let UnitKey::Container { pod_uid, .. } = &unit.key else { continue };
            if !wanted(pod_uid) {
                continue;
            }
            let entry = pods.entry(pod_uid.as_str()).or_insert_with(|| {
                let view = PodView {
                    namespace: unit.labels.namespace.clone(),
                    pod: unit.labels.pod.clone(),
                    uid: pod_uid.clone(),
                    phase: PodPhase::Pending,
                    api_phase: self.pods.get(pod_uid).and_then(|p| p.reported_phase.clone()),
                    api_status: self.pods.get(pod_uid).map(|p| p.reported_status.clone()),
                    running_containers: 0,
                    containers: 0,
                    conditions: PodConditions {
                        ready_to_start_containers: with_process.contains(pod_uid.as_str()),
                        initialized: true,
                    },
                };
                (view, Vec::new())
            });
            if unit.init_container && !unit.sidecar {
                let completed = matches!(unit.state(), ContainerState::Terminated { exit_code: 0, .. });
                entry.0.conditions.initialized &= completed;
            }
            if unit.init_container || unit.sidecar {
                continue;
            }
            let snapshot = unit.snapshot(now);
            let part = match &snapshot.state {
                ContainerState::Running { .. } => Part::Running,
                ContainerState::Waiting { .. } if snapshot.last_state.is_some() => Part::Restarting,
                ContainerState::Waiting { .. } => Part::Waiting,
                ContainerState::Terminated { .. } if snapshot.restart_expected => Part::Restarting,
                ContainerState::Terminated { exit_code, .. } => Part::Done(*exit_code),
            };
            entry.0.containers += 1;
            entry.0.running_containers += usize::from(part == Part::Running);
            entry.1.push(part);
        }
        pods.into_values()
            .map(|(mut view, parts)| {
                view.phase = phase(&parts);
                view
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_the_kubelets_rules() {
        assert_eq!(phase(&[]), PodPhase::Pending);
        assert_eq!(phase(&[Part::Waiting, Part::Done(0)]), PodPhase::Pending);
        assert_eq!(phase(&[Part::Running, Part::Done(1)]), PodPhase::Running);
        assert_eq!(phase(&[Part::Restarting]), PodPhase::Running, "a crash loop is Running");
        assert_eq!(phase(&[Part::Done(0), Part::Done(0)]), PodPhase::Succeeded);
        assert_eq!(phase(&[Part::Done(0), Part::Done(2)]), PodPhase::Failed);
    }
}
