//! A private containerd (CRI plugin, runc) for privileged integration tests, driven the way the
//! kubelet drives it: host-network pod sandboxes with the kubelet's labels and a cgroupfs
//! `/kubepods/<qos>/pod<uid>` parent, containers with the kubelet's annotations, and
//! `StopContainer(timeout)` for termination.
//!
//! Include it with `#[path = "support/containerd.rs"] mod containerd;`. Everything is local: the
//! image is built from Debian's busybox-static and imported with `ctr`, no registry is touched.
//!
//! Ownership and cleanup: each harness lives in its own run directory under
//! [`BASE_DIR`] (containerd root, state, sockets, runc state, logs, the image). `Drop` removes
//! what it created through the CRI, stops the containerd it started (by pid), then sweeps
//! whatever the CRI could not clean: shims serving its socket, processes left in its pod
//! cgroups, mounts under its run directory, its pod cgroups in every hierarchy, the directory.
//! A test process that was SIGKILLed cannot run `Drop`; the next harness start sweeps run
//! directories whose owner process is gone (stale sockets included) with the same code.
//!
//! Host state outside the run directory: shim sockets in /run/containerd/s (containerd 1.6 puts
//! them there whatever the config; removed with their shim), the hugetlb v1 hierarchy mounted at
//! /sys/fs/cgroup/hugetlb when absent (containerd needs it to report OOMKilled here), and
//! `kubepods` cgroup ancestors. The latter two are shared by the harnesses of one process and
//! removed by the last one out, if they created them and nothing else uses them.
//!
//! The API is synchronous (it owns a tokio runtime), so tests are plain `#[test]` functions;
//! [`Containerd::block_on`] runs async code such as `lifecycle_agent::discovery::cri::CriClient` calls.
//! Harnesses can run in parallel, but run with `--test-threads=1`: each is a whole containerd,
//! and timing assertions want a quiet machine.

#![allow(dead_code, reason = "shared by several test binaries, each uses a subset")]

use std::{
    collections::{BTreeSet, HashMap},
    ffi::CString,
    fmt::Write as _,
    fs,
    future::Future,
    io,
    os::unix::{ffi::OsStrExt, fs::symlink},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use lifecycle_agent::discovery::cri::{keys, CriClient};

/// Where run directories live.
pub const BASE_DIR: &str = "/tmp/lifecycle-containerd";
/// The image every sandbox and container runs (busybox-static plus applet links).
pub const IMAGE: &str = "docker.io/library/lifecycle-busybox:local";
/// Debian's busybox-static binary.
const BUSYBOX: &str = "/bin/busybox";
/// The cgroup v1 hierarchy containerd needs mounted to report OOMKilled on this hybrid host.
const HUGETLB_MOUNT: &str = "/sys/fs/cgroup/hugetlb";
/// Binaries the harness runs (containerd starts the shim, the shim runs runc).
const BINARIES: &[&str] = &["containerd", "containerd-shim-runc-v2", "runc", "ctr", "tar", "sha256sum"];
/// How long containerd may take to answer the CRI Version call.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on each cleanup call so a wedged runtime cannot hang `Drop`.
const CLEANUP_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Why the privileged tier cannot run here, or `None` when it can.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (runs containerd and creates cgroups)".to_owned());
    }
    if !Path::new(BUSYBOX).is_file() {
        return Some(format!("{BUSYBOX} missing (apt-get install busybox-static)"));
    }
    let missing: Vec<_> = BINARIES.iter().filter(|b| which(b).is_none()).copied().collect();
    if !missing.is_empty() {
        return Some(format!(
            "missing {} (apt-get install --no-install-recommends containerd runc)",
            missing.join(", ")
        ));
    }
    if cgroup_hierarchies().is_empty() {
        return Some("no cgroup hierarchy mounted".to_owned());
    }
    None
}

/// Starts a harness, or prints why the test is skipped and returns `None`. Panics when the
/// prerequisites are present but containerd cannot be started: that is a real failure.
pub fn start_or_skip(test: &str) -> Option<Containerd> {
    if let Some(reason) = skip_reason() {
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    match Containerd::start() {
        Ok(harness) => Some(harness),
        Err(e) => panic!("{test}: cannot start containerd: {e:#}"),
    }
}

/// Start-up costs, for reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Building the OCI image tarball.
    pub image_build: Duration,
    /// Spawning containerd until its CRI Version call answered.
    pub containerd_ready: Duration,
    /// `ctr images import` until the CRI image service lists the image.
    pub image_import: Duration,
}

