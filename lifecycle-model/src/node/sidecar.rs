//! Sidecars: init containers that keep running beside the main containers, and the order in
//! which a pod's termination stopped them.

use std::collections::{BTreeMap, HashMap};

use super::{NodeSnapshot, NodeTracker, Unit, UnitKey};
use crate::{
    container_state::ContainerState,
    termination::{sidecar_order, SidecarOrder},
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

impl NodeTracker {
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
