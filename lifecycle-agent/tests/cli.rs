//! Privileged tier: the `lifecycle-agent` binary itself — `run` serves metrics that promtool
//! accepts and detaches every program on SIGTERM; `events` prints JSON lines for one cgroup; bad
//! flags and missing BTF give one clear sentence and a non-zero exit.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use lifecycle_testkit::{cgroup::TestCgroup, require_privileges};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");

/// Ends the agent we started if the test fails before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Ids of the BPF programs a process holds open, from its fdinfo (`prog_id:` lines).
fn programs_held_by(pid: u32) -> Vec<u32> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("prog_id:")).and_then(|id| id.trim().parse().ok()))
        .collect()
}

fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs().filter_map(Result::ok).map(|p| p.id()).collect()
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Waits for the agent's health endpoint: it listens only after every program is attached.
fn wait_healthy(addr: &str, agent: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if http_get(addr, "/healthz").is_some_and(|r| r.contains(" 200 OK")) {
            return;
        }
        if let Some(status) = agent.try_wait().expect("try_wait") {
            panic!("agent exited early: {status}");
        }
        assert!(Instant::now() < deadline, "agent not healthy within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn run_serves_valid_metrics_and_detaches_everything_on_sigterm() {
    require_privileges!();
    let addr = "127.0.0.1:19893";
    let mut agent = KillOnDrop(
        Command::new(AGENT).args(["run", "--listen", addr, "--handoff-dir", "none"]).spawn().expect("start agent"),
    );
    let agent = &mut agent.0;
    wait_healthy(addr, agent);
    let held = programs_held_by(agent.id());
    assert!(held.len() >= 9, "every program loaded and held by the agent: {held:?}");

    let response = http_get(addr, "/metrics").expect("metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("http response");
    assert!(head.contains(" 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    for feature in
        ["process_exec", "process_exit", "signals", "oom_kills", "tcp_sockets", "tcp_accepts", "cgroup_events"]
    {
        assert!(
            body.contains(&format!("lifecycle_feature_enabled{{feature=\"{feature}\"}} 1")),
            "{feature} in\n{body}"
        );
    }
    assert!(body.contains("lifecycle_events_lost_total{kind=\"exit\"} 0"), "{body}");
    assert!(body.lines().any(|l| l.starts_with("lifecycle_events_total{kind=\"exec\"}")), "{body}");

    // promtool's linter reports nothing on the live output.
    if let Ok(mut promtool) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        promtool.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("feed promtool");
        let out = promtool.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        eprintln!("note: promtool not installed; the test tier installs it (Debian prometheus)");
    }

    // SAFETY: kill has no memory-safety preconditions; the pid is the agent we started.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) }, 0);
    let status = agent.wait().expect("wait agent");
    assert!(status.success(), "clean shutdown exits 0, got {status}");
    // The kernel frees a program after its last reference drops, from deferred (RCU) work, so
    // give it a moment; nothing signals that completion to userspace.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let still_loaded: Vec<u32> = loaded_program_ids().into_iter().filter(|id| held.contains(id)).collect();
        if still_loaded.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "programs left loaded after shutdown: {still_loaded:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn events_prints_json_lines_for_one_cgroup() {
    require_privileges!();
    let mut cg = TestCgroup::new("cli-events");
    let mut events = Command::new(AGENT)
        .args(["events", "--cgroup", &cg.path, "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start events");
    // The command logs each feature once attached; the last one marks readiness.
    let stderr = BufReader::new(events.stderr.take().expect("stderr"));
    for line in stderr.lines() {
        if line.expect("stderr line").contains("feature cgroup_events") {
            break;
        }
    }
    assert_eq!(cg.spawn(Command::new("/bin/sh").args(["-c", "exit 7"])).wait().expect("child").code(), Some(7));
    let output = events.wait_with_output().expect("events output");
    assert!(output.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[0]["kind"], "exec");
    assert_eq!(lines[1]["kind"], "exit");
    assert_eq!(lines[1]["exit_status"], 7);
    assert!(lines.iter().all(|l| l["cgroup_id"] == cg.id));
}

/// The sum of a family's samples whose labels contain `labels` in a `/metrics` body.
fn sample_sum(body: &str, family: &str, labels: &str) -> f64 {
    body.lines()
        .filter(|line| {
            line.strip_prefix(family).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && line.contains(labels)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_kernel_accounts_each_programs_runs_and_the_agent_exports_them() {
    require_privileges!();
    let addr = format!("127.0.0.1:{}", lifecycle_testkit::agent::free_port());
    let mut agent = KillOnDrop(
        Command::new(AGENT).args(["run", "--listen", &addr, "--handoff-dir", "none"]).spawn().expect("start agent"),
    );
    wait_healthy(&addr, &mut agent.0);
    let runs = |program: &str| {
        let body = http_get(&addr, "/metrics").expect("metrics");
        let label = format!("program=\"{program}\"");
        (
            sample_sum(&body, "lifecycle_kernel_program_runs_total", &label),
            sample_sum(&body, "lifecycle_kernel_program_run_seconds_total", &label),
        )
    };
    let (exits_before, seconds_before) = runs("sched_process_exit");
    const EXITS: u32 = 300;
    let mut cg = TestCgroup::new("program-runs");
    for _ in 0..EXITS {
        assert!(cg.spawn(&mut Command::new("/bin/true")).wait().expect("true").success());
    }
    // Counted by the kernel as each exit happens; a scrape reads the counts then.
    let (exits, seconds) = runs("sched_process_exit");
    assert!(exits - exits_before >= f64::from(EXITS), "{EXITS} exits, runs_total moved by {}", exits - exits_before);
    assert!(seconds > seconds_before, "the time spent in them moved too");
    let (execs, _) = runs("sched_process_exec");
    assert!(execs >= f64::from(EXITS), "{execs} exec runs");
    let body = http_get(&addr, "/metrics").expect("metrics");
    let value = |name: &str| {
        body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).unwrap_or_default()
    };
    assert!(value("lifecycle_agent_resident_memory_bytes") > 1e6, "the agent's own RSS: {body}");
    assert!(value("lifecycle_agent_cpu_seconds_total") > 0.0, "the agent's own CPU: {body}");
    drop(agent);

    // Turned off, the kernel accounts nothing for the agent and no program series is served.
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args(["run", "--listen", &addr, "--kernel-stats", "off", "--handoff-dir", "none"])
            .spawn()
            .expect("agent"),
    );
    wait_healthy(&addr, &mut agent.0);
    let body = http_get(&addr, "/metrics").expect("metrics");
    assert!(!body.contains("lifecycle_kernel_program_runs_total{"), "{body}");
}

fn one_sentence_failure(args: &[&str], expected: &str) {
    let mut agent = Command::new(AGENT);
    agent.args(args);
    command_fails_with(agent, expected);
}

fn command_fails_with(mut command: Command, expected: &str) {
    let output = command.output().expect("run agent");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(expected), "expected {expected:?} in:\n{stderr}");
}

/// The agent binary with `args`, in a mount namespace of its own whose `/run` is an empty tmpfs:
/// what a client finds there by default (the CA an agent on this host made,
/// `/run/lifecycle-agent/serving-ca.crt`) is not this host's. The namespace ends with the process.
fn with_empty_run(args: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t tmpfs lifecycle-test /run && exec \"$0\" \"$@\"")
        .arg(AGENT)
        .args(args);
    command
}

#[test]
fn missing_btf_is_one_clear_sentence() {
    require_privileges!();
    one_sentence_failure(
        &["run", "--btf", "/nonexistent/vmlinux", "--listen", "127.0.0.1:0", "--handoff-dir", "none"],
        "error: cannot read kernel BTF at /nonexistent/vmlinux",
    );
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    one_sentence_failure(&["run", "--listen", "not-an-address"], "invalid value 'not-an-address' for '--listen");
    one_sentence_failure(&["run", "--poll-ms", "0"], "invalid value '0' for '--poll-ms");
    one_sentence_failure(&["events", "--disable", "process-exit"], "invalid value 'process-exit'");
}

#[test]
fn bad_ring_size_is_refused() {
    require_privileges!();
    one_sentence_failure(
        &["run", "--ring-bytes", "12345", "--listen", "127.0.0.1:0", "--handoff-dir", "none"],
        "ring buffer size 12345 is not a power of two",
    );
}

#[test]
fn unknown_cgroup_filter_is_refused() {
    require_privileges!();
    one_sentence_failure(&["events", "--cgroup", "/no/such/cgroup"], "is not a cgroup directory");
}

#[test]
fn status_never_sends_a_token_in_clear_to_another_host_unless_told() {
    // Issue 18: `status` sent the service-account token over plain HTTP to any --server.
    require_privileges!();
    let dir = TempDir::new("token");
    let token = dir.join("token");
    std::fs::write(&token, "secret-token\n").expect("token file");
    let token_path = token.to_string_lossy().into_owned();
    // 192.0.2.1 (TEST-NET-1) is never reached: the refusal comes before any connection. Without
    // an agent's CA at the default path (the host's /run hidden: a DaemonSet's agent on this
    // host would have written one, and a client trusting it speaks TLS), plain HTTP is all
    // there is.
    command_fails_with(
        with_empty_run(&["status", "--server", "192.0.2.1:9890", "--token-file", &token_path]),
        "refusing to send the token to 192.0.2.1:9890 over plain HTTP",
    );
}

/// A fresh directory for one test's files under the temporary directory, removed when dropped
/// (after a failed assertion too).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("lifecycle-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test directory");
        Self(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A self-signed certificate for 127.0.0.1 and its key, made with openssl in `dir`.
fn self_signed(dir: &std::path::Path, name: &str) -> (String, String) {
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=lifecycle-test", "-addext", "subjectAltName=IP:127.0.0.1"])
        // An end-entity certificate that is its own trust anchor (webpki refuses a CA as the
        // server's certificate).
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    (cert.to_string_lossy().into_owned(), key.to_string_lossy().into_owned())
}

#[test]
fn status_reads_an_agent_serving_tls_and_trusts_only_its_ca() {
    // Issue 18: with --api-auth kubernetes, bearer tokens crossed the node network in clear.
    require_privileges!();
    let dir = TempDir::new("tls");
    let (cert, key) = self_signed(&dir, "agent");
    let (other, _) = self_signed(&dir, "other");
    let (addr, health) = ("127.0.0.1:19894", "127.0.0.1:19895");
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args([
                "run",
                "--listen",
                addr,
                "--health-listen",
                health,
                "--handoff-dir",
                dir.to_str().expect("a UTF-8 path"),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
            ])
            .spawn()
            .expect("start agent"),
    );
    wait_healthy(health, &mut agent.0);
    let status =
        |ca: &str| Command::new(AGENT).args(["status", "--server", addr, "--ca-file", ca, "-o", "json"]).output();
    let read = status(&cert).expect("status");
    assert!(read.status.success(), "{read:?}");
    assert!(String::from_utf8_lossy(&read.stdout).contains("\"containers\""), "{read:?}");
    // Not the agent's CA: refused, nothing sent.
    let refused = status(&other).expect("status");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("TLS with the agent at 127.0.0.1:19894 failed"),
        "{refused:?}"
    );
    // The same port still answers plain HTTP (Prometheus, host-network pods' probes); only
    // credentials from off the host must come over TLS (agent/http.rs tests that rule).
    assert!(http_get(addr, "/metrics").is_some_and(|answer| answer.contains(" 200 OK")));
    drop(agent);
}

/// A kubeconfig whose cluster is `server`, in `dir`.
fn kubeconfig_for(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{server}\"}}\nusers:\n- name: u\n  \
         user: {{token: not-a-secret}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
    );
    std::fs::write(&path, text).expect("write the kubeconfig");
    path
}

/// The agent with `--kubeconfig kubeconfig`, its log (RUST_LOG=info) in `log`.
fn agent_with_kubeconfig(kubeconfig: &std::path::Path, log: &std::path::Path) -> (KillOnDrop, String) {
    let addr = format!("127.0.0.1:{}", lifecycle_testkit::agent::free_port());
    let stderr = std::fs::File::create(log).expect("the log file");
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args(["run", "--listen", &addr, "--handoff-dir", "none", "--kubeconfig"])
            .arg(kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start agent"),
    );
    wait_healthy(&addr, &mut agent.0);
    (agent, addr)
}

#[test]
fn a_kubeconfig_named_on_the_command_line_that_cannot_be_read_stops_the_start() {
    // Before this was an error, the agent started and ran without the API for ever: the child is
    // given a deadline rather than waited on.
    let mut agent = KillOnDrop(
        Command::new(AGENT)
            .args([
                "run",
                "--kubeconfig",
                "/nonexistent/kubeconfig",
                "--listen",
                "127.0.0.1:0",
                "--handoff-dir",
                "none",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = agent.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the agent started with a kubeconfig that does not exist");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    agent.0.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    assert!(stderr.contains("error: --kubeconfig: cannot use kubeconfig /nonexistent/kubeconfig"), "{stderr}");
}

#[test]
fn an_unreachable_api_server_is_retried_without_flooding_the_log() {
    require_privileges!();
    let dir = TempDir::new("unreachable-api");
    // A port nothing listens on: every retry of every watch is refused at once.
    let port = lifecycle_testkit::agent::free_port();
    let kubeconfig = kubeconfig_for(&dir, &format!("http://127.0.0.1:{port}"));
    let log = dir.join("agent.log");
    let (_agent, addr) = agent_with_kubeconfig(&kubeconfig, &log);
    // The kube client's retries go on (about three a second); wait until the agent has held
    // back a few of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = http_get(&addr, "/metrics").expect("metrics");
        if sample_sum(&body, "lifecycle_log_lines_suppressed_total", "") >= 5.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no retries held back in 30 s:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).expect("the log");
    let client_lines = text.lines().filter(|line| line.contains(" kube_client")).count();
    assert!(client_lines <= 2, "the client's retries are one line per window:\n{text}");
    assert!(text.contains("the Kubernetes API does not answer yet"), "the agent says so itself:\n{text}");
    // No runtime's socket at its default place: a plain host, which `doctor` calls fine and the
    // log does not warn about. (Where one exists, the agent uses it and there is nothing to say.)
    let default_sockets = ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];
    if default_sockets.iter().all(|socket| !std::path::Path::new(socket).exists()) {
        assert!(
            !text.lines().any(|line| line.contains("WARN") && line.contains("container runtime")),
            "a host without a container runtime is not warned about:\n{text}"
        );
        assert!(text.contains("units are named by cgroup path"), "{text}");
    }
}

#[test]
fn a_server_that_is_not_the_api_is_named_in_one_line() {
    require_privileges!();
    let dir = TempDir::new("html-api");
    // A web server answering every request with an HTML error page, as a proxy or a wrong port
    // does.
    let server = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let server_addr = server.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in server.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let page = "<!DOCTYPE HTML>\n<html>\n  <head><title>Not Found</title></head>\n  <body>\n    \
                        <h1>Not Found</h1>\n  </body>\n</html>\n";
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    let kubeconfig = kubeconfig_for(&dir, &format!("http://{server_addr}"));
    let log = dir.join("agent.log");
    let (_agent, _addr) = agent_with_kubeconfig(&kubeconfig, &log);
    // The first contact is made before the agent serves /healthz: its line is written.
    let text = std::fs::read_to_string(&log).expect("the log");
    let line = text
        .lines()
        .find(|line| line.contains("the Kubernetes API does not answer yet"))
        .unwrap_or_else(|| panic!("no line about the API:\n{text}"));
    assert!(line.contains("HTTP 404 with an HTML page that is not the Kubernetes API's"), "{line}");
    assert!(!line.contains("Status {"), "no Debug text: {line}");
    assert!(!text.lines().any(|l| l.trim_start().starts_with('<')), "the page's markup is not in the log:\n{text}");
}

/// A stand-in for an agent's `--listen` on loopback: answers every request with `status` and
/// `body` (a real listener, so the CLI's connecting, resolving and reading are real), and
/// counts the requests it read.
struct FakeAgent {
    addr: std::net::SocketAddr,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeAgent {
    fn answering(status: &'static str, body: String) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        // Detached: it serves until the test process ends; each connection gets one answer.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { addr, requests }
    }
}

/// `/api/v1/containers`' body with these containers, as the agent writes it.
fn containers_body(containers: Vec<lifecycle_agent::model::node::ContainerView>) -> String {
    use lifecycle_agent::model::{
        time::BootTime,
        wire::{at::WallClock, with_clock::WithClock, ContainersResponse},
    };
    let body = ContainersResponse {
        boot_to_unix_seconds: 0.0,
        now: BootTime::from_ns(100_000_000_000),
        resource_version: String::new(),
        containers,
        pods: vec![],
    };
    serde_json::to_string(&WithClock::new(&body, WallClock::from_offset_seconds(0.0))).expect("serializes")
}

fn running(namespace: &str, pod: &str, container: &str) -> lifecycle_agent::model::node::ContainerView {
    use lifecycle_agent::model::{container_state::ContainerState, time::BootTime};
    lifecycle_testkit::fixtures::container_view(
        namespace,
        pod,
        container,
        ContainerState::Running { started_at: BootTime::from_ns(1_000_000_000) },
    )
}

/// Runs the agent binary with `args`, killed if it has not ended by `deadline` (then the test
/// fails): its output and how long it took.
fn ends_within(args: &[&str], deadline: Duration) -> (std::process::Output, Duration) {
    let began = Instant::now();
    let mut child =
        Command::new(AGENT).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run the agent");
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return (child.wait_with_output().expect("output"), began.elapsed());
        }
        if began.elapsed() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!("{args:?} still running after {deadline:?}: {output:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn status_to_a_listener_that_never_answers_ends_with_a_sentence_within_its_timeout() {
    // Issue 41 item 3: `status --server` to a listener that never answers hung for ever.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = silent.local_addr().expect("addr").to_string();
    // The kernel completes the handshake into the backlog; nobody ever reads or answers.
    let (output, took) =
        ends_within(&["status", "--server", &server, "--request-timeout", "1s500ms"], Duration::from_secs(20));
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(&format!("the agent at {server} did not answer within 1.5s (connected; no answer came)")),
        "{said}"
    );
    assert!(took < Duration::from_secs(10), "ended after {took:?}");
    drop(silent);
}

#[test]
fn status_resolves_host_names() {
    // Issue 41 item 3: `--server localhost:39890` was refused (`invalid socket address syntax`).
    let agent = FakeAgent::answering("200 OK", containers_body(vec![running("shop", "web-1", "app")]));
    let server = format!("localhost:{}", agent.addr.port());
    let (output, _) = ends_within(&["status", "--server", &server], Duration::from_secs(20));
    assert!(output.status.success(), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.lines().nth(1).is_some_and(|row| row.starts_with("shop       web-1  app")), "{table}");
}

#[test]
fn status_shows_the_agents_refusal_with_what_to_do() {
    // Issue 41 item 3: every error body was replaced by the status line, with no hint.
    for (status, body, hint) in [
        ("401 Unauthorized", "no bearer token", "--token-file"),
        ("403 Forbidden", "forbidden: not allowed to list containers", "lifecycle-api-reader"),
        ("503 Service Unavailable", "cannot review the token", "cannot reach the Kubernetes API server"),
    ] {
        let agent = FakeAgent::answering(status, format!("{body}\n\u{1b}[2J"));
        let server = agent.addr.to_string();
        let (output, _) = ends_within(&["explain", "shop/web-1", "--server", &server], Duration::from_secs(20));
        assert!(!output.status.success());
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains(&format!("the agent at {server} answered {status}: {body}")), "{said}");
        assert!(said.contains(hint), "{said}");
        assert!(!said.contains('\u{1b}'), "the agent's escape reached the terminal: {said:?}");
        assert_eq!(said.lines().count(), 1, "one line of words: {said}");
    }
}

#[test]
fn status_prints_no_escape_from_an_agent_and_says_no_resources_found() {
    // Issue 37 item 9 and issue 41 item 8: escapes in an agent's answer were printed raw; an
    // empty selection printed a bare header.
    let hostile =
        FakeAgent::answering("200 OK", containers_body(vec![running("shop", "web\u{1b}]0;owned\u{7}", "app\u{9b}2J")]));
    for output in ["table", "wide", "json", "yaml"] {
        let (shown, _) =
            ends_within(&["status", "--server", &hostile.addr.to_string(), "-o", output], Duration::from_secs(20));
        assert!(shown.status.success(), "{shown:?}");
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "-o {output}: {text:?}");
    }
    let empty = FakeAgent::answering("200 OK", containers_body(vec![]));
    let (shown, _) =
        ends_within(&["status", "--server", &empty.addr.to_string(), "-n", "shop"], Duration::from_secs(20));
    assert!(shown.status.success(), "{shown:?}");
    assert_eq!(String::from_utf8_lossy(&shown.stdout), "");
    assert_eq!(String::from_utf8_lossy(&shown.stderr), "No resources found in shop namespace.\n");
}

