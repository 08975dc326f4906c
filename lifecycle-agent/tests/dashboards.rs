//! Privileged tier: every Grafana dashboard panel returns data from a real Prometheus that scraped
//! the real `lifecycle-agent run` binary while real containers (containerd + runc, driven through
//! the CRI the way the kubelet drives it) went through the end-to-end scenarios: a graceful stop,
//! a grace-period violation, a crash loop restarted too early, an OOM kill, a child OOM-killed
//! under a living PID 1 (the memory events a container's cgroup counts), a completion, a
//! listening server with connections, exec probes, and probe requests to the agent.
//!
//! Then `dashboards/check_dashboards.py --prometheus URL` runs every panel's queries against that
//! Prometheus and must exit 0.
//!
//! Needs root, containerd/runc/busybox-static (see lifecycle-testkit/src/containerd/) and Debian's
//! `prometheus`; skips with the reason otherwise. Uses `target/pyenv/bin/python` when it exists
//! (the grafana-foundation-sdk round trip runs too), else `python3`.
//!
//! Run: `cargo test -p lifecycle-agent --test dashboards -- --nocapture`

use std::{
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use lifecycle_agent::model::metadata::keys;
use lifecycle_testkit::{
    agent::{free_port, get, Agent},
    containerd::{skip_reason, Containerd, KubeletAnnotations, Pod},
};
use serde_json::Value;

/// The `node` label the scrape adds, as the PodMonitor's relabelling does.
const NODE: &str = "dashboards-e2e-node";
const JOB: &str = "lifecycle-agent";
const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");

/// Debian's Prometheus on a loopback port with a temp config and tsdb; stopped (by pid) and its
/// directory removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    addr: String,
}

