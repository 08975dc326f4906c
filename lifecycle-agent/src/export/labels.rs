//! Label values as the exported series spell them. The model counts with enums; this is the one
//! place that turns them into strings, so every value comes from a bounded set.

use crate::model::{
    backoff::Verdict,
    container_state::{TerminatedReason, WaitingReason},
    node::DisagreementKind,
    spec::StopCause,
    termination::{OutcomeKind, SenderKind},
};

/// `sender` label of a signal.
pub fn sender_kind(sender: SenderKind) -> &'static str {
    match sender {
        SenderKind::Runtime => "runtime",
        SenderKind::Kubelet => "kubelet",
        SenderKind::SameContainer => "same_container",
        SenderKind::OtherProcess => "other_process",
    }
}

/// `outcome` label of a termination.
pub fn outcome(outcome: OutcomeKind) -> &'static str {
    match outcome {
        OutcomeKind::ExitedWithinGrace => "exited_within_grace",
        OutcomeKind::SigkilledAfterGrace => "sigkilled_after_grace",
        OutcomeKind::SigkilledEarly => "sigkilled_early",
        OutcomeKind::KilledWithoutGrace => "killed_without_grace",
        OutcomeKind::StopSignalNotObserved => "stop_signal_not_observed",
        OutcomeKind::OomKilled => "oom_killed",
        OutcomeKind::ExitedWithoutStopSignal => "exited_without_stop_signal",
    }
}

/// `cause` label of a stop (empty when nothing stopped the container: it exited by itself): the
/// model's one spelling, which serde uses too.
pub fn stop_cause(cause: StopCause) -> &'static str {
    cause.as_str()
}

/// `kind` label of a status disagreement.
pub fn disagreement(kind: DisagreementKind) -> &'static str {
    match kind {
        DisagreementKind::OomReportedNotOom => "oom_reported_not_oom",
        DisagreementKind::OomNotReported => "oom_not_reported",
        DisagreementKind::ExitCode => "exit_code",
        DisagreementKind::RestartCount => "restart_count",
    }
}

/// `verdict` label of a judged restart.
pub fn verdict(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::WithinTolerance => "within_tolerance",
        Verdict::TooEarly => "too_early",
        Verdict::TooLate => "too_late",
    }
}

/// `reason` label of a terminated container, as the kubelet spells it.
pub fn terminated_reason(reason: TerminatedReason) -> &'static str {
    match reason {
        TerminatedReason::Completed => "Completed",
        TerminatedReason::Error => "Error",
        TerminatedReason::OomKilled => "OOMKilled",
        TerminatedReason::Unknown => "Unknown",
    }
}

/// `reason` label of a waiting container, as the kubelet spells it.
pub fn waiting_reason(reason: WaitingReason) -> &'static str {
    match reason {
        WaitingReason::ContainerCreating => "ContainerCreating",
        WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_the_kubelets_words() {
        assert_eq!(terminated_reason(TerminatedReason::OomKilled), "OOMKilled");
        assert_eq!(waiting_reason(WaitingReason::CrashLoopBackOff), "CrashLoopBackOff");
        assert_eq!(outcome(OutcomeKind::SigkilledAfterGrace), "sigkilled_after_grace");
        assert_eq!(outcome(OutcomeKind::SigkilledEarly), "sigkilled_early");
        assert_eq!(sender_kind(SenderKind::SameContainer), "same_container");
        assert_eq!(verdict(Verdict::TooEarly), "too_early");
    }
}
