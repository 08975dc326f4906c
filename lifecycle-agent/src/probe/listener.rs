//! The pod probe listener's serving loop: one thread per listener running a small `mio` event
//! loop, so no client can delay another (issue 10).
//!
//! Probes are one GET each on a fresh connection (the kubelet disables keep-alive): the loop
//! accepts without blocking, drops sources the [`SourceFilter`] does not allow, and answers a
//! connection as soon as its request head is complete, then closes it. With TCP_DEFER_ACCEPT the
//! kernel completes the accept only once the request has arrived, so the usual probe costs one
//! wake-up, `accept4`, `read`, `write` and `close` — as cheap as the blocking thread it replaced
//! (that design was measured 2x cheaper than hyper on the tokio runtime), and nothing is
//! registered with epoll for it. Only a connection whose head is incomplete is kept, registered,
//! and given [`ListenerLimits::head_deadline`] to finish; at most
//! [`ListenerLimits::max_connections`] are kept at once. Past that bound a new connection still
//! gets one read: answered if its request is all there, else it takes the place of the
//! connection kept longest. Every connection closed without an answer is counted by reason.

use std::{
    io::{self, Read as _, Write as _},
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use mio::{net::TcpStream, Events, Interest, Poll, Token, Waker};

use super::{
    metrics::ConnectionCounters,
    server::{head_is_answerable, response, ProbeAnswer, ServerError, MAX_REQUEST_HEAD},
    source::SourceFilter,
};

/// Time a connection has to deliver its request head (and take its answer) before it is closed:
/// well under the kubelet's default 1 s probe timeout.
pub const HEAD_DEADLINE: Duration = Duration::from_millis(250);
/// Connections a listener keeps open at once (each waiting for the rest of its request head).
pub const MAX_CONNECTIONS: usize = 64;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);

/// Bounds of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    pub head_deadline: Duration,
    pub max_connections: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self { head_deadline: HEAD_DEADLINE, max_connections: MAX_CONNECTIONS }
    }
}

/// A probe listener served by its own thread. Dropping it (or [`ProbeListener::stop`]) wakes the
/// loop, which closes the socket and every open connection, and joins the thread.
pub struct ProbeListener {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl ProbeListener {
    /// Starts serving `listener` with `answer`, letting in only what `sources` allows.
    pub fn start(
        listener: std::net::TcpListener,
        answer: Arc<dyn ProbeAnswer>,
        sources: SourceFilter,
        counters: ConnectionCounters,
        limits: ListenerLimits,
    ) -> Result<Self, ServerError> {
        let local = listener.local_addr().map_err(ServerError::Start)?;
        listener.set_nonblocking(true).map_err(ServerError::Start)?;
        defer_accept(&listener);
        deepen_backlog(&listener);
        let mut listener = mio::net::TcpListener::from_std(listener);
        let poll = Poll::new().map_err(ServerError::Start)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(ServerError::Start)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(ServerError::Start)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut serving = Loop {
            poll,
            listener,
            stop: stop.clone(),
            answer,
            sources,
            counters,
            limits,
            slots: (0..limits.max_connections).map(|_| None).collect(),
            open: 0,
        };
        let thread = std::thread::Builder::new()
            .name("probe-listener".into())
            .spawn(move || serving.run())
            .map_err(ServerError::Start)?;
        Ok(Self { local, stop, waker, thread: Some(thread) })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting, closes every connection and waits for the serving thread.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Err(err) = self.waker.wake() {
            log::warn!("cannot wake a probe listener to stop it: {err}");
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ProbeListener {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The serving thread's state.
struct Loop {
    poll: Poll,
    listener: mio::net::TcpListener,
    stop: Arc<AtomicBool>,
    answer: Arc<dyn ProbeAnswer>,
    sources: SourceFilter,
    counters: ConnectionCounters,
    limits: ListenerLimits,
    /// Connections waiting for the rest of their request head (or for room to write the answer);
    /// the index is the connection's token.
    slots: Vec<Option<Connection>>,
    open: usize,
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(self.limits.max_connections + 2);
        loop {
            let timeout = self.next_deadline().map(|d| d.saturating_duration_since(Instant::now()));
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() != io::ErrorKind::Interrupted {
                    log::warn!("a probe listener's poll failed: {err}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            for event in &events {
                match event.token() {
                    WAKER => {}
                    LISTENER => self.accept_all(),
                    Token(slot) => self.advance(slot),
                }
            }
            self.expire(Instant::now());
        }
    }

    fn accept_all(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                // A client that reset before the accept: nothing to do.
                Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(err) => {
                    // EMFILE and friends: leave the rest queued; the next connection retries.
                    log::warn!("accept on a probe listener failed: {err}");
                    return;
                }
            };
            if !self.sources.allows(peer.ip()) {
                self.counters.source.inc();
                continue;
            }
            let mut connection = Connection::new(stream, Instant::now() + self.limits.head_deadline);
            let Step::Wait(interest) = connection.advance(self.answer.as_ref()) else { continue };
            if self.open >= self.limits.max_connections {
                // Full: the connection kept longest makes room. A real client (the kubelet)
                // sends its whole request at once, so the newest is the likeliest to be one;
                // refusing newcomers instead let anyone on a node address who holds 64
                // connections fail every probe of the pod (issue 18).
                self.counters.busy.inc();
                self.evict_oldest();
            }
            self.keep(connection, interest);
        }
    }

    /// Registers a connection that has to wait and keeps it in a free slot.
    fn keep(&mut self, mut connection: Connection, interest: Interest) {
        let Some(slot) = self.slots.iter().position(Option::is_none) else { return };
        match self.poll.registry().register(&mut connection.stream, Token(slot), interest) {
            Ok(()) => {
                connection.interest = interest;
                self.slots[slot] = Some(connection);
                self.open += 1;
            }
            Err(err) => log::warn!("cannot register a probe connection: {err}"),
        }
    }

    fn advance(&mut self, slot: usize) {
        let Some(connection) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        match connection.advance(self.answer.as_ref()) {
            Step::Done => self.close(slot),
            Step::Wait(interest) if interest != connection.interest => {
                connection.interest = interest;
                if let Err(err) = self.poll.registry().reregister(&mut connection.stream, Token(slot), interest) {
                    log::warn!("cannot re-register a probe connection: {err}");
                    self.close(slot);
                }
            }
            Step::Wait(_) => {}
        }
    }

    /// Closes the connection with the earliest deadline (the one kept longest).
    fn evict_oldest(&mut self) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| Some((c.as_ref()?.deadline, slot)))
            .min()
            .map(|(_, slot)| slot);
        if let Some(slot) = oldest {
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut connection) = self.slots.get_mut(slot).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut connection.stream);
            self.open -= 1;
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.open == 0 {
            return None;
        }
        self.slots.iter().flatten().map(|c| c.deadline).min()
    }

