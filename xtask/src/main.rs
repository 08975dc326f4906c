//! `cargo xtask`: bootstrap, run, test tiers and benchmarks. Not the normal build: the agent
//! builds with plain cargo once `bootstrap` has installed the eBPF toolchain.

mod bench;
mod bench_probes;
mod fuzz;
mod helm;
mod image;
mod kubernetes;
mod kubernetes_modern;
mod lock;
mod packages;
mod shell;
mod tiers;
mod toolchain;

use std::{os::unix::process::CommandExt as _, path::PathBuf, process::Command};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "lifecycle's developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the pinned nightly, rust-src, bpf-linker and the build's Debian packages.
    Bootstrap,
    /// Bootstrap, build the agent in release mode, and start it on this host.
    Run {
        /// Arguments for `lifecycle-agent run` (e.g. --listen 0.0.0.0:9890).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Bootstrap, build the agent in release mode and pack its OCI image archive (no registry,
    /// no container engine): `target/image/lifecycle-agent-<version>-<arch>.tar`.
    Image(image::ImageArgs),
    /// Bootstrap and run every test tier (unit, checks, kernel, runtime, hostile, kubelet, modern).
    Test {
        /// Run only these tiers (repeatable): unit, checks, kernel, runtime, hostile, kubelet, modern.
        #[arg(long = "tier", value_enum)]
        tiers: Vec<tiers::Tier>,
    },
    /// Run the cargo-fuzz targets in fuzz/ (installs cargo-fuzz); results go to BENCHMARKS.md by hand.
    Fuzz(fuzz::FuzzArgs),
    /// Build kube-apiserver and kubelet from Debian's source package into target/kubernetes/bin
    /// (once: later runs find them cached); the kubelet tier does this itself.
    Kubernetes,
    /// Provide a current node's binaries (kubelet and kube-apiserver of KUBERNETES_MODERN_VERSION,
    /// runc 1.3 and containerd 2.4 built with Go; etcd and the CNI plugins from Debian unstable) in
    /// /var/cache/lifecycle/kubernetes-modern (once per machine: later runs find them cached).
    KubernetesModern,
    /// Provide helm (built with Go from xtask/helm/go.mod, cached per machine in
    /// /var/cache/lifecycle/helm) and print its path; the checks tier does this itself.
    Helm,
    /// Benchmarks; results are printed and appended to BENCHMARKS.md by hand.
    Bench {
        #[command(subcommand)]
        which: bench::Bench,
    },
}

/// The workspace root (xtask's parent directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// A cargo command at the workspace root on the pinned stable toolchain.
pub fn cargo() -> Command {
    let mut command = Command::new("cargo");
    command.arg(format!("+{}", toolchain::STABLE)).current_dir(workspace_root());
    command
}

fn bootstrap() -> Result<()> {
    put_bpf_linker_on_path()?;
    toolchain::ensure()?;
    packages::ensure(packages::BUILD)
}

/// bpf-linker lands in $CARGO_HOME/bin; aya-build looks it up on PATH.
fn put_bpf_linker_on_path() -> Result<()> {
    if let Some(bin) = toolchain::bpf_linker_path().parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut parts = vec![bin.to_path_buf()];
        parts.extend(std::env::split_paths(&path));
        let joined = std::env::join_paths(parts).context("building PATH")?;
        // SAFETY: single-threaded at this point; no other thread reads the environment.
        unsafe { std::env::set_var("PATH", joined) };
    }
    Ok(())
}

/// `bootstrap` for `run`, with the agent's dependencies compiling beside the toolchain install.
/// Only the agent's own build script needs the nightly and bpf-linker; on a fresh machine their
/// install (the nightly's download, bpf-linker's ~80 s build) and the dependencies' build (~4 min
/// of the release build's ~4.5) would otherwise run one after the other. The dependencies are
/// built as `-p name@version` of the agent's direct dependencies, which cargo compiles with the
/// same features as the agent's own build (a later `cargo build -p lifecycle-agent` finds them
/// fresh). A failed prebuild is not an error here: the agent's build that follows reports it.
fn bootstrap_building_dependencies() -> Result<()> {
    put_bpf_linker_on_path()?;
    // protoc, for k8s-cri's build script, before anything compiles.
    packages::ensure(packages::BUILD)?;
    let mut prebuild = cargo();
    prebuild.args(["build", "--release", "--quiet"]);
    for spec in agent_dependency_specs()? {
        prebuild.args(["-p", &spec]);
    }
    eprintln!("xtask: building the agent's dependencies while the toolchains install");
    let mut prebuild = prebuild.spawn().context("starting the dependencies' build")?;
    let installed = toolchain::ensure();
    let built = prebuild.wait().context("waiting for the dependencies' build")?;
    if !built.success() {
        eprintln!("xtask: the dependencies' build failed ({built}); the agent's build will say why");
    }
    installed
}

/// `name@version` of each registry package the agent depends on directly, from `cargo tree`
/// over the committed lock file. Build dependencies are left out: built here they would be
/// compiled with the release profile, and again with the build scripts' own for the agent.
fn agent_dependency_specs() -> Result<Vec<String>> {
    let tree = shell::capture(cargo().args([
        "tree",
        "--locked",
        "-p",
        "lifecycle-agent",
        "--depth",
        "1",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]))?;
    Ok(dependency_specs(&tree))
}

/// The specs in `cargo tree --prefix none --format {p}` output: `name vX.Y.Z` lines without a
/// path (workspace members and the root are skipped), each once.
fn dependency_specs(tree: &str) -> Vec<String> {
    let mut specs: Vec<String> = tree
        .lines()
        .skip(1)
        .filter(|line| !line.contains('('))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (name, version) = (words.next()?, words.next()?.strip_prefix('v')?);
            Some(format!("{name}@{version}"))
        })
        .collect();
    specs.sort();
    specs.dedup();
    specs
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Task::Bootstrap => bootstrap(),
        Task::Run { args } => {
            bootstrap_building_dependencies()?;
            // The agent alone: the kubectl plugin is built when asked for (`--bin kubectl-lifecycle`).
            shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent", "--bin", "lifecycle-agent"]))?;
            let binary = workspace_root().join("target/release/lifecycle-agent");
            eprintln!("xtask: starting {} run {}", binary.display(), args.join(" "));
            let err = Command::new(&binary).arg("run").args(&args).exec();
            Err(err).with_context(|| format!("starting {}", binary.display()))
        }
        Task::Image(args) => {
            bootstrap()?;
            image::run(&args)
        }
        Task::Test { tiers } => {
            bootstrap()?;
            tiers::run(&tiers)
        }
        Task::Fuzz(args) => {
            bootstrap()?;
            fuzz::run(&args)
        }
        Task::Kubernetes => kubernetes::ensure().map(drop),
        Task::KubernetesModern => {
            let node = kubernetes_modern::ensure()?;
            println!("bin={}\ncni={}", node.bin.display(), node.cni.display());
            Ok(())
        }
        Task::Helm => {
            println!("{}", helm::ensure()?.display());
            Ok(())
        }
        Task::Bench { which } => {
            bootstrap()?;
            bench::run(which)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dependency_specs;

    #[test]
    fn dependency_specs_are_the_registry_packages_of_cargo_tree_once_each() {
        let tree = "lifecycle-agent v0.1.0 (/w/lifecycle-agent)\nanyhow v1.0.104\nkube v5.0.0\n\
                    lifecycle-common v0.1.0 (/w/lifecycle-common)\nanyhow v1.0.104\n\n";
        assert_eq!(dependency_specs(tree), ["anyhow@1.0.104", "kube@5.0.0"]);
    }
}
