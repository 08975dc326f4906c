//! Kernel tier: the README's "First look, on this host" block, run as written (only the agent's
//! path and address are this test's) against a running agent, gives the right answers: a unit
//! stopped by `kill` is SIGKILLed after a SIGTERM from the shell that ran `kill`, one over its
//! memory limit is `OOMKilled`, a crash loop under a shell loop restarts with `Error (1)`, and
//! `explain` draws the first one's stop. The block makes and removes its own cgroups; if it
//! fails half-way, this test removes what it left (its processes by pid, from the cgroups'
//! member lists).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use lifecycle_testkit::require_privileges;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const BEGIN: &str = "<!-- first-look:begin -->";
const END: &str = "<!-- first-look:end -->";
const UNITS: [&str; 3] = ["demo-kill", "demo-oom", "demo-loop"];

/// The agent this test started; ended by pid on drop.
struct Agent(std::process::Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn healthy(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr) else { return false };
    let _ = write!(stream, "GET /healthz HTTP/1.0\r\nHost: test\r\n\r\n");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains(" 200 ")
}

/// The block's shell commands, from the README.
fn first_look() -> String {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&readme).expect("README.md");
    let start = text.find(BEGIN).expect("the first-look block's start") + BEGIN.len();
    let end = text[start..].find(END).expect("the first-look block's end") + start;
    let block = text[start..end].trim();
    block.strip_prefix("```sh").and_then(|b| b.strip_suffix("```")).expect("a sh code block").to_owned()
}

/// What the block left if it stopped half-way: its processes (by pid) and its cgroups.
fn remove_leftovers() {
    let Ok(root) = lifecycle_agent::discovery::cgroupfs::CgroupRoot::detect() else { return };
    for unit in UNITS {
        for dir in [root.dir_of(&format!("/{unit}")), Path::new("/sys/fs/cgroup/memory").join(unit)] {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    // SAFETY: kill has no memory-safety preconditions; the pid is in a cgroup
                    // only this test's block makes.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let deadline = Instant::now() + Duration::from_secs(5);
                while std::fs::remove_dir(&dir).is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    let _ = std::fs::remove_file("/tmp/demo-ready");
}

#[test]
fn the_first_look_gives_right_answers_on_this_host() {
    require_privileges!();
    remove_leftovers();
    let addr = format!("127.0.0.1:{}", lifecycle_testkit::agent::free_port());
    let mut agent = Agent(
        Command::new(AGENT)
            .args(["run", "--listen", &addr, "--handoff-dir", "none"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start the agent"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthy(&addr) {
        assert!(agent.0.try_wait().expect("try_wait").is_none(), "the agent exited");
        assert!(Instant::now() < deadline, "the agent is not healthy in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Only where the agent is and where it listens are this test's.
    let block = first_look()
        .replace("B=target/release/lifecycle-agent", &format!("B={AGENT}"))
        .replace("$B status", &format!("$B status --server {addr}"))
        .replace("$B explain", &format!("$B explain --server {addr}"));
    let output = Command::new("bash").args(["-c", &block]).output().expect("bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    remove_leftovers();
    assert!(output.status.success(), "the block failed:\n{stdout}\n{stderr}");
    let row = |unit: &str| {
        stdout
            .lines()
            .find(|line| line.contains(&format!("/{unit} ")))
            .unwrap_or_else(|| panic!("no {unit} row:\n{stdout}"))
    };
    let kill = row("demo-kill");
    assert!(kill.contains("Error (137, SIGKILL)") && kill.contains("after SIGTERM from `bash` (pid "), "{kill}");
    assert!(!kill.contains("no stop signal"), "{kill}");
    assert!(row("demo-oom").contains("OOMKilled"), "{}", row("demo-oom"));
    let looped = row("demo-loop");
    let restarts: Vec<&str> = looped.split_whitespace().collect();
    assert!(looped.contains("Error (1)") && restarts.contains(&"2"), "two restarts, each ending Error (1): {looped}");
    assert!(stdout.contains("host unit /demo-kill"), "explain names the unit:\n{stdout}");
    assert!(stdout.contains("SIGTERM") && stdout.contains("SIGKILL"), "explain's timeline:\n{stdout}");
    // A plain host's unit has no Kubernetes cause to give.
    assert!(!stdout.contains("runtime_or_unknown") && !stdout.contains("runtime or unknown"), "{stdout}");
    eprintln!("{stdout}");
}
