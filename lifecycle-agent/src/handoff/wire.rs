//! The handoff's wire: `SOCK_SEQPACKET` Unix sockets (each message arrives whole or not at all),
//! one JSON [`Message`] per packet with at most one file descriptor attached (`SCM_RIGHTS`),
//! every call bounded in time: a peer that stops reading or writing costs a few seconds, never
//! a thread for ever.

use std::{
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    os::{
        fd::{BorrowedFd, OwnedFd},
        unix::fs::PermissionsExt as _,
    },
    path::Path,
    time::Duration,
};

use rustix::net::{
    self, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use super::{SocketFacts, SocketKey};

/// Largest message: one socket's description.
const MAX_MESSAGE: usize = 1024;
/// Room for the control messages of one receive: one fd needs 24 bytes; more fds than fit are
/// truncated (the message is then dropped, and the kernel closes what did not fit).
const CONTROL_LEN: usize = 64;

/// One packet of the handoff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub(crate) enum Message {
    /// An agent to the keeper of its own pod, first: hand me what you hold, then keep what I
    /// serve (the connection stays open for the agent's life).
    Attach,
    /// A new agent to a running agent or an orphaned keeper, first: hand me every socket.
    Take,
    /// One socket (its fd attached).
    Socket { facts: SocketFacts },
    /// No more sockets. `replaced`: the sender's sockets went to a newer agent.
    End { replaced: bool },
    /// The new agent serves these now: the sender stops serving them.
    Serving { keys: Vec<SocketKey> },
    /// An agent to its keeper: keep this socket too (its fd attached).
    Keep { facts: SocketFacts },
    /// An agent to its keeper: this socket is served no more.
    Forget { key: SocketKey },
    /// An agent to its keeper: a newer agent took every socket; keep none.
    Replaced,
}

/// A new `SOCK_SEQPACKET` Unix socket.
pub(crate) fn seqpacket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Connects `fd` to the socket at `path`.
pub(crate) fn connect(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    Ok(net::connect(fd, &SocketAddrUnix::new(path)?)?)
}

/// Binds `fd` at `path` (root only: mode 0600) and listens.
pub(crate) fn bind_listen(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    net::bind(fd, &SocketAddrUnix::new(path)?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(net::listen(fd, 8)?)
}

/// Bounds every later send on `fd`, and every receive unless `receive` is None.
pub(crate) fn set_timeouts(fd: &OwnedFd, send: Duration, receive: Option<Duration>) -> io::Result<()> {
    sockopt::set_socket_timeout(fd, sockopt::Timeout::Send, Some(send))?;
    Ok(sockopt::set_socket_timeout(fd, sockopt::Timeout::Recv, receive)?)
}

/// Sends `message`, with `fd` attached when given.
pub(crate) fn send(peer: &OwnedFd, message: &Message, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let payload = serde_json::to_vec(message).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::from(rustix::io::Errno::INVAL));
    }
    net::sendmsg(peer, &[IoSlice::new(&payload)], &mut control, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one message and the fd attached to it; None when the peer closed. A message that
/// is not one of ours, or came truncated, is an error (the fd that came with it is closed).
pub(crate) fn receive(fd: &OwnedFd) -> io::Result<Option<(Message, Option<OwnedFd>)>> {
    let mut payload = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); CONTROL_LEN];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // CMSG_CLOEXEC: received fds are close-on-exec.
    let message = net::recvmsg(fd, &mut [IoSliceMut::new(&mut payload)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    if message.bytes == 0 {
        return Ok(None);
    }
    let mut received = None;
    for ancillary in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = ancillary {
            // Each received fd is ours (closed when dropped); only the first is kept.
            for owned in fds {
                received.get_or_insert(owned);
            }
        }
    }
    if message.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a truncated handoff message"));
    }
    let parsed = serde_json::from_slice(&payload[..message.bytes])
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
    Ok(Some((parsed, received)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::Serves;

    #[test]
    fn messages_and_fds_cross_a_socket_pair_and_a_silent_peer_costs_its_timeout() {
        let (a, b) = net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let facts = SocketFacts { serves: Serves::Listen, addr: listener.local_addr().expect("addr") };
        let message = Message::Socket { facts: facts.clone() };
        send(&a, &message, Some(std::os::fd::AsFd::as_fd(&listener))).expect("send");
        let (got, fd) = receive(&b).expect("receive").expect("a message");
        assert_eq!(got, message);
        assert!(fd.is_some(), "the fd came along");
        // Nothing more comes: the receive ends at its timeout, not never.
        set_timeouts(&b, Duration::from_millis(100), Some(Duration::from_millis(100))).expect("timeouts");
        let began = std::time::Instant::now();
        let silent = receive(&b).expect_err("times out");
        assert!(matches!(silent.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{silent}");
        assert!(began.elapsed() < Duration::from_secs(2));
        drop(a);
        assert_eq!(receive(&b).expect("end").map(|(m, _)| m), None, "a closed peer ends the stream");
    }
}
