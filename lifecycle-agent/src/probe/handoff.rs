//! Pod probe listeners that outlive the agent process: a running agent hands its listening
//! sockets to its successor, so the kubelet's probes of every pod keep being answered through a
//! DaemonSet rolling update, an OOM kill followed by a restart, or a crash.
//!
//! Each agent with `--handoff-dir` serves a Unix socket there (`handoff.sock`, root only). A new
//! agent first connects to it: the running one sends one message per pod listener — which pod,
//! which network namespace (inode) and port — with a duplicate of the listening socket attached
//! (`SCM_RIGHTS`). From then on both serve the same socket (the kernel hands each queued
//! connection to one of them), until the old one exits; connections that arrived while neither
//! accepted wait in the socket's backlog, as they would for any busy server. The new agent
//! serves an adopted socket as soon as it knows the pod again, and binds no new one for it.
//! The DaemonSet's update strategy (`maxSurge: 10%`, `maxUnavailable: 0`) starts the new pod
//! before the old one stops, and its readiness (`/readyz`) waits for the adopted sockets.
//!
//! A listening socket is only ever received from a root process over the root-only socket, and
//! is checked to be a listening TCP socket before it is used.

use std::{
    collections::HashMap,
    io::{self, IoSlice, IoSliceMut},
    mem::MaybeUninit,
    net::TcpListener,
    os::{
        fd::{AsFd as _, BorrowedFd, OwnedFd},
        unix::{fs::PermissionsExt as _, net::UnixListener},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use rustix::net::{
    self, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

/// The socket's name in the handoff directory.
const SOCKET: &str = "handoff.sock";
/// How long a new agent waits for the running one's answer.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message (one listener's description).
const MAX_MESSAGE: usize = 1024;
/// Listeners taken per handoff at most (a node runs a few hundred pods).
pub(crate) const MAX_HANDED: usize = 4096;

/// One pod listener as it is handed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListenerFacts {
    pub namespace: String,
    pub pod: String,
    /// Inode of the pod's network namespace, where the socket was bound.
    pub netns: u32,
    pub port: u16,
}

/// Registered listeners by (netns inode, port).
type Entries = HashMap<(u32, u16), (ListenerFacts, Arc<OwnedFd>)>;

/// The pod listeners of this agent, as the handoff server hands them over.
#[derive(Default)]
pub(crate) struct ListenerRegistry {
    entries: Mutex<Entries>,
}

/// A listener's place in the registry, given up when dropped (the listener stopped).
pub(crate) struct Registration {
    registry: Arc<ListenerRegistry>,
    key: (u32, u16),
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.key);
    }
}

impl ListenerRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Records `listener` (a duplicate of its socket is kept) until the registration is dropped.
    pub(crate) fn register(self: &Arc<Self>, facts: ListenerFacts, listener: &TcpListener) -> io::Result<Registration> {
        let fd = OwnedFd::from(listener.try_clone()?);
        let key = (facts.netns, facts.port);
        self.lock().insert(key, (facts, Arc::new(fd)));
        Ok(Registration { registry: Arc::clone(self), key })
    }

    fn snapshot(&self) -> Vec<(ListenerFacts, Arc<OwnedFd>)> {
        self.lock().values().cloned().collect()
    }
}

/// Listeners taken from the previous agent, by network namespace inode.
pub(crate) type Adopted = HashMap<u32, (ListenerFacts, TcpListener)>;

/// Why a handoff did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandoffError {
    /// A socket call failed.
    #[error("{call} on {path}")]
    Socket {
        call: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The peer is not root.
    #[error("{path}: the peer runs as uid {uid}, not root; nothing taken from it")]
    NotRoot { path: PathBuf, uid: u32 },
}

fn socket_error<'a>(call: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HandoffError + 'a {
    move |source| HandoffError::Socket { call, path: path.to_owned(), source }
}

/// Takes the pod listeners of the agent serving `dir`, if one does. No agent there (no socket,
/// or nobody listening on it): nothing, at once.
pub(crate) fn adopt(dir: &Path) -> Result<Adopted, HandoffError> {
    let path = dir.join(SOCKET);
    let fd = seqpacket_socket().map_err(socket_error("socket", &path))?;
    match connect(&fd, &path) {
        Ok(()) => {}
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ECONNREFUSED)) => return Ok(Adopted::new()),
        Err(err) => return Err(socket_error("connect", &path)(err)),
    }
    let uid = peer_uid(&fd).map_err(socket_error("SO_PEERCRED", &path))?;
    if uid != 0 {
        return Err(HandoffError::NotRoot { path, uid });
    }
    set_receive_timeout(&fd, RECEIVE_TIMEOUT).map_err(socket_error("SO_RCVTIMEO", &path))?;
    let mut adopted = Adopted::new();
    for _ in 0..MAX_HANDED {
        let Some((payload, listener)) = receive(&fd).map_err(socket_error("recvmsg", &path))? else { break };
        let Some(listener) = listener else { continue };
        let Ok(facts) = serde_json::from_slice::<ListenerFacts>(&payload) else { continue };
        if is_tcp_listener(&listener) {
            adopted.insert(facts.netns, (facts, TcpListener::from(listener)));
        }
    }
    Ok(adopted)
}

