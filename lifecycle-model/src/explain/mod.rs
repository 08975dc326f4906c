//! Why a container stopped, told as one verdict line and a timeline with millisecond offsets and
//! the source of each line: what `explain` prints (the agent's CLI and the kubectl plugin), what
//! the explain pages draw and what the verdict log writes.
//!
//! Typed: it reads the views the API serves ([`ContainerView`], [`PastStop`]), as the agent
//! made them or as a client read them back, so a renamed field is a compile error, not a
//! silently empty story. Every string that comes from a pod (process names, paths) is escaped:
//! a process can name itself with terminal control sequences.

use std::fmt::Write as _;

use serde::Serialize;

use words::{
    escaped, memory_pressure, named_processes, oom_limit, process, seconds, sender, state_word, verdict, words,
};

use crate::{
    backoff::Observation,
    container_state::ContainerState,
    node::{ContainerView, Disagreement, PastStop, UnitLabels},
    signal,
    termination::{OomVictim, ProcessAtStop, StopRules, TerminationOutcome, TerminationReport, SIGKILL},
    time::BootTime,
};

/// One container's stop, explained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerStory {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The verdict in words, one line.
    pub verdict: String,
    /// Why it was stopped (the API's `cause`), when something stopped it.
    pub cause: Option<String>,
    /// What happened, in order; offsets from the stop signal (or from the exit without one).
    pub timeline: Vec<Line>,
    /// The moment the offsets count from (boot clock), for a page that shows wall time.
    #[serde(skip)]
    pub origin: Option<BootTime>,
    /// The stop on a time axis, for drawings (the timeline says the same in words).
    #[serde(skip)]
    pub axis: Option<StopAxis>,
}

/// A stop's moments and who ran at them, for a drawing on one time axis.
#[derive(Clone, Debug, PartialEq)]
pub struct StopAxis {
    /// A native sidecar (an init container that keeps running): drawn before the main ones.
    pub sidecar: bool,
    /// The stop signal.
    pub stop: Option<BootTime>,
    /// When the SIGKILL was due after it (the end of the grace window), where a grace applies.
    pub deadline: Option<BootTime>,
    /// The SIGKILL, when one came.
    pub kill: Option<BootTime>,
    /// The main process's exit.
    pub exit: BootTime,
    /// The processes running at the stop signal, in words (`PID 1 \`sh\``).
    pub running_at_stop: Vec<String>,
    /// The processes still alive at the SIGKILL, in words.
    pub alive_at_kill: Vec<String>,
}

impl ContainerStory {
    /// A plain host's unit (no pod): named by its cgroup.
    pub fn is_host_unit(&self) -> bool {
        self.namespace == HOST_NAMESPACE && self.pod.is_empty()
    }

    /// `shop/web-1 container app`, or `host unit /system.slice/web.service`.
    pub fn subject(&self) -> String {
        if self.is_host_unit() {
            format!("host unit {}", self.container)
        } else {
            format!("{}/{} container {}", self.namespace, self.pod, self.container)
        }
    }
}

/// One line of a timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Line {
    /// Milliseconds from the stop signal (negative before it); None for facts without a time.
    pub offset_ms: Option<f64>,
    /// Who says so: `kernel` (the agent's probes), `api` (the Pod and the kubelet's status),
    /// `agent` (the agent's judgement of the two).
    pub source: &'static str,
    pub text: String,
}

/// The namespace a plain host's units carry.
pub const HOST_NAMESPACE: &str = "host";

/// The stories of every container of `pod` in `namespace` among `containers`, only
/// `container`'s when given; containers that never stopped say so. A plain host's unit is
/// asked for as namespace `host` with its cgroup path as the container (and no pod).
pub fn explain(
    containers: &[ContainerView],
    namespace: &str,
    pod: &str,
    container: Option<&str>,
) -> Vec<ContainerStory> {
    let mut stories: Vec<ContainerStory> = containers
        .iter()
        .filter(|c| c.labels.namespace == namespace && c.labels.pod == pod)
        .filter(|c| container.is_none_or(|name| c.labels.container == name))
        .map(of_view)
        .collect();
    stories.sort_by(|a, b| a.container.cmp(&b.container));
    stories
}

/// [`explain`] for an answer made at `now`: a running container's listeners with connections
/// waiting that the app does not accept (an accept stall: clients time out while the pod is
/// Ready) are told as lines of its story.
pub fn explain_at(
    containers: &[ContainerView],
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    now: BootTime,
) -> Vec<ContainerStory> {
    let mut stories = explain(containers, namespace, pod, container);
    for story in &mut stories {
        let view = containers.iter().find(|c| {
            c.labels.namespace == namespace && c.labels.pod == pod && escaped(&c.labels.container) == story.container
        });
        for stall in view.map(|view| accept_stalls(view, now)).unwrap_or_default() {
            story.timeline.push(Line { offset_ms: None, source: "kernel", text: stall });
        }
    }
    stories
}

