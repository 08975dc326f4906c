//! The pod probe listeners' serving loop: one thread running one small `mio` event loop for
//! every pod's listener on the node, so no client can delay another (issue 10) and a node with
//! a hundred probed pods runs one thread for them, not a hundred. Each listening socket keeps the
//! network namespace it was bound in (`server::bind_in_netns`): the loop's thread never changes
//! namespace.
//!
//! Probes are one GET each on a fresh connection (the kubelet disables keep-alive): the loop
//! accepts without blocking, drops sources the [`SourceFilter`] does not allow, and answers a
//! connection as soon as its request head is complete, then closes it. With TCP_DEFER_ACCEPT the
//! kernel completes the accept only once the request has arrived, so the usual probe costs one
//! wake-up, `accept4`, `read`, `write` and `close` — as cheap as the blocking thread it replaced
//! (that design was measured 2x cheaper than hyper on the tokio runtime), and nothing is
//! registered with epoll for it. Only a connection whose head is incomplete is kept, registered,
//! and given [`ListenerLimits::head_deadline`] to finish; at most
//! [`ListenerLimits::max_connections`] are kept at once per listener. Past that bound a new
//! connection still gets one read: answered if its request is all there, else it takes the place
//! of that listener's connection kept longest. Every connection closed without an answer is
//! counted by reason.
//!
//! Fairness between pods: a wake-up accepts at most [`ACCEPTS_PER_TURN`] connections from one
//! listener, then serves the others; a listener with more waiting gets another turn at once (the
//! poll does not sleep while one has). A pod whose listener is flooded (by itself, or by anyone
//! on a node address) costs the others at most one turn's work per wake-up.

use std::{
    io::{self, Read as _},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use parking_lot::Mutex;

use mio::{net::TcpStream, Events, Interest, Poll, Token, Waker};

use super::{
    metrics::ConnectionCounters,
    rates::{Rate, SourceRates},
    server::{head_is_answerable, response, ProbeAnswer, ServerError, MAX_REQUEST_HEAD},
    source::SourceFilter,
};

/// Time a connection has to deliver its request head (and take its answer) before it is closed:
/// well under the kubelet's default 1 s probe timeout.
pub(crate) const HEAD_DEADLINE: Duration = Duration::from_millis(250);
/// Connections a listener keeps open at once (each waiting for the rest of its request head).
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Connections accepted from one listener before the others get their turn.
pub(crate) const ACCEPTS_PER_TURN: usize = 16;
/// How often one source may have a connection kept waiting for the rest of its head, per
/// listener, once half its places are taken: far above what a client that sends its request
/// at once ever needs (none), and a bound on how fast one source can take the places of
/// others.
pub(crate) const KEEP_RATE: Rate = Rate { per_second: 16.0, burst: 32.0 };

/// Listener tokens start here; connection tokens are their slots, below it.
const LISTENER_BASE: usize = 1 << 32;
const WAKER: Token = Token(usize::MAX);

/// Bounds of one listener.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ListenerLimits {
    pub head_deadline: Duration,
    pub max_connections: usize,
    /// How often one source may have a connection kept once half the places are taken (see
    /// [`KEEP_RATE`]); past it, a connection that would have to be kept is closed
    /// (`reason="rate"`). A complete request is answered whatever its source's rate.
    pub keep_rate: Rate,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self { head_deadline: HEAD_DEADLINE, max_connections: MAX_CONNECTIONS, keep_rate: KEEP_RATE }
    }
}

/// What a [`ProbeListeners`] loop is asked to do, between two wake-ups.
enum Command {
    Serve {
        id: usize,
        listener: Box<Served>,
    },
    /// Close a listener and its connections, then say so.
    Close {
        id: usize,
        closed: mpsc::SyncSender<()>,
    },
}

/// The loop's side of the handles: commands, and the waker that makes it read them.
struct Control {
    /// None once the loop has stopped: a command then has no one to run it (and a handle does
    /// not wait for an answer that cannot come).
    commands: Mutex<Option<Vec<Command>>>,
    waker: Waker,
    stop: AtomicBool,
}

