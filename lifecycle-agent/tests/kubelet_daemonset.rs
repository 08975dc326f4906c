//! Kubelet tier, the DaemonSet for real: the pod template of deploy/daemonset.yaml runs as a Pod
//! on a real node (etcd, kube-apiserver and kubelet v1.20.2, containerd + runc; and on the modern
//! tier's 1.37 node with containerd 2.4), from a local
//! image of this build's agent, with the template's hostPID, hostNetwork, capabilities, seccomp
//! and AppArmor settings, volumes and mounts; the agent inside it must see the node's other pods
//! and judge their stops as the agent beside the node does (kubelet_verdicts.rs).
//!
//! The node has no scheduler and no controller-manager, so no DaemonSet controller: the test
//! takes the DaemonSet's pod template and creates the Pod itself, bound to the node.
//!
//! Run: `xtask/x.sh test --tier kubelet`.

use std::{
    collections::BTreeSet,
    net::TcpListener,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    agent::{free_port, get, get_with_token},
    bpf,
    kube::{self, Kube, NodeVersion},
};
use serde_json::{json, Value};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");
const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml");
const NAMESPACE: &str = "lifecycle-system";
const AGENT_POD: &str = "lifecycle-agent";
/// The kubectl plugin, a crate of its own (`kubectl-lifecycle/`) built into the same target
/// directory: the kubelet tier builds it before this test (`cargo build -p kubectl-lifecycle`).
fn plugin_binary() -> std::path::PathBuf {
    let path = Path::new(AGENT).with_file_name("kubectl-lifecycle");
    assert!(path.is_file(), "{} is not built: cargo build -p kubectl-lifecycle", path.display());
    path
}
const IGNORE_TERM: &str = "trap '' TERM; while true; do sleep 0.2; done";

/// The objects of the manifest at `path` as kubectl reads them (client-side: nothing is created).
fn manifest_objects(kube: &Kube, path: &str) -> Vec<Value> {
    // Not validated against this node's API server: the manifest is for current clusters (its
    // DaemonSet surges, which a 1.20 API server does not know); check_manifests.py validates it
    // against the 1.28 and 1.37 schemas. The test takes only the pod template from it.
    let text = kube
        .kubectl(&["create", "--dry-run=client", "--validate=false", "-o", "json", "-f", path])
        .expect("kubectl reads it");
    // One JSON document per object, one after the other (a List when kubectl chooses to).
    let mut objects = Vec::new();
    for value in serde_json::Deserializer::from_str(&text).into_iter::<Value>() {
        let value = value.expect("JSON");
        match value["kind"].as_str() {
            Some("List") => objects.extend(value["items"].as_array().cloned().unwrap_or_default()),
            _ => objects.push(value),
        }
    }
    objects
}

/// `preferred` (the template's port) when it is free on the host, else another free port.
fn port_or_free(preferred: u16) -> u16 {
    match TcpListener::bind(("0.0.0.0", preferred)) {
        Ok(_) => preferred,
        Err(_) => free_port(),
    }
}

/// The DaemonSet's pod template as a Pod bound to the node, running `image`, listening on
/// `port`, with the node's CRI socket and an API kubeconfig mounted from `credentials`.
fn agent_pod(kube: &Kube, daemonset: &Value, image: &str, ports: Ports, credentials: &Path) -> Value {
    agent_pod_named(kube, daemonset, AGENT_POD, image, ports, credentials)
}

/// The manifest's DaemonSet made in the API (no controller acts on it on this node), and the
/// controller reference its pods carry, as the DaemonSet controller writes it: the kubectl plugin
/// sends its token only to pods of the agents' DaemonSet.
fn create_daemonset(kube: &Kube, daemonset: &Value) -> Value {
    let mut object = daemonset.clone();
    // A 1.20 API server knows no DaemonSet maxSurge; the strategy plays no part here.
    object["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}});
    kube.apply(&object.to_string()).expect("create the DaemonSet");
    let name = daemonset["metadata"]["name"].as_str().expect("the DaemonSet's name");
    let stored = kube.kubectl(&["get", "daemonset", "-n", NAMESPACE, name, "-o", "json"]).expect("get the DaemonSet");
    let stored: Value = serde_json::from_str(&stored).expect("JSON");
    json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": stored["metadata"]["uid"],
            "controller": true, "blockOwnerDeletion": true}])
}

/// The agent's `--listen` and `--health-listen` ports: the template's 9890 and 9892 when free on
/// the host, else others.
#[derive(Clone, Copy)]
struct Ports {
    listen: u16,
    health: u16,
}

impl Ports {
    fn pick() -> Self {
        Self { listen: port_or_free(9890), health: port_or_free(9892) }
    }
}

