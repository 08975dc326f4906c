//! Kubelet tier, the agent's verdicts against a real kubelet: a real node (etcd, kube-apiserver
//! and kubelet v1.20.2, containerd + runc) runs pods created with kubectl, and the agent beside it
//! — watching the node's pods through the API with the node's kubeconfig — must judge each stop,
//! exit and restart the way the kubelet actually did it: the grace it used, the cause, the
//! reason, and where its reported status is wrong.
//!
//! Run: `xtask/x.sh test --tier kubelet`.

use std::time::{Duration, Instant};

use lifecycle_testkit::{
    agent::{
        get,
        view::{grace_s, judged, outcome, running},
        Agent,
    },
    kube::{self, container_status, Kube},
};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const SECOND: f64 = 1e9;
const TRAP_EXIT: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";
const IGNORE_TERM: &str = "trap '' TERM; while true; do sleep 0.2; done";

fn start(test: &str) -> Option<(Kube, Agent)> {
    if let Some(reason) = kube::skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    kube::sweep_stale();
    let kube = kube::start_or_skip(test)?;
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let agent = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &["--kubeconfig", &kubeconfig, "--node-name", kube.node_name()],
    );
    assert!(
        agent.metrics().contains("lifecycle_feature_enabled{feature=\"kubernetes_api\"} 1"),
        "the agent reaches the node's API server"
    );
    Some((kube, agent))
}

fn apply(kube: &Kube, name: &str, script: &str, edit: impl FnOnce(&mut Value)) {
    let mut pod = kube.pod_manifest(name, &["sh", "-c", script]);
    edit(&mut pod);
    kube.apply(&pod.to_string()).unwrap_or_else(|e| panic!("apply {name}: {e:#}"));
}

/// The agent's view of container `app` of pod `name`, once `done` holds (within `within`).
fn wait_agent(agent: &Agent, name: &str, what: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
    agent.wait_named(name, "app", what, within, done)
}

#[test]
fn stops_are_judged_with_the_grace_and_the_cause_the_kubelet_used() {
    let Some((kube, agent)) = start("stops_are_judged_with_the_grace_and_the_cause_the_kubelet_used") else {
        return;
    };
    apply(&kube, "graceful", TRAP_EXIT, |p| p["spec"]["terminationGracePeriodSeconds"] = 30.into());
    apply(&kube, "stubborn", IGNORE_TERM, |p| p["spec"]["terminationGracePeriodSeconds"] = 2.into());
    apply(&kube, "shortened", IGNORE_TERM, |p| p["spec"]["terminationGracePeriodSeconds"] = 30.into());
    apply(&kube, "prestop", TRAP_EXIT, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 5.into();
        p["spec"]["containers"][0]["lifecycle"] = serde_json::json!({"preStop": {"exec": {"command": ["sleep", "8"]}}});
    });
    for name in ["graceful", "stubborn", "shortened", "prestop"] {
        let c = wait_agent(&agent, name, "running", Duration::from_secs(60), running);
        assert_eq!(c["named_by_id"], false);
        // As a user would: delete once `kubectl get` shows it Running.
        kube.wait_pod_phase("default", name, "Running", Duration::from_secs(60)).expect("Running");
    }
    kube.kubectl(&["delete", "pod", "graceful", "stubborn", "prestop", "--wait=false"]).expect("delete");
    // Deleted with a grace shorter than the spec's: the kubelet stops it with 3 s, not 30.
    kube.kubectl(&["delete", "pod", "shortened", "--grace-period=3", "--wait=false"]).expect("delete");

    let graceful = wait_agent(&agent, "graceful", "judged", kube::POD_STOPPED, judged);
    assert_eq!(outcome(&graceful), "exited_within_grace", "{graceful:#}");
    assert_eq!(graceful["last_termination"]["cause"], "deleted");
    assert_eq!(graceful["last_termination"]["spec"], "api");
    assert_eq!(graceful["state"]["reason"], "Completed");

    let stubborn = wait_agent(&agent, "stubborn", "judged", kube::POD_STOPPED, judged);
    assert_eq!(outcome(&stubborn), "sigkilled_after_grace", "{stubborn:#}");
    assert_eq!(grace_s(&stubborn), 2.0);
    assert_eq!(stubborn["last_termination"]["outcome"]["sender"]["kind"], "runtime");
    assert_eq!((&stubborn["state"]["reason"], &stubborn["state"]["exit_code"]), (&"Error".into(), &137.into()));
    assert_eq!(stubborn["state"]["signal"], 9);

    let shortened = wait_agent(&agent, "shortened", "judged", kube::POD_STOPPED, judged);
    assert_eq!(outcome(&shortened), "sigkilled_after_grace", "{shortened:#}");
    assert_eq!(grace_s(&shortened), 3.0, "the deletion's grace, not the spec's 30 s");
    assert_eq!(shortened["last_termination"]["outcome"]["sender"]["kind"], "runtime");
    assert_eq!(shortened["last_termination"]["cause"], "deleted");

    let prestop = wait_agent(&agent, "prestop", "judged", kube::POD_STOPPED, judged);
    let hook = &prestop["last_termination"]["pre_stop"];
    assert_eq!(hook["overran_grace"], true, "preStop sleep 8 with grace 5: {prestop:#}");
    assert_eq!(prestop["last_termination"]["cause"], "deleted");
}

