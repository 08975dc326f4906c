//! The node's kubelet as the agent knows it: its release, its effective configuration and the
//! feature gates that change the rules, and what the agent expects of it from those. The model
//! judges every container by the [`KubeletPolicy`] it is given (`NodeTracker::set_kubelet`);
//! the agent's discovery reads the kubelet's command line and files through `/proc` and its
//! release from the Node object, and the plumbing derives the policy again at each kubelet
//! start.
//!
//! Parts: `version` (the release), `gates` (upstream's gate stages and how one node's gate is
//! decided), `config` (merging the files and flags as the kubelet does), `policy` (the back-off
//! and gates derived from all that and the agent's flags), `shutdown` (the grace a graceful node
//! shutdown gives each pod).

pub mod config;
pub mod gates;
pub mod policy;
pub mod shutdown;
pub mod version;

pub use config::{CommandLine, ConfigError, ConfigFile, KubeletConfig};
pub use gates::{Gate, GateBasis, GateState};
pub use policy::{BackoffChoice, KubeletFacts, KubeletOverrides, KubeletPolicy, KubeletSource};
pub use version::KubeletVersion;
