//! What a node changes on the machine outside its run directory, recorded in the run directory
//! before the change and undone from that record — by `Drop`, or by the sweep of a crashed run:
//!
//! - sysctls: the kubelet sets `vm.overcommit_memory=1`, `vm.panic_on_oom=0`, `kernel.panic=10`,
//!   `kernel.panic_on_oops=1`, `kernel.keys.root_max{keys,bytes}`; the CNI bridge plugin turns on
//!   IPv4 forwarding for its gateway. Saved at start, written back at the end when they differ.
//! - paths the kubelet writes whatever its `--root-dir` (`/var/lib/kubelet/device-plugins`,
//!   `/var/log/pods`, `/var/log/containers`) and libcni's cache (`/var/lib/cni`): removed when
//!   the node created them; when they existed, only the entries that appeared meanwhile go.
//! - the cgroup root (`--cgroup-root`): created by the node in every hierarchy, so everything
//!   below it is the node's; at the end its processes are killed and its directories removed.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};

use super::process::wait_gone;
use crate::containerd::host::{cgroup_hierarchies, signal};

/// Sysctls the kubelet or the CNI bridge plugin may change (paths under /proc/sys).
pub(super) const SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
];

/// Paths the kubelet (or libcni, under containerd) writes outside the node's directories.
const HOST_PATHS: &[&str] = &["/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni"];

/// The current value of each of [`SYSCTLS`] that exists on this kernel.
pub(super) fn read_sysctls() -> Vec<(&'static str, String)> {
    SYSCTLS
        .iter()
        .filter_map(|key| Some((*key, fs::read_to_string(Path::new("/proc/sys").join(key)).ok()?.trim().to_owned())))
        .collect()
}

/// Saves the sysctls and the state of the host paths into the run directory.
pub(super) fn record(run: &Path) -> Result<()> {
    let mut text = String::new();
    for (key, value) in read_sysctls() {
        let _ = writeln!(text, "{key} {value}");
    }
    fs::write(run.join("sysctls"), text).context("record sysctls")?;
    let mut paths = String::new();
    for path in HOST_PATHS {
        match fs::read_dir(path) {
            Ok(entries) => {
                let names: Vec<String> =
                    entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                let _ = writeln!(paths, "existed {path} {}", names.join("/"));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let _ = writeln!(paths, "absent {path}");
            }
            Err(e) => return Err(e).with_context(|| format!("read {path}")),
        }
    }
    fs::write(run.join("host-paths"), paths).context("record host paths")
}

/// Writes back every recorded sysctl whose value changed; returns what could not be restored.
pub(super) fn restore_sysctls(run: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = fs::read_to_string(run.join("sysctls")).unwrap_or_default();
    for (key, saved) in text.lines().filter_map(|l| l.split_once(' ')) {
        let path = Path::new("/proc/sys").join(key);
        let now = fs::read_to_string(&path).unwrap_or_default();
        if now.trim() != saved {
            if let Err(e) = fs::write(&path, saved) {
                problems.push(format!("restore {key}={saved} (now {}): {e}", now.trim()));
            }
        }
    }
    problems
}

/// Removes what appeared in the recorded host paths since the start; returns what failed.
pub(super) fn clean_host_paths(run: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = fs::read_to_string(run.join("host-paths")).unwrap_or_default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ' ');
        let (state, path) = (fields.next().unwrap_or_default(), PathBuf::from(fields.next().unwrap_or_default()));
        if path.as_os_str().is_empty() || !path.exists() {
            continue;
        }
        let result = match state {
            "absent" => fs::remove_dir_all(&path),
            "existed" => {
                let before: BTreeSet<&str> = fields.next().unwrap_or_default().split('/').collect();
                fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| !before.contains(e.file_name().to_string_lossy().as_ref()))
                    .try_for_each(|e| {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            fs::remove_dir_all(e.path())
                        } else {
                            fs::remove_file(e.path())
                        }
                    })
            }
            _ => Ok(()),
        };
        if let Err(e) = result {
            problems.push(format!("clean {}: {e}", path.display()));
        }
    }
    problems
}

