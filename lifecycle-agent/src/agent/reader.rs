//! The ring reader: a thread of its own, the model's owner (`owner.rs`), that waits on the
//! kernel's ring, the commands queued by the agent's loops, or the poll period; hands each
//! batch of events and each command to the model, and publishes a snapshot.
//!
//! Not a tokio task: a wake-up from the kernel reaches this thread directly. As a task it came
//! through the runtime's I/O driver, which only a worker with nothing else to do polls, and then
//! a second thread hop; HTTP load on the workers could hold a container's exit back.

use std::{
    os::fd::{AsFd as _, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use prometheus::Histogram;
use tokio::sync::oneshot;

use crate::{
    discovery::clock::boottime_ns,
    export::metrics::AgentCounters,
    heartbeats::{Heartbeats, Loop},
    kernel::{EventStream, SensorMaps, StreamError},
    model::{
        event::{Detail, Event},
        node::Command,
        time::{seconds, BootTime},
    },
    owner::Owner,
};

/// Everything a batch of events feeds.
pub(super) struct Reader {
    pub(super) owner: Owner,
    pub(super) maps: Arc<SensorMaps>,
    /// `lifecycle_event_to_state_seconds`.
    pub(super) latency: Histogram,
    pub(super) counters: Arc<AgentCounters>,
    /// Beaten on every pass, so `/healthz` tells a stuck reader (`health.rs`).
    pub(super) heartbeats: Arc<Heartbeats>,
}

/// A started reader; [`Running::stop`] ends it and hands the stream back (to be dropped before
/// the sensor).
pub(super) struct Running {
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    done: oneshot::Receiver<Result<EventStream, StreamError>>,
}

impl Reader {
    /// Starts the reading thread: it drains on every kernel wake-up and at least every `poll`.
    pub(super) fn start(self, stream: EventStream, poll: Duration) -> std::io::Result<Running> {
        let wake = self.owner.wake_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let (sender, done) = oneshot::channel();
        let (thread_stop, thread_wake) = (stop.clone(), wake.clone());
        std::thread::Builder::new().name("ring-reader".into()).spawn(move || {
            raise_priority();
            let result = self.run(stream, poll, &thread_stop, &thread_wake);
            let _ = sender.send(result);
        })?;
        Ok(Running { stop, wake, done })
    }

    fn run(
        mut self,
        mut stream: EventStream,
        poll: Duration,
        stop: &AtomicBool,
        wake: &OwnedFd,
    ) -> Result<EventStream, StreamError> {
        let mut batch: Vec<Event> = Vec::with_capacity(1024);
        let mut publish_in: Option<Duration> = None;
        loop {
            stream.wait(wake.as_fd(), publish_in.map_or(poll, |due| due.min(poll)))?;
            if stop.load(Ordering::Acquire) {
                return Ok(stream);
            }
            self.owner.clear_wake();
            self.heartbeats.beat(Loop::RingReader);
            // Queued commands first: a container's metadata or pod spec queued before its exit
            // is there when the exit is judged.
            self.owner.run_queued();
            let mut ended = Vec::new();
            if stream.drain_into(&mut batch) > 0 {
                self.counters.events_read.fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.counters.decode_errors.store(stream.decode_errors(), Ordering::Relaxed);
                let maps = &self.maps;
                let commands = batch.drain(..).flat_map(|event| {
                    // The kernel's counts of a departing cgroup move to its unit before its map
                    // entry is freed for reuse.
                    let departing = match &event.detail {
                        Detail::CgroupRmdir(c) => maps
                            .take_counters(c.id)
                            .map(|counters| Command::DepartingCounters { cgroup_id: c.id, counters }),
                        _ => None,
                    };
                    departing.into_iter().chain([Command::Event(event)])
                });
                ended = self.owner.handle_all(commands, BootTime::from_ns(boottime_ns()));
            }
            publish_in = self.owner.publish();
            // The exits that ended a container (or a host unit's run): their state is in the
            // published snapshot now.
            let now = BootTime::from_ns(boottime_ns());
            for ended in &ended {
                self.latency.observe(seconds(now.since(ended.exit)));
            }
        }
    }
}

/// The reader thread's nice value. Its work per wake-up is tens of microseconds, but on a busy node
/// it waited for a CPU behind the HTTP workers (answering the API's and the scrapes' clients,
/// whom it must not wait for): `bench latency`'s own polling put most of the exit -> published
/// tail in that wait (BENCHMARKS.md: exit -> API). A higher weight lets the scheduler run it as it
/// wakes. In a pod the nice value orders it among the agent's own threads (the pod's CPU weight
/// and limit stay as they were), and what it reads is bounded by the kernel's per-cgroup rate
/// limits, so a pod flooding records gets no more of the node's CPU than before.
const READER_NICE: i32 = -10;

/// Gives the calling thread (the reader) [`READER_NICE`]. Without CAP_SYS_NICE (an agent run
/// unprivileged) it keeps the default, said once in the log.
fn raise_priority() {
    let thread = rustix::thread::gettid();
    if let Err(errno) = rustix::process::setpriority_process(Some(thread), READER_NICE) {
        log::info!(
            "the ring reader keeps the default scheduling priority (setpriority: {}); a busy node may delay its states",
            std::io::Error::from(errno)
        );
    }
}

impl Running {
    /// Waits until the reader fails; pending forever while it reads.
    pub(super) async fn failed(&mut self) -> StreamError {
        match (&mut self.done).await {
            Ok(Err(error)) => error,
            // It only returns Ok when stopped, and it is not stopped while this waits; a thread
            // that ended without sending panicked.
            Ok(Ok(_)) | Err(_) => StreamError::Wait(std::io::Error::other("the ring reader thread ended")),
        }
    }

    /// Stops the reader and returns the stream (None if the thread had already ended).
    pub(super) async fn stop(self) -> Option<EventStream> {
        self.stop.store(true, Ordering::Release);
        // An eventfd counts what is written to it: one wakes the reader's poll. It cannot fail
        // short of the counter's overflow, and the reader is stopped by the flag either way.
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        self.done.await.ok().and_then(Result::ok)
    }
}
