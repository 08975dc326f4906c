//! What the agent expects of the node's kubelet, derived from what it read of it (release,
//! effective configuration) and the agent's override flags: the state of each gate it models,
//! and the restart back-off every container is judged by.
//!
//! The back-off is `newCrashLoopBackOff` (`pkg/kubelet/kubelet.go`): 10 s doubling to 300 s;
//! with ReduceDefaultCrashLoopBackOffDecay 1 s to 60 s; then, with KubeletCrashLoopBackOffMax,
//! the maximum is `crashLoopBackOff.maxContainerRestartPeriod` (300 s when the gate is on and the
//! field unset: its v1beta1 default) and the initial delay is lowered to it when larger. When an
//! input is unknown, every value it could have is tried: the back-off is known only when they
//! all give the same one, and otherwise the agent says it cannot judge restarts after the first
//! (the first restart of a container is immediate under every policy).

use serde::Serialize;

use super::{
    config::KubeletConfig,
    gates::{resolve, Gate, GateBasis, GateState},
    version::KubeletVersion,
};
use crate::{backoff::BackoffPolicy, time::SECOND};

/// Where the agent's picture of the kubelet comes from, as one word (`lifecycle_kubelet_info`'s
/// `source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KubeletSource {
    /// The kubelet process's command line and configuration files, read through `/proc`.
    Node,
    /// The agent's flags alone (`--reduced-backoff-decay`, `--max-container-restart-period`).
    Flags,
    /// No kubelet process was found on this node (not hostPID, or not a Kubernetes node).
    NotFound,
    /// A kubelet runs, but its configuration could not be read (the error is logged and in
    /// `doctor`).
    Unreadable,
    /// Nothing was read yet: the kubelet's defaults (the model's own tests).
    Defaults,
}

crate::spelling::spelling!(KubeletSource {
    Node => "node",
    Flags => "flags",
    NotFound => "not_found",
    Unreadable => "unreadable",
    Defaults => "defaults",
});

/// What discovery read about the node's kubelet.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct KubeletFacts {
    pub source: KubeletSource,
    /// The kubelet's process, when one was found.
    pub pid: Option<u32>,
    /// Its release (the Node object's `status.nodeInfo.kubeletVersion`), when known.
    pub version: Option<KubeletVersion>,
    /// Its effective configuration, when it could be read.
    pub config: Option<KubeletConfig>,
    /// Where the configuration came from, in words (`/var/lib/kubelet/config.yaml + 2 drop-ins
    /// of /etc/kubernetes/kubelet.conf.d + flags`), or why it could not be read.
    pub origin: String,
}

impl KubeletFacts {
    /// Nothing read: the kubelet's defaults, for the model's tests and a tracker made before
    /// anything was read.
    pub fn defaults() -> Self {
        Self {
            source: KubeletSource::Defaults,
            pid: None,
            version: None,
            config: None,
            origin: "the kubelet's defaults".into(),
        }
    }
}

/// The agent's flags that override what it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KubeletOverrides {
    /// `--reduced-backoff-decay[=bool]`: the ReduceDefaultCrashLoopBackOffDecay gate.
    pub reduced_decay: Option<bool>,
    /// `--max-container-restart-period`: `crashLoopBackOff.maxContainerRestartPeriod`, with the
    /// KubeletCrashLoopBackOffMax gate on.
    pub max_container_restart_period_ns: Option<u64>,
}

impl KubeletOverrides {
    fn any_backoff(&self) -> bool {
        self.reduced_decay.is_some() || self.max_container_restart_period_ns.is_some()
    }
}

/// The back-off restarts are judged by, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BackoffChoice {
    Known {
        policy: BackoffPolicy,
    },
    /// Restarts after a container's first are not judged; why, in words.
    Unknown {
        why: String,
    },
}

impl BackoffChoice {
    /// The policy, when known.
    pub fn policy(&self) -> Option<BackoffPolicy> {
        match self {
            BackoffChoice::Known { policy } => Some(*policy),
            BackoffChoice::Unknown { .. } => None,
        }
    }
}

