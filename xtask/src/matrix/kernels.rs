//! Debian's cloud kernels for the matrix: which `linux-image-<release>` each suite's
//! `linux-image-cloud-<arch>` stands for, downloaded with the packages it is split into (sid
//! splits the image into `linux-binary-*`, `linux-modules-*` and `linux-base-*`) and unpacked
//! with `dpkg -x`: `vmlinuz` and the modules, nothing installed.
//!
//! The resolution (suite -> package and version) is kept in `<cache>/kernels/resolved` and
//! reused for [`REFRESH_AFTER`], so a warm run asks no archive anything; then it is made again
//! (sid moves on), and a kernel that changed is downloaded. `LIFECYCLE_MATRIX_REFRESH=1` makes
//! it again now. Kernels no longer resolved are removed from the cache.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context as _, Result};

use super::Archive;
use crate::debian::{unpack, PrivateApt};

/// The kernels booted, as (architecture, suite).
pub const WANTED: &[(&str, &str)] =
    &[("amd64", "bullseye"), ("amd64", "bookworm"), ("amd64", "trixie"), ("amd64", "sid"), ("arm64", "trixie")];
/// The suites the private apt configuration lists.
pub const SUITES: &[&str] = &["bullseye", "bookworm", "trixie", "sid"];
/// How long a resolution is reused.
const REFRESH_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
const REFRESH_ENV: &str = "LIFECYCLE_MATRIX_REFRESH";

/// One resolved package: what a suite's name stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub arch: String,
    pub suite: String,
    pub package: String,
    pub version: String,
}

/// An unpacked kernel.
pub struct Kernel {
    pub resolved: Resolved,
    /// `uname -r`: the package name without `linux-image-`.
    pub release: String,
    /// Where its packages are unpacked.
    pub dir: PathBuf,
}

impl Kernel {
    /// The kernel image: `boot/vmlinuz-<release>` or, in newer packages, `usr/lib/modules/<release>/vmlinuz`.
    pub fn vmlinuz(&self) -> Option<PathBuf> {
        [self.dir.join(format!("boot/vmlinuz-{}", self.release)), self.modules()?.join("vmlinuz")]
            .into_iter()
            .find(|p| p.is_file())
    }

    /// `lib/modules/<release>` or `usr/lib/modules/<release>`.
    pub fn modules(&self) -> Option<PathBuf> {
        ["lib/modules", "usr/lib/modules"].iter().map(|d| self.dir.join(d).join(&self.release)).find(|p| p.is_dir())
    }
}

/// The packages of a resolution, resolved again when it is old, asked for or incomplete.
pub fn resolution(cache: &Path, archive: &mut Archive) -> Result<Vec<Resolved>> {
    let file = cache.join("kernels/resolved");
    let previous = read_resolution(&file);
    let complete = |r: &[Resolved]| WANTED.iter().all(|(arch, suite)| find(r, arch, suite).is_some());
    let refresh = std::env::var_os(REFRESH_ENV).is_some_and(|v| v == "1");
    if let Some((at, kept)) = &previous {
        let age = SystemTime::now().duration_since(*at).unwrap_or_default();
        if !refresh && age < REFRESH_AFTER && complete(kept) {
            return Ok(kept.clone());
        }
    }
    match archive.apt().and_then(resolve) {
        Ok(fresh) => {
            write_resolution(&file, &fresh)?;
            Ok(fresh)
        }
        Err(err) => match previous {
            Some((_, kept)) if complete(&kept) => {
                eprintln!("xtask: matrix: cannot resolve the kernels again ({err:#}); keeping the last resolution");
                Ok(kept)
            }
            _ => Err(err),
        },
    }
}

pub fn find<'a>(resolved: &'a [Resolved], arch: &str, suite: &str) -> Option<&'a Resolved> {
    resolved.iter().find(|r| r.arch == arch && r.suite == suite)
}

