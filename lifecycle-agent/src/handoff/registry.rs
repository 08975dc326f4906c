//! The sockets this agent serves, as the node handoff hands them to a successor, each also
//! deposited with the agent's socket keeper (when it has one) for as long as it is served.

use std::{
    collections::HashMap,
    os::fd::{AsFd, OwnedFd},
    sync::Arc,
};

use parking_lot::{Mutex, MutexGuard};

use super::{keeper::KeeperLink, SocketFacts, SocketKey};

/// Served sockets by key, each a duplicate of the served one.
type Entries = HashMap<SocketKey, (SocketFacts, Arc<OwnedFd>)>;

/// What this agent serves (see the module header).
#[derive(Default)]
pub(crate) struct Registry {
    entries: Mutex<Entries>,
    keeper: Option<Arc<KeeperLink>>,
}

/// A socket's place in the registry, given up when dropped (the socket is served no more).
pub(crate) struct Registration {
    registry: Arc<Registry>,
    key: SocketKey,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.registry.lock().remove(&self.key).is_some() {
            if let Some(keeper) = &self.registry.keeper {
                keeper.forget(&self.key);
            }
        }
    }
}

impl Registry {
    /// A registry whose sockets are also deposited with `keeper`.
    pub(crate) fn new(keeper: Option<Arc<KeeperLink>>) -> Self {
        Self { entries: Mutex::default(), keeper }
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock()
    }

    /// Records `socket` (a duplicate is kept) until the registration is dropped.
    pub(crate) fn register(self: &Arc<Self>, facts: SocketFacts, socket: impl AsFd) -> std::io::Result<Registration> {
        let fd = socket.as_fd().try_clone_to_owned()?;
        let key = facts.key();
        if let Some(keeper) = &self.keeper {
            keeper.keep(&facts, fd.as_fd());
        }
        self.lock().insert(key.clone(), (facts, Arc::new(fd)));
        Ok(Registration { registry: Arc::clone(self), key })
    }

    /// What is served now.
    pub(crate) fn snapshot(&self) -> Vec<(SocketFacts, Arc<OwnedFd>)> {
        self.lock().values().cloned().collect()
    }

    /// Forgets `keys` here (a successor serves them now): no duplicate of them is held any more,
    /// and a later drop of their registrations tells the keeper nothing.
    pub(crate) fn release(&self, keys: &[SocketKey]) {
        let mut entries = self.lock();
        for key in keys {
            entries.remove(key);
        }
    }
}
