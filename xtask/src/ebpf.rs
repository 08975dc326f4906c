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

/// The digest of the current sources.
fn current_digest() -> Result<String> {
    inputs::digest(&workspace_root(), toolchain::EBPF_NIGHTLY, toolchain::BPF_LINKER_VERSION)
        .context("hashing the eBPF object's inputs")
}

/// The digests recorded beside the object, if both are there.
fn recorded_digests() -> Option<inputs::Digests> {
    let root = workspace_root();
    if !root.join(inputs::OBJECT).is_file() {
        return None;
    }
    inputs::Digests::parse(&std::fs::read_to_string(root.join(inputs::DIGESTS)).ok()?)
}

/// Whether the agent's build script will embed the checked-in object here (so the build needs
/// no nightly and no bpf-linker).
pub fn is_current() -> bool {
    // An input that cannot be read makes the digest unknown: not current, so build from source.
    recorded_digests().is_some_and(|recorded| current_digest().is_ok_and(|current| current == recorded.inputs))
        && inputs::SERVES.contains(&std::env::consts::ARCH)
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
    // One object for every architecture served (see `inputs::ARCH`): the same flags on any machine.
    let mut flags = vec![format!("--cfg=bpf_target_arch=\"{}\"", inputs::ARCH)];
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

/// Rebuilds the object and records both digests.
pub fn write() -> Result<()> {
    let object = build()?;
    let root = workspace_root();
    std::fs::create_dir_all(root.join(inputs::OBJECT).parent().context("object path has no parent")?)?;
    std::fs::write(root.join(inputs::OBJECT), &object).context("writing the object")?;
    let digests = inputs::Digests { inputs: current_digest()?, object: inputs::object_digest(&object) };
    std::fs::write(root.join(inputs::DIGESTS), digests.render()).context("writing the digests")?;
    // The file the digests replaced.
    let _ = std::fs::remove_file(root.join("lifecycle-ebpf/object/inputs.sha1"));
    eprintln!("xtask: wrote {} ({} bytes) and {}", inputs::OBJECT, object.len(), inputs::DIGESTS);
    Ok(())
}

/// Fails unless the recorded digests match the sources and the object, and a rebuild gives the
/// same bytes.
pub fn check() -> Result<()> {
    let root = workspace_root();
    let Some(recorded) = recorded_digests() else {
        bail!(
            "{} is missing or unreadable: run `xtask/x.sh ebpf-object` and commit lifecycle-ebpf/object/",
            inputs::DIGESTS
        );
    };
    if recorded.inputs != current_digest()? {
        bail!(
            "{} is not current for the kernel programs' sources: run `xtask/x.sh ebpf-object` and commit \
             lifecycle-ebpf/object/",
            inputs::DIGESTS
        );
    }
    let checked_in = std::fs::read(root.join(inputs::OBJECT)).context("reading the checked-in object")?;
    inputs::verify_object(&checked_in, &recorded).map_err(anyhow::Error::msg)?;
    let rebuilt = build()?;
    if rebuilt != checked_in {
        bail!(
            "a build from source ({} bytes) differs from the checked-in {} ({} bytes): the build is not \
             reproducible, or the object was not written by `xtask/x.sh ebpf-object`",
            rebuilt.len(),
            inputs::OBJECT,
            checked_in.len()
        );
    }
    eprintln!("xtask: {} is current, is the recorded object and rebuilds byte for byte", inputs::OBJECT);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::inputs::{digest, object_digest, verify_object, Digests};

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    const MANIFEST: &str = "[workspace]\nmembers = [\"a\"]\n\n[workspace.package]\nedition = \"2021\"\n\n\
                            [workspace.dependencies]\naya-ebpf = \"=0.2.1\"\nzbus = \"5\"\n\n\
                            [profile.release.package.lifecycle-ebpf]\nlto = true\n";
    const LOCK: &str = "version = 4\n\n[[package]]\nname = \"aya-ebpf\"\nversion = \"0.2.1\"\n\
                        dependencies = [\n \"aya-ebpf-macros\",\n]\n\n\
                        [[package]]\nname = \"aya-ebpf-macros\"\nversion = \"0.1.1\"\n\n\
                        [[package]]\nname = \"lifecycle-agent\"\nversion = \"0.1.0\"\ndependencies = [\n \"zbus\",\n]\n\n\
                        [[package]]\nname = \"lifecycle-ebpf\"\nversion = \"0.1.0\"\ndependencies = [\n \"aya-ebpf\",\n]\n\n\
                        [[package]]\nname = \"zbus\"\nversion = \"5.1.0\"\n";

    #[test]
    fn the_digest_follows_every_input_and_nothing_else() {
        let root = std::env::temp_dir().join(format!("xtask-ebpf-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (relative, text) in [
            ("Cargo.toml", MANIFEST),
            ("Cargo.lock", LOCK),
            ("lifecycle-common/Cargo.toml", "[package]"),
            ("lifecycle-common/src/lib.rs", "pub struct Record;"),
            ("lifecycle-ebpf/Cargo.toml", "[package]"),
            ("lifecycle-ebpf/src/main.rs", "mod tcp;"),
            ("lifecycle-ebpf/src/tcp.rs", "fn accept() {}"),
        ] {
            write(&root, relative, text);
        }
        let at = |nightly: &str, _arch: &str| digest(&root, nightly, "0.13.0").expect("digest");
        let first = at("nightly-2026-05-20", "x86_64");
        assert_eq!(first.len(), 64, "hex SHA-256: {first}");

        // Not inputs: the object itself, its digest, the agent, docs.
        write(&root, "lifecycle-ebpf/object/lifecycle", "\x7fELF");
        write(&root, "lifecycle-ebpf/object/digests", &first);
        write(&root, "lifecycle-agent/src/main.rs", "fn main() {}");
        write(&root, "README.md", "# lifecycle");
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first);

        // Every input counts: an edit, a new file, text moved between files, the pins.
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
        // Of the lock file and the workspace manifest, what the eBPF crate's build reads.
        write(
            &root,
            "Cargo.lock",
            &LOCK.replace("aya-ebpf-macros\"\nversion = \"0.1.1", "aya-ebpf-macros\"\nversion = \"0.1.2"),
        );
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first, "a dependency of a dependency");
        write(&root, "Cargo.lock", &LOCK.replace("zbus\"\nversion = \"5.1.0", "zbus\"\nversion = \"5.2.0"));
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first, "an agent-only crate");
        // A package after the last of the closure's, gone: its block's trailing text changes.
        write(&root, "Cargo.lock", &LOCK.replace("\n\n[[package]]\nname = \"zbus\"\nversion = \"5.1.0\"\n", "\n"));
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first, "the lock's end moved");
        write(&root, "Cargo.lock", LOCK);
        write(&root, "Cargo.toml", &MANIFEST.replace("zbus = \"5\"", "zbus = \"5\"\nclap = \"4\""));
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first, "a workspace dependency the eBPF crate does not use");
        write(&root, "Cargo.toml", &MANIFEST.replace("aya-ebpf = \"=0.2.1\"", "aya-ebpf = \"=0.2.2\""));
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first, "the eBPF crate's own dependency");
        write(&root, "Cargo.toml", &MANIFEST.replace("lto = true", "lto = false"));
        assert_ne!(at("nightly-2026-05-20", "x86_64"), first, "a profile");
        write(&root, "Cargo.toml", MANIFEST);
        assert_eq!(at("nightly-2026-05-20", "x86_64"), first);
        assert_ne!(at("nightly-2026-05-21", "x86_64"), first);
        // One object for every architecture: the machine's does not count.
        assert_eq!(at("nightly-2026-05-20", "aarch64"), first);
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn an_object_changed_without_its_recorded_digest_is_refused() {
        let object = b"\x7fELF the programs".to_vec();
        let recorded = Digests { inputs: "0".repeat(64), object: object_digest(&object) };
        assert_eq!(Digests::parse(&recorded.render()), Some(recorded.clone()), "the file reads back");
        assert!(verify_object(&object, &recorded).is_ok());
        let mut changed = object.clone();
        changed[5] ^= 1;
        let refused = verify_object(&changed, &recorded).expect_err("one bit changed");
        assert!(refused.contains("is not the object") && refused.contains("xtask/x.sh ebpf-object"), "{refused}");
    }

    #[test]
    fn the_programs_read_no_registers_so_one_object_serves_every_architecture() {
        // aya-ebpf's `bpf_target_arch` changes only the `pt_regs` layout kprobes and uprobes read.
        let sources = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lifecycle-ebpf/src");
        for entry in std::fs::read_dir(&sources).expect("lifecycle-ebpf/src") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("source");
            for register_reader in
                ["#[kprobe", "#[kretprobe", "#[uprobe", "#[uretprobe", "ProbeContext", "RetProbeContext", "pt_regs"]
            {
                assert!(!text.contains(register_reader), "{} uses {register_reader}", path.display());
            }
        }
    }
}