#[test]
fn exits_restarts_and_probe_kills_follow_the_pod_spec() {
    let Some((kube, agent)) = start("exits_restarts_and_probe_kills_follow_the_pod_spec") else { return };
    apply(&kube, "never", "sleep 1; exit 2", |p| p["spec"]["restartPolicy"] = "Never".into());
    apply(&kube, "onfailure", "sleep 1; exit 0", |p| p["spec"]["restartPolicy"] = "OnFailure".into());
    apply(&kube, "completion", "sleep 1; exit 0", |p| p["spec"]["restartPolicy"] = "Never".into());
    apply(&kube, "crash", "sleep 0.5; exit 1", |_| {});
    apply(&kube, "liveness", TRAP_EXIT, |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 10.into();
        p["spec"]["containers"][0]["livenessProbe"] = serde_json::json!({
            "exec": {"command": ["cat", "/tmp/healthy"]},
            "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 1
        });
    });

    let never = wait_agent(&agent, "never", "ended", Duration::from_secs(60), |c| c["state"]["state"] == "terminated");
    assert_eq!((&never["state"]["reason"], &never["state"]["exit_code"]), (&"Error".into(), &2.into()));
    assert_eq!(never["restart_expected"], false, "a Never pod that exited is final");
    let api = kube.wait_pod_phase("default", "never", "Failed", Duration::from_secs(30)).expect("Failed");
    assert_eq!(container_status(&api, "app").expect("status")["state"]["terminated"]["exitCode"], 2);

    let onfailure =
        wait_agent(&agent, "onfailure", "ended", Duration::from_secs(60), |c| c["state"]["state"] == "terminated");
    assert_eq!(onfailure["state"]["reason"], "Completed");
    assert_eq!(onfailure["restart_expected"], false, "OnFailure does not restart a success");

    let completion =
        wait_agent(&agent, "completion", "ended", Duration::from_secs(60), |c| c["state"]["state"] == "terminated");
    assert_eq!((&completion["state"]["reason"], &completion["state"]["exit_code"]), (&"Completed".into(), &0.into()));
    assert_eq!(completion["last_termination"]["cause"], Value::Null, "nothing stopped it");
    kube.wait_pod_phase("default", "completion", "Succeeded", Duration::from_secs(30)).expect("Succeeded");
    let pods = agent_pods(&agent);
    assert_eq!(pods.iter().find(|p| p["pod"] == "completion").map(|p| &p["phase"]), Some(&"Succeeded".into()));
    assert_eq!(pods.iter().find(|p| p["pod"] == "never").map(|p| &p["phase"]), Some(&"Failed".into()));

    // The kubelet kills it when `cat /tmp/healthy` fails, and says so in a Killing event.
    // The event may arrive after the exit; the stop's cause is set when it does.
    let liveness = wait_agent(&agent, "liveness", "killed by its liveness probe", Duration::from_secs(60), |c| {
        c["last_termination"]["cause"] == "liveness_probe"
    });
    assert_eq!(outcome(&liveness), "exited_within_grace");
    assert_eq!(grace_s(&liveness), 10.0);

    // The kubelet restarts at once, then after 10 s: both within its back-off.
    // The restart count moves when the new instance appears, the back-off verdict when its
    // process starts: wait for the verdict of the second restart itself.
    let crash = wait_agent(&agent, "crash", "restarted twice", Duration::from_secs(90), |c| {
        c["restart_count"].as_u64().is_some_and(|n| n >= 2)
            && c["last_backoff"]["restart_number"].as_u64().is_some_and(|n| n >= 2)
    });
    assert_eq!(crash["last_backoff"]["verdict"], "within_tolerance", "{crash:#}");
    assert!(crash["last_backoff"]["expected_delay_ns"].as_f64().is_some_and(|d| d >= 10.0 * SECOND), "{crash:#}");
    let api = kube.pod("default", "crash").expect("get").expect("exists");
    let reported = container_status(&api, "app").expect("status")["restartCount"].as_u64().expect("count");
    assert!(reported >= 1, "the kubelet counts its restarts too ({reported})");
}

