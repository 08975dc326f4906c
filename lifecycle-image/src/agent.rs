//! The agent's image: the `lifecycle-agent` binary at [`AGENT_PATH`] with its shared libraries
//! ([`rootfs::for_binary`]), run as root (its kernel work needs `CAP_BPF`, `CAP_PERFMON`,
//! `CAP_SYS_ADMIN` and `CAP_SYS_PTRACE` in the effective set, which the runtimes grant a
//! non-root user's process only through file capabilities or ambient capabilities, neither of
//! which Kubernetes sets), with the OCI labels operators and scanners read.

use std::{collections::BTreeMap, fs, io::Read as _, path::Path, process::Command};

use crate::{
    layout::{self, Arch, ImageConfig, PackError, Packed, Platform},
    rootfs::{self, RootfsError},
};

/// Where the binary is in the image (deploy/daemonset.yaml's container runs the entrypoint).
pub const AGENT_PATH: &str = "/usr/local/bin/lifecycle-agent";
/// The default command: serve /metrics and the API on every address (a pod's `args` replace it).
pub const DEFAULT_CMD: &[&str] = &["run", "--listen", "0.0.0.0:9890"];
/// The workspace's version, license and repository (this crate inherits all three).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const LICENSES: &str = env!("CARGO_PKG_LICENSE");
pub const SOURCE: &str = env!("CARGO_PKG_REPOSITORY");

/// The release image's name: `docker.io/library/lifecycle-agent:<version>`, which is what a pod's
/// `image: lifecycle-agent:<version>` (deploy/daemonset.yaml) resolves to on a node that
/// imported the archive.
pub fn release_name() -> String {
    format!("docker.io/library/lifecycle-agent:{VERSION}")
}

/// What to build.
#[derive(Clone, Copy, Debug)]
pub struct AgentImage<'a> {
    /// The `lifecycle-agent` binary (release for the image operators get, the test build in the
    /// kubelet tier).
    pub binary: &'a Path,
    /// The full reference, e.g. [`release_name`].
    pub name: &'a str,
    /// The source revision (`git rev-parse HEAD`) for `org.opencontainers.image.revision`.
    pub revision: &'a str,
    /// The image's creation time, RFC 3339: the commit's ([`git_commit_time`]) for the release
    /// image, so the same revision gives the same image; [`layout::EPOCH`] when nothing better.
    pub created: &'a str,
    /// The layer's gzip level ([`ImageConfig::gzip_level`]): [`RELEASE_GZIP_LEVEL`] for images
    /// that travel, 1 for the test build's, which is large and never leaves the machine.
    pub gzip_level: u8,
}

/// gzip's default: the release image is ~10% smaller than at level 1, for under a second.
pub const RELEASE_GZIP_LEVEL: u8 = 6;

