//! The kubelet's container restart back-off, replayed from observed exits and starts, and a
//! verdict on each restart's timing.
//!
//! Owns the model of `pkg/util/flowcontrol` `Backoff` as kuberuntime's `doBackOff` uses it
//! (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`): the reference time is the exited
//! instance's FinishedAt; a key with no entry restarts at once and gets an entry of `initial`;
//! a key with an entry waits `backoff` after FinishedAt, then the entry doubles up to `max`;
//! an entry expires when FinishedAt - lastUpdate exceeds the reset period (lastUpdate = the
//! last restart). The key includes the container spec's hash, so a spec change starts fresh.
//!
//! The policy may be unknown (the agent could not tell the node's kubelet's back-off:
//! `kubelet::policy`): the entry is still replayed (a first restart, or one after the entry
//! expired, is immediate under every policy and is judged), and every other restart is
//! [`Verdict::NotJudged`], with no expected delay.
//!
//! Pure: times in (`CLOCK_BOOTTIME` ns), observations out; no clock is read.

use serde::{Deserialize, Serialize};

use crate::time::{BootTime, SECOND};

/// The back-off parameters of one kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackoffPolicy {
    /// The delay of the first back-off (the second restart).
    pub initial_ns: u64,
    /// The cap the doubling stops at.
    pub max_ns: u64,
    /// An entry expires when the instance started at the last restart finishes more than this
    /// long after that restart (upstream: `eventTime - lastUpdate > 2 * maxDuration`; the kubelet
    /// pins it at 600 s for every gate setting).
    pub reset_after_ns: u64,
}

impl Default for BackoffPolicy {
    /// The kubelet's defaults: `backOffPeriod` 10 s, `MaxContainerBackOff` 300 s, and the
    /// 2 x 300 s = 10 min reset ("If a container has run for 10 minutes without any problems").
    fn default() -> Self {
        Self { initial_ns: 10 * SECOND, max_ns: 300 * SECOND, reset_after_ns: 600 * SECOND }
    }
}

impl BackoffPolicy {
    /// The smallest `crashLoopBackOff.maxContainerRestartPeriod` the kubelet accepts.
    pub const MIN_RESTART_PERIOD_NS: u64 = SECOND;
    /// The largest `crashLoopBackOff.maxContainerRestartPeriod` the kubelet accepts.
    pub const MAX_RESTART_PERIOD_NS: u64 = 300 * SECOND;

    /// Gate `ReduceDefaultCrashLoopBackOffDecay` (alpha 1.33): 1 s doubling to 60 s; the reset
    /// stays at 10 min.
    pub fn reduced_decay() -> Self {
        Self { initial_ns: SECOND, max_ns: 60 * SECOND, reset_after_ns: 600 * SECOND }
    }

    /// Gate `KubeletCrashLoopBackOffMax` (beta 1.35): the kubelet config's
    /// `crashLoopBackOff.maxContainerRestartPeriod`, 1..=300 s, replaces the cap, and lowers the
    /// initial delay to it when it is smaller. Applies on top of either decay (call it on
    /// [`BackoffPolicy::default`] or [`BackoffPolicy::reduced_decay`]), as the operator's setting
    /// wins over the gate defaults upstream.
    pub fn with_max_restart_period(self, max_ns: u64) -> Result<Self, BackoffError> {
        if !(Self::MIN_RESTART_PERIOD_NS..=Self::MAX_RESTART_PERIOD_NS).contains(&max_ns) {
            return Err(BackoffError::MaxRestartPeriodOutOfRange { max_ns });
        }
        Ok(Self { initial_ns: self.initial_ns.min(max_ns), max_ns, ..self })
    }
}

/// Invalid back-off settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackoffError {
    /// `maxContainerRestartPeriod` outside the kubelet's accepted 1 s..=300 s.
    #[error("maxContainerRestartPeriod {max_ns} ns is outside 1s..=300s")]
    MaxRestartPeriodOutOfRange { max_ns: u64 },
}

