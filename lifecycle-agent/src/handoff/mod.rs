//! Listening sockets that outlive the agent process, and that no other process can take.
//!
//! The agent's sockets are `--listen`, `--health-listen` and one probe listener in each probed
//! pod's network namespace. Each is bound by exactly one agent, without `SO_REUSEPORT` (which let
//! any root process of the node's network namespace bind 9890 beside the agent and collect its
//! requests and tokens), and leaves an agent only for another agent:
//!
//! - **The socket keeper** (`lifecycle-agent keep-sockets`, [`keeper`]): a second container in the
//!   agent's pod, a small process holding a duplicate of every socket its agent serves, handed
//!   over on a Unix socket in a directory only the pod's containers mount (`--keeper-dir`). When
//!   the kubelet restarts the agent in place (its liveness probe failed, an OOM kill, a crash),
//!   the keeper lives on with the sockets, their backlogs keep every connection made meanwhile,
//!   and the next agent takes them back before it binds anything: no probe is refused. This is
//!   systemd's socket holding (`FileDescriptorStoreMax=`) done by a process of the pod, since a
//!   pod has no systemd: a socket lives only as long as some process holds it, and the agent's
//!   container dies whole.
//! - **The node handoff** ([`node`]): a new agent pod on the node (a rolling update) connects to
//!   the running agent's socket in `--handoff-dir` and gets every socket it serves; once the new
//!   agent serves them it says which, and the old one stops serving those (so the two never
//!   answer in turn) and reports itself replaced on `/readyz`. When the old agent is gone but its
//!   keeper still holds a port, the new agent finds the keeper as the port's holder and takes
//!   the sockets from it instead.
//! - **Anything else on the port** is refused, named (`holder.rs`): the agent does not start
//!   beside another agent or any other process on its ports.
//!
//! Who may take sockets ([`peer`]): from a keeper, only a process of the keeper's own pod (its
//! agent) or, once that agent is gone, a successor; from an agent, only a successor. A successor
//! is a root process of the agent's own pid namespace with `CAP_SYS_PTRACE`: one that could take
//! the sockets from the agent's fd table anyway (`pidfd_getfd`), so the handoff gives it nothing
//! new. A received socket is used only if it is a listening TCP socket bound where the agent
//! would bind it, in the network namespace it is meant for ([`verify`]): the sender's claims
//! are never taken as they are.

pub(crate) mod holder;
pub mod keeper;
pub(crate) mod node;
pub(crate) mod peer;
pub(crate) mod registry;
pub(crate) mod verify;
pub(crate) mod wire;

use std::{io, net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

/// What a handed-over socket serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "serves", rename_all = "snake_case")]
pub(crate) enum Serves {
    /// `--listen`.
    Listen,
    /// `--health-listen`.
    Health,
    /// A pod's probe listener, bound in the pod's network namespace (its inode).
    Pod { namespace: String, pod: String, netns: u32 },
}

/// A handed-over socket as its sender describes it: checked against the socket before use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SocketFacts {
    #[serde(flatten)]
    pub serves: Serves,
    /// Where it is bound.
    pub addr: SocketAddr,
}

/// Which socket a message is about: one per role and port (a pod's by its netns).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct SocketKey {
    /// The pod's netns inode; None for the agent's own listeners.
    pub netns: Option<u32>,
    /// `listen`, `health` or `pod`.
    pub role: String,
    pub port: u16,
}

impl SocketFacts {
    pub(crate) fn key(&self) -> SocketKey {
        let (role, netns) = match &self.serves {
            Serves::Listen => ("listen", None),
            Serves::Health => ("health", None),
            Serves::Pod { netns, .. } => ("pod", Some(*netns)),
        };
        SocketKey { netns, role: role.to_owned(), port: self.addr.port() }
    }
}

/// Why sockets could not be handed over, or one could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// A socket call failed.
    #[error("{call} on {path}")]
    Socket {
        call: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The peer is not one that may take or give sockets.
    #[error("{path}: {refusal}")]
    Peer { path: PathBuf, refusal: peer::Refusal },
    /// The peer said something out of turn.
    #[error("{path}: unexpected message from pid {pid}: {what}")]
    Protocol { path: PathBuf, pid: u32, what: String },
    /// Another process holds an address the agent must bind.
    #[error("{addr} is held by {holder}{hint}")]
    Held { addr: SocketAddr, holder: holder::Holder, hint: &'static str },
    /// The address could not be bound, and nothing the agent can name holds it.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

fn socket_error<'a>(call: &'static str, path: &'a std::path::Path) -> impl FnOnce(io::Error) -> HandoffError + 'a {
    move |source| HandoffError::Socket { call, path: path.to_owned(), source }
}
