//! What the agent reads from /proc: the processes running at start (through the `procfs`
//! crate), and for the probes a process's listeners and their accept queues, its netns's
//! listen-drop counter, its scheduler state, and files inside its root.
//!
//! Listeners come from sock_diag (see `sockdiag.rs`), /proc/net/tcp only as the fallback.
//! Parsers are pure functions (unit tested here); the readers around them do the I/O. The three
//! narrow parsers stay hand-written: procfs 0.18 has no reader for `/proc/<pid>/net/netstat`
//! (TcpExt), and a probe refresh needs two fields of `stat` and the LISTEN rows of the socket
//! table, not the crate's full records. Files inside a container are opened with `openat2(2)` and
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` relative to `/proc/<pid>/root`, so `..`, absolute
//! or relative symlinks and `/proc/self/root`-style magic links all stay inside (or are refused
//! by) the container's root. A kernel without openat2 is refused, never worked around.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use super::{
    netns,
    sockdiag::{SockDiag, SockDiagError},
};
use crate::model::{
    node::FoundProcess,
    time::{BootTime, SECOND},
};

pub use crate::model::probe::{ProcessSample, ProcessState};

/// The agent's own effective capability set (`CapEff`), if /proc can tell.
/// This process's CPU time (seconds, user and system) and resident memory (bytes).
pub(crate) fn own_usage() -> Option<(f64, u64)> {
    let me = procfs::process::Process::myself().ok()?;
    let stat = me.stat().ok()?;
    let ticks = procfs::ticks_per_second() as f64;
    let statm = me.statm().ok()?;
    Some(((stat.utime + stat.stime) as f64 / ticks, statm.resident * procfs::page_size()))
}

pub(crate) fn effective_capabilities() -> Option<u64> {
    procfs::process::Process::myself().ok()?.status().ok().map(|status| status.capeff)
}

/// Every process whose cgroup v2 path is in `cgroup_ids`, oldest first (the order the tracker
/// must see them in: the first process of a container becomes its init). Processes that vanish
/// while being read are skipped.
pub(crate) fn processes_at_start(cgroup_ids: &std::collections::HashMap<&str, u64>) -> Vec<FoundProcess> {
    let mut out = Vec::new();
    let Ok(all) = procfs::process::all_processes() else { return out };
    let ticks = procfs::ticks_per_second().max(1);
    for process in all.flatten() {
        let (Ok(stat), Ok(groups)) = (process.stat(), process.cgroups()) else { continue };
        let Some(path) = groups.0.iter().find(|g| g.hierarchy == 0).map(|g| g.pathname.clone()) else { continue };
        let Some(&cgroup_id) = cgroup_ids.get(path.as_str()) else { continue };
        // NSpid lists the pid in each namespace from the host's down: more than one entry
        // means the process lives in a container's pid namespace.
        let child_pid_namespace = process.status().ok().and_then(|s| s.nspid).is_some_and(|ids| ids.len() > 1);
        out.push(FoundProcess {
            tgid: stat.pid as u32,
            ppid: stat.ppid as u32,
            cgroup_id,
            child_pid_namespace,
            started_at: BootTime::from_ns(stat.starttime * (SECOND / ticks)),
            zombie: stat.state == 'Z',
            comm: stat.comm,
        });
    }
    out.sort_by_key(|p| p.started_at);
    out
}

/// Why an observation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A /proc file could not be read (the process may be gone).
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A /proc file did not have the expected shape.
    #[error("cannot parse {path}: {what}")]
    Parse { path: PathBuf, what: &'static str },
    /// The kernel has no openat2 (Linux < 5.6): files in containers cannot be opened safely.
    #[error("openat2(2) is not available on this kernel; refusing to open {path} in the root of pid {pid} without RESOLVE_IN_ROOT")]
    Openat2Unsupported { pid: u32, path: String },
    /// The path could not be opened inside the container's root (missing, or an escape refused).
    #[error("cannot open {path} inside the root of pid {pid}")]
    Open {
        pid: u32,
        path: String,
        #[source]
        source: io::Error,
    },
    /// The sock_diag dump of the listeners failed.
    #[error(transparent)]
    Diag(#[from] SockDiagError),
    /// The path is not a regular file (a FIFO or device could block or never end).
    #[error("{path} inside the root of pid {pid} is not a regular file")]
    NotRegular { pid: u32, path: String },
    /// The path resolved into a kernel filesystem (procfs, sysfs, ...), whose files describe
    /// processes and the kernel rather than the application: never read for a probe.
    #[error("{path} inside the root of pid {pid} is on {fs}, which probes do not read")]
    KernelFilesystem { pid: u32, path: String, fs: &'static str },
    /// The path resolved onto a network or user-space filesystem (NFS, CIFS, FUSE, ceph, 9p),
    /// whose reads can hang as long as its server wants: never read for a probe.
    #[error("{path} inside the root of pid {pid} is on {fs}, a network or FUSE filesystem, which probes do not read")]
    NetworkFilesystem { pid: u32, path: String, fs: &'static str },
}

/// A listening TCP socket seen in a process's netns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub port: u16,
    /// `libc::AF_INET` or `libc::AF_INET6`.
    pub family: u16,
    /// rx_queue: connections in the accept queue.
    pub queue_depth: u32,
    /// The listen backlog, when known: sock_diag reports it (ss's Send-Q); /proc/net/tcp does
    /// not (for a LISTEN socket its tx_queue column is write_seq - snd_una, always 0).
    pub backlog: Option<u32>,
    /// The socket's inode (0 when not known): what `/proc/<pid>/fd` links name as
    /// `socket:[inode]`, so the listener's holder can be found, and a socket handed over
    /// checked to be this one.
    pub inode: u64,
}

/// TcpExt listen counters of a netns (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenCounters {
    /// Accept queue full.
    pub overflows: u64,
    /// Every dropped incoming connection on a listener, overflows included.
    pub drops: u64,
}

/// A file read inside a container's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRead {
    pub modified: SystemTime,
    /// The first `max_bytes` bytes (empty when none were asked for).
    pub head: Vec<u8>,
}

fn read_proc(path: PathBuf) -> Result<String, ObserveError> {
    std::fs::read_to_string(&path).map_err(|source| ObserveError::Read { path, source })
}

/// LISTEN sockets in the netns of `pid`, with their backlogs, from a sock_diag dump (cheap: only
/// the listening hash is walked). For repeated samples keep a [`SockDiag`] instead.
pub fn listeners(pid: u32) -> Result<Vec<Listener>, ObserveError> {
    Ok(SockDiag::open_in(&netns::of_pid(pid))?.listeners()?)
}

/// LISTEN sockets in the netns of `pid` from `/proc/<pid>/net/tcp` and tcp6: the fallback when
/// sock_diag is unavailable. Costly on a busy node (the kernel walks the whole established hash)
/// and without backlogs.
pub(crate) fn listeners_from_proc(pid: u32) -> Result<Vec<Listener>, ObserveError> {
    let mut out = Vec::new();
    for (file, family) in [("tcp", libc::AF_INET), ("tcp6", libc::AF_INET6)] {
        let path = PathBuf::from(format!("/proc/{pid}/net/{file}"));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                out.extend(parse_listeners(&text, family as u16).map_err(|what| ObserveError::Parse { path, what })?)
            }
            // No IPv6 in this kernel: no tcp6 file.
            Err(e) if e.kind() == io::ErrorKind::NotFound && family == libc::AF_INET6 => {}
            Err(source) => return Err(ObserveError::Read { path, source }),
        }
    }
    Ok(out)
}

/// Parses a /proc/net/tcp{,6} table, keeping state 0A (LISTEN).
pub fn parse_listeners(text: &str, family: u16) -> Result<Vec<Listener>, &'static str> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 5 {
            return Err("short line in the socket table");
        }
        if fields[3] != "0A" {
            continue;
        }
        let port =
            fields[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()).ok_or("bad local address")?;
        let (_tx, rx) = fields[4].split_once(':').ok_or("bad tx_queue:rx_queue")?;
        let depth = u32::from_str_radix(rx, 16).map_err(|_| "bad rx_queue")?;
        let inode = fields.get(9).and_then(|i| i.parse().ok()).unwrap_or(0);
        out.push(Listener { port, family, queue_depth: depth, backlog: None, inode });
    }
    Ok(out)
}

/// ListenOverflows and ListenDrops of the netns of `pid`.
pub(crate) fn netstat_overflows(pid: u32) -> Result<ListenCounters, ObserveError> {
    let path = PathBuf::from(format!("/proc/{pid}/net/netstat"));
    let text = read_proc(path.clone())?;
    parse_netstat(&text).map_err(|what| ObserveError::Parse { path, what })
}

/// Finds ListenOverflows and ListenDrops in the TcpExt header/value line pair.
pub fn parse_netstat(text: &str) -> Result<ListenCounters, &'static str> {
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().ok_or("no TcpExt lines")?, lines.next().ok_or("no TcpExt values")?);
    let mut counters = ListenCounters::default();
    let mut seen = 0;
    for (name, value) in names.split_whitespace().zip(values.split_whitespace()).skip(1) {
        let slot = match name {
            "ListenOverflows" => &mut counters.overflows,
            "ListenDrops" => &mut counters.drops,
            _ => continue,
        };
        *slot = value.parse().map_err(|_| "bad TcpExt value")?;
        seen += 1;
    }
    if seen != 2 {
        return Err("TcpExt lacks ListenOverflows or ListenDrops");
    }
    Ok(counters)
}

/// How far a start time read from /proc (whole clock ticks) may be from the kernel's
/// nanoseconds and still be the same process's: two ticks.
pub(crate) fn start_tolerance() -> Duration {
    Duration::from_nanos(2 * (SECOND / procfs::ticks_per_second().max(1)))
}

/// State and start time of `pid`; None when no such process exists.
pub(crate) fn process_state(pid: u32) -> Result<Option<ProcessSample>, ObserveError> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_stat(&text).map(Some).map_err(|what| ObserveError::Parse { path, what }),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        Err(source) => Err(ObserveError::Read { path, source }),
    }
}

/// Parses `/proc/<pid>/stat`; the comm field may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(text: &str) -> Result<ProcessSample, &'static str> {
    let after = text.rfind(')').map(|i| &text[i + 1..]).ok_or("no comm field")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3 (state); starttime is field 22.
    let letter = fields.first().and_then(|s| s.chars().next()).ok_or("no state field")?;
    let start_ticks = fields.get(19).and_then(|s| s.parse().ok()).ok_or("no start time field")?;
    let state = match letter {
        'R' => ProcessState::Running,
        'S' => ProcessState::Sleeping,
        'D' => ProcessState::Uninterruptible,
        'T' | 't' => ProcessState::Stopped,
        'Z' => ProcessState::Zombie,
        'X' | 'x' => ProcessState::Dead,
        other => ProcessState::Other(other),
    };
    Ok(ProcessSample { state, start_ticks })
}

/// Inode of the network namespace of `pid` (what the kernel events call `netns`).
pub(crate) fn netns_inode(pid: u32) -> Result<u32, ObserveError> {
    let path = netns::of_pid(pid);
    netns::inode(&path).map_err(|source| ObserveError::Read { path, source })
}

/// What kind of filesystem an opened path lives on, if it is one probes must not read: a kernel
/// filesystem (its files describe processes and the kernel, not the application) or a network or
/// user-space one (a read can hang for as long as the server or the FUSE daemon, which the pod
/// controls, wants).
fn refused_filesystem(file: &File) -> Option<(&'static str, Refusal)> {
    let Ok(stat) = rustix::fs::fstatfs(file) else {
        return Some(("an unknown filesystem", Refusal::Kernel));
    };
    const REFUSED: [(i64, &str, Refusal); 13] = [
        (0x9fa0, "procfs", Refusal::Kernel),
        (0x6265_6572, "sysfs", Refusal::Kernel),
        (0x6462_6720, "debugfs", Refusal::Kernel),
        (0x7363_6673, "securityfs", Refusal::Kernel),
        (0x7472_6163, "tracefs", Refusal::Kernel),
        (0x6367_7270, "cgroup2", Refusal::Kernel),
        (0x0027_e0eb, "cgroup", Refusal::Kernel),
        (0x6969, "nfs", Refusal::Network),
        (0xff53_4d42, "cifs", Refusal::Network),
        (0xfe53_4d42, "smb2", Refusal::Network),
        (0x6573_5546, "fuse", Refusal::Network),
        (0x00c3_6400, "ceph", Refusal::Network),
        (0x0102_1997, "9p", Refusal::Network),
    ];
    // The magic numbers are compared as i64, the type f_type has on 64-bit Linux.
    let kind: i64 = stat.f_type;
    REFUSED.iter().find(|(magic, _, _)| *magic == kind).map(|(_, name, refusal)| (*name, *refusal))
}

/// Why a filesystem is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Kernel,
    Network,
}

/// The root directory of `pid`, held open: files are resolved inside it for as long as it is
/// held, whatever becomes of the pid. A probe pins its container's root when it is created, so
/// a pid reused after the container's main process exited never leads its file checks into
/// another container's (or the host's) files.
pub(crate) fn pin_root(pid: u32) -> Result<File, ObserveError> {
    let root_path = PathBuf::from(format!("/proc/{pid}/root"));
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(&root_path)
        .map_err(|source| ObserveError::Read { path: root_path, source })
}

/// Opens `path` inside the root of `pid` and returns its mtime and first `max_bytes` bytes
/// (see [`read_file_in_pinned_root`]).
pub fn read_file_in_root(pid: u32, path: &str, max_bytes: usize) -> Result<FileRead, ObserveError> {
    read_file_in_pinned_root(&pin_root(pid)?, pid, path, max_bytes)
}

/// Opens `path` inside `root` (from [`pin_root`] of `pid`, which only names it in errors) and
/// returns its mtime and first `max_bytes` bytes.
///
/// Resolution is done by the kernel with the container's root as `/`: `..` stops at that root,
/// symlinks (absolute or relative) resolve inside it, magic links (`/proc/<pid>/root`,
/// `/proc/self/fd/*`) are refused with ELOOP. The path is first opened with `O_PATH`, which
/// opens nothing: only a regular file on a local, non-kernel filesystem is then opened for
/// reading, through that same handle. A device node, FIFO or socket is refused before any open
/// of it (opening some devices acts: a watchdog arms, a tape rewinds).
pub(crate) fn read_file_in_pinned_root(
    root: &File,
    pid: u32,
    path: &str,
    max_bytes: usize,
) -> Result<FileRead, ObserveError> {
    let open_err = |source| ObserveError::Open { pid, path: path.to_owned(), source };
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
    // A path with a NUL byte is refused by rustix with EINVAL before any call.
    let opened = openat2(
        root,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    );
    let handle = match opened {
        Ok(fd) => File::from(fd),
        Err(rustix::io::Errno::NOSYS) => return Err(ObserveError::Openat2Unsupported { pid, path: path.to_owned() }),
        Err(errno) => return Err(open_err(errno.into())),
    };
    if let Some((fs, refusal)) = refused_filesystem(&handle) {
        // A declared path may lead (by a symlink inside the container's root) to the
        // container's own /proc or /sys: refused whatever the path said.
        return Err(match refusal {
            Refusal::Kernel => ObserveError::KernelFilesystem { pid, path: path.to_owned(), fs },
            Refusal::Network => ObserveError::NetworkFilesystem { pid, path: path.to_owned(), fs },
        });
    }
    // fstat works on an O_PATH handle: the type is known before anything is opened.
    let meta = handle.metadata().map_err(open_err)?;
    if !meta.is_file() {
        return Err(ObserveError::NotRegular { pid, path: path.to_owned() });
    }
    // The same inode, opened for reading through the handle (not resolved again).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(open_err)?;
    let modified = meta.modified().map_err(open_err)?;
    let mut head = Vec::with_capacity(max_bytes.min(64 * 1024));
    if max_bytes > 0 {
        file.take(max_bytes as u64).read_to_end(&mut head).map_err(open_err)?;
    }
    Ok(FileRead { modified, head })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_table_keeps_listeners_with_queue_and_backlog() {
        let table =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000080:00000003 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n";
        let got = parse_listeners(table, 2).expect("parses");
        assert_eq!(got, vec![Listener { port: 8080, family: 2, queue_depth: 3, backlog: None, inode: 1 }]);
        assert!(parse_listeners("header\n 0: x\n", 2).is_err());
    }

    #[test]
    fn netstat_finds_listen_counters() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\nTcpExt: 0 5 7 100\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(parse_netstat(text), Ok(ListenCounters { overflows: 5, drops: 7 }));
        assert!(parse_netstat("IpExt: A\nIpExt: 1\n").is_err());
    }

    #[test]
    fn stat_parses_state_and_start_time_past_a_tricky_comm() {
        let text = "4242 (my) app (x)) Z 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 123456 1000 10 18446744073709551615";
        assert_eq!(parse_stat(text), Ok(ProcessSample { state: ProcessState::Zombie, start_ticks: 123456 }));
        assert_eq!(
            parse_stat("1 (a) T 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 7").map(|s| s.state),
            Ok(ProcessState::Stopped)
        );
        assert!(parse_stat("1 (a) R").is_err());
    }

    #[test]
    fn files_on_procfs_and_sysfs_are_refused_even_by_a_plain_path() {
        let me = std::process::id();
        for path in ["/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"] {
            match read_file_in_root(me, path, 64) {
                Err(ObserveError::KernelFilesystem { fs, .. }) => assert!(fs == "procfs" || fs == "sysfs", "{fs}"),
                Err(ObserveError::Open { .. }) => {} // not present on this kernel
                other => panic!("{path}: {other:?}"),
            }
        }
        let ordinary = read_file_in_root(me, "/etc/hostname", 64).or_else(|_| read_file_in_root(me, "/etc/passwd", 64));
        assert!(ordinary.is_ok(), "{ordinary:?}");
    }

    #[test]
    fn device_nodes_and_fifos_are_refused_without_being_opened() {
        // Issue 18: a declared char device was opened before the regular-file check. A FIFO
        // with no writer would block a plain open; the O_PATH handle opens nothing.
        let dir = std::env::temp_dir().join(format!("lifecycle-proc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("fifo");
        use rustix::fs::{mknodat, FileType, Mode, CWD};
        mknodat(CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
        let me = std::process::id();
        let refused = read_file_in_root(me, &fifo.to_string_lossy(), 64);
        assert!(matches!(refused, Err(ObserveError::NotRegular { .. })), "{refused:?}");
        let device = read_file_in_root(me, "/dev/null", 64);
        assert!(
            matches!(device, Err(ObserveError::NotRegular { .. } | ObserveError::KernelFilesystem { .. })),
            "{device:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pinned_root_outlives_its_process() {
        // The root is held by its handle: files resolve in it after the pid is gone (and so
        // never in whatever process is given that pid next).
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().expect("sleep");
        let root = pin_root(child.id()).expect("pin");
        let _ = child.kill();
        let _ = child.wait();
        assert!(read_file_in_root(child.id(), "/etc/passwd", 8).is_err(), "the pid is gone");
        let read = read_file_in_pinned_root(&root, child.id(), "/etc/passwd", 8).expect("read through the pin");
        assert_eq!(read.head.len(), 8);
    }

    #[test]
    fn own_process_is_observed() {
        let me = std::process::id();
        let sample = process_state(me).expect("read").expect("exists");
        // The main thread (what /proc/<pid>/stat shows) may be waiting on the test threads.
        assert!(matches!(sample.state, ProcessState::Running | ProcessState::Sleeping), "{sample:?}");
        assert!(process_state(u32::MAX - 1).expect("read").is_none());
        assert!(netns_inode(me).expect("netns") > 0);
    }
}
