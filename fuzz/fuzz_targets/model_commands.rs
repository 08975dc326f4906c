//! The node model driven through its one door, `NodeTracker::handle`, by arbitrary sequences of
//! commands over a small node (8 cgroups: 4 containers of 2 pods and 4 host units, 16 pids, 2
//! ports, 2 netns), so that the input's bytes pick interactions, not names.
//!
//! Properties: no command panics, whatever came before; each stop is judged once (no two kept
//! stops of one container instance with the same exit, every command's time being later than
//! the last); the bounds hold (kept stops, ports per unit, departed units after an expiry).

#![no_main]

use std::{
    collections::{BTreeSet, HashSet},
    time::Duration,
};

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::model::{
    container_state::RestartPolicy,
    event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
    metadata::{ContainerMeta, KubeletAnnotations},
    node::{
        Command, FoundCgroup, FoundProcess, NodeTracker, ProbeKey, ProbeSample, ProbeWatch, ResyncLook, TrackerConfig,
        MAX_DEPARTED_UNITS, MAX_HISTORY_STOPS, MAX_PORTS_PER_UNIT,
    },
    oom::KernelOomKill,
    probe::{ProcessSample, ProcessState},
    spec::{ContainerFacts, ContainerKind, KillNotice, PodFacts, PodRef, StopCause},
    time::{BootTime, SECOND},
};

const PODS: [&str; 2] = ["00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"];
const CONTAINERS: [&str; 2] = ["app", "sidecar"];