/// [`agent_pod`] named `name` (a DaemonSet's surge runs two on a node for a while; they share
/// the ports by SO_REUSEPORT).
fn agent_pod_named(kube: &Kube, daemonset: &Value, name: &str, image: &str, ports: Ports, credentials: &Path) -> Value {
    let Ports { listen: port, health: health_port } = ports;
    let template = &daemonset["spec"]["template"];
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": daemonset["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
            "annotations": template["metadata"]["annotations"],
            "ownerReferences": create_daemonset(kube, daemonset),
        },
        "spec": template["spec"],
    });
    let spec = &mut pod["spec"];
    // No scheduler on the test node: bound here, as the DaemonSet controller would.
    spec["nodeName"] = kube.node_name().into();
    let containers = spec["containers"].as_array_mut().expect("containers");
    assert_eq!(containers.len(), 2, "the agent and its socket keeper in the template");
    assert_eq!(containers[1]["args"][0], "keep-sockets", "the second is the keeper");
    containers[1]["image"] = image.into();
    containers[1]["imagePullPolicy"] = "Never".into();
    let agent = &mut containers[0];
    agent["image"] = image.into();
    agent["imagePullPolicy"] = "Never".into();
    // The template's --listen is 0.0.0.0:9890 and its `metrics` port (the probes' target) 9890:
    // both follow the port chosen (with hostNetwork the host port is the container port).
    let listen = format!("0.0.0.0:{port}");
    let args = agent["args"].as_array_mut().expect("args");
    let at = args.iter().position(|a| a == "--listen").expect("--listen in the template");
    args[at + 1] = listen.into();
    // The test node's containerd does not serve /run/containerd/containerd.sock: its socket is in
    // the harness's private directory. Pointed at with --cri-socket, and that DIRECTORY mounted
    // at the same path below (as the template mounts /run/containerd, for the same reason).
    let socket = kube.containerd_socket();
    let socket_dir = socket.parent().expect("socket directory");
    args.push("--cri-socket".into());
    args.push(socket.to_string_lossy().into_owned().into());
    // API credentials: the test node's API server takes static tokens and runs without the
    // ServiceAccount admission plugin (no signing key, no token controller), so the pod gets
    // no service-account token and in-cluster credentials cannot work. The agent falls back to
    // --kubeconfig: the admin's, mounted from the host (the template's serviceAccountName stays;
    // nothing checks it here).
    let kubeconfig = credentials.join("kubeconfig");
    args.push("--kubeconfig".into());
    args.push(kubeconfig.to_string_lossy().into_owned().into());
    // Likewise --health-listen 127.0.0.1:9892 and the port the kubelet probes the agent on.
    let at = args.iter().position(|a| a == "--health-listen").expect("--health-listen in the template");
    args[at + 1] = format!("127.0.0.1:{health_port}").into();
    assert!(agent.get("ports").is_none(), "the template declares no container ports (they would be host ports)");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(agent[probe]["httpGet"]["port"], 9892, "{probe} on the health port");
        agent[probe]["httpGet"]["port"] = health_port.into();
    }
    agent["volumeMounts"].as_array_mut().expect("volumeMounts").extend([
        json!({"name": "test-cri", "mountPath": socket_dir, "readOnly": true, "mountPropagation": "HostToContainer"}),
        json!({"name": "test-credentials", "mountPath": credentials, "readOnly": true}),
    ]);
    spec["volumes"].as_array_mut().expect("volumes").extend([
        json!({"name": "test-cri", "hostPath": {"path": socket_dir, "type": "Directory"}}),
        json!({"name": "test-credentials", "hostPath": {"path": credentials, "type": "Directory"}}),
    ]);
    // The source of a HostToContainer mount must propagate; where it cannot, the field goes.
    kube::drop_unpropagated_mount_propagation(&mut pod);
    pod
}

