//! Test tiers. `unit` needs nothing; `kernel` loads the real programs into this kernel; `runtime`
//! drives a real containerd + runc; `checks` enforces formatting and clippy on the host crates,
//! validates dashboards, manifests and rules with real tools, and smoke-runs the fuzz targets.
//! `hostile` runs real containers doing what a hostile pod can do to the agent (floods, port
//! sprays, silent clients) and asserts its memory, series and health. `kubelet` runs a real node
//! (kube-apiserver and kubelet built once from Debian's source package). `modern` runs a current
//! node (kubelet and kube-apiserver 1.37, containerd 2.x, runc 1.3, provided once per machine by
//! `kubernetes_modern`) and judges the agent's verdicts against it. `matrix` boots Debian's
//! kernels 5.10 to the newest, amd64 and arm64, under qemu and checks the agent on each
//! (`matrix`).
//! Tiers that need root say so and are skipped when not root.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Result};

/// Where the kubelet tier's helm test finds helm (lifecycle-testkit's `kube::HELM_ENV`).
const HELM_ENV: &str = "LIFECYCLE_HELM";

use crate::{cargo, fuzz, helm, kubernetes, kubernetes_modern, matrix, packages, shell, toolchain, workspace_root};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    Unit,
    Kernel,
    Runtime,
    Hostile,
    Checks,
    Kubelet,
    Modern,
    Matrix,
}

impl Tier {
    // Checks before Kernel and Runtime: formatting and lint errors show before the long tiers run.
    const ALL: [Tier; 8] = [
        Tier::Unit,
        Tier::Checks,
        Tier::Kernel,
        Tier::Runtime,
        Tier::Hostile,
        Tier::Kubelet,
        Tier::Modern,
        Tier::Matrix,
    ];

    fn needs_root(self) -> bool {
        matches!(self, Tier::Kernel | Tier::Runtime | Tier::Hostile | Tier::Kubelet | Tier::Modern | Tier::Matrix)
    }
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
    })
}

/// Runs the chosen tiers (all when none are named), stopping at the first failing tier.
pub fn run(chosen: &[Tier]) -> Result<()> {
    let tiers: Vec<Tier> = if chosen.is_empty() { Tier::ALL.to_vec() } else { chosen.to_vec() };
    packages::ensure(packages::TEST)?;
    let mut failed = Vec::new();
    for tier in tiers {
        if tier.needs_root() && !is_root() {
            let what = match tier {
                Tier::Kubelet | Tier::Modern => "it runs a kubelet, containerd and pods",
                Tier::Matrix => "it builds root filesystems with debootstrap and chroot",
                _ => "it loads eBPF programs and creates cgroups",
            };
            eprintln!("xtask: skipped tier {tier:?}: {what}, which needs root");
            continue;
        }
        eprintln!("xtask: ==== tier {tier:?} ====");
        let result = match tier {
            // With the documents' commands checked against both binaries' parsers, and the
            // model's recorded runs replayed (pure: no root, no kernel).
            Tier::Unit => shell::run(cargo().args(["test", "--lib", "--bins"]))
                .and_then(|()| {
                    shell::run(cargo().args([
                        "test",
                        "-p",
                        "lifecycle-agent",
                        "-p",
                        "kubectl-lifecycle",
                        "--test",
                        "docs",
                    ]))
                })
                .and_then(|()| shell::run(cargo().args(["test", "-p", "lifecycle-model", "--test", "replay"]))),
            Tier::Kernel => shell::run(cargo().args([
                "test",
                "-p",
                "lifecycle-agent",
                "--test",
                "kernel",
                "--test",
                "cli",
                "--test",
                "probe",
                "--test",
                "faults",
                "--test",
                "doctor",
                "--test",
                "host_units",
                "--test",
                "readme",
            ])),
            Tier::Runtime => {
                // The dashboards test runs its checker with the venv's Python when it exists, so
                // it is set up here too: the checks tier may have stopped before doing so.
                if let Err(err) = python_env() {
                    eprintln!("xtask: no Python venv for the dashboards test, it uses python3: {err:#}");
                }
                packages::ensure(packages::PAGES).and_then(|()| {
                    shell::run(
                        cargo()
                            .args([
                                "test",
                                "-p",
                                "lifecycle-agent",
                                "--test",
                                "containerd_harness",
                                "--test",
                                "e2e",
                                "--test",
                                "runtime_restart",
                                "--test",
                                "dashboards",
                                "--test",
                                "explain_page",
                            ])
                            .args(["--", "--test-threads=1"]),
                    )
                })
            }
            // One at a time: each measures the agent's memory and health while it attacks.
            Tier::Hostile => shell::run(cargo().args(["test", "-p", "lifecycle-agent", "--test", "hostile"]).args([
                "--",
                "--test-threads=1",
                "--nocapture",
            ])),
            Tier::Checks => checks(),
            Tier::Kubelet => kubelet(),
            Tier::Modern => modern(),
            Tier::Matrix => matrix::run(),
        };
        if let Err(err) = result {
            eprintln!("xtask: tier {tier:?} failed: {err:#}");
            failed.push(tier);
        }
    }
    if !failed.is_empty() {
        bail!("failing tiers: {failed:?}");
    }
    Ok(())
}

