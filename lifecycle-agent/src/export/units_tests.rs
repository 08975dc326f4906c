//! Tests of the per-container metrics: the signals the kernel only counted, and the kept texts.

use super::*;
use crate::model::event::{CgroupDetail, Detail, Event, SignalResult};
use crate::model::node::{NodeTracker, TrackerConfig};
use crate::model::time::BootTime;
use lifecycle_testkit::fixtures::{main_exec, main_exit};

/// The channel a tracker's snapshots are published on, as the model's owner does.
fn publisher(tracker: &NodeTracker) -> watch::Sender<Arc<NodeSnapshot>> {
    watch::Sender::new(Arc::new(tracker.snapshot()))
}

/// The kernel's counts for the one cgroup of the test: 7 SIGUSR1 (10) and 3 SIGURG (23)
/// sent inside it and not recorded.
struct Kernel;

impl KernelCounters for Kernel {
    fn read_all(&self, into: &mut LiveCounters) {
        let mut counters = CgroupCounters::default();
        counters.unrecorded_signals[10] = 7;
        counters.unrecorded_signals[23] = 3;
        into.insert(50, counters);
    }
}

fn event(time: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
    Event { at: BootTime::from_ns(time), pid: tgid, tgid, cgroup_id, detail }
}

/// The cgroup `/system.slice/<name>.service` appears (1 ns) and `pid` starts in it (2 ns).
fn start_host_unit(tracker: &mut NodeTracker, cgroup: u64, pid: u32, name: &str) {
    let mkdir = CgroupDetail { id: cgroup, path: format!("/system.slice/{name}.service"), truncated: false };
    tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(mkdir)));
    let exec = Detail::Exec {
        parent_tgid: 1,
        parent_cgroup_id: 1,
        namespace_init: false,
        child_pid_namespace: false,
        started: BootTime::from_ns(2),
        comm: name.into(),
    };
    tracker.apply(&event(2, pid, cgroup, exec));
}

#[test]
fn signals_only_counted_in_the_kernel_join_the_recorded_ones_from_the_same_container() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    let (cgroup, pid) = (50, 500);
    start_host_unit(&mut tracker, cgroup, pid, "app");
    // One SIGUSR1 the kernel recorded (the target had no handler yet), and one from outside.
    for (sender, sender_cgroup) in [(pid, cgroup), (7, 1)] {
        let signal = Detail::Signal {
            signal: 10,
            result: SignalResult::Delivered,
            group: true,
            target_pid: pid,
            target_tgid: pid,
            target_cgroup_id: cgroup,
            sender_comm: "app".into(),
            target_comm: "app".into(),
            from_kernel: false,
        };
        tracker.apply(&event(3, sender, sender_cgroup, signal));
    }
    let units = UnitMetrics::new(publisher(&tracker).subscribe(), Arc::new(Kernel), Box::new(|| 0.0));
    let mut text = String::new();
    units.scrape_into(&mut text);
    let signals: Vec<&str> = text.lines().filter(|l| l.starts_with("lifecycle_signals_received_total{")).collect();
    let value = |signal: &str, sender: &str| {
        let wanted = format!("signal=\"{signal}\",sender=\"{sender}\"");
        let lines: Vec<&&str> = signals.iter().filter(|l| l.contains(&wanted)).collect();
        assert_eq!(lines.len(), 1, "one series for {wanted} in {signals:#?}");
        lines[0].rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("value")
    };
    assert_eq!(value("10", "same_container"), 8.0);
    assert_eq!(value("10", "other_process"), 1.0);
    assert_eq!(value("23", "same_container"), 3.0);
    assert_eq!(signals.len(), 3, "{signals:#?}");
}

/// Counters the test changes between scrapes.
#[derive(Default)]
struct Changing(Mutex<HashMap<u64, CgroupCounters>>);

impl KernelCounters for Changing {
    fn read_all(&self, into: &mut LiveCounters) {
        for (cgroup_id, counters) in self.0.lock().iter() {
            into.insert(*cgroup_id, *counters);
        }
    }
}

