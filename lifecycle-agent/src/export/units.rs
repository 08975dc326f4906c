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
//! containers do not change. So each unit's samples are kept with what they were written from:
//! the model's `Arc` of the unit and the kernel's live counters of its cgroup. The samples are a
//! function of those two and the boot-to-Unix offset (`unit_text.rs`: `UnitView` holds everything
//! they say, none of it time-dependent), and the model replaces a unit's `Arc` whenever it changes
//! it (`NodeSnapshot::shared_units`), so a unit is written again exactly when one of the three
//! moved and reuse can never serve a stale value. Comparing the whole view instead (as before)
//! was a third of a scrape's CPU (BENCHMARKS.md). The kept samples are the last scrape's own
//! text: unchanged neighbours are copied from it family by family, one copy per run of them.

use std::{collections::HashMap, fmt::Write as _, sync::Arc};

use parking_lot::Mutex;

use tokio::sync::watch;

use lifecycle_common::CgroupCounters;

use super::{
    families::AgentFamily,
    histogram::{TerminationHistograms, GRACE_RATIO_BUCKETS, TERMINATION_BUCKETS},
    metrics::{ScrapeText, TextSource},
    unit_text::{new_families, write_unit, Families, Labels, UnitView, F, FAMILY_COUNT},
};
use crate::model::node::{DroppedCounts, Judgement, NodeSnapshot, Unit, UnitKey};

/// Source of the kernel's per-cgroup counters (the sensor's map, or a fake in tests).
pub trait KernelCounters: Send + Sync {
    /// The live counters of every cgroup the kernel has an entry for, read at once into `into`
    /// (empty; kept from scrape to scrape so its memory is reused).
    fn read_all(&self, into: &mut LiveCounters);
}

/// The kernel's counters of every cgroup, as one scrape read them. The values lie in a list and
/// the map holds positions: a map of the values themselves (a few hundred bytes each, at the
/// map's spare capacity) held about twice the memory for a thousand cgroups.
#[derive(Default)]
pub struct LiveCounters {
    positions: HashMap<u64, u32>,
    values: Vec<CgroupCounters>,
}

impl LiveCounters {
    /// Records a cgroup's counters; a second record of the same cgroup replaces the first.
    pub fn insert(&mut self, cgroup_id: u64, counters: CgroupCounters) {
        match self.positions.get(&cgroup_id).and_then(|at| self.values.get_mut(*at as usize)) {
            Some(kept) => *kept = counters,
            None => {
                let Ok(at) = u32::try_from(self.values.len()) else { return };
                self.positions.insert(cgroup_id, at);
                self.values.push(counters);
            }
        }
    }

    /// The counters of a cgroup, if the kernel had an entry for it.
    pub fn get(&self, cgroup_id: u64) -> Option<&CgroupCounters> {
        self.positions.get(&cgroup_id).and_then(|at| self.values.get(*at as usize))
    }

    fn clear(&mut self) {
        self.positions.clear();
        self.values.clear();
    }
}

/// Writes the per-container families; handed to [`crate::export::metrics::Metrics::add_text_source`].
pub struct UnitMetrics {
    /// The model's published snapshots (`owner.rs`).
    snapshots: watch::Receiver<Arc<NodeSnapshot>>,
    kernel: Arc<dyn KernelCounters>,
    /// The offset that turns a boot time into a Unix time, read at each scrape.
    boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    /// Filled from the tracker's judgements; outlives the units that fed it.
    histograms: Mutex<TerminationHistograms>,
    /// What the last scrape wrote for each unit, and from what.
    cache: Mutex<Cache>,
    /// Whether host cgroups (not containers) get series (`--host-cgroups`).
    host_units: bool,
}

#[derive(Default)]
struct Cache {
    /// The units of the last scrape, in the tracker's unit order.
    units: Vec<CachedUnit>,
    /// The per-container section of the last scrape's text: the unchanged units' samples are
    /// copied from it, family by family, in runs of neighbours (one copy per run instead of one
    /// per unit and family: 30,000 scattered reads at 1,000 units were most of a scrape's own
    /// time under `perf`, BENCHMARKS.md). It is the last answer's own text, shared with it
    /// ([`TextSource::written`]): a copy of its own cost 11-24 % of the scrape of an unchanged
    /// node (`xtask/x.sh bench scrape`, BENCHMARKS.md).
    section: Option<KeptSection>,
    /// Where in the text being written this scrape's section lies, until the finished text is
    /// handed back ([`TextSource::written`]): the units' [`Part`]s already point into it.
    pending: Option<(usize, usize)>,
    /// The samples of the units written afresh in this scrape, family by family.
    fresh: String,
    /// The boot-to-Unix offset the kept samples used (see [`stable_offset`]).
    offset: Option<f64>,
    /// Scratch bodies a changed unit is written into, family by family.
    scratch: Option<Families>,
    /// The kernel's counters, read at each scrape into the same memory.
    live: LiveCounters,
}

