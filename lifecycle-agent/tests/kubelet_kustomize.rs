//! Kubelet tier, the kustomize base for real: `kubectl apply -k` of an overlay over deploy/ on a
//! real node (etcd, kube-apiserver and kubelet v1.20.2, containerd + runc) with this build's agent
//! image (the release image's builder, `lifecycle_image`), the agent pod Ready and serving, then
//! `kubectl delete -k` of the same overlay and nothing of the base left: no object that
//! `kubectl kustomize deploy/` renders (their kinds and names are read from that rendering, so an
//! object added to the base is covered without a change here), no pod of its DaemonSet, none of
//! the agent's BPF programs, and none of the host directories its DirectoryOrCreate volumes made.
//!
//! The overlay is what an operator writes over deploy/ (deploy/README.md, "The image" and
//! "Upgrades"): `images:` for the image imported into the node's containerd, and a JSON patch of
//! the DaemonSet for what this node lacks or differs in: `imagePullPolicy: Never` (no registry),
//! the harness's containerd socket (`--cri-socket`, its directory mounted), the admin kubeconfig
//! (`--kubeconfig`, mounted: this API server issues no service-account tokens), ports that are
//! free on the machine, and `maxUnavailable: 1` without `maxSurge` (a 1.20 API server has no
//! DaemonSet surge). Every other object renders as the base has it, which the test checks. The
//! overlay says `bases:` and `patchesJson6902:`: the tier's fallback kubectl (Debian's
//! kubernetes-client 1.20, kustomize v2.0.3) knows no `patches:` and takes no directory under
//! `resources:`; current kustomize reads both fields, with a deprecation warning on stderr.
//!
//! The node has no controller-manager: the test does what three of its controllers would. After
//! the apply it creates the Pod the DaemonSet controller would (from the DaemonSet the API server
//! stored, owned by it). After the delete it deletes the pods the garbage collector would (those
//! owned by a DaemonSet that is gone), and does the namespace controller's part: `delete -k`
//! leaves the base's Namespace Terminating (a deletionTimestamp and the `kubernetes` finalizer,
//! which only that controller removes), so the test checks that it is, that every object of the
//! base inside it is gone and that nothing but Events is left in it (here the kubelet's, about
//! the agent's pod); then, as the controller does, deletes those and finalizes the Namespace,
//! which must then be gone. `kubectl delete -k` runs with `--wait=false` for the same reason:
//! kubectl's wait would block on that finalizer.
//!
//! Run: `xtask/x.sh test --tier kubelet`.

use std::{
    collections::BTreeSet,
    net::TcpListener,
    path::{Component, Path, PathBuf},
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    agent::{free_port, get, get_with_token},
    bpf,
    kube::{self, drop_unpropagated_mount_propagation, Kube, AGENT_IMAGE},
};
use serde_json::{json, Value};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
/// The kustomize base, as `kubectl apply -k deploy/` takes it.
const BASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
/// A pod in `default` the agent must see.
const WATCHED: &str = "kustomize-watched";

/// `preferred` (the base's port) when it is free on the host, else another free port.
fn port_or_free(preferred: u16) -> u16 {
    match TcpListener::bind(("0.0.0.0", preferred)) {
        Ok(_) => preferred,
        Err(_) => free_port(),
    }
}

/// The objects `kubectl kustomize <dir>` renders, as JSON (kubectl reads the YAML client-side:
/// nothing is created, and nothing is validated against this node's API server).
fn render(kube: &Kube, dir: &Path) -> Vec<Value> {
    let yaml = kube.kubectl(&["kustomize", &dir.to_string_lossy()]).expect("kubectl kustomize");
    let text = kube
        .kubectl_with_input(&["create", "--dry-run=client", "--validate=false", "-o", "json", "-f", "-"], Some(&yaml))
        .expect("kubectl reads the rendering");
    // One JSON document per object, one after the other (a List when kubectl chooses to).
    let mut objects = Vec::new();
    for value in serde_json::Deserializer::from_str(&text).into_iter::<Value>() {
        let value = value.expect("JSON");
        match value["kind"].as_str() {
            Some("List") => objects.extend(value["items"].as_array().cloned().unwrap_or_default()),
            _ => objects.push(value),
        }
    }
    assert!(!objects.is_empty(), "{} renders nothing", dir.display());
    objects
}

