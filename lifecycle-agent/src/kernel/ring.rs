//! Draining the ring buffer.
//!
//! The kernel wakes the reader only once `wakeup_bytes` wait (per-record wake-ups cost 12-22% on
//! an exec/exit loop), so the reader also polls on a short timer: a quiet node still sees each
//! record within one poll period, a busy one is drained in batches.

use std::{os::fd::BorrowedFd, time::Duration};

use aya::maps::{MapData, RingBuf};
use tokio::io::{unix::AsyncFd, Interest};

use super::decode::{decode, DecodeError};
use crate::model::event::Event;

/// Why reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The ring's file descriptor could not be registered with the runtime.
    #[error("cannot watch the event ring")]
    Register(#[source] std::io::Error),
    /// Waiting for readiness failed.
    #[error("waiting on the event ring failed")]
    Wait(#[source] std::io::Error),
}

/// Records from the kernel, decoded.
pub struct EventStream {
    ring: RingBuf<MapData>,
    decode_errors: u64,
}

impl EventStream {
    pub(super) fn new(ring: RingBuf<MapData>) -> Self {
        Self { ring, decode_errors: 0 }
    }

    /// Records that could not be decoded (unknown kind or short record); never expected, counted
    /// rather than dropped silently.
    pub(crate) fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// Moves every record waiting now into `out`, without blocking. Returns how many were read.
    pub fn drain_into(&mut self, out: &mut Vec<Event>) -> usize {
        let mut read = 0;
        while let Some(item) = self.ring.next() {
            read += 1;
            match decode(&item) {
                Ok(event) => out.push(event),
                Err(DecodeError::UnknownKind(_) | DecodeError::Short { .. }) => self.decode_errors += 1,
            }
        }
        read
    }

    /// Blocks until the kernel wakes the reader (or records wait already), `stop` is readable,
    /// or `timeout` passes; the caller then drains and checks its own stop flag.
    pub(crate) fn wait(&self, stop: BorrowedFd<'_>, timeout: Duration) -> Result<(), StreamError> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.ring, PollFlags::IN), PollFd::new(&stop, PollFlags::IN)];
        let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(errno) => Err(StreamError::Wait(errno.into())),
        }
    }

    /// Turns the stream into an async one that yields batches: on a kernel wake-up or every
    /// `poll`, whichever comes first.
    pub fn into_async(self, poll: Duration) -> Result<AsyncEventStream, StreamError> {
        // SAFETY: the fd is the ring map's, owned by the RingBuf inside `self`, which the AsyncFd
        // owns in turn: it stays open and unchanged for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(self, Interest::READABLE) }
            .map_err(|err| StreamError::Register(err.into()))?;
        let mut ticker = tokio::time::interval(poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(AsyncEventStream { fd, ticker })
    }
}

impl std::os::fd::AsRawFd for EventStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }
}

/// [`EventStream`] driven by tokio.
pub struct AsyncEventStream {
    fd: AsyncFd<EventStream>,
    ticker: tokio::time::Interval,
}

impl AsyncEventStream {
    /// Waits until at least one record is available (or a poll tick passes) and moves what is
    /// waiting into `out`. May return with `out` unchanged after an empty tick.
    pub async fn next_batch(&mut self, out: &mut Vec<Event>) -> Result<usize, StreamError> {
        tokio::select! {
            guard = self.fd.readable_mut() => {
                let mut guard = guard.map_err(StreamError::Wait)?;
                let read = guard.get_inner_mut().drain_into(out);
                guard.clear_ready();
                Ok(read)
            }
            _ = self.ticker.tick() => Ok(self.fd.get_mut().drain_into(out)),
        }
    }
}
