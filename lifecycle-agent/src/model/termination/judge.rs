//! The per-instance judge: collects signals, OOM kills, exec sessions and listener activity
//! until the init exits, then applies the kubelet's stop rules to produce a report.

use crate::model::spec::SpecSource;

use super::{
    report::OomVictim, PreStopHandler, PreStopSeen, SignalSender, StopSignalSeen, TerminationOutcome,
    TerminationReport, TerminationSettings, MINIMUM_GRACE_NS, SECOND_NS, SIGKILL,
};

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
    /// When watching began, if after the instance started (see [`Self::watched_since`]).
    watched_since: Option<u64>,
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
            watched_since: None,
            report: None,
        }
    }

    /// The instance was running before `time`, when the agent began watching it (found by the
    /// start-up scan, or by a rescan after lost records): nothing before `time` was seen. The
    /// first call counts.
    pub fn watched_since(&mut self, time: u64) {
        self.watched_since.get_or_insert(time);
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

    /// Drops the report so the next [`Self::on_init_exit`] judges again, with the settings in force
    /// then (the instance's metadata arrived after it was judged with defaults).
    pub fn forget_report(&mut self) {
        self.report = None;
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
        let pre_stop = self.pre_stop_seen(stop.as_ref().map(|s| s.time), exit_time);
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
                (_, kill) => {
                    let sender = kill.map(|k| k.sender.clone());
                    let kill_time = kill.map_or(exit_time, |k| k.time);
                    // A stop signal sent before watching began would bring this SIGKILL up to
                    // a grace period (plus tolerance) later; past that, none can explain it.
                    let window = grace_ns.max(expected_kill_after_ns).saturating_add(self.settings.kill_tolerance_ns);
                    match self.watched_since {
                        Some(since) if kill_time <= since.saturating_add(window) => {
                            TerminationOutcome::StopSignalNotObserved { sender }
                        }
                        _ => TerminationOutcome::KilledWithoutGrace { sender },
                    }
                }
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

        let oom_victim = match (&outcome, oom_before_exit.is_empty()) {
            (TerminationOutcome::OomKilled, _) => Some(OomVictim::Init),
            (_, false) => Some(OomVictim::Child),
            (_, true) => None,
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
            oom_victim,
            // The node's tracker knows the pod: it names the cause and the facts' source.
            cause: None,
            spec: SpecSource::default(),
            watched_since: self.watched_since,
        }
    }

    /// Finds the exec hook's session among exec sessions started before `deadline` (the stop
    /// signal, or the exit). Exec probes may run the same program (`sh`), so prefer the session
    /// that ended closest to the deadline — the kubelet sends the stop signal as soon as the hook
    /// returns — counting one still running at the deadline as closest, and among equals the
    /// earliest started.
    fn pre_stop_seen(&self, stop_time: Option<u64>, exit_time: u64) -> Option<PreStopSeen> {
        let deadline = stop_time.unwrap_or(exit_time);
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
            // The kubelet sends the stop signal once the hook returned or the grace period ran
            // out; a hook still running at the stop signal is one the kubelet gave up on. (The
            // session starts a little after the kubelet's timer, so its own age at that moment
            // can be just under the grace period.)
            overran_grace: running_at_deadline && stop_time.is_some(),
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
