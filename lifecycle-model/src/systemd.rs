//! systemd's rules for a unit on a plain host, as the kubelet's are for a container: how it is
//! stopped (`KillSignal=`, then SIGKILL once `TimeoutStopSec=` ran out) and whether and when it
//! is restarted (`Restart=`, `RestartSec=`, and since systemd 254 `RestartSteps=` with
//! `RestartMaxDelaySec=`), from the unit's own settings as systemd reports them (the agent reads
//! them over D-Bus, never from unit files: drop-ins, defaults and `daemon-reload` all count).
//!
//! Upstream: `src/core/service.c` (`service_shall_restart`, `service_restart_usec_next`) and
//! systemd.service(5), "Restart=". Pure: facts in, settings and expected delays out.

use serde::{Deserialize, Serialize};

use crate::{
    backoff::{Observation, Tolerance},
    termination::{TerminationSettings, SIGTERM},
    time::{BootTime, MILLISECOND, SECOND},
};

/// `Restart=`: which ends of the main process systemd restarts the unit after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    #[default]
    No,
    OnSuccess,
    OnFailure,
    OnAbnormal,
    OnWatchdog,
    OnAbort,
    Always,
}

crate::spelling::spelling!(RestartPolicy {
    No => "no",
    OnSuccess => "on-success",
    OnFailure => "on-failure",
    OnAbnormal => "on-abnormal",
    OnWatchdog => "on-watchdog",
    OnAbort => "on-abort",
    Always => "always",
});

impl RestartPolicy {
    /// `Restart=` as systemd spells it; None for a value this agent does not know.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|policy| policy.as_str() == text)
    }
}

/// One unit's settings, as systemd reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemdUnit {
    /// The unit's name (`nginx.service`, `session-3.scope`).
    pub name: String,
    /// `KillSignal=`: the stop signal.
    pub kill_signal: u8,
    /// `TimeoutStopUSec`; None is `infinity` (systemd never escalates).
    pub timeout_stop_ns: Option<u64>,
    /// `Restart=` (services only; scopes are never restarted).
    pub restart: RestartPolicy,
    /// `RestartUSec`: the delay before a restart (systemd's default 100 ms).
    pub restart_ns: u64,
    /// `RestartSteps` (0 unless set; systemd 254+).
    pub restart_steps: u32,
    /// `RestartMaxDelayUSec`; None is `infinity` (no growth).
    pub restart_max_delay_ns: Option<u64>,
    /// Exit codes `SuccessExitStatus=` adds to 0 as clean.
    pub success_exit_codes: Vec<u8>,
    /// Signals `SuccessExitStatus=` adds to SIGHUP, SIGINT, SIGTERM, SIGPIPE as clean.
    pub success_signals: Vec<u8>,
    /// `RestartPreventExitStatus=`: ends never restarted after (codes, signals).
    pub prevent_exit_codes: Vec<u8>,
    pub prevent_signals: Vec<u8>,
    /// `RestartForceExitStatus=`: ends always restarted after (codes, signals).
    pub force_exit_codes: Vec<u8>,
    pub force_signals: Vec<u8>,
    /// `NRestarts` when read: systemd's own count of automatic restarts since the last manual
    /// start.
    pub restarts: u32,
}

impl Default for SystemdUnit {
    /// systemd's defaults for a service.
    fn default() -> Self {
        Self {
            name: String::new(),
            kill_signal: SIGTERM,
            timeout_stop_ns: Some(90 * SECOND),
            restart: RestartPolicy::No,
            restart_ns: 100 * MILLISECOND,
            restart_steps: 0,
            restart_max_delay_ns: None,
            success_exit_codes: Vec::new(),
            success_signals: Vec::new(),
            prevent_exit_codes: Vec::new(),
            prevent_signals: Vec::new(),
            force_exit_codes: Vec::new(),
            force_signals: Vec::new(),
            restarts: 0,
        }
    }
}

/// How the main process ended, as systemd classifies it for `Restart=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MainEnd {
    /// Exited with this code.
    Exited(u8),
    /// Killed by this signal.
    Killed(u8),
}

/// Signals systemd counts as a clean end (SIGHUP, SIGINT, SIGTERM, SIGPIPE).
const CLEAN_SIGNALS: [u8; 4] = [1, 2, 15, 13];
/// Signals whose death dumps core (`on-abort` restarts after an uncaught one).
const CORE_SIGNALS: [u8; 10] = [3, 4, 5, 6, 7, 8, 11, 24, 25, 31];

