//! What one unit's per-container families say, and the exposition text they are written as.
//!
//! [`UnitView`] gathers everything the text says of a unit and nothing else, none of it
//! dependent on the time of the scrape; [`write_unit`] writes the samples from the view alone,
//! so samples kept with the unit and counters they came from (see `units.rs`) stay right until
//! one of those changes. Families are written straight into the text format (the registry's
//! model allocates per label pair), each family contiguous as the format requires.

use std::{collections::BTreeMap, fmt::Write as _};

use lifecycle_common::CgroupCounters;

pub(super) use super::families::PerContainer as F;
use super::{families::PER_CONTAINER, histogram::Histogram};
use crate::model::{
    container_state::{ContainerState, WaitingReason},
    memory::MemorySample,
    node::{PortStats, Unit, UnitCounters, UnitLabels},
    termination::{SenderKind, TerminationOutcome},
    time::seconds,
};

const STATES: [&str; 3] = ["waiting", "running", "terminated"];

/// Everything the per-container families say about one unit.
#[derive(Debug)]
pub(super) struct UnitView<'a> {
    labels: &'a UnitLabels,
    state: &'static str,
    waiting_reason: Option<&'static str>,
    /// Reason, exit code and Unix time of the last termination.
    last_terminated: Option<(&'static str, i32, f64)>,
    restart_count: u32,
    counters: &'a UnitCounters,
    /// Stop signal to exit of the last termination, when it had a stop signal.
    last_stop_seconds: Option<f64>,
    last_grace_ratio: Option<f64>,
    /// Observed and expected delay of the last restart.
    /// (observed, expected): expected absent when the node's back-off is not known.
    last_backoff_seconds: Option<(f64, Option<f64>)>,
    /// The kernel's counters of the unit's departed instances plus its live one.
    kernel: CgroupCounters,
    tcp: &'a BTreeMap<u16, PortStats>,
    /// The last reading of its memory files (`memory.events`, PSI), when read.
    memory: Option<&'a MemorySample>,
}

impl UnitView<'_> {
    /// The view of `unit`. Nothing in it depends on the time of the scrape: a unit waiting on
    /// its back-off shows Waiting/CrashLoopBackOff from its exit to its restart, a fact of the
    /// unit ([`Unit::held_by_back_off`]), which is what lets `units.rs` keep a text until the
    /// unit changes.
    pub(super) fn of<'a>(unit: &'a Unit, boot_to_unix: f64, live: Option<&CgroupCounters>) -> UnitView<'a> {
        let (state, waiting_reason) = match unit.state() {
            ContainerState::Terminated { .. } if unit.held_by_back_off() => {
                ("waiting", Some(WaitingReason::CrashLoopBackOff.as_str()))
            }
            ContainerState::Waiting { reason, .. } => ("waiting", Some(reason.as_str())),
            ContainerState::Running { .. } => ("running", None),
            ContainerState::Terminated { .. } => ("terminated", None),
        };
        // The last termination: the current state's, or (restarted since) the previous one's.
        // While backing off the status shows the termination as its last state: the same one.
        let last = match (unit.state(), unit.last_state()) {
            (current @ ContainerState::Terminated { .. }, _) => Some(current),
            (_, Some(last @ ContainerState::Terminated { .. })) => Some(last),
            _ => None,
        };
        let last_terminated = match last {
            Some(ContainerState::Terminated { reason, exit_code, finished_at, .. }) => {
                Some((reason.as_str(), *exit_code, seconds(finished_at.ns()) + boot_to_unix))
            }
            _ => None,
        };
        let report = unit.last_termination();
        let mut kernel = unit.departed_kernel_counters();
        if let Some(live) = live {
            kernel += *live;
        }
        UnitView {
            labels: unit.labels(),
            state,
            waiting_reason,
            last_terminated,
            restart_count: unit.restart_count(),
            counters: unit.counters(),
            last_stop_seconds: report
                .and_then(|r| r.stop_signal.as_ref().map(|stop| seconds(r.exit_time.since(stop.time)))),
            last_grace_ratio: report.and_then(|r| match r.outcome {
                TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } => Some(grace_used_ratio),
                _ => None,
            }),
            last_backoff_seconds: unit
                .last_backoff()
                .map(|b| (seconds(b.observed_delay_ns), b.expected_delay_ns.map(seconds))),
            kernel,
            tcp: unit.tcp(),
            memory: unit.memory(),
        }
    }
}

/// A family: name, help, type, and the samples written so far.
pub(super) struct Family {
    pub(super) name: &'static str,
    pub(super) help: &'static str,
    pub(super) kind: &'static str,
    pub(super) body: String,
}

/// The families in exposition order (each must be contiguous in the output).
pub(super) struct Families(pub(super) Vec<Family>);

