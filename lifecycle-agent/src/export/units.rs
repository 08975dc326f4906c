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
//! containers do not change. So each unit's text is kept with the [`UnitView`] it was written
//! from, everything the text says and nothing else, and written again only when the view differs.
//! The text is a function of the view alone ([`write_unit`] sees nothing else), so reuse can never
//! serve a stale value.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::{Arc, Mutex},
};

use lifecycle_common::CgroupCounters;

use super::{
    histogram::{Histogram, TerminationHistograms, GRACE_RATIO_BUCKETS, TERMINATION_BUCKETS},
    labels,
};
use crate::model::{
    container_state::ContainerState,
    node::{NodeTracker, PortStats, Unit, UnitCounters, UnitKey, UnitLabels},
    termination::{SenderKind, TerminationOutcome},
};

const STATES: [&str; 3] = ["waiting", "running", "terminated"];

/// Source of the kernel's per-cgroup counters (the sensor's map, or a fake in tests).
pub trait KernelCounters: Send + Sync {
    /// The live counters of every cgroup the kernel has an entry for, read at once into `into`
    /// (empty; kept from scrape to scrape so its memory is reused).
    fn read_all(&self, into: &mut HashMap<u64, CgroupCounters>);
}

/// Writes the per-container families; handed to [`crate::export::metrics::Metrics::add_text_source`].
pub struct UnitMetrics {
    tracker: Arc<Mutex<NodeTracker>>,
    kernel: Arc<dyn KernelCounters>,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The offset that turns a boot time into a Unix time, read at each scrape.
    boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    /// Filled from the tracker's judgements; outlives the units that fed it.
    histograms: Mutex<TerminationHistograms>,
    /// Each unit's text from the last scrape, in the tracker's unit order.
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// Boxed: an entry is about a kilobyte, and a scrape moves every entry from one list to the
    /// next (unboxed, those moves were most of a scrape's copying).
    #[expect(clippy::vec_box, reason = "entries move between lists at every scrape")]
    units: Vec<Box<CachedUnit>>,
    /// The boot-to-Unix offset the cached texts used (see [`UnitMetrics::stable_offset`]).
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

/// Everything the per-container families say about one unit.
#[derive(Clone, Debug, PartialEq)]
struct UnitView<'a> {
    labels: Cow<'a, UnitLabels>,
    state: &'static str,
    waiting_reason: Option<&'static str>,
    /// Reason, exit code and Unix time of the last termination.
    last_terminated: Option<(&'static str, i32, f64)>,
    restart_count: u32,
    counters: Cow<'a, UnitCounters>,
    /// Stop signal to exit of the last termination, when it had a stop signal.
    last_stop_seconds: Option<f64>,
    last_grace_ratio: Option<f64>,
    /// Observed and expected delay of the last restart.
    last_backoff_seconds: Option<(f64, f64)>,
    /// The kernel's counters of the unit's departed instances plus its live one.
    kernel: CgroupCounters,
    tcp: Cow<'a, BTreeMap<u16, PortStats>>,
}

impl UnitView<'_> {
    fn of<'a>(unit: &'a Unit, now: u64, boot_to_unix: f64, live: Option<&CgroupCounters>) -> UnitView<'a> {
        let snapshot = unit.snapshot(now);
        let state = match &snapshot.state {
            ContainerState::Waiting { .. } => "waiting",
            ContainerState::Running { .. } => "running",
            ContainerState::Terminated { .. } => "terminated",
        };
        let waiting_reason = match &snapshot.state {
            ContainerState::Waiting { reason, .. } => Some(labels::waiting_reason(*reason)),
            _ => None,
        };
        let last = match (&snapshot.state, &snapshot.last_state) {
            (ContainerState::Terminated { .. }, _) => Some(&snapshot.state),
            (_, Some(last @ ContainerState::Terminated { .. })) => Some(last),
            _ => None,
        };
        let last_terminated = match last {
            Some(ContainerState::Terminated { reason, exit_code, finished_at, .. }) => {
                Some((labels::terminated_reason(*reason), *exit_code, *finished_at as f64 / 1e9 + boot_to_unix))
            }
            _ => None,
        };
        let report = unit.last_termination();
        let mut kernel = unit.departed_kernel_counters();
        if let Some(live) = live {
            kernel += *live;
        }
        UnitView {
            labels: Cow::Borrowed(unit.labels()),
            state,
            waiting_reason,
            last_terminated,
            restart_count: unit.restart_count(),
            counters: Cow::Borrowed(unit.counters()),
            last_stop_seconds: report
                .and_then(|r| r.stop_signal.as_ref().map(|stop| r.exit_time.saturating_sub(stop.time) as f64 / 1e9)),
            last_grace_ratio: report.and_then(|r| match r.outcome {
                TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } => Some(grace_used_ratio),
                _ => None,
            }),
            last_backoff_seconds: unit
                .last_backoff()
                .map(|b| (b.observed_delay_ns as f64 / 1e9, b.expected_delay_ns as f64 / 1e9)),
            kernel,
            tcp: Cow::Borrowed(unit.tcp()),
        }
    }

    fn into_owned(self) -> UnitView<'static> {
        UnitView {
            labels: Cow::Owned(self.labels.into_owned()),
            counters: Cow::Owned(self.counters.into_owned()),
            tcp: Cow::Owned(self.tcp.into_owned()),
            state: self.state,
            waiting_reason: self.waiting_reason,
            last_terminated: self.last_terminated,
            restart_count: self.restart_count,
            last_stop_seconds: self.last_stop_seconds,
            last_grace_ratio: self.last_grace_ratio,
            last_backoff_seconds: self.last_backoff_seconds,
            kernel: self.kernel,
        }
    }
}

