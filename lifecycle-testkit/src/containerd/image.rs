//! The image every sandbox and container runs: Debian's busybox-static with its applet links,
//! packed as an OCI image-layout tarball for `ctr images import` (no registry involved) by
//! `lifecycle_image::layout`, the agent image's packer.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use lifecycle_image::layout::{pack, Arch, ImageConfig};

use super::{BUSYBOX, IMAGE};

/// Builds an OCI image-layout tarball of busybox-static with its applet links.
pub(super) fn build_image(dir: &Path) -> Result<PathBuf> {
    build_image_named(dir, IMAGE, None)
}

/// The same image under `name`, with the image config's `StopSignal` when given.
pub(super) fn build_image_named(dir: &Path, name: &str, stop_signal: Option<&str>) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    busybox_rootfs(&rootfs)?;
    let config = ImageConfig {
        architecture: Arch::host().context("images are made for amd64 and arm64 hosts only")?,
        entrypoint: Vec::new(),
        // The sandbox ("pause") container runs the image default: sleep until killed.
        cmd: vec!["/bin/sleep".to_owned(), "infinity".to_owned()],
        env: vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".to_owned()],
        user: None,
        labels: BTreeMap::new(),
        stop_signal: stop_signal.map(str::to_owned),
        created: lifecycle_image::layout::EPOCH.to_owned(),
        gzip_level: 1,
    };
    let archive = dir.join("image.tar");
    pack(&rootfs, name, &config, &dir.join("layout"), &archive).context("pack the busybox image")?;
    Ok(archive)
}

/// A root filesystem of busybox-static with its applet links, root's passwd and group entries,
/// and the usual top-level directories.
fn busybox_rootfs(rootfs: &Path) -> Result<()> {
    let dirs = ["bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "etc", "root", "run", "var"];
    for sub in dirs {
        fs::create_dir_all(rootfs.join(sub)).with_context(|| format!("create rootfs/{sub}"))?;
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).context("copy busybox")?;
    let list = Command::new(BUSYBOX).arg("--list-full").output().context("busybox --list-full")?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|l| !l.is_empty()) {
        let link = rootfs.join(applet);
        if link.exists() || applet == "bin/busybox" {
            continue;
        }
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).with_context(|| format!("create dir for {applet}"))?;
        }
        symlink("/bin/busybox", &link).with_context(|| format!("link {applet}"))?;
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").context("write passwd")?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n").context("write group")?;
    Ok(())
}
