//! Kubelet tier: a real node (etcd, kube-apiserver and kubelet v1.20.2, containerd + runc, the
//! CNI bridge) driven with kubectl as a user drives a cluster. These tests prove the node itself:
//! a pod runs and `kubectl delete` removes it; a crashing pod reaches CrashLoopBackOff as the API
//! reports it; and the machine is as it was once the node is gone. Each test starts its own node
//! and prints what the start cost (the first start in the process is the cold one).
//!
//! Run: `xtask/x.sh test --tier kubelet` (builds kube-apiserver and kubelet once), or
//! `cargo test -p lifecycle-agent --test kubelet -- --test-threads=1` once they are built.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use lifecycle_testkit::kube::{self, container_status, Kube, MachineState};
use serde_json::Value;

/// The pod of the smoke test: a shell that exits 0 on SIGTERM.
const TRAPPING_SHELL: &str = r#"trap "exit 0" TERM; while true; do sleep 1; done"#;

static STARTS: AtomicUsize = AtomicUsize::new(0);

/// Starts a node (which first sweeps leftovers of crashed runs and notes the machine's state)
/// and prints its start-up cost; `None` (printed) when the tier cannot run here.
fn start(test: &str) -> Option<Kube> {
    let kube = kube::start_or_skip(test)?;
    let n = STARTS.fetch_add(1, Ordering::SeqCst) + 1;
    let t = kube.timings;
    eprintln!(
        "{test}: node start #{n} in this process ({}): Ready in {:.1?} (etcd {:.1?}; containerd + image {:.1?}; \
         kube-apiserver ready {:.1?}; kubelet registered {:.1?}, Ready {:.1?})",
        if n == 1 { "cold" } else { "warm" },
        t.total,
        t.etcd,
        t.containerd,
        t.apiserver,
        t.kubelet_registered,
        t.node_ready,
    );
    Some(kube)
}

/// Stops the node and asserts the machine is as it was before the start.
fn stop_and_check_machine(kube: Kube) {
    let before = kube.machine_before_start().clone();
    let during = MachineState::capture();
    let began = Instant::now();
    let after = kube.stop();
    eprintln!("teardown {:.1?}", began.elapsed());
    eprintln!("sysctls before: {:?}", before.sysctls);
    eprintln!("sysctls while running: {:?}", during.sysctls);
    eprintln!("sysctls after: {:?}", after.sysctls);
    eprintln!(
        "while running: {} processes, mounts {:?}, bridges {:?}, cgroup roots {}, host paths {:?}",
        during.processes.len(),
        during.mounts,
        during.bridges,
        during.cgroup_roots.len(),
        during.host_paths
    );
    assert_eq!(after, before, "the node left the machine changed");
}

fn waiting_reason(pod: &Value) -> &str {
    container_status(pod, "app").and_then(|c| c["state"]["waiting"]["reason"].as_str()).unwrap_or_default()
}

