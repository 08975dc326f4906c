//! Per-container metrics, written at scrape time from the tracker's units and the kernel's
//! per-cgroup counters. Label names are kube-state-metrics' (namespace, pod, container, uid) so
//! series join.
//!
//! These families are the high-cardinality ones (tens of series per container, thousands of
//! containers per node), so they are written straight into the exposition text instead of going
//! through the registry's protobuf-shaped model, which allocates per label pair: a scrape of
//! 1,000 containers must stay within a few milliseconds. Distributions (termination durations,
//! grace used) are histograms per namespace and outcome, bounded whatever the pod count; each
//! container's own last value is a gauge beside them.

use std::{
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
    node::{NodeTracker, Unit},
    termination::{SenderKind, TerminationOutcome},
};

const STATES: [&str; 3] = ["waiting", "running", "terminated"];

/// Source of the kernel's per-cgroup counters (the sensor's map, or a fake in tests).
pub trait KernelCounters: Send + Sync {
    /// The live counters of one cgroup, if the kernel has an entry for it.
    fn counters_of(&self, cgroup_id: u64) -> Option<CgroupCounters>;
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
    fn sample(&mut self, family: F, suffix: &str, labels: &Labels<'_>, extra: &[(&str, &str)], value: f64) {
        let f = &mut self.0[family as usize];
        f.body.push_str(f.name);
        f.body.push_str(suffix);
        labels.write(&mut f.body, extra);
        f.body.push(' ');
        write_value(&mut f.body, value);
        f.body.push('\n');
    }

    fn histogram(&mut self, family: F, labels: &Labels<'_>, extra: &[(&str, &str)], bounds: &[f64], h: &Histogram) {
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

    fn write_into(self, out: &mut String) {
        for family in self.0 {
            if family.body.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
            out.push_str(&family.body);
        }
    }
}

/// The identifying labels of a series, written escaped.
struct Labels<'a> {
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Labels<'a> {
    fn write(&self, out: &mut String, extra: &[(&str, &str)]) {
        out.push('{');
        let mut first = true;
        for (name, value) in self.pairs.iter().chain(extra) {
            if !first {
                out.push(',');
            }
            first = false;
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
        out.push('}');
    }
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
        Self { tracker, kernel, clock, boot_to_unix, histograms: Mutex::new(TerminationHistograms::default()) }
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
        let boot_to_unix = (self.boot_to_unix)();
        let mut tracker = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        self.take_judgements(&mut tracker);
        let mut f = new_families();
        for unit in tracker.units() {
            self.unit(&mut f, unit, now, boot_to_unix);
        }
        drop(tracker);
        let histograms = self.histograms.lock().unwrap_or_else(|poison| poison.into_inner());
        for ((namespace, outcome), h) in &histograms.durations {
            let labels = Labels { pairs: vec![("namespace", namespace)] };
            f.histogram(F::Duration, &labels, &[("outcome", labels::outcome(*outcome))], &TERMINATION_BUCKETS, h);
        }
        for (namespace, h) in &histograms.grace_used {
            let labels = Labels { pairs: vec![("namespace", namespace)] };
            f.histogram(F::GraceUsed, &labels, &[], &GRACE_RATIO_BUCKETS, h);
        }
        f.write_into(out);
    }