impl SystemdUnit {
    /// The stop rules: `KillSignal=` first, SIGKILL once `TimeoutStopSec=` ran out.
    pub fn termination_settings(&self) -> TerminationSettings {
        TerminationSettings::systemd(self.kill_signal, self.timeout_stop_ns)
    }

    /// Whether systemd restarts the unit after its main process ended so, when nobody stopped
    /// it (`systemctl stop` restarts nothing).
    pub fn restarts_after(&self, end: MainEnd) -> bool {
        match end {
            MainEnd::Exited(code) if self.prevent_exit_codes.contains(&code) => return false,
            MainEnd::Killed(signal) if self.prevent_signals.contains(&signal) => return false,
            MainEnd::Exited(code) if self.force_exit_codes.contains(&code) => return true,
            MainEnd::Killed(signal) if self.force_signals.contains(&signal) => return true,
            _ => {}
        }
        let clean = match end {
            MainEnd::Exited(code) => code == 0 || self.success_exit_codes.contains(&code),
            MainEnd::Killed(signal) => CLEAN_SIGNALS.contains(&signal) || self.success_signals.contains(&signal),
        };
        match self.restart {
            RestartPolicy::No | RestartPolicy::OnWatchdog => false,
            RestartPolicy::Always => true,
            RestartPolicy::OnSuccess => clean,
            RestartPolicy::OnFailure => !clean,
            RestartPolicy::OnAbnormal => matches!(end, MainEnd::Killed(_)) && !clean,
            RestartPolicy::OnAbort => matches!(end, MainEnd::Killed(signal) if CORE_SIGNALS.contains(&signal)),
        }
    }

    /// The delay before automatic restart `n` (1 for the first since the last manual start):
    /// `RestartSec`, or with `RestartSteps` a geometric climb to `RestartMaxDelaySec` over that
    /// many steps (`service_restart_usec_next`: r_0 * (r_max / r_0) ^ ((n - 1) / steps)).
    pub fn delay_of_restart(&self, n: u32) -> u64 {
        let (first, steps) = (self.restart_ns, self.restart_steps);
        let Some(max) = self.restart_max_delay_ns else { return first };
        if n <= 1 || steps == 0 || first == 0 || first >= max {
            return first;
        }
        if n > steps {
            return max;
        }
        let ratio = max as f64 / first as f64;
        (first as f64 * ratio.powf(f64::from(n - 1) / f64::from(steps))) as u64
    }
}

/// systemd restarts on a timer of its own event loop: on time within its default accuracy
/// (250 ms), plus the unit's start.
pub const RESTART_TOLERANCE: Tolerance =
    Tolerance { early_ns: SECOND / 2, late_ns: 2 * SECOND, late_ratio: 0.1, late_ratio_cap_ns: 60 * SECOND };

/// Replays a unit's automatic restarts and judges each against its settings.
#[derive(Clone, Debug, Default)]
pub struct RestartTracker {
    /// A restart is due: (when the main process ended, its number, the delay expected).
    pending: Option<(BootTime, u32, u64)>,
    /// Automatic restarts seen since the agent started (added to systemd's count when read).
    seen: u32,
}

impl RestartTracker {
    /// The unit's main process ended at `at` so; `stopped` when something stopped it (a stop
    /// signal from outside: `systemctl stop` restarts nothing, and a `kill` is judged as a stop).
    pub fn on_ended(&mut self, unit: &SystemdUnit, at: BootTime, end: MainEnd, stopped_by_systemd: bool) {
        self.pending = None;
        if stopped_by_systemd || !unit.restarts_after(end) {
            return;
        }
        let number = unit.restarts.saturating_add(self.seen).saturating_add(1);
        self.pending = Some((at, number, unit.delay_of_restart(number)));
    }

    /// The unit started again at `at`: a judged restart when one was due.
    pub fn on_started(&mut self, at: BootTime) -> Option<Observation> {
        let (finished_at, restart_number, expected_delay_ns) = self.pending.take()?;
        self.seen = self.seen.saturating_add(1);
        let observed_delay_ns = at.since(finished_at);
        Some(Observation {
            restart_number,
            finished_at,
            started_at: at,
            observed_delay_ns,
            expected_delay_ns: Some(expected_delay_ns),
            entry_reset: false,
            after_kubelet_restart: false,
            verdict: RESTART_TOLERANCE.verdict(observed_delay_ns, expected_delay_ns),
        })
    }

    /// The delay of the restart now due, if one is.
    pub fn pending_delay_ns(&self) -> Option<u64> {
        self.pending.map(|(_, _, delay)| delay)
    }
}

