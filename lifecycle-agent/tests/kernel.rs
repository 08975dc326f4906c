//! Privileged tier: the real kernel programs, loaded into this kernel, watching real processes in
//! fresh cgroups. Every field of every event is checked against what the test itself knows (pids
//! it spawned, the cgroup directory's inode, its own netns), so a wrong BTF offset or a wrong
//! cgroup attribution fails here. Skips with a printed reason when not root.

use std::{
    io::{BufRead as _, BufReader},
    net::TcpStream,
    process::{Command, Stdio},
};

use lifecycle_agent::{
    kernel::{MapRead, Sensor, SensorConfig},
    model::event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
};
use lifecycle_testkit::{
    cgroup::{own_cgroup_id, own_netns, own_thread_comm, TestCgroup},
    hub::Hub,
    require_privileges,
};

const PYTHON: &str = "/usr/bin/python3";

fn exec_of(events: &[Event], tgid: u32) -> Option<&Event> {
    events.iter().find(|e| e.tgid == tgid && matches!(e.detail, Detail::Exec { .. }))
}

fn is_exit_of(e: &Event, tgid: u32) -> bool {
    e.tgid == tgid && matches!(e.detail, Detail::Exit { group_dead: true, .. })
}

/// Waits for the exec and the final exit of `pid`, returning them.
fn exec_and_exit(hub: &Hub, cg: &TestCgroup, pid: u32) -> (Event, Event) {
    let found = hub.wait_for(
        &format!("exec and exit of {pid}"),
        |e| e.cgroup_id == cg.id && e.tgid == pid,
        |m| exec_of(m, pid).is_some() && m.iter().any(|e| is_exit_of(e, pid)),
    );
    let exec = exec_of(&found, pid).cloned().expect("exec");
    let exit = found.iter().find(|e| is_exit_of(e, pid)).cloned().expect("exit");
    (exec, exit)
}

#[test]
fn process_exiting_3_reports_exec_and_exit_fields_exactly() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("exit3");
    let mut child = cg.spawn(Command::new("/bin/sh").args(["-c", "exit 3"]));
    let pid = child.id();
    assert_eq!(child.wait().expect("wait").code(), Some(3));
    let (exec, exit) = exec_and_exit(hub, &cg, pid);
    let me = std::process::id();

    let Detail::Exec { parent_tgid, parent_cgroup_id, started, comm, namespace_init, child_pid_namespace } =
        &exec.detail
    else {
        unreachable!()
    };
    // The test runs in the host's pid namespace.
    assert_eq!((*namespace_init, *child_pid_namespace), (false, false));
    assert_eq!((exec.pid, exec.tgid, exec.cgroup_id), (pid, pid, cg.id));
    assert_eq!((*parent_tgid, *parent_cgroup_id, comm.as_str()), (me, own_cgroup_id(), "sh"));
    let exec_start = *started;
    assert!(exec_start.ns() > 0 && exec_start <= exec.at, "start {exec_start:?} <= exec {:?}", exec.at);

    let Detail::Exit { exit_status, signal, core_dumped, group_dead, parent_tgid, started, cpu_time, comm } =
        &exit.detail
    else {
        unreachable!()
    };
    assert_eq!((*exit_status, *signal, *core_dumped, *group_dead), (Some(3), None, false, true));
    assert_eq!((*parent_tgid, *started, comm.as_str()), (me, exec_start, "sh"));
    // A shell that only exits runs for well under a second of CPU.
    assert!(*cpu_time < std::time::Duration::from_secs(1), "cpu {cpu_time:?}");
    assert_eq!((exit.pid, exit.tgid, exit.cgroup_id), (pid, pid, cg.id));
    assert!(exit.at > exec.at);

    let counters = hub.maps.counters_of(cg.id).expect("kernel counters for the cgroup");
    assert_eq!((counters.execs, counters.process_exits), (1, 1));
}