/// The agent's view of container `app` of pod `name`, once `done` holds (within `within`), read
/// with the bearer `token` (the template runs the agent with --api-auth kubernetes).
fn wait_agent(
    addr: &str,
    token: &str,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let began = Instant::now();
    loop {
        let found = get_with_token(addr, "/api/v1/containers", Some(token))
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["containers"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["pod"] == name && c["container"] == "app");
        if let Some(c) = found.as_ref().filter(|c| done(c)) {
            return c.clone();
        }
        assert!(began.elapsed() < within, "{name}: not {what} within {within:?}; last seen: {found:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Deletes the agent pod and waits until it is gone: the agent must exit on the kubelet's
/// SIGTERM (detaching its programs) within the template's grace, not be SIGKILLed after it.
fn delete_agent_pod(kube: &Kube) {
    delete_agent_pod_named(kube, AGENT_POD);
}

fn delete_agent_pod_named(kube: &Kube, name: &str) {
    let pod = kube.pod(NAMESPACE, name).expect("get").expect("agent pod");
    let status = kube::container_status(&pod, "agent").expect("agent status");
    let id = status["containerID"].as_str().expect("containerID");
    let id = id.rsplit_once("://").map_or(id, |(_, id)| id);
    let exits = kube.watch_task_exits().expect("watch task exits");
    let began = Instant::now();
    kube.kubectl(&["delete", "pod", "-n", NAMESPACE, name, "--wait=false"]).expect("delete the agent pod");
    let exit = exits.wait_for(id, Duration::from_secs(30)).expect("the agent exits");
    let exited = exit.seen.duration_since(began);
    kube.wait_pod_gone(NAMESPACE, name, kube::POD_REMOVAL).expect("agent pod gone");
    eprintln!(
        "agent exited {exited:.1?} after the pod's deletion (status {}); pod gone after {:.1?}",
        exit.exit_status,
        began.elapsed()
    );
    assert_eq!(exit.exit_status, 0, "the agent exits on SIGTERM, in {exited:.1?}");
}

/// Deletes the agent pod before the node goes, even when an assertion failed; then removes the
/// host directories its DirectoryOrCreate volumes created.
struct AgentPod<'a> {
    kube: &'a Kube,
    created_dirs: Vec<&'static str>,
    /// The agent pods to delete (if still there) when the test fails.
    names: Vec<String>,
}

impl<'a> AgentPod<'a> {
    fn new(kube: &'a Kube, created_dirs: Vec<&'static str>) -> Self {
        Self { kube, created_dirs, names: vec![AGENT_POD.to_owned()] }
    }
}

/// The template's host directories: those missing now are created by its DirectoryOrCreate
/// volumes, and removed by the test.
fn missing_host_dirs() -> Vec<&'static str> {
    ["/run/containerd", "/var/run/crio", HANDOFF_DIR].into_iter().filter(|p| !Path::new(p).exists()).collect()
}

/// The template's `--handoff-dir` (a hostPath).
const HANDOFF_DIR: &str = "/run/lifecycle-agent";

impl Drop for AgentPod<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in &self.names {
                eprintln!("agent pod {name} log:\n{}", agent_log(self.kube, name));
                let _ = self.kube.kubectl(&["delete", "pod", "-n", NAMESPACE, name, "--wait=false"]);
            }
            for name in &self.names {
                let _ = self.kube.wait_pod_gone(NAMESPACE, name, kube::POD_REMOVAL);
            }
        }
        for dir in &self.created_dirs {
            if *dir == HANDOFF_DIR {
                // The last agent's socket (nothing listens on it any more) and the CA of the
                // certificate it made.
                let _ = std::fs::remove_file(Path::new(dir).join("handoff.sock"));
                let _ = std::fs::remove_file(Path::new(dir).join("serving-ca.crt"));
            }
            // Empty unless something else started using it meanwhile; then it stays.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Issue 20 and issue 37 item 1: `kubectl lifecycle` from anywhere, and no credential of the
/// user's ever reaches a node. A user whose kubeconfig gets a token from an exec credential plugin
/// (the reader, as `aws eks get-token` gives one), with deploy/rbac.yaml's lifecycle-plugin-user
/// roles only, explains pods through the API server's proxy: the plugin mints a token of the
/// lifecycle-reader account for the agents' audience and sends that. A listener bound beside the
/// agent on its port (SO_REUSEPORT, as root in the node's network namespace: what a root
/// hostNetwork pod can do) and speaking TLS as the proxy expects catches what it is sent: never the
/// user's token; what it may catch is the minted one, audience-bound and short-lived. A gone
/// pod's node comes from its kubelet's Events; a pod no Event names costs no agent a request.
fn explained_from_anywhere_with_a_readers_own_rights(kube: &Kube, port: u16) {
    let bind = |kind: &str, name: &str, namespace: Option<&str>| {
        let mut binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": if kind == "Role" { "RoleBinding" } else { "ClusterRoleBinding" },
            "metadata": {"name": format!("test-plugin-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": "lifecycle-plugin-user"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]});
        if let Some(namespace) = namespace {
            binding["metadata"]["namespace"] = namespace.into();
        }
        kube.apply(&binding.to_string()).expect("bind the plugin's roles");
    };
    // The documented roles (deploy/rbac.yaml, applied with the agent): cluster-wide, and in the
    // agents' namespace.
    bind("ClusterRole", kube::READER, None);
    bind("Role", kube::READER, Some(NAMESPACE));
    // The reader's kubeconfig: the node's cluster, and the reader's token from an exec credential
    // plugin, as managed clusters' kubeconfigs give it.
    let admin: Value =
        serde_json::from_str(&std::fs::read_to_string(kube.kubeconfig()).expect("kubeconfig")).expect("JSON");
    let kubeconfig_of = |user: &str, token: &str| {
        let credential = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
            "status": {"token": token}});
        let credential_file = kube.run_dir().join(format!("{user}-credential.json"));
        std::fs::write(&credential_file, credential.to_string()).expect("write the credential");
        let exec = json!({"apiVersion": "client.authentication.k8s.io/v1", "command": "cat",
            "args": [credential_file.to_string_lossy()], "interactiveMode": "Never"});
        let config = json!({"apiVersion": "v1", "kind": "Config", "current-context": user,
            "clusters": admin["clusters"].clone(),
            "users": [{"name": user, "user": {"exec": exec}}],
            "contexts": [{"name": user, "context": {"cluster": admin["clusters"][0]["name"].clone(), "user": user,
                                                    "namespace": "default"}}]});
        let path = kube.run_dir().join(format!("{user}-kubeconfig"));
        std::fs::write(&path, config.to_string()).expect("write the kubeconfig");
        path
    };
    let kubeconfig = kubeconfig_of("reader", kube.reader_token());
    let plugin_as = |kubeconfig: &Path, args: &[&str]| {
        Command::new(plugin_binary())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .args(["--agent-port", &port.to_string()])
            .env_remove("KUBECONFIG")
            .output()
            .expect("run kubectl-lifecycle")
    };
    let plugin = |args: &[&str]| plugin_as(&kubeconfig, args);
    let capture = Capture::beside(port);
    // A typo, or a pod no Event names: no agent is asked, the user is told how to ask them all.
    let typo = plugin(&["explain", "default/stubbron"]);
    assert!(!typo.status.success());
    let said = String::from_utf8_lossy(&typo.stderr);
    assert!(said.contains("no kubelet Event names its node") && said.contains("--all-nodes"), "{said}");
    // The pod is gone from the API: its node is the one its kubelet's Events name.
    kube.wait_pod_gone("default", "stubborn", kube::POD_REMOVAL).expect("stubborn gone from the API");
    // Through the proxy, a connection may land on the capturing listener (then the plugin says
    // the agent did not answer): asked again until the agent answers.
    let answered = |args: &[&str], done: &dyn Fn(&Value) -> bool| -> Value {
        let began = Instant::now();
        loop {
            let output = plugin(args);
            let answer: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
            if output.status.success() && done(&answer) {
                return answer;
            }
            assert!(began.elapsed() < Duration::from_secs(90), "{args:?}: {output:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let stories = answered(&["explain", "default/stubborn", "-o", "json"], &|stories| stories[0]["cause"] == "deleted");
    let story = &stories[0];
    assert!(
        story["verdict"]
            .as_str()
            .is_some_and(|v| v.starts_with("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace")),
        "{stories:#}"
    );
    // Naming its node asks that node's agent alone: the same story.
    let named = answered(&["explain", "stubborn", "--node", kube.node_name(), "-o", "json"], &|s| s[0].is_object());
    assert_eq!(named[0]["verdict"], story["verdict"], "{named:#}");
    let all = answered(&["explain", "default/stubborn", "--all-nodes", "-o", "json"], &|s| s[0].is_object());
    assert_eq!(all[0]["verdict"], story["verdict"], "{all:#}");
    // The same client for an OOM kill and a liveness kill, each judged by the DaemonSet's agent.
    let explained = |pod: &str, done: &dyn Fn(&Value) -> bool| -> Value {
        answered(&["explain", &format!("default/{pod}"), "-o", "json"], &|stories| done(&stories[0]))[0].clone()
    };
    let verdict = |story: &Value| story["verdict"].as_str().unwrap_or_default().to_owned();
    let oom = explained("oomer", &|story| verdict(story).starts_with("OOM-killed"));
    eprintln!("oomer through the plugin: {}", oom["verdict"]);
    assert!(verdict(&oom).starts_with("OOM-killed at the"), "which limit fired: {oom:#}");
    assert!(oom["timeline"].to_string().contains("memory limit fired"), "{oom:#}");
    let shell = explained("shell", &|story| story["cause"] == "deleted");
    eprintln!("shell through the plugin: {}", shell["verdict"]);
    assert!(verdict(&shell).contains("PID 1 `sh` got SIGTERM and did not pass it on: `"), "{shell:#}");
    let overrun = explained("overrun", &|story| story["cause"] == "deleted");
    eprintln!("overrun through the plugin: {}", overrun["verdict"]);
    let overrun_lines = overrun["timeline"].to_string();
    assert!(overrun_lines.contains("preStop hook started"), "{overrun:#}");
    assert!(
        verdict(&overrun).starts_with("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace"),
        "{overrun:#}"
    );
    let unlively = explained("unlively", &|story| story["cause"] == "liveness_probe");
    eprintln!("unlively through the plugin: {}", unlively["verdict"]);
    assert!(
        verdict(&unlively).starts_with("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace"),
        "{unlively:#}"
    );
    // `status` across the cluster: every node's agent (one here), rows with the node's name.
    let nodes = answered(&["status", "-A", "-o", "json"], &|nodes| nodes.as_array().is_some_and(|n| n.len() == 1));
    assert_eq!(nodes[0]["node"], kube.node_name(), "{nodes:#}");
    let began = Instant::now();
    let table = loop {
        let wide = plugin(&["status", "-n", NAMESPACE, "-c", "agent", "-o", "wide"]);
        let table = String::from_utf8_lossy(&wide.stdout).into_owned();
        if wide.status.success() && table.lines().count() > 1 {
            break table;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "{wide:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with(NAMESPACE) && row.contains(" agent ") && row.trim_end().ends_with(kube.node_name()),
        "the agent's own container, on its node: {table}"
    );
    // A user with the cluster-wide role but not the one in the agents' namespace may not mint the
    // reader's token: the API server refuses, and the plugin says what is missing.
    kube.kubectl(&["create", "serviceaccount", "outsider"]).expect("service account");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "test-plugin-outsider"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lifecycle-plugin-user"},
        "subjects": [{"kind": "ServiceAccount", "name": "outsider", "namespace": "default"}]});
    kube.apply(&binding.to_string()).expect("bind the plugin role");
    let outsider = kube.kubectl(&["create", "token", "outsider"]).expect("kubectl create token").trim().to_owned();
    let refused =
        plugin_as(&kubeconfig_of("outsider", &outsider), &["explain", "default/stubborn", "--node", kube.node_name()]);
    assert!(!refused.status.success(), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("cannot mint a token of lifecycle-system/lifecycle-reader") && said.contains("403"),
        "{said}"
    );
    // The API server's proxy keeps its connection to the agent's port open between requests, so
    // the commands above may all have gone over one the agent accepted. Commands at once make it
    // open connections of its own, which the kernel spreads over both listeners.
    if capture.bound {
        let began = Instant::now();
        while capture.connections() == 0 {
            let running: Vec<_> = (0..12)
                .map(|_| {
                    Command::new(plugin_binary())
                        .arg("--kubeconfig")
                        .arg(&kubeconfig)
                        .args(["status", "-A", "-o", "json", "--agent-port", &port.to_string()])
                        .env_remove("KUBECONFIG")
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .expect("run kubectl-lifecycle")
                })
                .collect();
            for mut child in running {
                let _ = child.wait();
            }
            assert!(began.elapsed() < Duration::from_secs(90), "no proxied connection reached the capturing listener");
        }
    }
    // What the capturing listener caught, across every command above.
    capture.assert_no_user_token(&[kube.reader_token(), &outsider, kube.token()]);
}

/// A listener beside the agent's --listen (SO_REUSEPORT on the same port, as root in the node's
/// network namespace), speaking TLS as the API server's proxy expects (it checks no certificate),
/// that keeps every bearer token sent to it.
struct Capture {
    /// The tokens caught, and how many connections reached it.
    caught: std::sync::Arc<parking_lot::Mutex<(Vec<String>, usize)>>,
    /// Whether it could bind beside the agent at all.
    bound: bool,
}

impl Capture {
    fn beside(port: u16) -> Self {
        let caught = std::sync::Arc::new(parking_lot::Mutex::new((Vec::new(), 0)));
        let Some(listener) = reuse_port_listener(port) else {
            eprintln!("the agent's --listen cannot be shared: the capturing listener could not bind beside it");
            return Self { caught, bound: false };
        };
        let certified = rcgen::generate_simple_self_signed(vec!["capture".to_owned()]).expect("a certificate");
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .expect("TLS config");
        let config = std::sync::Arc::new(config);
        let keep = caught.clone();
        // Detached: it catches until the test process ends (the listener closes with it).
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let Ok(tls) = tokio_rustls::rustls::ServerConnection::new(config.clone()) else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut tls = tokio_rustls::rustls::StreamOwned::new(tls, stream);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && std::io::Read::read(&mut tls, &mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let mut kept = keep.lock();
                kept.1 += 1;
                for line in text.lines() {
                    let lower = line.to_ascii_lowercase();
                    if lower.starts_with("authorization:") || lower.starts_with("x-lifecycle-authorization:") {
                        kept.0.push(line.split_once(':').map(|(_, v)| v.trim().to_owned()).unwrap_or_default());
                    }
                }
                drop(kept);
                let _ = std::io::Write::write_all(
                    &mut tls,
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 8\r\nconnection: close\r\n\r\ncaptured",
                );
                tls.conn.send_close_notify();
                let _ = std::io::Write::flush(&mut tls);
            }
        });
        Self { caught, bound: true }
    }

    /// Connections that reached it.
    fn connections(&self) -> usize {
        self.caught.lock().1
    }

    /// None of `credentials` (the users' own tokens) was caught; every token caught was minted for
    /// the agents' audience, for the reader account.
    fn assert_no_user_token(&self, credentials: &[&str]) {
        let (caught, connections) = self.caught.lock().clone();
        eprintln!(
            "the capturing listener (bound beside the agent: {}) took {connections} connections and caught {} tokens",
            self.bound,
            caught.len()
        );
        for token in &caught {
            let bearer = token.strip_prefix("Bearer ").unwrap_or(token);
            assert!(!credentials.contains(&bearer), "a user's own credential reached a node: {token}");
            let claims = jwt_claims(bearer).unwrap_or_else(|| panic!("not a minted token: {token}"));
            assert_eq!(claims["aud"], json!(["lifecycle-agent"]), "{claims}");
            assert_eq!(claims["sub"], "system:serviceaccount:lifecycle-system:lifecycle-reader", "{claims}");
            let life = claims["exp"].as_i64().unwrap_or_default() - claims["iat"].as_i64().unwrap_or_default();
            assert!(life <= 3600, "short-lived: {claims}");
        }
        if self.bound && !caught.is_empty() {
            // An agent whose --listen can be shared (before issue 37's exclusive listeners): a
            // minted token can be caught; it reads the agents' API for its ten minutes and is
            // refused by the API server.
            eprintln!("NOTE: minted tokens were caught beside a shareable --listen");
        }
    }
}

