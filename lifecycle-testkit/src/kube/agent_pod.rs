//! Running the agent as the deploy/ manifests and the Helm chart describe it, on a node with no
//! controller-manager: the Pod a DaemonSet's controller would create, the admin credentials the
//! agent uses here (the API server runs without service-account tokens), mounts fitted to the
//! machine, and helm pointed at the node.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::Kube;

/// Where the kubelet tier finds helm (xtask sets it from `xtask/x.sh helm`'s cache).
pub const HELM_ENV: &str = "LIFECYCLE_HELM";

impl Kube {
    /// The Pod `name` that a DaemonSet controller would create from `daemonset` (as the API
    /// server returned it, with its uid) on this node: the template's metadata and spec, bound
    /// to the node, owned by the DaemonSet. The node has no controller-manager to do it.
    pub fn daemonset_pod(&self, daemonset: &Value, name: &str) -> Value {
        let template = &daemonset["spec"]["template"];
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": daemonset["metadata"]["namespace"],
                "labels": template["metadata"]["labels"],
                "annotations": template["metadata"]["annotations"],
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": daemonset["metadata"]["name"],
                    "uid": daemonset["metadata"]["uid"],
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": template["spec"],
        });
        pod["spec"]["nodeName"] = self.node_name().into();
        pod
    }

    /// A copy of the node's admin kubeconfig and its CA in a directory of their own (the run
    /// directory also holds the node's keys and the kubelet's root): the kubeconfig names the CA
    /// by its path, which an agent pod sees at the same place when the directory is mounted
    /// there. The test node's API server runs without the ServiceAccount admission plugin, so
    /// pods get no token and the agent uses `--kubeconfig`.
    pub fn write_agent_credentials(&self) -> Result<PathBuf> {
        let dir = self.run_dir().join("agent-credentials");
        std::fs::create_dir_all(&dir).context("create credentials dir")?;
        let ca = dir.join("ca.crt");
        std::fs::copy(self.ca_file(), &ca).context("copy CA")?;
        let text = std::fs::read_to_string(self.kubeconfig()).context("read kubeconfig")?;
        let mut config: Value = serde_json::from_str(&text).context("kubeconfig is JSON")?;
        config["clusters"][0]["cluster"]["certificate-authority"] = ca.to_string_lossy().into_owned().into();
        std::fs::write(dir.join("kubeconfig"), config.to_string()).context("write kubeconfig")?;
        Ok(dir)
    }

    /// `helm` (at `binary`) against this node: its kubeconfig (nothing from `$KUBECONFIG`), and
    /// helm's cache, config and data in the run directory instead of the user's home.
    pub fn helm_command(&self, binary: &Path) -> Command {
        let mut command = Command::new(binary);
        let home = self.run_dir().join("helm");
        command
            .env_remove("KUBECONFIG")
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig());
        command
    }
}

/// The helm binary of [`HELM_ENV`], or why there is none.
pub fn helm_binary() -> std::result::Result<PathBuf, String> {
    let path = std::env::var_os(HELM_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{HELM_ENV} is not set (xtask/x.sh helm builds helm and prints its path)"))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{HELM_ENV}={} is no file", path.display()))
    }
}

/// Removes `mountPropagation` from the volume mounts of `pod`'s containers whose host path is on
/// a mount that does not receive the host's mount events. HostToContainer needs the source on a
/// shared or slave mount, as on a systemd host (whose / is shared); on a test machine whose / is
/// private (a container, a plain init) the runtime refuses the container: there, and only there,
/// the field goes.
pub fn drop_unpropagated_mount_propagation(pod: &mut Value) {
    let host_paths: Vec<(String, String)> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?.to_owned(), v["hostPath"]["path"].as_str()?.to_owned())))
        .collect();
    let Some(containers) = pod["spec"]["containers"].as_array_mut() else { return };
    for mount in containers.iter_mut().filter_map(|c| c["volumeMounts"].as_array_mut()).flatten() {
        let Some((_, source)) = host_paths.iter().find(|(name, _)| mount["name"] == name.as_str()) else { continue };
        if mount.get("mountPropagation").is_some() && !mount_propagates(Path::new(source)) {
            eprintln!("{source} is on a private mount here: its volume mount loses mountPropagation");
            if let Some(mount) = mount.as_object_mut() {
                mount.remove("mountPropagation");
            }
        }
    }
}

/// Whether the mount `path` is on (its nearest existing ancestor's, for a path still to be
/// created) receives mount events from the host: shared or slave, per /proc/self/mountinfo.
pub fn mount_propagates(path: &Path) -> bool {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let path = existing.canonicalize().unwrap_or_else(|_| existing.to_owned());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // The deepest mount point above the path; of mounts stacked on one point, the last (the top).
    let mut best: Option<(usize, bool)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(point) = fields.get(4) else { continue };
        if !path.starts_with(point) {
            continue;
        }
        let optional = fields.iter().skip(6).take_while(|f| **f != "-");
        let shared = optional.into_iter().any(|f| f.starts_with("shared:") || f.starts_with("master:"));
        if best.is_none_or(|(depth, _)| point.len() >= depth) {
            best = Some((point.len(), shared));
        }
    }
    best.is_some_and(|(_, shared)| shared)
}
