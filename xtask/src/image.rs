//! `xtask image`: the agent's release image as an OCI archive, with no registry and no container
//! engine. Builds `lifecycle-agent` in release mode with the pinned toolchains (as `run` does;
//! for the other architecture, cross-built: `cross_linux`) and packs it with `lifecycle_image::agent`,
//! the builder the kubelet tier's image comes from. `--arch all` makes one multi-arch image of
//! both.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result};
use lifecycle_image::{
    agent::{self, AgentImage},
    layout::{Arch, Packed},
};

use crate::{cargo, cross_linux, shell, workspace_root};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchArg {
    Amd64,
    Arm64,
    /// Both, as one multi-arch image.
    All,
}

impl ArchArg {
    fn arches(self) -> Vec<Arch> {
        match self {
            ArchArg::Amd64 => vec![Arch::Amd64],
            ArchArg::Arm64 => vec![Arch::Arm64],
            ArchArg::All => vec![Arch::Amd64, Arch::Arm64],
        }
    }

    fn name(self) -> &'static str {
        match self {
            ArchArg::Amd64 => "amd64",
            ArchArg::Arm64 => "arm64",
            ArchArg::All => "multiarch",
        }
    }
}

#[derive(clap::Args)]
pub struct ImageArgs {
    /// The image's architecture (default: this machine's); another is cross-built (Debian's
    /// cross gcc and C library, installed when missing), `all` packs both as one multi-arch image.
    #[arg(long, value_enum)]
    arch: Option<ArchArg>,
    /// Where to write the archive (default: `target/image/lifecycle-agent-<version>-<arch>.tar`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The release agent for `arch`: this machine's build, or a cross build.
fn release_binary(arch: Arch) -> Result<PathBuf> {
    if Arch::host() == Some(arch) {
        shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent", "--bin", "lifecycle-agent"]))?;
        return Ok(workspace_root().join("target/release/lifecycle-agent"));
    }
    cross_linux::agent(arch, true)
}

/// Builds the release agent for each of `arches` and packs them as one image at `out`.
pub fn build(arches: &[Arch], out: &Path) -> Result<Packed> {
    let root = workspace_root();
    let binaries = arches.iter().map(|&arch| release_binary(arch)).collect::<Result<Vec<_>>>()?;
    let revision = agent::git_revision(&root).unwrap_or_else(|| "unknown".to_owned());
    if !shell::capture(std::process::Command::new("git").arg("-C").arg(&root).args(["status", "--porcelain"]))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        eprintln!("xtask: note: the working tree has uncommitted changes; the image's revision label says {revision}");
    }
    let name = agent::release_name();
    let created = agent::git_commit_time(&root).unwrap_or_else(|| lifecycle_image::layout::EPOCH.to_owned());
    let image = AgentImage {
        binary: &binaries[0],
        name: &name,
        revision: &revision,
        created: &created,
        gzip_level: agent::RELEASE_GZIP_LEVEL,
    };
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "image".to_owned());
    let work = root.join("target/image").join(format!("staging-{stem}"));
    let binaries: Vec<&Path> = binaries.iter().map(PathBuf::as_path).collect();
    agent::build_platforms(&binaries, &image, &work, out).context("building the agent image")
}

/// Builds the release binaries and the image; prints where the archive is and how to use it.
pub fn run(args: &ImageArgs) -> Result<()> {
    let host = Arch::host().context("images are built on amd64 or arm64 machines only")?;
    let choice = args.arch.unwrap_or(match host {
        Arch::Amd64 => ArchArg::Amd64,
        Arch::Arm64 => ArchArg::Arm64,
    });
    let root = workspace_root();
    let out = args.out.clone().unwrap_or_else(|| {
        root.join("target/image").join(format!("lifecycle-agent-{}-{}.tar", agent::VERSION, choice.name()))
    });
    let out = if out.is_absolute() { out } else { std::env::current_dir().context("current dir")?.join(out) };
    let began = Instant::now();
    // The plugin is not in the image (it runs beside kubectl, not on nodes): built for this
    // machine, for whoever installs the image from here (with this machine's agent, in one cargo
    // invocation), and for each other architecture asked.
    if choice.arches().contains(&host) {
        crate::build_agent_and_plugin()?;
    } else {
        shell::run(cargo().args(["build", "--release", "-p", "kubectl-lifecycle"]))?;
    }
    let packed = build(&choice.arches(), &out)?;
    crate::plugin_built();
    for arch in choice.arches().into_iter().filter(|&arch| Some(arch) != Arch::host()) {
        let plugin = cross_linux::plugin(arch)?;
        eprintln!("xtask: the kubectl plugin for {}: {}", arch.oci_name(), plugin.display());
    }
    eprintln!(
        "xtask: {} ({}) in {} ({:.1} MiB, digest {}); {:.0?}",
        agent::release_name(),
        choice.name(),
        packed.archive.display(),
        packed.bytes as f64 / (1024.0 * 1024.0),
        packed.manifest_digest,
        began.elapsed(),
    );
    let archive = packed.archive.display();
    eprintln!(
        "xtask: load it on a node with `ctr -n k8s.io images import {archive}` (`--all-platforms` for a multi-arch \
         archive), or `docker load -i {archive}`, `podman load -i {archive}`; push it with \
         `skopeo copy --all oci-archive:{archive} docker://<registry>/lifecycle-agent:{}` (deploy/README.md, \
         \"The image\")",
        agent::VERSION
    );
    println!("{archive}");
    Ok(())
}