/// `Kind namespace/name` (or `Kind name` for a cluster-scoped object), for messages.
fn describe(object: &Value) -> String {
    let (kind, name) = (object["kind"].as_str().unwrap_or("?"), object["metadata"]["name"].as_str().unwrap_or("?"));
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// What identifies an object: apiVersion, kind, namespace, name.
fn identity(object: &Value) -> (String, String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["apiVersion"]),
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// The object (of a rendering) as the API server has it now, or `None` when it has none.
fn live(kube: &Kube, object: &Value) -> Option<Value> {
    // kubectl maps the kind to its resource, as `apply -k` and `delete -k` do.
    let text = kube
        .kubectl_with_input(&["get", "-f", "-", "--ignore-not-found", "-o", "json"], Some(&object.to_string()))
        .unwrap_or_else(|e| panic!("get {}: {e:#}", describe(object)));
    if text.trim().is_empty() {
        return None;
    }
    let value: Value = serde_json::from_str(&text).expect("JSON");
    match value["kind"].as_str() {
        Some("List") => value["items"].as_array().and_then(|items| items.first().cloned()),
        _ => Some(value),
    }
}

/// `to` relative to the directory `from` (both made absolute): kustomize takes no absolute path
/// to a base.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().expect("overlay directory");
    let to = to.canonicalize().expect("base directory");
    let common = from.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = from.components().skip(common).map(|_| Component::ParentDir).collect();
    path.extend(to.components().skip(common));
    path
}

/// The port of a listen address (`0.0.0.0:9890`).
fn port_of(address: &Value) -> u16 {
    let text = address.as_str().expect("an address");
    text.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).unwrap_or_else(|| panic!("no port in {text}"))
}

/// What the overlay changes for this node.
struct NodeSpecifics<'a> {
    listen: u16,
    health: u16,
    credentials: &'a Path,
    socket: &'a Path,
}

