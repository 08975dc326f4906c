//! TCP listeners, handshakes and accepts (`inet_sock_set_state`, `sys_exit_accept[4]`), charged
//! to the socket's own cgroup.

use super::*;

/// Socket identity the TCP records share.
struct SocketFacts {
    cgroup_id: u64,
    netns: u32,
    family: u16,
    local_port: u16,
    remote_port: u16,
}

#[inline(always)]
fn socket_facts(sk: *const u8) -> Result<SocketFacts, i64> {
    let net = read_ptr(sk, off!(sock_net))?;
    Ok(SocketFacts {
        cgroup_id: socket_cgroup_id(sk)?,
        netns: read::<u32>(net, off!(net_ns_inum))?,
        family: read::<u16>(sk, off!(sock_family))?,
        local_port: read::<u16>(sk, off!(sock_num))?,
        remote_port: u16::from_be(read::<u16>(sk, off!(sock_dport))?),
    })
}

/// The cgroup a socket is charged to: `sk_cgrp_data`'s first word is the cgroup pointer, except
/// in 5.10, where its low two bits set mean it holds net_prio/net_cls data instead and the
/// socket counts as the root's (the kernel's `sock_cgroup_ptr`). A `struct cgroup` is aligned,
/// so on later kernels those bits are always clear and the test costs nothing.
#[inline(always)]
fn socket_cgroup_id(sk: *const u8) -> Result<u64, i64> {
    let word = read::<u64>(sk, off!(sock_cgroup))?;
    if word & 3 != 0 || word == 0 {
        return Ok(ROOT_CGROUP_ID);
    }
    cgroup_id(word as *const u8)
}

/// Whether `sk` is a TCP socket of IPv4 or IPv6: `accept(2)` returns Unix sockets too (systemd,
/// journald and every local server), whose connections are no TCP accepts.
#[inline(always)]
fn is_tcp(sk: *const u8) -> Result<bool, i64> {
    let family = read::<u16>(sk, off!(sock_family))?;
    Ok((family == AF_INET || family == AF_INET6) && read::<u16>(sk, off!(sock_protocol))? == IPPROTO_TCP)
}

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

#[inline(always)]
fn tcp_record(kind: EventKind, facts: &SocketFacts, fd: i32) -> TcpEvent {
    TcpEvent {
        header: current_header(kind),
        socket_cgroup_id: facts.cgroup_id,
        netns: facts.netns,
        family: facts.family,
        local_port: facts.local_port,
        remote_port: facts.remote_port,
        _pad: 0,
        fd,
    }
}

/// `inet_sock_set_state(const struct sock *sk, const int oldstate, const int newstate)`.
/// Handshakes finish in softirq on whatever task runs, so everything is charged to the socket's
/// own cgroup, never to `current`.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    let _ = try_sock_state(&ctx);
    0
}

fn try_sock_state(ctx: &BtfTracePointContext) -> Result<(), i64> {
    let old_state = ctx.arg::<u64>(1) as i32;
    let new_state = ctx.arg::<u64>(2) as i32;
    let (kind, field) = if new_state == TCP_LISTEN {
        (EventKind::TcpListen, offset_of!(CgroupCounters, tcp_listens))
    } else if old_state == TCP_LISTEN && new_state == TCP_CLOSE {
        // Only LISTEN -> CLOSE: a child socket is cloned in LISTEN and moved to SYN_RECV, which
        // is a handshake, not the listener going away.
        (EventKind::TcpListenClose, usize::MAX)
    } else if old_state == TCP_SYN_RECV && new_state == TCP_ESTABLISHED {
        (EventKind::TcpEstablished, offset_of!(CgroupCounters, tcp_established))
    } else {
        return Ok(());
    };
    let sk = ctx.arg::<u64>(0) as *const u8;
    if !is_tcp(sk)? {
        return Ok(());
    }
    let mut facts = socket_facts(sk)?;
    let key = sk as u64;
    match kind {
        EventKind::TcpListen => remember_port(key, facts.cgroup_id, facts.local_port),
        EventKind::TcpListenClose => {
            // SAFETY: the value is copied out immediately; the entry is removed right after.
            if let Some(port) = unsafe { LISTENER_PORTS.get(&key) } {
                facts.local_port = *port;
                if LISTENER_PORTS.remove(&key).is_ok() {
                    count_listener(facts.cgroup_id, false);
                }
            }
        }
        _ => {}
    }
    if field != usize::MAX {
        bump(facts.cgroup_id, field, kind);
    }
    send(kind, facts.cgroup_id, tcp_record(kind, &facts, -1));
    Ok(())
}

