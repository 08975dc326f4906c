//! What `doctor` reads from the real node, handed to the pure checks of the parent module. Every
//! read tolerates failure: a file that cannot be read becomes a finding, never an early exit, so
//! the report always has every line.

use std::{
    io,
    net::{SocketAddr, TcpListener},
    os::unix::fs::FileTypeExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::{
    cap, cgroup_layout, check_btf, check_capabilities, check_cgroups, check_clock, check_clock_sync, check_cri,
    check_features, check_kernel, check_kernel_cost, check_kubelet, check_kubernetes, check_memlock, check_port,
    check_programs, check_tracepoints, has_capability, listening_inodes, parse_cap_eff, ApiReach, BtfRead, ClockSync,
    DoctorArgs, Finding, Holder, KernelCost, KernelVersion, Memlock, PortRole, PortState, ProgramLoad, SocketOrigin,
    SocketProbe, SocketState, TracepointKind, TracepointSeen, DISTRIBUTION_SOCKETS, PERMISSIONS, TRACEPOINTS,
};
use crate::{
    agent::kubelet::KubeletLink,
    cli::doctor::proof::{self, Proof},
    discovery::{
        clock::{boottime_ns, realtime_ns},
        cri::{CriClient, CONTAINERD_SOCKET, CRIO_SOCKET},
        kube::{
            watch::{KubeError, KubeSource},
            words::ApiWords,
        },
    },
    kernel::{layout::KernelBtf, Feature, Sensor, SensorConfig},
    model::kubelet::KubeletOverrides,
    ErrorChain,
};

/// A CRI `Version` call, or a review, that takes longer than this is a runtime or an API server
/// that would stall the agent too: say so instead of waiting.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Where classic tracepoints are when tracefs is reached through debugfs.
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Runs every check in the report's order.
pub(super) async fn examine(args: &DoctorArgs) -> Vec<Finding> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = KernelVersion::parse(&release);
    let effective = std::fs::read_to_string("/proc/self/status").ok().as_deref().and_then(parse_cap_eff);

    let (btf_read, btf) = read_btf(&args.btf);
    let tracepoints = tracepoints_seen(btf.as_ref(), &args.tracefs);
    // The parse is 5-6 MB: let it go before the sensor makes its own.
    drop(btf);
    let (load, proofs, costs) = load_programs(args, &btf_read, effective);

    let mut findings = vec![
        check_kernel(&release),
        check_btf(&args.btf, &btf_read),
        check_tracepoints(&tracepoints),
        check_programs(&load),
        check_features(&load, proofs.as_deref()),
        check_kernel_cost(&load, costs.as_ref()),
        check_capabilities(effective),
        check_memlock(kernel, memlock(), effective.is_some_and(|caps| has_capability(caps, cap::SYS_RESOURCE))),
        check_cgroups(&cgroup_layout(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())),
        check_cri(&probe_sockets(args.cri_socket.as_deref()).await),
        check_kubernetes(&reach_api(args).await),
        read_kubelet(args).await,
    ];
    findings.push(check_port(PortRole::Listen, args.listen, &port_state(args.listen)));
    match args.health_listen.parse::<SocketAddr>() {
        Ok(addr) => findings.push(check_port(PortRole::Health, addr, &port_state(addr))),
        Err(_) if args.health_listen.is_empty() => {}
        Err(_) => findings.push(Finding::missing(
            "health-listen",
            format!("{:?} is not an address:port", args.health_listen),
            "pass --health-listen as IP:PORT",
        )),
    }
    if args.pod_probe_port != 0 {
        let addr = SocketAddr::from(([0, 0, 0, 0], args.pod_probe_port));
        findings.push(check_port(PortRole::PodProbe, addr, &port_state(addr)));
    }
    findings.push(check_clock(boottime_ns(), realtime_ns(), boot_time_from_proc_stat()));
    findings.push(check_clock_sync(&clock_sync()));
    findings
}

/// Reads and parses the BTF, computing the struct offsets as loading does.
fn read_btf(path: &Path) -> (BtfRead, Option<KernelBtf>) {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return (BtfRead::Absent, None),
        Err(err) => return (BtfRead::Unreadable(err.to_string()), None),
    };
    if bytes.is_empty() {
        return (BtfRead::Empty, None);
    }
    let size = bytes.len();
    match KernelBtf::from_bytes(bytes) {
        Ok(btf) => {
            let missing =
                btf.offsets().missing.iter().map(|(member, why)| format!("{} ({why})", member.field())).collect();
            (BtfRead::Usable { bytes: size, missing }, Some(btf))
        }
        Err(err) => (BtfRead::Unusable(ErrorChain(&err).to_string()), None),
    }
}

