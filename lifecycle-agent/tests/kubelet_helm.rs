//! Kubelet tier, the Helm chart for real: `helm install` of deploy/helm/lifecycle-agent on a real
//! node (etcd, kube-apiserver and kubelet v1.20.2, containerd + runc) with this build's agent
//! image (the release image's builder, `lifecycle_image`), the agent pod Ready and serving, then
//! `helm uninstall` and nothing of the chart left: no DaemonSet, pod, ServiceAccount, ClusterRole,
//! binding, ConfigMap or release record.
//!
//! The node has no controller-manager: the test does what two of its controllers would. After the
//! install it creates the Pod the DaemonSet controller would (from the DaemonSet the API server
//! stored, owned by it); after the uninstall it deletes the pods the garbage collector would (those
//! owned by a DaemonSet that is gone). What helm itself creates and deletes is all helm's.
//!
//! Values exercised on the way: the image (repository, tag, pullPolicy Never), the custom CRI
//! socket (the harness's containerd, mounted by its directory), listen and health ports,
//! extraArgs/extraVolumes/extraVolumeMounts (the admin kubeconfig: this API server issues no
//! service-account tokens), and the dashboards as ConfigMaps.
//!
//! Needs helm: `$LIFECYCLE_HELM` (`xtask/x.sh test --tier kubelet` sets it from `xtask/x.sh helm`).
//! Run: `xtask/x.sh test --tier kubelet`.

use std::{
    net::TcpListener,
    path::Path,
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    agent::{free_port, get},
    kube::{self, drop_unpropagated_mount_propagation, helm_binary, Kube, AGENT_IMAGE},
};
use serde_json::{json, Value};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/lifecycle-agent");
const RELEASE: &str = "lifecycle-agent";
const NAMESPACE: &str = "lifecycle-system";
/// The chart's `--handoff-dir` (a DirectoryOrCreate hostPath).
const HANDOFF_DIR: &str = "/run/lifecycle-agent";
/// The Pod the test creates for the DaemonSet (its controller would add a random suffix).
const POD: &str = "lifecycle-agent-helm";
/// What the chart makes, by kind, and how to find it after the uninstall: every object carries
/// the release's instance label.
const NAMESPACED_KINDS: &str =
    "daemonsets,pods,serviceaccounts,configmaps,services,resourcequotas,secrets,roles,rolebindings";
const CLUSTER_KINDS: &str = "clusterroles,clusterrolebindings";

/// `preferred` when it is free on the host, else another free port.
fn port_or_free(preferred: u16) -> u16 {
    match TcpListener::bind(("0.0.0.0", preferred)) {
        Ok(_) => preferred,
        Err(_) => free_port(),
    }
}

/// Runs helm with `args` against the node; its stdout, or a panic with its stderr.
fn helm(kube: &Kube, binary: &Path, args: &[&str]) -> String {
    let output = kube.helm_command(binary).args(args).output().expect("run helm");
    assert!(
        output.status.success(),
        "helm {}: {}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The names kubectl prints for `kinds` with the release's instance label (in the namespace,
/// or cluster-wide with `namespace` None).
fn release_objects(kube: &Kube, kinds: &str, namespace: Option<&str>) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let mut args = vec!["get", kinds, "-l", &selector, "-o", "name"];
    if let Some(namespace) = namespace {
        args.extend(["-n", namespace]);
    }
    kube.kubectl(&args).expect("kubectl get").lines().map(str::to_owned).collect()
}

/// Cleans up after a failed test: the pod (with the node still up, so the agent detaches), the
/// release, and the handoff directory when the test's pod created it.
struct Installed<'a> {
    kube: &'a Kube,
    helm: &'a Path,
    created_handoff_dir: bool,
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.kube.helm_command(self.helm).args(["uninstall", RELEASE, "-n", NAMESPACE]).output();
            let _ = self.kube.kubectl(&["delete", "pod", "-n", NAMESPACE, POD, "--wait=false"]);
            let _ = self.kube.wait_pod_gone(NAMESPACE, POD, kube::POD_REMOVAL);
        }
        if self.created_handoff_dir {
            // The last agent's handoff socket and serving CA: nothing uses them any more.
            let _ = std::fs::remove_dir_all(HANDOFF_DIR);
        }
    }
}

