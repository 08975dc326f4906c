//! helm for the checks tier (`helm lint`, `helm template` of deploy/helm/lifecycle-agent) and the
//! kubelet tier (`helm install`), built with Go from the module proxy: `xtask/helm/go.mod`
//! requires `helm.sh/helm/v3` at the version used (its go.sum committed, the build
//! `-mod=readonly`, as for the modern node's binaries), with the ldflags helm's Makefile sets
//! (its version, and the Kubernetes version of its client-go for `.Capabilities`).
//!
//! Cached per machine in `/var/cache/lifecycle/helm/<version>/bin/helm` (or under
//! `$LIFECYCLE_HELM_CACHE`), the Go module and build caches beside it: a run whose copies of
//! go.mod and go.sum match the repository's and whose binary reports the version builds nothing
//! and makes no network call. One build per machine at a time (an flock).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result};

use crate::{
    kubernetes_modern::go::{required_version, Go},
    lock::Lock,
    shell::run,
    workspace_root,
};

/// The machine-level cache root, unless the environment names another.
const CACHE_ROOT: &str = "/var/cache/lifecycle/helm";
const CACHE_ENV: &str = "LIFECYCLE_HELM_CACHE";
/// The module `xtask/helm/go.mod` requires, and the package built from it.
const MODULE: &str = "helm.sh/helm/v3";
const PACKAGE: &str = "helm.sh/helm/v3/cmd/helm";
/// The files whose content decides what is built (copies are kept beside the binary).
const INPUTS: &[&str] = &["go.mod", "go.sum"];

fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(CACHE_ROOT), PathBuf::from)
}

/// The Go module of the repository (`xtask/helm`).
fn module_dir() -> PathBuf {
    workspace_root().join("xtask/helm")
}

/// The helm version `xtask/helm/go.mod` requires.
fn version() -> Result<String> {
    let go_mod = fs::read_to_string(module_dir().join("go.mod")).context("reading xtask/helm/go.mod")?;
    required_version(&go_mod, MODULE).context("xtask/helm/go.mod requires no helm.sh/helm/v3")
}

/// Returns the path of a helm binary of the version go.mod requires, building it first unless
/// the cache has it.
pub fn ensure() -> Result<PathBuf> {
    let version = version()?;
    let dir = cache_root().join(&version);
    let helm = dir.join("bin/helm");
    if cached(&dir, &version) {
        eprintln!("xtask: helm {version} cached in {}", helm.display());
        return Ok(helm);
    }
    let root = cache_root();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let _lock = Lock::acquire(&root.join(".lock"))?;
    if cached(&dir, &version) {
        eprintln!("xtask: helm {version} cached in {}", helm.display());
        return Ok(helm);
    }
    let began = Instant::now();
    // Module and build caches are shared by every version: a version bump rebuilds little.
    let go = Go::new(&root.join("go"))?;
    let go_mod = fs::read_to_string(module_dir().join("go.mod")).context("reading xtask/helm/go.mod")?;
    let ldflags = ldflags(&version, required_version(&go_mod, "k8s.io/client-go").as_deref())
        .context("xtask/helm/go.mod requires no k8s.io/client-go v0.<minor>.<patch>")?;
    eprintln!("xtask: go build {PACKAGE} {version} with {} (~2 min cold; once per machine)", go.version);
    let staging = dir.join("bin.new");
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(staging.join("inputs")).with_context(|| format!("creating {}", staging.display()))?;
    let mut build = go.command(&module_dir());
    build.env("CGO_ENABLED", "0").args(["build", "-trimpath"]).arg(format!("-ldflags={ldflags}"));
    run(build.arg("-o").arg(staging.join("helm")).arg(PACKAGE))?;
    for input in INPUTS {
        fs::copy(module_dir().join(input), staging.join("inputs").join(input))
            .with_context(|| format!("copying {input}"))?;
    }
    let bin = dir.join("bin");
    if bin.exists() {
        fs::remove_dir_all(&bin).with_context(|| format!("removing {}", bin.display()))?;
    }
    fs::rename(&staging, &bin).with_context(|| format!("moving {} to {}", staging.display(), bin.display()))?;
    anyhow::ensure!(cached(&dir, &version), "the helm just built does not report {version}");
    eprintln!("xtask: helm {version} built in {:.0?}: {}", began.elapsed(), helm.display());
    Ok(helm)
}

/// Whether `dir/bin` holds a helm reporting `version`, built from the repository's go.mod and
/// go.sum as they are now. Local only.
fn cached(dir: &Path, version: &str) -> bool {
    let bin = dir.join("bin");
    let inputs_match = INPUTS.iter().all(|input| {
        let recorded = fs::read(bin.join("inputs").join(input)).ok();
        recorded.is_some() && recorded == fs::read(module_dir().join(input)).ok()
    });
    inputs_match
        && Command::new(bin.join("helm"))
            .args(["version", "--template", "{{.Version}}"])
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == version)
}

/// helm's Makefile's ldflags: its version, and the Kubernetes version `.Capabilities` and the
/// deprecation lint assume without a cluster (client-go `v0.<minor>.x` is Kubernetes `1.<minor>`).
fn ldflags(version: &str, client_go: Option<&str>) -> Option<String> {
    let minor = client_go?.strip_prefix("v0.")?.split('.').next()?;
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut flags =
        vec!["-s".to_owned(), "-w".to_owned(), format!("-X helm.sh/helm/v3/internal/version.version={version}")];
    for package in ["helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"] {
        flags.push(format!("-X {package}.k8sVersionMajor=1"));
        flags.push(format!("-X {package}.k8sVersionMinor={minor}"));
    }
    Some(flags.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_go_mod_pins_a_helm_3_and_its_client_go() {
        let version = version().unwrap_or_default();
        assert!(version.starts_with("v3."), "{version}");
        let go_mod = fs::read_to_string(module_dir().join("go.mod")).unwrap_or_default();
        assert!(go_mod.lines().any(|l| l.trim() == format!("tool {PACKAGE}")), "go.mod declares the tool");
        let flags = ldflags(&version, required_version(&go_mod, "k8s.io/client-go").as_deref()).unwrap_or_default();
        assert!(flags.contains(&format!("internal/version.version={version}")), "{flags}");
    }

    #[test]
    fn ldflags_follow_client_go() {
        let flags = ldflags("v3.22.0", Some("v0.35.1")).unwrap_or_default();
        assert!(flags.contains("-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=35"), "{flags}");
        assert!(flags.contains("-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"), "{flags}");
        assert_eq!(ldflags("v3.22.0", Some("v1.2.3")), None);
        assert_eq!(ldflags("v3.22.0", None), None);
    }
}
