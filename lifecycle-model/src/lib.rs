//! lifecycle's pure core: kernel events, runtime metadata and times in; container states,
//! back-off and termination verdicts out.
//!
//! No I/O and no clock, by construction: this crate depends on no I/O crate and on none of the
//! agent's layers (`kernel`, `discovery`, `export`, `agent`, `probe` live in `lifecycle-agent`,
//! which depends on this one), and `clippy.toml` beside its manifest refuses std's files,
//! sockets, processes, environment and clocks. Times come in as arguments.

pub mod backoff;
pub mod container_state;
pub mod duration;
pub mod event;
pub mod explain;
pub mod identity;
pub mod kubelet;
pub mod memory;
pub mod metadata;
pub mod node;
pub mod oom;
pub mod probe;
pub mod signal;
pub mod spec;
mod spelling;
pub mod systemd;
pub mod terminal;
pub mod termination;
pub mod time;
pub mod wire;
