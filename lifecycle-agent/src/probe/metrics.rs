//! Probe metrics: current result and transitions per check, requests by answer code, the time
//! to answer, and what the probe surface refused (declarations, connections, requests),
//! registered into the registry the caller passes in.
//!
//! Label values are bounded: `check` is the canonical text of a *declared* check (`tcp:8080`,
//! `process`, `file:/tmp/healthy`, `all:...`) — requests never mint series, they are answered
//! only for declared checks — and a pod (by its uid) gets at most [`MAX_CHECK_SERIES_PER_POD`]
//! (container, check) series; past that, results are not exported and
//! `lifecycle_probe_series_dropped_total` counts the checks left out. Every other label comes
//! from a fixed set.
//!
//! The per-check series are kept by container key ([`ProbedContainer::key`]) and carry its
//! labels with `uid`, as every per-container family does: a pod recreated under its name has
//! series of its own beside the departing pod's, never the same series twice.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use parking_lot::Mutex;

use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};

use crate::model::node::{PodWarning, ProbeKey, UnitLabels, WarningReason};

use super::{check::Verdict, container::ProbedContainer, declaration::RefusalReason};

/// (container, check) series a pod may have; checks past it answer but are not exported.
pub(crate) const MAX_CHECK_SERIES_PER_POD: usize = 32;

/// The exported checks of one container: the labels their series carry, and each check's last
/// result (to count transitions).
struct ContainerSeries {
    labels: UnitLabels,
    last: HashMap<String, bool>,
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
    /// The containers with exported checks, by key.
    series: Mutex<HashMap<ProbeKey, ContainerSeries>>,
    /// (container, check label) left out by the per-pod cap, so each is counted once.
    dropped: Mutex<HashSet<(ProbeKey, String)>>,
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

    fn note_stall(&self, labels: &UnitLabels, reason: &str) {
        let mut stalls = self.stalls.lock();
        if stalls.len() < MAX_STALL_WARNINGS {
            stalls.push(PodWarning {
                namespace: labels.namespace.clone(),
                pod: labels.pod.clone(),
                pod_uid: labels.uid.clone(),
                container: labels.container.clone(),
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
            series: Mutex::new(HashMap::new()),
            dropped: Mutex::new(HashSet::new()),
        }))
    }

    /// Whether `key`'s check `label` has, or may now get, series; counts it once when its
    /// pod's cap (per pod uid) leaves it out.
    fn exported(&self, series: &HashMap<ProbeKey, ContainerSeries>, key: &ProbeKey, label: &str) -> bool {
        if series.get(key).is_some_and(|container| container.last.contains_key(label)) {
            return true;
        }
        let pod_series: usize =
            series.iter().filter(|(other, _)| other.uid == key.uid).map(|(_, container)| container.last.len()).sum();
        if pod_series < MAX_CHECK_SERIES_PER_POD {
            return true;
        }
        if self.dropped.lock().insert((key.clone(), label.to_owned())) {
            self.series_dropped.inc();
        }
        false
    }

