//! The judged end of one container instance: the outcome, the stop signal and preStop hook as
//! observed, and who sent the signals.

use serde::{Deserialize, Serialize};

use crate::{
    memory::MemoryAtStop,
    oom::OomLimit,
    spec::{SpecSource, StopCause},
    time::{BootTime, SECOND},
};

use super::StopRules;

/// Who sent a signal to a container's process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SignalSender {
    /// The container runtime stack: containerd, its shims, runc/crun, CRI-O, conmon, dockerd.
    Runtime,
    /// The kubelet itself.
    Kubelet,
    /// A process in the same container cgroup: the application signalling itself.
    SameContainer,
    /// The kernel, for no process's asking: SIGIO or SIGURG for a file's owner (whoever's read
    /// or write woke it), a fault, a timer, the OOM killer. Never a stop request.
    Kernel,
    /// Anything else (an operator's `kill`, systemd, another container sharing the process
    /// namespace): named by its program and process id.
    OtherProcess {
        comm: String,
        /// The sending process (host pid), when the record said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
    },
}

impl SignalSender {
    /// Names a sender from its `comm`, whether it ran in the target's container cgroup, and its
    /// pid. Membership wins: a process called `runc` inside the container is the application.
    pub fn from_comm(comm: &str, same_container: bool, pid: u32) -> Self {
        // Prefixes, because comm is cut at 15 bytes ("containerd-shim-runc-v2" -> "containerd-shim")
        // and runc renames its stages ("runc:[2:INIT]").
        const RUNTIME_PREFIXES: [&str; 9] =
            ["containerd", "runc", "crun", "conmon", "crio", "dockerd", "docker-", "youki", "runsc"];
        if same_container {
            SignalSender::SameContainer
        } else if comm == "kubelet" {
            SignalSender::Kubelet
        } else if RUNTIME_PREFIXES.iter().any(|prefix| comm.starts_with(prefix)) {
            SignalSender::Runtime
        } else {
            SignalSender::other(comm, pid)
        }
    }

    /// A sender that is neither the runtime, the kubelet nor the container itself.
    pub fn other(comm: &str, pid: u32) -> Self {
        SignalSender::OtherProcess { comm: comm.to_owned(), pid: Some(pid) }
    }

    /// Which kind of sender this is, without the details (a bounded set, for counting).
    pub fn kind(&self) -> SenderKind {
        match self {
            SignalSender::Runtime => SenderKind::Runtime,
            SignalSender::Kubelet => SenderKind::Kubelet,
            SignalSender::SameContainer => SenderKind::SameContainer,
            SignalSender::Kernel => SenderKind::Kernel,
            SignalSender::OtherProcess { .. } => SenderKind::OtherProcess,
        }
    }

    /// The sender in words, for one-line notes ("the container runtime", "`kill` (pid
    /// unknown)", ...).
    pub fn describe(&self) -> String {
        match self {
            SignalSender::Runtime => "the container runtime".to_owned(),
            SignalSender::Kubelet => "the kubelet".to_owned(),
            SignalSender::SameContainer => "a process of the container itself".to_owned(),
            SignalSender::Kernel => "the kernel".to_owned(),
            SignalSender::OtherProcess { comm, pid: Some(pid) } => format!("`{}` (pid {pid})", comm.escape_debug()),
            SignalSender::OtherProcess { comm, pid: None } => format!("`{}`", comm.escape_debug()),
        }
    }

    /// The runtime or the kubelet, the only senders a kubelet-driven stop comes from.
    pub fn is_kubelet_side(&self) -> bool {
        matches!(self, SignalSender::Runtime | SignalSender::Kubelet)
    }

    /// A process outside the container asked for it: what a stop request or a kill comes from.
    pub fn is_from_outside(&self) -> bool {
        !matches!(self, SignalSender::SameContainer | SignalSender::Kernel)
    }
}

/// [`SignalSender`] without its details: what signals are counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SenderKind {
    /// The container runtime stack.
    Runtime,
    /// The kubelet itself.
    Kubelet,
    /// A process of the same container.
    SameContainer,
    /// The kernel, for no process's asking.
    Kernel,
    /// Anything else.
    OtherProcess,
}

