//! `cargo xtask`: bootstrap, run, test tiers and benchmarks. Not the normal build: the agent
//! builds with plain cargo (its build script embeds the checked-in eBPF object, or builds the
//! programs from source once `bootstrap` has installed the eBPF toolchain).

mod bench;
mod bench_probes;
mod cross;
mod cross_linux;
mod debian;
mod ebpf;
mod fuzz;
mod helm;
mod image;
mod kubernetes;
mod kubernetes_modern;
mod lock;
mod matrix;
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
    /// Install what the agent's build needs: the build's Debian packages, and the pinned nightly,
    /// rust-src and bpf-linker unless the checked-in eBPF object is current.
    Bootstrap,
    /// Rebuild the checked-in eBPF object (lifecycle-ebpf/object/) from source and record its
    /// inputs' digest; run it after changing lifecycle-ebpf, lifecycle-common or the lock file.
    EbpfObject {
        /// Change nothing; fail unless the object is current and rebuilds byte for byte.
        #[arg(long)]
        check: bool,
    },
    /// Bootstrap, build the agent in release mode, and start it on this host.
    Run {
        /// Arguments for `lifecycle-agent run` (e.g. --listen 0.0.0.0:9890).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Bootstrap, build the agent in release mode and pack its OCI image archive (no registry,
    /// no container engine): `target/image/lifecycle-agent-<version>-<arch>.tar`.
    Image(image::ImageArgs),
    /// Bootstrap and run every test tier (unit, checks, kernel, runtime, hostile, kubelet, modern, matrix).
    Test {
        /// Run only these tiers (repeatable): unit, checks, kernel, runtime, hostile, kubelet, modern, matrix.
        #[arg(long = "tier", value_enum)]
        tiers: Vec<tiers::Tier>,
    },
    /// Run the cargo-fuzz targets in fuzz/ (installs cargo-fuzz); results go to BENCHMARKS.md by hand.
    Fuzz(fuzz::FuzzArgs),
    /// Build kube-apiserver and kubelet from Debian's source package into
    /// /var/cache/lifecycle/kubernetes/bin (once per machine: later runs find them cached); the
    /// kubelet tier does this itself.
    Kubernetes,
    /// Provide a current node's binaries (kubelet and kube-apiserver of KUBERNETES_MODERN_VERSION,
    /// runc 1.3 and containerd 2.4 built with Go; etcd and the CNI plugins from Debian unstable) in
    /// /var/cache/lifecycle/kubernetes-modern (once per machine: later runs find them cached).
    KubernetesModern,
    /// Provide the kernel matrix's kernels and root images (Debian's cloud kernels, a bookworm
    /// debootstrap root, an arm64 busybox root) in /var/cache/lifecycle/matrix (once per
    /// machine: later runs find them cached); the matrix tier does this itself.
    KernelMatrix,
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

/// What the agent's build needs: the eBPF toolchain only when its build script will build the
/// programs from source (the checked-in object is not current for these sources).
fn bootstrap() -> Result<()> {
    if ebpf::is_current() {
        eprintln!("xtask: the checked-in eBPF object is current; no nightly or bpf-linker needed");
        return packages::ensure(packages::BUILD);
    }
    bootstrap_all()
}

/// Everything, the eBPF toolchain included: the tiers (the checks tier rebuilds the object, fuzz
/// targets build with the nightly) and the benchmarks.
fn bootstrap_all() -> Result<()> {
    // bpf-linker lands in $CARGO_HOME/bin; aya-build looks it up on PATH.
    if let Some(bin) = toolchain::bpf_linker_path().parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut parts = vec![bin.to_path_buf()];
        parts.extend(std::env::split_paths(&path));
        let joined = std::env::join_paths(parts).context("building PATH")?;
        // SAFETY: single-threaded at this point; no other thread reads the environment.
        unsafe { std::env::set_var("PATH", joined) };
    }
    toolchain::ensure()?;
    packages::ensure(packages::BUILD)
}

/// The release agent, and the kubectl plugin beside it for this machine's kubectl, in one cargo
/// invocation: the crates both use (kube, k8s-openapi, tokio, rustls, the model) are then built
/// once with one feature set. Two invocations built 44 of them twice, since the plugin alone asks
/// for fewer features (75 s more on a fresh machine; BENCHMARKS.md: fresh-machine run).
pub fn build_agent_and_plugin() -> Result<()> {
    shell::run(cargo().args([
        "build",
        "--release",
        "-p",
        "lifecycle-agent",
        "--bin",
        "lifecycle-agent",
        "-p",
        "kubectl-lifecycle",
    ]))
}

/// Says where the plugin is and the one command that installs it.
pub fn plugin_built() {
    eprintln!(
        "xtask: the kubectl plugin is target/release/kubectl-lifecycle; install it with\n  \
         install -m 0755 target/release/kubectl-lifecycle /usr/local/bin/kubectl-lifecycle\n\
         then `kubectl lifecycle --help` (deploy/README.md: the plugin, its RBAC, krew)"
    );
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Task::Bootstrap => bootstrap(),
        Task::EbpfObject { check } => {
            bootstrap_all()?;
            if check {
                ebpf::check()
            } else {
                ebpf::write()
            }
        }
        Task::Run { args } => {
            bootstrap()?;
            build_agent_and_plugin()?;
            plugin_built();
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
            bootstrap_all()?;
            tiers::run(&tiers)
        }
        Task::Fuzz(args) => {
            bootstrap_all()?;
            fuzz::run(&args)
        }
        Task::Kubernetes => kubernetes::ensure().map(drop),
        Task::KubernetesModern => {
            let node = kubernetes_modern::ensure()?;
            println!("bin={}\ncni={}", node.bin.display(), node.cni.display());
            Ok(())
        }
        Task::KernelMatrix => matrix::provide_only(),
        Task::Helm => {
            println!("{}", helm::ensure()?.display());
            Ok(())
        }
        Task::Bench { which } => {
            bootstrap_all()?;
            bench::run(which)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{error::ErrorKind, Parser as _};

    use super::{workspace_root, Cli};

    /// Every `xtask/x.sh ...` in the README, the deploy guide and the docs is a task and flags
    /// xtask takes: parsed with `--help` appended, clap shows help rather than an error.
    #[test]
    fn every_documented_task_is_one_xtask_takes() {
        // BENCHMARKS.md is left out (not among the documents): its commands are a record of
        // what ran then.
        let found: Vec<lifecycle_testkit::docs::DocCommand> = lifecycle_testkit::docs::documents(&workspace_root())
            .iter()
            .flat_map(|(name, text)| lifecycle_testkit::docs::commands(name, text, &["x.sh"]))
            .collect();
        for task in ["run", "test", "image", "bench"] {
            assert!(found.iter().any(|c| c.args.first().is_some_and(|a| a == task)), "no documented `x.sh {task}`");
        }
        let refused: Vec<String> = found
            .iter()
            .filter_map(|command| {
                let words = std::iter::once("xtask").chain(command.args.iter().map(String::as_str)).chain(["--help"]);
                match Cli::try_parse_from(words) {
                    // `run` passes everything after it on to the agent, `--help` included.
                    Ok(_) => None,
                    Err(err) if err.kind() == ErrorKind::DisplayHelp => None,
                    Err(err) => Some(format!("{}: x.sh {}: {}", command.at, command.args.join(" "), err.kind())),
                }
            })
            .collect();
        assert!(refused.is_empty(), "documented tasks xtask refuses:\n{}", refused.join("\n"));
    }
}