impl Prometheus {
    fn start(agent_addr: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("lifecycle-dashboards-prometheus-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data")).expect("prometheus dir");
        // The static target carries what the PodMonitor adds in a cluster: `node`, and (under
        // honor_labels, so the agent's container labels win) the agent pod's own identity.
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: {JOB}\n    honor_labels: true\n    static_configs:\n\
             \x20     - targets: ['{agent_addr}']\n        labels:\n          node: {NODE}\n\
             \x20         namespace: lifecycle-system\n          pod: lifecycle-agent-dashboards\n\
             \x20         container: agent\n"
        );
        fs::write(dir.join("prometheus.yml"), config).expect("prometheus config");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = fs::File::create(dir.join("prometheus.log")).expect("prometheus log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Self { child, dir, addr }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until the agent target's last scrape was healthy.
    fn wait_target_up(&mut self) -> Duration {
        let began = Instant::now();
        let deadline = began + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("prometheus status") {
                panic!("prometheus exited with {status}:\n{}", self.log_tail());
            }
            let up = get(&self.addr, "/api/v1/targets")
                .filter(|(code, _)| *code == 200)
                .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
                .is_some_and(|v| {
                    v["data"]["activeTargets"]
                        .as_array()
                        .is_some_and(|targets| targets.iter().any(|t| t["labels"]["job"] == JOB && t["health"] == "up"))
                });
            if up {
                return began.elapsed();
            }
            assert!(Instant::now() < deadline, "agent target not up in Prometheus after 30 s:\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let (code, body) =
            get(&self.addr, &format!("/api/v1/query?query={}", encode(expr))).expect("prometheus answers");
        assert_eq!(code, 200, "query {expr}: {body}");
        let value: Value = serde_json::from_str(&body).expect("JSON");
        value["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Polls an instant query until it returns a series.
    fn wait_for(&self, expr: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.query(expr).is_empty() {
            assert!(Instant::now() < deadline, "Prometheus never answered {expr}:\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The first sample value of an instant query.
    fn value(&self, expr: &str) -> Option<f64> {
        self.query(expr).first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is the Prometheus we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query-string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn state(c: &Value) -> &str {
    c["state"]["state"].as_str().unwrap_or_default()
}

fn outcome(c: &Value) -> &str {
    c["last_termination"]["outcome"]["kind"].as_str().unwrap_or_default()
}

fn annotations(grace_s: i64, restart_count: u32) -> KubeletAnnotations {
    KubeletAnnotations { termination_grace_period_s: Some(grace_s), restart_count, ..KubeletAnnotations::default() }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs_f64()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

/// A listening server with connections, exec probes, and probe requests (passing and failing).
/// Half the exec probes wait until Prometheus has scraped the container's exec-probe counter, so
/// their increase is one it can see.
fn web_scenario(h: &mut Containerd, agent: &Agent, prometheus: &Prometheus) -> (Pod, String) {
    let port = free_port();
    // The checks asked below, declared as the pod's lifecycle.dev/probes annotation.
    let declared = format!("/probe/tcp?port={port}\n/probe/tcp?port={}\n/probe/process", port + 1);
    let pod = h.new_pod_annotated("web", &[(keys::PROBE_DECLARATION, &declared)]).expect("pod");
    let serve = format!("httpd -f -p 127.0.0.1:{port} -h /");
    let id = h.run_container(&pod, "web", &["sh", "-c", &serve], &annotations(30, 0), None).expect("container");
    agent.wait(&pod, "web", "running", |c| state(c) == "running");
    agent.probe_until(&pod, "web", &format!("check=tcp&port={port}"), 200);
    agent.probe_until(&pod, "web", "check=process", 200);
    // A check that fails: nothing listens on the next port.
    assert_eq!(agent.probe(&pod, "web", &format!("check=tcp&port={}", port + 1)).0, 503);
    // Connections the server accepts and answers.
    for _ in 0..5 {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to httpd");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        write!(stream, "GET / HTTP/1.0\r\n\r\n").expect("request");
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
    }
    // Exec probes the kubelet's way (ExecSync): two, then two more once Prometheus has scraped the
    // exec-probe series (the agent creates it with the first exec), so rate() sees an increase.
    let mut runtime = h.cri().runtime_service();
    for round in 1..=2 {
        for _ in 0..2 {
            let request = k8s_cri::v1::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec!["cat".into(), "/etc/hostname".into()],
                timeout: 5,
            };
            let reply = h.block_on(runtime.exec_sync(request)).expect("exec").into_inner();
            assert_eq!(reply.exit_code, 0);
        }
        agent.wait(&pod, "web", "exec sessions", |c| c["exec_sessions"] == 2 * round);
        if round == 1 {
            prometheus.wait_for("lifecycle_exec_probe_processes_total{pod=\"web\"} == 2");
        }
    }
    (pod, id)
}

/// A container that exits on SIGTERM, stopped with a 30 s grace; its process check passes while
/// it runs and fails after the exit (a probe transition). The stop waits until Prometheus has
/// scraped the passing result, so the flip is an increase it can see.
fn graceful_stop(h: &mut Containerd, agent: &Agent, prometheus: &Prometheus) {
    let pod = h.new_pod_annotated("graceful", &[(keys::PROBE_DECLARATION, "/probe/process")]).expect("pod");
    let script = "trap 'exit 0' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations(30, 0), None).expect("container");
    agent.wait(&pod, "app", "running", |c| state(c) == "running");
    agent.probe_until(&pod, "app", "check=process", 200);
    prometheus.wait_for("lifecycle_probe_result{pod=\"graceful\", check=\"process\"} == 1");
    h.stop_container(&id, 30).expect("stop");
    let done = agent.wait(&pod, "app", "terminated", |c| state(c) == "terminated" && !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "exited_within_grace", "{done:#}");
    agent.probe_until(&pod, "app", "check=process", 503);
}

/// A container ignoring SIGTERM, stopped with timeout 2: SIGKILL after the grace period.
fn violation(h: &mut Containerd, agent: &Agent) {
    let pod = h.new_pod("stubborn").expect("pod");
    let script = "trap '' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations(2, 0), None).expect("container");
    agent.wait(&pod, "app", "running", |c| state(c) == "running");
    h.stop_container(&id, 2).expect("stop");
    let done = agent.wait(&pod, "app", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "sigkilled_after_grace", "{done:#}");
}

/// Four crashes; the last restart comes 0.2 s after the exit where 2 s are due (reduced decay).
/// Ends waiting in CrashLoopBackOff.
fn crash_loop(h: &mut Containerd, agent: &Agent) {
    let pod = h.new_pod("crashloop").expect("pod");
    let delays = [None, Some(0.0), Some(1.0), Some(0.2)];
    let mut finished_at: Option<Instant> = None;
    for (attempt, delay) in delays.iter().enumerate() {
        if let (Some(delay), Some(finished)) = (delay, finished_at) {
            std::thread::sleep(Duration::from_secs_f64(*delay).saturating_sub(finished.elapsed()));
        }
        let id = h
            .run_container(&pod, "crash", &["sh", "-c", "exit 1"], &annotations(30, attempt as u32), None)
            .expect("container");
        h.wait_exited(&id, Duration::from_secs(10)).expect("exit");
        finished_at = Some(Instant::now());
        agent.wait(&pod, "crash", "the exit", |c| c["restart_count"] == attempt && !c["last_termination"].is_null());
    }
    let c = agent.wait(&pod, "crash", "three restarts", |c| c["restart_count"] == 3);
    assert_eq!(c["last_backoff"]["verdict"], "too_early", "{c:#}");
    assert_eq!(c["state"]["reason"], "CrashLoopBackOff", "{c:#}");
}

/// A 64 MiB memory limit and an allocation loop: OOM-killed.
///
/// Seen once in about ten runs: the runtime reported OOMKilled but the agent judged the hog
/// `exited_without_stop_signal` with exit status 0 and counted its shell as an exec session (the
/// agent telling the container's init apart, not a dashboard problem; the e2e test of this
/// scenario asserts the verdict). This test is about the dashboards, so it says so loudly and runs
/// the scenario once more in a fresh pod.
fn oom_kill(h: &mut Containerd, agent: &Agent) {
    for attempt in 0..2 {
        let pod = h.new_pod(&format!("hog-{attempt}")).expect("pod");
        let script = "a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done";
        let id = h
            .run_container(&pod, "hog", &["sh", "-c", script], &annotations(30, 0), Some(64 << 20))
            .expect("container");
        let status = h.wait_exited(&id, Duration::from_secs(20)).expect("exit");
        assert_eq!(status.reason, "OOMKilled", "the runtime saw no OOM kill: {status:?}");
        let done = agent.wait(&pod, "hog", "judged", |c| !c["last_termination"].is_null());
        if outcome(&done) == "oom_killed" {
            return;
        }
        assert_eq!(attempt, 0, "the agent misjudged the OOM kill twice: {done:#}");
        eprintln!(
            "AGENT MISJUDGED: the runtime reports OOMKilled, the agent {:?}; trying again: {done:#}",
            outcome(&done)
        );
    }
}

/// A child OOM-killed at its container's 64 MiB limit while PID 1 lives on, until the agent has
/// read the kill from the container's memory files (`memory.events`, or v1's `oom_control`); then
/// the container is stopped.
fn memory_pressure(h: &mut Containerd, agent: &Agent) {
    let pod = h.new_pod("pressed").expect("pod");
    let script = "trap 'exit 0' TERM; (a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done); \
                  while true; do sleep 0.2; done";
    let id =
        h.run_container(&pod, "app", &["sh", "-c", script], &annotations(10, 0), Some(64 << 20)).expect("container");
    let deadline = Instant::now() + Duration::from_secs(30);
    let wanted = format!("lifecycle_container_memory_events_total{{namespace=\"{}\",pod=\"pressed\"", pod.namespace);
    loop {
        let metrics = agent.metrics();
        let read = metrics
            .lines()
            .any(|line| line.starts_with(&wanted) && line.contains("event=\"oom_kill\"") && line.ends_with(" 1"));
        if read {
            break;
        }
        assert!(Instant::now() < deadline, "no oom_kill count read within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    h.stop_container(&id, 10).expect("stop");
}

/// A container that completes with exit 0.
fn completion(h: &mut Containerd, agent: &Agent) {
    let pod = h.new_pod("job").expect("pod");
    let id = h
        .run_container(&pod, "task", &["sh", "-c", "sleep 0.3; exit 0"], &annotations(30, 0), None)
        .expect("container");
    h.wait_exited(&id, Duration::from_secs(10)).expect("exit");
    let done = agent.wait(&pod, "task", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "exited_without_stop_signal", "{done:#}");
}

#[test]
fn every_dashboard_panel_has_data_from_a_real_scrape() {
    const TEST: &str = "every_dashboard_panel_has_data_from_a_real_scrape";
    let began = Instant::now();
    if let Some(reason) = skip_reason() {
        eprintln!("SKIP {TEST}: {reason}");
        return;
    }
    if !on_path("prometheus") {
        eprintln!("SKIP {TEST}: prometheus missing (apt-get install --no-install-recommends prometheus)");
        return;
    }
    let root = workspace_root();
    let venv = root.join("target/pyenv/bin/python");
    let python = if venv.is_file() { venv } else { PathBuf::from("python3") };

    let mut h = match Containerd::start() {
        Ok(harness) => harness,
        Err(e) => panic!("{TEST}: cannot start containerd: {e:#}"),
    };
    // Reduced decay (1 s initial back-off) keeps the crash loop short.
    let agent = Agent::start(AGENT, &h, &["--reduced-backoff-decay"]);
    let mut prometheus = Prometheus::start(&agent.addr);
    let up_after = prometheus.wait_target_up();
    eprintln!("prometheus {} scraping the agent at {} (up after {up_after:.1?})", prometheus.url(), agent.addr);

    let scenarios = Instant::now();
    let (web, _web_id) = web_scenario(&mut h, &agent, &prometheus);
    graceful_stop(&mut h, &agent, &prometheus);
    violation(&mut h, &agent);
    crash_loop(&mut h, &agent);
    oom_kill(&mut h, &agent);
    memory_pressure(&mut h, &agent);
    completion(&mut h, &agent);
    // Probe the web container once more so its request counters move in the last scrapes too.
    assert_eq!(agent.probe(&web, "web", "check=process").0, 200);
    let last_event = unix_now();
    eprintln!("scenarios done in {:.1?}", scenarios.elapsed());

    // Prometheus has what the scenarios produced once it scraped twice after the last one (so
    // every new series has the two samples rate()/increase() need) and sees their results.
    let proofs = [
        format!("timestamp(up{{job=\"{JOB}\"}}) > {:.3}", last_event + 1.0),
        "lifecycle_grace_period_violations_total{pod=\"stubborn\"} > 0".to_owned(),
        "increase(lifecycle_probe_transitions_total{pod=\"graceful\"}[1m]) > 0".to_owned(),
        "lifecycle_container_waiting_reason{pod=\"crashloop\", reason=\"CrashLoopBackOff\"} == 1".to_owned(),
        "lifecycle_terminations_total{pod=\"job\", outcome=\"exited_without_stop_signal\"} > 0".to_owned(),
        "lifecycle_container_memory_events_total{pod=\"pressed\", event=\"oom_kill\"} > 0".to_owned(),
    ];
    for proof in &proofs {
        prometheus.wait_for(proof);
    }
    eprintln!(
        "prometheus has the scenarios ({} lifecycle series)",
        prometheus.value("count({__name__=~\"lifecycle_.+\"})").unwrap_or_default()
    );

    let output = Command::new(&python)
        .arg(root.join("dashboards/check_dashboards.py"))
        .args(["--prometheus", &prometheus.url()])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("run {} dashboards/check_dashboards.py: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let failures: Vec<_> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(output.status.success(), "check_dashboards.py exited {}:\n{}", output.status, failures.join("\n"));
    eprintln!("{TEST}: {} in {:.1?}", stdout.lines().last().unwrap_or_default(), began.elapsed());
}
