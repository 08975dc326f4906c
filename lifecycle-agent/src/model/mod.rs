//! The pure core: kernel events, runtime metadata and times in; container states, back-off and
//! termination verdicts out. No I/O, no clock, and no imports from the crate's I/O layers
//! (`kernel`, `discovery`, `export`, `agent`, `probe`): `layering.rs` enforces that in the unit tier.

pub mod backoff;
pub mod container_state;
pub mod duration;
pub mod event;
pub mod identity;
#[cfg(test)]
mod layering;
pub mod metadata;
pub mod node;
pub mod oom;
pub mod spec;
pub mod termination;