/// Failures building the agent's image.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The binary could not be read.
    #[error("read {}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The binary is no ELF file of an architecture images are made for.
    #[error("{} is not an x86-64 or AArch64 ELF executable ({what})", path.display())]
    NotElf { path: std::path::PathBuf, what: String },
    /// Its root filesystem could not be made.
    #[error("root filesystem")]
    Rootfs(#[from] RootfsError),
    /// The archive could not be packed.
    #[error("packing the image")]
    Pack(#[from] PackError),
    /// The staging directory could not be removed.
    #[error("remove {}", path.display())]
    Cleanup {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The OCI labels (also the manifest's annotations).
pub fn labels(revision: &str) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", "lifecycle-agent"),
        ("org.opencontainers.image.description", "eBPF node agent: the Pod Lifecycle rules versus what the kernel saw"),
        ("org.opencontainers.image.version", VERSION),
        ("org.opencontainers.image.source", SOURCE),
        ("org.opencontainers.image.revision", revision),
        ("org.opencontainers.image.licenses", LICENSES),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Builds the image of `image.binary` into `archive`, staging in `work` (removed afterwards).
pub fn build(image: &AgentImage<'_>, work: &Path, archive: &Path) -> Result<Packed, BuildError> {
    build_platforms(&[image.binary], image, work, archive)
}

/// Builds one image of the agent from `binaries`, one per architecture (each binary's own, read
/// from its ELF header), under `image`'s name and labels: with two, a multi-arch image.
pub fn build_platforms(
    binaries: &[&Path],
    image: &AgentImage<'_>,
    work: &Path,
    archive: &Path,
) -> Result<Packed, BuildError> {
    let mut staged = Vec::with_capacity(binaries.len());
    for binary in binaries {
        let architecture = elf_arch(binary)?;
        let rootfs = work.join(format!("rootfs-{}", architecture.oci_name()));
        rootfs::for_binary(&rootfs, binary, architecture, AGENT_PATH)?;
        let config = ImageConfig {
            architecture,
            entrypoint: vec![AGENT_PATH.to_owned()],
            cmd: DEFAULT_CMD.iter().map(|s| (*s).to_owned()).collect(),
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
            user: Some("0:0".to_owned()),
            labels: labels(image.revision),
            stop_signal: None,
            created: image.created.to_owned(),
            gzip_level: image.gzip_level,
        };
        staged.push((rootfs, config));
    }
    let platforms: Vec<Platform<'_>> =
        staged.iter().map(|(rootfs, config)| Platform { rootfs: rootfs.as_path(), config }).collect();
    let packed = layout::pack_platforms(&platforms, image.name, &work.join("layout"), archive)?;
    fs::remove_dir_all(work).map_err(|source| BuildError::Cleanup { path: work.to_owned(), source })?;
    Ok(packed)
}

/// The commit checked out in `repository` (`git rev-parse HEAD`), if git can tell.
pub fn git_revision(repository: &Path) -> Option<String> {
    let output = Command::new("git").arg("-C").arg(repository).args(["rev-parse", "HEAD"]).output().ok()?;
    let revision = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !revision.is_empty()).then_some(revision)
}

/// The committer time of the commit checked out in `repository`, RFC 3339 (`git show -s
/// --format=%cI HEAD`), if git can tell.
pub fn git_commit_time(repository: &Path) -> Option<String> {
    let output =
        Command::new("git").arg("-C").arg(repository).args(["show", "-s", "--format=%cI", "HEAD"]).output().ok()?;
    let time = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !time.is_empty()).then_some(time)
}

/// The architecture an ELF executable is for, from its header (`e_machine`).
pub fn elf_arch(path: &Path) -> Result<Arch, BuildError> {
    let mut header = [0u8; 20];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_err(|source| BuildError::Read { path: path.to_owned(), source })?;
    let not_elf = |what: String| BuildError::NotElf { path: path.to_owned(), what };
    if &header[..4] != b"\x7fELF" {
        return Err(not_elf("no ELF magic".to_owned()));
    }
    // e_ident[EI_DATA] 1: little-endian, which both architectures are here.
    if header[5] != 1 {
        return Err(not_elf("big-endian".to_owned()));
    }
    match u16::from_le_bytes([header[18], header[19]]) {
        62 => Ok(Arch::Amd64),
        183 => Ok(Arch::Arm64),
        other => Err(not_elf(format!("e_machine {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_carry_the_workspace_fields() {
        let labels = labels("abc123");
        assert_eq!(labels["org.opencontainers.image.version"], VERSION);
        assert_eq!(labels["org.opencontainers.image.revision"], "abc123");
        assert_eq!(labels["org.opencontainers.image.licenses"], "MIT OR Apache-2.0");
        assert!(!labels["org.opencontainers.image.source"].is_empty());
        assert_eq!(release_name(), format!("docker.io/library/lifecycle-agent:{VERSION}"));
    }

    #[test]
    fn the_running_test_binary_is_an_elf_of_this_machine() {
        let me = std::env::current_exe().expect("current exe");
        assert_eq!(elf_arch(&me).ok(), Arch::host());
        let not_elf = std::env::temp_dir().join(format!("lifecycle-image-not-elf-{}", std::process::id()));
        fs::write(&not_elf, b"#!/bin/sh\necho hello world\n").expect("write");
        assert!(matches!(elf_arch(&not_elf), Err(BuildError::NotElf { .. })));
        let _ = fs::remove_file(&not_elf);
    }
}
