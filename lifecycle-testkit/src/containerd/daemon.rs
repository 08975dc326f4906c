//! The containerd process of one harness: its config (everything private to the run directory),
//! the spawn that ends when the CRI Version call answers, the image import the CRI must see
//! before any sandbox starts, and the stop (SIGTERM, then SIGKILL).

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use lifecycle_agent::discovery::cri::CriClient;

use super::{host::signal, Containerd, Flavour, IMAGE, READY_TIMEOUT};

impl Containerd {
    /// Spawns containerd with the run directory's config; returns once its CRI Version call
    /// answers (the readiness check), failing with the log's tail if it exits or times out.
    pub(super) fn spawn_containerd(&mut self) -> Result<()> {
        let config = self.run.path.join("config.toml");
        let text = match &self.flavour {
            Flavour::Debian => containerd_config(&self.run.path),
            Flavour::Modern { bin } => containerd_v3_config(&self.run.path, bin),
        };
        fs::write(&config, text).context("write containerd config")?;
        // Appended to, so a restarted containerd's log follows the first one's.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run.path.join("containerd.log"))
            .context("open containerd log")?;
        let mut command = Command::new(self.flavour.binary("containerd"));
        if let Flavour::Modern { bin } = &self.flavour {
            // containerd finds its shim on PATH: its own first, not Debian's 1.6 one.
            let path = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(bin.clone()).chain(std::env::split_paths(&path));
            command.env("PATH", std::env::join_paths(dirs).context("PATH with the node's bin dir")?);
        }
        let child = command
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("dup log fd")?)
            .stderr(log)
            .spawn()
            .context("spawn containerd")?;
        fs::write(self.run.path.join("containerd.pid"), child.id().to_string()).context("record pid")?;
        self.child = Some(child);

        let socket = self.socket().to_owned();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("containerd exited with {status} before answering:\n{}", self.log_tail(30));
            }
            // The readiness check is the CRI Version call itself, not a sleep.
            match self.rt.block_on(CriClient::connect(&socket)) {
                Ok(client) => {
                    self.cri = Some(client);
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => {
                    bail!("containerd not ready after {READY_TIMEOUT:?}: {e}\n{}", self.log_tail(30))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// `ctr images import`, then waits until the CRI image service lists the image `name`.
    pub(super) fn import_image(&self, tarball: &Path, name: &str) -> Result<()> {
        let output = Command::new(self.ctr())
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(tarball)
            .output()
            .context("run ctr images import")?;
        if !output.status.success() {
            bail!("ctr images import failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        // The CRI plugin learns about imported images from containerd events: wait until its
        // image service answers for the name, so RunPodSandbox never tries to pull.
        let channel = self.block_on(lifecycle_agent::discovery::cri::connect_channel(self.socket()))?;
        let mut images = cri::image_service_client::ImageServiceClient::new(channel);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let request = cri::ImageStatusRequest {
                image: Some(cri::ImageSpec { image: name.to_owned(), ..Default::default() }),
                verbose: false,
            };
            let status = self.block_on(images.image_status(request)).context("CRI ImageStatus")?;
            if status.into_inner().image.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("CRI does not list {name} after import");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops containerd and starts it again on the same state, as a node upgrade or a runtime
    /// crash does: containers keep running under their shims, and the socket is created anew
    /// (a new inode). Returns once the new containerd answers the CRI.
    pub fn restart_containerd(&mut self) -> Result<()> {
        // Drop the gRPC channel before its server goes away.
        self.cri = None;
        self.stop_containerd();
        self.spawn_containerd()
    }

    /// SIGTERM to our containerd, SIGKILL if it has not exited within 5 s.
    pub(super) fn stop_containerd(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn containerd_config(run: &Path) -> String {
    let dir = run.display();
    // Everything private to the run directory except the shim sockets, which containerd 1.6
    // always puts under /run/containerd/s.
    format!(
        r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  # root has no CAP_SYS_RESOURCE here; without this every container start fails.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pod network namespaces (kube's CNI pods) under this run's state, where the sweep finds them,
  # not in the host's /var/run/netns.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{dir}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni/bin"
    conf_dir = "{dir}/cni/conf"
"#
    )
}

/// containerd 2.x's configuration (version 3, where the CRI plugin is split into images, runtime
/// and the gRPC service), as private as [`containerd_config`]: root, state, sockets and the opt
/// directory in the run directory; runc from `bin` with its state in the run directory; the CNI
/// plugins linked into the run directory by the kube node. The sandbox image is the local one
/// (pinned, so it is never garbage collected or pulled: current kubelets have no pause-image
/// flag). Off: snapshotters this host lacks, tracing, NRI and CDI (they would read and write
/// host paths), AppArmor (not on this host), oom_score_adj raises (root lacks
/// CAP_SYS_RESOURCE here).
fn containerd_v3_config(run: &Path, bin: &Path) -> String {
    let dir = run.display();
    let runc = bin.join("runc");
    let runc = runc.display();
    format!(
        r#"version = 3
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{dir}/runc"
        SystemdCgroup = false

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{dir}/cni/bin"]
    conf_dir = "{dir}/cni/conf"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}
