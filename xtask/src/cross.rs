//! The kubectl plugin on the laptops kubectl runs on: the checks tier type-checks
//! `kubectl-lifecycle` for `aarch64-apple-darwin` and `x86_64-pc-windows-msvc` with the pinned
//! stable (rustup adds those targets' std; no linker is needed to check), and refuses a
//! Linux-only crate in its dependency tree.
//!
//! A check still runs build scripts, and two dependencies compile C for the target: ring (under
//! rustls) and stacker (under kube's JSONPath parser). Debian's clang compiles both for either
//! target (no SDK: `-nostdlibinc`, with ring's own switch for that, and three one-line stand-ins
//! for SDK headers in `xtask/cross-check/`); what it compiles is never linked. A release build on
//! a Mac or a Windows machine uses their own compilers and SDKs.

use std::path::Path;

use anyhow::{bail, Result};

use crate::{cargo, packages, shell, toolchain, workspace_root};

/// The targets the plugin must build for, with the stand-in headers each needs.
const TARGETS: &[(&str, &str)] = &[("aarch64-apple-darwin", "darwin"), ("x86_64-pc-windows-msvc", "windows")];

/// Crates that exist for Linux only (or for the agent only): none may be in the plugin's tree.
const LINUX_ONLY: &[&str] = &[
    "aya",
    "procfs",
    "rustix",
    "if-addrs",
    "dbus",
    "libdbus-sys",
    "k8s-cri",
    "lifecycle-agent",
    "lifecycle-testkit",
    "nix",
];

/// Debian's clang (and llvm-ar) compile the C of ring and stacker for the two targets.
const PACKAGES: &[&str] = &["clang", "llvm"];

/// `cargo check -p kubectl-lifecycle` for each target, after `cargo tree` shows no Linux-only
/// crate for it.
pub fn check_plugin() -> Result<()> {
    packages::ensure(PACKAGES)?;
    let targets: Vec<&str> = TARGETS.iter().map(|(target, _)| *target).collect();
    toolchain::ensure_stable_targets(&targets)?;
    let root = workspace_root();
    for (target, headers) in TARGETS {
        let tree = shell::capture(cargo().args([
            "tree",
            "-p",
            "kubectl-lifecycle",
            "--target",
            target,
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ]))?;
        let found: Vec<&str> = tree
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| LINUX_ONLY.contains(name))
            .collect();
        if !found.is_empty() {
            bail!("the kubectl plugin's dependencies for {target} include Linux-only crates: {found:?}");
        }
        eprintln!("xtask: cargo check -p kubectl-lifecycle --target {target}");
        let env = target.replace('-', "_");
        let stand_ins = root.join("xtask/cross-check").join(headers);
        let mut check = cargo();
        check
            .args(["check", "-p", "kubectl-lifecycle", "--target", target])
            .env(format!("CC_{env}"), "clang")
            .env(format!("AR_{env}"), "llvm-ar")
            .env(format!("CFLAGS_{env}"), cflags(&stand_ins));
        shell::run(&mut check)?;
    }
    Ok(())
}

/// No system headers (there is no SDK here): clang's own, ring's switch for that, the stand-ins.
fn cflags(stand_ins: &Path) -> String {
    format!("-nostdlibinc -DRING_CORE_NOSTDLIBINC=1 -I{}", stand_ins.display())
}