/// A listening socket on 0.0.0.0:`port` with SO_REUSEPORT, or None when the port cannot be shared.
fn reuse_port_listener(port: u16) -> Option<TcpListener> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: plain socket calls on a descriptor this function owns until it is handed to std.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let one: libc::c_int = 1;
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, (&one as *const libc::c_int).cast(), size);
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: 0 },
            sin_zero: [0; 8],
        };
        let bound = libc::bind(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if bound != 0 || libc::listen(fd, 128) != 0 {
            libc::close(fd);
            return None;
        }
        Some(TcpListener::from_raw_fd(fd))
    }
}

/// The claims of a JWT (its middle part, base64url), if `token` is one.
fn jwt_claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    let mut bits = 0u32;
    let mut count = 0;
    let mut bytes = Vec::new();
    for c in payload.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            b'=' => continue,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            bytes.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    serde_json::from_slice(&bytes).ok()
}

/// Issue 18: with `--api-auth kubernetes` and no certificate given, the agent makes one and writes
/// its CA into the handoff directory. `status` on the node, pointed at the node's own address
/// (not loopback), finds that CA by default and reads the API over TLS with a token; the same
/// request in clear is refused before the token is looked at.
fn credentials_from_off_the_host_go_over_the_certificate_the_agent_made(kube: &Kube, port: u16, reader: &str) {
    let node = if_addrs::get_if_addrs()
        .expect("interfaces")
        .into_iter()
        .map(|i| i.ip())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .expect("the node has a non-loopback IPv4 address");
    let server = format!("{node}:{port}");
    let ca = Path::new(HANDOFF_DIR).join("serving-ca.crt");
    assert!(ca.is_file(), "the agent wrote its CA to {}", ca.display());
    let token = kube.run_dir().join("reader-token");
    std::fs::write(&token, reader).expect("write the token");
    let status = Command::new(AGENT)
        .args(["status", "--server", &server, "-o", "json", "--token-file"])
        .arg(&token)
        .output()
        .expect("run status");
    assert!(status.status.success(), "status over TLS at {server}: {status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"containers\""), "{status:?}");
    let (code, body) = get_with_token(&server, "/api/v1/containers", Some(reader)).expect("an answer");
    assert_eq!(code, 403, "a token in clear from off the host: {body}");
}