#[test]
fn status_watch_writes_no_clear_screen_escape_into_a_pipe() {
    // Issue 41 item 8: `status -w` wrote clear-screen escapes into a pipe.
    let agent = FakeAgent::answering("200 OK", containers_body(vec![running("shop", "web-1", "app")]));
    let mut watch = KillOnDrop(
        Command::new(AGENT)
            .args(["status", "-w", "--server", &agent.addr.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("status -w"),
    );
    let mut stdout = BufReader::new(watch.0.stdout.take().expect("stdout"));
    // Two drawings (an agent that does not wait is asked again every second).
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.matches("NAMESPACE").count() < 2 {
        assert!(Instant::now() < deadline, "two drawings within 20 s: {seen:?}");
        let mut line = String::new();
        if stdout.read_line(&mut line).expect("read") == 0 {
            panic!("status -w ended: {seen:?}");
        }
        seen.push_str(&line);
    }
    assert!(agent.requests.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    assert!(!seen.contains('\u{1b}'), "{seen:?}");
}

#[test]
fn flags_take_compound_durations_and_typos_get_a_suggestion() {
    // Issue 41 item 8: `1h30m` was refused; no "did you mean" for flag typos.
    let output = Command::new(AGENT).args(["status", "--namspace", "shop"]).output().expect("status");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("a similar argument exists: '--namespace'"), "{said}");
    let output = Command::new(AGENT)
        .args(["status", "--request-timeout", "1h30", "--server", "127.0.0.1:1"])
        .output()
        .expect("status");
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a duration like 500ms, 5s, 1.5m, 1h or 1h30m"));
}
