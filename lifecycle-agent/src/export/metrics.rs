//! Prometheus exposition: one registry, passed explicitly, and collectors that read kernel maps
//! at scrape time (the kernel's counters are the source of truth; nothing is copied on a timer).

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use parking_lot::Mutex;

use bytes::Bytes;

use lifecycle_common::{EventKind, KindStats, EVENT_KIND_COUNT};

use super::families::AgentFamily;
use prometheus::{
    core::{Collector, Desc},
    proto::MetricFamily,
    CounterVec, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Metric name prefix.
pub(crate) const NAMESPACE: &str = "lifecycle";

/// A labelled family made with `new` from its entry in `families.rs` (name, help and labels).
pub(crate) fn vec_of<T>(
    family: AgentFamily,
    new: impl FnOnce(Opts, &[&str]) -> Result<T, prometheus::Error>,
) -> Result<T, prometheus::Error> {
    let family = family.family();
    new(family.opts(), family.labels)
}

/// What the exporters read of the kernel's own statistics at scrape time (the sensor's maps, or
/// a fake in tests).
pub(crate) trait KernelStats: Send + Sync {
    /// Records submitted, lost and refused per event kind, summed over CPUs.
    fn kind_stats(&self) -> [KindStats; EVENT_KIND_COUNT];
    /// Entries in use in the per-cgroup counter map.
    fn counter_entries(&self) -> usize;
    /// Each program's runs and time, when the kernel accounts them.
    fn program_costs(&self) -> Vec<crate::kernel::ProgramCost> {
        Vec::new()
    }
    /// The agent's own CPU time (seconds, user and system) and resident memory (bytes).
    fn own_usage(&self) -> Option<(f64, u64)> {
        None
    }
}

/// One kernel feature's state, for `lifecycle_feature_enabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FeatureFlag {
    /// The feature's label value.
    pub name: &'static str,
    /// Attached or not.
    pub enabled: bool,
}

/// The runtime connection's health: whether the CRI socket answers, how often asking failed, and
/// when it last answered (so `time() - ...` says how long metadata has been missing).
#[derive(Clone)]
pub(crate) struct RuntimeMetrics {
    up: IntGauge,
    failures: IntCounter,
    last_success: Gauge,
}

impl RuntimeMetrics {
    /// Registers the three series.
    pub(crate) fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let up = IntGauge::with_opts(AgentFamily::RuntimeUp.family().opts())?;
        let failures = IntCounter::with_opts(AgentFamily::RuntimeFailures.family().opts())?;
        let last_success = Gauge::with_opts(AgentFamily::RuntimeLastSuccess.family().opts())?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(last_success.clone()))?;
        Ok(Self { up, failures, last_success })
    }

    /// The runtime answered.
    pub(crate) fn succeeded(&self) {
        self.up.set(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_success.set(now.as_secs_f64());
    }

    /// Asking the runtime failed.
    pub(crate) fn failed(&self) {
        self.up.set(0);
        self.failures.inc();
    }
}

/// Agent-side counters that the kernel does not keep.
#[derive(Debug, Default)]
pub(crate) struct AgentCounters {
    /// Ring records that could not be decoded.
    pub decode_errors: AtomicU64,
    /// Records read from the ring.
    pub events_read: AtomicU64,
}

/// Writes families straight into the exposition text (for high-cardinality families).
pub trait TextSource: Send + Sync {
    /// Appends its families to `out`, the scrape's text in the making.
    fn write(&self, out: &mut String);

    /// The scrape's finished text, once every source wrote into it and before the answer is sent:
    /// a source that reuses what it wrote last time keeps its part of this, shared with the
    /// answer, instead of a copy of its own (`export/units.rs`). Not called when the scrape was
    /// not finished; a source then must not rely on its last part.
    fn written(&self, _text: &Arc<ScrapeText>) {}
}

impl<T: TextSource + ?Sized> TextSource for Arc<T> {
    fn write(&self, out: &mut String) {
        (**self).write(out);
    }

    fn written(&self, text: &Arc<ScrapeText>) {
        (**self).written(text);
    }
}