#[test]
fn helm_install_runs_the_agent_and_uninstall_leaves_nothing() {
    let test = "helm_install_runs_the_agent_and_uninstall_leaves_nothing";
    if let Some(reason) = kube::skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return;
    }
    let helm_path = match helm_binary() {
        Ok(path) => path,
        Err(reason) => {
            eprintln!("SKIP {test}: {reason}");
            return;
        }
    };
    kube::sweep_stale();
    let began = Instant::now();
    let Some(kube) = kube::start_or_skip(test) else { return };
    eprintln!("node Ready in {:.1?}", began.elapsed());

    let began = Instant::now();
    let image = kube.import_agent_image(Path::new(AGENT)).expect("agent image");
    eprintln!("agent image built and imported in {:.1?}", began.elapsed());
    let (repository, tag) = image.rsplit_once(':').expect("image name:tag");
    assert_eq!(image, AGENT_IMAGE);

    // The release namespace, allowing privileged pods, as deploy/README.md tells operators.
    let namespace = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    });
    kube.apply(&namespace.to_string()).expect("create the namespace");

    let (port, health_port) = (port_or_free(9890), port_or_free(9892));
    let credentials = kube.write_agent_credentials().expect("credentials");
    let kubeconfig = credentials.join("kubeconfig");
    let values = json!({
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "criSocket": {"runtime": "custom", "path": kube.containerd_socket()},
        "listen": {"port": port},
        "health": {"port": health_port},
        "extraArgs": ["--kubeconfig", kubeconfig],
        "extraVolumes": [{"name": "test-credentials", "hostPath": {"path": credentials, "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "test-credentials", "mountPath": credentials, "readOnly": true}],
        "dashboards": {"enabled": true},
    });
    let values_file = kube.run_dir().join("helm-values.json");
    std::fs::write(&values_file, values.to_string()).expect("write values");
    let values_path = values_file.to_string_lossy().into_owned();

    let created_handoff_dir = !Path::new(HANDOFF_DIR).exists();
    let guard = Installed { kube: &kube, helm: &helm_path, created_handoff_dir };
    let began = Instant::now();
    let installed = helm(&kube, &helm_path, &["install", RELEASE, CHART, "-n", NAMESPACE, "-f", &values_path]);
    eprintln!("helm install in {:.1?}:\n{installed}", began.elapsed());
    // A 1.20 API server serves no DaemonSet maxSurge: the chart falls back and says so.
    assert!(installed.contains("maxUnavailable: 1"), "NOTES on the update strategy:\n{installed}");
    let listed = helm(&kube, &helm_path, &["list", "-n", NAMESPACE, "-o", "json"]);
    let listed: Value = serde_json::from_str(&listed).expect("helm list JSON");
    assert_eq!(listed[0]["status"], "deployed", "{listed:#}");

    // The DaemonSet's pod, as its controller would create it.
    let daemonset: Value = serde_json::from_str(
        &kube.kubectl(&["get", "daemonset", RELEASE, "-n", NAMESPACE, "-o", "json"]).expect("get ds"),
    )
    .expect("DaemonSet JSON");
    let mut pod = kube.daemonset_pod(&daemonset, POD);
    drop_unpropagated_mount_propagation(&mut pod);
    let began = Instant::now();
    kube.apply(&pod.to_string()).expect("create the DaemonSet's pod");
    kube.wait_pod_condition(NAMESPACE, POD, "Ready", Duration::from_secs(60)).expect("agent pod Ready");
    eprintln!("agent pod Ready (its readiness probe on :{health_port}) in {:.1?}", began.elapsed());
    let (code, metrics) = get(&format!("127.0.0.1:{port}"), "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    for feature in ["process_exit", "kubernetes_api"] {
        let line = format!("lifecycle_feature_enabled{{feature=\"{feature}\"}} 1");
        assert!(metrics.contains(&line), "{line} in the pod's metrics:\n{metrics}");
    }
    // Issue 40: in its pod (hostPID) the agent reads the kubelet's command line and files, and,
    // with the chart's ClusterRole (`get nodes`), its release.
    let info = metrics.lines().find(|l| l.starts_with("lifecycle_kubelet_info{")).unwrap_or_default();
    for label in ["version=\"v1.20.2\"", "source=\"node\"", "backoff=\"known\""] {
        assert!(info.contains(label), "{label} in {info:?}");
    }
    let made = release_objects(&kube, NAMESPACED_KINDS, Some(NAMESPACE));
    for object in [
        "daemonset.apps/lifecycle-agent",
        "serviceaccount/lifecycle-agent",
        // The kubectl plugin's reader account and its users' Role in the agents' namespace.
        "serviceaccount/lifecycle-reader",
        "role.rbac.authorization.k8s.io/lifecycle-plugin-user",
        &format!("pod/{POD}"),
    ] {
        assert!(made.iter().any(|m| m == object), "{object} in {made:?}");
    }
    assert!(made.iter().filter(|m| m.starts_with("configmap/")).count() >= 4, "the dashboards' ConfigMaps: {made:?}");
    let cluster = release_objects(&kube, CLUSTER_KINDS, None);
    // The agent's, the readers' and the plugin users' ClusterRoles; the agent's and the plugin's
    // reader account's bindings.
    assert_eq!(cluster.len(), 5, "three ClusterRoles and two bindings: {cluster:?}");

    let began = Instant::now();
    helm(&kube, &helm_path, &["uninstall", RELEASE, "-n", NAMESPACE]);
    eprintln!("helm uninstall in {:.1?}", began.elapsed());
    // The garbage collector's part: pods whose owning DaemonSet is gone.
    let uid = daemonset["metadata"]["uid"].as_str().expect("DaemonSet uid");
    let pods: Value =
        serde_json::from_str(&kube.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "json"]).expect("get pods"))
            .expect("JSON");
    for pod in pods["items"].as_array().into_iter().flatten() {
        if pod["metadata"]["ownerReferences"].as_array().into_iter().flatten().any(|o| o["uid"] == uid) {
            let name = pod["metadata"]["name"].as_str().expect("pod name");
            kube.kubectl(&["delete", "pod", "-n", NAMESPACE, name, "--wait=false"]).expect("delete the orphan");
            let gone = kube.wait_pod_gone(NAMESPACE, name, kube::POD_REMOVAL).expect("agent pod gone");
            eprintln!("the DaemonSet's pod {name} gone {gone:.1?} after its deletion");
        }
    }

    let left = release_objects(&kube, NAMESPACED_KINDS, Some(NAMESPACE));
    assert!(left.is_empty(), "left in {NAMESPACE} after helm uninstall: {left:?}");
    let left = release_objects(&kube, CLUSTER_KINDS, None);
    assert!(left.is_empty(), "cluster objects left after helm uninstall: {left:?}");
    // Helm's own record of the release (Secrets labelled owner=helm).
    let records =
        kube.kubectl(&["get", "secrets", "-n", NAMESPACE, "-l", "owner=helm", "-o", "name"]).expect("secrets");
    assert!(records.trim().is_empty(), "helm's release records left: {records}");
    for name in ["lifecycle-agent", "lifecycle-api-reader"] {
        let found = kube.kubectl(&["get", "clusterrole", name, "--ignore-not-found", "-o", "name"]).expect("get");
        assert!(found.trim().is_empty(), "ClusterRole {name} left");
    }
    let listed = helm(&kube, &helm_path, &["list", "-n", NAMESPACE, "--all", "-q"]);
    assert!(listed.trim().is_empty(), "helm still lists {listed}");
    drop(guard);
    eprintln!("nothing of the chart is left");
}