/// A pod sandbox the harness created.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// cgroupfs parent, e.g. `/kubepods/burstable/pod<uid>`.
    pub cgroup_parent: String,
    config: cri::PodSandboxConfig,
}

/// The annotations the kubelet writes on a container (`pkg/kubelet/kuberuntime/labels.go`).
#[derive(Clone, Debug)]
pub struct KubeletAnnotations {
    /// `io.kubernetes.pod.terminationGracePeriod`, seconds.
    pub termination_grace_period_s: Option<i64>,
    /// `io.kubernetes.pod.deletionGracePeriod`, seconds.
    pub deletion_grace_period_s: Option<i64>,
    /// `io.kubernetes.container.restartCount`; also the CRI attempt.
    pub restart_count: u32,
    /// `io.kubernetes.container.hash` (written as hex).
    pub hash: u64,
    /// `io.kubernetes.container.type`.
    pub container_type: &'static str,
    /// `io.kubernetes.container.preStopHandler`, JSON.
    pub pre_stop_handler: Option<String>,
    /// `io.kubernetes.container.ports`, JSON.
    pub ports: Option<String>,
    /// Anything else, verbatim (e.g. deliberately malformed values).
    pub extra: Vec<(String, String)>,
}

impl Default for KubeletAnnotations {
    fn default() -> Self {
        Self {
            termination_grace_period_s: Some(30),
            deletion_grace_period_s: None,
            restart_count: 0,
            hash: 0x5eed_cafe,
            container_type: "container",
            pre_stop_handler: None,
            ports: None,
            extra: Vec::new(),
        }
    }
}

impl KubeletAnnotations {
    fn to_map(&self) -> HashMap<String, String> {
        let mut map = HashMap::from([
            (keys::RESTART_COUNT.to_owned(), self.restart_count.to_string()),
            (keys::CONTAINER_HASH.to_owned(), format!("{:x}", self.hash)),
            (keys::CONTAINER_TYPE.to_owned(), self.container_type.to_owned()),
            ("io.kubernetes.container.terminationMessagePath".to_owned(), "/dev/termination-log".to_owned()),
            ("io.kubernetes.container.terminationMessagePolicy".to_owned(), "File".to_owned()),
        ]);
        let optional = [
            (keys::TERMINATION_GRACE_PERIOD, self.termination_grace_period_s.map(|s| s.to_string())),
            (keys::DELETION_GRACE_PERIOD, self.deletion_grace_period_s.map(|s| s.to_string())),
            (keys::PRE_STOP_HANDLER, self.pre_stop_handler.clone()),
            (keys::PORTS, self.ports.clone()),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                map.insert(key.to_owned(), value);
            }
        }
        map.extend(self.extra.iter().cloned());
        map
    }
}

/// A private containerd with the CRI plugin.
pub struct Containerd {
    rt: tokio::runtime::Runtime,
    run: RunDir,
    child: Option<Child>,
    cri: Option<CriClient>,
    pods: Vec<Pod>,
    containers: Vec<String>,
    _host: HostShare,
    /// Set by [`Self::abandon_as_if_crashed`]: Drop leaves everything to a later sweep.
    abandoned: bool,
    /// What start-up cost.
    pub timings: Timings,
}

impl Containerd {
    /// Sweeps stale runs, builds the image, starts containerd, waits for the CRI to answer and
    /// imports the image.
    pub fn start() -> Result<Self> {
        sweep_stale_runs();
        let host = HostShare::acquire()?;
        let run = RunDir::create()?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("build tokio runtime")?;
        let mut harness = Self {
            rt,
            run,
            child: None,
            cri: None,
            pods: Vec::new(),
            containers: Vec::new(),
            _host: host,
            abandoned: false,
            timings: Timings::default(),
        };
        // From here on, Drop cleans up whatever part of start-up succeeded.
        let began = Instant::now();
        let image = build_image(&harness.run.path.join("image"))?;
        harness.timings.image_build = began.elapsed();

        let began = Instant::now();
        harness.spawn_containerd()?;
        harness.timings.containerd_ready = began.elapsed();

        let began = Instant::now();
        harness.import_image(&image)?;
        harness.timings.image_import = began.elapsed();
        Ok(harness)
    }

