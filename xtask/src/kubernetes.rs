//! kube-apiserver and kubelet for the kubelet tier, built once from Debian's `kubernetes` source
//! package with Debian's Go and cached per machine in `/var/cache/lifecycle/kubernetes` (or under
//! `$LIFECYCLE_KUBERNETES_CACHE`), as helm and the current node's binaries are: every clone of
//! the repository finds them there (under each clone's `target/`, a clean clone spent ~6.5 of its
//! suite's 40 minutes building them again).
//!
//! No registry serves prebuilt binaries here, so they are built from source (~5 min on 2 cores,
//! once):
//! 1. a private apt configuration (`<cache>/apt`) whose only entries are `deb-src`
//!    copies of this machine's own Debian entries, read at run time from its sources file (so no
//!    archive host is written anywhere in the repository); the system's apt state is untouched;
//! 2. `apt-get source --download-only kubernetes=<version>` (the newest source version whose
//!    upstream is the pinned `KUBERNETES_VERSION`), `dpkg-source -x`;
//! 3. `make WHAT="cmd/kubelet cmd/kube-apiserver"` with `CGO_ENABLED=0`, the pinned
//!    `KUBE_GIT_VERSION`, a clean tree state, and a private GOCACHE/GOPATH/HOME/TMPDIR (no module
//!    downloads: the source is vendored, GOPROXY is off).
//!
//! The binaries land in `<cache>/<debian version>/bin` with a `BUILD` stamp, and `<cache>/bin`
//! points there. A run whose stamp matches the pin does nothing (not even an apt call). The
//! downloaded source package is kept; the extracted tree (2 GB with the Go build cache, which
//! Kubernetes' build scripts keep under `_output` whatever GOCACHE says) is removed after a
//! build, so a changed pin or Debian revision builds cold again. A lock in the cache lets one
//! clone build while another waits for its binaries.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    lock::Lock,
    packages,
    shell::{capture, run},
    toolchain,
};

/// The upstream release to build (`KUBERNETES_VERSION` in toolchains.env, with its `v`).
pub const VERSION: &str = toolchain::KUBERNETES_VERSION;
/// Debian's source package.
const SOURCE_PACKAGE: &str = "kubernetes";
/// What `make WHAT=...` builds, and the binaries installed from it.
const TARGETS: &[&str] = &["cmd/kubelet", "cmd/kube-apiserver"];
pub const BINARIES: &[&str] = &["kubelet", "kube-apiserver"];
/// The machine's Debian entries (deb822), else the one-line list.
const HOST_DEB822: &str = "/etc/apt/sources.list.d/debian.sources";
const HOST_ONE_LINE: &str = "/etc/apt/sources.list";
/// The environment variable the kubelet tier's tests read the binaries' directory from.
pub const BIN_ENV: &str = "LIFECYCLE_KUBE_BIN";
/// The environment variables the modern tier's tests read the current node's binaries and CNI
/// plugins from (lifecycle-testkit's `kube::NodeVersion::V1_37`).
pub const MODERN_BIN_ENV: &str = "LIFECYCLE_KUBE_MODERN_BIN";
pub const MODERN_CNI_ENV: &str = "LIFECYCLE_KUBE_MODERN_CNI";

/// The machine-level cache, unless the environment names another.
const CACHE_ROOT: &str = "/var/cache/lifecycle/kubernetes";
const CACHE_ENV: &str = "LIFECYCLE_KUBERNETES_CACHE";

/// `/var/cache/lifecycle/kubernetes`, or `$LIFECYCLE_KUBERNETES_CACHE`.
fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(CACHE_ROOT), PathBuf::from)
}

/// Where the current binaries are (a symlink into the versioned build).
pub fn bin_dir() -> PathBuf {
    cache_dir().join("bin")
}

