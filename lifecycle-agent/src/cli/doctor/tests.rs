//! Unit tests of the checks, over fixtures: kernel releases, CapEff masks, mount tables, socket
//! and API answers, /proc/net/tcp tables, clock readings.

use std::{net::SocketAddr, path::Path};

use lifecycle_common::names;

use super::*;
use crate::model::kubelet::{KubeletPolicy, KubeletSource};

fn verdict(finding: &Finding) -> Verdict {
    finding.result
}

#[test]
fn kernel_releases_parse_and_5_8_is_the_floor() {
    assert_eq!(KernelVersion::parse("6.18.44-fc-v669"), Some(KernelVersion { major: 6, minor: 18 }));
    assert_eq!(KernelVersion::parse("4.18.0-513.el8.x86_64"), Some(KernelVersion { major: 4, minor: 18 }));
    assert_eq!(KernelVersion::parse("5.8\n"), Some(KernelVersion { major: 5, minor: 8 }));
    assert_eq!(KernelVersion::parse("5.15+"), Some(KernelVersion { major: 5, minor: 15 }));
    assert_eq!(KernelVersion::parse("6.1rc3"), Some(KernelVersion { major: 6, minor: 1 }));
    assert_eq!(KernelVersion::parse("garbage"), None);

    assert_eq!(verdict(&check_kernel("5.8.0-1-generic")), Verdict::Ok);
    assert_eq!(verdict(&check_kernel("6.18.44-fc-v669")), Verdict::Ok);
    let old = check_kernel("5.4.0-150-generic");
    assert_eq!(verdict(&old), Verdict::Missing);
    assert!(old.found.contains("5.4.0-150-generic") && old.found.contains("5.8"), "{old:?}");
    assert_eq!(verdict(&check_kernel("")), Verdict::Warn);
}

#[test]
fn btf_is_mandatory_and_an_empty_file_is_missing() {
    let path = Path::new("/sys/kernel/btf/vmlinux");
    assert_eq!(verdict(&check_btf(path, &BtfRead::Usable { bytes: 6 << 20, missing: Vec::new() })), Verdict::Ok);
    // 5.10: the socket's cgroup member is missing; only the TCP programs need it.
    let partial =
        BtfRead::Usable { bytes: 6 << 20, missing: vec!["sock_cgroup (no member sk_cgrp_data.cgroup)".into()] };
    let finding = check_btf(path, &partial);
    assert_eq!(verdict(&finding), Verdict::Ok, "{finding:?}");
    assert!(finding.found.contains("sock_cgroup") && finding.found.contains("programs line"), "{finding:?}");
    for read in [
        BtfRead::Absent,
        BtfRead::Empty,
        BtfRead::Unreadable("permission denied".into()),
        BtfRead::Unusable("bad magic".into()),
    ] {
        let finding = check_btf(path, &read);
        assert_eq!(verdict(&finding), Verdict::Missing, "{read:?}");
        assert!(finding.found.contains("/sys/kernel/btf/vmlinux"), "{finding:?}");
        assert!(finding.fix.is_some());
    }
    assert!(check_btf(path, &BtfRead::Empty).found.contains("empty"));
}

fn seen(present: impl Fn(&str) -> Option<bool>) -> Vec<TracepointSeen> {
    TRACEPOINTS
        .iter()
        .map(|&(feature, name, kind)| TracepointSeen { feature, name, kind, present: present(name) })
        .collect()
}

