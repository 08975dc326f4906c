//! Privileged tier: the containerd harness against the real runtime (containerd 1.6 + runc),
//! and the agent's CRI client against that runtime. Each test skips with a printed reason when
//! it is not root or the runtime is not installed.
//!
//! Run: `cargo test -p lifecycle-agent --test containerd_harness -- --test-threads=1`

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use lifecycle_agent::{
    discovery::cri::CriError,
    model::metadata::{ContainerState, ContainerType},
};
use lifecycle_testkit::containerd::{start_or_skip, KubeletAnnotations};

const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

#[test]
fn term_trapping_shell_exits_promptly_on_stop() {
    let Some(mut h) = start_or_skip("term_trapping_shell_exits_promptly_on_stop") else {
        return;
    };
    eprintln!("timings: {:?}", h.timings);
    let began = Instant::now();
    let pod = h.new_pod("trap-term").expect("pod");
    let sandbox_ready = began.elapsed();
    let id = h
        .run_container(
            &pod,
            "app",
            &["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
            &KubeletAnnotations::default(),
            None,
        )
        .expect("container");
    eprintln!("sandbox {sandbox_ready:?}, sandbox+container running {:?}", began.elapsed());

    let elapsed = h.stop_container(&id, 10).expect("stop");
    let status = h.container_status(&id).expect("status");
    eprintln!("stop took {elapsed:?}: exit {} reason {:?}", status.exit_code, status.reason);
    assert_eq!(status.state, EXITED);
    // Busybox sh is PID 1 of its own pid namespace; its trap runs after the current `sleep 0.1`
    // returns and exits with the trap's code, so the runtime reports the trap's 0 / Completed.
    assert_eq!(status.exit_code, 0, "reason {:?}", status.reason);
    assert_eq!(status.reason, "Completed");
    // Far below the 10 s timeout: no SIGKILL was needed.
    assert!(elapsed < Duration::from_secs(3), "stop took {elapsed:?}");
}

#[test]
fn term_ignoring_container_is_killed_after_the_timeout() {
    let Some(mut h) = start_or_skip("term_ignoring_container_is_killed_after_the_timeout") else {
        return;
    };
    let pod = h.new_pod("ignore-term").expect("pod");
    let id = h
        .run_container(
            &pod,
            "app",
            &["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"],
            &KubeletAnnotations { termination_grace_period_s: Some(2), ..Default::default() },
            None,
        )
        .expect("container");

    let elapsed = h.stop_container(&id, 2).expect("stop");
    let status = h.container_status(&id).expect("status");
    eprintln!("stop took {elapsed:?}: exit {} reason {:?}", status.exit_code, status.reason);
    assert_eq!(status.state, EXITED);
    assert_eq!(status.exit_code, 137, "SIGKILL after the timeout");
    assert_eq!(status.reason, "Error");
    // containerd waits the full timeout before SIGKILL, so never less than 2 s; the upper bound
    // allows for the kill, the exit event and the status update (~0.1 s measured) with margin
    // for a loaded 2-CPU machine.
    assert!(elapsed >= Duration::from_secs(2), "killed early: {elapsed:?}");
    assert!(elapsed < Duration::from_millis(3500), "kill came late: {elapsed:?}");
    let finished_after_start = Duration::from_nanos((status.finished_at - status.started_at).try_into().unwrap_or(0));
    assert!(finished_after_start >= Duration::from_secs(2), "{finished_after_start:?}");
}

#[test]
fn completed_container_exits_zero() {
    let Some(mut h) = start_or_skip("completed_container_exits_zero") else {
        return;
    };
    let pod = h.new_pod("complete").expect("pod");
    let id = h
        .run_container(&pod, "job", &["sh", "-c", "sleep 0.2; exit 0"], &KubeletAnnotations::default(), None)
        .expect("container");
    let status = h.wait_exited(&id, Duration::from_secs(10)).expect("exit");
    assert_eq!(status.exit_code, 0);
    assert_eq!(status.reason, "Completed");
    assert!(status.created_at <= status.started_at && status.started_at < status.finished_at, "{status:?}");
    // containerd stamps started_at after the task started, so the sleep may begin before it
    // (199.2 ms between the two was seen); the container was created before anything ran.
    let ran = Duration::from_nanos((status.finished_at - status.created_at).try_into().unwrap_or(0));
    assert!(ran >= Duration::from_millis(200), "created to finished {ran:?}");
}

#[test]
fn memory_limit_oom_is_reported_as_oomkilled() {
    let Some(mut h) = start_or_skip("memory_limit_oom_is_reported_as_oomkilled") else {
        return;
    };
    let pod = h.new_pod("oom").expect("pod");
    // Doubling a shell variable reaches 64 MiB within a few iterations; PID 1 is the allocator,
    // so the OOM killer's victim is the container's main process.
    let id = h
        .run_container(
            &pod,
            "hog",
            &["sh", "-c", "a=xxxxxxxxxxxxxxxx; while true; do a=\"$a$a\"; done"],
            &KubeletAnnotations::default(),
            Some(64 * 1024 * 1024),
        )
        .expect("container");
    let status = h.wait_exited(&id, Duration::from_secs(20)).expect("exit");
    eprintln!("exit {} reason {:?} message {:?}", status.exit_code, status.reason, status.message);
    assert_eq!(status.exit_code, 137);
    assert_eq!(status.reason, "OOMKilled");
}

#[test]
fn cri_client_reads_kubelet_identity_and_outcome() {
    let Some(mut h) = start_or_skip("cri_client_reads_kubelet_identity_and_outcome") else {
        return;
    };
    let uid = "0b3f6a52-7c1e-4d38-9a57-2f6e1c0d8e41";
    let pod = h.run_pod_sandbox("web-0", "shop", uid, &format!("/kubepods/burstable/pod{uid}")).expect("pod");
    let pre_stop = r#"{"exec":{"command":["sh","-c","sleep 1"]}}"#;
    let ports = r#"[{"name":"http","containerPort":8080,"protocol":"TCP"}]"#;
    let app = h
        .run_container(
            &pod,
            "app",
            &["sleep", "300"],
            &KubeletAnnotations {
                termination_grace_period_s: Some(45),
                deletion_grace_period_s: Some(10),
                restart_count: 2,
                hash: 0xdead_beef,
                pre_stop_handler: Some(pre_stop.to_owned()),
                ports: Some(ports.to_owned()),
                ..Default::default()
            },
            None,
        )
        .expect("app");
    let init = h
        .run_container(
            &pod,
            "setup",
            &["true"],
            &KubeletAnnotations {
                container_type: "init",
                // Malformed on purpose: the field is unset, the listing still succeeds.
                termination_grace_period_s: None,
                extra: vec![("io.kubernetes.pod.terminationGracePeriod".to_owned(), "thirty".to_owned())],
                ..Default::default()
            },
            None,
        )
        .expect("init");
    h.wait_exited(&init, Duration::from_secs(10)).expect("init exits");

    let listed = h.block_on(h.cri().list_containers()).expect("list");
    assert_eq!(listed.len(), 2, "{listed:#?}");
    let app_meta = listed.iter().find(|m| m.container_id == app).expect("app listed");
    assert_eq!(app_meta.pod_sandbox_id, pod.id);
    assert_eq!((app_meta.pod_name.as_str(), app_meta.pod_namespace.as_str()), ("web-0", "shop"));
    assert_eq!(app_meta.pod_uid, uid);
    assert_eq!(app_meta.container_name, "app");
    assert_eq!(app_meta.attempt, 2);
    assert_eq!(app_meta.kubelet.restart_count, Some(2));
    assert_eq!(app_meta.kubelet.spec_hash, Some(0xdead_beef));
    assert_eq!(app_meta.kubelet.container_type, Some(ContainerType::Regular));
    assert_eq!(app_meta.kubelet.termination_grace_period_ns, Some(45_000_000_000));
    assert_eq!(app_meta.kubelet.deletion_grace_period_ns, Some(10_000_000_000));
    assert_eq!(app_meta.kubelet.pre_stop_handler.as_deref(), Some(pre_stop));
    assert_eq!(app_meta.kubelet.ports.as_deref(), Some(ports));
    assert_eq!(app_meta.state, ContainerState::Running);
    assert!(app_meta.created_ns > 0);

    let init_meta = listed.iter().find(|m| m.container_id == init).expect("init listed");
    assert_eq!(init_meta.kubelet.container_type, Some(ContainerType::Init));
    assert_eq!(init_meta.kubelet.termination_grace_period_ns, None);
    assert_eq!(init_meta.state, ContainerState::Exited);

    let done = h.block_on(h.cri().container_status(&init)).expect("status");
    assert_eq!(done.pod_sandbox_id, pod.id);
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(done.reason.as_deref(), Some("Completed"));
    // Both set; not ordered: for a process this short containerd 1.6 records StartedAt after
    // StartContainer returns, which can be later than the exit the shim already timestamped.
    assert!(done.started_ns.is_some() && done.finished_ns.is_some(), "{done:?}");

    let running = h.block_on(h.cri().container_status(&app)).expect("status");
    assert_eq!((running.exit_code, running.finished_ns), (None, None));

    let missing = h.block_on(h.cri().container_status("0000")).expect_err("no such container");
    assert!(matches!(missing, CriError::NotFound { .. }), "{missing:?}");
    let version = h.cri().version();
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
}

#[test]
fn drop_leaves_nothing_behind() {
    let Some(mut h) = start_or_skip("drop_leaves_nothing_behind") else {
        return;
    };
    let pod = h.new_pod("tidy").expect("pod");
    h.run_container(&pod, "app", &["sleep", "300"], &KubeletAnnotations::default(), None).expect("container");
    let pid = h.containerd_pid().expect("containerd pid");
    let run_dir = h.run_dir().to_owned();
    let socket = h.socket().to_string_lossy().into_owned();
    let shim_sockets = h.shim_sockets();
    drop(h);

    assert!(!running(pid), "containerd {pid} survived");
    assert!(!run_dir.exists(), "{} survived", run_dir.display());
    assert_eq!(processes_mentioning(&socket), Vec::<u32>::new(), "shims survived");
    assert!(shim_sockets.iter().all(|s| !s.exists()), "shim sockets survived: {shim_sockets:?}");
    assert_eq!(mounts_under(&run_dir), Vec::<String>::new());
    assert_eq!(cgroups_named(&format!("pod{}", pod.uid)), Vec::<String>::new());
}

#[test]
fn a_crashed_run_is_swept_by_the_next_start() {
    let Some(mut first) = start_or_skip("a_crashed_run_is_swept_by_the_next_start") else {
        return;
    };
    let pod = first.new_pod("orphan").expect("pod");
    first.run_container(&pod, "app", &["sleep", "300"], &KubeletAnnotations::default(), None).expect("container");
    let pid = first.containerd_pid().expect("containerd pid");
    let run_dir = first.run_dir().to_owned();
    let socket = first.socket().to_string_lossy().into_owned();
    let shim_sockets = first.shim_sockets();
    assert_eq!(shim_sockets.len(), 1, "one shim per sandbox");
    // As if the test process had been SIGKILLed: containerd, its shim, the containers, the
    // mounts, the cgroups and the socket stay behind, owned by a dead pid.
    first.abandon_as_if_crashed();
    assert!(running(pid));

    let second = start_or_skip("a_crashed_run_is_swept_by_the_next_start").expect("second harness");
    // It was our child, so it lingers as a zombie until this process exits: that counts as gone.
    assert!(!running(pid), "stale containerd {pid} survived");
    assert!(!run_dir.exists(), "{} survived", run_dir.display());
    assert_eq!(processes_mentioning(&socket), Vec::<u32>::new(), "stale shims survived");
    assert!(shim_sockets.iter().all(|s| !s.exists()), "stale shim sockets survived: {shim_sockets:?}");
    assert_eq!(mounts_under(&run_dir), Vec::<String>::new());
    assert_eq!(cgroups_named(&format!("pod{}", pod.uid)), Vec::<String>::new());
    drop(second);
}

/// Exists and is not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|raw| raw.split(|b| *b == 0).any(|arg| arg == needle.as_bytes()))
        })
        .collect()
}

fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|line| line.split_whitespace().nth(4).is_some_and(|point| point.starts_with(&prefix)))
        .map(str::to_owned)
        .collect()
}

fn cgroups_named(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    for hierarchy in hierarchies.flatten() {
        let dir = hierarchy.path().join("kubepods/burstable").join(name);
        if dir.exists() {
            found.push(dir.to_string_lossy().into_owned());
        }
    }
    found
}