/// The accept stalls of a running container at `now`, one line per port: a listener open with
/// connections the kernel completed into its queue (established) that the app has not accepted,
/// and since when it accepted none: `port 8080: 3 connections waiting, none accepted for 40s`.
pub fn accept_stalls(view: &ContainerView, now: BootTime) -> Vec<String> {
    let ContainerState::Running { started_at } = view.status.state else { return Vec::new() };
    view.tcp
        .iter()
        .filter(|(_, stats)| stats.listeners > 0)
        .filter_map(|(port, stats)| {
            let waiting = stats.established.saturating_sub(stats.accepts);
            if waiting == 0 {
                return None;
            }
            let connections = if waiting == 1 { "connection" } else { "connections" };
            let since = match stats.last_accept_ns.map(BootTime::from_ns) {
                Some(last) => format!("none accepted for {}", seconds(now.since(last.max(started_at)))),
                None => format!("none accepted since it started {} ago", seconds(now.since(started_at))),
            };
            Some(format!("port {port}: {waiting} {connections} waiting, {since}"))
        })
        .collect()
}

/// The stories of past stops (newest first, as the history gives them), only `container`'s when
/// given.
pub fn explain_history(stops: &[PastStop], container: Option<&str>) -> Vec<ContainerStory> {
    stops.iter().filter(|s| container.is_none_or(|name| s.container == name)).map(of_stop).collect()
}

/// What a story is told from: what a container view and a past stop share.
struct Subject<'a> {
    labels: UnitLabels,
    report: Option<&'a TerminationReport>,
    state: Option<&'a ContainerState>,
    restart_count: u32,
    disagreements: &'a [Disagreement],
    backoff: Option<&'a Observation>,
    back_off_remaining_ns: Option<u64>,
    sidecar: bool,
}

/// The story of a container as it is now (its last stop, if any).
pub fn of_view(view: &ContainerView) -> ContainerStory {
    story(Subject {
        labels: view.labels.clone(),
        report: view.last_termination.as_ref(),
        state: Some(&view.status.state),
        restart_count: view.status.restart_count,
        disagreements: &view.disagreements,
        backoff: view.last_backoff.as_ref(),
        back_off_remaining_ns: view.status.back_off_remaining_ns,
        sidecar: view.sidecar,
    })
}

/// The story of one kept stop.
pub fn of_stop(stop: &PastStop) -> ContainerStory {
    story(Subject {
        labels: UnitLabels {
            namespace: stop.namespace.clone(),
            pod: stop.pod.clone(),
            container: stop.container.clone(),
            uid: stop.uid.clone(),
        },
        report: Some(&stop.last_termination),
        state: None,
        restart_count: stop.restart_count,
        disagreements: &[],
        backoff: None,
        back_off_remaining_ns: None,
        sidecar: stop.last_termination.is_sidecar,
    })
}