/// A real node (etcd, kube-apiserver, containerd, the CNI bridge, kubelet) driven with kubectl:
/// installs its packages, builds kube-apiserver and kubelet once per machine (cached in
/// /var/cache/lifecycle/kubernetes), then runs the tests one at a time (each owns the node while
/// it runs).
fn kubelet() -> Result<()> {
    packages::ensure(packages::KUBELET)?;
    if which("kubectl").is_none() {
        packages::ensure(packages::KUBECTL)?;
    }
    let bin = kubernetes::ensure()?;
    // kubelet_helm installs the chart with it.
    let helm = helm::ensure()?;
    // kubelet_daemonset runs the kubectl plugin, a crate of its own, from the same target directory.
    shell::run(cargo().args(["build", "-p", "kubectl-lifecycle"]))?;
    shell::run(
        cargo()
            // --nocapture: the tests print what the node's starts and the pods' steps took.
            .args(["test", "-p", "lifecycle-agent", "--test", "kubelet", "--test", "kubelet_verdicts"])
            .args(["--test", "kubelet_daemonset", "--test", "kubelet_helm", "--test", "kubelet_kustomize"])
            // The DaemonSet on the 1.37 node is the modern tier's.
            .args(["--", "--test-threads=1", "--nocapture", "--skip", MODERN_DAEMONSET_TEST])
            .env(kubernetes::BIN_ENV, bin)
            .env(HELM_ENV, helm),
    )
}

/// A current node (etcd 3.5, kube-apiserver and kubelet 1.37, containerd 2.x, runc 1.3, the CNI
/// bridge) driven with kubectl: provides its binaries once per machine (`kubernetes_modern`), then
/// runs the tests one at a time (each owns the node while it runs).
fn modern() -> Result<()> {
    packages::ensure(packages::MODERN)?;
    // The explain page of the shell-entrypoint case is rendered in a real browser there too.
    packages::ensure(packages::PAGES)?;
    if which("kubectl").is_none() {
        packages::ensure(packages::KUBECTL)?;
    }
    let node = kubernetes_modern::ensure()?;
    shell::run(cargo().args(["build", "-p", "kubectl-lifecycle"]))?;
    shell::run(
        cargo()
            .args(["test", "-p", "lifecycle-agent", "--test", "kubelet_modern"])
            .args(["--", "--test-threads=1", "--nocapture"])
            .env(kubernetes::MODERN_BIN_ENV, &node.bin)
            .env(kubernetes::MODERN_CNI_ENV, &node.cni),
    )?;
    shell::run(
        cargo()
            .args(["test", "-p", "lifecycle-agent", "--test", "kubelet_daemonset"])
            .args(["--", "--test-threads=1", "--nocapture", "--exact", MODERN_DAEMONSET_TEST])
            .env(kubernetes::MODERN_BIN_ENV, &node.bin)
            .env(kubernetes::MODERN_CNI_ENV, &node.cni),
    )
}