/// The registry and what feeds it.
pub struct Metrics {
    registry: Registry,
    text_sources: Vec<Box<dyn TextSource>>,
    /// Which families are served (`--metric-allowlist`, `--metric-denylist`).
    families: FamilyFilter,
    /// A finished scrape's buffer, back once nothing holds its text (see [`ScrapeText`]).
    spare: Arc<Mutex<Option<Vec<u8>>>>,
    /// Scrape texts alive (being sent, the newest, or kept by a text source), and the newest:
    /// past [`MAX_BODIES_IN_FLIGHT`] scrapes share the newest instead of each getting a copy.
    bodies: Arc<std::sync::atomic::AtomicUsize>,
    newest: Mutex<Option<Bytes>>,
}

/// Scrape bodies alive at once at most. A body is the whole answer (2.6 MB for 1,000
/// containers) and lives until its reader has taken it: clients that read slowly, each with a
/// copy, once took the agent past its memory limit (issue 18). Past the bound, a scrape gets the
/// newest body (at most as old as the slow reads in flight), shared, not a new one.
pub(crate) const MAX_BODIES_IN_FLIGHT: usize = 4;

/// A scrape's text, whose buffer goes back to the spare slot once nothing holds it any more:
/// neither the HTTP stack sending it nor a text source that kept its part for the next scrape.
/// A fresh buffer per scrape (2.6 MB for 1,000 containers) cost ~650 page faults each time, and
/// about half of a 4 ms scrape together with the heap trim that follows large answers
/// (`xtask/x.sh bench scrape`, BENCHMARKS.md "Scrape").
pub struct ScrapeText {
    text: String,
    /// Where the buffer goes back to; none for a text made from another (a filtered answer).
    home: Option<Arc<Mutex<Option<Vec<u8>>>>>,
    alive: Arc<std::sync::atomic::AtomicUsize>,
}

impl ScrapeText {
    /// The whole text of the scrape: every source's families, then the registry's.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// A finished text of no registry, for tests of a text source.
    #[cfg(test)]
    pub(crate) fn unpooled(text: String) -> Arc<Self> {
        Arc::new(Self { text, home: None, alive: Default::default() })
    }
}

impl Drop for ScrapeText {
    fn drop(&mut self) {
        if let Some(home) = &self.home {
            let mut bytes = std::mem::take(&mut self.text).into_bytes();
            bytes.clear();
            *home.lock() = Some(bytes);
        }
        self.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A scrape's text as an answer's bytes, shared with whoever else keeps it.
struct SharedText(Arc<ScrapeText>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.text.as_bytes()
    }
}

/// Why metrics could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Two collectors claimed the same metric, or a name was invalid.
    #[error("metric registration failed")]
    Register(#[from] prometheus::Error),
}

impl Metrics {
    /// Registers the agent-health metrics: per-kind delivery and loss read from the kernel, the
    /// feature switchboard, and build info.
    pub(crate) fn new(
        maps: Arc<dyn KernelStats>,
        features: &[FeatureFlag],
        counter_capacity: u32,
        ring_bytes: u32,
        agent: Arc<AgentCounters>,
    ) -> Result<Self, MetricsError> {
        let registry = Registry::new();

        let enabled = vec_of(AgentFamily::FeatureEnabled, IntGaugeVec::new)?;
        for state in features {
            enabled.with_label_values(&[state.name]).set(i64::from(state.enabled));
        }
        registry.register(Box::new(enabled))?;

        let build = vec_of(AgentFamily::BuildInfo, IntGaugeVec::new)?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;

        let ring = IntGauge::with_opts(AgentFamily::RingBufferBytes.family().opts())?;
        ring.set(i64::from(ring_bytes));
        registry.register(Box::new(ring))?;

        registry.register(Box::new(KernelStatsCollector::new(maps, counter_capacity, agent)?))?;
        Ok(Self {
            registry,
            text_sources: Vec::new(),
            families: FamilyFilter::default(),
            spare: Default::default(),
            bodies: Default::default(),
            newest: Mutex::new(None),
        })
    }

