//! One node's run directory (`/tmp/lifecycle-kube/<pid>-<n>`: etcd data, certificates, the
//! kubelet's root dir, logs, and the records of what the node changed on the machine), the sweep
//! that undoes all of it — run by the node's `Drop` after the orderly stop, and at the next start
//! for runs whose owner process is gone — and the machine-wide lock that keeps one node at a time.

use std::{
    fs, io,
    os::linux::net::SocketAddrExt as _,
    os::unix::net::{SocketAddr, UnixListener},
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{machine, network, process::kill_recorded, BASE_DIR};
use crate::containerd::host::{alive, mounts, process_start_time, unmount};

static RUN_SEQUENCE: AtomicUsize = AtomicUsize::new(0);

/// The daemons a run records, stopped in this order (the kubelet first: it would restart pods).
pub(super) const DAEMONS: &[&str] = &["kubelet", "kube-apiserver", "etcd"];

fn owner_tag(pid: u32) -> String {
    format!("{pid} {}", process_start_time(pid).unwrap_or_default())
}

/// One node's private directory.
pub(super) struct RunDir {
    pub(super) path: PathBuf,
    pub(super) sequence: usize,
}

impl RunDir {
    pub(super) fn create() -> Result<Self> {
        let pid = std::process::id();
        let sequence = RUN_SEQUENCE.fetch_add(1, Ordering::SeqCst);
        let path = Path::new(BASE_DIR).join(format!("{pid}-{sequence}"));
        if path.exists() {
            // Same pid and sequence as a dead run: pid reuse. Its contents are stale.
            Self { path: path.clone(), sequence }.sweep();
        }
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        fs::write(path.join("owner"), owner_tag(pid)).context("write owner")?;
        Ok(Self { path, sequence })
    }

    fn owner_alive(&self) -> bool {
        let Ok(owner) = fs::read_to_string(self.path.join("owner")) else {
            return false;
        };
        let pid = owner.split_whitespace().next().and_then(|p| p.parse::<u32>().ok());
        pid.is_some_and(|pid| alive(pid) && owner_tag(pid) == owner)
    }

    /// Removes everything the run left on the machine; returns what could not be undone.
    pub(super) fn sweep(&self) -> Vec<String> {
        // 1. The daemons, if still running (a crashed owner leaves them orphaned).
        for daemon in DAEMONS {
            kill_recorded(&self.path, daemon);
        }
        // 2. The pods' processes and cgroups: everything below the node's cgroup root.
        let mut problems = machine::remove_cgroup_root(&self.path);
        // 3. Mounts under the run directory (the kubelet's bind mount of its root dir onto
        //    itself, pod volumes), deepest first, until none is left (mounts can be stacked).
        for _ in 0..5 {
            let mut ours: Vec<PathBuf> =
                mounts().into_iter().map(|m| m.point).filter(|p| p.starts_with(&self.path)).collect();
            if ours.is_empty() {
                break;
            }
            ours.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
            for point in ours {
                if let Err(e) = unmount(&point) {
                    problems.push(format!("umount {}: {e}", point.display()));
                }
            }
        }
        // 4. The bridge and libcni's cache; what the kubelet wrote outside its root; sysctls.
        problems.extend(network::clean(&self.path));
        problems.extend(machine::clean_host_paths(&self.path));
        problems.extend(machine::restore_sysctls(&self.path));
        // 5. The directory itself, and the base once no other run uses it.
        if let Err(e) = fs::remove_dir_all(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                problems.push(format!("remove {}: {e}", self.path.display()));
            }
        }
        let _ = fs::remove_dir(BASE_DIR);
        problems
    }
}

/// Sweeps run directories left by dead test processes.
pub(super) fn sweep_stale_runs() {
    let Ok(entries) = fs::read_dir(BASE_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let run = RunDir { path: entry.path(), sequence: 0 };
        if entry.path().is_dir() && !run.owner_alive() {
            eprintln!("kube: sweeping stale run {}", run.path.display());
            for problem in run.sweep() {
                eprintln!("kube: stale sweep: {problem}");
            }
        }
    }
}

/// One node per machine at a time: the kubelet writes fixed host paths (its device-plugin
/// socket, /var/log/pods), so two would collide. The lock is an abstract unix socket: nothing on
/// disk, released by the kernel when the holder exits however it exits.
pub(super) struct MachineLock {
    _socket: UnixListener,
}

impl MachineLock {
    const NAME: &'static [u8] = b"lifecycle-kube-node";

    /// Takes the lock, waiting up to `within` for another node (this process's or another's).
    pub(super) fn acquire(within: Duration) -> Result<Self> {
        let address = SocketAddr::from_abstract_name(Self::NAME).context("abstract socket name")?;
        let deadline = Instant::now() + within;
        let mut told = false;
        loop {
            match UnixListener::bind_addr(&address) {
                Ok(socket) => return Ok(Self { _socket: socket }),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    if Instant::now() > deadline {
                        bail!("another kube node has run on this machine for over {within:?}");
                    }
                    if !told {
                        eprintln!("kube: another node is running on this machine; waiting for it to finish");
                        told = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e).context("bind the node lock"),
            }
        }
    }
}
