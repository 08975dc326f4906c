//! The tracker driven by hand-made event sequences.

use super::*;
use crate::event::{CgroupDetail, SignalResult, TcpDetail};
use crate::metadata::{ContainerState as CriState, KubeletAnnotations};
use crate::{
    backoff::Verdict,
    container_state::{ContainerState, TerminatedReason},
    metadata::ContainerType,
    termination::{SenderKind, SignalSender, TerminationOutcome},
};

const SECOND: u64 = crate::time::SECOND;

/// A point in time of these tests.
fn at(ns: u64) -> crate::time::BootTime {
    crate::time::BootTime::from_ns(ns)
}
const POD_UID: &str = "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e";
const POD_CGROUP: u64 = 500;
const SHIM_CGROUP: u64 = 7;

fn container_id(n: u64) -> String {
    format!("{n:064x}")
}

fn meta(n: u64, grace_s: u64) -> ContainerMeta {
    ContainerMeta {
        kubelet: KubeletAnnotations {
            container_type: Some(ContainerType::Regular),
            spec_hash: Some(0xabc),
            termination_grace_period_ns: Some(grace_s * SECOND),
            ..KubeletAnnotations::default()
        },
        ..ContainerMeta::running(container_id(n), "sandbox".into(), "shop", "web-1", POD_UID, "app")
    }
}

fn event(time: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
    Event { at: at(time), pid: tgid, tgid, cgroup_id, detail }
}

fn mkdir(time: u64, id: u64, path: &str) -> Event {
    event(time, 1, 1, Detail::CgroupMkdir(CgroupDetail { id, path: path.into(), truncated: false }))
}

fn container_cgroup(tracker: &mut NodeTracker, time: u64, n: u64) -> u64 {
    let id = 1000 + n;
    tracker.apply(&mkdir(time, id, &format!("/kubepods/burstable/pod{POD_UID}/{}", container_id(n))));
    id
}

fn exec(time: u64, tgid: u32, cgroup_id: u64, parent_cgroup_id: u64, comm: &str) -> Event {
    let detail = Detail::Exec {
        parent_tgid: 1,
        parent_cgroup_id,
        namespace_init: parent_cgroup_id != cgroup_id,
        child_pid_namespace: true,
        started: at(time),
        comm: comm.into(),
    };
    event(time, tgid, cgroup_id, detail)
}

fn exit(time: u64, tgid: u32, cgroup_id: u64, status: Option<u8>, signal: Option<u8>) -> Event {
    let detail = Detail::Exit {
        exit_status: status,
        signal,
        core_dumped: false,
        group_dead: true,
        parent_tgid: 1,
        started: at(0),
        cpu_time: std::time::Duration::from_millis(5),
        comm: "app".into(),
    };
    event(time, tgid, cgroup_id, detail)
}

fn signal(time: u64, from: (u32, u64, &str), to: (u32, u64), sig: u32) -> Event {
    let detail = Detail::Signal {
        signal: sig,
        result: SignalResult::Delivered,
        group: true,
        target_pid: to.0,
        target_tgid: to.0,
        target_cgroup_id: to.1,
        sender_comm: from.2.into(),
        target_comm: "app".into(),
        from_kernel: false,
    };
    event(time, from.0, from.1, detail)
}

fn tracker_with_cri() -> NodeTracker {
    let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    tracker.apply(&mkdir(0, POD_CGROUP, &format!("/kubepods/burstable/pod{POD_UID}")));
    tracker
}

fn only_view(tracker: &NodeTracker, now: u64) -> ContainerView {
    let views = tracker.snapshot().containers(at(now));
    assert_eq!(views.len(), 1, "{views:#?}");
    views.into_iter().next().expect("one")
}

#[test]
fn a_sidecar_signalled_before_the_main_container_exited_is_flagged() {
    let mut tracker = tracker_with_cri();
    let mut sidecar = meta(1, 30);
    (sidecar.container_name, sidecar.kubelet.container_type) = ("proxy".into(), Some(ContainerType::Init));
    tracker.set_metadata(vec![sidecar, meta(2, 30)]);
    let proxy = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, proxy, SHIM_CGROUP, "proxy"));
    let app = container_cgroup(&mut tracker, 2 * SECOND, 2);
    tracker.apply(&exec(3 * SECOND, 200, app, SHIM_CGROUP, "app"));
    // The runtime signals both at once (the rule: the sidecar only after the app exited).
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (200, app), 15));
    tracker.apply(&signal(10 * SECOND, shim, (100, proxy), 15));
    tracker.apply(&exit(10 * SECOND + 1000, 100, proxy, None, Some(15)));
    tracker.apply(&exit(12 * SECOND, 200, app, Some(0), None));
    let views = tracker.snapshot().containers(at(13 * SECOND));
    let proxy = views.iter().find(|v| v.labels.container == "proxy").expect("proxy");
    assert!(proxy.sidecar);
    let order = proxy.sidecar_order.clone().expect("judged");
    assert_eq!(
        order.verdict,
        crate::termination::SidecarVerdict::SignalledBeforeMainExited { main_container: "app".into() }
    );
    let app = views.iter().find(|v| v.labels.container == "app").expect("app");
    assert!(!app.sidecar && app.sidecar_order.is_none());
    // Asked for the sidecar alone, it is the only view made, judged against the whole pod.
    let alone = tracker.snapshot().containers_where(at(13 * SECOND), |unit| unit.labels().container == "proxy");
    assert_eq!(alone.len(), 1);
    assert_eq!(alone[0].sidecar_order.as_ref(), Some(&order));
    let pods = tracker.snapshot().pods_where(at(13 * SECOND), |uid| uid == "someone-else");
    assert!(pods.is_empty(), "only the pods asked for");
    assert_eq!(tracker.snapshot().pods_where(at(13 * SECOND), |uid| uid == POD_UID).len(), 1);
}