    /// A registry with nothing registered, for collectors that do not need the sensor (benches,
    /// tests of the per-container metrics).
    pub fn bare() -> Self {
        Self {
            registry: Registry::new(),
            text_sources: Vec::new(),
            families: FamilyFilter::default(),
            spare: Default::default(),
            bodies: Default::default(),
            newest: Mutex::new(None),
        }
    }

    /// The registry, for modules that add their own collectors.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Serves only the families `filter` lets through.
    pub(crate) fn set_family_filter(&mut self, filter: FamilyFilter) {
        self.families = filter;
    }

    /// Adds families written directly as text (before the registry's).
    pub fn add_text_source(&mut self, source: Box<dyn TextSource>) {
        self.text_sources.push(source);
    }

    /// Text exposition format, version 0.0.4.
    pub(crate) fn render(&self) -> Bytes {
        let mut newest = self.newest.lock();
        if self.bodies.load(Ordering::Acquire) >= MAX_BODIES_IN_FLIGHT {
            if let Some(shared) = newest.as_ref() {
                return shared.clone();
            }
        }
        // Let go of the newest first: when no reader holds it, its buffer comes back as the
        // spare below.
        *newest = None;
        // A finished scrape's buffer once nothing holds it (sized by it), else a new one. The last
        // scrape's text is still kept by the per-container source, so two buffers take turns;
        // concurrent scrapes each get one, and the last to be let go is kept.
        let spare = self.spare.lock().take();
        let mut text =
            spare.map(String::from_utf8).and_then(Result::ok).unwrap_or_else(|| String::with_capacity(64 * 1024));
        // The text sources first: the per-container families read the kernel's counter map, and
        // the registry's collector then takes the map's entry count from that read instead of
        // reading it again (`SensorMaps::counter_entries`). The format puts no order on families.
        for source in &self.text_sources {
            source.write(&mut text);
        }
        // Encoding into a String cannot fail on I/O; a collector error leaves what was written.
        let _ = TextEncoder::new().encode_utf8(&self.registry.gather(), &mut text);
        let text = self.counted(text, Some(self.spare.clone()));
        for source in &self.text_sources {
            source.written(&text);
        }
        let body = if self.families.is_everything() {
            Bytes::from_owner(SharedText(text))
        } else {
            Bytes::from_owner(SharedText(self.counted(self.families.apply(text.as_str()), None)))
        };
        *newest = Some(body.clone());
        body
    }

    /// `text` as a counted scrape text whose buffer goes back to `home`.
    fn counted(&self, text: String, home: Option<Arc<Mutex<Option<Vec<u8>>>>>) -> Arc<ScrapeText> {
        self.bodies.fetch_add(1, Ordering::AcqRel);
        Arc::new(ScrapeText { text, home, alive: self.bodies.clone() })
    }
}

/// Which metric families a scrape gets, by name: `name` or a `prefix*`. Empty allow list: all.
/// The deny list wins. Applied to the finished text (families are contiguous in it, each
/// opened by its `# HELP`), so every family is covered, registered or written as text: one
/// pass, only when a list is given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyFilter {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl FamilyFilter {
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> Self {
        Self { allow, deny }
    }

    fn is_everything(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether family `name` is served.
    pub(crate) fn serves(&self, name: &str) -> bool {
        let matches = |pattern: &String| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pattern,
        };
        (self.allow.is_empty() || self.allow.iter().any(matches)) && !self.deny.iter().any(matches)
    }

    fn apply(&self, text: &str) -> String {
        let mut kept = String::with_capacity(text.len());
        let mut serving = true;
        for line in text.split_inclusive('\n') {
            if let Some(rest) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
                serving = self.serves(rest.split_whitespace().next().unwrap_or_default());
            }
            if serving {
                kept.push_str(line);
            }
        }
        kept
    }
}

