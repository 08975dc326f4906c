//! `xtask image`: the agent's release image as an OCI archive, with no registry and no container
//! engine. Builds `lifecycle-agent` in release mode with the pinned toolchains (as `run` does)
//! and packs it with `lifecycle_image::agent`, the builder the kubelet tier's image comes from.

use std::{path::PathBuf, time::Instant};

use anyhow::{bail, Context as _, Result};
use lifecycle_image::{
    agent::{self, AgentImage},
    layout::Arch,
};

use crate::{cargo, shell, toolchain, workspace_root};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchArg {
    Amd64,
    Arm64,
}

impl ArchArg {
    fn arch(self) -> Arch {
        match self {
            ArchArg::Amd64 => Arch::Amd64,
            ArchArg::Arm64 => Arch::Arm64,
        }
    }
}

#[derive(clap::Args)]
pub struct ImageArgs {
    /// The image's architecture (default: this machine's). Only this machine's can be built.
    #[arg(long, value_enum)]
    arch: Option<ArchArg>,
    /// Where to write the archive (default: `target/image/lifecycle-agent-<version>-<arch>.tar`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Builds the release binary and its image; prints where the archive is and how to use it.
pub fn run(args: &ImageArgs) -> Result<()> {
    let host = Arch::host().context("images are built on amd64 or arm64 machines only")?;
    let arch = args.arch.map_or(host, ArchArg::arch);
    if arch != host {
        bail!("{}", cross_build_missing(arch));
    }
    let root = workspace_root();
    let began = Instant::now();
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent", "--bin", "lifecycle-agent"]))?;
    // The plugin is not in the image (it runs beside kubectl, not on nodes): built for this
    // machine, for whoever installs the image from here.
    shell::run(cargo().args(["build", "--release", "-p", "kubectl-lifecycle"]))?;
    crate::plugin_built();
    let built = began.elapsed();
    let binary = root.join("target/release/lifecycle-agent");
    let revision = agent::git_revision(&root).unwrap_or_else(|| "unknown".to_owned());
    if !shell::capture(std::process::Command::new("git").arg("-C").arg(&root).args(["status", "--porcelain"]))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        eprintln!("xtask: note: the working tree has uncommitted changes; the image's revision label says {revision}");
    }
    let name = agent::release_name();
    let out = args.out.clone().unwrap_or_else(|| {
        root.join("target/image").join(format!("lifecycle-agent-{}-{}.tar", agent::VERSION, arch.oci_name()))
    });
    let out = if out.is_absolute() { out } else { std::env::current_dir().context("current dir")?.join(out) };
    let packing = Instant::now();
    let created = agent::git_commit_time(&root).unwrap_or_else(|| lifecycle_image::layout::EPOCH.to_owned());
    let image = AgentImage {
        binary: &binary,
        name: &name,
        revision: &revision,
        created: &created,
        gzip_level: agent::RELEASE_GZIP_LEVEL,
    };
    let work = root.join("target/image").join(format!("staging-{}", arch.oci_name()));
    let packed = agent::build(&image, &work, &out).context("building the agent image")?;
    eprintln!(
        "xtask: {name} ({}) in {} ({:.1} MiB, manifest {}); release build {:.0?}, packing {:.1?}",
        arch.oci_name(),
        packed.archive.display(),
        packed.bytes as f64 / (1024.0 * 1024.0),
        packed.manifest_digest,
        built,
        packing.elapsed(),
    );
    let archive = packed.archive.display();
    eprintln!(
        "xtask: load it on a node with `ctr -n k8s.io images import {archive}`, or `docker load -i {archive}`, \
         `podman load -i {archive}`; push it with `skopeo copy oci-archive:{archive} docker://<registry>/lifecycle-agent:{}` \
         (deploy/README.md, \"The image\")",
        agent::VERSION
    );
    println!("{archive}");
    Ok(())
}

/// Why an image for `arch` cannot be built on this machine, and what is missing for it.
fn cross_build_missing(arch: Arch) -> String {
    let target = format!("{}-unknown-linux-gnu", arch.rust_name());
    let linker = format!("{}-linux-gnu-gcc", arch.rust_name());
    let mut missing = Vec::new();
    let installed = shell::capture(std::process::Command::new("rustup").args([
        "target",
        "list",
        "--installed",
        "--toolchain",
        toolchain::STABLE,
    ]))
    .unwrap_or_default();
    if !installed.lines().any(|l| l.trim() == target) {
        missing.push(format!("the Rust target (`rustup target add --toolchain {} {target}`)", toolchain::STABLE));
    }
    if !on_path(&linker) {
        missing.push(format!(
            "a linker and C library for it (`{linker}`: Debian's gcc-{0}-linux-gnu and libc6-dev-{1}-cross)",
            arch.rust_name().replace('_', "-"),
            arch.oci_name()
        ));
    }
    // Even with both, the image's libraries are listed by `ldd`, which runs this machine's loader.
    missing.push(format!(
        "a way to list an {} binary's shared libraries: `xtask image` uses ldd, which only reads this machine's \
         architecture, so cross-built images are not made here",
        arch.oci_name()
    ));
    format!(
        "cannot build an {} image on this {} machine; missing: {}. Run `xtask/x.sh image` on an {0} machine \
         (it builds natively), or see deploy/README.md, \"The image\", for the cross-build steps",
        arch.oci_name(),
        std::env::consts::ARCH,
        missing.join("; ")
    )
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(binary).is_file()))
}
