//! The words a story is told in: durations, senders, processes and their names, the OOM
//! killer's limit, memory pressure, and the verdict line at the top of each story. Every string
//! that comes from a pod goes through [`escaped`].

use std::fmt::Write as _;

use crate::{
    container_state::ContainerState,
    memory::MemoryAtStop,
    oom::{OomLimit, OomScope},
    signal,
    spec::StopCause,
    termination::{ProcessAtStop, SignalSender, StopRules, TerminationOutcome, TerminationReport},
    time::{seconds as to_seconds, BootTime},
};

pub(super) fn seconds(ns: u64) -> String {
    format!("{:.1}s", to_seconds(ns))
}

/// A string from a pod, escaped for a terminal.
pub(super) fn escaped(text: &str) -> String {
    text.escape_debug().to_string()
}

/// The sender in words; a process is named with its pid.
pub(super) fn sender(sender: Option<&SignalSender>) -> String {
    sender.map_or_else(|| "an unseen sender".to_owned(), SignalSender::describe)
}

/// The words a stop's rules use: what the unit's main process is called, and its grace.
pub(super) struct Words {
    pub main: &'static str,
    pub grace: &'static str,
}

pub(super) fn words(rules: StopRules) -> Words {
    match rules {
        StopRules::Kubelet => Words { main: "PID 1", grace: "grace" },
        StopRules::Systemd => Words { main: "the main process", grace: "TimeoutStopSec" },
        StopRules::Unmanaged => Words { main: "the main process", grace: "grace" },
    }
}

/// `PID 1 \`sh\`` or `` `java` (pid 107) ``.
pub(super) fn process(p: &ProcessAtStop, main: &str) -> String {
    if p.init {
        format!("{main} `{}`", escaped(&p.comm))
    } else if p.exec_session {
        format!("`{}` (pid {}, exec session)", escaped(&p.comm), p.pid)
    } else {
        format!("`{}` (pid {})", escaped(&p.comm), p.pid)
    }
}

pub(super) fn state_word(state: &ContainerState) -> &'static str {
    match state {
        ContainerState::Waiting { .. } => "waiting",
        ContainerState::Running { .. } => "running",
        ContainerState::Terminated { .. } => "terminated",
    }
}

/// Processes in words, one entry per name: two processes of one name are said plainly
/// ("2 processes named `exe` (pids 10284, 10290)"), not as two lookalike entries; one that
/// started after `since` (the stop signal) says so.
pub(super) fn named_processes(processes: &[ProcessAtStop], main: &str, since: Option<BootTime>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for p in processes {
        if seen.contains(&p.comm.as_str()) {
            continue;
        }
        seen.push(&p.comm);
        let same: Vec<&ProcessAtStop> = processes.iter().filter(|q| q.comm == p.comm).collect();
        if same.len() == 1 {
            let late = since.is_some_and(|t| p.started_at > t);
            out.push(if late {
                format!("{} (started after the stop signal)", process(p, main))
            } else {
                process(p, main)
            });
        } else {
            let pids: Vec<String> = same.iter().map(|q| q.pid.to_string()).collect();
            out.push(format!("{} processes named `{}` (pids {})", same.len(), escaped(&p.comm), pids.join(", ")));
        }
    }
    out
}

/// Which limit the OOM killer answered, in words.
pub(super) fn oom_limit(limit: &OomLimit) -> String {
    let memcg = escaped(&limit.memcg);
    let victim = format!("`{}` (pid {})", escaped(&limit.victim_comm), limit.victim_pid);
    match limit.scope {
        OomScope::Container => format!("the container's memory limit fired ({memcg}); victim {victim}"),
        OomScope::Pod => format!(
            "the pod's memory limit fired ({memcg}), not the container's: the pod's containers (and its sandbox) \
             together reached it; victim {victim}"
        ),
        OomScope::Node => format!("no cgroup limit: the node ran out of memory; victim {victim}"),
        OomScope::Ancestor => {
            format!("a limit above the pod fired ({memcg}: the QoS class or the node's allocatable); victim {victim}")
        }
    }
}

/// A container's memory pressure before its stop, in words: the stall PSI measured (an upper
/// bound of the throttling at `memory.high`, which the kernel accounts as a stall too) and the
/// `memory.events` counts that grew, each said only where the layout has it (`memory.rs`).
pub(super) fn memory_pressure(memory: &MemoryAtStop, report: &TerminationReport) -> String {
    let before = match (report.cause, &report.outcome, &report.stop_signal) {
        (Some(StopCause::LivenessProbe), _, _) => "the liveness failure",
        (Some(StopCause::StartupProbe), _, _) => "the startup failure",
        (_, TerminationOutcome::OomKilled, _) => "the OOM kill",
        (_, _, Some(_)) => "the stop signal",
        _ => "the exit",
    };
    let window = seconds(memory.window_ns);
    let events = memory.events;
    let stalled = memory.stalls.filter(|s| s.some_ns > 0).map(|s| {
        let full = if s.full_ns > 0 { format!("; every task at once {}", seconds(s.full_ns)) } else { String::new() };
        format!("stalled on memory {} of the {window} before {before} (PSI some{full})", seconds(s.some_ns))
    });
    let mut said = match (events.high.filter(|n| *n > 0), stalled) {
        (Some(high), Some(stalled)) => format!("throttled at memory.high ({high} times) and {stalled}"),
        (Some(high), None) => format!("throttled at memory.high {high} times in the {window} before {before}"),
        (None, Some(stalled)) => stalled,
        (None, None) => format!("in the {window} before {before}"),
    };
    let counts: Vec<String> = [("memory.max reached", events.max), ("OOM", events.oom), ("OOM kills", events.oom_kill)]
        .into_iter()
        .filter_map(|(what, n)| n.filter(|n| *n > 0).map(|n| format!("{what} {n}")))
        .collect();
    if !counts.is_empty() {
        let _ = write!(said, "; {}", counts.join(", "));
    }
    if events.high.is_none() {
        said.push_str(" (no memory.events: the memory controller is cgroup v1's here)");
    }
    format!("memory: {said}")
}