/// The DaemonSet test on the 1.37 node (`lifecycle-agent/tests/kubelet_daemonset.rs`).
const MODERN_DAEMONSET_TEST: &str = "the_daemonset_pod_template_runs_the_agent_on_a_1_37_node";

/// `binary`'s path on PATH, if any.
fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(binary)).find(|p| p.is_file())
}

/// Formatting and clippy first (they fail fast, with what to run to fix them), then the kubectl
/// plugin checked for macOS and Windows, then the checked-in eBPF object against a rebuild from source, then the Python-side checks: dashboards' structure and the deploy manifests and alert rules; the Helm
/// chart against the kustomize base (helm built once per machine); last, a short run of every
/// fuzz target (the first one on a machine also builds them, a few minutes).
fn checks() -> Result<()> {
    rust_lints()?;
    crate::cross::check_plugin()?;
    crate::ebpf::check()?;
    python_checks()?;
    chart_checks()?;
    fuzz::smoke()
}

/// `helm lint` and `helm template` of deploy/helm/lifecycle-agent, compared with deploy/
/// (deploy/check_chart.py).
fn chart_checks() -> Result<()> {
    let helm = helm::ensure()?;
    let python = python_env()?;
    let root = workspace_root();
    shell::run(
        Command::new(&python).arg(root.join("deploy/check_chart.py")).arg("--helm").arg(&helm).current_dir(&root),
    )
}

/// `cargo fmt --check` over every workspace member (rustfmt.toml at the root), clippy with
/// warnings denied over the host crates (the default members, all targets: lifecycle-ebpf builds
/// for the bpf target only; it is compiled, not linted, through the agent's build script), and
/// `cargo doc` of the same with warnings denied.
fn rust_lints() -> Result<()> {
    toolchain::ensure_stable_lint_components()?;
    let stable = toolchain::STABLE;
    eprintln!("xtask: cargo +{stable} fmt --all -- --check");
    if let Err(err) = shell::run(cargo().args(["fmt", "--all", "--", "--check"])) {
        bail!(
            "formatting differs from rustfmt.toml (the diff is above); run `cargo +{stable} fmt --all` and commit \
             the result ({err:#})"
        );
    }
    eprintln!("xtask: cargo +{stable} clippy --all-targets -- -D warnings");
    if let Err(err) = shell::run(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"])) {
        bail!("clippy failed: warnings are denied in this tier, or the code does not build (see above) ({err:#})");
    }
    // The docs as `cargo doc` makes them: a broken link or stray markup is a warning, denied. The
    // crate-private items are documented too: the agent is an application whose items are
    // `pub(crate)` by default, and its docs are for the people who work on it.
    eprintln!("xtask: RUSTDOCFLAGS=-D warnings cargo +{stable} doc --no-deps --document-private-items");
    let mut doc = cargo();
    doc.args(["doc", "--no-deps", "--document-private-items"]).env("RUSTDOCFLAGS", "-D warnings");
    if let Err(err) = shell::run(&mut doc) {
        bail!("cargo doc warned (see above): fix the links or markup it names ({err:#})");
    }
    Ok(())
}

/// The tiers' Python: a venv in target/pyenv with deploy/requirements.txt installed.
fn python_env() -> Result<PathBuf> {
    let venv = workspace_root().join("target/pyenv");
    let python = venv.join("bin/python");
    if !python.exists() {
        shell::run(Command::new("/usr/bin/python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let requirements = workspace_root().join("deploy/requirements.txt");
    if requirements.exists() {
        shell::run(
            Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "-r"])
                .arg(&requirements),
        )?;
    }
    Ok(python)
}

/// Dashboards' structure, the deploy manifests and the alert rules (promtool).
fn python_checks() -> Result<()> {
    let python = python_env()?;
    let root = workspace_root();
    for script in ["dashboards/check_dashboards.py", "deploy/check_manifests.py"] {
        let path = root.join(script);
        if !path.exists() {
            bail!("{script} is missing");
        }
        let mut command = Command::new(&python);
        command.arg(&path).current_dir(&root);
        if script.starts_with("dashboards") {
            command.arg("--structure");
        }
        shell::run(&mut command)?;
    }
    Ok(())
}
