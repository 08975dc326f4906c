//! Per-container metrics, built at scrape time from the tracker's units and the kernel's
//! per-cgroup counters. Label names are kube-state-metrics' (namespace, pod, container, uid) so
//! series join; every enumerated label value (outcomes, verdicts, states) is exported from the
//! unit's first appearance, at 0, so `increase()` sees the first event.

use std::sync::{Arc, Mutex};

use lifecycle_common::CgroupCounters;
use prometheus::{
    core::{Collector, Desc},
    proto::{Bucket, Counter, Gauge, Histogram as ProtoHistogram, LabelPair, Metric, MetricFamily, MetricType},
};

use crate::{
    container_state::{ContainerState, WaitingReason},
    sensor::SensorMaps,
    tracker::{reason_name, Histogram, NodeTracker, Unit, GRACE_RATIO_BUCKETS, TERMINATION_BUCKETS},
};

const OUTCOMES: [&str; 5] =
    ["exited_within_grace", "sigkilled_after_grace", "killed_without_grace", "oom_killed", "exited_without_stop_signal"];
const VERDICTS: [&str; 3] = ["within_tolerance", "too_early", "too_late"];
const STATES: [&str; 3] = ["waiting", "running", "terminated"];

/// Source of the kernel's per-cgroup counters (the sensor's map, or a fake in tests).
pub trait KernelCounters: Send + Sync {
    fn counters_of(&self, cgroup_id: u64) -> Option<CgroupCounters>;
}

impl KernelCounters for SensorMaps {
    fn counters_of(&self, cgroup_id: u64) -> Option<CgroupCounters> {
        SensorMaps::counters_of(self, cgroup_id)
    }
}

/// The collector registered in the agent's registry.
pub struct UnitCollector {
    tracker: Arc<Mutex<NodeTracker>>,
    kernel: Arc<dyn KernelCounters>,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
    descs: Vec<Desc>,
}

/// (name, help, type) of every family this collector emits.
const FAMILIES: &[(&str, &str, MetricType)] = &[
    ("lifecycle_container_state", "1 for the container's current state (waiting, running, terminated), 0 for the others.", MetricType::GAUGE),
    ("lifecycle_container_waiting_reason", "1 while the container waits for this reason (ContainerCreating, CrashLoopBackOff).", MetricType::GAUGE),
    ("lifecycle_container_last_terminated_reason", "1 for the reason of the container's last termination.", MetricType::GAUGE),
    ("lifecycle_container_last_terminated_exit_code", "Exit code of the last termination (128+signal when killed).", MetricType::GAUGE),
    ("lifecycle_container_last_terminated_timestamp_seconds", "When the last termination happened, Unix seconds.", MetricType::GAUGE),
    ("lifecycle_container_restarts_total", "Restarts of the container seen by the agent.", MetricType::COUNTER),
    ("lifecycle_container_exits_total", "Exits of the container's main process by reason, exit code and signal.", MetricType::COUNTER),
    ("lifecycle_terminations_total", "Container terminations by outcome under the kubelet's rules.", MetricType::COUNTER),
    ("lifecycle_grace_period_violations_total", "Containers SIGKILLed after their grace period.", MetricType::COUNTER),
    ("lifecycle_termination_duration_seconds", "Stop signal to exit.", MetricType::HISTOGRAM),
    ("lifecycle_termination_grace_used_ratio", "Share of the grace period used by exits within grace.", MetricType::HISTOGRAM),
    ("lifecycle_backoff_observed_seconds", "Delay between the last exit and the restart, as observed.", MetricType::GAUGE),
    ("lifecycle_backoff_expected_seconds", "Delay the kubelet's back-off required for the last restart.", MetricType::GAUGE),
    ("lifecycle_backoff_verdicts_total", "Restarts judged against the kubelet's back-off.", MetricType::COUNTER),
    ("lifecycle_signals_received_total", "Signals received by the container's processes, by signal and sender.", MetricType::COUNTER),
    ("lifecycle_oom_kills_total", "OOM kills in the container (kernel OOM events).", MetricType::COUNTER),
    ("lifecycle_process_execs_total", "Program executions in the container (kernel counter).", MetricType::COUNTER),
    ("lifecycle_process_exits_total", "Process exits in the container (kernel counter).", MetricType::COUNTER),
    ("lifecycle_tcp_listeners", "Listening TCP sockets of the container by port.", MetricType::GAUGE),
    ("lifecycle_tcp_connections_established_total", "Connections that completed the handshake into the container's listener.", MetricType::COUNTER),
    ("lifecycle_tcp_accepts_total", "Connections the application accepted.", MetricType::COUNTER),
    ("lifecycle_tcp_accept_queue_depth", "Connections established but not accepted yet (kernel counts).", MetricType::GAUGE),
    ("lifecycle_exec_probe_processes_total", "Processes the runtime started into the container outside its init's tree (exec probes, hooks, exec sessions).", MetricType::COUNTER),
    ("lifecycle_exec_probe_cpu_seconds_total", "CPU time of those processes.", MetricType::COUNTER),
];

