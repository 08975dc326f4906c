//! Whether one container instance was stopped by the rules, judged from what the kernel saw.
//!
//! Owns the model of the kubelet's `killContainer` (`pkg/kubelet/kuberuntime/kuberuntime_container.go`)
//! and the runtime's StopContainer (containerd `container_stop.go`): the grace period
//! (deletion grace, else the pod's terminationGracePeriodSeconds), the preStop hook run first and
//! its elapsed whole seconds subtracted, the 2 s floor, then the stop signal to PID 1 and SIGKILL
//! when the remaining time runs out. Also the sidecar rule: sidecars get their stop signal only
//! after every main container exited, in reverse order of definition.
//!
//! Pure: a [`TerminationTracker`] per container cgroup takes signals, OOM kills, exec sessions,
//! listener activity and the init's exit, and produces a [`TerminationReport`].

use serde::{Deserialize, Serialize};

const SECOND_NS: u64 = 1_000_000_000;
/// `SIGKILL`.
pub const SIGKILL: u8 = 9;
/// `SIGTERM`, the stop signal unless the image or the pod names another.
pub const SIGTERM: u8 = 15;
/// The pod's terminationGracePeriodSeconds when unset.
pub const DEFAULT_GRACE_NS: u64 = 30 * SECOND_NS;
/// `minimumGracePeriodInSeconds`: the kubelet always leaves this long between the stop signal and
/// SIGKILL, even when the preStop hook used up the grace period.
pub const MINIMUM_GRACE_NS: u64 = 2 * SECOND_NS;
/// `TASK_COMM_LEN - 1`: the kernel keeps this many bytes of a program's name.
pub const COMM_VISIBLE_LEN: usize = 15;

/// Who sent a signal to a container's process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SignalSender {
    /// The container runtime stack: containerd, its shims, runc/crun, CRI-O, conmon, dockerd.
    Runtime,
    /// The kubelet itself.
    Kubelet,
    /// A process in the same container cgroup: the application signalling itself.
    SameContainer,
    /// Anything else (an operator's `kill`, another agent).
    OtherProcess { comm: String },
}

impl SignalSender {
    /// Names a sender from its `comm` and whether it ran in the target's container cgroup.
    /// Membership wins: a process called `runc` inside the container is the application.
    pub fn from_comm(comm: &str, same_container: bool) -> Self {
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
            SignalSender::OtherProcess { comm: comm.to_owned() }
        }
    }

    /// Which kind of sender this is, without the details (a bounded set, for counting).
    pub fn kind(&self) -> SenderKind {
        match self {
            SignalSender::Runtime => SenderKind::Runtime,
            SignalSender::Kubelet => SenderKind::Kubelet,
            SignalSender::SameContainer => SenderKind::SameContainer,
            SignalSender::OtherProcess { .. } => SenderKind::OtherProcess,
        }
    }

    /// The runtime or the kubelet, the only senders a kubelet-driven stop comes from.
    fn is_kubelet_side(&self) -> bool {
        matches!(self, SignalSender::Runtime | SignalSender::Kubelet)
    }
}

/// [`SignalSender`] without its details: what signals are counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SenderKind {
    /// The container runtime stack.
    Runtime,
    /// The kubelet itself.
    Kubelet,
    /// A process of the same container.
    SameContainer,
    /// Anything else.
    OtherProcess,
}

/// A container's preStop hook, from the `io.kubernetes.container.preStopHandler` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreStopHandler {
    /// Runs in the container: visible to the kernel as an exec session.
    Exec { command: Vec<String> },
    /// The kubelet calls the container over HTTP: its duration is not visible here.
    HttpGet,
    /// Deprecated TCP handler (the kubelet only logs it): not visible here.
    TcpSocket,
    /// The kubelet sleeps (PodLifecycleSleepAction) before stopping: known duration.
    Sleep { seconds: u64 },
}

/// The annotation's JSON: a v1.LifecycleHandler with exactly one action set.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LifecycleHandlerJson {
    exec: Option<ExecActionJson>,
    http_get: Option<serde_json::Value>,
    tcp_socket: Option<serde_json::Value>,
    sleep: Option<SleepActionJson>,
}

#[derive(Deserialize)]
struct ExecActionJson {
    #[serde(default)]
    command: Vec<String>,
}

#[derive(Deserialize)]
struct SleepActionJson {
    seconds: i64,
}

impl PreStopHandler {
    /// Parses the kubelet's `io.kubernetes.container.preStopHandler` annotation
    /// (`{"exec":{"command":[...]}}`, `{"httpGet":{...}}`, `{"sleep":{"seconds":N}}`).
    pub fn from_annotation(json: &str) -> Result<Self, TerminationError> {
        let handler: LifecycleHandlerJson = serde_json::from_str(json)
            .map_err(|source| TerminationError::PreStopJson { json: json.to_owned(), source })?;
        let actions =
            [handler.exec.is_some(), handler.http_get.is_some(), handler.tcp_socket.is_some(), handler.sleep.is_some()];
        match actions.iter().filter(|set| **set).count() {
            0 => return Err(TerminationError::PreStopNoAction { json: json.to_owned() }),
            1 => {}
            _ => return Err(TerminationError::PreStopSeveralActions { json: json.to_owned() }),
        }
        if let Some(exec) = handler.exec {
            if exec.command.first().is_none_or(|program| program.is_empty()) {
                return Err(TerminationError::PreStopEmptyCommand { json: json.to_owned() });
            }
            return Ok(PreStopHandler::Exec { command: exec.command });
        }
        if let Some(sleep) = handler.sleep {
            let seconds = u64::try_from(sleep.seconds)
                .map_err(|_| TerminationError::PreStopNegativeSleep { seconds: sleep.seconds })?;
            return Ok(PreStopHandler::Sleep { seconds });
        }
        if handler.http_get.is_some() {
            return Ok(PreStopHandler::HttpGet);
        }
        Ok(PreStopHandler::TcpSocket)
    }