fn killed_by(signal: i32, name: &str) {
    let hub = Hub::get();
    let mut cg = TestCgroup::new(name);
    let mut child = cg.spawn(Command::new("/bin/sleep").arg("1000"));
    let pid = child.id();
    // Signal only once the kernel has reported the exec: the target is then `sleep`, not the
    // forked test binary, and its comm is known.
    hub.wait_for("exec of sleep", |e| e.tgid == pid && e.cgroup_id == cg.id, |m| exec_of(m, pid).is_some());
    let sender_comm = own_thread_comm();
    // SAFETY: kill has no memory-safety preconditions; pid is our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    let status = child.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(signal));

    let (_, exit) = exec_and_exit(hub, &cg, pid);
    let Detail::Exit { exit_status, signal: got, core_dumped, .. } = exit.detail else { unreachable!() };
    assert_eq!((exit_status, got, core_dumped), (None, Some(signal as u8), false));

    let me = std::process::id();
    let sent = hub.wait_for(
        "the signal from the test",
        |e| matches!(e.detail, Detail::Signal { target_tgid, signal: s, .. } if target_tgid == pid && s == signal as u32),
        |m| !m.is_empty(),
    );
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let e = &sent[0];
    assert_eq!((e.tgid, e.cgroup_id), (me, own_cgroup_id()));
    assert_eq!(
        e.detail,
        Detail::Signal {
            signal: signal as u32,
            result: SignalResult::Delivered,
            group: true,
            target_pid: pid,
            target_tgid: pid,
            target_cgroup_id: cg.id,
            sender_comm,
            target_comm: "sleep".into(),
            from_kernel: false,
        }
    );
    let counters = hub.maps.counters_of(cg.id).expect("counters");
    assert!(counters.signals_received >= 1);
}

#[test]
fn process_killed_by_sigterm_reports_the_signal_and_its_sender() {
    require_privileges!();
    killed_by(libc::SIGTERM, "sigterm");
}

#[test]
fn process_killed_by_sigkill_reports_the_signal_and_its_sender() {
    require_privileges!();
    killed_by(libc::SIGKILL, "sigkill");
}

#[test]
fn memory_limit_oom_kill_reports_the_victim_in_its_cgroup() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("oom");
    cg.limit_memory(32 << 20);
    // dd reads /dev/zero into one 256 MiB buffer, touching every page: far over the limit.
    let mut child = cg.spawn(
        Command::new("/bin/dd").args(["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]).stderr(Stdio::null()),
    );
    let pid = child.id();
    let status = child.wait().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));

    let oom = hub.wait_for(
        "OOM victim",
        |e| matches!(e.detail, Detail::OomVictim { victim_cgroup_id, .. } if victim_cgroup_id == cg.id),
        |m| !m.is_empty(),
    );
    assert_eq!(oom.len(), 1, "{oom:#?}");
    assert_eq!(
        oom[0].detail,
        Detail::OomVictim { victim_pid: pid, victim_tgid: pid, victim_cgroup_id: cg.id, victim_comm: "dd".into() }
    );
    let (_, exit) = exec_and_exit(hub, &cg, pid);
    assert!(matches!(exit.detail, Detail::Exit { signal: Some(9), exit_status: None, .. }), "{exit:?}");
    assert_eq!(hub.maps.counters_of(cg.id).expect("counters").oom_kills, 1);
}

#[test]
fn signal_between_two_processes_of_one_cgroup_names_both() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("sig2");
    // The shell waits (without forking) until its child has exec'd sleep, then signals it.
    let script = "sleep 1000 & p=$!; until read c < /proc/$p/comm && [ \"$c\" = sleep ]; do :; done; kill -USR1 $p; wait $p; exit 0";
    let mut child = cg.spawn(Command::new("/bin/sh").args(["-c", script]));
    let shell = child.id();
    assert!(child.wait().expect("wait").success());

    let sent = hub.wait_for(
        "SIGUSR1 between the shell and sleep",
        |e| e.tgid == shell && matches!(e.detail, Detail::Signal { signal: 10, .. }),
        |m| !m.is_empty(),
    );
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let sleeper = hub
        .events_of(cg.id)
        .into_iter()
        .find_map(|e| match e.detail {
            Detail::Exec { ref comm, parent_tgid, parent_cgroup_id, .. }
                if comm == "sleep" && parent_tgid == shell && parent_cgroup_id == cg.id =>
            {
                Some(e.tgid)
            }
            _ => None,
        })
        .expect("exec of sleep in the cgroup");
    let e = &sent[0];
    assert_eq!((e.pid, e.tgid, e.cgroup_id), (shell, shell, cg.id));
    assert_eq!(
        e.detail,
        Detail::Signal {
            signal: 10,
            result: SignalResult::Delivered,
            group: true,
            target_pid: sleeper,
            target_tgid: sleeper,
            target_cgroup_id: cg.id,
            sender_comm: "sh".into(),
            target_comm: "sleep".into(),
            from_kernel: false,
        }
    );
    let (_, exit) = exec_and_exit(hub, &cg, sleeper);
    assert!(matches!(exit.detail, Detail::Exit { signal: Some(10), .. }), "{exit:?}");
}