/// Returns the directory holding kubelet and kube-apiserver, building them first unless the
/// cache already has them for the pinned version.
pub fn ensure() -> Result<PathBuf> {
    if let Some(build) = cached() {
        eprintln!("xtask: kubernetes {VERSION} cached in {} ({build})", bin_dir().display());
        return Ok(bin_dir());
    }
    fs::create_dir_all(cache_dir()).with_context(|| format!("creating {}", cache_dir().display()))?;
    // One build at a time: a second xtask waits here, then finds the first one's binaries.
    let _lock = Lock::acquire(&cache_dir().join(".lock"))?;
    if let Some(build) = cached() {
        eprintln!("xtask: kubernetes {VERSION} cached in {} ({build})", bin_dir().display());
        return Ok(bin_dir());
    }
    let began = Instant::now();
    eprintln!("xtask: building kubernetes {VERSION} (kubelet, kube-apiserver) from Debian's source package, once");
    packages::ensure(packages::KUBERNETES_BUILD)?;
    let apt = PrivateApt::create(&cache_dir().join("apt"))?;
    apt.update()?;
    let version = apt.source_version()?;
    eprintln!("xtask: Debian source {SOURCE_PACKAGE} {version}");
    let source = cache_dir().join("source").join(&version);
    let dsc = apt.download(&version, &source)?;
    let tree = source.join("tree");
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing the stale tree {}", tree.display()))?;
    }
    run(Command::new("dpkg-source").arg("-x").arg(&dsc).arg(&tree).current_dir(&source))?;
    let go_version = make(&tree)?;
    install(&tree, &version, &go_version)?;
    fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    eprintln!("xtask: built kubernetes {VERSION} in {:.0?}: {}", began.elapsed(), bin_dir().display());
    Ok(bin_dir())
}

/// The stamp's summary when the cache holds working binaries of the pinned version.
fn cached() -> Option<String> {
    let bin = bin_dir();
    let stamp = fs::read_to_string(bin.join("BUILD")).ok()?;
    if !stamp.lines().any(|line| line == format!("kubernetes={VERSION}")) {
        return None;
    }
    // The binary itself must agree (a truncated copy or a foreign file fails here).
    let version = Command::new(bin.join("kubelet")).arg("--version").output().ok()?;
    let printed = String::from_utf8_lossy(&version.stdout);
    if !version.status.success() || printed.split_whitespace().last() != Some(VERSION) {
        return None;
    }
    if !BINARIES.iter().all(|b| bin.join(b).is_file()) {
        return None;
    }
    Some(stamp.lines().filter(|l| !l.starts_with("kubernetes=")).collect::<Vec<_>>().join(", "))
}

/// apt with its own source list, lists and cache under `dir`: only deb-src entries, derived from
/// the machine's Debian entries. The system's own lists and caches are not touched.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn create(dir: &Path) -> Result<Self> {
        let parts = dir.join("sources.list.d");
        for sub in [parts.clone(), dir.join("lists/partial"), dir.join("cache/archives/partial")] {
            fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        let (name, text) = if let Ok(deb822) = fs::read_to_string(HOST_DEB822) {
            ("sources", deb_src_stanzas(&deb822))
        } else {
            let one_line = fs::read_to_string(HOST_ONE_LINE)
                .with_context(|| format!("reading the machine's Debian sources ({HOST_DEB822}, {HOST_ONE_LINE})"))?;
            ("list", deb_src_lines(&one_line))
        };
        if text.trim().is_empty() {
            bail!("no Debian `deb` entries in {HOST_DEB822} or {HOST_ONE_LINE} to derive a deb-src entry from");
        }
        // Rewritten each time: it follows the machine's sources, which may change.
        for stale in fs::read_dir(&parts)?.flatten() {
            let _ = fs::remove_file(stale.path());
        }
        fs::write(parts.join(format!("lifecycle-src.{name}")), text).context("writing the private apt sources")?;
        fs::write(dir.join("sources.list"), "").context("writing the private apt sources.list")?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        let options = [
            ("Dir::Etc::SourceList", self.dir.join("sources.list")),
            ("Dir::Etc::SourceParts", self.dir.join("sources.list.d")),
            ("Dir::State::Lists", self.dir.join("lists")),
            ("Dir::Cache", self.dir.join("cache")),
        ];
        for (key, value) in options {
            command.arg("-o").arg(format!("{key}={}", value.display()));
        }
        // The private directories live in the user's tree, which apt's download user may not
        // reach; downloads are checked against the signed index either way.
        command.args(["-o", "APT::Sandbox::User=root", "-q"]).env("DEBIAN_FRONTEND", "noninteractive");
        command
    }

    fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// The newest source version of [`SOURCE_PACKAGE`] whose upstream release is [`VERSION`].
    fn source_version(&self) -> Result<String> {
        let records = capture(self.command("apt-cache").args(["showsrc", "--only-source", SOURCE_PACKAGE]))?;
        let mut best: Option<String> = None;
        for version in source_versions(&records) {
            if !upstream_is(&version, VERSION) {
                continue;
            }
            let newer = match &best {
                None => true,
                Some(current) => Command::new("dpkg")
                    .args(["--compare-versions", &version, "gt", current])
                    .status()
                    .is_ok_and(|s| s.success()),
            };
            if newer {
                best = Some(version);
            }
        }
        best.with_context(|| {
            format!(
                "no {SOURCE_PACKAGE} source package for upstream {VERSION} in this machine's Debian archive \
                 (apt-cache showsrc listed: {:?})",
                source_versions(&records)
            )
        })
    }

    /// Downloads the source package into `dir` (once); returns its .dsc.
    fn download(&self, version: &str, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // The .dsc is named without the epoch.
        let bare = version.split_once(':').map_or(version, |(_, rest)| rest);
        let dsc = dir.join(format!("{SOURCE_PACKAGE}_{bare}.dsc"));
        if !dsc.exists() {
            run(self
                .command("apt-get")
                .args(["source", "--download-only", &format!("{SOURCE_PACKAGE}={version}")])
                .current_dir(dir))?;
        }
        if !dsc.exists() {
            bail!("apt-get source left no {}", dsc.display());
        }
        Ok(dsc)
    }
}

