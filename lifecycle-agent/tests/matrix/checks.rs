//! The judgement of one boot: each check the issue asks for, from what the guest collected, as
//! pass or fail with what was found. Every check is evaluated (the results table shows them
//! all); the test then fails on any that failed.

use lifecycle_agent::model::{
    container_state::ContainerState,
    node::ContainerView,
    termination::{OomVictim, SignalSender, TerminationOutcome},
    wire::ContainersResponse,
};

use super::{
    collected::{sample, Collected},
    Boot, Mode,
};

/// One check's result.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// The features whose programs must all attach (`lifecycle_feature_enabled{feature}`).
const FEATURES: [&str; 7] =
    ["process_exec", "process_exit", "signals", "oom_kills", "tcp_sockets", "tcp_accepts", "cgroup_events"];
const NS: u64 = 1_000_000_000;

fn check(name: &'static str, result: Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check { name, passed: true, detail },
        Err(detail) => Check { name, passed: false, detail },
    }
}

/// Every check of `boot`, in the order of the results table.
pub fn judge(boot: &Boot, got: &Collected, ids: &Ids) -> Vec<Check> {
    let mut checks = vec![check("layout", cgroup_mode(boot, got))];
    if boot.mode == Mode::Legacy {
        checks.push(check("refuses", refuses(got)));
        return checks;
    }
    let started = starts(got);
    let ran = started.is_ok();
    checks.push(check("starts", started));
    checks.push(check("programs", programs(got)));
    // Without an agent the workload is not run: each of its checks fails saying so.
    let workload =
        |result: Result<String, String>| if ran { result } else { Err("not run: the agent did not start".into()) };
    checks.push(check("exit", workload(exit(got, boot))));
    if !boot.arch_is_arm64() {
        checks.push(check("signal", workload(signal(got))));
        checks.push(check("stop", workload(stop(got))));
        checks.push(check("listener", workload(listener(got))));
        checks.push(check("accept", workload(accept(got))));
        checks.push(check("unix", workload(unix(got))));
        checks.push(check("oom", workload(oom(got))));
        checks.push(check("container", workload(container(got, ids))));
        checks.push(check("status", workload(status(got))));
    }
    checks.push(check("shutdown", workload(shutdown(got))));
    checks.push(check("no_panic", workload(no_panic(got))));
    checks
}

/// The pod uid and container id the guest's container was given.
pub struct Ids {
    pub pod_uid: String,
    pub container_id: String,
}

fn cgroup_mode(boot: &Boot, got: &Collected) -> Result<String, String> {
    let seen = got.fact_text("cgroup_mode");
    // The arm64 guest mounts cgroup2 itself (no systemd): unified by construction.
    if boot.arch_is_arm64() {
        return Ok("unified (mounted by the guest's init)".to_owned());
    }
    if seen == boot.mode.name() {
        Ok(seen)
    } else {
        Err(format!("booted for {} but the guest has {seen:?}", boot.mode.name()))
    }
}

/// The last `error:` line of the agent's log.
fn error_line(got: &Collected) -> String {
    got.agent_log.lines().rev().find(|l| l.starts_with("error:")).unwrap_or("").to_owned()
}

fn starts(got: &Collected) -> Result<String, String> {
    let started =
        matches!(got.fact("agent_started"), serde_json::Value::Bool(true)) || got.fact_text("agent_started") == "1";
    if started {
        Ok("/healthz answered".to_owned())
    } else {
        Err(format!("the agent did not start: {} (log: {})", error_line(got), got.agent_log_tail(3)))
    }
}

fn refuses(got: &Collected) -> Result<String, String> {
    let exited = got.fact("agent_exit_at_start");
    let error = error_line(got);
    let doctor_cgroups = doctor_result(got, "cgroups");
    match (exited.as_i64(), error.contains("no cgroup v2 hierarchy is mounted"), doctor_cgroups.as_deref()) {
        (Some(code), true, Some("missing")) if code != 0 => Ok(format!("exit {code}: {error}")),
        _ => Err(format!(
            "wanted a non-zero exit with `no cgroup v2 hierarchy is mounted` and doctor's cgroups missing; got exit \
             {exited}, {error:?}, doctor cgroups {doctor_cgroups:?}; log: {}",
            got.agent_log_tail(4)
        )),
    }
}

fn doctor_result(got: &Collected, name: &str) -> Option<String> {
    let checks = got.doctor.as_ref()?["checks"].as_array()?;
    let found = checks.iter().find(|c| c["check"] == name)?;
    Some(found["result"].as_str()?.to_owned())
}

fn programs(got: &Collected) -> Result<String, String> {
    let mut missing = Vec::new();
    for feature in FEATURES {
        if sample(&got.metrics_start, "lifecycle_feature_enabled", &[("feature", feature)]) != Some(1.0) {
            missing.push(feature);
        }
    }
    let off: Vec<&str> = got.agent_log.lines().filter(|l| l.contains("is off")).collect();
    // The arm64 guest runs no doctor (its check is programs and an exit).
    let doctor = doctor_result(got, "programs");
    let doctor_ok = got.doctor.is_none() || doctor.as_deref() == Some("ok");
    if missing.is_empty() && off.is_empty() && doctor_ok {
        Ok(format!("all {} features enabled", FEATURES.len()))
    } else {
        Err(format!("features not enabled: {missing:?}; log: {off:?}; doctor programs: {doctor:?}"))
    }
}