    fn unit(&self, f: &mut Families, unit: &Unit, now: u64, boot_to_unix: f64) {
        let l = unit.labels();
        let with_uid = Labels {
            pairs: vec![("namespace", &l.namespace), ("pod", &l.pod), ("container", &l.container), ("uid", &l.uid)],
        };
        let short = Labels { pairs: vec![("namespace", &l.namespace), ("pod", &l.pod), ("container", &l.container)] };
        let snapshot = unit.snapshot(now);
        let state = match &snapshot.state {
            ContainerState::Waiting { .. } => "waiting",
            ContainerState::Running { .. } => "running",
            ContainerState::Terminated { .. } => "terminated",
        };
        for candidate in STATES {
            f.sample(F::State, "", &with_uid, &[("state", candidate)], f64::from(u8::from(candidate == state)));
        }
        if let ContainerState::Waiting { reason, .. } = &snapshot.state {
            let reason = labels::waiting_reason(*reason);
            f.sample(F::Waiting, "", &with_uid, &[("reason", reason)], 1.0);
        }
        let last = match (&snapshot.state, &snapshot.last_state) {
            (ContainerState::Terminated { .. }, _) => Some(&snapshot.state),
            (_, Some(last @ ContainerState::Terminated { .. })) => Some(last),
            _ => None,
        };
        if let Some(ContainerState::Terminated { reason, exit_code, finished_at, .. }) = last {
            f.sample(F::LastReason, "", &with_uid, &[("reason", labels::terminated_reason(*reason))], 1.0);
            f.sample(F::LastCode, "", &with_uid, &[], f64::from(*exit_code));
            f.sample(F::LastTime, "", &with_uid, &[], *finished_at as f64 / 1e9 + boot_to_unix);
        }
        f.sample(F::Restarts, "", &with_uid, &[], f64::from(unit.restart_count()));
        let c = unit.counters();
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
        if let Some(report) = unit.last_termination() {
            if let Some(stop) = &report.stop_signal {
                f.sample(F::LastStopSeconds, "", &short, &[], report.exit_time.saturating_sub(stop.time) as f64 / 1e9);
            }
            if let TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } = report.outcome {
                f.sample(F::LastGraceRatio, "", &short, &[], grace_used_ratio);
            }
        }
        if let Some(b) = unit.last_backoff() {
            f.sample(F::Observed, "", &with_uid, &[], b.observed_delay_ns as f64 / 1e9);
            f.sample(F::Expected, "", &with_uid, &[], b.expected_delay_ns as f64 / 1e9);
        }
        for (verdict, n) in &c.backoff_verdicts {
            f.sample(F::Verdicts, "", &short, &[("verdict", labels::verdict(*verdict))], *n as f64);
        }
        let mut kernel = unit.departed_kernel_counters();
        if let Some(live) = unit.cgroup_id().and_then(|id| self.kernel.counters_of(id)) {
            kernel += live;
        }
        // Signals the kernel counted without recording them (sent inside the container and
        // harmless to their target) join the recorded ones from the same container.
        let mut unrecorded = kernel.unrecorded_signals;
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
        f.sample(F::Execs, "", &short, &[], kernel.execs as f64);
        f.sample(F::ProcessExits, "", &short, &[], kernel.process_exits as f64);
        let mut port_text = String::new();
        for (port, stats) in unit.tcp() {
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
        fn counters_of(&self, _cgroup_id: u64) -> Option<CgroupCounters> {
            let mut counters = CgroupCounters::default();
            counters.unrecorded_signals[10] = 7;
            counters.unrecorded_signals[23] = 3;
            Some(counters)
        }
    }

    #[test]
    fn signals_only_counted_in_the_kernel_join_the_recorded_ones_from_the_same_container() {
        let mut tracker = NodeTracker::new(TrackerConfig::default());
        let (cgroup, pid) = (50, 500);
        let event = |time: u64, tgid: u32, cgroup_id: u64, detail: Detail| Event {
            time_ns: time,
            pid: tgid,
            tgid,
            cgroup_id,
            detail,
        };
        let mkdir = CgroupDetail { id: cgroup, path: "/system.slice/app.service".into(), truncated: false };
        tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(mkdir)));
        let exec = Detail::Exec {
            parent_tgid: 1,
            parent_cgroup_id: 1,
            namespace_init: false,
            child_pid_namespace: false,
            start_time_ns: 2,
            comm: "app".into(),
        };
        tracker.apply(&event(2, pid, cgroup, exec));
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
}