/// Writes the overlay over the base into `dir`: `kustomization.yaml` and the DaemonSet's JSON
/// patch `node.json`, whose `test` operations check that the base still has what it replaces.
fn write_overlay(dir: &Path, daemonset: &Value, node: &NodeSpecifics) {
    std::fs::create_dir_all(dir).expect("overlay directory");
    let spec = &daemonset["spec"]["template"]["spec"];
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2, "the agent and its socket keeper in the base's DaemonSet");
    let container = &containers[0];
    let at = "/spec/template/spec/containers/0";
    let args = container["args"].as_array().expect("the agent's args");
    let flag = |name: &str| args.iter().position(|a| a == name).unwrap_or_else(|| panic!("{name} in the base"));
    let (listen, health) = (flag("--listen"), flag("--health-listen"));
    let base_health = port_of(&args[health + 1]);
    let socket_dir = node.socket.parent().expect("socket directory");
    let mut patch = vec![
        json!({"op": "test", "path": format!("{at}/name"), "value": container["name"]}),
        // No registry: the image is in the node's containerd already.
        json!({"op": "add", "path": format!("{at}/imagePullPolicy"), "value": "Never"}),
        // --listen (metrics, API) and --health-listen (the kubelet's probes of the agent) on ports
        // free here; with hostNetwork they are the host's.
        json!({"op": "test", "path": format!("{at}/args/{listen}"), "value": "--listen"}),
        json!({"op": "replace", "path": format!("{at}/args/{}", listen + 1), "value": format!("0.0.0.0:{}", node.listen)}),
        json!({"op": "test", "path": format!("{at}/args/{health}"), "value": "--health-listen"}),
        json!({"op": "replace", "path": format!("{at}/args/{}", health + 1), "value": format!("127.0.0.1:{}", node.health)}),
        json!({"op": "test", "path": "/spec/template/spec/containers/1/args/0", "value": "keep-sockets"}),
        json!({"op": "add", "path": "/spec/template/spec/containers/1/imagePullPolicy", "value": "Never"}),
        // This node's containerd does not serve /run/containerd/containerd.sock: its socket is in
        // the harness's directory, mounted as the base mounts /run/containerd (the directory).
        json!({"op": "add", "path": format!("{at}/args/-"), "value": "--cri-socket"}),
        json!({"op": "add", "path": format!("{at}/args/-"), "value": node.socket}),
        // The API server runs without the ServiceAccount admission plugin (no signing key, no
        // token controller): the pod gets no token, and the agent takes the admin's kubeconfig.
        json!({"op": "add", "path": format!("{at}/args/-"), "value": "--kubeconfig"}),
        json!({"op": "add", "path": format!("{at}/args/-"), "value": node.credentials.join("kubeconfig")}),
        json!({"op": "add", "path": format!("{at}/volumeMounts/-"),
               "value": {"name": "test-cri", "mountPath": socket_dir, "readOnly": true, "mountPropagation": "HostToContainer"}}),
        json!({"op": "add", "path": format!("{at}/volumeMounts/-"),
               "value": {"name": "test-credentials", "mountPath": node.credentials, "readOnly": true}}),
        json!({"op": "add", "path": "/spec/template/spec/volumes/-",
               "value": {"name": "test-cri", "hostPath": {"path": socket_dir, "type": "Directory"}}}),
        json!({"op": "add", "path": "/spec/template/spec/volumes/-",
               "value": {"name": "test-credentials", "hostPath": {"path": node.credentials, "type": "Directory"}}}),
        // A 1.20 API server knows no DaemonSet maxSurge (and refuses maxUnavailable 0 without
        // it): what deploy/README.md ("Upgrades") tells operators of clusters before 1.22.
        json!({"op": "replace", "path": "/spec/updateStrategy",
               "value": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}}),
    ];
    // The kubelet probes the agent on the health port.
    for probe in ["livenessProbe", "readinessProbe"] {
        if container[probe]["httpGet"].is_object() {
            let path = format!("{at}/{probe}/httpGet/port");
            patch.push(json!({"op": "test", "path": path, "value": base_health}));
            patch.push(json!({"op": "replace", "path": path, "value": node.health}));
        }
    }
    std::fs::write(dir.join("node.json"), serde_json::to_string_pretty(&patch).expect("JSON")).expect("write patch");

    // The image: its name in the base without the tag, pointed at the imported one.
    let image = container["image"].as_str().expect("the base's image");
    let name = image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')).map_or(image, |(name, _)| name);
    let (new_name, new_tag) = AGENT_IMAGE.rsplit_once(':').expect("image name:tag");
    let (group, version) =
        daemonset["apiVersion"].as_str().expect("apiVersion").split_once('/').expect("group/version");
    // Scalars as JSON strings: YAML reads them as double-quoted strings, whatever they hold.
    let quote = |text: &str| Value::from(text).to_string();
    let base = relative_path(dir, Path::new(BASE));
    let kustomization = format!(
        "# What the kubelet tier's node needs changed in deploy/ (lifecycle-agent/tests/kubelet_kustomize.rs).\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         bases:\n  - {}\n\
         images:\n  - name: {}\n    newName: {}\n    newTag: {}\n\
         patchesJson6902:\n  - target:\n      group: {}\n      version: {}\n      kind: {}\n      name: {}\n      namespace: {}\n    path: node.json\n",
        quote(&base.to_string_lossy()),
        quote(name),
        quote(new_name),
        quote(new_tag),
        quote(group),
        quote(version),
        quote(daemonset["kind"].as_str().expect("kind")),
        quote(daemonset["metadata"]["name"].as_str().expect("name")),
        quote(daemonset["metadata"]["namespace"].as_str().expect("namespace")),
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write kustomization");
}

