//! A real single-node Kubernetes for the kubelet tier: etcd on loopback, kube-apiserver on
//! 127.0.0.1 (static tokens, RBAC, a kubeconfig file for kubectl and for the agent's Kubernetes
//! client), a private containerd (the [`crate::containerd`] harness, whose busybox image pods run
//! with `imagePullPolicy: Never`), the CNI bridge plugin for pod IPs, and a kubelet. No scheduler
//! and no controller-manager: manifests name the node in `spec.nodeName` ([`Kube::pod_manifest`]
//! does), and nothing deletes namespaces.
//!
//! Two nodes ([`NodeVersion`], chosen by the test): the 1.20 one, whose kube-apiserver and
//! kubelet are the v1.20.2 binaries `xtask` builds from Debian's source package
//! (`/var/cache/lifecycle/kubernetes/bin`, or `$LIFECYCLE_KUBE_BIN`) with etcd, containerd 1.6
//! and the CNI plugins from Debian packages; and a current one (1.37) whose kube-apiserver,
//! kubelet, containerd 2.x, runc, etcd and CNI plugins all come from xtask's kubernetes-modern
//! cache (`$LIFECYCLE_KUBE_MODERN_BIN`, `$LIFECYCLE_KUBE_MODERN_CNI`), with the feature gates of
//! [`MODERN_FEATURE_GATES`] on and `crashLoopBackOff.maxContainerRestartPeriod`
//! [`MODERN_MAX_CONTAINER_RESTART_PERIOD`]. openssl and kubectl come from PATH for both.
//!
//! Ownership and cleanup: everything lives in a run directory under [`BASE_DIR`] (etcd data,
//! certificates, the kubelet's `--root-dir`, logs) or is recorded there before it is changed
//! (sysctls, the kubelet's paths outside its root, libcni's cache, the bridge, the cgroup root
//! `/lifecycle-kube-<pid>-<n>` the kubelet puts its `kubepods` under). `Drop` stops the kubelet,
//! removes every pod sandbox through the CRI (which kills the containers and tears their
//! network down), stops the API server and etcd (by pid), drops the containerd harness (its own
//! sweep), then undoes the records: processes left in the cgroup root, mounts under the run
//! directory (the kubelet bind-mounts its root dir onto itself), the bridge and cache entries,
//! new entries in `/var/log/pods` and friends, sysctls. A test process that was killed cannot run
//! `Drop`: the next start sweeps runs whose owner is gone with the same code.
//!
//! One node runs on a machine at a time (the kubelet writes fixed host paths): a second start
//! waits for the first to end; within one process it fails at once.
//!
//! Parts: `control_plane` (certificates, etcd, kube-apiserver, kubeconfigs), `kubelet`,
//! `network` (CNI), `machine` (sysctls, host paths, the cgroup root), `process` (daemons by pid),
//! `run_dir` (the directory, its sweep, the machine lock), `api` (kubectl and waits on pods),
//! `task_exits` (containerd's exit events: the runtime's truth), `agent_image` (the agent as a
//! local image, for deploy/daemonset.yaml's pod), `agent_pod` (a DaemonSet's pod as its
//! controller would make it, the agent's credentials, helm against the node), `version` (what
//! differs between the two nodes), `teardown` (stopping the node, or abandoning it as a killed
//! test would).

mod agent_image;
mod agent_pod;
mod api;
mod control_plane;
mod kubelet;
mod machine;
mod network;
mod process;
mod run_dir;
mod task_exits;
mod teardown;
mod version;

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

pub use self::{
    agent_image::{AGENT_IMAGE, AGENT_PATH},
    agent_pod::{drop_unpropagated_mount_propagation, helm_binary, mount_propagates, HELM_ENV},
    api::{condition_is_true, container_status},
    control_plane::READER,
    machine::MachineState,
    task_exits::{TaskExit, TaskExits},
    teardown::Abandoned,
    version::{
        NodeVersion, BIN_ENV, MODERN_BIN_ENV, MODERN_CNI_ENV, MODERN_FEATURE_GATES, MODERN_MAX_CONTAINER_RESTART_PERIOD,
    },
};
use self::{
    control_plane::Pki,
    kubelet::KubeletSetup,
    network::Network,
    process::Daemon,
    run_dir::{sweep_stale_runs, MachineLock, RunDir},
};
use crate::containerd::{host::which, Containerd};