    fn spawn_containerd(&mut self) -> Result<()> {
        let config = self.run.path.join("config.toml");
        fs::write(&config, containerd_config(&self.run.path)).context("write containerd config")?;
        let log = fs::File::create(self.run.path.join("containerd.log")).context("create containerd log")?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("dup log fd")?)
            .stderr(log)
            .spawn()
            .context("spawn containerd")?;
        fs::write(self.run.path.join("containerd.pid"), child.id().to_string()).context("record pid")?;
        self.child = Some(child);

        let socket = self.socket().to_owned();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("containerd exited with {status} before answering:\n{}", self.log_tail(30));
            }
            // The readiness check is the CRI Version call itself, not a sleep.
            match self.rt.block_on(CriClient::connect(&socket)) {
                Ok(client) => {
                    self.cri = Some(client);
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => {
                    bail!("containerd not ready after {READY_TIMEOUT:?}: {e}\n{}", self.log_tail(30))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn import_image(&self, tarball: &Path) -> Result<()> {
        let output = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(tarball)
            .output()
            .context("run ctr images import")?;
        if !output.status.success() {
            bail!("ctr images import failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        // The CRI plugin learns about imported images from containerd events: wait until its
        // image service answers for the name, so RunPodSandbox never tries to pull.
        let channel = self.block_on(lifecycle_agent::discovery::cri::connect_channel(self.socket()))?;
        let mut images = cri::image_service_client::ImageServiceClient::new(channel);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let request = cri::ImageStatusRequest {
                image: Some(cri::ImageSpec { image: IMAGE.to_owned(), ..Default::default() }),
                verbose: false,
            };
            let status = self.block_on(images.image_status(request)).context("CRI ImageStatus")?;
            if status.into_inner().image.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("CRI does not list {IMAGE} after import");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// containerd's CRI socket.
    pub fn socket(&self) -> &Path {
        &self.run.socket
    }

    /// The run directory (config, logs, state).
    pub fn run_dir(&self) -> &Path {
        &self.run.path
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.run.path.join("containerd.log")).unwrap_or_default();
        let all: Vec<_> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Shim sockets of the sandboxes started so far (under /run/containerd/s).
    pub fn shim_sockets(&self) -> Vec<PathBuf> {
        shim_sockets(&self.run.path.join("state/io.containerd.runtime.v2.task"))
    }

    /// The pid of the containerd this harness started.
    pub fn containerd_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs a future on the harness's runtime; works from sync and async tests alike.
    pub fn block_on<F: Future + Send>(&self, future: F) -> F::Output
    where
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside another runtime a nested block_on panics: drive ours from a plain thread.
            std::thread::scope(|scope| match scope.spawn(|| self.rt.block_on(future)).join() {
                Ok(output) => output,
                Err(panic) => std::panic::resume_unwind(panic),
            })
        } else {
            self.rt.block_on(future)
        }
    }

    /// The agent's CRI client, connected to this containerd.
    pub fn cri(&self) -> &CriClient {
        // Set in spawn_containerd; start() fails before returning a harness without it.
        self.cri.as_ref().expect("harness is connected")
    }

    fn runtime(&self) -> cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel> {
        self.cri().runtime_service()
    }

    /// A pod sandbox as the kubelet creates one: host network, pid namespace per container,
    /// the kubelet's identity labels, the given cgroupfs parent.
    pub fn run_pod_sandbox(&mut self, name: &str, namespace: &str, uid: &str, cgroup_parent: &str) -> Result<Pod> {
        self.run.record_cgroup_parent(cgroup_parent)?;
        let log_dir = self.run.path.join("logs").join(format!("{namespace}_{name}_{uid}"));
        fs::create_dir_all(&log_dir).context("create pod log dir")?;
        let namespaces = kubelet_namespaces();
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            // Host network: no CNI, and the kubelet leaves the hostname empty.
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: HashMap::from([
                (keys::POD_NAME.to_owned(), name.to_owned()),
                (keys::POD_NAMESPACE.to_owned(), namespace.to_owned()),
                (keys::POD_UID.to_owned(), uid.to_owned()),
            ]),
            annotations: HashMap::from([("kubernetes.io/config.source".to_owned(), "api".to_owned())]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let request = cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        let mut runtime = self.runtime();
        let id = self
            .block_on(runtime.run_pod_sandbox(request))
            .with_context(|| format!("RunPodSandbox {namespace}/{name}\n{}", self.log_tail(20)))?
            .into_inner()
            .pod_sandbox_id;
        let pod = Pod {
            id,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
            cgroup_parent: cgroup_parent.to_owned(),
            config,
        };
        self.pods.push(pod.clone());
        Ok(pod)
    }

    /// A burstable pod in `default` with a fresh UID: `/kubepods/burstable/pod<uid>`.
    pub fn new_pod(&mut self, name: &str) -> Result<Pod> {
        let uid = fresh_uid()?;
        self.run_pod_sandbox(name, "default", &uid, &format!("/kubepods/burstable/pod{uid}"))
    }

    /// A container as the kubelet creates one (labels, annotations, attempt = restart count,
    /// log path, namespaces); `memory_limit_bytes` also caps swap, as the kubelet does.
    pub fn create_container(
        &mut self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &KubeletAnnotations,
        memory_limit_bytes: Option<i64>,
    ) -> Result<String> {
        let resources = cri::LinuxContainerResources {
            cpu_shares: 2,
            memory_limit_in_bytes: memory_limit_bytes.unwrap_or(0),
            memory_swap_limit_in_bytes: memory_limit_bytes.unwrap_or(0),
            ..Default::default()
        };
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.to_owned(), attempt: annotations.restart_count }),
            image: Some(cri::ImageSpec { image: IMAGE.to_owned(), ..Default::default() }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            labels: HashMap::from([
                (keys::POD_NAME.to_owned(), pod.name.clone()),
                (keys::POD_NAMESPACE.to_owned(), pod.namespace.clone()),
                (keys::POD_UID.to_owned(), pod.uid.clone()),
                (keys::CONTAINER_NAME.to_owned(), name.to_owned()),
            ]),
            annotations: annotations.to_map(),
            log_path: format!("{name}/{}.log", annotations.restart_count),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(kubelet_namespaces()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let mut runtime = self.runtime();
        let id = self
            .block_on(runtime.create_container(request))
            .with_context(|| format!("CreateContainer {name} in {}\n{}", pod.name, self.log_tail(20)))?
            .into_inner()
            .container_id;
        self.containers.push(id.clone());
        Ok(id)
    }

    /// StartContainer.
    pub fn start_container(&self, id: &str) -> Result<()> {
        let mut runtime = self.runtime();
        let request = cri::StartContainerRequest { container_id: id.to_owned() };
        self.block_on(runtime.start_container(request))
            .with_context(|| format!("StartContainer {id}\n{}", self.log_tail(20)))?;
        Ok(())
    }

    /// Create and start.
    pub fn run_container(
        &mut self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &KubeletAnnotations,
        memory_limit_bytes: Option<i64>,
    ) -> Result<String> {
        let id = self.create_container(pod, name, command, annotations, memory_limit_bytes)?;
        self.start_container(&id)?;
        Ok(id)
    }

    /// StopContainer as the kubelet's killContainer issues it; returns how long the call took
    /// (the runtime answers once the container has exited).
    pub fn stop_container(&self, id: &str, timeout_s: i64) -> Result<Duration> {
        let mut runtime = self.runtime();
        let request = cri::StopContainerRequest { container_id: id.to_owned(), timeout: timeout_s };
        let began = Instant::now();
        self.block_on(runtime.stop_container(request)).with_context(|| format!("StopContainer {id}"))?;
        Ok(began.elapsed())
    }

    /// ContainerStatus, raw.
    pub fn container_status(&self, id: &str) -> Result<cri::ContainerStatus> {
        let mut runtime = self.runtime();
        let request = cri::ContainerStatusRequest { container_id: id.to_owned(), verbose: false };
        self.block_on(runtime.container_status(request))
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("ContainerStatus {id}: empty answer"))
    }

    /// Polls ContainerStatus until the container has exited.
    pub fn wait_exited(&self, id: &str, within: Duration) -> Result<cri::ContainerStatus> {
        let deadline = Instant::now() + within;
        loop {
            let status = self.container_status(id)?;
            if status.state == cri::ContainerState::ContainerExited as i32 {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("container {id} still in state {} after {within:?}", status.state);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// RemoveContainer (the runtime kills it first if it still runs).
    pub fn remove_container(&mut self, id: &str) -> Result<()> {
        let mut runtime = self.runtime();
        let request = cri::RemoveContainerRequest { container_id: id.to_owned() };
        self.block_on(runtime.remove_container(request)).with_context(|| format!("RemoveContainer {id}"))?;
        self.containers.retain(|c| c != id);
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox (which removes the pod's containers too).
    pub fn remove_pod(&mut self, pod: &Pod) -> Result<()> {
        let mut runtime = self.runtime();
        let stop = cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() };
        self.block_on(runtime.stop_pod_sandbox(stop)).with_context(|| format!("StopPodSandbox {}", pod.id))?;
        let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() };
        self.block_on(runtime.remove_pod_sandbox(remove)).with_context(|| format!("RemovePodSandbox {}", pod.id))?;
        self.pods.retain(|p| p.id != pod.id);
        Ok(())
    }

    /// Removes, through the CRI, everything this harness created; returns what failed.
    fn remove_all_through_cri(&mut self) -> Vec<String> {
        let Some(client) = self.cri.as_ref() else {
            return Vec::new();
        };
        let runtime = client.runtime_service();
        let containers = std::mem::take(&mut self.containers);
        let pods = std::mem::take(&mut self.pods);
        self.block_on(async move {
            let mut failures = Vec::new();
            let mut note =
                |what: String, result: Result<Result<(), tonic::Status>, tokio::time::error::Elapsed>| match result {
                    Ok(Ok(())) => {}
                    Ok(Err(status)) if status.code() == tonic::Code::NotFound => {}
                    Ok(Err(status)) => failures.push(format!("{what}: {status}")),
                    Err(_) => failures.push(format!("{what}: timed out")),
                };
            for id in containers.iter().rev() {
                let mut rt = runtime.clone();
                let stop = cri::StopContainerRequest { container_id: id.clone(), timeout: 0 };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.stop_container(stop)).await;
                note(format!("StopContainer {id}"), result.map(|r| r.map(drop)));
                let remove = cri::RemoveContainerRequest { container_id: id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.remove_container(remove)).await;
                note(format!("RemoveContainer {id}"), result.map(|r| r.map(drop)));
            }
            for pod in pods.iter().rev() {
                let mut rt = runtime.clone();
                let stop = cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.stop_pod_sandbox(stop)).await;
                note(format!("StopPodSandbox {}", pod.id), result.map(|r| r.map(drop)));
                let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.remove_pod_sandbox(remove)).await;
                note(format!("RemovePodSandbox {}", pod.id), result.map(|r| r.map(drop)));
            }
            failures
        })
    }

    /// Leaves containerd, shims, containers, mounts and cgroups running, owned by a dead pid, as
    /// a SIGKILLed test process would; the next [`Self::start`] must sweep them.
    pub fn abandon_as_if_crashed(mut self) {
        // pid 0 is never a live owner.
        if let Err(e) = fs::write(self.run.path.join("owner"), "0 abandoned") {
            panic!("cannot rewrite owner of {}: {e}", self.run.path.display());
        }
        self.cri = None;
        // Dropping a Child neither kills nor waits for it.
        drop(self.child.take());
        self.pods.clear();
        self.containers.clear();
        self.abandoned = true;
    }

    /// SIGTERM to our containerd, SIGKILL if it has not exited within 5 s.
    fn stop_containerd(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.abandoned {
            return;
        }
        let failures = self.remove_all_through_cri();
        if !failures.is_empty() {
            eprintln!("containerd harness: CRI cleanup left work for the sweep: {failures:?}");
        }
        // Drop the gRPC channel before its server goes away.
        self.cri = None;
        self.stop_containerd();
        for problem in self.run.sweep() {
            eprintln!("containerd harness cleanup: {problem}");
        }
    }
}

/// The kubelet's namespace choices: host network, a pid namespace per container, pod IPC.
fn kubelet_namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn containerd_config(run: &Path) -> String {
    let dir = run.display();
    // Everything private to the run directory except the shim sockets, which containerd 1.6
    // always puts under /run/containerd/s.
    format!(
        r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  # root has no CAP_SYS_RESOURCE here; without this every container start fails.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{dir}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni/bin"
    conf_dir = "{dir}/cni/conf"
"#
    )
}

/// Builds an OCI image-layout tarball of busybox-static with its applet links.
fn build_image(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "etc", "root", "run", "var"] {
        fs::create_dir_all(rootfs.join(sub)).with_context(|| format!("create rootfs/{sub}"))?;
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).context("copy busybox")?;
    let list = Command::new(BUSYBOX).arg("--list-full").output().context("busybox --list-full")?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|l| !l.is_empty()) {
        let link = rootfs.join(applet);
        if link.exists() || applet == "bin/busybox" {
            continue;
        }
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).with_context(|| format!("create dir for {applet}"))?;
        }
        symlink("/bin/busybox", &link).with_context(|| format!("link {applet}"))?;
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").context("write passwd")?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n").context("write group")?;

    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).context("create blobs dir")?;
    let layer = dir.join("layer.tar");
    run(Command::new("tar")
        .args(["--create", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "--mtime=@0", "--file"])
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs)
        .arg("."))?;
    let (layer_digest, layer_size) = add_blob(&blobs, &fs::read(&layer).context("read layer")?)?;

    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            // The sandbox ("pause") container runs the image default: sleep until killed.
            "Cmd": ["/bin/sleep", "infinity"],
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let (config_digest, config_size) = add_blob(&blobs, config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = add_blob(&blobs, manifest.to_string().as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": { "io.containerd.image.name": IMAGE },
        }],
    });
    fs::write(layout.join("index.json"), index.to_string()).context("write index.json")?;
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).context("write oci-layout")?;
    let tarball = dir.join("image.tar");
    run(Command::new("tar").arg("--create").arg("--file").arg(&tarball).arg("-C").arg(&layout).args([
        "oci-layout",
        "index.json",
        "blobs",
    ]))?;
    Ok(tarball)
}