/// The DirectoryOrCreate host paths of the DaemonSet's pod that do not exist yet: the kubelet
/// creates them for the pod, and the test removes them after it.
fn missing_host_dirs(daemonset: &Value) -> Vec<PathBuf> {
    daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["hostPath"]["type"] == "DirectoryOrCreate")
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .map(PathBuf::from)
        .filter(|p| !p.exists())
        .collect()
}

/// Undoes what the test made when it fails (the agent's pod deleted while the node is still up,
/// so the agent detaches on SIGTERM; the overlay deleted), and removes the host directories the
/// pod's volumes created, with what the agent left in its handoff directory.
struct Applied<'a> {
    kube: &'a Kube,
    overlay: PathBuf,
    /// The DaemonSet's pod, once created: (namespace, name).
    pod: Option<(String, String)>,
    created_dirs: Vec<PathBuf>,
    handoff_dir: PathBuf,
    dirs_removed: bool,
}

impl Applied<'_> {
    /// Removes the directories the pod's volumes created (the agent's pod must be gone); returns
    /// those that could not be removed.
    fn remove_created_dirs(&mut self) -> Vec<String> {
        self.dirs_removed = true;
        let mut problems = Vec::new();
        for dir in &self.created_dirs {
            // The handoff directory holds the last agent's socket (nothing listens on it) and the
            // CA of the certificate it made: deploy/README.md says `rm -rf` it. The others
            // (the runtime directories of the runtime the node does not run) must be empty.
            let removed =
                if *dir == self.handoff_dir { std::fs::remove_dir_all(dir) } else { std::fs::remove_dir(dir) };
            if let Err(e) = removed {
                if e.kind() != std::io::ErrorKind::NotFound {
                    problems.push(format!("{}: {e}", dir.display()));
                }
            }
        }
        problems
    }
}

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.kube.kubectl(&["delete", "-k", &self.overlay.to_string_lossy(), "--wait=false"]);
            if let Some((namespace, name)) = &self.pod {
                let _ = self.kube.kubectl(&["delete", "pod", "-n", namespace, name, "--wait=false"]);
                let _ = self.kube.wait_pod_gone(namespace, name, kube::POD_REMOVAL);
            }
        }
        if !self.dirs_removed {
            let _ = self.remove_created_dirs();
        }
    }
}

