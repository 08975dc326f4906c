//! Modern tier: the agent's verdicts against a current kubelet. A real node of Kubernetes 1.37
//! (etcd 3.5, kube-apiserver and kubelet v1.37 with ContainerRestartRules,
//! KubeletCrashLoopBackOffMax, RestartAllContainersOnContainerExits and ContainerStopSignals on,
//! `crashLoopBackOff.maxContainerRestartPeriod: 20s`; containerd 2.x and runc 1.3; the CNI
//! bridge) runs pods created with kubectl, and the agent beside it — started with the chart's
//! arguments (no back-off flags: it reads the kubelet's configuration and release itself),
//! watching the node's pods through the API — must judge each stop, exit and restart the way this
//! kubelet did it. The runtime's own record (containerd's `/tasks/exit` events, with
//! nanosecond exit times) is the ground truth where order matters.
//!
//! Each test owns a node of its own and checks at the end that the machine is as it was.
//!
//! Run: `xtask/x.sh test --tier modern` (provides the node's binaries once per machine and sets
//! `LIFECYCLE_KUBE_MODERN_BIN` / `LIFECYCLE_KUBE_MODERN_CNI`).

use std::time::{Duration, Instant};

use lifecycle_testkit::{
    agent::{
        view::{grace_s, judged, outcome, running},
        Agent,
    },
    browser,
    kube::{self, container_status, Kube, NodeVersion},
};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const SECOND: f64 = 1e9;
const TRAP_EXIT: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

/// Starts a 1.37 node and the agent beside it; `None` (printed) when the tier cannot run here.
fn start(test: &str) -> Option<(Kube, Agent)> {
    if let Some(reason) = kube::skip_reason_for(NodeVersion::V1_37) {
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    let kube = kube::start_or_skip_version(test, NodeVersion::V1_37)?;
    let t = kube.timings;
    eprintln!(
        "{test}: 1.37 node Ready in {:.1?} (etcd {:.1?}; containerd + image {:.1?}; kube-apiserver ready {:.1?}; \
         kubelet registered {:.1?}, Ready {:.1?})",
        t.total, t.etcd, t.containerd, t.apiserver, t.kubelet_registered, t.node_ready,
    );
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let agent = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            kube.node_name(),
            // No back-off flag: the agent reads the kubelet's crashLoopBackOff cap and gates.
            // Warnings as Events on the pods, as the DaemonSet runs it.
            "--events",
        ],
    );
    assert!(
        agent.metrics().contains("lifecycle_feature_enabled{feature=\"kubernetes_api\"} 1"),
        "the agent reaches the node's API server"
    );
    Some((kube, agent))
}

/// Stops the agent and the node, and asserts the machine is as it was before the node started.
fn stop_and_check_machine(kube: Kube, agent: Agent) {
    drop(agent);
    let before = kube.machine_before_start().clone();
    let began = Instant::now();
    let after = kube.stop();
    eprintln!("teardown {:.1?}", began.elapsed());
    assert_eq!(after, before, "the node left the machine changed");
}

fn apply(kube: &Kube, name: &str, script: &str, edit: impl FnOnce(&mut Value)) {
    let mut pod = kube.pod_manifest(name, &["sh", "-c", script]);
    edit(&mut pod);
    kube.apply(&pod.to_string()).unwrap_or_else(|e| panic!("apply {name}: {e:#}"));
}

#[test]
fn a_pod_runs_and_kubectl_delete_removes_it_judged_within_grace() {
    let Some((kube, agent)) = start("a_pod_runs_and_kubectl_delete_removes_it_judged_within_grace") else { return };
    apply(&kube, "sleeper", TRAP_EXIT, |p| p["spec"]["terminationGracePeriodSeconds"] = 5.into());
    let applied = Instant::now();
    let running_pod = kube
        .wait_pod("default", "sleeper", "Running with its container running", Duration::from_secs(60), |pod| {
            pod["status"]["phase"] == "Running"
                && container_status(pod, "app").is_some_and(|c| c["state"]["running"].is_object())
        })
        .expect("pod runs");
    eprintln!("apply -> Running in {:.1?}", applied.elapsed());
    let ip = running_pod["status"]["podIP"].as_str().unwrap_or_default();
    assert!(ip.starts_with("10.244."), "pod IP {ip:?}");
    // A 1.33+ kubelet reports the effective stop signal (the image has none: SIGTERM).
    eprintln!("container status: {}", container_status(&running_pod, "app").expect("status"));
    agent.wait_named("sleeper", "app", "running", Duration::from_secs(30), running);

    let container =
        container_status(&running_pod, "app").and_then(|c| c["containerID"].as_str()).unwrap_or_default().to_owned();
    let exits = kube.watch_task_exits().expect("ctr events");
    let deleted = Instant::now();
    kube.kubectl(&["delete", "pod", "sleeper", "--wait=false"]).expect("kubectl delete");
    let exit = exits.wait_for(&container, Duration::from_secs(20)).expect("the container exits");
    eprintln!("kubectl delete -> container exit (containerd) in {:.1?}: {exit:?}", exit.seen.duration_since(deleted));
    assert_eq!(exit.exit_status, 0, "the shell exited through its TERM trap: {exit:?}");

    let judged = agent.wait_named("sleeper", "app", "judged", Duration::from_secs(30), judged);
    assert_eq!(outcome(&judged), "exited_within_grace", "{judged:#}");
    assert_eq!(judged["last_termination"]["cause"], "deleted", "{judged:#}");
    assert_eq!(judged["last_termination"]["spec"], "api", "{judged:#}");
    assert_eq!(grace_s(&judged), 5.0, "{judged:#}");
    assert_eq!(judged["state"]["reason"], "Completed", "{judged:#}");
    let gone = kube.wait_pod_gone("default", "sleeper", kube::POD_REMOVAL).expect("pod is removed");
    eprintln!("kubectl delete -> pod gone from the API in {gone:.1?}");

    stop_and_check_machine(kube, agent);
}

