//! The kubelet feature gates the agent's rules depend on, their defaults per release, and how a
//! gate's state on one node is decided: what the node's configuration says, else the default of
//! the node's release, else unknown.
//!
//! The stages are upstream's `defaultVersionedKubernetesFeatureGates`
//! (`pkg/features/kube_features.go`, as of the `k8s.io/kubernetes` v1.37.2 module the modern
//! tier builds): a gate exists from its first stage on, with that stage's default until the
//! next. Releases after [`NEWEST_KNOWN_MINOR`] keep a gate that is on by default on (gates move
//! towards on: beta, then GA), but one that is off may have been promoted since: unknown.

use serde::Serialize;

use super::version::KubeletVersion;

/// The newest 1.x release whose gate defaults this table knows.
pub const NEWEST_KNOWN_MINOR: u32 = 37;
/// The oldest 1.x release the table speaks for (the agent's oldest test node).
pub const OLDEST_KNOWN_MINOR: u32 = 20;

/// A kubelet feature gate whose state changes what the agent expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gate {
    /// Native sidecars (KEP-753): init containers with `restartPolicy: Always`.
    SidecarContainers,
    /// `crashLoopBackOff.maxContainerRestartPeriod` (KEP-4603).
    KubeletCrashLoopBackOffMax,
    /// Back-off 1 s doubling to 60 s instead of 10 s to 300 s (KEP-4603).
    ReduceDefaultCrashLoopBackOffDecay,
    /// `lifecycle.stopSignal` (KEP-4960).
    ContainerStopSignals,
    /// Container `restartPolicy` and `restartPolicyRules` (KEP-5307).
    ContainerRestartRules,
    /// The `RestartAllContainers` action of `restartPolicyRules` (KEP-5532).
    RestartAllContainersOnContainerExits,
    /// preStop `sleep` inside the kubelet (KEP-3960).
    PodLifecycleSleepAction,
    /// The kubelet's shutdown manager (`shutdownGracePeriod`, KEP-2000).
    GracefulNodeShutdown,
    /// `memory.high` from `memoryThrottlingFactor` (KEP-2570).
    MemoryQoS,
    /// In-place resize (KEP-1287): `resizePolicy: RestartContainer` restarts by design.
    InPlacePodVerticalScaling,
    /// Pod-level `resources` (KEP-2837): an OOM kill can answer the pod's limit.
    PodLevelResources,
}

crate::spelling::spelling!(Gate {
    SidecarContainers => "SidecarContainers",
    KubeletCrashLoopBackOffMax => "KubeletCrashLoopBackOffMax",
    ReduceDefaultCrashLoopBackOffDecay => "ReduceDefaultCrashLoopBackOffDecay",
    ContainerStopSignals => "ContainerStopSignals",
    ContainerRestartRules => "ContainerRestartRules",
    RestartAllContainersOnContainerExits => "RestartAllContainersOnContainerExits",
    PodLifecycleSleepAction => "PodLifecycleSleepAction",
    GracefulNodeShutdown => "GracefulNodeShutdown",
    MemoryQoS => "MemoryQoS",
    InPlacePodVerticalScaling => "InPlacePodVerticalScaling",
    PodLevelResources => "PodLevelResources",
});

/// A gate's maturity from a release on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Maturity {
    Alpha,
    Beta,
    Ga,
}

/// One row of upstream's versioned specs: from `1.<since>` on, this default.
#[derive(Clone, Copy, Debug)]
struct Stage {
    since: u32,
    default: bool,
    maturity: Maturity,
}

const fn stage(since: u32, default: bool, maturity: Maturity) -> Stage {
    Stage { since, default, maturity }
}

