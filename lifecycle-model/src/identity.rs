//! Who a cgroup belongs to, read from its v2 path alone.
//!
//! Owns the kubelet's cgroup naming: both cgroup drivers (cgroupfs `/kubepods/<qos>/pod<uid>/<id>`
//! and systemd `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/<scope>`),
//! the system partition of KEP-5894 under either (`/kubepods/system/<qos>/pod<uid>`,
//! `/kubepods.slice/kubepods-system.slice/kubepods-system-<qos>.slice/...`), any prefix before the
//! kubepods root (kind's `/kubelet.slice/kubelet-kubepods.slice/...`, cgroupfs `--cgroup-root`s),
//! and the runtimes' container scopes (containerd, CRI-O and its conmon helper, Docker). Pure: a
//! path in, a [`CgroupIdentity`] out.
//!
//! Paths outside kubepods are host units named by their path (the plain-host mode). Paths inside
//! kubepods that do not follow a layout are errors naming what was wrong: a wrong guess here
//! would attribute one container's events to another. The node model keeps such a cgroup as a
//! unit named by its path, as a host unit is, and counts it (`DroppedKind::CgroupLayout`): its
//! processes are still watched, only the pod and container names are not guessed.

use serde::Serialize;

/// A pod's Quality of Service class, spelled as in `pod.status.qosClass`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum QosClass {
    /// Pods directly under the kubepods root (no tier cgroup of their own).
    Guaranteed,
    /// Pods under the `burstable` tier.
    Burstable,
    /// Pods under the `besteffort` tier.
    BestEffort,
}

impl QosClass {
    /// The tier's word in cgroup names (`kubepods/burstable`, `kubepods-besteffort.slice`).
    /// Guaranteed pods have no tier cgroup, so it has no word.
    fn tier_word(self) -> Option<&'static str> {
        match self {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        }
    }

    const TIERED: [QosClass; 2] = [QosClass::Burstable, QosClass::BestEffort];
}

/// The container runtime that named a container's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// `cri-containerd-<id>.scope`.
    Containerd,
    /// `crio-<id>.scope` (or `crio-<id>` under the cgroupfs driver).
    CriO,
    /// `docker-<id>.scope`.
    Docker,
    /// A bare `<id>` directory: the cgroupfs driver's naming, shared by containerd and
    /// cri-dockerd, so the path does not say which runtime it was.
    Unnamed,
}

/// What a cgroup is, as far as its path says.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CgroupIdentity {
    /// A container's cgroup, or a cgroup nested inside one (crun's `container` sub-cgroup,
    /// systemd or Docker running inside the container): everything below a container's cgroup is
    /// that container's.
    Container { pod_uid: String, qos: QosClass, container_id: String, runtime: Runtime },
    /// A pod-level cgroup: the parent of the pod's containers, including its sandbox (pause).
    Pod { pod_uid: String, qos: QosClass },
    /// A runtime helper inside a pod that is not a container: CRI-O's `crio-conmon-<id>.scope`,
    /// which holds conmon for container `container_id`.
    RuntimeHelper { pod_uid: String, container_id: String },
    /// The kubepods root (`qos_tier` None) or one of its QoS tiers: ancestors of pods that run
    /// no processes of their own.
    KubepodsAncestor { qos_tier: Option<QosClass> },
    /// Anything outside kubepods: on a plain host every cgroup that runs processes is a unit
    /// named by its path (`/system.slice/nginx.service`, `/user.slice/...`).
    HostUnit { path: String },
}

/// Why a path under kubepods could not be classified.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The path does not start with `/`, so it is not a path as the kernel prints it.
    #[error("cgroup path {path:?} does not start with '/'")]
    NotAbsolute { path: String },
    /// A segment where the kubelet's layout puts a QoS tier or a pod is something else.
    #[error("cgroup path {path:?}: segment {segment:?} is not {expected}")]
    UnexpectedSegment { path: String, segment: String, expected: &'static str },
    /// A pod segment whose uid is neither a UUID nor a static pod's 32-hex-digit hash.
    #[error("cgroup path {path:?}: pod segment {segment:?} does not hold a pod uid")]
    BadPodUid { path: String, segment: String },
    /// A container segment whose id is not 64 hex digits.
    #[error("cgroup path {path:?}: container segment {segment:?} does not hold a 64-hex-digit id")]
    BadContainerId { path: String, segment: String },
    /// A `.scope` under a pod whose prefix names no known runtime.
    #[error("cgroup path {path:?}: scope {segment:?} under a pod has no known runtime prefix")]
    UnknownScope { path: String, segment: String },
}