/// Remembers a listening socket's port for its close record, within the cgroup's quota of
/// entries: a pod listening on every port fills its own quota, not the node's map. Past either
/// bound only the port of the close record is missing (counted; the agent's refresh closes the
/// port from the kernel's own list).
#[inline(always)]
fn remember_port(key: u64, cgroup: u64, port: u16) {
    // SAFETY: the value is only tested for presence.
    if unsafe { LISTENER_PORTS.get(&key) }.is_some() {
        // listen(2) again on a listening socket: the same entry, counted once.
        let _ = LISTENER_PORTS.insert(&key, &port, 0);
        return;
    }
    // SAFETY: the value is copied out at once.
    let held = unsafe { LISTENERS_PER_CGROUP.get(&cgroup) }.copied().unwrap_or(0);
    if held >= defaults::LISTENERS_PER_CGROUP || LISTENER_PORTS.insert(&key, &port, 0).is_err() {
        stat(EventKind::TcpListen, offset_of!(KindStats, listener_ports_full));
        return;
    }
    count_listener(cgroup, true);
}

/// One more (or one fewer) entry of `cgroup` in LISTENER_PORTS; its count goes when it is zero.
#[inline(always)]
fn count_listener(cgroup: u64, added: bool) {
    // SAFETY: the value is copied out at once.
    let held = unsafe { LISTENERS_PER_CGROUP.get(&cgroup) }.copied().unwrap_or(0);
    match (added, held) {
        (true, held) => {
            let _ = LISTENERS_PER_CGROUP.insert(&cgroup, &(held + 1), 0);
        }
        (false, 0 | 1) => {
            let _ = LISTENERS_PER_CGROUP.remove(&cgroup);
        }
        (false, held) => {
            let _ = LISTENERS_PER_CGROUP.insert(&cgroup, &(held - 1), 0);
        }
    }
}

/// `syscalls/sys_exit_accept4` and `sys_exit_accept`: `long ret` sits at offset 16 of the record
/// (8 bytes of common fields, then the 4-byte syscall number padded to 8).
#[tracepoint(category = "syscalls", name = "sys_exit_accept4")]
pub fn sys_exit_accept4(ctx: TracePointContext) -> u32 {
    let _ = try_accept(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_accept")]
pub fn sys_exit_accept(ctx: TracePointContext) -> u32 {
    let _ = try_accept(&ctx);
    0
}

const SYSCALL_RET_OFFSET: usize = 16;

fn try_accept(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: the offset is inside the syscall-exit record layout (see above).
    let ret = unsafe { ctx.read_at::<i64>(SYSCALL_RET_OFFSET) }.map_err(|e| e as i64)?;
    if ret < 0 || is_agent() {
        return Ok(());
    }
    let fd = ret as u32;
    // The new fd -> struct file -> struct socket -> struct sock: the accepted socket inherited the
    // listener's port, netns and cgroup, which is what ties this accept to its listener.
    // SAFETY: see try_exec.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files = read_ptr(task, off!(task_files))?;
    let fdt = read_ptr(files, off!(files_fdt))?;
    if fd >= read::<u32>(fdt, off!(fdtable_max_fds))? {
        return Err(-1);
    }
    let fd_array = read_ptr(fdt, off!(fdtable_fd))?;
    let file = read_ptr(fd_array, fd as usize * core::mem::size_of::<u64>())?;
    let socket = read_ptr(file, off!(file_private_data))?;
    let sk = read_ptr(socket, off!(socket_sk))?;
    if !is_tcp(sk)? {
        return Ok(());
    }
    let facts = socket_facts(sk)?;
    bump(facts.cgroup_id, offset_of!(CgroupCounters, tcp_accepts), EventKind::TcpAccept);
    send(EventKind::TcpAccept, facts.cgroup_id, tcp_record(EventKind::TcpAccept, &facts, fd as i32));
    Ok(())
}
