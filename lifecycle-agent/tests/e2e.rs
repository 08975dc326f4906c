//! Privileged tier, end to end: a real containerd + runc driven through the CRI the way the
//! kubelet drives it, and the real `lifecycle-agent run` binary watching from the kernel. Each
//! scenario asserts the agent's verdicts and times from `/api/v1/containers` and `/metrics`.
//!
//! Run: `cargo test -p lifecycle-agent --test e2e -- --test-threads=1`

use std::time::{Duration, Instant};

use lifecycle_agent::{export::families, model::metadata::keys};
use lifecycle_testkit::{
    agent::{free_port, get, Agent},
    containerd::{start_or_skip, KubeletAnnotations, Pod},
};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const SECOND: f64 = 1e9;

fn state(c: &Value) -> &str {
    c["state"]["state"].as_str().unwrap_or_default()
}

fn outcome(c: &Value) -> &str {
    c["last_termination"]["outcome"]["kind"].as_str().unwrap_or_default()
}

fn metric_line(metrics: &str, name: &str, pod: &Pod, extra: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("pod=\"{}\"", pod.name)) && l.contains(extra))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn annotations(grace_s: i64, restart_count: u32) -> KubeletAnnotations {
    KubeletAnnotations { termination_grace_period_s: Some(grace_s), restart_count, ..KubeletAnnotations::default() }
}

/// Each thread of `pid` by name, with its nice value (field 19 of `/proc/<pid>/task/<tid>/stat`;
/// the name, field 2, has no spaces here).
fn thread_nice(pid: u32) -> Vec<(String, i32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads");
    tasks
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 2..];
            // Fields from the state (3rd) on: nice is the 19th, the 17th after the state.
            let nice = after_name.split(' ').nth(16)?.parse().ok()?;
            Some((comm.trim().to_owned(), nice))
        })
        .collect()
}

/// The ring reader is scheduled ahead of the threads that answer HTTP clients: a container's
/// exit must not wait for a CPU behind them (BENCHMARKS.md: exit -> API).
#[test]
fn the_ring_reader_runs_at_a_higher_priority_than_the_http_workers() {
    let Some(h) = start_or_skip("the_ring_reader_runs_at_a_higher_priority_than_the_http_workers") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let threads = thread_nice(agent.pid());
    let reader = threads.iter().find(|(name, _)| name == "ring-reader").expect("a ring-reader thread");
    let workers: Vec<i32> =
        threads.iter().filter(|(name, _)| name.starts_with("tokio-rt-worker")).map(|(_, nice)| *nice).collect();
    assert!(!workers.is_empty(), "HTTP workers in {threads:?}");
    assert!(workers.iter().all(|&worker| reader.1 < worker), "{threads:?}");
}

#[test]
fn app_exiting_on_sigterm_is_within_grace() {
    let Some(mut h) = start_or_skip("app_exiting_on_sigterm_is_within_grace") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("graceful").expect("pod");
    let script = "trap 'exit 0' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations(30, 0), None).expect("container");
    let running = agent.wait(&pod, "app", "running", |c| state(c) == "running");
    assert_eq!((running["namespace"].as_str(), running["pod"].as_str()), (Some("default"), Some("graceful")));
    assert_eq!(running["container_id"].as_str(), Some(id.as_str()));

    h.stop_container(&id, 30).expect("stop");
    let done = agent.wait(&pod, "app", "terminated", |c| state(c) == "terminated" && !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "exited_within_grace", "{done:#}");
    let report = &done["last_termination"];
    assert_eq!(report["stop_signal"]["signal"], 15);
    assert_eq!(report["stop_signal"]["sender"]["kind"], "runtime", "containerd's shim sends the stop signal");
    assert_eq!(report["grace_ns"].as_f64(), Some(30.0 * SECOND), "grace from the kubelet's annotation");
    // The trap runs after the current `sleep 0.1`: well under a second of the 30 s grace.
    let duration = report["outcome"]["duration_ns"].as_f64().expect("duration") / SECOND;
    assert!((0.0..1.0).contains(&duration), "stop took {duration} s");
    assert_eq!(done["state"]["reason"], "Completed");
    let metrics = agent.metrics();
    assert_eq!(
        metric_line(&metrics, "lifecycle_terminations_total", &pod, "outcome=\"exited_within_grace\""),
        Some(1.0)
    );
    assert_eq!(metric_line(&metrics, "lifecycle_grace_period_violations_total", &pod, ""), Some(0.0));
}