/// A process that owns its stdout (a pipe) with O_ASYNC and F_SETSIG(SIGTERM), handled: each
/// read by the process at the other end makes the kernel send it SIGTERM, in the reader's
/// context. As a container's stdout is read by the runtime's shim.
const ASYNC_STDOUT_OWNER: &str = r#"
import fcntl, os, signal, sys
signal.signal(signal.SIGTERM, lambda *a: None)
F_SETSIG = 10
fcntl.fcntl(1, fcntl.F_SETOWN, os.getpid())
fcntl.fcntl(1, F_SETSIG, signal.SIGTERM)
fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_ASYNC)
os.write(1, b"ready\n")
sys.stdin.read()
"#;

#[test]
fn a_signal_the_kernel_generates_is_marked_so_whoever_ran() {
    // Issue 37: with F_SETOWN + O_ASYNC + F_SETSIG(SIGTERM) on its stdout, a tenant made the
    // runtime's shim (whose read woke the pipe) look like the sender of a SIGTERM to its PID 1.
    require_privileges!();
    let hub = Hub::get();
    let mut owner_cg = TestCgroup::new("async-owner");
    let mut owner = owner_cg
        .spawn(Command::new(PYTHON).args(["-c", ASYNC_STDOUT_OWNER]).stdin(Stdio::piped()).stdout(Stdio::piped()));
    let owner_pid = owner.id();
    // This test's read of the owner's stdout is what makes the kernel signal it.
    let mut line = String::new();
    BufReader::new(owner.stdout.take().expect("stdout")).read_line(&mut line).expect("ready");
    let events = hub.wait_for(
        "the SIGTERM the kernel sent for the pipe",
        |e| matches!(e.detail, Detail::Signal { signal: 15, target_tgid, .. } if target_tgid == owner_pid),
        |m| !m.is_empty(),
    );
    let term = &events[0];
    assert_eq!(term.tgid, std::process::id(), "current was this test, the reader");
    assert!(matches!(term.detail, Detail::Signal { from_kernel: true, .. }), "{term:?}");
    // A plain kill(2) is a process's own request.
    let kill = Command::new("/bin/kill").args(["-TERM", &owner_pid.to_string()]).spawn().expect("kill");
    let killer = kill.id();
    assert!(kill.wait_with_output().expect("kill").status.success());
    hub.wait_for(
        "the SIGTERM kill sent",
        |e| e.tgid == killer && matches!(e.detail, Detail::Signal { signal: 15, from_kernel: false, .. }),
        |m| !m.is_empty(),
    );
    drop(owner.stdin.take());
    assert!(owner.wait().expect("owner").success());
}

/// Signals recorded from `cg`, as (signal, target tgid).
fn signal_records(hub: &Hub, cg: &TestCgroup) -> Vec<(u32, u32)> {
    hub.events_of(cg.id)
        .into_iter()
        .filter_map(|e| match e.detail {
            Detail::Signal { signal, target_tgid, .. } if e.cgroup_id == cg.id => Some((signal, target_tgid)),
            _ => None,
        })
        .collect()
}

#[test]
fn signals_a_process_handles_inside_its_cgroup_are_counted_by_number_not_recorded() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("sigquiet");
    // Handled SIGUSR1 (a signal-driven loop), SIGWINCH whose default is to ignore it, and a
    // handled SIGTERM last: a stop request the process sends itself and handles is no request
    // to stop anything, and floods the ring if recorded (issue 18): counted too.
    let script = "import os, signal\n\
                  signal.signal(signal.SIGUSR1, lambda *a: None)\n\
                  signal.signal(signal.SIGTERM, lambda *a: None)\n\
                  pid = os.getpid()\n\
                  for _ in range(50): os.kill(pid, signal.SIGUSR1)\n\
                  os.kill(pid, signal.SIGWINCH)\n\
                  os.kill(pid, signal.SIGTERM)\n";
    let mut child = cg.spawn(Command::new(PYTHON).args(["-c", script]));
    let pid = child.id();
    assert!(child.wait().expect("wait").success());
    // Its exit follows every signal into the ring: once it is read, a signal record would have been.
    hub.wait_for(
        "the exit of the signalling process",
        |e| e.tgid == pid && matches!(e.detail, Detail::Exit { group_dead: true, .. }),
        |m| !m.is_empty(),
    );
    assert_eq!(signal_records(hub, &cg), vec![], "nothing recorded");
    let counters = hub.maps.counters_of(cg.id).expect("counters");
    assert_eq!(counters.signals_received, 52, "every signal counted: {counters:?}");
    let mut unrecorded = [0u64; lifecycle_common::SIGNAL_SLOTS];
    unrecorded[10] = 50;
    unrecorded[15] = 1;
    unrecorded[28] = 1;
    assert_eq!(counters.unrecorded_signals, unrecorded);
}

