//! Test support for lifecycle's privileged integration tests (`lifecycle-agent/tests/`): real
//! cgroups, network namespaces, a loaded sensor, a private containerd driven the way the kubelet
//! drives it, and the agent binary pointed at it. Dev-only: nothing here ships.
//!
//! Every helper owns what it creates and removes it on drop, ending only processes it started,
//! by pid. Helpers that need root or missing tools say why through a `*skip_reason` function;
//! tests print it and return.
//!
//! - [`cgroup`]: fresh v2 cgroups with processes spawned into them; [`require_privileges!`].
//! - [`hub`]: one loaded sensor per test binary and waits on its events.
//! - [`netns`]: named network namespaces and a small runc container.
//! - [`containerd`]: a private containerd with the CRI plugin.
//! - [`agent`]: the `lifecycle-agent run` binary against a [`containerd::Containerd`].
//! - [`bpf`]: the machine's loaded BPF programs (an agent's must go with it).
//! - [`browser`]: headless Chromium on the agent's pages.
//! - [`docs`]: the commands the READMEs show, for tests that check the programs take them.
//! - [`kube`]: a real single-node Kubernetes (etcd, kube-apiserver, containerd, CNI, kubelet)
//!   driven with kubectl.
//! - [`vm`]: qemu guests booting other kernels, with a payload disk in and results out.

pub mod agent;
pub mod bpf;
pub mod browser;
pub mod cgroup;
pub mod containerd;
pub mod docs;
pub mod fixtures;
pub mod hub;
/// The agent's image, as the tiers that run it read it.
pub mod image {
    pub use lifecycle_image::layout::{unpack, Arch};
}
pub mod kube;
pub mod netns;
pub mod vm;