/// The template's `--api-auth kubernetes` and `--api-auth-audience lifecycle-agent`: /api/*
/// answers only bearer tokens minted for the agents' audience whose user the API server allows,
/// by the manifest's `lifecycle-api-reader` role (bound to the `lifecycle-reader` account);
/// a credential issued for the API server itself — the admin's, a user's own — is refused (401);
/// /metrics stays open. Returns a token of the reader account for the agents.
fn api_access_is_decided_by_the_api_server(kube: &Kube, addr: &str) -> String {
    let containers = |token: Option<&str>| get_with_token(addr, "/api/v1/containers", token).map(|(code, _)| code);
    assert_eq!(get(addr, "/metrics").map(|(code, _)| code), Some(200), "/metrics needs no token");
    assert_eq!(containers(None), Some(401), "no token");
    assert_eq!(containers(Some("not-a-token")), Some(401), "a token the API server does not know");
    assert_eq!(containers(Some(kube.token())), Some(401), "the admin's own credential, not for the agents");
    assert_eq!(containers(Some(kube.reader_token())), Some(401), "a user's own credential, not for the agents");
    let minted = |account: &str, namespace: &str| {
        kube.kubectl(&[
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--audience",
            "lifecycle-agent",
            "--duration",
            "1h",
        ])
        .expect("kubectl create token")
        .trim()
        .to_owned()
    };
    kube.kubectl(&["create", "serviceaccount", "stranger"]).expect("service account");
    assert_eq!(containers(Some(&minted("stranger", "default"))), Some(403), "minted for the agents, without the role");
    let reader = minted("lifecycle-reader", NAMESPACE);
    let began = Instant::now();
    while containers(Some(&reader)) != Some(200) {
        assert!(began.elapsed() < Duration::from_secs(30), "the reader account is allowed");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("the reader account's token was allowed after {:.1?}", began.elapsed());
    let (_, metrics) = get(addr, "/metrics").expect("metrics");
    for result in ["allowed", "denied", "unauthenticated"] {
        let line = format!("lifecycle_api_auth_reviews_total{{result=\"{result}\"}} ");
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} in the metrics"));
        assert!(count >= 1, "{line}{count}");
    }
    reader
}