impl Control {
    /// Queues `command` for the loop; false if the loop has stopped.
    fn send(&self, command: Command) -> bool {
        match self.commands.lock().as_mut() {
            Some(queue) => queue.push(command),
            None => return false,
        }
        if let Err(err) = self.waker.wake() {
            log::warn!("cannot wake the probe listeners' loop: {err}");
        }
        true
    }
}

/// Ends the loop's side of [`Control`] when the loop's thread ends, returning or unwinding.
struct Stopped(Arc<Control>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.commands.lock().take();
    }
}

/// One thread serving any number of probe listeners (see the module header). Dropping it stops
/// the thread, which closes every listener and connection it still has.
pub(crate) struct ProbeListeners {
    control: Arc<Control>,
    next_id: std::sync::atomic::AtomicUsize,
    thread: Option<JoinHandle<()>>,
    limits: ListenerLimits,
}

impl ProbeListeners {
    /// Starts the loop's thread; each listener it serves has `limits`.
    pub(crate) fn start(limits: ListenerLimits) -> Result<Self, ServerError> {
        let poll = Poll::new().map_err(ServerError::Start)?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(ServerError::Start)?;
        let control = Arc::new(Control { commands: Mutex::new(Some(Vec::new())), waker, stop: AtomicBool::new(false) });
        let mut serving = Loop { poll, control: control.clone(), limits, listeners: Vec::new(), slots: Vec::new() };
        let thread = std::thread::Builder::new()
            .name("probe-listeners".into())
            .spawn(move || {
                // However the loop ends, what is still queued is dropped, so no handle waits on it.
                let _stopped = Stopped(serving.control.clone());
                serving.run();
            })
            .map_err(ServerError::Start)?;
        Ok(Self { control, next_id: 0.into(), thread: Some(thread), limits })
    }

    /// Serves `listener` with `answer`, letting in only what `sources` allows, until the
    /// returned handle is dropped.
    pub(crate) fn serve(
        &self,
        listener: std::net::TcpListener,
        answer: Arc<dyn ProbeAnswer>,
        sources: SourceFilter,
        counters: ConnectionCounters,
    ) -> Result<ProbeListener, ServerError> {
        #[cfg(test)]
        let local = listener.local_addr().map_err(ServerError::Start)?;
        listener.set_nonblocking(true).map_err(ServerError::Start)?;
        defer_accept(&listener);
        deepen_backlog(&listener);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let served = Served {
            listener: mio::net::TcpListener::from_std(listener),
            answer,
            sources,
            counters,
            rates: SourceRates::new(self.limits.keep_rate),
            open: 0,
            more_waiting: false,
        };
        if !self.control.send(Command::Serve { id, listener: Box::new(served) }) {
            return Err(ServerError::Start(io::Error::other("the probe listeners' loop has stopped")));
        }
        Ok(ProbeListener {
            #[cfg(test)]
            local,
            id,
            control: self.control.clone(),
            own_loop: None,
        })
    }
}

impl Drop for ProbeListeners {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        if let Err(err) = self.control.waker.wake() {
            log::warn!("cannot wake the probe listeners' loop to stop it: {err}");
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One listener served by a [`ProbeListeners`] loop. Dropping it (or [`ProbeListener::stop`])
/// closes the socket and every open connection of it before it returns.
pub struct ProbeListener {
    #[cfg(test)]
    local: std::net::SocketAddr,
    id: usize,
    control: Arc<Control>,
    /// The loop this listener alone is served by ([`ProbeListener::start`]).
    own_loop: Option<ProbeListeners>,
}

impl ProbeListener {
    /// Serves `listener` on a loop of its own (a tool, a test, the bench): the agent serves its
    /// pods' listeners on one shared [`ProbeListeners`].
    pub fn start(
        listener: std::net::TcpListener,
        answer: Arc<dyn ProbeAnswer>,
        sources: SourceFilter,
        counters: ConnectionCounters,
        limits: ListenerLimits,
    ) -> Result<Self, ServerError> {
        let own = ProbeListeners::start(limits)?;
        let mut served = own.serve(listener, answer, sources, counters)?;
        served.own_loop = Some(own);
        Ok(served)
    }

