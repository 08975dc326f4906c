//! The image every sandbox and container runs: Debian's busybox-static with its applet links,
//! packed as an OCI image-layout tarball for `ctr images import` (no registry involved).

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{host::run, BUSYBOX, IMAGE};

/// Builds an OCI image-layout tarball of busybox-static with its applet links.
pub(super) fn build_image(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    busybox_rootfs(&rootfs, &[])?;
    let config = serde_json::json!({
        "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        // The sandbox ("pause") container runs the image default: sleep until killed.
        "Cmd": ["/bin/sleep", "infinity"],
        "WorkingDir": "/",
    });
    pack_oci(dir, &rootfs, IMAGE, config)
}

/// A root filesystem of busybox-static with its applet links, root's passwd and group entries,
/// and the usual top-level directories plus `extra_dirs`.
pub(crate) fn busybox_rootfs(rootfs: &Path, extra_dirs: &[&str]) -> Result<()> {
    let dirs = ["bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "etc", "root", "run", "var"];
    for sub in dirs.iter().chain(extra_dirs) {
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

/// Packs `rootfs` as a one-layer OCI image named `name` with the image config `config` (`Env`,
/// `Cmd`, ...), as an image-layout tarball under `dir` for `ctr images import`.
pub(crate) fn pack_oci(dir: &Path, rootfs: &Path, name: &str, config: serde_json::Value) -> Result<PathBuf> {
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).context("create blobs dir")?;
    let layer = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--create", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "--mtime=@0", "--file"])
        .arg(&layer)
        .arg("-C")
        .arg(rootfs)
        .arg("."))?;
    let (layer_digest, layer_size) = add_blob(&blobs, &fs::read(&layer).context("read layer")?)?;
    let image_config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let (config_digest, config_size) = add_blob(&blobs, image_config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = add_blob(&blobs, manifest.to_string().as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": { "io.containerd.image.name": name },
        }],
    });
    fs::write(layout.join("index.json"), index.to_string()).context("write index.json")?;
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).context("write oci-layout")?;
    let tarball = dir.join("image.tar");
    run(Command::new("tar").arg("--create").arg("--file").arg(&tarball).arg("-C").arg(&layout).args([
        "oci-layout",
        "index.json",
        "blobs",
    ]))?;
    // The layout's copies are in the tarball now.
    let _ = fs::remove_dir_all(&layout);
    let _ = fs::remove_file(&layer);
    Ok(tarball)
}

/// Stores a blob under its sha256; returns (hex digest, size).
fn add_blob(blobs: &Path, data: &[u8]) -> Result<(String, usize)> {
    let staging = blobs.join("staging");
    fs::write(&staging, data).context("write blob")?;
    let output = Command::new("sha256sum").arg(&staging).output().context("run sha256sum")?;
    let digest = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .map(str::to_owned)
        .with_context(|| format!("sha256sum gave no digest: {}", String::from_utf8_lossy(&output.stderr)))?;
    fs::rename(&staging, blobs.join(&digest)).context("name blob")?;
    Ok((digest, data.len()))
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
