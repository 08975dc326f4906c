//! Fixtures for the model-level tests of the agent, which each test adjusts with struct update
//! syntax: the one running container the CRI would list, and the API's views of a container and
//! of a stop (for the clients that read the API's types).

use lifecycle_agent::model::{
    container_state::{ContainerState as ApiState, ContainerStatusSnapshot},
    event::Detail,
    metadata::ContainerMeta,
    node::{ContainerView, UnitLabels},
    spec::SpecSource,
    termination::{StopScene, TerminationOutcome, TerminationReport},
    time::BootTime,
};

/// A running container `container` of pod `namespace/pod` (uid `pod_uid`) as the runtime lists
/// it: first attempt, no kubelet annotations, no probe declaration.
pub fn running_container(
    container_id: &str,
    pod_uid: &str,
    namespace: &str,
    pod: &str,
    container: &str,
) -> ContainerMeta {
    ContainerMeta::running(container_id.into(), format!("sandbox-{pod}"), namespace, pod, pod_uid, container)
}

/// Container `container` of pod `namespace/pod` (uid `uid-<pod>`) as `/api/v1/containers` shows
/// it in `state`: first instance, no verdicts, no ports, no disagreements.
pub fn container_view(namespace: &str, pod: &str, container: &str, state: ApiState) -> ContainerView {
    let uid = format!("uid-{pod}");
    ContainerView {
        labels: UnitLabels {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
            uid: uid.clone(),
        },
        container_id: None,
        cgroup_id: None,
        status: ContainerStatusSnapshot {
            pod_uid: uid,
            container_name: container.into(),
            state,
            last_state: None,
            restart_count: 0,
            instance_created_at: None,
            restart_expected: false,
            back_off_remaining_ns: None,
        },
        last_termination: None,
        last_backoff: None,
        exec_sessions: 0,
        exec_session_cpu_seconds: 0.0,
        tcp: Default::default(),
        sidecar: false,
        named_by_id: false,
        disagreements: Vec::new(),
        sidecar_order: None,
        systemd: None,
    }
}

/// A stop judged `outcome` whose init exited at `exit_time`, with a 30 s grace period and
/// nothing else seen (no stop signal, preStop hook, OOM kill or cause).
pub fn termination_report(outcome: TerminationOutcome, exit_time: BootTime) -> TerminationReport {
    const GRACE_NS: u64 = 30 * lifecycle_agent::model::time::SECOND;
    TerminationReport {
        stop_signal: None,
        pre_stop: None,
        exit_time,
        exit_status: None,
        exit_signal: None,
        rules: lifecycle_agent::model::termination::StopRules::Kubelet,
        grace_ns: GRACE_NS,
        expected_kill_after_ns: GRACE_NS,
        expected_kill_exact: true,
        oom_kills: 0,
        is_sidecar: false,
        sidecar_turn: None,
        outcome,
        oom_victim: None,
        oom_limit: None,
        cause: None,
        kubelet_started_before_ns: None,
        memory: None,
        spec: SpecSource::default(),
        watched_since: None,
        scene: StopScene::default(),
    }
}

/// The exec of a container's main process: started by the runtime (pid 1, in the root cgroup)
/// at 2 ns as the init of the container's own pid namespace. [`main_exit`] is its end.
pub fn main_exec(comm: &str) -> Detail {
    Detail::Exec {
        parent_tgid: 1,
        parent_cgroup_id: 1,
        namespace_init: true,
        child_pid_namespace: true,
        started: BootTime::from_ns(2),
        comm: comm.into(),
    }
}

/// The exit of a container's main process (its pid namespace's init, started at 2 ns, child of
/// pid 1) with `status`: the last thread, no signal.
pub fn main_exit(status: u8, comm: &str) -> Detail {
    Detail::Exit {
        exit_status: Some(status),
        signal: None,
        core_dumped: false,
        group_dead: true,
        parent_tgid: 1,
        started: BootTime::from_ns(2),
        cpu_time: std::time::Duration::from_nanos(1),
        comm: comm.into(),
    }
}
