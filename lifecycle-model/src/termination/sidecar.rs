//! The sidecar rule: sidecars get their stop signal only after every main container exited, in
//! reverse order of definition, or once the pod's grace ran out waiting for them: the kubelet's
//! `waitForTurn` (`pkg/kubelet/kuberuntime/kuberuntime_termination_order.go`) waits at most the
//! grace, then the sidecar is stopped with the 2 s floor while a main container that ignores its
//! stop signal is still being SIGKILLed (the sidecar's TERM can land milliseconds before that
//! exit). Judged per pod termination from the containers' reports.

use serde::{Deserialize, Serialize};

use super::TerminationReport;
use crate::time::{BootTime, SECOND};

/// How near the pod's grace deadline a sidecar's stop signal counts as the kubelet's deadline
/// stop: its timer and the main container's runtime timer start milliseconds apart, and events
/// are stamped when the kernel sees them.
const DEADLINE_TOLERANCE_NS: u64 = SECOND;

/// Whether a sidecar's stop came in its turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SidecarVerdict {
    /// Signalled after every main container and every later-defined sidecar had exited.
    InOrder,
    /// Signalled while a main container was still running: the rule was broken.
    SignalledBeforeMainExited { main_container: String },
    /// Signalled while a main container was still running, when the pod's grace had run out:
    /// what the kubelet does at the deadline (not a violation).
    AtGraceDeadline { main_container: String },
    /// Signalled before a sidecar defined after it had exited (sidecars stop in reverse order).
    SignalledBeforeLaterSidecarExited { sidecar: String },
    /// No stop signal (it crashed, completed, or was killed in an emergency termination).
    NotSignalled,
}

/// One sidecar's termination order, judged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarOrder {
    pub container: String,
    #[serde(flatten, with = "crate::wire::at::stop_signal_at")]
    pub stop_signal_at: Option<BootTime>,
    /// The exit of the main container that exited last.
    #[serde(flatten, with = "crate::wire::at::last_main_exit")]
    pub last_main_exit: Option<BootTime>,
    pub verdict: SidecarVerdict,
}

/// Judges the sidecars of one pod termination. Pass every container's report as (name, report)
/// in the pod spec's order (init containers first, as defined), including every main container:
/// a main container that was still running when a sidecar was signalled shows up through its
/// later exit time.
pub fn sidecar_order<'a>(reports: impl IntoIterator<Item = (&'a str, &'a TerminationReport)>) -> Vec<SidecarOrder> {
    let reports: Vec<(&str, &TerminationReport)> = reports.into_iter().collect();
    let mains: Vec<(&str, BootTime)> = reports
        .iter()
        .filter(|(_, report)| !report.is_sidecar)
        .map(|(name, report)| (*name, report.exit_time))
        .collect();
    let last_main = mains.iter().max_by_key(|(_, exit)| *exit).copied();
    let sidecars: Vec<(&str, &TerminationReport)> =
        reports.iter().filter(|(_, report)| report.is_sidecar).copied().collect();
    sidecars
        .iter()
        .enumerate()
        .map(|(index, (name, report))| {
            let stop_signal_at = report.stop_signal.as_ref().map(|stop| stop.time);
            let at_deadline = report.sidecar_turn.is_some_and(|turn| turn.at_deadline(DEADLINE_TOLERANCE_NS));
            let verdict = match stop_signal_at {
                None => SidecarVerdict::NotSignalled,
                Some(at) => match last_main.filter(|(_, exit)| *exit > at) {
                    Some((main, _)) if at_deadline => {
                        SidecarVerdict::AtGraceDeadline { main_container: main.to_owned() }
                    }
                    Some((main, _)) => SidecarVerdict::SignalledBeforeMainExited { main_container: main.to_owned() },
                    None => match sidecars[index + 1..].iter().find(|(_, later)| later.exit_time > at) {
                        Some((later, _)) => {
                            SidecarVerdict::SignalledBeforeLaterSidecarExited { sidecar: (*later).to_owned() }
                        }
                        None => SidecarVerdict::InOrder,
                    },
                },
            };
            SidecarOrder {
                container: (*name).to_owned(),
                stop_signal_at,
                last_main_exit: last_main.map(|(_, exit)| exit),
                verdict,
            }
        })
        .collect()
}
