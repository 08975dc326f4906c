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
/// What the object is built from, relative to the workspace root; directories are walked. The
/// whole manifest and lock file are over-inclusive (most of their changes leave the object
/// unchanged) but safe: a change only asks for `xtask/x.sh ebpf-object` to be run again.
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
        reason = "xtask writes the file; the build script, which includes this module too, only reads it"
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
    for relative in input_files(root)? {
        let bytes = std::fs::read(root.join(&relative))?;
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hex(&hasher.finalize()))
}
