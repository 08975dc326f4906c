//! Proof that each feature the loaded programs claim works here: `doctor` makes each kind of
//! event with processes, sockets and a cgroup of its own and waits for the kernel's record. A
//! program can attach and still see nothing (a tracepoint whose arguments it misreads, as
//! `mark_victim`'s did before the prototype check), so attaching is not the proof; the record is.
//!
//! The children are this binary itself (`lifecycle-agent proof-child <what>`, hidden), so the
//! proof needs nothing from the host or the image but the agent. Everything made is removed: the
//! cgroup, the socket file, the children (each waited for).

use std::{
    io::{self, Read as _},
    net::{TcpListener, TcpStream},
    os::unix::{
        net::{UnixListener, UnixStream},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    discovery::cgroupfs::CgroupRoot,
    kernel::{EventStream, Feature},
    model::event::{Detail, Event},
};

/// How long a record may take to arrive: the ring is read every few milliseconds, the OOM
/// killer takes a moment to pick its victim.
const RECORD_DEADLINE: Duration = Duration::from_secs(3);
/// The memory limit the allocating child runs under.
const MEMORY_LIMIT_BYTES: u64 = 32 << 20;

/// What the proof of one feature found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Proof {
    /// Its record arrived.
    Seen,
    /// Made, and no record came: the feature says it runs and does not.
    NotSeen(String),
    /// Could not be made here (why).
    NotMade(String),
}

/// The hidden child's errands.
pub const CHILD_COMMAND: &str = "proof-child";

/// What a child does: exit with 3, sleep until signalled, or allocate until the OOM killer ends
/// it. Runs in the child (`lifecycle-agent proof-child <what>`).
pub fn child(what: &str) -> std::process::ExitCode {
    match what {
        "exit" => std::process::ExitCode::from(3),
        "sleep" => {
            std::thread::sleep(Duration::from_secs(30));
            std::process::ExitCode::SUCCESS
        }
        "allocate" => {
            let mut held: Vec<Vec<u8>> = Vec::new();
            // Past a gibibyte without being killed, the limit was not in force: give up.
            for _ in 0..1024 {
                held.push(vec![1u8; 1 << 20]);
            }
            std::hint::black_box(&held);
            std::process::ExitCode::FAILURE
        }
        _ => std::process::ExitCode::FAILURE,
    }
}

/// Proves every feature in `features` with records from `stream`.
pub(crate) fn prove(
    stream: &mut EventStream,
    features: &[Feature],
    root: Option<&CgroupRoot>,
) -> Vec<(Feature, Proof)> {
    let mut seen = Seen { stream, events: Vec::new() };
    let mut proofs = Vec::new();
    let wanted = |feature| features.contains(&feature);
    if wanted(Feature::ProcessExec) || wanted(Feature::ProcessExit) {
        let (exec, exit) = prove_process(&mut seen);
        if wanted(Feature::ProcessExec) {
            proofs.push((Feature::ProcessExec, exec));
        }
        if wanted(Feature::ProcessExit) {
            proofs.push((Feature::ProcessExit, exit));
        }
    }
    if wanted(Feature::Signals) {
        proofs.push((Feature::Signals, prove_signal(&mut seen)));
    }
    if wanted(Feature::TcpSockets) || wanted(Feature::TcpAccepts) {
        let (sockets, accepts) = prove_tcp(&mut seen);
        if wanted(Feature::TcpSockets) {
            proofs.push((Feature::TcpSockets, sockets));
        }
        if wanted(Feature::TcpAccepts) {
            proofs.push((Feature::TcpAccepts, accepts));
        }
    }
    if wanted(Feature::CgroupEvents) || wanted(Feature::OomKills) {
        let (cgroups, oom) = match root {
            Some(root) => prove_cgroup_and_oom(&mut seen, root),
            None => {
                let why = Proof::NotMade("no cgroup v2 mount".to_owned());
                (why.clone(), why)
            }
        };
        if wanted(Feature::CgroupEvents) {
            proofs.push((Feature::CgroupEvents, cgroups));
        }
        if wanted(Feature::OomKills) {
            proofs.push((Feature::OomKills, oom));
        }
    }
    proofs
}

/// The records read so far, and the ring they come from.
struct Seen<'a> {
    stream: &'a mut EventStream,
    events: Vec<Event>,
}

