//! CRI protobuf messages decoded into the model's [`ContainerMeta`]: labels and annotations go
//! through [`KubeletAnnotations`] and [`PodIdentity`], the runtime's state and outcome fields are
//! mapped here.

use std::collections::HashMap;

use k8s_cri::v1 as proto;

use crate::model::metadata::{AnnotationProblem, ContainerMeta, ContainerState, KubeletAnnotations, PodIdentity};

/// The model's state for a CRI `ContainerState` value (unknown values are `Unknown`).
fn state_from_proto(raw: i32) -> ContainerState {
    match proto::ContainerState::try_from(raw) {
        Ok(proto::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(proto::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(proto::ContainerState::ContainerExited) => ContainerState::Exited,
        Ok(proto::ContainerState::ContainerUnknown) | Err(_) => ContainerState::Unknown,
    }
}

fn nonzero(ns: i64) -> Option<i64> {
    (ns != 0).then_some(ns)
}

fn nonempty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Decodes a `ListContainers` entry. Outcome fields (exit code, reason, start/finish) stay
/// `None`: the list does not carry them.
pub(crate) fn meta_from_list_entry(container: &proto::Container) -> (ContainerMeta, Vec<AnnotationProblem>) {
    let mut problems = Vec::new();
    let a = KubeletAnnotations::parse(&container.annotations, &mut problems);
    let PodIdentity { pod_name, pod_namespace, pod_uid, container_name } =
        PodIdentity::from_labels(&container.labels, container.metadata.as_ref().map(|m| m.name.as_str()));
    let meta = ContainerMeta {
        container_id: container.id.clone(),
        pod_sandbox_id: container.pod_sandbox_id.clone(),
        pod_name,
        pod_namespace,
        pod_uid,
        container_name,
        attempt: container.metadata.as_ref().map_or(0, |m| m.attempt),
        kubelet: a,
        probe_declaration: None,
        state: state_from_proto(container.state),
        exit_code: None,
        reason: None,
        message: None,
        created_ns: container.created_at,
        started_ns: None,
        finished_ns: None,
        image_ref: container.image_ref.clone(),
        image_stop_signal: None,
    };
    (meta, problems)
}

/// Decodes a `ContainerStatus` answer. The status message has no sandbox id, so the caller
/// supplies it (from a list entry).
pub(crate) fn meta_from_status(
    status: &proto::ContainerStatus,
    pod_sandbox_id: String,
) -> (ContainerMeta, Vec<AnnotationProblem>) {
    let mut problems = Vec::new();
    let a = KubeletAnnotations::parse(&status.annotations, &mut problems);
    let PodIdentity { pod_name, pod_namespace, pod_uid, container_name } =
        PodIdentity::from_labels(&status.labels, status.metadata.as_ref().map(|m| m.name.as_str()));
    let state = state_from_proto(status.state);
    let meta = ContainerMeta {
        container_id: status.id.clone(),
        pod_sandbox_id,
        pod_name,
        pod_namespace,
        pod_uid,
        container_name,
        attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
        kubelet: a,
        probe_declaration: None,
        state,
        // The CRI reports 0 for containers that have not exited; only an exited one has a code.
        exit_code: (state == ContainerState::Exited).then_some(status.exit_code),
        reason: nonempty(&status.reason),
        message: nonempty(&status.message),
        created_ns: status.created_at,
        started_ns: nonzero(status.started_at),
        finished_ns: nonzero(status.finished_at),
        image_ref: status.image_ref.clone(),
        image_stop_signal: None,
    };
    (meta, problems)
}

/// The stop signal an image's configuration names (`STOPSIGNAL`: `SIGINT`, `INT`, `2`), from
/// a verbose `ImageStatus`'s `info`: containerd and CRI-O put the OCI image there as JSON,
/// `{"imageSpec": {"config": {"StopSignal": ...}}}`. None when it names none, or says
/// something that is no signal.
pub(crate) fn image_stop_signal(info: &HashMap<String, String>) -> Option<u8> {
    let info: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    let text = info.pointer("/imageSpec/config/StopSignal")?.as_str()?.trim();
    if let Ok(number) = text.parse::<u8>() {
        return (1..=64).contains(&number).then_some(number);
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    crate::discovery::kube::convert::signal_number(&name)
}

pub(super) fn log_problems(container_id: &str, problems: &[AnnotationProblem]) {
    for problem in problems {
        log::warn!("container {container_id}: {problem}; leaving that field unset");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_images_stop_signal_is_read_from_its_verbose_status() {
        let info = |stop: &str| {
            let config = serde_json::json!({"chainID": "sha256:1", "imageSpec": {"config": {"StopSignal": stop, "Cmd": ["sh"]}}});
            HashMap::from([("info".to_owned(), config.to_string())])
        };
        assert_eq!(super::image_stop_signal(&info("SIGINT")), Some(2));
        assert_eq!(super::image_stop_signal(&info("USR2")), Some(12));
        assert_eq!(super::image_stop_signal(&info("sigquit")), Some(3));
        assert_eq!(super::image_stop_signal(&info("10")), Some(10));
        assert_eq!(super::image_stop_signal(&info("SIGRTMIN+3")), Some(37));
        for nothing in ["", "SIGNOPE", "0", "99"] {
            assert_eq!(super::image_stop_signal(&info(nothing)), None, "{nothing:?}");
        }
        let no_signal = serde_json::json!({"imageSpec": {"config": {"Cmd": ["sh"]}}}).to_string();
        assert_eq!(super::image_stop_signal(&HashMap::from([("info".to_owned(), no_signal)])), None);
        assert_eq!(super::image_stop_signal(&HashMap::new()), None, "not verbose, or another runtime");
        assert_eq!(super::image_stop_signal(&HashMap::from([("info".to_owned(), "{".to_owned())])), None);
    }

    use super::*;
    use crate::model::metadata::{keys, ContainerType};
    use std::collections::HashMap;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn kubelet_labels() -> HashMap<String, String> {
        map(&[
            (keys::POD_NAME, "web-0"),
            (keys::POD_NAMESPACE, "shop"),
            (keys::POD_UID, "7d2c0a8e-1111-2222-3333-444455556666"),
            (keys::CONTAINER_NAME, "nginx"),
        ])
    }

    fn entry(annotations: HashMap<String, String>) -> proto::Container {
        proto::Container {
            id: "c0ffee".to_owned(),
            pod_sandbox_id: "5a4d".to_owned(),
            metadata: Some(proto::ContainerMetadata { name: "nginx".to_owned(), attempt: 3 }),
            state: proto::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_000_000_000,
            labels: kubelet_labels(),
            annotations,
            ..Default::default()
        }
    }

    #[test]
    fn decodes_what_the_kubelet_writes() {
        let (meta, problems) = meta_from_list_entry(&entry(map(&[
            (keys::RESTART_COUNT, "3"),
            (keys::CONTAINER_HASH, "a1b2c3d4"),
            (keys::CONTAINER_TYPE, "init"),
            (keys::TERMINATION_GRACE_PERIOD, "30"),
            (keys::DELETION_GRACE_PERIOD, "0"),
            (keys::PRE_STOP_HANDLER, r#"{"exec":{"command":["sleep","5"]}}"#),
            (keys::PORTS, r#"[{"containerPort":80,"protocol":"TCP"}]"#),
        ])));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(meta.container_id, "c0ffee");
        assert_eq!(meta.pod_sandbox_id, "5a4d");
        assert_eq!(
            (meta.pod_name.as_str(), meta.pod_namespace.as_str(), meta.container_name.as_str()),
            ("web-0", "shop", "nginx")
        );
        assert_eq!(meta.pod_uid, "7d2c0a8e-1111-2222-3333-444455556666");
        assert!(meta.is_kubelet_managed());
        assert_eq!(meta.attempt, 3);
        assert_eq!(meta.kubelet.restart_count, Some(3));
        assert_eq!(meta.kubelet.spec_hash, Some(0xa1b2_c3d4));
        assert_eq!(meta.kubelet.container_type, Some(ContainerType::Init));
        assert_eq!(meta.kubelet.termination_grace_period_ns, Some(30_000_000_000));
        assert_eq!(meta.kubelet.deletion_grace_period_ns, Some(0));
        assert_eq!(meta.kubelet.pre_stop_handler.as_deref(), Some(r#"{"exec":{"command":["sleep","5"]}}"#));
        assert_eq!(meta.kubelet.ports.as_deref(), Some(r#"[{"containerPort":80,"protocol":"TCP"}]"#));
        assert_eq!(meta.state, ContainerState::Running);
        assert_eq!(meta.created_ns, 1_700_000_000_000_000_000);
        assert_eq!((meta.exit_code, meta.started_ns, meta.finished_ns), (None, None, None));
    }

    #[test]
    fn absent_annotations_are_none_without_problems() {
        let (meta, problems) = meta_from_list_entry(&entry(HashMap::new()));
        assert!(problems.is_empty());
        assert_eq!(meta.kubelet.restart_count, None);
        assert_eq!(meta.kubelet.container_type, None);
        assert_eq!(meta.kubelet.termination_grace_period_ns, None);
        assert_eq!(meta.kubelet.pre_stop_handler, None);
    }

    #[test]
    fn malformed_annotations_unset_only_their_field() {
        let (meta, problems) = meta_from_list_entry(&entry(map(&[
            (keys::RESTART_COUNT, "-1"),
            (keys::CONTAINER_HASH, "not-hex"),
            (keys::CONTAINER_TYPE, "sidecar"),
            (keys::TERMINATION_GRACE_PERIOD, "thirty"),
            (keys::DELETION_GRACE_PERIOD, "99999999999999999999"),
            (keys::PRE_STOP_HANDLER, "{exec:"),
            (keys::PORTS, r#"[{"containerPort":8080}]"#),
        ])));
        let keys_hit: Vec<_> = problems.iter().map(|p| p.key).collect();
        assert_eq!(
            keys_hit,
            [
                keys::RESTART_COUNT,
                keys::CONTAINER_TYPE,
                keys::CONTAINER_HASH,
                keys::TERMINATION_GRACE_PERIOD,
                keys::DELETION_GRACE_PERIOD,
                keys::PRE_STOP_HANDLER,
            ]
        );
        assert_eq!(meta.kubelet.restart_count, None);
        assert_eq!(meta.kubelet.spec_hash, None);
        assert_eq!(meta.kubelet.container_type, None);
        assert_eq!(meta.kubelet.termination_grace_period_ns, None);
        assert_eq!(meta.kubelet.deletion_grace_period_ns, None);
        assert_eq!(meta.kubelet.pre_stop_handler, None);
        // The well-formed neighbour and the identity survive.
        assert_eq!(meta.kubelet.ports.as_deref(), Some(r#"[{"containerPort":8080}]"#));
        assert_eq!(meta.pod_name, "web-0");
        assert!(problems[3].to_string().contains("\"thirty\""), "{}", problems[3]);
    }

    #[test]
    fn unlabelled_containers_fall_back_to_the_metadata_name() {
        let mut container = entry(HashMap::new());
        container.labels.clear();
        let (meta, _) = meta_from_list_entry(&container);
        assert_eq!(meta.container_name, "nginx");
        assert!(meta.pod_uid.is_empty());
        assert!(!meta.is_kubelet_managed());
    }

    #[test]
    fn status_outcome_fields() {
        let mut status = proto::ContainerStatus {
            id: "c0ffee".to_owned(),
            metadata: Some(proto::ContainerMetadata { name: "nginx".to_owned(), attempt: 0 }),
            state: proto::ContainerState::ContainerExited as i32,
            created_at: 10,
            started_at: 20,
            finished_at: 30,
            exit_code: 137,
            reason: "OOMKilled".to_owned(),
            labels: kubelet_labels(),
            annotations: map(&[(keys::TERMINATION_GRACE_PERIOD, "2")]),
            ..Default::default()
        };
        let (meta, problems) = meta_from_status(&status, "5a4d".to_owned());
        assert!(problems.is_empty());
        assert_eq!(meta.pod_sandbox_id, "5a4d");
        assert_eq!(meta.state, ContainerState::Exited);
        assert_eq!(meta.exit_code, Some(137));
        assert_eq!(meta.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(meta.message, None);
        assert_eq!((meta.created_ns, meta.started_ns, meta.finished_ns), (10, Some(20), Some(30)));
        assert_eq!(meta.kubelet.termination_grace_period_ns, Some(2_000_000_000));

        // A running container's 0 exit code and 0 finish time mean "not yet", not "exit 0 at 1970".
        status.state = proto::ContainerState::ContainerRunning as i32;
        status.exit_code = 0;
        status.finished_at = 0;
        status.reason.clear();
        let (meta, _) = meta_from_status(&status, String::new());
        assert_eq!((meta.exit_code, meta.finished_ns, meta.reason), (None, None, None));
    }

    #[test]
    fn unknown_state_values_map_to_unknown() {
        assert_eq!(state_from_proto(42), ContainerState::Unknown);
        assert_eq!(state_from_proto(2), ContainerState::Exited);
    }
}