/// The pid of the process that began a new pid namespace in `cg` (`unshare --pid --fork`'s child).
fn namespace_init(hub: &Hub, cg: &TestCgroup) -> u32 {
    hub.wait_for(
        "the exec of the namespace's init",
        |e| e.cgroup_id == cg.id && matches!(e.detail, Detail::Exec { namespace_init: true, .. }),
        |m| !m.is_empty(),
    )[0]
    .tgid
}

#[test]
fn handled_signals_to_a_pid_namespace_init_from_inside_are_counted_not_recorded() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("siginit");
    // PID 1 of a new pid namespace and its child both handle SIGUSR2. Each signals itself, then
    // the child signals the init: all three counted, none recorded. A container's own processes
    // signalling its PID 1 is the container doing something to itself (issue 18: a child
    // flooding its init with SIGHUPs it ignores grew the agent without bound); the verdicts only
    // weigh signals to the init from outside the container.
    let script = "trap : USR2; kill -USR2 $$; sh -c 'trap : USR2; kill -USR2 $$; kill -USR2 1'; exit 0";
    let mut child = cg.spawn(Command::new("/usr/bin/unshare").args(["--pid", "--fork", "/bin/sh", "-c", script]));
    assert!(child.wait().expect("wait").success());
    let init = namespace_init(hub, &cg);
    // The init's exit follows every signal into the ring: once it is read, a signal record
    // would have been too.
    hub.wait_for(
        "the exit of the namespace's init",
        |e| e.cgroup_id == cg.id && e.tgid == init && matches!(e.detail, Detail::Exit { group_dead: true, .. }),
        |m| !m.is_empty(),
    );
    assert_eq!(signal_records(hub, &cg), vec![]);
    assert_eq!(hub.maps.counters_of(cg.id).expect("counters").unrecorded_signals[12], 3);
}

#[test]
fn a_stop_request_the_namespace_init_passes_on_is_recorded_even_when_handled() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("sigforward");
    // A shell as PID 1 passes SIGTERM on to its child, which handles it, then SIGKILLs it: both
    // recorded (did the app get the SIGTERM? is the question of every shell entrypoint).
    let script = "sh -c 'trap : TERM; while :; do sleep 0.05; done' & child=$!; sleep 0.2; \
                  kill -TERM $child; kill -KILL $child; wait; exit 0";
    let mut child = cg.spawn(Command::new("/usr/bin/unshare").args(["--pid", "--fork", "/bin/sh", "-c", script]));
    assert!(child.wait().expect("wait").success());
    let init = namespace_init(hub, &cg);
    let records = hub.wait_for(
        "the TERM and the KILL the init sent",
        |e| e.cgroup_id == cg.id && e.tgid == init && matches!(e.detail, Detail::Signal { .. }),
        |m| m.len() >= 2,
    );
    // To the child shell (the init's exit then SIGKILLs what is left of its namespace, `sleep`).
    let to_child = |e: &Event| match e.detail {
        Detail::Signal { target_tgid, target_comm: ref comm, .. } if target_tgid != init && comm == "sh" => {
            Some(target_tgid)
        }
        _ => None,
    };
    let child_tgid = records.iter().find_map(to_child).expect("a signal to the child shell");
    let signals: Vec<u32> = records
        .iter()
        .filter_map(|e| match e.detail {
            Detail::Signal { signal, target_tgid, .. } if target_tgid == child_tgid => Some(signal),
            _ => None,
        })
        .collect();
    assert_eq!(signals, vec![15, 9], "{records:?}");
}

