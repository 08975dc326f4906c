//! lifecycle's node agent as a library: the binary in main.rs is a thin CLI over it, and the
//! privileged integration tests drive the same pieces.
//!
//! Layers: [`sensor`] owns the kernel programs (the only aya user); [`event`] decodes records;
//! [`cgroupfs`] and [`cri`] are discovery (cgroupfs, /proc, the runtime's socket). The pure core
//! — [`identity`], [`container_state`], [`backoff`], [`termination`], tied together by
//! [`tracker`] — takes events and times and returns state. [`metrics`] and [`http`] are the
//! surfaces.

pub mod agent;
pub mod backoff;
pub mod cgroupfs;
pub mod container_state;
pub mod cri;
pub mod event;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod probe;
pub mod probe_supervisor;
pub mod sensor;
pub mod status;
pub mod termination;
pub mod tracker;
pub mod unit_metrics;