/// How far an observed restart delay may stray from the modelled one and still match.
///
/// A restart is never meaningfully early: the kubelet checks `now - FinishedAt < backoff` and the
/// runtime's FinishedAt is stamped after the kernel's exit, so `early_ns` only absorbs clock and
/// reaping skew. It is routinely late, by a bounded amount:
/// - PLEG relists every 1 s before the kubelet even sees the exit, then a pod sync and the
///   runtime's create+start follow (`late_ns`);
/// - while in back-off, the pod worker re-queues the pod with `wait.Jitter(d, 0.5)`, where `d` is
///   the remaining back-off (recent kubelets, `kubecontainer.MinBackoffExpiration`) clamped to the
///   sync frequency (1 min), or a fixed 10 s (older kubelets). The restart can therefore land up
///   to half of min(back-off, 1 min) after it was due (`late_ratio`, `late_ratio_cap_ns`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// How much earlier than modelled a restart may come.
    pub early_ns: u64,
    /// Fixed lateness allowed on every restart (PLEG relist + sync + container start).
    pub late_ns: u64,
    /// Extra lateness as a fraction of the modelled delay (the pod worker's re-queue jitter).
    pub late_ratio: f64,
    /// The modelled delay `late_ratio` applies to is clamped to this (the kubelet's
    /// `syncFrequency`, which clamps the re-queue interval).
    pub late_ratio_cap_ns: u64,
}

impl Default for Tolerance {
    /// 500 ms early; late 3 s + 50% of min(delay, 60 s): 8 s on a 10 s back-off, 33 s on 300 s,
    /// 3 s on the immediate first restart. See the type's documentation for where each comes from.
    fn default() -> Self {
        Self { early_ns: SECOND / 2, late_ns: 3 * SECOND, late_ratio: 0.5, late_ratio_cap_ns: 60 * SECOND }
    }
}

impl Tolerance {
    /// How late a restart whose modelled delay is `expected_ns` may be.
    pub fn late_allowance_ns(&self, expected_ns: u64) -> u64 {
        // `as u64` saturates (and maps NaN/negative to 0), which is the clamp wanted here.
        let proportional = (self.late_ratio * expected_ns.min(self.late_ratio_cap_ns) as f64) as u64;
        self.late_ns.saturating_add(proportional)
    }

    /// Judges an observed delay against the modelled one.
    pub fn verdict(&self, observed_ns: u64, expected_ns: u64) -> Verdict {
        if observed_ns.saturating_add(self.early_ns) < expected_ns {
            Verdict::TooEarly
        } else if observed_ns > expected_ns.saturating_add(self.late_allowance_ns(expected_ns)) {
            Verdict::TooLate
        } else {
            Verdict::WithinTolerance
        }
    }
}

/// How a restart's timing compares with the kubelet's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    WithinTolerance,
    /// Restarted before the back-off allowed: not what the kubelet does.
    TooEarly,
    /// Restarted later than the back-off plus the kubelet's usual scheduling slack.
    TooLate,
    /// The node's back-off is not known (see the module header): neither early nor late.
    NotJudged,
}

impl Verdict {
    /// Early or late: what the kubelet does not do (a warning, an alert). Not judged is not one.
    pub fn is_deviation(self) -> bool {
        matches!(self, Verdict::TooEarly | Verdict::TooLate)
    }
}

crate::spelling::spelling!(Verdict {
    WithinTolerance => "within_tolerance",
    TooEarly => "too_early",
    TooLate => "too_late",
    NotJudged => "not_judged",
});

/// One observed restart, judged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// 1 for the first restart of this container, counting across spec changes.
    pub restart_number: u32,
    /// When the previous instance finished.
    #[serde(flatten, with = "crate::wire::at::finished_at")]
    pub finished_at: BootTime,
    /// When the new instance started.
    #[serde(flatten, with = "crate::wire::at::started_at")]
    pub started_at: BootTime,
    pub observed_delay_ns: u64,
    /// The delay the kubelet's back-off required; absent when the back-off is not known
    /// (verdict `not_judged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_delay_ns: Option<u64>,
    /// The back-off entry had expired (or the spec changed), so the restart was due at once.
    pub entry_reset: bool,
    /// The kubelet restarted while the container waited: the new kubelet has no back-off entry
    /// and restarts it at its first sync, however long its own start took, so the restart is
    /// neither early nor late.
    pub after_kubelet_restart: bool,
    pub verdict: Verdict,
}

/// The kubelet's back-off entry for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackoffEntry {
    backoff_ns: u64,
    /// When the entry was last advanced: the last restart.
    last_update: BootTime,
}