#[test]
fn tracepoints_missing_turn_features_off_and_core_ones_are_fatal() {
    assert_eq!(verdict(&check_tracepoints(&seen(|_| Some(true)))), Verdict::Ok);

    let no_accept = check_tracepoints(&seen(|name| Some(!name.starts_with("sys_exit_accept"))));
    assert_eq!(verdict(&no_accept), Verdict::Warn);
    assert!(no_accept.found.contains("syscalls/sys_exit_accept4"), "{no_accept:?}");
    assert!(no_accept.fix.as_deref().is_some_and(|fix| fix.contains("tcp_accepts off")), "{no_accept:?}");

    let no_exit = check_tracepoints(&seen(|name| Some(name != names::PROG_EXIT)));
    assert_eq!(verdict(&no_exit), Verdict::Missing);
    assert!(no_exit.found.contains("tp_btf/sched_process_exit"), "{no_exit:?}");

    // tracefs not mounted: the agent mounts it at start, so it is a caveat, not a failure.
    let unmounted = check_tracepoints(&seen(|name| (!name.starts_with("sys_exit_accept")).then_some(true)));
    assert_eq!(verdict(&unmounted), Verdict::Warn);
    assert!(unmounted.found.contains("not checked"), "{unmounted:?}");
    assert!(unmounted.fix.as_deref().is_some_and(|fix| fix.contains("tracefs")), "{unmounted:?}");

    // No BTF: the BTF tracepoints cannot be told, and the btf line says why.
    let no_btf = check_tracepoints(&seen(|name| name.starts_with("sys_exit_accept").then_some(true)));
    assert_eq!(verdict(&no_btf), Verdict::Warn);
    assert!(no_btf.fix.as_deref().is_some_and(|fix| fix.contains("btf line")), "{no_btf:?}");
}

#[test]
fn program_loads_report_features_off_and_failures() {
    assert_eq!(verdict(&check_programs(&ProgramLoad::NotTried("no usable BTF".into()))), Verdict::Skip);
    assert_eq!(verdict(&check_programs(&ProgramLoad::Failed("BPF_PROG_LOAD: EPERM".into()))), Verdict::Missing);
    let all = ProgramLoad::Loaded(vec![("process_exec", None), ("process_exit", None)]);
    assert_eq!(verdict(&check_programs(&all)), Verdict::Ok);
    let some_off = check_programs(&ProgramLoad::Loaded(vec![
        ("process_exec", None),
        ("tcp_accepts", Some("kernel has no tracepoint sys_exit_accept4".into())),
    ]));
    assert_eq!(verdict(&some_off), Verdict::Warn);
    assert!(some_off.found.contains("tcp_accepts (kernel has no tracepoint"), "{some_off:?}");
}

/// CapEff of root on this machine kind: everything but CAP_SYS_RESOURCE (bit 24).
const ROOT_WITHOUT_SYS_RESOURCE: u64 = 0x0000_01ff_feff_ffff;
/// deploy/daemonset.yaml's set: BPF, PERFMON, SYS_ADMIN, SYS_PTRACE, SYSLOG, SYS_NICE.
const DAEMONSET: u64 = (1 << 39) | (1 << 38) | (1 << 34) | (1 << 23) | (1 << 21) | (1 << 19);

#[test]
fn cap_eff_is_read_from_proc_status() {
    let status = "Name:\tlifecycle-agent\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t0\n";
    assert_eq!(parse_cap_eff(status), Some(ROOT_WITHOUT_SYS_RESOURCE));
    assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    assert_eq!(parse_cap_eff("CapEff:\tnot-hex\n"), None);
}

#[test]
fn each_missing_capability_is_named() {
    assert_eq!(verdict(&check_capabilities(Some(ROOT_WITHOUT_SYS_RESOURCE))), Verdict::Ok);
    assert_eq!(verdict(&check_capabilities(Some(DAEMONSET))), Verdict::Ok);

    let none = check_capabilities(Some(0));
    assert_eq!(verdict(&none), Verdict::Missing);
    for name in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"] {
        assert!(none.found.contains(name), "{name} in {none:?}");
    }

    // Without SYS_PTRACE only that one is named.
    let no_ptrace = check_capabilities(Some(DAEMONSET & !(1 << cap::SYS_PTRACE)));
    assert_eq!(verdict(&no_ptrace), Verdict::Missing);
    assert!(no_ptrace.found.contains("CAP_SYS_PTRACE") && !no_ptrace.found.contains("CAP_BPF"), "{no_ptrace:?}");
    assert_eq!(verdict(&check_capabilities(None)), Verdict::Warn);

    // Without SYSLOG the agent runs, without the limit of OOM kills: a warning that names it.
    let no_syslog = check_capabilities(Some(DAEMONSET & !(1 << cap::SYSLOG)));
    assert_eq!(verdict(&no_syslog), Verdict::Warn);
    assert!(no_syslog.found.contains("CAP_SYSLOG"), "{no_syslog:?}");
    assert!(no_syslog.fix.as_deref().is_some_and(|fix| fix.contains("add SYSLOG ")), "{no_syslog:?}");

    // Without SYS_NICE it runs, its ring reader at the default priority: a warning naming it.
    let no_nice = check_capabilities(Some(DAEMONSET & !(1 << cap::SYS_NICE)));
    assert_eq!(verdict(&no_nice), Verdict::Warn);
    assert!(no_nice.found.contains("CAP_SYS_NICE") && !no_nice.found.contains("CAP_SYSLOG"), "{no_nice:?}");
    assert!(no_nice.fix.as_deref().is_some_and(|fix| fix.contains("add SYS_NICE ")), "{no_nice:?}");
}

