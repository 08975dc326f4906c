//! The parts of a current Kubernetes node (kubelet and kube-apiserver of
//! `KUBERNETES_MODERN_VERSION`, containerd 2.x, runc 1.3, etcd, the CNI plugins), provided once
//! per machine and cached outside the work tree, so every clone on the machine reuses them.
//!
//! The kubelet tier's node (`kubernetes.rs`) is 1.20, the newest Debian builds a kubelet from;
//! no registry reachable here ships newer kubelet or kube-apiserver binaries, and Debian's newer
//! containerd needs a runc this Debian does not have. So:
//! - kubelet and kube-apiserver are built with Go from the Go module proxy: `kubernetes-modern/go.mod`
//!   (beside this crate) requires `k8s.io/kubernetes` at the pin and replaces each staging module
//!   (`k8s.io/api`, `k8s.io/component-base`, ...) with its published `v0.<minor>.<patch>`: upstream's
//!   own go.mod points them at `./staging/...`, which a dependent module ignores. Its go.sum is
//!   committed and the build is `-mod=readonly`, so what is built is what was reviewed.
//! - runc is built the same way from `kubernetes-modern/runc/go.mod` (with cgo and seccomp, against
//!   this machine's libseccomp): Debian unstable's runc 1.3 is linked against glibc 2.38, and this
//!   Debian has 2.36 (`GLIBC_2.38' not found`).
//! - containerd (with its shim and `ctr`) is built from `kubernetes-modern/containerd/go.mod`,
//!   without cgo: container stop signals (`lifecycle.stopSignal`) need containerd 2.3 or newer,
//!   and Debian unstable has 2.1.
//! - etcd and the CNI plugins come from Debian unstable through a private apt
//!   configuration whose only entry is derived at run time from this machine's own Debian archive
//!   (no archive host is written in the repository), downloaded with `apt-get download` and
//!   unpacked with `dpkg -x` into a private prefix: the system's packages, apt lists and caches
//!   are never touched. Their binaries are dynamically linked against glibc >= 2.34 only.
//!
//! Everything lives in `/var/cache/lifecycle/kubernetes-modern/<version>/` (or under
//! `$LIFECYCLE_KUBERNETES_MODERN_CACHE`): the Go module and build caches, the private apt state,
//! the prefix and `bin/` with every binary and a `BUILD` stamp. A run whose stamp matches the pin
//! and whose recorded go.mod/go.sum copies match the repository's does nothing, not even a network
//! call. One build at a time per machine (an flock); a failed build leaves the previous `bin/` in
//! place and the caches warm.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{ensure, Context as _, Result};

pub(crate) mod go;

use go::{check_go_mod, required_version, Go};

use crate::{
    debian::{unpack, Deb, PrivateApt},
    lock::Lock,
    packages,
    shell::{capture, run},
    toolchain, workspace_root,
};

/// The release of kubelet and kube-apiserver (`KUBERNETES_MODERN_VERSION` in toolchains.env).
pub const VERSION: &str = toolchain::KUBERNETES_MODERN_VERSION;
/// The machine-level cache root, unless the environment names another.
const CACHE_ROOT: &str = "/var/cache/lifecycle/kubernetes-modern";
const CACHE_ENV: &str = "LIFECYCLE_KUBERNETES_MODERN_CACHE";
/// The Go packages built from `kubernetes-modern/go.mod`, installed under their last element.
const KUBERNETES_PACKAGES: &[&str] = &["k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-apiserver"];
/// The runc module in `kubernetes-modern/runc/go.mod` (its main package is the module root).
const RUNC_MODULE: &str = "github.com/opencontainers/runc";
/// The containerd module in `kubernetes-modern/containerd/go.mod`.
const CONTAINERD_MODULE: &str = "github.com/containerd/containerd/v2";
/// containerd's main packages, installed under their last element.
const CONTAINERD_PACKAGES: &[&str] = &[
    "github.com/containerd/containerd/v2/cmd/containerd",
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    "github.com/containerd/containerd/v2/cmd/ctr",
];
/// The oldest containerd whose CRI plugin applies a container's stop signal.
const CONTAINERD_MINIMUM: (u64, u64) = (2, 3);
/// The version variables Kubernetes' own build sets with -X, in both packages that carry them
/// (component-base's is what `--version` and /version print; client-go's is the user agent).
const VERSION_PACKAGES: &[&str] = &["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"];
/// The Debian suite etcd 3.5+ and the CNI plugins come from.
const DEBIAN_SUITE: &str = "unstable";
/// Debian packages unpacked into the prefix, with the binaries linked from `bin/`.
const DEBIAN_PACKAGES: &[(&str, &[&str])] =
    &[("etcd-server", &["usr/bin/etcd", "usr/bin/etcdutl"]), ("containernetworking-plugins", &[])];
