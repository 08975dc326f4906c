//! Runtime metadata for the model-level tests of the agent: the one running container the CRI
//! would list, which each test adjusts with struct update syntax.

use lifecycle_agent::model::metadata::{ContainerMeta, ContainerState, KubeletAnnotations};

/// A running container `container` of pod `namespace/pod` (uid `pod_uid`) as the runtime lists
/// it: first attempt, no kubelet annotations, no probe declaration.
pub fn running_container(
    container_id: &str,
    pod_uid: &str,
    namespace: &str,
    pod: &str,
    container: &str,
) -> ContainerMeta {
    ContainerMeta {
        container_id: container_id.into(),
        pod_sandbox_id: format!("sandbox-{pod}"),
        pod_name: pod.into(),
        pod_namespace: namespace.into(),
        pod_uid: pod_uid.into(),
        container_name: container.into(),
        attempt: 0,
        kubelet: KubeletAnnotations::default(),
        probe_declaration: None,
        state: ContainerState::Running,
        exit_code: None,
        reason: None,
        message: None,
        created_ns: 0,
        started_ns: None,
        finished_ns: None,
    }
}
