//! The agent for the arm64 guest: cross-built for aarch64 with the pinned stable toolchain's
//! target and Debian's cross gcc as the linker (named through cargo's per-target environment
//! variables, not a global cargo config, so no other build is affected). The agent's build
//! script builds the eBPF object for it (see lifecycle-agent/build.rs).

use std::path::PathBuf;

use anyhow::{ensure, Result};

use crate::{cargo, shell::run, toolchain, workspace_root};

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's `gcc-aarch64-linux-gnu`, with `libc6-dev-arm64-cross` as its sysroot.
const GCC: &str = "aarch64-linux-gnu-gcc";
const AR: &str = "aarch64-linux-gnu-ar";

/// Builds `lifecycle-agent` (debug, as the amd64 guests' is) for aarch64; returns its path.
pub fn agent() -> Result<PathBuf> {
    toolchain::ensure_stable_target(TARGET)?;
    run(cargo()
        .args(["build", "-p", "lifecycle-agent", "--bin", "lifecycle-agent", "--target", TARGET])
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", GCC)
        // Build scripts that compile C for the target (cc crate).
        .env("CC_aarch64_unknown_linux_gnu", GCC)
        .env("AR_aarch64_unknown_linux_gnu", AR))?;
    let binary = workspace_root().join("target").join(TARGET).join("debug/lifecycle-agent");
    ensure!(binary.is_file(), "cargo built no {}", binary.display());
    Ok(binary)
}