    /// The `comm` the exec hook's process has: the program's basename, cut to 15 bytes.
    pub fn exec_comm(&self) -> Option<String> {
        let PreStopHandler::Exec { command } = self else { return None };
        let program = command.first()?;
        let basename = program.rsplit('/').next().unwrap_or(program);
        let bytes = basename.as_bytes();
        let cut = &bytes[..bytes.len().min(COMM_VISIBLE_LEN)];
        // The kernel cuts bytes, and the decoder turns a split character into U+FFFD; do the same.
        Some(String::from_utf8_lossy(cut).into_owned())
    }
}

/// Problems with a container's termination settings.
#[derive(Debug, thiserror::Error)]
pub enum TerminationError {
    /// The preStopHandler annotation is not JSON of a lifecycle handler.
    #[error("preStopHandler annotation {json:?} is not a lifecycle handler: {source}")]
    PreStopJson {
        json: String,
        #[source]
        source: serde_json::Error,
    },
    /// The preStopHandler annotation sets no action.
    #[error("preStopHandler annotation {json:?} sets none of exec, httpGet, tcpSocket, sleep")]
    PreStopNoAction { json: String },
    /// The preStopHandler annotation sets more than one action (the API forbids it).
    #[error("preStopHandler annotation {json:?} sets more than one action")]
    PreStopSeveralActions { json: String },
    /// The exec action has no program to run.
    #[error("preStopHandler annotation {json:?} has an exec action with an empty command")]
    PreStopEmptyCommand { json: String },
    /// The sleep action's seconds are negative.
    #[error("preStopHandler sleep of {seconds} seconds is negative")]
    PreStopNegativeSleep { seconds: i64 },
}

/// What the container's metadata says about how it should be stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TerminationSettings {
    /// The pod's terminationGracePeriodSeconds (`io.kubernetes.pod.terminationGracePeriod`).
    pub grace_period_ns: u64,
    /// The pod's deletionGracePeriodSeconds, which wins when set.
    pub deletion_grace_ns: Option<u64>,
    pub pre_stop: Option<PreStopHandler>,
    /// The signal the runtime should send first (image STOPSIGNAL or lifecycle.stopSignal).
    pub stop_signal: u8,
    /// An init container with restartPolicy Always.
    pub is_sidecar: bool,
    /// How much earlier than the model the runtime's SIGKILL may come before it is flagged.
    /// The runtime's own timer is precise to milliseconds; this absorbs event timestamps.
    pub kill_tolerance_ns: u64,
}

impl Default for TerminationSettings {
    /// The API defaults: 30 s grace, SIGTERM, no hook, not a sidecar; 500 ms kill tolerance.
    fn default() -> Self {
        Self {
            grace_period_ns: DEFAULT_GRACE_NS,
            deletion_grace_ns: None,
            pre_stop: None,
            stop_signal: SIGTERM,
            is_sidecar: false,
            kill_tolerance_ns: SECOND_NS / 2,
        }
    }
}

impl TerminationSettings {
    /// The grace period the kubelet uses: the deletion's, else the pod's.
    pub fn effective_grace_ns(&self) -> u64 {
        self.deletion_grace_ns.unwrap_or(self.grace_period_ns)
    }
}

/// The stop signal as observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StopSignalSeen {
    pub time: u64,
    pub signal: u8,
    pub sender: SignalSender,
    /// The signal is the one the settings name (a different one suggests an image STOPSIGNAL the
    /// agent was not told about).
    pub matches_configured: bool,
}

/// The preStop hook as observed: an exec session matching the hook's program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PreStopSeen {
    pub started_at: u64,
    pub ended_at: Option<u64>,
    /// How long the session ran, when its end was seen.
    pub duration_ns: Option<u64>,
    /// The session was still running when the stop signal came, after at least the grace
    /// period: the kubelet gave up waiting for it.
    pub overran_grace: bool,
}

/// How the instance ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
        /// The SIGKILL came earlier than the model allows (minus the tolerance).
        killed_early: bool,
        /// Connections the app accepted after the stop signal: it kept serving.
        accepts_after_stop: u64,
        /// The app still had a listening socket when it was killed.
        still_listening: bool,
    },
    /// SIGKILL with no stop signal before it, not by the OOM killer.
    KilledWithoutGrace {
        /// The SIGKILL's sender, when it was seen.
        sender: Option<SignalSender>,
    },
    /// The kernel's OOM killer killed the init (from the OOM event, never from exit code 137).
    OomKilled,
    /// No stop signal: a crash or a normal completion.
    ExitedWithoutStopSignal { exit_status: Option<u8>, signal: Option<u8> },
}

