//! The node's daemons (etcd, kube-apiserver, kubelet) as child processes: spawned with their
//! output in a log file of the run directory and their pid recorded there (with its start time,
//! so a later sweep never kills a reused pid), stopped by pid with SIGTERM then SIGKILL.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::containerd::host::{alive, process_start_time, signal};

/// One daemon this node started.
pub(super) struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `command` with stdout and stderr appended to `<run>/<name>.log` and records its pid
    /// in `<run>/<name>.pid` as `<pid> <start time>`.
    pub(super) fn spawn(name: &'static str, run: &Path, command: &mut Command) -> Result<Self> {
        let log_path = run.join(format!("{name}.log"));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("dup log fd")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {name} ({command:?})"))?;
        let tag = format!("{} {}", child.id(), process_start_time(child.id()).unwrap_or_default());
        fs::write(run.join(format!("{name}.pid")), tag).with_context(|| format!("record {name}'s pid"))?;
        Ok(Self { name, child, log: log_path })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails, with the log's tail, when the daemon has exited.
    pub(super) fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait().context("wait")? {
            bail!("{} exited with {status}:\n{}", self.name, log_tail(&self.log, 40));
        }
        Ok(())
    }

    /// The last `lines` lines of the daemon's log.
    pub(super) fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM, then SIGKILL when it has not exited within `grace`; returns how long it took.
    pub(super) fn stop(mut self, grace: Duration) -> Duration {
        let began = Instant::now();
        if let Ok(Some(_)) = self.child.try_wait() {
            return began.elapsed();
        }
        signal(self.child.id(), libc::SIGTERM);
        while began.elapsed() < grace {
            if let Ok(Some(_)) = self.child.try_wait() {
                return began.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if grace >= Duration::from_secs(1) {
            eprintln!("kube: {} ignored SIGTERM for {grace:?}; killing it", self.name);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        began.elapsed()
    }
}

/// The last `lines` lines of a log file.
pub(super) fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<_> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// SIGKILLs the daemon recorded in `<run>/<name>.pid` if that very process (same start time)
/// still runs, and waits for it to go.
pub(super) fn kill_recorded(run: &Path, name: &str) {
    let Ok(tag) = fs::read_to_string(run.join(format!("{name}.pid"))) else {
        return;
    };
    let Some(pid) = tag.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) else {
        return;
    };
    let now = format!("{pid} {}", process_start_time(pid).unwrap_or_default());
    if alive(pid) && now == tag.trim() {
        signal(pid, libc::SIGKILL);
        wait_gone(&[pid], Duration::from_secs(5));
    }
}

/// Waits until none of `pids` is alive (zombies count as gone), at most `within`.
pub(super) fn wait_gone(pids: &[u32], within: Duration) {
    let deadline = Instant::now() + within;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}