#[test]
fn a_pod_runs_and_kubectl_delete_removes_it() {
    let Some(kube) = start("a_pod_runs_and_kubectl_delete_removes_it") else { return };
    let mut pod = kube.pod_manifest("sleeper", &["sh", "-c", TRAPPING_SHELL]);
    pod["spec"]["terminationGracePeriodSeconds"] = 5.into();
    let applied = Instant::now();
    kube.apply(&pod.to_string()).expect("kubectl apply");
    let running = kube
        .wait_pod("default", "sleeper", "Running with its container running", Duration::from_secs(60), |pod| {
            pod["status"]["phase"] == "Running"
                && container_status(pod, "app").is_some_and(|c| c["state"]["running"].is_object())
        })
        .expect("pod runs");
    eprintln!("apply -> Running in {:.1?}", applied.elapsed());
    // The CNI bridge gave it an address of the node's pod subnet.
    let ip = running["status"]["podIP"].as_str().unwrap_or_default();
    assert!(ip.starts_with("10.244."), "pod IP {ip:?}");
    let table = kube.kubectl(&["get", "pods", "-o", "wide"]).expect("kubectl get pods");
    eprintln!("{table}");
    assert!(table.contains("sleeper") && table.contains("Running") && table.contains(kube.node_name()), "{table}");

    let container = container_status(&running, "app").and_then(|c| c["containerID"].as_str()).unwrap_or_default();
    let exits = kube.watch_task_exits().expect("ctr events");
    let deleted = Instant::now();
    kube.kubectl(&["delete", "pod", "sleeper", "--wait=false"]).expect("kubectl delete");
    // The runtime's truth: the shell got SIGTERM and exited 0 through its trap (a SIGKILL after
    // the 5 s grace period would be 137).
    let exit = exits.wait_for(container, Duration::from_secs(20)).expect("the container exits");
    eprintln!(
        "kubectl delete -> container exit (containerd) in {:.1?}: status {} at {}",
        exit.seen.duration_since(deleted),
        exit.exit_status,
        exit.exited_at
    );
    assert_eq!(exit.exit_status, 0, "{exit:?}");
    // The kubelet then removes the pod. Kubelet 1.20 sometimes removes the exited container
    // before reporting it (the API then shows ContainerStatusUnknown) and the pod stays
    // Terminating until a later sync: allow for that.
    let gone = kube.wait_pod_gone("default", "sleeper", kube::POD_REMOVAL).expect("pod is removed");
    eprintln!("kubectl delete -> pod gone from the API in {:.1?}", deleted.elapsed());
    assert!(gone < Duration::from_secs(120));

    stop_and_check_machine(kube);
}

#[test]
fn a_crashing_pod_reaches_crash_loop_back_off() {
    let Some(kube) = start("a_crashing_pod_reaches_crash_loop_back_off") else { return };
    let pod = kube.pod_manifest("crasher", &["sh", "-c", "exit 3"]);
    let applied = Instant::now();
    kube.apply(&pod.to_string()).expect("kubectl apply");
    let crashing = kube
        .wait_pod("default", "crasher", "in CrashLoopBackOff", Duration::from_secs(90), |pod| {
            waiting_reason(pod) == "CrashLoopBackOff"
        })
        .expect("CrashLoopBackOff");
    eprintln!("apply -> CrashLoopBackOff in {:.1?}", applied.elapsed());
    let status = container_status(&crashing, "app").expect("container status");
    eprintln!("container status: {status}");
    assert!(status["restartCount"].as_u64().unwrap_or_default() >= 1, "{status}");
    let last = &status["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3, "{status}");
    assert_eq!(last["reason"], "Error", "{status}");
    assert_eq!(crashing["status"]["phase"], "Running", "a restarting pod stays Running");
    let message = status["state"]["waiting"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("back-off 10s restarting failed container"), "{message}");

    stop_and_check_machine(kube);
}

#[test]
fn a_crashed_node_is_swept_by_the_next_start() {
    let Some(kube) = start("a_crashed_node_is_swept_by_the_next_start") else { return };
    let before = kube.machine_before_start().clone();
    kube.apply(&kube.pod_manifest("orphan", &["sh", "-c", TRAPPING_SHELL]).to_string()).expect("kubectl apply");
    kube.wait_pod_phase("default", "orphan", "Running", Duration::from_secs(60)).expect("pod runs");
    // As if the test process had been SIGKILLed: daemons, the pod, mounts, the bridge, cgroups
    // and the kubelet's sysctls stay behind.
    let abandoned = kube.abandon_as_if_crashed();
    let left = MachineState::capture();
    assert_ne!(left, before, "an abandoned node leaves the machine changed");
    eprintln!(
        "left behind: {} processes, {} mounts, bridges {:?}",
        left.processes.len(),
        left.mounts.len(),
        left.bridges
    );
    let began = Instant::now();
    let after = abandoned.sweep();
    eprintln!("sweep took {:.1?}", began.elapsed());
    assert_eq!(after, before, "the sweep left the machine changed");
}