/// Each tracepoint: BTF ones from the parse, classic ones from tracefs (where it is mounted).
fn tracepoints_seen(btf: Option<&KernelBtf>, tracefs: &Path) -> Vec<TracepointSeen> {
    let events_dir = [tracefs.to_owned(), PathBuf::from(DEBUGFS_TRACING)]
        .into_iter()
        .map(|root| root.join("events"))
        .find(|events| events.is_dir());
    TRACEPOINTS
        .iter()
        .map(|&(feature, name, kind)| {
            let present = match kind {
                TracepointKind::Btf => btf.map(|btf| btf.has_raw_tracepoint(name)),
                TracepointKind::Tracefs(category) => {
                    events_dir.as_ref().map(|dir| dir.join(category).join(name).is_dir())
                }
            };
            TracepointSeen { feature, name, kind, present }
        })
        .collect()
}

/// Loads and attaches the programs exactly as `run` does, proves each feature that attached
/// with records of its own making (`proof.rs`), then detaches them (the sensor is dropped): the
/// only way to hear the verifier, lockdown and the LSMs, and to know a feature that says it runs
/// does.
/// The programs' proofs and what the kernel accounted for them, when they loaded.
type Proven = (ProgramLoad, Option<Vec<(Feature, Proof)>>, Option<KernelCost>);

fn load_programs(args: &DoctorArgs, btf: &BtfRead, effective: Option<u64>) -> Proven {
    if args.no_load {
        return (ProgramLoad::NotTried("--no-load".to_owned()), None, None);
    }
    if !matches!(btf, BtfRead::Usable { .. }) {
        return (ProgramLoad::NotTried("no usable BTF".to_owned()), None, None);
    }
    // The same test as the sensor's own: CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON.
    let privileged = effective.is_none_or(|caps| {
        has_capability(caps, cap::SYS_ADMIN) || (has_capability(caps, cap::BPF) && has_capability(caps, cap::PERFMON))
    });
    if !privileged {
        return (ProgramLoad::NotTried("needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN".to_owned()), None, None);
    }
    // Its own accepts are among the proofs: record them.
    let config = SensorConfig {
        btf_path: args.btf.clone(),
        tracefs_path: args.tracefs.clone(),
        ignore_tgid: 0,
        ..SensorConfig::default()
    };
    match Sensor::load(&config) {
        Ok(mut sensor) => {
            let load = ProgramLoad::Loaded(
                sensor
                    .features()
                    .iter()
                    .map(|state| {
                        let off = (!state.enabled).then(|| {
                            state
                                .reason
                                .as_ref()
                                .map_or("off".to_owned(), |reason| ErrorChain(reason.as_ref()).to_string())
                        });
                        (state.feature.name(), off)
                    })
                    .collect(),
            );
            let enabled: Vec<Feature> = sensor.features().iter().filter(|s| s.enabled).map(|s| s.feature).collect();
            let root = crate::discovery::cgroupfs::CgroupRoot::detect().ok();
            let proofs = sensor.take_events().map(|mut stream| proof::prove(&mut stream, &enabled, root.as_ref()));
            // What the proofs' own events cost the kernel, program by program.
            let maps = sensor.maps();
            let cost = match maps.kernel_stats() {
                Ok(()) => KernelCost::Accounted(
                    maps.program_costs().into_iter().map(|c| (c.program, c.runs, c.run_time_ns)).collect(),
                ),
                Err(why) => KernelCost::NotAccounted(ErrorChain(why.as_ref()).to_string()),
            };
            (load, proofs, Some(cost))
        }
        Err(err) => (ProgramLoad::Failed(ErrorChain(&err).to_string()), None, None),
    }
}

fn memlock() -> Option<Memlock> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    // None is RLIM_INFINITY.
    Some(Memlock { soft: limit.current.unwrap_or(u64::MAX), hard: limit.maximum.unwrap_or(u64::MAX) })
}

