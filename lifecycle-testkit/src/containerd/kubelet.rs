//! What the kubelet writes on a container besides its command: the annotations
//! (`pkg/kubelet/kuberuntime/labels.go`) and the namespace options.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use lifecycle_agent::model::metadata::keys;

/// The annotations the kubelet writes on a container (`pkg/kubelet/kuberuntime/labels.go`).
#[derive(Clone, Debug)]
pub struct KubeletAnnotations {
    /// `io.kubernetes.pod.terminationGracePeriod`, seconds.
    pub termination_grace_period_s: Option<i64>,
    /// `io.kubernetes.pod.deletionGracePeriod`, seconds.
    pub deletion_grace_period_s: Option<i64>,
    /// `io.kubernetes.container.restartCount`; also the CRI attempt.
    pub restart_count: u32,
    /// `io.kubernetes.container.hash` (written as hex).
    pub hash: u64,
    /// `io.kubernetes.container.type`.
    pub container_type: &'static str,
    /// `io.kubernetes.container.preStopHandler`, JSON.
    pub pre_stop_handler: Option<String>,
    /// `io.kubernetes.container.ports`, JSON.
    pub ports: Option<String>,
    /// Anything else, verbatim (e.g. deliberately malformed values).
    pub extra: Vec<(String, String)>,
}

impl Default for KubeletAnnotations {
    fn default() -> Self {
        Self {
            termination_grace_period_s: Some(30),
            deletion_grace_period_s: None,
            restart_count: 0,
            hash: 0x5eed_cafe,
            container_type: "container",
            pre_stop_handler: None,
            ports: None,
            extra: Vec::new(),
        }
    }
}

impl KubeletAnnotations {
    pub(super) fn to_map(&self) -> HashMap<String, String> {
        let mut map = HashMap::from([
            (keys::RESTART_COUNT.to_owned(), self.restart_count.to_string()),
            (keys::CONTAINER_HASH.to_owned(), format!("{:x}", self.hash)),
            (keys::CONTAINER_TYPE.to_owned(), self.container_type.to_owned()),
            ("io.kubernetes.container.terminationMessagePath".to_owned(), "/dev/termination-log".to_owned()),
            ("io.kubernetes.container.terminationMessagePolicy".to_owned(), "File".to_owned()),
        ]);
        let optional = [
            (keys::TERMINATION_GRACE_PERIOD, self.termination_grace_period_s.map(|s| s.to_string())),
            (keys::DELETION_GRACE_PERIOD, self.deletion_grace_period_s.map(|s| s.to_string())),
            (keys::PRE_STOP_HANDLER, self.pre_stop_handler.clone()),
            (keys::PORTS, self.ports.clone()),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                map.insert(key.to_owned(), value);
            }
        }
        map.extend(self.extra.iter().cloned());
        map
    }
}

/// The kubelet's namespace choices: host network, a pid namespace per container, pod IPC.
pub(super) fn kubelet_namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}