/// Issue 40: `app` ignores TERM; the pod's 10 s run out. The kubelet stops the sidecar at the
/// deadline with the 2 s floor, 5 ms before `app`'s SIGKILL exit: the kubelet's rule, and the
/// sidecar's grace (and any Warning about it) is the 2 s it was given.
#[test]
fn a_sidecar_stopped_as_the_pods_grace_runs_out_is_in_the_kubelets_rule_with_two_seconds() {
    let mut tracker = tracker_with_cri();
    let mut sidecar = meta(1, 10);
    (sidecar.container_name, sidecar.kubelet.container_type) = ("proxy".into(), Some(ContainerType::Init));
    tracker.set_metadata(vec![sidecar, meta(2, 10)]);
    let proxy = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, proxy, SHIM_CGROUP, "proxy"));
    let app = container_cgroup(&mut tracker, 2 * SECOND, 2);
    tracker.apply(&exec(3 * SECOND, 200, app, SHIM_CGROUP, "app"));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(10 * SECOND, shim, (200, app), 15));
    tracker.apply(&signal(20 * SECOND - 5_000_000, shim, (100, proxy), 15));
    tracker.apply(&signal(20 * SECOND, shim, (200, app), 9));
    tracker.apply(&exit(20 * SECOND + 1_000_000, 200, app, None, Some(9)));
    // The sidecar ignores TERM as well: the runtime kills it at its 2 s.
    tracker.apply(&signal(22 * SECOND - 5_000_000, shim, (100, proxy), 9));
    tracker.apply(&exit(22 * SECOND - 4_000_000, 100, proxy, None, Some(9)));
    let views = tracker.snapshot().containers(at(23 * SECOND));
    let proxy = views.iter().find(|v| v.labels.container == "proxy").expect("proxy");
    let order = proxy.sidecar_order.clone().expect("judged");
    assert_eq!(order.verdict, crate::termination::SidecarVerdict::AtGraceDeadline { main_container: "app".into() });
    let report = proxy.last_termination.clone().expect("judged");
    assert_eq!((report.grace_ns, report.expected_kill_after_ns), (2 * SECOND, 2 * SECOND), "{report:#?}");
    let turn = report.sidecar_turn.expect("its wait was measured");
    assert_eq!((turn.waited_ns, turn.pod_grace_ns), (10 * SECOND - 5_000_000, 10 * SECOND));
    assert!(matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { .. }), "{:?}", report.outcome);
    let warnings = tracker.take_warnings();
    let proxy_warning = warnings.iter().find(|w| w.container == "proxy").expect("a Warning for its SIGKILL");
    assert!(proxy_warning.note.contains("its 2s grace period"), "{proxy_warning:?}");
}

#[test]
fn a_container_runs_and_completes_with_kubelet_names() {
    let (mut tracker, cg) = running_app();
    let view = only_view(&tracker, 3 * SECOND);
    assert_eq!(
        (
            view.labels.namespace.as_str(),
            view.labels.pod.as_str(),
            view.labels.container.as_str(),
            view.labels.uid.as_str()
        ),
        ("shop", "web-1", "app", POD_UID)
    );
    assert_eq!(view.status.state, ContainerState::Running { started_at: at(2 * SECOND) });
    tracker.apply(&exit(4 * SECOND, 100, cg, Some(0), None));
    let view = only_view(&tracker, 5 * SECOND);
    assert!(matches!(
        view.status.state,
        ContainerState::Terminated { reason: TerminatedReason::Completed, exit_code: 0, .. }
    ));
    assert!(matches!(
        view.last_termination.map(|r| r.outcome),
        Some(TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(0), signal: None })
    ));
}

/// A tracker with one named container (`meta(1, 30)`) started at 2 s, its init pid 100; and the
/// container's cgroup.
fn running_app() -> (NodeTracker, u64) {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let cgroup = container_cgroup(&mut tracker, SECOND, 1);
    tracker.apply(&exec(2 * SECOND, 100, cgroup, SHIM_CGROUP, "app"));
    (tracker, cgroup)
}

