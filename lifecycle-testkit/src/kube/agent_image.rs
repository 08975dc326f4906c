//! An image of the agent itself, for running deploy/daemonset.yaml's pod template on the node:
//! the test's agent binary packed by the release image's builder (`lifecycle_image::agent`, the
//! one `xtask/x.sh image` uses: the binary, its shared libraries and loader, no shell), imported
//! into the node's containerd with `ctr -n k8s.io images import`. No registry is involved: pods
//! run it with `imagePullPolicy: Never`. The tests need no shell in it: `kubectl exec` cannot
//! reach this node's kubelet (it listens on loopback), and they read the agent over HTTP.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;

use super::Kube;

/// The agent image's name (never pulled).
pub const AGENT_IMAGE: &str = "docker.io/library/lifecycle-agent:local";
/// Where the binary is in the image.
pub const AGENT_PATH: &str = lifecycle_image::agent::AGENT_PATH;

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

/// The image's archive, under `dir`.
fn build(dir: &Path, binary: &Path) -> Result<PathBuf> {
    let archive = dir.join("image.tar");
    let revision = lifecycle_image::agent::git_revision(Path::new(env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|| "unknown".to_owned());
    // gzip -1: the test build is ~230 MB (3 s instead of 9 s at the release's level).
    let image = lifecycle_image::agent::AgentImage {
        binary,
        name: AGENT_IMAGE,
        revision: &revision,
        created: lifecycle_image::layout::EPOCH,
        gzip_level: 1,
    };
    lifecycle_image::agent::build(&image, &dir.join("staging"), &archive).context("build the agent image")?;
    Ok(archive)
}