fn story(subject: Subject<'_>) -> ContainerStory {
    let mut story = ContainerStory {
        namespace: escaped(&subject.labels.namespace),
        pod: escaped(&subject.labels.pod),
        container: escaped(&subject.labels.container),
        verdict: String::new(),
        cause: None,
        timeline: Vec::new(),
        origin: None,
        axis: None,
    };
    let Some(report) = subject.report else {
        story.verdict = match subject.state {
            Some(state) => format!("{}; no stop seen", state_word(state)),
            None => "no stop seen".to_owned(),
        };
        return story;
    };
    let words = words(report.rules);
    let outcome = &report.outcome;
    let stop = report.stop_signal.as_ref();
    let origin = stop.map_or(report.exit_time, |s| s.time);
    story.origin = Some(origin);
    let at = |t: BootTime| Some((t.ns() as f64 - origin.ns() as f64) / 1e6);
    let grace = report.grace_ns;
    let due = report.expected_kill_after_ns;
    story.cause = report.cause.map(|cause| cause.as_str().to_owned());
    let stop_signal = stop.map_or_else(|| "the stop signal".to_owned(), |s| signal::name(s.signal.into()));
    let mut lines = Vec::new();

    // Why, and with what grace.
    if let Some(cause) = &story.cause {
        let floor =
            if due > grace { format!(" (raised to the kubelet's {} floor)", seconds(due)) } else { String::new() };
        lines.push(Line {
            offset_ms: None,
            source: "api",
            text: format!("stopped because: {cause}; grace {}{floor}", seconds(grace)),
        });
    }
    if let Some(pre_stop) = &report.pre_stop {
        lines.push(Line { offset_ms: at(pre_stop.started_at), source: "kernel", text: "preStop hook started".into() });
        match pre_stop.ended_at {
            Some(ended) => lines.push(Line {
                offset_ms: at(ended),
                source: "kernel",
                text: format!("preStop hook ended after {}", seconds(ended.since(pre_stop.started_at))),
            }),
            None if pre_stop.overran_grace => lines.push(Line {
                offset_ms: None,
                source: "kernel",
                text: "preStop hook still running when the grace ran out".into(),
            }),
            None => {}
        }
    }
    let scene = &report.scene;
    let running = &scene.running_at_stop;
    // The app's processes the stop signal did not reach (the runtime's exec sessions, a preStop
    // hook's among them, are not the app's).
    let missed: Vec<&ProcessAtStop> = running.iter().filter(|p| !p.got_stop_signal && !p.exec_session).collect();
    let list = |processes: &mut dyn Iterator<Item = &ProcessAtStop>| {
        processes.map(|p| process(p, words.main)).collect::<Vec<_>>().join(", ")
    };
    if let Some(stop) = stop {
        let configured = if stop.matches_configured { "" } else { " (not the configured stop signal)" };
        lines.push(Line {
            offset_ms: at(stop.time),
            source: "kernel",
            text: format!("{stop_signal} to {} from {}{configured}", words.main, sender(Some(&stop.sender))),
        });
        if !running.is_empty() {
            let mut said = format!("running: {}", list(&mut running.iter()));
            let got = list(&mut running.iter().filter(|p| p.got_stop_signal));
            if !got.is_empty() {
                let _ = write!(said, "; got {stop_signal}: {got}");
            }
            if !missed.is_empty() {
                let _ = write!(said, "; never got it: {}", list(&mut missed.iter().copied()));
            }
            lines.push(Line { offset_ms: at(stop.time), source: "kernel", text: said });
        }
    }
    let (stop_to_kill, kill_sender, accepts, still_listening) = match outcome {
        TerminationOutcome::SigkilledAfterGrace {
            stop_to_kill_ns,
            sender,
            accepts_after_stop,
            still_listening,
            ..
        }
        | TerminationOutcome::SigkilledEarly { stop_to_kill_ns, sender, accepts_after_stop, still_listening, .. } => {
            (Some(*stop_to_kill_ns), sender.as_ref(), *accepts_after_stop, *still_listening)
        }
        TerminationOutcome::SigkilledAfterStopSignal { stop_to_kill_ns, sender } => {
            (Some(*stop_to_kill_ns), sender.as_ref(), 0, false)
        }
        TerminationOutcome::KilledWithoutGrace { sender } | TerminationOutcome::StopSignalNotObserved { sender } => {
            (None, sender.as_ref(), 0, false)
        }
        _ => (None, None, 0, false),
    };
    if accepts > 0 {
        lines.push(Line {
            offset_ms: None,
            source: "kernel",
            text: format!("accepted {accepts} connection(s) after {stop_signal}"),
        });
    }
    if still_listening {
        lines.push(Line {
            offset_ms: None,
            source: "kernel",
            text: "still listening when the SIGKILL came: clients were still being let in".into(),
        });
    }
    if report.exit_signal == Some(SIGKILL) && !matches!(outcome, TerminationOutcome::OomKilled) {
        let kill_time = stop.zip(stop_to_kill).map_or(report.exit_time, |(s, d)| s.time.after(d));
        // A process that started after the stop signal is another than the one of the same name
        // that got (or missed) it: said so, not left to the pids.
        let stop_time = stop.map(|s| s.time);
        let alive = scene
            .alive_at_kill
            .iter()
            .map(|p| match stop_time.filter(|&t| p.started_at > t) {
                Some(t) => format!(
                    "{}, started {} after {stop_signal}",
                    process(p, words.main),
                    seconds(p.started_at.since(t))
                ),
                None => format!("{}, up {}", process(p, words.main), seconds(kill_time.since(p.started_at))),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut said = format!("SIGKILL from {}", sender(kill_sender));
        if !alive.is_empty() {
            let _ = write!(said, "; alive: {alive}");
        }
        lines.push(Line { offset_ms: at(kill_time), source: "kernel", text: said });
    }
    let how = match (report.exit_status, report.exit_signal) {
        (_, Some(n)) => format!("killed by {} (exit code {})", signal::name(n.into()), 128 + u32::from(n)),
        (Some(code), None) => format!("exited with code {code}"),
        (None, None) => "ended".to_owned(),
    };
    let oom = match report.oom_victim {
        Some(OomVictim::Init) => format!("; the OOM killer chose {}", words.main),
        Some(OomVictim::Child) => "; the OOM killer killed another of its processes before".to_owned(),
        None => String::new(),
    };
    lines.push(Line { offset_ms: at(report.exit_time), source: "kernel", text: format!("{} {how}{oom}", words.main) });
    if let Some(limit) = &report.oom_limit {
        lines.push(Line { offset_ms: None, source: "kernel", text: oom_limit(limit) });
    }
    if let Some(memory) = report.memory.as_ref().filter(|m| m.under_pressure()) {
        lines.push(Line { offset_ms: None, source: "kernel", text: memory_pressure(memory, report) });
    }
    if let Some(before) = report.kubelet_started_before_ns {
        lines.push(Line {
            // Counted back from the stop signal (or the exit), which is the origin.
            offset_ms: Some(-(before as f64) / 1e6),
            source: "kernel",
            text: format!("the kubelet started {} before this stop (its exec: a new kubelet process)", seconds(before)),
        });
    }
    if let Some(ContainerState::Waiting { reason, .. }) = subject.state {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!(
                "state as the kubelet should report it: waiting {}, restarts {}",
                reason.as_str(),
                subject.restart_count
            ),
        });
    } else if let Some(ContainerState::Terminated { reason, .. }) = subject.state {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!(
                "state as the kubelet should report it: terminated {}, restarts {}",
                reason.as_str(),
                subject.restart_count
            ),
        });
    }
    for disagreement in subject.disagreements {
        lines.push(Line {
            offset_ms: None,
            source: "api",
            text: format!(
                "the kubelet reported {} where the kernel saw {} ({})",
                escaped(&disagreement.kubelet),
                escaped(&disagreement.kernel),
                disagreement.kind.as_str()
            ),
        });
    }
    if let Some(backoff) = subject.backoff {
        let rule =
            if report.rules == StopRules::Systemd { "the unit's RestartSec= allows" } else { "the back-off allows" };
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: match backoff.expected_delay_ns {
                Some(expected) => format!(
                    "restart {} came {} after the exit; {rule} {} ({})",
                    backoff.restart_number,
                    seconds(backoff.observed_delay_ns),
                    seconds(expected),
                    backoff.verdict.as_str()
                ),
                None => format!(
                    "restart {} came {} after the exit; the node's back-off is not known here ({})",
                    backoff.restart_number,
                    seconds(backoff.observed_delay_ns),
                    backoff.verdict.as_str()
                ),
            },
        });
    }
    // In CrashLoopBackOff now: when the kubelet's back-off lets it start again.
    if let Some(remaining) = subject.back_off_remaining_ns.filter(|ns| *ns > 0) {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!("the next restart is due in {} (the kubelet's back-off)", seconds(remaining)),
        });
    }
    story.verdict = verdict(report, &stop_signal, &words, &missed);
    story.timeline = lines;
    let kill = (report.exit_signal == Some(SIGKILL) && !matches!(outcome, TerminationOutcome::OomKilled))
        .then(|| stop.zip(stop_to_kill).map_or(report.exit_time, |(s, d)| s.time.after(d)));
    story.axis = Some(StopAxis {
        sidecar: subject.sidecar,
        stop: stop.map(|s| s.time),
        deadline: stop.filter(|_| report.rules != StopRules::Unmanaged).map(|s| s.time.after(due)),
        kill,
        exit: report.exit_time,
        running_at_stop: named_processes(&scene.running_at_stop, words.main, None),
        alive_at_kill: named_processes(&scene.alive_at_kill, words.main, stop.map(|s| s.time)),
    });
    story
}