#[test]
fn a_snapshot_keeps_what_it_showed_while_the_model_goes_on() {
    let (mut tracker, cg) = running_app();
    let before = tracker.snapshot();
    let running = before.running_containers();
    assert_eq!(running.iter().map(|c| c.main_pid).collect::<Vec<_>>(), [100], "its init is the main process");
    assert!(before.pods(at(3 * SECOND))[0].conditions.ready_to_start_containers, "the pod has a live process");
    tracker.apply(&exit(4 * SECOND, 100, cg, Some(0), None));
    tracker.expire(4 * SECOND, 0);
    let after = tracker.snapshot();
    // The unit the tracker changed (copied on write) and then dropped is still the old
    // snapshot's, as it was.
    assert_eq!(after.units().count(), 0, "expired in the model");
    let view = before.containers(at(3 * SECOND)).pop().expect("still in the old snapshot");
    assert_eq!(view.status.state, ContainerState::Running { started_at: at(2 * SECOND) });
    assert_eq!(before.running_containers(), running);
    assert!(after.running_containers().is_empty());
    assert!(after.history_of_pod("shop", "web-1").len() == 1 && before.history_of_pod("shop", "web-1").is_empty());
}

#[test]
fn the_generation_moves_when_containers_change_and_stays_when_only_counters_do() {
    let mut tracker = tracker_with_cri();
    let generation = |tracker: &NodeTracker| tracker.snapshot().generation();
    let start = generation(&tracker);
    tracker.set_metadata(vec![meta(1, 30)]);
    let named = generation(&tracker);
    assert!(named > start, "names changed");
    let cg = container_cgroup(&mut tracker, SECOND, 1);
    tracker.apply(&exec(2 * SECOND, 100, cg, SHIM_CGROUP, "app"));
    let running = generation(&tracker);
    assert!(running > named, "a container appeared and started");
    // A process the runtime starts into the running container (an exec probe), a signal: counted.
    tracker.apply(&exec(3 * SECOND, 101, cg, SHIM_CGROUP, "sh"));
    tracker.apply(&signal(3 * SECOND, (101, cg, "sh"), (100, cg), 10));
    assert_eq!(generation(&tracker), running, "only counters moved");
    tracker.apply(&exit(4 * SECOND, 100, cg, Some(0), None));
    assert!(generation(&tracker) > running, "the container ended");
}

#[test]
fn a_node_declares_probes_only_when_a_container_does() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    container_cgroup(&mut tracker, SECOND, 1);
    assert!(!tracker.snapshot().declares_probes(Some(9891)), "no annotation, no pod spec");
    let declaring = ContainerMeta { probe_declaration: Some("/probe/process".into()), ..meta(1, 30) };
    tracker.set_metadata(vec![declaring]);
    assert!(tracker.snapshot().declares_probes(None), "its pod's annotation declares a check");
}

#[test]
fn a_runtime_refresh_that_changes_nothing_copies_no_unit_the_snapshots_share() {
    let (mut tracker, _) = running_app();
    let before = tracker.snapshot();
    tracker.set_metadata(vec![meta(1, 30)]);
    let after = tracker.snapshot();
    assert_eq!(after.units.len(), 1);
    assert!(std::sync::Arc::ptr_eq(&before.units[0], &after.units[0]), "the same metadata copied the unit");
    // A declaration that changed is written.
    let declaring = ContainerMeta { probe_declaration: Some("/probe/process".into()), ..meta(1, 30) };
    tracker.set_metadata(vec![declaring]);
    let declared = tracker.snapshot();
    assert!(!std::sync::Arc::ptr_eq(&after.units[0], &declared.units[0]));
    assert_eq!(declared.units[0].probe_declaration.as_deref(), Some("/probe/process"));
}

#[test]
fn late_metadata_links_the_instance_and_judges_with_its_grace_period() {
    let mut tracker = tracker_with_cri();
    let id = 1000 + 1;
    let created = tracker.apply(&mkdir(SECOND, id, &format!("/kubepods/burstable/pod{POD_UID}/{}", container_id(1))));
    assert_eq!(created.notices, vec![Notice::MetadataNeeded { container_id: container_id(1) }]);
    let cg = id;
    tracker.apply(&exec(2 * SECOND, 100, cg, SHIM_CGROUP, "app"));
    tracker.apply(&signal(10 * SECOND, (50, SHIM_CGROUP, "containerd-shim"), (100, cg), 15));
    tracker.apply(&signal(13 * SECOND, (50, SHIM_CGROUP, "containerd-shim"), (100, cg), 9));
    tracker.apply(&exit(13 * SECOND + 1000, 100, cg, None, Some(9)));
    assert!(tracker.snapshot().containers(at(14 * SECOND)).is_empty(), "nothing shown before the runtime names it");
    tracker.set_metadata(vec![meta(1, 3)]);
    let view = only_view(&tracker, 14 * SECOND);
    let report = view.last_termination.expect("judged on linking");
    assert_eq!(report.grace_ns, 3 * SECOND, "the annotation's grace period, not the 30 s default");
    assert!(
        matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, .. } if stop_to_kill_ns == 3 * SECOND)
    );
    let unit = tracker.units().next().expect("unit");
    assert_eq!(unit.counters().grace_violations, 1);
    assert_eq!(unit.counters().signals.get(&(15, SenderKind::Runtime)), Some(&1));
    assert_eq!(unit.counters().exits.get(&(TerminatedReason::Error, 137, Some(9))), Some(&1));
}

