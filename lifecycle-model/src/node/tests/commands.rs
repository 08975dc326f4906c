//! The model driven through its one door, `NodeTracker::handle`: what the commands the agent
//! sends mean, and that they survive serialization (a recorded sequence replays).

use super::*;
use crate::spec::{PodFacts, PodRef};

fn found(tgid: u32, ppid: u32, cgroup_id: u64, start: u64, comm: &str) -> FoundProcess {
    FoundProcess {
        tgid,
        ppid,
        cgroup_id,
        child_pid_namespace: false,
        started_at: at(start),
        comm: comm.into(),
        zombie: false,
    }
}

fn cgroup(id: u64, path: &str) -> FoundCgroup {
    FoundCgroup { id, path: path.into() }
}

#[test]
fn processes_found_in_proc_seed_the_host_units_they_run_in_once() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    let cgroups = vec![cgroup(50, "/system.slice/nginx.service")];
    // Oldest first, as /proc is read: the first process of the cgroup is its init; its child
    // (parent in the same cgroup) is not a second unit.
    let processes = vec![found(500, 1, 50, 10, "nginx"), found(501, 500, 50, 20, "nginx")];
    tracker.handle(Command::Seed { cgroups: cgroups.clone(), processes: processes.clone() }, at(30));
    let units: Vec<String> = tracker.units().map(|u| u.labels().container.clone()).collect();
    assert_eq!(units, ["/system.slice/nginx.service"]);
    assert_eq!(tracker.tracked_processes().len(), 2);
    // A repair finds the same processes again: nothing is added twice.
    tracker.handle(Command::Seed { cgroups, processes }, at(40));
    assert_eq!(tracker.tracked_processes().len(), 2);
    assert_eq!(tracker.units().count(), 1);
}

/// A look at the node: `cgroups` on disk, `processes` running.
fn look(cgroups: &[(u64, &str)], processes: &[FoundProcess]) -> Command {
    Command::Resync(ResyncLook {
        cgroups: cgroups.iter().map(|(id, path)| cgroup(*id, path)).collect(),
        processes: processes.to_vec(),
        start_tolerance: std::time::Duration::from_millis(20),
        departing: Vec::new(),
    })
}

fn repaired(outcome: &Outcome) -> Resync {
    outcome
        .notices
        .iter()
        .find_map(|notice| match notice {
            Notice::Repaired(report) => Some(*report),
            _ => None,
        })
        .expect("a look reports what it repaired")
}

#[test]
fn a_repair_ends_what_two_looks_in_a_row_do_not_find_and_seeds_what_is_new_at_once() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, "/system.slice/web.service"));
    tracker.apply(&exec(SECOND, 10, 42, 1, "web"));
    tracker.apply(&mkdir(0, 43, "/system.slice/gone.service"));
    tracker.apply(&exec(SECOND, 20, 43, 1, "gone"));
    // web's init exited unseen (pid 10 runs no more); gone's cgroup was removed unseen; new
    // appeared unseen. Process start times as /proc gives them (ticks), near the kernel's.
    let on_disk = [(42, "/system.slice/web.service"), (44, "/system.slice/new.service")];
    let new = found(30, 1, 44, 3 * SECOND, "new");
    let first = tracker.handle(look(&on_disk, std::slice::from_ref(&new)), at(4 * SECOND));
    assert_eq!(repaired(&first), Resync { cgroups_created_unseen: 1, ..Resync::default() }, "seen once: suspect only");
    assert!(tracker.snapshot().repair_pending(), "the next look confirms");
    assert_eq!(tracker.tracked_processes().len(), 3, "web's and gone's inits are suspects, new is seeded");
    let Command::Resync(second) = look(&on_disk, &[new]) else { unreachable!() };
    assert_eq!(tracker.cgroups_a_look_removes(&second), [43], "the owner takes its counts first");
    let second = tracker.handle(Command::Resync(second), at(5 * SECOND));
    assert_eq!(repaired(&second), Resync { exits_unseen: 2, cgroups_removed_unseen: 1, cgroups_created_unseen: 0 });
    assert!(second.ended.contains(&Ended { cgroup_id: 42, exit: at(5 * SECOND) }), "{:?}", second.ended);
    assert!(!tracker.snapshot().repair_pending(), "nothing left suspect");
    assert!(tracker.tracked_cgroups().contains(&44) && !tracker.tracked_cgroups().contains(&43));
}

