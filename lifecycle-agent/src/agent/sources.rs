//! What the agent's listeners keep per source address (`http.rs`): how many connections each
//! has open, and the turns whole-node answers take, one source's after another and one at a
//! time per listener.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections open per source address; an entry exists only while its source has one open, so
/// the map holds at most `max_connections` entries.
pub(super) struct PerSource {
    limit: usize,
    open: Mutex<HashMap<IpAddr, SourceEntry>>,
}

/// A source's open connections, and the turn its requests take one after another ([`Turns`]).
struct SourceEntry {
    connections: usize,
    turn: Arc<Semaphore>,
}

/// One connection's place in [`PerSource`], given back when dropped.
pub(super) struct SourcePlace {
    sources: Arc<PerSource>,
    ip: IpAddr,
    /// Its source's turn, shared by the source's connections.
    pub(super) turn: Arc<Semaphore>,
}

impl PerSource {
    /// At most `limit` connections per source.
    pub(super) fn new(limit: usize) -> Self {
        Self { limit, open: Mutex::new(HashMap::new()) }
    }

    /// A place for a connection from `ip`; None when it has `limit` open already.
    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<SourcePlace> {
        let mut open = self.open.lock().unwrap_or_else(|poison| poison.into_inner());
        let entry = open.entry(ip).or_insert_with(|| SourceEntry { connections: 0, turn: Arc::new(Semaphore::new(1)) });
        if entry.connections >= self.limit {
            return None;
        }
        entry.connections += 1;
        Some(SourcePlace { sources: Arc::clone(self), ip, turn: Arc::clone(&entry.turn) })
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut open = self.sources.open.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(entry) = open.get_mut(&self.ip) {
            entry.connections -= 1;
            if entry.connections == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The turns whole-node answers take on one listener (see `http.rs`'s header): a source's turn
/// first (its requests in the order they came), then the listener's, FIFO. A source therefore
/// has at most one request in the listener's queue, and a request waits there for at most one
/// answer per other source. Nothing is dropped: a request waits, within its connection's
/// lifetime (`Limits::lifetime`).
pub(super) struct Turns {
    listener: Arc<Semaphore>,
}

/// A request's turn to make its answer: held while it is made, given back when dropped.
pub(super) struct Turn {
    _listener: Option<OwnedSemaphorePermit>,
    _source: Option<OwnedSemaphorePermit>,
}

impl Turns {
    pub(super) fn new() -> Self {
        Self { listener: Arc::new(Semaphore::new(1)) }
    }

    /// Waits for the turn of a request from the source whose turn is `source`.
    pub(super) async fn take(&self, source: &Arc<Semaphore>) -> Turn {
        // Neither semaphore is ever closed (acquiring fails only then); if one were, the answer
        // would be made without waiting rather than refused.
        let source = Arc::clone(source).acquire_owned().await.ok();
        let listener = Arc::clone(&self.listener).acquire_owned().await.ok();
        Turn { _listener: listener, _source: source }
    }
}