/// Where run directories live.
pub const BASE_DIR: &str = "/tmp/lifecycle-kube";
/// When set, a directory the daemons' logs are copied into at teardown.
pub const LOG_ENV: &str = "LIFECYCLE_KUBE_LOGS";
/// The image pods run (the containerd harness's busybox-static image; never pulled).
pub const IMAGE: &str = crate::containerd::IMAGE;
/// The node's name.
pub const NODE: &str = "lifecycle-node";
/// How long a test waits for a deleted pod's object to leave the API server. The kubelet deletes
/// it only once its status manager sees the pod's resources reclaimed (containers gone, volumes
/// unmounted, pod cgroup removed by housekeeping); on the 1.20 kubelet that took from 2 s to past
/// 30 s in clean-clone runs of this suite. A precondition of the tests that use it, not a check.
pub const POD_REMOVAL: Duration = Duration::from_secs(120);
/// How long a test waits for the kubelet to stop the containers of a pod it was told to delete:
/// its pod worker picks the deletion up from the API watch, then gives the grace period. On the
/// 1.20 kubelet under the suite's load the pickup alone once took past 40 s (a child-OOM pod with
/// no grace to speak of, in a clean-clone run). A precondition, not a check: what the tests
/// assert is the stop's judgement, and how fast the kubelet is belongs to no test.
pub const POD_STOPPED: Duration = Duration::from_secs(90);
/// How long the API server may take to answer /readyz, and the node to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a daemon may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Set while this process runs a node.
static LIVE: AtomicBool = AtomicBool::new(false);

/// The directory with the 1.20 node's kube-apiserver and kubelet.
pub fn bin_dir() -> PathBuf {
    NodeVersion::V1_20.bin_dir()
}

/// Why the 1.20 node cannot run here, or `None` when it can.
pub fn skip_reason() -> Option<String> {
    skip_reason_for(NodeVersion::V1_20)
}

/// Why a node of `version` cannot run here, or `None` when it can.
pub fn skip_reason_for(version: NodeVersion) -> Option<String> {
    if version == NodeVersion::V1_37 && std::env::var_os(MODERN_BIN_ENV).is_none() {
        return Some(format!("{MODERN_BIN_ENV} is not set: {}", version.provided_by()));
    }
    if let Some(reason) = crate::containerd::skip_reason_for(&version.containerd()) {
        return Some(reason);
    }
    let bin = version.bin_dir();
    let binaries: &[&str] = match version {
        NodeVersion::V1_20 => &["kube-apiserver", "kubelet"],
        NodeVersion::V1_37 => &["kube-apiserver", "kubelet", "etcd"],
    };
    if let Some(missing) = binaries.iter().find(|b| !bin.join(b).is_file()) {
        return Some(format!("{} missing: {}", bin.join(missing).display(), version.provided_by()));
    }
    let missing: Vec<_> = version.tools().iter().filter(|b| which(b).is_none()).copied().collect();
    if !missing.is_empty() {
        return Some(format!(
            "missing {} (apt-get install etcd-server openssl iproute2; kubectl: kubernetes-client)",
            missing.join(", ")
        ));
    }
    if !version.cni_dir().join("bridge").is_file() {
        return Some(format!(
            "no CNI bridge plugin in {}: {}",
            version.cni_dir().display(),
            match version {
                NodeVersion::V1_20 => "apt-get install containernetworking-plugins",
                NodeVersion::V1_37 => version.provided_by(),
            }
        ));
    }
    None
}

/// Sweeps what nodes of dead test processes left behind, then their containerd harnesses (a
/// start does this too).
pub fn sweep_stale() {
    sweep_stale_runs();
    crate::containerd::sweep_stale();
}

/// Starts a node, or prints why the test is skipped and returns `None`. Panics when the
/// prerequisites are present but the node cannot start: that is a real failure.
pub fn start_or_skip(test: &str) -> Option<Kube> {
    start_or_skip_version(test, NodeVersion::V1_20)
}

