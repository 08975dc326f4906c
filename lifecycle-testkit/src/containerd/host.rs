//! The host as the harnesses (this one and `kube`) see it: commands they run, processes found
//! through `/proc`, mounts and cgroup hierarchies from mountinfo, and the host state the
//! harnesses of one test process share (the hugetlb v1 mount and the `kubepods` ancestors),
//! released by the last one out.

use std::{
    collections::BTreeSet,
    ffi::CString,
    fs, io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use anyhow::{bail, Context, Result};

use super::HUGETLB_MOUNT;

pub(crate) fn run(command: &mut Command) -> Result<()> {
    let output = command.output().with_context(|| format!("run {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

pub(crate) fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(binary)).find(|p| p.is_file())
}

pub(crate) fn signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a specific positive pid we identified; no memory is involved.
    unsafe { libc::kill(pid, signal) };
}

/// Mount points of every cgroup hierarchy (v1 controllers and v2).
pub(crate) fn cgroup_hierarchies() -> Vec<PathBuf> {
    mounts().into_iter().filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2").map(|m| m.point).collect()
}

pub(crate) struct Mount {
    pub(crate) point: PathBuf,
    pub(crate) fstype: String,
    pub(crate) options: String,
}

pub(crate) fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fstype = right.next()?.to_owned();
            let options = right.nth(1).unwrap_or_default().to_owned();
            Some(Mount { point: PathBuf::from(unescape_mountinfo(point)), fstype, options })
        })
        .collect()
}

fn unescape_mountinfo(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(byte) => out.push(char::from(byte)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Processes whose command line mentions `needle` (shims carry `-address <our socket>`).
pub(crate) fn pids_mentioning(needle: &str, binary_suffix: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<_> = raw.split(|b| *b == 0).map(String::from_utf8_lossy).collect();
            args.first().is_some_and(|argv0| argv0.ends_with(binary_suffix)) && args.iter().any(|a| a == needle)
        })
        .collect()
}

/// Running or sleeping; a zombie waiting for its (possibly foreign) parent counts as gone.
pub(crate) fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

pub(crate) fn process_start_time(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields after the parenthesised comm are space-separated.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19).map(str::to_owned)
}

pub(crate) fn unmount(point: &Path) -> io::Result<()> {
    let path =
        CString::new(point.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Host state shared by this process's harnesses: how many are live, whether one of them
/// mounted the hugetlb hierarchy, and which cgroup ancestors (`kubepods`, `kubepods/burstable`)
/// they created. Parallel harnesses share those, so only the last one out removes them.
struct Shared {
    users: usize,
    mounted_hugetlb: bool,
    ancestors: BTreeSet<PathBuf>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared { users: 0, mounted_hugetlb: false, ancestors: BTreeSet::new() });

fn shared() -> std::sync::MutexGuard<'static, Shared> {
    SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One harness's claim on the shared host state.
///
/// The hugetlb cgroup v1 hierarchy is not mounted on this hybrid host by default; without it
/// containerd's v1 cgroup loader cannot watch memory events and reports an OOM kill as a plain
/// `Error`. The last harness out removes the ancestors the harnesses created and unmounts
/// hugetlb if a harness mounted it, each only once nothing else uses it.
pub(super) struct HostShare;

impl HostShare {
    pub(super) fn acquire() -> Result<Self> {
        let mut state = shared();
        let mounted = mounts().iter().any(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == "hugetlb"));
        if !mounted {
            fs::create_dir_all(HUGETLB_MOUNT).with_context(|| format!("mkdir {HUGETLB_MOUNT}"))?;
            run(Command::new("mount").args(["-t", "cgroup", "-o", "hugetlb", "cgroup", HUGETLB_MOUNT]))?;
            state.mounted_hugetlb = true;
        }
        state.users += 1;
        Ok(Self)
    }

    pub(super) fn note_ancestor(dir: &Path) {
        shared().ancestors.insert(dir.to_owned());
    }
}

impl Drop for HostShare {
    fn drop(&mut self) {
        let mut state = shared();
        state.users = state.users.saturating_sub(1);
        if state.users > 0 {
            return;
        }
        let mut ancestors: Vec<_> = std::mem::take(&mut state.ancestors).into_iter().collect();
        ancestors.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for dir in ancestors {
            // rmdir refuses a cgroup with children: someone else's pods keep it alive.
            let _ = fs::remove_dir(dir);
        }
        if state.mounted_hugetlb {
            let in_use = fs::read_dir(HUGETLB_MOUNT).is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().is_dir())));
            if !in_use && unmount(Path::new(HUGETLB_MOUNT)).is_ok() {
                let _ = fs::remove_dir(HUGETLB_MOUNT);
                state.mounted_hugetlb = false;
            }
        }
    }
}
