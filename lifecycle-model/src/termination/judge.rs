//! The per-instance judge: collects signals, OOM kills, exec sessions and listener activity
//! until the init exits, then applies the kubelet's stop rules to produce a report.
//!
//! Every record is bounded (a container lives for months and controls its own processes): what
//! judging needs is pinned — the first kubelet-side stop signal to the init, the first SIGKILL to
//! it from outside, whether the OOM killer chose the init — and everything else is kept as the
//! most recent [`MAX_KEPT_RECORDS`] of each kind, with counts. Each `on_*` method says whether it
//! had to drop an older record, so the node's owner can count what was dropped.

use std::collections::VecDeque;

use crate::{oom::OomLimit, spec::SpecSource, time::BootTime};

use super::{
    records::{ExecSession, OomLog, Retention, SignalLog, SignalRecord, MAX_KEPT_RECORDS},
    report::OomVictim,
    report::SidecarTurn,
    PreStopHandler, PreStopSeen, ProcessAtStop, SignalSender, StopRules, StopScene, StopSignalSeen, TerminationOutcome,
    TerminationReport, TerminationSettings, MINIMUM_GRACE_NS, SECOND, SIGKILL,
};

/// Collects one container instance's termination evidence until its init exits.
#[derive(Clone, Debug)]
pub struct TerminationTracker {
    settings: TerminationSettings,
    signals: SignalLog,
    oom_kills: OomLog,
    /// The limit the last OOM kill answered, when the kernel said (see [`crate::oom`]).
    oom_limit: Option<OomLimit>,
    exec_sessions: Vec<ExecSession>,
    /// Connections the app accepted after the stop signal: how many, and the first ones' times.
    accepts_after_stop: u64,
    accept_times: Vec<u64>,
    /// (time, +1 listen / -1 close) after a stop may have begun, to tell whether a listener was
    /// open at a given time; the most recent [`MAX_KEPT_RECORDS`], older ones folded into
    /// `listeners_before_stop` (exact for any time after them).
    listener_changes: VecDeque<(u64, i32)>,
    /// Listening sockets opened minus closed before any stop signal (and folded changes).
    listeners_before_stop: i64,
    /// When watching began, if after the instance started (see [`Self::watched_since`]).
    watched_since: Option<u64>,
    /// Who ran at the stop signal and at the SIGKILL (filled by the node, which knows the
    /// processes: see [`Self::scene_wanted`]).
    scene: StopScene,
    scene_taken: (bool, bool),
    /// A sidecar's wait for its turn, as the node measured it at its stop signal (see
    /// [`Self::on_sidecar_turn`]).
    sidecar_turn: Option<SidecarTurn>,
    report: Option<TerminationReport>,
}

/// Which moment of a stop the node should list the container's processes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SceneMoment {
    /// The stop signal just came to the init.
    Stop,
    /// The SIGKILL just came to the init.
    Kill,
}

impl TerminationTracker {
    pub fn new(settings: TerminationSettings) -> Self {
        Self {
            settings,
            signals: SignalLog::default(),
            oom_kills: OomLog::default(),
            oom_limit: None,
            exec_sessions: Vec::new(),
            accepts_after_stop: 0,
            accept_times: Vec::new(),
            listener_changes: VecDeque::new(),
            listeners_before_stop: 0,
            watched_since: None,
            scene: StopScene::default(),
            scene_taken: (false, false),
            sidecar_turn: None,
            report: None,
        }
    }

    /// The time of the kubelet's stop signal to the init so far (the runtime's or the
    /// kubelet's), if one came.
    pub fn kubelet_stop_time(&self) -> Option<u64> {
        self.signals.first_stop.as_ref().map(|stop| stop.time)
    }

    /// A sidecar got its stop signal `turn.waited_ns` after the kubelet began stopping its pod
    /// (the pod's main containers' stop signal): the kubelet held it that long for its turn
    /// (`waitForTurn`, `kuberuntime_termination_order.go`), at most the pod's grace, and gave it
    /// what was left in whole seconds, 2 s at least (`killContainer`). Judged by that grace.
    pub fn on_sidecar_turn(&mut self, turn: SidecarTurn) {
        self.sidecar_turn.get_or_insert(turn);
    }

