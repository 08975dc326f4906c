//! Listening sockets of a network namespace via NETLINK_SOCK_DIAG (what `ss -ltn` uses).
//!
//! Why not `/proc/<pid>/net/tcp`: the kernel prints that table by walking the whole established
//! hash, which is shared by every netns (262,144 buckets here, 113k sockets on a busy node:
//! ~250 ms of system CPU per read, even for a pod netns with one listener), and it does not carry
//! a listener's backlog. A sock_diag dump asking only for TCP_LISTEN walks only the listening
//! hash and reports both queue depth (rqueue) and backlog (wqueue).
//!
//! A netlink socket answers for the netns it was created in, so [`SockDiag::open_in`] creates it
//! on a short-lived thread that entered the pod's netns (like `server::bind_in_netns`).

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use super::{
    netns::{self, NetnsError},
    proc::Listener,
};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const TCP_LISTEN: u32 = 10;
const HEADER: usize = 16;
/// inet_diag_msg: family, state, timer, retrans, a 48-byte sockid, then expires, rqueue, wqueue,
/// uid and inode.
const MSG_LEN: usize = 72;

/// Why a sock_diag dump failed.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    /// The namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The netlink socket could not be created in the namespace.
    #[error("cannot open a sock_diag socket in {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Sending the request or reading the answer failed, or the kernel answered an error.
    #[error("sock_diag dump failed")]
    Dump(#[source] io::Error),
    /// The answer did not have the expected shape.
    #[error("malformed sock_diag answer: {0}")]
    Malformed(&'static str),
}

/// A NETLINK_SOCK_DIAG socket bound to one network namespace.
#[derive(Debug)]
pub(crate) struct SockDiag {
    fd: OwnedFd,
}

impl SockDiag {
    /// Creates the socket inside the netns at `netns` (e.g. `/proc/<pid>/ns/net`).
    pub(crate) fn open_in(netns: &Path) -> Result<Self, SockDiagError> {
        let path = netns.to_path_buf();
        let fd = netns::run_in(netns, "probe-netns-diag", || -> io::Result<OwnedFd> {
            use rustix::net::{netlink, socket_with, AddressFamily, SocketFlags, SocketType};
            Ok(socket_with(AddressFamily::NETLINK, SocketType::RAW, SocketFlags::CLOEXEC, Some(netlink::SOCK_DIAG))?)
        })?
        .map_err(|source| SockDiagError::Open { path, source })?;
        Ok(Self { fd })
    }

    /// Every TCP listener (v4 and v6) of the namespace.
    pub(crate) fn listeners(&self) -> Result<Vec<Listener>, SockDiagError> {
        let mut out = Vec::new();
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.send_request(family)?;
            self.read_dump(&mut out)?;
        }
        Ok(out)
    }

    fn send_request(&self, family: u8) -> Result<(), SockDiagError> {
        let mut request = [0u8; HEADER + 56];
        let length = request.len() as u32;
        request[0..4].copy_from_slice(&length.to_ne_bytes());
        request[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        request[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        // inet_diag_req_v2: family, protocol, ext, pad, states, then a zero sockid (match all).
        request[HEADER] = family;
        request[HEADER + 1] = libc::IPPROTO_TCP as u8;
        request[HEADER + 4..HEADER + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        // With no address the kernel is the destination.
        rustix::net::send(&self.fd, &request, rustix::net::SendFlags::empty())
            .map_err(|errno| SockDiagError::Dump(errno.into()))?;
        Ok(())
    }

    fn read_dump(&self, out: &mut Vec<Listener>) -> Result<(), SockDiagError> {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            let (got, _) = rustix::net::recv(&self.fd, &mut buffer[..], rustix::net::RecvFlags::empty())
                .map_err(|errno| SockDiagError::Dump(errno.into()))?;
            if parse_messages(&buffer[..got], out)? {
                return Ok(());
            }
        }
    }
}

/// Parses one datagram of netlink messages into `out`; true once NLMSG_DONE was seen.
pub(crate) fn parse_messages(mut data: &[u8], out: &mut Vec<Listener>) -> Result<bool, SockDiagError> {
    let u32_at = |b: &[u8], i: usize| b.get(i..i + 4).map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]));
    while data.len() >= HEADER {
        let len = u32_at(data, 0).ok_or(SockDiagError::Malformed("short header"))? as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if len < HEADER || len > data.len() {
            return Err(SockDiagError::Malformed("bad message length"));
        }
        let body = &data[HEADER..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(body, 0).ok_or(SockDiagError::Malformed("short error"))? as i32;
                return Err(SockDiagError::Dump(io::Error::from_raw_os_error(-errno)));
            }
            SOCK_DIAG_BY_FAMILY => {
                if body.len() < MSG_LEN {
                    return Err(SockDiagError::Malformed("short inet_diag_msg"));
                }
                if u32::from(body[1]) == TCP_LISTEN {
                    out.push(Listener {
                        port: u16::from_be_bytes([body[4], body[5]]),
                        family: u16::from(body[0]),
                        queue_depth: u32_at(body, 56).unwrap_or(0),
                        backlog: u32_at(body, 60),
                        inode: u64::from(u32_at(body, 68).unwrap_or(0)),
                    });
                }
            }
            _ => {}
        }
        let aligned = (len + 3) & !3;
        data = data.get(aligned..).unwrap_or(&[]);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((HEADER + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn parses_listeners_and_the_end_of_the_dump() {
        let mut body = [0u8; MSG_LEN];
        body[0] = libc::AF_INET as u8;
        body[1] = TCP_LISTEN as u8;
        body[4..6].copy_from_slice(&8080u16.to_be_bytes());
        body[56..60].copy_from_slice(&3u32.to_ne_bytes());
        body[60..64].copy_from_slice(&128u32.to_ne_bytes());
        body[68..72].copy_from_slice(&4242u32.to_ne_bytes());
        let mut data = message(SOCK_DIAG_BY_FAMILY, &body);
        let mut out = Vec::new();
        assert!(!parse_messages(&data, &mut out).expect("parses"));
        data.extend(message(NLMSG_DONE, &[0; 4]));
        out.clear();
        assert!(parse_messages(&data, &mut out).expect("parses"));
        assert_eq!(out, vec![Listener { port: 8080, family: 2, queue_depth: 3, backlog: Some(128), inode: 4242 }]);
        let error = message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert!(parse_messages(&error, &mut out).is_err());
    }

    #[test]
    fn own_netns_listener_is_seen_with_its_backlog() {
        let Ok(diag) = SockDiag::open_in(&netns::own()) else {
            eprintln!("skipped: cannot open a sock_diag socket here");
            return;
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let found = diag.listeners().expect("dump");
        let ours = found.iter().find(|l| l.port == port).expect("our listener");
        // std listens with backlog 128 (capped by net.core.somaxconn, 4096 by default).
        assert_eq!((ours.queue_depth, ours.backlog), (0, Some(128)));
        use std::os::unix::fs::MetadataExt as _;
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&listener)))
            .expect("the socket's inode")
            .ino();
        assert_eq!(ours.inode, inode, "the socket's own inode");
    }
}
