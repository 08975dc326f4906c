//! The checked-in eBPF object: where it lives, what it is built from, and the two digests that
//! say whether it is current and whether it is the object that was built.
//!
//! Building the kernel programs needs a nightly with `rust-src` (`-Z build-std=core`) and a
//! bpf-linker linked against that nightly's LLVM: on a fresh machine about a minute of the
//! README's `run` (BENCHMARKS.md, fresh-machine run). Like `bpf2go` users do with their `.o`
//! files, the object is checked in (`xtask/x.sh ebpf-object` writes it) and verified: the checks
//! tier rebuilds it from source and fails unless the bytes are equal. The build is reproducible
//! across checkouts because it remaps the workspace, the crate registry and the nightly's
//! sysroot out of the debug info.
//!
//! `lifecycle-ebpf/object/digests` holds two SHA-256 lines a reviewer reads in a diff: `inputs`,
//! of everything the object is built from (sources, manifests, lock file, toolchain pins, flags),
//! and `object`, of the object's own bytes. The build script embeds the object only when the
//! inputs' digest is current, and refuses to build at all when the object's bytes are not the
//! ones recorded: a commit that changes the object alone cannot slip into a binary.
//!
//! One object serves every architecture the agent is built for (x86_64, aarch64): the programs
//! read no registers (no kprobes or uprobes, whose `pt_regs` layout is the one thing aya-ebpf's
//! `bpf_target_arch` changes), so a build for aarch64 differs from the x86_64 one only in debug
//! info and BTF names, never in code (checked with a section-by-section comparison, 2026-11-29).
//! `xtask`'s tests keep the programs free of register reads.
//!
//! Included by the agent's build script and by xtask (which writes and checks it), so both hash
//! the same inputs the same way.

use std::{
    io,
    path::{Path, PathBuf},
};

/// The object, relative to the workspace root.
pub const OBJECT: &str = "lifecycle-ebpf/object/lifecycle";
/// The two digests (`inputs <hex>`, `object <hex>`), relative to the workspace root.
pub const DIGESTS: &str = "lifecycle-ebpf/object/digests";
/// The `bpf_target_arch` the object is built with, whatever the machine (see above).
pub const ARCH: &str = "x86_64";
/// The architectures the checked-in object serves.
pub const SERVES: &[&str] = &["x86_64", "aarch64"];
/// What the object is built from, relative to the workspace root; directories are walked. Of the
/// workspace's manifest and lock file only what the eBPF crate's build reads counts (see
/// [`narrowed`]): a crate added to the agent leaves the object current.
pub const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "lifecycle-common/Cargo.toml",
    "lifecycle-common/src",
    "lifecycle-ebpf/Cargo.toml",
    "lifecycle-ebpf/src",
];
/// rustc flags of the build besides the path remaps: aya-build's own (BTF for CO-RE and for the
/// maps' types), so an object built from source by the build script differs only in its paths.
pub const RUSTFLAGS: &[&str] = &["-Cdebuginfo=2", "-Clink-arg=--btf"];

/// The recorded digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digests {
    pub inputs: String,
    pub object: String,
}

impl Digests {
    /// Reads `inputs <hex>` and `object <hex>` lines (anything else is ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let field = |name: &str| {
            text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ').map(|v| v.trim().to_owned()))
        };
        Some(Self { inputs: field("inputs")?, object: field("object")? })
    }

    /// The file's text.
    #[allow(
        dead_code,
        reason = "xtask writes the file; the build script, which includes this module too, only reads it (allow, not expect: in xtask the function is used)"
    )]
    pub fn render(&self) -> String {
        format!("inputs {}\nobject {}\n", self.inputs, self.object)
    }
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn object_digest(bytes: &[u8]) -> String {
    hex(&hmac_sha256::Hash::hash(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `object` is the object `recorded` names; the error says what to do.
pub fn verify_object(object: &[u8], recorded: &Digests) -> Result<(), String> {
    let found = object_digest(object);
    if found == recorded.object {
        return Ok(());
    }
    Err(format!(
        "{OBJECT} is not the object {DIGESTS} records (its SHA-256 is {found}, the recorded one {}): \
         rebuild it with `xtask/x.sh ebpf-object`, which writes both",
        recorded.object
    ))
}

/// Every input file under `root`, relative and sorted, so the digest does not depend on the order
/// a directory lists in.
pub fn input_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending: Vec<PathBuf> = INPUTS.iter().map(PathBuf::from).collect();
    while let Some(relative) = pending.pop() {
        let path = root.join(&relative);
        if path.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(relative.join(entry?.file_name()));
            }
        } else {
            files.push(relative);
        }
    }
    files.sort();
    Ok(files)
}

