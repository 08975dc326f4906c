//! Privileged tier, runtime faults: the agent keeps every container's identity and verdicts while
//! the container runtime restarts and while its socket cannot be reached.
//!
//! The DaemonSet mounts the runtime's socket *directory*, so a restarted runtime's new socket is
//! found on the agent's next connection attempt. Here a symlink to the harness's run directory
//! plays that mount: the agent resolves it on every attempt, and pointing it at an empty
//! directory cuts the agent off from the runtime (as a stale mount or a runtime still starting
//! does) without touching containerd.
//!
//! Run: `cargo test -p lifecycle-agent --test runtime_restart -- --test-threads=1`

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lifecycle_agent::discovery::cgroupfs::CgroupRoot;
use lifecycle_testkit::{
    agent::Agent,
    containerd::{start_or_skip, Containerd, KubeletAnnotations, Pod},
};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const SECOND: f64 = 1e9;

/// The agent's view of the runtime's socket directory: a symlink it resolves on each connect.
struct SocketView {
    dir: PathBuf,
    runtime: PathBuf,
}

impl SocketView {
    fn new(runtime: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("lifecycle-socket-view-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("empty")).expect("view dir");
        let view = Self { dir, runtime: runtime.to_owned() };
        view.point_at(&view.runtime.clone());
        view
    }

    /// The socket path the agent is given.
    fn socket(&self) -> PathBuf {
        self.dir.join("runtime/containerd.sock")
    }

    /// Replaces the link in one rename, so the agent never sees it missing.
    fn point_at(&self, target: &Path) {
        let next = self.dir.join("runtime.next");
        let _ = fs::remove_file(&next);
        std::os::unix::fs::symlink(target, &next).expect("symlink");
        fs::rename(&next, self.dir.join("runtime")).expect("swap symlink");
    }

    fn cut(&self) {
        self.point_at(&self.dir.join("empty"));
    }

    fn restore(&self) {
        self.point_at(&self.runtime.clone());
    }
}

impl Drop for SocketView {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn state(c: &Value) -> &str {
    c["state"]["state"].as_str().unwrap_or_default()
}

fn outcome(c: &Value) -> &str {
    c["last_termination"]["outcome"]["kind"].as_str().unwrap_or_default()
}

fn annotations(grace_s: i64) -> KubeletAnnotations {
    KubeletAnnotations { termination_grace_period_s: Some(grace_s), ..KubeletAnnotations::default() }
}

fn metric(agent: &Agent, name: &str) -> Option<f64> {
    agent
        .metrics()
        .lines()
        .find(|l| l.starts_with(name) && l.as_bytes().get(name.len()) == Some(&b' '))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The container's init (the lowest pid of its cgroup: `sh`, started before its children).
fn init_pid(pod: &Pod, container_id: &str) -> i32 {
    let root = CgroupRoot::detect().expect("cgroup v2 mount");
    let procs = root.dir_of(&format!("{}/{container_id}", pod.cgroup_parent)).join("cgroup.procs");
    let text = fs::read_to_string(&procs).unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    text.lines().filter_map(|l| l.parse().ok()).min().expect("a process in the container")
}

/// Polls the API until a container satisfies `done`, for at most `within`.
fn wait_for(agent: &Agent, within: Duration, what: &str, done: impl Fn(&Value) -> bool) -> (Value, Duration) {
    let began = Instant::now();
    loop {
        if let Some(found) = agent.containers().into_iter().find(|c| done(c)) {
            return (found, began.elapsed());
        }
        assert!(began.elapsed() < within, "not within {within:?}: {what}; containers: {:#?}", agent.containers());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(h: &mut Containerd, pod: &Pod, script: &str, grace_s: i64) -> String {
    h.run_container(pod, "app", &["sh", "-c", script], &annotations(grace_s), None).expect("container")
}

#[test]
fn containers_keep_their_identity_and_verdicts_across_a_runtime_restart() {
    let Some(mut h) = start_or_skip("containers_keep_their_identity_and_verdicts_across_a_runtime_restart") else {
        return;
    };
    let view = SocketView::new(h.run_dir());
    let agent = Agent::start_with_socket(AGENT, &view.socket(), &[]);
    let stubborn_pod = h.new_pod("stubborn").expect("pod");
    let stubborn = run(&mut h, &stubborn_pod, "trap '' TERM; while true; do sleep 0.1; done", 2);
    let killed_pod = h.new_pod("killed").expect("pod");
    let killed = run(&mut h, &killed_pod, "while true; do sleep 0.1; done", 30);
    agent.wait(&stubborn_pod, "app", "named and running", |c| state(c) == "running");
    agent.wait(&killed_pod, "app", "named and running", |c| state(c) == "running");
    assert_eq!(metric(&agent, "lifecycle_runtime_metadata_up"), Some(1.0));

    // The runtime restarts while the agent cannot reach its socket.
    view.cut();
    h.restart_containerd().expect("containerd restarts");
    // Killed from outside while the runtime is away: no stop signal, SIGKILL.
    // SAFETY: kill has no memory-safety preconditions; the pid is the init of our container.
    assert_eq!(unsafe { libc::kill(init_pid(&killed_pod, &killed), libc::SIGKILL) }, 0);

    // (a) A container started while the agent cannot reach the runtime is listed at once, by pod
    // uid and container id, and judged like any other.
    let unnamed_pod = h.new_pod("unnamed").expect("pod");
    let unnamed = run(&mut h, &unnamed_pod, "trap 'exit 0' TERM; while true; do sleep 0.1; done", 30);
    let short = &unnamed[..12];
    let (listed, after) = wait_for(&agent, Duration::from_secs(5), "the unnamed container listed by id", |c| {
        c["uid"] == unnamed_pod.uid.as_str() && c["container"] == short && state(c) == "running"
    });
    assert_eq!(listed["named_by_id"], true, "{listed:#}");
    assert_eq!(listed["pod"], "", "no pod name without the runtime");
    assert_eq!(listed["container_id"].as_str(), Some(unnamed.as_str()));
    eprintln!("listed by id {after:?} after its start");
    assert_eq!(metric(&agent, "lifecycle_runtime_metadata_up"), Some(0.0));
    assert!(metric(&agent, "lifecycle_runtime_metadata_refresh_failures_total").is_some_and(|n| n >= 1.0));
    let killed_view = agent.wait(&killed_pod, "app", "judged", |c| !c["last_termination"].is_null());

    // The agent reaches the runtime again: the container takes its name, keeping its identity.
    view.restore();
    let named = agent.wait(&unnamed_pod, "app", "named", |c| c["named_by_id"] == false && state(c) == "running");
    assert_eq!(named["container_id"].as_str(), Some(unnamed.as_str()));
    assert_eq!(named["cgroup_id"], listed["cgroup_id"]);
    assert_eq!((named["namespace"].as_str(), named["pod"].as_str()), (Some("default"), Some("unnamed")));
    assert_eq!(named["restart_count"], 0, "naming is not a restart");
    assert!(
        !agent.containers().iter().any(|c| c["container"] == short),
        "nothing stays behind under the id: {:#?}",
        agent.containers()
    );
    assert_eq!(metric(&agent, "lifecycle_runtime_metadata_up"), Some(1.0));

    // (b) A container started after the restart is named within 2 s.
    let fresh_pod = h.new_pod("fresh").expect("pod");
    let started = Instant::now();
    run(&mut h, &fresh_pod, "while true; do sleep 0.1; done", 30);
    agent.wait(&fresh_pod, "app", "named", |c| c["named_by_id"] == false && state(c) == "running");
    let named_after = started.elapsed();
    assert!(named_after < Duration::from_secs(2), "named {named_after:?} after its start");

    // (c) Stops across the restart are judged right.
    assert_eq!(outcome(&killed_view), "killed_without_grace", "{killed_view:#}");
    assert_eq!(killed_view["last_termination"]["outcome"]["sender"]["kind"], "other_process");
    assert_eq!(killed_view["state"]["exit_code"], 137);
    h.stop_container(&stubborn, 2).expect("stop");
    let done = agent.wait(&stubborn_pod, "app", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "sigkilled_after_grace", "{done:#}");
    assert_eq!(done["last_termination"]["outcome"]["grace_ns"].as_f64(), Some(2.0 * SECOND));
    assert_eq!(done["last_termination"]["outcome"]["sender"]["kind"], "runtime");
    h.stop_container(&unnamed, 30).expect("stop");
    let done = agent.wait(&unnamed_pod, "app", "judged", |c| !c["last_termination"].is_null());
    assert_eq!(outcome(&done), "exited_within_grace", "{done:#}");
    assert_eq!(done["last_termination"]["grace_ns"].as_f64(), Some(30.0 * SECOND), "grace learned when named");
}