/// Builds the targets in `tree` with Debian's Go; returns `go version`'s answer.
fn make(tree: &Path) -> Result<String> {
    let go = cache_dir().join("go");
    let (cache, path, home, tmp) = (go.join("cache"), go.join("path"), go.join("home"), go.join("tmp"));
    for dir in [&cache, &path, &home, &tmp] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let env = |command: &mut Command| {
        command
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .env("GOCACHE", &cache)
            .env("GOPATH", &path)
            .env("GOPROXY", "off")
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0")
            .env("KUBE_GIT_VERSION", VERSION)
            .env("KUBE_GIT_TREE_STATE", "clean");
    };
    let mut version = Command::new("go");
    env(&mut version);
    let go_version = capture(version.arg("version"))?.trim().to_owned();
    let began = Instant::now();
    eprintln!("xtask: make WHAT=\"{}\" with {go_version} (~5 min on 2 cores)", TARGETS.join(" "));
    let mut make = Command::new("make");
    env(&mut make);
    run(make.current_dir(tree).arg(format!("WHAT={}", TARGETS.join(" "))))?;
    eprintln!("xtask: make took {:.0?}", began.elapsed());
    Ok(go_version)
}

/// Copies the binaries into `<cache>/<version>/bin` with a stamp and points `bin` at it.
fn install(tree: &Path, debian_version: &str, go_version: &str) -> Result<()> {
    let built = tree.join("_output/bin");
    let target = cache_dir().join(debian_version.replace(':', "_"));
    let staging = target.join("bin.new");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    for binary in BINARIES {
        let from = built.join(binary);
        fs::copy(&from, staging.join(binary)).with_context(|| format!("copying {}", from.display()))?;
    }
    fs::write(
        staging.join("BUILD"),
        format!("kubernetes={VERSION}\nsource={SOURCE_PACKAGE} {debian_version}\ngo={go_version}\n"),
    )
    .context("writing the build stamp")?;
    let final_dir = target.join("bin");
    if final_dir.exists() {
        fs::remove_dir_all(&final_dir)?;
    }
    fs::rename(&staging, &final_dir).context("installing the binaries")?;
    // Replace the `bin` link atomically: a new link, renamed over the old one.
    let link = bin_dir();
    let new_link = cache_dir().join("bin.new");
    let _ = fs::remove_file(&new_link);
    let relative = final_dir.strip_prefix(cache_dir()).unwrap_or(&final_dir);
    symlink(relative, &new_link).context("linking the binaries")?;
    fs::rename(&new_link, &link).with_context(|| format!("pointing {} at {}", link.display(), final_dir.display()))
}