/// The flag's socket alone when given; else the agent's defaults and the distributions' paths.
async fn probe_sockets(flag: Option<&Path>) -> Vec<SocketProbe> {
    let candidates: Vec<(PathBuf, SocketOrigin)> = match flag {
        Some(path) => vec![(path.to_owned(), SocketOrigin::Flag)],
        None => [CONTAINERD_SOCKET, CRIO_SOCKET]
            .into_iter()
            .map(|path| (PathBuf::from(path), SocketOrigin::Default))
            .chain(DISTRIBUTION_SOCKETS.into_iter().map(|path| (PathBuf::from(path), SocketOrigin::Distribution)))
            .collect(),
    };
    let mut probes = Vec::with_capacity(candidates.len());
    for (path, origin) in candidates {
        let state = match std::fs::metadata(&path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => SocketState::Absent,
            Err(err) if err.kind() == io::ErrorKind::PermissionDenied => SocketState::NoAccess(err.to_string()),
            Ok(meta) if !meta.file_type().is_socket() => SocketState::Failed("not a unix socket".to_owned()),
            _ => match tokio::time::timeout(CALL_TIMEOUT, CriClient::connect(&path)).await {
                Ok(Ok(client)) => {
                    let version = client.version();
                    SocketState::Answered {
                        runtime: format!(
                            "{} {}, CRI {}",
                            version.runtime_name, version.runtime_version, version.runtime_api_version
                        ),
                    }
                }
                Ok(Err(err)) => SocketState::Failed(ErrorChain(&err).to_string()),
                Err(_) => SocketState::Failed(format!("no answer to Version within {CALL_TIMEOUT:?}")),
            },
        };
        probes.push(SocketProbe { path, origin, state });
    }
    probes
}

/// Connects as the agent does (which lists this node's pods), then asks what the account may do.
async fn reach_api(args: &DoctorArgs) -> ApiReach {
    let node = KubeSource::node_name(args.node_name.clone());
    let source = match KubeSource::connect(args.kubeconfig.clone(), node.clone()).await {
        Ok(source) => source,
        Err(KubeError::NotConfigured) => return ApiReach::NotConfigured,
        Err(err) => return ApiReach::Failed { node, why: ApiWords(&err).to_string() },
    };
    let reviews: Api<SelfSubjectAccessReview> = Api::all(source.client());
    let mut answers = Vec::with_capacity(PERMISSIONS.len());
    for permission in PERMISSIONS {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(permission.group.to_owned()),
                    resource: Some(permission.resource.to_owned()),
                    verb: Some(permission.verb.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = match tokio::time::timeout(CALL_TIMEOUT, reviews.create(&PostParams::default(), &review)).await {
            Ok(Ok(review)) => Ok(review.status.is_some_and(|status| status.allowed)),
            Ok(Err(err)) => Err(ApiWords(&err).to_string()),
            Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
        };
        answers.push((permission, answer));
    }
    ApiReach::Reached { node, answers }
}

/// Reads the kubelet as `run` does (its process through /proc, its release from the Node
/// object) and says what the agent would judge it by.
async fn read_kubelet(args: &DoctorArgs) -> Finding {
    let node = KubeSource::node_name(args.node_name.clone());
    let kube = KubeSource::configure(args.kubeconfig.clone(), node.clone()).await.ok();
    let api_configured = kube.is_some();
    let mut link = KubeletLink::new(node, kube, KubeletOverrides::default(), None).quiet();
    check_kubelet(&link.read().await, api_configured)
}

/// Binds and releases the address; when it is taken, looks for the holder.
fn port_state(addr: SocketAddr) -> PortState {
    match TcpListener::bind(addr) {
        Ok(listener) => {
            drop(listener);
            PortState::Free
        }
        Err(err) if err.kind() == io::ErrorKind::AddrInUse => PortState::InUse(port_holder(addr.port())),
        Err(err) => PortState::Unusable(err.to_string()),
    }
}

/// The process listening on `port` in this network namespace: the socket's inode from
/// `/proc/net/tcp{,6}`, then the `/proc/<pid>/fd` link that names it. Only runs for a taken port.
fn port_holder(port: u16) -> Option<Holder> {
    let inodes: Vec<u64> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    let wanted: Vec<String> = inodes.iter().map(|inode| format!("socket:[{inode}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        // Processes come and go, and other users' fds are unreadable without CAP_SYS_PTRACE.
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if holds {
            let command = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_owned();
            return Some(Holder { pid, command });
        }
    }
    None
}

/// `btime` of /proc/stat: the kernel's own idea of the boot's wall time, in seconds.
fn boot_time_from_proc_stat() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|line| line.strip_prefix("btime "))?.trim().parse().ok()
}

fn clock_sync() -> ClockSync {
    match crate::sys::clock_discipline() {
        Err(error) => ClockSync::Unknown(ErrorChain(&error).to_string()),
        Ok(discipline) if discipline.unsynchronised => ClockSync::Unsynchronised,
        Ok(discipline) => ClockSync::Synchronised { max_error_us: discipline.max_error_us },
    }
}
