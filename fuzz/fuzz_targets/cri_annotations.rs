//! The kubelet's labels and annotations as the CRI hands them over: `KubeletAnnotations::parse`,
//! `PodIdentity::from_labels`, `PreStopHandler::from_annotation` and the pod's probe declaration
//! (`probe_declaration`).
//!
//! Input: NUL-separated `key=value` entries (a value may hold newlines); a key that is one letter
//! `A`-`L` stands for the key of that index in [`KNOWN`], so the fuzzer reaches every
//! decoder without having to spell the keys. Properties: a known key that is present is either
//! decoded to the value its format says or reported as exactly one problem with the field left
//! `None`; absent and unknown keys make no problem; problems and preStop errors are one line; the
//! identity is the labels' values; the probe declaration is the annotation as is while within its
//! size bound.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::model::{
    metadata::{
        keys, probe_declaration, AnnotationProblem, ContainerType, KubeletAnnotations, PodIdentity,
        MAX_PROBE_DECLARATION_BYTES,
    },
    termination::PreStopHandler,
};
use lifecycle_fuzz::{assert_error_one_line, assert_one_line, debug_len_bound};
use serde::de::IgnoredAny;

/// Every key the agent decodes, in the order the input's one-letter keys `A`.. name them.
const KNOWN: [&str; 12] = [
    keys::POD_NAME,
    keys::POD_NAMESPACE,
    keys::POD_UID,
    keys::CONTAINER_NAME,
    keys::RESTART_COUNT,
    keys::CONTAINER_HASH,
    keys::CONTAINER_TYPE,
    keys::PRE_STOP_HANDLER,
    keys::PORTS,
    keys::TERMINATION_GRACE_PERIOD,
    keys::DELETION_GRACE_PERIOD,
    keys::PROBE_DECLARATION,
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut map = HashMap::new();
    for entry in text.split('\0') {
        let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
        let key = match key.as_bytes() {
            [letter @ b'A'..=b'L'] => KNOWN[usize::from(letter - b'A')],
            _ => key,
        };
        map.insert(key.to_owned(), value.to_owned());
    }

    let mut problems = Vec::new();
    let decoded = KubeletAnnotations::parse(&map, &mut problems);
    for problem in &problems {
        assert_one_line("AnnotationProblem", &problem.to_string());
    }
    let mut accounted = 0;
    accounted += check(&map, &problems, keys::RESTART_COUNT, decoded.restart_count, |v| v.parse().ok());
    accounted += check(&map, &problems, keys::CONTAINER_HASH, decoded.spec_hash, |v| u64::from_str_radix(v, 16).ok());
    accounted += check(&map, &problems, keys::CONTAINER_TYPE, decoded.container_type, |v| match v {
        "init" => Some(ContainerType::Init),
        "container" => Some(ContainerType::Regular),
        "ephemeral" => Some(ContainerType::Ephemeral),
        _ => None,
    });
    for (key, field) in [
        (keys::TERMINATION_GRACE_PERIOD, decoded.termination_grace_period_ns),
        (keys::DELETION_GRACE_PERIOD, decoded.deletion_grace_period_ns),
    ] {
        accounted += check(&map, &problems, key, field, |v| v.parse::<u64>().ok()?.checked_mul(1_000_000_000));
    }
    // Well-formed means JSON's grammar, which has no range limit: `77E777` is JSON although no
    // f64 holds it (serde_json::Value refuses it; IgnoredAny, like the agent, does not).
    for (key, field) in [(keys::PRE_STOP_HANDLER, &decoded.pre_stop_handler), (keys::PORTS, &decoded.ports)] {
        accounted += check(&map, &problems, key, field.clone(), |v| {
            serde_json::from_str::<IgnoredAny>(v).is_ok().then(|| v.to_owned())
        });
    }
    assert_eq!(accounted, problems.len(), "problems for keys that are absent or well-formed: {problems:?}");

    let runtime_name = map.get("runtime-name").map(String::as_str);
    let identity = PodIdentity::from_labels(&map, runtime_name);
    let label = |key: &str| map.get(key).cloned().unwrap_or_default();
    assert_eq!(identity.pod_name, label(keys::POD_NAME));
    assert_eq!(identity.pod_namespace, label(keys::POD_NAMESPACE));
    assert_eq!(identity.pod_uid, label(keys::POD_UID));
    let container = map.get(keys::CONTAINER_NAME).map(String::as_str).or(runtime_name).unwrap_or_default();
    assert_eq!(identity.container_name, container);

    let declared = map.get(keys::PROBE_DECLARATION);
    match probe_declaration(&map) {
        Ok(found) => assert_eq!(found.as_ref(), declared.filter(|text| text.len() <= MAX_PROBE_DECLARATION_BYTES)),
        Err(problem) => {
            assert!(declared.is_some_and(|text| text.len() > MAX_PROBE_DECLARATION_BYTES), "{problem}");
            assert_eq!(problem.key, keys::PROBE_DECLARATION);
            assert_one_line("AnnotationProblem", &problem.to_string());
        }
    }

    // The preStop decoder on the annotation when there is one, else on the whole input.
    let json = map.get(keys::PRE_STOP_HANDLER).map_or(text.as_ref(), String::as_str);
    match PreStopHandler::from_annotation(json) {
        Ok(handler) => {
            if let PreStopHandler::Exec { command } = &handler {
                assert!(command.first().is_some_and(|program| !program.is_empty()), "{json:?}");
            }
            if let Some(comm) = handler.exec_comm() {
                // The kernel keeps 15 bytes of the basename; a character split there is one U+FFFD.
                assert!(comm.chars().count() <= 15 && !comm.contains('/'), "comm {comm:?} from {json:?}");
            }
        }
        Err(err) => assert_error_one_line("TerminationError", &err, 200 + debug_len_bound(json.len())),
    }
});

/// Checks one decoded field against its annotation and returns how many problems belong to it:
/// absent means `None` and no problem; well-formed means `expected(value)` and no problem;
/// malformed (`expected` says None) means `None` and exactly one problem quoting the value.
fn check<T: PartialEq + std::fmt::Debug>(
    map: &HashMap<String, String>,
    problems: &[AnnotationProblem],
    key: &'static str,
    field: Option<T>,
    expected: impl Fn(&str) -> Option<T>,
) -> usize {
    let mine: Vec<&AnnotationProblem> = problems.iter().filter(|p| p.key == key).collect();
    let Some(value) = map.get(key) else {
        assert!(field.is_none() && mine.is_empty(), "{key} is absent but decoded {field:?}, problems {mine:?}");
        return 0;
    };
    match expected(value) {
        Some(want) => {
            assert_eq!(field.as_ref(), Some(&want), "{key}={value:?}");
            assert!(mine.is_empty(), "{key}={value:?} decoded but reported: {mine:?}");
            0
        }
        None => {
            assert!(field.is_none(), "{key}={value:?} is malformed but decoded {field:?}");
            assert_eq!(mine.len(), 1, "{key}={value:?} is malformed: want one problem, got {mine:?}");
            assert_eq!(&mine[0].value, value);
            1
        }
    }
}
