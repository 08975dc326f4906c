//! The pinned toolchains and bpf-linker, installed on demand and idempotently.
//!
//! The eBPF crate needs a nightly with rust-src (`-Z build-std=core`) and a bpf-linker linked
//! against that same nightly's libLLVM: an LLVM major mismatch fails with "Invalid record". Both
//! are pinned; a second run finds them and installs nothing.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::shell::{capture, run};

/// The stable toolchain that builds the agent and xtask (also pinned in xtask/x.sh).
pub const STABLE: &str = "1.95.0";
/// The nightly that builds the eBPF crate (also pinned in lifecycle-agent/build.rs).
pub const EBPF_NIGHTLY: &str = "nightly-2026-05-20";
/// bpf-linker release, built from crates.io against [`EBPF_NIGHTLY`]'s LLVM.
pub const BPF_LINKER_VERSION: &str = "0.13.0";

/// Installs whatever of the pinned toolchain set is missing.
pub fn ensure() -> Result<()> {
    ensure_nightly()?;
    ensure_bpf_linker()
}

fn rustup() -> Command {
    Command::new("rustup")
}

/// Whether `rustup component list --installed` output lists `name`: printed as `name` for
/// target-independent components such as rust-src, `name-<target>` otherwise. (Only asked for
/// rust-src, rustfmt and clippy, none of which is another component's name plus a dash.)
fn has_component(installed: &str, name: &str) -> bool {
    installed.lines().map(str::trim).any(|line| {
        line == name
            || line.strip_prefix(name).and_then(|rest| rest.strip_prefix('-')).is_some_and(|target| !target.is_empty())
    })
}

/// Adds rustfmt and clippy to the pinned stable toolchain when missing (a clean machine has only
/// the minimal profile, which has neither); the checks tier runs both.
pub fn ensure_stable_lint_components() -> Result<()> {
    let installed = capture(rustup().args(["component", "list", "--installed", "--toolchain", STABLE]))?;
    let missing: Vec<&str> =
        ["rustfmt", "clippy"].into_iter().filter(|name| !has_component(&installed, name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: adding {} to Rust {STABLE}", missing.join(" and "));
    run(rustup().args(["component", "add", "--toolchain", STABLE]).args(&missing))
}

fn ensure_nightly() -> Result<()> {
    let installed = capture(rustup().args(["toolchain", "list"]))?;
    if !installed.lines().any(|line| line.starts_with(EBPF_NIGHTLY)) {
        eprintln!("xtask: installing {EBPF_NIGHTLY} with rust-src");
        run(rustup().args([
            "toolchain",
            "install",
            EBPF_NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--no-self-update",
        ]))?;
        return Ok(());
    }
    let components = capture(rustup().args(["component", "list", "--installed", "--toolchain", EBPF_NIGHTLY]))?;
    if !has_component(&components, "rust-src") {
        eprintln!("xtask: adding rust-src to {EBPF_NIGHTLY}");
        run(rustup().args(["component", "add", "rust-src", "--toolchain", EBPF_NIGHTLY]))?;
    }
    Ok(())
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"))
}

/// Where bpf-linker is installed: `$CARGO_HOME/bin`, which `x.sh` puts on PATH.
pub fn bpf_linker_path() -> PathBuf {
    cargo_home().join("bin").join("bpf-linker")
}

/// A stamp beside the binary recording which nightly's LLVM it links, so a changed pin rebuilds.
fn stamp_path() -> PathBuf {
    cargo_home().join("bin").join(".bpf-linker.lifecycle-stamp")
}

fn wanted_stamp() -> String {
    format!("bpf-linker {BPF_LINKER_VERSION} for {EBPF_NIGHTLY}\n")
}

fn ensure_bpf_linker() -> Result<()> {
    let linker = bpf_linker_path();
    let stamp_ok = std::fs::read_to_string(stamp_path()).is_ok_and(|s| s == wanted_stamp());
    if stamp_ok && linker.exists() && Command::new(&linker).arg("--version").output().is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    let sysroot = capture(Command::new("rustc").arg(format!("+{EBPF_NIGHTLY}")).args(["--print", "sysroot"]))?;
    let sysroot = PathBuf::from(sysroot.trim());
    let verbose = capture(Command::new("rustc").arg(format!("+{EBPF_NIGHTLY}")).arg("-vV"))?;
    let llvm_major = verbose
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc -vV printed no LLVM version")?
        .to_owned();
    // The nightly ships libLLVM as lib/libLLVM-<major>-rust-<version>.so (a linker script).
    let lib_dir = sysroot.join("lib");
    let llvm_lib = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find(|name| name.starts_with(&format!("libLLVM-{llvm_major}-rust-")) && name.ends_with(".so"))
        .with_context(|| format!("{EBPF_NIGHTLY} has no libLLVM-{llvm_major}-rust-*.so in {}", lib_dir.display()))?;
    let llvm_lib = llvm_lib.trim_start_matches("lib").trim_end_matches(".so").to_owned();
    let host =
        verbose.lines().find_map(|line| line.strip_prefix("host: ")).context("rustc -vV printed no host")?.to_owned();
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {EBPF_NIGHTLY}'s LLVM {llvm_major} (~1 min, once)"
    );
    let rustflags =
        format!("-L native={lib} -l dylib={llvm_lib} -C link-arg=-Wl,-rpath,{lib}", lib = lib_dir.display());
    let status = Command::new("cargo")
        .arg(format!("+{STABLE}"))
        .args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}"), "--locked", "--force", "--no-default-features"])
        .args(["--features", &format!("llvm-{llvm_major},no-llvm-linking"), "--target", &host])
        .env("RUSTFLAGS", rustflags)
        .status()
        .context("running cargo install bpf-linker")?;
    if !status.success() {
        bail!("cargo install bpf-linker@{BPF_LINKER_VERSION} failed ({status})");
    }
    std::fs::write(stamp_path(), wanted_stamp()).context("writing the bpf-linker stamp")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::has_component;

    /// `rustup component list --installed` of a minimal-profile toolchain with rust-src added.
    const MINIMAL: &str = "cargo-x86_64-unknown-linux-gnu\nrust-src\nrust-std-x86_64-unknown-linux-gnu\n\
                           rustc-x86_64-unknown-linux-gnu\n";

    #[test]
    fn components_are_matched_by_whole_name() {
        assert!(has_component(MINIMAL, "rust-src"));
        assert!(has_component(MINIMAL, "rustc"));
        assert!(!has_component(MINIMAL, "rustfmt"));
        assert!(!has_component(MINIMAL, "clippy"));
        assert!(!has_component(MINIMAL, "car"));
        let full = format!("{MINIMAL}clippy-x86_64-unknown-linux-gnu\nrustfmt-x86_64-unknown-linux-gnu\n");
        assert!(has_component(&full, "rustfmt"));
        assert!(has_component(&full, "clippy"));
    }
}