/// The per-container families (`families.rs`), each with the text written so far.
pub(super) fn new_families() -> Families {
    Families(
        PER_CONTAINER
            .iter()
            .map(|family| Family {
                name: family.name,
                help: family.help,
                kind: family.kind.as_str(),
                body: String::new(),
            })
            .collect(),
    )
}

/// How many per-container families there are.
pub(super) const FAMILY_COUNT: usize = PER_CONTAINER.len();

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

    pub(super) fn histogram(
        &mut self,
        family: F,
        labels: &Labels,
        extra: &[(&str, &str)],
        bounds: &[f64],
        h: &Histogram,
    ) {
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
pub(super) struct Labels(String);

impl Labels {
    pub(super) fn new(pairs: &[(&str, &str)]) -> Self {
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

/// Writes one unit's samples into the families' bodies: from the view and nothing else.
pub(super) fn write_unit(f: &mut Families, view: &UnitView<'_>) {
    let l = &view.labels;
    let with_uid =
        Labels::new(&[("namespace", &l.namespace), ("pod", &l.pod), ("container", &l.container), ("uid", &l.uid)]);
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
            &with_uid,
            &[("reason", reason.as_str()), ("exit_code", &code_text), ("signal", &signal)],
            *n as f64,
        );
    }
    for ((outcome, cause), n) in &c.terminations {
        let labels = [("outcome", outcome.as_str()), ("cause", cause.map_or("", |cause| cause.as_str()))];
        f.sample(F::Terminations, "", &with_uid, &labels, *n as f64);
    }
    for (kind, n) in &c.disagreements {
        f.sample(F::Disagreements, "", &with_uid, &[("kind", kind.as_str())], *n as f64);
    }
    // Initialised at 0 so the first violation is an increase, not a new series.
    f.sample(F::Violations, "", &with_uid, &[], c.grace_violations as f64);
    if let Some(seconds) = view.last_stop_seconds {
        f.sample(F::LastStopSeconds, "", &with_uid, &[], seconds);
    }
    if let Some(ratio) = view.last_grace_ratio {
        f.sample(F::LastGraceRatio, "", &with_uid, &[], ratio);
    }
    if let Some((observed, expected)) = view.last_backoff_seconds {
        f.sample(F::Observed, "", &with_uid, &[], observed);
        if let Some(expected) = expected {
            f.sample(F::Expected, "", &with_uid, &[], expected);
        }
    }
    for (verdict, n) in &c.backoff_verdicts {
        f.sample(F::Verdicts, "", &with_uid, &[("verdict", verdict.as_str())], *n as f64);
    }
    // Signals the kernel counted without recording them (sent inside the container and harmless
    // to their target) join the recorded ones from the same container.
    let mut unrecorded = view.kernel.unrecorded_signals;
    let mut signal_text = String::new();
    let mut signal_sample = |f: &mut Families, signal: usize, sender: SenderKind, n: u64| {
        signal_text.clear();
        let _ = write!(signal_text, "{signal}");
        let labels = [("signal", signal_text.as_str()), ("sender", sender.as_str())];
        f.sample(F::Signals, "", &with_uid, &labels, n as f64);
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
    f.sample(F::Oom, "", &with_uid, &[], c.oom_kills as f64);
    f.sample(F::Execs, "", &with_uid, &[], view.kernel.execs as f64);
    f.sample(F::ProcessExits, "", &with_uid, &[], view.kernel.process_exits as f64);
    let mut port_text = String::new();
    for (port, stats) in view.tcp.iter() {
        port_text.clear();
        let _ = write!(port_text, "{port}");
        let port = [("port", port_text.as_str())];
        f.sample(F::Listeners, "", &with_uid, &port, stats.listeners as f64);
        f.sample(F::Established, "", &with_uid, &port, stats.established as f64);
        f.sample(F::Accepts, "", &with_uid, &port, stats.accepts as f64);
        let waiting = if stats.listeners > 0 { stats.established.saturating_sub(stats.accepts) } else { 0 };
        f.sample(F::QueueDepth, "", &with_uid, &port, waiting as f64);
    }
    if c.exec_sessions > 0 {
        f.sample(F::ExecProcesses, "", &with_uid, &[], c.exec_sessions as f64);
        f.sample(F::ExecCpu, "", &with_uid, &[], seconds(c.exec_session_cpu_ns));
    }
    // Counts of the current cgroup (a restart starts them over, as a counter reset).
    if let Some(memory) = view.memory {
        for (event, n) in memory.events.present() {
            f.sample(F::MemoryEvents, "", &with_uid, &[("event", event)], n as f64);
        }
        if let Some(stalls) = memory.stalls {
            f.sample(F::MemoryStall, "", &with_uid, &[("kind", "some")], seconds(stalls.some_ns));
            f.sample(F::MemoryStall, "", &with_uid, &[("kind", "full")], seconds(stalls.full_ns));
        }
    }
}
