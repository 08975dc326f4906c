//! Whether a socket received in a handoff is what its sender says: a listening TCP socket,
//! bound to the address the agent would bind, in the network namespace it is meant for. The
//! namespace is asked, not the socket: its own sock_diag table (what `ss -ltn` reads there)
//! must list this very socket (by inode) on that port. The same holds on every kernel the agent
//! runs on (a socket's netns cookie, `SO_NETNS_COOKIE`, needs 5.14).

use std::{
    net::{SocketAddr, TcpListener},
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use rustix::net::{self, sockopt, SocketType};

use crate::discovery::sockdiag::SockDiag;

/// Why a received socket is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Mismatch {
    /// Not a listening TCP socket.
    #[error("not a listening TCP socket")]
    NotListening,
    /// Bound elsewhere than said.
    #[error("bound to {found}, not {expected}")]
    Address { expected: SocketAddr, found: String },
    /// The namespace does not list it.
    #[error("network namespace {} does not list it on port {port}", .netns.display())]
    NotInNamespace { netns: PathBuf, port: u16 },
    /// It could not be looked at.
    #[error("cannot be looked at")]
    Look(#[source] std::io::Error),
}

/// `fd` as a listener, if it is a listening TCP socket bound to `expected` and listed by the
/// network namespace at `netns` (`/proc/<pid>/ns/net`, or the agent's own).
pub(crate) fn listener(fd: OwnedFd, expected: SocketAddr, netns: &Path) -> Result<TcpListener, Mismatch> {
    let listening = sockopt::socket_acceptconn(&fd).unwrap_or(false)
        && sockopt::socket_type(&fd).ok() == Some(SocketType::STREAM)
        && sockopt::socket_protocol(&fd).ok().flatten() == Some(net::ipproto::TCP);
    if !listening {
        return Err(Mismatch::NotListening);
    }
    let found = net::getsockname(&fd).map_err(|errno| Mismatch::Look(errno.into()))?;
    let found = SocketAddr::try_from(found).map_err(|_| Mismatch::NotListening)?;
    if found != expected {
        return Err(Mismatch::Address { expected, found: found.to_string() });
    }
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())))
        .map_err(Mismatch::Look)?
        .ino();
    let listed = SockDiag::open_in(netns)
        .and_then(|diag| diag.listeners())
        .map_err(|err| Mismatch::Look(std::io::Error::other(crate::ErrorChain(&err).to_string())))?;
    if !listed.iter().any(|l| l.inode == inode && l.port == expected.port()) {
        return Err(Mismatch::NotInNamespace { netns: netns.to_owned(), port: expected.port() });
    }
    Ok(TcpListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::netns;

    #[test]
    fn only_a_listener_bound_as_said_in_the_namespace_said_is_taken() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let fd = || OwnedFd::from(listener.try_clone().expect("dup"));
        if SockDiag::open_in(&netns::own()).is_err() {
            eprintln!("skipped: no sock_diag here");
            return;
        }
        assert!(super::listener(fd(), addr, &netns::own()).is_ok());
        let elsewhere = SocketAddr::from(([127, 0, 0, 1], addr.port().wrapping_add(1).max(1)));
        assert!(matches!(super::listener(fd(), elsewhere, &netns::own()), Err(Mismatch::Address { .. })));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        assert!(matches!(super::listener(OwnedFd::from(udp), addr, &netns::own()), Err(Mismatch::NotListening)));
        let connected = std::net::TcpStream::connect(addr).expect("connect");
        assert!(matches!(super::listener(OwnedFd::from(connected), addr, &netns::own()), Err(Mismatch::NotListening)));
    }
}