#[test]
fn a_process_seen_running_again_or_a_zombie_is_judged_by_the_second_look() {
    let mut tracker = NodeTracker::new(TrackerConfig::default());
    tracker.apply(&mkdir(0, 42, "/system.slice/web.service"));
    tracker.apply(&exec(SECOND, 10, 42, 1, "web"));
    let on_disk = [(42, "/system.slice/web.service")];
    // Not found at the first look (a /proc read raced its start), found at the second: kept.
    tracker.handle(look(&on_disk, &[]), at(2 * SECOND));
    let running = found(10, 1, 42, SECOND + 5 * crate::time::MILLISECOND, "web");
    let kept = tracker.handle(look(&on_disk, std::slice::from_ref(&running)), at(3 * SECOND));
    assert_eq!(repaired(&kept), Resync::default());
    assert_eq!(tracker.tracked_processes().len(), 1);
    // An exited, unreaped process does not run: two looks at its zombie end it.
    let zombie = FoundProcess { zombie: true, ..running };
    tracker.handle(look(&on_disk, std::slice::from_ref(&zombie)), at(4 * SECOND));
    let ended = tracker.handle(look(&on_disk, &[zombie]), at(5 * SECOND));
    assert_eq!(repaired(&ended).exits_unseen, 1);
}

/// shop/web-1 as the API shows it.
fn pod() -> PodFacts {
    spec::pod_facts(30, crate::container_state::RestartPolicy::Always)
}

#[test]
fn a_notice_naming_this_nodes_pod_under_another_name_is_refused_and_told() {
    let mut tracker = tracker_with_cri();
    tracker.handle(Command::ApiConfigured, at(SECOND));
    tracker.handle(Command::Pod(pod()), at(SECOND));
    let forged = PodRef { uid: POD_UID.into(), namespace: "evil".into(), name: "web-1".into() };
    let outcome = tracker.handle(Command::EvictionNotice(forged), at(2 * SECOND));
    assert_eq!(outcome.notices, [Notice::ForgedNotice { namespace: "evil".into(), name: "web-1".into() }]);
    let genuine = PodRef { uid: POD_UID.into(), namespace: "shop".into(), name: "web-1".into() };
    let outcome = tracker.handle(Command::EvictionNotice(genuine), at(3 * SECOND));
    assert!(outcome.notices.is_empty(), "{:?}", outcome.notices);
    // A relist that no longer lists the pod forgets it.
    tracker.handle(Command::PodsListed { listed: Some(Vec::new()) }, at(4 * SECOND));
    assert!(!tracker.knows_pod(POD_UID));
}

#[test]
fn commands_read_back_as_written() {
    let commands = vec![
        Command::Event(exec(SECOND, 10, 42, 1, "web")),
        Command::Event(mkdir(0, 42, "/system.slice/web.service")),
        Command::DepartingCounters {
            cgroup_id: 42,
            counters: lifecycle_common::CgroupCounters { execs: 3, ..Default::default() },
        },
        Command::RuntimeListed { containers: vec![meta(1, 30)] },
        Command::Pod(pod()),
        Command::Expire { retention: std::time::Duration::from_secs(60) },
        Command::FlushWarnings,
    ];
    for command in commands {
        let written = serde_json::to_string(&command).expect("serializes");
        let read: Command = serde_json::from_str(&written).expect("reads back");
        assert_eq!(read, command, "{written}");
    }
}

#[test]
fn commands_write_their_times_under_the_recorded_names_in_nanoseconds() {
    // Recordings made before the times were typed (`tests/fixtures/crash_loop.jsonl`) must
    // still replay: the names and the numbers on the wire are the ones the `u64`s had.
    let written = |command: Command| serde_json::to_value(&command).expect("serializes");
    let started = written(Command::Event(exec(3 * SECOND, 10, 42, 1, "web")));
    assert_eq!((started["time_ns"].as_u64(), started["start_time_ns"].as_u64()), (Some(3 * SECOND), Some(3 * SECOND)));
    let exited = written(Command::Event(exit(4 * SECOND, 10, 42, Some(0), None)));
    assert_eq!(exited["time_ns"].as_u64(), Some(4 * SECOND));
    assert_eq!(exited["cpu_time_ns"].as_u64(), Some(5 * crate::time::MILLISECOND));
    let expire = written(Command::Expire { retention: std::time::Duration::from_secs(60) });
    assert_eq!(expire, serde_json::json!({ "command": "expire", "retention_ns": 60 * SECOND }));
    let resync = written(look(&[], &[]));
    assert_eq!(resync["start_tolerance_ns"].as_u64(), Some(20 * crate::time::MILLISECOND));
}
