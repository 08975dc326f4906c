//! Why a pod's containers stopped, told as one verdict line per stop and a timeline with
//! millisecond offsets and the source of each line: what `lifecycle-agent explain` prints and
//! what the verdict log writes.
//!
//! Pure: it reads the API's JSON of a container (`/api/v1/containers`) or of a past stop
//! (`/api/v1/history`), the same JSON every other surface is made from, so the story cannot
//! differ from the API's. Every string that comes from a pod (process names) is escaped: a
//! process can name itself with terminal control sequences.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

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

/// The stories of every container of `pod` in `namespace` in `answer` (a `/api/v1/containers`
/// body), only `container`'s when given; containers that never stopped say so.
pub fn explain(answer: &Value, namespace: &str, pod: &str, container: Option<&str>) -> Vec<ContainerStory> {
    let mut stories: Vec<ContainerStory> = answer["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["namespace"] == namespace && c["pod"] == pod)
        .filter(|c| container.is_none_or(|name| c["container"] == name))
        .map(story)
        .collect();
    stories.sort_by(|a, b| a.container.cmp(&b.container));
    stories
}

/// Boot-clock ns of a time field: the API writes `<field>_boot_ns` beside its RFC 3339 text.
fn boot_ns(v: &Value, field: &str) -> Option<u64> {
    v[format!("{field}_boot_ns")].as_u64().or_else(|| v[field].as_u64())
}

fn seconds(ns: u64) -> String {
    format!("{:.1}s", crate::model::time::seconds(ns))
}

/// A signal number as its name.
fn signal_name(signal: u64) -> String {
    let name = match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        12 => "SIGUSR2",
        15 => "SIGTERM",
        17 => "SIGCHLD",
        19 => "SIGSTOP",
        28 => "SIGWINCH",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// A sender as the API writes it, in words.
fn sender(v: &Value) -> String {
    match v["kind"].as_str() {
        Some("runtime") => "the container runtime".to_owned(),
        Some("kubelet") => "the kubelet".to_owned(),
        Some("same_container") => "a process of the container".to_owned(),
        Some("other_process") => format!("`{}`", text(&v["comm"])),
        _ => "an unseen sender".to_owned(),
    }
}

/// A string from the agent's answer, escaped for a terminal (it may come from a pod).
fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().escape_debug().to_string()
}

/// `PID 1 \`sh\`` or `` `java` (pid 107) ``.
fn process(p: &Value) -> String {
    if p["init"] == true {
        format!("PID 1 `{}`", text(&p["comm"]))
    } else if p["exec_session"] == true {
        format!("`{}` (pid {}, exec session)", text(&p["comm"]), p["pid"])
    } else {
        format!("`{}` (pid {})", text(&p["comm"]), p["pid"])
    }
}

/// The stories of the past stops in `answer` (a `/api/v1/history` body), newest first, only
/// `container`'s when given.
pub fn explain_history(answer: &Value, container: Option<&str>) -> Vec<ContainerStory> {
    answer["stops"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| container.is_none_or(|name| s["container"] == name))
        .map(story)
        .collect()
}

/// The story of one container view, or one past stop (the same fields).
pub(crate) fn story(c: &Value) -> ContainerStory {
    let mut story = ContainerStory {
        namespace: text(&c["namespace"]),
        pod: text(&c["pod"]),
        container: text(&c["container"]),
        verdict: String::new(),
        cause: None,
        timeline: Vec::new(),
    };
    let report = &c["last_termination"];
    if report.is_null() {
        story.verdict = match c["state"]["state"].as_str() {
            Some("running") => "running; no stop seen".to_owned(),
            Some(state) => format!("{state}; no stop seen"),
            None => "no stop seen".to_owned(),
        };
        return story;
    }
    let outcome = &report["outcome"];
    let stop = &report["stop_signal"];
    let stop_time = boot_ns(stop, "time");
    let exit_time = boot_ns(report, "exit_time");
    let origin = stop_time.or(exit_time).unwrap_or_default();
    let at = |t: u64| Some((t as f64 - origin as f64) / 1e6);
    let grace = report["grace_ns"].as_u64().unwrap_or_default();
    let due = report["expected_kill_after_ns"].as_u64().unwrap_or(grace);
    story.cause = report["cause"].as_str().map(str::to_owned);
    let stop_signal = stop["signal"].as_u64().map(signal_name).unwrap_or_else(|| "the stop signal".to_owned());
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
    let pre_stop = &report["pre_stop"];
    if let Some(started) = boot_ns(pre_stop, "started_at") {
        lines.push(Line { offset_ms: at(started), source: "kernel", text: "preStop hook started".to_owned() });
        match boot_ns(pre_stop, "ended_at") {
            Some(ended) => lines.push(Line {
                offset_ms: at(ended),
                source: "kernel",
                text: format!("preStop hook ended after {}", seconds(ended.saturating_sub(started))),
            }),
            None if pre_stop["overran_grace"] == true => lines.push(Line {
                offset_ms: None,
                source: "kernel",
                text: "preStop hook still running when the grace ran out".to_owned(),
            }),
            None => {}
        }
    }
    let scene = &report["scene"];
    let running: Vec<&Value> = scene["running_at_stop"].as_array().into_iter().flatten().collect();
    // The app's processes the stop signal did not reach (the runtime's exec sessions, a preStop
    // hook's among them, are not the app's).
    let missed: Vec<&Value> =
        running.iter().copied().filter(|p| p["got_stop_signal"] != true && p["exec_session"] != true).collect();
    if let Some(time) = stop_time {
        let configured = if stop["matches_configured"] == false { " (not the configured stop signal)" } else { "" };
        lines.push(Line {
            offset_ms: at(time),
            source: "kernel",
            text: format!("{stop_signal} to PID 1 from {}{configured}", sender(&stop["sender"])),
        });
        if !running.is_empty() {
            let got: Vec<String> =
                running.iter().filter(|p| p["got_stop_signal"] == true).map(|p| process(p)).collect();
            let mut said = format!("running: {}", running.iter().map(|p| process(p)).collect::<Vec<_>>().join(", "));
            if !got.is_empty() {
                let _ = write!(said, "; got {stop_signal}: {}", got.join(", "));
            }
            if !missed.is_empty() {
                let _ = write!(
                    said,
                    "; never got it: {}",
                    missed.iter().map(|p| process(p)).collect::<Vec<_>>().join(", ")
                );
            }
            lines.push(Line { offset_ms: at(time), source: "kernel", text: said });
        }
        let accepts = outcome["accepts_after_stop"].as_u64().unwrap_or_default();
        if accepts > 0 {
            lines.push(Line {
                offset_ms: None,
                source: "kernel",
                text: format!("accepted {accepts} connection(s) after {stop_signal}"),
            });
        }
        if outcome["still_listening"] == true {
            lines.push(Line {
                offset_ms: None,
                source: "kernel",
                text: "still listening when the SIGKILL came: clients were still being let in".to_owned(),
            });
        }
    }
    let kill_time = stop_time.zip(outcome["stop_to_kill_ns"].as_u64()).map(|(s, d)| s + d);
    if report["exit_signal"] == 9 && !matches!(outcome["kind"].as_str(), Some("oom_killed")) {
        let time = kill_time.or(exit_time).unwrap_or(origin);
        let alive: Vec<String> = scene["alive_at_kill"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let up = boot_ns(p, "started_at").map(|s| format!(", up {}", seconds(time.saturating_sub(s))));
                format!("{}{}", process(p), up.unwrap_or_default())
            })
            .collect();
        let mut said = format!("SIGKILL from {}", sender(&outcome["sender"]));
        if !alive.is_empty() {
            let _ = write!(said, "; alive: {}", alive.join(", "));
        }
        lines.push(Line { offset_ms: at(time), source: "kernel", text: said });
    }
    if let Some(time) = exit_time {
        let how = match (report["exit_status"].as_u64(), report["exit_signal"].as_u64()) {
            (_, Some(signal)) => format!("killed by {} (exit code {})", signal_name(signal), 128 + signal),
            (Some(code), None) => format!("exited with code {code}"),
            (None, None) => "ended".to_owned(),
        };
        let oom = match report["oom_victim"].as_str() {
            Some("init") => "; the OOM killer chose PID 1",
            Some("child") => "; the OOM killer killed a process of the container before",
            _ => "",
        };
        lines.push(Line { offset_ms: at(time), source: "kernel", text: format!("PID 1 {how}{oom}") });
        if let Some(limit) = oom_limit(&report["oom_limit"]) {
            lines.push(Line { offset_ms: None, source: "kernel", text: limit });
        }
    }
    let state = &c["state"];
    if let Some(reason) = state["reason"].as_str() {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!(
                "state as the kubelet should report it: {} {reason}, restarts {}",
                text(&state["state"]),
                c["restart_count"]
            ),
        });
    }
    for disagreement in c["disagreements"].as_array().into_iter().flatten() {
        lines.push(Line {
            offset_ms: None,
            source: "api",
            text: format!(
                "the kubelet reported {} where the kernel saw {} ({})",
                text(&disagreement["kubelet"]),
                text(&disagreement["kernel"]),
                text(&disagreement["kind"])
            ),
        });
    }
    let backoff = &c["last_backoff"];
    if !backoff.is_null() {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!(
                "restart {} came {} after the exit; the back-off allows {} ({})",
                backoff["restart_number"],
                seconds(backoff["observed_delay_ns"].as_u64().unwrap_or_default()),
                seconds(backoff["expected_delay_ns"].as_u64().unwrap_or_default()),
                text(&backoff["verdict"])
            ),
        });
    }

    // In CrashLoopBackOff now: when the kubelet's back-off lets it start again.
    if let Some(remaining) = c["back_off_remaining_ns"].as_u64().filter(|ns| *ns > 0) {
        lines.push(Line {
            offset_ms: None,
            source: "agent",
            text: format!("the next restart is due in {} (the kubelet's back-off)", seconds(remaining)),
        });
    }
    story.verdict =
        verdict(outcome, &stop_signal, grace, due, &running, &missed, report["oom_limit"]["scope"].as_str());
    story.timeline = lines;
    story
}

