//! Which node a test runs: the 1.20 one (kubelet and kube-apiserver built from Debian's source
//! package, Debian's containerd 1.6, etcd and CNI plugins) or a current one (kubelet and
//! kube-apiserver 1.37 built from the Go module, containerd 2.x, runc 1.3, etcd 3.5 and the CNI
//! plugins from xtask's kubernetes-modern cache). Everything else about the node (its run
//! directory, clean-up, network, API helpers) is the same for both.

use std::path::PathBuf;

use crate::containerd::{host::which, Flavour};

/// The environment variable naming the directory with the 1.20 kube-apiserver and kubelet.
pub const BIN_ENV: &str = "LIFECYCLE_KUBE_BIN";
/// Where `xtask/x.sh kubernetes` caches them when [`BIN_ENV`] is not set (its `bin/`), unless
/// the second variable names another cache: a test run by hand finds them there.
const KUBERNETES_CACHE: &str = "/var/cache/lifecycle/kubernetes";
const KUBERNETES_CACHE_ENV: &str = "LIFECYCLE_KUBERNETES_CACHE";
/// The environment variable naming the directory with the current node's binaries (kubelet,
/// kube-apiserver, containerd, containerd-shim-runc-v2, ctr, runc, etcd): xtask's modern tier sets
/// it to its kubernetes-modern cache.
pub const MODERN_BIN_ENV: &str = "LIFECYCLE_KUBE_MODERN_BIN";
/// The environment variable naming the current node's CNI plugin directory.
pub const MODERN_CNI_ENV: &str = "LIFECYCLE_KUBE_MODERN_CNI";
/// `crashLoopBackOff.maxContainerRestartPeriod` of the current node's kubelet (its
/// KubeletCrashLoopBackOffMax gate is on): the agent beside it must be told the same.
pub const MODERN_MAX_CONTAINER_RESTART_PERIOD: &str = "20s";
/// The feature gates of the current node's kubelet and kube-apiserver: beta ones that are on by
/// default are named anyway, so the node says what its cases rely on; ContainerStopSignals is
/// alpha in 1.37.
pub const MODERN_FEATURE_GATES: &[&str] = &[
    "ContainerRestartRules",
    "ContainerStopSignals",
    "KubeletCrashLoopBackOffMax",
    "RestartAllContainersOnContainerExits",
];
/// Debian's containernetworking-plugins, the 1.20 node's.
const DEBIAN_CNI: &str = "/usr/lib/cni";

/// The node a test starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeVersion {
    /// kubelet and kube-apiserver v1.20.2 with Debian's containerd 1.6 (the `kubelet` tier).
    #[default]
    V1_20,
    /// kubelet and kube-apiserver v1.37 with containerd 2.x and runc 1.3 (the `modern` tier).
    V1_37,
}

impl NodeVersion {
    /// The directory with kube-apiserver and kubelet (and, for 1.37, every other binary).
    pub fn bin_dir(self) -> PathBuf {
        match self {
            NodeVersion::V1_20 => std::env::var_os(BIN_ENV).map(PathBuf::from).unwrap_or_else(|| {
                std::env::var_os(KUBERNETES_CACHE_ENV)
                    .filter(|dir| !dir.is_empty())
                    .map_or_else(|| PathBuf::from(KUBERNETES_CACHE), PathBuf::from)
                    .join("bin")
            }),
            NodeVersion::V1_37 => std::env::var_os(MODERN_BIN_ENV).map(PathBuf::from).unwrap_or_default(),
        }
    }

    /// Where the CNI plugins (bridge, host-local, loopback) are.
    pub fn cni_dir(self) -> PathBuf {
        match self {
            NodeVersion::V1_20 => PathBuf::from(DEBIAN_CNI),
            NodeVersion::V1_37 => std::env::var_os(MODERN_CNI_ENV).map(PathBuf::from).unwrap_or_default(),
        }
    }

    /// The containerd the node runs.
    pub fn containerd(self) -> Flavour {
        match self {
            NodeVersion::V1_20 => Flavour::Debian,
            NodeVersion::V1_37 => Flavour::Modern { bin: self.bin_dir() },
        }
    }

    /// etcd's binary.
    pub(super) fn etcd(self) -> PathBuf {
        match self {
            NodeVersion::V1_20 => which("etcd").unwrap_or_else(|| PathBuf::from("etcd")),
            NodeVersion::V1_37 => self.bin_dir().join("etcd"),
        }
    }

    /// Binaries taken from PATH.
    pub(super) fn tools(self) -> &'static [&'static str] {
        match self {
            NodeVersion::V1_20 => &["etcd", "openssl", "ip", "kubectl"],
            NodeVersion::V1_37 => &["openssl", "ip", "kubectl"],
        }
    }

    /// How a missing part is provided.
    pub(super) fn provided_by(self) -> &'static str {
        match self {
            NodeVersion::V1_20 => {
                "run `xtask/x.sh test --tier kubelet` (or `cargo xtask kubernetes`), which builds it once"
            }
            NodeVersion::V1_37 => {
                "run `xtask/x.sh test --tier modern`, which provides it once per machine and sets \
                 LIFECYCLE_KUBE_MODERN_BIN and LIFECYCLE_KUBE_MODERN_CNI"
            }
        }
    }

    /// The KubeletConfiguration's `featureGates`.
    pub(super) fn feature_gates_map(self) -> serde_json::Value {
        match self {
            NodeVersion::V1_20 => serde_json::json!({}),
            NodeVersion::V1_37 => {
                MODERN_FEATURE_GATES.iter().map(|gate| ((*gate).to_owned(), serde_json::Value::Bool(true))).collect()
            }
        }
    }

    /// `--feature-gates=` for kube-apiserver, if any.
    pub(super) fn feature_gates(self) -> Option<String> {
        match self {
            NodeVersion::V1_20 => None,
            NodeVersion::V1_37 => {
                Some(MODERN_FEATURE_GATES.iter().map(|gate| format!("{gate}=true")).collect::<Vec<_>>().join(","))
            }
        }
    }
}