/// The agent's view of container `app` of pod `name` in `default`, once it is running (within
/// `within`); the base runs the agent with `--api-auth kubernetes --api-auth-audience
/// lifecycle-agent`: read with a token of the base's reader account minted for that audience, as
/// the kubectl plugin reads it.
fn wait_agent_sees_running(kube: &Kube, addr: &str, name: &str, within: Duration) -> Value {
    let token = kube
        .kubectl(&["create", "token", "lifecycle-reader", "-n", "lifecycle-system", "--audience", "lifecycle-agent"])
        .expect("kubectl create token")
        .trim()
        .to_owned();
    let began = Instant::now();
    loop {
        let found = get_with_token(addr, "/api/v1/containers", Some(&token))
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["containers"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["namespace"] == "default" && c["pod"] == name && c["container"] == "app");
        if let Some(c) = found.as_ref().filter(|c| c["state"]["state"] == "running") {
            return c.clone();
        }
        assert!(began.elapsed() < within, "the agent did not see {name} running within {within:?}: {found:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Everything in `namespace`, of every kind the API server lists there, once each.
fn namespace_contents(kube: &Kube, namespace: &str) -> Vec<Value> {
    let kinds = kube.kubectl(&["api-resources", "--namespaced=true", "--verbs=list", "-o", "name"]).expect("kinds");
    let kinds: Vec<&str> = kinds.lines().map(str::trim).filter(|k| !k.is_empty()).collect();
    let text = kube.kubectl(&["get", &kinds.join(","), "-n", namespace, "-o", "json"]).expect("get everything");
    let list: Value = serde_json::from_str(&text).expect("JSON");
    // Events are served under two groups (core and events.k8s.io): one object.
    let mut seen = BTreeSet::new();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| seen.insert(item["metadata"]["uid"].as_str().unwrap_or_default().to_owned()))
        .cloned()
        .collect()
}

#[test]
fn kubectl_apply_k_runs_the_agent_and_delete_k_leaves_nothing() {
    let test = "kubectl_apply_k_runs_the_agent_and_delete_k_leaves_nothing";
    if let Some(reason) = kube::skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return;
    }
    kube::sweep_stale();
    let began = Instant::now();
    let Some(kube) = kube::start_or_skip(test) else { return };
    eprintln!("node Ready in {:.1?}", began.elapsed());

    let began = Instant::now();
    let image = kube.import_agent_image(Path::new(AGENT)).expect("agent image");
    eprintln!("agent image built and imported in {:.1?}", began.elapsed());

    // The base as `kubectl apply -k deploy/` would create it: every name below comes from here.
    let base = render(&kube, Path::new(BASE));
    eprintln!("the base renders {}", base.iter().map(describe).collect::<Vec<_>>().join(", "));
    let daemonsets: Vec<&Value> = base.iter().filter(|o| o["kind"] == "DaemonSet").collect();
    assert_eq!(daemonsets.len(), 1, "one DaemonSet in the base");
    let base_daemonset = daemonsets[0];
    let base_args = &base_daemonset["spec"]["template"]["spec"]["containers"][0]["args"];
    let arg_after = |flag: &str| {
        let args = base_args.as_array().expect("args");
        let at = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("{flag} in the base"));
        args[at + 1].clone()
    };
    let listen = port_or_free(port_of(&arg_after("--listen")));
    let health = port_or_free(port_of(&arg_after("--health-listen")));
    let handoff_dir = PathBuf::from(arg_after("--handoff-dir").as_str().expect("--handoff-dir path"));

    let credentials = kube.write_agent_credentials().expect("agent credentials");
    let overlay = kube.run_dir().join("kustomize-overlay");
    let node = NodeSpecifics { listen, health, credentials: &credentials, socket: kube.containerd_socket() };
    write_overlay(&overlay, base_daemonset, &node);
    eprintln!(
        "overlay {}:\n{}",
        overlay.display(),
        std::fs::read_to_string(overlay.join("kustomization.yaml")).expect("read it")
    );

    // The overlay keeps every object of the base, and changes none but the DaemonSet.
    let rendered = render(&kube, &overlay);
    let ids = |objects: &[Value]| objects.iter().map(identity).collect::<BTreeSet<_>>();
    assert_eq!(ids(&rendered), ids(&base), "the overlay renders the base's objects");
    for object in base.iter().filter(|o| o["kind"] != "DaemonSet") {
        let ours = rendered.iter().find(|r| identity(r) == identity(object)).expect("rendered");
        assert_eq!(ours, object, "{} as the base has it", describe(object));
    }
    let daemonset = rendered.iter().find(|o| o["kind"] == "DaemonSet").expect("the DaemonSet");
    assert_eq!(daemonset["spec"]["template"]["spec"]["containers"][0]["image"], image, "images: took");

    let mut guard = Applied {
        kube: &kube,
        overlay: overlay.clone(),
        pod: None,
        created_dirs: missing_host_dirs(daemonset),
        handoff_dir: handoff_dir.clone(),
        dirs_removed: false,
    };
    let began = Instant::now();
    let applied = kube.kubectl(&["apply", "-k", &overlay.to_string_lossy()]).expect("kubectl apply -k");
    eprintln!("kubectl apply -k in {:.1?}:\n{applied}", began.elapsed());
    for object in &rendered {
        assert!(live(&kube, object).is_some(), "{} created by apply -k", describe(object));
    }

    // The DaemonSet's pod, as its controller would create it.
    let stored = live(&kube, daemonset).expect("the DaemonSet");
    let namespace = stored["metadata"]["namespace"].as_str().expect("namespace").to_owned();
    let pod_name = format!("{}-kustomize", stored["metadata"]["name"].as_str().expect("name"));
    let mut pod = kube.daemonset_pod(&stored, &pod_name);
    drop_unpropagated_mount_propagation(&mut pod);
    let programs_before = bpf::program_ids();
    let began = Instant::now();
    guard.pod = Some((namespace.clone(), pod_name.clone()));
    kube.apply(&pod.to_string()).expect("create the DaemonSet's pod");
    kube.wait_pod_condition(&namespace, &pod_name, "Ready", Duration::from_secs(60)).expect("agent pod Ready");
    eprintln!("agent pod Ready (its readiness probe on :{health}) in {:.1?}", began.elapsed());

    // The pod's agent, reached on the host: hostNetwork.
    let addr = format!("127.0.0.1:{listen}");
    let (code, metrics) = get(&addr, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    for feature in ["process_exit", "kubernetes_api"] {
        let line = format!("lifecycle_feature_enabled{{feature=\"{feature}\"}} 1");
        assert!(metrics.contains(&line), "{line} in the pod's metrics:\n{metrics}");
    }
    // It sees the node's other pods (from the API server and the runtime).
    let mut watched = kube.pod_manifest(WATCHED, &["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]);
    watched["spec"]["terminationGracePeriodSeconds"] = 5.into();
    kube.apply(&watched.to_string()).expect("create the watched pod");
    let began = Instant::now();
    let seen = wait_agent_sees_running(&kube, &addr, WATCHED, Duration::from_secs(60));
    eprintln!("the agent saw {WATCHED} running after {:.1?}", began.elapsed());
    assert_eq!(seen["named_by_id"], false, "named by the runtime: {seen:#}");
    // Its watch of the node's pods works, with the kubeconfig the overlay gave it.
    let began = Instant::now();
    loop {
        let (_, metrics) = get(&addr, "/metrics").expect("metrics answer");
        if metrics.lines().any(|l| l == "lifecycle_kubernetes_api_up 1") {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "lifecycle_kubernetes_api_up not 1:\n{metrics}");
        std::thread::sleep(Duration::from_millis(200));
    }
    kube.kubectl(&["delete", "pod", WATCHED, "--wait=false"]).expect("delete the watched pod");
    // A fixture's removal, not what this test checks: the 1.20 kubelet sometimes holds a deleted
    // pod Terminating until a later sync (docs/kubelet-behaviour.md; kubelet.rs allows 120 s too),
    // and took over 30 s once in a clean-clone run.
    kube.wait_pod_gone("default", WATCHED, kube::POD_REMOVAL).expect("watched pod gone");

    // The uninstall, as deploy/README.md has it.
    let agent_pod = kube.pod(&namespace, &pod_name).expect("get").expect("the agent pod");
    let container = stored["spec"]["template"]["spec"]["containers"][0]["name"].as_str().expect("container name");
    let container_id = kube::container_status(&agent_pod, container)
        .and_then(|s| s["containerID"].as_str())
        .expect("the agent's containerID")
        .to_owned();
    let programs_running = bpf::program_ids();
    let exits = kube.watch_task_exits().expect("watch task exits");
    let began = Instant::now();
    let deleted =
        kube.kubectl(&["delete", "-k", &overlay.to_string_lossy(), "--wait=false"]).expect("kubectl delete -k");
    eprintln!("kubectl delete -k in {:.1?}:\n{deleted}", began.elapsed());
    assert!(live(&kube, daemonset).is_none(), "the DaemonSet is deleted at once");

    // The garbage collector's part: pods whose owning DaemonSet is gone.
    let uid = stored["metadata"]["uid"].as_str().expect("DaemonSet uid");
    let pods: Value =
        serde_json::from_str(&kube.kubectl(&["get", "pods", "-n", &namespace, "-o", "json"]).expect("get pods"))
            .expect("JSON");
    let owned: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["ownerReferences"].as_array().into_iter().flatten().any(|o| o["uid"] == uid))
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(owned, std::slice::from_ref(&pod_name), "the DaemonSet's pods");
    let began = Instant::now();
    kube.kubectl(&["delete", "pod", "-n", &namespace, &pod_name, "--wait=false"]).expect("delete the orphan");
    let exit = exits.wait_for(&container_id, Duration::from_secs(30)).expect("the agent exits");
    let exited = exit.seen.duration_since(began);
    let gone = kube.wait_pod_gone(&namespace, &pod_name, kube::POD_REMOVAL).expect("agent pod gone");
    eprintln!(
        "the agent exited {exited:.1?} after its pod's deletion (status {}); pod gone in {gone:.1?}",
        exit.exit_status
    );
    assert_eq!(exit.exit_status, 0, "the agent exits on SIGTERM, detaching its programs");
    guard.pod = None;
    match (programs_before, programs_running) {
        (Some(before), Some(running)) => {
            let agents: BTreeSet<u32> = running.difference(&before).copied().collect();
            assert!(!agents.is_empty(), "the pod's agent loaded programs");
            let gone = bpf::wait_programs_gone(&agents, Duration::from_secs(10))
                .unwrap_or_else(|left| panic!("BPF programs {left:?} outlived the agent pod"));
            eprintln!("the agent's {} BPF programs gone {gone:.1?} after its pod", agents.len());
        }
        _ => eprintln!("BPF program ids cannot be listed here: not checking that the agent's are gone"),
    }

    // Nothing of the base is left but its Namespace(s), deleted and waiting for the namespace
    // controller.
    let namespaces: Vec<&Value> = rendered.iter().filter(|o| o["kind"] == "Namespace").collect();
    for object in &rendered {
        let found = live(&kube, object);
        if object["kind"] == "Namespace" {
            let found = found.unwrap_or_else(|| panic!("{} gone without a namespace controller?", describe(object)));
            let finalizers = found["spec"]["finalizers"].as_array().cloned().unwrap_or_default();
            assert!(
                found["metadata"]["deletionTimestamp"].is_string()
                    && found["status"]["phase"] == "Terminating"
                    && finalizers == [json!("kubernetes")],
                "{} deleted by delete -k: {found:#}",
                describe(object)
            );
        } else {
            assert!(found.is_none(), "{} left after delete -k: {found:#?}", describe(object));
        }
    }
    // The namespace controller's part: what is left in each namespace goes, then the namespace.
    for object in namespaces {
        let name = object["metadata"]["name"].as_str().expect("namespace name");
        let left = namespace_contents(&kube, name);
        let not_events: Vec<String> = left.iter().filter(|o| o["kind"] != "Event").map(describe).collect();
        assert!(not_events.is_empty(), "left in {name} after delete -k: {not_events:?}");
        let events: Vec<String> = left
            .iter()
            .map(|e| {
                let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
                format!(
                    "{} {} {}",
                    text(&e["source"]["component"]),
                    text(&e["reason"]),
                    text(&e["involvedObject"]["name"])
                )
            })
            .collect();
        eprintln!("left in {name}: {} Events {events:?}", left.len());
        if !left.is_empty() {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": left});
            kube.kubectl_with_input(&["delete", "--ignore-not-found", "-f", "-"], Some(&list.to_string()))
                .expect("delete the Events");
        }
        let mut terminating = live(&kube, object).expect("the namespace");
        terminating["spec"]["finalizers"] = json!([]);
        kube.kubectl_with_input(
            &["replace", "--raw", &format!("/api/v1/namespaces/{name}/finalize"), "-f", "-"],
            Some(&terminating.to_string()),
        )
        .expect("finalize the namespace");
        let began = Instant::now();
        while live(&kube, object).is_some() {
            assert!(began.elapsed() < Duration::from_secs(10), "Namespace {name} still there once finalized");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for object in &rendered {
        assert!(live(&kube, object).is_none(), "{} left", describe(object));
    }

    // The host: the directories the pod's volumes made.
    let created = guard.created_dirs.clone();
    let problems = guard.remove_created_dirs();
    assert!(problems.is_empty(), "host directories the agent's pod created: {problems:?}");
    let left: Vec<&PathBuf> = created.iter().filter(|d| d.exists()).collect();
    assert!(left.is_empty(), "host directories left: {left:?}");
    eprintln!("nothing of the base is left (host directories removed: {created:?})");
    drop(guard);
}
