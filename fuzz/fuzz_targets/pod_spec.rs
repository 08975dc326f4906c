//! Pod objects from the API: `discovery::kube::convert::pod_facts` on whatever JSON decodes as a
//! `Pod`, plus the two string decoders beside it (`signal_number` for `lifecycle.stopSignal`,
//! `model::spec::kill_cause_from_message` for the kubelet's Killing events).
//!
//! Properties: a pod decodes exactly when it has a uid, keeping its uid, namespace and name;
//! every container of the spec (init, regular, ephemeral) becomes one fact of the right kind, a
//! sidecar being an init container with `restartPolicy: Always`; stop signals are Linux numbers
//! 1-64, from any decoder; grace periods are the spec's seconds (negative ones as 0); problems
//! say why in one line; a kill cause names the container the message names (a container's or a
//! sidecar's: "Init container ...").

#![no_main]

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use lifecycle_agent::{
    discovery::kube::convert::{pod_facts, signal_number},
    model::spec::{kill_cause_from_message, ContainerKind},
};
use lifecycle_fuzz::assert_one_line;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(number) = signal_number(&text) {
        assert!((1..=64).contains(&number), "{text:?} -> {number}");
    }
    if let Some((container, _cause)) = kill_cause_from_message(&text) {
        // A container's message, or a sidecar's ("Init container proxy failed startup probe").
        let named =
            ["Container", "Init container"].iter().any(|kind| text.starts_with(&format!("{kind} {container} ")));
        assert!(named && !container.contains(' '), "{text:?} -> {container:?}");
    }

    let Ok(pod) = serde_json::from_slice::<Pod>(data) else { return };
    let mut problems = Vec::new();
    let Some(facts) = pod_facts(&pod, &mut problems) else {
        assert!(pod.metadata.uid.is_none(), "a pod with a uid was not decoded");
        return;
    };
    let meta = &pod.metadata;
    assert_eq!(Some(&facts.uid), meta.uid.as_ref());
    assert_eq!(facts.namespace, meta.namespace.clone().unwrap_or_default());
    assert_eq!(facts.name, meta.name.clone().unwrap_or_default());
    for problem in &problems {
        assert_one_line("SpecProblem", &problem.why);
    }

    let Some(spec) = &pod.spec else {
        assert!(facts.containers.is_empty() && facts.grace_ns.is_none());
        return;
    };
    let grace = |seconds: i64| u64::try_from(seconds).unwrap_or(0).saturating_mul(1_000_000_000);
    assert_eq!(facts.grace_ns, spec.termination_grace_period_seconds.map(grace));
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or_default();
    let want: Vec<(&str, bool)> = init
        .iter()
        .map(|c| (c.name.as_str(), c.restart_policy.as_deref() == Some("Always")))
        .chain(spec.containers.iter().map(|c| (c.name.as_str(), false)))
        .chain(ephemeral.iter().map(|c| (c.name.as_str(), false)))
        .collect();
    assert_eq!(facts.containers.len(), want.len(), "containers lost or added");
    for (index, (fact, (name, sidecar))) in facts.containers.iter().zip(want).enumerate() {
        assert_eq!(fact.name, name);
        let kind = if index < init.len() {
            if sidecar {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            }
        } else if index < init.len() + spec.containers.len() {
            ContainerKind::Regular
        } else {
            ContainerKind::Ephemeral
        };
        assert_eq!(fact.kind, kind, "container {name:?}");
        if let Some(signal) = fact.stop_signal {
            assert!((1..=64).contains(&signal), "container {name:?} stop signal {signal}");
        }
    }
    for reported in &facts.reported {
        if let Some(signal) = reported.stop_signal {
            assert!((1..=64).contains(&signal), "reported {:?} stop signal {signal}", reported.name);
        }
    }
});