fn unit<'a>(got: &'a Collected, path: &str) -> Result<&'a ContainerView, String> {
    got.host_unit(path).ok_or_else(|| format!("no unit {path} in /api/v1/containers"))
}

fn exit(got: &Collected, boot: &Boot) -> Result<String, String> {
    let path = if boot.arch_is_arm64() { "/matrix-exit" } else { "/system.slice/matrix-exit.service" };
    let view = unit(got, path)?;
    let report = view.last_termination.as_ref().ok_or("no last termination")?;
    let exited = matches!(report.outcome, TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(7), .. });
    let execs = sample(&got.metrics, "lifecycle_process_execs_total", &[("container", path)]).unwrap_or(0.0);
    let code = match view.status.state {
        ContainerState::Terminated { exit_code, .. } => Some(exit_code),
        _ => None,
    };
    if exited && code == Some(7) && execs >= 1.0 {
        Ok(format!("exit code 7, {execs} exec(s)"))
    } else {
        Err(format!("state exit code {code:?}, outcome {:?}, execs {execs}", report.outcome))
    }
}

fn signal(got: &Collected) -> Result<String, String> {
    let path = "/system.slice/matrix-signal.service";
    let labels = [("container", path), ("signal", "10"), ("sender", "other_process")];
    let counted = sample(&got.metrics, "lifecycle_signals_received_total", &labels);
    let view = unit(got, path)?;
    let status = view.last_termination.as_ref().and_then(|r| r.exit_status);
    if counted.is_some_and(|n| n >= 1.0) && status == Some(0) {
        Ok("SIGUSR1 from another process counted; exit 0".to_owned())
    } else {
        let all: Vec<&str> =
            got.metrics.lines().filter(|l| l.contains(path) && l.contains("signals_received")).collect();
        Err(format!("SIGUSR1 from other_process: {counted:?} ({all:?}); exit status {status:?}"))
    }
}

fn is_systemd(sender: &SignalSender) -> bool {
    matches!(sender, SignalSender::OtherProcess { comm, .. } if comm == "systemd")
}

fn stop(got: &Collected) -> Result<String, String> {
    let view = unit(got, "/system.slice/matrix-stop.service")?;
    let report = view.last_termination.as_ref().ok_or("no last termination")?;
    let stop_signal = report.stop_signal.as_ref().map(|s| (s.signal, is_systemd(&s.sender)));
    // SIGTERM ignored, SIGKILL when TimeoutStopSec=2 ran out: the service's grace was 2 s and it
    // did not exit within it.
    let judged = match &report.outcome {
        TerminationOutcome::SigkilledAfterGrace { grace_ns, stop_to_kill_ns, sender, .. } => {
            *grace_ns == 2 * NS && (NS..=10 * NS).contains(stop_to_kill_ns) && sender.as_ref().is_some_and(is_systemd)
        }
        _ => false,
    };
    if stop_signal == Some((15, true)) && judged {
        Ok("SIGTERM from systemd, SIGKILL after its 2 s grace".to_owned())
    } else {
        Err(format!(
            "wanted SIGTERM from systemd then sigkilled_after_grace (grace 2 s, SIGKILL from systemd); got stop \
             signal {:?}, outcome {:?}, grace {} ms",
            report.stop_signal,
            report.outcome,
            report.grace_ns / 1_000_000
        ))
    }
}

fn port(view: &ContainerView, port: u16) -> (i64, u64, u64) {
    view.tcp.get(&port).map_or((0, 0, 0), |p| (p.listeners, p.established, p.accepts))
}

fn listener(got: &Collected) -> Result<String, String> {
    let path = "/system.slice/matrix-backlog.service";
    let seen = port(unit(got, path)?, 9101);
    let depth = sample(&got.metrics, "lifecycle_tcp_accept_queue_depth", &[("container", path), ("port", "9101")]);
    if seen == (1, 2, 0) && depth == Some(2.0) {
        Ok("listening, 2 handshakes queued, 0 accepted".to_owned())
    } else {
        Err(format!("(listeners, established, accepts) = {seen:?}, queue depth {depth:?}; wanted (1, 2, 0) and 2"))
    }
}

fn accept(got: &Collected) -> Result<String, String> {
    // One connection, then the Unix step's barrier: two.
    let seen = port(unit(got, "/system.slice/matrix-accept.service")?, 9102);
    if seen == (1, 2, 2) {
        Ok("2 connections established and accepted".to_owned())
    } else {
        Err(format!("(listeners, established, accepts) = {seen:?}; wanted (1, 2, 2)"))
    }
}

