//! lifecycle's node agent as a library: the binary in main.rs is a thin CLI over it, and the
//! privileged integration tests drive the same pieces.
//!
//! Layers: [`sensor`] owns the kernel programs (the only aya user); [`event`] decodes records;
//! [`cgroupfs`] is the discovery side for cgroups; [`metrics`] and [`http`] are the surfaces.

pub mod backoff;
pub mod cgroupfs;
pub mod container_state;
pub mod cri;
pub mod event;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod sensor;
pub mod termination;