/// [`start_or_skip`] for a node of `version`.
pub fn start_or_skip_version(test: &str, version: NodeVersion) -> Option<Kube> {
    if let Some(reason) = skip_reason_for(version) {
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    match Kube::start_version(version) {
        Ok(kube) => Some(kube),
        Err(e) => panic!("{test}: cannot start the kube node: {e:#}"),
    }
}

/// What a start cost, phase by phase (phases overlap: the API server boots while containerd
/// starts).
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// etcd spawned until /health answered.
    pub etcd: Duration,
    /// The containerd harness: image build, containerd ready, image import.
    pub containerd: Duration,
    /// kube-apiserver spawned until /readyz answered.
    pub apiserver: Duration,
    /// kubelet spawned until its Node object existed.
    pub kubelet_registered: Duration,
    /// kubelet spawned until the Node was Ready.
    pub node_ready: Duration,
    /// [`Kube::start`] until the Node was Ready (not counting a wait for another node).
    pub total: Duration,
}

/// A running node; `Drop` tears it down and restores the machine.
pub struct Kube {
    version: NodeVersion,
    run: RunDir,
    containerd: Option<Containerd>,
    etcd: Option<Daemon>,
    apiserver: Option<Daemon>,
    /// What a restart of the API server needs: its keys and etcd's URL.
    apiserver_setup: Option<(Pki, String)>,
    kubelet: Option<Daemon>,
    bin: PathBuf,
    kubectl: PathBuf,
    api_url: String,
    token: String,
    reader_token: String,
    ca: PathBuf,
    kubeconfig: PathBuf,
    kubelet_kubeconfig: PathBuf,
    cgroup_root: String,
    /// Set once torn down ([`Self::stop`]) or abandoned: Drop has nothing left to do.
    done: bool,
    /// The machine as it was before this node changed anything (after the stale sweep).
    before: MachineState,
    /// What start-up cost.
    pub timings: Timings,
    /// Held from before the start until after the teardown (or the abandoned run's sweep).
    lock: Option<MachineLock>,
}

impl Kube {
    /// Sweeps stale runs, then starts the 1.20 node: etcd, kube-apiserver, containerd (with the
    /// image and the CNI config) and the kubelet; returns once the Node is Ready.
    pub fn start() -> Result<Self> {
        Self::start_version(NodeVersion::V1_20)
    }