impl Gate {
    /// Upstream's stages, oldest first.
    fn stages(self) -> &'static [Stage] {
        use Maturity::*;
        match self {
            Gate::SidecarContainers => const { &[stage(28, false, Alpha), stage(29, true, Beta), stage(33, true, Ga)] },
            Gate::KubeletCrashLoopBackOffMax => const { &[stage(32, false, Alpha), stage(35, true, Beta)] },
            Gate::ReduceDefaultCrashLoopBackOffDecay => const { &[stage(33, false, Alpha)] },
            Gate::ContainerStopSignals => const { &[stage(33, false, Alpha)] },
            Gate::ContainerRestartRules => const { &[stage(34, false, Alpha), stage(35, true, Beta)] },
            Gate::RestartAllContainersOnContainerExits => const { &[stage(35, false, Alpha), stage(36, true, Beta)] },
            Gate::PodLifecycleSleepAction => {
                const { &[stage(29, false, Alpha), stage(30, true, Beta), stage(34, true, Ga)] }
            }
            Gate::GracefulNodeShutdown => const { &[stage(20, false, Alpha), stage(21, true, Beta)] },
            Gate::MemoryQoS => const { &[stage(22, false, Alpha), stage(37, true, Beta)] },
            Gate::InPlacePodVerticalScaling => {
                const { &[stage(27, false, Alpha), stage(33, true, Beta), stage(35, true, Ga)] }
            }
            Gate::PodLevelResources => const { &[stage(32, false, Alpha), stage(34, true, Beta)] },
        }
    }

    /// The gate's default and maturity in release `1.<minor>`; None before the gate existed.
    pub fn default_in(self, minor: u32) -> Option<(bool, Maturity)> {
        self.stages().iter().rev().find(|s| s.since <= minor).map(|s| (s.default, s.maturity))
    }
}

/// How a gate's state was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateBasis {
    /// The kubelet's configuration or command line names it.
    Configured,
    /// An agent flag says so (`--reduced-backoff-decay`, `--max-container-restart-period`).
    AgentFlag,
    /// The default of the kubelet's release.
    ReleaseDefault,
    /// The kubelet's release predates the gate: the behaviour it guards does not exist.
    NotInRelease,
    /// A release newer than the table: on by default since a release the table knows.
    OnSinceKnownRelease,
    /// The release is unknown, and every release the table knows has the same default.
    SameInEveryKnownRelease,
    /// The kubelet's configuration could not be read, and the gate exists in its release (or
    /// the release is unknown): the configuration may set it either way.
    ConfigurationUnread,
    /// Nothing tells: the release is unknown (or newer than the table, where the gate was off).
    Unknown,
}

/// One gate's state on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GateState {
    pub gate: Gate,
    /// On or off; None when the agent cannot tell.
    pub enabled: Option<bool>,
    pub basis: GateBasis,
}

