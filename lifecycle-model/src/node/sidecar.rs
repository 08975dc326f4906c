//! Sidecars: init containers that keep running beside the main containers, and the order in
//! which a pod's termination stopped them.

use std::collections::{BTreeMap, HashMap};

use super::{NodeSnapshot, NodeTracker, Unit, UnitKey};
use crate::{
    container_state::ContainerState,
    termination::{sidecar_order, SidecarOrder, SidecarTurn},
    time::SECOND,
};

impl NodeSnapshot {
    /// Sidecar stop order for every pod with a terminated sidecar: sidecars in the order they
    /// started (their definition order), main containers after, as `sidecar_order` expects.
    pub(super) fn sidecar_orders(&self, of_pod: impl Fn(&str) -> bool) -> HashMap<(String, String), SidecarOrder> {
        let mut pods: BTreeMap<&str, Vec<&Unit>> = BTreeMap::new();
        for unit in self.units() {
            if let UnitKey::Container { pod_uid, .. } = &unit.key {
                if of_pod(pod_uid) {
                    pods.entry(pod_uid.as_str()).or_default().push(unit);
                }
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
                .filter_map(|u| u.last_termination.as_deref().map(|r| (u.labels.container.as_str(), r)));
            for order in sidecar_order(reports) {
                out.insert((pod_uid.to_owned(), order.container.clone()), order);
            }
        }
        out
    }
}

/// How long before a sidecar's stop signal its pod's stop may have begun and still be the same
/// stop: the pod's grace, and this for the kubelet's own latency.
const TURN_MARGIN_NS: u64 = 5 * SECOND;

impl NodeTracker {
    /// The sidecar in `cgroup_id` got its stop signal at `stop_time`: measures its wait for its
    /// turn from the earliest stop signal of its pod's main containers in this stop (the kubelet
    /// signals them as it begins), for its judgement (`TerminationTracker::on_sidecar_turn`).
    /// Nothing when no main container was stopped (they had all exited: no wait).
    pub(super) fn note_sidecar_turn(&mut self, cgroup_id: u64, stop_time: u64) {
        let Some(instance) = self.instances.get(cgroup_id) else { return };
        let Some(key @ UnitKey::Container { .. }) = instance.unit.clone() else { return };
        let UnitKey::Container { pod_uid, .. } = &key else { return };
        let is_sidecar = instance.termination.settings().is_sidecar || self.units.get(&key).is_some_and(|u| u.sidecar);
        if !is_sidecar {
            return;
        }
        let pod_grace_ns = instance.termination.settings().effective_grace_ns();
        let earliest = stop_time.saturating_sub(pod_grace_ns.saturating_add(TURN_MARGIN_NS));
        let in_pod = |u: &Unit| matches!(&u.key, UnitKey::Container { pod_uid: p, .. } if p == pod_uid);
        let began = self
            .units
            .values()
            .filter(|u| in_pod(u) && !u.sidecar && !u.init_container)
            .flat_map(|main| {
                let live = main
                    .cgroup_id
                    .and_then(|id| self.instances.get(id))
                    .and_then(|i| i.termination.kubelet_stop_time());
                let ended = main.last_termination.as_deref().and_then(|r| r.stop_signal.as_ref()).map(|s| s.time.ns());
                [live, ended]
            })
            .flatten()
            .filter(|time| (earliest..=stop_time).contains(time))
            .min();
        let Some(began) = began else { return };
        if let Some(instance) = self.instances.get_mut(cgroup_id) {
            instance.termination.on_sidecar_turn(SidecarTurn { waited_ns: stop_time - began, pod_grace_ns });
        }
    }

    /// Without the pod spec, marks init containers running beside a main container of their pod as sidecars.
    pub(super) fn recognise_sidecars(&mut self, pod_uid: &str) {
        // With the pod spec, sidecars are what it declares (set when it is applied).
        if self.pods.contains_key(pod_uid) {
            return;
        }
        let in_pod = |u: &Unit| matches!(&u.key, UnitKey::Container { pod_uid: p, .. } if p == pod_uid);
        let running = |u: &Unit| matches!(u.status.state(), ContainerState::Running { .. });
        let main_running = self.units.values().any(|u| in_pod(u) && !u.init_container && running(u));
        if !main_running {
            return;
        }
        for unit in self.units.changing(|u| in_pod(u) && u.init_container && running(u) && !u.sidecar) {
            unit.sidecar = true;
        }
    }
}
