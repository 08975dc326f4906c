//! Accept progress of one listening port in one network namespace, from kernel events.
//!
//! Pure: fed in time order with the sensor's TCP events (listen, handshake completed into the
//! accept queue, accept, listener close) and occasional /proc samples of the queue, it says
//! whether the application is keeping up. It answers what a tcpSocket probe cannot: the kernel
//! completes handshakes into the backlog whether or not the app ever calls accept().
//!
//! Failure, in order of precedence:
//! - the listener closed (flips on the close event itself);
//! - the accept queue overflowed (the netns's ListenDrops went up while this queue was full, or
//!   while it was the netns's only listener, or — backlog unknown — non-empty); the failure
//!   holds for one stall time;
//! - connections have waited unaccepted longer than the stall time: the oldest established
//!   connection not yet accepted (the queue is FIFO), or a non-empty sampled queue with no accept
//!   since (covers events missed before the agent started).

use std::collections::VecDeque;

use super::check::{seconds, Verdict};

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

    /// Judges the listener at `now` against `stall_ns`.
    pub fn verdict(&self, port: u16, now: u64, stall_ns: u64) -> Verdict {
        if self.open == 0 {
            return Verdict::fail(format!("listener on {port} closed"));
        }
        if let Some((at, drops)) = self.overflow {
            if now < at.saturating_add(stall_ns) {
                return Verdict::fail(format!(
                    "port {port}: accept queue overflowed ({drops} connections dropped {} ago)",
                    seconds(now.saturating_sub(at))
                ));
            }
        }
        if let Some(start) = self.stall_start() {
            let waited = now.saturating_sub(start);
            if waited >= stall_ns {
                let n = self.waiting.len().max(1);
                return Verdict::fail(format!(
                    "port {port}: {n} connection{} waiting unaccepted for {} (stall limit {})",
                    if n == 1 { "" } else { "s" },
                    seconds(waited),
                    seconds(stall_ns)
                ));
            }
        }
        Verdict::pass(format!("port {port} accepting ({} waiting)", self.waiting.len()))
    }

    /// When the verdict changes next with no new input: a stall or an overflow window ending.
    pub fn next_deadline(&self, now: u64, stall_ns: u64) -> Option<u64> {
        if self.open == 0 {
            return None;
        }
        let stall = self.stall_start().map(|s| s.saturating_add(stall_ns));
        let overflow_ends = self.overflow.map(|(at, _)| at.saturating_add(stall_ns));
        [stall, overflow_ends].into_iter().flatten().filter(|&d| d > now).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn listening() -> AcceptProgress {
        let mut p = AcceptProgress::default();
        p.on_listen(0);
        p
    }

    fn sample(depth: u32, drops: u64) -> QueueSample {
        QueueSample { depth, backlog: Some(4), netns_drops: drops, sole_listener: false }
    }

    #[test]
    fn fresh_listener_with_nothing_waiting_passes_and_has_no_deadline() {
        let p = listening();
        assert!(p.verdict(8080, 100 * S, 5 * S).pass);
        assert_eq!(p.next_deadline(100 * S, 5 * S), None);
    }

    #[test]
    fn accepted_connections_keep_it_passing() {
        let mut p = listening();
        for i in 0..100 {
            p.on_established(i * S);
            p.on_accept(i * S + 1000);
        }
        assert!(p.verdict(8080, 200 * S, 5 * S).pass);
        assert_eq!(p.waiting(), 0);
    }

    #[test]
    fn stall_fails_exactly_when_the_oldest_waiting_connection_reaches_the_limit() {
        let mut p = listening();
        p.on_established(10 * S);
        p.on_established(11 * S);
        p.on_established(12 * S);
        let deadline = p.next_deadline(12 * S, 5 * S).expect("deadline");
        assert_eq!(deadline, 15 * S);
        assert!(p.verdict(8080, deadline - 1, 5 * S).pass);
        let v = p.verdict(8080, 17 * S + 200_000_000, 5 * S);
        assert_eq!(v, Verdict::fail("port 8080: 3 connections waiting unaccepted for 7.2s (stall limit 5s)"));
        // An accept takes the oldest; the next oldest is younger.
        p.on_accept(17 * S);
        assert_eq!(p.next_deadline(13 * S, 5 * S), Some(16 * S));
    }

    #[test]
    fn close_flips_at_once_and_a_new_listen_starts_over() {
        let mut p = listening();
        p.on_established(1);
        p.on_close(2);
        assert_eq!(p.verdict(8080, 2, 5 * S), Verdict::fail("listener on 8080 closed"));
        assert_eq!(p.next_deadline(2, 5 * S), None);
        p.on_listen(3);
        assert!(p.verdict(8080, 100 * S, 5 * S).pass);
    }

    #[test]
    fn dual_stack_port_is_closed_only_when_both_listeners_are() {
        let mut p = listening();
        p.on_listen(1);
        p.on_close(2);
        assert!(p.verdict(80, 3, S).pass);
        p.on_close(4);
        assert!(!p.verdict(80, 5, S).pass);
    }

    #[test]
    fn queue_sample_without_events_stalls_from_the_sample_time() {
        let mut p = AcceptProgress::already_listening(1);
        p.observe_queue(10 * S, sample(2, 0));
        assert_eq!(p.waiting(), 2);
        assert_eq!(p.next_deadline(10 * S, 5 * S), Some(15 * S));
        assert!(!p.verdict(8080, 15 * S, 5 * S).pass);
        // An empty queue later means they were taken.
        p.observe_queue(16 * S, sample(0, 0));
        assert!(p.verdict(8080, 16 * S, 5 * S).pass);
    }

    #[test]
    fn sample_trims_connections_that_left_without_an_accept_event() {
        let mut p = listening();
        p.on_established(S);
        p.on_established(2 * S);
        p.observe_queue(3 * S, sample(1, 0));
        assert_eq!(p.waiting(), 1);
        // The survivor is the newer one (2 s).
        assert_eq!(p.next_deadline(3 * S, 5 * S), Some(7 * S));
    }

    #[test]
    fn drops_fail_only_when_attributable_and_only_for_one_stall_time() {
        let mut p = listening();
        p.observe_queue(S, sample(0, 7));
        // Another listener's drops: our queue is not full and we are not alone.
        p.observe_queue(2 * S, sample(1, 9));
        assert!(p.verdict(80, 2 * S, 5 * S).pass, "{:?}", p.verdict(80, 2 * S, 5 * S));
        p.on_accept(2 * S);
        // Our queue full when drops rose.
        p.observe_queue(3 * S, sample(4, 12));
        let v = p.verdict(80, 3 * S, 5 * S);
        assert_eq!(v, Verdict::fail("port 80: accept queue overflowed (3 connections dropped 0s ago)"));
        p.observe_queue(3 * S, sample(0, 12));
        assert_eq!(p.next_deadline(3 * S, 5 * S), Some(8 * S));
        assert!(p.verdict(80, 8 * S, 5 * S).pass);
        // Sole listener: any rise is ours.
        p.observe_queue(9 * S, QueueSample { depth: 0, backlog: Some(4), netns_drops: 13, sole_listener: true });
        assert!(!p.verdict(80, 9 * S, 5 * S).pass);
    }

    #[test]
    fn a_lost_close_record_is_repaired_by_the_next_sample_and_a_later_event_wins() {
        // Issue 18: refresh never closed ports sock_diag no longer showed.
        let mut p = AcceptProgress::default();
        p.on_listen(10);
        assert!(p.is_listening());
        // The close record was lost; the kernel lists no listener at 20.
        p.reconcile_listeners(20, 0);
        assert!(!p.is_listening(), "closed by the sample");
        // A listen at 30 is newer than a sample taken at 25 that did not see it.
        p.on_listen(30);
        p.reconcile_listeners(25, 0);
        assert!(p.is_listening(), "the event after the sample wins");
        // A lost listen record: the sample shows one.
        let mut q = AcceptProgress::default();
        q.reconcile_listeners(40, 2);
        assert!(q.is_listening());
    }
}