/// Back-off state for one (pod uid, container name), fed that container's instance finishes and
/// starts in order.
#[derive(Clone, Debug)]
pub struct BackoffTracker {
    /// None: the node's back-off is not known.
    policy: Option<BackoffPolicy>,
    tolerance: Tolerance,
    entry: Option<BackoffEntry>,
    /// FinishedAt of the latest instance, while it waits to be restarted.
    pending_finish: Option<BootTime>,
    spec_hash: Option<String>,
    restarts: u32,
    /// When a kubelet last started (boot ns), while an instance waited to be restarted.
    kubelet_restarted_at: Option<BootTime>,
}

impl BackoffTracker {
    pub fn new(policy: Option<BackoffPolicy>, tolerance: Tolerance) -> Self {
        Self {
            policy,
            tolerance,
            entry: None,
            pending_finish: None,
            spec_hash: None,
            restarts: 0,
            kubelet_restarted_at: None,
        }
    }

    /// The policy restarts are judged by; None when it is not known.
    pub fn policy(&self) -> Option<BackoffPolicy> {
        self.policy
    }

    /// The node's kubelet is known to back off by `policy` (None: not known) from now on, as
    /// read again at a kubelet start. The entry stays: its doublings count under the new cap
    /// (a restarted kubelet has none anyway: [`Self::on_kubelet_restart`]).
    pub fn set_policy(&mut self, policy: Option<BackoffPolicy>) {
        self.policy = policy;
        if let (Some(policy), Some(entry)) = (policy, self.entry.as_mut()) {
            entry.backoff_ns = entry.backoff_ns.min(policy.max_ns);
        }
    }

    /// Restarts observed so far.
    pub fn restart_count(&self) -> u32 {
        self.restarts
    }

    /// FinishedAt of the instance waiting to be restarted, if one is.
    pub fn pending_finished_at(&self) -> Option<BootTime> {
        self.pending_finish
    }

    /// The kubelet restarted: its back-off lives in memory only (`flowcontrol.Backoff`), so the
    /// new kubelet has no entry and restarts the container at once when its back-off would still
    /// hold it. The next restart is judged against no back-off.
    pub fn on_kubelet_restart(&mut self, at: BootTime) {
        self.entry = None;
        self.kubelet_restarted_at = Some(at);
    }

    /// An instance exited.
    pub fn on_finished(&mut self, finished_at: BootTime) {
        self.pending_finish = Some(finished_at);
    }

    /// An instance started. Returns the judged restart when it follows a finished instance; the
    /// container's first start (or one after a missed exit) is no restart and returns None.
    /// `spec_hash` is the container's `io.kubernetes.container.hash`: when it differs from the
    /// last known one the kubelet's key is new, so there is no back-off. An unknown hash (None)
    /// is not a change.
    pub fn on_started(&mut self, started_at: BootTime, spec_hash: Option<String>) -> Option<Observation> {
        let spec_changed = match (&self.spec_hash, &spec_hash) {
            (Some(old), Some(new)) => old != new,
            _ => false,
        };
        if spec_changed {
            self.entry = None;
        }
        if spec_hash.is_some() {
            self.spec_hash = spec_hash;
        }
        let finished_at = self.pending_finish.take()?;
        let after_kubelet_restart =
            self.kubelet_restarted_at.take().is_some_and(|at| (finished_at..=started_at).contains(&at));
        let live_entry = self.live_entry(finished_at);
        // No entry: at once, whatever the policy. A live one holds its delay, which only a known
        // policy tells.
        let expected_delay_ns = match (live_entry, self.policy) {
            (None, _) => Some(0),
            (Some(entry), Some(_)) => Some(entry.backoff_ns),
            (Some(_), None) => None,
        };
        // flowcontrol Backoff.Next: a missing or expired entry restarts at `initial`, a live one
        // doubles up to the cap; either way lastUpdate becomes now (this restart). Without a
        // policy the entry is kept for its existence and age alone.
        let (initial_ns, max_ns) = self.policy.map_or((0, 0), |p| (p.initial_ns, p.max_ns));
        let backoff_ns = match live_entry {
            None => initial_ns,
            Some(entry) => entry.backoff_ns.saturating_mul(2).min(max_ns),
        };
        self.entry = Some(BackoffEntry { backoff_ns, last_update: started_at });
        self.restarts = self.restarts.saturating_add(1);
        let observed_delay_ns = started_at.since(finished_at);
        Some(Observation {
            restart_number: self.restarts,
            finished_at,
            started_at,
            observed_delay_ns,
            expected_delay_ns,
            entry_reset: live_entry.is_none(),
            after_kubelet_restart,
            verdict: match expected_delay_ns {
                _ if after_kubelet_restart => Verdict::WithinTolerance,
                Some(expected) => self.tolerance.verdict(observed_delay_ns, expected),
                None => Verdict::NotJudged,
            },
        })
    }

