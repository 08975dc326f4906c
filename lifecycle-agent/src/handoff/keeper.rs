//! The socket keeper: `lifecycle-agent keep-sockets --dir <dir>`, a second container in the
//! agent's pod holding a duplicate of every socket its agent serves, so that an agent restarted
//! in place (liveness, OOM kill, crash) takes them back and no connection to them is refused
//! meanwhile (see the module header of `handoff`).
//!
//! It serves `<dir>/keeper.sock` (`<dir>` is an `emptyDir` only the pod's containers mount).
//! The agent attaches once at start ([`Message::Attach`]): it gets what the keeper holds, then
//! sends each socket it starts serving ([`Message::Keep`]) and each it stops serving
//! ([`Message::Forget`]) over the same connection for as long as it lives; only a process of the
//! keeper's own pod may attach, one at a time. When the agent is gone and a new agent of another
//! pod finds the keeper holding its port, it may take everything ([`Message::Take`]: a successor
//! only, and only while no agent is attached); after the successor says what it serves, the
//! keeper forgets those, and once `--listen` is among them it answers a restarted agent of its
//! own pod that it was replaced.
//!
//! The keeper needs no capability and no host mount, and does nothing else: it is small, has
//! little to crash on, and holds at most [`MAX_KEPT`] sockets.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    os::unix::{fs::PermissionsExt as _, net::UnixListener},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use parking_lot::{Mutex, MutexGuard};

use super::{
    peer::Peer,
    socket_error,
    wire::{self, Message},
    HandoffError, SocketFacts, SocketKey,
};

/// The keeper's socket in its directory.
pub const KEEPER_SOCKET: &str = "keeper.sock";
/// Sockets kept at most (an agent serves its two and one per probed pod).
pub const MAX_KEPT: usize = 4096;
/// Connections served at once (its agent's, and a successor's or a refused one's).
const MAX_CONNECTIONS: usize = 4;
/// How long a send to a peer, or its first message, may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a successor may take to say what it serves (it claims pods' sockets as it learns
/// of the pods, within the supervisor's adoption window).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(45);

/// What the keeper holds.
#[derive(Default)]
struct Kept {
    sockets: BTreeMap<SocketKey, (SocketFacts, OwnedFd)>,
    /// The pid of the attached agent.
    attached: Option<u32>,
    /// A successor took `--listen`: a restarted agent of this pod is told so.
    replaced: bool,
    connections: usize,
}

/// The keeper's state, shared by its connection threads.
#[derive(Default)]
struct Keeper {
    kept: Mutex<Kept>,
}

impl Keeper {
    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock()
    }
}

