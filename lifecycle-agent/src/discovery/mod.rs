//! Discovery: what the node says about itself, read through its files and sockets. Everything
//! here does I/O; the model never imports it.
//!
//! - [`cgroupfs`]: the cgroup v2 mount, paths and ids.
//! - [`cri`]: the container runtime's CRI socket (names, pods, spec annotations).
//! - [`kube`]: the Kubernetes API: this node's pods (spec and reported status) and their events.
//! - [`kubelet`]: the kubelet's process: its command line and configuration files.
//! - [`proc`]: /proc: processes at start, and what the probes sample of a process.
//! - [`sockdiag`]: listeners and backlogs of a network namespace over NETLINK_SOCK_DIAG.
//! - [`netns`]: running a piece of work inside another network namespace.
//! - [`clock`]: the boot-time clock the kernel stamps events with.
//! - [`memory`]: a container's memory files (`memory.events`, PSI; v1's `oom_kill` on a hybrid host).
//! - [`kmsg`]: the kernel log's account of OOM kills (which memory limit fired).
//! - [`systemd`]: a systemd unit's stop and restart settings, over D-Bus.

pub mod cgroupfs;
pub mod clock;
pub mod cri;
pub(crate) mod kmsg;
pub mod kube;
pub(crate) mod kubelet;
pub(crate) mod memory;
pub(crate) mod netns;
pub mod proc;
pub(crate) mod sockdiag;
pub(crate) mod systemd;
