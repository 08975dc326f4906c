//! The kernel-matrix tier: the agent on Debian's own cloud kernels booted under qemu (TCG; this
//! machine has no KVM) — bullseye 5.10, bookworm 6.1, trixie 6.12 and sid's newest on amd64,
//! each on pure cgroup v2 and on hybrid with systemd as PID 1, cgroup v1 alone once, and
//! trixie's arm64 kernel. The boots and their judgement are `lifecycle-agent/tests/matrix.rs`;
//! this module provides what they boot and writes `docs/kernel-matrix.md` from their rows.
//!
//! Provided once per machine and cached in `/var/cache/lifecycle/matrix` (or under
//! `$LIFECYCLE_MATRIX_CACHE`), keyed by what each was made from, so a second run from any clone
//! downloads and builds nothing: the kernels (`kernels`), the bookworm debootstrap tree and the
//! root images (`rootfs`). Downloads go through a private apt configuration derived from this
//! machine's own Debian archive entry (`crate::debian`); the system's apt is untouched. One tier
//! run at a time per machine (an flock held throughout: the images are in use while it boots).
//!
//! The amd64 guests run the debug agent `cargo test` builds with the test; the arm64 guest an
//! arm64 image built here (`xtask/x.sh image --arch arm64`: the release agent cross-built, its libraries
//! and loader), whose tree the arm64 guest runs in a chroot.

mod kernels;
mod rootfs;
mod table;

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result};

use crate::{
    cargo,
    debian::{self, PrivateApt},
    lock::Lock,
    packages, shell, workspace_root,
};

const CACHE_ROOT: &str = "/var/cache/lifecycle/matrix";
const CACHE_ENV: &str = "LIFECYCLE_MATRIX_CACHE";
/// The file the tests read their kernels and images from (lifecycle-agent/tests/matrix.rs).
const MANIFEST_ENV: &str = "LIFECYCLE_MATRIX_MANIFEST";
/// Two guests at a time: one vCPU each on this 2-core machine.
const PARALLEL_BOOTS: &str = "2";

/// The cache root: `$LIFECYCLE_MATRIX_CACHE` or [`CACHE_ROOT`].
fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(CACHE_ROOT), PathBuf::from)
}

/// The matrix's private apt (every suite, amd64 and arm64), made and updated at its first use
/// in a run: a warm run never needs it.
pub(crate) struct Archive {
    dir: PathBuf,
    apt: Option<PrivateApt>,
}

impl Archive {
    fn new(cache: &Path) -> Self {
        Self { dir: cache.join("apt"), apt: None }
    }

    pub(crate) fn apt(&mut self) -> Result<&PrivateApt> {
        if self.apt.is_none() {
            let apt = PrivateApt::create(&self.dir, kernels::SUITES, &["amd64", "arm64"])?;
            apt.update()?;
            self.apt = Some(apt);
        }
        Ok(self.apt.as_ref().expect("set above"))
    }
}