#[test]
fn a_crash_loop_is_compared_with_the_kubelet_back_off() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata((1..=4).map(|n| meta(n, 30)).collect());
    // (created, started, exited) per instance, seconds. Restarts: immediate, +10 s (due),
    // then +5 s where 20 s were due.
    let runs = [(0.0, 0.1, 1.0), (1.1, 1.2, 2.0), (12.0, 12.1, 13.0), (17.9, 18.0, 19.0)];
    for (n, (created, started, exited)) in runs.iter().enumerate() {
        let at = |s: f64| (s * SECOND as f64) as u64;
        let cg = container_cgroup(&mut tracker, at(*created), n as u64 + 1);
        tracker.apply(&exec(at(*started), 100 + n as u32, cg, SHIM_CGROUP, "app"));
        tracker.apply(&exit(at(*exited), 100 + n as u32, cg, Some(1), None));
    }
    let unit = tracker.units().next().expect("unit");
    assert_eq!(unit.restart_count(), 3);
    assert_eq!(unit.counters().backoff_verdicts.get(&Verdict::WithinTolerance), Some(&2));
    assert_eq!(unit.counters().backoff_verdicts.get(&Verdict::TooEarly), Some(&1));
    let last = unit.last_backoff.clone().expect("observation");
    assert_eq!((last.expected_delay_ns, last.verdict), (Some(20 * SECOND), Verdict::TooEarly));
    // Right after the fourth exit the kubelet would hold the restart for 40 s.
    let view = only_view(&tracker, 20 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Waiting { .. }), "{:?}", view.status.state);
    assert_eq!(view.status.back_off_remaining_ns, Some(39 * SECOND));
}

#[test]
fn the_runtimes_setup_process_in_the_new_cgroup_is_not_the_init() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let cg = container_cgroup(&mut tracker, 0, 1);
    // runc re-executes itself after being moved into the container's cgroup, still in the
    // host's pid namespace, then exits once the container's init is set up.
    let mut setup = exec(SECOND / 10, 90, cg, SHIM_CGROUP, "runc");
    if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut setup.detail {
        (*child_pid_namespace, *namespace_init) = (false, false);
    }
    tracker.apply(&setup);
    tracker.apply(&exit(SECOND / 5, 90, cg, Some(0), None));
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    let view = only_view(&tracker, 2 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Running { .. }), "{:?}", view.status.state);
    assert_eq!(view.exec_sessions, 0);
    tracker.apply(&exit(3 * SECOND, 100, cg, Some(3), None));
    let view = only_view(&tracker, 4 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Terminated { exit_code: 3, .. }));
}

#[test]
fn a_host_pid_container_ends_with_its_cgroup_when_no_namespaced_init_follows() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let cg = container_cgroup(&mut tracker, 0, 1);
    let mut init = exec(SECOND, 100, cg, SHIM_CGROUP, "agent");
    if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut init.detail {
        (*child_pid_namespace, *namespace_init) = (false, false);
    }
    tracker.apply(&init);
    assert!(matches!(only_view(&tracker, 2 * SECOND).status.state, ContainerState::Running { .. }));
    tracker.apply(&exit(3 * SECOND, 100, cg, Some(1), None));
    tracker.apply(&event(
        4 * SECOND,
        1,
        1,
        Detail::CgroupRmdir(CgroupDetail { id: cg, path: String::new(), truncated: false }),
    ));
    let view = only_view(&tracker, 5 * SECOND);
    assert!(
        matches!(view.status.state, ContainerState::Terminated { exit_code: 1, finished_at, .. } if finished_at == at(3 * SECOND))
    );
}