#[test]
fn oom_kills_are_attributed_by_the_kernel() {
    let Some((kube, agent)) = start("oom_kills_are_attributed_by_the_kernel") else { return };
    let limit = |p: &mut Value| {
        p["spec"]["restartPolicy"] = "Never".into();
        p["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {"memory": "32Mi"}});
    };
    // PID 1 itself grows until the OOM killer picks it.
    apply(&kube, "pid1oom", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done", limit);
    // A child grows and is killed; PID 1 goes on.
    apply(&kube, "childoom", &format!("(x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done); {TRAP_EXIT}"), limit);

    let pid1 = wait_agent(&agent, "pid1oom", "ended, with the limit that fired", Duration::from_secs(60), |c| {
        c["state"]["state"] == "terminated" && !c["last_termination"]["oom_limit"].is_null()
    });
    assert_eq!(pid1["state"]["reason"], "OOMKilled", "{pid1:#}");
    assert_eq!(pid1["last_termination"]["oom_victim"], "init");
    // Which limit fired is the kernel's to say: the agent repeats its `oom-kill:` line. On this
    // node the pod's cgroup has the same 32Mi as the container and the sandbox's memory too.
    let limit = &pid1["last_termination"]["oom_limit"];
    eprintln!("pid1oom: {limit}");
    let (memcg, pid) = (limit["memcg"].as_str().expect("memcg"), limit["victim_pid"].as_u64().expect("pid"));
    let dmesg = std::process::Command::new("dmesg").output().expect("dmesg");
    let log = String::from_utf8_lossy(&dmesg.stdout);
    let line = log.lines().rev().find(|l| l.contains("oom-kill:") && l.contains(&format!(",pid={pid},")));
    let line = line.unwrap_or_else(|| panic!("the kernel logged the kill of pid {pid}"));
    assert!(line.contains(&format!(",oom_memcg={memcg},")), "the kernel's line agrees: {line}");
    let expected_scope = if line.contains(&format!("task_memcg={memcg},")) { "container" } else { "pod" };
    assert_eq!(limit["scope"], expected_scope, "{line}");
    let explained = std::process::Command::new(AGENT)
        .args(["explain", "default/pid1oom", "--server", &agent.addr])
        .output()
        .expect("run explain");
    let text = String::from_utf8_lossy(&explained.stdout);
    eprintln!("{text}");
    assert!(
        text.contains(&format!("OOM-killed at the {expected_scope}'s memory limit")) && text.contains(memcg),
        "{text}"
    );
    // Whatever the runtime made of it, the API's report is compared with the kernel's.
    let api = kube
        .wait_pod("default", "pid1oom", "terminated in the API", Duration::from_secs(30), |pod| {
            container_status(pod, "app").is_some_and(|c| c["state"]["terminated"].is_object())
        })
        .expect("reported");
    let reported = container_status(&api, "app").expect("status")["state"]["terminated"]["reason"].clone();
    if reported != "OOMKilled" {
        let c = wait_agent(&agent, "pid1oom", "disagreeing", Duration::from_secs(20), |c| {
            c["disagreements"].as_array().is_some_and(|d| d.iter().any(|d| d["kind"] == "oom_not_reported"))
        });
        eprintln!("the kubelet reported {reported} for a PID-1 OOM kill: {}", c["disagreements"]);
    }

    let child = wait_agent(&agent, "childoom", "running after its child's OOM kill", Duration::from_secs(60), |c| {
        running(c)
            && agent.metrics().lines().any(|l| {
                l.starts_with("lifecycle_oom_kills_total") && l.contains("pod=\"childoom\"") && !l.ends_with(" 0")
            })
    });
    assert_eq!(child["restart_count"], 0, "the container lives on");
    kube.kubectl(&["delete", "pod", "childoom", "--wait=false"]).expect("delete");
    let child = wait_agent(&agent, "childoom", "judged", kube::POD_STOPPED, judged);
    assert_eq!(child["last_termination"]["oom_victim"], "child", "{child:#}");
    assert_eq!(child["state"]["reason"], "Completed", "not OOMKilled: its init exited on SIGTERM");
}

fn agent_pods(agent: &Agent) -> Vec<Value> {
    let (_, body) = lifecycle_testkit::agent::get(&agent.addr, "/api/v1/containers").expect("api");
    let value: Value = serde_json::from_str(&body).expect("JSON");
    value["pods"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_kubelet_restart_resets_the_back_off_and_the_agent_knows() {
    let Some((mut kube, agent)) = start("a_kubelet_restart_resets_the_back_off_and_the_agent_knows") else { return };
    apply(&kube, "crashloop", "sleep 0.5; exit 1", |_| {});
    // The first restart is immediate; the second waits 10 s in the kubelet's back-off.
    let first = wait_agent(&agent, "crashloop", "restarted once and ended again", Duration::from_secs(60), |c| {
        c["restart_count"] == 1 && !c["last_backoff"].is_null() && c["state"]["state"] != "running"
    });
    assert_eq!(first["last_backoff"]["verdict"], "within_tolerance");
    // While the back-off holds the next restart, the kubelet restarts: its back-off lived in
    // memory only, so the new kubelet restarts the container at once.
    wait_agent(&agent, "crashloop", "in CrashLoopBackOff", Duration::from_secs(30), |c| {
        c["state"]["reason"] == "CrashLoopBackOff"
    });
    kube.restart_kubelet().expect("kubelet restarts");
    let after = wait_agent(&agent, "crashloop", "restarted by the new kubelet", Duration::from_secs(60), |c| {
        c["last_backoff"]["restart_number"].as_u64().is_some_and(|n| n >= 2)
    });
    let backoff = &after["last_backoff"];
    assert_eq!(backoff["verdict"], "within_tolerance", "not too early: the kubelet's back-off was reset {after:#}");
    assert_eq!(backoff["entry_reset"], true);
    assert_eq!(backoff["after_kubelet_restart"], true, "{after:#}");
    assert_eq!(backoff["expected_delay_ns"], 0);
}

/// The default pod probe port (`--pod-probe-port`).
const PROBE_PORT: u16 = 9891;

#[test]
fn the_kubelets_http_probes_are_answered_only_when_the_pod_spec_declares_them() {
    let Some((kube, agent)) = start("the_kubelets_http_probes_are_answered_only_when_the_pod_spec_declares_them")
    else {
        return;
    };
    let readiness = |path: &str| serde_json::json!({"httpGet": {"path": path, "port": PROBE_PORT}, "periodSeconds": 1, "failureThreshold": 1});
    // Declared by its own readiness probe, which the kubelet sends to the pod IP over the bridge.
    let declared = readiness("/probe/process");
    apply(&kube, "declared", TRAP_EXIT, |p| p["spec"]["containers"][0]["readinessProbe"] = declared);
    // The file oracle, declared through the spec: refused at declaration, so never answered.
    let oracle = readiness("/probe/file?path=/proc/1/environ&contains=PATH");
    apply(&kube, "oracle", TRAP_EXIT, |p| p["spec"]["containers"][0]["readinessProbe"] = oracle);

    let pod = kube.wait_pod_condition("default", "declared", "Ready", Duration::from_secs(60)).expect("Ready");
    let ip = pod["status"]["podIP"].as_str().expect("pod IP").to_owned();
    let addr = format!("{ip}:{PROBE_PORT}");
    // From the node (an allowed source), as the kubelet: the declared check answers, nothing else.
    assert_eq!(get(&addr, "/probe/process").map(|(code, _)| code), Some(200));
    for undeclared in ["/probe/file?path=/etc/hostname", "/probe/tcp?port=1", "/probe/process?max_d_state=1s"] {
        let (code, body) = get(&addr, undeclared).expect("answers");
        assert_eq!((code, body.as_str()), (403, "forbidden\n"), "{undeclared}");
    }
    assert!(
        !agent.metrics().contains("path=\"/etc/hostname\"") && !agent.metrics().contains("/etc/hostname"),
        "no request-driven series"
    );

    // The kubelet probed the oracle and failed; the agent counted the refusal; it is not Ready.
    kube.wait_pod("default", "oracle", "probed", Duration::from_secs(60), |_| {
        kube.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=oracle,reason=Unhealthy",
            "-o",
            "name",
        ])
        .is_ok_and(|names| !names.trim().is_empty())
    })
    .expect("the kubelet probes the oracle");
    let oracle = kube.pod("default", "oracle").expect("get").expect("exists");
    assert!(!kube::condition_is_true(&oracle, "Ready"), "{:#}", oracle["status"]);
    let refused = metric(&agent.metrics(), "lifecycle_probe_declarations_refused_total{reason=\"forbidden_path\"}");
    assert!(refused >= 1.0, "the oracle's declaration is refused and counted ({refused})");
}

/// The value of the sample `series` (name with labels, exactly as exported).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series}"))
}

/// The host pid of the init (PID 1 of its namespace) of the container with id `container_id`.
fn container_init_pid(container_id: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let ns_pid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.to_owned();
        (cgroup.contains(container_id) && ns_pid == "1").then_some(pid)
    })
}