impl UnitCollector {
    pub fn new(
        tracker: Arc<Mutex<NodeTracker>>,
        kernel: Arc<dyn KernelCounters>,
        clock: Box<dyn Fn() -> u64 + Send + Sync>,
    ) -> Result<Self, prometheus::Error> {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, _)| Desc::new((*name).to_owned(), (*help).to_owned(), Vec::new(), Default::default()))
            .collect::<Result<_, _>>()?;
        Ok(Self { tracker, kernel, clock, descs })
    }
}

/// Accumulates one scrape's families.
struct Families {
    families: Vec<MetricFamily>,
}

impl Families {
    fn new() -> Self {
        let families = FAMILIES
            .iter()
            .map(|(name, help, kind)| {
                let mut family = MetricFamily::default();
                family.set_name((*name).to_owned());
                family.set_help((*help).to_owned());
                family.set_field_type(*kind);
                family
            })
            .collect();
        Self { families }
    }

    fn push(&mut self, name: &str, labels: Vec<LabelPair>, fill: impl FnOnce(&mut Metric)) {
        if let Some(family) = self.families.iter_mut().find(|f| f.name() == name) {
            let mut metric = Metric::from_label(labels);
            fill(&mut metric);
            family.mut_metric().push(metric);
        }
    }

    fn counter(&mut self, name: &str, labels: Vec<LabelPair>, value: f64) {
        self.push(name, labels, |m| {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        });
    }

    fn gauge(&mut self, name: &str, labels: Vec<LabelPair>, value: f64) {
        self.push(name, labels, |m| {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        });
    }

    fn histogram(&mut self, name: &str, labels: Vec<LabelPair>, bounds: &[f64], h: &Histogram) {
        self.push(name, labels, |m| {
            let mut proto = ProtoHistogram::default();
            proto.set_sample_count(h.count);
            proto.set_sample_sum(h.sum);
            let buckets = bounds
                .iter()
                .enumerate()
                .map(|(i, bound)| {
                    let mut b = Bucket::default();
                    b.set_upper_bound(*bound);
                    b.set_cumulative_count(h.counts.get(i).copied().unwrap_or(0));
                    b
                })
                .collect();
            proto.set_bucket(buckets);
            m.set_histogram(proto);
        });
    }
}

fn pair(name: &str, value: &str) -> LabelPair {
    let mut p = LabelPair::default();
    p.set_name(name.to_owned());
    p.set_value(value.to_owned());
    p
}

/// namespace, pod, container, uid.
fn unit_labels(unit: &Unit) -> Vec<LabelPair> {
    vec![
        pair("namespace", &unit.labels.namespace),
        pair("pod", &unit.labels.pod),
        pair("container", &unit.labels.container),
        pair("uid", &unit.labels.uid),
    ]
}

/// namespace, pod, container plus extra labels.
fn with(unit: &Unit, extra: &[(&str, &str)]) -> Vec<LabelPair> {
    let mut labels = vec![
        pair("namespace", &unit.labels.namespace),
        pair("pod", &unit.labels.pod),
        pair("container", &unit.labels.container),
    ];
    labels.extend(extra.iter().map(|(k, v)| pair(k, v)));
    labels
}