/// [`TerminationOutcome`] without its details: what terminations are counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// See [`TerminationOutcome::ExitedWithinGrace`].
    ExitedWithinGrace,
    /// See [`TerminationOutcome::SigkilledAfterGrace`].
    SigkilledAfterGrace,
    /// See [`TerminationOutcome::KilledWithoutGrace`].
    KilledWithoutGrace,
    /// See [`TerminationOutcome::OomKilled`].
    OomKilled,
    /// See [`TerminationOutcome::ExitedWithoutStopSignal`].
    ExitedWithoutStopSignal,
}

impl TerminationOutcome {
    /// The outcome's kind.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            TerminationOutcome::ExitedWithinGrace { .. } => OutcomeKind::ExitedWithinGrace,
            TerminationOutcome::SigkilledAfterGrace { .. } => OutcomeKind::SigkilledAfterGrace,
            TerminationOutcome::KilledWithoutGrace { .. } => OutcomeKind::KilledWithoutGrace,
            TerminationOutcome::OomKilled => OutcomeKind::OomKilled,
            TerminationOutcome::ExitedWithoutStopSignal { .. } => OutcomeKind::ExitedWithoutStopSignal,
        }
    }
}

/// The judged end of one container instance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TerminationReport {
    pub stop_signal: Option<StopSignalSeen>,
    pub pre_stop: Option<PreStopSeen>,
    pub exit_time: u64,
    pub exit_status: Option<u8>,
    pub exit_signal: Option<u8>,
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
    pub outcome: TerminationOutcome,
}

#[derive(Clone, Debug)]
struct SignalRecord {
    time: u64,
    signal: u8,
    sender: SignalSender,
    to_init: bool,
}

#[derive(Clone, Copy, Debug)]
struct OomRecord {
    time: u64,
    victim_is_init: bool,
}

#[derive(Clone, Debug)]
struct ExecSession {
    start: u64,
    end: Option<u64>,
    comm: String,
}

/// Records of each kind kept per instance (signals not to the init, exec sessions).
const MAX_KEPT_RECORDS: usize = 64;

/// Collects one container instance's termination evidence until its init exits.
#[derive(Clone, Debug)]
pub struct TerminationTracker {
    settings: TerminationSettings,
    signals: Vec<SignalRecord>,
    oom_kills: Vec<OomRecord>,
    exec_sessions: Vec<ExecSession>,
    accepts: Vec<u64>,
    /// (time, +1 listen / -1 close), to tell whether a listener was open at a given time.
    listener_changes: Vec<(u64, i32)>,
    /// Listening sockets opened minus closed before any stop signal.
    listeners_before_stop: i64,
    report: Option<TerminationReport>,
}

impl TerminationTracker {
    pub fn new(settings: TerminationSettings) -> Self {
        Self {
            settings,
            signals: Vec::new(),
            oom_kills: Vec::new(),
            exec_sessions: Vec::new(),
            accepts: Vec::new(),
            listener_changes: Vec::new(),
            listeners_before_stop: 0,
            report: None,
        }
    }

    pub fn settings(&self) -> &TerminationSettings {
        &self.settings
    }

    /// Replaces the settings, e.g. when the runtime's metadata arrives after the instance started.
    /// The evidence collected so far is kept.
    pub fn set_settings(&mut self, settings: TerminationSettings) {
        self.settings = settings;
    }

    /// A kubelet-side non-KILL signal to the init has been seen: a stop may be under way.
    fn stop_may_have_begun(&self) -> bool {
        self.signals.iter().any(|s| s.to_init && s.signal != SIGKILL && s.sender.is_kubelet_side())
    }

    /// A signal to a process of this container; `to_init` when the target is its PID 1.
    pub fn on_signal(&mut self, time: u64, signal: u8, sender: SignalSender, to_init: bool) {
        // A container lives for months; keep memory bounded. Signals the judgement can use are
        // those to the init; others are only kept while there is room.
        if !to_init && self.signals.len() >= MAX_KEPT_RECORDS {
            return;
        }
        self.signals.push(SignalRecord { time, signal, sender, to_init });
    }

    /// The OOM killer chose a victim in this container; `victim_is_init` when it was PID 1.
    /// With memory.oom.group (the kubelet's default on cgroup v2) every process is a victim.
    pub fn on_oom_kill(&mut self, time: u64, victim_is_init: bool) {
        self.oom_kills.push(OomRecord { time, victim_is_init });
    }

    /// A process the runtime started into the container that does not descend from its init:
    /// an exec probe, a hook, `kubectl exec`. Reporting the same (start, comm) again updates it,
    /// so a session can be reported when it starts and again when it ends.
    pub fn on_exec_session(&mut self, start: u64, end: Option<u64>, comm: &str) {
        if let Some(known) =
            self.exec_sessions.iter_mut().find(|session| session.start == start && session.comm == comm)
        {
            known.end = end.or(known.end);
            return;
        }
        // Exec probes run every period for the container's whole life: keep the most recent
        // sessions (the preStop hook is always among the last), dropping the oldest ended one.
        if self.exec_sessions.len() >= MAX_KEPT_RECORDS {
            if let Some(oldest) = self.exec_sessions.iter().position(|s| s.end.is_some()) {
                self.exec_sessions.remove(oldest);
            }
        }
        self.exec_sessions.push(ExecSession { start, end, comm: comm.to_owned() });
    }

    /// The app opened a listening socket.
    pub fn on_listen(&mut self, time: u64) {
        self.listener_change(time, 1);
    }