/// The deb822 stanzas of `text` that enable `deb` entries, as `deb-src` stanzas with the same
/// URIs, suites, components and keys. Comments go; disabled stanzas are skipped.
fn deb_src_stanzas(text: &str) -> String {
    let mut out = String::new();
    for stanza in text.split("\n\n").map(|s| s.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>()) {
        let field = |name: &str| {
            stanza.iter().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
            })
        };
        let has_deb = field("Types").is_some_and(|types| types.split_whitespace().any(|t| t == "deb"));
        let enabled = field("Enabled").is_none_or(|value| !value.eq_ignore_ascii_case("no"));
        if !has_deb || !enabled || field("URIs").is_none() {
            continue;
        }
        for line in &stanza {
            let is_types = line.split_once(':').is_some_and(|(key, _)| key.trim().eq_ignore_ascii_case("Types"));
            out.push_str(if is_types { "Types: deb-src" } else { line });
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// The `deb` lines of a one-line sources.list, as `deb-src` lines.
fn deb_src_lines(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t")))
        .map(|rest| format!("deb-src {}\n", rest.trim()))
        .collect()
}

/// The `Version:` of every record `apt-cache showsrc` printed.
fn source_versions(records: &str) -> Vec<String> {
    records.lines().filter_map(|line| line.strip_prefix("Version:")).map(|v| v.trim().to_owned()).collect()
}

/// Whether a Debian version's upstream part is `pin` (`v1.20.2`): `1.20.2`, or a repack that
/// says it really is that (`1.20.5+really1.20.2`).
fn upstream_is(debian_version: &str, pin: &str) -> bool {
    let pin = pin.trim_start_matches('v');
    let without_epoch = debian_version.split_once(':').map_or(debian_version, |(_, rest)| rest);
    let upstream = without_epoch.rsplit_once('-').map_or(without_epoch, |(upstream, _revision)| upstream);
    let upstream = upstream.split_once("+ds").map_or(upstream, |(before, _)| before);
    upstream == pin || upstream.rsplit_once("really").is_some_and(|(_, really)| really == pin)
}

#[cfg(test)]
mod tests {
    use super::{deb_src_lines, deb_src_stanzas, source_versions, upstream_is};

    const DEB822: &str = "Types: deb\n# a snapshot comment\nURIs: http://archive.invalid/debian\n\
                          Suites: bookworm bookworm-updates\nComponents: main\n\
                          Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                          Types: deb\nURIs: http://archive.invalid/debian-security\nSuites: bookworm-security\n\
                          Components: main\nEnabled: no\n\n\
                          Types: deb-src\nURIs: http://archive.invalid/other\nSuites: x\nComponents: main\n";

    #[test]
    fn deb822_entries_become_deb_src_with_the_same_archive_and_key() {
        let out = deb_src_stanzas(DEB822);
        assert_eq!(
            out,
            "Types: deb-src\nURIs: http://archive.invalid/debian\nSuites: bookworm bookworm-updates\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        );
    }

    #[test]
    fn one_line_deb_entries_become_deb_src() {
        let text = "# comment\ndeb [signed-by=/k.gpg] http://archive.invalid/debian bookworm main\n\
                    deb-src http://archive.invalid/debian bookworm main\n";
        assert_eq!(deb_src_lines(text), "deb-src [signed-by=/k.gpg] http://archive.invalid/debian bookworm main\n");
    }

    #[test]
    fn the_pinned_upstream_is_recognised_in_debian_versions() {
        assert!(upstream_is("1.20.5+really1.20.2-1.1+deb12u1", "v1.20.2"));
        assert!(upstream_is("1.20.5+really1.20.2-1.1", "v1.20.2"));
        assert!(upstream_is("1:1.20.2-3", "v1.20.2"));
        assert!(upstream_is("1.20.2+ds1-1", "v1.20.2"));
        assert!(!upstream_is("1.20.5+really1.20.2-1.1", "v1.20.5"));
        assert!(!upstream_is("1.20.21-1", "v1.20.2"));
        assert!(!upstream_is("1.20.2", "v1.20.21"));
    }

    #[test]
    fn showsrc_versions_are_read_per_record() {
        let records = "Package: kubernetes\nVersion: 1.20.5+really1.20.2-1.1\n\nPackage: kubernetes\n\
                       Version: 1.20.5+really1.20.2-1.1+deb12u1\n";
        assert_eq!(source_versions(records), ["1.20.5+really1.20.2-1.1", "1.20.5+really1.20.2-1.1+deb12u1"]);
    }
}
