//! Who is at the other end of a handoff socket, and whether it may have the agent's sockets.
//!
//! The directory of the handoff socket is root's, but root is not enough: a root process of any
//! pod that mounts the directory, even read-only (connecting needs no write access), reached
//! it, took every listener and marked the agent replaced. So the peer process itself is looked
//! at, pinned by a pidfd while it is (a pid reused meanwhile fails the last check):
//!
//! - a **successor** (a new agent taking a running one's sockets): root, in this agent's pid
//!   namespace, with `CAP_SYS_PTRACE`. Such a process can already take any of this agent's file
//!   descriptors (`pidfd_getfd`), so handing them over gives it nothing new. Not the "same
//!   executable": a rolling update runs another version of it, from another container's
//!   filesystem, so neither the inode nor the bytes match;
//! - **one of the pod's own** (an agent and its keeper): root, in the same pid namespace, in the
//!   same cgroup or a sibling in the same pod's cgroup. The keeper has no capability to look at
//!   the agent's namespaces, but every process may read another's cgroup.

use std::{io, os::fd::OwnedFd, path::Path};

use rustix::{
    event::{poll, PollFd, PollFlags},
    process::{pidfd_open, Pid, PidfdFlags},
};

/// `CAP_SYS_PTRACE`'s bit in a capability set.
const CAP_SYS_PTRACE: u64 = 1 << 19;

/// Why a peer may not have the sockets.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// `SO_PEERCRED` gave no pid: the peer's pid namespace is not this agent's nor below it.
    #[error("the peer runs in a pid namespace this agent cannot see")]
    Unseen,
    /// Its credentials could not be read.
    #[error("the peer's credentials cannot be read")]
    Credentials(#[source] io::Error),
    /// Not root.
    #[error("pid {pid} (`{command}`) runs as uid {uid}, not root")]
    NotRoot { pid: u32, command: String, uid: u32 },
    /// In another pid namespace.
    #[error("pid {pid} (`{command}`) runs in another pid namespace")]
    PidNamespace { pid: u32, command: String },
    /// A would-be successor without `CAP_SYS_PTRACE`.
    #[error("pid {pid} (`{command}`) lacks CAP_SYS_PTRACE: it could not take the sockets from the agent itself")]
    NoPtrace { pid: u32, command: String },
    /// Neither in this cgroup nor in a sibling of this pod's.
    #[error("pid {pid} (`{command}`) is not of this pod (its cgroup is {cgroup:?})")]
    OtherPod { pid: u32, command: String, cgroup: String },
    /// It exited while it was looked at (its pid may be another's now).
    #[error("pid {pid} exited while it was looked at")]
    Gone { pid: u32 },
    /// `/proc` of it could not be read.
    #[error("pid {pid} cannot be looked at")]
    Unreadable {
        pid: u32,
        #[source]
        source: io::Error,
    },
}

/// A connected peer process, pinned while it is looked at.
pub(crate) struct Peer {
    pub pid: u32,
    pub uid: u32,
    /// Its command line, for logs.
    pub command: String,
    status: Status,
    /// Its cgroup v2 path as this process's cgroup namespace shows it.
    cgroup: String,
    pidfd: OwnedFd,
}

/// The parts of `/proc/<pid>/status` that matter here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Status {
    /// How many pid namespaces, from this `/proc`'s down, the process has a pid in.
    depth: usize,
    /// Its effective capabilities.
    effective: u64,
}

impl Peer {
    /// The process at the other end of `socket`.
    pub(crate) fn of(socket: &OwnedFd) -> Result<Self, Refusal> {
        let credentials = crate::sys::peer_credentials(socket).map_err(|err| Refusal::Credentials(err.source))?;
        let Some(id) = Pid::from_raw(credentials.pid) else { return Err(Refusal::Unseen) };
        let pid = credentials.pid.unsigned_abs();
        let pidfd = pidfd_open(id, PidfdFlags::empty()).map_err(|_| Refusal::Gone { pid })?;
        let unreadable = |source| Refusal::Unreadable { pid, source };
        let status = read_status(&format!("/proc/{pid}/status")).map_err(unreadable)?;
        let cgroup = read_cgroup(&format!("/proc/{pid}/cgroup")).map_err(unreadable)?;
        let command = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| command_line(&raw))
            .unwrap_or_else(|_| "?".to_owned());
        let peer = Self { pid, uid: credentials.uid, command, status, cgroup, pidfd };
        peer.still_there()?;
        Ok(peer)
    }

    /// Whether it may take a running agent's sockets (see the module header).
    pub(crate) fn may_succeed(&self) -> Result<(), Refusal> {
        self.root_here()?;
        if self.status.effective & CAP_SYS_PTRACE == 0 {
            return Err(Refusal::NoPtrace { pid: self.pid, command: self.command.clone() });
        }
        self.still_there()
    }

    /// Whether it is of this process's pod: the same cgroup, or a sibling in a pod's cgroup.
    pub(crate) fn of_this_pod(&self) -> Result<(), Refusal> {
        self.root_here()?;
        let own = read_cgroup("/proc/self/cgroup").map_err(|source| Refusal::Unreadable { pid: 0, source })?;
        if !same_pod(&own, &self.cgroup) {
            return Err(Refusal::OtherPod {
                pid: self.pid,
                command: self.command.clone(),
                cgroup: self.cgroup.clone(),
            });
        }
        self.still_there()
    }

    fn root_here(&self) -> Result<(), Refusal> {
        if self.uid != 0 {
            return Err(Refusal::NotRoot { pid: self.pid, command: self.command.clone(), uid: self.uid });
        }
        let own = read_status("/proc/self/status").map_err(|source| Refusal::Unreadable { pid: 0, source })?;
        if own.depth != self.status.depth {
            return Err(Refusal::PidNamespace { pid: self.pid, command: self.command.clone() });
        }
        Ok(())
    }

    /// The pinned process has not exited: what was read of its pid was its own.
    fn still_there(&self) -> Result<(), Refusal> {
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        match poll(&mut fds, Some(&now)) {
            // Readable: it exited.
            Ok(n) if n > 0 => Err(Refusal::Gone { pid: self.pid }),
            _ => Ok(()),
        }
    }
}

