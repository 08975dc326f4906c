//! Benchmark (ignored by default): how soon a container's exit is visible, on a real node, in the
//! agent's API and in the Kubernetes API's pod status, for the same exits.
//!
//! 60 pods (restartPolicy Never) exit at spread times. For each, the kernel's exit time (the
//! agent's `finished_at_boot_ns`, from the exit event) is the origin; the agent's API is polled
//! every 2 ms, and the pods are watched through the API server with kube-rs; each side records
//! when it first showed the container terminated (CLOCK_BOOTTIME, the kernel's clock).
//!
//! Run: `cargo test --release -p lifecycle-agent --test bench_kubelet -- --ignored --nocapture`
//! (with `LIFECYCLE_BENCH_NODE=1.37` and the modern node's binaries for the current kubelet).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::Api,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{watcher, WatchStreamExt as _},
    Client, Config,
};
use lifecycle_agent::discovery::clock::boottime_ns;
use lifecycle_testkit::{agent::Agent, kube as node};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const PODS: usize = 60;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
#[ignore = "benchmark: needs the kubelet tier's node; run with --ignored"]
fn exit_to_agent_api_vs_exit_to_kubernetes_status() {
    // LIFECYCLE_BENCH_NODE=1.37 runs it on the modern node (its binaries from
    // `xtask/x.sh kubernetes-modern`, as the modern tier takes them); default the 1.20 node.
    let version = match std::env::var("LIFECYCLE_BENCH_NODE").as_deref() {
        Ok("1.37") => node::NodeVersion::V1_37,
        _ => node::NodeVersion::V1_20,
    };
    if let Some(reason) = node::skip_reason_for(version) {
        eprintln!("SKIP: {reason}");
        return;
    }
    node::sweep_stale();
    let Some(kube) = node::start_or_skip_version("bench_kubelet", version) else { return };
    eprintln!("node {version:?}");
    let kubeconfig = kube.kubeconfig().to_owned();
    let agent = Agent::start_with_socket(
        AGENT,
        kube.containerd_socket(),
        &["--kubeconfig", &kubeconfig.to_string_lossy(), "--node-name", kube.node_name()],
    );
    // API side: a watch records when each pod's status first says terminated.
    let api_seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let seen = api_seen.clone();
    rt.spawn(async move {
        let file = Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.expect("config");
        let pods: Api<Pod> = Api::namespaced(Client::try_from(config).expect("client"), "default");
        let mut stream = std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects());
        while let Some(Ok(pod)) = stream.next().await {
            let now = boottime_ns();
            let terminated = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some())));
            if terminated {
                let name = pod.metadata.name.clone().unwrap_or_default();
                seen.lock().entry(name).or_insert(now);
            }
        }
    });
    // All pods in one apply (a List), each exiting at its own time well after the apply.
    let items: Vec<serde_json::Value> = (0..PODS)
        .map(|i| {
            let delay = 8.0 + (i % 20) as f64 * 0.5;
            let mut pod = kube.pod_manifest(&format!("exit-{i}"), &["sh", "-c", &format!("sleep {delay}; exit 1")]);
            pod["spec"]["restartPolicy"] = "Never".into();
            pod
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    // Agent side, polling from before the pods exist: first poll that shows each container
    // terminated, and the kernel's exit time.
    let poller = {
        let addr = agent.addr.clone();
        std::thread::spawn(move || {
            let mut seen: HashMap<String, (u64, u64)> = HashMap::new();
            let deadline = Instant::now() + Duration::from_secs(180);
            while seen.len() < PODS && Instant::now() < deadline {
                let now = boottime_ns();
                let Some((_, body)) = lifecycle_testkit::agent::get(&addr, "/api/v1/containers") else { continue };
                let value: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                for c in value["containers"].as_array().into_iter().flatten() {
                    let name = c["pod"].as_str().unwrap_or_default().to_owned();
                    if c["state"]["state"] == "terminated" && name.starts_with("exit-") && !seen.contains_key(&name) {
                        let exit = c["state"]["finished_at_boot_ns"].as_u64().expect("exit time");
                        seen.insert(name, (exit, now));
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    kube.apply(&list.to_string()).expect("apply");
    let agent_seen = poller.join().expect("poller");
    let api_deadline = Instant::now() + Duration::from_secs(60);
    while api_seen.lock().len() < PODS && Instant::now() < api_deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let api_seen = api_seen.lock().clone();
    let mut to_agent = Vec::new();
    let mut to_api = Vec::new();
    for (name, (exit, agent_at)) in &agent_seen {
        to_agent.push(agent_at.saturating_sub(*exit) as f64 / 1e6);
        if let Some(api_at) = api_seen.get(name) {
            to_api.push(api_at.saturating_sub(*exit) as f64 / 1e6);
        }
    }
    to_agent.sort_by(f64::total_cmp);
    to_api.sort_by(f64::total_cmp);
    assert!(to_agent.len() >= 50 && to_api.len() >= 50, "agent {} / API {} exits seen", to_agent.len(), to_api.len());
    println!("| path | exits | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for (path, values) in
        [("exit -> agent API (2 ms polling)", &to_agent), ("exit -> Kubernetes pod status (watch)", &to_api)]
    {
        println!(
            "| {path} | {} | {:.1} | {:.1} | {:.1} |",
            values.len(),
            percentile(values, 0.5),
            percentile(values, 0.99),
            values[values.len() - 1]
        );
    }
    drop(agent);
    drop(rt);
}