/// Stores a blob under its sha256; returns (hex digest, size).
fn add_blob(blobs: &Path, data: &[u8]) -> Result<(String, usize)> {
    let staging = blobs.join("staging");
    fs::write(&staging, data).context("write blob")?;
    let output = Command::new("sha256sum").arg(&staging).output().context("run sha256sum")?;
    let digest = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .map(str::to_owned)
        .with_context(|| format!("sha256sum gave no digest: {}", String::from_utf8_lossy(&output.stderr)))?;
    fs::rename(&staging, blobs.join(&digest)).context("name blob")?;
    Ok((digest, data.len()))
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn run(command: &mut Command) -> Result<()> {
    let output = command.output().with_context(|| format!("run {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(binary)).find(|p| p.is_file())
}

fn fresh_uid() -> Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/uuid").context("read a random uuid")?.trim().to_owned())
}

fn signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a specific positive pid we identified; no memory is involved.
    unsafe { libc::kill(pid, signal) };
}

/// Mount points of every cgroup hierarchy (v1 controllers and v2).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    mounts().into_iter().filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2").map(|m| m.point).collect()
}

struct Mount {
    point: PathBuf,
    fstype: String,
    options: String,
}

fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fstype = right.next()?.to_owned();
            let options = right.nth(1).unwrap_or_default().to_owned();
            Some(Mount { point: PathBuf::from(unescape_mountinfo(point)), fstype, options })
        })
        .collect()
}

