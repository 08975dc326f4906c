//! An image of the agent itself, for running deploy/daemonset.yaml's pod template on the node:
//! the test's agent binary (dynamically linked: the shared libraries `ldd` lists and the dynamic
//! loader go in at the same paths) plus busybox-static with its applet links for debugging
//! (`kubectl exec`), packed as an OCI image-layout tarball and imported into the node's
//! containerd with `ctr -n k8s.io images import`. No registry is involved: pods run it with
//! `imagePullPolicy: Never`.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;

use super::Kube;
use crate::containerd::host::run;

/// The agent image's name (never pulled).
pub const AGENT_IMAGE: &str = "docker.io/library/lifecycle-agent:local";
/// Where the binary is in the image (as in deploy/Containerfile).
pub const AGENT_PATH: &str = "/usr/local/bin/lifecycle-agent";
const BUSYBOX: &str = "/bin/busybox";

impl Kube {
    /// Builds the agent image from `binary` (`env!("CARGO_BIN_EXE_lifecycle-agent")`) in the run
    /// directory, imports it into the node's containerd and waits until the CRI lists it.
    /// Returns the image's name ([`AGENT_IMAGE`]).
    pub fn import_agent_image(&self, binary: &Path) -> Result<&'static str> {
        let dir = self.run.path.join("agent-image");
        let tarball = build(&dir, binary)?;
        let containerd = self.containerd();
        let output = Command::new("ctr")
            .arg("--address")
            .arg(containerd.socket())
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(&tarball)
            .output()
            .context("run ctr images import")?;
        if !output.status.success() {
            bail!("ctr images import failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        // The CRI plugin learns of imported images from containerd's events: wait until it
        // answers for the name, or the kubelet would report ErrImageNeverPull.
        let channel = containerd.block_on(lifecycle_agent::discovery::cri::connect_channel(containerd.socket()))?;
        let mut images = cri::image_service_client::ImageServiceClient::new(channel);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let request = cri::ImageStatusRequest {
                image: Some(cri::ImageSpec { image: AGENT_IMAGE.to_owned(), ..Default::default() }),
                verbose: false,
            };
            let status = containerd.block_on(images.image_status(request)).context("CRI ImageStatus")?;
            if status.into_inner().image.is_some() {
                return Ok(AGENT_IMAGE);
            }
            if Instant::now() > deadline {
                bail!("CRI does not list {AGENT_IMAGE} after import");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The rootfs and its OCI image-layout tarball, under `dir`.
fn build(dir: &Path, binary: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "dev", "proc", "sys", "tmp", "etc", "run", "var"]
    {
        fs::create_dir_all(rootfs.join(sub)).with_context(|| format!("create rootfs/{sub}"))?;
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).context("copy busybox")?;
    let list = Command::new(BUSYBOX).arg("--list-full").output().context("busybox --list-full")?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|l| !l.is_empty() && *l != "bin/busybox") {
        let link = rootfs.join(applet);
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).with_context(|| format!("create dir for {applet}"))?;
        }
        if !link.exists() {
            symlink("/bin/busybox", &link).with_context(|| format!("link {applet}"))?;
        }
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").context("write passwd")?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n").context("write group")?;
    fs::copy(binary, rootfs.join(AGENT_PATH.trim_start_matches('/')))
        .with_context(|| format!("copy {}", binary.display()))?;
    for library in shared_libraries(binary)? {
        let target = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).with_context(|| format!("create dir for {}", library.display()))?;
        }
        // fs::copy follows symlinks: the file lands under the name the loader asks for.
        fs::copy(&library, &target).with_context(|| format!("copy {}", library.display()))?;
    }

    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).context("create blobs dir")?;
    let layer = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--create", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "--mtime=@0", "--file"])
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .arg("."))?;
    let (layer_digest, layer_size) = add_blob(&blobs, &layer)?;
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": [AGENT_PATH],
            "Cmd": ["run", "--listen", "0.0.0.0:9890"],
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let (config_digest, config_size) = add_blob_bytes(&blobs, config.to_string().as_bytes())?;
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
    let (manifest_digest, manifest_size) = add_blob_bytes(&blobs, manifest.to_string().as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": { "io.containerd.image.name": AGENT_IMAGE },
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

/// The absolute paths `ldd` prints for `binary`: each `name => /path (addr)` and the loader's
/// `/path (addr)` line (the vDSO has no path).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd").arg(binary).output().context("run ldd")?;
    if !output.status.success() {
        bail!("ldd {}: {}", binary.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    let libraries: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let path = line.split_once("=>").map_or(line, |(_, path)| path).split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    if libraries.is_empty() {
        bail!("ldd lists no libraries for {}", binary.display());
    }
    Ok(libraries)
}

/// Moves the file at `path` into `blobs` under its sha256; returns (hex digest, size).
fn add_blob(blobs: &Path, path: &Path) -> Result<(String, u64)> {
    let output = Command::new("sha256sum").arg(path).output().context("run sha256sum")?;
    let digest = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .map(str::to_owned)
        .with_context(|| format!("sha256sum gave no digest: {}", String::from_utf8_lossy(&output.stderr)))?;
    let size = fs::metadata(path).context("blob size")?.len();
    fs::copy(path, blobs.join(&digest)).context("store blob")?;
    Ok((digest, size))
}

fn add_blob_bytes(blobs: &Path, data: &[u8]) -> Result<(String, u64)> {
    let staging = blobs.join("staging");
    fs::write(&staging, data).context("write blob")?;
    let stored = add_blob(blobs, &staging);
    let _ = fs::remove_file(&staging);
    stored
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
