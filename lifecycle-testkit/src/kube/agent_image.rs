//! An image of the agent itself, for running deploy/daemonset.yaml's pod template on the node:
//! the test's agent binary (dynamically linked: the shared libraries `ldd` lists and the dynamic
//! loader go in at the same paths) plus busybox-static with its applet links for debugging
//! (`kubectl exec`), packed as an OCI image-layout tarball and imported into the node's
//! containerd with `ctr -n k8s.io images import`. No registry is involved: pods run it with
//! `imagePullPolicy: Never`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;

use super::Kube;
use crate::containerd::image::{busybox_rootfs, pack_oci};

/// The agent image's name (never pulled).
pub const AGENT_IMAGE: &str = "docker.io/library/lifecycle-agent:local";
/// Where the binary is in the image (as in deploy/Containerfile).
pub const AGENT_PATH: &str = "/usr/local/bin/lifecycle-agent";

impl Kube {
    /// Builds the agent image from `binary` (`env!("CARGO_BIN_EXE_lifecycle-agent")`) in the run
    /// directory, imports it into the node's containerd and waits until the CRI lists it.
    /// Returns the image's name ([`AGENT_IMAGE`]).
    pub fn import_agent_image(&self, binary: &Path) -> Result<&'static str> {
        let dir = self.run.path.join("agent-image");
        let tarball = build(&dir, binary)?;
        let containerd = self.containerd();
        let output = Command::new(containerd.ctr())
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
    busybox_rootfs(&rootfs, &["usr/local/bin"])?;
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
    let config = serde_json::json!({
        "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Entrypoint": [AGENT_PATH],
        "Cmd": ["run", "--listen", "0.0.0.0:9890"],
        "WorkingDir": "/",
    });
    pack_oci(dir, &rootfs, AGENT_IMAGE, config)
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
