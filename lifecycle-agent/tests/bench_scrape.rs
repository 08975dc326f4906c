//! Benchmark (`#[ignore]`d; `xtask/x.sh bench scrape`): `/metrics` of an agent tracking 1,000
//! containers, served by the agent's own HTTP stack and registry, scraped by a client. The
//! containers are synthetic (the tracker is fed the events a node would produce), the rest is the
//! production path: collector, encoder, hyper.
//!
//! The agent writes a unit's text again only when something it says changed, so the run scrapes
//! with none, a tenth and all of the containers' kernel counters moving between scrapes. "All"
//! is the cost of writing every container each time (what every scrape cost before the texts were
//! kept), the baseline the others are compared with.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use lifecycle_agent::{
    agent::http::{self, Routes},
    export::metrics::{Metrics, TextSource},
    export::units::{KernelCounters, LiveCounters, UnitMetrics},
    model::event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
    model::metadata::{ContainerMeta, ContainerType, KubeletAnnotations},
    model::node::{Judgement, NodeTracker, Outcome, TrackerConfig},
    model::time::BootTime,
};
use lifecycle_common::CgroupCounters;

/// The kernel's counters of the bench's cgroups; on each read, the cgroups of the moving share
/// count one more exec than on the read before.
struct FakeKernel {
    cgroups: Vec<u64>,
    reads: AtomicU64,
    moving_per_mille: AtomicU64,
}

impl KernelCounters for FakeKernel {
    fn read_all(&self, into: &mut LiveCounters) {
        let read = self.reads.fetch_add(1, Ordering::Relaxed);
        let moving = self.moving_per_mille.load(Ordering::Relaxed);
        for &id in &self.cgroups {
            let execs = if id.wrapping_mul(7919) % 1000 < moving { id % 17 + read } else { id % 17 };
            into.insert(id, CgroupCounters { execs, process_exits: id % 13, ..Default::default() });
        }
    }
}

/// The floor's source: the same text every scrape, written once.
struct Floor(String);

impl TextSource for Floor {
    fn write(&self, out: &mut String) {
        out.push_str(&self.0);
    }
}

fn event(time: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
    Event { at: BootTime::from_ns(time), pid: tgid, tgid, cgroup_id, detail }
}

/// A node with `n` containers: each ran once, exited with a varying code, restarted, received a
/// stop signal and listens on a port.
/// The tracker of a node running `n` pods, and the terminations judged on the way (the agent
/// routes them into the distributions; so does the bench).
fn node(n: u64) -> (NodeTracker, Vec<Judgement>) {
    let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    let mut outcome = Outcome::default();
    let mut metas = Vec::new();
    for i in 0..n {
        let uid = format!("00000000-0000-0000-0000-{i:012x}");
        for attempt in 0..2u64 {
            let id = format!("{:064x}", i * 2 + attempt);
            let (sandbox, pod, namespace) = (format!("sandbox-{i}"), format!("pod-{i}"), format!("ns-{}", i % 20));
            metas.push(ContainerMeta {
                attempt: attempt as u32,
                kubelet: KubeletAnnotations {
                    restart_count: Some(attempt as u32),
                    container_type: Some(ContainerType::Regular),
                    spec_hash: Some(1),
                    termination_grace_period_ns: Some(30_000_000_000),
                    ..KubeletAnnotations::default()
                },
                ..ContainerMeta::running(id, sandbox, &namespace, &pod, &uid, "app")
            });
        }
    }
    outcome.extend(tracker.set_metadata(metas));
    let second = 1_000_000_000u64;
    for i in 0..n {
        let uid = format!("00000000-0000-0000-0000-{i:012x}");
        for attempt in 0..2u64 {
            let cgroup = 10_000 + i * 2 + attempt;
            let path = format!("/kubepods/burstable/pod{uid}/{:064x}", i * 2 + attempt);
            let t = attempt * 20 * second + i;
            let pid = (100_000 + i * 2 + attempt) as u32;
            outcome.extend(tracker.apply(&event(
                t,
                1,
                1,
                Detail::CgroupMkdir(CgroupDetail { id: cgroup, path, truncated: false }),
            )));
            let exec = Detail::Exec {
                parent_tgid: 1,
                parent_cgroup_id: 1,
                namespace_init: true,
                child_pid_namespace: true,
                started: BootTime::from_ns(t + 1),
                comm: "app".into(),
            };
            outcome.extend(tracker.apply(&event(t + 1, pid, cgroup, exec)));
            let tcp =
                TcpDetail { socket_cgroup_id: cgroup, netns: 1, family: 2, local_port: 8080, remote_port: 0, fd: None };
            outcome.extend(tracker.apply(&event(t + 2, pid, cgroup, Detail::TcpListen(tcp))));
            let signal = Detail::Signal {
                signal: 15,
                result: SignalResult::Delivered,
                group: true,
                target_pid: pid,
                target_tgid: pid,
                target_cgroup_id: cgroup,
                sender_comm: "containerd-shim".into(),
                target_comm: "app".into(),
                from_kernel: false,
            };
            outcome.extend(tracker.apply(&event(t + second, 7, 7, signal)));
            if attempt == 0 {
                let exit = Detail::Exit {
                    exit_status: Some((i % 3) as u8),
                    signal: None,
                    core_dumped: false,
                    group_dead: true,
                    parent_tgid: 1,
                    started: BootTime::from_ns(t + 1),
                    cpu_time: Duration::from_nanos(1),
                    comm: "app".into(),
                };
                outcome.extend(tracker.apply(&event(t + 2 * second, pid, cgroup, exit)));
            }
        }
    }
    (tracker, outcome.judgements)
}