/// The input's bytes, read one at a time (zeros once it runs out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        first
    }

    fn below(&mut self, n: u8) -> u8 {
        self.next() % n
    }

    fn flag(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Cgroup `id` (1..=8): 1-4 containers of the two pods, 5-8 host units.
fn cgroup_path(id: u64) -> String {
    if id <= 4 {
        format!("/kubepods/burstable/pod{}/{}", PODS[(id % 2) as usize], container_id(id))
    } else {
        format!("/system.slice/unit{id}.service")
    }
}

fn container_id(id: u64) -> String {
    format!("{id:064x}")
}

fn meta(id: u64, container: &str, grace_s: u8) -> ContainerMeta {
    let pod = (id % 2) as usize;
    let (sandbox, name) = (format!("sandbox-{pod}"), format!("pod-{pod}"));
    ContainerMeta {
        kubelet: KubeletAnnotations {
            termination_grace_period_ns: Some(u64::from(grace_s) * SECOND),
            ..KubeletAnnotations::default()
        },
        ..ContainerMeta::running(container_id(id), sandbox, "fuzz", &name, PODS[pod], container)
    }
}

fn pod_facts(pod: usize, bytes: &mut Bytes) -> PodFacts {
    let restart_policy =
        [RestartPolicy::Always, RestartPolicy::OnFailure, RestartPolicy::Never][usize::from(bytes.below(3))];
    PodFacts {
        uid: PODS[pod].into(),
        namespace: "fuzz".into(),
        name: format!("pod-{pod}"),
        restart_policy,
        grace_ns: Some(u64::from(bytes.below(40)) * SECOND),
        deletion_grace_ns: bytes.flag().then(|| u64::from(bytes.below(40)) * SECOND),
        disruption: None,
        restarting_all_containers: false,
        priority: None,
        containers: CONTAINERS
            .iter()
            .map(|name| ContainerFacts {
                name: (*name).into(),
                kind: ContainerKind::Regular,
                restart: Default::default(),
                stop_signal: None,
                pre_stop: None,
                liveness_grace_ns: None,
                startup_grace_ns: None,
                http_probes: Vec::new(),
            })
            .collect(),
        reported_phase: None,
        reported: Vec::new(),
        reported_status: Default::default(),
    }
}

fn pod_ref(bytes: &mut Bytes) -> PodRef {
    let pod = usize::from(bytes.below(2));
    // Now and then a uid of this node's pod under another name (a forged Event).
    let name = if bytes.below(4) == 0 { "forged".to_owned() } else { format!("pod-{pod}") };
    PodRef { uid: PODS[pod].into(), namespace: "fuzz".into(), name }
}

fn tcp(bytes: &mut Bytes, cgroup_id: u64) -> TcpDetail {
    TcpDetail {
        socket_cgroup_id: cgroup_id,
        netns: 100 + u32::from(bytes.below(2)),
        family: 2,
        local_port: 8080 + u16::from(bytes.below(40)),
        remote_port: 0,
        fd: None,
    }
}

/// The next command, at `time` (ns), picked by the input.
fn command(bytes: &mut Bytes, time: u64) -> Command {
    let cgroup_id = 1 + u64::from(bytes.below(8));
    let pid = 100 + u32::from(bytes.below(16));
    let at = BootTime::from_ns(time);
    let event = |detail| Command::Event(Event { at, pid, tgid: pid, cgroup_id, detail });
    match bytes.below(20) {
        0 | 1 => Command::Event(Event {
            at,
            pid: 1,
            tgid: 1,
            cgroup_id: 1,
            detail: Detail::CgroupMkdir(CgroupDetail { id: cgroup_id, path: cgroup_path(cgroup_id), truncated: false }),
        }),
        2 => Command::Event(Event {
            at,
            pid: 1,
            tgid: 1,
            cgroup_id: 1,
            detail: Detail::CgroupRmdir(CgroupDetail { id: cgroup_id, path: cgroup_path(cgroup_id), truncated: false }),
        }),
        3 | 4 => event(Detail::Exec {
            parent_tgid: if bytes.flag() { 1 } else { 100 + u32::from(bytes.below(16)) },
            parent_cgroup_id: if bytes.flag() { 0 } else { cgroup_id },
            namespace_init: bytes.flag(),
            child_pid_namespace: cgroup_id <= 4,
            started: at,
            comm: "proc".into(),
        }),
        5 | 6 => event(Detail::Exit {
            exit_status: (!bytes.flag()).then(|| bytes.next()),
            signal: bytes.flag().then(|| [9, 15, 6][usize::from(bytes.below(3))]),
            core_dumped: false,
            group_dead: bytes.below(4) != 0,
            parent_tgid: 1,
            started: BootTime::from_ns(time.saturating_sub(u64::from(bytes.next()) * SECOND)),
            cpu_time: Duration::from_nanos(1),
            comm: "proc".into(),
        }),
        7 => {
            let target = 100 + u32::from(bytes.below(16));
            event(Detail::Signal {
                signal: [9, 15, 2, 10][usize::from(bytes.below(4))],
                result: SignalResult::Delivered,
                group: true,
                target_pid: target,
                target_tgid: target,
                target_cgroup_id: 1 + u64::from(bytes.below(8)),
                sender_comm: if bytes.flag() { "kubelet".into() } else { "containerd-shim".into() },
                target_comm: "proc".into(),
                from_kernel: bytes.below(8) == 0,
            })
        }
        8 => event(Detail::OomVictim {
            victim_pid: pid,
            victim_tgid: pid,
            victim_cgroup_id: cgroup_id,
            victim_comm: "proc".into(),
        }),
        9 => {
            let socket = tcp(bytes, cgroup_id);
            event(match bytes.below(4) {
                0 => Detail::TcpListen(socket),
                1 => Detail::TcpListenClose(socket),
                2 => Detail::TcpEstablished(socket),
                _ => Detail::TcpAccept(socket),
            })
        }
        10 => {
            // The runtime lists some of the container cgroups, each as one of the two containers.
            let mut listed = Vec::new();
            for id in 1..=4u64 {
                if bytes.flag() {
                    listed.push(meta(id, CONTAINERS[usize::from(bytes.below(2))], bytes.below(40)));
                }
            }
            if bytes.below(4) == 0 {
                Command::RuntimeUnreachable
            } else {
                Command::RuntimeListed { containers: listed }
            }
        }
        11 => {
            let pod = usize::from(bytes.below(2));
            match bytes.below(6) {
                0 => Command::PodGone(pod_facts(pod, bytes)),
                1 => Command::PodForgotten { uid: PODS[pod].into() },
                2 => Command::PodsListed { listed: bytes.flag().then(|| vec![PODS[pod].into()]) },
                3 => Command::ApiUnreachable,
                4 => Command::ApiConfigured,
                _ => Command::Pod(pod_facts(pod, bytes)),
            }
        }
        12 => match bytes.below(3) {
            0 => Command::KillNotice(KillNotice {
                pod: pod_ref(bytes),
                container: CONTAINERS[usize::from(bytes.below(2))].into(),
                cause: StopCause::ALL[usize::from(bytes.next()) % StopCause::ALL.len()],
            }),
            1 => Command::EvictionNotice(pod_ref(bytes)),
            _ => Command::FlushWarnings,
        },
        13 => Command::OomLog(KernelOomKill {
            pid,
            comm: "proc".into(),
            oom_memcg: bytes.flag().then(|| cgroup_path(cgroup_id)),
            task_memcg: cgroup_path(cgroup_id),
        }),
        14 => Command::Expire { retention: Duration::from_secs(u64::from(bytes.next())) },
        15 | 16 => {
            let key = ProbeKey {
                uid: PODS[usize::from(bytes.below(2))].into(),
                container: CONTAINERS[usize::from(bytes.below(2))].into(),
            };
            match bytes.below(3) {
                0 => Command::WatchProbe {
                    key,
                    watch: ProbeWatch {
                        netns: 100 + u32::from(bytes.below(2)),
                        main_pid: pid,
                        since_ns: time,
                        ports: BTreeSet::from([8080 + u16::from(bytes.below(4))]),
                    },
                    first: None,
                },
                1 => Command::UnwatchProbe { key },
                _ => Command::SampleProbe {
                    key,
                    sample: ProbeSample {
                        at_ns: time,
                        process: bytes.flag().then(|| ProcessSample {
                            state: if bytes.flag() { ProcessState::Running } else { ProcessState::Zombie },
                            start_ticks: u64::from(bytes.below(4)),
                        }),
                        listeners: None,
                    },
                },
            }
        }
        17 => {
            // A look at the node after lost records: some cgroups on disk, some processes.
            let cgroups =
                (1..=8u64).filter(|_| bytes.flag()).map(|id| FoundCgroup { id, path: cgroup_path(id) }).collect();
            let processes = (0..bytes.below(4))
                .map(|_| FoundProcess {
                    tgid: 100 + u32::from(bytes.below(16)),
                    ppid: 1,
                    cgroup_id: 1 + u64::from(bytes.below(8)),
                    child_pid_namespace: false,
                    started_at: BootTime::from_ns(time.saturating_sub(SECOND)),
                    comm: "found".into(),
                    zombie: bytes.below(4) == 0,
                })
                .collect();
            Command::Resync(ResyncLook {
                cgroups,
                processes,
                start_tolerance: Duration::from_millis(20),
                departing: Vec::new(),
            })
        }
        18 => Command::Rescan {
            cgroups: (1..=8u64).filter(|_| bytes.flag()).map(|id| FoundCgroup { id, path: cgroup_path(id) }).collect(),
        },
        _ => Command::DepartingCounters { cgroup_id, counters: Default::default() },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    // Every command is later than the last: two stops of one instance never share an exit time.
    let mut time = SECOND;
    let mut commands = 0;
    while !bytes.0.is_empty() && commands < 512 {
        time += u64::from(bytes.next()) * 10_000_000 + 1;
        let command = command(&mut bytes, time);
        let expired = matches!(command, Command::Expire { .. });
        let _ = tracker.handle(command, BootTime::from_ns(time));
        commands += 1;
        let snapshot = tracker.snapshot();
        let stops = snapshot.recent_stops(usize::MAX);
        assert!(stops.len() <= MAX_HISTORY_STOPS, "{} stops kept", stops.len());
        let mut judged = HashSet::new();
        for stop in &stops {
            let instance = (&stop.uid, &stop.container, &stop.container_id, stop.last_termination.exit_time);
            assert!(judged.insert(instance), "a stop judged twice: {instance:?}");
        }
        for unit in snapshot.units() {
            assert!(unit.tcp().len() <= MAX_PORTS_PER_UNIT, "{} ports", unit.tcp().len());
        }
        if expired {
            assert!(snapshot.units().count() <= MAX_DEPARTED_UNITS + 8, "departed units beyond the bound");
        }
    }
});
