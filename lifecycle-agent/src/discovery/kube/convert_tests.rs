//! Pod decoding through the same path the watcher uses, from JSON fixtures (including fields a
//! 1.20 API server does not serve).

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::model::spec::StopCause;

fn decode(json: &str) -> (PodFacts, Vec<SpecProblem>) {
    let pod: Pod = serde_json::from_str(json).expect("fixture is a Pod");
    let mut problems = Vec::new();
    let facts = pod_facts(&pod, &mut problems).expect("has a uid");
    (facts, problems)
}

#[test]
fn newer_fields_restart_rules_stop_signal_sidecars_and_probes_decode() {
    let (pod, problems) = decode(include_str!("fixtures/pod-1.35-fields.json"));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!((pod.namespace.as_str(), pod.name.as_str()), ("shop", "web-1"));
    assert_eq!(pod.restart_policy, RestartPolicy::OnFailure);
    assert_eq!(pod.grace_ns, Some(45 * SECOND));
    assert_eq!(pod.deletion_grace_ns, None);
    assert!(pod.restarting_all_containers);
    let reported = &pod.reported_status;
    assert_eq!((reported.ready_to_start_containers, reported.initialized), (Some(true), Some(false)));
    assert_eq!(
        (reported.generation, reported.observed_generation),
        (Some(3), Some(2)),
        "a spec the kubelet has not seen"
    );
    assert_eq!(crate::model::spec::pod_level_cause(&pod), Some(StopCause::RestartAllContainers));
    let kinds: Vec<(&str, ContainerKind)> = pod.containers.iter().map(|c| (c.name.as_str(), c.kind)).collect();
    assert_eq!(
        kinds,
        vec![("migrate", ContainerKind::Init), ("proxy", ContainerKind::Sidecar), ("app", ContainerKind::Regular)]
    );
    let app = pod.container("app").expect("app");
    assert_eq!(app.stop_signal, Some(10));
    assert_eq!(app.pre_stop, Some(PreStopHandler::Sleep { seconds: 5 }));
    assert_eq!(app.liveness_grace_ns, Some(7 * SECOND));
    assert_eq!(app.startup_grace_ns, None);
    assert_eq!(app.restart.container_restart_policy, Some(RestartPolicy::Never));
    let actions: Vec<_> = app.restart.restart_policy_rules.iter().map(|r| r.action).collect();
    assert_eq!(actions, [RestartRuleAction::Restart, RestartRuleAction::RestartAllContainers], "both rules, in order");
    assert!(app.restart.should_restart(42) && !app.restart.should_restart(1), "rules before the Never policy");
    // Exit 7 restarts every container of the pod, this one with them; 42 restarts it alone.
    assert!(app.restart.should_restart(7) && app.restart.restarts_all_containers(7));
    assert!(!app.restart.restarts_all_containers(42));
    assert_eq!(
        app.http_probes,
        vec![
            HttpProbe { port: 9891, path: "/probe/tcp?port=8080&stall=5s".into() },
            HttpProbe { port: 9891, path: "/probe/process".into() },
        ],
        "a named port resolves; the exec probe is not an http probe"
    );
    assert!(pod.container("proxy").expect("proxy").restart.is_sidecar());
    let reported = pod.reported("app").expect("reported");
    assert_eq!((reported.restart_count, reported.stop_signal), (2, Some(10)));
    assert_eq!(reported.container_id.as_deref(), Some("c0ffee"), "without the runtime's prefix");
    assert_eq!(reported.state, Some(ReportedState::Running));
    assert_eq!(
        reported.last_state,
        Some(ReportedState::Terminated { reason: "Error".into(), exit_code: 137, signal: Some(9), container_id: None })
    );
    assert_eq!(pod.reported.len(), 3, "init containers' statuses too");
}

#[test]
fn a_pod_the_kubelet_evicted_then_deleted_carries_both() {
    let (pod, problems) = decode(include_str!("fixtures/pod-deleted-evicted.json"));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(pod.restart_policy, RestartPolicy::Never);
    assert_eq!(pod.grace_ns, None, "the API default applies");
    assert_eq!(pod.deletion_grace_ns, Some(3 * SECOND));
    assert_eq!(pod.disruption, Some(Disruption::EvictedByKubelet), "status.reason Evicted is the kubelet's");
    assert_eq!(pod.reported_phase.as_deref(), Some("Failed"));
}

#[test]
fn malformed_fields_are_reported_one_by_one_and_defaulted() {
    let (pod, problems) = decode(include_str!("fixtures/pod-malformed.json"));
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "spec.restartPolicy",
            "app.restartPolicy",
            "app.restartPolicyRules.exitCodes.operator",
            "app.lifecycle.stopSignal"
        ]
    );
    assert_eq!(pod.restart_policy, RestartPolicy::Always);
    let app = pod.container("app").expect("app");
    assert_eq!((app.stop_signal, app.restart.container_restart_policy), (None, None));
    assert!(app.restart.restart_policy_rules.is_empty());
    assert_eq!(pod.disruption, Some(Disruption::Preempted));
}

#[test]
fn signal_names_map_to_linux_numbers() {
    assert_eq!(signal_number("SIGTERM"), Some(15));
    assert_eq!(signal_number("SIGKILL"), Some(9));
    assert_eq!(signal_number("SIGRTMIN+3"), Some(37));
    assert_eq!(signal_number("SIGRTMAX-1"), Some(63));
    assert_eq!(signal_number("SIGRTMIN+99"), None);
    assert_eq!(signal_number("TERM"), None);
}

#[test]
fn an_overlong_probe_path_is_refused_and_a_long_bad_value_is_cut_in_the_problem() {
    // Issue 18: httpGet.path was copied at any length into declarations and the `check` label.
    let long_path = format!("/probe/file?path=/{}", "a".repeat(100_000));
    let long_signal = "X".repeat(10_000);
    let pod = serde_json::json!({
        "metadata": {"name": "fat", "namespace": "shop", "uid": "u-1"},
        "spec": {"containers": [{
            "name": "app",
            "lifecycle": {"stopSignal": long_signal},
            "livenessProbe": {"httpGet": {"port": 9891, "path": long_path}},
            "readinessProbe": {"httpGet": {"port": 9891, "path": "/probe/process"}}
        }]}
    });
    let (facts, problems) = decode(&pod.to_string());
    let app = facts.container("app").expect("app");
    assert_eq!(app.http_probes, vec![HttpProbe { port: 9891, path: "/probe/process".into() }]);
    assert!(problems.iter().any(|p| p.field == "app.httpGet.path" && p.why.contains("longer than 512 bytes")));
    assert!(problems.iter().all(|p| p.why.len() < 200), "{problems:?}");
}
