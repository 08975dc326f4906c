//! The checked-in eBPF object (`lifecycle-ebpf/object/`): `xtask/x.sh ebpf-object` rebuilds it
//! from source and records the digest of its inputs; `--check` (in the checks tier) fails unless
//! the recorded digest is current and a rebuild gives the same bytes.
//!
//! The build is aya-build's (the same target, `-Z build-std=core` and flags) plus path remaps: the
//! workspace, the crate registry and the nightly's sysroot appear in the debug info and BTF line
//! info under fixed names, so every checkout on every machine builds the same bytes.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{shell, toolchain, workspace_root};

#[path = "../../lifecycle-agent/build/ebpf_object.rs"]
mod inputs;

/// The digest of the current sources for this machine's architecture.
fn current_digest() -> Result<String> {
    inputs::digest(&workspace_root(), toolchain::EBPF_NIGHTLY, toolchain::BPF_LINKER_VERSION, std::env::consts::ARCH)
        .context("hashing the eBPF object's inputs")
}

/// The digest recorded beside the object, if any.
fn recorded_digest() -> Option<String> {
    let root = workspace_root();
    if !root.join(inputs::OBJECT).is_file() {
        return None;
    }
    Some(std::fs::read_to_string(root.join(inputs::DIGEST)).ok()?.trim().to_owned())
}

/// Whether the agent's build script will embed the checked-in object here (so the build needs
/// no nightly and no bpf-linker).
pub fn is_current() -> bool {
    // An input that cannot be read makes the digest unknown: not current, so build from source.
    recorded_digest().is_some_and(|recorded| current_digest().is_ok_and(|current| current == recorded))
}

/// `--remap-path-prefix` flags: the workspace, the nightly's sysroot (whose `rust-src` build-std
/// compiles) and each registry's source directory, most specific last (rustc applies the last
/// match).
fn remaps() -> Result<Vec<String>> {
    let sysroot = shell::capture(
        Command::new("rustc").arg(format!("+{}", toolchain::EBPF_NIGHTLY)).args(["--print", "sysroot"]),
    )?;
    let mut remaps = vec![
        format!("--remap-path-prefix={}=/lifecycle", workspace_root().display()),
        format!("--remap-path-prefix={}=/rust", sysroot.trim()),
    ];
    // One directory per registry; xtask's own dependencies were unpacked there, so it exists.
    let registry = toolchain::cargo_home().join("registry/src");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&registry)
        .with_context(|| format!("reading {}", registry.display()))?
        .map(|entry| Ok(entry?.path()))
        .collect::<std::io::Result<_>>()?;
    sources.sort();
    remaps.extend(sources.iter().map(|source| format!("--remap-path-prefix={}=/registry", source.display())));
    Ok(remaps)
}

