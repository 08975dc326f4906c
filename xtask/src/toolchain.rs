//! The pinned toolchains and bpf-linker, installed on demand and idempotently.
//!
//! The eBPF crate needs a nightly with rust-src (`-Z build-std=core`) and a bpf-linker linked
//! against that same nightly's libLLVM: an LLVM major mismatch fails with "Invalid record". Both
//! are pinned; a second run finds them and installs nothing.
//!
//! The versions live in `toolchains.env` at the workspace root, embedded here at compile time and
//! parsed by a `const fn`: a missing, repeated or malformed key fails the build of xtask.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::shell::{capture, run};

/// The pin file (`toolchains.env` at the workspace root; x.sh and the agent's build.rs read it too).
const PINS: &str = include_str!("../../toolchains.env");

/// The stable toolchain that builds the agent and xtask.
pub const STABLE: &str = pin(PINS, "RUST_STABLE");
/// The nightly that builds the eBPF crate.
pub const EBPF_NIGHTLY: &str = pin(PINS, "EBPF_NIGHTLY");
/// bpf-linker release, built from crates.io against [`EBPF_NIGHTLY`]'s LLVM.
pub const BPF_LINKER_VERSION: &str = pin(PINS, "BPF_LINKER_VERSION");
/// The Kubernetes release the kubelet tier builds from Debian's source package (`v1.20.2`).
pub const KUBERNETES_VERSION: &str = pin(PINS, "KUBERNETES_VERSION");
/// The Kubernetes release of the current node, built with Go from the module proxy (`v1.37.2`).
pub const KUBERNETES_MODERN_VERSION: &str = pin(PINS, "KUBERNETES_MODERN_VERSION");
/// cargo-fuzz release, installed with [`EBPF_NIGHTLY`] by `xtask fuzz` and the checks tier.
pub const CARGO_FUZZ_VERSION: &str = pin(PINS, "CARGO_FUZZ_VERSION");

/// Why a key could not be read from the pin file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PinError {
    Missing,
    Repeated,
    /// Empty, or a character outside `[A-Za-z0-9._-]` (quotes, spaces, a CR from CRLF endings).
    Malformed,
}

/// The value of `key` in the pin file: the rest of the one line that starts with `key=`. Lines
/// that start otherwise (comments, blank lines, other keys) are skipped.
const fn lookup<'a>(text: &'a str, key: &str) -> Result<&'a str, PinError> {
    let mut rest = text.as_bytes();
    let mut found: Option<&'a [u8]> = None;
    while !rest.is_empty() {
        let mut end = 0;
        while end < rest.len() && rest[end] != b'\n' {
            end += 1;
        }
        let (line, tail) = rest.split_at(end);
        rest = match tail.split_first() {
            Some((_newline, after)) => after,
            None => tail,
        };
        if let Some(value) = strip_key(line, key.as_bytes()) {
            if found.is_some() {
                return Err(PinError::Repeated);
            }
            found = Some(value);
        }
    }
    let Some(value) = found else {
        return Err(PinError::Missing);
    };
    if value.is_empty() {
        return Err(PinError::Malformed);
    }
    let mut i = 0;
    while i < value.len() {
        let byte = value[i];
        if !(byte.is_ascii_alphanumeric() || byte == b'.' || byte == b'-' || byte == b'_') {
            return Err(PinError::Malformed);
        }
        i += 1;
    }
    match std::str::from_utf8(value) {
        Ok(value) => Ok(value),
        Err(_) => Err(PinError::Malformed),
    }
}

/// `line` without its leading `key=`, or None when it does not start with exactly that.
const fn strip_key<'a>(line: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    if line.len() <= key.len() || line[key.len()] != b'=' {
        return None;
    }
    let mut i = 0;
    while i < key.len() {
        if line[i] != key[i] {
            return None;
        }
        i += 1;
    }
    Some(line.split_at(key.len() + 1).1)
}

/// [`lookup`] for the constants above: evaluated at compile time, so a bad pin file is a build
/// error that points at the constant whose key is at fault.
const fn pin(text: &'static str, key: &'static str) -> &'static str {
    match lookup(text, key) {
        Ok(value) => value,
        Err(PinError::Missing) => panic!("toolchains.env lacks this key"),
        Err(PinError::Repeated) => panic!("toolchains.env has this key more than once"),
        Err(PinError::Malformed) => panic!("toolchains.env: this key's value is empty or not [A-Za-z0-9._-]"),
    }
}

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

