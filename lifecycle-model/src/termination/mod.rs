//! Whether one container instance was stopped by the rules, judged from what the kernel saw.
//!
//! Owns the model of the kubelet's `killContainer` (`pkg/kubelet/kuberuntime/kuberuntime_container.go`)
//! and the runtime's StopContainer (containerd `container_stop.go`): the grace period
//! (deletion grace, else the pod's terminationGracePeriodSeconds), the preStop hook run first and
//! its elapsed whole seconds subtracted, the 2 s floor, then the stop signal to PID 1 and SIGKILL
//! when the remaining time runs out. Also the sidecar rule: sidecars get their stop signal only
//! after every main container exited, in reverse order of definition, or when the pod's grace ran
//! out waiting for them (then with what was left of it, 2 s at least).
//!
//! Pure: a [`TerminationTracker`] per container cgroup takes signals, OOM kills, exec sessions,
//! listener activity and the init's exit, and produces a [`TerminationReport`].
//!
//! - `settings`: what the metadata says (grace periods, preStop hook, constants of the rules).
//! - `report`: the judged outcome and who sent which signal.
//! - `judge`: the per-instance tracker that collects evidence and judges the exit.
//! - `sidecar`: the order in which a pod's sidecars were stopped.

mod judge;
mod records;
mod report;
mod settings;
mod sidecar;
#[cfg(test)]
mod tests;

pub use judge::{SceneMoment, TerminationTracker};
pub use records::{Retention, MAX_KEPT_RECORDS};
pub use report::{
    OomVictim, OutcomeKind, PreStopSeen, ProcessAtStop, SenderKind, SidecarTurn, SignalSender, StopScene,
    StopSignalSeen, TerminationOutcome, TerminationReport, KUBELET_RESTART_WINDOW_NS, MAX_SCENE_PROCESSES,
};
pub use settings::{
    PreStopHandler, StopRules, TerminationError, TerminationSettings, COMM_VISIBLE_LEN, DEFAULT_GRACE_NS,
    MINIMUM_GRACE_NS, SIGKILL, SIGTERM,
};
pub use sidecar::{sidecar_order, SidecarOrder, SidecarVerdict};

use crate::time::SECOND;
