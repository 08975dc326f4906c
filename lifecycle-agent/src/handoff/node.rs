//! The node handoff: a running agent hands every socket it serves to a new agent on the node
//! (a rolling update, or an agent started by hand with the same `--handoff-dir`), over
//! `<handoff-dir>/handoff.sock`; the same exchange takes a gone agent's sockets from its orphaned
//! keeper (`keeper.rs`).
//!
//! The running agent sends only to a successor ([`Peer::may_succeed`]), each send bounded in
//! time; a peer refused gets nothing and changes nothing. It learns it was replaced only when
//! the successor says which sockets it serves ([`Message::Serving`]): those it stops serving, so
//! the two never answer in turn, and once `--listen` is among them `/readyz` says replaced. A
//! peer that connects and says nothing, or never confirms, costs the handoff thread a few
//! seconds and leaves the agent as it was.

use std::{
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::{fs::PermissionsExt as _, net::UnixListener},
    },
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use super::{
    keeper::receive_all,
    peer::{Peer, Refusal},
    registry::Registry,
    socket_error,
    wire::{self, Message},
    HandoffError, SocketFacts, SocketKey,
};

/// The socket's name in the handoff directory.
pub(crate) const HANDOFF_SOCKET: &str = "handoff.sock";
/// How long a send, or a first message, may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a successor may take to say what it serves (it claims pods' sockets as it learns
/// of the pods, within the supervisor's adoption window, 30 s).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(45);

/// Serves `dir`'s handoff socket on a thread of its own: a successor gets every socket in
/// `registry`, and `replaced` runs with the keys it then says it serves.
pub(crate) fn serve(
    dir: &Path,
    registry: Arc<Registry>,
    replaced: impl Fn(Vec<SocketKey>) + Send + 'static,
) -> Result<(), HandoffError> {
    std::fs::create_dir_all(dir).map_err(socket_error("mkdir", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(socket_error("chmod", dir))?;
    let path = dir.join(HANDOFF_SOCKET);
    let staging = dir.join(format!("{HANDOFF_SOCKET}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let fd = wire::seqpacket().map_err(socket_error("socket", &path))?;
    wire::bind_listen(&fd, &staging).map_err(socket_error("bind", &staging))?;
    // Renamed over the old name at once: a successor never finds no socket.
    std::fs::rename(&staging, &path).map_err(socket_error("rename", &path))?;
    let listener = UnixListener::from(fd);
    let thread_path = path.clone();
    std::thread::Builder::new()
        .name("handoff".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                match hand_over(&OwnedFd::from(stream), &registry, &thread_path) {
                    Ok(Some(keys)) => replaced(keys),
                    Ok(None) => {}
                    Err(err) => log::warn!("nothing handed over: {}", crate::ErrorChain(&err)),
                }
            }
        })
        .map_err(socket_error("spawn", &path))?;
    Ok(())
}

/// One connection: the keys the successor serves now, or None when it confirmed nothing.
fn hand_over(connection: &OwnedFd, registry: &Registry, path: &Path) -> Result<Option<Vec<SocketKey>>, HandoffError> {
    let peer = Peer::of(connection)
        .and_then(|peer| peer.may_succeed().map(|()| peer))
        .map_err(|refusal| HandoffError::Peer { path: path.to_owned(), refusal })?;
    wire::set_timeouts(connection, STEP_TIMEOUT, Some(STEP_TIMEOUT)).map_err(socket_error("SO_SNDTIMEO", path))?;
    match wire::receive(connection).map_err(socket_error("recvmsg", path))? {
        Some((Message::Take, _)) => {}
        Some((other, _)) => {
            let what = format!("{other:?} first");
            return Err(HandoffError::Protocol { path: path.to_owned(), pid: peer.pid, what });
        }
        None => return Ok(None),
    }
    let sockets = registry.snapshot();
    for (facts, fd) in &sockets {
        wire::send(connection, &Message::Socket { facts: facts.clone() }, Some(fd.as_fd()))
            .map_err(socket_error("sendmsg", path))?;
    }
    wire::send(connection, &Message::End { replaced: false }, None).map_err(socket_error("sendmsg", path))?;
    log::info!(
        "handed {} socket(s) to pid {} (`{}`); serving them until it says it does",
        sockets.len(),
        peer.pid,
        peer.command
    );
    wire::set_timeouts(connection, STEP_TIMEOUT, Some(CONFIRM_TIMEOUT)).map_err(socket_error("SO_RCVTIMEO", path))?;
    match wire::receive(connection) {
        Ok(Some((Message::Serving { keys }, _))) => {
            log::info!("pid {} serves {} of them now; this agent stops serving those", peer.pid, keys.len());
            Ok(Some(keys))
        }
        Ok(_) | Err(_) => {
            log::warn!("pid {} took the sockets and never said it serves them; this agent serves on", peer.pid);
            Ok(None)
        }
    }
}

/// Sockets taken from a running agent or an orphaned keeper, to be confirmed once served.
pub(crate) struct Taken {
    session: OwnedFd,
    pub sockets: Vec<(SocketFacts, OwnedFd)>,
    /// Who gave them, for logs.
    pub from: String,
}

impl Taken {
    /// Tells the giver which of the sockets this agent serves now (it stops serving those).
    pub(crate) fn confirm(self, keys: Vec<SocketKey>) {
        if let Err(err) = wire::send(&self.session, &Message::Serving { keys }, None) {
            log::warn!("{} was not told which sockets this agent serves: {err}", self.from);
        }
    }
}

/// Takes every socket from whoever serves `path` (a running agent's `handoff.sock`, or an
/// orphaned keeper's `keeper.sock`), if `giver` accepts it; None when nobody serves there.
pub(crate) fn take(path: &Path, giver: impl Fn(&Peer) -> Result<(), Refusal>) -> Result<Option<Taken>, HandoffError> {
    let session = wire::seqpacket().map_err(socket_error("socket", path))?;
    match wire::connect(&session, path) {
        Ok(()) => {}
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ECONNREFUSED)) => return Ok(None),
        Err(err) => return Err(socket_error("connect", path)(err)),
    }
    let peer = Peer::of(&session).map_err(|refusal| HandoffError::Peer { path: path.to_owned(), refusal })?;
    giver(&peer).map_err(|refusal| HandoffError::Peer { path: path.to_owned(), refusal })?;
    wire::set_timeouts(&session, STEP_TIMEOUT, Some(STEP_TIMEOUT)).map_err(socket_error("SO_RCVTIMEO", path))?;
    wire::send(&session, &Message::Take, None).map_err(socket_error("sendmsg", path))?;
    let (sockets, _) = receive_all(&session, path)?;
    Ok(Some(Taken { session, sockets, from: format!("pid {} (`{}`)", peer.pid, peer.command) }))
}