fn unescape_mountinfo(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(byte) => out.push(char::from(byte)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Processes whose command line mentions `needle` (shims carry `-address <our socket>`).
fn pids_mentioning(needle: &str, binary_suffix: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<_> = raw.split(|b| *b == 0).map(String::from_utf8_lossy).collect();
            args.first().is_some_and(|argv0| argv0.ends_with(binary_suffix)) && args.iter().any(|a| a == needle)
        })
        .collect()
}

/// Running or sleeping; a zombie waiting for its (possibly foreign) parent counts as gone.
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

fn process_start_time(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime); fields after the parenthesised comm are space-separated.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19).map(str::to_owned)
}

/// The process's own identity, so a later sweep can tell a live owner from a reused pid.
fn owner_tag(pid: u32) -> String {
    format!("{pid} {}", process_start_time(pid).unwrap_or_default())
}

static RUN_SEQUENCE: AtomicUsize = AtomicUsize::new(0);

/// One harness's private directory and the host state recorded in it for the sweep.
struct RunDir {
    path: PathBuf,
    socket: PathBuf,
}

impl RunDir {
    fn create() -> Result<Self> {
        let pid = std::process::id();
        let n = RUN_SEQUENCE.fetch_add(1, Ordering::SeqCst);
        let path = Path::new(BASE_DIR).join(format!("{pid}-{n}"));
        if path.exists() {
            // Same pid and sequence as a dead run: pid reuse. Its contents are stale.
            Self::open(path.clone()).sweep();
        }
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        fs::write(path.join("owner"), owner_tag(pid)).context("write owner")?;
        Ok(Self::open(path))
    }