/// Classifies a v2 cgroup path as the kernel prints it (`/kubepods/burstable/pod<uid>/<id>`).
pub fn classify(path: &str) -> Result<CgroupIdentity, IdentityError> {
    if !path.starts_with('/') {
        return Err(IdentityError::NotAbsolute { path: path.to_owned() });
    }
    // The kernel never prints empty segments; skipping them keeps `//` or a trailing `/` from a
    // hand-written path from turning into a bogus segment.
    let segments: Vec<&str> = path.split('/').filter(|segment| !segment.is_empty()).collect();
    // The first kubepods root wins: a kubelet running inside a pod (kind in a pod) is, from this
    // host's point of view, processes of that outer container.
    let root =
        segments.iter().enumerate().find_map(|(index, segment)| kubepods_root(segment).map(|driver| (index, driver)));
    let Some((root_index, driver)) = root else {
        return Ok(CgroupIdentity::HostUnit { path: path.to_owned() });
    };
    let below = &segments[root_index + 1..];
    let parser = LayoutParser { path };
    match driver {
        Driver::Cgroupfs => parser.cgroupfs(below),
        Driver::Systemd { stem } => parser.systemd(stem, below),
    }
}

/// The kubelet's cgroup driver, as recognised from the kubepods root's name.
enum Driver<'a> {
    /// `kubepods`.
    Cgroupfs,
    /// `kubepods.slice`, or `<prefix>-kubepods.slice` under a non-default cgroup root; `stem` is
    /// the name without `.slice`, which every descendant slice's name starts with.
    Systemd { stem: &'a str },
}

fn kubepods_root(segment: &str) -> Option<Driver<'_>> {
    if segment == "kubepods" {
        return Some(Driver::Cgroupfs);
    }
    let stem = segment.strip_suffix(".slice")?;
    (stem == "kubepods" || stem.ends_with("-kubepods")).then_some(Driver::Systemd { stem })
}

/// The partition of KEP-5894 that keeps system pods apart from the others: `system` under the
/// kubepods root (`kubepods-system.slice` under the systemd driver), with the same QoS tiers and
/// pods below it as the root itself.
const SYSTEM_PARTITION: &str = "system";

/// Walks the segments below a kubepods root, carrying the full path for error messages.
struct LayoutParser<'a> {
    path: &'a str,
}