/// The per-container lines of a scrape (the histograms are per namespace and fed once).
fn unit_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("lifecycle_termination_"))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_scrape_shows_every_change_since_the_last_and_keeps_nothing_stale() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    for (cgroup, pid, name) in [(50, 500, "a"), (51, 510, "b"), (52, 520, "c")] {
        start_host_unit(&mut tracker, cgroup, pid, name);
    }
    let published = publisher(&tracker);
    let kernel = Arc::new(Changing::default());
    let metrics = |kernel: Arc<Changing>| UnitMetrics::new(published.subscribe(), kernel, Box::new(|| 1_700_000_000.0));
    let cached = metrics(kernel.clone());
    let scrape = |m: &UnitMetrics| {
        let mut text = String::new();
        m.scrape_into(&mut text);
        text
    };
    let first = scrape(&cached);
    assert_eq!(first.matches("lifecycle_container_state{").count(), 3 * 3, "{first}");

    // a exits 3; b's kernel counters move; c's cgroup goes and its unit expires.
    let exit = main_exit(3, "a");
    kernel.0.lock().insert(51, CgroupCounters { execs: 4, ..Default::default() });
    tracker.apply(&event(3_000_000_000, 500, 50, exit));
    let rmdir = CgroupDetail { id: 52, path: "/system.slice/c.service".into(), truncated: false };
    tracker.apply(&event(3_000_000_001, 520, 52, Detail::CgroupRmdir(rmdir)));
    // c changed last at 2 ns, a at 3 s: a retention of 7 s at 9 s keeps a only.
    tracker.expire(9_000_000_000, 7_000_000_000);
    published.send_replace(Arc::new(tracker.snapshot()));
    let second = scrape(&cached);
    assert_eq!(
        unit_lines(&second),
        unit_lines(&scrape(&metrics(kernel.clone()))),
        "a cached scrape says what a fresh one says"
    );
    let a = r#"namespace="host",pod="",container="/system.slice/a.service""#;
    let b = r#"namespace="host",pod="",container="/system.slice/b.service""#;
    assert!(second.contains(&format!("lifecycle_container_last_terminated_exit_code{{{a},uid=\"\"}} 3\n")), "{second}");
    assert!(second.contains(&format!("lifecycle_process_execs_total{{{b},uid=\"\"}} 4\n")), "{second}");
    assert!(!second.contains("c.service"), "{second}");
    assert!(first.contains("c.service"));
}

#[test]
fn scrape_after_scrape_the_kept_text_is_the_text_written_afresh() {
    // Units come, change (exits, restarts, kernel counters) and go between scrapes, a few at a
    // time as on a node; each scrape of the kept text must be byte for byte what a scrape without
    // any kept text writes, families contiguous.
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    let kernel = Arc::new(Changing::default());
    let published = publisher(&tracker);
    let make = || UnitMetrics::new(published.subscribe(), kernel.clone(), Box::new(|| 1_700_000_000.0));
    let kept = make();
    let scrape = |m: &UnitMetrics| {
        let mut text = String::new();
        m.scrape_into(&mut text);
        text
    };
    // A fixed pseudo-random sequence (a linear congruential generator): the same run every time.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |below: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    let mut time = 10u64;
    let mut live: Vec<(u64, u32)> = Vec::new();
    let mut last_cgroup = 1000u64;
    for round in 0..40 {
        for _ in 0..next(6) {
            time += 1;
            match next(5) {
                0 | 1 => {
                    last_cgroup += 1;
                    let pid = last_cgroup as u32;
                    start_host_unit(&mut tracker, last_cgroup, pid, &format!("u{last_cgroup}"));
                    live.push((last_cgroup, pid));
                }
                2 if !live.is_empty() => {
                    let (cgroup, pid) = live.remove(next(live.len() as u64) as usize);
                    let exit = main_exit(next(3) as u8, "u");
                    tracker.apply(&event(time * 1_000_000, pid, cgroup, exit));
                    if next(2) == 0 {
                        let path = format!("/system.slice/u{cgroup}.service");
                        let rmdir = CgroupDetail { id: cgroup, path, truncated: false };
                        tracker.apply(&event(time * 1_000_000 + 1, pid, cgroup, Detail::CgroupRmdir(rmdir)));
                    }
                }
                _ if !live.is_empty() => {
                    let (cgroup, _) = live[next(live.len() as u64) as usize];
                    let counters = CgroupCounters { execs: next(100) + 1, ..Default::default() };
                    kernel.0.lock().insert(cgroup, counters);
                }
                _ => {}
            }
        }
        if round % 7 == 6 {
            tracker.expire(time * 1_000_000, 3_000_000);
        }
        published.send_replace(Arc::new(tracker.snapshot()));
        let text = scrape(&kept);
        assert_eq!(text, scrape(&make()), "round {round}");
        let families: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut unique = families.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(families.len(), unique.len(), "each family once, round {round}:\n{text}");
    }
    assert!(tracker.units().count() > 10, "the run kept some units: {}", tracker.units().count());
}