/// A Python listener in the cgroup: prints its port, then accepts `accepts` connections (or, with
/// -1, never accepts) and exits when stdin closes.
const LISTENER: &str = r#"
import socket, sys
n = int(sys.argv[1])
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(64)
print(l.getsockname()[1], flush=True)
for _ in range(max(n, 0)):
    s, _ = l.accept(); s.close()
sys.stdin.read()
"#;

fn tcp_events(hub: &Hub, cg: &TestCgroup, port: u16, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    hub.wait_for(
        what,
        |e| match &e.detail {
            Detail::TcpListen(t) | Detail::TcpListenClose(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => {
                t.socket_cgroup_id == cg.id && t.local_port == port
            }
            _ => false,
        },
        done,
    )
}

fn count(events: &[Event], kind: fn(&Detail) -> bool) -> usize {
    events.iter().filter(|e| kind(&e.detail)).count()
}

#[test]
fn tcp_listener_accepting_clients_from_inside_and_outside_its_cgroup() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("accept");
    const OUTSIDE: usize = 3;
    const INSIDE: usize = 2;
    let mut listener = cg.spawn(
        Command::new(PYTHON)
            .args(["-c", LISTENER, &(OUTSIDE + INSIDE).to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let server = listener.id();
    let mut port = String::new();
    BufReader::new(listener.stdout.take().expect("stdout")).read_line(&mut port).expect("port");
    let port: u16 = port.trim().parse().expect("port number");

    let outside: Vec<TcpStream> =
        (0..OUTSIDE).map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect")).collect();
    let inside_client =
        format!("import socket\nfor _ in range({INSIDE}): socket.create_connection(('127.0.0.1', {port})).close()");
    assert!(cg.spawn(Command::new(PYTHON).args(["-c", &inside_client])).wait().expect("client").success());

    let events = tcp_events(hub, &cg, port, "listen, established and accepts", |m| {
        count(m, |d| matches!(d, Detail::TcpAccept(_))) == OUTSIDE + INSIDE
            && count(m, |d| matches!(d, Detail::TcpEstablished(_))) == OUTSIDE + INSIDE
    });
    let netns = own_netns();
    let expected = |remote_port: u16, fd: Option<i32>| TcpDetail {
        socket_cgroup_id: cg.id,
        netns,
        family: libc::AF_INET as u16,
        local_port: port,
        remote_port,
        fd,
    };
    let listens: Vec<&Event> = events.iter().filter(|e| matches!(e.detail, Detail::TcpListen(_))).collect();
    assert_eq!(listens.len(), 1);
    assert_eq!((listens[0].tgid, listens[0].cgroup_id), (server, cg.id));
    assert_eq!(listens[0].detail, Detail::TcpListen(expected(0, None)));

    // Every handshake is charged to the listener's cgroup, whoever the client was.
    let mut remote_ports: Vec<u16> = events
        .iter()
        .filter_map(|e| match e.detail {
            Detail::TcpEstablished(t) => {
                assert_eq!(t, expected(t.remote_port, None));
                Some(t.remote_port)
            }
            _ => None,
        })
        .collect();
    remote_ports.sort_unstable();
    let mut outside_ports: Vec<u16> = outside.iter().map(|s| s.local_addr().expect("addr").port()).collect();
    outside_ports.sort_unstable();
    assert!(outside_ports.iter().all(|p| remote_ports.contains(p)), "{outside_ports:?} in {remote_ports:?}");

    for accept in events.iter().filter(|e| matches!(e.detail, Detail::TcpAccept(_))) {
        assert_eq!((accept.tgid, accept.cgroup_id), (server, cg.id));
        let Detail::TcpAccept(t) = accept.detail else { unreachable!() };
        assert!(t.fd.is_some_and(|fd| fd >= 0));
        assert_eq!(t, expected(t.remote_port, t.fd));
        assert!(remote_ports.contains(&t.remote_port));
    }

    drop(listener.stdin.take());
    assert!(listener.wait().expect("listener").success());
    let closed =
        tcp_events(hub, &cg, port, "listen close", |m| count(m, |d| matches!(d, Detail::TcpListenClose(_))) == 1);
    assert_eq!(
        closed.iter().find(|e| matches!(e.detail, Detail::TcpListenClose(_))).map(|e| e.detail.clone()),
        Some(Detail::TcpListenClose(expected(0, None)))
    );
    let counters = hub.maps.counters_of(cg.id).expect("counters");
    assert_eq!(
        (counters.tcp_listens, counters.tcp_established, counters.tcp_accepts),
        (1, (OUTSIDE + INSIDE) as u64, (OUTSIDE + INSIDE) as u64)
    );
}

/// A server in the cgroup that accepts `UNIX` connections on a Unix socket, then one TCP
/// connection (the marker that it is done), and exits when stdin closes.
const UNIX_THEN_TCP_SERVER: &str = r#"
import os, socket, sys, tempfile
n = int(sys.argv[1])
path = os.path.join(tempfile.mkdtemp(), "s")
u = socket.socket(socket.AF_UNIX); u.bind(path); u.listen(16)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(16)
print(path, l.getsockname()[1], flush=True)
for _ in range(n):
    s, _ = u.accept(); s.close()
s, _ = l.accept(); s.close()
sys.stdin.read()
os.unlink(path)
"#;

#[test]
fn unix_socket_accepts_are_not_counted_as_tcp_accepts() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("unixaccept");
    const UNIX: usize = 3;
    let mut server = cg.spawn(
        Command::new(PYTHON)
            .args(["-c", UNIX_THEN_TCP_SERVER, &UNIX.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("stdout")).read_line(&mut line).expect("path and port");
    let (path, port) = line.trim().split_once(' ').expect("two fields");
    let port: u16 = port.parse().expect("port number");
    let unix_clients: Vec<std::os::unix::net::UnixStream> =
        (0..UNIX).map(|_| std::os::unix::net::UnixStream::connect(path).expect("connect unix")).collect();
    let marker = TcpStream::connect(("127.0.0.1", port)).expect("connect tcp");
    // The TCP accept comes after every Unix accept of the same process: once it is seen, a Unix
    // accept recorded as TCP would have been seen too.
    let events = hub.wait_for(
        "the TCP accept after the Unix ones",
        |e| e.cgroup_id == cg.id && matches!(e.detail, Detail::TcpAccept(_)),
        |m| m.iter().any(|e| matches!(e.detail, Detail::TcpAccept(t) if t.local_port == port)),
    );
    let accepts: Vec<&Event> = events.iter().filter(|e| matches!(e.detail, Detail::TcpAccept(_))).collect();
    assert_eq!(accepts.len(), 1, "only the TCP connection is a TCP accept: {accepts:?}");
    let counters = hub.maps.counters_of(cg.id).expect("counters");
    assert_eq!(counters.tcp_accepts, 1, "{counters:?}");
    drop((unix_clients, marker));
    drop(server.stdin.take());
    assert!(server.wait().expect("server").success());
}

/// rx_queue of the LISTEN socket on `port` in /proc/<pid>/net/tcp: the accept-queue depth.
fn accept_queue_depth(pid: u32, port: u16) -> Option<u64> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
        let (_, rx) = fields.get(4)?.split_once(':')?;
        (local_port == port && *fields.get(3)? == "0A").then(|| u64::from_str_radix(rx, 16).ok()).flatten()
    })
}

#[test]
fn tcp_listener_that_never_accepts_shows_connections_waiting() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("noaccept");
    const CLIENTS: usize = 4;
    let mut listener =
        cg.spawn(Command::new(PYTHON).args(["-c", LISTENER, "-1"]).stdin(Stdio::piped()).stdout(Stdio::piped()));
    let mut port = String::new();
    BufReader::new(listener.stdout.take().expect("stdout")).read_line(&mut port).expect("port");
    let port: u16 = port.trim().parse().expect("port number");
    // Connecting succeeds: the kernel completes the handshake into the backlog (why a tcpSocket
    // probe passes for an app that stopped accepting).
    let clients: Vec<TcpStream> =
        (0..CLIENTS).map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect")).collect();
    let events = tcp_events(hub, &cg, port, "established connections", |m| {
        count(m, |d| matches!(d, Detail::TcpEstablished(_))) == CLIENTS
    });
    assert_eq!(count(&events, |d| matches!(d, Detail::TcpAccept(_))), 0);
    let counters = hub.maps.counters_of(cg.id).expect("counters");
    let waiting = counters.tcp_established - counters.tcp_accepts;
    assert_eq!(waiting, CLIENTS as u64);
    assert_eq!(accept_queue_depth(listener.id(), port), Some(waiting), "kernel's own accept-queue depth agrees");
    drop(clients);
    drop(listener.stdin.take());
    assert!(listener.wait().expect("listener").success());
}

