//! Warnings worth a Kubernetes Event on the Pod (`kubectl describe pod` shows them): a SIGKILL
//! after the grace period, a restart off the kubelet's back-off, a status the kubelet reported
//! wrong. The model only notes them on the unit; the plumbing publishes them (opt-in, rate
//! limited) and drops what it cannot.

use serde::Serialize;

use super::{NodeTracker, Unit, UnitKey};

/// Warnings kept per unit until taken.
const MAX_PENDING: usize = 8;

/// The Event's reason: a bounded set of CamelCase words, as Kubernetes events use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum WarningReason {
    /// The container was SIGKILLed after its grace period.
    GracePeriodExceeded,
    /// The container was SIGKILLed before its grace period ran out: not the app's doing.
    KilledBeforeGracePeriod,
    /// A restart came earlier or later than the kubelet's back-off allows.
    BackOffDeviation,
    /// The kubelet's reported status disagrees with what the kernel saw.
    StatusDisagreement,
    /// A declared tcp probe saw connections wait unaccepted past its limit (the app stopped
    /// accepting while the kernel still completes handshakes, which a tcpSocket probe misses).
    AcceptStall,
}

impl WarningReason {
    /// The reason as the Event carries it.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningReason::GracePeriodExceeded => "GracePeriodExceeded",
            WarningReason::KilledBeforeGracePeriod => "KilledBeforeGracePeriod",
            WarningReason::BackOffDeviation => "BackOffDeviation",
            WarningReason::StatusDisagreement => "StatusDisagreement",
            WarningReason::AcceptStall => "AcceptStall",
        }
    }
}

/// One warning about a container of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodWarning {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
    pub reason: WarningReason,
    /// One line for people.
    pub note: String,
}

impl Unit {
    pub(super) fn warn(&mut self, reason: WarningReason, note: String) {
        if self.pending_warnings.len() < MAX_PENDING {
            self.pending_warnings.push((reason, note));
        }
    }
}

impl NodeTracker {
    /// Warnings since the last call, for pods with a name (containers named by id are not
    /// Kubernetes objects the agent can point at yet).
    pub fn take_warnings(&mut self) -> Vec<PodWarning> {
        let mut out = Vec::new();
        for unit in self.units.changing(|unit| !unit.pending_warnings.is_empty()) {
            let pending = std::mem::take(&mut unit.pending_warnings);
            let UnitKey::Container { pod_uid, .. } = &unit.key else { continue };
            if unit.labels.pod.is_empty() {
                continue;
            }
            for (reason, note) in pending {
                out.push(PodWarning {
                    namespace: unit.labels.namespace.clone(),
                    pod: unit.labels.pod.clone(),
                    pod_uid: pod_uid.clone(),
                    container: unit.labels.container.clone(),
                    reason,
                    note,
                });
            }
        }
        out
    }
}