/// Serves `dir`'s handoff socket on a thread of its own: every agent that connects gets every
/// listener in `registry`, and `handed_over` is set once one has. The socket is made anew (a
/// previous agent's stays reachable to those who already connected, not by its name).
pub(crate) fn serve(
    dir: &Path,
    registry: Arc<ListenerRegistry>,
    handed_over: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), HandoffError> {
    std::fs::create_dir_all(dir).map_err(socket_error("mkdir", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(socket_error("chmod", dir))?;
    let path = dir.join(SOCKET);
    let staging = dir.join(format!("{SOCKET}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let fd = seqpacket_socket().map_err(socket_error("socket", &path))?;
    bind_listen(&fd, &staging).map_err(socket_error("bind", &staging))?;
    // Renamed over the old name at once: a successor never finds no socket.
    std::fs::rename(&staging, &path).map_err(socket_error("rename", &path))?;
    let listener = UnixListener::from(fd);
    std::thread::Builder::new()
        .name("probe-handoff".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let peer = OwnedFd::from(stream);
                if peer_uid(&peer).ok() != Some(0) {
                    continue;
                }
                let listeners = registry.snapshot();
                let mut sent = 0;
                for (facts, socket) in &listeners {
                    let Ok(payload) = serde_json::to_vec(facts) else { continue };
                    if send(&peer, &payload, socket.as_fd()).is_ok() {
                        sent += 1;
                    }
                }
                handed_over.store(true, std::sync::atomic::Ordering::Release);
                log::info!(
                    "handed {sent} pod probe listener(s) to a new agent; both serve them until this one exits, \
                     and /readyz says this one is replaced"
                );
            }
        })
        .map_err(socket_error("spawn", &path))?;
    Ok(())
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

fn connect(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    Ok(net::connect(fd, &SocketAddrUnix::new(path)?)?)
}

fn bind_listen(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    net::bind(fd, &SocketAddrUnix::new(path)?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(net::listen(fd, 8)?)
}

fn peer_uid(fd: &OwnedFd) -> io::Result<u32> {
    Ok(sockopt::socket_peercred(fd)?.uid.as_raw())
}

fn set_receive_timeout(fd: &OwnedFd, timeout: Duration) -> io::Result<()> {
    Ok(sockopt::set_socket_timeout(fd, sockopt::Timeout::Recv, Some(timeout))?)
}

/// Whether `fd` is a TCP socket in the listening state.
fn is_tcp_listener(fd: &OwnedFd) -> bool {
    sockopt::socket_acceptconn(fd).unwrap_or(false)
        && sockopt::socket_type(fd).ok() == Some(SocketType::STREAM)
        && sockopt::socket_protocol(fd).ok().flatten() == Some(net::ipproto::TCP)
}

/// Room for the control messages of one receive: one fd needs 24 bytes; more fds than fit are
/// truncated (the message is then dropped, and the kernel closes what did not fit).
const CONTROL_LEN: usize = 64;

/// Sends `payload` with `fd` attached.
fn send(peer: &OwnedFd, payload: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::from(rustix::io::Errno::INVAL));
    }
    net::sendmsg(peer, &[IoSlice::new(payload)], &mut control, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one message and the fd attached to it, if any; None at the end.
fn receive(fd: &OwnedFd) -> io::Result<Option<(Vec<u8>, Option<OwnedFd>)>> {
    let mut payload = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); CONTROL_LEN];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // CMSG_CLOEXEC: received fds are close-on-exec.
    let message = net::recvmsg(fd, &mut [IoSliceMut::new(&mut payload)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    if message.bytes == 0 {
        return Ok(None);
    }
    payload.truncate(message.bytes);
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
        return Ok(Some((Vec::new(), None)));
    }
    Ok(Some((payload, received)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_agent_takes_every_listener_of_the_running_one_and_both_serve_it() {
        let dir = std::env::temp_dir().join(format!("lifecycle-handoff-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(adopt(&dir).expect("no agent there").is_empty(), "nothing to take where nobody serves");
        let registry = Arc::new(ListenerRegistry::default());
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let facts = ListenerFacts { namespace: "shop".into(), pod: "web-1".into(), netns: 4026531999, port };
        let registration = registry.register(facts.clone(), &listener).expect("register");
        let handed_over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        serve(&dir, Arc::clone(&registry), handed_over.clone()).expect("serve");
        assert!(!handed_over.load(std::sync::atomic::Ordering::Acquire), "nobody took anything yet");
        let adopted = adopt(&dir).expect("handoff");
        // The handoff thread sets it right after the last send the new agent received.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !handed_over.load(std::sync::atomic::Ordering::Acquire) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(handed_over.load(std::sync::atomic::Ordering::Acquire), "the running agent knows it was replaced");
        let (got, taken) = adopted.get(&4026531999).expect("the listener was handed over");
        assert_eq!(got, &facts);
        // The same socket: a connection made now is accepted on the adopted copy.
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        drop(listener);
        taken.set_nonblocking(false).expect("blocking");
        let (_, from) = taken.accept().expect("accepted on the adopted socket");
        assert!(from.ip().is_loopback());
        // A stopped listener is handed over no more.
        drop(registration);
        assert!(adopt(&dir).expect("handoff").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