impl Cache {
    /// Drops what the next scrape would copy from: every unit is written afresh.
    fn forget(&mut self) {
        self.units.clear();
        self.section = None;
    }
}

/// The per-container section of a finished scrape's text.
struct KeptSection {
    text: Arc<ScrapeText>,
    start: usize,
    end: usize,
}

impl KeptSection {
    fn as_str(&self) -> &str {
        self.text.as_str().get(self.start..self.end).unwrap_or_default()
    }
}

/// A unit of the last scrape: what its samples were written from, and where they are.
struct CachedUnit {
    /// The unit as the model shared it; holding it keeps its address from being reused.
    unit: Arc<Unit>,
    /// The unit's cgroup then (read from the unit only when it changes).
    cgroup_id: Option<u64>,
    /// The kernel's live counters of its cgroup at the time (boxed: a few hundred bytes that
    /// only a changed unit reads).
    live: Option<Box<CgroupCounters>>,
    /// Each family's samples of this unit: in `Cache::section`, or in `Cache::fresh` while
    /// `fresh` (written in this scrape).
    parts: [Part; FAMILY_COUNT],
    fresh: bool,
}

/// Where one family's samples of a unit lie in a text. A scrape's text is bounded far below
/// 4 GiB (`a_thousand_units_beside_a_hostile_one...`: under 4 MB for a thousand units).
#[derive(Clone, Copy, Default)]
struct Part {
    start: u32,
    len: u32,
}

impl CachedUnit {
    fn new(unit: Arc<Unit>) -> Self {
        Self { unit, cgroup_id: None, live: None, parts: [Part::default(); FAMILY_COUNT], fresh: true }
    }

    /// Whether this entry is `unit`'s: the very `Arc` (read without touching the unit), or a
    /// newer one of the same key.
    fn is_for(&self, unit: &Arc<Unit>) -> bool {
        Arc::ptr_eq(&self.unit, unit) || self.unit.key() == unit.key()
    }

    /// The cgroup of `unit`, taken from the entry when it is the very `Arc` it was written from.
    fn cgroup_of(&self, unit: &Arc<Unit>) -> Option<u64> {
        if Arc::ptr_eq(&self.unit, unit) {
            self.cgroup_id
        } else {
            unit.cgroup_id()
        }
    }

    /// Whether the samples were written from this very unit and these counters.
    fn written_from(&self, unit: &Arc<Unit>, live: Option<&CgroupCounters>) -> bool {
        Arc::ptr_eq(&self.unit, unit) && self.live.as_deref() == live
    }

    /// Writes the samples afresh from `unit` and `live` at the end of `fresh`, through the
    /// scratch families (left empty).
    fn rewrite(
        &mut self,
        unit: &Arc<Unit>,
        live: Option<&CgroupCounters>,
        scratch: &mut Families,
        fresh: &mut String,
        boot_to_unix: f64,
    ) {
        self.unit = unit.clone();
        self.cgroup_id = unit.cgroup_id();
        match (&mut self.live, live) {
            (Some(kept), Some(live)) => **kept = *live,
            (kept, live) => *kept = live.map(|live| Box::new(*live)),
        }
        write_unit(scratch, &UnitView::of(&self.unit, boot_to_unix, live));
        for (part, family) in self.parts.iter_mut().zip(scratch.0.iter_mut()) {
            *part = Part { start: offset(fresh.len()), len: offset(family.body.len()) };
            fresh.push_str(&family.body);
            family.body.clear();
        }
        self.fresh = true;
    }
}

/// The capacity the fresh samples' buffer keeps between scrapes: about sixty changed units'.
const FRESH_KEPT_BYTES: usize = 64 * 1024;