/// Reads the kernel's per-kind statistics and the counters map's fill at scrape time.
struct KernelStatsCollector {
    maps: Arc<dyn KernelStats>,
    agent: Arc<AgentCounters>,
    submitted: IntCounterVec,
    lost: IntCounterVec,
    rate_limited: IntCounterVec,
    map_full: IntCounterVec,
    decode_errors: IntCounterVec,
    map_entries: IntGaugeVec,
    map_capacity: IntGaugeVec,
    program_seconds: CounterVec,
    program_runs: IntCounterVec,
    own_cpu: prometheus::Counter,
    own_rss: IntGauge,
    log_suppressed: IntCounter,
    descs: Vec<Desc>,
}

impl KernelStatsCollector {
    fn new(maps: Arc<dyn KernelStats>, capacity: u32, agent: Arc<AgentCounters>) -> Result<Self, prometheus::Error> {
        let submitted = vec_of(AgentFamily::Events, IntCounterVec::new)?;
        let lost = vec_of(AgentFamily::EventsLost, IntCounterVec::new)?;
        let rate_limited = vec_of(AgentFamily::EventsRateLimited, IntCounterVec::new)?;
        let map_full = vec_of(AgentFamily::KernelMapFull, IntCounterVec::new)?;
        let decode_errors = vec_of(AgentFamily::EventDecodeErrors, IntCounterVec::new)?;
        let map_entries = vec_of(AgentFamily::KernelMapEntries, IntGaugeVec::new)?;
        let map_capacity = vec_of(AgentFamily::KernelMapCapacity, IntGaugeVec::new)?;
        map_capacity.with_label_values(&["cgroup_counters"]).set(i64::from(capacity));
        let program_seconds = vec_of(AgentFamily::KernelProgramRunSeconds, CounterVec::new)?;
        let program_runs = vec_of(AgentFamily::KernelProgramRuns, IntCounterVec::new)?;
        let own_cpu = prometheus::Counter::with_opts(AgentFamily::AgentCpu.family().opts())?;
        let own_rss = IntGauge::with_opts(AgentFamily::AgentResidentMemory.family().opts())?;
        let log_suppressed = IntCounter::with_opts(AgentFamily::LogLinesSuppressed.family().opts())?;
        let descs = [
            &log_suppressed.desc(),
            &program_seconds.desc(),
            &program_runs.desc(),
            &own_cpu.desc(),
            &own_rss.desc(),
            &submitted.desc(),
            &lost.desc(),
            &rate_limited.desc(),
            &map_full.desc(),
            &decode_errors.desc(),
            &map_entries.desc(),
            &map_capacity.desc(),
        ]
        .into_iter()
        .flat_map(|d| d.iter().map(|desc| (*desc).clone()))
        .collect();
        Ok(Self {
            maps,
            agent,
            submitted,
            lost,
            rate_limited,
            map_full,
            decode_errors,
            map_entries,
            map_capacity,
            program_seconds,
            program_runs,
            own_cpu,
            own_rss,
            log_suppressed,
            descs,
        })
    }
}

impl Collector for KernelStatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.maps.kind_stats();
        for kind in EventKind::ALL {
            let s = stats[kind as usize];
            set_counter(&self.submitted.with_label_values(&[kind.name()]), s.submitted);
            set_counter(&self.lost.with_label_values(&[kind.name()]), s.lost);
            set_counter(&self.rate_limited.with_label_values(&[kind.name()]), s.rate_limited);
            set_counter(&self.map_full.with_label_values(&["cgroup_counters", kind.name()]), s.counter_map_full);
            if kind == EventKind::TcpListen {
                set_counter(&self.map_full.with_label_values(&["listener_ports", kind.name()]), s.listener_ports_full);
            }
        }
        set_counter(
            &self.decode_errors.with_label_values(&[] as &[&str]),
            self.agent.decode_errors.load(Ordering::Relaxed),
        );
        let entries = self.maps.counter_entries();
        self.map_entries.with_label_values(&["cgroup_counters"]).set(i64::try_from(entries).unwrap_or(i64::MAX));
        for cost in self.maps.program_costs() {
            let seconds = self.program_seconds.with_label_values(&[cost.program]);
            seconds.inc_by((crate::model::time::seconds(cost.run_time_ns) - seconds.get()).max(0.0));
            set_counter(&self.program_runs.with_label_values(&[cost.program]), cost.runs);
        }
        let mut out = self.program_seconds.collect();
        out.extend(self.program_runs.collect());
        if let Some((cpu_seconds, rss_bytes)) = self.maps.own_usage() {
            self.own_cpu.inc_by((cpu_seconds - self.own_cpu.get()).max(0.0));
            self.own_rss.set(i64::try_from(rss_bytes).unwrap_or(i64::MAX));
            out.extend(self.own_cpu.collect());
            out.extend(self.own_rss.collect());
        }
        set_counter(&self.log_suppressed, crate::agent::logging::suppressed_lines());
        out.extend(self.log_suppressed.collect());
        for c in [&self.submitted, &self.lost, &self.rate_limited, &self.map_full, &self.decode_errors] {
            out.extend(c.collect());
        }
        out.extend(self.map_entries.collect());
        out.extend(self.map_capacity.collect());
        out
    }
}

