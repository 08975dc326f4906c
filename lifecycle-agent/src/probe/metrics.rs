//! Probe metrics: current result and transitions per check, requests by answer code, and the
//! time to answer, registered into the registry the caller passes in.
//!
//! Label values are bounded: `check` is the canonical check text (`tcp:8080`, `process`,
//! `file:/tmp/healthy`, `all:...`), and a pod gets at most [`MAX_CHECKS_PER_POD`] distinct ones;
//! further checks are counted under `check="other"` (anything inside the pod's netns can send
//! requests, so paths must not mint series). The histogram's `check` is the kind only.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::check::Verdict;
use crate::export::metrics::NAMESPACE;

/// Distinct `check` label values per pod before falling back to `other`.
pub const MAX_CHECKS_PER_POD: usize = 16;

/// Which container a probe speaks for (the kube-state-metrics label names).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeTarget {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The probe metric families.
pub struct ProbeMetrics {
    result: IntGaugeVec,
    transitions: IntCounterVec,
    requests: IntCounterVec,
    duration: HistogramVec,
    /// Last result per (target, check label), to count transitions.
    last: Mutex<HashMap<(ProbeTarget, String), bool>>,
}

impl ProbeMetrics {
    /// Creates the families and registers them into `registry`.
    pub fn register(registry: &Registry) -> Result<Arc<Self>, prometheus::Error> {
        let labels = ["namespace", "pod", "container", "check"];
        let result = IntGaugeVec::new(
            Opts::new("probe_result", "Last result of an agent probe check: 1 pass, 0 fail.").namespace(NAMESPACE),
            &labels,
        )?;
        let transitions = IntCounterVec::new(
            Opts::new("probe_transitions_total", "Times an agent probe check changed between pass and fail.")
                .namespace(NAMESPACE),
            &labels,
        )?;
        let requests = IntCounterVec::new(
            Opts::new("probe_requests_total", "Probe HTTP requests answered, by HTTP status code.")
                .namespace(NAMESPACE),
            &["namespace", "pod", "container", "check", "code"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new("probe_duration_seconds", "Time to answer a probe request from cached state.")
                .namespace(NAMESPACE)
                .buckets(vec![1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2]),
            &["check"],
        )?;
        registry.register(Box::new(result.clone()))?;
        registry.register(Box::new(transitions.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Arc::new(Self { result, transitions, requests, duration, last: Mutex::new(HashMap::new()) }))
    }

    /// The label to use for `check` of `target`, keeping the per-pod cardinality bounded.
    pub fn check_label(&self, target: &ProbeTarget, label: &str) -> String {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.contains_key(&(target.clone(), label.to_owned())) {
            return label.to_owned();
        }
        let count = last.keys().filter(|(t, _)| t == target).count();
        if count >= MAX_CHECKS_PER_POD {
            "other".to_owned()
        } else {
            label.to_owned()
        }
    }

    /// Records a verdict; counts and logs a transition when it differs from the last one.
    pub fn record_result(&self, target: &ProbeTarget, check: &str, verdict: &Verdict) {
        let label = self.check_label(target, check);
        let values = [target.namespace.as_str(), &target.pod, &target.container, &label];
        self.result.with_label_values(&values).set(i64::from(verdict.pass));
        let previous = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            last.insert((target.clone(), label.clone()), verdict.pass)
        };
        match previous {
            Some(before) if before != verdict.pass => {
                self.transitions.with_label_values(&values).inc();
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

    /// Counts one answered request and its duration.
    pub fn record_request(&self, target: &ProbeTarget, check: &str, kind: &str, code: u16, seconds: f64) {
        let label = self.check_label(target, check);
        let code = code.to_string();
        self.requests.with_label_values(&[&target.namespace, &target.pod, &target.container, &label, &code]).inc();
        self.duration.with_label_values(&[kind]).observe(seconds);
    }

    /// Drops every series of a pod that went away.
    pub fn forget(&self, target: &ProbeTarget) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|(t, label), _| {
            if t != target {
                return true;
            }
            let values = [t.namespace.as_str(), &t.pod, &t.container, label];
            let _ = self.result.remove_label_values(&values);
            let _ = self.transitions.remove_label_values(&values);
            false
        });
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
        for port in 0..40 {
            metrics.record_result(&target, &format!("tcp:{port}"), &Verdict::pass("ok"));
        }
        let text = render(&registry);
        let series = text.lines().filter(|l| l.starts_with("lifecycle_probe_result{")).count();
        assert_eq!(series, MAX_CHECKS_PER_POD + 1, "16 checks plus `other`");
        metrics.forget(&target);
        assert!(!render(&registry).contains("lifecycle_probe_result{"));
    }
}
