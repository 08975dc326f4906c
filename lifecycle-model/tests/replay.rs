//! A recorded run replayed: the commands an agent handled during the runtime tier's crash-loop
//! test (`lifecycle-agent/tests/e2e.rs`, `crash_loop_delays_are_judged_against_the_kubelet_back_off`:
//! a container that exits 1, restarted by the harness after no delay, 1 s, then 0.2 s where the
//! kubelet's reduced-decay back-off wants 2 s), recorded with `LIFECYCLE_RECORD_COMMANDS` into
//! `fixtures/crash_loop.jsonl` (one `{"at", "command"}` a line) and handed to a fresh model in
//! order, at the times they were handled. The verdicts are the ones the agent served then.
//!
//! To record it again: `LIFECYCLE_RECORD_COMMANDS=/tmp/crash_loop.jsonl cargo test -p
//! lifecycle-agent --test e2e crash_loop` (root, containerd), then keep the lines of the test's
//! own run.

use lifecycle_model::{
    backoff::Verdict,
    node::{Command, NodeTracker, Outcome, TrackerConfig, UnitKey},
    time::{BootTime, SECOND},
};

/// One line of a recording.
#[derive(serde::Deserialize)]
struct Recorded {
    at: BootTime,
    command: Command,
}

/// The model after `recording`'s commands, and what they returned.
fn replay(recording: &str) -> (NodeTracker, Outcome) {
    // As the agent makes it (`agent::run`): the runtime answers from the start.
    let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    let mut outcome = Outcome::default();
    for (n, line) in recording.lines().enumerate() {
        let Recorded { at, command } = serde_json::from_str(line).unwrap_or_else(|err| panic!("line {}: {err}", n + 1));
        outcome.extend(tracker.handle(command, at));
    }
    (tracker, outcome)
}

#[test]
fn a_recorded_crash_loop_replays_to_the_verdicts_the_agent_served() {
    let (tracker, outcome) = replay(include_str!("fixtures/crash_loop.jsonl"));
    let crash = tracker
        .units()
        .find(|unit| matches!(unit.key(), UnitKey::Container { container, .. } if container == "crash"))
        .expect("the crash-looping container is a unit");
    assert_eq!(crash.labels().pod, "crashloop");
    let counters = crash.counters();
    // Four exits with status 1, each judged once.
    assert_eq!(counters.exits.values().sum::<u64>(), 4, "{:?}", counters.exits);
    let verdicts = &counters.backoff_verdicts;
    assert_eq!(verdicts.get(&Verdict::WithinTolerance), Some(&2), "{verdicts:?}");
    assert_eq!(verdicts.get(&Verdict::TooEarly), Some(&1), "{verdicts:?}");
    let last = crash.last_backoff().expect("the last restart was judged");
    assert_eq!(last.verdict, Verdict::TooEarly);
    assert_eq!(last.expected_delay_ns, Some(2 * SECOND));
    assert!(last.observed_delay_ns < SECOND, "restarted {} ns after the exit", last.observed_delay_ns);
    let crash_namespace = crash.labels().namespace.clone();
    let judged = outcome.judgements.iter().filter(|j| j.namespace == crash_namespace).count();
    assert_eq!(judged, 4, "one judgement per stop");
}