/// What the agent expects of this node's kubelet.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct KubeletPolicy {
    pub facts: KubeletFacts,
    /// Every gate the agent models, decided.
    pub gates: Vec<GateState>,
    pub backoff: BackoffChoice,
}

impl Default for KubeletPolicy {
    /// The kubelet's defaults, judged as known (what the model's own tests run with).
    fn default() -> Self {
        let gates = Gate::ALL.iter().map(|&gate| resolve(gate, None, true, None)).collect();
        Self {
            facts: KubeletFacts::defaults(),
            gates,
            backoff: BackoffChoice::Known { policy: BackoffPolicy::default() },
        }
    }
}

impl KubeletPolicy {
    /// Derives the policy from `facts` and the agent's `overrides` (see the module header).
    pub fn derive(mut facts: KubeletFacts, overrides: KubeletOverrides) -> Self {
        let configured = |gate: Gate| facts.config.as_ref().and_then(|c| c.feature_gates.get(gate.as_str()).copied());
        let read = facts.config.is_some();
        let mut gates: Vec<GateState> =
            Gate::ALL.iter().map(|&gate| resolve(gate, configured(gate), read, facts.version.as_ref())).collect();
        if let Some(on) = overrides.reduced_decay {
            set(&mut gates, Gate::ReduceDefaultCrashLoopBackOffDecay, on);
        }
        if overrides.max_container_restart_period_ns.is_some() {
            set(&mut gates, Gate::KubeletCrashLoopBackOffMax, true);
        }
        let state = |gate: Gate| gates.iter().find(|g| g.gate == gate).and_then(|g| g.enabled);
        // With a back-off flag the operator states the back-off: what the node did not tell
        // is taken at the kubelet's defaults (the gate off, the field unset).
        let stated = overrides.any_backoff();
        let field: Option<Option<u64>> = match (overrides.max_container_restart_period_ns, &facts.config) {
            (Some(max), _) => Some(Some(max)),
            (None, Some(config)) => Some(config.max_container_restart_period_ns),
            (None, None) if stated => Some(None),
            (None, None) => None,
        };
        let decay = state(Gate::ReduceDefaultCrashLoopBackOffDecay).or(stated.then_some(false));
        let max_gate = state(Gate::KubeletCrashLoopBackOffMax).or(stated.then_some(false));
        let backoff = backoff_of(decay, max_gate, field, &facts);
        if stated && facts.source != KubeletSource::Node {
            facts.source = KubeletSource::Flags;
        }
        Self { facts, gates, backoff }
    }

    /// A gate's state.
    pub fn gate(&self, gate: Gate) -> Option<GateState> {
        self.gates.iter().find(|g| g.gate == gate).copied()
    }

    /// The kubelet's release, when known.
    pub fn version(&self) -> Option<&KubeletVersion> {
        self.facts.version.as_ref()
    }
}

fn set(gates: &mut [GateState], gate: Gate, on: bool) {
    if let Some(state) = gates.iter_mut().find(|g| g.gate == gate) {
        *state = GateState { gate, enabled: Some(on), basis: GateBasis::AgentFlag };
    }
}