/// Moves a counter up to a monotonic value kept elsewhere (a kernel map, an atomic).
pub(crate) fn set_counter(counter: &prometheus::IntCounter, value: u64) {
    counter.inc_by(value.saturating_sub(counter.get()));
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# HELP lifecycle_a_total A.\n# TYPE lifecycle_a_total counter\nlifecycle_a_total 1\n\
        # HELP lifecycle_probe_b B.\n# TYPE lifecycle_probe_b gauge\nlifecycle_probe_b{x=\"1\"} 2\n\
        # HELP lifecycle_c_seconds C.\n# TYPE lifecycle_c_seconds histogram\nlifecycle_c_seconds_bucket{le=\"1\"} 3\nlifecycle_c_seconds_count 3\n";

    #[test]
    fn slow_readers_share_one_body_past_the_bound() {
        // Issue 18: every slow reader of /metrics held a copy of the whole answer.
        let metrics = Metrics::bare();
        let held: Vec<Bytes> = (0..50).map(|_| metrics.render()).collect();
        let mut distinct: Vec<*const u8> = held.iter().map(|b| b.as_ptr()).collect();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() <= MAX_BODIES_IN_FLIGHT, "{} bodies for 50 readers", distinct.len());
        assert!(metrics.bodies.load(Ordering::Acquire) <= MAX_BODIES_IN_FLIGHT);
        drop(held);
        // Readers gone: each scrape renders afresh again, and the buffers come back.
        let first = metrics.render();
        let second = metrics.render();
        assert_eq!(metrics.bodies.load(Ordering::Acquire), 2, "the newest and the one still held");
        drop((first, second));
        assert_eq!(metrics.bodies.load(Ordering::Acquire), 1, "only the newest is kept");
    }

    #[test]
    fn families_are_kept_or_dropped_whole_by_name_or_prefix_and_the_deny_list_wins() {
        let names = |filter: &FamilyFilter| -> Vec<String> {
            filter.apply(SCRAPE).lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.to_owned()).collect()
        };
        let only = FamilyFilter::new(vec!["lifecycle_c_seconds".into(), "lifecycle_probe_*".into()], Vec::new());
        assert_eq!(names(&only), ["lifecycle_probe_b gauge", "lifecycle_c_seconds histogram"]);
        assert!(only.apply(SCRAPE).contains("lifecycle_c_seconds_bucket{le=\"1\"} 3\nlifecycle_c_seconds_count 3\n"));
        let without = FamilyFilter::new(Vec::new(), vec!["lifecycle_probe_*".into()]);
        assert_eq!(names(&without), ["lifecycle_a_total counter", "lifecycle_c_seconds histogram"]);
        let both = FamilyFilter::new(vec!["lifecycle_*".into()], vec!["lifecycle_a_total".into()]);
        assert!(!both.serves("lifecycle_a_total") && both.serves("lifecycle_probe_b"));
        assert!(FamilyFilter::default().is_everything());
    }
}