    fn open(path: PathBuf) -> Self {
        let socket = path.join("containerd.sock");
        Self { path, socket }
    }

    fn owner_alive(&self) -> bool {
        let Ok(owner) = fs::read_to_string(self.path.join("owner")) else {
            return false;
        };
        let pid = owner.split_whitespace().next().and_then(|p| p.parse::<u32>().ok());
        pid.is_some_and(|pid| alive(pid) && owner_tag(pid) == owner)
    }

    /// Notes, before the runtime creates them, which cgroup directories will be ours: in each
    /// hierarchy the pod directory (with everything below it) and any ancestor that does not
    /// exist yet (by itself: other pods may appear under it later).
    fn record_cgroup_parent(&self, cgroup_parent: &str) -> Result<()> {
        let parts: Vec<_> = cgroup_parent.trim_start_matches('/').split('/').collect();
        let mut text = fs::read_to_string(self.path.join("cgroups")).unwrap_or_default();
        for hierarchy in cgroup_hierarchies() {
            let mut dir = hierarchy.clone();
            for (i, part) in parts.iter().enumerate() {
                dir.push(part);
                if i + 1 == parts.len() {
                    let _ = writeln!(text, "pod {}", dir.display());
                } else if !dir.exists() {
                    let _ = writeln!(text, "ancestor {}", dir.display());
                    HostShare::note_ancestor(&dir);
                }
            }
        }
        fs::write(self.path.join("cgroups"), text).context("record cgroups")
    }

