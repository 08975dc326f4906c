//! The agent for another Linux architecture than this machine's (arm64 on amd64, amd64 on arm64):
//! built with the pinned stable toolchain's target and Debian's cross gcc as the linker, named
//! through cargo's per-target environment variables (not a global cargo config, so no other build
//! is affected), with the target's C library from Debian's cross packages. The agent's build
//! script embeds the checked-in eBPF object, which serves both architectures
//! (lifecycle-agent/build/ebpf_object.rs).

use std::path::PathBuf;

use anyhow::{ensure, Result};
use lifecycle_image::layout::Arch;

use crate::{cargo, packages, shell::run, toolchain, workspace_root};

/// The Rust target of `arch`.
pub fn target(arch: Arch) -> String {
    format!("{}-unknown-linux-gnu", arch.rust_name())
}

/// Debian's cross gcc and C library for `arch`, as packages and as the gcc's name prefix.
fn toolchain_packages(arch: Arch) -> (&'static [&'static str], &'static str) {
    match arch {
        Arch::Arm64 => (&["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"], "aarch64-linux-gnu"),
        Arch::Amd64 => (&["gcc-x86-64-linux-gnu", "libc6-dev-amd64-cross"], "x86_64-linux-gnu"),
    }
}

/// Builds `lifecycle-agent` for `arch` (release, or debug); returns the binary's path.
pub fn agent(arch: Arch, release: bool) -> Result<PathBuf> {
    build(arch, "lifecycle-agent", "lifecycle-agent", release)
}

/// Builds the kubectl plugin for `arch` in release mode; returns the binary's path.
pub fn plugin(arch: Arch) -> Result<PathBuf> {
    build(arch, "kubectl-lifecycle", "kubectl-lifecycle", true)
}

/// Builds `bin` of `package` for `arch`, installing the target's standard library and the cross
/// toolchain first; returns the binary's path.
fn build(arch: Arch, package: &str, bin: &str, release: bool) -> Result<PathBuf> {
    let target = target(arch);
    let (debs, prefix) = toolchain_packages(arch);
    packages::ensure(debs)?;
    toolchain::ensure_stable_target(&target)?;
    let gcc = format!("{prefix}-gcc");
    let env_target = target.replace('-', "_");
    let mut command = cargo();
    command
        .args(["build", "-p", package, "--bin", bin, "--target", &target])
        .env(format!("CARGO_TARGET_{}_LINKER", env_target.to_uppercase()), &gcc)
        // Build scripts that compile C for the target (the cc crate: libdbus, ring).
        .env(format!("CC_{env_target}"), &gcc)
        .env(format!("AR_{env_target}"), format!("{prefix}-ar"));
    if release {
        command.arg("--release");
    }
    run(&mut command)?;
    let profile = if release { "release" } else { "debug" };
    let binary = workspace_root().join("target").join(&target).join(profile).join(bin);
    ensure!(binary.is_file(), "cargo built no {}", binary.display());
    Ok(binary)
}