impl Collector for UnitCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = (self.clock)();
        let boot_to_unix = unix_minus_boot_seconds();
        let tracker = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        let mut out = Families::new();
        for unit in tracker.units() {
            let labels = unit_labels(unit);
            let snapshot = unit.snapshot(now);
            let state = match &snapshot.state {
                ContainerState::Waiting { .. } => "waiting",
                ContainerState::Running { .. } => "running",
                ContainerState::Terminated { .. } => "terminated",
            };
            for candidate in STATES {
                let mut l = labels.clone();
                l.push(pair("state", candidate));
                out.gauge("lifecycle_container_state", l, f64::from(u8::from(candidate == state)));
            }
            if let ContainerState::Waiting { reason, .. } = &snapshot.state {
                let reason = match reason {
                    WaitingReason::ContainerCreating => "ContainerCreating",
                    WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
                };
                let mut l = labels.clone();
                l.push(pair("reason", reason));
                out.gauge("lifecycle_container_waiting_reason", l, 1.0);
            }
            let last = match (&snapshot.state, &snapshot.last_state) {
                (ContainerState::Terminated { .. }, _) => Some(&snapshot.state),
                (_, Some(last @ ContainerState::Terminated { .. })) => Some(last),
                _ => None,
            };
            if let Some(ContainerState::Terminated { reason, exit_code, finished_at, .. }) = last {
                let mut l = labels.clone();
                l.push(pair("reason", reason_name(*reason)));
                out.gauge("lifecycle_container_last_terminated_reason", l, 1.0);
                out.gauge("lifecycle_container_last_terminated_exit_code", labels.clone(), f64::from(*exit_code));
                out.gauge(
                    "lifecycle_container_last_terminated_timestamp_seconds",
                    labels.clone(),
                    *finished_at as f64 / 1e9 + boot_to_unix,
                );
            }
            out.counter("lifecycle_container_restarts_total", labels.clone(), f64::from(unit.restart_count()));
            let c = &unit.counters;
            for ((reason, code, signal), n) in &c.exits {
                let signal = signal.map(|s| s.to_string()).unwrap_or_default();
                let code = code.to_string();
                out.counter(
                    "lifecycle_container_exits_total",
                    with(unit, &[("reason", reason), ("exit_code", &code), ("signal", &signal)]),
                    *n as f64,
                );
            }
            for outcome in OUTCOMES {
                let n = c.terminations.get(outcome).copied().unwrap_or(0);
                out.counter("lifecycle_terminations_total", with(unit, &[("outcome", outcome)]), n as f64);
            }
            out.counter("lifecycle_grace_period_violations_total", labels.clone(), c.grace_violations as f64);
            for (outcome, h) in &c.termination_seconds {
                out.histogram("lifecycle_termination_duration_seconds", with(unit, &[("outcome", outcome)]), &TERMINATION_BUCKETS, h);
            }
            if c.grace_used_ratio.count > 0 {
                out.histogram("lifecycle_termination_grace_used_ratio", with(unit, &[]), &GRACE_RATIO_BUCKETS, &c.grace_used_ratio);
            }
            if let Some(b) = &unit.last_backoff {
                out.gauge("lifecycle_backoff_observed_seconds", labels.clone(), b.observed_delay_ns as f64 / 1e9);
                out.gauge("lifecycle_backoff_expected_seconds", labels.clone(), b.expected_delay_ns as f64 / 1e9);
            }
            for verdict in VERDICTS {
                let n = c.backoff_verdicts.get(verdict).copied().unwrap_or(0);
                out.counter("lifecycle_backoff_verdicts_total", with(unit, &[("verdict", verdict)]), n as f64);
            }
            for ((signal, sender), n) in &c.signals {
                let signal = signal.to_string();
                out.counter("lifecycle_signals_received_total", with(unit, &[("signal", &signal), ("sender", sender)]), *n as f64);
            }
            out.counter("lifecycle_oom_kills_total", with(unit, &[]), c.oom_kills as f64);
            let mut kernel = unit.departed_kernel_counters;
            if let Some(live) = unit.cgroup_id.and_then(|id| self.kernel.counters_of(id)) {
                kernel += live;
            }
            out.counter("lifecycle_process_execs_total", with(unit, &[]), kernel.execs as f64);
            out.counter("lifecycle_process_exits_total", with(unit, &[]), kernel.process_exits as f64);
            for (port, stats) in &unit.tcp {
                let port = port.to_string();
                let l = with(unit, &[("port", &port)]);
                out.gauge("lifecycle_tcp_listeners", l.clone(), stats.listeners as f64);
                out.counter("lifecycle_tcp_connections_established_total", l.clone(), stats.established as f64);
                out.counter("lifecycle_tcp_accepts_total", l.clone(), stats.accepts as f64);
                let waiting = if stats.listeners > 0 { stats.established.saturating_sub(stats.accepts) } else { 0 };
                out.gauge("lifecycle_tcp_accept_queue_depth", l, waiting as f64);
            }
            out.counter("lifecycle_exec_probe_processes_total", with(unit, &[]), c.exec_sessions as f64);
            out.counter("lifecycle_exec_probe_cpu_seconds_total", with(unit, &[]), c.exec_session_cpu_ns as f64 / 1e9);
        }
        // The encoder rejects families without samples.
        out.families.into_iter().filter(|f| !f.get_metric().is_empty()).collect()
    }
}

/// CLOCK_REALTIME - CLOCK_BOOTTIME, in seconds: adds to a boot time to give a Unix time.
pub fn unix_minus_boot_seconds() -> f64 {
    let read = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: ts is a valid timespec for clock_gettime to fill.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_BOOTTIME)
}

/// CLOCK_BOOTTIME now, in ns: the clock the kernel stamps events with.
pub fn boot_time_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
