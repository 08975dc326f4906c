//! The agent's container image, built without a registry or a container engine, by
//! `xtask/x.sh image` (the release image) and by lifecycle-testkit (the kubelet tier's image of
//! the test build): both go through [`agent::build`], so the tier runs what operators get.
//!
//! - [`layout`]: packs a root filesystem as a one-layer image in an OCI image-layout tar archive
//!   that also carries docker's `manifest.json`, so `ctr images import`, `docker load`,
//!   `podman load` and `skopeo copy oci-archive:...` all read it. Reproducible: fixed times,
//!   sorted entries, canonical JSON; the same inputs give the same digest.
//! - [`rootfs`]: a minimal root filesystem: a dynamically linked binary, the shared libraries
//!   and loader `ldd` names for it, root's passwd and group entries, the mount points.
//! - [`agent`]: the agent image itself: where the binary goes, entrypoint, default command,
//!   OCI labels.
//!
//! The archives are made with GNU tar, gzip and sha256sum (coreutils), which every machine that
//! builds the agent has; nothing is downloaded.

pub mod agent;
pub mod layout;
pub mod rootfs;