    /// The address the listener is bound to.
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }

    /// Stops accepting and closes every connection.
    pub fn stop(self) {}
}

impl Drop for ProbeListener {
    fn drop(&mut self) {
        let (closed, done) = mpsc::sync_channel(1);
        // The loop answers at its next wake-up; one that stopped has closed everything, and
        // drops the command (the answer is then an error at once).
        if self.control.send(Command::Close { id: self.id, closed }) {
            let _ = done.recv();
        }
        // Then its own loop, if it has one, stops.
        self.own_loop.take();
    }
}

/// One listener in the loop.
struct Served {
    listener: mio::net::TcpListener,
    answer: Arc<dyn ProbeAnswer>,
    sources: SourceFilter,
    counters: ConnectionCounters,
    /// How often each source has had a connection kept.
    rates: SourceRates,
    /// Its connections kept open.
    open: usize,
    /// Its turn's accepts ran out before the kernel's queue did: it gets another turn at once.
    more_waiting: bool,
}

/// The serving thread's state.
struct Loop {
    poll: Poll,
    control: Arc<Control>,
    limits: ListenerLimits,
    /// Listeners by index (their token is `LISTENER_BASE + index`), with their ids.
    listeners: Vec<Option<(usize, Served)>>,
    /// Connections waiting for the rest of their request head (or for room to write the answer),
    /// with their listener's index; the index is the connection's token.
    slots: Vec<Option<(usize, Connection)>>,
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let more_waiting = self.listeners.iter().flatten().any(|(_, l)| l.more_waiting);
            let timeout = match more_waiting {
                true => Some(Duration::ZERO),
                false => self.next_deadline().map(|d| d.saturating_duration_since(Instant::now())),
            };
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() != io::ErrorKind::Interrupted {
                    log::warn!("the probe listeners' poll failed: {err}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if self.control.stop.load(Ordering::Acquire) {
                return;
            }
            for event in &events {
                match event.token() {
                    WAKER => self.run_commands(),
                    Token(t) if t >= LISTENER_BASE => {
                        if let Some(Some((_, listener))) = self.listeners.get_mut(t - LISTENER_BASE) {
                            listener.more_waiting = true;
                        }
                    }
                    Token(slot) => self.advance(slot),
                }
            }
            // Every listener with connections waiting takes one turn.
            for index in 0..self.listeners.len() {
                if self.listeners[index].as_ref().is_some_and(|(_, l)| l.more_waiting) {
                    self.accept_turn(index);
                }
            }
            self.expire(Instant::now());
        }
    }

    fn run_commands(&mut self) {
        let commands = match self.control.commands.lock().as_mut() {
            Some(queue) => std::mem::take(queue),
            None => return,
        };
        for command in commands {
            match command {
                Command::Serve { id, listener } => self.add(id, *listener),
                Command::Close { id, closed } => {
                    self.remove(id);
                    let _ = closed.send(());
                }
            }
        }
    }

