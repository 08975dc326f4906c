//! The checked-in eBPF object: where it lives, what it is built from, and the digest of those
//! inputs that says whether it is current.
//!
//! Building the kernel programs needs a nightly with `rust-src` (`-Z build-std=core`) and a
//! bpf-linker linked against that nightly's LLVM: on a fresh machine about a minute of the
//! README's `run` (BENCHMARKS.md, fresh-machine run). Like `bpf2go` users do with their `.o`
//! files, the object is checked in (`xtask/x.sh ebpf-object` writes it) and verified: the checks
//! tier rebuilds it from source and fails unless the bytes are equal. The build is reproducible
//! across checkouts because it remaps the workspace, the crate registry and the nightly's
//! sysroot out of the debug info.
//!
//! Included by the agent's build script (which embeds the object when its digest matches, and
//! otherwise builds from source with aya-build) and by xtask (which writes and checks it), so
//! both hash the same inputs the same way.

use std::{
    io,
    path::{Path, PathBuf},
};

/// The object, relative to the workspace root.
pub const OBJECT: &str = "lifecycle-ebpf/object/lifecycle";
/// The digest of the inputs the object was built from (hex SHA-1, one line).
pub const DIGEST: &str = "lifecycle-ebpf/object/inputs.sha1";
/// The target architecture the checked-in object is built for (`bpf_target_arch` changes how the
/// programs read registers); the agent built for any other one builds its object from source.
pub const ARCH: &str = "x86_64";
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

/// The hex SHA-1 of the inputs with the toolchain pins and the flags: every file's relative path,
/// length and bytes, so moving text between files changes it too.
pub fn digest(root: &Path, nightly: &str, bpf_linker: &str, arch: &str) -> io::Result<String> {
    let mut hasher = sha1_smol::Sha1::new();
    for field in [nightly, bpf_linker, arch].iter().chain(RUSTFLAGS) {
        hasher.update(field.as_bytes());
        hasher.update(b"\0");
    }
    for relative in input_files(root)? {
        let bytes = std::fs::read(root.join(&relative))?;
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher.digest().to_string())
}