/// The one line at the top.
pub(super) fn verdict(
    report: &TerminationReport,
    stop_signal: &str,
    words: &Words,
    missed: &[&ProcessAtStop],
) -> String {
    let (grace, due) = (report.grace_ns, report.expected_kill_after_ns);
    let main = words.main;
    let shell = match (report.scene.running_at_stop.iter().find(|p| p.init), missed.first()) {
        (Some(init), Some(child)) if init.got_stop_signal => format!(
            "; {} got {stop_signal} and did not pass it on: {} never got it",
            process(init, main),
            process(child, main)
        ),
        _ => String::new(),
    };
    // Who sent the stop signal, said where it is not the kubelet's own stop (the timeline says
    // "from the container runtime" for those).
    let from = match report.stop_signal.as_ref() {
        Some(stop) if !stop.sender.is_kubelet_side() => format!(" from {}", sender(Some(&stop.sender))),
        _ => String::new(),
    };
    // Killed by the stop signal itself (a plain `kill`): say so, and who sent it.
    let killed_by_stop = report.stop_signal.as_ref().is_some_and(|s| report.exit_signal == Some(s.signal));
    match &report.outcome {
        TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, .. } => format!(
            "SIGKILLed {} after {stop_signal}{from}: it did not exit within its {} {}{shell}",
            seconds(*stop_to_kill_ns),
            seconds(due),
            words.grace
        ),
        TerminationOutcome::SigkilledEarly { stop_to_kill_ns, sender: by, .. } => format!(
            "SIGKILLed by {} {} after {stop_signal}{from}, {} before its {} {} ran out: killed early, not the \
             app's doing",
            sender(by.as_ref()),
            seconds(*stop_to_kill_ns),
            seconds(due.saturating_sub(*stop_to_kill_ns)),
            seconds(grace.max(due)),
            words.grace
        ),
        TerminationOutcome::SigkilledAfterStopSignal { stop_to_kill_ns, sender: by } => format!(
            "SIGKILLed by {} {} after {stop_signal}{from}; no grace period applies (nothing manages this \
             cgroup){shell}",
            sender(by.as_ref()),
            seconds(*stop_to_kill_ns)
        ),
        TerminationOutcome::ExitedWithinGrace { .. } | TerminationOutcome::ExitedAfterStopSignal { .. }
            if killed_by_stop =>
        {
            format!("killed by {stop_signal}{from}")
        }
        TerminationOutcome::ExitedWithinGrace { duration_ns, .. } => format!(
            "exited {} after {stop_signal}{from}, within its {} {}",
            seconds(*duration_ns),
            seconds(due),
            words.grace
        ),
        TerminationOutcome::ExitedAfterStopSignal { duration_ns } => {
            format!("exited {} after {stop_signal}{from}", seconds(*duration_ns))
        }
        TerminationOutcome::KilledWithoutGrace { sender: by } => {
            format!("SIGKILLed with no stop signal first, by {}", sender(by.as_ref()))
        }
        TerminationOutcome::StopSignalNotObserved { sender: by } => {
            format!("SIGKILLed by {}; a stop signal may have come before the agent watched", sender(by.as_ref()))
        }
        TerminationOutcome::OomKilled => match report.oom_limit.as_ref().map(|l| l.scope) {
            Some(OomScope::Container) => {
                format!("OOM-killed at the container's memory limit: the kernel's OOM killer chose {main}")
            }
            Some(OomScope::Pod) => format!(
                "OOM-killed at the pod's memory limit, not the container's: the kernel's OOM killer chose {main}"
            ),
            Some(OomScope::Node) => {
                format!("OOM-killed: the node ran out of memory and the kernel's OOM killer chose {main}")
            }
            Some(OomScope::Ancestor) => {
                format!("OOM-killed at a memory limit above the pod: the kernel's OOM killer chose {main}")
            }
            None => format!("OOM-killed: the kernel's OOM killer chose {main}"),
        },
        TerminationOutcome::ExitedWithoutStopSignal { exit_status, signal: killed_by } => {
            match (exit_status, killed_by) {
                (_, Some(n)) => format!("ended on its own, killed by {}", signal::name((*n).into())),
                (Some(0), None) => "exited on its own with code 0".to_owned(),
                (Some(code), None) => format!("exited on its own with code {code}"),
                (None, None) => "ended on its own".to_owned(),
            }
        }
    }
}
