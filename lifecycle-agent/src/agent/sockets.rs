//! How the agent gets its listening sockets at start (see `handoff`): from the socket keeper of
//! its own pod (restarted in place), else from the agent running on the node (a rolling
//! update), else from an orphaned keeper holding its port (a rolling update whose old agent is
//! gone), else bound anew; never beside another process: a port someone else holds is refused,
//! naming the holder.

use std::{
    net::{SocketAddr, TcpListener},
    os::fd::OwnedFd,
    path::Path,
    sync::Arc,
};

use crate::{
    discovery::netns,
    handoff::{
        holder::{holder_of, Holder},
        keeper::{KeeperLink, KEEPER_SOCKET},
        node::{self, Taken},
        peer::{Peer, Refusal},
        verify, HandoffError, Serves, SocketFacts,
    },
    probe::supervisor::Adopted,
};

/// What the agent starts with.
pub(crate) enum Start {
    /// Its sockets, to serve.
    Serve(Sockets),
    /// Its keeper says a newer agent took this pod's sockets: it serves nothing.
    Replaced,
}

/// The agent's sockets and where they came from.
pub(crate) struct Sockets {
    pub listen: TcpListener,
    pub health: Option<TcpListener>,
    /// Pods' probe listeners, checked when their pods claim them.
    pub pods: Adopted,
    /// The keeper of this pod, which every socket served goes to.
    pub keeper: Option<Arc<KeeperLink>>,
    /// The agent or keeper they were taken from, to be told which are served once they are.
    pub taken: Option<Taken>,
}

/// Where the agent's sockets are to be bound, and where they may come from.
pub(crate) struct Wanted<'a> {
    pub listen: SocketAddr,
    pub health: Option<SocketAddr>,
    pub keeper_dir: Option<&'a Path>,
    pub handoff_dir: Option<&'a Path>,
}

/// Gets the sockets (see the module header).
pub(crate) fn obtain(wanted: &Wanted<'_>) -> Result<Start, HandoffError> {
    let mut received = Vec::new();
    let mut keeper = None;
    if let Some(dir) = wanted.keeper_dir {
        match KeeperLink::attach(dir) {
            Ok(attached) if attached.replaced => return Ok(Start::Replaced),
            Ok(attached) => {
                if !attached.sockets.is_empty() {
                    log::info!("took {} listening socket(s) back from the socket keeper", attached.sockets.len());
                }
                received = attached.sockets;
                keeper = Some(attached.link);
            }
            Err(err) => log::warn!(
                "no socket keeper: the listening sockets will not outlive this agent: {}",
                crate::ErrorChain(&err)
            ),
        }
    }
    let mut taken = None;
    if let (true, Some(dir)) = (received.is_empty(), wanted.handoff_dir) {
        match node::take(&node::socket_in(dir), Peer::may_succeed) {
            Ok(Some(mut from)) => {
                log::info!("took {} listening socket(s) from the running agent, {}", from.sockets.len(), from.from);
                received = std::mem::take(&mut from.sockets);
                taken = Some(from);
            }
            Ok(None) => {}
            Err(err) => log::warn!("nothing taken from a running agent: {}", crate::ErrorChain(&err)),
        }
    }
    let mut sorted = Sorted::of(received, wanted);
    let listen = match sorted.listen.take() {
        Some(listener) => listener,
        None => {
            let (listener, from) = bind_or_take(wanted.listen, wanted, &mut sorted)?;
            taken = taken.or(from);
            listener
        }
    };
    let health = match (wanted.health, sorted.health.take()) {
        (_, Some(listener)) => Some(listener),
        (None, None) => None,
        (Some(addr), None) => {
            let (listener, from) = bind_or_take(addr, wanted, &mut sorted)?;
            taken = taken.or(from);
            Some(listener)
        }
    };
    Ok(Start::Serve(Sockets { listen, health, pods: sorted.pods, keeper, taken }))
}

/// Received sockets by what they serve, the agent's own checked already.
#[derive(Default)]
struct Sorted {
    listen: Option<TcpListener>,
    health: Option<TcpListener>,
    pods: Adopted,
}

impl Sorted {
    fn of(received: Vec<(SocketFacts, OwnedFd)>, wanted: &Wanted<'_>) -> Self {
        let mut sorted = Self::default();
        sorted.add(received, wanted);
        sorted
    }