    /// The app closed a listening socket.
    pub fn on_listen_close(&mut self, time: u64) {
        self.listener_change(time, -1);
    }

    /// Before a stop begins only the running total matters; after it, the timeline does.
    fn listener_change(&mut self, time: u64, change: i32) {
        if self.stop_may_have_begun() {
            self.listener_changes.push((time, change));
        } else {
            self.listeners_before_stop += i64::from(change);
        }
    }

    /// The app accepted a connection.
    pub fn on_listener_accept(&mut self, time: u64) {
        // Only accepts after the stop signal are judged; a busy server must not grow this list.
        if self.stop_may_have_begun() {
            self.accepts.push(time);
        }
    }

    /// The init (PID 1 of the container) exited: judges the termination. Later calls return the
    /// first report unchanged.
    pub fn on_init_exit(&mut self, time: u64, exit_status: Option<u8>, signal: Option<u8>) -> &TerminationReport {
        let report = match self.report.take() {
            Some(report) => report,
            None => self.judge(time, exit_status, signal),
        };
        self.report.insert(report)
    }

    /// The report, once the init exited.
    pub fn report(&self) -> Option<&TerminationReport> {
        self.report.as_ref()
    }

    fn judge(&self, exit_time: u64, exit_status: Option<u8>, exit_signal: Option<u8>) -> TerminationReport {
        let before_exit = |time: u64| time <= exit_time;
        let stop = self
            .signals
            .iter()
            .filter(|s| s.to_init && s.signal != SIGKILL && s.sender.is_kubelet_side() && before_exit(s.time))
            .min_by_key(|s| s.time)
            .map(|s| StopSignalSeen {
                time: s.time,
                signal: s.signal,
                sender: s.sender.clone(),
                matches_configured: s.signal == self.settings.stop_signal,
            });
        let grace_ns = self.settings.effective_grace_ns();
        let pre_stop = self.pre_stop_seen(stop.as_ref().map_or(exit_time, |s| s.time), grace_ns);
        let (expected_kill_after_ns, expected_kill_exact) =
            self.expected_kill_after(grace_ns, stop.as_ref().map(|s| s.time), pre_stop.as_ref());
        let oom_before_exit: Vec<OomRecord> =
            self.oom_kills.iter().copied().filter(|oom| before_exit(oom.time)).collect();

        let outcome = if exit_signal == Some(SIGKILL) {
            // A SIGKILL from the application to its own PID 1 is dropped by the kernel (init is
            // immune to signals from inside its namespace), so it cannot be the cause.
            let kill = self
                .signals
                .iter()
                .filter(|s| s.to_init && s.signal == SIGKILL && s.sender != SignalSender::SameContainer)
                .filter(|s| before_exit(s.time))
                .min_by_key(|s| s.time);
            // The OOM killer's SIGKILL is sent in the context of whichever task was allocating
            // (usually one of the container's own), so the sender cannot tell; the OOM event can.
            // It killed the init if the event names the init, or if an OOM kill happened and no
            // other SIGKILL to the init competes as the cause.
            let oom_killed_init =
                oom_before_exit.iter().any(|oom| oom.victim_is_init) || (!oom_before_exit.is_empty() && kill.is_none());
            match (&stop, kill) {
                _ if oom_killed_init => TerminationOutcome::OomKilled,
                (Some(stop), kill) if kill.is_none_or(|k| k.time >= stop.time) => {
                    let kill_time = kill.map_or(exit_time, |k| k.time);
                    let stop_to_kill_ns = kill_time.saturating_sub(stop.time);
                    TerminationOutcome::SigkilledAfterGrace {
                        grace_ns,
                        stop_to_kill_ns,
                        expected_kill_after_ns,
                        killed_early: stop_to_kill_ns.saturating_add(self.settings.kill_tolerance_ns)
                            < expected_kill_after_ns,
                        accepts_after_stop: self.accepts.iter().filter(|&&t| t > stop.time && t <= exit_time).count()
                            as u64,
                        still_listening: self.listening_at(kill_time),
                    }
                }
                (_, kill) => TerminationOutcome::KilledWithoutGrace { sender: kill.map(|k| k.sender.clone()) },
            }
        } else if let Some(stop) = &stop {
            let duration_ns = exit_time.saturating_sub(stop.time);
            TerminationOutcome::ExitedWithinGrace {
                duration_ns,
                grace_used_ratio: duration_ns as f64 / expected_kill_after_ns.max(1) as f64,
            }
        } else {
            TerminationOutcome::ExitedWithoutStopSignal { exit_status, signal: exit_signal }
        };

        TerminationReport {
            stop_signal: stop,
            pre_stop,
            exit_time,
            exit_status,
            exit_signal,
            grace_ns,
            expected_kill_after_ns,
            expected_kill_exact,
            oom_kills: u32::try_from(oom_before_exit.len()).unwrap_or(u32::MAX),
            is_sidecar: self.settings.is_sidecar,
            outcome,
        }
    }

