//! Who a probe speaks for: a container's identity, the model's [`ProbeKey`] (its pod's uid and
//! its name), and the names it is known by (kube-state-metrics' labels, uid included).
//!
//! The probe layer keys everything by the key: a pod recreated under the same name (a
//! StatefulSet's) is another pod, with its own probe, series and warnings, while the departing
//! one may still be terminating. The names only travel beside it, for what people and the
//! kubelet read: metric labels, log lines, warnings and routing by name (`server.rs`).

use std::fmt;

use crate::model::node::{ProbeKey, UnitLabels};

/// A probed container: its key and its names, which always agree (both come from one
/// [`UnitLabels`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbedContainer {
    key: ProbeKey,
    labels: UnitLabels,
}

impl ProbedContainer {
    /// The container the model labels `labels`.
    pub fn new(labels: UnitLabels) -> Self {
        Self { key: ProbeKey::of(&labels), labels }
    }

    /// Its identity in the model: its pod's uid and its name.
    pub fn key(&self) -> &ProbeKey {
        &self.key
    }

    /// Its namespace, pod, container and uid, as its series carry them.
    pub fn labels(&self) -> &UnitLabels {
        &self.labels
    }
}

/// `namespace/pod/container`, as log lines and the node's probe paths name it.
impl fmt::Display for ProbedContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let UnitLabels { namespace, pod, container, .. } = &self.labels;
        write!(f, "{namespace}/{pod}/{container}")
    }
}
