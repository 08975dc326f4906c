//! The parts of the node model that snapshots share with the tracker: units, pods and the
//! history, each held behind an `Arc` and copied on write.
//!
//! A snapshot (`snapshot.rs`) takes an `Arc` of each unit, of the pod table and of the history,
//! so publishing one costs a pointer copy per unit. The tracker keeps changing its own copy:
//! writing to a part a snapshot still holds copies that part first (`Arc::make_mut`), so a
//! batch copies the few units it touched, not the node. The rare node-wide change
//! ([`Units::values_mut`]) copies every unit a snapshot holds; the changes that touch a few
//! units pick them first ([`Units::changing`]).

use std::{
    collections::{btree_map, BTreeMap, HashMap},
    sync::Arc,
};

use super::{Unit, UnitKey};
use crate::spec::PodFacts;

/// The node's units by key (see the module header).
#[derive(Default)]
pub(super) struct Units {
    map: BTreeMap<UnitKey, Arc<Unit>>,
    /// Handed out to each unit taken to be changed ([`Unit::version`]): never repeats, so a
    /// reader that keeps a unit's version (not the unit) knows whether it is still the same.
    versions: u64,
}

/// Gives `unit` the next version from `versions`.
fn stamp<'a>(versions: &mut u64, unit: &'a mut Arc<Unit>) -> &'a mut Unit {
    *versions += 1;
    let unit = Arc::make_mut(unit);
    unit.version = *versions;
    unit
}

impl Units {
    pub(super) fn get(&self, key: &UnitKey) -> Option<&Unit> {
        self.map.get(key).map(|unit| &**unit)
    }

    /// The unit, to change: copied first if a snapshot holds it.
    pub(super) fn get_mut(&mut self, key: &UnitKey) -> Option<&mut Unit> {
        let versions = &mut self.versions;
        self.map.get_mut(key).map(|unit| stamp(versions, unit))
    }

    /// The unit of `key`, made by `new` if there is none.
    pub(super) fn get_or_insert_with(&mut self, key: &UnitKey, new: impl FnOnce() -> Unit) -> &mut Unit {
        stamp(&mut self.versions, self.map.entry(key.clone()).or_insert_with(|| Arc::new(new())))
    }

    pub(super) fn keys(&self) -> btree_map::Keys<'_, UnitKey, Arc<Unit>> {
        self.map.keys()
    }

    /// Every unit, in key order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Unit> {
        self.map.values().map(|unit| &**unit)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&UnitKey, &Unit)> {
        self.map.iter().map(|(key, unit)| (key, &**unit))
    }

    /// Every unit, to change: copies each one a snapshot holds (a node-wide change: rare).
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Unit> {
        let versions = &mut self.versions;
        self.map.values_mut().map(move |unit| stamp(versions, unit))
    }

    /// The units `wanted` picks, to change: only those are copied.
    pub(super) fn changing(&mut self, wanted: impl Fn(&Unit) -> bool) -> impl Iterator<Item = &mut Unit> {
        let versions = &mut self.versions;
        self.map.values_mut().filter(move |unit| wanted(unit)).map(move |unit| stamp(versions, unit))
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&UnitKey, &Unit) -> bool) {
        self.map.retain(|key, unit| keep(key, unit));
    }

    pub(super) fn remove(&mut self, key: &UnitKey) -> Option<Unit> {
        self.map.remove(key).map(Arc::unwrap_or_clone)
    }

    /// Every unit, shared (for a snapshot), in key order.
    pub(super) fn shared(&self) -> impl Iterator<Item = &Arc<Unit>> {
        self.map.values()
    }
}

/// The pods the API told about, by uid: the table and each pod shared with snapshots.
#[derive(Clone, Default)]
pub(super) struct Pods(Arc<HashMap<String, Arc<PodFacts>>>);

impl Pods {
    pub(super) fn get(&self, uid: &str) -> Option<&PodFacts> {
        self.0.get(uid).map(|pod| &**pod)
    }

    /// The pod, to change: the table and the pod are copied first if a snapshot holds them.
    pub(super) fn get_mut(&mut self, uid: &str) -> Option<&mut PodFacts> {
        Arc::make_mut(&mut self.0).get_mut(uid).map(Arc::make_mut)
    }

    pub(super) fn insert(&mut self, uid: String, pod: PodFacts) {
        Arc::make_mut(&mut self.0).insert(uid, Arc::new(pod));
    }

    pub(super) fn remove(&mut self, uid: &str) {
        if self.0.contains_key(uid) {
            Arc::make_mut(&mut self.0).remove(uid);
        }
    }

    pub(super) fn contains_key(&self, uid: &str) -> bool {
        self.0.contains_key(uid)
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}