/// Which limit the OOM killer answered, in words, from the report's `oom_limit`.
fn oom_limit(limit: &Value) -> Option<String> {
    let scope = limit["scope"].as_str()?;
    let memcg = text(&limit["memcg"]);
    let victim = format!("`{}` (pid {})", text(&limit["victim_comm"]), limit["victim_pid"]);
    Some(match scope {
        "container" => format!("the container's memory limit fired ({memcg}); victim {victim}"),
        "pod" => format!(
            "the pod's memory limit fired ({memcg}), not the container's: the pod's containers (and its sandbox) \
             together reached it; victim {victim}"
        ),
        "node" => format!("no cgroup limit: the node ran out of memory; victim {victim}"),
        _ => format!("a limit above the pod fired ({memcg}: the QoS class or the node's allocatable); victim {victim}"),
    })
}

/// The one line at the top.
fn verdict(
    outcome: &Value,
    stop_signal: &str,
    grace: u64,
    due: u64,
    running: &[&Value],
    missed: &[&Value],
    oom_scope: Option<&str>,
) -> String {
    let stop_to_kill = outcome["stop_to_kill_ns"].as_u64().unwrap_or_default();
    let shell = match (running.iter().find(|p| p["init"] == true), missed.first()) {
        (Some(init), Some(child)) if init["got_stop_signal"] == true => {
            format!("; {} got {stop_signal} and did not pass it on: {} never got it", process(init), process(child))
        }
        _ => String::new(),
    };
    match outcome["kind"].as_str() {
        Some("sigkilled_after_grace") => format!(
            "SIGKILLed {} after {stop_signal}: it did not exit within its {} grace{shell}",
            seconds(stop_to_kill),
            seconds(due)
        ),
        Some("sigkilled_early") => format!(
            "SIGKILLed by {} {} after {stop_signal}, {} before its {} grace ran out: killed early, not the app's doing",
            sender(&outcome["sender"]),
            seconds(stop_to_kill),
            seconds(due.saturating_sub(stop_to_kill)),
            seconds(grace.max(due))
        ),
        Some("exited_within_grace") => format!(
            "exited {} after {stop_signal}, within its {} grace",
            seconds(outcome["duration_ns"].as_u64().unwrap_or_default()),
            seconds(due)
        ),
        Some("killed_without_grace") => {
            format!("SIGKILLed with no stop signal first, by {}", sender(&outcome["sender"]))
        }
        Some("stop_signal_not_observed") => {
            format!("SIGKILLed by {}; a stop signal may have come before the agent watched", sender(&outcome["sender"]))
        }
        Some("oom_killed") => match oom_scope {
            Some("container") => {
                "OOM-killed at the container's memory limit: the kernel's OOM killer chose PID 1".to_owned()
            }
            Some("pod") => {
                "OOM-killed at the pod's memory limit, not the container's: the kernel's OOM killer chose PID 1"
                    .to_owned()
            }
            Some("node") => "OOM-killed: the node ran out of memory and the kernel's OOM killer chose PID 1".to_owned(),
            Some(_) => "OOM-killed at a memory limit above the pod: the kernel's OOM killer chose PID 1".to_owned(),
            None => "OOM-killed: the kernel's OOM killer chose PID 1".to_owned(),
        },
        Some("exited_without_stop_signal") => match (outcome["exit_status"].as_u64(), outcome["signal"].as_u64()) {
            (_, Some(signal)) => format!("ended on its own, killed by {}", signal_name(signal)),
            (Some(0), None) => "exited on its own with code 0".to_owned(),
            (Some(code), None) => format!("exited on its own with code {code}"),
            (None, None) => "ended on its own".to_owned(),
        },
        _ => "judged, outcome unknown to this client".to_owned(),
    }
}

