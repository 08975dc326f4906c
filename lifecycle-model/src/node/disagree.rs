//! Where the kubelet's reported status disagrees with what the kernel saw. For each container
//! the API reports, its terminated states are matched to the instances the kernel saw end (by
//! container id) and compared: OOM kills the runtime missed or invented, exit codes, and the
//! restart count of the running instance. Each disagreement is counted once per instance and
//! kind, and the last few are kept with both sides for the API.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{warning::WarningReason, NodeTracker, UnitKey};
use crate::{
    container_state::TerminatedReason,
    spec::{PodFacts, ReportedState},
};

/// Instance ends kept per unit to match the API's reports against.
const KEPT_ENDS: usize = 8;
/// Disagreements kept per unit for the API view.
const KEPT_DISAGREEMENTS: usize = 8;

/// What the kernel saw of one instance's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InstanceEnd {
    pub(super) container_id: String,
    pub(super) reason: TerminatedReason,
    pub(super) exit_code: i32,
    /// The OOM killer chose the container's init.
    pub(super) oom_init: bool,
}

/// A kind of disagreement (a bounded metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DisagreementKind {
    /// The kubelet reported OOMKilled; the kernel's OOM killer did not kill the init.
    OomReportedNotOom,
    /// The kernel's OOM killer killed the init; the kubelet reported another reason.
    OomNotReported,
    /// The kubelet reported another exit code than the kernel saw.
    ExitCode,
    /// The kubelet's restart count differs from the restarts seen (with the count the kubelet
    /// wrote on the first instance the agent saw as the base).
    RestartCount,
}

crate::spelling::spelling!(DisagreementKind {
    OomReportedNotOom => "oom_reported_not_oom",
    OomNotReported => "oom_not_reported",
    ExitCode => "exit_code",
    RestartCount => "restart_count",
});

/// One disagreement, with both sides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disagreement {
    pub kind: DisagreementKind,
    pub container_id: String,
    /// What the kubelet reported.
    pub kubelet: String,
    /// What the kernel saw.
    pub kernel: String,
}

/// A unit's record of its ends and disagreements.
#[derive(Clone, Debug, Default)]
pub(super) struct StatusCheck {
    pub(super) ends: VecDeque<InstanceEnd>,
    pub(super) recent: VecDeque<Disagreement>,
    /// (container id, kind) already counted.
    counted: Vec<(String, DisagreementKind)>,
    /// The kubelet's restart count written on the first instance seen (CRI annotation).
    pub(super) restart_base: Option<u32>,
}

impl StatusCheck {
    pub(super) fn on_end(&mut self, end: InstanceEnd) {
        if self.ends.len() == KEPT_ENDS {
            self.ends.pop_front();
        }
        self.ends.push_back(end);
    }

    /// Records a disagreement once; returns whether it is new.
    fn record(&mut self, disagreement: Disagreement) -> bool {
        let key = (disagreement.container_id.clone(), disagreement.kind);
        if self.counted.contains(&key) {
            return false;
        }
        if self.counted.len() >= KEPT_ENDS * 4 {
            self.counted.remove(0);
        }
        self.counted.push(key);
        if self.recent.len() == KEPT_DISAGREEMENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(disagreement);
        true
    }
}

/// The disagreements between one reported terminated state and the kernel's view of that end.
fn compare_end(end: &InstanceEnd, reason: &str, exit_code: i32) -> Vec<Disagreement> {
    let mut out = Vec::new();
    let kernel_reason = match end.reason {
        TerminatedReason::Completed => "Completed",
        TerminatedReason::Error => "Error",
        TerminatedReason::OomKilled => "OOMKilled",
        TerminatedReason::Unknown => "Unknown",
    };
    let both = |kind| Disagreement {
        kind,
        container_id: end.container_id.clone(),
        kubelet: format!("{reason} ({exit_code})"),
        kernel: format!("{kernel_reason} ({})", end.exit_code),
    };
    if reason == "OOMKilled" && !end.oom_init {
        out.push(both(DisagreementKind::OomReportedNotOom));
    }
    if end.oom_init && reason != "OOMKilled" {
        out.push(both(DisagreementKind::OomNotReported));
    }
    if end.reason != TerminatedReason::Unknown && exit_code != end.exit_code {
        out.push(both(DisagreementKind::ExitCode));
    }
    out
}

