//! The `lifecycle-agent run` binary pointed at a containerd harness, and the HTTP calls the
//! end-to-end tests make to it.
//!
//! The binary's path comes from the test: only the agent's own integration tests get
//! `CARGO_BIN_EXE_lifecycle-agent` (and cargo builds the binary for them).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::containerd::{Containerd, Pod};

/// The agent binary pointed at the harness's runtime; stopped (by pid) on drop.
pub struct Agent {
    child: Child,
    pub addr: String,
    /// Where the agent's stdout (its verdict log, one JSON line per judged stop) goes.
    verdict_log: std::path::PathBuf,
    /// Its handoff directory, its own unless the test gave one (`--handoff-dir`): an agent of
    /// another test, or the node's own (`/run/lifecycle-agent`, the default), is never asked
    /// for its sockets nor told it was replaced.
    handoff_dir: Option<std::path::PathBuf>,
}

impl Agent {
    /// Starts `binary` (`env!("CARGO_BIN_EXE_lifecycle-agent")`) with `run` against the
    /// harness's CRI socket plus `extra` flags, and waits until /healthz answers 200.
    pub fn start(binary: impl AsRef<Path>, h: &Containerd, extra: &[&str]) -> Self {
        Self::start_with_socket(binary, h.socket(), extra)
    }

    /// Like [`Self::start`], with the CRI socket at `socket` (a path that reaches the harness's
    /// socket some other way, as a mounted directory does).
    pub fn start_with_socket(binary: impl AsRef<Path>, socket: &Path, extra: &[&str]) -> Self {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let socket = socket.to_string_lossy().into_owned();
        let verdict_log = std::env::temp_dir().join(format!("lifecycle-verdicts-{}-{port}.jsonl", std::process::id()));
        let stdout = std::fs::File::create(&verdict_log).expect("create the verdict log file");
        let handoff_dir = (!extra.contains(&"--handoff-dir"))
            .then(|| std::env::temp_dir().join(format!("lifecycle-handoff-{}-{port}", std::process::id())));
        let own_handoff: Vec<String> = match &handoff_dir {
            Some(dir) => vec!["--handoff-dir".into(), dir.to_string_lossy().into_owned()],
            None => Vec::new(),
        };
        let child = Command::new(binary.as_ref())
            .args(["run", "--listen", &addr, "--cri-socket", &socket])
            .args(&own_handoff)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(stdout)
            .spawn()
            .expect("start agent");
        let agent = Self { child, addr, verdict_log, handoff_dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(&agent.addr, "/healthz").is_none_or(|(code, _)| code != 200) {
            assert!(Instant::now() < deadline, "agent not healthy in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    pub fn containers(&self) -> Vec<Value> {
        let (_, body) = get(&self.addr, "/api/v1/containers").expect("api answers");
        let value: Value = serde_json::from_str(&body).expect("JSON");
        value["containers"].as_array().cloned().unwrap_or_default()
    }

    /// Polls the API until the pod's container satisfies `done`.
    pub fn wait(&self, pod: &Pod, container: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found =
                self.containers().into_iter().find(|c| c["uid"] == pod.uid.as_str() && c["container"] == container);
            if let Some(c) = found.as_ref().filter(|c| done(c)) {
                return c.clone();
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last seen: {found:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The verdict log's lines so far, parsed (each a judged stop).
    pub fn verdict_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.verdict_log)
            .unwrap_or_default()
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|err| panic!("a verdict line is JSON ({err}): {line}"))
            })
            .collect()
    }

    /// The body of /metrics.
    pub fn metrics(&self) -> String {
        get(&self.addr, "/metrics").expect("metrics").1
    }

    /// A request to the node probe endpoint: (HTTP status, body).
    pub fn probe(&self, pod: &Pod, container: &str, query: &str) -> (u16, String) {
        let path = format!("/api/v1/probe/{}/{}/{container}?{query}", pod.namespace, pod.name);
        get(&self.addr, &path).expect("probe endpoint answers")
    }

    /// Probes until the answer has `code` (the probe supervisor picks containers up within its
    /// 1 s reconcile period, and exits flip results from the kernel's event).
    pub fn probe_until(&self, pod: &Pod, container: &str, query: &str, code: u16) {
        self.probe_until_body(pod, container, query, code, |_| true);
    }

    /// Probes until the answer has `code` and a body `said` accepts: for checks whose answer
    /// comes from a sample refreshed in the background, where an earlier sample may give the
    /// same code for another reason.
    pub fn probe_until_body(&self, pod: &Pod, container: &str, query: &str, code: u16, said: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self.probe(pod, container, query);
            if answer.0 == code && said(&answer.1) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "probe {query} on {}/{container} never answered {code}: {answer:?}",
                pod.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Agent {
    /// The agent's view of `container` of the pod named `pod`, once `done` holds, polled for at
    /// most `within` (`what` names the wait in the failure).
    pub fn wait_named(
        &self,
        pod: &str,
        container: &str,
        what: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let began = Instant::now();
        loop {
            let found = self.containers().into_iter().find(|c| c["pod"] == pod && c["container"] == container);
            if let Some(c) = found.as_ref().filter(|c| done(c)) {
                return c.clone();
            }
            assert!(began.elapsed() < within, "{pod}/{container}: not {what} within {within:?}; last seen: {found:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the agent, as the OOM killer or a node problem would: no clean-up runs.
    pub fn kill(mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is the agent we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is the agent we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.verdict_log);
        if let Some(dir) = &self.handoff_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// HTTP/1.0 GET: (status, body), or None when the server does not answer.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    get_with_token(addr, path, None)
}

/// HTTP/1.0 GET with `Authorization: Bearer <token>` when a token is given.
pub fn get_with_token(addr: &str, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: lifecycle\r\n{authorization}\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The sum of every sample of `family` (all its label sets) in a Prometheus text body.
pub fn metric_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|line| line.strip_prefix(family).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Reading one container of the agent's `/api/v1/containers` answer.
pub mod view {
    use serde_json::Value;

    pub fn running(c: &Value) -> bool {
        c["state"]["state"] == "running"
    }

    pub fn judged(c: &Value) -> bool {
        !c["last_termination"].is_null()
    }

    /// The last termination's outcome kind (empty when not judged).
    pub fn outcome(c: &Value) -> &str {
        c["last_termination"]["outcome"]["kind"].as_str().unwrap_or_default()
    }

    /// The grace period of the last termination in seconds (-1 when not judged).
    pub fn grace_s(c: &Value) -> f64 {
        c["last_termination"]["grace_ns"].as_f64().unwrap_or(-1.0) / 1e9
    }
}
