//! Who holds a listening port: its socket's inode from the namespace's sock_diag table, then the
//! process whose fd table has that socket (`/proc/*/fd`, the host's with `hostPID`). Used to name
//! the holder when the agent cannot bind (another agent, or anything else, on its port), and to
//! find an orphaned socket keeper, whose sockets a new agent may take.

use std::{
    collections::HashSet,
    fmt,
    path::{Path, PathBuf},
};

use crate::discovery::sockdiag::SockDiag;

/// A process holding a listening socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line (escaped), for people to recognise.
    pub command: String,
    /// The keeper's socket directory, if it is a socket keeper (`keep-sockets --dir <dir>`), as
    /// seen through its root (`/proc/<pid>/root/<dir>`).
    pub keeper_dir: Option<PathBuf>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} (`{}`)", self.pid, self.command)
    }
}

/// The process holding a TCP listener on `port` in the network namespace at `netns`, if one can
/// be found (the agent needs `CAP_SYS_PTRACE` to read other processes' fd tables).
pub(crate) fn holder_of(netns: &Path, port: u16) -> Option<Holder> {
    let inodes: HashSet<u64> = SockDiag::open_in(netns)
        .and_then(|diag| diag.listeners())
        .ok()?
        .into_iter()
        .filter(|l| l.port == port && l.inode != 0)
        .map(|l| l.inode)
        .collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|target| socket_inode(&target))
                .is_some_and(|i| inodes.contains(&i))
        });
        if holds {
            let raw = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            return Some(Holder { pid, command: super::peer::command_line(&raw), keeper_dir: keeper_dir(pid, &raw) });
        }
    }
    None
}

/// The inode of an fd link's target `socket:[<inode>]`.
fn socket_inode(target: &Path) -> Option<u64> {
    target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// `/proc/<pid>/root/<dir>` for a command line `... keep-sockets ... --dir <dir>`.
fn keeper_dir(pid: u32, cmdline: &[u8]) -> Option<PathBuf> {
    let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    words.iter().position(|w| *w == b"keep-sockets")?;
    let dir = words.iter().position(|w| *w == b"--dir").and_then(|i| words.get(i + 1))?;
    let dir = std::str::from_utf8(dir).ok()?.trim_start_matches('/');
    Some(PathBuf::from(format!("/proc/{pid}/root")).join(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_links_and_keeper_command_lines_are_read() {
        assert_eq!(socket_inode(Path::new("socket:[4242]")), Some(4242));
        assert_eq!(socket_inode(Path::new("pipe:[4242]")), None);
        let keeper = b"/lifecycle-agent\0keep-sockets\0--dir\0/run/lifecycle-keeper\0";
        assert_eq!(keeper_dir(7, keeper), Some(PathBuf::from("/proc/7/root/run/lifecycle-keeper")));
        assert_eq!(keeper_dir(7, b"/lifecycle-agent\0run\0--listen\x000.0.0.0:9890\0"), None);
    }

    #[test]
    fn the_holder_of_a_port_is_found_and_named() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // The listening socket passes to a child (`sleep`, which inherits it), which holds it.
        rustix::io::fcntl_setfd(&listener, rustix::io::FdFlags::empty()).expect("inheritable");
        let mut child = match std::process::Command::new("sleep").arg("30").spawn() {
            Ok(child) => child,
            Err(err) => return eprintln!("skipped: no sleep: {err}"),
        };
        drop(listener);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let holder = loop {
            let holder = holder_of(&crate::discovery::netns::own(), port);
            if holder.as_ref().is_some_and(|h| h.command.starts_with("sleep")) || std::time::Instant::now() > deadline {
                break holder;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        let Some(holder) = holder else { return eprintln!("skipped: no sock_diag or /proc/*/fd here") };
        assert_eq!(holder.pid, child.id());
        assert_eq!(holder.to_string(), format!("pid {} (`sleep 30`)", child.id()));
        assert_eq!(holder.keeper_dir, None);
    }
}
