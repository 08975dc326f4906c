//! Per-container metrics, written at scrape time from the tracker's units and the kernel's
//! per-cgroup counters. Label names are kube-state-metrics' (namespace, pod, container, uid) so
//! series join.
//!
//! These families are the high-cardinality ones (tens of series per container, thousands of
//! containers per node), so they are written straight into the exposition text instead of going
//! through the registry's protobuf-shaped model, which allocates per label pair. Distributions
//! (termination durations, grace used) are histograms per namespace and outcome, bounded whatever
//! the pod count; each container's own last value is a gauge beside them.
//!
//! A scrape of 1,000 containers must stay within a few milliseconds, and between two scrapes most
//! containers do not change. So each unit's text is kept with the `UnitView` it was written from
//! (`unit_text.rs`: everything the text says and nothing else) and written again only when the view
//! differs. The text is a function of the view alone, so reuse can never serve a stale value.

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{Arc, Mutex},
};

use tokio::sync::watch;

use lifecycle_common::CgroupCounters;

use super::{
    families::AgentFamily,
    histogram::{TerminationHistograms, GRACE_RATIO_BUCKETS, TERMINATION_BUCKETS},
    unit_text::{new_families, write_unit, Families, Labels, UnitView, F, FAMILY_COUNT},
};
use crate::model::node::{DroppedCounts, Judgement, NodeSnapshot, UnitKey};

/// Source of the kernel's per-cgroup counters (the sensor's map, or a fake in tests).
pub trait KernelCounters: Send + Sync {
    /// The live counters of every cgroup the kernel has an entry for, read at once into `into`
    /// (empty; kept from scrape to scrape so its memory is reused).
    fn read_all(&self, into: &mut HashMap<u64, CgroupCounters>);
}

/// Writes the per-container families; handed to [`crate::export::metrics::Metrics::add_text_source`].
pub struct UnitMetrics {
    /// The model's published snapshots (`agent/owner.rs`).
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
    kernel: Arc<dyn KernelCounters>,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The offset that turns a boot time into a Unix time, read at each scrape.
    boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    /// Filled from the tracker's judgements; outlives the units that fed it.
    histograms: Mutex<TerminationHistograms>,
    /// Each unit's text from the last scrape, in the tracker's unit order.
    cache: Mutex<Cache>,
    /// Whether host cgroups (not containers) get series (`--host-cgroups`).
    host_units: bool,
}

#[derive(Default)]
struct Cache {
    /// Boxed: an entry is about a kilobyte, and a scrape moves every entry from one list to the
    /// next (unboxed, those moves were most of a scrape's copying).
    #[expect(clippy::vec_box, reason = "entries move between lists at every scrape")]
    units: Vec<Box<CachedUnit>>,
    /// The boot-to-Unix offset the cached texts used (see [`stable_offset`]).
    offset: Option<f64>,
    /// Scratch bodies a changed unit is written into, family by family.
    scratch: Option<Families>,
    /// The kernel's counters, read at each scrape into the same map.
    live: HashMap<u64, CgroupCounters>,
}

/// One unit's text, family by family, and what it was written from.
struct CachedUnit {
    key: UnitKey,
    view: UnitView<'static>,
    text: String,
    /// Family `f`'s part is `text[ends[f - 1]..ends[f]]` (from 0 for the first).
    ends: [usize; FAMILY_COUNT],
}

impl CachedUnit {
    fn new(key: UnitKey, view: UnitView<'static>) -> Self {
        Self { key, view, text: String::new(), ends: [0; FAMILY_COUNT] }
    }

    /// Writes the text afresh from the view, through the scratch families (left empty).
    fn write(&mut self, scratch: &mut Families) {
        write_unit(scratch, &self.view);
        self.text.clear();
        for (index, family) in scratch.0.iter_mut().enumerate() {
            self.text.push_str(&family.body);
            family.body.clear();
            self.ends[index] = self.text.len();
        }
    }

    fn part(&self, family: usize) -> &str {
        let start = if family == 0 { 0 } else { self.ends[family - 1] };
        &self.text[start..self.ends[family]]
    }
}

impl UnitMetrics {
    pub fn new(
        snapshots: watch::Receiver<Arc<NodeSnapshot>>,
        kernel: Arc<dyn KernelCounters>,
        clock: Box<dyn Fn() -> u64 + Send + Sync>,
        boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    ) -> Self {
        Self {
            snapshots,
            kernel,
            clock,
            boot_to_unix,
            histograms: Mutex::new(TerminationHistograms::default()),
            cache: Mutex::new(Cache::default()),
            host_units: true,
        }
    }

    /// No series for host cgroups: on a Kubernetes node only containers are of interest.
    pub(crate) fn without_host_units(mut self) -> Self {
        self.host_units = false;
        self
    }