/// `linux-image-cloud-<arch>` of each wanted suite, as the real image package it depends on.
fn resolve(apt: &PrivateApt) -> Result<Vec<Resolved>> {
    let mut out = Vec::new();
    for (arch, suite) in WANTED {
        let meta = format!("linux-image-cloud-{arch}:{arch}/{suite}");
        let depends = apt.depends(&meta)?;
        let (package, version) = depends
            .iter()
            .find_map(|entry| {
                let (name, constraint) = entry.split_once(' ')?;
                let version = constraint.strip_prefix("(= ")?.strip_suffix(')')?;
                let name = name.split(':').next()?;
                (name.starts_with("linux-image-") && name.ends_with(&format!("-cloud-{arch}")))
                    .then(|| (name.to_owned(), version.to_owned()))
            })
            .with_context(|| format!("{meta} depends on no linux-image-*-cloud-{arch} (= version): {depends:?}"))?;
        out.push(Resolved { arch: (*arch).into(), suite: (*suite).into(), package, version });
    }
    Ok(out)
}

fn read_resolution(file: &Path) -> Option<(SystemTime, Vec<Resolved>)> {
    let text = fs::read_to_string(file).ok()?;
    let mut lines = text.lines();
    let at: u64 = lines.next()?.strip_prefix("resolved ")?.parse().ok()?;
    let entries = lines
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some(Resolved {
                arch: words.next()?.into(),
                suite: words.next()?.into(),
                package: words.next()?.into(),
                version: words.next()?.into(),
            })
        })
        .collect();
    Some((UNIX_EPOCH + Duration::from_secs(at), entries))
}

fn write_resolution(file: &Path, entries: &[Resolved]) -> Result<()> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let mut text = format!("resolved {now}\n");
    for r in entries {
        text.push_str(&format!("{} {} {} {}\n", r.arch, r.suite, r.package, r.version));
    }
    if let Some(parent) = file.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::write(file, text).with_context(|| format!("writing {}", file.display()))
}

/// Every resolved kernel unpacked in the cache (downloaded only when its stamp differs), and
/// the cache's other kernels removed.
pub fn ensure(cache: &Path, resolved: &[Resolved], archive: &mut Archive) -> Result<Vec<Kernel>> {
    let mut kernels = Vec::new();
    for r in resolved.iter().filter(|r| WANTED.contains(&(r.arch.as_str(), r.suite.as_str()))) {
        let release = r.package.strip_prefix("linux-image-").context("not a linux-image package")?.to_owned();
        let dir = cache.join("kernels").join(&r.arch).join(&release);
        let stamp = format!("{}={}\n", r.package, r.version);
        let kernel = Kernel { resolved: r.clone(), release, dir };
        let cached = fs::read_to_string(kernel.dir.join("STAMP")).is_ok_and(|s| s == stamp);
        if !cached || kernel.vmlinuz().is_none() {
            eprintln!("xtask: matrix: downloading {} {} ({} {})", r.package, r.version, r.suite, r.arch);
            let apt = archive.apt()?;
            // The image package, and the parts it is split into (named after the same release).
            let mut wanted = vec![format!("{}:{}={}", r.package, r.arch, r.version)];
            for entry in apt.depends(&format!("{}:{}={}", r.package, r.arch, r.version))? {
                let name = entry.split([' ', ':']).next().unwrap_or_default();
                if name.starts_with("linux-") && name.ends_with(&format!("-{}", kernel.release)) {
                    wanted.push(format!("{name}:{}={}", r.arch, r.version));
                }
            }
            let refs: Vec<&str> = wanted.iter().map(String::as_str).collect();
            let debs = apt.download(&refs, &cache.join("kernels/download"))?;
            unpack(&debs, &kernel.dir)?;
            fs::remove_dir_all(cache.join("kernels/download")).context("removing the downloaded packages")?;
            fs::write(kernel.dir.join("STAMP"), &stamp).context("writing the kernel's stamp")?;
            if kernel.vmlinuz().is_none() || kernel.modules().is_none() {
                bail!("{} unpacked without vmlinuz or modules in {}", r.package, kernel.dir.display());
            }
        }
        kernels.push(kernel);
    }
    prune(cache, &kernels)?;
    Ok(kernels)
}

/// Removes cached kernels that are not `kept`.
fn prune(cache: &Path, kept: &[Kernel]) -> Result<()> {
    for arch in ["amd64", "arm64"] {
        let Ok(entries) = fs::read_dir(cache.join("kernels").join(arch)) else { continue };
        for entry in entries.flatten() {
            if !kept.iter().any(|k| k.dir == entry.path()) {
                eprintln!("xtask: matrix: removing the kernel no longer resolved: {}", entry.path().display());
                fs::remove_dir_all(entry.path()).with_context(|| format!("removing {}", entry.path().display()))?;
            }
        }
    }
    Ok(())
}
