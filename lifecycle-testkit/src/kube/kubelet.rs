//! The kubelet of the node: a `KubeletConfiguration` file and the flags 1.20 still wants on the
//! command line. cgroupfs driver under the node's own cgroup root, the remote runtime (the
//! harness's containerd over CRI v1alpha2), its own root and certificate directories, no
//! iptables chains, no swap check, no image garbage collection (the local image has no registry
//! to come back from) and eviction thresholds low enough never to fire on a test machine. It
//! listens on 127.0.0.1 only.
//!
//! The 1.37 kubelet takes the runtime endpoint in its configuration (the runtime and pause-image
//! flags are gone: containerd pins the sandbox image itself), must be told that cgroup v1 is
//! acceptable (`failCgroupV1: false`: this host is hybrid, v1 controllers plus the unified
//! hierarchy), and gets the node's feature gates and `crashLoopBackOff.maxContainerRestartPeriod`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{process::Daemon, NodeVersion, MODERN_MAX_CONTAINER_RESTART_PERIOD};
use crate::{agent::free_port, containerd::IMAGE};

/// The kubelet's `--config` file in the run directory `run`.
pub(super) fn config_path(run: &Path) -> PathBuf {
    run.join("kubelet-config.json")
}

/// What the kubelet needs from the rest of the node.
pub(super) struct KubeletSetup<'a> {
    pub(super) version: NodeVersion,
    pub(super) run: &'a Path,
    /// Where kubelet is (xtask's build).
    pub(super) bin_dir: &'a Path,
    pub(super) node: &'a str,
    pub(super) kubeconfig: &'a Path,
    pub(super) runtime_socket: &'a Path,
    pub(super) cgroup_root: &'a str,
}

impl KubeletSetup<'_> {
    /// The kubelet's `--root-dir`.
    pub(super) fn root_dir(&self) -> PathBuf {
        self.run.join("kubelet")
    }

    /// Writes the configuration (once per run: a restarted kubelet reads the same file, or what
    /// a test changed in it) and spawns the kubelet.
    pub(super) fn spawn(&self) -> Result<Daemon> {
        let root = self.root_dir();
        fs::create_dir_all(&root).context("create the kubelet root dir")?;
        let config = config_path(self.run);
        if !config.exists() {
            fs::write(&config, serde_json::to_vec_pretty(&self.configuration(&root)).context("encode")?)
                .context("write the kubelet config")?;
        }
        let mut command = Command::new(self.bin_dir.join("kubelet"));
        command
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--root-dir={}", root.display()))
            .arg(format!("--cert-dir={}", root.join("pki").display()))
            .arg(format!("--hostname-override={}", self.node));
        if self.version == NodeVersion::V1_37 {
            return Daemon::spawn("kubelet", self.run, command.arg("--v=2"));
        }
        Daemon::spawn(
            "kubelet",
            self.run,
            command
                .arg("--container-runtime=remote")
                .arg(format!("--container-runtime-endpoint=unix://{}", self.runtime_socket.display()))
                .arg(format!("--pod-infra-container-image={IMAGE}"))
                // cAdvisor's own containerd client (container stats): without it, it waits 5 s
                // for the default /run/containerd/containerd.sock at every start.
                .arg(format!("--containerd={}", self.runtime_socket.display()))
                .arg("--v=2"),
        )
    }

    fn configuration(&self, root: &Path) -> serde_json::Value {
        let mut config = serde_json::json!({
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": { "anonymous": { "enabled": false }, "webhook": { "enabled": false } },
            "authorization": { "mode": "AlwaysAllow" },
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": true,
            "failSwapOn": false,
            "makeIPTablesUtilChains": false,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "volumePluginDir": root.join("volume-plugins"),
            "serializeImagePulls": false,
            // The Node turns Ready at the first status update after registration: 1 s instead of
            // 10 s saves 9 s per start. Pod status reporting does not depend on it.
            "nodeStatusUpdateFrequency": "1s",
        });
        if self.version == NodeVersion::V1_37 {
            let extra = serde_json::json!({
                "containerRuntimeEndpoint": format!("unix://{}", self.runtime_socket.display()),
                "failCgroupV1": false,
                "featureGates": self.version.feature_gates_map(),
                "crashLoopBackOff": { "maxContainerRestartPeriod": MODERN_MAX_CONTAINER_RESTART_PERIOD },
                // Volume usage measured every 2 s instead of every minute: an emptyDir past its
                // sizeLimit is evicted within the eviction manager's 10 s pass.
                "volumeStatsAggPeriod": "2s",
            });
            if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
                // Gone from the 1.37 configuration (iptables chains are kube-proxy's affair).
                config.remove("makeIPTablesUtilChains");
                config.extend(extra.clone());
            }
        }
        config
    }
}