/// SIGKILLs the init of the container the agent shows in `c`, from this test (an outside sender).
fn kill_init(c: &Value) {
    let id = c["container_id"].as_str().expect("container id");
    let pid = container_init_pid(id).unwrap_or_else(|| panic!("no init process for container {id}"));
    // SAFETY: kill has no memory-safety preconditions; the pid is the test pod's container init.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0, "kill {pid}");
}

fn wait_metric(agent: &Agent, series: &str, what: &str, done: impl Fn(f64) -> bool) {
    let began = Instant::now();
    loop {
        let value = agent.metrics().lines().find_map(|line| line.strip_prefix(series)?.trim().parse::<f64>().ok());
        if value.is_some_and(&done) {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "{what}: {series} is {value:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_api_server_outage_is_named_in_the_verdicts_made_during_it_and_loses_nothing() {
    let Some((mut kube, agent)) =
        start("an_api_server_outage_is_named_in_the_verdicts_made_during_it_and_loses_nothing")
    else {
        return;
    };
    apply(&kube, "victim", TRAP_EXIT, |_| {});
    kube.wait_pod_phase("default", "victim", "Running", Duration::from_secs(60)).expect("Running");
    let first = wait_agent(&agent, "victim", "running", Duration::from_secs(30), |c| running(c) && !judged(c));
    wait_metric(&agent, "lifecycle_kubernetes_api_up", "the watch works", |up| up == 1.0);

    kube.stop_apiserver();
    wait_metric(&agent, "lifecycle_kubernetes_api_up", "the agent notices the API server is gone", |up| up == 0.0);
    // The kubelet runs on without the API server: it restarts what dies, from its cached spec.
    kill_init(&first);
    let during = wait_agent(&agent, "victim", "judged during the outage", Duration::from_secs(30), judged);
    assert_eq!(during["last_termination"]["spec"], "api_unreachable", "{during:#}");
    assert_eq!(outcome(&during), "killed_without_grace", "{during:#}");
    assert_eq!(during["last_termination"]["outcome"]["sender"]["kind"], "other_process", "{during:#}");
    let restarted = wait_agent(&agent, "victim", "restarted by the kubelet", Duration::from_secs(60), |c| {
        c["restart_count"] == 1 && running(c)
    });

    // An agent (re)started while the API server is down keeps the API: it retries, not gives up
    // for its whole life.
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let late = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &["--kubeconfig", &kubeconfig, "--node-name", kube.node_name()],
    );
    assert!(late.metrics().contains("lifecycle_feature_enabled{feature=\"kubernetes_api\"} 1"), "configured");
    wait_metric(&late, "lifecycle_kubernetes_api_watch_errors_total", "the late agent retries", |n| n >= 1.0);
    assert_eq!(metric(&late.metrics(), "lifecycle_kubernetes_api_up"), 0.0, "not up while the API server is down");

    let took = kube.start_apiserver().expect("the API server comes back");
    eprintln!("API server back in {took:.1?}");
    wait_metric(&agent, "lifecycle_kubernetes_api_up", "the watch resumes", |up| up == 1.0);
    wait_metric(&late, "lifecycle_kubernetes_api_up", "the late agent's first list", |up| up == 1.0);
    let late_pods = || -> Vec<Value> {
        let body = lifecycle_testkit::agent::get(&late.addr, "/api/v1/containers").map(|(_, body)| body);
        let view: Value = body.and_then(|b| serde_json::from_str(&b).ok()).unwrap_or_default();
        view["pods"].as_array().cloned().unwrap_or_default()
    };
    let began = Instant::now();
    while !late_pods().iter().any(|p| p["pod"] == "victim" && p["api_phase"] == "Running") {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the late agent has the pod from the API: {:?}",
            late_pods()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(late);
    kill_init(&restarted);
    let after = wait_agent(&agent, "victim", "judged after the outage", Duration::from_secs(30), |c| {
        c["restart_count"] == 1 && judged(c) && c["last_termination"]["spec"] == "api"
    });
    assert_eq!(outcome(&after), "killed_without_grace", "{after:#}");
    // Nothing lost: the kubelet's count, reported once the API server is back, is the agent's.
    let second = wait_agent(&agent, "victim", "restarted again", Duration::from_secs(60), |c| {
        c["restart_count"] == 2 && running(c)
    });
    kube.wait_pod("default", "victim", "restartCount 2 reported", Duration::from_secs(60), |pod| {
        container_status(pod, "app").is_some_and(|s| s["restartCount"] == 2)
    })
    .expect("the kubelet reports both restarts");
    assert_eq!(second["disagreements"].as_array().map(Vec::len), Some(0), "{second:#}");
}

#[test]
fn an_agent_killed_during_a_termination_says_what_it_did_not_see() {
    let Some((kube, agent)) = start("an_agent_killed_during_a_termination_says_what_it_did_not_see") else { return };
    apply(&kube, "stubborn", IGNORE_TERM, |p| p["spec"]["terminationGracePeriodSeconds"] = 8.into());
    kube.wait_pod_phase("default", "stubborn", "Running", Duration::from_secs(60)).expect("Running");
    wait_agent(&agent, "stubborn", "running", Duration::from_secs(30), running);

    kube.kubectl(&["delete", "pod", "stubborn", "--wait=false"]).expect("delete");
    // The kubelet's SIGTERM reached the container (the agent counted it); then the agent dies.
    let began = Instant::now();
    while !agent.metrics().lines().any(|line| {
        line.starts_with("lifecycle_signals_received_total{")
            && line.contains("pod=\"stubborn\"")
            && line.contains("signal=\"15\"")
    }) {
        assert!(began.elapsed() < Duration::from_secs(30), "the agent saw no SIGTERM to stubborn");
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.kill();
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let agent = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &["--kubeconfig", &kubeconfig, "--node-name", kube.node_name()],
    );
    // The kubelet SIGKILLs it 8 s after the SIGTERM the new agent never saw: not "without grace".
    let judged = wait_agent(&agent, "stubborn", "judged", kube::POD_STOPPED, judged);
    let termination = &judged["last_termination"];
    assert_eq!(outcome(&judged), "stop_signal_not_observed", "{judged:#}");
    assert_eq!(termination["cause"], "deleted", "{judged:#}");
    assert_eq!(grace_s(&judged), 8.0, "{judged:#}");
    assert!(termination["watched_since"].is_string(), "when the new agent began watching: {judged:#}");
    assert!(
        agent.metrics().contains("outcome=\"stop_signal_not_observed\""),
        "counted as such, not as killed_without_grace"
    );
}

/// Issue 18: tokens were not audience-bound. With `--api-auth-audience`, the agent takes only
/// tokens the API server says were issued for that audience.
#[test]
fn with_an_audience_the_agent_refuses_tokens_issued_for_the_api_server() {
    let test = "with_an_audience_the_agent_refuses_tokens_issued_for_the_api_server";
    if let Some(reason) = kube::skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return;
    }
    kube::sweep_stale();
    let Some(kube) = kube::start_or_skip(test) else { return };
    let kubeconfig = kube.kubeconfig().to_string_lossy().into_owned();
    let agent = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            kube.node_name(),
            "--api-auth",
            "kubernetes",
            "--api-auth-audience",
            "lifecycle-agent",
        ],
    );
    // No controller-manager on the test node: the account is made by hand.
    kube.kubectl(&["create", "serviceaccount", "reader"]).expect("service account");
    let token = |audience: Option<&str>| {
        let mut args = vec!["create", "token", "reader"];
        args.extend(audience.map(|a| ["--audience", a]).into_iter().flatten());
        kube.kubectl(&args).expect("kubectl create token").trim().to_owned()
    };
    let containers = |token: &str| {
        lifecycle_testkit::agent::get_with_token(&agent.addr, "/api/v1/containers", Some(token)).map(|(code, _)| code)
    };
    // For the agent: authenticated, then refused by RBAC (the account has no role).
    assert_eq!(containers(&token(Some("lifecycle-agent"))), Some(403), "a token for the agent's audience");
    // For the API server (the default audience), or another: not a token for the agent.
    assert_eq!(containers(&token(None)), Some(401), "a token for the API server");
    assert_eq!(containers(&token(Some("another"))), Some(401), "a token for another audience");
}