#[test]
fn runtime_started_processes_are_exec_sessions_with_their_cpu() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    // The app forks a helper: not a session.
    tracker.apply(&exec(2 * SECOND, 101, cg, cg, "helper"));
    // Two exec probes from the runtime, one forking a child of its own.
    tracker.apply(&exec(3 * SECOND, 200, cg, SHIM_CGROUP, "sh"));
    let mut child = exec(3 * SECOND + 10, 201, cg, cg, "cat");
    if let Detail::Exec { parent_tgid, .. } = &mut child.detail {
        *parent_tgid = 200;
    }
    tracker.apply(&child);
    tracker.apply(&exit(3 * SECOND + 20, 201, cg, Some(0), None));
    tracker.apply(&exit(3 * SECOND + 30, 200, cg, Some(0), None));
    tracker.apply(&exec(4 * SECOND, 300, cg, SHIM_CGROUP, "true"));
    tracker.apply(&exit(4 * SECOND + 10, 300, cg, Some(0), None));
    tracker.apply(&exit(5 * SECOND, 101, cg, Some(0), None));
    let unit = tracker.units().next().expect("unit");
    assert_eq!(unit.counters().exec_sessions, 2);
    assert_eq!(unit.counters().exec_session_cpu_ns, 3 * 5_000_000, "sh, its cat, and true; not the helper");
    assert!(matches!(unit.state(), ContainerState::Running { .. }));
}

#[test]
fn containers_the_runtime_does_not_list_are_sandboxes_and_ignored() {
    let mut tracker = tracker_with_cri();
    let cg = container_cgroup(&mut tracker, 0, 9);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "pause"));
    tracker.set_metadata(vec![meta(1, 30)]);
    assert!(tracker.snapshot().containers(at(2 * SECOND)).is_empty());
}

#[test]
fn without_a_runtime_containers_are_named_by_id() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    let view = only_view(&tracker, 2 * SECOND);
    assert_eq!((view.labels.container.as_str(), view.labels.uid.as_str()), ("000000000000", POD_UID));
}

#[test]
fn host_cgroups_are_units_that_run_while_any_process_does() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, "/system.slice/web.service"));
    assert!(tracker.snapshot().containers(at(0)).is_empty(), "a cgroup becomes a unit when something runs in it");
    tracker.apply(&exec(SECOND, 10, 42, 1, "web"));
    tracker.apply(&exec(2 * SECOND, 11, 42, 42, "worker"));
    let first_exit = tracker.apply(&exit(3 * SECOND, 10, 42, Some(0), None));
    let view = only_view(&tracker, 4 * SECOND);
    assert_eq!((view.labels.namespace.as_str(), view.labels.container.as_str()), ("host", "/system.slice/web.service"));
    assert!(matches!(view.status.state, ContainerState::Running { .. }), "the worker still runs");
    assert!(first_exit.ended.is_empty(), "an exit that changes no state is not an end");
    let last_exit = tracker.apply(&exit(5 * SECOND, 11, 42, Some(2), None));
    let view = only_view(&tracker, 6 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Terminated { exit_code: 2, .. }));
    assert_eq!(
        last_exit.ended,
        [Ended { cgroup_id: 42, exit: BootTime::from_ns(5 * SECOND) }],
        "the last process's exit ends the run"
    );
    tracker.apply(&exec(7 * SECOND, 12, 42, 1, "web"));
    let view = only_view(&tracker, 8 * SECOND);
    assert!(matches!(view.status.state, ContainerState::Running { started_at } if started_at == at(7 * SECOND)));
    assert_eq!(view.status.restart_count, 1);
}

#[test]
fn events_for_unknown_cgroups_ask_for_a_rescan_and_departed_units_expire() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    let unknown = tracker.apply(&exec(SECOND, 10, 77, 1, "x"));
    assert_eq!(unknown.notices, vec![Notice::UnknownCgroup(77)]);
    tracker.seed_cgroup(77, "/batch/job", SECOND);
    tracker.apply(&exec(2 * SECOND, 10, 77, 1, "x"));
    tracker.apply(&exit(3 * SECOND, 10, 77, Some(0), None));
    tracker.apply(&event(
        4 * SECOND,
        1,
        1,
        Detail::CgroupRmdir(CgroupDetail { id: 77, path: "/batch/job".into(), truncated: false }),
    ));
    tracker.expire(5 * SECOND, 10 * SECOND);
    assert_eq!(tracker.snapshot().containers(at(5 * SECOND)).len(), 1, "kept during the retention");
    tracker.expire(20 * SECOND, 10 * SECOND);
    assert!(tracker.snapshot().containers(at(20 * SECOND)).is_empty());
}