#[test]
fn the_daemonset_pod_template_runs_the_agent_on_the_node() {
    daemonset_runs_on("the_daemonset_pod_template_runs_the_agent_on_the_node", NodeVersion::V1_20);
}

/// Issue 19: the same on the current node (kubelet 1.37, containerd 2.4). Run by the modern tier
/// (`xtask/x.sh test --tier modern`), skipped where its binaries are not provided.
#[test]
fn the_daemonset_pod_template_runs_the_agent_on_a_1_37_node() {
    daemonset_runs_on("the_daemonset_pod_template_runs_the_agent_on_a_1_37_node", NodeVersion::V1_37);
}

fn daemonset_runs_on(test: &str, version: NodeVersion) {
    if let Some(reason) = kube::skip_reason_for(version) {
        eprintln!("SKIP {test}: {reason}");
        return;
    }
    kube::sweep_stale();
    let began = Instant::now();
    let Some(kube) = kube::start_or_skip_version(test, version) else { return };
    eprintln!("{version:?} node Ready in {:.1?}", began.elapsed());

    let began = Instant::now();
    let image = kube.import_agent_image(Path::new(AGENT)).expect("agent image");
    eprintln!("agent image built and imported in {:.1?}", began.elapsed());

    let objects = manifest_objects(&kube, MANIFEST);
    let namespace = objects.iter().find(|o| o["kind"] == "Namespace").expect("the manifest's Namespace");
    assert_eq!(namespace["metadata"]["name"], NAMESPACE);
    kube.apply(&namespace.to_string()).expect("create the namespace");
    // The accounts and roles of deploy/rbac.yaml: the agent's (its pod mounts a token of it for
    // the agents' audience), the plugin's reader, the readers' and the plugin users' roles.
    for object in manifest_objects(&kube, RBAC) {
        kube.apply(&object.to_string()).expect("apply deploy/rbac.yaml");
    }
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("the manifest's DaemonSet");
    let template = &daemonset["spec"]["template"]["spec"];
    assert_eq!((&template["hostPID"], &template["hostNetwork"]), (&true.into(), &true.into()));

    let ports = Ports::pick();
    let addr = format!("127.0.0.1:{}", ports.listen);
    let credentials = kube.write_agent_credentials().expect("agent credentials");
    let manifest = agent_pod(&kube, daemonset, image, ports, &credentials);
    // The template's DirectoryOrCreate volumes create these on the host when missing.
    let created_dirs = missing_host_dirs();
    let programs_before = bpf::program_ids();
    let began = Instant::now();
    kube.apply(&manifest.to_string()).expect("create the agent pod");
    let guard = AgentPod::new(&kube, created_dirs);
    kube.wait_pod_condition(NAMESPACE, AGENT_POD, "Ready", Duration::from_secs(60)).expect("agent pod Ready");
    eprintln!("agent pod Ready (its readiness probe on :{}) in {:.1?}", ports.health, began.elapsed());

    // The pod's own agent, reached on the host: hostNetwork.
    let (code, metrics) = get(&addr, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    // oom_log: the template's SYSLOG capability lets it read the kernel log (dmesg_restrict).
    for feature in ["process_exit", "kubernetes_api", "oom_log"] {
        let line = format!("lifecycle_feature_enabled{{feature=\"{feature}\"}} 1");
        assert!(metrics.contains(&line), "{line} in the pod's metrics:\n{metrics}");
    }
    // Issue 40: the template's hostPID and SYS_PTRACE let the agent read the kubelet's command
    // line and its configuration inside the kubelet's root; the back-off is the node's.
    let info = metrics.lines().find(|l| l.starts_with("lifecycle_kubelet_info{")).unwrap_or_default();
    assert!(info.contains("source=\"node\"") && info.contains("backoff=\"known\""), "{info:?}");
    let max = if version == NodeVersion::V1_37 { "20" } else { "300" };
    let cap = format!("lifecycle_kubelet_backoff_seconds{{bound=\"max\"}} {max}");
    assert!(metrics.contains(&cap), "{cap} in the pod's metrics");

    let reader = api_access_is_decided_by_the_api_server(&kube, &addr);
    credentials_from_off_the_host_go_over_the_certificate_the_agent_made(&kube, ports.listen, &reader);

    let mut pod = kube.pod_manifest("stubborn", &["sh", "-c", IGNORE_TERM]);
    pod["spec"]["terminationGracePeriodSeconds"] = 2.into();
    kube.apply(&pod.to_string()).expect("create stubborn");
    let began = Instant::now();
    let seen = wait_agent(&addr, &reader, "stubborn", "running", Duration::from_secs(60), |c| {
        c["state"]["state"] == "running"
    });
    eprintln!("the pod's agent saw stubborn running after {:.1?}", began.elapsed());
    assert_eq!(seen["namespace"], "default", "{seen:#}");
    kube.wait_pod_phase("default", "stubborn", "Running", Duration::from_secs(60)).expect("Running");

    // For `explain` through the plugin below: an OOM kill, and a liveness kill of an app that
    // ignores TERM (restartPolicy Always: the kubelet's Event names the probe).
    let mut oomer = kube.pod_manifest("oomer", &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"]);
    oomer["spec"]["restartPolicy"] = "Never".into();
    oomer["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "32Mi"}});
    kube.apply(&oomer.to_string()).expect("create oomer");
    let mut unlively = kube.pod_manifest("unlively", &["sh", "-c", IGNORE_TERM]);
    unlively["spec"]["terminationGracePeriodSeconds"] = 2.into();
    unlively["spec"]["containers"][0]["livenessProbe"] = json!({
        "exec": {"command": ["sh", "-c", "test -e /tmp/alive"]},
        "initialDelaySeconds": 2, "periodSeconds": 1, "failureThreshold": 1});
    kube.apply(&unlively.to_string()).expect("create unlively");
    // A shell entrypoint that keeps TERM from its child, and a preStop hook that overruns the
    // grace: both deleted once they run.
    let mut shell = kube.pod_manifest("shell", &["sh", "-c", "sleep 100000; true"]);
    shell["spec"]["terminationGracePeriodSeconds"] = 2.into();
    kube.apply(&shell.to_string()).expect("create shell");
    let mut overrun = kube.pod_manifest("overrun", &["sh", "-c", IGNORE_TERM]);
    overrun["spec"]["terminationGracePeriodSeconds"] = 4.into();
    overrun["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c", "sleep 30"]}}});
    kube.apply(&overrun.to_string()).expect("create overrun");
    for name in ["shell", "overrun"] {
        kube.wait_pod_phase("default", name, "Running", Duration::from_secs(60)).expect("Running");
    }
    // The shell's child must run before the stop: its `sleep`, in the container's cgroup.
    let shell_pod = kube.pod("default", "shell").expect("get").expect("exists");
    let id = shell_pod["status"]["containerStatuses"][0]["containerID"].as_str().unwrap_or_default();
    let id = id.trim_start_matches("containerd://").to_owned();
    let began = Instant::now();
    while !std::fs::read_dir("/proc").expect("/proc").flatten().any(|entry| {
        let dir = entry.path();
        std::fs::read_to_string(dir.join("comm")).is_ok_and(|comm| comm.trim() == "sleep")
            && std::fs::read_to_string(dir.join("cgroup")).is_ok_and(|cgroup| !id.is_empty() && cgroup.contains(&id))
    }) {
        assert!(began.elapsed() < Duration::from_secs(20), "the shell's sleep runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    kube.kubectl(&["delete", "pod", "shell", "overrun", "--wait=false"]).expect("delete shell and overrun");
    kube.kubectl(&["delete", "pod", "stubborn", "--wait=false"]).expect("delete");
    let began = Instant::now();
    let judged =
        wait_agent(&addr, &reader, "stubborn", "judged", Duration::from_secs(40), |c| !c["last_termination"].is_null());
    eprintln!("stubborn judged {:.1?} after its deletion", began.elapsed());
    let termination = &judged["last_termination"];
    assert_eq!(termination["outcome"]["kind"], "sigkilled_after_grace", "{judged:#}");
    assert_eq!(termination["grace_ns"].as_f64(), Some(2e9), "{judged:#}");
    assert_eq!(termination["cause"], "deleted", "{judged:#}");
    assert_eq!(termination["spec"], "api", "{judged:#}");
    explained_from_anywhere_with_a_readers_own_rights(&kube, ports.listen);

    // Teardown: the agent pod before the node, so the agent detaches its programs on SIGTERM
    // (the node's teardown would SIGKILL it with the sandbox).
    let programs_running = bpf::program_ids();
    delete_agent_pod(&kube);
    drop(guard);
    match (programs_before, programs_running) {
        (Some(before), Some(running)) => {
            let agents: BTreeSet<u32> = running.difference(&before).copied().collect();
            assert!(!agents.is_empty(), "the pod's agent loaded programs");
            match bpf::wait_programs_gone(&agents, Duration::from_secs(10)) {
                Ok(_) => eprintln!("the agent's {} BPF programs are gone", agents.len()),
                Err(left) => panic!("BPF programs {left:?} outlived the agent pod"),
            }
        }
        _ => eprintln!("BPF program ids cannot be listed here: not checking that the agent's are gone"),
    }
}

/// What the agent container of pod `name` logged so far, read where the kubelet writes it
/// (`kubectl logs` cannot reach this node's kubelet: it listens on loopback).
fn agent_log(kube: &Kube, name: &str) -> String {
    let Some(pod) = kube.pod(NAMESPACE, name).ok().flatten() else { return format!("(no pod {name})") };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let dir = Path::new("/var/log/pods").join(format!("{NAMESPACE}_{name}_{uid}")).join("agent");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) => return format!("(no log in {}: {err})", dir.display()),
    };
    let mut text = String::new();
    for entry in entries.flatten() {
        text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
    }
    text
}

