//! Liveness as the kubelet should judge it: the loops that do the agent's work report progress
//! here, and `/healthz` (`agent/health.rs`) says ok only while each has made progress recently.
//! A module of its own below `agent/` and `probe/`, whose loops both beat.
//!
//! A constant "ok" kept the agent alive in the kubelet's eyes while its ring reader was stuck
//! (probe answers and verdicts going stale) or its probe supervisor had stopped. Each loop beats
//! on every pass: the ring reader at least every poll period (50 ms by default), the probe
//! supervisor every second. A loop silent for longer than its allowance fails the check, and the
//! answer names which and for how long, so `kubectl describe pod` says why the kubelet restarted
//! the agent.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A loop whose progress liveness depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loop {
    /// The ring reader thread (`reader.rs`): kernel events into the model.
    RingReader,
    /// The probe supervisor (`probe/supervisor.rs`): pod listeners follow the pods.
    ProbeSupervisor,
}

impl Loop {
    const ALL: [Loop; 2] = [Loop::RingReader, Loop::ProbeSupervisor];

    fn name(self) -> &'static str {
        match self {
            Loop::RingReader => "ring reader",
            Loop::ProbeSupervisor => "probe supervisor",
        }
    }
}

/// Progress of each loop, shared by the loops (which beat) and the health endpoint (which reads).
#[derive(Debug)]
pub struct Heartbeats {
    /// Set by the probe supervisor once the listeners taken from a previous agent are served
    /// (or given up): until then `/readyz` says not ready, so a rolling update does not stop the
    /// previous agent before this one answers for its pods.
    pub settled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Set by the handoff socket once a newer agent on this node took the probe listeners. Both
    /// answer on the health port then (`SO_REUSEPORT`): saying not ready from here on keeps the
    /// kubelet's readiness probe of the new agent's pod from being answered ready by this one
    /// before the new one serves what it took.
    pub handed_over: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) origin: Instant,
    /// Per [`Loop`]: milliseconds since `origin` at its last beat; `u64::MAX` for a loop not
    /// started (not judged: a plain host without probes has no supervisor).
    last_ms: [AtomicU64; 2],
    /// Per [`Loop`]: how long it may stay silent.
    allowance: [Duration; 2],
}

impl Heartbeats {
    /// The reader may be silent `reader_allowance`, the supervisor `supervisor_allowance`.
    pub(crate) fn new(reader_allowance: Duration, supervisor_allowance: Duration) -> Self {
        Self {
            settled: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            handed_over: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            origin: Instant::now(),
            last_ms: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            allowance: [reader_allowance, supervisor_allowance],
        }
    }

    /// `which` made progress now.
    pub(crate) fn beat(&self, which: Loop) {
        let now = self.origin.elapsed().as_millis() as u64;
        self.last_ms[which as usize].store(now, Ordering::Relaxed);
    }

    /// Ok, or the first loop silent past its allowance and for how long.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.check_at(self.origin.elapsed())
    }

    /// Live, serving what the previous agent handed over, and not replaced by a newer one.
    pub(crate) fn ready(&self) -> Result<(), String> {
        self.check()?;
        if self.handed_over.load(Ordering::Acquire) {
            return Err("replaced: a newer agent on this node took the probe listeners".into());
        }
        if !self.settled.load(Ordering::Acquire) {
            return Err("probe listeners taken from the previous agent are not served yet".into());
        }
        Ok(())
    }

    pub(crate) fn check_at(&self, now: Duration) -> Result<(), String> {
        for which in Loop::ALL {
            let last = self.last_ms[which as usize].load(Ordering::Relaxed);
            if last == u64::MAX {
                continue;
            }
            let silent = now.saturating_sub(Duration::from_millis(last));
            if silent > self.allowance[which as usize] {
                return Err(format!("{} made no progress for {:.1}s", which.name(), silent.as_secs_f64()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_silent_past_its_allowance_fails_the_check_and_is_named() {
        let beats = Heartbeats::new(Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(beats.check_at(Duration::from_secs(100)), Ok(()), "loops not started are not judged");
        beats.beat(Loop::RingReader);
        beats.beat(Loop::ProbeSupervisor);
        assert_eq!(beats.check(), Ok(()));
        let later = beats.origin.elapsed() + Duration::from_secs(7);
        let failure = beats.check_at(later).expect_err("the reader is 7 s silent");
        assert!(failure.starts_with("ring reader made no progress for 7."), "{failure}");
    }

    #[test]
    fn an_agent_a_newer_one_replaced_is_live_but_not_ready() {
        // During a surge both agents answer on the health port: the replaced one must not
        // answer the new pod's readiness probe with ready.
        let beats = Heartbeats::new(Duration::from_secs(5), Duration::from_secs(10));
        beats.settled.store(true, Ordering::Release);
        assert_eq!(beats.ready(), Ok(()));
        beats.handed_over.store(true, Ordering::Release);
        assert!(beats.ready().expect_err("replaced").starts_with("replaced"));
        assert_eq!(beats.check(), Ok(()), "still live: it serves until it is stopped");
    }
}