#[test]
fn containers_the_runtime_cannot_name_are_listed_by_id_and_named_when_it_answers() {
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![]);
    tracker.set_runtime_reachable(false);
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, cg, SHIM_CGROUP, "app"));
    let shim = (50, SHIM_CGROUP, "containerd-shim");
    tracker.apply(&signal(2 * SECOND, (60, 1, "kill"), (100, cg), 10));
    let view = only_view(&tracker, 2 * SECOND);
    assert!(view.named_by_id);
    assert_eq!((view.labels.uid.as_str(), view.labels.container.as_str()), (POD_UID, &container_id(1)[..12]));
    assert!(matches!(view.status.state, ContainerState::Running { .. }), "{:?}", view.status.state);

    // Stopped while unnamed: SIGTERM, then SIGKILL 2 s later. With the default 30 s grace that
    // is an early kill; the pod's 2 s grace (known once named) makes it a kill after grace.
    tracker.apply(&signal(10 * SECOND, shim, (100, cg), 15));
    tracker.apply(&signal(12 * SECOND, shim, (100, cg), 9));
    let exited = tracker.apply(&exit(12 * SECOND + 1000, 100, cg, None, Some(9)));
    let early = only_view(&tracker, 13 * SECOND).last_termination.expect("judged while unnamed");
    assert!(matches!(early.outcome, TerminationOutcome::SigkilledEarly { .. }));
    assert_eq!(exited.ended.len(), 1, "its state changed");
    assert!(exited.judgements.is_empty(), "no namespace yet: not in the distributions");

    let mut known = meta(1, 2);
    known.state = CriState::Exited;
    let named = tracker.set_metadata(vec![known]);
    let view = only_view(&tracker, 14 * SECOND);
    assert!(!view.named_by_id);
    assert_eq!(
        (view.labels.namespace.as_str(), view.labels.pod.as_str(), view.labels.container.as_str()),
        ("shop", "web-1", "app")
    );
    assert_eq!(view.container_id, Some(container_id(1)));
    let report = view.last_termination.expect("judged again under its name");
    assert!(
        matches!(report.outcome, TerminationOutcome::SigkilledAfterGrace { grace_ns, .. } if grace_ns == 2 * SECOND),
        "{report:?}"
    );
    let unit = tracker.units().next().expect("one unit");
    assert_eq!(unit.counters().signals.get(&(10, SenderKind::OtherProcess)), Some(&1), "counts joined the name");
    assert_eq!(unit.counters().grace_violations, 1, "judged once");
    assert_eq!(named.judgements.len(), 1, "judged under its name, for the distributions");
    assert!(named.ended.is_empty(), "the exit was applied before, not now");
}

#[test]
fn a_running_instance_the_runtime_does_not_list_is_a_sandbox_and_dropped() {
    let mut tracker = tracker_with_cri();
    tracker.set_runtime_reachable(false);
    let sandbox = container_cgroup(&mut tracker, 0, 9);
    tracker.apply(&exec(SECOND, 90, sandbox, SHIM_CGROUP, "pause"));
    let finished = container_cgroup(&mut tracker, 0, 8);
    tracker.apply(&exec(SECOND, 80, finished, SHIM_CGROUP, "job"));
    tracker.apply(&exit(2 * SECOND, 80, finished, Some(0), None));
    assert_eq!(
        tracker.snapshot().containers(at(3 * SECOND)).len(),
        2,
        "{:#?}",
        tracker.snapshot().containers(at(3 * SECOND))
    );
    tracker.set_metadata(vec![]);
    let views = tracker.snapshot().containers(at(3 * SECOND));
    assert_eq!(views.len(), 1, "{views:#?}");
    assert_eq!(views[0].labels.container, container_id(8)[..12], "an exited one keeps its verdict");
    assert!(tracker.runtime_reachable());
}

#[test]
fn a_kubelet_restart_resets_the_back_off() {
    let run = |kubelet_restarts: bool| {
        let mut tracker = tracker_with_cri();
        tracker.set_metadata((1..=3).map(|n| meta(n, 30)).collect());
        tracker.apply(&mkdir(0, 300, "/system.slice/kubelet.service"));
        // Exits at 1 s and 2 s; the first restart is immediate, the second is due 10 s later.
        let runs = [(0.0, 0.1, 1.0), (1.0, 1.1, 2.0)];
        for (n, (created, started, exited)) in runs.iter().enumerate() {
            let at = |s: f64| (s * SECOND as f64) as u64;
            let cg = container_cgroup(&mut tracker, at(*created), n as u64 + 1);
            tracker.apply(&exec(at(*started), 100 + n as u32, cg, SHIM_CGROUP, "app"));
            tracker.apply(&exit(at(*exited), 100 + n as u32, cg, Some(1), None));
        }
        if kubelet_restarts {
            let mut kubelet = exec(3 * SECOND, 400, 300, 300, "kubelet");
            if let Detail::Exec { child_pid_namespace, namespace_init, .. } = &mut kubelet.detail {
                (*child_pid_namespace, *namespace_init) = (false, false);
            }
            tracker.apply(&kubelet);
        }
        // The new kubelet restarts the container at once, 1.5 s after its exit.
        let cg = container_cgroup(&mut tracker, 3 * SECOND + SECOND / 2, 3);
        tracker.apply(&exec(3 * SECOND + SECOND / 2, 102, cg, SHIM_CGROUP, "app"));
        let observation = tracker
            .units()
            .find(|u| matches!(u.key(), UnitKey::Container { .. }))
            .and_then(|u| u.last_backoff().cloned());
        observation
    };
    let after_restart = run(true).expect("judged");
    assert_eq!((after_restart.expected_delay_ns, after_restart.verdict), (Some(0), Verdict::WithinTolerance));
    assert!(after_restart.entry_reset && after_restart.after_kubelet_restart);
    let without = run(false).expect("judged");
    assert_eq!((without.expected_delay_ns, without.verdict), (Some(10 * SECOND), Verdict::TooEarly));
}

