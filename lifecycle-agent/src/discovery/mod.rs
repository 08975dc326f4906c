//! Discovery: what the node says about itself, read through its files and sockets. Everything
//! here does I/O; the model never imports it.
//!
//! - [`cgroupfs`]: the cgroup v2 mount, paths and ids.
//! - [`cri`]: the container runtime's CRI socket (names, pods, spec annotations).

pub mod cgroupfs;
pub mod cri;