#[test]
fn a_step_of_the_wall_clock_rewrites_the_kept_termination_times() {
    // A unit that did not change keeps its text, except when the boot-to-Unix offset moved by
    // more than a millisecond (an NTP step): its termination time is a Unix time.
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    start_host_unit(&mut tracker, 50, 500, "a");
    let exit = main_exit(1, "a");
    tracker.apply(&event(3_000_000_000, 500, 50, exit));
    let published = publisher(&tracker);
    let offset = Arc::new(Mutex::new(1_700_000_000.0));
    let clock = offset.clone();
    let metrics =
        UnitMetrics::new(published.subscribe(), Arc::new(Changing::default()), Box::new(move || *clock.lock()));
    let finished = |offset: f64| {
        let mut text = String::new();
        metrics.scrape_into(&mut text);
        let line = text.lines().find(|l| l.starts_with("lifecycle_container_last_terminated_timestamp_seconds{"));
        assert_eq!(
            line.and_then(|l| l.rsplit_once(' ')).map(|(_, v)| v.parse::<f64>().expect("value")),
            Some(offset + 3.0)
        );
    };
    finished(1_700_000_000.0);
    // Microseconds of drift keep the offset (and the text) as it was.
    *offset.lock() = 1_700_000_000.000_5;
    finished(1_700_000_000.0);
    *offset.lock() = 1_700_000_060.0;
    finished(1_700_000_060.0);
}

#[test]
fn without_host_units_a_scrape_has_no_host_cgroup_series() {
    // Issue 21: on a Kubernetes node host cgroups are off by default (`--host-cgroups`).
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    start_host_unit(&mut tracker, 50, 500, "nginx");
    let published = publisher(&tracker);
    let scrape = |m: UnitMetrics| {
        let mut text = String::new();
        m.scrape_into(&mut text);
        text
    };
    let make = || UnitMetrics::new(published.subscribe(), Arc::new(Kernel), Box::new(|| 1_700_000_000.0));
    assert!(scrape(make()).contains("container=\"/system.slice/nginx.service\""));
    let without = scrape(make().without_host_units());
    assert!(!without.contains("nginx"), "{without}");
    assert!(without.contains("lifecycle_state_dropped_total"), "the node's own families stay");
}

#[test]
fn a_pod_recreated_under_the_same_name_gives_two_series_sets_not_duplicates() {
    // Issue 17: a StatefulSet pod deleted and created again keeps its name; for the series
    // retention both the departed container and the new one are exported. Families without
    // `uid` wrote the same series twice, and Prometheus refuses a scrape with a duplicate.
    use lifecycle_testkit::fixtures::running_container;
    let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    let uids = ["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"];
    let metas = uids
        .iter()
        .enumerate()
        .map(|(n, uid)| running_container(&format!("{n}").repeat(64), uid, "shop", "db-0", "db"))
        .collect();
    tracker.set_metadata(metas);
    for (n, uid) in uids.iter().enumerate() {
        let cgroup = 100 + n as u64;
        let path = format!("/kubepods/besteffort/pod{uid}/{}", format!("{n}").repeat(64));
        tracker.apply(&event(1, 1, 1, Detail::CgroupMkdir(CgroupDetail { id: cgroup, path, truncated: false })));
        let exec = main_exec("db");
        tracker.apply(&event(2, 1000 + n as u32, cgroup, exec));
    }
    let metrics = UnitMetrics::new(publisher(&tracker).subscribe(), Arc::new(Kernel), Box::new(|| 1_700_000_000.0));
    let mut text = String::new();
    metrics.scrape_into(&mut text);
    let mut seen = std::collections::HashSet::new();
    for series in text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s)) {
        assert!(seen.insert(series.to_owned()), "{series} twice in:\n{text}");
    }
    for uid in uids {
        assert!(
            text.contains(&format!(
                "lifecycle_process_execs_total{{namespace=\"shop\",pod=\"db-0\",container=\"db\",uid=\"{uid}\"}}"
            )),
            "{text}"
        );
    }
}