/// Decides `gate` for a kubelet whose configuration sets it to `configured` (None: not named,
/// or the configuration could not be read: `configuration_read` false) and whose release is
/// `version` (None: unknown).
pub fn resolve(
    gate: Gate,
    configured: Option<bool>,
    configuration_read: bool,
    version: Option<&KubeletVersion>,
) -> GateState {
    let decided = |enabled: Option<bool>, basis| GateState { gate, enabled, basis };
    if let Some(enabled) = configured {
        return decided(Some(enabled), GateBasis::Configured);
    }
    if !configuration_read {
        let in_release = version.and_then(KubeletVersion::minor_of_1).map(|minor| gate.default_in(minor).is_some());
        return match in_release {
            Some(false) => decided(Some(false), GateBasis::NotInRelease),
            _ => decided(None, GateBasis::ConfigurationUnread),
        };
    }
    match version {
        Some(version) => match version.minor_of_1() {
            Some(minor) if minor <= NEWEST_KNOWN_MINOR => match gate.default_in(minor) {
                Some((default, _)) => decided(Some(default), GateBasis::ReleaseDefault),
                None => decided(Some(false), GateBasis::NotInRelease),
            },
            // Newer than the table (or a 2.x): what was on stays on; what was off may not be.
            _ => match gate.default_in(NEWEST_KNOWN_MINOR) {
                Some((true, _)) => decided(Some(true), GateBasis::OnSinceKnownRelease),
                _ => decided(None, GateBasis::Unknown),
            },
        },
        None => {
            let default = |minor| gate.default_in(minor).is_some_and(|(on, _)| on);
            let first = default(OLDEST_KNOWN_MINOR);
            if (OLDEST_KNOWN_MINOR..=NEWEST_KNOWN_MINOR).all(|minor| default(minor) == first) {
                decided(Some(first), GateBasis::SameInEveryKnownRelease)
            } else {
                decided(None, GateBasis::Unknown)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeletVersion {
        KubeletVersion::new(1, minor, 0)
    }

    #[test]
    fn defaults_follow_the_release() {
        let state = |gate, minor| resolve(gate, None, true, Some(&v(minor)));
        assert_eq!(state(Gate::KubeletCrashLoopBackOffMax, 31).enabled, Some(false));
        assert_eq!(state(Gate::KubeletCrashLoopBackOffMax, 31).basis, GateBasis::NotInRelease);
        assert_eq!(state(Gate::KubeletCrashLoopBackOffMax, 34).enabled, Some(false));
        assert_eq!(state(Gate::KubeletCrashLoopBackOffMax, 35).enabled, Some(true));
        assert_eq!(state(Gate::KubeletCrashLoopBackOffMax, 37).basis, GateBasis::ReleaseDefault);
        assert_eq!(state(Gate::ReduceDefaultCrashLoopBackOffDecay, 37).enabled, Some(false));
        assert_eq!(state(Gate::SidecarContainers, 28).enabled, Some(false));
        assert_eq!(state(Gate::SidecarContainers, 29).enabled, Some(true));
        assert_eq!(state(Gate::GracefulNodeShutdown, 20).enabled, Some(false));
        // MemoryQoS: alpha from 1.22, beta and on from 1.37 (`memory.high` set).
        assert_eq!(state(Gate::MemoryQoS, 36).enabled, Some(false));
        assert_eq!(state(Gate::MemoryQoS, 37).enabled, Some(true));
        assert_eq!(Gate::SidecarContainers.default_in(33), Some((true, Maturity::Ga)));
        assert_eq!(Gate::ContainerStopSignals.default_in(32), None);
    }

    #[test]
    fn the_configuration_wins_over_the_release() {
        let state = resolve(Gate::ReduceDefaultCrashLoopBackOffDecay, Some(true), true, Some(&v(37)));
        assert_eq!((state.enabled, state.basis), (Some(true), GateBasis::Configured));
        let state = resolve(Gate::KubeletCrashLoopBackOffMax, Some(false), true, None);
        assert_eq!((state.enabled, state.basis), (Some(false), GateBasis::Configured));
    }

    #[test]
    fn newer_releases_keep_what_was_on_and_do_not_guess_what_was_off() {
        let newer = v(NEWEST_KNOWN_MINOR + 1);
        let on = resolve(Gate::KubeletCrashLoopBackOffMax, None, true, Some(&newer));
        assert_eq!((on.enabled, on.basis), (Some(true), GateBasis::OnSinceKnownRelease));
        let off = resolve(Gate::ReduceDefaultCrashLoopBackOffDecay, None, true, Some(&newer));
        assert_eq!((off.enabled, off.basis), (None, GateBasis::Unknown));
    }

    #[test]
    fn an_unknown_release_is_decided_only_where_every_known_release_agrees() {
        let same = resolve(Gate::ReduceDefaultCrashLoopBackOffDecay, None, true, None);
        assert_eq!((same.enabled, same.basis), (Some(false), GateBasis::SameInEveryKnownRelease));
        let differs = resolve(Gate::KubeletCrashLoopBackOffMax, None, true, None);
        assert_eq!((differs.enabled, differs.basis), (None, GateBasis::Unknown));
    }

    #[test]
    fn an_unread_configuration_leaves_every_gate_of_the_release_open() {
        let open = resolve(Gate::MemoryQoS, None, false, Some(&v(37)));
        assert_eq!((open.enabled, open.basis), (None, GateBasis::ConfigurationUnread));
        let absent = resolve(Gate::ContainerStopSignals, None, false, Some(&v(32)));
        assert_eq!((absent.enabled, absent.basis), (Some(false), GateBasis::NotInRelease));
        assert_eq!(resolve(Gate::MemoryQoS, None, false, None).enabled, None);
    }

    #[test]
    fn gates_are_spelled_as_upstream_spells_them() {
        for gate in Gate::ALL {
            assert!(gate.as_str().chars().all(|c| c.is_ascii_alphanumeric()), "{gate:?}");
            assert!(!gate.stages().is_empty());
            assert!(gate.stages().windows(2).all(|w| w[0].since < w[1].since), "{gate:?}");
        }
    }
}
