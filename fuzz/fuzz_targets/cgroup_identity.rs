//! `model::identity::classify` on arbitrary UTF-8 paths (the kernel's cgroup mkdir records and
//! cgroupfs walks feed it). Properties: what it returns is consistent with the path (ids are the
//! kubelet's formats and come from the path; host units keep the path; a relative path is
//! refused), empty segments do not change the answer, errors are one line, and the identity
//! serialises to JSON (the API shows it).

#![no_main]

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::model::identity::{classify, CgroupIdentity, IdentityError};
use lifecycle_fuzz::{assert_error_one_line, debug_len_bound};

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else { return };
    let result = classify(path);
    match &result {
        Ok(identity) => check_identity(path, identity),
        Err(err) => {
            // Two quoted copies of (part of) the path and the fixed words around them.
            assert_error_one_line("IdentityError", err, 200 + 2 * debug_len_bound(path.len()));
            assert_eq!(matches!(err, IdentityError::NotAbsolute { .. }), !path.starts_with('/'), "{err}");
        }
    }

    // `//` and a trailing `/` are not segments: the same path written without them has the same
    // identity (host units and errors quote the path as given, so only their kind is compared).
    if path.starts_with('/') {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let tidy = format!("/{}", segments.join("/"));
        let again = classify(&tidy);
        match (&result, &again) {
            (Ok(CgroupIdentity::HostUnit { .. }), Ok(CgroupIdentity::HostUnit { .. })) => {}
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{path:?} vs {tidy:?}"),
            (Err(a), Err(b)) => {
                assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b), "{path:?} vs {tidy:?}")
            }
            (a, b) => panic!("{path:?} gives {a:?} but {tidy:?} gives {b:?}"),
        }
    }
});

fn check_identity(path: &str, identity: &CgroupIdentity) {
    assert!(path.starts_with('/'), "a relative path was classified: {path:?}");
    match identity {
        CgroupIdentity::HostUnit { path: unit } => {
            assert_eq!(unit, path);
            assert!(!path.split('/').any(is_kubepods_root), "{path:?} has a kubepods root but is a host unit");
        }
        CgroupIdentity::KubepodsAncestor { .. } => {
            assert!(path.split('/').any(is_kubepods_root), "{path:?} has no kubepods root");
        }
        CgroupIdentity::Pod { pod_uid, .. } => check_pod_uid(path, pod_uid),
        CgroupIdentity::Container { pod_uid, container_id, .. }
        | CgroupIdentity::RuntimeHelper { pod_uid, container_id } => {
            check_pod_uid(path, pod_uid);
            assert!(is_container_id(container_id), "container id {container_id:?} from {path:?}");
            assert!(path.contains(container_id.as_str()), "container id {container_id:?} is not in {path:?}");
        }
    }
    serde_json::to_string(identity).expect("a cgroup identity serialises");
}

/// A UUID (8-4-4-4-12 hex) or a static pod's 32 hex digits, found in the path as is or with the
/// systemd driver's `_` for `-`.
fn check_pod_uid(path: &str, uid: &str) {
    let is_uuid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() });
    let is_static = uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(is_uuid || is_static, "pod uid {uid:?} from {path:?}");
    assert!(path.contains(uid) || path.contains(&uid.replace('-', "_")), "pod uid {uid:?} is not in {path:?}");
}

fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The cgroupfs driver's `kubepods`, or the systemd driver's `kubepods.slice`/`*-kubepods.slice`.
fn is_kubepods_root(segment: &str) -> bool {
    segment == "kubepods"
        || segment.strip_suffix(".slice").is_some_and(|stem| stem == "kubepods" || stem.ends_with("-kubepods"))
}
