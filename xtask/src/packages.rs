//! Debian packages the tiers need, installed when missing (apt-get update runs at most once).

use std::process::Command;

use anyhow::Result;

use crate::shell::run;

/// Needed to build the agent at all (the CRI protos are compiled by protoc).
pub const BUILD: &[&str] = &["protobuf-compiler"];
/// The real components the test tiers drive.
pub const TEST: &[&str] =
    &["protobuf-compiler", "runc", "containerd", "busybox-static", "prometheus", "iproute2", "python3-venv"];
/// libFuzzer is C++, compiled by libfuzzer-sys's build script.
pub const FUZZ: &[&str] = &["g++"];
/// The runtime tier renders the agent's `explain` pages in a real browser (headless), with a
/// font for its text.
pub const PAGES: &[&str] = &["chromium", "fonts-dejavu-core"];
/// The kubelet tier's node: etcd, the CNI plugins (bridge, host-local, loopback), openssl for the
/// API server's service-account key, and the runtime the other tiers use too.
pub const KUBELET: &[&str] =
    &["etcd-server", "containernetworking-plugins", "openssl", "containerd", "runc", "busybox-static", "iproute2"];
/// The modern tier's node takes etcd, containerd, runc and the CNI plugins from
/// `kubernetes_modern`'s cache; from Debian: openssl (service-account key), busybox-static (the
/// image), iproute2.
pub const MODERN: &[&str] = &["openssl", "busybox-static", "iproute2"];
/// Building kube-apiserver and kubelet from Debian's source package (`kubernetes.rs`).
pub const KUBERNETES_BUILD: &[&str] = &["golang-go", "dpkg-dev", "rsync", "make"];
/// Building runc for the current node (`kubernetes_modern/`): cgo (its nsenter is C) linked
/// against the machine's libseccomp, as Debian's own runc is.
pub const KUBERNETES_MODERN_BUILD: &[&str] = &["gcc", "libc6-dev", "libseccomp-dev", "pkg-config"];
/// The kernel matrix: qemu for both architectures (TCG), debootstrap for the amd64 guests' root
/// filesystem, e2fsprogs for images made and read without mounting them, the aarch64 cross
/// linker and C library for the arm64 agent, busybox-static for the containerd image.
pub const MATRIX: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-arm",
    "debootstrap",
    "e2fsprogs",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "busybox-static",
];
/// kubectl, when the machine has none on PATH (Debian's build of the same Kubernetes release).
pub const KUBECTL: &[&str] = &["kubernetes-client"];
/// Peers and tools the benchmarks compare against.
pub const BENCH: &[&str] =
    &["bpftrace", "bpftool", "runc", "busybox-static", "iproute2", "protobuf-compiler", "containerd", "wrk"];

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"ii"))
}

/// Installs the packages that are not installed yet; does nothing when all are.
pub fn ensure(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]).env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}