/// Creates the cgroup root `name` (e.g. `/lifecycle-kube-123-0`) in every hierarchy, recording
/// each directory first. cpuset needs its cpus and mems set before children can run tasks.
pub(super) fn create_cgroup_root(run: &Path, name: &str) -> Result<()> {
    let dirs: Vec<PathBuf> = cgroup_hierarchies().into_iter().map(|h| h.join(name.trim_start_matches('/'))).collect();
    let text: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
    fs::write(run.join("cgroup-root"), text).context("record the cgroup root")?;
    for dir in &dirs {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        if let Some(parent) = dir.parent() {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = fs::read_to_string(parent.join(file)) {
                    if fs::read_to_string(dir.join(file)).is_ok_and(|v| v.trim().is_empty()) {
                        fs::write(dir.join(file), value.trim()).with_context(|| format!("set {file}"))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Kills every process below the recorded cgroup root and removes its directories, children
/// first; returns what could not be removed.
pub(super) fn remove_cgroup_root(run: &Path) -> Vec<String> {
    let roots: Vec<PathBuf> =
        fs::read_to_string(run.join("cgroup-root")).unwrap_or_default().lines().map(PathBuf::from).collect();
    let mut dirs = Vec::new();
    for root in &roots {
        collect_dirs(root, &mut dirs);
    }
    for _ in 0..3 {
        let pids: Vec<u32> = dirs
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
            .collect();
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            signal(*pid, libc::SIGKILL);
        }
        wait_gone(&pids, Duration::from_secs(5));
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let mut problems = Vec::new();
    for dir in dirs {
        // A cgroup whose last task just exited can be busy for a moment.
        let mut result = fs::remove_dir(&dir);
        for _ in 0..50 {
            match &result {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(20));
                    result = fs::remove_dir(&dir);
                }
                _ => break,
            }
        }
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => problems.push(format!("rmdir {}: {e}", dir.display())),
            _ => {}
        }
    }
    problems
}

/// `dir` and every directory below it.
fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}

/// What a node can leave behind on the machine, for tests that check it left nothing: the
/// sysctls it may change, mounts of its run directories and pod network namespaces, its bridges,
/// its cgroup roots, the kubelet's host paths and libcni's cache, processes started from its run
/// directories, and the run directories themselves. Only node-specific things, so that other
/// work on the machine (another harness's containers) does not make two snapshots differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineState {
    pub sysctls: Vec<(String, String)>,
    pub mounts: Vec<PathBuf>,
    pub bridges: Vec<String>,
    pub cgroup_roots: Vec<PathBuf>,
    /// Each host path with its entries (`None` when absent).
    pub host_paths: Vec<(PathBuf, Option<Vec<String>>)>,
    /// `pid cmdline` of processes whose command line mentions a node run directory.
    pub processes: Vec<String>,
    pub run_dirs: Vec<String>,
}

impl MachineState {
    pub fn capture() -> Self {
        let entries = |dir: &Path| -> Option<Vec<String>> {
            let mut names: Vec<String> =
                fs::read_dir(dir).ok()?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            Some(names)
        };
        let mut mounts: Vec<PathBuf> = crate::containerd::host::mounts()
            .into_iter()
            .map(|m| m.point)
            .filter(|p| p.starts_with(super::BASE_DIR) || p.to_string_lossy().contains("/netns/cni-"))
            .collect();
        mounts.sort();
        let bridges = entries(Path::new("/sys/class/net"))
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name.starts_with("lck"))
            .collect();
        let mut cgroup_roots: Vec<PathBuf> = cgroup_hierarchies()
            .into_iter()
            .flat_map(|h| fs::read_dir(h).into_iter().flatten().flatten().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("lifecycle-kube-")))
            .collect();
        cgroup_roots.sort();
        let mut host_paths: Vec<(PathBuf, Option<Vec<String>>)> =
            HOST_PATHS.iter().map(|p| (PathBuf::from(p), entries(Path::new(p)))).collect();
        host_paths.push((PathBuf::from("/var/lib/cni/results"), entries(Path::new("/var/lib/cni/results"))));
        // kubectl's cache (the node's kubectl runs use the run directory instead).
        if let Some(home) = std::env::var_os("HOME") {
            let cache = Path::new(&home).join(".kube/cache");
            host_paths.push((cache.clone(), entries(&cache)));
        }
        let mut processes: Vec<String> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                cmdline.contains(super::BASE_DIR).then(|| format!("{pid} {}", cmdline.trim()))
            })
            .collect();
        processes.sort();
        Self {
            sysctls: read_sysctls().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            mounts,
            bridges,
            cgroup_roots,
            host_paths,
            processes,
            run_dirs: entries(Path::new(super::BASE_DIR)).unwrap_or_default(),
        }
    }
}