/// Where the CNI plugins are inside the prefix.
const CNI_IN_PREFIX: &str = "usr/lib/cni";
/// The Go settings read from the user's environment (with `go env`, so a GOENV file counts) and
/// handed to the build, whose environment is otherwise cleared: where modules come from.
const INHERITED_GO_SETTINGS: &[&str] = &["GOPROXY", "GOSUMDB", "GONOSUMDB", "GONOPROXY", "GOPRIVATE", "GOINSECURE"];
/// Variables a module download may need that `go env` does not report.
const INHERITED_VARIABLES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// Where the node's binaries are.
pub struct Node {
    /// kubelet, kube-apiserver, runc, containerd, containerd-shim-runc-v2, ctr, etcd, etcdutl and
    /// the `BUILD` stamp.
    pub bin: PathBuf,
    /// The CNI plugins (bridge, host-local, loopback, ...).
    pub cni: PathBuf,
}

/// The cache root: `$LIFECYCLE_KUBERNETES_MODERN_CACHE` or [`CACHE_ROOT`].
fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(CACHE_ROOT), PathBuf::from)
}

/// This release's directory in the cache.
fn version_dir() -> PathBuf {
    cache_root().join(VERSION)
}

/// The Go modules of the repository (`xtask/kubernetes-modern`).
fn modules_dir() -> PathBuf {
    workspace_root().join("xtask/kubernetes-modern")
}

fn node() -> Node {
    let dir = version_dir();
    Node { bin: dir.join("bin"), cni: dir.join("prefix").join(CNI_IN_PREFIX) }
}

/// The files whose content decides what is built; copies are kept beside the stamp, so an edited
/// go.mod or go.sum rebuilds and an unchanged one is recognised without the network.
const INPUTS: &[&str] = &["go.mod", "go.sum", "runc/go.mod", "runc/go.sum", "containerd/go.mod", "containerd/go.sum"];