    /// Closes the connections whose deadline has passed.
    fn expire(&mut self, now: Instant) {
        if self.open == 0 {
            return;
        }
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|c| c.deadline <= now) {
                self.counters.timeout.inc();
                self.close(slot);
            }
        }
    }
}

/// One client connection: its request head so far, then its answer.
struct Connection {
    stream: TcpStream,
    head: Vec<u8>,
    out: Vec<u8>,
    written: usize,
    deadline: Instant,
    interest: Interest,
}

/// What a connection needs next.
enum Step {
    /// Answered, or given up on: close it.
    Done,
    /// More of the request, or room to write.
    Wait(Interest),
}

impl Connection {
    fn new(stream: TcpStream, deadline: Instant) -> Self {
        Self { stream, head: Vec::new(), out: Vec::new(), written: 0, deadline, interest: Interest::READABLE }
    }

    /// Reads what has arrived; once the head is complete, writes the answer.
    fn advance(&mut self, answer: &dyn ProbeAnswer) -> Step {
        if self.out.is_empty() {
            match self.read_head() {
                Ok(true) => self.out = response(&self.head, answer).into_bytes(),
                Ok(false) => return Step::Wait(Interest::READABLE),
                Err(_) => return Step::Done,
            }
        }
        while self.written < self.out.len() {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => return Step::Done,
                Ok(n) => self.written += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Step::Wait(Interest::WRITABLE),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Done,
            }
        }
        Step::Done
    }

    /// Reads until the socket has nothing more; whether the head is complete. Errors: the peer
    /// closed early, the head is too long, or the read failed.
    fn read_head(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    if self.head.len() + n > MAX_REQUEST_HEAD {
                        return Err(io::ErrorKind::InvalidData.into());
                    }
                    self.head.extend_from_slice(&chunk[..n]);
                    if head_is_answerable(&self.head) {
                        return Ok(true);
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
    }
}

/// Connections the kernel queues for the listener (capped by net.core.somaxconn): clients that
/// connect and say nothing wait there, not in front of the kubelet's next probe.
const BACKLOG: i32 = 4096;

/// Sets the listen backlog to [`BACKLOG`] (listen(2) again on a listening socket only resizes
/// its queue, so this also serves a socket taken from a previous agent).
fn deepen_backlog(listener: &std::net::TcpListener) {
    if let Err(errno) = rustix::net::listen(listener, BACKLOG) {
        log::debug!("the probe listener's backlog stays as it was: {}", io::Error::from(errno));
    }
}

/// Asks the kernel to complete accept only once the request has arrived (TCP_DEFER_ACCEPT):
/// one wake-up per probe instead of one for the handshake and another for the request. Best
/// effort; without it probes are answered all the same.
fn defer_accept(listener: &std::net::TcpListener) {
    if let Err(error) = crate::sys::set_tcp_defer_accept(listener, 1) {
        log::debug!("TCP_DEFER_ACCEPT not set on a probe listener: {}", crate::ErrorChain(&error));
    }
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