fn read_status(path: &str) -> io::Result<Status> {
    let text = std::fs::read_to_string(path)?;
    parse_status(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: no NSpid or CapEff")))
}

/// `NSpid:` and `CapEff:` of a `/proc/<pid>/status`.
fn parse_status(text: &str) -> Option<Status> {
    let field = |name: &str| text.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
    let depth = field("NSpid:")?.split_whitespace().count();
    let effective = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some(Status { depth, effective })
}

/// The cgroup v2 path (`0::<path>`) of a `/proc/<pid>/cgroup`.
fn read_cgroup(path: &str) -> io::Result<String> {
    let text = std::fs::read_to_string(Path::new(path))?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: no cgroup v2 line")))
}

/// Whether `peer`'s cgroup is `own`'s, or a sibling of it under a pod's cgroup. In a private
/// cgroup namespace (a container's: `own` is `/`) a sibling shows as `/../<name>`, and the
/// parent is the pod's; in the host's, the parent is named: `pod<uid>` (cgroupfs driver) or
/// `kubepods-<class>-pod<uid>.slice` (systemd).
fn same_pod(own: &str, peer: &str) -> bool {
    if own == peer {
        return true;
    }
    if own == "/" {
        return peer.strip_prefix("/../").is_some_and(|sibling| !sibling.is_empty() && !sibling.contains('/'));
    }
    let parent = |path: &str| path.rsplit_once('/').map(|(parent, _)| parent.to_owned());
    let Some(pod) = parent(own) else { return false };
    let is_pod = pod.rsplit('/').next().is_some_and(|name| name.starts_with("pod") || name.contains("-pod"));
    is_pod && parent(peer).as_deref() == Some(pod.as_str())
}

/// A `/proc/<pid>/cmdline` as one line (arguments split by spaces, control characters escaped).
pub(crate) fn command_line(raw: &[u8]) -> String {
    let words: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|word| !word.is_empty())
        .map(|word| String::from_utf8_lossy(word).escape_debug().to_string())
        .collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_the_pid_namespace_depth_and_the_effective_capabilities() {
        let host = "Name:\tlifecycle-agent\nNSpid:\t4242\nCapEff:\t00000000a80c25fb\n";
        assert_eq!(parse_status(host), Some(Status { depth: 1, effective: 0xa80c_25fb }));
        assert!(parse_status(host).is_some_and(|s| s.effective & CAP_SYS_PTRACE != 0));
        let nested = "NSpid:\t4242\t7\t1\nCapEff:\t0000000000000000\n";
        assert_eq!(parse_status(nested), Some(Status { depth: 3, effective: 0 }));
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn a_pod_is_its_cgroup_and_its_siblings_under_a_pods_cgroup() {
        let agent = "/kubepods/besteffort/pod0b1c/agentcid";
        assert!(same_pod(agent, agent));
        assert!(same_pod(agent, "/kubepods/besteffort/pod0b1c/keepercid"));
        assert!(!same_pod(agent, "/kubepods/besteffort/pod9999/tenantcid"), "another pod");
        let systemd =
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c.slice/cri-containerd-a.scope";
        let sibling =
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c.slice/cri-containerd-b.scope";
        assert!(same_pod(systemd, sibling));
        // A service's siblings are other services, not its pod.
        assert!(!same_pod("/system.slice/lifecycle-agent.service", "/system.slice/sshd.service"));
        // In a container's own cgroup namespace, siblings show through `..`.
        assert!(same_pod("/", "/"));
        assert!(same_pod("/", "/../keepercid"));
        assert!(!same_pod("/", "/../../pod9999/tenantcid"));
        assert!(!same_pod("/", "/child"));
    }

    #[test]
    fn this_process_is_of_its_own_pod_and_a_successor_when_it_has_ptrace() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .expect("socketpair");
        let peer = Peer::of(&a).expect("this process");
        assert_eq!(peer.pid, std::process::id());
        if peer.uid != 0 {
            assert!(matches!(peer.of_this_pod(), Err(Refusal::NotRoot { .. })));
            return;
        }
        peer.of_this_pod().expect("its own cgroup");
        let own = read_status("/proc/self/status").expect("status");
        assert_eq!(peer.may_succeed().is_ok(), own.effective & CAP_SYS_PTRACE != 0);
        drop(b);
    }

    #[test]
    fn command_lines_read_as_one_escaped_line() {
        assert_eq!(
            command_line(b"lifecycle-agent\0run\0--listen\x000.0.0.0:9890\0"),
            "lifecycle-agent run --listen 0.0.0.0:9890"
        );
        assert_eq!(command_line(b"evil\n\x1b[2J\0"), "evil\\n\\u{1b}[2J");
    }
}