/// Returns where the node's binaries are, providing them first unless the cache has them.
pub fn ensure() -> Result<Node> {
    if let Some(summary) = cached() {
        eprintln!("xtask: kubernetes-modern {VERSION} cached in {} ({summary})", node().bin.display());
        return Ok(node());
    }
    let root = cache_root();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    // One build per machine at a time: a second xtask waits here, then finds the first one's work.
    let _lock = Lock::acquire(&root.join(".lock"))?;
    if let Some(summary) = cached() {
        eprintln!("xtask: kubernetes-modern {VERSION} cached in {} ({summary})", node().bin.display());
        return Ok(node());
    }
    let began = Instant::now();
    let modules = modules_dir();
    let go_mod = read(&modules.join("go.mod"))?;
    check_go_mod(&go_mod, VERSION)?;
    let runc_version = required_version(&read(&modules.join("runc/go.mod"))?, RUNC_MODULE)
        .context("kubernetes-modern/runc/go.mod requires no runc")?;
    let containerd_version = required_version(&read(&modules.join("containerd/go.mod"))?, CONTAINERD_MODULE)
        .context("kubernetes-modern/containerd/go.mod requires no containerd")?;
    ensure!(
        minor_version(&containerd_version).is_some_and(|v| v >= CONTAINERD_MINIMUM),
        "kubernetes-modern/containerd/go.mod requires containerd {containerd_version}; stop signals need {}.{}+",
        CONTAINERD_MINIMUM.0,
        CONTAINERD_MINIMUM.1
    );
    eprintln!("xtask: providing kubernetes-modern {VERSION} in {} (once per machine)", version_dir().display());
    // runc is built with cgo against this machine's libseccomp.
    packages::ensure(packages::KUBERNETES_MODERN_BUILD)?;

    let dir = version_dir();
    let apt = PrivateApt::create(&dir.join("apt"), &[DEBIAN_SUITE], &["amd64"])?;
    apt.update()?;
    let debs = apt.download(&DEBIAN_PACKAGES.iter().map(|(name, _)| *name).collect::<Vec<_>>(), &dir.join("debs"))?;
    unpack(&debs, &dir.join("prefix"))?;

    let go = Go::new(&dir.join("go"))?;
    let staging = dir.join("bin.new");
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    go.build_kubernetes(&modules, &staging)?;
    go.build_runc(&modules.join("runc"), &runc_version, &staging)?;
    go.build_containerd(&modules.join("containerd"), &containerd_version, CONTAINERD_PACKAGES, &staging)?;
    let built = [("runc", runc_version.as_str()), ("containerd", containerd_version.as_str())];
    install(&staging, &debs, &go.version, &built)?;
    let summary = cached().context("the binaries just installed do not pass the cache check")?;
    eprintln!(
        "xtask: kubernetes-modern {VERSION} ready in {:.0?}: {} ({summary})",
        began.elapsed(),
        node().bin.display()
    );
    Ok(node())
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `(2, 4)` for `v2.4.2`.
fn minor_version(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.strip_prefix('v')?.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The stamp's summary when `bin/` holds working binaries of the pin, built from the inputs the
/// repository has now. Local only: reads files and asks the kubelet its version.
fn cached() -> Option<String> {
    let dir = version_dir();
    let bin = dir.join("bin");
    let stamp = fs::read_to_string(bin.join("BUILD")).ok()?;
    if !stamp.lines().any(|line| line == format!("kubernetes={VERSION}")) {
        return None;
    }
    for input in INPUTS {
        let recorded = fs::read(bin.join("inputs").join(input)).ok()?;
        if fs::read(modules_dir().join(input)).ok()? != recorded {
            return None;
        }
    }
    let mut binaries = vec!["runc"];
    binaries.extend(KUBERNETES_PACKAGES.iter().chain(CONTAINERD_PACKAGES).filter_map(|p| p.rsplit('/').next()));
    binaries.extend(DEBIAN_PACKAGES.iter().flat_map(|(_, files)| files.iter().filter_map(|f| f.rsplit('/').next())));
    // A link into the prefix counts only when its target is there too.
    if !binaries.iter().all(|b| bin.join(b).is_file()) || !node().cni.join("bridge").is_file() {
        return None;
    }
    // The binary itself must agree (a truncated copy or a foreign file fails here).
    let version = Command::new(bin.join("kubelet")).arg("--version").output().ok()?;
    let printed = String::from_utf8_lossy(&version.stdout);
    if !version.status.success() || printed.split_whitespace().last() != Some(VERSION) {
        return None;
    }
    Some(stamp.lines().filter(|l| !l.starts_with("kubernetes=")).collect::<Vec<_>>().join(", "))
}

/// Completes `staging` (the Go-built binaries) with links into the prefix, the input copies and
/// the stamp, and puts it in place of `bin/`.
fn install(staging: &Path, debs: &[Deb], go_version: &str, built: &[(&str, &str)]) -> Result<()> {
    for (_, files) in DEBIAN_PACKAGES {
        for file in *files {
            let name = file.rsplit('/').next().unwrap_or(file);
            // Relative, so the version directory can move as a whole.
            symlink(Path::new("../prefix").join(file), staging.join(name))
                .with_context(|| format!("linking {name}"))?;
        }
    }
    for input in INPUTS {
        let to = staging.join("inputs").join(input);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        fs::copy(modules_dir().join(input), &to).with_context(|| format!("copying {input}"))?;
    }
    let mut stamp = format!("kubernetes={VERSION}\ngo={go_version}\n");
    for (name, version) in built {
        stamp.push_str(&format!("{name}={version} (built)\n"));
    }
    for deb in debs {
        stamp.push_str(&format!("{}={} (Debian {DEBIAN_SUITE})\n", deb.package, deb.version));
    }
    fs::write(staging.join("BUILD"), stamp).context("writing the build stamp")?;
    let bin = node().bin;
    if bin.exists() {
        fs::remove_dir_all(&bin).with_context(|| format!("removing {}", bin.display()))?;
    }
    fs::rename(staging, &bin).with_context(|| format!("moving {} to {}", staging.display(), bin.display()))
}

#[cfg(test)]
mod tests {
    use super::{
        check_go_mod,
        go::{staging_version, version_ldflags},
        minor_version, modules_dir, required_version, CONTAINERD_MINIMUM, CONTAINERD_MODULE, RUNC_MODULE, VERSION,
    };

    #[test]
    fn the_committed_go_mod_builds_the_pinned_release() {
        let go_mod = std::fs::read_to_string(modules_dir().join("go.mod")).unwrap_or_default();
        assert!(check_go_mod(&go_mod, VERSION).is_ok(), "{:?}", check_go_mod(&go_mod, VERSION));
        let runc = std::fs::read_to_string(modules_dir().join("runc/go.mod")).unwrap_or_default();
        assert!(required_version(&runc, RUNC_MODULE).is_some_and(|v| v.starts_with("v1.3.")));
        let containerd = std::fs::read_to_string(modules_dir().join("containerd/go.mod")).unwrap_or_default();
        let containerd = required_version(&containerd, CONTAINERD_MODULE).unwrap_or_default();
        assert!(minor_version(&containerd).is_some_and(|v| v >= CONTAINERD_MINIMUM), "{containerd}");
        assert_eq!(minor_version("v2.2.9"), Some((2, 2)));
        assert_eq!(minor_version("2.4"), None);
    }

    #[test]
    fn go_mod_checks_catch_a_pin_and_go_mod_that_disagree() {
        let good = "module x\n\nrequire (\n\tk8s.io/kubernetes v1.37.2\n\tother v1.0.0 // indirect\n)\n\n\
                    replace (\n\tk8s.io/api => k8s.io/api v0.37.2\n)\n";
        assert!(check_go_mod(good, "v1.37.2").is_ok());
        assert!(check_go_mod(good, "v1.37.3").is_err(), "the require differs from the pin");
        let stale = good.replace("k8s.io/api v0.37.2", "k8s.io/api v0.37.1");
        assert!(check_go_mod(&stale, "v1.37.2").is_err(), "a staging module of another release");
        let local = good.replace("k8s.io/api v0.37.2", "./staging/src/k8s.io/api");
        assert!(check_go_mod(&local, "v1.37.2").is_err(), "upstream's path replacement");
        let one_line = "module x\nrequire k8s.io/kubernetes v1.37.2\nreplace k8s.io/api => k8s.io/api v0.37.2\n";
        assert!(check_go_mod(one_line, "v1.37.2").is_ok());
        assert!(check_go_mod("module x\nrequire k8s.io/kubernetes v1.37.2\n", "v1.37.2").is_err(), "no replace");
    }

    #[test]
    fn versions_derive_from_the_release() {
        assert_eq!(staging_version("v1.37.2").as_deref(), Some("v0.37.2"));
        assert_eq!(staging_version("v1.37"), None);
        assert_eq!(staging_version("1.37.2"), None);
        let flags = version_ldflags("v1.37.2").unwrap_or_default();
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"), "{flags}");
        assert!(flags.contains("-X k8s.io/component-base/version.gitMinor=37"), "{flags}");
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMajor=1"), "{flags}");
    }
}