#[test]
fn cgroup_creation_and_removal_report_id_and_path() {
    require_privileges!();
    let hub = Hub::get();
    let cg = TestCgroup::new("mkdir");
    let (id, path) = (cg.id, cg.path.clone());
    let detail = CgroupDetail { id, path: path.clone(), truncated: false };
    let created =
        hub.wait_for("cgroup mkdir", |e| matches!(&e.detail, Detail::CgroupMkdir(c) if c.id == id), |m| !m.is_empty());
    assert_eq!(created[0].detail, Detail::CgroupMkdir(detail.clone()));
    drop(cg);
    let removed =
        hub.wait_for("cgroup rmdir", |e| matches!(&e.detail, Detail::CgroupRmdir(c) if c.id == id), |m| !m.is_empty());
    assert_eq!(removed[0].detail, Detail::CgroupRmdir(detail));
}

#[test]
fn ring_overflow_is_counted_exactly_never_dropped_silently() {
    require_privileges!();
    // A private sensor with the smallest ring, whose reader stays paused during the burst.
    let config = SensorConfig { ring_bytes: 16 * 1024, ..SensorConfig::default() };
    let mut sensor = Sensor::load(&config).expect("load sensor");
    let mut stream = sensor.take_events().expect("stream");
    let maps = sensor.maps();
    let before = maps.kind_stats();
    let mut cg = TestCgroup::new("overflow");
    const RUNS: usize = 600;
    let burst = format!("i=0; while [ $i -lt {RUNS} ]; do /bin/true; i=$((i+1)); done");
    assert!(cg.spawn(Command::new("/bin/sh").args(["-c", &burst])).wait().expect("burst").success());

    // The burst is over (we reaped the shell); read everything that made it into the ring.
    let mut received = Vec::new();
    while stream.drain_into(&mut received) > 0 {}
    // Records about this cgroup: its processes' execs and exits, and its own mkdir record (whose
    // loss, when the ring is already full of other tests' events, is charged to it too).
    let ours: Vec<&Event> = received
        .iter()
        .filter(|e| e.cgroup_id == cg.id || matches!(&e.detail, Detail::CgroupMkdir(c) if c.id == cg.id))
        .collect();
    let counters = maps.counters_of(cg.id).expect("counters");
    // The shell's exec plus RUNS execs of true, and as many process exits.
    assert_eq!((counters.execs, counters.process_exits), ((RUNS + 1) as u64, (RUNS + 1) as u64));
    let sent = counters.execs + counters.process_exits + 1;
    assert!(counters.events_lost > 0, "a 16 KiB ring cannot hold {sent} records");
    assert_eq!(ours.len() as u64 + counters.events_lost, sent, "sent == received + counted lost");
    let after = maps.kind_stats();
    let lost_globally: u64 = after.iter().zip(&before).map(|(a, b)| a.lost - b.lost).sum();
    assert!(lost_globally >= counters.events_lost);
    drop(cg);
    drop(stream);
    drop(sensor);
}