/// The back-off for every value the unknown inputs could take; known when they agree.
fn backoff_of(
    decay: Option<bool>,
    max_gate: Option<bool>,
    field: Option<Option<u64>>,
    facts: &KubeletFacts,
) -> BackoffChoice {
    let both = |known: Option<bool>| match known {
        Some(on) => vec![on],
        None => vec![false, true],
    };
    let mut candidates = Vec::new();
    for decay in both(decay) {
        for max_gate in both(max_gate) {
            let base = if decay { BackoffPolicy::reduced_decay() } else { BackoffPolicy::default() };
            if !max_gate {
                candidates.push(Ok(base));
                continue;
            }
            match field {
                // The gate's v1beta1 default for an unset field: the old cap.
                Some(field) => candidates
                    .push(base.with_max_restart_period(field.unwrap_or(300 * SECOND)).map_err(|err| err.to_string())),
                None => candidates.push(Err("crashLoopBackOff.maxContainerRestartPeriod could not be read".into())),
            }
        }
    }
    let first = candidates[0].clone();
    if let (Ok(policy), true) = (&first, candidates.iter().all(|c| *c == first)) {
        return BackoffChoice::Known { policy: *policy };
    }
    let mut why = Vec::new();
    if decay.is_none() {
        why.push("whether ReduceDefaultCrashLoopBackOffDecay is on");
    }
    if max_gate.is_none() {
        why.push("whether KubeletCrashLoopBackOffMax is on");
    }
    if field.is_none() {
        why.push("its crashLoopBackOff.maxContainerRestartPeriod");
    }
    let why = match (why.is_empty(), &first) {
        (true, Err(err)) => format!("the kubelet's back-off setting is invalid: {err}"),
        _ => {
            let release = match &facts.version {
                Some(version) => format!("kubelet {version}"),
                None => "a kubelet of unknown release".into(),
            };
            format!("{release} ({}): the agent cannot tell {}", facts.origin, why.join(", "))
        }
    };
    BackoffChoice::Unknown { why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::config::{effective, CommandLine};

    const S: u64 = SECOND;

    fn facts(version: Option<(u32, u32)>, config: Option<KubeletConfig>) -> KubeletFacts {
        KubeletFacts {
            source: if config.is_some() { KubeletSource::Node } else { KubeletSource::Unreadable },
            pid: Some(42),
            version: version.map(|(major, minor)| KubeletVersion::new(major, minor, 0)),
            config,
            origin: "/var/lib/kubelet/config.yaml".into(),
        }
    }

    fn config(cap: Option<&str>, gates: &[(&str, bool)]) -> KubeletConfig {
        let line = CommandLine {
            feature_gates: gates.iter().map(|(g, on)| ((*g).to_owned(), *on)).collect(),
            ..CommandLine::default()
        };
        let mut config = effective(None, &[], &line).expect("valid");
        config.max_container_restart_period_ns =
            cap.map(|c| crate::kubelet::config::go_duration_ns(c).expect("duration"));
        config
    }

    fn policy(facts: KubeletFacts) -> BackoffChoice {
        KubeletPolicy::derive(facts, KubeletOverrides::default()).backoff
    }

    fn known(initial: u64, max: u64) -> BackoffChoice {
        BackoffChoice::Known {
            policy: BackoffPolicy { initial_ns: initial * S, max_ns: max * S, reset_after_ns: 600 * S },
        }
    }

    #[test]
    fn the_nodes_cap_is_the_maximum_where_the_gate_is_on() {
        // 1.37: KubeletCrashLoopBackOffMax beta, on by default.
        assert_eq!(policy(facts(Some((1, 37)), Some(config(Some("20s"), &[])))), known(10, 20));
        // Below the initial delay, the initial delay is the cap.
        assert_eq!(policy(facts(Some((1, 37)), Some(config(Some("3s"), &[])))), known(3, 3));
        // 1.34: alpha, off unless named: the field is ignored.
        assert_eq!(policy(facts(Some((1, 34)), Some(config(Some("20s"), &[])))), known(10, 300));
        assert_eq!(
            policy(facts(Some((1, 34)), Some(config(Some("20s"), &[("KubeletCrashLoopBackOffMax", true)])))),
            known(10, 20)
        );
        // Switched off on a release where it is on by default.
        assert_eq!(
            policy(facts(Some((1, 37)), Some(config(Some("20s"), &[("KubeletCrashLoopBackOffMax", false)])))),
            known(10, 300)
        );
    }

    #[test]
    fn the_default_back_off_on_every_release_without_a_cap() {
        for minor in [20, 27, 33, 35, 37] {
            assert_eq!(policy(facts(Some((1, minor)), Some(config(None, &[])))), known(10, 300), "1.{minor}");
        }
    }

    #[test]
    fn reduced_decay_and_its_cap() {
        let gate = ("ReduceDefaultCrashLoopBackOffDecay", true);
        // 1.34: only the reduced decay.
        assert_eq!(policy(facts(Some((1, 34)), Some(config(None, &[gate])))), known(1, 60));
        // 1.37: the cap gate is on, and its unset field defaults to 300 s: 1 s doubling to 300 s.
        assert_eq!(policy(facts(Some((1, 37)), Some(config(None, &[gate])))), known(1, 300));
        assert_eq!(policy(facts(Some((1, 37)), Some(config(Some("45s"), &[gate])))), known(1, 45));
    }

    #[test]
    fn an_unknown_release_is_judged_only_where_every_release_agrees() {
        // No cap written: every release backs off 10 s to 300 s.
        assert_eq!(policy(facts(None, Some(config(None, &[])))), known(10, 300));
        // A cap written: 1.32-1.34 ignore it, 1.35+ apply it: cannot tell.
        let BackoffChoice::Unknown { why } = policy(facts(None, Some(config(Some("20s"), &[])))) else {
            panic!("judged without knowing the release")
        };
        assert!(why.contains("KubeletCrashLoopBackOffMax") && why.contains("unknown release"), "{why}");
        // The gate named in the configuration settles it.
        assert_eq!(
            policy(facts(None, Some(config(Some("20s"), &[("KubeletCrashLoopBackOffMax", true)])))),
            known(10, 20)
        );
    }

    #[test]
    fn without_the_configuration_the_agent_cannot_judge() {
        let BackoffChoice::Unknown { why } = policy(facts(Some((1, 37)), None)) else { panic!("judged blind") };
        assert!(why.contains("maxContainerRestartPeriod"), "{why}");
        // On a release before the cap existed, the configuration cannot change the back-off...
        // unless it names the reduced decay's gate, which it could: still unknown from 1.33 on.
        assert_eq!(policy(facts(Some((1, 31)), None)), known(10, 300));
        assert!(matches!(policy(facts(Some((1, 33)), None)), BackoffChoice::Unknown { .. }));
    }

    #[test]
    fn a_newer_release_keeps_what_was_on_and_leaves_the_rest_unjudged() {
        let newer = Some((1, crate::kubelet::gates::NEWEST_KNOWN_MINOR + 1));
        let BackoffChoice::Unknown { why } = policy(facts(newer, Some(config(Some("20s"), &[])))) else {
            panic!("guessed a newer release's decay")
        };
        assert!(why.contains("ReduceDefaultCrashLoopBackOffDecay"), "{why}");
        let pinned = config(Some("20s"), &[("ReduceDefaultCrashLoopBackOffDecay", false)]);
        assert_eq!(policy(facts(newer, Some(pinned))), known(10, 20));
    }

    #[test]
    fn flags_override_and_state_what_the_node_did_not_tell() {
        let flags = KubeletOverrides { reduced_decay: None, max_container_restart_period_ns: Some(20 * S) };
        // Nothing read (no kubelet process): the flag is the operator's statement.
        let derived =
            KubeletPolicy::derive(KubeletFacts { source: KubeletSource::NotFound, ..facts(None, None) }, flags);
        assert_eq!(derived.backoff, known(10, 20));
        assert_eq!(derived.facts.source, KubeletSource::Flags);
        assert_eq!(derived.gate(Gate::KubeletCrashLoopBackOffMax).map(|g| g.basis), Some(GateBasis::AgentFlag));
        // Over a node that says otherwise, the flag wins.
        let over = KubeletPolicy::derive(facts(Some((1, 37)), Some(config(Some("60s"), &[]))), flags);
        assert_eq!(over.backoff, known(10, 20));
        assert_eq!(over.facts.source, KubeletSource::Node);
        let decay = KubeletOverrides { reduced_decay: Some(true), max_container_restart_period_ns: None };
        let blind = KubeletFacts { source: KubeletSource::NotFound, ..facts(None, None) };
        assert_eq!(KubeletPolicy::derive(blind, decay).backoff, known(1, 60));
    }

    #[test]
    fn an_invalid_cap_is_not_judged_by() {
        let BackoffChoice::Unknown { why } = policy(facts(Some((1, 37)), Some(config(Some("301s"), &[])))) else {
            panic!("judged by a cap the kubelet refuses")
        };
        assert!(why.contains("invalid"), "{why}");
    }
}