/// A family: name, help, type, and the samples written so far.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    body: String,
}

/// The families in exposition order (each must be contiguous in the output).
struct Families(Vec<Family>);

macro_rules! families {
    ($($id:ident: $name:literal, $kind:literal, $help:literal;)*) => {
        #[derive(Clone, Copy)]
        #[repr(usize)]
        enum F { $($id),* }
        const FAMILY_COUNT: usize = [$($name),*].len();
        fn new_families() -> Families {
            Families(vec![$(Family { name: $name, help: $help, kind: $kind, body: String::new() }),*])
        }
    };
}
families! {
    State: "lifecycle_container_state", "gauge", "1 for the container's current state (waiting, running, terminated), 0 for the others.";
    Waiting: "lifecycle_container_waiting_reason", "gauge", "1 while the container waits for this reason (ContainerCreating, CrashLoopBackOff).";
    LastReason: "lifecycle_container_last_terminated_reason", "gauge", "1 for the reason of the container's last termination.";
    LastCode: "lifecycle_container_last_terminated_exit_code", "gauge", "Exit code of the last termination (128+signal when killed).";
    LastTime: "lifecycle_container_last_terminated_timestamp_seconds", "gauge", "When the last termination happened, Unix seconds.";
    Restarts: "lifecycle_container_restarts_total", "counter", "Restarts of the container seen by the agent.";
    Exits: "lifecycle_container_exits_total", "counter", "Exits of the container's main process by reason, exit code and signal.";
    Terminations: "lifecycle_terminations_total", "counter", "Container terminations by outcome under the kubelet's rules.";
    Violations: "lifecycle_grace_period_violations_total", "counter", "Containers SIGKILLed after their grace period.";
    Disagreements: "lifecycle_status_disagreements_total", "counter", "Times the kubelet's reported container status disagreed with what the kernel saw, by kind.";
    LastStopSeconds: "lifecycle_container_last_termination_seconds", "gauge", "Stop signal to exit of the container's last termination that had a stop signal.";
    LastGraceRatio: "lifecycle_container_last_grace_used_ratio", "gauge", "Share of the grace period the last termination within grace used.";
    Duration: "lifecycle_termination_duration_seconds", "histogram", "Stop signal to exit, per namespace and outcome.";
    GraceUsed: "lifecycle_termination_grace_used_ratio", "histogram", "Share of the grace period used by exits within grace, per namespace.";
    Observed: "lifecycle_backoff_observed_seconds", "gauge", "Delay between the last exit and the restart, as observed.";
    Expected: "lifecycle_backoff_expected_seconds", "gauge", "Delay the kubelet's back-off required for the last restart.";
    Verdicts: "lifecycle_backoff_verdicts_total", "counter", "Restarts judged against the kubelet's back-off.";
    Signals: "lifecycle_signals_received_total", "counter", "Signals received by the container's processes, by signal and sender.";
    Oom: "lifecycle_oom_kills_total", "counter", "OOM kills in the container (kernel OOM events).";
    Execs: "lifecycle_process_execs_total", "counter", "Program executions in the container (kernel counter).";
    ProcessExits: "lifecycle_process_exits_total", "counter", "Process exits in the container (kernel counter).";
    Listeners: "lifecycle_tcp_listeners", "gauge", "Listening TCP sockets of the container by port.";
    Established: "lifecycle_tcp_connections_established_total", "counter", "Connections that completed the handshake into the container's listener.";
    Accepts: "lifecycle_tcp_accepts_total", "counter", "Connections the application accepted.";
    QueueDepth: "lifecycle_tcp_accept_queue_depth", "gauge", "Connections established but not accepted yet (kernel counts).";
    ExecProcesses: "lifecycle_exec_probe_processes_total", "counter", "Processes the runtime started into the container outside its init's tree (exec probes, hooks, exec sessions).";
    ExecCpu: "lifecycle_exec_probe_cpu_seconds_total", "counter", "CPU time of those processes.";
}