impl NodeTracker {
    /// Compares what the API reports for pod `pod`'s containers with what the kernel saw.
    pub(super) fn check_reported_status(&mut self, pod: &PodFacts) {
        for reported in &pod.reported {
            let key = UnitKey::Container { pod_uid: pod.uid.clone(), container: reported.name.clone() };
            let Some(unit) = self.units.get_mut(&key) else { continue };
            let mut found = Vec::new();
            for state in [&reported.state, &reported.last_state].into_iter().flatten() {
                let ReportedState::Terminated { reason, exit_code, container_id: Some(id), .. } = state else {
                    continue;
                };
                if let Some(end) = unit.status_check.ends.iter().find(|e| &e.container_id == id) {
                    found.extend(compare_end(end, reason, *exit_code));
                }
            }
            let running_now = matches!(reported.state, Some(ReportedState::Running))
                && reported.container_id.is_some()
                && reported.container_id == unit.container_id;
            if let (true, Some(base)) = (running_now, unit.status_check.restart_base) {
                let seen = base.saturating_add(unit.status.restart_count());
                if seen != reported.restart_count {
                    found.push(Disagreement {
                        kind: DisagreementKind::RestartCount,
                        container_id: unit.container_id.clone().unwrap_or_default(),
                        kubelet: reported.restart_count.to_string(),
                        kernel: seen.to_string(),
                    });
                }
            }
            for disagreement in found {
                let kind = disagreement.kind;
                let note = format!(
                    "the kubelet reported {} where the kernel saw {} (container {})",
                    disagreement.kubelet,
                    disagreement.kernel,
                    disagreement.container_id.chars().take(12).collect::<String>()
                );
                if unit.status_check.record(disagreement) {
                    *unit.counters.disagreements.entry(kind).or_default() += 1;
                    unit.warn(WarningReason::StatusDisagreement, note);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(reason: TerminatedReason, exit_code: i32, oom_init: bool) -> InstanceEnd {
        InstanceEnd { container_id: "c1".into(), reason, exit_code, oom_init }
    }

    #[test]
    fn a_pid_1_oom_kill_reported_as_error_137_is_a_disagreement() {
        let kinds = |found: Vec<Disagreement>| found.into_iter().map(|d| d.kind).collect::<Vec<_>>();
        // Seen on a real node: containerd reported a real PID-1 OOM kill as Error 137.
        assert_eq!(
            kinds(compare_end(&end(TerminatedReason::OomKilled, 137, true), "Error", 137)),
            vec![DisagreementKind::OomNotReported]
        );
        assert_eq!(
            kinds(compare_end(&end(TerminatedReason::Error, 137, false), "OOMKilled", 137)),
            vec![DisagreementKind::OomReportedNotOom]
        );
        assert_eq!(
            kinds(compare_end(&end(TerminatedReason::Error, 143, false), "Error", 137)),
            vec![DisagreementKind::ExitCode]
        );
        assert!(compare_end(&end(TerminatedReason::Completed, 0, false), "Completed", 0).is_empty());
    }

    #[test]
    fn each_disagreement_counts_once() {
        let mut check = StatusCheck::default();
        let d = Disagreement {
            kind: DisagreementKind::ExitCode,
            container_id: "c1".into(),
            kubelet: "Error (1)".into(),
            kernel: "Error (2)".into(),
        };
        assert!(check.record(d.clone()));
        assert!(!check.record(d));
        assert_eq!(check.recent.len(), 1);
    }
}
