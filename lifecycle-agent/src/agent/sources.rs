//! What the agent's listener keeps per source address (`http.rs`): its connections' places,
//! which idle ones give up to newcomers, and the turns whole-node answers take, one source's
//! after another and one at a time per listener.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use parking_lot::Mutex;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::probe::rates::{Rate, SourceRates};

/// The places of one listener's connections, by source address (see `http.rs`'s header):
/// at most `max` in all and `per_source` from one source. A connection is *idle* while it has no
/// request in the making (before its first request head is complete, and between requests on
/// a kept-alive connection); an idle one gives its place up to a newcomer when there is no other
/// room: its own source's oldest idle connection when the source has its `per_source`, else the
/// oldest idle connection of the source holding the most. A source may take another source's
/// place at most [`EVICTION_RATE`]: a client that holds places (silent or slow) cannot keep
/// others out, and one that connects in a flood cannot cut everyone's connections as fast as it
/// likes. An entry exists only while its source has a connection, so the map holds at most
/// `max` entries.
pub(super) struct Places {
    max: usize,
    per_source: usize,
    origin: Instant,
    state: Mutex<PlacesState>,
    /// How often each source has taken another source's place.
    rates: Mutex<SourceRates>,
}

/// How often one source may take another source's idle connection's place.
pub(super) const EVICTION_RATE: Rate = Rate { per_second: 20.0, burst: 40.0 };

#[derive(Default)]
struct PlacesState {
    next_id: u64,
    total: usize,
    sources: HashMap<IpAddr, SourceEntry>,
}

/// A source's connections, and the turn its requests take one after another ([`Turns`]).
struct SourceEntry {
    held: Vec<Arc<Held>>,
    turn: Arc<Semaphore>,
}

/// One connection's state as its place sees it.
pub(super) struct Held {
    id: u64,
    /// Requests in the making (0: idle).
    busy: AtomicUsize,
    /// When it last became idle (ms since the places' origin).
    idle_since_ms: AtomicU64,
    /// Told when its place is given to a newcomer: the connection closes.
    pub(super) evicted: Notify,
}

impl Held {
    fn idle_since(&self) -> Option<u64> {
        (self.busy.load(Ordering::Acquire) == 0).then(|| self.idle_since_ms.load(Ordering::Acquire))
    }
}

/// A request in the making on a connection: it is not idle until this is dropped (once its
/// answer is written, or the request is abandoned).
pub(super) struct Busy {
    held: Arc<Held>,
    origin: Instant,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.held.idle_since_ms.store(self.origin.elapsed().as_millis() as u64, Ordering::Release);
        self.held.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection got no place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its source has `per_source` connections, none of them idle.
    Source,
    /// `max` connections, none of them idle.
    Busy,
    /// Room only in another source's place, and its source took others' too often.
    Rate,
}

/// One connection's place, given back when dropped.
pub(super) struct Place {
    places: Arc<Places>,
    ip: IpAddr,
    pub(super) held: Arc<Held>,
    /// Its source's turn, shared by the source's connections.
    pub(super) turn: Arc<Semaphore>,
}

impl Place {
    /// Marks a request in the making until the returned guard is dropped.
    pub(super) fn busy(&self) -> Busy {
        self.held.busy.fetch_add(1, Ordering::AcqRel);
        Busy { held: Arc::clone(&self.held), origin: self.places.origin }
    }
}

impl Places {
    pub(super) fn new(max: usize, per_source: usize) -> Self {
        Self {
            max,
            per_source: per_source.max(1),
            origin: Instant::now(),
            state: Mutex::default(),
            rates: Mutex::new(SourceRates::new(EVICTION_RATE)),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, PlacesState> {
        self.state.lock()
    }

    /// A place for a connection from `ip`, and whether an idle connection was closed for it.
    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Result<(Place, bool), Refused> {
        let mut state = self.lock();
        let own = state.sources.get(&ip).map_or(0, |entry| entry.held.len());
        let mut evicted = false;
        if own >= self.per_source {
            let victim = state.sources.get(&ip).and_then(|entry| oldest_idle(&entry.held)).ok_or(Refused::Source)?;
            evict(&mut state, ip, victim);
            evicted = true;
        } else if state.total >= self.max {
            // The source holding the most places gives one up (its oldest idle connection).
            let (victim_ip, victim) = state
                .sources
                .iter()
                .filter_map(|(source, entry)| {
                    oldest_idle(&entry.held).map(|victim| (entry.held.len(), *source, victim))
                })
                .max_by_key(|(held, _, victim)| (*held, std::cmp::Reverse(victim.1)))
                .map(|(_, source, victim)| (source, victim))
                .ok_or(Refused::Busy)?;
            let allowed = victim_ip == ip || self.rates.lock().admit(ip, Instant::now());
            if !allowed {
                return Err(Refused::Rate);
            }
            evict(&mut state, victim_ip, victim);
            evicted = true;
        }
        state.next_id += 1;
        let held = Arc::new(Held {
            id: state.next_id,
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.origin.elapsed().as_millis() as u64),
            evicted: Notify::new(),
        });
        state.total += 1;
        let entry = state
            .sources
            .entry(ip)
            .or_insert_with(|| SourceEntry { held: Vec::new(), turn: Arc::new(Semaphore::new(1)) });
        entry.held.push(Arc::clone(&held));
        let turn = Arc::clone(&entry.turn);
        Ok((Place { places: Arc::clone(self), ip, held, turn }, evicted))
    }
}

/// The oldest idle connection of `held`: (its id, when it became idle).
fn oldest_idle(held: &[Arc<Held>]) -> Option<(u64, u64)> {
    held.iter().filter_map(|h| h.idle_since().map(|since| (h.id, since))).min_by_key(|(_, since)| *since)
}

/// Takes `victim`'s place from `source` and tells its connection to close.
fn evict(state: &mut PlacesState, source: IpAddr, (id, _): (u64, u64)) {
    let Some(entry) = state.sources.get_mut(&source) else { return };
    if let Some(at) = entry.held.iter().position(|h| h.id == id) {
        let held = entry.held.remove(at);
        held.evicted.notify_one();
        state.total -= 1;
    }
    if entry.held.is_empty() {
        state.sources.remove(&source);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.places.lock();
        let Some(entry) = state.sources.get_mut(&self.ip) else { return };
        // Gone already if it was evicted.
        if let Some(at) = entry.held.iter().position(|h| h.id == self.held.id) {
            entry.held.remove(at);
            let empty = entry.held.is_empty();
            state.total -= 1;
            if empty {
                state.sources.remove(&self.ip);
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