/// The hex SHA-256 of the inputs with the toolchain pins and the flags: every file's relative
/// path, length and bytes, so moving text between files changes it too.
pub fn digest(root: &Path, nightly: &str, bpf_linker: &str) -> io::Result<String> {
    let mut hasher = hmac_sha256::Hash::new();
    for field in [nightly, bpf_linker, ARCH].iter().chain(RUSTFLAGS) {
        hasher.update(field.as_bytes());
        hasher.update(b"\0");
    }
    let lock = std::fs::read_to_string(root.join("Cargo.lock"))?;
    let closure = lock_closure(&lock, EBPF_PACKAGE);
    for relative in input_files(root)? {
        let bytes = std::fs::read(root.join(&relative))?;
        let bytes = narrowed(&relative, bytes, &closure);
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hex(&hasher.finalize()))
}

/// The eBPF crate's package name: the root of what its build reads from the lock file.
const EBPF_PACKAGE: &str = "lifecycle-ebpf";

/// A package of the lock file: its `[[package]]` block and what it depends on.
struct LockedPackage<'a> {
    name: &'a str,
    version: &'a str,
    block: &'a str,
    /// `name` or `name version` (or `name version (source)`), as the lock file writes them.
    dependencies: Vec<&'a str>,
}

/// The lock file's packages, as written (a block per `[[package]]`).
fn locked_packages(lock: &str) -> Vec<LockedPackage<'_>> {
    lock.split("[[package]]")
        .skip(1)
        .map(|block| {
            let field = |key: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(key)?.trim_start().strip_prefix('=').map(str::trim))
                    .map(|quoted| quoted.trim_matches('"'))
                    .unwrap_or_default()
            };
            let dependencies = block
                .split_once("dependencies = [")
                .map(|(_, rest)| rest.split(']').next().unwrap_or_default())
                .map(|list| {
                    list.split(',')
                        .map(|entry| entry.trim().trim_matches('"'))
                        .filter(|entry| !entry.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            LockedPackage { name: field("name"), version: field("version"), block, dependencies }
        })
        .collect()
}

/// The lock file's blocks of `root` and everything it depends on, in the file's order, joined:
/// what the eBPF crate's build resolves. (Dev-dependencies are in the lock's lists too: over-
/// inclusive, never short.)
pub fn lock_closure(lock: &str, root: &str) -> String {
    let packages = locked_packages(lock);
    let mut kept = vec![false; packages.len()];
    let mut pending: Vec<&str> = vec![root];
    while let Some(wanted) = pending.pop() {
        let mut words = wanted.split_whitespace();
        let name = words.next().unwrap_or_default();
        let version = words.next();
        for (index, package) in packages.iter().enumerate() {
            if kept[index] || package.name != name || version.is_some_and(|v| v != package.version) {
                continue;
            }
            kept[index] = true;
            pending.extend(package.dependencies.iter().copied());
        }
    }
    // Trimmed: the last block of the file ends at the end of the file, the others before the
    // next block's blank line; which one is last must not count.
    let blocks: Vec<&str> =
        packages.iter().zip(kept).filter(|(_, kept)| *kept).map(|(package, _)| package.block.trim()).collect();
    blocks.join("\n")
}

/// The workspace manifest's lines the eBPF build reads: the edition and other package
/// defaults, every profile, patches, and the workspace dependencies named in `closure` (the
/// lock blocks [`lock_closure`] kept).
fn manifest_part(manifest: &str, closure: &str) -> String {
    let in_closure = |name: &str| closure.contains(&format!("name = \"{name}\"\n"));
    let mut section = String::new();
    let mut kept = String::new();
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            section = trimmed.trim_matches(|c| c == '[' || c == ']').to_owned();
        }
        let keep = match section.as_str() {
            "workspace.package" => true,
            "workspace.dependencies" => {
                trimmed.starts_with('[') || trimmed.split('=').next().is_some_and(|key| in_closure(key.trim()))
            }
            other => other.starts_with("profile") || other.starts_with("patch"),
        };
        if keep {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// What of an input file the digest covers: the workspace manifest's and lock file's parts the
/// eBPF build reads, every other file whole.
fn narrowed(relative: &Path, bytes: Vec<u8>, closure: &str) -> Vec<u8> {
    if relative == Path::new("Cargo.lock") {
        return closure.as_bytes().to_vec();
    }
    if relative == Path::new("Cargo.toml") {
        return manifest_part(&String::from_utf8_lossy(&bytes), closure).into_bytes();
    }
    bytes
}