    /// The recorded cgroups: (pod directories, ancestors we created).
    fn recorded_cgroups(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let text = fs::read_to_string(self.path.join("cgroups")).unwrap_or_default();
        let (mut pods, mut ancestors) = (Vec::new(), Vec::new());
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pod", dir)) => pods.push(PathBuf::from(dir)),
                Some(("ancestor", dir)) => ancestors.push(PathBuf::from(dir)),
                _ => {}
            }
        }
        (pods, ancestors)
    }

    /// Removes everything the run left on the host; returns what could not be removed.
    fn sweep(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // 1. Our containerd, if it is still running (a crashed owner leaves it orphaned).
        if let Some(pid) = fs::read_to_string(self.path.join("containerd.pid")).ok().and_then(|p| p.trim().parse().ok())
        {
            let config = self.path.join("config.toml").to_string_lossy().into_owned();
            if pids_mentioning(&config, "containerd").contains(&pid) {
                signal(pid, libc::SIGKILL);
                wait_gone(&[pid]);
            }
        }
        // 2. Shims serving our socket, then anything still in our cgroups (the containers of a
        //    killed shim keep running otherwise).
        let shims = pids_mentioning(&self.socket.to_string_lossy(), "containerd-shim-runc-v2");
        for pid in &shims {
            signal(*pid, libc::SIGKILL);
        }
        wait_gone(&shims);
        // A killed shim leaves its socket in /run/containerd/s; each bundle's `address` file
        // names it. (Shims that exited normally removed theirs already.)
        for socket in shim_sockets(&self.path.join("state/io.containerd.runtime.v2.task")) {
            let _ = fs::remove_file(socket);
        }
        let (pod_cgroups, ancestors) = self.recorded_cgroups();
        for dir in &pod_cgroups {
            let pids = cgroup_pids(dir);
            for pid in &pids {
                signal(*pid, libc::SIGKILL);
            }
            wait_gone(&pids);
        }
        // 3. Mounts under the run directory (rootfs overlays, sandbox shm), deepest first.
        let mut ours: Vec<PathBuf> =
            mounts().into_iter().map(|m| m.point).filter(|p| p.starts_with(&self.path)).collect();
        ours.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for point in ours {
            if let Err(e) = unmount(&point) {
                problems.push(format!("umount {}: {e}", point.display()));
            }
        }
        // 4. Cgroup directories, children before parents. An ancestor that another user of
        //    /kubepods populated meanwhile is not empty: rmdir refuses, and that is right.
        let mut dirs = Vec::new();
        for dir in &pod_cgroups {
            collect_subdirs(dir, &mut dirs);
        }
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        dirs.dedup();
        for dir in dirs {
            match fs::remove_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    problems.push(format!("rmdir {}: {e}", dir.display()));
                }
                _ => {}
            }
        }
        let mut ancestors = ancestors;
        ancestors.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        ancestors.dedup();
        for dir in ancestors {
            let _ = fs::remove_dir(&dir);
        }
        // 5. The directory itself, and the shared base once no other run uses it (remove_dir
        // fails harmlessly while another harness's directory is still inside).
        if let Err(e) = fs::remove_dir_all(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                problems.push(format!("remove {}: {e}", self.path.display()));
            }
        }
        let _ = fs::remove_dir(BASE_DIR);
        problems
    }
}