fn scrape(addr: &str) -> usize {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("request");
    let mut body = Vec::new();
    stream.read_to_end(&mut body).expect("response");
    body.len()
}

/// A condition of the run: how many containers' counters move between scrapes, or the floor.
#[derive(Clone, Copy)]
enum Condition {
    Moving {
        per_mille: u64,
    },
    /// The same body, written once, served through the same HTTP stack: what any scrape costs.
    Floor,
}

/// Serves `metrics` on a fresh loopback port of `runtime`; the address.
fn serve(runtime: &tokio::runtime::Runtime, metrics: Metrics, stop: tokio::sync::watch::Receiver<bool>) -> String {
    let listener = runtime.block_on(http::bind("127.0.0.1:0".parse().expect("addr"))).expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    runtime.spawn(http::serve(
        listener,
        Arc::new(Routes {
            metrics,
            api: None,
            gate: None,
            health: None,
            probe_sources: None,
            tls: None,
            rejections: None,
        }),
        stop,
    ));
    addr
}

#[test]
#[ignore = "benchmark: run with xtask/x.sh bench scrape"]
fn scrape_of_a_thousand_containers() {
    let containers: u64 = std::env::var("LIFECYCLE_BENCH_CONTAINERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let scrapes: usize = std::env::var("LIFECYCLE_BENCH_SCRAPES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let (tracker, judgements) = node(containers);
    assert_eq!(tracker.units().count() as u64, containers);
    // The snapshot the model's owner would publish; its channel's sender is not needed after.
    let snapshots = tokio::sync::watch::Sender::new(Arc::new(tracker.snapshot())).subscribe();
    let kernel = Arc::new(FakeKernel {
        cgroups: (0..containers * 2).map(|i| 10_000 + i).collect(),
        reads: AtomicU64::new(0),
        moving_per_mille: AtomicU64::new(0),
    });
    let units = Arc::new(UnitMetrics::new(
        snapshots,
        kernel.clone(),
        Box::new(lifecycle_agent::discovery::clock::unix_minus_boot_seconds),
    ));
    units.record_judgements(judgements);
    let mut written_once = String::new();
    units.render(&mut written_once);
    let mut metrics = Metrics::bare();
    metrics.add_text_source(Box::new(units));
    let mut floor = Metrics::bare();
    floor.add_text_source(Box::new(Floor(written_once)));

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let (tx, rx) = tokio::sync::watch::channel(false);
    let addr = serve(&runtime, metrics, rx.clone());
    let floor_addr = serve(&runtime, floor, rx);
    let size = scrape(&addr);
    if let Ok(path) = std::env::var("LIFECYCLE_BENCH_DUMP") {
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("request");
        let mut body = Vec::new();
        stream.read_to_end(&mut body).expect("response");
        let text = String::from_utf8_lossy(&body);
        let body = text.split_once("\r\n\r\n").map_or(text.as_ref(), |(_, b)| b);
        std::fs::write(path, body).expect("dump");
    }
    let conditions = [
        Condition::Moving { per_mille: 1000 },
        Condition::Moving { per_mille: 100 },
        Condition::Moving { per_mille: 0 },
        Condition::Floor,
    ];
    let mut times: Vec<Vec<f64>> = conditions.iter().map(|_| Vec::with_capacity(scrapes)).collect();
    // Interleaved rounds, so a noisy moment of the shared machine falls on every condition.
    let rounds = 10;
    for _ in 0..rounds {
        for (condition, times) in conditions.iter().zip(&mut times) {
            let target = match condition {
                Condition::Moving { per_mille } => {
                    kernel.moving_per_mille.store(*per_mille, Ordering::Relaxed);
                    // The first scrape writes what the previous condition left changed.
                    scrape(&addr);
                    &addr
                }
                Condition::Floor => &floor_addr,
            };
            for _ in 0..scrapes / rounds {
                let began = Instant::now();
                assert!(scrape(target) > size / 2, "every scrape returns the whole body");
                times.push(began.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let _ = tx.send(true);
    for times in &mut times {
        times.sort_by(f64::total_cmp);
    }
    let at = |times: &[f64], p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize];
    let baseline = at(&times[0], 0.99);
    println!("\n| containers | condition | scrapes | body | p50 | p90 | p99 | max | p99 vs all moving |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (condition, times) in conditions.iter().zip(&times) {
        let name = match condition {
            Condition::Moving { per_mille } => format!("{:.0} % of counters moving", *per_mille as f64 / 10.0),
            Condition::Floor => "floor: the same body written once".into(),
        };
        println!(
            "| {containers} | {name} | {} | {:.0} KiB | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} |",
            times.len(),
            size as f64 / 1024.0,
            at(times, 0.5),
            at(times, 0.9),
            at(times, 0.99),
            times[times.len() - 1],
            at(times, 0.99) / baseline,
        );
    }
    let typical = at(&times[1], 0.99);
    println!("\ntarget p99 <= 5 ms with a tenth moving: {}", if typical <= 5.0 { "met" } else { "NOT met" });
}