// The fixture's 8 MiB limit must be below what the maps need: the default ring alone is mapped twice.
const _: () = assert!(MEMLOCK_NEEDED_BYTES > 8 << 20);

#[test]
fn memlock_matters_only_before_5_11() {
    let small = Some(Memlock { soft: 8 << 20, hard: 8 << 20 });
    let unlimited = Some(Memlock { soft: u64::MAX, hard: u64::MAX });
    let new_kernel = Some(KernelVersion { major: 6, minor: 1 });
    let old_kernel = Some(KernelVersion { major: 5, minor: 10 });
    assert_eq!(verdict(&check_memlock(new_kernel, small, false)), Verdict::Ok);
    assert_eq!(verdict(&check_memlock(old_kernel, unlimited, false)), Verdict::Ok);
    assert_eq!(verdict(&check_memlock(old_kernel, small, true)), Verdict::Ok, "aya raises it with SYS_RESOURCE");
    let stuck = check_memlock(old_kernel, small, false);
    assert_eq!(verdict(&stuck), Verdict::Missing);
    assert!(stuck.found.contains("8 MiB"), "{stuck:?}");
    assert!(stuck.fix.as_deref().is_some_and(|fix| fix.contains("SYS_RESOURCE")), "{stuck:?}");
}

const UNIFIED: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";
const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:13 - cgroup cgroup rw,cpu,cpuacct
";
const V1_ONLY: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
";