    /// Finds the exec hook's session among exec sessions started before `deadline` (the stop
    /// signal, or the exit). Exec probes may run the same program (`sh`), so prefer the session
    /// that ended closest to the deadline — the kubelet sends the stop signal as soon as the hook
    /// returns — counting one still running at the deadline as closest, and among equals the
    /// earliest started.
    fn pre_stop_seen(&self, deadline: u64, grace_ns: u64) -> Option<PreStopSeen> {
        let comm = self.settings.pre_stop.as_ref()?.exec_comm()?;
        let session =
            self.exec_sessions.iter().filter(|session| session.comm == comm && session.start <= deadline).min_by_key(
                |session| {
                    let gap = match session.end {
                        Some(end) if end < deadline => deadline - end,
                        _ => 0,
                    };
                    (gap, session.start)
                },
            )?;
        let running_at_deadline = session.end.is_none_or(|end| end >= deadline);
        Some(PreStopSeen {
            started_at: session.start,
            ended_at: session.end,
            duration_ns: session.end.map(|end| end.saturating_sub(session.start)),
            overran_grace: running_at_deadline && deadline.saturating_sub(session.start) >= grace_ns,
        })
    }

    /// max(grace - preStop elapsed, 2 s), with the elapsed time truncated to whole seconds as
    /// `executePreStopHook` returns it. Returns whether the preStop part was known.
    fn expected_kill_after(
        &self,
        grace_ns: u64,
        stop_time: Option<u64>,
        pre_stop: Option<&PreStopSeen>,
    ) -> (u64, bool) {
        let floor_only = (MINIMUM_GRACE_NS, false);
        if self.settings.is_sidecar {
            return floor_only;
        }
        // The kubelet runs the hook only when there is a grace period to run it in.
        let hook = self.settings.pre_stop.as_ref().filter(|_| grace_ns > 0);
        let elapsed_ns = match hook {
            None => 0,
            Some(PreStopHandler::Sleep { seconds }) => seconds.saturating_mul(SECOND_NS).min(grace_ns),
            Some(PreStopHandler::Exec { .. }) => match (pre_stop, stop_time) {
                // The hook ends when the kubelet stops waiting (at most the grace period), and
                // the stop signal follows at once, so stop - start is the kubelet's elapsed.
                (Some(seen), Some(stop)) => stop.saturating_sub(seen.started_at).min(grace_ns),
                _ => return floor_only,
            },
            Some(PreStopHandler::HttpGet | PreStopHandler::TcpSocket) => return floor_only,
        };
        let elapsed_whole_seconds_ns = elapsed_ns / SECOND_NS * SECOND_NS;
        (grace_ns.saturating_sub(elapsed_whole_seconds_ns).max(MINIMUM_GRACE_NS), true)
    }

    fn listening_at(&self, time: u64) -> bool {
        let open: i64 = self.listeners_before_stop
            + self
                .listener_changes
                .iter()
                .filter(|(at, _)| *at <= time)
                .map(|(_, change)| i64::from(*change))
                .sum::<i64>();
        open > 0
    }
}

/// Whether a sidecar's stop came in its turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SidecarVerdict {
    /// Signalled after every main container and every later-defined sidecar had exited.
    InOrder,
    /// Signalled while a main container was still running: the rule was broken.
    SignalledBeforeMainExited { main_container: String },
    /// Signalled before a sidecar defined after it had exited (sidecars stop in reverse order).
    SignalledBeforeLaterSidecarExited { sidecar: String },
    /// No stop signal (it crashed, completed, or was killed in an emergency termination).
    NotSignalled,
}

/// One sidecar's termination order, judged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SidecarOrder {
    pub container: String,
    pub stop_signal_at: Option<u64>,
    /// The exit of the main container that exited last.
    pub last_main_exit: Option<u64>,
    pub verdict: SidecarVerdict,
}