    /// Records a verdict; counts and logs a transition when it differs from the last one.
    pub(crate) fn record_result(&self, container: &ProbedContainer, label: &str, verdict: &Verdict) {
        let (key, labels) = (container.key(), container.labels());
        let previous = {
            let mut series = self.series.lock();
            // A container now known under other names starts afresh: its series under the old
            // ones would otherwise never be removed.
            if series.get(key).is_some_and(|known| known.labels != *labels) {
                if let Some(stale) = series.remove(key) {
                    stale.last.keys().for_each(|check| self.remove_series(&stale.labels, check));
                }
            }
            if !self.exported(&series, key, label) {
                return;
            }
            match series.get_mut(key) {
                Some(known) => known.last.insert(label.to_owned(), verdict.pass),
                None => {
                    let last = HashMap::from([(label.to_owned(), verdict.pass)]);
                    series.insert(key.clone(), ContainerSeries { labels: labels.clone(), last });
                    None
                }
            }
        };
        let values = [labels.namespace.as_str(), &labels.pod, &labels.container, &labels.uid, label];
        self.result.with_label_values(&values).set(i64::from(verdict.pass));
        match previous {
            Some(before) if before != verdict.pass => {
                self.transitions.with_label_values(&values).inc();
                if before && is_accept_stall(label, &verdict.reason) {
                    self.note_stall(labels, &verdict.reason);
                }
                log::info!(
                    "probe {container} {label}: {} -> {}: {}",
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
    pub(crate) fn record_request(&self, key: &ProbeKey, label: &str, kind: &str, code: u16, seconds: f64) {
        self.duration.with_label_values(&[kind]).observe(seconds);
        let series = self.series.lock();
        // Counted under the labels its results are exported with, so they go together.
        let Some(container) = series.get(key).filter(|container| container.last.contains_key(label)) else {
            return;
        };
        let UnitLabels { namespace, pod, container, uid } = &container.labels;
        let code = code.to_string();
        self.requests.with_label_values(&[namespace, pod, container, uid, label, &code]).inc();
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
    pub(crate) fn forget_check(&self, key: &ProbeKey, label: &str) {
        self.dropped.lock().remove(&(key.clone(), label.to_owned()));
        let mut series = self.series.lock();
        let Some(container) = series.get_mut(key) else { return };
        if container.last.remove(label).is_some() {
            self.remove_series(&container.labels, label);
        }
        if container.last.is_empty() {
            series.remove(key);
        }
    }

    /// Drops every series of a container that went away.
    pub(crate) fn forget(&self, key: &ProbeKey) {
        self.dropped.lock().retain(|(dropped, _)| dropped != key);
        if let Some(container) = self.series.lock().remove(key) {
            container.last.keys().for_each(|label| self.remove_series(&container.labels, label));
        }
    }

    fn remove_series(&self, labels: &UnitLabels, label: &str) {
        let UnitLabels { namespace, pod, container, uid } = labels;
        let values = [namespace.as_str(), pod, container, uid, label];
        let _ = self.result.remove_label_values(&values);
        let _ = self.transitions.remove_label_values(&values);
        // Requests are only counted for declared checks, answered 200 or 503.
        for code in ["200", "503"] {
            let _ = self.requests.remove_label_values(&[namespace, pod, container, uid, label, code]);
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

    fn container(namespace: &str, pod: &str, container: &str, uid: &str) -> ProbedContainer {
        ProbedContainer::new(UnitLabels {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
            uid: uid.into(),
        })
    }

    #[test]
    fn a_tcp_check_turning_to_a_stall_is_a_warning_once() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let target = container("shop", "web-1", "app", "u-web-1");
        let stall = Verdict::fail("port 8080: 3 connections waiting unaccepted for 7.2s (stall limit 5s)");
        metrics.record_result(&target, "tcp:8080", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:8080", &stall);
        metrics.record_result(&target, "tcp:8080", &stall);
        let warnings = metrics.take_stall_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!((warnings[0].reason, warnings[0].pod.as_str()), (WarningReason::AcceptStall, "web-1"));
        // The pod's uid: the Event names this pod, not another one under its name.
        assert_eq!((warnings[0].pod_uid.as_str(), warnings[0].container.as_str()), ("u-web-1", "app"));
        metrics.record_result(&target, "tcp:8080", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:8080", &Verdict::fail("listener on 8080 closed"));
        assert!(metrics.take_stall_warnings().is_empty(), "a closed listener is not a stall");
    }

    #[test]
    fn results_transitions_requests_and_bounded_labels() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let target = container("ns", "p", "c", "u");
        metrics.record_result(&target, "tcp:80", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:80", &Verdict::fail("closed"));
        metrics.record_result(&target, "tcp:80", &Verdict::fail("closed"));
        metrics.record_request(target.key(), "tcp:80", "tcp", 503, 0.00001);
        let text = render(&registry);
        assert!(
            text.contains(r#"lifecycle_probe_result{check="tcp:80",container="c",namespace="ns",pod="p",uid="u"} 0"#),
            "{text}"
        );
        assert!(text.contains(
            r#"lifecycle_probe_transitions_total{check="tcp:80",container="c",namespace="ns",pod="p",uid="u"} 1"#
        ));
        assert!(text.contains(
            r#"lifecycle_probe_requests_total{check="tcp:80",code="503",container="c",namespace="ns",pod="p",uid="u"} 1"#
        ));
        assert!(text.contains(r#"lifecycle_probe_duration_seconds_count{check="tcp"} 1"#));
        // The cap is per pod, across its containers; what it leaves out is counted once each.
        let sidecar = container("ns", "p", "sidecar", "u");
        for round in 0..2 {
            for port in 0..40 {
                let who = if port % 2 == 0 { &target } else { &sidecar };
                metrics.record_result(who, &format!("tcp:{port}"), &Verdict::pass("ok"));
                metrics.record_request(who.key(), &format!("tcp:{port}"), "tcp", 200, 0.00001);
            }
            let text = render(&registry);
            let series = |family: &str| text.lines().filter(|l| l.starts_with(family)).count();
            assert_eq!(series("lifecycle_probe_result{"), MAX_CHECK_SERIES_PER_POD, "round {round}");
            assert!(series("lifecycle_probe_requests_total{") <= MAX_CHECK_SERIES_PER_POD + 1);
            assert!(text.contains("lifecycle_probe_series_dropped_total 9\n"), "41 checks, 32 kept\n{text}");
        }
        assert!(!text.contains("other"));
        metrics.forget(target.key());
        metrics.forget(sidecar.key());
        let text = render(&registry);
        assert!(!text.contains("lifecycle_probe_result{"), "{text}");
        assert!(!text.contains("lifecycle_probe_requests_total{"), "{text}");
    }

    #[test]
    fn a_pod_recreated_under_its_name_has_series_and_a_cap_of_its_own() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let (old, new) = (container("ns", "db-0", "db", "u-old"), container("ns", "db-0", "db", "u-new"));
        for port in 0..MAX_CHECK_SERIES_PER_POD {
            metrics.record_result(&old, &format!("tcp:{port}"), &Verdict::fail("closed"));
        }
        // The old pod is at its cap; the new one, under the same name, is not.
        metrics.record_result(&new, "tcp:0", &Verdict::pass("ok"));
        metrics.record_request(new.key(), "tcp:0", "tcp", 200, 0.00001);
        let text = render(&registry);
        assert!(text.contains("lifecycle_probe_series_dropped_total 0\n"), "{text}");
        let old_series =
            r#"lifecycle_probe_result{check="tcp:0",container="db",namespace="ns",pod="db-0",uid="u-old"} 0"#;
        let new_series =
            r#"lifecycle_probe_result{check="tcp:0",container="db",namespace="ns",pod="db-0",uid="u-new"} 1"#;
        assert!(text.contains(old_series) && text.contains(new_series), "{text}");
        // The old pod going takes its series only.
        metrics.forget(old.key());
        let text = render(&registry);
        assert!(!text.contains("u-old") && text.contains(new_series), "{text}");
        assert!(text.contains(
            r#"lifecycle_probe_requests_total{check="tcp:0",code="200",container="db",namespace="ns",pod="db-0",uid="u-new"} 1"#
        ));
    }

    #[test]
    fn a_container_probed_again_under_other_names_keeps_no_stale_series() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::register(&registry).expect("register");
        let by_id = container("ns", "3f2a9c81d0e4", "app", "u");
        let named = container("ns", "web-0", "app", "u");
        metrics.record_result(&by_id, "process", &Verdict::pass("ok"));
        metrics.record_result(&named, "process", &Verdict::pass("ok"));
        let text = render(&registry);
        assert!(!text.contains("3f2a9c81d0e4") && text.contains(r#"pod="web-0""#), "{text}");
        metrics.forget(named.key());
        assert!(!render(&registry).contains("lifecycle_probe_result{"));
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
        let target = container("ns", "p", "c", "u");
        metrics.record_result(&target, "process", &Verdict::pass("ok"));
        metrics.record_result(&target, "tcp:80", &Verdict::pass("ok"));
        metrics.forget_check(target.key(), "tcp:80");
        let text = render(&registry);
        assert!(text.contains(r#"check="process""#) && !text.contains(r#"check="tcp:80""#), "{text}");
    }
}