impl LayoutParser<'_> {
    fn cgroupfs(&self, below: &[&str]) -> Result<CgroupIdentity, IdentityError> {
        let Some((first, rest)) = below.split_first() else {
            return Ok(CgroupIdentity::KubepodsAncestor { qos_tier: None });
        };
        // The system partition holds the same layout as the root; nothing under it is named
        // `system` again, so it is entered once.
        if *first == SYSTEM_PARTITION {
            return match rest.first() {
                Some(next) if *next == SYSTEM_PARTITION => {
                    Err(self.unexpected(next, "a QoS tier or a pod<uid> directory"))
                }
                Some(_) => self.cgroupfs(rest),
                None => Ok(CgroupIdentity::KubepodsAncestor { qos_tier: None }),
            };
        }
        if let Some(qos) = QosClass::TIERED.into_iter().find(|q| q.tier_word() == Some(*first)) {
            let Some((pod_segment, rest)) = rest.split_first() else {
                return Ok(CgroupIdentity::KubepodsAncestor { qos_tier: Some(qos) });
            };
            let uid = pod_segment
                .strip_prefix("pod")
                .ok_or_else(|| self.unexpected(pod_segment, "a pod<uid> directory under a QoS tier"))?;
            let pod_uid = self.pod_uid(pod_segment, uid)?;
            return self.inside_pod(pod_uid, qos, rest);
        }
        let uid = first
            .strip_prefix("pod")
            .ok_or_else(|| self.unexpected(first, "burstable, besteffort or a pod<uid> directory under kubepods"))?;
        let pod_uid = self.pod_uid(first, uid)?;
        self.inside_pod(pod_uid, QosClass::Guaranteed, rest)
    }

    fn systemd(&self, stem: &str, below: &[&str]) -> Result<CgroupIdentity, IdentityError> {
        let Some((first, rest)) = below.split_first() else {
            return Ok(CgroupIdentity::KubepodsAncestor { qos_tier: None });
        };
        // `kubepods-system.slice`: the system partition, whose slices are named after it.
        let system_stem = format!("{stem}-{SYSTEM_PARTITION}");
        if *first == format!("{system_stem}.slice") && !stem.ends_with(&format!("-{SYSTEM_PARTITION}")) {
            return self.systemd(&system_stem, rest);
        }
        for qos in QosClass::TIERED {
            let Some(word) = qos.tier_word() else { continue };
            let tier_stem = format!("{stem}-{word}");
            if *first != format!("{tier_stem}.slice") {
                continue;
            }
            let Some((pod_segment, rest)) = rest.split_first() else {
                return Ok(CgroupIdentity::KubepodsAncestor { qos_tier: Some(qos) });
            };
            let pod_uid = self.systemd_pod_uid(&tier_stem, pod_segment)?;
            return self.inside_pod(pod_uid, qos, rest);
        }
        if first.starts_with(&format!("{stem}-pod")) {
            let pod_uid = self.systemd_pod_uid(stem, first)?;
            return self.inside_pod(pod_uid, QosClass::Guaranteed, rest);
        }
        Err(self.unexpected(first, "a QoS tier slice or a pod slice under the kubepods slice"))
    }

    /// Reads `<parent_stem>-pod<uid_>.slice`; systemd spells the uid's dashes as `_` because a
    /// dash in a slice name means nesting.
    fn systemd_pod_uid(&self, parent_stem: &str, segment: &str) -> Result<String, IdentityError> {
        let uid = segment
            .strip_prefix(parent_stem)
            .and_then(|rest| rest.strip_prefix("-pod"))
            .and_then(|rest| rest.strip_suffix(".slice"))
            .ok_or_else(|| self.unexpected(segment, "a pod slice named after its parent slice"))?;
        if uid.contains('-') {
            return Err(self.bad_uid(segment));
        }
        self.pod_uid(segment, &uid.replace('_', "-"))
    }

    /// Accepts the two uid forms the kubelet puts in cgroup names: an API object's UUID, and a
    /// static pod's uid, which the kubelet derives as 32 hex digits of a hash with no dashes. The
    /// static form is kept as is because the CRI label `io.kubernetes.pod.uid` carries it so.
    fn pod_uid(&self, segment: &str, uid: &str) -> Result<String, IdentityError> {
        if is_uuid(uid) || (uid.len() == 32 && is_hex(uid)) {
            Ok(uid.to_owned())
        } else {
            Err(self.bad_uid(segment))
        }
    }

    fn inside_pod(&self, pod_uid: String, qos: QosClass, below_pod: &[&str]) -> Result<CgroupIdentity, IdentityError> {
        // Deeper segments belong to the container (see CgroupIdentity::Container).
        let Some(segment) = below_pod.first() else {
            return Ok(CgroupIdentity::Pod { pod_uid, qos });
        };
        let (name, is_scope) = match segment.strip_suffix(".scope") {
            Some(name) => (name, true),
            None => (*segment, false),
        };
        // `crio-conmon-` before `crio-`: the helper's prefix extends the container's.
        if let Some(id) = name.strip_prefix("crio-conmon-") {
            let container_id = self.container_id(segment, id)?;
            return Ok(CgroupIdentity::RuntimeHelper { pod_uid, container_id });
        }
        let (runtime, id) = if let Some(id) = name.strip_prefix("cri-containerd-") {
            (Runtime::Containerd, id)
        } else if let Some(id) = name.strip_prefix("crio-") {
            (Runtime::CriO, id)
        } else if let Some(id) = name.strip_prefix("docker-") {
            (Runtime::Docker, id)
        } else if is_scope {
            return Err(IdentityError::UnknownScope { path: self.path.to_owned(), segment: (*segment).to_owned() });
        } else {
            (Runtime::Unnamed, name)
        };
        let container_id = self.container_id(segment, id)?;
        Ok(CgroupIdentity::Container { pod_uid, qos, container_id, runtime })
    }

    fn container_id(&self, segment: &str, id: &str) -> Result<String, IdentityError> {
        if id.len() == 64 && is_hex(id) {
            Ok(id.to_owned())
        } else {
            Err(IdentityError::BadContainerId { path: self.path.to_owned(), segment: segment.to_owned() })
        }
    }

    fn unexpected(&self, segment: &str, expected: &'static str) -> IdentityError {
        IdentityError::UnexpectedSegment { path: self.path.to_owned(), segment: segment.to_owned(), expected }
    }

    fn bad_uid(&self, segment: &str) -> IdentityError {
        IdentityError::BadPodUid { path: self.path.to_owned(), segment: segment.to_owned() }
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// 8-4-4-4-12 hex digits.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5 && groups.iter().zip([8, 4, 4, 4, 12]).all(|(group, len)| group.len() == len && is_hex(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b0f2e4b-2d44-4d2a-9a5f-3c1b6a7e8f90";
    const UID_: &str = "0b0f2e4b_2d44_4d2a_9a5f_3c1b6a7e8f90";
    const STATIC_UID: &str = "4d8e1b1e2d8c5a4f9a0b1c2d3e4f5a6b";
    const ID: &str = "3f1a9c0e5b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c0e2b4d6f8a0c2e4b6d8f0a";

    fn container(qos: QosClass, runtime: Runtime) -> CgroupIdentity {
        CgroupIdentity::Container { pod_uid: UID.into(), qos, container_id: ID.into(), runtime }
    }

    fn ok(path: &str) -> CgroupIdentity {
        classify(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn cgroupfs_containers_in_every_qos_tier() {
        for (tier, qos) in
            [("/burstable", QosClass::Burstable), ("/besteffort", QosClass::BestEffort), ("", QosClass::Guaranteed)]
        {
            let path = format!("/kubepods{tier}/pod{UID}/{ID}");
            assert_eq!(ok(&path), container(qos, Runtime::Unnamed), "{path}");
            let crio = format!("/kubepods{tier}/pod{UID}/crio-{ID}");
            assert_eq!(ok(&crio), container(qos, Runtime::CriO), "{crio}");
        }
    }

    #[test]
    fn systemd_containers_for_every_runtime_and_qos() {
        for (prefix, runtime) in
            [("cri-containerd", Runtime::Containerd), ("crio", Runtime::CriO), ("docker", Runtime::Docker)]
        {
            let scope = format!("{prefix}-{ID}.scope");
            let burstable =
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/{scope}");
            assert_eq!(ok(&burstable), container(QosClass::Burstable, runtime));
            let besteffort =
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/{scope}");
            assert_eq!(ok(&besteffort), container(QosClass::BestEffort, runtime));
            let guaranteed = format!("/kubepods.slice/kubepods-pod{UID_}.slice/{scope}");
            assert_eq!(ok(&guaranteed), container(QosClass::Guaranteed, runtime));
        }
    }

    #[test]
    fn pod_level_cgroups_and_ancestors() {
        assert_eq!(
            ok(&format!("/kubepods/besteffort/pod{UID}")),
            CgroupIdentity::Pod { pod_uid: UID.into(), qos: QosClass::BestEffort }
        );
        assert_eq!(
            ok(&format!("/kubepods.slice/kubepods-pod{UID_}.slice")),
            CgroupIdentity::Pod { pod_uid: UID.into(), qos: QosClass::Guaranteed }
        );
        assert_eq!(ok("/kubepods"), CgroupIdentity::KubepodsAncestor { qos_tier: None });
        assert_eq!(ok("/kubepods.slice"), CgroupIdentity::KubepodsAncestor { qos_tier: None });
        assert_eq!(ok("/kubepods/burstable"), CgroupIdentity::KubepodsAncestor { qos_tier: Some(QosClass::Burstable) });
        assert_eq!(
            ok("/kubepods.slice/kubepods-besteffort.slice"),
            CgroupIdentity::KubepodsAncestor { qos_tier: Some(QosClass::BestEffort) }
        );
    }

    #[test]
    fn nested_roots_kind_style_and_cgroupfs_prefix() {
        let kind = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(ok(&kind), container(QosClass::BestEffort, Runtime::Containerd));
        let kind_guaranteed =
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(ok(&kind_guaranteed), container(QosClass::Guaranteed, Runtime::Containerd));
        let docker_in_docker = format!("/docker/{ID}/kubelet/kubepods/burstable/pod{UID}/{ID}");
        assert_eq!(ok(&docker_in_docker), container(QosClass::Burstable, Runtime::Unnamed));
        assert_eq!(ok("/kubelet.slice/kubelet-kubepods.slice"), CgroupIdentity::KubepodsAncestor { qos_tier: None });
    }

    #[test]
    fn conmon_is_a_runtime_helper_not_a_container() {
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope"
        );
        let helper = CgroupIdentity::RuntimeHelper { pod_uid: UID.into(), container_id: ID.into() };
        assert_eq!(ok(&systemd), helper);
        assert_eq!(ok(&format!("/kubepods/pod{UID}/crio-conmon-{ID}")), helper);
    }

    #[test]
    fn cgroups_below_a_container_are_that_container() {
        let crun_subgroup = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope/container"
        );
        assert_eq!(ok(&crun_subgroup), container(QosClass::Burstable, Runtime::CriO));
        let deep = format!("/kubepods/pod{UID}/{ID}/init.scope/a/b/c");
        assert_eq!(ok(&deep), container(QosClass::Guaranteed, Runtime::Unnamed));
    }

    #[test]
    fn static_pod_hash_uids_are_kept_verbatim() {
        assert_eq!(
            ok(&format!("/kubepods/burstable/pod{STATIC_UID}/{ID}")),
            CgroupIdentity::Container {
                pod_uid: STATIC_UID.into(),
                qos: QosClass::Burstable,
                container_id: ID.into(),
                runtime: Runtime::Unnamed,
            }
        );
        assert_eq!(
            ok(&format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice")),
            CgroupIdentity::Pod { pod_uid: STATIC_UID.into(), qos: QosClass::Burstable }
        );
    }

    #[test]
    fn the_system_partition_of_kep_5894_is_named_under_both_drivers() {
        for (tier, qos) in
            [("burstable/", QosClass::Burstable), ("besteffort/", QosClass::BestEffort), ("", QosClass::Guaranteed)]
        {
            let path = format!("/kubepods/system/{tier}pod{UID}/{ID}");
            assert_eq!(ok(&path), container(qos, Runtime::Unnamed), "{path}");
            assert_eq!(
                ok(&format!("/kubepods/system/{tier}pod{UID}")),
                CgroupIdentity::Pod { pod_uid: UID.into(), qos },
                "{path}"
            );
        }
        let systemd = format!(
            "/kubepods.slice/kubepods-system.slice/kubepods-system-burstable.slice/\
             kubepods-system-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(ok(&systemd), container(QosClass::Burstable, Runtime::Containerd));
        let guaranteed =
            format!("/kubepods.slice/kubepods-system.slice/kubepods-system-pod{UID_}.slice/crio-{ID}.scope");
        assert_eq!(ok(&guaranteed), container(QosClass::Guaranteed, Runtime::CriO));
        assert_eq!(ok("/kubepods/system"), CgroupIdentity::KubepodsAncestor { qos_tier: None });
        assert_eq!(
            ok("/kubepods.slice/kubepods-system.slice/kubepods-system-besteffort.slice"),
            CgroupIdentity::KubepodsAncestor { qos_tier: Some(QosClass::BestEffort) }
        );
        // Entered once: a partition inside the partition is no layout.
        assert!(matches!(err("/kubepods/system/system/burstable"), IdentityError::UnexpectedSegment { .. }));
        assert!(classify("/kubepods.slice/kubepods-system.slice/kubepods-system-system.slice").is_err());
    }

    #[test]
    fn host_units_are_named_by_path() {
        for path in [
            "/",
            "/system.slice/containerd.service",
            "/user.slice/user-1000.slice/session-3.scope",
            "/kubepodsx/burstable",
            "/system.slice/kubepods-burstable.slice",
            "/init.scope",
        ] {
            assert_eq!(ok(path), CgroupIdentity::HostUnit { path: path.into() }, "{path}");
        }
    }

    #[test]
    fn odd_spellings_the_kernel_never_prints_are_tolerated() {
        assert_eq!(
            ok(&format!("/kubepods//burstable/pod{UID}/{ID}/")),
            container(QosClass::Burstable, Runtime::Unnamed)
        );
    }

    #[test]
    fn long_paths_do_not_matter() {
        let prefix = "/very-long-host-prefix-segment".repeat(40);
        let path = format!("{prefix}/kubepods/besteffort/pod{UID}/docker-{ID}.scope");
        assert_eq!(ok(&path), container(QosClass::BestEffort, Runtime::Docker));
        let host = "/a".repeat(2000);
        assert_eq!(ok(&host), CgroupIdentity::HostUnit { path: host.clone() });
    }

    fn err(path: &str) -> IdentityError {
        match classify(path) {
            Ok(identity) => panic!("{path} classified as {identity:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn relative_paths_are_refused() {
        assert_eq!(err("kubepods/burstable"), IdentityError::NotAbsolute { path: "kubepods/burstable".into() });
        assert!(matches!(err(""), IdentityError::NotAbsolute { .. }));
    }

    #[test]
    fn malformed_pod_segments_are_errors() {
        for path in [
            "/kubepods/burstable/podnot-a-uid".to_owned(),
            "/kubepods/pod".to_owned(),
            format!("/kubepods/pod{}", &UID[1..]),
            format!("/kubepods/pod{}", UID.replace('-', "_")),
            format!("/kubepods/pod{}x", STATIC_UID),
            format!("/kubepods.slice/kubepods-pod{UID}.slice"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podzzzz.slice".to_owned(),
        ] {
            assert!(matches!(err(&path), IdentityError::BadPodUid { .. }), "{path}");
        }
    }

    #[test]
    fn unexpected_segments_under_kubepods_are_errors() {
        for path in [
            "/kubepods/guaranteed".to_owned(),
            "/kubepods/burstable/something".to_owned(),
            "/kubepods.slice/system.slice".to_owned(),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-pod{UID_}.slice"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}"),
            format!("/kubelet.slice/kubelet-kubepods.slice/kubepods-pod{UID_}.slice"),
        ] {
            assert!(matches!(err(&path), IdentityError::UnexpectedSegment { .. }), "{path}");
        }
    }

    #[test]
    fn malformed_container_segments_are_errors() {
        let pod = format!("/kubepods/burstable/pod{UID}");
        for segment in [
            "not-hex".to_owned(),
            ID[..63].to_owned(),
            format!("{ID}0"),
            format!("cri-containerd-{}.scope", ID.replace('a', "g")),
            format!("crio-conmon-{}.scope", &ID[..12]),
            "docker-.scope".to_owned(),
        ] {
            let path = format!("{pod}/{segment}");
            assert!(matches!(err(&path), IdentityError::BadContainerId { .. }), "{path}");
        }
        let unknown = format!("{pod}/podman-{ID}.scope");
        assert_eq!(
            err(&unknown),
            IdentityError::UnknownScope { path: unknown.clone(), segment: format!("podman-{ID}.scope") }
        );
    }

    #[test]
    fn errors_name_the_path_and_the_problem() {
        let path = format!("/kubepods/besteffort/pod{UID}/podman-{ID}.scope");
        let text = err(&path).to_string();
        assert!(text.contains(&path) && text.contains("no known runtime prefix"), "{text}");
    }

    #[test]
    fn identities_serialize_with_a_kind_tag() {
        let json = serde_json::to_value(container(QosClass::BestEffort, Runtime::CriO)).expect("json");
        assert_eq!(json["kind"], "container");
        assert_eq!(json["qos"], "BestEffort");
        assert_eq!(json["runtime"], "cri-o");
    }
}
