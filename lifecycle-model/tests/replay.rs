//! Recorded runs replayed: the commands an agent handled, recorded with
//! `LIFECYCLE_RECORD_COMMANDS` (one `{"at", "command"}` a line), handed to a fresh model in
//! order at the times they were handled; the verdicts must be the ones the agent served then.
//!
//! - `fixtures/crash_loop.jsonl`: the runtime tier's crash-loop test
//!   (`lifecycle-agent/tests/e2e.rs`, `crash_loop_delays_are_judged_against_the_kubelet_back_off`:
//!   a container that exits 1, restarted by the harness after no delay, 1 s, then 0.2 s where the
//!   kubelet's reduced-decay back-off wants 2 s), the lines of the test's own run. Again:
//!   `LIFECYCLE_RECORD_COMMANDS=/tmp/crash_loop.jsonl cargo test -p lifecycle-agent --test e2e
//!   crash_loop` (root, containerd).
//! - `fixtures/kubelet_stops.jsonl`: the kubelet tier's stop test against a real 1.20 kubelet
//!   (`lifecycle-agent/tests/kubelet_verdicts.rs`,
//!   `stops_are_judged_with_the_grace_and_the_cause_the_kubelet_used`: four pods deleted, one
//!   exiting on SIGTERM, two ignoring it (one deleted with a shorter grace than its spec's), one
//!   with a preStop hook longer than its grace), the whole node's commands (1,284). Again:
//!   `LIFECYCLE_KUBE_BIN=/var/cache/lifecycle/kubernetes/bin LIFECYCLE_RECORD_COMMANDS=<file>
//!   cargo test -p lifecycle-agent --test kubelet_verdicts -- --exact
//!   stops_are_judged_with_the_grace_and_the_cause_the_kubelet_used` (root, after
//!   `xtask/x.sh kubernetes`).

use lifecycle_model::{
    backoff::Verdict,
    node::{Command, NodeTracker, Outcome, TrackerConfig, UnitKey},
    spec::{SpecSource, StopCause},
    termination::{SignalSender, TerminationOutcome, TerminationReport},
    time::{BootTime, SECOND},
    wire::{at::WallClock, with_clock::WithClock, ContainersResponse, HistoryResponse},
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

/// The last termination of the container of pod `pod` after `tracker`'s commands.
fn last_stop<'t>(tracker: &'t NodeTracker, pod: &str) -> &'t TerminationReport {
    let unit = tracker
        .units()
        .find(|unit| matches!(unit.key(), UnitKey::Container { .. }) && unit.labels().pod == pod)
        .unwrap_or_else(|| panic!("pod {pod}'s container is a unit"));
    unit.last_termination().unwrap_or_else(|| panic!("pod {pod}'s stop was judged"))
}

#[test]
fn a_recorded_kubelet_node_replays_to_the_stop_verdicts_the_kubelet_tier_asserted() {
    let (tracker, outcome) = replay(include_str!("fixtures/kubelet_stops.jsonl"));

    let graceful = last_stop(&tracker, "graceful");
    assert!(matches!(graceful.outcome, TerminationOutcome::ExitedWithinGrace { .. }), "{graceful:?}");
    assert_eq!(
        (graceful.cause, graceful.spec, graceful.exit_status),
        (Some(StopCause::Deleted), SpecSource::Api, Some(0))
    );

    let stubborn = last_stop(&tracker, "stubborn");
    let TerminationOutcome::SigkilledAfterGrace { grace_ns, sender, .. } = &stubborn.outcome else {
        panic!("stubborn: {stubborn:?}");
    };
    assert_eq!((*grace_ns, sender), (2 * SECOND, &Some(SignalSender::Runtime)));
    assert_eq!((stubborn.exit_status, stubborn.exit_signal), (None, Some(9)));

    // Deleted with --grace-period=3 while its spec says 30: the deletion's grace is the one used.
    let shortened = last_stop(&tracker, "shortened");
    let TerminationOutcome::SigkilledAfterGrace { grace_ns, sender, .. } = &shortened.outcome else {
        panic!("shortened: {shortened:?}");
    };
    assert_eq!((*grace_ns, sender), (3 * SECOND, &Some(SignalSender::Runtime)));
    assert_eq!(shortened.cause, Some(StopCause::Deleted));

    // preStop `sleep 8` within a grace of 5 s: still running when the stop signal came.
    let prestop = last_stop(&tracker, "prestop");
    let hook = prestop.pre_stop.as_ref().unwrap_or_else(|| panic!("prestop's hook was seen: {prestop:?}"));
    assert!(hook.overran_grace, "{prestop:?}");
    assert_eq!(prestop.cause, Some(StopCause::Deleted));

    let judged = outcome.judgements.iter().filter(|j| j.namespace == "default").count();
    assert_eq!(judged, 4, "one judgement per stop");
}

/// Every `<field>_boot_ns` in `value` (at any depth) with its text beside it: each must be the
/// RFC 3339 of its boot-clock value in `clock`. Returns how many there were.
fn times_written_in(value: &serde_json::Value, clock: WallClock) -> usize {
    match value {
        serde_json::Value::Object(fields) => {
            let mut checked = 0;
            for (key, boot_ns) in fields {
                let Some(field) = key.strip_suffix("_boot_ns") else { continue };
                let boot_ns = BootTime::from_ns(boot_ns.as_u64().unwrap_or_else(|| panic!("{key}: {boot_ns}")));
                assert_eq!(
                    fields.get(field).and_then(|text| text.as_str()),
                    clock.rfc3339(boot_ns).as_deref(),
                    "{field} in {value}"
                );
                checked += 1;
            }
            checked + fields.values().map(|v| times_written_in(v, clock)).sum::<usize>()
        }
        serde_json::Value::Array(items) => items.iter().map(|v| times_written_in(v, clock)).sum(),
        _ => 0,
    }
}

#[test]
fn a_replayed_nodes_answers_carry_every_time_in_the_writers_clock() {
    // The whole API of a real node, states, pods and judged stops: each time field, however
    // deep (an Option, an internally tagged state, a list of processes), gets its text from the
    // clock its writer passed.
    let (tracker, _) = replay(include_str!("fixtures/kubelet_stops.jsonl"));
    let snapshot = tracker.snapshot();
    let now = BootTime::from_ns(2_779 * SECOND);
    let clock = WallClock::from_offset_seconds(1_764_000_000.25);
    let containers = ContainersResponse {
        boot_to_unix_seconds: clock.offset_seconds(),
        now,
        resource_version: String::new(),
        containers: snapshot.containers(now),
        pods: snapshot.pods(now),
    };
    let stops = ["graceful", "stubborn", "shortened", "prestop"]
        .iter()
        .flat_map(|pod| snapshot.history_of_pod("default", pod))
        .collect::<Vec<_>>();
    assert_eq!(stops.len(), 4, "one kept stop per deleted pod");
    let history = HistoryResponse { boot_to_unix_seconds: clock.offset_seconds(), stops };
    let times =
        times_written_in(&written(&containers, clock), clock) + times_written_in(&written(&history, clock), clock);
    // A start, an exit, a stop signal, a watch start, processes at the stop...: many per stop.
    assert!(times > 40, "only {times} times written");
}

/// `body` as a writer with `clock` writes it, read back as JSON.
fn written(body: &impl serde::Serialize, clock: WallClock) -> serde_json::Value {
    serde_json::from_str(&serde_json::to_string(&WithClock::new(body, clock)).expect("serializes")).expect("JSON")
}
