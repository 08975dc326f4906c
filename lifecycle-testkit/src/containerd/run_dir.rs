//! One harness's private run directory (containerd root and state, sockets, runc state, logs,
//! the image) and the host state recorded in it, and the sweep that removes all of it — run by
//! the harness's own `Drop`, and at the next start for runs whose owner process is gone.

use std::{
    fmt::Write as _,
    fs, io,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    host::{alive, cgroup_hierarchies, mounts, pids_mentioning, process_start_time, signal, unmount, HostShare},
    BASE_DIR,
};

/// The process's own identity, so a later sweep can tell a live owner from a reused pid.
fn owner_tag(pid: u32) -> String {
    format!("{pid} {}", process_start_time(pid).unwrap_or_default())
}

static RUN_SEQUENCE: AtomicUsize = AtomicUsize::new(0);

/// One harness's private directory and the host state recorded in it for the sweep.
pub(super) struct RunDir {
    pub(super) path: PathBuf,
    pub(super) socket: PathBuf,
}

impl RunDir {
    pub(super) fn create() -> Result<Self> {
        let pid = std::process::id();
        let n = RUN_SEQUENCE.fetch_add(1, Ordering::SeqCst);
        let path = Path::new(BASE_DIR).join(format!("{pid}-{n}"));
        if path.exists() {
            // Same pid and sequence as a dead run: pid reuse. Its contents are stale.
            Self::open(path.clone()).sweep();
        }
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        fs::write(path.join("owner"), owner_tag(pid)).context("write owner")?;
        Ok(Self::open(path))
    }

    fn open(path: PathBuf) -> Self {
        let socket = path.join("containerd.sock");
        Self { path, socket }
    }

    fn owner_alive(&self) -> bool {
        let Ok(owner) = fs::read_to_string(self.path.join("owner")) else {
            return false;
        };
        let pid = owner.split_whitespace().next().and_then(|p| p.parse::<u32>().ok());
        pid.is_some_and(|pid| alive(pid) && owner_tag(pid) == owner)
    }

    /// Notes, before the runtime creates them, which cgroup directories will be ours: in each
    /// hierarchy the pod directory (with everything below it) and any ancestor that does not
    /// exist yet (by itself: other pods may appear under it later).
    pub(super) fn record_cgroup_parent(&self, cgroup_parent: &str) -> Result<()> {
        let parts: Vec<_> = cgroup_parent.trim_start_matches('/').split('/').collect();
        let mut text = fs::read_to_string(self.path.join("cgroups")).unwrap_or_default();
        for hierarchy in cgroup_hierarchies() {
            let mut dir = hierarchy.clone();
            for (i, part) in parts.iter().enumerate() {
                dir.push(part);
                if i + 1 == parts.len() {
                    let _ = writeln!(text, "pod {}", dir.display());
                } else if !dir.exists() {
                    let _ = writeln!(text, "ancestor {}", dir.display());
                    HostShare::note_ancestor(&dir);
                }
            }
        }
        fs::write(self.path.join("cgroups"), text).context("record cgroups")
    }

    /// The recorded cgroups: (pod directories, ancestors we created).
    fn recorded_cgroups(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let text = fs::read_to_string(self.path.join("cgroups")).unwrap_or_default();
        let (mut pods, mut ancestors) = (Vec::new(), Vec::new());
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pod", dir)) => pods.push(PathBuf::from(dir)),
                Some(("ancestor", dir)) => ancestors.push(PathBuf::from(dir)),
                _ => {}
            }
        }
        (pods, ancestors)
    }

    /// Removes everything the run left on the host; returns what could not be removed.
    pub(super) fn sweep(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // 1. Our containerd, if it is still running (a crashed owner leaves it orphaned).
        if let Some(pid) = fs::read_to_string(self.path.join("containerd.pid")).ok().and_then(|p| p.trim().parse().ok())
        {
            let config = self.path.join("config.toml").to_string_lossy().into_owned();
            if pids_mentioning(&config, "containerd").contains(&pid) {
                signal(pid, libc::SIGKILL);
                wait_gone(&[pid]);
            }
        }
        // 2. Shims serving our socket, then anything still in our cgroups (the containers of a
        //    killed shim keep running otherwise).
        let shims = pids_mentioning(&self.socket.to_string_lossy(), "containerd-shim-runc-v2");
        for pid in &shims {
            signal(*pid, libc::SIGKILL);
        }
        wait_gone(&shims);
        // A killed shim leaves its socket in /run/containerd/s; each bundle's `address` file
        // names it. (Shims that exited normally removed theirs already.)
        for socket in shim_sockets(&self.path.join("state/io.containerd.runtime.v2.task")) {
            let _ = fs::remove_file(socket);
        }
        let (pod_cgroups, ancestors) = self.recorded_cgroups();
        for dir in &pod_cgroups {
            let pids = cgroup_pids(dir);
            for pid in &pids {
                signal(*pid, libc::SIGKILL);
            }
            wait_gone(&pids);
        }
        // 3. Mounts under the run directory (rootfs overlays, sandbox shm), deepest first.
        let mut ours: Vec<PathBuf> =
            mounts().into_iter().map(|m| m.point).filter(|p| p.starts_with(&self.path)).collect();
        ours.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for point in ours {
            if let Err(e) = unmount(&point) {
                problems.push(format!("umount {}: {e}", point.display()));
            }
        }
        // 4. Cgroup directories, children before parents. An ancestor that another user of
        //    /kubepods populated meanwhile is not empty: rmdir refuses, and that is right.
        let mut dirs = Vec::new();
        for dir in &pod_cgroups {
            collect_subdirs(dir, &mut dirs);
        }
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        dirs.dedup();
        for dir in dirs {
            match fs::remove_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    problems.push(format!("rmdir {}: {e}", dir.display()));
                }
                _ => {}
            }
        }
        let mut ancestors = ancestors;
        ancestors.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        ancestors.dedup();
        for dir in ancestors {
            let _ = fs::remove_dir(&dir);
        }
        // 5. The directory itself, and the shared base once no other run uses it (remove_dir
        // fails harmlessly while another harness's directory is still inside).
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
        let run = RunDir::open(entry.path());
        if entry.path().is_dir() && !run.owner_alive() {
            eprintln!("containerd harness: sweeping stale run {}", run.path.display());
            for problem in run.sweep() {
                eprintln!("containerd harness: stale sweep: {problem}");
            }
        }
    }
}

/// The shim sockets named by `<task dir>/<namespace>/<id>/address` files.
pub(super) fn shim_sockets(task_dir: &Path) -> Vec<PathBuf> {
    let bundles = fs::read_dir(task_dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|namespace| fs::read_dir(namespace.path()).into_iter().flatten().flatten());
    let mut sockets: Vec<PathBuf> = bundles
        .filter_map(|bundle| fs::read_to_string(bundle.path().join("address")).ok())
        .filter_map(|address| {
            let path = PathBuf::from(address.trim().strip_prefix("unix://")?);
            path.starts_with("/run/containerd/s").then_some(path)
        })
        .collect();
    // Containers of a sandbox share its shim, so their bundles name the same socket.
    sockets.sort();
    sockets.dedup();
    sockets
}

fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut dirs = Vec::new();
    collect_subdirs(dir, &mut dirs);
    dirs.iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// `dir` and every directory below it.
fn collect_subdirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_subdirs(&entry.path(), out);
            }
        }
    }
}