/// The stories as text: a block per container, the verdict first.
pub fn render_text(stories: &[ContainerStory]) -> String {
    let mut out = String::new();
    for story in stories {
        let cause = story.cause.as_deref().map(|c| format!(" [{c}]")).unwrap_or_default();
        let _ =
            writeln!(out, "{}/{} container {}: {}{cause}", story.namespace, story.pod, story.container, story.verdict);
        for line in &story.timeline {
            let offset = line.offset_ms.map(|ms| format!("{:+10.1}ms", ms)).unwrap_or_else(|| " ".repeat(12));
            let _ = writeln!(out, "  {offset}  {:<6}  {}", line.source, line.text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(container: Value) -> Value {
        json!({"containers": [container]})
    }

    /// A TERM-ignoring `java` behind a shell entrypoint, SIGKILLed at its 30 s grace after a
    /// deletion, as the API writes it.
    fn shell_entrypoint() -> Value {
        json!({
            "namespace": "shop", "pod": "web-1", "container": "app", "restart_count": 0,
            "state": {"state": "terminated", "reason": "Error", "exit_code": 137},
            "disagreements": [], "last_backoff": null,
            "last_termination": {
                "cause": "deleted", "grace_ns": 30_000_000_000u64, "expected_kill_after_ns": 30_000_000_000u64,
                "exit_time_boot_ns": 130_002_000_000u64, "exit_status": null, "exit_signal": 9, "oom_victim": null,
                "pre_stop": null,
                "stop_signal": {"signal": 15, "sender": {"kind": "runtime"}, "matches_configured": true,
                                "time_boot_ns": 100_000_000_000u64},
                "outcome": {"kind": "sigkilled_after_grace", "stop_to_kill_ns": 30_001_000_000u64,
                            "sender": {"kind": "runtime"}, "accepts_after_stop": 0},
                "scene": {
                    "running_at_stop": [
                        {"pid": 4100, "init": true, "comm": "sh", "started_at_boot_ns": 10_000_000_000u64, "got_stop_signal": true},
                        {"pid": 4107, "init": false, "comm": "java", "started_at_boot_ns": 11_000_000_000u64, "got_stop_signal": false}
                    ],
                    "alive_at_kill": [
                        {"pid": 4100, "init": true, "comm": "sh", "started_at_boot_ns": 10_000_000_000u64, "got_stop_signal": true},
                        {"pid": 4107, "init": false, "comm": "java", "started_at_boot_ns": 11_000_000_000u64, "got_stop_signal": false}
                    ],
                    "left_out": 0
                }
            }
        })
    }

    #[test]
    fn a_shell_entrypoint_that_kept_term_from_java_is_said_in_the_verdict_and_the_timeline() {
        let stories = explain(&answer(shell_entrypoint()), "shop", "web-1", None);
        assert_eq!(stories.len(), 1);
        let story = &stories[0];
        assert_eq!(
            story.verdict,
            "SIGKILLed 30.0s after SIGTERM: it did not exit within its 30.0s grace; PID 1 `sh` got SIGTERM and \
             did not pass it on: `java` (pid 4107) never got it"
        );
        assert_eq!(story.cause.as_deref(), Some("deleted"));
        let kill = story.timeline.iter().find(|l| l.text.starts_with("SIGKILL")).expect("the SIGKILL line");
        assert_eq!(kill.offset_ms, Some(30_001.0));
        assert_eq!(
            kill.text,
            "SIGKILL from the container runtime; alive: PID 1 `sh`, up 120.0s, `java` (pid 4107), up 119.0s"
        );
        let text = render_text(&stories);
        assert!(text.contains("never got it: `java` (pid 4107)"), "{text}");
        assert!(text.contains("PID 1 killed by SIGKILL (exit code 137)"), "{text}");
    }

    #[test]
    fn an_early_kill_is_the_runtimes_doing_and_names_what_was_left() {
        let mut c = shell_entrypoint();
        c["last_termination"]["outcome"] = json!({"kind": "sigkilled_early", "stop_to_kill_ns": 1_000_000_000u64,
            "sender": {"kind": "runtime"}});
        c["last_termination"]["grace_ns"] = json!(3_000_000_000u64);
        c["last_termination"]["expected_kill_after_ns"] = json!(3_000_000_000u64);
        let story = &explain(&answer(c), "shop", "web-1", Some("app"))[0];
        assert_eq!(
            story.verdict,
            "SIGKILLed by the container runtime 1.0s after SIGTERM, 2.0s before its 3.0s grace ran out: killed \
             early, not the app's doing"
        );
    }

    #[test]
    fn a_prestop_hooks_processes_are_not_the_apps_that_missed_the_signal() {
        let mut c = shell_entrypoint();
        let hook = json!({"pid": 4200, "init": false, "comm": "sleep", "started_at_boot_ns": 99_000_000_000u64,
            "got_stop_signal": false, "exec_session": true});
        c["last_termination"]["scene"]["running_at_stop"] =
            json!([c["last_termination"]["scene"]["running_at_stop"][0].clone(), hook]);
        let story = &explain(&answer(c), "shop", "web-1", None)[0];
        assert_eq!(story.verdict, "SIGKILLed 30.0s after SIGTERM: it did not exit within its 30.0s grace");
        let running = story.timeline.iter().find(|l| l.text.starts_with("running:")).expect("who ran");
        assert_eq!(running.text, "running: PID 1 `sh`, `sleep` (pid 4200, exec session); got SIGTERM: PID 1 `sh`");
    }

    #[test]
    fn a_listener_left_open_and_a_pending_restart_are_said() {
        let mut c = shell_entrypoint();
        c["last_termination"]["outcome"]["still_listening"] = json!(true);
        c["back_off_remaining_ns"] = json!(12_000_000_000u64);
        let story = &explain(&answer(c), "shop", "web-1", None)[0];
        let lines: Vec<&str> = story.timeline.iter().map(|l| l.text.as_str()).collect();
        assert!(lines.contains(&"still listening when the SIGKILL came: clients were still being let in"), "{lines:?}");
        assert!(lines.contains(&"the next restart is due in 12.0s (the kubelet's back-off)"), "{lines:?}");
        let quiet = &explain(&answer(shell_entrypoint()), "shop", "web-1", None)[0];
        assert!(!quiet.timeline.iter().any(|l| l.text.contains("still listening") || l.text.contains("next restart")));
    }

    #[test]
    fn names_from_a_pod_cannot_write_to_the_terminal() {
        let mut c = shell_entrypoint();
        c["last_termination"]["scene"]["running_at_stop"][1]["comm"] = json!("ja\u{1b}[2Jva");
        let text = render_text(&explain(&answer(c), "shop", "web-1", None));
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(text.contains("ja\\u{1b}[2Jva"), "{text}");
    }

    #[test]
    fn other_pods_and_containers_are_left_out_and_a_running_one_says_so() {
        let running = json!({"namespace": "shop", "pod": "web-1", "container": "side", "state": {"state": "running"},
                             "last_termination": null});
        let other = json!({"namespace": "shop", "pod": "web-2", "container": "app", "last_termination": null});
        let body = json!({"containers": [shell_entrypoint(), running, other]});
        let stories = explain(&body, "shop", "web-1", None);
        assert_eq!(stories.iter().map(|s| s.container.as_str()).collect::<Vec<_>>(), ["app", "side"]);
        assert_eq!(stories[1].verdict, "running; no stop seen");
        assert_eq!(explain(&body, "shop", "web-1", Some("side")).len(), 1);
    }
}