/// The time of day (UTC, ms), to set the test's steps beside the kubelet's Events.
fn wall_clock() -> String {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let ms = since.as_millis() % 86_400_000;
    format!("{:02}:{:02}:{:02}.{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

/// The default pod probe port (`--pod-probe-port`), where pods' probes reach the agent.
const PROBE_PORT: u16 = 9891;

/// Issue 18: a rolling update of the agent dropped every probe answer (a healthy pod whose
/// liveness and readiness went through the agent was restarted twice and unready for 10.8 s).
/// Here the agent is replaced twice as the DaemonSet's surge update does it — the next agent pod
/// starts, is Ready, then the previous one is deleted — while the kubelet probes a pod through
/// the agent every second with no tolerance for a failure: the pod must stay Ready throughout,
/// never restart, and the kubelet must report no failed probe.
///
/// The one failure seen in earlier runs came before any restart: the kubelet's first liveness
/// probe of the new pod found no listener yet (the supervisor bound it at its next 1 s pass).
/// The supervisor now passes as soon as a pod or a container becomes known.
#[test]
fn probe_answers_survive_two_agent_restarts() {
    let test = "probe_answers_survive_two_agent_restarts";
    if let Some(reason) = kube::skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return;
    }
    kube::sweep_stale();
    let Some(kube) = kube::start_or_skip(test) else { return };
    let image = kube.import_agent_image(Path::new(AGENT)).expect("agent image");
    let objects = manifest_objects(&kube, MANIFEST);
    let namespace = objects.iter().find(|o| o["kind"] == "Namespace").expect("the manifest's Namespace");
    kube.apply(&namespace.to_string()).expect("create the namespace");
    // The accounts and roles of deploy/rbac.yaml: the agent's (its pod mounts a token of it for
    // the agents' audience), the plugin's reader, the readers' and the plugin users' roles.
    for object in manifest_objects(&kube, RBAC) {
        kube.apply(&object.to_string()).expect("apply deploy/rbac.yaml");
    }
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("the manifest's DaemonSet");
    let ports = Ports::pick();
    let credentials = kube.write_agent_credentials().expect("agent credentials");
    let mut guard = AgentPod::new(&kube, missing_host_dirs());
    guard.names = (1..=3).map(|n| format!("{AGENT_POD}-{n}")).collect();
    let start_agent = |name: &str| {
        let manifest = agent_pod_named(&kube, daemonset, name, image, ports, &credentials);
        let began = Instant::now();
        kube.apply(&manifest.to_string()).expect("create an agent pod");
        kube.wait_pod_condition(NAMESPACE, name, "Ready", Duration::from_secs(90)).expect("agent pod Ready");
        eprintln!("{} {name} Ready in {:.1?}", wall_clock(), began.elapsed());
    };
    start_agent(&guard.names[0]);

    // Liveness and readiness through the agent, every second, failing at the first miss.
    let probe = json!({"httpGet": {"path": "/probe/process", "port": PROBE_PORT},
                       "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1});
    let mut pod = kube.pod_manifest("probed", &["sh", "-c", "while true; do sleep 0.2; done"]);
    pod["metadata"]["annotations"] = json!({"lifecycle.dev/probes": "/probe/process"});
    pod["spec"]["containers"][0]["livenessProbe"] = probe.clone();
    pod["spec"]["containers"][0]["readinessProbe"] = probe;
    kube.apply(&pod.to_string()).expect("create the probed pod");
    kube.wait_pod_condition("default", "probed", "Ready", Duration::from_secs(60)).expect("probed Ready");

    // From here the pod must stay Ready, watched on every change by a thread of its own.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let unready = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let watcher = {
        let (watching, unready) = (watching.clone(), unready.clone());
        let mut command = kube.kubectl_command();
        command.args(["get", "pod", "probed", "-w", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.containerStatuses[0].restartCount}{\"\\n\"}"]);
        command.stdout(std::process::Stdio::piped());
        let mut child = command.spawn().expect("kubectl get -w");
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if watching.load(std::sync::atomic::Ordering::Acquire) && line.trim() != "True 0" {
                    unready.lock().push(line);
                }
            }
        });
        (child, reader)
    };

    let mut logs = String::new();
    for (old, new) in [(0, 1), (1, 2)] {
        start_agent(&guard.names[new]);
        // Ready means it serves the listener it took over; the log says it took it (the runtime
        // copies the agent's stderr into the log file a moment later: read until it is there).
        let took = |log: &str| {
            log.contains("probe listener for default/probed") && log.contains("taken over from the previous agent")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut log = agent_log(&kube, &guard.names[new]);
        while !took(&log) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            log = agent_log(&kube, &guard.names[new]);
        }
        assert!(took(&log), "{} took the probed pod's listener from {}:\n{log}", guard.names[new], guard.names[old]);
        // The health port went over with the rest (ports are exclusive, shared only through the
        // handoff): every answer on it is the successor's, ready; none is the replaced agent's.
        let health = format!("127.0.0.1:{}", ports.health);
        let successors = |answer: &Option<(u16, String)>| {
            answer.as_ref().is_some_and(|(code, body)| *code == 200 && !body.contains("replaced"))
        };
        // Until the old agent has heard the successor confirm (then it stops serving the port).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(0..10).all(|_| successors(&get(&health, "/readyz"))) {
            assert!(Instant::now() < deadline, "{} never served the health port alone", guard.names[new]);
        }
        let answers: Vec<Option<(u16, String)>> = (0..40).map(|_| get(&health, "/readyz")).collect();
        assert!(
            answers
                .iter()
                .all(|answer| answer.as_ref().is_some_and(|(code, body)| *code == 200 && !body.contains("replaced"))),
            "/readyz after {} took over from {}: {answers:?}",
            guard.names[new],
            guard.names[old]
        );
        eprintln!("{} deleting {}", wall_clock(), guard.names[old]);
        logs.push_str(&format!(
            "--- {} (until its deletion)\n{}",
            guard.names[old],
            agent_log(&kube, &guard.names[old])
        ));
        delete_agent_pod_named(&kube, &guard.names[old]);
        eprintln!("{} {} gone", wall_clock(), guard.names[old]);
        // A few probe periods served by the new agent alone.
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_secs(3) {
            assert!(unready.lock().is_empty(), "{:?}", unready.lock());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    watching.store(false, std::sync::atomic::Ordering::Release);
    let (mut child, reader) = watcher;
    // SAFETY: kill has no memory-safety preconditions; the pid is the kubectl this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = reader.join();
    // What the kubelet said and when, beside the times above, so a failure can be placed.
    let failures = kube
        .kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=probed,reason=Unhealthy",
            "-o",
            "jsonpath={range .items[*]}{.firstTimestamp} {.lastTimestamp} x{.count} {.message}{\"\\n\"}{end}",
        ])
        .expect("events");
    logs.push_str(&format!("--- {}\n{}", guard.names[2], agent_log(&kube, &guard.names[2])));
    assert!(failures.trim().is_empty(), "the kubelet reported failed probes:\n{failures}\n{logs}");
    let unready = unready.lock().clone();
    assert!(unready.is_empty(), "the probed pod left Ready or restarted: {unready:?}");
    let probed = kube.pod("default", "probed").expect("get").expect("probed");
    assert_eq!(kube::container_status(&probed, "app").map(|c| c["restartCount"].clone()), Some(0.into()));
    delete_agent_pod_named(&kube, &guard.names[2]);
    guard.names.clear();
}