#[test]
fn cgroup_layouts_are_told_apart() {
    assert_eq!(cgroup_layout(UNIFIED), CgroupLayout::Unified { v2: "/sys/fs/cgroup".into() });
    assert_eq!(
        cgroup_layout(HYBRID),
        CgroupLayout::Hybrid {
            v2: "/sys/fs/cgroup/unified".into(),
            v1_controllers: vec!["cpu,cpuacct".into(), "memory".into(), "name=systemd".into()],
        }
    );
    assert_eq!(cgroup_layout(V1_ONLY), CgroupLayout::V1Only { v1_controllers: vec!["memory".into()] });
    assert_eq!(cgroup_layout("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), CgroupLayout::None);

    assert_eq!(verdict(&check_cgroups(&cgroup_layout(UNIFIED))), Verdict::Ok);
    let hybrid = check_cgroups(&cgroup_layout(HYBRID));
    assert_eq!(verdict(&hybrid), Verdict::Ok);
    assert!(hybrid.found.starts_with("hybrid: v2 at /sys/fs/cgroup/unified"), "{hybrid:?}");
    assert_eq!(verdict(&check_cgroups(&cgroup_layout(V1_ONLY))), Verdict::Missing);
    assert_eq!(verdict(&check_cgroups(&CgroupLayout::None)), Verdict::Missing);
}

fn socket(path: &str, origin: SocketOrigin, state: SocketState) -> SocketProbe {
    SocketProbe { path: path.into(), origin, state }
}

fn defaults_absent() -> Vec<SocketProbe> {
    let mut probes = vec![
        socket(CONTAINERD, SocketOrigin::Default, SocketState::Absent),
        socket("/var/run/crio/crio.sock", SocketOrigin::Default, SocketState::Absent),
    ];
    probes
        .extend(DISTRIBUTION_SOCKETS.iter().map(|path| socket(path, SocketOrigin::Distribution, SocketState::Absent)));
    probes
}

const CONTAINERD: &str = "/run/containerd/containerd.sock";
const K3S: &str = "/run/k3s/containerd/containerd.sock";

fn answered() -> SocketState {
    SocketState::Answered { runtime: "containerd 1.6.20, CRI v1".into() }
}

#[test]
fn the_cri_socket_the_agent_would_use_must_answer() {
    let mut probes = defaults_absent();
    probes[0].state = answered();
    let ok = check_cri(&probes);
    assert_eq!(verdict(&ok), Verdict::Ok);
    assert!(ok.found.contains("answers (containerd 1.6.20"), "{ok:?}");

    // k3s: found, but only with the flag.
    let mut probes = defaults_absent();
    probes[2].state = answered();
    let k3s = check_cri(&probes);
    assert_eq!(verdict(&k3s), Verdict::Missing);
    assert!(k3s.fix.as_deref().is_some_and(|fix| fix.contains(&format!("--cri-socket {K3S}"))), "{k3s:?}");

    // A plain host: nothing at all is a caveat.
    let nothing = check_cri(&defaults_absent());
    assert_eq!(verdict(&nothing), Verdict::Warn);
    assert!(nothing.found.starts_with("none of /run/containerd/containerd.sock"), "{nothing:?}");

    // A stale socket of the default runtime.
    let mut probes = defaults_absent();
    probes[0].state = SocketState::Failed("connection refused".into());
    assert_eq!(verdict(&check_cri(&probes)), Verdict::Missing);

    // A directory this process cannot search (no CAP_DAC_OVERRIDE): said so, not "not serving".
    let mut probes = defaults_absent();
    probes[0].state = SocketState::NoAccess("permission denied".into());
    let hidden = check_cri(&probes);
    assert_eq!(verdict(&hidden), Verdict::Missing);
    assert!(hidden.found.contains("cannot be looked at: permission denied"), "{hidden:?}");
    assert!(hidden.fix.as_deref().is_some_and(|fix| fix.contains("run doctor as the agent runs")), "{hidden:?}");

    // The flag's socket alone decides.
    assert_eq!(verdict(&check_cri(&[socket(K3S, SocketOrigin::Flag, answered())])), Verdict::Ok);
    assert_eq!(verdict(&check_cri(&[socket(K3S, SocketOrigin::Flag, SocketState::Absent)])), Verdict::Missing);
}

#[test]
fn the_api_is_skipped_without_credentials_and_denials_are_named() {
    assert_eq!(verdict(&check_kubernetes(&ApiReach::NotConfigured)), Verdict::Skip);
    let failed = ApiReach::Failed { node: "n1".into(), why: "403 forbidden".into() };
    assert_eq!(verdict(&check_kubernetes(&failed)), Verdict::Missing);

    let all_allowed =
        ApiReach::Reached { node: "n1".into(), answers: PERMISSIONS.iter().map(|&p| (p, Ok(true))).collect() };
    let ok = check_kubernetes(&all_allowed);
    assert_eq!(verdict(&ok), Verdict::Ok);
    assert!(ok.found.contains("create tokenreviews.authentication.k8s.io"), "{ok:?}");

    let answers = PERMISSIONS
        .iter()
        .map(|&p| match p.resource {
            "events" => (p, Ok(false)),
            "subjectaccessreviews" => (p, Err("timeout".to_owned())),
            _ => (p, Ok(true)),
        })
        .collect();
    let partial = check_kubernetes(&ApiReach::Reached { node: "n1".into(), answers });
    assert_eq!(verdict(&partial), Verdict::Missing);
    assert!(partial.found.contains("denied: list events, watch events, create events.events.k8s.io"), "{partial:?}");
    assert!(partial.found.contains("could not ask: create subjectaccessreviews"), "{partial:?}");
    assert!(!partial.found.contains("denied: list pods"), "{partial:?}");
}

#[test]
fn ports_held_by_others_are_missing_and_by_the_agent_fine() {
    let listen: SocketAddr = "127.0.0.1:9890".parse().expect("address");
    assert_eq!(verdict(&check_port(PortRole::Listen, listen, &PortState::Free)), Verdict::Ok);
    let agent = PortState::InUse(Some(Holder { pid: 42, command: "lifecycle-agent".into() }));
    assert_eq!(verdict(&check_port(PortRole::Listen, listen, &agent)), Verdict::Ok);
    let nginx =
        check_port(PortRole::Listen, listen, &PortState::InUse(Some(Holder { pid: 7, command: "nginx".into() })));
    assert_eq!(verdict(&nginx), Verdict::Missing);
    assert!(nginx.found.contains("nginx (pid 7)"), "{nginx:?}");
    assert!(nginx.fix.as_deref().is_some_and(|fix| fix.contains("--listen")), "{nginx:?}");
    assert_eq!(verdict(&check_port(PortRole::Health, listen, &PortState::InUse(None))), Verdict::Missing);
    // The pod probe port lives in the pods' namespaces: taken here is a caveat.
    let probe: SocketAddr = "0.0.0.0:9891".parse().expect("address");
    assert_eq!(verdict(&check_port(PortRole::PodProbe, probe, &PortState::InUse(None))), Verdict::Warn);
    assert_eq!(
        verdict(&check_port(PortRole::Listen, listen, &PortState::Unusable("cannot assign".into()))),
        Verdict::Missing
    );
}

#[test]
fn listening_sockets_are_found_in_proc_net_tcp() {
    let table = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:26A2 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0
   1: 0100007F:26A2 0100007F:D1A4 01 00000000:00000000 00:00000000 00000000     0        0 40000 1 0
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0
";
    assert_eq!(listening_inodes(table, 9890), vec![31337], "the established connection is not a listener");
    assert_eq!(listening_inodes(table, 22), vec![1234]);
    assert!(listening_inodes(table, 9891).is_empty());
}

#[test]
fn clocks_agree_with_the_kernels_boot_time() {
    let boot_ns = 3_600 * 1_000_000_000;
    let realtime_ns = 1_800_000_000 * 1_000_000_000;
    let booted = 1_800_000_000 - 3_600;
    assert_eq!(verdict(&check_clock(boot_ns, realtime_ns, Some(booted))), Verdict::Ok);
    assert_eq!(verdict(&check_clock(boot_ns, realtime_ns, Some(booted + 1))), Verdict::Ok, "btime rounds");
    let jumped = check_clock(boot_ns, realtime_ns, Some(booted - 600));
    assert_eq!(verdict(&jumped), Verdict::Warn);
    assert_eq!(verdict(&check_clock(boot_ns, 5 * 1_000_000_000, None)), Verdict::Missing, "1970");
    assert_eq!(verdict(&check_clock(boot_ns, realtime_ns, None)), Verdict::Ok);
}

#[test]
fn an_unsynchronised_clock_is_a_warning() {
    assert_eq!(verdict(&check_clock_sync(&ClockSync::Synchronised { max_error_us: 16_000 })), Verdict::Ok);
    assert_eq!(verdict(&check_clock_sync(&ClockSync::Unsynchronised)), Verdict::Warn);
    assert_eq!(verdict(&check_clock_sync(&ClockSync::Unknown("EPERM".into()))), Verdict::Warn);
}

#[test]
fn the_report_is_ready_unless_something_is_missing() {
    let warn_only = Report::new(vec![
        Finding::ok("kernel", "Linux 6.18"),
        Finding::warn("clock-sync", "not synchronised", "run NTP"),
        Finding::skip("kubernetes", "no API configured"),
    ]);
    assert!(warn_only.ready);
    let text = render_text(&warn_only);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "ok       kernel      Linux 6.18");
    assert_eq!(lines[1], "warn     clock-sync  not synchronised  -> run NTP");
    assert_eq!(lines[2], "skip     kubernetes  no API configured");
    assert!(lines[3].starts_with("ready:"), "{text}");

    let missing = Report::new(vec![Finding::missing("btf", "/sys/kernel/btf/vmlinux is empty", "use a BTF kernel")]);
    assert!(!missing.ready);
    assert!(render_text(&missing).lines().last().is_some_and(|line| line.starts_with("not ready: 1")));
    let json = serde_json::to_value(&missing).expect("json");
    assert_eq!(json["ready"], false);
    assert_eq!(json["checks"][0]["result"], "missing");
    assert_eq!(json["checks"][0]["check"], "btf");
}

/// A kubelet as `doctor` would read it: release `v1.<minor>.2` (None: the Node object was not
/// read), its configuration capping the back-off at `cap` (None: the files were not readable).
fn kubelet_policy(minor: Option<u32>, cap: Option<Option<&str>>, source: KubeletSource) -> KubeletPolicy {
    use crate::model::kubelet::{config, CommandLine, KubeletFacts, KubeletOverrides, KubeletVersion};
    let config = cap.map(|cap| {
        let line =
            CommandLine { feature_gates: [("ContainerStopSignals".to_owned(), true)].into(), ..CommandLine::default() };
        let mut effective = config::effective(None, &[], &line).expect("valid");
        effective.max_container_restart_period_ns = cap.map(|c| config::go_duration_ns(c).expect("duration"));
        effective
    });
    let facts = KubeletFacts {
        source,
        pid: Some(812),
        version: minor.map(|minor| KubeletVersion::new(1, minor, 2)),
        config,
        origin: "pid 812: /var/lib/kubelet/config.yaml + flags".into(),
    };
    KubeletPolicy::derive(facts, KubeletOverrides::default())
}

#[test]
fn the_kubelet_line_says_release_cap_gates_and_source() {
    let read = check_kubelet(&kubelet_policy(Some(37), Some(Some("20s")), KubeletSource::Node), true);
    assert_eq!(verdict(&read), Verdict::Ok, "{read:?}");
    for said in [
        "v1.37.2 (Node object)",
        "back-off 10s doubling to 20s (crashLoopBackOff.maxContainerRestartPeriod 20s)",
        "KubeletCrashLoopBackOffMax=on (release default)",
        "ContainerStopSignals=on (configured)",
        "ReduceDefaultCrashLoopBackOffDecay=off (release default)",
        "read from node (pid 812: /var/lib/kubelet/config.yaml + flags)",
    ] {
        assert!(read.found.contains(said), "{said:?} not in {:?}", read.found);
    }
    // The release unknown (no `get nodes`): a cap cannot be judged by.
    let blind = check_kubelet(&kubelet_policy(None, Some(Some("20s")), KubeletSource::Node), true);
    assert_eq!(verdict(&blind), Verdict::Warn);
    assert!(blind.found.contains("release unknown") && blind.found.contains("not judged"), "{blind:?}");
    assert!(blind.fix.as_deref().is_some_and(|fix| fix.contains("get nodes")), "{blind:?}");
    // Without a cap every release agrees: judged, but the release is still worth having.
    let uncapped = check_kubelet(&kubelet_policy(None, Some(None), KubeletSource::Node), true);
    assert_eq!(verdict(&uncapped), Verdict::Warn);
    assert!(uncapped
        .found
        .contains("back-off 10s doubling to 300s (crashLoopBackOff.maxContainerRestartPeriod not set)"));
    // No kubelet process visible: hostPID.
    let hidden = check_kubelet(&kubelet_policy(Some(37), None, KubeletSource::NotFound), true);
    assert_eq!(verdict(&hidden), Verdict::Warn);
    assert!(hidden.fix.as_deref().is_some_and(|fix| fix.contains("hostPID")), "{hidden:?}");
    // A plain host.
    assert_eq!(verdict(&check_kubelet(&kubelet_policy(None, None, KubeletSource::NotFound), false)), Verdict::Skip);
}