#[test]
fn exec_records_say_whether_the_task_is_a_pid_namespace_init() {
    require_privileges!();
    let hub = Hub::get();
    let mut cg = TestCgroup::new("pidns");
    // unshare forks a child that is PID 1 of a new pid namespace and execs sh there; sh forks
    // sleep, PID 2 of that namespace.
    let mut child =
        cg.spawn(Command::new("/usr/bin/unshare").args(["--pid", "--fork", "/bin/sh", "-c", "/bin/sleep 0; exit 0"]));
    assert!(child.wait().expect("wait").success());
    let execs = hub.wait_for(
        "exec of sh and sleep in the new pid namespace",
        |e| e.cgroup_id == cg.id && matches!(&e.detail, Detail::Exec { comm, .. } if comm == "sh" || comm == "sleep"),
        |m| m.len() == 2,
    );
    let flags = |name: &str| {
        execs.iter().find_map(|e| match &e.detail {
            Detail::Exec { comm, namespace_init, child_pid_namespace, .. } if comm == name => {
                Some((*namespace_init, *child_pid_namespace))
            }
            _ => None,
        })
    };
    assert_eq!(flags("sh"), Some((true, true)), "sh is PID 1 of the new namespace");
    assert_eq!(flags("sleep"), Some((false, true)), "sleep lives in it without being its init");
}

