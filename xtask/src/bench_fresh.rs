//! `bench fresh-run`: how long the README's `xtask/x.sh run` takes to serve `/metrics` on a
//! fresh machine. A clone of a commit runs with an empty `RUSTUP_HOME` and `CARGO_HOME` (only the
//! `rustup` binary is copied in), so it downloads and builds everything a new machine would: the
//! pinned stable and nightly, the crates, bpf-linker, the eBPF programs and the release agent.
//! What it cannot make fresh: the Debian packages already installed here (`protobuf-compiler`;
//! `apt-get install` of it takes seconds) and the page cache. `--baseline` times another commit
//! in the same run, before this one, for a ratio on this shared machine.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::tracer::free_port;
use crate::{shell, workspace_root};

/// Longer than any fresh build seen here (about 5 min).
const SERVE_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// One timed `run`: when each xtask step began (seconds from the command) and when `/metrics`
/// answered.
struct Timing {
    commit: String,
    steps: Vec<(f64, String)>,
    served_s: f64,
}

pub fn run(baseline: Option<&str>) -> Result<()> {
    let head = shell::capture(Command::new("git").current_dir(workspace_root()).args(["rev-parse", "HEAD"]))?;
    let mut commits: Vec<String> = baseline.map(str::to_owned).into_iter().collect();
    commits.push(head.trim().to_owned());
    let mut timings = Vec::new();
    for commit in &commits {
        timings.push(time_fresh_run(commit)?);
    }
    println!("\n| commit | step | seconds from `xtask/x.sh run` |");
    println!("|---|---|---|");
    for timing in &timings {
        for (at, step) in &timing.steps {
            println!("| {} | {step} | {at:.1} |", short(&timing.commit));
        }
        println!("| {} | **`/metrics` answered** | **{:.1}** |", short(&timing.commit), timing.served_s);
    }
    if let [before, after] = &timings[..] {
        println!("\nthis tree / baseline: {:.2}", after.served_s / before.served_s);
    }
    Ok(())
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(7)]
}

/// Clones `commit`, runs its `xtask/x.sh run` with empty toolchain homes until `/metrics`
/// answers, then stops it (its process group) and removes everything it made.
fn time_fresh_run(commit: &str) -> Result<Timing> {
    let port = free_port()?;
    let dir = TempDir(std::env::temp_dir().join(format!("lifecycle-fresh-{}-{port}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let source = dir.0.join("src");
    shell::run(Command::new("git").args(["clone", "-q"]).arg(workspace_root()).arg(&source))?;
    shell::run(Command::new("git").current_dir(&source).args(["checkout", "-q", commit]))?;
    let (rustup_home, cargo_home) = (dir.0.join("rustup"), dir.0.join("cargo"));
    let bin = cargo_home.join("bin");
    std::fs::create_dir_all(&bin)?;
    let rustup = which("rustup").context("rustup is not on PATH")?;
    std::fs::copy(&rustup, bin.join("rustup")).context("copying rustup")?;
    for proxy in ["cargo", "rustc"] {
        std::os::unix::fs::symlink("rustup", bin.join(proxy))?;
    }
    // The machine's PATH without any other cargo home.
    let path = std::env::var("PATH").unwrap_or_default();
    let path: Vec<&str> = path.split(':').filter(|p| !p.contains(".cargo") && !p.contains(".rustup")).collect();
    let path = format!("{}:{}", bin.display(), path.join(":"));
    eprintln!("xtask: timing a fresh `xtask/x.sh run` of {commit} in {}", dir.0.display());
    let began = Instant::now();
    let mut child = Command::new(source.join("xtask/x.sh"))
        .args(["run", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(&source)
        .env("RUSTUP_HOME", &rustup_home)
        .env("CARGO_HOME", &cargo_home)
        .env("PATH", path)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("starting xtask/x.sh run")?;
    let group = Group(child.id());
    let stderr = child.stderr.take().context("stderr")?;
    let log = std::thread::spawn(move || {
        // The xtask steps, with when each began; the rest of the output is not kept.
        let mut steps = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("xtask: ") || line.trim_start().starts_with("Finished ") {
                steps.push((began.elapsed().as_secs_f64(), line.trim().to_owned()));
            }
        }
        steps
    });
    let served = loop {
        if metrics_answer(port) {
            break began.elapsed();
        }
        if let Some(status) = child.try_wait()? {
            bail!("xtask/x.sh run ended ({status}) before /metrics answered");
        }
        if began.elapsed() > SERVE_TIMEOUT {
            bail!("/metrics did not answer within {SERVE_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(group);
    let _ = child.wait();
    let steps = log.join().unwrap_or_default();
    Ok(Timing { commit: commit.to_owned(), steps, served_s: served.as_secs_f64() })
}

/// Whether `GET /metrics` on the port answers 200.
fn metrics_answer(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut head = [0u8; 16];
    let n = stream.read(&mut head).unwrap_or(0);
    head[..n].starts_with(b"HTTP/1.") && head[..n].windows(5).any(|w| w == b" 200 ")
}

fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(binary)).find(|p| p.is_file())
}

/// The run's process group (x.sh, cargo, the agent): ended with SIGTERM when dropped (the agent
/// detaches its programs on it).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this benchmark started (negative pid).
        unsafe { libc::kill(-(self.0 as i32), libc::SIGTERM) };
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