#[test]
fn a_container_gone_before_its_metadata_arrived_is_still_judged() {
    let mut tracker = tracker_with_cri();
    let cg = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND / 10, 100, cg, SHIM_CGROUP, "app"));
    tracker.apply(&exit(SECOND / 5, 100, cg, Some(1), None));
    tracker.apply(&event(
        SECOND / 4,
        1,
        1,
        Detail::CgroupRmdir(CgroupDetail { id: cg, path: String::new(), truncated: false }),
    ));
    assert!(tracker.snapshot().containers(at(SECOND)).is_empty(), "waiting for its name");
    tracker.set_metadata(vec![meta(1, 30)]);
    let view = only_view(&tracker, SECOND);
    assert_eq!(view.labels.container, "app");
    assert!(matches!(view.status.state, ContainerState::Terminated { exit_code: 1, .. }), "{:?}", view.status.state);
    assert_eq!(view.cgroup_id, None, "its cgroup is gone");
    // Linked and gone: nothing is kept for it any more.
    tracker.set_metadata(vec![]);
    assert_eq!(tracker.snapshot().containers(at(SECOND)).len(), 1);
}

mod causes;
mod commands;
mod host;
mod kubelet;
mod restart_all;
mod spec;

#[test]
fn a_resync_repairs_what_lost_records_would_have_changed() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, "/system.slice/web.service"));
    tracker.apply(&exec(SECOND, 10, 42, 1, "web"));
    tracker.apply(&mkdir(0, 43, "/system.slice/gone.service"));
    tracker.apply(&exec(SECOND, 20, 43, 1, "gone"));
    assert_eq!(tracker.tracked_processes().len(), 2);
    let on_disk = vec![(42, "/system.slice/web.service".to_owned()), (44, "/system.slice/new.service".to_owned())];
    let mut taken = Vec::new();
    let (report, repaired) = tracker.resync(
        &[10],
        &[43],
        &on_disk,
        |id| {
            taken.push(id);
            None
        },
        5 * SECOND,
    );
    assert_eq!(report, Resync { exits_unseen: 1, cgroups_removed_unseen: 1, cgroups_created_unseen: 1 });
    assert_eq!(taken, [43], "a removed cgroup's kernel counts are taken first");
    assert_eq!(
        repaired.ended,
        [Ended { cgroup_id: 42, exit: BootTime::from_ns(5 * SECOND) }],
        "the lost exit ended web's run"
    );
    let web = tracker
        .snapshot()
        .containers(at(6 * SECOND))
        .into_iter()
        .find(|v| v.labels.container == "/system.slice/web.service");
    let web = web.expect("web");
    assert!(
        matches!(web.status.state, ContainerState::Terminated { finished_at, .. } if finished_at == at(5 * SECOND)),
        "{:?}",
        web.status.state
    );
    assert!(tracker.tracked_cgroups().contains(&44) && !tracker.tracked_cgroups().contains(&43));
    // A mkdir record arriving after the scan found the cgroup changes nothing.
    tracker.apply(&exec(6 * SECOND, 30, 44, 1, "new"));
    tracker.apply(&mkdir(4 * SECOND, 44, "/system.slice/new.service"));
    let new = tracker
        .snapshot()
        .containers(at(7 * SECOND))
        .into_iter()
        .find(|v| v.labels.container == "/system.slice/new.service");
    assert!(new.is_some_and(|v| matches!(v.status.state, ContainerState::Running { .. })));
    // Repeating it is harmless: nothing left to repair.
    assert_eq!(tracker.resync(&[10], &[43], &on_disk, |_| None, 8 * SECOND), (Resync::default(), Outcome::default()));
}

fn tcp(time: u64, cgroup_id: u64, port: u16, listen: bool) -> Event {
    let detail =
        TcpDetail { socket_cgroup_id: cgroup_id, netns: 1, family: 2, local_port: port, remote_port: 0, fd: None };
    event(time, 100, cgroup_id, if listen { Detail::TcpListen(detail) } else { Detail::TcpListenClose(detail) })
}