#[test]
fn a_request_waiting_on_a_container_is_answered_with_its_exit() {
    let Some(mut h) = start_or_skip("a_request_waiting_on_a_container_is_answered_with_its_exit") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("followed").expect("pod");
    let script = "trap 'exit 4' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations(30, 0), None).expect("container");
    agent.wait(&pod, "app", "running", |c| state(c) == "running");
    let ask = |path: &str| -> Value {
        let (code, body) = get(&agent.addr, path).expect("the API answers");
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("JSON")
    };
    let first = ask(&format!("/api/v1/containers?container_id={id}"));
    assert_eq!(state(&first["containers"][0]), "running", "{first:#}");
    // The client follows the container from the version it saw, one waiting request at a time,
    // as `status --watch` does. The stop lands at any point of that: before the first wait
    // arrives (answered at once, "behind"), or while one waits ("changed").
    let exited = std::thread::scope(|scope| {
        let stopper = scope.spawn(|| h.stop_container(&id, 30));
        let mut version = first["resource_version"].as_str().expect("a resource_version").to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        let exited = loop {
            assert!(Instant::now() < deadline, "no exit seen; last version {version}");
            let answer =
                ask(&format!("/api/v1/containers?container_id={id}&wait_seconds=8&resource_version={version}"));
            let container = &answer["containers"][0];
            if state(container) == "terminated" {
                break container.clone();
            }
            version = answer["resource_version"].as_str().expect("a resource_version").to_owned();
        };
        stopper.join().expect("stopper").expect("stop");
        exited
    });
    assert_eq!(exited["state"]["exit_code"], 4, "{exited:#}");
    let metrics = agent.metrics();
    let ended = |result: &str| {
        let line = format!("lifecycle_api_waits_total{{result=\"{result}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&line)).and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(ended("timeout"), Some(0.0), "every wait ended with a change, none at its 8 s:\n{metrics}");
    assert!(ended("changed").unwrap_or(0.0) + ended("behind").unwrap_or(0.0) >= 1.0, "{metrics}");
}

#[test]
fn app_ignoring_sigterm_is_sigkilled_at_the_timeout_as_a_violation() {
    let Some(mut h) = start_or_skip("app_ignoring_sigterm_is_sigkilled_at_the_timeout_as_a_violation") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("stubborn").expect("pod");
    // Accepting nothing, ignoring TERM: the kubelet's stop ends in SIGKILL at the grace period.
    let script = "trap '' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations(2, 0), None).expect("container");
    agent.wait(&pod, "app", "running", |c| state(c) == "running");
    h.stop_container(&id, 2).expect("stop");
    let done = agent.wait(&pod, "app", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "sigkilled_after_grace", "{done:#}");
    let o = &done["last_termination"]["outcome"];
    assert_eq!(o["grace_ns"].as_f64(), Some(2.0 * SECOND));
    assert_eq!(o["expected_kill_after_ns"].as_f64(), Some(2.0 * SECOND));
    assert_eq!(o["sender"]["kind"], "runtime", "the runtime killed it, at the grace period");
    // containerd arms its timer after sending TERM and kills when it fires: 2 s plus the
    // runtime's own latency (measured 0.05-0.15 s here), never less than 2 s.
    let stop_to_kill = o["stop_to_kill_ns"].as_f64().expect("stop_to_kill") / SECOND;
    assert!((2.0..2.5).contains(&stop_to_kill), "SIGKILL {stop_to_kill} s after the stop signal");
    assert_eq!(done["state"]["reason"], "Error", "a signal death is Error with exit 128+N, as the kubelet says");
    assert_eq!(done["state"]["signal"], 9);
    assert_eq!(done["state"]["exit_code"], 137);
    let metrics = agent.metrics();
    assert_eq!(metric_line(&metrics, "lifecycle_grace_period_violations_total", &pod, ""), Some(1.0));
    assert_eq!(
        metric_line(&metrics, "lifecycle_signals_received_total", &pod, "signal=\"9\",sender=\"runtime\""),
        Some(1.0)
    );
}

#[test]
fn crash_loop_delays_are_judged_against_the_kubelet_back_off() {
    let Some(mut h) = start_or_skip("crash_loop_delays_are_judged_against_the_kubelet_back_off") else { return };
    // The reduced-decay gate (1 s initial) keeps the kubelet-like delays short enough for a test.
    let agent = Agent::start(AGENT, &h, &["--reduced-backoff-decay"]);
    let pod = h.new_pod("crashloop").expect("pod");
    // Delay before each restart, as the harness (playing the kubelet) applies it after the
    // previous exit: immediate (first crash), 1 s (due), then 0.2 s where 2 s are due.
    let delays = [None, Some(0.0), Some(1.0), Some(0.2)];
    let mut finished_at = None;
    for (attempt, delay) in delays.iter().enumerate() {
        if let (Some(delay), Some(finished)) = (delay, finished_at) {
            let wait = Duration::from_secs_f64(*delay).saturating_sub(Instant::elapsed(&finished));
            std::thread::sleep(wait);
        }
        let id = h
            .run_container(&pod, "crash", &["sh", "-c", "exit 1"], &annotations(30, attempt as u32), None)
            .expect("container");
        h.wait_exited(&id, Duration::from_secs(10)).expect("exit");
        finished_at = Some(Instant::now());
        agent.wait(&pod, "crash", "the exit", |c| c["restart_count"] == attempt && !c["last_termination"].is_null());
    }
    let c = agent.wait(&pod, "crash", "three restarts", |c| c["restart_count"] == 3);
    let last = &c["last_backoff"];
    assert_eq!(last["verdict"], "too_early", "{c:#}");
    assert_eq!(last["expected_delay_ns"].as_f64(), Some(2.0 * SECOND));
    let observed = last["observed_delay_ns"].as_f64().expect("observed") / SECOND;
    assert!(observed < 1.0, "restarted {observed} s after the exit");
    let metrics = agent.metrics();
    assert_eq!(
        metric_line(&metrics, "lifecycle_backoff_verdicts_total", &pod, "verdict=\"within_tolerance\""),
        Some(2.0)
    );
    assert_eq!(metric_line(&metrics, "lifecycle_backoff_verdicts_total", &pod, "verdict=\"too_early\""), Some(1.0));
    assert_eq!(
        metric_line(&metrics, "lifecycle_container_exits_total", &pod, "reason=\"Error\",exit_code=\"1\""),
        Some(4.0)
    );
    // Until the next restart, the kubelet would show CrashLoopBackOff for the 4 s now due.
    assert_eq!(state(&c), "waiting");
    assert_eq!(c["state"]["reason"], "CrashLoopBackOff");
}

#[test]
fn memory_limit_oom_kill_is_oomkilled_from_the_kernel_event() {
    let Some(mut h) = start_or_skip("memory_limit_oom_kill_is_oomkilled_from_the_kernel_event") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("hog").expect("pod");
    let script = "a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done";
    let id =
        h.run_container(&pod, "hog", &["sh", "-c", script], &annotations(30, 0), Some(64 << 20)).expect("container");
    h.wait_exited(&id, Duration::from_secs(20)).expect("exit");
    let done = agent.wait(&pod, "hog", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "oom_killed", "{done:#}");
    assert_eq!(done["state"]["reason"], "OOMKilled");
    assert_eq!(done["state"]["exit_code"], 137);
    assert_eq!(metric_line(&agent.metrics(), "lifecycle_oom_kills_total", &pod, ""), Some(1.0));
}

/// Issue 40, item 4: the container's memory files are read while it runs and exported, and its
/// stop carries what they said in the minute before. On this hybrid host the memory controller
/// is cgroup v1's: `memory.events` does not exist, v1's `oom_kill` count and PSI (from cgroup
/// v2) do, and nothing else is claimed.
#[test]
fn a_containers_memory_pressure_is_exported_and_told_at_its_stop() {
    let Some(mut h) = start_or_skip("a_containers_memory_pressure_is_exported_and_told_at_its_stop") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("pressed").expect("pod");
    // A child grows until the OOM killer takes it at the 64 MiB limit; PID 1 lives on.
    let script = "trap 'exit 0' TERM; (a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done); \
                  while true; do sleep 0.2; done";
    let id =
        h.run_container(&pod, "app", &["sh", "-c", script], &annotations(10, 0), Some(64 << 20)).expect("container");
    let deadline = Instant::now() + Duration::from_secs(30);
    let v2_memory = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .or_else(|_| std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers"))
        .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
    let metrics = loop {
        let metrics = agent.metrics();
        if metric_line(&metrics, "lifecycle_container_memory_events_total", &pod, "event=\"oom_kill\"") == Some(1.0) {
            break metrics;
        }
        assert!(Instant::now() < deadline, "no oom_kill count read within 30 s:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        metric_line(&metrics, "lifecycle_container_memory_pressure_seconds_total", &pod, "kind=\"some\"").is_some(),
        "PSI is read from cgroup v2 whatever the controllers"
    );
    let high = metric_line(&metrics, "lifecycle_container_memory_events_total", &pod, "event=\"high\"");
    assert_eq!(high.is_some(), v2_memory, "memory.high counted only where the v2 controller is");
    h.stop_container(&id, 10).expect("stop");
    let done = agent.wait(&pod, "app", "judged", |c| !c["last_termination"].is_null());
    let memory = &done["last_termination"]["memory"];
    for line in metrics.lines().filter(|l| l.starts_with("lifecycle_container_memory") && l.contains(&pod.name)) {
        eprintln!("{line}");
    }
    eprintln!("memory at the stop: {memory}");
    assert_eq!(memory["events"]["oom_kill"], 1, "the kill in the minute before the stop: {done:#}");
    assert!(memory["window_ns"].as_f64().is_some_and(|w| w > 0.0 && w <= 60.0 * SECOND), "{memory}");
    assert_eq!(memory["events"].get("high").is_some(), v2_memory);
}

#[test]
fn exit_zero_is_a_completion_without_stop_signal() {
    let Some(mut h) = start_or_skip("exit_zero_is_a_completion_without_stop_signal") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("job").expect("pod");
    let id = h
        .run_container(&pod, "task", &["sh", "-c", "sleep 0.3; exit 0"], &annotations(30, 0), None)
        .expect("container");
    let status = h.wait_exited(&id, Duration::from_secs(10)).expect("exit");
    let done = agent.wait(&pod, "task", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "exited_without_stop_signal", "{done:#}");
    assert_eq!((done["state"]["reason"].as_str(), done["state"]["exit_code"].as_i64()), (Some("Completed"), Some(0)));
    // The runtime and the kernel agree on how long it ran (the runtime's clock is Unix time,
    // the agent's boot time: compare durations). Start differs by exec setup; allow 100 ms.
    let ran = (done["state"]["finished_at_boot_ns"].as_f64().expect("finished")
        - done["state"]["started_at_boot_ns"].as_f64().expect("started"))
        / SECOND;
    let runtime_ran = (status.finished_at - status.started_at) as f64 / SECOND;
    assert!((ran - runtime_ran).abs() < 0.1, "agent {ran} s vs runtime {runtime_ran} s");
    assert!(ran >= 0.3, "ran {ran} s");
}

#[test]
fn probes_answer_from_kernel_state_and_exec_sessions_are_costed() {
    let Some(mut h) = start_or_skip("probes_answer_from_kernel_state_and_exec_sessions_are_costed") else { return };
    let agent = Agent::start(AGENT, &h, &[]);
    // busybox httpd listens and accepts; the pod shares the node's network (no CNI here), so its
    // probes are answered by the node endpoint, which uses the same per-container state. The pod
    // declares the checks asked below, as its lifecycle.dev/probes annotation.
    let port = free_port();
    let declared = format!("/probe/tcp?port={port}\n/probe/tcp?port={}\n/probe/process", port + 1);
    let pod = h.new_pod_annotated("web", &[(keys::PROBE_DECLARATION, &declared)]).expect("pod");
    let serve = format!("httpd -f -p 127.0.0.1:{port} -h /");
    let id = h.run_container(&pod, "web", &["sh", "-c", &serve], &annotations(30, 0), None).expect("container");
    agent.wait(&pod, "web", "running", |c| state(c) == "running");
    let probe = |query: &str| {
        let (code, body) = agent.probe(&pod, "web", query);
        (code.to_string(), body.trim().to_owned())
    };
    // The probe supervisor picks the container up within its 1 s reconcile period.
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe(&format!("check=tcp&port={port}")).0 != "200" {
        assert!(Instant::now() < deadline, "tcp probe never passed: {:?}", probe(&format!("check=tcp&port={port}")));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(probe("check=process"), ("200".into(), "ok".into()));
    let (code, body) = probe(&format!("check=tcp&port={}", port + 1));
    assert_eq!(code, "503");
    assert!(body.contains(&format!("{}", port + 1)), "{body}");
    assert_eq!(probe("port=1").0, "400", "a probe without check= is a bad request");
    // Undeclared checks, and containers that are not there, get 403 and no detail.
    let forbidden = ("403".to_owned(), "forbidden".to_owned());
    assert_eq!(probe(&format!("check=tcp&port={}", port + 2)), forbidden);
    assert_eq!(probe("check=file&path=/etc/hostname"), forbidden);
    assert_eq!(agent.probe(&pod, "nobody", "check=process"), (403, "forbidden\n".to_owned()));

    // Two exec probes the kubelet's way (ExecSync), costed per container.
    let mut runtime = h.cri().runtime_service();
    for _ in 0..2 {
        let request = k8s_cri::v1::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["cat".into(), "/etc/hostname".into()],
            timeout: 5,
        };
        let reply = h.block_on(runtime.exec_sync(request)).expect("exec").into_inner();
        assert_eq!(reply.exit_code, 0);
    }
    let c = agent.wait(&pod, "web", "exec sessions", |c| c["exec_sessions"] == 2);
    assert!(c["exec_session_cpu_seconds"].as_f64().is_some_and(|s| s >= 0.0));
    let metrics = agent.metrics();
    assert_eq!(metric_line(&metrics, "lifecycle_exec_probe_processes_total", &pod, ""), Some(2.0));
    // Every family served (probes and containers tracked) is one the list names, which
    // docs/metrics.md documents.
    for served in metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = served.split_once(' ').expect("name and type");
        let listed = families::all().find(|f| f.name == name);
        assert_eq!(
            listed.map(|f| f.kind.as_str()),
            Some(kind),
            "{name} served as {kind}: not as export/families.rs lists it"
        );
    }

    // Stopping the container flips the probes from the kernel's exit event.
    h.stop_container(&id, 5).expect("stop");
    agent.wait(&pod, "web", "terminated", |c| state(c) == "terminated");
    let deadline = Instant::now() + Duration::from_secs(5);
    while probe("check=process").0 != "503" {
        assert!(Instant::now() < deadline, "process probe still passing after the exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(metric_line(&agent.metrics(), "lifecycle_probe_transitions_total", &pod, "").is_some_and(|n| n >= 1.0));
}