    /// The delay the pending restart needs after its FinishedAt (0 = immediate), if an instance
    /// is waiting to be restarted and the delay is known.
    pub fn pending_delay_ns(&self) -> Option<u64> {
        let finished_at = self.pending_finish?;
        match self.live_entry(finished_at) {
            None => Some(0),
            Some(entry) => self.policy.map(|_| entry.backoff_ns),
        }
    }

    /// The pending restart is held by a back-off (a live entry): the kubelet shows
    /// CrashLoopBackOff until it ends. The delay is [`Self::pending_delay_ns`], when known.
    pub fn pending_held(&self) -> bool {
        let Some(finished_at) = self.pending_finish else { return false };
        match self.live_entry(finished_at) {
            None => false,
            // Under a known policy an entry holds for its delay; every policy's is at least 1 s.
            Some(entry) => self.policy.is_none() || entry.backoff_ns > 0,
        }
    }

    /// How much of the pending restart's back-off is left at `now`; Some(0) once it has elapsed
    /// (the kubelet restarts at its next sync). None while no instance waits to be restarted, or
    /// when the back-off is not known.
    pub fn expected_wait_remaining(&self, now: BootTime) -> Option<u64> {
        let finished_at = self.pending_finish?;
        let delay = self.pending_delay_ns()?;
        Some(finished_at.after(delay).since(now))
    }