    /// Adds judged terminations to the distributions: the model's owner routes every change's
    /// judgements here (`agent/owner.rs`) before it publishes the snapshot that shows them, so a
    /// scrape never sees a judged stop without its distributions.
    pub fn record_judgements(&self, judged: Vec<Judgement>) {
        if !judged.is_empty() {
            self.histograms.lock().unwrap_or_else(|poison| poison.into_inner()).record(judged);
        }
    }

    /// Appends every per-container family to `out`.
    pub fn render(&self, out: &mut String) {
        let now = (self.clock)();
        let mut cache = self.cache.lock().unwrap_or_else(|poison| poison.into_inner());
        // The kernel's map, read once per scrape into the kept map.
        let mut live = std::mem::take(&mut cache.live);
        live.clear();
        self.kernel.read_all(&mut live);
        let boot_to_unix = stable_offset(&mut cache.offset, (self.boot_to_unix)());
        let mut scratch = cache.scratch.take().unwrap_or_else(new_families);
        let mut previous = std::mem::take(&mut cache.units).into_iter().peekable();
        // (entry, whether its text must be written from its new view)
        let mut units: Vec<(Box<CachedUnit>, bool)> = Vec::with_capacity(previous.len());
        let dropped;
        {
            let snapshot = self.snapshots.borrow().clone();
            dropped = *snapshot.dropped();
            // Both sequences are in unit-key order: a merge keeps the entries of units still here.
            for unit in snapshot.units().filter(|u| self.host_units || !matches!(u.key(), UnitKey::Host { .. })) {
                while previous.next_if(|cached| cached.key < *unit.key()).is_some() {}
                let cached = previous.next_if(|cached| cached.key == *unit.key());
                let view = UnitView::of(unit, now, boot_to_unix, unit.cgroup_id().and_then(|id| live.get(&id)));
                units.push(match cached {
                    Some(cached) if cached.view == view => (cached, false),
                    Some(mut cached) => {
                        cached.view = view.into_owned();
                        (cached, true)
                    }
                    None => (Box::new(CachedUnit::new(unit.key().clone(), view.into_owned())), true),
                });
            }
        }
        cache.units = units
            .into_iter()
            .map(|(mut cached, stale)| {
                if stale {
                    cached.write(&mut scratch);
                }
                cached
            })
            .collect();
        cache.scratch = Some(scratch);
        cache.live = live;

        let mut shared = new_families();
        let histograms = self.histograms.lock().unwrap_or_else(|poison| poison.into_inner());
        for ((namespace, outcome), h) in &histograms.durations {
            let labels = Labels::new(&[("namespace", namespace)]);
            shared.histogram(F::Duration, &labels, &[("outcome", outcome.as_str())], &TERMINATION_BUCKETS, h);
        }
        for (namespace, h) in &histograms.grace_used {
            let labels = Labels::new(&[("namespace", namespace)]);
            shared.histogram(F::GraceUsed, &labels, &[], &GRACE_RATIO_BUCKETS, h);
        }
        drop(histograms);
        for (index, family) in shared.0.iter().enumerate() {
            if family.body.is_empty() && cache.units.iter().all(|u| u.part(index).is_empty()) {
                continue;
            }
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
            for unit in &cache.units {
                out.push_str(unit.part(index));
            }
            out.push_str(&family.body);
        }
        write_dropped(out, &dropped);
    }
}

/// `lifecycle_state_dropped_total{kind}`: what the model dropped to stay within its bounds,
/// every kind from the start (a zero is an answer: nothing was dropped).
fn write_dropped(out: &mut String, dropped: &DroppedCounts) {
    let family = AgentFamily::StateDropped.family();
    let name = family.name;
    let _ = writeln!(out, "# HELP {name} {}", family.help);
    let _ = writeln!(out, "# TYPE {name} {}", family.kind.as_str());
    for (kind, count) in dropped.iter() {
        let _ = writeln!(out, "{name}{{kind=\"{}\"}} {count}", kind.as_str());
    }
}

/// The boot-to-Unix offset for this scrape: the previous one unless the clocks moved apart by more
/// than a millisecond (NTP steps, suspend). Read fresh, it differs by microseconds from scrape to
/// scrape, which would make every terminated unit's view new and its timestamp jitter.
fn stable_offset(kept: &mut Option<f64>, now: f64) -> f64 {
    match kept {
        Some(offset) if (*offset - now).abs() <= 1e-3 => *offset,
        _ => *kept.insert(now),
    }
}

// The tests feed the tracker events for the state they then render; the outcomes (routed by the
// agent, `agent/owner.rs`) are not what they examine.
#[cfg(test)]
#[allow(unused_must_use)]
#[path = "units_tests.rs"]
mod tests;