#[test]
fn the_whole_counter_map_reads_as_each_entry_does() {
    require_privileges!();
    let hub = Hub::get();
    // More cgroups than one batch call asks for, so the read takes several calls.
    let cgroups: Vec<TestCgroup> = (0..400)
        .map(|i| {
            let mut cg = TestCgroup::new(&format!("batch{i}"));
            let status = cg.spawn(&mut Command::new("/bin/true")).wait().expect("wait");
            assert!(status.success());
            cg
        })
        .collect();
    let mut all = Vec::new();
    let read = hub.maps.each_cgroup_counters(|id, counters| all.push((id, counters)));
    // This kernel (>= 5.6) has batch lookups for hash maps: the fast path is the one taken.
    assert_eq!(read, MapRead::Batched);
    let mut ids: Vec<u64> = all.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "every entry once");
    for cg in &cgroups {
        let one = hub.maps.counters_of(cg.id).expect("an entry for the cgroup");
        let in_all = all.iter().find(|(id, _)| *id == cg.id).map(|(_, c)| *c);
        assert_eq!(in_all, Some(one), "cgroup {}", cg.id);
        assert_eq!((one.execs, one.process_exits), (1, 1));
    }
}

/// A cgroup listening on more ports than its quota of the node's listener map: past the quota its
/// listeners' close records come without their port (counted), and another cgroup's listener still
/// has its port remembered, so one pod cannot fill the map for the others.
#[test]
fn a_cgroup_past_its_listener_quota_leaves_the_map_to_others() {
    require_privileges!();
    let hub = Hub::get();
    const EXTRA: u64 = 6;
    let quota = lifecycle_common::defaults::LISTENERS_PER_CGROUP;
    // Filling the node's map takes more full cgroups than a node runs pods (110 by default) with
    // a sidecar each.
    let cgroups_to_fill = u64::from(lifecycle_common::defaults::LISTENER_ENTRIES) / quota;
    assert!(cgroups_to_fill >= 2 * 110, "{cgroups_to_fill} cgroups fill the listener map");
    let full_before = hub.maps.kind_stats().iter().map(|s| s.listener_ports_full).sum::<u64>();
    let mut greedy = TestCgroup::new("listen-quota");
    let opener = format!(
        "import socket, sys\nls = []\nfor _ in range({}):\n  l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1); ls.append(l)\n\
         print(' '.join(str(l.getsockname()[1]) for l in ls), flush=True)\nsys.stdin.read()\n",
        quota + EXTRA
    );
    let mut child =
        greedy.spawn(Command::new(PYTHON).args(["-c", &opener]).stdin(Stdio::piped()).stdout(Stdio::piped()));
    let mut ports = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut ports).expect("ports");
    let ports: Vec<u16> = ports.split_whitespace().map(|p| p.parse().expect("port")).collect();
    assert_eq!(ports.len() as u64, quota + EXTRA);
    // Closing them all (stdin's end): each close is recorded, with its port while it was remembered.
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success());
    let greedy_id = greedy.id;
    let closes = hub.wait_for(
        "every close of the greedy cgroup's listeners",
        |e| matches!(&e.detail, Detail::TcpListenClose(t) if t.socket_cgroup_id == greedy_id),
        |m| m.len() as u64 == quota + EXTRA,
    );
    let with_port =
        closes.iter().filter(|e| matches!(&e.detail, Detail::TcpListenClose(t) if t.local_port != 0)).count();
    assert_eq!(with_port as u64, quota, "the quota's worth of ports remembered, the rest not");
    let full_after = hub.maps.kind_stats().iter().map(|s| s.listener_ports_full).sum::<u64>();
    assert!(full_after - full_before >= EXTRA, "each listener past the quota counted: {full_before} -> {full_after}");

    // Another cgroup's listener, after all that: its close has its port.
    let mut other = TestCgroup::new("listen-quota-other");
    let mut listener =
        other.spawn(Command::new(PYTHON).args(["-c", LISTENER, "0"]).stdin(Stdio::piped()).stdout(Stdio::piped()));
    let mut port = String::new();
    BufReader::new(listener.stdout.take().expect("stdout")).read_line(&mut port).expect("port");
    let port: u16 = port.trim().parse().expect("port number");
    drop(listener.stdin.take());
    assert!(listener.wait().expect("wait").success());
    tcp_events(hub, &other, port, "the other cgroup's listen and close, with its port", |m| {
        count(m, |d| matches!(d, Detail::TcpListenClose(_))) == 1
    });
}