/// The value of the one sample of `family` whose labels contain every one of `labels` in
/// the agent's `/metrics`, if there is one.
fn sample(metrics: &str, family: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{family}{{")) || line.starts_with(&format!("{family} ")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Waits (at most `within`) for a sample of `family` with `labels` whose value `settled` accepts (the agent reads
/// the kubelet when it sees it start, so an older value can stand for a moment) and returns
/// the last value seen when none did within `within`, for the caller's assertion to name.
fn wait_sample(agent: &Agent, family: &str, labels: &[&str], within: Duration, settled: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        let metrics = agent.metrics();
        let value = sample(&metrics, family, labels);
        if let Some(value) = value.filter(|v| settled(*v) || Instant::now() >= deadline) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "no {family} with {labels:?} within {within:?}:\n{}",
            metrics.lines().filter(|l| l.starts_with("lifecycle_kubelet")).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for the crash loop's restarts `from..=to` (numbered as the agent counts them) and
/// returns each one's judged back-off.
fn restarts(agent: &Agent, from: u64, to: u64, began: Instant) -> Vec<Value> {
    (from..=to)
        .map(|restart| {
            let c = agent.wait_named(
                "crasher",
                "app",
                &format!("restart {restart} judged"),
                Duration::from_secs(90),
                |c| c["last_backoff"]["restart_number"].as_u64().is_some_and(|n| n >= restart),
            );
            let backoff = c["last_backoff"].clone();
            eprintln!("restart {restart} at {:.1?}: {backoff}", began.elapsed());
            assert_eq!(backoff["restart_number"], restart, "each restart is judged: {c:#}");
            backoff
        })
        .collect()
}

fn expected_seconds(verdicts: &[Value]) -> Vec<f64> {
    verdicts.iter().map(|b| b["expected_delay_ns"].as_f64().unwrap_or(-1.0) / SECOND).collect()
}

/// Issue 40: the agent, started as the chart starts it, reads the kubelet's cap (20 s) and
/// judges a crash loop by it; the kubelet then restarts with no cap (an operator's edit), the
/// agent reads it again at the kubelet's start, and judges the loop's next restarts by the
/// default back-off. `doctor` prints the release, cap and gates it read.
#[test]
fn a_crash_loop_backs_off_to_the_nodes_20s_maximum() {
    let Some((mut kube, agent)) = start("a_crash_loop_backs_off_to_the_nodes_20s_maximum") else { return };
    // What the agent believes about its kubelet, before any pod.
    let info = ["version=\"v1.37.2\"", "cgroup_driver=\"cgroupfs\"", "source=\"node\"", "backoff=\"known\""];
    assert_eq!(wait_sample(&agent, "lifecycle_kubelet_info", &info, Duration::from_secs(30), |_| true), 1.0);
    let metrics = agent.metrics();
    assert_eq!(sample(&metrics, "lifecycle_kubelet_backoff_seconds", &["bound=\"initial\""]), Some(10.0));
    assert_eq!(sample(&metrics, "lifecycle_kubelet_backoff_seconds", &["bound=\"max\""]), Some(20.0));
    for gate in kube::MODERN_FEATURE_GATES {
        let label = format!("gate=\"{gate}\"");
        assert_eq!(sample(&metrics, "lifecycle_kubelet_feature_gate_enabled", &[&label]), Some(1.0), "{gate}");
    }
    let decay = ["gate=\"ReduceDefaultCrashLoopBackOffDecay\""];
    assert_eq!(sample(&metrics, "lifecycle_kubelet_feature_gate_enabled", &decay), Some(0.0));
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let doctor = std::process::Command::new(AGENT)
        .args(["doctor", "--no-load", "--kubeconfig", &kubeconfig, "--node-name", kube.node_name()])
        .output()
        .expect("run doctor");
    let report = String::from_utf8_lossy(&doctor.stdout);
    let line = report.lines().find(|l| l.split_whitespace().nth(1) == Some("kubelet")).unwrap_or_default();
    eprintln!("doctor: {line}");
    assert!(line.starts_with("ok"), "{report}");
    for said in [
        "v1.37.2 (Node object)",
        "back-off 10s doubling to 20s (crashLoopBackOff.maxContainerRestartPeriod 20s)",
        "KubeletCrashLoopBackOffMax=on (configured)",
        "ContainerStopSignals=on (configured)",
        "ReduceDefaultCrashLoopBackOffDecay=off (release default)",
        "read from node",
    ] {
        assert!(line.contains(said), "{said:?} not in {line}");
    }
    assert!(line.contains(&kube.kubelet_config_path().to_string_lossy().into_owned()), "{line}");

    apply(&kube, "crasher", "sleep 0.5; exit 3", |_| {});
    let applied = Instant::now();
    // The kubelet's own record of the back-off: its BackOff event. (The API's container state
    // shows waiting/CrashLoopBackOff only when a pod sync happens to run during a back-off: a
    // 1.37 pod worker re-queues a backing-off pod for when the back-off ends, so the state often
    // goes from terminated straight to running. See docs/kubelet-behaviour.md.)
    let backoff_event = || {
        kube.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=crasher,reason=BackOff",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap_or_default()
    };
    kube.wait_pod("default", "crasher", "backing off (a BackOff event)", Duration::from_secs(90), |_| {
        !backoff_event().trim().is_empty()
    })
    .expect("BackOff event");
    let message = backoff_event();
    eprintln!("apply -> BackOff event in {:.1?}: {message}", applied.elapsed());
    assert!(message.starts_with("Back-off restarting failed container app in pod crasher_default"), "{message}");
    let crashing = kube.pod("default", "crasher").expect("get").expect("exists");
    let status = container_status(&crashing, "app").expect("container status");
    eprintln!("container status: {status}");
    assert!(status["restartCount"].as_u64().unwrap_or_default() >= 1, "{status}");
    let last = &status["lastState"]["terminated"];
    assert_eq!((&last["exitCode"], &last["reason"]), (&3.into(), &"Error".into()), "{status}");
    assert_eq!(crashing["status"]["phase"], "Running", "a restarting pod stays Running");
    // The agent, which sees the exit and knows the back-off, says so at once.
    agent.wait_named("crasher", "app", "in CrashLoopBackOff", Duration::from_secs(60), |c| {
        c["state"]["reason"] == "CrashLoopBackOff"
    });

    // Restarts: at once, then 10 s, then 20 s, then 20 s again (the node's cap; the default cap
    // would make it 40 s). The fourth restart's verdict tells the agent read the node's cap.
    let verdicts = restarts(&agent, 1, 4, applied);
    assert_eq!(expected_seconds(&verdicts), [0.0, 10.0, 20.0, 20.0], "the node's 20 s cap: {verdicts:#?}");
    for backoff in &verdicts {
        assert_eq!(backoff["verdict"], "within_tolerance", "{backoff:#}");
    }
    let pod = kube.pod("default", "crasher").expect("get").expect("exists");
    let reported = container_status(&pod, "app").expect("status")["restartCount"].as_u64().expect("count");
    assert!(reported >= 4, "the kubelet counts its restarts too ({reported})");

    // The operator drops the cap and restarts the kubelet (as an upgrade would): the kubelet
    // backs off by the default again, 10 s doubling to 300 s, from a fresh entry.
    kube.edit_kubelet_config(|config| {
        config.as_object_mut().map(|c| c.remove("crashLoopBackOff"));
    })
    .expect("edit the kubelet's configuration");
    let restarted = kube.restart_kubelet().expect("the kubelet restarts");
    eprintln!("kubelet restarted without a cap; Ready again in {restarted:.1?}");
    assert_eq!(
        wait_sample(&agent, "lifecycle_kubelet_backoff_seconds", &["bound=\"max\""], Duration::from_secs(30), |max| {
            max != 20.0
        }),
        300.0,
        "the agent read the restarted kubelet's configuration"
    );
    let reads = sample(&agent.metrics(), "lifecycle_kubelet_config_reads_total", &["result=\"read\""]);
    assert!(reads.is_some_and(|n| n >= 2.0), "read at the agent's start and at the kubelet's: {reads:?}");
    // The new kubelet has no back-off entry: the next restart comes at its first sync, then
    // 10 s, 20 s and 40 s after each exit: the fourth is where a 20 s cap would have judged it
    // too late.
    let after = restarts(&agent, 5, 8, applied);
    assert_eq!(after[0]["entry_reset"], true, "the kubelet's entry went with it: {:#}", after[0]);
    assert_eq!(expected_seconds(&after), [0.0, 10.0, 20.0, 40.0], "the default back-off: {after:#?}");
    for backoff in &after {
        assert_eq!(backoff["verdict"], "within_tolerance", "{backoff:#}");
    }

    stop_and_check_machine(kube, agent);
}

/// Issue 19: stops the kubelet starts itself, named with the grace it used. A forced deletion
/// (`--grace-period=0 --force`: the object is gone at once, the kubelet still stops the
/// container with its 2 s floor) is `deleted`; a pod past `activeDeadlineSeconds` is
/// `deadline_exceeded` with the pod's grace. Both apps ignore TERM, so the SIGKILL decides the
/// outcome: after the grace (`sigkilled_after_grace`), or before it ran out (`sigkilled_early`,
/// the runtime's doing, with its sender).
#[test]
fn a_forced_deletion_and_an_active_deadline_are_named_with_the_grace_used() {
    let Some((kube, agent)) = start("a_forced_deletion_and_an_active_deadline_are_named_with_the_grace_used") else {
        return;
    };
    const IGNORE_TERM: &str = "trap '' TERM; while true; do sleep 0.2; done";
    apply(&kube, "forced", IGNORE_TERM, |p| p["spec"]["terminationGracePeriodSeconds"] = 30.into());
    apply(&kube, "deadline", IGNORE_TERM, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 3.into();
        p["spec"]["activeDeadlineSeconds"] = 8.into();
    });
    for name in ["forced", "deadline"] {
        agent.wait_named(name, "app", "running", Duration::from_secs(60), running);
    }

    kube.kubectl(&["delete", "pod", "forced", "--grace-period=0", "--force", "--wait=false"]).expect("delete --force");
    let forced = agent.wait_named("forced", "app", "judged", Duration::from_secs(30), judged);
    let termination = &forced["last_termination"];
    eprintln!("forced deletion on 1.37: {termination}");
    assert_eq!(termination["cause"], "deleted", "{forced:#}");
    assert_eq!(termination["spec"], "api", "the deleted pod's spec, kept past its object: {forced:#}");
    assert_eq!(grace_s(&forced), 0.0, "the deletion's grace: {forced:#}");
    assert_eq!(termination["expected_kill_after_ns"].as_f64(), Some(2.0 * SECOND), "the kubelet's floor: {forced:#}");
    check_sigkill_story(&forced);

    let failed = kube
        .wait_pod("default", "deadline", "failed past its deadline", Duration::from_secs(60), |pod| {
            pod["status"]["reason"] == "DeadlineExceeded"
        })
        .expect("DeadlineExceeded");
    assert_eq!(failed["status"]["phase"], "Failed");
    let deadline = agent.wait_named("deadline", "app", "judged", Duration::from_secs(30), |c| {
        judged(c) && c["last_termination"]["cause"] != "runtime_or_unknown"
    });
    let termination = &deadline["last_termination"];
    eprintln!("active deadline on 1.37: {termination}");
    assert_eq!(termination["cause"], "deadline_exceeded", "{deadline:#}");
    assert_eq!(grace_s(&deadline), 3.0, "the pod's grace: {deadline:#}");
    check_sigkill_story(&deadline);

    stop_and_check_machine(kube, agent);
}

/// Issue 20: "why did my pod die?" in one command. A shell entrypoint that runs its app as a
/// child (kubernetes#119884, #67126): PID 1 `sh` gets the TERM (and, as a namespace's init
/// without a handler, ignores it), `sleep` never gets it, and both are SIGKILLed at the grace.
/// `lifecycle-agent explain` says so, with the sender, the grace, the cause and who was alive.
#[test]
fn explain_tells_a_shell_entrypoint_kept_sigterm_from_its_child() {
    let Some((kube, agent)) = start("explain_tells_a_shell_entrypoint_kept_sigterm_from_its_child") else {
        return;
    };
    apply(&kube, "shell", "sleep 100000; true", |p| p["spec"]["terminationGracePeriodSeconds"] = 2.into());
    agent.wait_named("shell", "app", "running", Duration::from_secs(60), running);
    // The shell's child must be running before the stop: find it (its host pid) by name.
    let pod = kube.pod("default", "shell").expect("get").expect("exists");
    let id = container_id(&pod, "app");
    let began = Instant::now();
    let sleep_pid = loop {
        let found = std::fs::read_dir("/proc").expect("/proc").flatten().find_map(|entry| {
            let dir = entry.path();
            let is_sleep = std::fs::read_to_string(dir.join("comm")).is_ok_and(|comm| comm.trim() == "sleep")
                && std::fs::read_to_string(dir.join("cgroup")).is_ok_and(|cgroup| cgroup.contains(&id));
            is_sleep.then(|| entry.file_name().to_string_lossy().into_owned())
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "the shell's sleep runs");
        std::thread::sleep(Duration::from_millis(50));
    };
    kube.kubectl(&["delete", "pod", "shell", "--wait=false"]).expect("delete");
    agent.wait_named("shell", "app", "judged", Duration::from_secs(30), judged);

    let explain = |format: &str| {
        let output = std::process::Command::new(AGENT)
            .args(["explain", "default/shell", "--server", &agent.addr, "-o", format])
            .output()
            .expect("run explain");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let text = explain("text");
    eprintln!("{text}");
    let stories: Value = serde_json::from_str(&explain("json")).expect("explain -o json");
    let story = &stories[0];
    assert_eq!(story["container"], "app", "{stories:#}");
    assert_eq!(story["cause"], "deleted", "{stories:#}");
    let verdict = story["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace"), "{verdict}");
    // The child is named as it was exec'ed: busybox runs its applets again through
    // /proc/self/exe (`exe`) and renames itself after (`sleep` in /proc), which the kernel's exec
    // record does not see. Its pid is what identifies it.
    let child = format!("(pid {sleep_pid}) never got it");
    assert!(
        verdict.contains("PID 1 `sh` got SIGTERM and did not pass it on: `") && verdict.ends_with(&child),
        "{verdict}"
    );
    let lines: Vec<&str> =
        story["timeline"].as_array().expect("timeline").iter().filter_map(|l| l["text"].as_str()).collect();
    let kill = lines.iter().find(|l| l.starts_with("SIGKILL from")).expect("a SIGKILL line");
    assert!(kill.starts_with("SIGKILL from the container runtime; alive: PID 1 `sh`"), "{kill}");
    assert!(kill.contains(&format!("(pid {sleep_pid}), up ")), "{kill}");
    assert!(lines.contains(&"SIGTERM to PID 1 from the container runtime"), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("stopped because: deleted; grace 2.0s")), "{lines:#?}");
    assert!(text.contains(&format!("never got it: `exe` (pid {sleep_pid})")), "{text}");

    // The page a person opens: the pod's stop on one axis, the grace window shaded and the
    // SIGKILL at its end with who was alive, its cause from the API (the README's picture).
    if std::path::Path::new(browser::CHROMIUM).exists() {
        let dir = std::env::temp_dir().join(format!("lifecycle-explain-shell-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let url = format!("http://{}/explain/default/shell", agent.addr);
        let dom = browser::chromium(&dir, &url, "--dump-dom");
        assert!(dom.contains("<rect class=\"grace\""), "the grace window: {dom}");
        assert!(dom.contains("cause: deleted"), "the cause the API told: {dom}");
        assert!(dom.contains(&format!("(pid {sleep_pid})")), "who was alive at the SIGKILL: {dom}");
        browser::screenshot(&dir, &url);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // The Event on the pod says the same, and where the timeline is.
    let began = Instant::now();
    let event = loop {
        let message = kube
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=shell,reason=GracePeriodExceeded",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .unwrap_or_default();
        if !message.trim().is_empty() {
            break message;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "a GracePeriodExceeded Event on the pod");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        event.contains(&format!(
            "PID 1 `sh` got the stop signal and did not pass it on: `exe` (pid {sleep_pid}) never got it"
        )) && event.contains("stopped because: deleted")
            && event.ends_with("(timeline: lifecycle-agent explain default/shell)"),
        "{event}"
    );

    // Once the pod is gone, the node's history still answers, with the same verdict.
    kube.wait_pod_gone("default", "shell", kube::POD_REMOVAL).expect("the pod is removed");
    let output = std::process::Command::new(AGENT)
        .args(["explain", "default/shell", "--all-instances", "--server", &agent.addr, "-o", "json"])
        .output()
        .expect("run explain --all-instances");
    assert!(output.status.success(), "{output:?}");
    let past: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(past[0]["verdict"], story["verdict"], "{past:#}");
    // And the verdict log wrote the stop once, with the API's facts and the same words.
    let began = Instant::now();
    let logged = loop {
        let lines: Vec<Value> =
            agent.verdict_lines().into_iter().filter(|l| l["pod"] == "shell" && l["container"] == "app").collect();
        if !lines.is_empty() {
            break lines;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "the verdict is logged");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(logged.len(), 1, "once: {logged:#?}");
    let line = &logged[0];
    assert_eq!((&line["msg"], &line["verdict"]), (&"verdict".into(), &story["verdict"]), "{line:#}");
    assert_eq!(line["last_termination"]["cause"], "deleted", "{line:#}");
    assert_eq!(line["last_termination"]["outcome"]["kind"], "sigkilled_after_grace", "{line:#}");
    let alive: Vec<&Value> =
        line["last_termination"]["scene"]["alive_at_kill"].as_array().expect("alive_at_kill").iter().collect();
    assert_eq!(alive.len(), 2, "{line:#}");
    assert_eq!(alive[1]["pid"].to_string(), sleep_pid, "{line:#}");

    stop_and_check_machine(kube, agent);
}

/// Issue 19: an eviction through the Eviction API (what `kubectl drain` does) is `evicted`, from
/// the `DisruptionTarget` condition (reason `EvictionByEvictionAPI`) the API server sets, with
/// the pod's grace.
#[test]
fn an_eviction_through_the_eviction_api_is_named_with_the_pods_grace() {
    let Some((kube, agent)) = start("an_eviction_through_the_eviction_api_is_named_with_the_pods_grace") else {
        return;
    };
    apply(&kube, "evictee", TRAP_EXIT, |p| p["spec"]["terminationGracePeriodSeconds"] = 4.into());
    agent.wait_named("evictee", "app", "running", Duration::from_secs(60), running);
    let eviction = serde_json::json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "evictee", "namespace": "default"},
    });
    let path = kube.run_dir().join("eviction.json");
    std::fs::write(&path, eviction.to_string()).expect("write the eviction");
    kube.kubectl(&[
        "create",
        "--raw",
        "/api/v1/namespaces/default/pods/evictee/eviction",
        "-f",
        &path.to_string_lossy(),
    ])
    .expect("POST pods/evictee/eviction");
    let evicted = agent.wait_named("evictee", "app", "judged", Duration::from_secs(30), judged);
    let termination = &evicted["last_termination"];
    eprintln!("eviction API on 1.37: {termination}");
    assert_eq!(termination["cause"], "evicted", "{evicted:#}");
    assert_eq!(grace_s(&evicted), 4.0, "the pod's grace: {evicted:#}");
    assert_eq!(outcome(&evicted), "exited_within_grace", "the app's TERM trap: {evicted:#}");

    stop_and_check_machine(kube, agent);
}

/// Issue 19: RestartAllContainers (beta 1.36). The `app` container's rule restarts every
/// container of the pod when it exits 42: the kubelet stops `helper` (running), re-runs both, and
/// sets the condition `AllContainersRestarting` meanwhile. The agent names `helper`'s stop
/// `restart_all_containers` and claims no back-off deviation for either restart.
#[test]
fn restart_all_containers_names_the_stop_and_claims_no_backoff_deviation() {
    let Some((kube, agent)) = start("restart_all_containers_names_the_stop_and_claims_no_backoff_deviation") else {
        return;
    };
    // `app` exits 42 once (its first run leaves a mark in an emptyDir), then runs.
    let app = "if [ -e /data/ran ]; then exec sleep 100000; fi; touch /data/ran; sleep 2; exit 42";
    apply(&kube, "together", app, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 3.into();
        p["spec"]["volumes"] = serde_json::json!([{"name": "data", "emptyDir": {}}]);
        let container = &mut p["spec"]["containers"][0];
        container["volumeMounts"] = serde_json::json!([{"name": "data", "mountPath": "/data"}]);
        container["restartPolicy"] = "Never".into();
        container["restartPolicyRules"] =
            serde_json::json!([{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]);
        let mut helper = container.clone();
        helper["name"] = "helper".into();
        helper["command"] = serde_json::json!(["sh", "-c", TRAP_EXIT]);
        helper.as_object_mut().expect("object").remove("restartPolicy");
        helper.as_object_mut().expect("object").remove("restartPolicyRules");
        p["spec"]["containers"].as_array_mut().expect("containers").push(helper);
    });
    let helper =
        agent.wait_named("together", "helper", "stopped by the restart of all", Duration::from_secs(90), |c| {
            judged(c) && c["last_termination"]["cause"] != "runtime_or_unknown"
        });
    let termination = &helper["last_termination"];
    eprintln!("RestartAllContainers on 1.37, helper: {termination}");
    assert_eq!(termination["cause"], "restart_all_containers", "{helper:#}");
    assert_eq!(outcome(&helper), "exited_within_grace", "its TERM trap: {helper:#}");
    // Both run again; neither restart is called off the back-off.
    for container in ["app", "helper"] {
        let c = agent.wait_named("together", container, "running again", Duration::from_secs(60), |c| {
            running(c) && !c["last_backoff"].is_null()
        });
        eprintln!("{container} restart: {}", c["last_backoff"]);
        assert_ne!(c["last_backoff"]["verdict"], "too_early", "{c:#}");
        assert_ne!(c["last_backoff"]["verdict"], "too_late", "{c:#}");
    }

    stop_and_check_machine(kube, agent);
}

/// A TERM-ignoring app's stop ends in a SIGKILL from the runtime; whether it came after the
/// grace or before it ran out, the outcome says which and agrees with its own numbers.
fn check_sigkill_story(c: &Value) {
    let outcome = &c["last_termination"]["outcome"];
    assert_eq!(outcome["sender"]["kind"], "runtime", "{c:#}");
    let stop_to_kill = outcome["stop_to_kill_ns"].as_f64().expect("stop_to_kill_ns");
    let due = outcome["expected_kill_after_ns"].as_f64().expect("expected_kill_after_ns");
    match outcome["kind"].as_str() {
        Some("sigkilled_early") => assert!(stop_to_kill < due, "{c:#}"),
        Some("sigkilled_after_grace") => assert!(stop_to_kill >= due - 0.5 * SECOND, "{c:#}"),
        other => panic!("a SIGKILL outcome, not {other:?}: {c:#}"),
    }
    assert_eq!(c["state"]["signal"], 9, "{c:#}");
}

/// Issue 20: `status` takes kubectl's filters. On the running `sidecars` pod (containers
/// `first`, `second`, `app` with containerd ids `ids` in that order): a pod's rows sorted by
/// container with the wide columns, one container by name as JSON and YAML, another namespace
/// without them.
fn status_filters_select_what_kubectl_users_expect(agent: &Agent, ids: &[String]) {
    let status = |args: &[&str]| {
        let output = std::process::Command::new(AGENT)
            .arg("status")
            .args(args)
            .args(["--server", &agent.addr])
            .output()
            .expect("run status");
        assert!(output.status.success(), "status {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let wide = status(&["default/sidecars", "-o", "wide"]);
    eprintln!("{wide}");
    let rows: Vec<Vec<&str>> =
        wide.lines().take_while(|l| !l.is_empty()).skip(1).map(|l| l.split_whitespace().collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[2]).collect();
    assert_eq!(names, ["app", "first", "second"], "one pod's rows, sorted by container: {wide}");
    for (row, id) in rows.iter().zip([&ids[2], &ids[0], &ids[1]]) {
        assert!(row.contains(&&id[..13]) && row[3] == "Running", "the short id of {}: {wide}", row[2]);
    }
    assert!(wide.lines().next().is_some_and(|h| h.contains("CONTAINER ID") && h.contains("POD UID")), "{wide}");
    let json: Value = serde_json::from_str(&status(&["sidecars", "-n", "default", "-c", "second", "-o", "json"]))
        .expect("status -o json");
    let containers = json["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{json:#}");
    assert_eq!(
        (&containers[0]["container"], &containers[0]["container_id"]),
        (&"second".into(), &ids[1].clone().into())
    );
    let yaml = status(&["default/sidecars", "-c", "first", "-o", "yaml"]);
    assert!(yaml.contains("container: first") && !yaml.contains("container: second"), "{yaml}");
    let elsewhere: Value = serde_json::from_str(&status(&["-n", "kube-system", "-o", "json"])).expect("status -o json");
    assert!(
        elsewhere["containers"].as_array().expect("containers").iter().all(|c| c["namespace"] == "kube-system"),
        "{elsewhere:#}"
    );
}

/// The containerd id (without `containerd://`) the API reports for `container` of `pod`.
fn container_id(pod: &Value, container: &str) -> String {
    let id = container_status(pod, container).and_then(|c| c["containerID"].as_str()).unwrap_or_default();
    id.trim_start_matches("containerd://").to_owned()
}

#[test]
fn native_sidecars_start_in_order_and_stop_after_the_main_container_in_reverse() {
    let Some((kube, agent)) = start("native_sidecars_start_in_order_and_stop_after_the_main_container_in_reverse")
    else {
        return;
    };
    let sidecar = |name: &str| {
        serde_json::json!({
            "name": name, "image": kube::IMAGE, "imagePullPolicy": "Never",
            "restartPolicy": "Always", "command": ["sh", "-c", TRAP_EXIT],
        })
    };
    apply(&kube, "sidecars", TRAP_EXIT, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 10.into();
        p["spec"]["initContainers"] = serde_json::json!([sidecar("first"), sidecar("second")]);
    });
    let pod = kube
        .wait_pod("default", "sidecars", "Running with every container running", Duration::from_secs(60), |pod| {
            ["first", "second", "app"]
                .iter()
                .all(|c| container_status(pod, c).is_some_and(|s| s["state"]["running"].is_object()))
        })
        .expect("pod runs");
    assert!(kube::condition_is_true(&pod, "Initialized"), "sidecars started count as initialised: {:#}", pod["status"]);
    // Start order, from the agent's kernel clock (the API's startedAt has 1 s resolution): the
    // kubelet starts each sidecar only once the previous one has started, the main container last.
    let started: Vec<u64> = ["first", "second", "app"]
        .iter()
        .map(|c| {
            let view = agent.wait_named("sidecars", c, "running", Duration::from_secs(30), running);
            assert_eq!(view["sidecar"], *c != "app", "{view:#}");
            view["state"]["started_at_boot_ns"].as_u64().expect("started_at_boot_ns")
        })
        .collect();
    eprintln!(
        "started (boottime ns): first {}, second +{:.3} s, app +{:.3} s",
        started[0],
        (started[1] - started[0]) as f64 / SECOND,
        (started[2] - started[0]) as f64 / SECOND
    );
    assert!(started[0] < started[1] && started[1] < started[2], "start order first, second, app: {started:?}");

    let ids: Vec<String> = ["first", "second", "app"].iter().map(|c| container_id(&pod, c)).collect();
    status_filters_select_what_kubectl_users_expect(&agent, &ids);
    let exits = kube.watch_task_exits().expect("ctr events");
    kube.kubectl(&["delete", "pod", "sidecars", "--wait=false"]).expect("kubectl delete");
    let exited: Vec<u128> = ids
        .iter()
        .map(|id| {
            let exit = exits.wait_for(id, Duration::from_secs(30)).expect("the container exits");
            assert_eq!(exit.exit_status, 0, "each exits through its TERM trap: {exit:?}");
            exit.exited_at_ns.expect("exit time")
        })
        .collect();
    eprintln!(
        "exits after app's: second +{:.3} s, first +{:.3} s",
        (exited[1] as f64 - exited[2] as f64) / SECOND,
        (exited[0] as f64 - exited[2] as f64) / SECOND
    );
    // The runtime's truth: the main container first, then the sidecars in reverse order.
    assert!(exited[2] < exited[1] && exited[1] < exited[0], "stop order app, second, first: {exited:?}");

    let app = agent.wait_named("sidecars", "app", "judged", Duration::from_secs(30), judged);
    assert_eq!(outcome(&app), "exited_within_grace", "{app:#}");
    assert_eq!(app["last_termination"]["cause"], "deleted", "{app:#}");
    assert_eq!(grace_s(&app), 10.0, "{app:#}");
    for name in ["second", "first"] {
        let c = agent.wait_named("sidecars", name, "judged in its turn", Duration::from_secs(30), |c| {
            judged(c) && !c["sidecar_order"].is_null()
        });
        eprintln!("{name}: {} grace {:.1} s, order {}", outcome(&c), grace_s(&c), c["sidecar_order"]["verdict"]);
        assert_eq!(outcome(&c), "exited_within_grace", "{c:#}");
        assert_eq!(c["last_termination"]["cause"], "deleted", "{c:#}");
        assert_eq!(c["sidecar_order"]["verdict"]["kind"], "in_order", "{c:#}");
        // What was left of the pod's 10 s, as the kubelet gave it: less the whole seconds waited.
        let waited = c["last_termination"]["sidecar_turn"]["waited_ns"].as_f64().expect("its wait") / SECOND;
        assert_eq!(grace_s(&c), (10.0 - waited.floor()).max(2.0), "waited {waited:.3} s: {c:#}");
    }
    kube.wait_pod_gone("default", "sidecars", kube::POD_REMOVAL).expect("pod is removed");

    stop_and_check_machine(kube, agent);
}

/// Issue 40: a main container that ignores TERM outlives the pod's 4 s grace. The kubelet's wait
/// for the sidecar's turn ends with the grace (`waitForTurn`), and it stops the sidecar with the
/// 2 s floor while the runtime SIGKILLs the main container: the sidecar's TERM may land just
/// before that exit. Either way it is the kubelet's rule, and the sidecar's grace is 2 s.
#[test]
fn a_sidecar_is_stopped_at_the_deadline_when_the_main_container_outlives_the_grace() {
    let Some((kube, agent)) = start("a_sidecar_is_stopped_at_the_deadline_when_the_main_container_outlives_the_grace")
    else {
        return;
    };
    apply(&kube, "deadline-sidecar", "trap '' TERM; while true; do sleep 0.2; done", |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 4.into();
        p["spec"]["initContainers"] = serde_json::json!([{
            "name": "proxy", "image": kube::IMAGE, "imagePullPolicy": "Never",
            "restartPolicy": "Always", "command": ["sh", "-c", TRAP_EXIT],
        }]);
    });
    for c in ["proxy", "app"] {
        agent.wait_named("deadline-sidecar", c, "running", Duration::from_secs(60), running);
    }
    kube.kubectl(&["delete", "pod", "deadline-sidecar", "--wait=false"]).expect("kubectl delete");
    let app = agent.wait_named("deadline-sidecar", "app", "judged", kube::POD_STOPPED, judged);
    assert_eq!(outcome(&app), "sigkilled_after_grace", "{app:#}");
    assert_eq!(grace_s(&app), 4.0, "{app:#}");
    let proxy = agent.wait_named("deadline-sidecar", "proxy", "judged in its turn", Duration::from_secs(30), |c| {
        judged(c) && !c["sidecar_order"].is_null()
    });
    let verdict = proxy["sidecar_order"]["verdict"]["kind"].as_str().unwrap_or_default().to_owned();
    let stop_ns = proxy["last_termination"]["stop_signal"]["time_boot_ns"].as_f64().unwrap_or_default();
    let app_exit_ns = app["last_termination"]["exit_time_boot_ns"].as_f64().unwrap_or_default();
    eprintln!(
        "proxy: {verdict}, stop signal {:+.3} s from app's exit, grace {:.1} s, {}",
        (stop_ns - app_exit_ns) / SECOND,
        grace_s(&proxy),
        proxy["last_termination"]["sidecar_turn"]
    );
    assert!(["in_order", "at_grace_deadline"].contains(&verdict.as_str()), "the kubelet's rule: {proxy:#}");
    assert_eq!(outcome(&proxy), "exited_within_grace", "{proxy:#}");
    assert_eq!(grace_s(&proxy), 2.0, "the 2 s floor, not the pod's 4 s: {proxy:#}");
    kube.wait_pod_gone("default", "deadline-sidecar", kube::POD_REMOVAL).expect("pod is removed");

    stop_and_check_machine(kube, agent);
}

/// Issue 19: container stop signals (ContainerStopSignals; containerd 2.3+ applies them). One
/// pod, two containers that exit 0 only on their own signal and ignore SIGTERM: `app` with
/// `lifecycle.stopSignal: SIGUSR1`, `from-image` whose image says `STOPSIGNAL SIGUSR2`. The
/// kubelet reports each effective signal; on deletion the kernel saw the runtime send exactly
/// that signal, and the agent judges each stop as the configured signal's, within grace.
#[test]
fn stop_signals_from_the_pod_or_the_image_are_the_ones_the_kernel_saw() {
    let Some((kube, agent)) = start("stop_signals_from_the_pod_or_the_image_are_the_ones_the_kernel_saw") else {
        return;
    };
    const USR2_IMAGE: &str = "docker.io/library/lifecycle-busybox:stopsignal-usr2";
    kube.containerd().import_image_with_stop_signal(USR2_IMAGE, "SIGUSR2").expect("import the SIGUSR2 image");
    let exits_on = |signal: &str| format!("trap 'exit 0' {signal}; trap '' TERM; while true; do sleep 0.2; done");
    apply(&kube, "stopsig", &exits_on("USR1"), |p| {
        // A pod's stop signal is valid only with its OS named.
        p["spec"]["os"] = serde_json::json!({"name": "linux"});
        p["spec"]["terminationGracePeriodSeconds"] = 10.into();
        p["spec"]["containers"][0]["lifecycle"] = serde_json::json!({"stopSignal": "SIGUSR1"});
        let from_image = serde_json::json!({"name": "from-image", "image": USR2_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", exits_on("USR2")]});
        p["spec"]["containers"].as_array_mut().expect("containers").push(from_image);
    });
    let pod = kube
        .wait_pod("default", "stopsig", "both containers running", Duration::from_secs(60), |pod| {
            ["app", "from-image"]
                .iter()
                .all(|c| container_status(pod, c).is_some_and(|s| s["state"]["running"].is_object()))
        })
        .expect("pod runs");
    for (name, signal) in [("app", "SIGUSR1"), ("from-image", "SIGUSR2")] {
        let reported = container_status(&pod, name).expect("status");
        assert_eq!(reported["stopSignal"], signal, "the kubelet reports the runtime's effective signal: {reported:#}");
        agent.wait_named("stopsig", name, "running", Duration::from_secs(30), running);
    }
    kube.kubectl(&["delete", "pod", "stopsig", "--wait=false"]).expect("kubectl delete");
    for (name, signal) in [("app", 10), ("from-image", 12)] {
        let c = agent.wait_named("stopsig", name, "judged", Duration::from_secs(30), judged);
        eprintln!("{name}: {} stop signal {}", outcome(&c), c["last_termination"]["stop_signal"]);
        assert_eq!(outcome(&c), "exited_within_grace", "only its own signal ends it: {c:#}");
        assert_eq!(c["last_termination"]["cause"], "deleted", "{c:#}");
        let stop = &c["last_termination"]["stop_signal"];
        assert_eq!(stop["signal"], signal, "the signal the kernel saw: {c:#}");
        assert_eq!(stop["sender"]["kind"], "runtime", "{c:#}");
        assert_eq!(stop["matches_configured"], true, "judged against the configured signal: {c:#}");
        assert_eq!(c["state"]["exit_code"], 0, "{c:#}");
    }
    kube.wait_pod_gone("default", "stopsig", kube::POD_REMOVAL).expect("pod is removed");
    stop_and_check_machine(kube, agent);
}

/// Issue 19: an in-place resize (GA 1.35) of memory with `resizePolicy: RestartContainer`. The
/// kubelet stops the container (Event `Killing`: "Container app resize requires restart") and
/// starts it again at once with the new limits: the agent names the stop `resize`, judges it
/// against the pod's grace, and the restart as expected, not as a crash held by back-off.
#[test]
fn a_resize_that_restarts_the_container_is_named_resize() {
    let Some((kube, agent)) = start("a_resize_that_restarts_the_container_is_named_resize") else {
        return;
    };
    apply(&kube, "resized", TRAP_EXIT, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 6.into();
        p["spec"]["containers"][0]["resources"] = serde_json::json!({
            "requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}});
        p["spec"]["containers"][0]["resizePolicy"] = serde_json::json!([
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
    });
    agent.wait_named("resized", "app", "running", Duration::from_secs(60), running);
    let resize = r#"{"spec":{"containers":[{"name":"app","resources":{"requests":{"memory":"48Mi"},"limits":{"memory":"96Mi"}}}]}}"#;
    kube.kubectl(&["patch", "pod", "resized", "--subresource", "resize", "--patch", resize]).expect("resize");
    let pod = kube
        .wait_pod("default", "resized", "restarted with the new limit", Duration::from_secs(60), |pod| {
            container_status(pod, "app").is_some_and(|s| {
                s["restartCount"] == 1
                    && s["state"]["running"].is_object()
                    && s["resources"]["limits"]["memory"] == "96Mi"
            })
        })
        .expect("the resize restarts the container");
    let reported = container_status(&pod, "app").expect("status");
    assert_eq!(reported["lastState"]["terminated"]["exitCode"], 0, "the TERM trap: {reported:#}");
    let c = agent.wait_named("resized", "app", "the restart judged", Duration::from_secs(30), |c| {
        judged(c) && c["restart_count"] == 1 && c["state"]["state"] == "running" && !c["last_backoff"].is_null()
    });
    eprintln!("resize on 1.37: {} / {}", c["last_termination"], c["last_backoff"]);
    assert_eq!(c["last_termination"]["cause"], "resize", "{c:#}");
    assert_eq!(outcome(&c), "exited_within_grace", "{c:#}");
    assert_eq!(grace_s(&c), 6.0, "the pod's grace: {c:#}");
    assert_eq!(c["last_backoff"]["verdict"], "within_tolerance", "restarted at once, as expected: {c:#}");
    assert_eq!(c["last_backoff"]["expected_delay_ns"], 0, "{c:#}");
    assert!(c["disagreements"].as_array().is_some_and(Vec::is_empty), "{c:#}");
    // The pod beside the kernel's view: the API's conditions and the generation the kubelet acted
    // on (the resize bumped it), once it reported the restart.
    let began = Instant::now();
    let view = loop {
        let view = agent_pods(&agent).into_iter().find(|p| p["pod"] == "resized").expect("the pod's view");
        let api = &view["api_status"];
        if api["generation"].as_i64().is_some_and(|g| g >= 2) && api["observed_generation"] == api["generation"] {
            break view;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "observedGeneration catches up: {view:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("resized pod: kernel {} / API {}", view["conditions"], view["api_status"]);
    assert_eq!(view["conditions"]["ready_to_start_containers"], true, "{view:#}");
    assert_eq!(view["api_status"]["ready_to_start_containers"], true, "the same as the kubelet's: {view:#}");
    assert_eq!(view["conditions"]["initialized"], view["api_status"]["initialized"], "{view:#}");
    assert_eq!(view["phase"], view["api_phase"], "{view:#}");
    stop_and_check_machine(kube, agent);
}

/// Issues 19 and 20: which memory limit an OOM kill answered. `podlimit` has only a pod-level
/// memory limit (PodLevelResources, beta and on in 1.37); `ctrlimit` a container limit under its
/// pod's. PID 1 of each grows until the OOM killer takes it. The agent says the pod's limit
/// fired for the first and the container's for the second, as the kernel's own `oom-kill:` line
/// says (read here with `dmesg`), and `explain` says it in words.
#[test]
fn an_oom_kill_says_whether_the_pods_or_the_containers_limit_fired() {
    let Some((kube, agent)) = start("an_oom_kill_says_whether_the_pods_or_the_containers_limit_fired") else {
        return;
    };
    assert!(agent.metrics().contains("lifecycle_feature_enabled{feature=\"oom_log\"} 1"), "the kernel log is read");
    let grow = "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done";
    apply(&kube, "podlimit", grow, |p| {
        p["spec"]["restartPolicy"] = "Never".into();
        p["spec"]["resources"] = serde_json::json!({"limits": {"memory": "48Mi"}});
    });
    apply(&kube, "ctrlimit", grow, |p| {
        p["spec"]["restartPolicy"] = "Never".into();
        p["spec"]["resources"] = serde_json::json!({"limits": {"memory": "96Mi"}});
        p["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"memory": "32Mi"}});
    });
    for (pod, scope, words) in [
        ("podlimit", "pod", "OOM-killed at the pod's memory limit, not the container's"),
        ("ctrlimit", "container", "OOM-killed at the container's memory limit"),
    ] {
        let c = agent.wait_named(pod, "app", "OOM-killed, with the limit", Duration::from_secs(60), |c| {
            c["state"]["state"] == "terminated" && !c["last_termination"]["oom_limit"].is_null()
        });
        let report = &c["last_termination"];
        eprintln!("{pod}: {} {}", report["oom_victim"], report["oom_limit"]);
        assert_eq!(report["oom_victim"], "init", "{c:#}");
        assert_eq!(report["oom_limit"]["scope"], scope, "{c:#}");
        let memcg = report["oom_limit"]["memcg"].as_str().expect("memcg");
        let pid = report["oom_limit"]["victim_pid"].as_u64().expect("victim pid");
        let dmesg = std::process::Command::new("dmesg").output().expect("dmesg");
        let log = String::from_utf8_lossy(&dmesg.stdout);
        let line = log.lines().rev().find(|l| l.contains("oom-kill:") && l.contains(&format!(",pid={pid},")));
        let line = line.unwrap_or_else(|| panic!("the kernel logged the kill of pid {pid}"));
        assert!(line.contains(&format!(",oom_memcg={memcg},")), "the kernel's line agrees: {line}");
        let explained = std::process::Command::new(AGENT)
            .args(["explain", &format!("default/{pod}"), "--server", &agent.addr, "-o", "json"])
            .output()
            .expect("run explain");
        assert!(explained.status.success(), "{explained:?}");
        let stories: Value = serde_json::from_slice(&explained.stdout).expect("JSON");
        let verdict = stories[0]["verdict"].as_str().unwrap_or_default();
        assert!(verdict.starts_with(words), "{stories:#}");
        let timeline = stories[0]["timeline"].to_string();
        assert!(timeline.contains(memcg), "the timeline names the cgroup: {stories:#}");
    }
    stop_and_check_machine(kube, agent);
}

/// `explain -o json` of `pod` from the agent beside the node: its stories.
fn explain_json(agent: &Agent, pod: &str) -> Value {
    let output = std::process::Command::new(AGENT)
        .args(["explain", &format!("default/{pod}"), "--server", &agent.addr, "-o", "json"])
        .output()
        .expect("run explain");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("explain -o json")
}

/// The text of each timeline line of a story.
fn timeline(story: &Value) -> Vec<String> {
    story["timeline"].as_array().into_iter().flatten().filter_map(|l| l["text"].as_str().map(str::to_owned)).collect()
}

/// Issue 20: `explain` on the real node for a preStop hook that overran the grace and for a
/// liveness kill, each of a TERM-ignoring app, each fact against what the test did: the cause,
/// the grace the kubelet used, the hook's start, the stop signal's sender, the SIGKILL and the
/// processes alive then.
#[test]
fn explain_tells_a_prestop_overrun_and_a_liveness_kill() {
    let Some((kube, agent)) = start("explain_tells_a_prestop_overrun_and_a_liveness_kill") else {
        return;
    };
    const IGNORE_TERM: &str = "trap '' TERM; while true; do sleep 0.2; done";
    apply(&kube, "overrun", IGNORE_TERM, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 4.into();
        p["spec"]["containers"][0]["lifecycle"] =
            serde_json::json!({"preStop": {"exec": {"command": ["sh", "-c", "sleep 30"]}}});
    });
    // restartPolicy Always: the kubelet then kills the container alone, with an Event naming
    // the probe. (Under Never it kills the whole pod and its Event says only "Stopping container":
    // docs/kubelet-behaviour.md.)
    apply(&kube, "unlively", IGNORE_TERM, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 3.into();
        p["spec"]["containers"][0]["livenessProbe"] = serde_json::json!({
            "exec": {"command": ["sh", "-c", "test -e /tmp/alive"]},
            "initialDelaySeconds": 2, "periodSeconds": 1, "failureThreshold": 1});
    });
    agent.wait_named("overrun", "app", "running", Duration::from_secs(60), running);
    kube.kubectl(&["delete", "pod", "overrun", "--wait=false"]).expect("delete");

    let overrun = agent.wait_named("overrun", "app", "judged", Duration::from_secs(40), judged);
    let stories = explain_json(&agent, "overrun");
    let story = &stories[0];
    let lines = timeline(story);
    eprintln!("overrun: {}\n  {}", story["verdict"], lines.join("\n  "));
    let report = &overrun["last_termination"];
    assert_eq!(story["cause"], "deleted", "{stories:#}");
    assert!(!report["pre_stop"].is_null(), "the hook was seen: {overrun:#}");
    assert!(lines.iter().any(|l| l == "preStop hook started"), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("stopped because: deleted; grace 4.0s")), "{lines:#?}");
    assert_eq!(outcome(&overrun), "sigkilled_after_grace", "the app ignores TERM: {overrun:#}");
    // The hook used the grace up: the kubelet's 2 s floor is what TERM got.
    assert_eq!(report["expected_kill_after_ns"].as_f64(), Some(2.0 * SECOND), "{overrun:#}");
    let verdict = story["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace"), "{verdict}");
    assert!(lines.iter().any(|l| l.starts_with("SIGTERM to PID 1 from the container runtime")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("SIGKILL from the container runtime; alive: PID 1 `sh`")), "{lines:#?}");

    let unlively = agent.wait_named("unlively", "app", "judged", Duration::from_secs(40), judged);
    let stories = explain_json(&agent, "unlively");
    let story = &stories[0];
    let lines = timeline(story);
    eprintln!("unlively: {}\n  {}", story["verdict"], lines.join("\n  "));
    assert_eq!(story["cause"], "liveness_probe", "{unlively:#}");
    assert_eq!(grace_s(&unlively), 3.0, "the pod's grace: {unlively:#}");
    assert_eq!(outcome(&unlively), "sigkilled_after_grace", "{unlively:#}");
    assert!(lines.iter().any(|l| l.starts_with("stopped because: liveness_probe; grace 3.0s")), "{lines:#?}");
    let verdict = story["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("SIGKILLed 3.0s after SIGTERM: it did not exit within its 3.0s grace"), "{verdict}");
    stop_and_check_machine(kube, agent);
}

/// Issue 19: an eviction the kubelet starts itself. A pod writes past its emptyDir's
/// `sizeLimit`; the kubelet's eviction manager evicts it (`status.reason: Evicted`; no
/// `DisruptionTarget` condition for this kind of eviction) with its grace override of 1 s, which
/// the runtime raises to its 2 s floor, whatever the pod's own grace (20 s here).
#[test]
fn an_eviction_by_the_kubelet_is_named_with_the_grace_it_used() {
    let Some((kube, agent)) = start("an_eviction_by_the_kubelet_is_named_with_the_grace_it_used") else {
        return;
    };
    let script = "dd if=/dev/zero of=/scratch/fill bs=1M count=8; trap '' TERM; while true; do sleep 0.2; done";
    apply(&kube, "hog", script, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 20.into();
        p["spec"]["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]);
        p["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([{"name": "scratch", "mountPath": "/scratch"}]);
    });
    let pod = kube
        .wait_pod("default", "hog", "evicted", Duration::from_secs(90), |pod| pod["status"]["reason"] == "Evicted")
        .expect("the kubelet evicts the pod");
    eprintln!("hog: {} / {}", pod["status"]["message"], pod["status"]["conditions"]);
    let c = agent.wait_named("hog", "app", "judged", Duration::from_secs(40), judged);
    let report = &c["last_termination"];
    eprintln!("hog: {report}");
    assert_eq!(report["cause"], "evicted", "{c:#}");
    // The eviction manager's override (1 s), not the pod's 20 s; the runtime's 2 s floor.
    assert_eq!(grace_s(&c), 1.0, "{c:#}");
    assert_eq!(report["expected_kill_after_ns"].as_f64(), Some(2.0 * SECOND), "{c:#}");
    assert_eq!(outcome(&c), "sigkilled_after_grace", "the app ignores TERM: {c:#}");
    check_sigkill_story(&c);
    let stories = explain_json(&agent, "hog");
    let lines = timeline(&stories[0]);
    eprintln!("hog: {}\n  {}", stories[0]["verdict"], lines.join("\n  "));
    assert!(
        lines.iter().any(|l| l == "stopped because: evicted; grace 1.0s (raised to the kubelet's 2.0s floor)"),
        "{lines:#?}"
    );
    stop_and_check_machine(kube, agent);
}

/// Issue 19: a native sidecar in a `restartPolicy: Never` pod. `proxy` crashes once (exit 1) and
/// the kubelet restarts it, as it restarts every sidecar whatever the pod's policy; `app` then
/// completes (exit 0) while `proxy` runs, the kubelet stops `proxy`, and the pod Succeeds.
#[test]
fn a_sidecar_restarts_in_a_never_pod_and_is_stopped_when_the_main_container_completes() {
    let Some((kube, agent)) =
        start("a_sidecar_restarts_in_a_never_pod_and_is_stopped_when_the_main_container_completes")
    else {
        return;
    };
    let proxy = format!("if [ -e /shared/crashed ]; then {TRAP_EXIT}; else touch /shared/crashed; sleep 1; exit 1; fi");
    apply(&kube, "withproxy", "sleep 6; exit 0", |p| {
        p["spec"]["restartPolicy"] = "Never".into();
        p["spec"]["terminationGracePeriodSeconds"] = 10.into();
        p["spec"]["volumes"] = serde_json::json!([{"name": "shared", "emptyDir": {}}]);
        p["spec"]["initContainers"] = serde_json::json!([{
            "name": "proxy", "image": kube::IMAGE, "imagePullPolicy": "Never", "restartPolicy": "Always",
            "command": ["sh", "-c", proxy], "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}]);
    });
    let pod = kube
        .wait_pod("default", "withproxy", "Succeeded", Duration::from_secs(90), |pod| {
            pod["status"]["phase"] == "Succeeded"
        })
        .expect("the pod completes");
    let reported = container_status(&pod, "proxy").expect("the sidecar's status");
    eprintln!("proxy as reported: {reported}");
    let proxy = agent.wait_named("withproxy", "proxy", "stopped after its restart", Duration::from_secs(30), |c| {
        c["restart_count"] == 1 && judged(c) && c["state"]["state"] == "terminated"
    });
    let app = agent.wait_named("withproxy", "app", "completed", Duration::from_secs(30), judged);
    eprintln!("proxy: {} / {}", proxy["last_termination"], proxy["last_backoff"]);
    eprintln!("app: {}", app["last_termination"]);
    let phase = agent_pods(&agent).into_iter().find(|p| p["pod"] == "withproxy").expect("the pod's view");
    eprintln!("pod: {phase}");
    assert_eq!(proxy["sidecar"], true, "{proxy:#}");
    assert_eq!(proxy["last_backoff"]["verdict"], "within_tolerance", "the crash's restart, expected: {proxy:#}");
    assert_eq!(reported["restartCount"], proxy["restart_count"], "{proxy:#}");
    assert_eq!(outcome(&app), "exited_without_stop_signal", "{app:#}");
    assert_eq!(app["state"]["exit_code"], 0, "{app:#}");
    assert_eq!(outcome(&proxy), "exited_within_grace", "stopped by the kubelet, its TERM trap: {proxy:#}");
    assert_eq!(phase["phase"], "Succeeded", "{phase:#}");
    assert_eq!(phase["api_phase"], "Succeeded", "{phase:#}");
    stop_and_check_machine(kube, agent);
}

#[test]
fn restart_rules_restart_a_never_pods_container_on_exit_42_and_not_on_1() {
    let Some((kube, agent)) = start("restart_rules_restart_a_never_pods_container_on_exit_42_and_not_on_1") else {
        return;
    };
    // The first run exits 42 (a rule says restart), the second exits 1 (no rule: the container's
    // own restartPolicy Never holds). An emptyDir keeps the marker across the restart.
    let script = "sleep 1; if [ -e /state/ran ]; then exit 1; fi; touch /state/ran; exit 42";
    apply(&kube, "rules", script, |p| {
        p["spec"]["restartPolicy"] = "Never".into();
        p["spec"]["volumes"] = serde_json::json!([{"name": "state", "emptyDir": {}}]);
        let app = &mut p["spec"]["containers"][0];
        app["volumeMounts"] = serde_json::json!([{"name": "state", "mountPath": "/state"}]);
        app["restartPolicy"] = "Never".into();
        app["restartPolicyRules"] =
            serde_json::json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
    });
    let failed = kube.wait_pod_phase("default", "rules", "Failed", Duration::from_secs(60)).expect("Failed");
    let status = container_status(&failed, "app").expect("status");
    eprintln!("container status: {status}");
    assert_eq!(status["restartCount"], 1, "restarted once, after the 42: {status}");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 42, "{status}");
    assert_eq!(status["state"]["terminated"]["exitCode"], 1, "{status}");

    let c = agent.wait_named("rules", "app", "ended after its restart", Duration::from_secs(30), |c| {
        c["restart_count"] == 1 && c["state"]["state"] == "terminated"
    });
    eprintln!("agent: restart {} state {} backoff {}", c["restart_count"], c["state"], c["last_backoff"]);
    // The restart after 42 was expected, at once (no back-off before a first restart).
    let backoff = &c["last_backoff"];
    assert_eq!(backoff["restart_number"], 1, "{c:#}");
    assert_eq!(backoff["verdict"], "within_tolerance", "{c:#}");
    assert_eq!(backoff["expected_delay_ns"], 0, "{c:#}");
    // After 1 nothing restarts it, and the agent does not wait for a restart.
    assert_eq!((&c["state"]["exit_code"], &c["state"]["reason"]), (&1.into(), &"Error".into()), "{c:#}");
    assert_eq!(c["restart_expected"], false, "exit 1 matches no rule: {c:#}");
    let pods = agent_pods(&agent);
    assert_eq!(pods.iter().find(|p| p["pod"] == "rules").map(|p| &p["phase"]), Some(&"Failed".into()), "{pods:#?}");

    stop_and_check_machine(kube, agent);
}

fn agent_pods(agent: &Agent) -> Vec<Value> {
    let (_, body) = lifecycle_testkit::agent::get(&agent.addr, "/api/v1/containers").expect("api");
    let value: Value = serde_json::from_str(&body).expect("JSON");
    value["pods"].as_array().cloned().unwrap_or_default()
}
