//! Histograms kept as cumulative bucket counts, and the bucket bounds of the termination
//! distributions. They are filled from the judgements every change of the model returns (routed
//! by `owner.rs`) and never shrink, so the exported `_bucket`/`_count`/`_sum` series are true counters even
//! after the units that fed them expire.

use std::collections::BTreeMap;

use crate::model::{node::Judgement, termination::OutcomeKind};

/// Bucket upper bounds for termination durations, seconds.
pub(crate) const TERMINATION_BUCKETS: [f64; 12] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0];
/// Bucket upper bounds for the share of the grace period used.
pub(crate) const GRACE_RATIO_BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0];

/// A histogram kept as cumulative bucket counts (upper bounds given by the caller).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// Counts one value against `bounds`.
    pub(crate) fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (count, bound) in self.counts.iter_mut().zip(bounds) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// The termination distributions per namespace: stop-to-exit seconds per outcome, and the share
/// of the grace period used by exits within grace. Bounded by namespaces x outcomes.
#[derive(Debug, Default)]
pub(crate) struct TerminationHistograms {
    /// (namespace, outcome) -> stop signal to exit, seconds.
    pub durations: BTreeMap<(String, OutcomeKind), Histogram>,
    /// namespace -> share of the grace period used.
    pub grace_used: BTreeMap<String, Histogram>,
}

impl TerminationHistograms {
    /// Adds judged terminations.
    pub(crate) fn record(&mut self, judgements: impl IntoIterator<Item = Judgement>) {
        for judgement in judgements {
            if let Some(seconds) = judgement.stop_to_exit_seconds {
                self.durations
                    .entry((judgement.namespace.clone(), judgement.outcome))
                    .or_default()
                    .observe(&TERMINATION_BUCKETS, seconds);
            }
            if let Some(ratio) = judgement.grace_used_ratio {
                self.grace_used.entry(judgement.namespace).or_default().observe(&GRACE_RATIO_BUCKETS, ratio);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(&TERMINATION_BUCKETS, 3.0);
        h.observe(&TERMINATION_BUCKETS, 0.1);
        assert_eq!(h.counts, vec![1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]);
        assert_eq!((h.count, h.sum), (2, 3.1));
    }

    #[test]
    fn judgements_fill_per_namespace_distributions() {
        let mut all = TerminationHistograms::default();
        let judged = |ns: &str, seconds, ratio| Judgement {
            namespace: ns.to_owned(),
            outcome: OutcomeKind::ExitedWithinGrace,
            stop_to_exit_seconds: seconds,
            grace_used_ratio: ratio,
        };
        all.record([judged("a", Some(1.0), Some(0.5)), judged("a", None, None), judged("b", Some(2.0), None)]);
        assert_eq!(all.durations[&("a".to_owned(), OutcomeKind::ExitedWithinGrace)].count, 1);
        assert_eq!(all.durations[&("b".to_owned(), OutcomeKind::ExitedWithinGrace)].count, 1);
        assert_eq!(all.grace_used["a"].count, 1);
        assert!(!all.grace_used.contains_key("b"));
    }
}