/// Issue 40, on the 1.20 node: the agent reads this kubelet too (its release from the Node
/// object, its file and flags from its process: no cap, no back-off gates in 1.20, so the
/// default back-off), and an image whose configuration says `STOPSIGNAL SIGINT` is stopped with
/// SIGINT by containerd 1.6, which the kubelet does not report (the field came in 1.33): the
/// agent reads the image's stop signal from the runtime and calls it the configured one.
#[test]
fn an_image_only_stop_signal_is_the_configured_one_and_the_1_20_kubelet_is_read() {
    let Some((kube, agent)) = start("an_image_only_stop_signal_is_the_configured_one_and_the_1_20_kubelet_is_read")
    else {
        return;
    };
    let metrics = agent.metrics();
    let info = metrics.lines().find(|l| l.starts_with("lifecycle_kubelet_info{")).unwrap_or_default().to_owned();
    for label in ["version=\"v1.20.2\"", "cgroup_driver=\"cgroupfs\"", "source=\"node\"", "backoff=\"known\""] {
        assert!(info.contains(label), "{label} in {info:?}");
    }
    assert_eq!(metric(&metrics, "lifecycle_kubelet_backoff_seconds{bound=\"max\"}"), 300.0);
    // The node's image under another tag, whose configuration says STOPSIGNAL SIGINT.
    let repository = kube::IMAGE.rsplit_once(':').map_or(kube::IMAGE, |(repository, _)| repository);
    let int_image = format!("{repository}:stopsignal-int");
    kube.containerd().import_image_with_stop_signal(&int_image, "SIGINT").expect("import the SIGINT image");
    apply(&kube, "intstop", "trap 'exit 0' INT; trap '' TERM; while true; do sleep 0.2; done", |p| {
        p["spec"]["terminationGracePeriodSeconds"] = 10.into();
        p["spec"]["containers"][0]["image"] = int_image.clone().into();
    });
    wait_agent(&agent, "intstop", "running", Duration::from_secs(60), running);
    kube.wait_pod_phase("default", "intstop", "Running", Duration::from_secs(60)).expect("Running");
    let pod = kube.pod("default", "intstop").expect("get").expect("exists");
    let reported = container_status(&pod, "app").map(|s| s["stopSignal"].clone()).unwrap_or_default();
    assert!(reported.is_null(), "1.20 reports no stop signal: {reported}");
    kube.kubectl(&["delete", "pod", "intstop", "--wait=false"]).expect("delete");
    let judged = wait_agent(&agent, "intstop", "judged", kube::POD_STOPPED, judged);
    let stop = &judged["last_termination"]["stop_signal"];
    assert_eq!((&stop["signal"], &stop["matches_configured"]), (&2.into(), &true.into()), "{judged:#}");
    assert_eq!(outcome(&judged), "exited_within_grace", "{judged:#}");
}