    fn add(&mut self, received: Vec<(SocketFacts, OwnedFd)>, wanted: &Wanted<'_>) {
        let own = |fd, addr: SocketAddr| match verify::listener(fd, addr, &netns::own()) {
            Ok(listener) => Some(listener),
            Err(mismatch) => {
                log::warn!("a socket handed over for {addr} is not used: {mismatch}");
                None
            }
        };
        for (facts, fd) in received {
            match facts.serves {
                Serves::Listen if facts.addr == wanted.listen && self.listen.is_none() => {
                    self.listen = own(fd, facts.addr);
                }
                Serves::Health if Some(facts.addr) == wanted.health && self.health.is_none() => {
                    self.health = own(fd, facts.addr);
                }
                Serves::Pod { netns, .. } => drop(self.pods.insert(netns, (facts, fd))),
                // Another address than this agent's, or one it has already: not its to serve
                // (closed here).
                _ => {}
            }
        }
    }

    fn own(&mut self, addr: SocketAddr, wanted: &Wanted<'_>) -> Option<TcpListener> {
        if addr == wanted.listen {
            self.listen.take()
        } else {
            self.health.take()
        }
    }
}

/// Binds `addr` for this agent alone (no `SO_REUSEPORT`: no other process can bind beside it);
/// when it is held by an orphaned socket keeper, takes that keeper's sockets instead; when held
/// by anything else, refuses, naming the holder.
fn bind_or_take(
    addr: SocketAddr,
    wanted: &Wanted<'_>,
    sorted: &mut Sorted,
) -> Result<(TcpListener, Option<Taken>), HandoffError> {
    let error = match bind_alone(addr) {
        Ok(listener) => return Ok((listener, None)),
        Err(error) => error,
    };
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return Err(HandoffError::Bind { addr, source: error });
    }
    let Some(holder) = holder_of(&netns::own(), addr.port()) else {
        return Err(HandoffError::Bind { addr, source: error });
    };
    if let Some(dir) = holder.keeper_dir.clone() {
        let path = dir.join(KEEPER_SOCKET);
        let pid = holder.pid;
        let the_holder = |peer: &Peer| match peer.pid == pid {
            true => Ok(()),
            false => Err(Refusal::Gone { pid }),
        };
        match node::take(&path, the_holder) {
            Ok(Some(mut from)) => {
                log::info!("took {} socket(s) from {holder}, the keeper of an agent gone", from.sockets.len());
                sorted.add(std::mem::take(&mut from.sockets), wanted);
                if let Some(listener) = sorted.own(addr, wanted) {
                    return Ok((listener, Some(from)));
                }
            }
            Ok(None) => {}
            Err(err) => log::warn!("nothing taken from {holder}: {}", crate::ErrorChain(&err)),
        }
    }
    Err(HandoffError::Held { addr, hint: hint(&holder), holder })
}

/// What to do about `holder`, for the refusal.
fn hint(holder: &Holder) -> &'static str {
    match (holder.keeper_dir.is_some(), holder.command.contains("lifecycle-agent")) {
        (true, _) => "; it is the socket keeper of an agent that is still attached to it",
        (false, true) => {
            "; another agent serves this node: stop it, or start this one with its --handoff-dir to take its sockets over"
        }
        (false, false) => "",
    }
}

/// `addr` bound with `SO_REUSEADDR` (a port in TIME_WAIT is no obstacle) and not `SO_REUSEPORT`.
fn bind_alone(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)?.into_std()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_another_process_holds_is_refused_naming_it_and_no_one_binds_beside_the_agent() {
        // Issue 37: `--listen` was bound with SO_REUSEPORT, so any root process of the node's
        // network namespace could bind the port beside the agent and receive its requests.
        let wanted =
            Wanted { listen: "127.0.0.1:0".parse().expect("addr"), health: None, keeper_dir: None, handoff_dir: None };
        let Start::Serve(sockets) = obtain(&wanted).expect("bound") else { panic!("not replaced") };
        let addr = sockets.listen.local_addr().expect("addr");
        let beside = tokio::net::TcpSocket::new_v4().expect("socket");
        beside.set_reuseport(true).expect("SO_REUSEPORT");
        beside.set_reuseaddr(true).expect("SO_REUSEADDR");
        let refused = beside.bind(addr).expect_err("nobody binds beside the agent");
        assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
        // A second agent on the same port, without a handoff, does not start.
        let second = Wanted { listen: addr, ..wanted };
        match obtain(&second) {
            Err(HandoffError::Held { addr: held, holder, .. }) => {
                assert_eq!(held, addr);
                assert_eq!(holder.pid, std::process::id(), "{holder}");
            }
            // Without CAP_SYS_PTRACE or sock_diag the holder cannot be named: still refused.
            Err(HandoffError::Bind { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a second agent bound the same port"),
        }
    }
}
