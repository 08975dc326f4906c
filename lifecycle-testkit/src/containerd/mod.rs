//! A private containerd (CRI plugin, runc) for privileged integration tests, driven the way the
//! kubelet drives it: host-network pod sandboxes with the kubelet's labels and a cgroupfs
//! `/kubepods/<qos>/pod<uid>` parent, containers with the kubelet's annotations, and
//! `StopContainer(timeout)` for termination.
//!
//! Everything is local: the image is built from Debian's busybox-static and imported with `ctr`,
//! no registry is touched.
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
//! [`Containerd::block_on`] runs async code such as `lifecycle_agent::discovery::cri::CriClient`
//! calls. Harnesses can run in parallel, but run with `--test-threads=1`: each is a whole
//! containerd, and timing assertions want a quiet machine.
//!
//! This module owns the harness itself (start-up order, accessors, teardown); its parts:
//! - `daemon`: the containerd process — config, spawn until the CRI answers, image import, stop.
//! - `pod`: pod sandboxes and containers through the CRI, as the kubelet calls it.
//! - `kubelet`: the annotations and namespace options the kubelet writes.
//! - `image`: the busybox-static OCI image, built locally.
//! - `run_dir`: the per-harness run directory and the sweep of dead runs.
//! - `host`: `/proc`, mounts and cgroup hierarchies, and the host state shared by
//!   one process's harnesses.
//!
//! Two containerds: Debian's 1.6 from PATH ([`Flavour::Debian`], config version 2, the default)
//! or a 2.x with its own runc and shim from one directory ([`Flavour::Modern`], config version 3:
//! the kube node of a current kubelet). Everything above holds for both.

mod daemon;
pub(crate) mod host;
pub(crate) mod image;
mod kubelet;
mod pod;
mod run_dir;

use std::{
    fs,
    future::Future,
    path::{Path, PathBuf},
    process::Child,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use k8s_cri::v1 as cri;
use lifecycle_agent::discovery::cri::CriClient;

use self::{
    host::{cgroup_hierarchies, which, HostShare},
    image::{build_image, build_image_named},
    run_dir::{shim_sockets, sweep_stale_runs, RunDir},
};
pub use self::{kubelet::KubeletAnnotations, pod::Pod};

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

/// Builds the busybox image every sandbox and container runs ([`IMAGE`]) as an OCI image-layout
/// tarball in `dir`, for a `ctr images import` elsewhere (the kernel matrix's guests).
pub fn build_busybox_image(dir: &Path) -> Result<PathBuf> {
    build_image(dir)
}

/// Why the privileged tier cannot run here, or `None` when it can.
pub fn skip_reason() -> Option<String> {
    skip_reason_for(&Flavour::Debian)
}

/// Why a harness of `flavour` cannot run here, or `None` when it can.
pub fn skip_reason_for(flavour: &Flavour) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (runs containerd and creates cgroups)".to_owned());
    }
    if !Path::new(BUSYBOX).is_file() {
        return Some(format!("{BUSYBOX} missing (apt-get install busybox-static)"));
    }
    if let Some(missing) = flavour.missing() {
        return Some(missing);
    }
    if *flavour != Flavour::Debian {
        if let Some(missing) = ["tar", "sha256sum"].into_iter().find(|b| which(b).is_none()) {
            return Some(format!("missing {missing}"));
        }
    }
    if cgroup_hierarchies().is_empty() {
        return Some("no cgroup hierarchy mounted".to_owned());
    }
    None
}

/// Sweeps run directories of dead test processes (a start does this too).
pub(crate) fn sweep_stale() {
    sweep_stale_runs();
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

/// Which containerd a harness runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Flavour {
    /// Debian's containerd 1.6 (CRI v1alpha2 and v1), its shim and runc, all from PATH.
    #[default]
    Debian,
    /// containerd 2.x with `containerd`, `containerd-shim-runc-v2`, `ctr` and `runc` in `bin`
    /// (xtask's kubernetes-modern cache): config version 3, runc named in the runtime options, and
    /// `bin` first on containerd's PATH so it starts its own shim, not Debian's.
    Modern { bin: PathBuf },
}

impl Flavour {
    /// The path of one of the harness's binaries (`containerd`, `ctr`, ...).
    pub fn binary(&self, name: &str) -> PathBuf {
        match self {
            Flavour::Debian => which(name).unwrap_or_else(|| PathBuf::from(name)),
            Flavour::Modern { bin } => bin.join(name),
        }
    }

    /// Why this containerd cannot run here (besides root and busybox), or `None`.
    fn missing(&self) -> Option<String> {
        match self {
            Flavour::Debian => {
                let missing: Vec<_> = BINARIES.iter().filter(|b| which(b).is_none()).copied().collect();
                (!missing.is_empty()).then(|| {
                    format!("missing {} (apt-get install --no-install-recommends containerd runc)", missing.join(", "))
                })
            }
            Flavour::Modern { bin } => {
                let missing: Vec<_> = ["containerd", "containerd-shim-runc-v2", "ctr", "runc"]
                    .into_iter()
                    .filter(|b| !bin.join(b).is_file())
                    .collect();
                (!missing.is_empty()).then(|| {
                    format!(
                        "missing {} in {} (`xtask/x.sh kubernetes-modern` provides them)",
                        missing.join(", "),
                        bin.display()
                    )
                })
            }
        }
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

/// A private containerd with the CRI plugin.
pub struct Containerd {
    rt: tokio::runtime::Runtime,
    run: RunDir,
    child: Option<Child>,
    cri: Option<CriClient>,
    pods: Vec<Pod>,
    containers: Vec<String>,
    _host: HostShare,
    flavour: Flavour,
    /// Set by [`Self::abandon_as_if_crashed`]: Drop leaves everything to a later sweep.
    abandoned: bool,
    /// What start-up cost.
    pub timings: Timings,
}

impl Containerd {
    /// Sweeps stale runs, builds the image, starts Debian's containerd, waits for the CRI to
    /// answer and imports the image.
    pub fn start() -> Result<Self> {
        Self::start_flavour(Flavour::Debian)
    }

    /// [`Self::start`] with the containerd of `flavour`.
    pub fn start_flavour(flavour: Flavour) -> Result<Self> {
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
            flavour,
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
        harness.import_image(&image, IMAGE)?;
        harness.timings.image_import = began.elapsed();
        Ok(harness)
    }

    /// containerd's CRI socket.
    pub fn socket(&self) -> &Path {
        &self.run.socket
    }

    /// Which containerd this is.
    pub fn flavour(&self) -> &Flavour {
        &self.flavour
    }

    /// The `ctr` that speaks to this containerd (give it the absolute socket path).
    pub fn ctr(&self) -> PathBuf {
        self.flavour.binary("ctr")
    }

    /// Imports the busybox image again as `name`, with `StopSignal` in its image config (e.g.
    /// `SIGUSR2`): for a container whose stop signal comes from its image, not its pod.
    pub fn import_image_with_stop_signal(&self, name: &str, stop_signal: &str) -> Result<()> {
        let dir = self.run.path.join(format!("image-{stop_signal}"));
        let image = build_image_named(&dir, name, Some(stop_signal))?;
        self.import_image(&image, name)
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
