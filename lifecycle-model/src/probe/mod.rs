//! Facts the agent's probes read, kept by the node model from the same events as everything
//! else (`node/probed.rs` holds them per probed container): accept progress per listening port
//! of a network namespace, and the main process's state.

pub mod accept;
pub mod process;

pub use accept::{AcceptFacts, AcceptProgress, QueueSample};
pub use process::{ProcessFacts, ProcessSample, ProcessState};