impl Families {
    /// One sample: `name{labels} value`. `suffix` extends the name (histogram parts).
    fn sample(&mut self, family: F, suffix: &str, labels: &Labels, extra: &[(&str, &str)], value: f64) {
        let f = &mut self.0[family as usize];
        f.body.push_str(f.name);
        f.body.push_str(suffix);
        labels.write(&mut f.body, extra);
        f.body.push(' ');
        write_value(&mut f.body, value);
        f.body.push('\n');
    }

    fn histogram(&mut self, family: F, labels: &Labels, extra: &[(&str, &str)], bounds: &[f64], h: &Histogram) {
        let mut le = String::new();
        for (i, bound) in bounds.iter().enumerate() {
            le.clear();
            write_value(&mut le, *bound);
            let mut with_le: Vec<(&str, &str)> = extra.to_vec();
            with_le.push(("le", &le));
            self.sample(family, "_bucket", labels, &with_le, h.counts.get(i).copied().unwrap_or(0) as f64);
        }
        let mut with_le: Vec<(&str, &str)> = extra.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample(family, "_bucket", labels, &with_le, h.count as f64);
        self.sample(family, "_sum", labels, extra, h.sum);
        self.sample(family, "_count", labels, extra, h.count as f64);
    }
}

/// The identifying labels of a series, escaped once per unit: `{a="x",b="y"` (no closing brace;
/// each sample adds its own labels and the brace).
struct Labels(String);

impl Labels {
    fn new(pairs: &[(&str, &str)]) -> Self {
        let mut text = String::from("{");
        for (index, (name, value)) in pairs.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            write_pair(&mut text, name, value);
        }
        Labels(text)
    }

    fn write(&self, out: &mut String, extra: &[(&str, &str)]) {
        out.push_str(&self.0);
        let mut first = self.0.len() == 1;
        for (name, value) in extra {
            if !first {
                out.push(',');
            }
            first = false;
            write_pair(out, name, value);
        }
        out.push('}');
    }
}

/// `name="value"`, the value escaped as the text format requires.
fn write_pair(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str("=\"");
    if value.contains(['\\', '"', '\n']) {
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
    } else {
        out.push_str(value);
    }
    out.push('"');
}

/// Prometheus text values: integers without a fraction, `+Inf`/`-Inf`/`NaN` spelled its way.
fn write_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        // Counts are the common case; integer formatting is several times cheaper than f64's.
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