/// Sweeps run directories left by dead test processes.
fn sweep_stale_runs() {
    let Ok(entries) = fs::read_dir(BASE_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let run = RunDir::open(entry.path());
        if entry.path().is_dir() && !run.owner_alive() {
            eprintln!("containerd harness: sweeping stale run {}", run.path.display());
            for problem in run.sweep() {
                eprintln!("containerd harness: stale sweep: {problem}");
            }
        }
    }
}

/// The shim sockets named by `<task dir>/<namespace>/<id>/address` files.
fn shim_sockets(task_dir: &Path) -> Vec<PathBuf> {
    let bundles = fs::read_dir(task_dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|namespace| fs::read_dir(namespace.path()).into_iter().flatten().flatten());
    let mut sockets: Vec<PathBuf> = bundles
        .filter_map(|bundle| fs::read_to_string(bundle.path().join("address")).ok())
        .filter_map(|address| {
            let path = PathBuf::from(address.trim().strip_prefix("unix://")?);
            path.starts_with("/run/containerd/s").then_some(path)
        })
        .collect();
    // Containers of a sandbox share its shim, so their bundles name the same socket.
    sockets.sort();
    sockets.dedup();
    sockets
}

fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut dirs = Vec::new();
    collect_subdirs(dir, &mut dirs);
    dirs.iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// `dir` and every directory below it.
fn collect_subdirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_subdirs(&entry.path(), out);
            }
        }
    }
}

fn unmount(point: &Path) -> io::Result<()> {
    let path =
        CString::new(point.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Host state shared by this process's harnesses: how many are live, whether one of them
/// mounted the hugetlb hierarchy, and which cgroup ancestors (`kubepods`, `kubepods/burstable`)
/// they created. Parallel harnesses share those, so only the last one out removes them.
struct Shared {
    users: usize,
    mounted_hugetlb: bool,
    ancestors: BTreeSet<PathBuf>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared { users: 0, mounted_hugetlb: false, ancestors: BTreeSet::new() });

fn shared() -> std::sync::MutexGuard<'static, Shared> {
    SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One harness's claim on the shared host state.
///
/// The hugetlb cgroup v1 hierarchy is not mounted on this hybrid host by default; without it
/// containerd's v1 cgroup loader cannot watch memory events and reports an OOM kill as a plain
/// `Error`. The last harness out removes the ancestors the harnesses created and unmounts
/// hugetlb if a harness mounted it, each only once nothing else uses it.
struct HostShare;

impl HostShare {
    fn acquire() -> Result<Self> {
        let mut state = shared();
        let mounted = mounts().iter().any(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == "hugetlb"));
        if !mounted {
            fs::create_dir_all(HUGETLB_MOUNT).with_context(|| format!("mkdir {HUGETLB_MOUNT}"))?;
            run(Command::new("mount").args(["-t", "cgroup", "-o", "hugetlb", "cgroup", HUGETLB_MOUNT]))?;
            state.mounted_hugetlb = true;
        }
        state.users += 1;
        Ok(Self)
    }

    fn note_ancestor(dir: &Path) {
        shared().ancestors.insert(dir.to_owned());
    }
}

impl Drop for HostShare {
    fn drop(&mut self) {
        let mut state = shared();
        state.users = state.users.saturating_sub(1);
        if state.users > 0 {
            return;
        }
        let mut ancestors: Vec<_> = std::mem::take(&mut state.ancestors).into_iter().collect();
        ancestors.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for dir in ancestors {
            // rmdir refuses a cgroup with children: someone else's pods keep it alive.
            let _ = fs::remove_dir(dir);
        }
        if state.mounted_hugetlb {
            let in_use = fs::read_dir(HUGETLB_MOUNT).is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().is_dir())));
            if !in_use && unmount(Path::new(HUGETLB_MOUNT)).is_ok() {
                let _ = fs::remove_dir(HUGETLB_MOUNT);
                state.mounted_hugetlb = false;
            }
        }
    }
}