impl Seen<'_> {
    /// Whether a record `matches` arrives within [`RECORD_DEADLINE`].
    fn wait_for(&mut self, matches: impl Fn(&Event) -> bool) -> bool {
        let deadline = Instant::now() + RECORD_DEADLINE;
        loop {
            self.stream.drain_into(&mut self.events);
            if self.events.iter().any(&matches) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn any(&self, matches: impl Fn(&Event) -> bool) -> bool {
        self.events.iter().any(matches)
    }
}

/// This binary as a child doing `what`.
fn spawn_child(what: &str, cgroup_procs: &[PathBuf]) -> io::Result<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args([CHILD_COMMAND, what]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let procs: Vec<std::ffi::CString> = cgroup_procs
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(io::Error::other))
        .collect::<io::Result<_>>()?;
    if !procs.is_empty() {
        // SAFETY: only async-signal-safe calls (open, write, close: rustix's raw system calls,
        // no allocation) on buffers made before fork.
        unsafe {
            command.pre_exec(move || {
                use rustix::fs::{Mode, OFlags};
                for file in &procs {
                    let fd = rustix::fs::open(file.as_c_str(), OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
                    rustix::io::write(&fd, b"0")?;
                }
                Ok(())
            });
        }
    }
    command.spawn()
}

fn prove_process(seen: &mut Seen<'_>) -> (Proof, Proof) {
    let mut child = match spawn_child("exit", &[]) {
        Ok(child) => child,
        Err(err) => return (Proof::NotMade(format!("spawning a child: {err}")), Proof::NotMade(String::new())),
    };
    let tgid = child.id();
    let _ = child.wait();
    let exec = seen.wait_for(|e| e.tgid == tgid && matches!(e.detail, Detail::Exec { .. }));
    let exit = seen.wait_for(|e| e.tgid == tgid && matches!(e.detail, Detail::Exit { exit_status: Some(3), .. }));
    let said = |ok: bool, what: &str| match ok {
        true => Proof::Seen,
        false => Proof::NotSeen(format!("no {what} record for a child that ran and exited with 3")),
    };
    (said(exec, "exec"), said(exit, "exit"))
}

fn prove_signal(seen: &mut Seen<'_>) -> Proof {
    let mut child = match spawn_child("sleep", &[]) {
        Ok(child) => child,
        Err(err) => return Proof::NotMade(format!("spawning a child: {err}")),
    };
    let tgid = child.id();
    // The child's exec record says it runs the sleep, so the signal finds it there.
    let running = seen.wait_for(|e| e.tgid == tgid && matches!(e.detail, Detail::Exec { .. }));
    let sent = rustix::process::Pid::from_raw(tgid as i32)
        .map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::TERM));
    let _ = child.wait();
    if !matches!(sent, Some(Ok(()))) {
        return Proof::NotMade("could not signal the child".to_owned());
    }
    match seen.wait_for(|e| matches!(e.detail, Detail::Signal { signal: 15, target_tgid, .. } if target_tgid == tgid)) {
        true => Proof::Seen,
        false if !running => Proof::NotSeen("no record of a SIGTERM to a child (nor of its exec)".to_owned()),
        false => Proof::NotSeen("no record of a SIGTERM to a child".to_owned()),
    }
}

/// A listener, a connection to it and its accept, after a Unix socket's accept: the TCP
/// records must come, and the Unix accept must not be one of them.
fn prove_tcp(seen: &mut Seen<'_>) -> (Proof, Proof) {
    let me = std::process::id();
    let unix_path = std::env::temp_dir().join(format!("lifecycle-doctor-{me}.sock"));
    let unix = (|| -> io::Result<()> {
        let listener = UnixListener::bind(&unix_path)?;
        let _client = UnixStream::connect(&unix_path)?;
        listener.accept().map(drop)
    })();
    let _ = std::fs::remove_file(&unix_path);
    let tcp = (|| -> io::Result<u16> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let mut client = TcpStream::connect(("127.0.0.1", port))?;
        let (server, _) = listener.accept()?;
        drop(server);
        let _ = client.read(&mut [0u8; 1]);
        Ok(port)
    })();
    let port = match tcp {
        Ok(port) => port,
        Err(err) => {
            let why = Proof::NotMade(format!("a loopback TCP connection: {err}"));
            return (why.clone(), why);
        }
    };
    let tcp_detail = |detail: &Detail| match detail {
        Detail::TcpListen(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => Some(*t),
        _ => None,
    };
    let listened = seen.wait_for(|e| matches!(e.detail, Detail::TcpListen(t) if t.local_port == port));
    let established = seen.wait_for(|e| matches!(e.detail, Detail::TcpEstablished(t) if t.local_port == port));
    let accepted = seen.wait_for(|e| e.tgid == me && matches!(e.detail, Detail::TcpAccept(t) if t.local_port == port));
    let sockets = match (listened, established) {
        (true, true) => Proof::Seen,
        _ => Proof::NotSeen(format!("no listen or handshake record for 127.0.0.1:{port}")),
    };
    // The Unix accept came first: had it been taken for TCP, its record is here by now.
    let unix_as_tcp = seen.any(|e| {
        e.tgid == me
            && tcp_detail(&e.detail).is_some_and(|t| matches!(e.detail, Detail::TcpAccept(_)) && t.local_port != port)
    });
    let accepts = match (accepted, unix.is_ok(), unix_as_tcp) {
        (false, _, _) => Proof::NotSeen(format!("no accept record for 127.0.0.1:{port}")),
        (true, true, true) => Proof::NotSeen("a Unix socket's accept was recorded as a TCP accept".to_owned()),
        (true, _, _) => Proof::Seen,
    };
    (sockets, accepts)
}