    /// [`Self::start`] for a node of `version`.
    pub fn start_version(version: NodeVersion) -> Result<Self> {
        if LIVE.swap(true, Ordering::SeqCst) {
            bail!("this process already runs a kube node (one per machine at a time)");
        }
        let lock = match MachineLock::acquire(Duration::from_secs(20 * 60)) {
            Ok(lock) => lock,
            Err(e) => {
                LIVE.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        let began = Instant::now();
        sweep_stale();
        let before = MachineState::capture();
        let run = match RunDir::create() {
            Ok(run) => run,
            Err(e) => {
                LIVE.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        let cgroup_root = format!("/lifecycle-kube-{}-{}", std::process::id(), run.sequence);
        let mut kube = Self {
            version,
            kubeconfig: run.path.join("kubeconfig"),
            kubelet_kubeconfig: run.path.join("kubelet.kubeconfig"),
            run,
            containerd: None,
            etcd: None,
            apiserver: None,
            apiserver_setup: None,
            kubelet: None,
            bin: version.bin_dir(),
            kubectl: which("kubectl").unwrap_or_else(|| PathBuf::from("kubectl")),
            api_url: String::new(),
            token: String::new(),
            reader_token: String::new(),
            ca: PathBuf::new(),
            cgroup_root,
            done: false,
            before,
            timings: Timings::default(),
            lock: Some(lock),
        };
        // From here on, Drop cleans up whatever part of start-up succeeded.
        kube.start_parts()?;
        kube.timings.total = began.elapsed();
        Ok(kube)
    }

    fn start_parts(&mut self) -> Result<()> {
        let run = self.run.path.clone();
        machine::record(&run)?;
        let pki = Pki::create(&run, NODE)?;
        self.ca = pki.ca.clone();
        self.token = pki.admin_token.clone();
        self.reader_token = pki.reader_token.clone();

        let began = Instant::now();
        let (etcd, etcd_url) = control_plane::start_etcd(&run, &self.version.etcd())?;
        self.etcd = Some(etcd);
        self.timings.etcd = began.elapsed();

        let apiserver_began = Instant::now();
        let binary = self.bin.join("kube-apiserver");
        let (apiserver, url) = control_plane::spawn_apiserver(&run, &binary, self.version, &etcd_url, &pki, None)?;
        self.apiserver = Some(apiserver);
        self.apiserver_setup = Some((pki.clone(), etcd_url.clone()));
        self.api_url = url;
        control_plane::write_kubeconfig(&self.kubeconfig, &self.api_url, &pki.ca, "admin", &pki.admin_token)?;
        control_plane::write_kubeconfig(
            &self.kubelet_kubeconfig,
            &self.api_url,
            &pki.ca,
            &format!("system:node:{NODE}"),
            &pki.kubelet_token,
        )?;

        // containerd starts while the API server boots.
        let began = Instant::now();
        let containerd = Containerd::start_flavour(self.version.containerd()).context("start containerd")?;
        let network = Network::choose(std::process::id(), self.run.sequence)?;
        network.install(&run, containerd.run_dir(), &self.version.cni_dir())?;
        self.containerd = Some(containerd);
        self.timings.containerd = began.elapsed();

        self.wait_apiserver_ready()?;
        self.timings.apiserver = apiserver_began.elapsed();

        machine::create_cgroup_root(&run, &self.cgroup_root)?;
        self.spawn_kubelet()?;
        Ok(())
    }

    fn wait_apiserver_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(apiserver) = self.apiserver.as_mut() {
                apiserver.check_running()?;
            }
            // /readyz covers etcd and the post-start hooks; the default namespace is created by
            // one of them, and pods need it.
            if self.kubectl(&["get", "--raw=/readyz"]).is_ok() && self.kubectl(&["get", "namespace", "default"]).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("kube-apiserver not ready after {READY_TIMEOUT:?}:\n{}", self.log_tail("kube-apiserver", 30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Spawns the kubelet and waits until its Node is registered and Ready.
    fn spawn_kubelet(&mut self) -> Result<()> {
        let began = Instant::now();
        let kubelet = self.kubelet_setup()?.spawn()?;
        self.kubelet = Some(kubelet);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut registered = None;
        loop {
            if let Some(kubelet) = self.kubelet.as_mut() {
                kubelet.check_running()?;
            }
            if let Ok(text) = self.kubectl(&["get", "node", NODE, "-o", "json", "--ignore-not-found"]) {
                if !text.trim().is_empty() {
                    registered.get_or_insert_with(|| began.elapsed());
                    let node: serde_json::Value = serde_json::from_str(&text).context("node JSON")?;
                    if api::condition_is_true(&node, "Ready") {
                        self.timings.kubelet_registered = registered.unwrap_or_default();
                        self.timings.node_ready = began.elapsed();
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                bail!("node {NODE} not Ready after {READY_TIMEOUT:?}:\n{}", self.log_tail("kubelet", 40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kubelet_setup(&self) -> Result<KubeletSetup<'_>> {
        let containerd = self.containerd.as_ref().context("containerd is not running")?;
        Ok(KubeletSetup {
            version: self.version,
            run: &self.run.path,
            bin_dir: &self.bin,
            node: NODE,
            kubeconfig: &self.kubelet_kubeconfig,
            runtime_socket: containerd.socket(),
            cgroup_root: &self.cgroup_root,
        })
    }

    /// Stops the API server as a crash would (SIGTERM, SIGKILL after 0.5 s: its graceful
    /// shutdown drains watches for longer): the node's clients (kubelet, agent) lose it, pods
    /// keep running. [`Self::start_apiserver`] brings it back on the same address.
    pub fn stop_apiserver(&mut self) {
        if let Some(apiserver) = self.apiserver.take() {
            apiserver.stop(Duration::from_millis(500));
        }
    }

    /// Starts the API server again on its address and waits until it is ready; returns how long
    /// that took.
    pub fn start_apiserver(&mut self) -> Result<Duration> {
        let began = Instant::now();
        let (pki, etcd_url) = self.apiserver_setup.clone().context("the node was not started")?;
        let port = self.api_url.rsplit_once(':').and_then(|(_, port)| port.parse().ok());
        let binary = self.bin.join("kube-apiserver");
        let (apiserver, url) =
            control_plane::spawn_apiserver(&self.run.path, &binary, self.version, &etcd_url, &pki, port)?;
        self.apiserver = Some(apiserver);
        anyhow::ensure!(url == self.api_url, "the API server came back at {url}, not {}", self.api_url);
        self.wait_apiserver_ready()?;
        Ok(began.elapsed())
    }

    /// Stops the kubelet (SIGTERM) and starts it again on the same root dir, as a node agent
    /// upgrade does; pods keep running. Returns how long until the Node was Ready again.
    pub fn restart_kubelet(&mut self) -> Result<Duration> {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop(STOP_GRACE);
        }
        let began = Instant::now();
        self.spawn_kubelet()?;
        Ok(began.elapsed())
    }

    /// Changes the kubelet's configuration file with `edit` (the JSON the node wrote), as an
    /// operator edits it before restarting the kubelet; [`Self::restart_kubelet`] then runs the
    /// kubelet with it. The file stays in the run directory and goes with it.
    pub fn edit_kubelet_config(&self, edit: impl FnOnce(&mut serde_json::Value)) -> Result<()> {
        let path = self.kubelet_config_path();
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let mut config: serde_json::Value = serde_json::from_str(&text).context("the kubelet config is JSON")?;
        edit(&mut config);
        std::fs::write(&path, serde_json::to_vec_pretty(&config).context("encode")?)
            .with_context(|| format!("write {}", path.display()))
    }

    /// The kubelet's `--config` file.
    pub fn kubelet_config_path(&self) -> PathBuf {
        kubelet::config_path(&self.run.path)
    }

    /// Which node this is.
    pub fn version(&self) -> NodeVersion {
        self.version
    }

    /// The node's name (what `spec.nodeName` says).
    pub fn node_name(&self) -> &str {
        NODE
    }

    /// The admin kubeconfig: kubectl's, and the agent's `--kubeconfig`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL (`https://127.0.0.1:<port>`).
    pub fn api_server_url(&self) -> &str {
        &self.api_url
    }

    /// The admin bearer token (group system:masters).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The bearer token of user [`READER`], who is in no group and allowed nothing unless a
    /// test binds a role to it.
    pub fn reader_token(&self) -> &str {
        &self.reader_token
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// containerd's CRI socket (the agent's `--cri-socket`).
    pub fn containerd_socket(&self) -> &Path {
        self.containerd().socket()
    }

    /// The containerd harness, for ground truth from the CRI.
    pub fn containerd(&self) -> &Containerd {
        // Set during start; start fails before returning a node without it.
        self.containerd.as_ref().expect("containerd is running")
    }

    /// The kubelet's `--cgroup-root`: pods are under `<root>/kubepods/...` in every hierarchy.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The kubelet's `--root-dir`.
    pub fn kubelet_root_dir(&self) -> PathBuf {
        self.run.path.join("kubelet")
    }

    /// The run directory (logs: `etcd.log`, `kube-apiserver.log`, `kubelet.log`).
    pub fn run_dir(&self) -> &Path {
        &self.run.path
    }

    /// The pid of a daemon: `etcd`, `kube-apiserver` or `kubelet`.
    pub fn pid(&self, daemon: &str) -> Option<u32> {
        match daemon {
            "etcd" => self.etcd.as_ref(),
            "kube-apiserver" => self.apiserver.as_ref(),
            "kubelet" => self.kubelet.as_ref(),
            _ => None,
        }
        .map(Daemon::pid)
    }

    /// The last `lines` lines of a daemon's log (`etcd`, `kube-apiserver`, `kubelet`,
    /// `containerd`).
    pub fn log_tail(&self, daemon: &str, lines: usize) -> String {
        if daemon == "containerd" {
            return self.containerd.as_ref().map(|c| c.log_tail(lines)).unwrap_or_default();
        }
        process::log_tail(&self.run.path.join(format!("{daemon}.log")), lines)
    }

    /// The machine's node-related state before this node changed anything, for comparison
    /// with what [`Self::stop`] returns.
    pub fn machine_before_start(&self) -> &MachineState {
        &self.before
    }
}
