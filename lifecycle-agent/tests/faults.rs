//! Kernel tier, faults of the node the agent must come through on a plain host (each cgroup a
//! unit), with the real programs and the `lifecycle-agent run` binary:
//! - a fork storm that overflows the ring while the agent cannot read it: every lost record is
//!   counted, and what those records would have changed (an exit, cgroups created and removed, a
//!   process started) is repaired from /proc and cgroupfs;
//! - cgroup churn of 1,000 creates and removes a second: no record lost at that rate, every
//!   cgroup's counter-map entry freed, and no unit left behind that claims to run;
//! - a unit's end on a quiet node, with polls a second apart: its last process's exit wakes the
//!   agent itself, as a container's init does.

use std::{
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    agent::{metric_sum, Agent},
    cgroup::TestCgroup,
    require_privileges,
};
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
/// No runtime on a plain host: the agent runs on cgroups alone.
const NO_RUNTIME: &str = "/nonexistent/lifecycle-test/cri.sock";

/// Held by each test: every agent sees every cgroup of the machine, so one test's churn must not
/// land in the other's ring.
static MACHINE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The agent's unit for the host cgroup `path`.
fn unit(agent: &Agent, path: &str) -> Option<Value> {
    agent.containers().into_iter().find(|c| c["namespace"] == "host" && c["container"] == path)
}