/// A cgroup made and removed (its records), and in it a child that allocates past a memory
/// limit (the OOM killer's record of it).
fn prove_cgroup_and_oom(seen: &mut Seen<'_>, root: &CgroupRoot) -> (Proof, Proof) {
    let name = format!("/lifecycle-doctor-{}", std::process::id());
    let dir = root.dir_of(&name);
    if let Err(err) = std::fs::create_dir(&dir) {
        let why = Proof::NotMade(format!("creating {}: {err}", dir.display()));
        return (why.clone(), why);
    }
    let made = seen.wait_for(|e| matches!(&e.detail, Detail::CgroupMkdir(c) if c.path == name));
    let oom = match memory_limit(&dir, &name) {
        Ok(procs) => {
            let oom = match spawn_child("allocate", &procs) {
                Ok(mut child) => {
                    let tgid = child.id();
                    let _ = child.wait();
                    match seen
                        .wait_for(|e| matches!(e.detail, Detail::OomVictim { victim_tgid, .. } if victim_tgid == tgid))
                    {
                        true => Proof::Seen,
                        false => Proof::NotSeen(format!(
                            "a child allocating past a {} MiB limit left no OOM record",
                            MEMORY_LIMIT_BYTES >> 20
                        )),
                    }
                }
                Err(err) => Proof::NotMade(format!("spawning a child: {err}")),
            };
            for file in procs.iter().skip(1) {
                if let Some(v1) = file.parent() {
                    let _ = std::fs::remove_dir(v1);
                }
            }
            oom
        }
        Err(why) => Proof::NotMade(why),
    };
    let removed = std::fs::remove_dir(&dir).is_ok();
    let gone = removed && seen.wait_for(|e| matches!(&e.detail, Detail::CgroupRmdir(c) if c.path == name));
    let cgroups = match (made, gone) {
        (true, true) => Proof::Seen,
        _ => Proof::NotSeen(format!("no mkdir or rmdir record for {name}")),
    };
    (cgroups, oom)
}

/// Puts a memory limit on the cgroup: v2's `memory.max` when the memory controller is on v2,
/// else a v1 memory cgroup beside it (hybrid hosts). Returns the `cgroup.procs` files a child
/// joins.
fn memory_limit(dir: &Path, name: &str) -> Result<Vec<PathBuf>, String> {
    let v2_max = dir.join("memory.max");
    if v2_max.exists() {
        std::fs::write(&v2_max, MEMORY_LIMIT_BYTES.to_string()).map_err(|err| format!("memory.max: {err}"))?;
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        return Ok(vec![dir.join("cgroup.procs")]);
    }
    let v1 = Path::new("/sys/fs/cgroup/memory").join(name.trim_start_matches('/'));
    if !v1.parent().is_some_and(Path::is_dir) {
        return Err("no memory controller to set a limit with (v2 or v1)".to_owned());
    }
    std::fs::create_dir_all(&v1).map_err(|err| format!("{}: {err}", v1.display()))?;
    let limit = std::fs::write(v1.join("memory.limit_in_bytes"), MEMORY_LIMIT_BYTES.to_string());
    if let Err(err) = limit {
        let _ = std::fs::remove_dir(&v1);
        return Err(format!("v1 memory.limit_in_bytes: {err}"));
    }
    let _ = std::fs::write(v1.join("memory.memsw.limit_in_bytes"), MEMORY_LIMIT_BYTES.to_string());
    Ok(vec![dir.join("cgroup.procs"), v1.join("cgroup.procs")])
}
