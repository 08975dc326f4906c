//! The grace a graceful node shutdown gives a pod: the kubelet's shutdown manager
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager.go`, KEP-2000) groups the node's pods by
//! priority and kills each group with the group's whole seconds, or with the pod's own
//! `terminationGracePeriodSeconds` when that is no longer (`killPods`). Without
//! `shutdownGracePeriodByPodPriority` the groups are two (`migrateConfig`): pods below
//! system-critical priority get `shutdownGracePeriod - shutdownGracePeriodCriticalPods`, critical
//! pods `shutdownGracePeriodCriticalPods`. The runtime then applies its 2 s floor.
//!
//! Pure: the configuration as read, the pod's priority and grace in, a grace out.

use super::KubeletConfig;
use crate::time::SECOND;

/// `scheduling.SystemCriticalPriority`: `system-cluster-critical`; `system-node-critical` is
/// above it.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The kubelet's priority groups for a shutdown, lowest priority first, each with its whole
/// seconds; empty when graceful node shutdown is off (`shutdownGracePeriod` 0).
pub fn shutdown_groups(config: &KubeletConfig) -> Vec<(i32, i64)> {
    // The list replaces the two fields unless its gate was turned off (beta and on from 1.24).
    let by_priority_on = config.feature_gates.get("GracefulNodeShutdownBasedOnPodPriority") != Some(&false);
    let mut groups = if by_priority_on && !config.shutdown_grace_period_by_pod_priority.is_empty() {
        config.shutdown_grace_period_by_pod_priority.clone()
    } else {
        let requested = config.shutdown_grace_period_ns;
        let critical = config.shutdown_grace_period_critical_pods_ns;
        if requested == 0 || critical > requested {
            return Vec::new();
        }
        // Durations become whole seconds the way Go's `int64(d / time.Second)` does.
        let whole = |ns: u64| (ns / SECOND) as i64;
        vec![(0, whole(requested - critical)), (SYSTEM_CRITICAL_PRIORITY, whole(critical))]
    };
    groups.sort_by_key(|(priority, _)| *priority);
    groups
}

/// The grace the shutdown manager gives a pod of `priority` (None: 0, as the kubelet takes an
/// unset one) whose spec asks for `pod_grace_ns` (None: unset); None when graceful node
/// shutdown is off.
pub fn node_shutdown_grace_ns(config: &KubeletConfig, priority: Option<i32>, pod_grace_ns: Option<u64>) -> Option<u64> {
    let groups = shutdown_groups(config);
    let priority = priority.unwrap_or(0);
    // `groupByPriority`: the group with the highest priority at or below the pod's; a pod
    // below every group's is in the lowest, one above every group's in the highest.
    let (_, group_seconds) =
        groups.iter().rev().find(|(floor, _)| *floor <= priority).or_else(|| groups.first()).copied()?;
    let group_ns = u64::try_from(group_seconds).unwrap_or(0).saturating_mul(SECOND);
    Some(match pod_grace_ns {
        Some(pod) if pod <= group_ns => pod,
        _ => group_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::config::{effective, CommandLine, ConfigFile};

    fn config(content: serde_json::Value) -> KubeletConfig {
        let file = ConfigFile { path: "/var/lib/kubelet/config.yaml".into(), content };
        effective(Some(&file), &[], &CommandLine::default()).expect("valid")
    }

    fn base(extra: serde_json::Value) -> serde_json::Value {
        let mut value = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
        });
        value.as_object_mut().expect("present").extend(extra.as_object().expect("present").clone());
        value
    }

    #[test]
    fn each_pod_gets_its_groups_seconds_or_its_own_shorter_grace() {
        let c = config(base(serde_json::json!({
            "shutdownGracePeriod": "30s",
            "shutdownGracePeriodCriticalPods": "10s",
        })));
        assert_eq!(shutdown_groups(&c), vec![(0, 20), (SYSTEM_CRITICAL_PRIORITY, 10)]);
        // An ordinary pod asking for 60 s gets the group's 20 s; one asking for 5 s keeps 5 s.
        assert_eq!(node_shutdown_grace_ns(&c, None, Some(60 * SECOND)), Some(20 * SECOND));
        assert_eq!(node_shutdown_grace_ns(&c, Some(1000), Some(5 * SECOND)), Some(5 * SECOND));
        // system-cluster-critical and system-node-critical pods: the critical 10 s.
        assert_eq!(node_shutdown_grace_ns(&c, Some(SYSTEM_CRITICAL_PRIORITY), Some(30 * SECOND)), Some(10 * SECOND));
        assert_eq!(node_shutdown_grace_ns(&c, Some(2_000_001_000), Some(30 * SECOND)), Some(10 * SECOND));
        // A negative priority is in the lowest group.
        assert_eq!(node_shutdown_grace_ns(&c, Some(-5), Some(30 * SECOND)), Some(20 * SECOND));
    }

    #[test]
    fn off_without_a_shutdown_grace_period_and_by_priority_when_listed() {
        assert_eq!(node_shutdown_grace_ns(&config(base(serde_json::json!({}))), None, Some(30 * SECOND)), None);
        let listed = config(base(serde_json::json!({
            "shutdownGracePeriod": "30s",
            "shutdownGracePeriodByPodPriority": [
                {"priority": 100000, "shutdownGracePeriodSeconds": 120},
                {"priority": 0, "shutdownGracePeriodSeconds": 7},
                {"priority": 10000, "shutdownGracePeriodSeconds": 40},
            ],
        })));
        assert_eq!(node_shutdown_grace_ns(&listed, Some(9999), Some(300 * SECOND)), Some(7 * SECOND));
        assert_eq!(node_shutdown_grace_ns(&listed, Some(10000), Some(300 * SECOND)), Some(40 * SECOND));
        assert_eq!(node_shutdown_grace_ns(&listed, Some(SYSTEM_CRITICAL_PRIORITY), None), Some(120 * SECOND));
        // With its gate off the kubelet ignores the list and falls back to the two fields.
        let mut gate_off = listed.clone();
        gate_off.feature_gates.insert("GracefulNodeShutdownBasedOnPodPriority".into(), false);
        assert_eq!(node_shutdown_grace_ns(&gate_off, Some(10000), Some(300 * SECOND)), Some(30 * SECOND));
    }
}
