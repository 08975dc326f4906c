//! A fresh named network namespace (`ip netns add lifecycle-probe-<pid>-<n>`) with
//! loopback up (and, on request, a veth link to the host's namespace), processes started inside
//! it with `ip netns exec`, and a small runc container
//! built from busybox-static. Drop ends only the processes started here, by pid, then deletes
//! the namespace (or the container and its bundle).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
};

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn run(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(status.success(), "{command:?} exited {status}");
}

/// Why netns tests cannot run here (besides root, which `require_privileges!` checks).
pub fn netns_skip_reason() -> Option<String> {
    if !Path::new("/usr/sbin/ip").exists() && !Path::new("/sbin/ip").exists() {
        return Some("iproute2's ip is not installed".into());
    }
    None
}

pub struct TestNetns {
    pub name: String,
    /// `/var/run/netns/<name>`: what setns and bind_in_netns take.
    pub path: PathBuf,
    /// The namespace inode, as the kernel's TCP events report it.
    pub inode: u32,
    children: Vec<Child>,
    /// Host sides of veth pairs made by [`TestNetns::link_to_host`].
    host_links: Vec<String>,
}

impl TestNetns {
    /// Adds the namespace and brings its loopback up.
    #[expect(
        clippy::new_without_default,
        reason = "creating one runs `ip netns add` as root: a side effect, not a default value"
    )]
    pub fn new() -> Self {
        let name = format!("lifecycle-probe-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        run(Command::new("ip").args(["netns", "add", &name]));
        run(Command::new("ip").args(["-n", &name, "link", "set", "lo", "up"]));
        let path = PathBuf::from("/var/run/netns").join(&name);
        let inode = std::fs::metadata(&path).expect("stat netns").ino() as u32;
        Self { name, path, inode, children: Vec::new(), host_links: Vec::new() }
    }

    /// `ip netns exec <name> <program> <args>` with piped stdin/stdout; `ip` execs the program,
    /// so the child's pid is the program's.
    pub fn spawn(&mut self, program: &str, args: &[&str]) -> Proc {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("ip netns exec");
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        self.children.push(child);
        Proc { pid, stdin, stdout }
    }

    /// Links the namespace to the host's with a veth pair, the way a CNI links a pod: a /30 of
    /// 169.254.0.0/16 (link-local: nothing outside this machine is ever addressed), the host
    /// side's address one of the node's own. Returns (host side, namespace side).
    pub fn link_to_host(&mut self) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let host_if = format!("lcv{}x{n}", std::process::id() % 100_000);
        let (third, fourth) = (100 + (std::process::id() % 100) as u8, ((n * 4) % 256) as u8);
        let host = std::net::Ipv4Addr::new(169, 254, third, fourth + 1);
        let inside = std::net::Ipv4Addr::new(169, 254, third, fourth + 2);
        run(Command::new("ip")
            .args(["link", "add", &host_if, "type", "veth", "peer", "name", "veth0", "netns"])
            .arg(&self.name));
        run(Command::new("ip").args(["addr", "add", &format!("{host}/30"), "dev", &host_if]));
        run(Command::new("ip").args(["link", "set", &host_if, "up"]));
        run(Command::new("ip").args(["-n", &self.name, "addr", "add", &format!("{inside}/30"), "dev", "veth0"]));
        run(Command::new("ip").args(["-n", &self.name, "link", "set", "veth0", "up"]));
        self.host_links.push(host_if);
        (host, inside)
    }

    /// Runs a program inside to completion, returning its stdout.
    pub fn output(&self, program: &str, args: &[&str]) -> String {
        let out =
            Command::new("ip").args(["netns", "exec", &self.name, program]).args(args).output().expect("ip netns exec");
        assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "delete", &self.name]).status();
        // Deleting the namespace deletes its veth ends, and so the pairs; in case it did not:
        for link in &self.host_links {
            let _ = Command::new("ip").args(["link", "del", link]).stderr(Stdio::null()).status();
        }
    }
}

/// A process started inside a namespace, with line-wise stdio.
pub struct Proc {
    pub pid: u32,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Proc {
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.as_mut().expect("stdout").read_line(&mut line).expect("read line");
        line.trim_end().to_owned()
    }

    pub fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write line");
        stdin.flush().expect("flush");
    }
}

/// A detached runc container running `sleep` from a busybox-static rootfs.
pub struct RuncContainer {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    /// The container's init process, in the host pid namespace.
    pub pid: u32,
}

/// Why runc tests cannot run here.
pub fn runc_skip_reason() -> Option<String> {
    for tool in ["/usr/sbin/runc", "/bin/busybox"] {
        if !Path::new(tool).exists() {
            return Some(format!("{tool} missing (apt-get install runc busybox-static)"));
        }
    }
    None
}

impl RuncContainer {
    pub fn start(name: &str) -> Self {
        let id = format!("lifecycle-probe-{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let bundle = std::env::temp_dir().join(&id);
        let rootfs = bundle.join("rootfs");
        let _ = std::fs::remove_dir_all(&bundle);
        for dir in ["bin", "etc", "tmp", "proc", "dev", "sys"] {
            std::fs::create_dir_all(rootfs.join(dir)).expect("mkdir rootfs");
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
        for applet in ["sh", "sleep", "cat", "true"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("applet link");
        }
        run(Command::new("runc").arg("spec").current_dir(&bundle));
        let config_path = bundle.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).expect("config.json")).expect("json");
        config["process"]["terminal"] = false.into();
        config["process"]["args"] = serde_json::json!(["/bin/sleep", "100000"]);
        config["linux"]["cgroupsPath"] = format!("/{id}").into();
        std::fs::write(&config_path, config.to_string()).expect("write config.json");
        let pid_file = bundle.join("pid");
        run(Command::new("runc")
            .args(["run", "-d", "--pid-file"])
            .arg(&pid_file)
            .arg(&id)
            .current_dir(&bundle)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()));
        let pid = std::fs::read_to_string(&pid_file).expect("pid file").trim().parse().expect("pid");
        Self { id, bundle, rootfs, pid }
    }
}

impl Drop for RuncContainer {
    fn drop(&mut self) {
        // `runc delete -f` kills this container's processes (ours) and removes its state.
        let _ = Command::new("runc").args(["delete", "-f", &self.id]).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.bundle);
    }
}
