//! The tracker with a RestartAllContainers rule: a sibling's stop named from the exit that fired
//! the rule, whichever of the two is judged first.

use super::spec::pod_facts;
use super::*;

/// The pod of `pod_facts` with a second container `helper`, `app` under a RestartAllContainers
/// rule for exit code 42; both running (cgroups 1001 and 1002, init pids 100 and 200).
fn restart_all_pod(tracker_links_app_first: bool) -> (NodeTracker, u64, u64) {
    use crate::container_state::{ExitCodeOperator, RestartPolicy, RestartRule, RestartRuleAction};
    let mut pod = pod_facts(3, RestartPolicy::Always);
    let mut helper = pod.containers[0].clone();
    helper.name = "helper".into();
    pod.containers[0].restart.restart_policy_rules = vec![RestartRule {
        action: RestartRuleAction::RestartAllContainers,
        operator: ExitCodeOperator::In,
        values: vec![42],
    }];
    pod.containers.push(helper);
    let mut tracker = tracker_with_cri();
    tracker.set_api_configured();
    tracker.set_api_reachable(true);
    tracker.apply_pod(pod, 0);
    let helper_meta = ContainerMeta { container_name: "helper".into(), ..meta(2, 3) };
    if tracker_links_app_first {
        tracker.set_metadata(vec![meta(1, 3), helper_meta]);
    } else {
        tracker.set_metadata(vec![helper_meta]);
    }
    let app = container_cgroup(&mut tracker, 0, 1);
    let helper = container_cgroup(&mut tracker, 0, 2);
    tracker.apply(&exec(SECOND, 100, app, SHIM_CGROUP, "sh"));
    tracker.apply(&exec(SECOND, 200, helper, SHIM_CGROUP, "sh"));
    (tracker, app, helper)
}

/// `app` exits with `code` at 10 s; the runtime sends `helper` TERM at `stop_at` and it exits
/// 0.1 s later.
fn app_exits_then_helper_stopped(tracker: &mut NodeTracker, (app, helper): (u64, u64), code: u8, stop_at: u64) {
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&exit(10 * SECOND, 100, app, Some(code), None));
    tracker.apply(&signal(stop_at, shim, (200, helper), 15));
    tracker.apply(&exit(stop_at + 100_000_000, 200, helper, Some(0), None));
}

fn cause_of(tracker: &NodeTracker, container: &str, now: u64) -> Option<crate::spec::StopCause> {
    tracker
        .snapshot()
        .containers(at(now))
        .into_iter()
        .find(|v| v.labels.container == container)
        .and_then(|v| v.last_termination)
        .and_then(|r| r.cause)
}

#[test]
fn a_restart_all_containers_rule_names_the_siblings_stop_without_the_pods_condition() {
    // Seen on the 1.37 node: the kubelet set AllContainersRestarting and cleared it between two
    // status syncs, so the API never showed it, and `helper`'s stop was `runtime_or_unknown`.
    // `app`'s exit 42, which its rule says restarts every container, names it.
    use crate::spec::StopCause;
    let (mut tracker, app, helper) = restart_all_pod(true);
    app_exits_then_helper_stopped(&mut tracker, (app, helper), 42, 10 * SECOND + 500_000_000);
    assert_eq!(cause_of(&tracker, "helper", 11 * SECOND), Some(StopCause::RestartAllContainers));
    assert_eq!(cause_of(&tracker, "app", 11 * SECOND), None, "app exited on its own");

    // Another exit code is no restart of all: the sibling's stop stays unexplained.
    let (mut tracker, app, helper) = restart_all_pod(true);
    app_exits_then_helper_stopped(&mut tracker, (app, helper), 1, 10 * SECOND + 500_000_000);
    assert_eq!(cause_of(&tracker, "helper", 11 * SECOND), Some(StopCause::RuntimeOrUnknown));

    // A stop long after the exit that fired the rule is not the rule's.
    let (mut tracker, app, helper) = restart_all_pod(true);
    app_exits_then_helper_stopped(&mut tracker, (app, helper), 42, 40 * SECOND);
    assert_eq!(cause_of(&tracker, "helper", 41 * SECOND), Some(StopCause::RuntimeOrUnknown));
}

#[test]
fn a_restart_all_exit_judged_after_the_siblings_stop_names_that_stop() {
    // `app`'s runtime metadata came late: `helper`'s stop was judged first, without a cause;
    // the exit that fired the rule names it once `app` is linked and judged.
    use crate::spec::StopCause;
    let (mut tracker, app, helper) = restart_all_pod(false);
    app_exits_then_helper_stopped(&mut tracker, (app, helper), 42, 10 * SECOND + 500_000_000);
    assert_eq!(cause_of(&tracker, "helper", 11 * SECOND), Some(StopCause::RuntimeOrUnknown));
    let helper_meta = ContainerMeta { container_name: "helper".into(), ..meta(2, 3) };
    tracker.set_metadata(vec![meta(1, 3), helper_meta]);
    assert_eq!(cause_of(&tracker, "helper", 11 * SECOND), Some(StopCause::RestartAllContainers));
    let unit = tracker.units().find(|u| u.labels().container == "helper").expect("helper");
    let causes: Vec<_> = unit.counters().terminations.keys().map(|(_, cause)| *cause).collect();
    assert_eq!(causes, vec![Some(StopCause::RestartAllContainers)], "the count moved with the cause");
}