    /// After a signal: the moment whose processes the node should now list with
    /// [`Self::on_scene`], once each (the first stop signal, the first SIGKILL), while the init
    /// runs.
    pub fn scene_wanted(&self) -> Option<SceneMoment> {
        if self.report.is_some() {
            return None;
        }
        if self.signals.first_kill.is_some() && !self.scene_taken.1 {
            return Some(SceneMoment::Kill);
        }
        if self.signals.stop().is_some() && !self.scene_taken.0 {
            return Some(SceneMoment::Stop);
        }
        None
    }

    /// The container's processes at `moment`.
    pub fn on_scene(&mut self, moment: SceneMoment, processes: Vec<ProcessAtStop>) {
        match moment {
            SceneMoment::Stop => {
                self.scene_taken.0 = true;
                self.scene.at_stop(processes);
            }
            SceneMoment::Kill => {
                // A SIGKILL with no stop signal first (grace 0) lists its processes once too.
                self.scene_taken = (true, true);
                self.scene.at_kill(processes);
            }
        }
    }

    /// `signal` went to process `pid` of this container: when it is the stop signal, that
    /// process got it (from the runtime, or passed on by another process).
    pub fn on_signal_to(&mut self, pid: u32, signal: u8) {
        if self.signals.stop().is_some_and(|stop| stop.signal == signal) {
            self.scene.got_stop_signal(pid);
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

    /// A stop signal to the init has been seen: a stop may be under way. O(1): called for every
    /// listen, close and accept.
    fn stop_may_have_begun(&self) -> bool {
        self.signals.stop().is_some()
    }

    /// A signal to a process of this container; `to_init` when the target is its PID 1.
    pub fn on_signal(&mut self, time: u64, signal: u8, sender: SignalSender, to_init: bool) -> Retention {
        self.signals.record(SignalRecord { time, signal, sender, to_init }, &self.settings)
    }

    /// The OOM killer chose a victim in this container; `victim_is_init` when it was PID 1.
    /// With memory.oom.group (the kubelet's default on cgroup v2) every process is a victim.
    pub fn on_oom_kill(&mut self, time: u64, victim_is_init: bool) -> Retention {
        self.oom_kills.record(time, victim_is_init)
    }

    /// The limit an OOM kill in this container answered, from the kernel's log line; the last
    /// one stands.
    pub fn on_oom_limit(&mut self, limit: OomLimit) {
        self.oom_limit = Some(limit);
    }

    /// A process the runtime started into the container that does not descend from its init:
    /// an exec probe, a hook, `kubectl exec`. Reporting the same (start, comm) again updates it,
    /// so a session can be reported when it starts and again when it ends.
    pub fn on_exec_session(&mut self, start: u64, end: Option<u64>, comm: &str) -> Retention {
        if let Some(known) =
            self.exec_sessions.iter_mut().find(|session| session.start == start && session.comm == comm)
        {
            known.end = end.or(known.end);
            return Retention::Kept;
        }
        // Exec probes run every period for the container's whole life: keep the most recent
        // sessions (the preStop hook is always among the last), dropping the oldest ended one, or
        // the oldest of all when every kept session still runs (a container can start sessions
        // that never end).
        let full = self.exec_sessions.len() >= MAX_KEPT_RECORDS;
        if full {
            let oldest = self.exec_sessions.iter().position(|s| s.end.is_some()).unwrap_or(0);
            self.exec_sessions.remove(oldest);
        }
        self.exec_sessions.push(ExecSession { start, end, comm: comm.to_owned() });
        Retention::dropped_if(full)
    }

    /// The app opened a listening socket.
    pub fn on_listen(&mut self, time: u64) -> Retention {
        self.listener_change(time, 1)
    }

    /// The app closed a listening socket.
    pub fn on_listen_close(&mut self, time: u64) -> Retention {
        self.listener_change(time, -1)
    }

    /// Before a stop begins only the running total matters; after it, the timeline does.
    fn listener_change(&mut self, time: u64, change: i32) -> Retention {
        if !self.stop_may_have_begun() {
            self.listeners_before_stop += i64::from(change);
            return Retention::Kept;
        }
        let full = self.listener_changes.len() >= MAX_KEPT_RECORDS;
        if full {
            if let Some((_, oldest)) = self.listener_changes.pop_front() {
                self.listeners_before_stop += i64::from(oldest);
            }
        }
        self.listener_changes.push_back((time, change));
        Retention::dropped_if(full)
    }

    /// The app accepted a connection.
    pub fn on_listener_accept(&mut self, time: u64) -> Retention {
        // Only accepts after the stop signal are judged; a busy server must not grow this list:
        // they are counted, and the first ones' times kept.
        if self.signals.stop().is_none_or(|stop| time <= stop.time) {
            return Retention::Kept;
        }
        self.accepts_after_stop += 1;
        if self.accept_times.len() >= MAX_KEPT_RECORDS {
            return Retention::DroppedOne;
        }
        self.accept_times.push(time);
        Retention::Kept
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

    /// Records held now, of every kind together: what a flood can grow (bounded by
    /// [`MAX_KEPT_RECORDS`] per kind plus the pinned ones).
    pub fn records_held(&self) -> usize {
        self.signals.recent.len()
            + usize::from(self.signals.first_stop.is_some())
            + usize::from(self.signals.first_outside_stop.is_some())
            + usize::from(self.signals.first_kill.is_some())
            + self.oom_kills.times.len()
            + self.exec_sessions.len()
            + self.accept_times.len()
            + self.listener_changes.len()
    }

    /// The report, once the init exited.
    pub fn report(&self) -> Option<&TerminationReport> {
        self.report.as_ref()
    }

    fn judge(&self, exit_time: u64, exit_status: Option<u8>, exit_signal: Option<u8>) -> TerminationReport {
        let before_exit = |time: u64| time <= exit_time;
        let stop = self.signals.stop_before(exit_time, exit_signal).map(|s| StopSignalSeen {
            time: BootTime::from_ns(s.time),
            signal: s.signal,
            sender: s.sender.clone(),
            matches_configured: s.signal == self.settings.stop_signal,
        });
        let sidecar_turn = self.sidecar_turn.filter(|_| self.settings.is_sidecar && self.settings.pre_stop.is_none());
        // A sidecar's grace is what was left of the pod's after its wait, as the kubelet gave it.
        let grace_ns = match sidecar_turn {
            Some(turn) => turn.remaining_grace_ns(),
            None => self.settings.effective_grace_ns(),
        };
        let stop_time = stop.as_ref().map(|s| s.time.ns());
        let pre_stop = self.pre_stop_seen(stop_time, exit_time);
        let (expected_kill_after_ns, expected_kill_exact) =
            self.expected_kill_after(grace_ns, stop_time, pre_stop.as_ref());
        let oom_kills_before_exit = self.oom_kills.count_until(exit_time);
        let init_oom_killed = self.oom_kills.first_init_victim.is_some_and(before_exit);

        let outcome = if exit_signal == Some(SIGKILL) {
            // A SIGKILL from the application to its own PID 1 is dropped by the kernel (init is
            // immune to signals from inside its namespace), so it cannot be the cause.
            let kill = self.signals.first_kill.as_ref().filter(|s| before_exit(s.time));
            // The OOM killer's SIGKILL is sent in the context of whichever task was allocating
            // (usually one of the container's own), so the sender cannot tell; the OOM event can.
            // It killed the init if the event names the init, or if an OOM kill happened and no
            // other SIGKILL to the init competes as the cause.
            let oom_killed_init = init_oom_killed || (oom_kills_before_exit > 0 && kill.is_none());
            match (&stop, kill) {
                _ if oom_killed_init => TerminationOutcome::OomKilled,
                (Some(stop), kill) if kill.is_none_or(|k| k.time >= stop.time.ns()) => {
                    let kill_time = kill.map_or(exit_time, |k| k.time);
                    let stop_to_kill_ns = kill_time.saturating_sub(stop.time.ns());
                    let sender = kill.map(|k| k.sender.clone());
                    let (accepts_after_stop, still_listening) = (self.accepts_after_stop, self.listening_at(kill_time));
                    if self.settings.rules == StopRules::Unmanaged {
                        TerminationOutcome::SigkilledAfterStopSignal { stop_to_kill_ns, sender }
                    } else if stop_to_kill_ns.saturating_add(self.settings.kill_tolerance_ns) < expected_kill_after_ns {
                        TerminationOutcome::SigkilledEarly {
                            grace_ns,
                            stop_to_kill_ns,
                            expected_kill_after_ns,
                            sender,
                            accepts_after_stop,
                            still_listening,
                        }
                    } else {
                        TerminationOutcome::SigkilledAfterGrace {
                            grace_ns,
                            stop_to_kill_ns,
                            expected_kill_after_ns,
                            sender,
                            accepts_after_stop,
                            still_listening,
                        }
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
            let duration_ns = exit_time.saturating_sub(stop.time.ns());
            if self.settings.rules == StopRules::Unmanaged {
                TerminationOutcome::ExitedAfterStopSignal { duration_ns }
            } else {
                TerminationOutcome::ExitedWithinGrace {
                    duration_ns,
                    grace_used_ratio: duration_ns as f64 / expected_kill_after_ns.max(1) as f64,
                }
            }
        } else {
            TerminationOutcome::ExitedWithoutStopSignal { exit_status, signal: exit_signal }
        };

        let oom_victim = match (&outcome, oom_kills_before_exit) {
            (TerminationOutcome::OomKilled, _) => Some(OomVictim::Init),
            (_, 0) => None,
            (_, _) => Some(OomVictim::Child),
        };
        TerminationReport {
            stop_signal: stop,
            pre_stop,
            exit_time: BootTime::from_ns(exit_time),
            exit_status,
            exit_signal,
            rules: self.settings.rules,
            grace_ns,
            expected_kill_after_ns,
            expected_kill_exact,
            oom_kills: oom_kills_before_exit,
            is_sidecar: self.settings.is_sidecar,
            sidecar_turn,
            outcome,
            oom_victim,
            oom_limit: self.oom_limit.clone().filter(|_| oom_kills_before_exit > 0),
            // The node's tracker knows the pod: it names the cause and the facts' source.
            cause: None,
            kubelet_started_before_ns: None,
            memory: None,
            spec: SpecSource::default(),
            watched_since: self.watched_since.map(BootTime::from_ns),
            scene: self.scene.clone(),
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
            started_at: BootTime::from_ns(session.start),
            ended_at: session.end.map(BootTime::from_ns),
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
        match self.settings.rules {
            // systemd kills once TimeoutStopSec= ran out, with no floor (ExecStop= commands run
            // before the stop signal, on their own timeouts).
            StopRules::Systemd => return (grace_ns, true),
            StopRules::Unmanaged => return (0, false),
            StopRules::Kubelet => {}
        }
        let floor_only = (MINIMUM_GRACE_NS, false);
        if self.settings.is_sidecar {
            // Its wait measured (and no hook of its own): `grace_ns` is already the kubelet's.
            return match self.sidecar_turn {
                Some(_) if self.settings.pre_stop.is_none() => (grace_ns.max(MINIMUM_GRACE_NS), true),
                _ => floor_only,
            };
        }
        // The kubelet runs the hook only when there is a grace period to run it in.
        let hook = self.settings.pre_stop.as_ref().filter(|_| grace_ns > 0);
        let elapsed_ns = match hook {
            None => 0,
            Some(PreStopHandler::Sleep { seconds }) => seconds.saturating_mul(SECOND).min(grace_ns),
            Some(PreStopHandler::Exec { .. }) => match (pre_stop, stop_time) {
                // The hook ends when the kubelet stops waiting (at most the grace period), and
                // the stop signal follows at once, so stop - start is the kubelet's elapsed.
                (Some(seen), Some(stop)) => BootTime::from_ns(stop).since(seen.started_at).min(grace_ns),
                _ => return floor_only,
            },
            Some(PreStopHandler::HttpGet | PreStopHandler::TcpSocket) => return floor_only,
        };
        let elapsed_whole_seconds_ns = elapsed_ns / SECOND * SECOND;
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