impl Drop for Archive {
    /// Its indexes and caches (half a gigabyte for four suites and two architectures) are
    /// needed again only when the kernels are resolved again: made afresh then.
    fn drop(&mut self) {
        if self.apt.is_some() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// What the boots need, from the cache.
struct Provided {
    kernels: Vec<kernels::Kernel>,
    amd64_root: PathBuf,
    arm64_root: PathBuf,
}

fn provide(cache: &Path) -> Result<Provided> {
    let mut archive = Archive::new(cache);
    let resolved = kernels::resolution(cache, &mut archive)?;
    let kernels = kernels::ensure(cache, &resolved, &mut archive)?;
    let tree = rootfs::debootstrap_tree(cache, &debian::archive_uri)?;
    let amd64: Vec<&kernels::Kernel> = kernels.iter().filter(|k| k.resolved.arch == "amd64").collect();
    let amd64_root = rootfs::amd64_image(cache, &tree, &amd64)?;
    let arm64_root = arm64_root(cache, &mut archive)?;
    Ok(Provided { kernels, amd64_root, arm64_root })
}

/// The arm64 root image, downloading its packages only when the image is not cached.
fn arm64_root(cache: &Path, archive: &mut Archive) -> Result<PathBuf> {
    let stamp = cache.join("images/arm64.made");
    // The image's key needs the packages' versions, which only apt knows: the image made last
    // for this recipe is recorded beside it, so a warm run need not ask. (Its packages are
    // bookworm's; a point release of them makes no new image until the recipe changes.)
    let recipe = rootfs::arm64_recipe();
    if let Ok(recorded) = fs::read_to_string(&stamp) {
        let mut lines = recorded.lines();
        if lines.next() == Some(recipe.as_str()) {
            if let Some(image) = lines.next().map(PathBuf::from).filter(|p| p.is_file()) {
                return Ok(image);
            }
        }
    }
    let wanted: Vec<String> = rootfs::ARM64_PACKAGES.iter().map(|p| format!("{p}:arm64/bookworm")).collect();
    let refs: Vec<&str> = wanted.iter().map(String::as_str).collect();
    let download = cache.join("images/download-arm64");
    let debs = archive.apt()?.download(&refs, &download)?;
    let image = rootfs::arm64_image(cache, &debs)?;
    fs::remove_dir_all(&download).context("removing the arm64 packages")?;
    fs::write(&stamp, format!("{recipe}\n{}\n", image.display())).context("recording the arm64 image")?;
    Ok(image)
}

/// The manifest of kernels and images for the tests.
fn manifest(provided: &Provided, arm64_image: &Path, rows: &Path) -> Result<String> {
    let mut text = format!(
        "rootfs.amd64={}\nrootfs.arm64={}\nrootfs.root={}\nimage.arm64={}\nrows={}\n",
        provided.amd64_root.display(),
        provided.arm64_root.display(),
        rootfs::root_argument(),
        arm64_image.display(),
        rows.display()
    );
    for kernel in &provided.kernels {
        let r = &kernel.resolved;
        let key = format!("kernel.{}.{}", r.arch, r.suite);
        let vmlinuz = kernel.vmlinuz().with_context(|| format!("{} has no vmlinuz", kernel.release))?;
        text.push_str(&format!("{key}.release={}\n", kernel.release));
        text.push_str(&format!("{key}.package={} {}\n", r.package, r.version));
        text.push_str(&format!("{key}.vmlinuz={}\n", vmlinuz.display()));
    }
    Ok(text)
}

/// Takes the cache's lock and provides the kernels and root images.
fn locked_provide() -> Result<(Lock, Provided)> {
    let began = Instant::now();
    packages::ensure(packages::MATRIX)?;
    let cache = cache_root();
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let lock = Lock::acquire(&cache.join(".lock"))?;
    let provided = provide(&cache)?;
    eprintln!(
        "xtask: matrix: kernels and root images ready in {:.0?} in {} ({})",
        began.elapsed(),
        cache.display(),
        provided.kernels.iter().map(|k| k.release.as_str()).collect::<Vec<_>>().join(", ")
    );
    Ok((lock, provided))
}

/// Provides the kernels and root images (`xtask/x.sh kernel-matrix`) and prints where they are.
pub fn provide_only() -> Result<()> {
    let (_lock, provided) = locked_provide()?;
    println!("rootfs.amd64={}\nrootfs.arm64={}", provided.amd64_root.display(), provided.arm64_root.display());
    for kernel in &provided.kernels {
        let vmlinuz = kernel.vmlinuz().unwrap_or_default();
        println!("kernel.{}.{}={}", kernel.resolved.arch, kernel.resolved.suite, vmlinuz.display());
    }
    Ok(())
}

/// Provides, cross-builds, runs the boots and writes the results table.
pub fn run() -> Result<()> {
    let began = Instant::now();
    let (_lock, provided) = locked_provide()?;
    let work = workspace_root().join("target/matrix");
    // The arm64 guest runs the arm64 image's agent: the release cross build, its libraries and
    // loader as the image packs them.
    let arm64_image =
        crate::image::build(&[lifecycle_image::layout::Arch::Arm64], &work.join("lifecycle-agent-arm64.tar"))?;
    // The plugin builds for arm64 too (it runs where kubectl does: arm64 laptops and hosts).
    let arm64_plugin = crate::cross_linux::plugin(lifecycle_image::layout::Arch::Arm64)?;
    anyhow::ensure!(
        lifecycle_image::agent::elf_arch(&arm64_plugin).ok() == Some(lifecycle_image::layout::Arch::Arm64),
        "{} is not an arm64 executable",
        arm64_plugin.display()
    );
    let rows = work.join("rows");
    if rows.exists() {
        fs::remove_dir_all(&rows).with_context(|| format!("removing {}", rows.display()))?;
    }
    fs::create_dir_all(&rows).with_context(|| format!("creating {}", rows.display()))?;
    let manifest_file = work.join("manifest");
    fs::write(&manifest_file, manifest(&provided, &arm64_image.archive, &rows)?)
        .context("writing the matrix manifest")?;
    let tests = shell::run(
        cargo()
            .args(["test", "-p", "lifecycle-agent", "--test", "matrix"])
            .args(["--", "--test-threads", PARALLEL_BOOTS, "--nocapture"])
            .env(MANIFEST_ENV, &manifest_file),
    );
    let table = workspace_root().join("docs/kernel-matrix.md");
    match table::write(&rows, &table, "xtask/x.sh test --tier matrix") {
        Ok(0) => eprintln!("xtask: matrix: no boot wrote a row; {} left as it was", table.display()),
        Ok(n) => eprintln!("xtask: matrix: {n} boots written to {}", table.display()),
        Err(err) => eprintln!("xtask: matrix: could not write {}: {err:#}", table.display()),
    }
    eprintln!("xtask: matrix tier took {:.0?}", began.elapsed());
    for failure in table::failures(&rows) {
        eprintln!("xtask: matrix: FAILED {failure}");
    }
    tests
}