#[test]
fn a_thousand_units_beside_a_hostile_one_stay_under_four_megabytes() {
    // Issue 18's bound: `/metrics` under 4 MB for 1,000 containers while one of them listens on
    // 20,000 ports, accepts on each, and is sent every signal number from inside and outside.
    use crate::model::event::TcpDetail;
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    for n in 0..1000u64 {
        start_host_unit(&mut tracker, 100 + n, 10_000 + n as u32, &format!("unit-{n}"));
    }
    let (hostile, pid) = (50, 500);
    start_host_unit(&mut tracker, hostile, pid, "hostile");
    let published = publisher(&tracker);
    let units = UnitMetrics::new(published.subscribe(), Arc::new(Changing::default()), Box::new(|| 0.0));
    let hostile_lines = |text: &str| text.lines().filter(|l| l.contains("/hostile.service\"")).count();
    let mut text = String::new();
    units.scrape_into(&mut text);
    let alone = hostile_lines(&text);
    for port in 1..=20_000u16 {
        let tcp = |remote_port| TcpDetail {
            socket_cgroup_id: hostile,
            netns: 1,
            family: 2,
            local_port: port,
            remote_port,
            fd: None,
        };
        tracker.apply(&event(3, pid, hostile, Detail::TcpListen(tcp(0))));
        tracker.apply(&event(4, pid, hostile, Detail::TcpAccept(tcp(40_000))));
    }
    for signal in 1..=64u32 {
        for (sender, sender_cgroup) in [(pid, hostile), (7, 1)] {
            let detail = Detail::Signal {
                signal,
                result: SignalResult::Delivered,
                group: true,
                target_pid: pid,
                target_tgid: pid,
                target_cgroup_id: hostile,
                sender_comm: "x".into(),
                target_comm: "hostile".into(),
                from_kernel: false,
            };
            tracker.apply(&event(5, sender, sender_cgroup, detail));
        }
    }
    published.send_replace(Arc::new(tracker.snapshot()));
    let mut text = String::new();
    units.scrape_into(&mut text);
    let hostile_series = hostile_lines(&text);
    eprintln!("{} bytes, hostile unit {alone} -> {hostile_series} series", text.len());
    assert!(text.len() < 4_000_000, "{} bytes for 1,001 units", text.len());
    // Its ports are cut at MAX_PORTS_PER_UNIT (4 series each) and its signals at 64 numbers by
    // two sender kinds.
    let most = alone + 4 * crate::model::node::MAX_PORTS_PER_UNIT + 2 * 64;
    assert!(hostile_series <= most, "{hostile_series} series for the hostile unit, at most {most}");
    assert!(hostile_series > alone + 64, "its ports and signals are shown, up to the bound");
}

#[test]
fn a_scrape_whose_text_never_came_back_is_followed_by_one_written_afresh() {
    // The kept samples are the last answer's own text, handed back once it is finished. A scrape
    // written but never handed back (its answer abandoned) leaves nothing to copy from: the next
    // one must write every unit again, not copy from where that text would have been.
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    for (cgroup, pid, name) in [(50, 500, "a"), (51, 510, "b")] {
        start_host_unit(&mut tracker, cgroup, pid, name);
    }
    let published = publisher(&tracker);
    let kernel = Arc::new(Changing::default());
    let make = || UnitMetrics::new(published.subscribe(), kernel.clone(), Box::new(|| 1_700_000_000.0));
    let kept = make();
    let mut text = String::new();
    kept.scrape_into(&mut text);
    // a exits: its samples grow, and the abandoned text lays them out unlike the kept one.
    tracker.apply(&event(3_000_000_000, 500, 50, main_exit(3, "a")));
    published.send_replace(Arc::new(tracker.snapshot()));
    let mut abandoned = String::new();
    kept.write(&mut abandoned);
    // b's counters move; a stays as the abandoned text wrote it.
    kernel.0.lock().insert(51, CgroupCounters { execs: 4, ..Default::default() });
    let (mut after, mut fresh) = (String::new(), String::new());
    kept.scrape_into(&mut after);
    make().scrape_into(&mut fresh);
    assert_eq!(after, fresh);
    assert!(after.contains("lifecycle_container_last_terminated_exit_code{"), "{after}");
}

#[test]
fn the_registry_answers_with_the_kept_text_and_two_buffers_take_turns() {
    // Through the registry, as the agent serves /metrics: each answer says what a scrape without
    // kept text says, and the per-container source keeps the last answer's text instead of a copy
    // of it, so the buffers of two answers take turns (a new one per scrape cost page faults).
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    for n in 0..50u64 {
        start_host_unit(&mut tracker, 100 + n, 1000 + n as u32, &format!("u{n}"));
    }
    let published = publisher(&tracker);
    let kernel = Arc::new(Changing::default());
    let make = || UnitMetrics::new(published.subscribe(), kernel.clone(), Box::new(|| 1_700_000_000.0));
    let mut metrics = crate::export::metrics::Metrics::bare();
    metrics.add_text_source(Box::new(Arc::new(make())));
    let mut buffers = Vec::new();
    for round in 0..6u64 {
        kernel.0.lock().insert(100 + round, CgroupCounters { execs: round + 1, ..Default::default() });
        let body = metrics.render();
        let mut fresh = String::new();
        make().scrape_into(&mut fresh);
        assert_eq!(std::str::from_utf8(&body).expect("utf-8"), fresh, "round {round}");
        buffers.push(body.as_ptr());
    }
    buffers.sort();
    buffers.dedup();
    assert_eq!(buffers.len(), 2, "the answers' buffers");
}
