//! Privileged tier: a plain host's units as a newcomer meets them (issue 41, items 1 and 2). An
//! agent runs with no container runtime; processes in fresh cgroups are stopped as people stop
//! them (`kill`, `kill -KILL` after a TERM that is ignored), and `status`, `explain host/<path>`,
//! `/api/v1/history` and the verdict log say what happened and who did it: never "no stop
//! signal" for a stop signal the kernel saw, and every stop explainable after its cgroup is gone.

use std::{
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    agent::{free_port, get},
    cgroup::TestCgroup,
    require_privileges,
};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const PYTHON: &str = "/usr/bin/python3";

/// The agent on this host alone (no runtime answers at the socket given), its verdict log in a
/// file; stopped by pid on drop.
struct HostAgent {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl HostAgent {
    fn start() -> Self {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::env::temp_dir().join(format!("lifecycle-host-units-{}.jsonl", std::process::id()));
        let stdout = std::fs::File::create(&log).expect("verdict log file");
        let child = Command::new(AGENT)
            .args([
                "run",
                "--listen",
                &addr,
                "--cri-socket",
                "/nonexistent/lifecycle-test.sock",
                "--handoff-dir",
                "none",
            ])
            .env("RUST_LOG", "warn")
            .stdout(stdout)
            .spawn()
            .expect("start agent");
        let agent = Self { child, addr, log };
        wait_for("the agent to be healthy", || get(&agent.addr, "/healthz").is_some_and(|(code, _)| code == 200));
        agent
    }

    fn client(&self, args: &[&str]) -> Output {
        Command::new(AGENT).args(args).args(["--server", &self.addr]).output().expect("run the client")
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A python process in `cg` that ignores SIGTERM (or not) and sleeps; returns once it runs.
fn sleeper(cg: &mut TestCgroup, ignore_term: bool) -> Child {
    let handler = if ignore_term { "signal.signal(signal.SIGTERM, signal.SIG_IGN); " } else { "" };
    let script = format!("import signal, sys, time; {handler}print('up', flush=True); time.sleep(1000)");
    let mut child = cg.spawn(Command::new(PYTHON).args(["-c", &script]).stdout(Stdio::piped()));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line)
        .expect("the sleeper starts");
    child
}

/// `kill -<signal> <pid>` run as its own process: its pid is the sender's.
fn kill(signal: &str, pid: u32) -> u32 {
    let mut kill = Command::new("/bin/kill").args([&format!("-{signal}"), &pid.to_string()]).spawn().expect("kill");
    let sender = kill.id();
    assert!(kill.wait().expect("kill ran").success());
    sender
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_term_ignored_then_killed_and_a_plain_kill_are_judged_with_their_sender_and_explained() {
    require_privileges!();
    let agent = HostAgent::start();

    // Issue 41, item 1: TERM ignored, then KILL 1 s later.
    let mut ignoring = TestCgroup::new("ignores-term");
    let mut child = sleeper(&mut ignoring, true);
    let term_sender = kill("TERM", child.id());
    std::thread::sleep(Duration::from_secs(1));
    let kill_sender = kill("KILL", child.id());
    let _ = child.wait();
    let path = ignoring.path.clone();
    let row = || stdout(&agent.client(&["status", "-c", &path]));
    wait_for("the stop to be judged", || row().contains("SIGKILLED"));
    let table = row();
    assert!(
        table.contains(&format!("after SIGTERM from `kill` (pid {term_sender})")) && table.contains("no grace applies"),
        "{table}"
    );
    assert!(!table.contains("without stop signal") && !table.contains("without grace"), "{table}");

    // A plain `kill`: the process dies of the TERM.
    let mut plain = TestCgroup::new("plain-kill");
    let mut child = sleeper(&mut plain, false);
    let plain_sender = kill("TERM", child.id());
    let _ = child.wait();
    let plain_path = plain.path.clone();
    let row = || stdout(&agent.client(&["status", "-c", &plain_path]));
    wait_for("the kill to be judged", || row().contains("killed by"));
    let table = row();
    assert!(table.contains(&format!("killed by SIGTERM from `kill` (pid {plain_sender})")), "{table}");
    assert!(table.contains("Error (143, SIGTERM)") && !table.contains("without stop signal"), "{table}");

    // Issue 41, item 2: each is explainable, after its cgroup is gone too.
    drop(ignoring);
    drop(plain);
    let explained = stdout(&agent.client(&["explain", &format!("host{path}")]));
    assert!(
        explained.starts_with(&format!("host unit {path}: SIGKILLed by `kill` (pid {kill_sender})")),
        "{explained}"
    );
    assert!(explained.contains(&format!("SIGTERM to the main process from `kill` (pid {term_sender})")), "{explained}");
    let query = format!("/api/v1/history?namespace=host&container={}", path.replace('/', "%2F"));
    let (code, history) = get(&agent.addr, &query).expect("history answers");
    assert_eq!(code, 200, "{history}");
    let history: serde_json::Value = serde_json::from_str(&history).expect("JSON");
    assert_eq!(history["stops"].as_array().map(Vec::len), Some(1), "{history}");
    assert_eq!(history["stops"][0]["last_termination"]["outcome"]["kind"], "sigkilled_after_stop_signal");
    // The page lists it with a link to the unit's own page.
    let (_, page) = get(&agent.addr, "/explain").expect("the node page");
    assert!(page.contains(&format!("href=\"/explain/host{path}\"")), "{page}");
    let (code, unit_page) = get(&agent.addr, &format!("/explain/host{path}")).expect("the unit's page");
    assert!(code == 200 && unit_page.contains("SIGKILLed by `kill`"), "{unit_page}");
    // The verdict log has a line for each stop, once it settled.
    wait_for("the verdict log's lines", || {
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        log.contains(&format!("\"container\":\"{path}\"")) && log.contains(&format!("\"container\":\"{plain_path}\""))
    });
}