/// The stories as text: a block per container, the verdict first; each offset with the wall time
/// it was when `boot_to_unix_seconds` (an answer's) is given. Every field is made safe for a
/// terminal (`terminal.rs`), whichever part of the answer it was made from.
pub fn render_text(stories: &[ContainerStory], boot_to_unix_seconds: Option<f64>) -> String {
    use crate::terminal::safe;
    let mut out = String::new();
    for story in stories {
        let cause = story.cause.as_deref().map(|c| format!(" [{}]", safe(c))).unwrap_or_default();
        let _ = writeln!(out, "{}: {}{cause}", safe(&story.subject()), safe(&story.verdict));
        let wall = boot_to_unix_seconds.map(crate::wire::at::WallClock::from_offset_seconds);
        if let Some(time) = story.origin.zip(wall).and_then(|(origin, clock)| clock.rfc3339(origin)) {
            let _ = writeln!(out, "  at {time}");
        }
        for line in &story.timeline {
            let offset = line.offset_ms.map(|ms| format!("{ms:+10.1}ms")).unwrap_or_else(|| " ".repeat(12));
            let _ = writeln!(out, "  {offset}  {:<6}  {}", line.source, safe(&line.text));
        }
    }
    out
}

#[cfg(test)]
mod tests;
mod words;
