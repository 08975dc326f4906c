//! Probe metrics: current result and transitions per check, requests by answer code, the time
//! to answer, and what the probe surface refused (declarations, connections, requests),
//! registered into the registry the caller passes in.
//!
//! Label values are bounded: `check` is the canonical text of a *declared* check (`tcp:8080`,
//! `process`, `file:/tmp/healthy`, `all:...`) — requests never mint series, they are answered
//! only for declared checks — and a pod gets at most [`MAX_CHECK_SERIES_PER_POD`] (container,
//! check) series; past that, results are not exported and `lifecycle_probe_series_dropped_total`
//! counts the checks left out. Every other label comes from a fixed set.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use parking_lot::Mutex;

use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};

use crate::model::node::{PodWarning, WarningReason};

use super::{check::Verdict, declaration::RefusalReason};

/// (container, check) series a pod may have; checks past it answer but are not exported.
pub(crate) const MAX_CHECK_SERIES_PER_POD: usize = 32;

/// Which container a probe speaks for (the kube-state-metrics label names).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeTarget {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl ProbeTarget {
    fn same_pod(&self, other: &ProbeTarget) -> bool {
        self.namespace == other.namespace && self.pod == other.pod
    }
}

/// Connections a pod listener closed without reading a request (the `reason` label of
/// `lifecycle_probe_connections_rejected_total`). Handles share the registered family; clones
/// count into the same series.
#[derive(Clone)]
pub struct ConnectionCounters {
    /// The source address is not allowed (`--probe-allow-from`).
    pub source: IntCounter,
    /// The listener already had its maximum of connections open.
    pub busy: IntCounter,
    /// The request head did not arrive within the deadline.
    pub timeout: IntCounter,
    /// Its source had connections kept too often ([`super::listener::KEEP_RATE`]).
    pub rate: IntCounter,
}

impl ConnectionCounters {
    /// Counters that are not registered anywhere (tests, benchmarks).
    pub fn unregistered() -> Self {
        Self::from_family(&connection_family())
    }

    fn from_family(family: &IntCounterVec) -> Self {
        Self::from_series(|reason| family.with_label_values(&[reason]))
    }

    /// The counters `series` gives for each reason (`source`, `busy`, `timeout`, `rate`).
    pub(crate) fn from_series(series: impl Fn(&str) -> IntCounter) -> Self {
        Self { source: series("source"), busy: series("busy"), timeout: series("timeout"), rate: series("rate") }
    }
}

fn connection_family() -> IntCounterVec {
    // A constant, valid name and label set: `new` cannot fail.
    vec_of(AgentFamily::ProbeConnectionsRejected, IntCounterVec::new).expect("valid metric")
}

/// The probe metric families.
pub struct ProbeMetrics {
    result: IntGaugeVec,
    transitions: IntCounterVec,
    requests: IntCounterVec,
    duration: HistogramVec,
    declarations_refused: IntCounterVec,
    connections: ConnectionCounters,
    forbidden: IntCounter,
    series_dropped: IntCounter,
    ports_untracked: IntCounter,
    /// Last result per exported (target, check label), to count transitions.
    last: Mutex<HashMap<(ProbeTarget, String), bool>>,
    /// (target, check label) left out by the per-pod cap, so each is counted once.
    dropped: Mutex<HashSet<(ProbeTarget, String)>>,
    /// Accept stalls seen by tcp checks (a pass turning into a stall), for Kubernetes Events.
    stalls: Mutex<Vec<PodWarning>>,
}

/// A tcp check's failure that means the application stopped accepting (not a closed listener).
fn is_accept_stall(label: &str, reason: &str) -> bool {
    label.starts_with("tcp") && (reason.contains("waiting unaccepted") || reason.contains("accept queue overflowed"))
}

/// Stall warnings kept until taken; beyond this the newest are dropped.
const MAX_STALL_WARNINGS: usize = 256;