/// Serves `<dir>/keeper.sock` until the process is stopped (`lifecycle-agent keep-sockets`).
pub fn keep(dir: &Path) -> Result<(), HandoffError> {
    std::fs::create_dir_all(dir).map_err(socket_error("mkdir", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(socket_error("chmod", dir))?;
    let path = dir.join(KEEPER_SOCKET);
    let staging = dir.join(format!("{KEEPER_SOCKET}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let fd = wire::seqpacket().map_err(socket_error("socket", &path))?;
    wire::bind_listen(&fd, &staging).map_err(socket_error("bind", &staging))?;
    std::fs::rename(&staging, &path).map_err(socket_error("rename", &path))?;
    log::info!("keeping the agent's listening sockets; its agent attaches at {}", path.display());
    let keeper = Arc::new(Keeper::default());
    for stream in UnixListener::from(fd).incoming() {
        let Ok(stream) = stream else { continue };
        let connection = OwnedFd::from(stream);
        {
            let mut kept = keeper.lock();
            if kept.connections >= MAX_CONNECTIONS {
                log::warn!("{MAX_CONNECTIONS} connections open already; one more closed");
                continue;
            }
            kept.connections += 1;
        }
        let (keeper, path) = (Arc::clone(&keeper), path.clone());
        let spawned = std::thread::Builder::new().name("keeper-peer".into()).spawn(move || {
            if let Err(err) = serve_peer(&keeper, &connection, &path) {
                log::warn!("{}", crate::ErrorChain(&err));
            }
            keeper.lock().connections -= 1;
        });
        if let Err(err) = spawned {
            log::warn!("no thread for a connection: {err}");
        }
    }
    Ok(())
}

/// One connection: an agent attaching, or a successor taking.
fn serve_peer(keeper: &Keeper, connection: &OwnedFd, path: &Path) -> Result<(), HandoffError> {
    let refused = |refusal| HandoffError::Peer { path: path.to_owned(), refusal };
    let peer = Peer::of(connection).map_err(refused)?;
    wire::set_timeouts(connection, STEP_TIMEOUT, Some(STEP_TIMEOUT)).map_err(socket_error("SO_RCVTIMEO", path))?;
    let out_of_turn = |what: String| HandoffError::Protocol { path: path.to_owned(), pid: peer.pid, what };
    match wire::receive(connection).map_err(socket_error("recvmsg", path))? {
        Some((Message::Attach, _)) => {
            peer.of_this_pod().map_err(refused)?;
            attach(keeper, connection, &peer, path)
        }
        Some((Message::Take, _)) => {
            peer.may_succeed().map_err(refused)?;
            hand_over(keeper, connection, &peer, path)
        }
        Some((other, _)) => Err(out_of_turn(format!("{other:?} first"))),
        None => Ok(()),
    }
}

/// Its agent attached: it gets what is held (or hears it was replaced), then tells what to keep
/// for as long as it lives.
fn attach(keeper: &Keeper, connection: &OwnedFd, peer: &Peer, path: &Path) -> Result<(), HandoffError> {
    let sent = {
        let mut kept = keeper.lock();
        if let Some(attached) = kept.attached.filter(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            return Err(HandoffError::Protocol {
                path: path.to_owned(),
                pid: peer.pid,
                what: format!("pid {attached} is attached already"),
            });
        }
        kept.attached = Some(peer.pid);
        send_all(&kept, connection, path)?
    };
    log::info!("agent pid {} (`{}`) attached; {sent} socket(s) handed back", peer.pid, peer.command);
    // The agent's life: no receive timeout (a send is still bounded).
    wire::set_timeouts(connection, STEP_TIMEOUT, None).map_err(socket_error("SO_RCVTIMEO", path))?;
    let ended = loop {
        match wire::receive(connection) {
            Ok(Some((Message::Keep { facts }, Some(fd)))) => {
                let mut kept = keeper.lock();
                if kept.sockets.len() >= MAX_KEPT && !kept.sockets.contains_key(&facts.key()) {
                    log::warn!("{MAX_KEPT} sockets kept already; {:?} not kept", facts.key());
                    continue;
                }
                kept.sockets.insert(facts.key(), (facts, fd));
            }
            Ok(Some((Message::Forget { key }, _))) => drop(keeper.lock().sockets.remove(&key)),
            Ok(Some((Message::Replaced, _))) => {
                let mut kept = keeper.lock();
                kept.sockets.clear();
                kept.replaced = true;
            }
            Ok(Some((other, _))) => log::warn!("agent pid {}: {other:?} ignored", peer.pid),
            Ok(None) => break Ok(()),
            Err(err) => break Err(socket_error("recvmsg", path)(err)),
        }
    };
    let mut kept = keeper.lock();
    kept.attached = None;
    log::info!("agent pid {} gone; keeping {} socket(s) for the next", peer.pid, kept.sockets.len());
    ended
}

/// A successor takes everything while no agent of this pod is attached; once it says what it
/// serves, those are forgotten here.
fn hand_over(keeper: &Keeper, connection: &OwnedFd, peer: &Peer, path: &Path) -> Result<(), HandoffError> {
    {
        let kept = keeper.lock();
        if let Some(attached) = kept.attached {
            return Err(HandoffError::Protocol {
                path: path.to_owned(),
                pid: peer.pid,
                what: format!("its agent (pid {attached}) is attached: the sockets are its to hand over"),
            });
        }
        send_all(&kept, connection, path)?;
    }
    wire::set_timeouts(connection, STEP_TIMEOUT, Some(CONFIRM_TIMEOUT)).map_err(socket_error("SO_RCVTIMEO", path))?;
    if let Some((Message::Serving { keys }, _)) = wire::receive(connection).map_err(socket_error("recvmsg", path))? {
        let mut kept = keeper.lock();
        kept.replaced |= keys.iter().any(|key| key.role == "listen");
        for key in &keys {
            kept.sockets.remove(key);
        }
        log::info!("pid {} (`{}`) serves {} of the sockets kept here now", peer.pid, peer.command, keys.len());
    }
    Ok(())
}

/// Sends every kept socket, then the end; how many.
fn send_all(kept: &Kept, connection: &OwnedFd, path: &Path) -> Result<usize, HandoffError> {
    let mut sent = 0;
    if !kept.replaced {
        for (facts, fd) in kept.sockets.values() {
            wire::send(connection, &Message::Socket { facts: facts.clone() }, Some(fd.as_fd()))
                .map_err(socket_error("sendmsg", path))?;
            sent += 1;
        }
    }
    wire::send(connection, &Message::End { replaced: kept.replaced }, None).map_err(socket_error("sendmsg", path))?;
    Ok(sent)
}

/// The agent's connection to the keeper of its pod.
pub(crate) struct KeeperLink {
    session: Mutex<OwnedFd>,
    path: PathBuf,
}

/// What attaching gave.
pub(crate) struct Attached {
    pub link: Arc<KeeperLink>,
    /// The sockets the keeper held (an agent of this pod served them before).
    pub sockets: Vec<(SocketFacts, OwnedFd)>,
    /// A newer agent took this pod's sockets: this agent is to serve none.
    pub replaced: bool,
}

impl KeeperLink {
    /// Attaches to the keeper serving `dir`.
    pub(crate) fn attach(dir: &Path) -> Result<Attached, HandoffError> {
        let path = dir.join(KEEPER_SOCKET);
        let session = wire::seqpacket().map_err(socket_error("socket", &path))?;
        wire::connect(&session, &path).map_err(socket_error("connect", &path))?;
        Peer::of(&session)
            .and_then(|keeper| keeper.of_this_pod())
            .map_err(|refusal| HandoffError::Peer { path: path.clone(), refusal })?;
        wire::set_timeouts(&session, STEP_TIMEOUT, Some(STEP_TIMEOUT)).map_err(socket_error("SO_SNDTIMEO", &path))?;
        wire::send(&session, &Message::Attach, None).map_err(socket_error("sendmsg", &path))?;
        let (sockets, replaced) = receive_all(&session, &path)?;
        let link = Arc::new(Self { session: Mutex::new(session), path });
        Ok(Attached { link, sockets, replaced })
    }

    fn send(&self, message: &Message, fd: Option<BorrowedFd<'_>>) {
        let session = self.session.lock();
        if let Err(err) = wire::send(&session, message, fd) {
            log::warn!("the socket keeper at {} was not told: {err}", self.path.display());
        }
    }

    /// The keeper keeps a duplicate of `fd` (described by `facts`).
    pub(crate) fn keep(&self, facts: &SocketFacts, fd: BorrowedFd<'_>) {
        self.send(&Message::Keep { facts: facts.clone() }, Some(fd));
    }

    /// The keeper forgets the socket of `key`.
    pub(crate) fn forget(&self, key: &SocketKey) {
        self.send(&Message::Forget { key: key.clone() }, None);
    }

    /// A newer agent took every socket: the keeper keeps none and says so to a restarted agent.
    pub(crate) fn replaced(&self) {
        self.send(&Message::Replaced, None);
    }
}

/// Receives sockets until the end; the sockets and whether the sender was replaced. At most
/// [`MAX_KEPT`]: past that the sender is not one of ours.
pub(crate) fn receive_all(session: &OwnedFd, path: &Path) -> Result<(Vec<(SocketFacts, OwnedFd)>, bool), HandoffError> {
    let mut sockets = Vec::new();
    loop {
        match wire::receive(session).map_err(socket_error("recvmsg", path))? {
            Some((Message::Socket { facts }, Some(fd))) if sockets.len() < MAX_KEPT => sockets.push((facts, fd)),
            Some((Message::End { replaced }, _)) => return Ok((sockets, replaced)),
            Some((other, _)) => {
                return Err(HandoffError::Protocol { path: path.to_owned(), pid: 0, what: format!("{other:?}") })
            }
            None => return Ok((sockets, false)),
        }
    }
}