/// The path of the handoff socket in `dir`.
pub(crate) fn socket_in(dir: &Path) -> PathBuf {
    dir.join(HANDOFF_SOCKET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::Serves;

    /// A handoff directory of its own.
    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lifecycle-handoff-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_successor_takes_every_socket_and_the_giver_learns_it_only_when_told() {
        // This test's process is both ends: it may succeed itself when it is root with
        // CAP_SYS_PTRACE (the privileged tiers run so; the handoff tier shows refusals).
        let dir = dir("take");
        assert!(take(&socket_in(&dir), |_| Ok(())).expect("nobody there").is_none());
        let registry = Arc::new(Registry::default());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let facts =
            SocketFacts { serves: Serves::Pod { namespace: "shop".into(), pod: "web-1".into(), netns: 1 }, addr };
        let _registration = registry.register(facts.clone(), &listener).expect("register");
        let (told, heard) = std::sync::mpsc::channel();
        serve(&dir, registry, move |keys| drop(told.send(keys))).expect("serve");
        let taken = match take(&socket_in(&dir), Peer::may_succeed) {
            Ok(Some(taken)) => taken,
            Err(HandoffError::Peer { refusal, .. }) => return eprintln!("skipped: not a successor here: {refusal}"),
            other => panic!("{:?}", other.map(|t| t.map(|t| t.from))),
        };
        assert_eq!(taken.sockets.len(), 1);
        assert_eq!(taken.sockets[0].0, facts);
        assert!(heard.recv_timeout(Duration::from_millis(200)).is_err(), "not replaced before it is told");
        taken.confirm(vec![facts.key()]);
        assert_eq!(heard.recv_timeout(Duration::from_secs(5)).expect("told"), vec![facts.key()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