impl UnitMetrics {
    pub fn new(
        tracker: Arc<Mutex<NodeTracker>>,
        kernel: Arc<dyn KernelCounters>,
        clock: Box<dyn Fn() -> u64 + Send + Sync>,
        boot_to_unix: Box<dyn Fn() -> f64 + Send + Sync>,
    ) -> Self {
        Self {
            tracker,
            kernel,
            clock,
            boot_to_unix,
            histograms: Mutex::new(TerminationHistograms::default()),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// Moves the tracker's judged terminations into the distributions. The agent calls this after
    /// every batch of events; a scrape calls it too, so nothing waits for the next batch.
    pub fn take_judgements(&self, tracker: &mut NodeTracker) {
        let judged = tracker.take_judgements();
        if !judged.is_empty() {
            self.histograms.lock().unwrap_or_else(|poison| poison.into_inner()).record(judged);
        }
    }

    /// Appends every per-container family to `out`.
    pub fn render(&self, out: &mut String) {
        let now = (self.clock)();
        let mut cache = self.cache.lock().unwrap_or_else(|poison| poison.into_inner());
        // Read before the tracker's lock: the event loop need not wait for the kernel's map.
        let mut live = std::mem::take(&mut cache.live);
        live.clear();
        self.kernel.read_all(&mut live);
        let boot_to_unix = stable_offset(&mut cache.offset, (self.boot_to_unix)());
        let mut scratch = cache.scratch.take().unwrap_or_else(new_families);
        let mut previous = std::mem::take(&mut cache.units).into_iter().peekable();
        // (entry, whether its text must be written from its new view)
        let mut units: Vec<(Box<CachedUnit>, bool)> = Vec::with_capacity(previous.len());
        {
            let mut tracker = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner());
            self.take_judgements(&mut tracker);
            // Both sequences are in unit-key order: a merge keeps the entries of units still here.
            for unit in tracker.units() {
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
        // Written after the tracker's lock is released: events need not wait for the text.
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
            shared.histogram(F::Duration, &labels, &[("outcome", labels::outcome(*outcome))], &TERMINATION_BUCKETS, h);
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

/// Writes one unit's samples into the families' bodies: from the view and nothing else.
fn write_unit(f: &mut Families, view: &UnitView<'_>) {
    let l = &view.labels;
    let with_uid =
        Labels::new(&[("namespace", &l.namespace), ("pod", &l.pod), ("container", &l.container), ("uid", &l.uid)]);
    let short = Labels::new(&[("namespace", &l.namespace), ("pod", &l.pod), ("container", &l.container)]);
    for candidate in STATES {
        f.sample(F::State, "", &with_uid, &[("state", candidate)], f64::from(u8::from(candidate == view.state)));
    }
    if let Some(reason) = view.waiting_reason {
        f.sample(F::Waiting, "", &with_uid, &[("reason", reason)], 1.0);
    }
    if let Some((reason, exit_code, unix_time)) = view.last_terminated {
        f.sample(F::LastReason, "", &with_uid, &[("reason", reason)], 1.0);
        f.sample(F::LastCode, "", &with_uid, &[], f64::from(exit_code));
        f.sample(F::LastTime, "", &with_uid, &[], unix_time);
    }
    f.sample(F::Restarts, "", &with_uid, &[], f64::from(view.restart_count));
    let c = &view.counters;
    let mut code_text = String::new();
    for ((reason, code, signal), n) in &c.exits {
        code_text.clear();
        let _ = write!(code_text, "{code}");
        let signal = signal.map(|s| s.to_string()).unwrap_or_default();
        f.sample(
            F::Exits,
            "",
            &short,
            &[("reason", labels::terminated_reason(*reason)), ("exit_code", &code_text), ("signal", &signal)],
            *n as f64,
        );
    }
    for ((outcome, cause), n) in &c.terminations {
        let labels = [("outcome", labels::outcome(*outcome)), ("cause", cause.map_or("", labels::stop_cause))];
        f.sample(F::Terminations, "", &short, &labels, *n as f64);
    }
    for (kind, n) in &c.disagreements {
        f.sample(F::Disagreements, "", &short, &[("kind", labels::disagreement(*kind))], *n as f64);
    }
    // Initialised at 0 so the first violation is an increase, not a new series.
    f.sample(F::Violations, "", &with_uid, &[], c.grace_violations as f64);
    if let Some(seconds) = view.last_stop_seconds {
        f.sample(F::LastStopSeconds, "", &short, &[], seconds);
    }
    if let Some(ratio) = view.last_grace_ratio {
        f.sample(F::LastGraceRatio, "", &short, &[], ratio);
    }
    if let Some((observed, expected)) = view.last_backoff_seconds {
        f.sample(F::Observed, "", &with_uid, &[], observed);
        f.sample(F::Expected, "", &with_uid, &[], expected);
    }
    for (verdict, n) in &c.backoff_verdicts {
        f.sample(F::Verdicts, "", &short, &[("verdict", labels::verdict(*verdict))], *n as f64);
    }
    // Signals the kernel counted without recording them (sent inside the container and harmless
    // to their target) join the recorded ones from the same container.
    let mut unrecorded = view.kernel.unrecorded_signals;
    let mut signal_text = String::new();
    let mut signal_sample = |f: &mut Families, signal: usize, sender: SenderKind, n: u64| {
        signal_text.clear();
        let _ = write!(signal_text, "{signal}");
        let labels = [("signal", signal_text.as_str()), ("sender", labels::sender_kind(sender))];
        f.sample(F::Signals, "", &short, &labels, n as f64);
    };
    for (&(signal, sender), &n) in &c.signals {
        let extra = match (sender, unrecorded.get_mut(signal as usize)) {
            (SenderKind::SameContainer, Some(extra)) => std::mem::take(extra),
            _ => 0,
        };
        signal_sample(f, signal as usize, sender, n + extra);
    }
    for (signal, &n) in unrecorded.iter().enumerate().filter(|(_, &n)| n > 0) {
        signal_sample(f, signal, SenderKind::SameContainer, n);
    }
    f.sample(F::Oom, "", &short, &[], c.oom_kills as f64);
    f.sample(F::Execs, "", &short, &[], view.kernel.execs as f64);
    f.sample(F::ProcessExits, "", &short, &[], view.kernel.process_exits as f64);
    let mut port_text = String::new();
    for (port, stats) in view.tcp.iter() {
        port_text.clear();
        let _ = write!(port_text, "{port}");
        let port = [("port", port_text.as_str())];
        f.sample(F::Listeners, "", &short, &port, stats.listeners as f64);
        f.sample(F::Established, "", &short, &port, stats.established as f64);
        f.sample(F::Accepts, "", &short, &port, stats.accepts as f64);
        let waiting = if stats.listeners > 0 { stats.established.saturating_sub(stats.accepts) } else { 0 };
        f.sample(F::QueueDepth, "", &short, &port, waiting as f64);
    }
    if c.exec_sessions > 0 {
        f.sample(F::ExecProcesses, "", &short, &[], c.exec_sessions as f64);
        f.sample(F::ExecCpu, "", &short, &[], c.exec_session_cpu_ns as f64 / 1e9);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{CgroupDetail, Detail, Event, SignalResult};
    use crate::model::node::TrackerConfig;

    /// The kernel's counts for the one cgroup of the test: 7 SIGUSR1 (10) and 3 SIGURG (23)
    /// sent inside it and not recorded.
    struct Kernel;

    impl KernelCounters for Kernel {
        fn read_all(&self, into: &mut HashMap<u64, CgroupCounters>) {
            let mut counters = CgroupCounters::default();
            counters.unrecorded_signals[10] = 7;
            counters.unrecorded_signals[23] = 3;
            into.insert(50, counters);
        }
    }

    fn event(time: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
        Event { time_ns: time, pid: tgid, tgid, cgroup_id, detail }
    }

    /// The cgroup `/system.slice/<name>.service` appears (1 ns) and `pid` starts in it (2 ns).
    fn start_host_unit(tracker: &mut NodeTracker, cgroup: u64, pid: u32, name: &str) {
        let mkdir = CgroupDetail { id: cgroup, path: format!("/system.slice/{name}.service"), truncated: false };
        tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(mkdir)));
        let exec = Detail::Exec {
            parent_tgid: 1,
            parent_cgroup_id: 1,
            namespace_init: false,
            child_pid_namespace: false,
            start_time_ns: 2,
            comm: name.into(),
        };
        tracker.apply(&event(2, pid, cgroup, exec));
    }

    #[test]
    fn signals_only_counted_in_the_kernel_join_the_recorded_ones_from_the_same_container() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        let (cgroup, pid) = (50, 500);
        start_host_unit(&mut tracker, cgroup, pid, "app");
        // One SIGUSR1 the kernel recorded (the target had no handler yet), and one from outside.
        for (sender, sender_cgroup) in [(pid, cgroup), (7, 1)] {
            let signal = Detail::Signal {
                signal: 10,
                result: SignalResult::Delivered,
                group: true,
                target_pid: pid,
                target_tgid: pid,
                target_cgroup_id: cgroup,
                sender_comm: "app".into(),
                target_comm: "app".into(),
            };
            tracker.apply(&event(3, sender, sender_cgroup, signal));
        }
        let units =
            UnitMetrics::new(Arc::new(Mutex::new(tracker)), Arc::new(Kernel), Box::new(|| 10), Box::new(|| 0.0));
        let mut text = String::new();
        units.render(&mut text);
        let signals: Vec<&str> = text.lines().filter(|l| l.starts_with("lifecycle_signals_received_total{")).collect();
        let value = |signal: &str, sender: &str| {
            let wanted = format!("signal=\"{signal}\",sender=\"{sender}\"");
            let lines: Vec<&&str> = signals.iter().filter(|l| l.contains(&wanted)).collect();
            assert_eq!(lines.len(), 1, "one series for {wanted} in {signals:#?}");
            lines[0].rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("value")
        };
        assert_eq!(value("10", "same_container"), 8.0);
        assert_eq!(value("10", "other_process"), 1.0);
        assert_eq!(value("23", "same_container"), 3.0);
        assert_eq!(signals.len(), 3, "{signals:#?}");
    }

    /// Counters the test changes between scrapes.
    #[derive(Default)]
    struct Changing(Mutex<HashMap<u64, CgroupCounters>>);

    impl KernelCounters for Changing {
        fn read_all(&self, into: &mut HashMap<u64, CgroupCounters>) {
            into.extend(self.0.lock().expect("lock").iter().map(|(k, v)| (*k, *v)));
        }
    }

    /// The per-container lines of a scrape (the histograms are per namespace and fed once).
    fn unit_lines(text: &str) -> Vec<String> {
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("lifecycle_termination_"))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn a_scrape_shows_every_change_since_the_last_and_keeps_nothing_stale() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        for (cgroup, pid, name) in [(50, 500, "a"), (51, 510, "b"), (52, 520, "c")] {
            start_host_unit(&mut tracker, cgroup, pid, name);
        }
        let tracker = Arc::new(Mutex::new(tracker));
        let kernel = Arc::new(Changing::default());
        let metrics = |kernel: Arc<Changing>| {
            UnitMetrics::new(tracker.clone(), kernel, Box::new(|| 10_000_000_000), Box::new(|| 1_700_000_000.0))
        };
        let cached = metrics(kernel.clone());
        let scrape = |m: &UnitMetrics| {
            let mut text = String::new();
            m.render(&mut text);
            text
        };
        let first = scrape(&cached);
        assert_eq!(first.matches("lifecycle_container_state{").count(), 3 * 3, "{first}");

        // a exits 3; b's kernel counters move; c's cgroup goes and its unit expires.
        let exit = Detail::Exit {
            exit_status: Some(3),
            signal: None,
            core_dumped: false,
            group_dead: true,
            parent_tgid: 1,
            start_time_ns: 2,
            cpu_time_ns: 1,
            comm: "a".into(),
        };
        kernel.0.lock().expect("lock").insert(51, CgroupCounters { execs: 4, ..Default::default() });
        {
            let mut tracker = tracker.lock().expect("lock");
            tracker.apply(&event(3_000_000_000, 500, 50, exit));
            let rmdir = CgroupDetail { id: 52, path: "/system.slice/c.service".into(), truncated: false };
            tracker.apply(&event(3_000_000_001, 520, 52, Detail::CgroupRmdir(rmdir)));
            // c changed last at 2 ns, a at 3 s: a retention of 7 s at 9 s keeps a only.
            tracker.expire(9_000_000_000, 7_000_000_000);
        }
        let second = scrape(&cached);
        assert_eq!(
            unit_lines(&second),
            unit_lines(&scrape(&metrics(kernel.clone()))),
            "a cached scrape says what a fresh one says"
        );
        let a = r#"namespace="host",pod="",container="/system.slice/a.service""#;
        let b = r#"namespace="host",pod="",container="/system.slice/b.service""#;
        assert!(
            second.contains(&format!("lifecycle_container_last_terminated_exit_code{{{a},uid=\"\"}} 3\n")),
            "{second}"
        );
        assert!(second.contains(&format!("lifecycle_process_execs_total{{{b}}} 4\n")), "{second}");
        assert!(!second.contains("c.service"), "{second}");
        assert!(first.contains("c.service"));
    }
}
