//! What one call into the tracker changed that its caller must act on, returned by that call:
//! the instances it ended (the exit -> state latency is measured from them), whether a
//! container's state changed otherwise (readers should see it at once), the terminations it
//! judged (the exporters' distributions) and the notices for the plumbing (rescan, ask the
//! runtime, read the kernel's OOM line). Nothing waits in the tracker between calls.

use super::{probed::ProbeChanges, Judgement, Notice, PodWarning};
use crate::time::BootTime;

/// A container instance (or a host unit's run) that its init's exit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub cgroup_id: u64,
    /// The exit's time: the kernel's, or the repair's for an exit it found.
    pub exit: BootTime,
}

/// The outcome of one call (see the module header).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub ended: Vec<Ended>,
    /// A unit appeared or a container started (besides the instances that ended): what
    /// readers are shown changed, not only counters.
    pub states_changed: bool,
    pub judgements: Vec<Judgement>,
    pub notices: Vec<Notice>,
    /// The probed containers whose facts changed (`probed.rs`): published at once.
    pub probes: ProbeChanges,
    /// Warnings for Kubernetes Events, handed over by `Command::FlushWarnings`.
    pub warnings: Vec<PodWarning>,
}

impl Outcome {
    /// Appends `other`, for a caller that routes the outcomes of several calls at once.
    pub fn extend(&mut self, other: Outcome) {
        self.ended.extend(other.ended);
        self.states_changed |= other.states_changed;
        self.judgements.extend(other.judgements);
        self.notices.extend(other.notices);
        self.probes.extend(other.probes);
        self.warnings.extend(other.warnings);
    }
}