/// Judges the sidecars of one pod termination. Pass every container's report as (name, report)
/// in the pod spec's order (init containers first, as defined), including every main container:
/// a main container that was still running when a sidecar was signalled shows up through its
/// later exit time.
pub fn sidecar_order<'a>(reports: impl IntoIterator<Item = (&'a str, &'a TerminationReport)>) -> Vec<SidecarOrder> {
    let reports: Vec<(&str, &TerminationReport)> = reports.into_iter().collect();
    let mains: Vec<(&str, u64)> = reports
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
            let verdict = match stop_signal_at {
                None => SidecarVerdict::NotSignalled,
                Some(at) => match last_main.filter(|(_, exit)| *exit > at) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = SECOND_NS;
    const MS: u64 = 1_000_000;

    fn runtime() -> SignalSender {
        SignalSender::Runtime
    }

    fn tracker_with(settings: TerminationSettings) -> TerminationTracker {
        TerminationTracker::new(settings)
    }

    fn exec_pre_stop(command: &[&str]) -> Option<PreStopHandler> {
        Some(PreStopHandler::Exec { command: command.iter().map(|s| (*s).to_owned()).collect() })
    }

    #[test]
    fn senders_are_named_from_comm_and_cgroup() {
        assert_eq!(SignalSender::from_comm("containerd-shim", false), SignalSender::Runtime);
        assert_eq!(SignalSender::from_comm("runc", false), SignalSender::Runtime);
        assert_eq!(SignalSender::from_comm("crun", false), SignalSender::Runtime);
        assert_eq!(SignalSender::from_comm("conmon", false), SignalSender::Runtime);
        assert_eq!(SignalSender::from_comm("containerd", false), SignalSender::Runtime);
        assert_eq!(SignalSender::from_comm("kubelet", false), SignalSender::Kubelet);
        assert_eq!(SignalSender::from_comm("runc", true), SignalSender::SameContainer);
        assert_eq!(SignalSender::from_comm("bash", false), SignalSender::OtherProcess { comm: "bash".into() });
    }

    #[test]
    fn pre_stop_annotations_parse() {
        assert_eq!(
            PreStopHandler::from_annotation(r#"{"exec":{"command":["/bin/sh","-c","sleep 5"]}}"#).expect("exec"),
            PreStopHandler::Exec { command: vec!["/bin/sh".into(), "-c".into(), "sleep 5".into()] }
        );
        assert_eq!(
            PreStopHandler::from_annotation(r#"{"httpGet":{"path":"/quit","port":8080,"scheme":"HTTP"}}"#)
                .expect("http"),
            PreStopHandler::HttpGet
        );
        assert_eq!(
            PreStopHandler::from_annotation(r#"{"sleep":{"seconds":7}}"#).expect("sleep"),
            PreStopHandler::Sleep { seconds: 7 }
        );
    }

    #[test]
    fn malformed_pre_stop_annotations_are_clear_errors() {
        let bad_json = PreStopHandler::from_annotation(r#"{"exec":{"command":["sh""#);
        assert!(matches!(bad_json, Err(TerminationError::PreStopJson { .. })));
        assert!(bad_json.map_err(|e| e.to_string()).err().is_some_and(|text| text.contains("not a lifecycle handler")));
        assert!(matches!(PreStopHandler::from_annotation("{}"), Err(TerminationError::PreStopNoAction { .. })));
        assert!(matches!(
            PreStopHandler::from_annotation(r#"{"exec":{"command":[]}}"#),
            Err(TerminationError::PreStopEmptyCommand { .. })
        ));
        assert!(matches!(
            PreStopHandler::from_annotation(r#"{"exec":{"command":["a"]},"sleep":{"seconds":1}}"#),
            Err(TerminationError::PreStopSeveralActions { .. })
        ));
        assert!(matches!(
            PreStopHandler::from_annotation(r#"{"sleep":{"seconds":-1}}"#),
            Err(TerminationError::PreStopNegativeSleep { seconds: -1 })
        ));
        assert!(matches!(
            PreStopHandler::from_annotation(r#"{"exec":{"command":"sh"}}"#),
            Err(TerminationError::PreStopJson { .. })
        ));
    }

    #[test]
    fn exec_comm_is_the_basename_cut_to_15_bytes() {
        assert_eq!(exec_pre_stop(&["/bin/sh", "-c", "x"]).and_then(|h| h.exec_comm()), Some("sh".into()));
        assert_eq!(exec_pre_stop(&["nginx"]).and_then(|h| h.exec_comm()), Some("nginx".into()));
        assert_eq!(
            exec_pre_stop(&["/usr/local/bin/graceful-shutdown-helper"]).and_then(|h| h.exec_comm()),
            Some("graceful-shutdo".into())
        );
        assert_eq!(PreStopHandler::HttpGet.exec_comm(), None);
    }

    #[test]
    fn exit_within_grace() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        let report = t.on_init_exit(103 * S, None, Some(SIGTERM)).clone();
        assert_eq!(report.expected_kill_after_ns, 30 * S);
        assert!(report.expected_kill_exact);
        assert_eq!(
            report.stop_signal.as_ref().map(|s| (s.time, s.signal, s.matches_configured)),
            Some((100 * S, 15, true))
        );
        match report.outcome {
            TerminationOutcome::ExitedWithinGrace { duration_ns, grace_used_ratio } => {
                assert_eq!(duration_ns, 3 * S);
                assert!((grace_used_ratio - 0.1).abs() < 1e-9);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sigterm_exit_143_with_earlier_child_oom_is_not_oom_killed() {
        // A child was OOM-killed earlier (the cgroup's oom_kill counter is non-zero); the init
        // then exits 143 on SIGTERM. Runtimes reading the counter call this OOMKilled (#140718).
        let mut t = tracker_with(TerminationSettings::default());
        t.on_oom_kill(50 * S, false);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        let report = t.on_init_exit(101 * S, Some(143), None);
        assert!(matches!(report.outcome, TerminationOutcome::ExitedWithinGrace { .. }));
        assert_eq!(report.oom_kills, 1);
    }

    #[test]
    fn sigkill_at_grace_is_a_violation() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_listen(10 * S);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        t.on_listener_accept(99 * S);
        t.on_listener_accept(101 * S);
        t.on_listener_accept(120 * S);
        t.on_signal(130 * S + 90 * MS, SIGKILL, runtime(), true);
        let report = t.on_init_exit(130 * S + 91 * MS, None, Some(SIGKILL));
        assert_eq!(
            report.outcome,
            TerminationOutcome::SigkilledAfterGrace {
                grace_ns: 30 * S,
                stop_to_kill_ns: 30 * S + 90 * MS,
                expected_kill_after_ns: 30 * S,
                killed_early: false,
                accepts_after_stop: 2,
                still_listening: true,
            }
        );
    }

    #[test]
    fn deletion_grace_wins_and_early_kills_are_flagged() {
        let settings = TerminationSettings { deletion_grace_ns: Some(10 * S), ..Default::default() };
        let mut t = tracker_with(settings);
        t.on_listen(S);
        t.on_listen_close(99 * S);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        t.on_signal(105 * S, SIGKILL, runtime(), true);
        let report = t.on_init_exit(105 * S, None, Some(SIGKILL));
        assert_eq!(report.grace_ns, 10 * S);
        match &report.outcome {
            TerminationOutcome::SigkilledAfterGrace {
                killed_early, still_listening, expected_kill_after_ns, ..
            } => {
                assert_eq!(*expected_kill_after_ns, 10 * S);
                assert!(*killed_early);
                assert!(!*still_listening);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pre_stop_elapsed_whole_seconds_are_subtracted() {
        let settings =
            TerminationSettings { pre_stop: exec_pre_stop(&["/bin/sh", "-c", "sleep 5"]), ..Default::default() };
        let mut t = tracker_with(settings);
        // An exec probe running the same program earlier must not be taken for the hook.
        t.on_exec_session(80 * S, Some(80 * S + 20 * MS), "sh");
        t.on_exec_session(90 * S, None, "sh");
        t.on_exec_session(90 * S, Some(95 * S + 800 * MS), "sh");
        t.on_signal(95 * S + 900 * MS, SIGTERM, runtime(), true);
        t.on_signal(95 * S + 900 * MS + 25 * S, SIGKILL, runtime(), true);
        let report = t.on_init_exit(95 * S + 900 * MS + 25 * S, None, Some(SIGKILL)).clone();
        let pre_stop = report.pre_stop.expect("preStop seen");
        assert_eq!(pre_stop.started_at, 90 * S);
        assert_eq!(pre_stop.duration_ns, Some(5 * S + 800 * MS));
        assert!(!pre_stop.overran_grace);
        // 5.9 s elapsed counts as 5 s: 30 - 5 = 25 s.
        assert_eq!(report.expected_kill_after_ns, 25 * S);
        assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { killed_early: false, .. }));
    }

    #[test]
    fn pre_stop_overrun_leaves_the_two_second_floor() {
        let settings = TerminationSettings {
            grace_period_ns: 10 * S,
            pre_stop: exec_pre_stop(&["sleep", "3600"]),
            ..Default::default()
        };
        let mut t = tracker_with(settings);
        t.on_exec_session(100 * S, None, "sleep");
        t.on_signal(110 * S + 5 * MS, SIGTERM, runtime(), true);
        t.on_signal(112 * S + 10 * MS, SIGKILL, runtime(), true);
        let report = t.on_init_exit(112 * S + 11 * MS, None, Some(SIGKILL));
        assert_eq!(report.expected_kill_after_ns, MINIMUM_GRACE_NS);
        assert!(report.pre_stop.as_ref().is_some_and(|p| p.overran_grace));
        match &report.outcome {
            TerminationOutcome::SigkilledAfterGrace { killed_early, stop_to_kill_ns, .. } => {
                assert!(!killed_early);
                assert_eq!(*stop_to_kill_ns, 2 * S + 5 * MS);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pre_stop_that_ate_most_of_the_grace_gets_the_floor() {
        let settings = TerminationSettings { pre_stop: exec_pre_stop(&["/bin/drain"]), ..Default::default() };
        let mut t = tracker_with(settings);
        t.on_exec_session(100 * S, Some(129 * S + 500 * MS), "drain");
        t.on_signal(129 * S + 510 * MS, SIGTERM, runtime(), true);
        t.on_signal(131 * S + 520 * MS, SIGKILL, runtime(), true);
        let report = t.on_init_exit(131 * S + 520 * MS, None, Some(SIGKILL));
        // 29 whole seconds elapsed: 30 - 29 = 1 s, raised to the 2 s floor.
        assert_eq!(report.expected_kill_after_ns, 2 * S);
        assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { killed_early: false, .. }));
    }

    #[test]
    fn sleep_hook_and_invisible_hooks() {
        let sleep = TerminationSettings { pre_stop: Some(PreStopHandler::Sleep { seconds: 5 }), ..Default::default() };
        let mut t = tracker_with(sleep);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        let report = t.on_init_exit(101 * S, Some(0), None);
        assert_eq!((report.expected_kill_after_ns, report.expected_kill_exact), (25 * S, true));

        let http = TerminationSettings { pre_stop: Some(PreStopHandler::HttpGet), ..Default::default() };
        let mut t = tracker_with(http);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        let report = t.on_init_exit(101 * S, Some(0), None);
        assert_eq!((report.expected_kill_after_ns, report.expected_kill_exact), (2 * S, false));
    }

    #[test]
    fn sigkill_without_stop_signal() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_signal(100 * S, SIGKILL, runtime(), true);
        let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
        assert_eq!(report.outcome, TerminationOutcome::KilledWithoutGrace { sender: Some(SignalSender::Runtime) });

        let mut t = tracker_with(TerminationSettings::default());
        t.on_signal(100 * S, SIGKILL, SignalSender::OtherProcess { comm: "kill".into() }, true);
        let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
        assert_eq!(
            report.outcome,
            TerminationOutcome::KilledWithoutGrace { sender: Some(SignalSender::OtherProcess { comm: "kill".into() }) }
        );
    }

    #[test]
    fn oom_kill_of_the_init() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_oom_kill(100 * S, true);
        t.on_signal(100 * S, SIGKILL, SignalSender::SameContainer, true);
        let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
        assert_eq!(report.outcome, TerminationOutcome::OomKilled);
        assert_eq!(report.oom_kills, 1);

        // The event names another victim, but nothing else sent the init a SIGKILL: the OOM
        // killer (a group kill the caller did not attribute) is the only candidate.
        let mut t = tracker_with(TerminationSettings::default());
        t.on_oom_kill(100 * S, false);
        let report = t.on_init_exit(100 * S + MS, None, Some(SIGKILL));
        assert_eq!(report.outcome, TerminationOutcome::OomKilled);
    }

    #[test]
    fn exit_137_without_an_oom_event_is_not_oom() {
        let mut t = tracker_with(TerminationSettings::default());
        let report = t.on_init_exit(100 * S, Some(137), None);
        assert_eq!(
            report.outcome,
            TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(137), signal: None }
        );
    }

    #[test]
    fn child_oom_then_grace_kill_is_a_grace_kill() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_oom_kill(90 * S, false);
        t.on_signal(100 * S, SIGTERM, runtime(), true);
        t.on_signal(130 * S, SIGKILL, runtime(), true);
        let report = t.on_init_exit(130 * S, None, Some(SIGKILL));
        assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }));
    }

    #[test]
    fn crash_and_completion_have_no_stop_signal() {
        let mut t = tracker_with(TerminationSettings::default());
        // The app signalling itself is not a stop.
        t.on_signal(99 * S, SIGTERM, SignalSender::SameContainer, true);
        let report = t.on_init_exit(100 * S, None, Some(11));
        assert_eq!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: None, signal: Some(11) });
        let mut t = tracker_with(TerminationSettings::default());
        let report = t.on_init_exit(100 * S, Some(0), None);
        assert_eq!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(0), signal: None });
    }

    #[test]
    fn signals_to_other_processes_and_after_exit_do_not_count() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_signal(90 * S, SIGTERM, runtime(), false);
        t.on_signal(101 * S, SIGTERM, runtime(), true);
        let report = t.on_init_exit(100 * S, Some(1), None);
        assert!(report.stop_signal.is_none());
        // The report is fixed at the first exit.
        let again = t.on_init_exit(200 * S, Some(0), None);
        assert_eq!(again.exit_time, 100 * S);
    }

    #[test]
    fn an_unexpected_stop_signal_is_reported() {
        let mut t = tracker_with(TerminationSettings::default());
        t.on_signal(100 * S, 3, runtime(), true);
        let report = t.on_init_exit(100 * S + 10 * MS, None, Some(3));
        assert_eq!(report.stop_signal.as_ref().map(|s| s.matches_configured), Some(false));
    }

    fn report_of(is_sidecar: bool, stop_at: Option<u64>, exit_at: u64) -> TerminationReport {
        let mut t = tracker_with(TerminationSettings { is_sidecar, ..Default::default() });
        if let Some(at) = stop_at {
            t.on_signal(at, SIGTERM, runtime(), true);
        }
        t.on_init_exit(exit_at, None, Some(SIGTERM)).clone()
    }

    #[test]
    fn sidecars_stopped_after_mains_in_reverse_order_comply() {
        let proxy = report_of(true, Some(112 * S), 113 * S);
        let logs = report_of(true, Some(110 * S), 111 * S);
        let app = report_of(false, Some(100 * S), 105 * S);
        let worker = report_of(false, Some(100 * S), 109 * S);
        let order = sidecar_order([("proxy", &proxy), ("logs", &logs), ("app", &app), ("worker", &worker)]);
        assert_eq!(order.len(), 2);
        assert!(order.iter().all(|o| o.verdict == SidecarVerdict::InOrder), "{order:?}");
        assert_eq!(order[0].last_main_exit, Some(109 * S));
    }

    #[test]
    fn sidecar_signalled_with_the_mains_is_a_violation() {
        let proxy = report_of(true, Some(100 * S), 101 * S);
        let app = report_of(false, Some(100 * S), 105 * S);
        let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
        assert_eq!(order[0].verdict, SidecarVerdict::SignalledBeforeMainExited { main_container: "app".into() });
    }

    #[test]
    fn sidecars_out_of_reverse_order_are_flagged() {
        let first = report_of(true, Some(110 * S), 111 * S);
        let second = report_of(true, Some(110 * S), 112 * S);
        let app = report_of(false, Some(100 * S), 105 * S);
        let order = sidecar_order([("first", &first), ("second", &second), ("app", &app)]);
        assert_eq!(order[0].verdict, SidecarVerdict::SignalledBeforeLaterSidecarExited { sidecar: "second".into() });
        assert_eq!(order[1].verdict, SidecarVerdict::InOrder);
    }

    #[test]
    fn sidecar_killed_in_an_emergency_was_not_signalled() {
        let mut t = tracker_with(TerminationSettings { is_sidecar: true, ..Default::default() });
        t.on_signal(130 * S, SIGKILL, runtime(), true);
        let proxy = t.on_init_exit(130 * S, None, Some(SIGKILL)).clone();
        assert!(!proxy.expected_kill_exact);
        let app = report_of(false, Some(100 * S), 130 * S);
        let order = sidecar_order([("proxy", &proxy), ("app", &app)]);
        assert_eq!(order[0].verdict, SidecarVerdict::NotSignalled);
    }

    #[test]
    fn reports_serialize() {
        let report = report_of(false, Some(100 * S), 101 * S);
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["outcome"]["kind"], "exited_within_grace");
        assert_eq!(json["stop_signal"]["sender"]["kind"], "runtime");
    }
}
