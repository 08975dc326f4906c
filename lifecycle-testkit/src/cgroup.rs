//! Real cgroups and processes placed in them, cleaned up on drop.
//!
//! Each [`TestCgroup`] is a fresh directory on the v2 hierarchy (and, for memory limits on a
//! hybrid host, a sibling in the v1 memory controller). Processes are spawned straight into it
//! (the child writes itself into cgroup.procs before exec), so every event they cause is charged
//! to it from the first instruction. Drop kills only the processes this cgroup spawned, by pid,
//! and removes the directories.

use std::{
    ffi::CString,
    os::unix::{fs::MetadataExt as _, process::CommandExt as _},
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use lifecycle_agent::discovery::cgroupfs::CgroupRoot;

/// Why a privileged test cannot run here.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root: loads eBPF programs and creates cgroups".into());
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    if CgroupRoot::detect().is_err() {
        return Some("no cgroup v2 hierarchy mounted".into());
    }
    None
}

/// Returns early from a test, printing why, when privileged tests cannot run.
#[macro_export]
macro_rules! require_privileges {
    () => {
        if let Some(reason) = $crate::cgroup::skip_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

pub struct TestCgroup {
    pub root: CgroupRoot,
    /// Path as the kernel prints it, e.g. `/lifecycle-test-exit-1234`.
    pub path: String,
    pub dir: PathBuf,
    pub id: u64,
    memory_v1: Option<PathBuf>,
    procs_files: Vec<CString>,
    children: Vec<u32>,
}

impl TestCgroup {
    /// A new, empty cgroup named after the test.
    pub fn new(name: &str) -> Self {
        let root = CgroupRoot::detect().expect("cgroup v2 mount");
        let path = format!("/lifecycle-test-{name}-{}", std::process::id());
        let dir = root.dir_of(&path);
        if dir.exists() {
            // A crashed earlier run of this very pid is impossible; a stale dir from another is not.
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let id = std::fs::metadata(&dir).expect("stat cgroup").ino();
        let procs = CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).expect("path");
        Self { root, path, dir, id, memory_v1: None, procs_files: vec![procs], children: Vec::new() }
    }

    /// Limits memory: v2 memory.max when the memory controller is on v2, otherwise a v1 memory
    /// cgroup alongside (hybrid hosts keep the controllers on v1).
    pub fn limit_memory(&mut self, bytes: u64) {
        let v2_max = self.dir.join("memory.max");
        if v2_max.exists() {
            std::fs::write(&v2_max, bytes.to_string()).expect("write memory.max");
            let _ = std::fs::write(self.dir.join("memory.swap.max"), "0");
            return;
        }
        let v1 = PathBuf::from("/sys/fs/cgroup/memory").join(self.path.trim_start_matches('/'));
        std::fs::create_dir_all(&v1).expect("mkdir v1 memory cgroup");
        std::fs::write(v1.join("memory.limit_in_bytes"), bytes.to_string()).expect("v1 memory limit");
        let _ = std::fs::write(v1.join("memory.memsw.limit_in_bytes"), bytes.to_string());
        let procs = CString::new(v1.join("cgroup.procs").into_os_string().into_encoded_bytes()).expect("path");
        self.procs_files.push(procs);
        self.memory_v1 = Some(v1);
    }

    /// Spawns `command` inside this cgroup.
    pub fn spawn(&mut self, command: &mut Command) -> Child {
        let files = self.procs_files.clone();
        // SAFETY: the closure only calls async-signal-safe functions (open, write, close) on
        // buffers allocated before fork.
        unsafe {
            command.pre_exec(move || {
                for file in &files {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawn into test cgroup");
        self.children.push(child.id());
        child
    }

    /// Pids now in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A child the test reaped itself may have left its pid to a later child of this process
        // in another cgroup (pid_max is 32,768 here): only a child still in this cgroup is
        // waited for; the others are reaped only if they are done, so a reused pid never makes
        // this wait on someone else's process.
        let inside = self.pids();
        // Everything in this cgroup was started by this test (directly or by its children), so
        // cgroup.kill ends exactly our processes and nothing else.
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
            for pid in &inside {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
        }
        for pid in &self.children {
            let flags = if inside.contains(pid) { 0 } else { libc::WNOHANG };
            // SAFETY: waitpid with a null status pointer is allowed.
            unsafe { libc::waitpid(*pid as i32, std::ptr::null_mut(), flags) };
        }
        // Grandchildren are reaped by init asynchronously; rmdir reports EBUSY until then.
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in [Some(self.dir.clone()), self.memory_v1.clone()].into_iter().flatten() {
            while std::fs::remove_dir(&dir).is_err() && dir.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The v2 id of the calling process's own cgroup.
pub fn own_cgroup_id() -> u64 {
    let root = CgroupRoot::detect().expect("cgroup v2 mount");
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let path = text.lines().find_map(|l| l.strip_prefix("0::")).expect("v2 line in /proc/self/cgroup");
    std::fs::metadata(root.dir_of(path)).expect("stat own cgroup").ino()
}

/// Inode of the calling process's network namespace.
pub fn own_netns() -> u32 {
    std::fs::metadata("/proc/self/ns/net").expect("netns").ino() as u32
}

/// The calling thread's comm (cargo's test threads are named after the test).
pub fn own_thread_comm() -> String {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).expect("comm").trim_end().to_owned()
}