impl ProbeMetrics {
    /// Accept stalls noted since the last call (a declared tcp check that passed and now sees
    /// connections waiting unaccepted, or an overflowed queue).
    pub(crate) fn take_stall_warnings(&self) -> Vec<PodWarning> {
        std::mem::take(&mut *self.stalls.lock())
    }

    fn note_stall(&self, target: &ProbeTarget, reason: &str) {
        let mut stalls = self.stalls.lock();
        if stalls.len() < MAX_STALL_WARNINGS {
            stalls.push(PodWarning {
                namespace: target.namespace.clone(),
                pod: target.pod.clone(),
                pod_uid: String::new(),
                container: target.container.clone(),
                reason: WarningReason::AcceptStall,
                note: reason.to_owned(),
            });
        }
    }

    /// Creates the families and registers them into `registry`.
    pub fn register(registry: &Registry) -> Result<Arc<Self>, prometheus::Error> {
        let result = vec_of(AgentFamily::ProbeResult, IntGaugeVec::new)?;
        let transitions = vec_of(AgentFamily::ProbeTransitions, IntCounterVec::new)?;
        let requests = vec_of(AgentFamily::ProbeRequests, IntCounterVec::new)?;
        let duration = {
            let family = AgentFamily::ProbeDuration.family();
            let buckets = vec![1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2];
            HistogramVec::new(family.histogram_opts(buckets), family.labels)?
        };
        let declarations_refused = vec_of(AgentFamily::ProbeDeclarationsRefused, IntCounterVec::new)?;
        for reason in RefusalReason::ALL {
            declarations_refused.with_label_values(&[reason.label()]).inc_by(0);
        }
        let connections = connection_family();
        let forbidden = IntCounter::with_opts(AgentFamily::ProbeRequestsForbidden.family().opts())?;
        let series_dropped = IntCounter::with_opts(AgentFamily::ProbeSeriesDropped.family().opts())?;
        registry.register(Box::new(result.clone()))?;
        registry.register(Box::new(transitions.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(declarations_refused.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(forbidden.clone()))?;
        let ports_untracked = IntCounter::with_opts(AgentFamily::ProbePortsUntracked.family().opts())?;
        registry.register(Box::new(series_dropped.clone()))?;
        registry.register(Box::new(ports_untracked.clone()))?;
        Ok(Arc::new(Self {
            stalls: Mutex::new(Vec::new()),
            result,
            transitions,
            requests,
            duration,
            declarations_refused,
            connections: ConnectionCounters::from_family(&connections),
            forbidden,
            series_dropped,
            ports_untracked,
            last: Mutex::new(HashMap::new()),
            dropped: Mutex::new(HashSet::new()),
        }))
    }

    /// Whether (`target`, `label`) has, or may now get, series; counts it once when the pod's
    /// cap leaves it out.
    fn exported(&self, last: &HashMap<(ProbeTarget, String), bool>, target: &ProbeTarget, label: &str) -> bool {
        let key = (target.clone(), label.to_owned());
        if last.contains_key(&key) {
            return true;
        }
        if last.keys().filter(|(t, _)| t.same_pod(target)).count() < MAX_CHECK_SERIES_PER_POD {
            return true;
        }
        if self.dropped.lock().insert(key) {
            self.series_dropped.inc();
        }
        false
    }

    /// Records a verdict; counts and logs a transition when it differs from the last one.
    pub(crate) fn record_result(&self, target: &ProbeTarget, label: &str, verdict: &Verdict) {
        let previous = {
            let mut last = self.last.lock();
            if !self.exported(&last, target, label) {
                return;
            }
            last.insert((target.clone(), label.to_owned()), verdict.pass)
        };
        let values = [target.namespace.as_str(), &target.pod, &target.container, label];
        self.result.with_label_values(&values).set(i64::from(verdict.pass));
        match previous {
            Some(before) if before != verdict.pass => {
                self.transitions.with_label_values(&values).inc();
                if before && is_accept_stall(label, &verdict.reason) {
                    self.note_stall(target, &verdict.reason);
                }
                log::info!(
                    "probe {}/{}/{} {label}: {} -> {}: {}",
                    target.namespace,
                    target.pod,
                    target.container,
                    pass_word(before),
                    pass_word(verdict.pass),
                    verdict.reason
                );
            }
            // First result: the transitions series starts at 0 so rate() sees the first flip.
            None => {
                self.transitions.with_label_values(&values).inc_by(0);
            }
            _ => {}
        }
    }

    /// Counts one answered request of a declared check and its duration.
    pub(crate) fn record_request(&self, target: &ProbeTarget, label: &str, kind: &str, code: u16, seconds: f64) {
        self.duration.with_label_values(&[kind]).observe(seconds);
        if !self.last.lock().contains_key(&(target.clone(), label.to_owned())) {
            return;
        }
        let code = code.to_string();
        self.requests.with_label_values(&[&target.namespace, &target.pod, &target.container, label, &code]).inc();
    }

    /// Counts one request answered 403.
    pub(crate) fn record_forbidden(&self) {
        self.forbidden.inc();
    }

    /// Counts one refused declaration entry.
    /// Ports of a probed netns the model did not track (see `model::node::MAX_TRACKED_PORTS`).
    pub(crate) fn record_untracked_ports(&self, n: u64) {
        self.ports_untracked.inc_by(n);
    }

    pub(crate) fn record_refusal(&self, reason: RefusalReason) {
        self.declarations_refused.with_label_values(&[reason.label()]).inc();
    }

    /// The shared handles the pod listeners count rejected connections with.
    pub(crate) fn connection_counters(&self) -> ConnectionCounters {
        self.connections.clone()
    }

    /// Drops the series of one check of a container (no longer declared).
    pub(crate) fn forget_check(&self, target: &ProbeTarget, label: &str) {
        let key = (target.clone(), label.to_owned());
        self.dropped.lock().remove(&key);
        if self.last.lock().remove(&key).is_some() {
            self.remove_series(target, label);
        }
    }

    /// Drops every series of a container that went away.
    pub(crate) fn forget(&self, target: &ProbeTarget) {
        self.dropped.lock().retain(|(t, _)| t != target);
        let mut last = self.last.lock();
        last.retain(|(t, label), _| {
            if t != target {
                return true;
            }
            self.remove_series(t, label);
            false
        });
    }

    fn remove_series(&self, t: &ProbeTarget, label: &str) {
        let values = [t.namespace.as_str(), &t.pod, &t.container, label];
        let _ = self.result.remove_label_values(&values);
        let _ = self.transitions.remove_label_values(&values);
        // Requests are only counted for declared checks, answered 200 or 503.
        for code in ["200", "503"] {
            let _ = self.requests.remove_label_values(&[&t.namespace, &t.pod, &t.container, label, code]);
        }
    }
}

fn pass_word(pass: bool) -> &'static str {
    if pass {
        "pass"
    } else {
        "fail"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder as _;

    fn render(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new().encode(&registry.gather(), &mut out).expect("encode");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn a_tcp_check_turning_to_a_stall_is_a_warning_once() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let target = ProbeTarget { namespace: "shop".into(), pod: "web-1".into(), container: "app".into() };
        let stall = Verdict::fail("port 8080: 3 connections waiting unaccepted for 7.2s (stall limit 5s)");
        metrics.record_result(&target, "tcp:8080", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:8080", &stall);
        metrics.record_result(&target, "tcp:8080", &stall);
        let warnings = metrics.take_stall_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!((warnings[0].reason, warnings[0].pod.as_str()), (WarningReason::AcceptStall, "web-1"));
        metrics.record_result(&target, "tcp:8080", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:8080", &Verdict::fail("listener on 8080 closed"));
        assert!(metrics.take_stall_warnings().is_empty(), "a closed listener is not a stall");
    }

    #[test]
    fn results_transitions_requests_and_bounded_labels() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let target = ProbeTarget { namespace: "ns".into(), pod: "p".into(), container: "c".into() };
        metrics.record_result(&target, "tcp:80", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:80", &Verdict::fail("closed"));
        metrics.record_result(&target, "tcp:80", &Verdict::fail("closed"));
        metrics.record_request(&target, "tcp:80", "tcp", 503, 0.00001);
        let text = render(&registry);
        assert!(
            text.contains(r#"lifecycle_probe_result{check="tcp:80",container="c",namespace="ns",pod="p"} 0"#),
            "{text}"
        );
        assert!(text
            .contains(r#"lifecycle_probe_transitions_total{check="tcp:80",container="c",namespace="ns",pod="p"} 1"#));
        assert!(text.contains(
            r#"lifecycle_probe_requests_total{check="tcp:80",code="503",container="c",namespace="ns",pod="p"} 1"#
        ));
        assert!(text.contains(r#"lifecycle_probe_duration_seconds_count{check="tcp"} 1"#));
        // The cap is per pod, across its containers; what it leaves out is counted once each.
        let sidecar = ProbeTarget { container: "sidecar".into(), ..target.clone() };
        for round in 0..2 {
            for port in 0..40 {
                let who = if port % 2 == 0 { &target } else { &sidecar };
                metrics.record_result(who, &format!("tcp:{port}"), &Verdict::pass("ok"));
                metrics.record_request(who, &format!("tcp:{port}"), "tcp", 200, 0.00001);
            }
            let text = render(&registry);
            let series = |family: &str| text.lines().filter(|l| l.starts_with(family)).count();
            assert_eq!(series("lifecycle_probe_result{"), MAX_CHECK_SERIES_PER_POD, "round {round}");
            assert!(series("lifecycle_probe_requests_total{") <= MAX_CHECK_SERIES_PER_POD + 1);
            assert!(text.contains("lifecycle_probe_series_dropped_total 9\n"), "41 checks, 32 kept\n{text}");
        }
        assert!(!text.contains("other"));
        metrics.forget(&target);
        metrics.forget(&sidecar);
        let text = render(&registry);
        assert!(!text.contains("lifecycle_probe_result{"), "{text}");
        assert!(!text.contains("lifecycle_probe_requests_total{"), "{text}");
    }

    #[test]
    fn refusals_and_rejections_are_counted_under_fixed_labels() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let text = render(&registry);
        for reason in ["unparsable", "forbidden_path", "too_many"] {
            assert!(text.contains(&format!("lifecycle_probe_declarations_refused_total{{reason=\"{reason}\"}} 0")));
        }
        for reason in ["source", "busy", "timeout"] {
            assert!(text.contains(&format!("lifecycle_probe_connections_rejected_total{{reason=\"{reason}\"}} 0")));
        }
        metrics.record_refusal(RefusalReason::ForbiddenPath);
        metrics.record_forbidden();
        let counters = metrics.connection_counters();
        counters.busy.inc();
        let text = render(&registry);
        assert!(text.contains("lifecycle_probe_declarations_refused_total{reason=\"forbidden_path\"} 1"));
        assert!(text.contains("lifecycle_probe_connections_rejected_total{reason=\"busy\"} 1"));
        assert!(text.contains("lifecycle_probe_requests_forbidden_total 1"));
        assert_eq!(ConnectionCounters::unregistered().busy.get(), 0, "unregistered handles are their own");
    }

    #[test]
    fn a_check_no_longer_declared_loses_its_series() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let target = ProbeTarget { namespace: "ns".into(), pod: "p".into(), container: "c".into() };
        metrics.record_result(&target, "process", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:80", &Verdict::pass("ok"));
        metrics.forget_check(&target, "tcp:80");
        let text = render(&registry);
        assert!(text.contains(r#"check="process""#) && !text.contains(r#"check="tcp:80""#), "{text}");
    }
}