crate::spelling::spelling!(SenderKind {
    Runtime => "runtime",
    Kubelet => "kubelet",
    SameContainer => "same_container",
    Kernel => "kernel",
    OtherProcess => "other_process",
});

/// The stop signal as observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopSignalSeen {
    #[serde(flatten, with = "crate::wire::at::time")]
    pub time: BootTime,
    pub signal: u8,
    pub sender: SignalSender,
    /// The signal is the one the settings name (a different one suggests an image STOPSIGNAL the
    /// agent was not told about).
    pub matches_configured: bool,
}

/// The preStop hook as observed: an exec session matching the hook's program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreStopSeen {
    #[serde(flatten, with = "crate::wire::at::started_at")]
    pub started_at: BootTime,
    #[serde(flatten, with = "crate::wire::at::ended_at")]
    pub ended_at: Option<BootTime>,
    /// How long the session ran, when its end was seen.
    pub duration_ns: Option<u64>,
    /// The session was still running when the stop signal came: the grace period ran out
    /// before the hook finished, and the kubelet gave up waiting for it.
    pub overran_grace: bool,
}

/// How the instance ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TerminationOutcome {
    /// The stop signal came and the init exited before any SIGKILL.
    ExitedWithinGrace {
        /// Stop signal to exit.
        duration_ns: u64,
        /// `duration_ns` over the time the runtime allowed (see `expected_kill_after_ns`).
        grace_used_ratio: f64,
    },
    /// A violation of the app's side of the contract: the stop signal came, the app did not exit
    /// in time, and it was SIGKILLed.
    SigkilledAfterGrace {
        /// The effective grace period.
        grace_ns: u64,
        /// Stop signal to SIGKILL (to the exit when the SIGKILL itself was not seen).
        stop_to_kill_ns: u64,
        /// When the model says the SIGKILL was due after the stop signal.
        expected_kill_after_ns: u64,
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
        /// Connections the app accepted after the stop signal: it kept serving.
        accepts_after_stop: u64,
        /// The app still had a listening socket when it was killed.
        still_listening: bool,
    },
    /// Not the app's doing: the stop signal came, and the SIGKILL came before the grace the
    /// app was given had run out (minus the tolerance). Seen when the kubelet stops a
    /// container twice (a forced deletion, an active deadline) and the runtime kills at the
    /// second call's shorter timeout.
    SigkilledEarly {
        /// The effective grace period.
        grace_ns: u64,
        /// Stop signal to SIGKILL (to the exit when the SIGKILL itself was not seen).
        stop_to_kill_ns: u64,
        /// When the model says the SIGKILL was due after the stop signal.
        expected_kill_after_ns: u64,
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
        /// Connections the app accepted after the stop signal.
        accepts_after_stop: u64,
        /// The app still had a listening socket when it was killed.
        still_listening: bool,
    },
    /// SIGKILL with no stop signal before it, not by the OOM killer.
    KilledWithoutGrace {
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
    },
    /// SIGKILL with no stop signal seen, but the agent began watching this instance (it started,
    /// or rescanned after lost records) less than a grace period before the kill: the stop
    /// signal may have come while nobody watched, so "without grace" cannot be said.
    StopSignalNotObserved {
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
    },
    /// A cgroup no manager stops (no grace was promised): the stop signal came and the init
    /// was SIGKILLed after it. Reported with the sender, judged by no rule.
    SigkilledAfterStopSignal {
        /// Stop signal to SIGKILL (to the exit when the SIGKILL itself was not seen).
        stop_to_kill_ns: u64,
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
    },
    /// A cgroup no manager stops: the stop signal came and the init exited, of it or on its
    /// own, with no SIGKILL.
    ExitedAfterStopSignal {
        /// Stop signal to exit.
        duration_ns: u64,
    },
    /// The kernel's OOM killer killed the init (from the OOM event, never from exit code 137).
    OomKilled,
    /// No stop signal: a crash or a normal completion.
    ExitedWithoutStopSignal { exit_status: Option<u8>, signal: Option<u8> },
}