/// A position in a scrape's text (see [`Part`]).
fn offset(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

/// Copies the units' samples of one family into `out`, each run of samples that lay side by side
/// in the same text with one copy, and notes where each unit's samples now are.
fn copy_family(out: &mut String, base: usize, family: usize, units: &mut [CachedUnit], section: &str, fresh: &str) {
    // The run being gathered: its text (fresh or not), its range there, where it goes in `out`.
    let mut run: Option<(bool, usize, usize, usize)> = None;
    let flush = |out: &mut String, run: Option<(bool, usize, usize, usize)>| {
        if let Some((from_fresh, start, end, _)) = run {
            out.push_str((if from_fresh { fresh } else { section }).get(start..end).unwrap_or_default());
        }
    };
    for unit in units {
        let part = &mut unit.parts[family];
        if part.len == 0 {
            continue;
        }
        let (start, len) = (part.start as usize, part.len as usize);
        let at = match &mut run {
            Some((from_fresh, run_start, run_end, to)) if *from_fresh == unit.fresh && *run_end == start => {
                *run_end += len;
                *to + (start - *run_start)
            }
            _ => {
                flush(out, run);
                run = Some((unit.fresh, start, start + len, out.len()));
                out.len()
            }
        };
        part.start = offset(at - base);
    }
    flush(out, run);
}

impl UnitMetrics {
    pub fn new(
        snapshots: watch::Receiver<Arc<NodeSnapshot>>,
        kernel: Arc<dyn KernelCounters>,
        boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    ) -> Self {
        Self {
            snapshots,
            kernel,
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

    /// Adds judged terminations to the distributions: the model's owner hands every command's
    /// judgements here (`owner.rs`, a sink) before it publishes the snapshot that shows them, so
    /// a scrape never sees a judged stop without its distributions.
    pub fn record_judgements(&self, judged: Vec<Judgement>) {
        if !judged.is_empty() {
            self.histograms.lock().record(judged);
        }
    }

    /// Whether a unit gets series (host cgroups only with `--host-cgroups`).
    fn shown(&self, unit: &Unit) -> bool {
        self.host_units || !matches!(unit.key(), UnitKey::Host { .. })
    }

    /// Whether the snapshot shows the same units, in the same order, as the kept list: then the
    /// list is updated in place (a new one each scrape, a few hundred kilobytes at 1,000 units,
    /// was mapped and unmapped every time, or kept twice).
    fn same_units(&self, kept: &[CachedUnit], snapshot: &NodeSnapshot) -> bool {
        let mut kept = kept.iter();
        for unit in snapshot.shared_units() {
            match kept.as_slice().first() {
                Some(cached) if cached.is_for(unit) => {
                    kept.next();
                }
                _ if !self.shown(unit) => {}
                _ => return false,
            }
        }
        kept.next().is_none()
    }

    /// Appends every per-container family to `out`. The next scrape copies the unchanged
    /// units' samples from this one's only once the finished text is handed back
    /// ([`TextSource::written`]); without it, it writes every unit afresh.
    pub fn render(&self, out: &mut String) {
        let mut cache = self.cache.lock();
        if cache.pending.take().is_some() {
            // The last scrape's text never came back: its units' parts point into nothing kept.
            cache.forget();
        }
        // The kernel's map, read once per scrape into the kept map.
        let mut live = std::mem::take(&mut cache.live);
        live.clear();
        self.kernel.read_all(&mut live);
        let kept_offset = cache.offset;
        let boot_to_unix = stable_offset(&mut cache.offset, (self.boot_to_unix)());
        // A new offset moves every terminated unit's timestamp: nothing is reused then.
        let offset_kept = kept_offset == Some(boot_to_unix);
        let mut scratch = cache.scratch.take().unwrap_or_else(new_families);
        let mut fresh = std::mem::take(&mut cache.fresh);
        fresh.clear();
        let snapshot = self.snapshots.borrow().clone();
        let dropped = *snapshot.dropped();
        // Brings one kept unit up to date: its samples are written again unless they were written
        // from this very unit and these counters.
        let mut refresh = |cached: &mut CachedUnit, unit: &Arc<Unit>, cgroup_id: Option<u64>, new: bool| {
            let counters = cgroup_id.and_then(|id| live.get(id));
            if new || !offset_kept || !cached.written_from(unit, counters) {
                cached.rewrite(unit, counters, &mut scratch, &mut fresh, boot_to_unix);
            }
        };
        let mut units = std::mem::take(&mut cache.units);
        if self.same_units(&units, &snapshot) {
            // The usual scrape: the units of the last one, in the same order, updated where they
            // are. An unchanged unit (the same `Arc`) is not even read: at 1,000 units, reading
            // each one was a cache miss apiece.
            let mut kept = units.iter_mut().peekable();
            for unit in snapshot.shared_units() {
                // No entry: a unit without series (`same_units` checked).
                if let Some(cached) = kept.next_if(|cached| cached.is_for(unit)) {
                    let cgroup_id = cached.cgroup_of(unit);
                    refresh(cached, unit, cgroup_id, false);
                }
            }
        } else {
            // Units came or went: both sequences are in unit-key order, and a merge keeps the
            // entries of the units still here.
            let mut previous = units.into_iter().peekable();
            units = Vec::with_capacity(previous.len() + 1);
            for unit in snapshot.shared_units().filter(|u| self.shown(u)) {
                while previous.next_if(|cached| cached.unit.key() < unit.key()).is_some() {}
                let (mut cached, new) = match previous.next_if(|cached| cached.unit.key() == unit.key()) {
                    Some(cached) => (cached, false),
                    None => (CachedUnit::new(unit.clone()), true),
                };
                refresh(&mut cached, unit, unit.cgroup_id(), new);
                units.push(cached);
            }
        }
        cache.scratch = Some(scratch);
        cache.live = live;

        let mut shared = new_families();
        let histograms = self.histograms.lock();
        for ((namespace, outcome), h) in &histograms.durations {
            let labels = Labels::new(&[("namespace", namespace)]);
            shared.histogram(F::Duration, &labels, &[("outcome", outcome.as_str())], &TERMINATION_BUCKETS, h);
        }
        for (namespace, h) in &histograms.grace_used {
            let labels = Labels::new(&[("namespace", namespace)]);
            shared.histogram(F::GraceUsed, &labels, &[], &GRACE_RATIO_BUCKETS, h);
        }
        drop(histograms);
        let base = out.len();
        for (index, family) in shared.0.iter().enumerate() {
            // A family no unit has a sample of is left out: its header is taken back.
            let header_at = out.len();
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
            let samples_at = out.len();
            let section = cache.section.as_ref().map_or("", KeptSection::as_str);
            copy_family(out, base, index, &mut units, section, &fresh);
            out.push_str(&family.body);
            if out.len() == samples_at {
                out.truncate(header_at);
            }
        }
        for unit in &mut units {
            unit.fresh = false;
        }
        // What the next scrape copies from (kept once the text is finished, `written`); the fresh
        // samples' buffer is kept small (all of them are fresh at the first scrape).
        cache.pending = Some((base, out.len()));
        fresh.clear();
        fresh.shrink_to(FRESH_KEPT_BYTES);
        cache.fresh = fresh;
        cache.units = units;
        write_dropped(out, &dropped);
    }
}

impl TextSource for UnitMetrics {
    fn write(&self, out: &mut String) {
        self.render(out);
    }

    fn written(&self, text: &Arc<ScrapeText>) {
        let mut cache = self.cache.lock();
        let Some((start, end)) = cache.pending.take() else { return };
        if text.as_str().get(start..end).is_some() {
            cache.section = Some(KeptSection { text: text.clone(), start, end });
        } else {
            // Not the text `render` wrote into: nothing of it can be reused.
            cache.forget();
        }
    }
}

/// The sink of the model's judgements (`owner.rs`).
impl crate::owner::JudgementSink for UnitMetrics {
    fn record_judgements(&self, judged: Vec<Judgement>) {
        UnitMetrics::record_judgements(self, judged);
    }
}

#[cfg(test)]
impl UnitMetrics {
    /// Appends one scrape to `text` as the registry makes it: written, then handed back finished
    /// (a copy), so that the next scrape reuses this one's text.
    pub(crate) fn scrape_into(&self, text: &mut String) {
        self.write(text);
        self.written(&ScrapeText::unpooled(text.clone()));
    }
}

/// The agent's families (not per container) that the unit text writes itself, from the model's
/// snapshot, instead of a registered collector: [`write_dropped`]'s. Read by the test of the
/// registrations (`agent/families.rs`), which leaves them out of the registry's.
#[cfg(test)]
pub(crate) const AGENT_FAMILIES_WRITTEN: &[AgentFamily] = &[AgentFamily::StateDropped];

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
// agent, `owner.rs`) are not what they examine.
#[cfg(test)]
#[expect(unused_must_use, reason = "the tests examine the text, not the outcomes")]
#[path = "units_tests.rs"]
mod tests;