    fn add(&mut self, id: usize, mut served: Served) {
        let index = match self.listeners.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.listeners.push(None);
                self.listeners.len() - 1
            }
        };
        match self.poll.registry().register(&mut served.listener, Token(LISTENER_BASE + index), Interest::READABLE) {
            Ok(()) => {
                // Connections queued before it was registered raise no event: look at once.
                served.more_waiting = true;
                self.listeners[index] = Some((id, served));
            }
            Err(err) => log::warn!("cannot serve a probe listener: {err}"),
        }
    }

    fn remove(&mut self, id: usize) {
        let Some(index) = self.listeners.iter().position(|l| l.as_ref().is_some_and(|(known, _)| *known == id)) else {
            return;
        };
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|(owner, _)| *owner == index) {
                self.close(slot);
            }
        }
        if let Some((_, mut served)) = self.listeners[index].take() {
            let _ = self.poll.registry().deregister(&mut served.listener);
        }
    }

    /// Accepts at most [`ACCEPTS_PER_TURN`] connections of listener `index`.
    fn accept_turn(&mut self, index: usize) {
        for _ in 0..ACCEPTS_PER_TURN {
            let Some((_, served)) = self.listeners[index].as_mut() else { return };
            let (stream, peer) = match served.listener.accept() {
                Ok(accepted) => accepted,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    served.more_waiting = false;
                    return;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                // A client that reset before the accept: nothing to do.
                Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(err) => {
                    // EMFILE and friends: leave the rest queued; the next connection retries.
                    log::warn!("accept on a probe listener failed: {err}");
                    served.more_waiting = false;
                    return;
                }
            };
            if !served.sources.allows(peer.ip()) {
                served.counters.source.inc();
                continue;
            }
            let now = Instant::now();
            let mut connection = Connection::new(stream, now + self.limits.head_deadline);
            let Step::Wait(interest) = connection.advance_guarded(served.answer.as_ref()) else { continue };
            // Only what is kept is rated, and only once half the places are taken: a request
            // that came whole was answered above, and a client whose head comes in pieces is
            // not held back while places are plenty.
            let pressed = served.open >= self.limits.max_connections / 2;
            if pressed && !served.rates.admit(peer.ip(), now) {
                served.counters.rate.inc();
                continue;
            }
            if served.open >= self.limits.max_connections {
                // Full: the connection kept longest makes room. A real client (the kubelet)
                // sends its whole request at once, so the newest is the likeliest to be one;
                // refusing newcomers instead let anyone on a node address who holds 64
                // connections fail every probe of the pod (issue 18).
                served.counters.busy.inc();
                self.evict_oldest(index);
            }
            self.keep(index, connection, interest);
        }
    }

    /// Registers a connection of listener `index` that has to wait and keeps it in a free slot.
    fn keep(&mut self, index: usize, mut connection: Connection, interest: Interest) {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        match self.poll.registry().register(&mut connection.stream, Token(slot), interest) {
            Ok(()) => {
                connection.interest = interest;
                self.slots[slot] = Some((index, connection));
                if let Some((_, served)) = self.listeners[index].as_mut() {
                    served.open += 1;
                }
            }
            Err(err) => log::warn!("cannot register a probe connection: {err}"),
        }
    }

    fn advance(&mut self, slot: usize) {
        let Some((index, connection)) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        let Some((_, served)) = self.listeners.get(*index).and_then(Option::as_ref) else { return };
        match connection.advance_guarded(served.answer.as_ref()) {
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

    /// Closes listener `index`'s connection with the earliest deadline (the one kept longest).
    fn evict_oldest(&mut self, index: usize) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, kept)| {
                kept.as_ref().filter(|(owner, _)| *owner == index).map(|(_, c)| (c.deadline, slot))
            })
            .min()
            .map(|(_, slot)| slot);
        if let Some(slot) = oldest {
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some((index, mut connection)) = self.slots.get_mut(slot).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut connection.stream);
            if let Some((_, served)) = self.listeners.get_mut(index).and_then(Option::as_mut) {
                served.open -= 1;
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|(_, c)| c.deadline).min()
    }

    /// Closes the connections whose deadline has passed.
    fn expire(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            let Some((index, connection)) = self.slots[slot].as_ref() else { continue };
            if connection.deadline <= now {
                if let Some((_, served)) = self.listeners.get(*index).and_then(Option::as_ref) {
                    served.counters.timeout.inc();
                }
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

    /// [`Self::advance`], where a panic (a bug an input found) closes this connection only: the
    /// loop serves every pod's listener, and one pod's client must not end the others' probes.
    fn advance_guarded(&mut self, answer: &dyn ProbeAnswer) -> Step {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.advance(answer))) {
            Ok(step) => step,
            Err(_) => {
                log::error!("answering a probe connection panicked; the connection is closed");
                Step::Done
            }
        }
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
            // MSG_MORE holds the answer back until the close that follows, which then sends it
            // and the FIN in one segment: one packet for the client's kernel to take in, not two.
            match rustix::net::send(&self.stream, &self.out[self.written..], rustix::net::SendFlags::MORE) {
                Ok(0) => return Step::Done,
                Ok(n) => self.written += n,
                Err(rustix::io::Errno::AGAIN) => return Step::Wait(Interest::WRITABLE),
                Err(rustix::io::Errno::INTR) => {}
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
