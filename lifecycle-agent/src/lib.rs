//! lifecycle's node agent as a library: the binary in `main.rs` is a thin CLI over it, and the
//! privileged integration tests drive the same pieces.
//!
//! The pipeline, one folder per layer (see `docs/architecture.md`):
//! - [`kernel`] (I/O, the only aya user): loads the programs, reads the ring, decodes records
//!   into [`model::event::Event`]s and reads the per-cgroup counter maps.
//! - [`discovery`] (I/O): cgroupfs, the runtime's CRI socket, `/proc`, network namespaces, the
//!   boot-time clock.
//! - [`model`] (pure): identity, runtime metadata, container states, back-off, termination
//!   verdicts and the node's units. Events, metadata and times in; state and verdicts out. It is
//!   the `lifecycle-model` crate, which depends on no I/O crate and on no layer of this one.
//! - [`export`] (pure formatting over a read-only view): Prometheus series and their label
//!   spellings, histograms, the JSON containers view.
//! - [`probe`]: exec-free probes answered from the model's and the kernel's facts.
//! - [`handoff`]: the agent's listening sockets, held by its socket keeper across restarts and
//!   handed from agent to agent, never shared with another process.
//! - [`agent`] (plumbing): the owner loop that ties the layers together, background tasks,
//!   HTTP routes and shutdown.
//! - [`cli`]: the client side of the subcommands (the `status` table).
//! - [`sys`]: the few system calls no well-kept crate wraps (the rest go through rustix, aya
//!   and std), each made once, with errors that name the call.
//!
//! Items are `pub(crate)` unless a binary, an integration test, the testkit, the fuzz targets or
//! xtask uses them. The docs are built with `--document-private-items` (the checks tier), where
//! links from public items to crate-private ones resolve.

// Public docs link to crate-private items on purpose: see above.
#![allow(
    rustdoc::private_intra_doc_links,
    reason = "public docs link to crate-private items on purpose (allow, not expect: rustc, which does not run rustdoc lints, would call the expectation unfulfilled)"
)]

pub mod agent;
pub mod cli;
pub mod discovery;
pub mod export;
pub mod handoff;
pub(crate) mod heartbeats;
pub mod kernel;
pub(crate) mod owner;
pub mod probe;
pub(crate) mod sys;

/// The pure core, its own crate so the compiler keeps it free of I/O (`lifecycle-model`); named
/// `model` here as the layer it is.
pub use lifecycle_model as model;

/// Caps glibc's allocator at two heaps for the whole agent (a no-op on other C libraries); the
/// binary calls it before starting any thread.
///
/// glibc gives each thread that allocates a heap of its own (up to eight per core), so the
/// runtime's workers, its blocking threads and the ring reader each held one, and what was freed
/// in each stayed resident there: with 1,000 units, after ten scrapes and API reads, 6.8 MB
/// anonymous with glibc's default, 6.4 MB with two heaps, 6.3 MB with one (BENCHMARKS.md:
/// memory, 2026-11-27). Two, not one: past the cap, a thread that finds its heap locked takes the
/// other instead of waiting. Small allocations take no heap lock (glibc's per-thread cache).
pub fn limit_malloc_arenas() {
    sys::limit_malloc_arenas(2);
}

/// Displays an error with every cause in its chain, `outer: cause: root`. Errors in this crate
/// name their cause through `#[source]` and not in their own message, so logs print them with
/// this (and the CLI with anyhow's `{:#}`): each cause appears exactly once. Other crates' errors
/// (tonic's, io's inside them) often repeat their source in their own message; a cause whose text
/// is already printed is skipped.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut printed = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !printed.contains(&text) {
                printed.push_str(": ");
                printed.push_str(&text);
            }
            cause = error.source();
        }
        f.write_str(&printed)
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorChain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("call failed: {0}")]
    struct Repeating(#[source] std::io::Error);

    #[test]
    fn every_cause_is_printed_once() {
        let err = Outer(std::io::Error::other("root cause"));
        assert_eq!(ErrorChain(&err).to_string(), "outer: root cause");
        let err = Outer(std::io::Error::other(Repeating(std::io::Error::other("no such file"))));
        assert_eq!(ErrorChain(&err).to_string(), "outer: call failed: no such file");
    }
}