    /// The entry as `IsInBackOffSince(key, finished_at)` sees it: absent when expired.
    fn live_entry(&self, finished_at: BootTime) -> Option<BackoffEntry> {
        // The reset is 10 min under every gate setting: known even when the policy is not.
        let reset_after_ns = self.policy.map_or(BackoffPolicy::default().reset_after_ns, |p| p.reset_after_ns);
        self.entry.filter(|entry| finished_at.since(entry.last_update) <= reset_after_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = SECOND;

    fn at(ns: u64) -> BootTime {
        BootTime::from_ns(ns)
    }

    fn tracker() -> BackoffTracker {
        BackoffTracker::new(Some(BackoffPolicy::default()), Tolerance::default())
    }

    /// Runs a crash loop where every instance lives `run_ns` and every restart comes exactly
    /// when the back-off allows; returns the expected delays.
    fn crash_loop(tracker: &mut BackoffTracker, restarts: usize, run_ns: u64) -> Vec<u64> {
        let mut now = 1_000 * S;
        assert_eq!(tracker.on_started(at(now), None), None, "the first start is no restart");
        let mut delays = Vec::new();
        for _ in 0..restarts {
            now += run_ns;
            tracker.on_finished(at(now));
            let delay = tracker.pending_delay_ns().expect("pending");
            now += delay;
            let observation = tracker.on_started(at(now), None).expect("a restart");
            assert_eq!(observation.expected_delay_ns, Some(delay));
            assert_eq!(observation.verdict, Verdict::WithinTolerance);
            delays.push(delay / S);
        }
        delays
    }

    #[test]
    fn default_sequence_doubles_to_the_cap() {
        assert_eq!(crash_loop(&mut tracker(), 9, S), [0, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn restart_numbers_count_up() {
        let mut t = tracker();
        t.on_started(at(0), None);
        t.on_finished(at(S));
        assert_eq!(t.on_started(at(2 * S), None).map(|o| o.restart_number), Some(1));
        t.on_finished(at(3 * S));
        assert_eq!(t.on_started(at(13 * S), None).map(|o| o.restart_number), Some(2));
        assert_eq!(t.restart_count(), 2);
    }

    /// Start at 0, crash at 1 s, restarts at 2 s (immediate), 13 s (10 s) and 34 s (20 s):
    /// the entry is then 40 s, last updated at 34 s.
    fn three_restarts() -> BackoffTracker {
        let mut t = tracker();
        t.on_started(at(0), None);
        for (finish, start) in [(1, 2), (3, 13), (14, 34)] {
            t.on_finished(at(finish * S));
            t.on_started(at(start * S), None).expect("restart");
        }
        t
    }

    #[test]
    fn a_long_run_resets_the_back_off() {
        let mut t = three_restarts();
        t.on_finished(at(34 * S + 601 * S));
        assert_eq!(t.pending_delay_ns(), Some(0));
        let observation = t.on_started(at(34 * S + 602 * S), None).expect("restart");
        assert!(observation.entry_reset);
        assert_eq!(observation.expected_delay_ns, Some(0));
        // The entry restarts at initial: the next crash waits 10 s.
        t.on_finished(at(34 * S + 603 * S));
        assert_eq!(t.pending_delay_ns(), Some(10 * S));
    }

    #[test]
    fn exactly_the_reset_period_does_not_reset() {
        let mut t = three_restarts();
        t.on_finished(at(34 * S + 600 * S)); // 600 s after the restart: not more than
        assert_eq!(t.pending_delay_ns(), Some(40 * S));
    }

    #[test]
    fn reduced_decay_gate() {
        let mut t = BackoffTracker::new(Some(BackoffPolicy::reduced_decay()), Tolerance::default());
        assert_eq!(crash_loop(&mut t, 9, S), [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(BackoffPolicy::reduced_decay().reset_after_ns, 600 * S);
    }

    #[test]
    fn max_restart_period_gate() {
        let policy = BackoffPolicy::default().with_max_restart_period(45 * S).expect("valid");
        assert_eq!(policy, BackoffPolicy { initial_ns: 10 * S, max_ns: 45 * S, reset_after_ns: 600 * S });
        let mut t = BackoffTracker::new(Some(policy), Tolerance::default());
        assert_eq!(crash_loop(&mut t, 5, S), [0, 10, 20, 40, 45]);

        // Below the initial delay, initial = max: every back-off is the max.
        let low = BackoffPolicy::default().with_max_restart_period(3 * S).expect("valid");
        assert_eq!(low.initial_ns, 3 * S);
        let mut t = BackoffTracker::new(Some(low), Tolerance::default());
        assert_eq!(crash_loop(&mut t, 4, S), [0, 3, 3, 3]);

        // Both gates: the operator's max applies on top of the reduced decay.
        let both = BackoffPolicy::reduced_decay().with_max_restart_period(5 * S).expect("valid");
        assert_eq!((both.initial_ns, both.max_ns), (S, 5 * S));
    }

    #[test]
    fn max_restart_period_out_of_range_is_refused() {
        for max_ns in [0, S - 1, 300 * S + 1, u64::MAX] {
            assert_eq!(
                BackoffPolicy::default().with_max_restart_period(max_ns),
                Err(BackoffError::MaxRestartPeriodOutOfRange { max_ns })
            );
        }
        assert!(BackoffPolicy::default().with_max_restart_period(S).is_ok());
        assert!(BackoffPolicy::default().with_max_restart_period(300 * S).is_ok());
    }

    #[test]
    fn early_and_late_restarts_get_verdicts() {
        let mut t = tracker();
        t.on_started(at(0), None);
        t.on_finished(at(S));
        t.on_started(at(2 * S), None); // immediate first restart; entry 10 s
        t.on_finished(at(3 * S));
        let early = t.on_started(at(3 * S + 9 * S), None).expect("restart");
        assert_eq!((early.expected_delay_ns, early.observed_delay_ns), (Some(10 * S), 9 * S));
        assert_eq!(early.verdict, Verdict::TooEarly);

        t.on_finished(at(20 * S)); // entry 20 s: allowance 3 s + 10 s
        let late = t.on_started(at(20 * S + 34 * S), None).expect("restart");
        assert_eq!(late.verdict, Verdict::TooLate);
    }

    #[test]
    fn tolerance_edges() {
        let tolerance = Tolerance::default();
        assert_eq!(tolerance.verdict(10 * S - S / 2, 10 * S), Verdict::WithinTolerance);
        assert_eq!(tolerance.verdict(10 * S - S / 2 - 1, 10 * S), Verdict::TooEarly);
        assert_eq!(tolerance.late_allowance_ns(10 * S), 8 * S);
        assert_eq!(tolerance.verdict(18 * S, 10 * S), Verdict::WithinTolerance);
        assert_eq!(tolerance.verdict(18 * S + 1, 10 * S), Verdict::TooLate);
        assert_eq!(tolerance.late_allowance_ns(300 * S), 33 * S);
        assert_eq!(tolerance.late_allowance_ns(0), 3 * S);
        assert_eq!(tolerance.verdict(3 * S + 1, 0), Verdict::TooLate);
    }

    #[test]
    fn a_spec_change_starts_a_fresh_key() {
        let mut t = tracker();
        t.on_started(at(0), Some("h1".into()));
        crash_loop_steps(&mut t, 3, Some("h1"));
        t.on_finished(at(140 * S));
        assert_eq!(t.pending_delay_ns(), Some(40 * S));
        let observation = t.on_started(at(141 * S), Some("h2".into())).expect("restart");
        assert_eq!(observation.expected_delay_ns, Some(0));
        assert!(observation.entry_reset);
        assert_eq!(observation.verdict, Verdict::WithinTolerance);
        t.on_finished(at(142 * S));
        assert_eq!(t.pending_delay_ns(), Some(10 * S));
        // An unknown hash is not a change.
        let next = t.on_started(at(152 * S), None).expect("restart");
        assert_eq!(next.expected_delay_ns, Some(10 * S));
    }

    fn crash_loop_steps(t: &mut BackoffTracker, restarts: usize, hash: Option<&str>) {
        let mut now = 100 * S;
        for _ in 0..restarts {
            t.on_finished(at(now));
            now += t.pending_delay_ns().expect("pending");
            t.on_started(at(now), hash.map(str::to_owned));
            now += S;
        }
    }

    #[test]
    fn wait_remaining_counts_down_from_finished_at() {
        let mut t = tracker();
        assert_eq!(t.expected_wait_remaining(at(0)), None);
        t.on_started(at(0), None);
        t.on_finished(at(S));
        assert_eq!(t.expected_wait_remaining(at(S)), Some(0), "first crash: immediate");
        t.on_started(at(2 * S), None);
        t.on_finished(at(5 * S));
        assert_eq!(t.expected_wait_remaining(at(5 * S)), Some(10 * S));
        assert_eq!(t.expected_wait_remaining(at(11 * S)), Some(4 * S));
        assert_eq!(t.expected_wait_remaining(at(20 * S)), Some(0));
        t.on_started(at(15 * S), None);
        assert_eq!(t.expected_wait_remaining(at(16 * S)), None);
    }

    #[test]
    fn an_unknown_policy_judges_the_immediate_restarts_and_no_other() {
        let mut t = BackoffTracker::new(None, Tolerance::default());
        t.on_started(at(0), None);
        t.on_finished(at(S));
        assert_eq!(t.pending_delay_ns(), Some(0), "no entry: at once under every policy");
        let first = t.on_started(at(2 * S), None).expect("restart");
        assert_eq!((first.expected_delay_ns, first.verdict), (Some(0), Verdict::WithinTolerance));
        t.on_finished(at(3 * S));
        assert_eq!(t.pending_delay_ns(), None, "an entry's delay is the policy's");
        assert_eq!(t.expected_wait_remaining(at(3 * S)), None);
        // However soon or late.
        for start in [3 * S + S / 10, 500 * S] {
            let mut u = t.clone();
            let second = u.on_started(at(start), None).expect("restart");
            assert_eq!((second.expected_delay_ns, second.verdict), (None, Verdict::NotJudged));
            assert_eq!(serde_json::to_value(&second).expect("json").get("expected_delay_ns"), None);
        }
        // An entry that expired (10 min under every policy) is immediate again.
        t.on_started(at(4 * S), None);
        t.on_finished(at(4 * S + 601 * S));
        let reset = t.on_started(at(4 * S + 602 * S), None).expect("restart");
        assert_eq!((reset.expected_delay_ns, reset.verdict), (Some(0), Verdict::WithinTolerance));
    }

    #[test]
    fn a_new_policy_applies_to_the_next_restart() {
        let mut t = tracker();
        crash_loop(&mut t, 4, S); // the entry is 80 s now, last updated at 1,074 s
        t.set_policy(Some(BackoffPolicy::default().with_max_restart_period(20 * S).expect("valid")));
        t.on_finished(at(1_100 * S));
        assert_eq!(t.pending_delay_ns(), Some(20 * S), "the entry is held to the new cap");
        t.set_policy(None);
        assert_eq!(t.pending_delay_ns(), None);
    }

    #[test]
    fn a_start_without_a_finish_is_not_a_restart() {
        let mut t = tracker();
        assert_eq!(t.on_started(at(0), None), None);
        assert_eq!(t.on_started(at(5 * S), None), None);
        assert_eq!(t.restart_count(), 0);
    }
}