/// The unit a cgroup path belongs to: its deepest `.service` or `.scope` component (a delegated
/// service's own sub-cgroups belong to it).
pub fn unit_of_path(path: &str) -> Option<&str> {
    path.split('/').rev().find(|part| part.ends_with(".service") || part.ends_with(".scope"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Verdict;

    fn unit(restart: RestartPolicy) -> SystemdUnit {
        SystemdUnit { restart, restart_ns: 2 * SECOND, ..SystemdUnit::default() }
    }

    #[test]
    fn restart_policies_follow_systemds_table() {
        use MainEnd::{Exited, Killed};
        let cases = [
            (RestartPolicy::No, [false, false, false, false]),
            (RestartPolicy::Always, [true, true, true, true]),
            (RestartPolicy::OnSuccess, [true, false, true, false]),
            (RestartPolicy::OnFailure, [false, true, false, true]),
            (RestartPolicy::OnAbnormal, [false, false, false, true]),
            (RestartPolicy::OnAbort, [false, false, false, true]),
        ];
        // Clean exit, unclean exit, clean signal (TERM), unclean signal with core (SEGV).
        let ends = [Exited(0), Exited(1), Killed(15), Killed(11)];
        for (policy, expected) in cases {
            let got: Vec<bool> = ends.iter().map(|&end| unit(policy).restarts_after(end)).collect();
            assert_eq!(got, expected, "Restart={}", policy.as_str());
        }
        // SIGKILL is unclean but dumps no core: on-abnormal restarts, on-abort does not.
        assert!(unit(RestartPolicy::OnAbnormal).restarts_after(Killed(9)));
        assert!(!unit(RestartPolicy::OnAbort).restarts_after(Killed(9)));
    }

    #[test]
    fn exit_status_lists_override_the_policy() {
        let mut u = unit(RestartPolicy::OnFailure);
        u.success_exit_codes = vec![3];
        assert!(!u.restarts_after(MainEnd::Exited(3)), "SuccessExitStatus=3 is clean");
        u.prevent_exit_codes = vec![4];
        assert!(!u.restarts_after(MainEnd::Exited(4)), "RestartPreventExitStatus=4");
        u.force_exit_codes = vec![0];
        assert!(u.restarts_after(MainEnd::Exited(0)), "RestartForceExitStatus=0");
    }

    #[test]
    fn restart_steps_climb_geometrically_to_the_maximum() {
        let u = SystemdUnit {
            restart: RestartPolicy::Always,
            restart_ns: SECOND,
            restart_steps: 4,
            restart_max_delay_ns: Some(16 * SECOND),
            ..SystemdUnit::default()
        };
        let delays: Vec<u64> = (1..=6).map(|n| u.delay_of_restart(n) / MILLISECOND).collect();
        assert_eq!(delays, [1000, 2000, 4000, 8000, 16000, 16000]);
        let flat = SystemdUnit { restart_steps: 0, ..u.clone() };
        assert_eq!(flat.delay_of_restart(5), SECOND, "no steps: RestartSec every time");
    }

    #[test]
    fn a_restart_is_judged_only_when_systemd_was_due_to_make_one() {
        let u = unit(RestartPolicy::OnFailure);
        let mut tracker = RestartTracker::default();
        let t = |s: u64| BootTime::from_ns(s * SECOND);
        tracker.on_ended(&u, t(10), MainEnd::Exited(1), false);
        let seen = tracker.on_started(t(12)).expect("due");
        assert_eq!(
            (seen.restart_number, seen.expected_delay_ns, seen.verdict),
            (1, Some(2 * SECOND), Verdict::WithinTolerance)
        );
        tracker.on_ended(&u, t(20), MainEnd::Exited(1), false);
        assert_eq!(tracker.on_started(t(20)).expect("due").verdict, Verdict::TooEarly);
        // A clean exit under on-failure, or a stop by systemd: a later start is a manual one.
        tracker.on_ended(&u, t(30), MainEnd::Exited(0), false);
        assert_eq!(tracker.on_started(t(31)), None);
        tracker.on_ended(&u, t(40), MainEnd::Killed(15), true);
        assert_eq!(tracker.on_started(t(41)), None);
    }

    #[test]
    fn a_cgroup_path_names_its_unit() {
        assert_eq!(unit_of_path("system.slice/nginx.service"), Some("nginx.service"));
        assert_eq!(unit_of_path("system.slice/docker.service/sub"), Some("docker.service"));
        assert_eq!(unit_of_path("user.slice/user-0.slice/session-3.scope"), Some("session-3.scope"));
        assert_eq!(unit_of_path("t"), None);
    }
}