fn is_running(c: &Value) -> bool {
    c["state"]["state"] == "running"
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let began = Instant::now();
    while !done() {
        assert!(began.elapsed() < within, "not {what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops (SIGSTOP) or resumes (SIGCONT) the agent: a reader that does not read.
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions; the pid is the agent this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_ring_overflow_is_counted_and_the_state_it_hid_is_repaired_from_proc_and_cgroupfs() {
    require_privileges!();
    let _machine = MACHINE.lock();
    // The smallest ring, and a reader stopped while the storm fills it: loss is certain.
    let agent =
        Agent::start_with_socket(AGENT, Path::new(NO_RUNTIME), &["--ring-bytes", "16384", "--wakeup-bytes", "8192"]);
    let mut victim = TestCgroup::new("overflow-victim");
    let victim_process = victim.spawn(Command::new("sleep").arg("1000"));
    let mut doomed: Vec<(TestCgroup, Child)> = (0..10)
        .map(|n| {
            let mut cg = TestCgroup::new(&format!("overflow-doomed{n}"));
            let child = cg.spawn(Command::new("sleep").arg("1000"));
            (cg, child)
        })
        .collect();
    wait_until("the units running", Duration::from_secs(10), || {
        std::iter::once(&victim.path)
            .chain(doomed.iter().map(|(cg, _)| &cg.path))
            .all(|path| unit(&agent, path).is_some_and(|u| is_running(&u)))
    });
    let lost_before = metric_sum(&agent.metrics(), "lifecycle_events_lost_total");

    signal(agent.pid(), libc::SIGSTOP);
    let mut storm = TestCgroup::new("overflow-storm");
    let burst = "i=0; while [ $i -lt 2000 ]; do /bin/true; i=$((i+1)); done";
    assert!(storm.spawn(Command::new("/bin/sh").args(["-c", burst])).wait().expect("storm").success());
    // With the ring full, these are the records that go missing.
    reap(victim_process);
    for (cg, child) in doomed.drain(..) {
        reap(child);
        drop(cg);
    }
    let mut born = TestCgroup::new("overflow-born");
    let born_process = born.spawn(Command::new("sleep").arg("1000"));
    signal(agent.pid(), libc::SIGCONT);

    wait_until("the loss counted", Duration::from_secs(10), || {
        metric_sum(&agent.metrics(), "lifecycle_events_lost_total") > lost_before
    });
    // Repaired within a few seconds: two looks a second apart confirm what is gone.
    wait_until("the state repaired", Duration::from_secs(15), || {
        let victim_ended = unit(&agent, &victim.path).is_some_and(|u| !is_running(&u));
        let born_runs = unit(&agent, &born.path).is_some_and(|u| is_running(&u));
        let none_doomed_runs = agent
            .containers()
            .iter()
            .filter(|c| c["container"].as_str().is_some_and(|p| p.contains("overflow-doomed")))
            .all(|c| !is_running(c));
        victim_ended && born_runs && none_doomed_runs
    });
    let victim_unit = unit(&agent, &victim.path).expect("victim");
    assert_eq!(victim_unit["state"]["state"], "terminated", "{victim_unit:#}");
    let repairs = agent.metrics();
    for kind in ["exit", "cgroup_removed", "cgroup_created"] {
        let line = format!("lifecycle_state_repairs_total{{kind=\"{kind}\"}} ");
        let n: f64 = repairs.lines().find_map(|l| l.strip_prefix(&line)?.trim().parse().ok()).unwrap_or(0.0);
        assert!(n >= 1.0, "{line}{n}: the lost records' changes were repaired");
    }
    reap(born_process);
}

#[test]
fn cgroup_churn_of_a_thousand_a_second_loses_nothing_and_leaves_nothing_behind() {
    require_privileges!();
    let _machine = MACHINE.lock();
    let agent = Agent::start_with_socket(AGENT, Path::new(NO_RUNTIME), &[]);
    let used = || {
        agent
            .metrics()
            .lines()
            .find_map(|l| l.strip_prefix("lifecycle_kernel_map_entries{map=\"cgroup_counters\"} ")?.parse::<f64>().ok())
    };
    let lost_before = metric_sum(&agent.metrics(), "lifecycle_events_lost_total");
    let used_before = used().expect("counter map entries exported");
    // Cgroups created and removed at 1,000 a second (or as fast as this machine manages); every
    // fourth runs a process, so it gets a unit and a counter-map entry (a fork and exec per
    // cgroup would hold the rate near 550 a second here).
    const CGROUPS: u32 = 3000;
    const WITH_PROCESS: u32 = 4;
    let began = Instant::now();
    for n in 0..CGROUPS {
        let mut cg = TestCgroup::new(&format!("churn{n}"));
        if n % WITH_PROCESS == 0 {
            assert!(cg.spawn(&mut Command::new("/bin/true")).wait().expect("true").success());
        }
        drop(cg);
        if let Some(wait) = Duration::from_millis(u64::from(n + 1)).checked_sub(began.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let took = began.elapsed();
    eprintln!(
        "{CGROUPS} cgroups created, run and removed in {took:.2?} ({:.0}/s)",
        f64::from(CGROUPS) / took.as_secs_f64()
    );
    assert_eq!(metric_sum(&agent.metrics(), "lifecycle_events_lost_total"), lost_before, "no record lost at this rate");
    // Every entry is freed when its cgroup's removal is read (a few other cgroups of the machine
    // may come and go meanwhile).
    wait_until("the counter map back to its size", Duration::from_secs(10), || {
        used().is_some_and(|now| now <= used_before + 5.0)
    });
    let churned: Vec<Value> = agent
        .containers()
        .into_iter()
        .filter(|c| c["container"].as_str().is_some_and(|p| p.starts_with("/lifecycle-test-churn")))
        .collect();
    let running: Vec<&Value> = churned.iter().filter(|c| is_running(c)).collect();
    assert!(running.is_empty(), "no unit of a removed cgroup runs: {running:#?}");
    assert_eq!(churned.len(), CGROUPS.div_ceil(WITH_PROCESS) as usize, "every cgroup that ran is a unit");
}

/// `lifecycle_event_to_state_seconds`: (observations within 0.25 s, all observations).
fn state_latencies(agent: &Agent) -> (f64, f64) {
    let metrics = agent.metrics();
    let value = |prefix: &str| -> f64 {
        metrics.lines().find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok()).unwrap_or(0.0)
    };
    (value("lifecycle_event_to_state_seconds_bucket{le=\"0.25\"} "), value("lifecycle_event_to_state_seconds_count "))
}

#[test]
fn a_host_units_last_exit_wakes_the_agent_instead_of_waiting_for_its_poll() {
    require_privileges!();
    let _machine = MACHINE.lock();
    // The ring is drained once a second unless the kernel wakes the agent: an exit applied within
    // a quarter of that, four times running, is one the kernel woke it for (polling alone would
    // manage it for all four one time in 256).
    let agent = Agent::start_with_socket(AGENT, Path::new(NO_RUNTIME), &["--poll-ms", "1000"]);
    for n in 0..4 {
        let mut cg = TestCgroup::new(&format!("wake{n}"));
        let child = cg.spawn(Command::new("sleep").arg("1000"));
        wait_until("the unit running", Duration::from_secs(10), || {
            unit(&agent, &cg.path).is_some_and(|u| is_running(&u))
        });
        let (quick_before, all_before) = state_latencies(&agent);
        reap(child);
        wait_until("the unit ended", Duration::from_secs(10), || {
            unit(&agent, &cg.path).is_some_and(|u| !is_running(&u))
        });
        let (quick, all) = state_latencies(&agent);
        assert_eq!(all - all_before, 1.0, "one state-changing exit observed");
        assert_eq!(quick - quick_before, 1.0, "unit {n}: its end was applied within 0.25 s of the exit");
    }
}
