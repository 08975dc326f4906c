//! Accept progress of one listening port in one network namespace, from kernel events: a fact
//! of the pods whose probes watch that namespace (`node/probed.rs`), judged by the agent's probe
//! layer from the [`AcceptFacts`] it publishes.
//!
//! Pure: fed in time order with the sensor's TCP events (listen, handshake completed into the
//! accept queue, accept, listener close) and occasional /proc samples of the queue, it keeps
//! what tells whether the application is keeping up. It sees what a tcpSocket probe cannot: the
//! kernel completes handshakes into the backlog whether or not the app ever calls accept().
//!
//! What fails a tcp check, in order of precedence (judged in the agent's `probe/tcp.rs`):
//! - the listener closed (flips on the close event itself);
//! - the accept queue overflowed (the netns's ListenDrops went up while this queue was full, or
//!   while it was the netns's only listener, or — backlog unknown — non-empty); the failure
//!   holds for one stall time;
//! - connections have waited unaccepted longer than the stall time: the oldest established
//!   connection not yet accepted (the queue is FIFO), or a non-empty sampled queue with no accept
//!   since (covers events missed before the agent started).

use std::collections::VecDeque;

/// Established-but-unaccepted times kept per listener. The kernel caps the queue at backlog + 1;
/// this only bounds memory if events and accepts drift apart (lost ring records).
const MAX_TRACKED: usize = 65_536;

/// A /proc sample of one listener and its netns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSample {
    /// rx_queue of the LISTEN socket: connections in the accept queue.
    pub depth: u32,
    /// The listen backlog (max accept queue), when known (sock_diag; /proc lacks it).
    pub backlog: Option<u32>,
    /// TcpExt ListenDrops of the netns (counts overflows too), cumulative.
    pub netns_drops: u64,
    /// Whether this is the only listener of the netns (drops are then surely its own).
    pub sole_listener: bool,
}

/// Accept progress of one (netns, port).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptProgress {
    /// Open listening sockets on the port (v4 and v6, SO_REUSEPORT groups).
    open: u32,
    /// Set when the last listener closed.
    closed_at: Option<u64>,
    /// Completion times of connections in the accept queue, oldest first.
    waiting: VecDeque<u64>,
    last_accept: Option<u64>,
    /// First sample that showed a non-empty queue with no accept since.
    queued_since: Option<u64>,
    /// Last drop count seen, and when and by how much it last went up while attributed to us.
    drops_seen: Option<u64>,
    overflow: Option<(u64, u64)>,
    /// When a listen or close event last changed `open`: a /proc sample older than that does not
    /// overrule it (see [`Self::reconcile_listeners`]).
    changed_at: Option<u64>,
}

impl AcceptProgress {
    /// A listener seen already listening (the agent started after the app), at time `t`.
    pub fn already_listening(count: u32) -> Self {
        Self { open: count.max(1), ..Self::default() }
    }

    /// A socket started listening on the port.
    pub fn on_listen(&mut self, t: u64) {
        if self.open == 0 {
            // A new listener after a close: start over.
            *self = Self { drops_seen: self.drops_seen, ..Self::default() };
        }
        self.open += 1;
        self.changed_at = Some(t);
    }

    /// A listening socket closed; the port is closed when the last one goes.
    pub fn on_close(&mut self, t: u64) {
        self.changed_at = Some(t);
        self.open = self.open.saturating_sub(1);
        if self.open == 0 {
            self.closed_at = Some(t);
            self.waiting.clear();
            self.queued_since = None;
        }
    }

    /// A handshake completed into the accept queue.
    pub fn on_established(&mut self, t: u64) {
        if self.waiting.len() < MAX_TRACKED {
            self.waiting.push_back(t);
        }
    }

    /// The application accepted a connection (the oldest, the queue is FIFO).
    pub fn on_accept(&mut self, t: u64) {
        self.waiting.pop_front();
        self.last_accept = Some(t);
        self.queued_since = None;
    }

    /// Reconciles the open listeners with the kernel's own count of them on the port, sampled at
    /// `t` (sock_diag, else /proc). A listen or close record lost in the ring (counted in
    /// `lifecycle_events_lost_total`), or a close whose port the kernel could not name, would
    /// otherwise leave a dead server's port "listening" for ever. A listen or close event after
    /// the sample wins over it.
    pub fn reconcile_listeners(&mut self, t: u64, count: u32) {
        if self.changed_at.is_some_and(|changed| changed > t) {
            return;
        }
        match (self.open, count) {
            (open, 0) if open > 0 => {
                self.open = 1;
                self.on_close(t);
            }
            (0, count) if count > 0 => {
                *self = Self { drops_seen: self.drops_seen, ..Self::already_listening(count) };
                self.changed_at = Some(t);
            }
            (_, count) if count > 0 => self.open = count,
            _ => {}
        }
    }

    /// Reconciles with the kernel's own view of the queue and the netns drop counter.
    pub fn observe_queue(&mut self, t: u64, sample: QueueSample) {
        let depth = sample.depth as usize;
        // The sample is the truth about how many wait; events tell how long. Fewer than tracked:
        // the oldest left without an accept event (reset, or a lost record). More: completions
        // we never saw, which have waited at least since now.
        while self.waiting.len() > depth {
            self.waiting.pop_front();
        }
        while self.waiting.len() < depth.min(MAX_TRACKED) {
            self.waiting.push_front(t);
        }
        self.queued_since = match (depth, self.queued_since) {
            (0, _) => None,
            (_, Some(since)) => Some(since),
            (_, None) => Some(t),
        };
        if let Some(before) = self.drops_seen {
            // Without the backlog, a non-empty queue at the sample is the best sign it was ours.
            let full = sample.depth > 0 && sample.backlog.is_none_or(|b| sample.depth >= b);
            if sample.netns_drops > before && (full || sample.sole_listener) {
                self.overflow = Some((t, sample.netns_drops - before));
            }
        }
        self.drops_seen = Some(sample.netns_drops);
    }

    /// Whether a listening socket is open on the port.
    pub fn is_listening(&self) -> bool {
        self.open > 0
    }

    /// Connections known to be waiting in the accept queue.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Since when the oldest waiting connection has waited, if any does.
    fn stall_start(&self) -> Option<u64> {
        let oldest = self.waiting.front().copied();
        match (oldest, self.queued_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What a check of this port reads, as of the last event or sample.
    pub fn facts(&self) -> AcceptFacts {
        AcceptFacts {
            listening: self.open > 0,
            waiting: self.waiting.len(),
            stall_start: self.stall_start(),
            overflow: self.overflow,
        }
    }
}

/// What a tcp check reads of one port: small and copied into each published [`AcceptFacts`]
/// map, while the times of the waiting connections stay with the [`AcceptProgress`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcceptFacts {
    /// A listening socket is open on the port.
    pub listening: bool,
    /// Connections known to be waiting in the accept queue.
    pub waiting: usize,
    /// Since when the oldest waiting connection has waited, if any does (boot ns).
    pub stall_start: Option<u64>,
    /// When the accept queue last overflowed while attributed to this port, and by how many.
    pub overflow: Option<(u64, u64)>,
}