/// [`TerminationOutcome`] without its details: what terminations are counted by. Its spelling
/// is the `kind` serde writes for the outcome (a test holds them together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OutcomeKind {
    /// See [`TerminationOutcome::ExitedWithinGrace`].
    ExitedWithinGrace,
    /// See [`TerminationOutcome::SigkilledAfterGrace`].
    SigkilledAfterGrace,
    /// See [`TerminationOutcome::SigkilledEarly`].
    SigkilledEarly,
    /// See [`TerminationOutcome::KilledWithoutGrace`].
    KilledWithoutGrace,
    /// See [`TerminationOutcome::StopSignalNotObserved`].
    StopSignalNotObserved,
    /// See [`TerminationOutcome::SigkilledAfterStopSignal`].
    SigkilledAfterStopSignal,
    /// See [`TerminationOutcome::ExitedAfterStopSignal`].
    ExitedAfterStopSignal,
    /// See [`TerminationOutcome::OomKilled`].
    OomKilled,
    /// See [`TerminationOutcome::ExitedWithoutStopSignal`].
    ExitedWithoutStopSignal,
}

crate::spelling::spelling!(OutcomeKind {
    ExitedWithinGrace => "exited_within_grace",
    SigkilledAfterGrace => "sigkilled_after_grace",
    SigkilledEarly => "sigkilled_early",
    KilledWithoutGrace => "killed_without_grace",
    StopSignalNotObserved => "stop_signal_not_observed",
    SigkilledAfterStopSignal => "sigkilled_after_stop_signal",
    ExitedAfterStopSignal => "exited_after_stop_signal",
    OomKilled => "oom_killed",
    ExitedWithoutStopSignal => "exited_without_stop_signal",
});

impl TerminationOutcome {
    /// The outcome's kind.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            TerminationOutcome::ExitedWithinGrace { .. } => OutcomeKind::ExitedWithinGrace,
            TerminationOutcome::SigkilledAfterGrace { .. } => OutcomeKind::SigkilledAfterGrace,
            TerminationOutcome::SigkilledEarly { .. } => OutcomeKind::SigkilledEarly,
            TerminationOutcome::KilledWithoutGrace { .. } => OutcomeKind::KilledWithoutGrace,
            TerminationOutcome::StopSignalNotObserved { .. } => OutcomeKind::StopSignalNotObserved,
            TerminationOutcome::SigkilledAfterStopSignal { .. } => OutcomeKind::SigkilledAfterStopSignal,
            TerminationOutcome::ExitedAfterStopSignal { .. } => OutcomeKind::ExitedAfterStopSignal,
            TerminationOutcome::OomKilled => OutcomeKind::OomKilled,
            TerminationOutcome::ExitedWithoutStopSignal { .. } => OutcomeKind::ExitedWithoutStopSignal,
        }
    }
}

/// The OOM killer's victim in a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomVictim {
    /// The container's init (PID 1 of its namespace): the container ended with it.
    Init,
    /// Another process of the container.
    Child,
}

/// How long after a kubelet's start a stop is said to follow it (a new kubelet's first syncs of
/// every pod come within seconds; a minute leaves room for a node's slow start).
pub const KUBELET_RESTART_WINDOW_NS: u64 = 60 * SECOND;