/// Adds the standard library of `target` to the pinned stable toolchain when missing (the
/// matrix tier cross-builds the agent for aarch64).
pub fn ensure_stable_target(target: &str) -> Result<()> {
    let installed = capture(rustup().args(["target", "list", "--installed", "--toolchain", STABLE]))?;
    if installed.lines().any(|line| line.trim() == target) {
        return Ok(());
    }
    eprintln!("xtask: adding the {target} target to Rust {STABLE}");
    run(rustup().args(["target", "add", "--toolchain", STABLE, target]))
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

/// Adds the std of `targets` to the pinned stable toolchain when missing (the plugin's
/// cross-target check: `cross.rs`).
pub fn ensure_stable_targets(targets: &[&str]) -> Result<()> {
    let installed = capture(rustup().args(["target", "list", "--installed", "--toolchain", STABLE]))?;
    let missing: Vec<&str> =
        targets.iter().copied().filter(|target| !installed.lines().any(|line| line.trim() == *target)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: adding the std of {} to Rust {STABLE}", missing.join(" and "));
    run(rustup().args(["target", "add", "--toolchain", STABLE]).args(&missing))
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

/// `$CARGO_HOME`, or `~/.cargo` when unset (as cargo and rustup resolve it).
pub fn cargo_home() -> PathBuf {
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
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {EBPF_NIGHTLY}'s LLVM {llvm_major} (~30 s, once)"
    );
    let rustflags =
        format!("-L native={lib} -l dylib={llvm_lib} -C link-arg=-Wl,-rpath,{lib}", lib = lib_dir.display());
    // `--debug`: bpf-linker's own code only drives the nightly's LLVM (already optimised), so an
    // unoptimised build links the very same object (same sha256 here) in 1.9 s instead of 1.4 s
    // per eBPF build, and builds in 48 s instead of 95 s (measured side by side on this 2-core
    // machine under load): the larger part of a fresh machine's wait before the agent's build.
    let status = Command::new("cargo")
        .arg(format!("+{STABLE}"))
        .args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}"), "--locked", "--force", "--debug"])
        .arg("--no-default-features")
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
    use super::{has_component, lookup, PinError, BPF_LINKER_VERSION, CARGO_FUZZ_VERSION, EBPF_NIGHTLY, PINS, STABLE};
    use crate::workspace_root;

    /// Dot-separated decimal numbers, `parts` of them.
    fn is_version(text: &str, parts: usize) -> bool {
        let numbers: Vec<&str> = text.split('.').collect();
        numbers.len() == parts && numbers.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    #[test]
    fn the_pin_file_parses_into_plausible_versions() {
        assert_eq!(lookup(PINS, "RUST_STABLE"), Ok(STABLE));
        assert_eq!(lookup(PINS, "EBPF_NIGHTLY"), Ok(EBPF_NIGHTLY));
        assert_eq!(lookup(PINS, "BPF_LINKER_VERSION"), Ok(BPF_LINKER_VERSION));
        assert_eq!(lookup(PINS, "CARGO_FUZZ_VERSION"), Ok(CARGO_FUZZ_VERSION));
        assert!(is_version(STABLE, 3), "RUST_STABLE={STABLE} is not x.y.z");
        assert!(is_version(BPF_LINKER_VERSION, 3), "BPF_LINKER_VERSION={BPF_LINKER_VERSION} is not x.y.z");
        assert!(is_version(CARGO_FUZZ_VERSION, 3), "CARGO_FUZZ_VERSION={CARGO_FUZZ_VERSION} is not x.y.z");
        let date = EBPF_NIGHTLY.strip_prefix("nightly-").unwrap_or_default();
        let fields: Vec<&str> = date.split('-').collect();
        assert!(
            fields.len() == 3 && fields.iter().all(|f| f.bytes().all(|b| b.is_ascii_digit())),
            "EBPF_NIGHTLY={EBPF_NIGHTLY} is not nightly-YYYY-MM-DD"
        );
    }

    #[test]
    fn the_pin_file_is_what_disk_has() {
        // include_str! and the file the shell script and build.rs read are the same file.
        let on_disk = std::fs::read_to_string(workspace_root().join("toolchains.env")).unwrap_or_default();
        assert_eq!(on_disk, PINS);
    }

    #[test]
    fn lookup_takes_whole_keys_at_line_start_once() {
        let text =
            "# RUST_STABLE=0.0.1 in a comment\n\nRUST_STABLE_OLD=1.0.0\n RUST_STABLE=9.9.9\nRUST_STABLE=1.2.3\nLAST=x";
        assert_eq!(lookup(text, "RUST_STABLE"), Ok("1.2.3"));
        assert_eq!(lookup(text, "RUST_STABLE_OLD"), Ok("1.0.0"));
        assert_eq!(lookup(text, "LAST"), Ok("x"), "the last line needs no newline");
        assert_eq!(lookup(text, "RUST"), Err(PinError::Missing));
        assert_eq!(lookup("", "RUST_STABLE"), Err(PinError::Missing));
        assert_eq!(lookup("A=1\nA=1\n", "A"), Err(PinError::Repeated));
        for bad in ["A=\n", "A=\"1.0\"\n", "A=1.0 \n", "A=1.0\r\n", "A=1.0 # comment\n", "A=$(x)\n"] {
            assert_eq!(lookup(bad, "A"), Err(PinError::Malformed), "{bad:?}");
        }
    }

    /// The workspace's declared minimum Rust (Cargo.toml rust-version) must not be newer than the
    /// pinned stable that builds it.
    #[test]
    fn rust_version_is_not_newer_than_the_pinned_stable() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap_or_default();
        let Some(declared) = manifest.lines().find_map(|line| {
            line.trim()
                .strip_prefix("rust-version")?
                .trim()
                .strip_prefix('=')?
                .trim()
                .strip_prefix('"')?
                .strip_suffix('"')
        }) else {
            return; // no rust-version declared: nothing to compare
        };
        let numbers = |v: &str| -> Vec<u64> { v.split('.').map(|n| n.parse().unwrap_or(u64::MAX)).collect() };
        let (declared, pinned) = (numbers(declared), numbers(STABLE));
        assert!(declared[..] <= pinned[..declared.len().min(pinned.len())], "rust-version {declared:?} > {STABLE}");
    }

    /// The scripts and build files that use the pins read them from toolchains.env rather than
    /// repeating them (prose in READMEs may mention versions).
    #[test]
    fn users_of_the_pins_do_not_repeat_them() {
        for path in ["xtask/x.sh", "lifecycle-agent/build.rs", "deploy/Containerfile"] {
            let text = std::fs::read_to_string(workspace_root().join(path)).unwrap_or_default();
            assert!(text.contains("toolchains.env"), "{path} does not read toolchains.env");
            for pinned in [STABLE, EBPF_NIGHTLY] {
                assert!(!text.contains(pinned), "{path} repeats {pinned}; read it from toolchains.env");
            }
        }
    }

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