#[test]
fn a_container_listening_on_every_port_keeps_a_bounded_port_table() {
    // Issue 18: listening once on each port made four series per port, kept for ever.
    let mut tracker = tracker_with_cri();
    tracker.set_metadata(vec![meta(1, 30)]);
    let app = container_cgroup(&mut tracker, 0, 1);
    tracker.apply(&exec(SECOND, 100, app, SHIM_CGROUP, "app"));
    // Two ports stay open; twenty thousand are opened and closed at once.
    tracker.apply(&tcp(2 * SECOND, app, 80, true));
    tracker.apply(&tcp(2 * SECOND, app, 443, true));
    for port in 1000..21_000u16 {
        tracker.apply(&tcp(3 * SECOND + u64::from(port), app, port, true));
        tracker.apply(&tcp(3 * SECOND + u64::from(port) + 1, app, port, false));
    }
    let unit = tracker.units().next().expect("the unit");
    assert!(unit.tcp().len() <= MAX_PORTS_PER_UNIT, "{} ports kept", unit.tcp().len());
    assert_eq!(unit.tcp().get(&80).map(|p| p.listeners), Some(1), "open ports are never evicted");
    assert_eq!(unit.tcp().get(&443).map(|p| p.listeners), Some(1));
    // Full of open ports, a new one is not kept, and that is counted.
    for port in 30_000..30_000 + MAX_PORTS_PER_UNIT as u16 {
        tracker.apply(&tcp(40 * SECOND, app, port, true));
    }
    let before = tracker.dropped().get(DroppedKind::Port);
    tracker.apply(&tcp(41 * SECOND, app, 50_000, true));
    assert_eq!(tracker.dropped().get(DroppedKind::Port), before + 1);
    // Closed ports expire once idle for the retention; open ones stay.
    tracker.expire(100 * SECOND, 10 * SECOND);
    let unit = tracker.units().next().expect("the unit");
    assert!(unit.tcp().values().all(|p| p.listeners > 0), "{:?}", unit.tcp());
    assert!(unit.tcp().contains_key(&80));
}

#[test]
fn a_process_in_a_container_named_like_the_runtime_is_not_the_runtime() {
    // Issue 18: a pod can name a process `containerd-shim` and SIGKILL another container's init.
    let mut tracker = tracker_with_cri();
    let mut other = meta(2, 30);
    other.container_name = "attacker".into();
    tracker.set_metadata(vec![meta(1, 30), other]);
    let victim = container_cgroup(&mut tracker, 0, 1);
    let attacker = container_cgroup(&mut tracker, 0, 2);
    tracker.apply(&exec(SECOND, 100, victim, SHIM_CGROUP, "app"));
    tracker.apply(&exec(SECOND, 200, attacker, SHIM_CGROUP, "app"));
    tracker.apply(&signal(10 * SECOND, (201, attacker, "containerd-shim"), (100, victim), 15));
    tracker.apply(&signal(11 * SECOND, (201, attacker, "containerd-shim"), (100, victim), 9));
    tracker.apply(&exit(11 * SECOND, 100, victim, None, Some(9)));
    let view = tracker.snapshot().containers(at(12 * SECOND)).into_iter().find(|v| v.labels.container == "app");
    let termination = view.and_then(|v| v.last_termination).expect("judged");
    // Issue 41: a stop signal from another container is a stop signal, named for what it is.
    let attacker_process = SignalSender::other("containerd-shim", 201);
    let stop = termination.stop_signal.as_ref().expect("the attacker's SIGTERM is the stop signal");
    assert_eq!(stop.sender, attacker_process, "never the runtime: {termination:?}");
    assert!(
        matches!(&termination.outcome, TerminationOutcome::SigkilledEarly { sender: Some(sender), .. } if *sender == attacker_process),
        "killed early by the attacker, not an overrun the app or the runtime is blamed for: {:?}",
        termination.outcome
    );
}

#[test]
fn answer_inputs_move_with_what_an_answer_reads_and_stay_for_another_pod() {
    let (mut tracker, app) = running_app();
    let other_pod = "00000000-0000-0000-0000-0000000000db";
    let db = ContainerMeta {
        pod_uid: other_pod.into(),
        pod_name: "db-0".into(),
        container_name: "db".into(),
        ..meta(2, 30)
    };
    tracker.set_metadata(vec![meta(1, 30), db]);
    let db_cgroup = 2002;
    tracker.apply(&mkdir(SECOND, db_cgroup, &format!("/kubepods/burstable/pod{other_pod}/{}", container_id(2))));
    tracker.apply(&exec(2 * SECOND, 200, db_cgroup, SHIM_CGROUP, "db"));
    let web = |unit: &Unit| unit.labels.pod == "web-1";
    let running = tracker.snapshot().answer_inputs(web);
    assert_eq!(running, tracker.snapshot().answer_inputs(web), "nothing changed");
    tracker.apply(&exit(3 * SECOND, 200, db_cgroup, Some(1), None));
    assert_eq!(tracker.snapshot().answer_inputs(web), running, "only the other pod's container ended");
    tracker.apply(&exit(4 * SECOND, 100, app, Some(1), None));
    assert_ne!(tracker.snapshot().answer_inputs(web), running, "its own container ended");
}