/// The judged end of one container instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TerminationReport {
    pub stop_signal: Option<StopSignalSeen>,
    pub pre_stop: Option<PreStopSeen>,
    #[serde(flatten, with = "crate::wire::at::exit_time")]
    pub exit_time: BootTime,
    pub exit_status: Option<u8>,
    pub exit_signal: Option<u8>,
    /// Whose rules the stop was judged by (the grace below is theirs; none for a cgroup no
    /// manager stops).
    #[serde(default)]
    pub rules: StopRules,
    /// The effective grace period.
    pub grace_ns: u64,
    /// Stop signal to SIGKILL as the kubelet computes it: max(grace - preStop whole seconds, 2 s).
    pub expected_kill_after_ns: u64,
    /// False when the model could only give the 2 s floor: a sidecar (its wait for its turn is
    /// subtracted too), an httpGet/tcpSocket hook, or an exec hook whose session was not seen.
    pub expected_kill_exact: bool,
    /// OOM kills in the container before the exit (any victim).
    pub oom_kills: u32,
    pub is_sidecar: bool,
    /// A sidecar's wait for its turn and the pod's grace it waited within, when the node saw the
    /// pod's stop begin: `grace_ns` is then what the kubelet left it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_turn: Option<SidecarTurn>,
    pub outcome: TerminationOutcome,
    /// Which process the OOM killer chose before the exit, when it struck: the container's init,
    /// or a child (the runtime reports neither when the init survives a child's kill).
    pub oom_victim: Option<OomVictim>,
    /// The memory limit the OOM killer answered at its last kill before the exit (the kernel's
    /// own account: the container's, the pod's, another cgroup's, or none: the node's), when
    /// the kernel logged it.
    pub oom_limit: Option<OomLimit>,
    /// Why it was stopped (None when nothing stopped it: it exited, or the OOM killer).
    pub cause: Option<StopCause>,
    /// How long before the stop this node's kubelet (re)started, when it did within
    /// [`KUBELET_RESTART_WINDOW_NS`] of a stop the kubelet asked for (the kernel saw its exec):
    /// a stop that follows a kubelet's start is often its doing (a container whose definition
    /// the new kubelet finds changed is restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_started_before_ns: Option<u64>,
    /// The container's memory pressure in the minute before the stop (or the exit), when the
    /// agent read it (`memory.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryAtStop>,
    /// Where the facts behind this verdict came from.
    pub spec: SpecSource,
    /// When the agent began watching this instance, if after it started (the agent itself
    /// started, or rescanned after lost records): evidence before it (a stop signal, a preStop
    /// hook) was not seen.
    #[serde(flatten, with = "crate::wire::at::watched_since")]
    pub watched_since: Option<BootTime>,
    /// The container's processes when the stop signal came and when the SIGKILL came.
    pub scene: StopScene,
}

/// How long a sidecar waited for its turn in its pod's termination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarTurn {
    /// From the pod's main containers' stop signal (the kubelet began stopping the pod) to the
    /// sidecar's.
    pub waited_ns: u64,
    /// The pod's grace (the deletion's, else the spec's): the most the kubelet waits.
    pub pod_grace_ns: u64,
}

impl SidecarTurn {
    /// What the kubelet gave the sidecar: the pod's grace less the whole seconds it waited
    /// (`waitForTurn` returns seconds, truncated), 2 s at least.
    pub fn remaining_grace_ns(&self) -> u64 {
        let waited_whole_seconds_ns = self.waited_ns.min(self.pod_grace_ns) / SECOND * SECOND;
        self.pod_grace_ns.saturating_sub(waited_whole_seconds_ns).max(super::MINIMUM_GRACE_NS)
    }

    /// The pod's grace had run out when the sidecar got its stop signal: the kubelet stops it
    /// then whether or not the main containers exited (`waitForTurn`'s timer). Within
    /// `tolerance` of the deadline, as the two timers start a few milliseconds apart.
    pub fn at_deadline(&self, tolerance_ns: u64) -> bool {
        self.waited_ns.saturating_add(tolerance_ns) >= self.pod_grace_ns
    }
}

/// Processes of a container listed at one moment of its stop, at most this many (the init
/// first, then the oldest); the rest are counted in [`StopScene::left_out`].
pub const MAX_SCENE_PROCESSES: usize = 32;

/// A process of the container at a moment of its stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessAtStop {
    /// The process id as the host sees it.
    pub pid: u32,
    /// The container's PID 1.
    pub init: bool,
    pub comm: String,
    /// When it started.
    #[serde(flatten, with = "crate::wire::at::started_at")]
    pub started_at: BootTime,
    /// The stop signal reached it (sent to it by the runtime, the kubelet, or passed on by
    /// another process of the container). False for a process behind a shell that does not
    /// pass signals on: the shell-entrypoint bug.
    pub got_stop_signal: bool,
    /// Started into the container by the runtime (an exec probe, a preStop hook, `kubectl
    /// exec`) or by such a process: not the app's, so not one the stop signal should reach.
    pub exec_session: bool,
}