fn unix(got: &Collected) -> Result<String, String> {
    let containers = got.containers.as_ref().ok_or("no /api/v1/containers answer")?;
    // Without the barrier's accept the agent may not have read the Unix accepts yet.
    let barrier = got.host_unit("/system.slice/matrix-accept.service").map(|v| port(v, 9102).2);
    if barrier != Some(2) {
        return Err(format!("the TCP accept after the Unix ones was not seen (accepts {barrier:?})"));
    }
    let series: Vec<&str> = got.metrics.lines().filter(|l| l.contains("port=\"0\"")).collect();
    let units: Vec<&str> =
        containers.containers.iter().filter(|c| c.tcp.contains_key(&0)).map(|c| c.labels.container.as_str()).collect();
    if series.is_empty() && units.is_empty() {
        Ok("no port=\"0\" series".to_owned())
    } else {
        let shown: Vec<&str> = series.iter().take(4).copied().collect();
        Err(format!("{} port=\"0\" series (e.g. {shown:?}); units with a port 0: {units:?}", series.len()))
    }
}

fn oom(got: &Collected) -> Result<String, String> {
    let path = "/system.slice/matrix-oom.service";
    // On hybrid, a kernel built without cgroup v1's memory controller (CONFIG_MEMCG_V1, off in
    // Debian's from 6.12) has nothing to enforce MemoryMax= with: the unit grows until the
    // node's OOM killer takes it. Either is an OOM kill of the unit's process.
    // (doctor's own proof of the feature OOM-kills a child of its own, named lifecycle-agent.)
    let line = got.dmesg.lines().find(|l| l.contains("Killed process") && l.contains("(python3)"));
    let killer = match line {
        Some(line) if line.contains("Memory cgroup out of memory") => "its memory cgroup's limit",
        Some(_) => "the node's OOM killer (MemoryMax= not enforced: no v1 memory controller)",
        None => return Err("the unit's python3 was not OOM-killed in the guest (dmesg)".to_owned()),
    };
    let view = unit(got, path)?;
    let report = view.last_termination.as_ref().ok_or("no last termination")?;
    let counted = sample(&got.metrics, "lifecycle_oom_kills_total", &[("container", path)]);
    let reason = match &view.status.state {
        ContainerState::Terminated { reason, .. } => format!("{reason:?}"),
        other => format!("{other:?}"),
    };
    let judged = matches!(report.outcome, TerminationOutcome::OomKilled)
        && report.oom_victim == Some(OomVictim::Init)
        && report.oom_kills >= 1;
    if judged && counted.is_some_and(|n| n >= 1.0) && reason == "OomKilled" {
        Ok(format!("OOMKilled, victim init, {} kill(s), by {killer}", report.oom_kills))
    } else {
        Err(format!(
            "state {reason}, outcome {:?}, victim {:?}, oom_kills {}, lifecycle_oom_kills_total {counted:?}",
            report.outcome, report.oom_victim, report.oom_kills
        ))
    }
}

fn container(got: &Collected, ids: &Ids) -> Result<String, String> {
    let uid_ = ids.pod_uid.replace('-', "_");
    let layout = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{}.scope",
        ids.container_id
    );
    let placed = got.fact("workload")["container"]["proc_cgroup"]
        .as_array()
        .is_some_and(|lines| lines.iter().any(|l| l.as_str().is_some_and(|l| l.ends_with(&layout))));
    if !placed {
        return Err(format!(
            "the container's process is not in {layout}: {}",
            got.fact("workload")["container"]["proc_cgroup"]
        ));
    }
    let running = got.containers_running.as_ref().ok_or("no answer while the container ran")?;
    let found = running.containers.iter().find(|c| c.container_id.as_deref() == Some(ids.container_id.as_str()));
    match found {
        Some(view) if view.labels.uid == ids.pod_uid => Ok(format!("pod uid and id from {layout}")),
        Some(view) => Err(format!("container found with pod uid {:?}, wanted {}", view.labels.uid, ids.pod_uid)),
        None => Err(format!("no container {} in /api/v1/containers while it ran", ids.container_id)),
    }
}

fn status(got: &Collected) -> Result<String, String> {
    let answer: ContainersResponse =
        serde_json::from_str(&got.status).map_err(|e| format!("`status -o json` is not the API's answer: {e}"))?;
    let units = answer.containers.iter().filter(|c| c.labels.container.contains("matrix-")).count();
    if units >= 6 {
        Ok(format!("{units} matrix units listed"))
    } else {
        Err(format!("`status -o json` lists {units} matrix units"))
    }
}

fn shutdown(got: &Collected) -> Result<String, String> {
    let code = got.fact_text("agent_exit_at_stop");
    if code == "0" {
        Ok("exit 0 on SIGTERM".to_owned())
    } else {
        Err(format!("exit status on SIGTERM: {code:?}"))
    }
}

/// A thread of the agent that panicked is a bug, whatever it was doing.
fn no_panic(got: &Collected) -> Result<String, String> {
    match got.agent_log.lines().position(|l| l.contains("panicked at")) {
        None => Ok("no panic in the agent's log".to_owned()),
        Some(at) => {
            let lines: Vec<&str> = got.agent_log.lines().skip(at).take(2).collect();
            Err(format!("the agent's log has a panic: {}", lines.join(" ")))
        }
    }
}