/// Builds the programs from source as the object is built, returning its bytes.
fn build() -> Result<Vec<u8>> {
    toolchain::ensure()?;
    let arch = std::env::consts::ARCH;
    if arch != inputs::ARCH {
        bail!("the checked-in object is for {}; this machine is {arch}", inputs::ARCH);
    }
    let mut flags = vec![format!("--cfg=bpf_target_arch=\"{arch}\"")];
    flags.extend(inputs::RUSTFLAGS.iter().map(|flag| (*flag).to_owned()));
    flags.extend(remaps()?);
    let target_dir = workspace_root().join("target/ebpf-object");
    let mut command = Command::new("cargo");
    command
        .arg(format!("+{}", toolchain::EBPF_NIGHTLY))
        .args(["build", "--package", "lifecycle-ebpf", "--bins", "--release", "--locked"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .current_dir(workspace_root());
    shell::run(&mut command)?;
    let built = target_dir.join("bpfel-unknown-none/release/lifecycle");
    std::fs::read(&built).with_context(|| format!("reading {}", built.display()))
}

/// Rebuilds the object and records its inputs' digest.
pub fn write() -> Result<()> {
    let object = build()?;
    let root = workspace_root();
    std::fs::create_dir_all(root.join(inputs::OBJECT).parent().context("object path has no parent")?)?;
    std::fs::write(root.join(inputs::OBJECT), &object).context("writing the object")?;
    std::fs::write(root.join(inputs::DIGEST), format!("{}\n", current_digest()?)).context("writing the digest")?;
    eprintln!("xtask: wrote {} ({} bytes) and {}", inputs::OBJECT, object.len(), inputs::DIGEST);
    Ok(())
}

/// Fails unless the recorded digest matches the sources and a rebuild gives the same bytes.
pub fn check() -> Result<()> {
    let root = workspace_root();
    if recorded_digest() != Some(current_digest()?) {
        bail!(
            "{} is not current for the kernel programs' sources: run `xtask/x.sh ebpf-object` and commit \
             lifecycle-ebpf/object/",
            inputs::DIGEST
        );
    }
    let rebuilt = build()?;
    let checked_in = std::fs::read(root.join(inputs::OBJECT)).context("reading the checked-in object")?;
    if rebuilt != checked_in {
        bail!(
            "a build from source ({} bytes) differs from the checked-in {} ({} bytes): the build is not \
             reproducible, or the object was not written by `xtask/x.sh ebpf-object`",
            rebuilt.len(),
            inputs::OBJECT,
            checked_in.len()
        );
    }
    eprintln!("xtask: {} is current and rebuilds byte for byte", inputs::OBJECT);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::inputs::digest;

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn the_digest_follows_every_input_and_nothing_else() {
        let root = std::env::temp_dir().join(format!("xtask-ebpf-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (relative, text) in [
            ("Cargo.toml", "[workspace]"),
            ("Cargo.lock", "version = 4"),
            ("lifecycle-common/Cargo.toml", "[package]"),
            ("lifecycle-common/src/lib.rs", "pub struct Record;"),
            ("lifecycle-ebpf/Cargo.toml", "[package]"),
            ("lifecycle-ebpf/src/main.rs", "mod tcp;"),
            ("lifecycle-ebpf/src/tcp.rs", "fn accept() {}"),
        ] {
            write(&root, relative, text);
        }
        let at = |nightly: &str, arch: &str| digest(&root, nightly, "0.13.0", arch).expect("digest");
        let first = at("nightly-2026-05-20", "x86_64");
        assert_eq!(first.len(), 40, "hex SHA-1: {first}");

        // Not inputs: the object itself, its digest, the agent, docs.
        write(&root, "lifecycle-ebpf/object/lifecycle", "\x7fELF");
        write(&root, "lifecycle-ebpf/object/inputs.sha1", &first);
        write(&root, "lifecycle-agent/src/main.rs", "fn main() {}");
        write(&root, "README.md", "# lifecycle");
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first);

        // Every input counts: an edit, a new file, text moved between files, the pins, the arch.
        write(&root, "lifecycle-ebpf/src/tcp.rs", "fn accept() { }");
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first);
        write(&root, "lifecycle-ebpf/src/tcp.rs", "fn accept() {}");
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first, "the same bytes hash the same again");
        write(&root, "lifecycle-common/src/extra.rs", "");
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first);
        std::fs::remove_file(root.join("lifecycle-common/src/extra.rs")).expect("rm");
        write(&root, "lifecycle-ebpf/src/main.rs", "mod tcp;fn accept() {}");
        write(&root, "lifecycle-ebpf/src/tcp.rs", "");
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first);
        write(&root, "lifecycle-ebpf/src/main.rs", "mod tcp;");
        write(&root, "lifecycle-ebpf/src/tcp.rs", "fn accept() {}");
        write(&root, "Cargo.lock", "version = 3");
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first);
        write(&root, "Cargo.lock", "version = 4");
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first);
        assert_ne!(at("nightly-2026-05-21", "x86_64"), first);
        assert_ne!(at("nightly-2026-05-20", "aarch64"), first);
        std::fs::remove_dir_all(&root).expect("cleanup");
    }
}