/// Who was running when a container was stopped: what `explain` needs to say "PID 1 `sh` got
/// SIGTERM; `java` never did" and which processes a SIGKILL cut short.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopScene {
    /// Processes running when the stop signal came to the init.
    pub running_at_stop: Vec<ProcessAtStop>,
    /// Processes still alive when the SIGKILL came to the init.
    pub alive_at_kill: Vec<ProcessAtStop>,
    /// Processes left out of either list past [`MAX_SCENE_PROCESSES`].
    pub left_out: u32,
}

impl StopScene {
    /// The listed processes, the init first, then by start; at most [`MAX_SCENE_PROCESSES`].
    /// Returns how many were left out.
    fn bounded(mut processes: Vec<ProcessAtStop>) -> (Vec<ProcessAtStop>, u32) {
        processes.sort_by_key(|p| (!p.init, p.started_at, p.pid));
        let left_out = processes.len().saturating_sub(MAX_SCENE_PROCESSES) as u32;
        processes.truncate(MAX_SCENE_PROCESSES);
        (processes, left_out)
    }

    /// Sets the processes running at the stop signal (once).
    pub fn at_stop(&mut self, processes: Vec<ProcessAtStop>) {
        let (listed, left_out) = Self::bounded(processes);
        self.running_at_stop = listed;
        self.left_out += left_out;
    }

    /// Sets the processes alive at the SIGKILL (once), carrying over who got the stop signal.
    pub fn at_kill(&mut self, processes: Vec<ProcessAtStop>) {
        let (mut listed, left_out) = Self::bounded(processes);
        for process in &mut listed {
            process.got_stop_signal |= self
                .running_at_stop
                .iter()
                .any(|p| p.pid == process.pid && p.started_at == process.started_at && p.got_stop_signal);
        }
        self.alive_at_kill = listed;
        self.left_out += left_out;
    }

    /// The shell-entrypoint bug, when this stop shows it: the init got the stop signal and a
    /// process that ran beside it never did. (init comm, that process's comm and pid.)
    pub fn stop_signal_kept_from(&self) -> Option<(&str, &str, u32)> {
        let init = self.running_at_stop.iter().find(|p| p.init && p.got_stop_signal)?;
        let missed = self.running_at_stop.iter().find(|p| !p.init && !p.got_stop_signal && !p.exec_session)?;
        Some((&init.comm, &missed.comm, missed.pid))
    }

    /// `pid` received `signal`, which is the stop signal: mark it among those running at the
    /// stop.
    pub fn got_stop_signal(&mut self, pid: u32) {
        if let Some(process) = self.running_at_stop.iter_mut().find(|p| p.pid == pid) {
            process.got_stop_signal = true;
        }
    }
}

#[cfg(test)]
impl TerminationReport {
    /// A plain report (exited on its own with `n` as its code at `n` s), for tests elsewhere.
    pub fn for_tests(n: u64) -> Self {
        TerminationReport {
            stop_signal: None,
            pre_stop: None,
            exit_time: crate::time::BootTime::from_ns(n * crate::time::SECOND),
            exit_status: Some(n as u8),
            exit_signal: None,
            rules: StopRules::Kubelet,
            grace_ns: 30_000_000_000,
            expected_kill_after_ns: 30_000_000_000,
            expected_kill_exact: true,
            oom_kills: 0,
            is_sidecar: false,
            sidecar_turn: None,
            outcome: TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(n as u8), signal: None },
            oom_victim: None,
            oom_limit: None,
            cause: None,
            kubelet_started_before_ns: None,
            memory: None,
            spec: SpecSource::default(),
            watched_since: None,
            scene: StopScene::default(),
        }
    }
}
