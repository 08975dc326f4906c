//! The running agent: the one owner of the loaded sensor, feeding kernel events to the tracker,
//! keeping runtime metadata current, and serving metrics and the API. Thin plumbing around the
//! pure core; every decision lives in `tracker` and below.

pub(crate) mod auth;
mod events;
mod families;
pub(crate) mod health;
pub mod http;
mod kube;
pub(crate) mod kubelet;
pub mod logging;
mod memory;
mod notices;
mod reader;
mod routes;
mod runtime;
mod sockets;
mod sources;
mod systemd;
mod tasks;
pub(crate) mod tls;
mod verdicts;

use crate::handoff::{self, registry::Registry, HandoffError, Serves, SocketFacts};
use crate::{heartbeats::Heartbeats, owner};
use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use lifecycle_common::{KindStats, EVENT_KIND_COUNT};
use tokio::sync::{watch, Notify};

use crate::{
    discovery::{
        cgroupfs::{CgroupFsError, CgroupRoot},
        clock::{boottime_ns, unix_minus_boot_seconds},
    },
    export::{
        metrics::{AgentCounters, FeatureFlag, KernelStats, Metrics, MetricsError},
        units::{KernelCounters, LiveCounters, UnitMetrics},
    },
    kernel::{Sensor, SensorConfig, SensorError, SensorMaps, StreamError},
    model::{
        kubelet::KubeletOverrides,
        node::{Command, NodeTracker, TrackerConfig},
        time::BootTime,
    },
    probe::{
        feeds::ProbeFeeds,
        source::{AllowFrom, SourceFilter},
        supervisor::ProbeSupervisor,
        NodeProbes,
    },
};
use http::Routes;
use reader::Reader;
use routes::ContainersApi;
use runtime::{runtime_loop, RuntimeLink};
use tasks::{expiry_loop, seed};

/// With this variable set to a file's path, the agent writes every command its model handles to
/// that file, one JSON object a line (`owner.rs`): the sequence a replay test reads back.
pub const RECORD_COMMANDS_ENV: &str = "LIFECYCLE_RECORD_COMMANDS";

/// The sensor's counter map is where the exporters' kernel counters come from.
impl KernelCounters for SensorMaps {
    fn read_all(&self, into: &mut LiveCounters) {
        self.each_cgroup_counters(|id, counters| {
            into.insert(id, counters);
        });
    }
}

/// ... and its statistics.
impl KernelStats for SensorMaps {
    fn kind_stats(&self) -> [KindStats; EVENT_KIND_COUNT] {
        SensorMaps::kind_stats(self)
    }

    fn counter_entries(&self) -> usize {
        SensorMaps::counter_entries(self)
    }

    fn program_costs(&self) -> Vec<crate::kernel::ProgramCost> {
        SensorMaps::program_costs(self)
    }

    fn own_usage(&self) -> Option<(f64, u64)> {
        crate::discovery::proc::own_usage()
    }
}

/// Settings for a running agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    /// The kubelet's liveness probe of the agent: `/healthz` alone, on a listener of its own.
    pub health_listen: Option<SocketAddr>,
    /// Where this agent's listening sockets are handed to the next agent on the node, and taken
    /// from the running one (`handoff`); None: not.
    pub handoff_dir: Option<PathBuf>,
    /// Where this pod's socket keeper serves (`handoff::keeper`), which holds the sockets across
    /// restarts of this agent; None: no keeper, the sockets end with the process.
    pub keeper_dir: Option<PathBuf>,
    /// Series for host cgroups: Some(on/off), or None for "unless the Kubernetes API is there".
    pub host_cgroups: Option<bool>,
    /// Which metric families /metrics serves.
    pub metric_families: crate::export::metrics::FamilyFilter,
    pub sensor: SensorConfig,
    /// How often the ring is drained when the kernel has not woken the agent.
    pub poll: Duration,
    /// The runtime's CRI socket; None tries containerd's, then CRI-O's default path.
    pub cri_socket: Option<PathBuf>,
    /// How often runtime metadata is refreshed besides on demand.
    pub cri_refresh: Duration,
    /// How long a departed container's series and status are kept.
    pub series_retention: Duration,
    /// Port of the probe listener started inside each pod's network namespace; None: only the
    /// node endpoint `/api/v1/probe/...` answers.
    pub pod_probe_port: Option<u16>,
    /// Who may connect to the per-pod probe listeners (`--probe-allow-from`).
    pub probe_allow_from: Vec<AllowFrom>,
    pub tracker: TrackerConfig,
    /// The agent's flags over what it reads of the node's kubelet (`--reduced-backoff-decay`,
    /// `--max-container-restart-period`).
    pub kubelet_overrides: KubeletOverrides,
    /// Kubeconfig for the Kubernetes API when not running in a pod (else `KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// This node's name for the pod watch (else `NODE_NAME`, else the hostname).
    pub node_name: Option<String>,
    /// Publish warnings as Kubernetes Events on the pods (`--events`).
    pub events: bool,
    /// Require a bearer token allowed by the API server for `/api/*` (`--api-auth kubernetes`).
    pub api_auth: bool,
    /// The same for `/metrics` (`--metrics-auth kubernetes`; needs `api_auth`).
    pub metrics_auth: bool,
    /// Audiences a bearer token must be issued for (`--api-auth-audience`); empty: any the API
    /// server accepts.
    pub api_auth_audiences: Vec<String>,
    /// Serve `--listen` over TLS with this (certificate chain, key) PEM pair.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The kernel programs could not be loaded or attached.
    #[error(transparent)]
    Sensor(#[from] SensorError),
    /// The cgroup v2 hierarchy could not be found.
    #[error(transparent)]
    CgroupFs(#[from] CgroupFsError),
    /// The metrics registry could not be set up.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The listening sockets could not be had: a port held by another process, or not ours to
    /// bind.
    #[error(transparent)]
    Sockets(#[from] HandoffError),
    /// The health listener's loop could not be started.
    #[error("cannot serve --health-listen")]
    Health(#[source] crate::probe::server::ServerError),
    /// `--tls-cert-file`/`--tls-key-file` could not be used.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Reading the event ring failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// `--kubeconfig` names a file that cannot be read or used: an operator's explicit choice,
    /// so the agent does not start without the API it was told to use.
    #[error("--kubeconfig: {0}")]
    Kubeconfig(String),
    /// The sensor's event stream was already taken (a programming error).
    #[error("the sensor's event stream is already in use")]
    StreamTaken,
}

/// [`run`] as a boxed future, made in this crate: what the binary awaits. Its poll, and every
/// future it awaits, is then compiled here once, with the instances of generic code this crate
/// has anyway; awaited in the binary, the whole tree was compiled again in the binary's crate
/// (release builds share no generic instances between crates). With `doctor`'s run boxed too,
/// the binary's unit fell from 49.5 s to 12.2 s and the library's rose from 47 s to 63 s: 98 s
/// to 75 s for both on this machine (BENCHMARKS.md: fresh-machine run).
pub fn run_boxed(
    config: AgentConfig,
    shutdown: watch::Receiver<bool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AgentError>> + Send>> {
    Box::pin(run(config, shutdown))
}

/// Runs until `shutdown` turns true, then detaches everything.
pub async fn run(config: AgentConfig, shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    // First: a kubeconfig named on the command line that cannot be used ends the start here.
    let kube = kube::connect(config.kubeconfig.clone(), config.node_name.clone()).await?;
    // Then the sockets: a port another process holds stops the agent before anything is loaded.
    let wanted = sockets::Wanted {
        listen: config.listen,
        health: config.health_listen,
        keeper_dir: config.keeper_dir.as_deref(),
        handoff_dir: config.handoff_dir.as_deref(),
    };
    let own_sockets = match sockets::obtain(&wanted)? {
        sockets::Start::Serve(own) => own,
        sockets::Start::Replaced => {
            log::warn!(
                "this pod's socket keeper says a newer agent on this node took its sockets: this agent serves \
                 nothing and waits to be removed"
            );
            let mut shutdown = shutdown;
            while !*shutdown.borrow_and_update() && shutdown.changed().await.is_ok() {}
            return Ok(());
        }
    };
    let mut sensor = Sensor::load(&config.sensor)?;
    sensor.log_features();
    let root = CgroupRoot::detect()?;
    // Until the runtime is first asked, containers wait for their names; the first refresh below
    // names them, or tells the tracker to name them by id.
    let tracker_config = TrackerConfig { cri_available: true, ..config.tracker.clone() };
    let tracker = NodeTracker::new(tracker_config);
    // Handed to the model once its owner exists, below (the runtime is asked before the first
    // batch anyway).
    let mut start_commands = vec![seed(&root)];
    if kube.is_some() {
        start_commands.push(Command::ApiConfigured);
    }
    let snapshots = owner::snapshots_of(&tracker);
    let maps = sensor.maps();
    let agent_counters = Arc::new(AgentCounters::default());
    let mut features: Vec<FeatureFlag> =
        sensor.features().iter().map(|f| FeatureFlag { name: f.feature.name(), enabled: f.enabled }).collect();
    features.push(FeatureFlag { name: "kubernetes_api", enabled: kube.is_some() });
    let kernel_log = tasks::kernel_log_readable();
    features.push(FeatureFlag { name: "oom_log", enabled: kernel_log });
    // Memory pressure as evidence: what this host's cgroups have of it, said once. Not a
    // `lifecycle_feature_enabled` flag: a hybrid host lacks memory.events by its layout, which
    // is no fault to alert on; the series say it by what they carry (docs/metrics.md).
    let memory_layout = crate::discovery::memory::MemoryLayout::detect(&root);
    log::info!("memory pressure: {}", memory_layout.describe());
    let mut metrics = Metrics::new(
        maps.clone(),
        &features,
        config.sensor.counter_entries,
        config.sensor.ring_bytes,
        agent_counters.clone(),
    )?;
    let events_wanted = kube.is_some() && config.events;
    let wanted = families::Wanted { kube: kube.is_some(), events: events_wanted, api_auth: config.api_auth };
    let families::AgentMetrics {
        event_to_state: latency,
        repairs,
        probes: probe_metrics,
        file_readers: readers,
        systemd: systemd_counts,
        kubelet: kubelet_metrics,
        runtime: runtime_metrics,
        kube: kube_metrics,
        events: event_counts,
        api_reviews,
        waits,
        rejections: rejected,
    } = families::register_all(metrics.registry(), wanted).map_err(MetricsError::from)?;
    metrics.set_family_filter(config.metric_families.clone());
    let units = UnitMetrics::new(snapshots.subscribe(), maps.clone(), Box::new(unix_minus_boot_seconds));
    let host_units = config.host_cgroups.unwrap_or(kube.is_none());
    if !host_units {
        log::info!("no series for host cgroups (--host-cgroups on to have them)");
    }
    let units = Arc::new(if host_units { units } else { units.without_host_units() });
    metrics.add_text_source(Box::new(units.clone()));
    let node_probes = Arc::new(NodeProbes::new(Some(probe_metrics.clone())));
    let probe_feeds = Arc::new(ProbeFeeds::new(Some(probe_metrics.clone())));
    let metadata_wanted = Arc::new(Notify::new());
    let (systemd_requests, systemd_queue) = systemd::SystemdRequests::new(systemd_counts.clone());
    // The node's kubelet, before the first event is judged: its back-off, release and gates.
    let node_name = crate::discovery::kube::watch::KubeSource::node_name(config.node_name.clone());
    let mut kubelet_link =
        kubelet::KubeletLink::new(node_name, kube.clone(), config.kubelet_overrides, Some(kubelet_metrics));
    start_commands.push(Command::Kubelet(kubelet_link.read().await));
    let (kubelet_starts, kubelet_queue) = kubelet::KubeletStarts::new();
    let rescan_wanted = Arc::new(Notify::new());
    let (oom_victims, oom_victims_queue) = tokio::sync::mpsc::unbounded_channel();
    let (warnings, warnings_queue) = tokio::sync::mpsc::unbounded_channel();
    // Where what the model's commands change goes (`owner.rs`, the doors).
    let sinks = owner::Sinks {
        judgements: units.clone(),
        probes: probe_feeds.clone(),
        notices: Box::new(notices::NoticeHandlers {
            metadata_wanted: metadata_wanted.clone(),
            rescan_wanted: rescan_wanted.clone(),
            oom_victims: kernel_log.then_some(oom_victims),
            systemd: systemd_requests,
            kubelet: kubelet_starts,
            repairs: repairs.clone(),
            notices_refused: kube_metrics.as_ref().map(kube::KubeMetrics::notices_refused),
            warnings: events_wanted.then_some(warnings),
        }),
    };
    let (mut owner, model) =
        owner::own(tracker, snapshots, sinks).map_err(|err| AgentError::Stream(StreamError::Register(err)))?;
    let taken_maps = maps.clone();
    owner.take_counters_with(Box::new(move |cgroup_id| taken_maps.take_counters(cgroup_id)));
    if let Some(path) = std::env::var_os(RECORD_COMMANDS_ENV) {
        let path = PathBuf::from(path);
        match owner.record_to(path.clone()) {
            Ok(()) => log::info!("recording the model's commands to {} ({RECORD_COMMANDS_ENV})", path.display()),
            Err(err) => log::warn!("cannot record the model's commands to {}: {err}", path.display()),
        }
    }
    owner.handle_all(start_commands, BootTime::from_ns(boottime_ns()));

    let sources = SourceFilter::new(&config.probe_allow_from);
    let probe_sources = sources.clone();
    let supervisor = ProbeSupervisor::new(
        node_probes.clone(),
        probe_feeds,
        probe_metrics.clone(),
        config.pod_probe_port,
        sources,
        readers,
        shutdown.clone(),
    );
    // The reader passes at least every poll period, the supervisor every second: allowances
    // far above either, so only a loop that is stuck (not merely busy) fails liveness.
    let heartbeats = Arc::new(Heartbeats::new(Duration::from_secs(5).max(config.poll * 20), Duration::from_secs(10)));
    // Every socket served is in the registry: offered to a successor, and deposited with the
    // keeper of this pod while it is served.
    let registry = Arc::new(Registry::new(own_sockets.keeper.clone()));
    let register = |serves: Serves, listener: &std::net::TcpListener| -> Option<handoff::registry::Registration> {
        let addr = listener.local_addr().ok()?;
        registry
            .register(SocketFacts { serves, addr }, listener)
            .map_err(|err| log::warn!("a listening socket is not offered to a successor: {err}"))
            .ok()
    };
    let _listen_registration = register(Serves::Listen, &own_sockets.listen);
    let _health_registration = own_sockets.health.as_ref().and_then(|health| register(Serves::Health, health));
    // Set once a successor says it serves this agent's --listen: then this one serves none of
    // what it handed over (the two never answer in turn).
    let (replaced, replaced_seen) = watch::channel(false);
    if let Some(dir) = &config.handoff_dir {
        let (listen_port, handed_over, keeper, held) =
            (config.listen.port(), heartbeats.handed_over.clone(), own_sockets.keeper.clone(), registry.clone());
        let on_taken = move |keys: Vec<handoff::SocketKey>| {
            if keys.iter().any(|key| key.role == "listen" && key.port == listen_port) {
                handed_over.store(true, std::sync::atomic::Ordering::Release);
                if let Some(keeper) = &keeper {
                    keeper.replaced();
                }
                held.release(&keys);
                replaced.send_replace(true);
            }
        };
        if let Err(err) = handoff::node::serve(dir, registry.clone(), on_taken) {
            log::warn!("the listening sockets will not be handed to a successor: {}", crate::ErrorChain(&err));
        }
    }
    let taken = own_sockets.taken;
    let supervisor = supervisor.with_handoff(own_sockets.pods, registry.clone(), heartbeats.settled.clone());
    // Every loop the agent runs until shutdown, owned here: joined at shutdown, and one that
    // ends before it is said in the log.
    let mut loops = tokio::task::JoinSet::new();
    loops.spawn(supervisor.run(model.clone(), Duration::from_secs(1), heartbeats.clone()));

    let mut runtime = RuntimeLink::new(config.cri_socket.clone(), runtime_metrics);
    // Before the first batch of events: containers seen at start are judged under their names.
    let answer = runtime.refresh().await;
    owner.handle_all([answer.command()], BootTime::from_ns(boottime_ns()));
    // Readers that come before the reader's first pass see what the start found.
    owner.publish();
    loops.spawn(runtime_loop(runtime, model.clone(), metadata_wanted.clone(), config.cri_refresh, shutdown.clone()));
    let review_client = kube.as_ref().filter(|_| config.api_auth).map(|source| source.client());
    if let (Some(source), Some(kube_metrics)) = (kube, kube_metrics) {
        loops.spawn(kube::pod_loop(source.clone(), model.clone(), kube_metrics.clone(), shutdown.clone()));
        loops.spawn(kube::kill_loop(source.clone(), model.clone(), kube_metrics, shutdown.clone()));
        if let Some(counts) = event_counts {
            let events =
                events::event_loop(source, model.clone(), warnings_queue, probe_metrics, counts, shutdown.clone());
            loops.spawn(events);
        }
    }
    loops.spawn(systemd::systemd_loop(systemd_queue, model.clone(), systemd_counts, None, shutdown.clone()));
    loops.spawn(kubelet::kubelet_loop(kubelet_link, model.clone(), kubelet_queue, shutdown.clone()));
    loops.spawn(expiry_loop(model.clone(), config.series_retention, shutdown.clone()));
    loops.spawn(memory::memory_loop(model.clone(), root.clone(), memory_layout, shutdown.clone()));
    loops.spawn(verdicts::verdict_log_loop(model.snapshots(), shutdown.clone()));
    loops.spawn(tasks::resync_loop(model.clone(), maps.clone(), root.clone(), shutdown.clone()));
    loops.spawn(tasks::rescan_loop(model.clone(), root.clone(), rescan_wanted, shutdown.clone()));
    if kernel_log {
        loops.spawn(tasks::oom_log_loop(model.clone(), oom_victims_queue, shutdown.clone()));
    }

    let gate = match config.api_auth {
        false => None,
        true => {
            let audiences = config.api_auth_audiences.clone();
            let reviewer = review_client
                .map(|client| Box::new(auth::ApiServerReviewer { client, audiences }) as Box<dyn auth::Reviewer>);
            if reviewer.is_none() {
                log::warn!("--api-auth kubernetes without a Kubernetes API: every /api/* request is refused (503)");
            }
            let gate = auth::ApiGate::new(reviewer, api_reviews).map_err(MetricsError::from)?;
            Some(if config.metrics_auth { gate.with_metrics() } else { gate })
        }
    };
    if config.metrics_auth && !config.api_auth {
        log::warn!("--metrics-auth kubernetes needs --api-auth kubernetes: /metrics stays open");
    }
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls::acceptor(cert, key)?),
        // Bearer tokens must not cross the network in clear: with auth on, TLS is on too, with
        // a certificate of the agent's own when the operator gave none.
        None if config.api_auth => {
            let names = tls::serving_names(config.listen.ip(), config.node_name.as_deref());
            let generated = tls::generate(names)?;
            let written = config.handoff_dir.as_ref().map(|dir| {
                let path = dir.join(tls::GENERATED_CA_FILE);
                match write_public_file(&path, generated.ca_pem.as_bytes()) {
                    Ok(()) => format!("; its CA is in {}", path.display()),
                    Err(err) => format!("; its CA could not be written to {}: {err}", path.display()),
                }
            });
            log::info!(
                "--api-auth kubernetes without --tls-cert-file: serving a certificate made at start for {}{}",
                generated.names.join(", "),
                written.unwrap_or_default()
            );
            Some(generated.acceptor)
        }
        None => None,
    };
    let scheme = if tls.is_some() { "https (and http without credentials)" } else { "http" };
    let listener = own_sockets
        .listen
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(own_sockets.listen))
        .map_err(|source| HandoffError::Bind { addr: config.listen, source })?;
    log::info!("serving /metrics, /healthz and /api/v1/containers on {}, {scheme}", config.listen);
    let node = config.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default()
    });
    let api = ContainersApi { snapshots: model.snapshots(), probes: node_probes.clone(), node, waits };
    let routes = Arc::new(Routes {
        metrics,
        api: Some(Arc::new(api)),
        gate,
        health: Some(heartbeats.clone()),
        probe_sources: Some(probe_sources),
        tls,
        rejections: Some(http::Rejections::of(&rejected, "listen")),
    });
    // --listen serves until shutdown, or until a successor serves it.
    let (stop_serving, serving_stopped) = watch::channel(false);
    {
        let (mut shutdown, mut replaced) = (shutdown.clone(), replaced_seen.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.changed() => {}
                // Without a handoff directory nothing replaces it (the sender is gone: no match).
                Ok(_) = replaced.wait_for(|replaced| *replaced) => {
                    log::info!("replaced: --listen is served by the newer agent alone");
                }
            }
            stop_serving.send_replace(true);
        });
    }
    let server = tokio::spawn(http::serve(listener, routes, serving_stopped));
    let health_server = match own_sockets.health {
        None => None,
        Some(listener) => {
            let counters = crate::probe::metrics::ConnectionCounters::from_series(|reason| {
                rejected.with_label_values(&["health", reason])
            });
            Some(health::serve(listener, heartbeats.clone(), counters).map_err(AgentError::Health)?)
        }
    };
    if let Some(health_server) = health_server {
        // Served until shutdown, or until a successor serves it.
        let (mut shutdown, mut replaced) = (shutdown.clone(), replaced_seen.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.changed() => {}
                Ok(_) = replaced.wait_for(|replaced| *replaced) => {}
            }
            drop(tokio::task::spawn_blocking(move || drop(health_server)));
        });
    }

    if let Some(taken) = taken {
        // The agent (or keeper) they came from stops serving them once this one does: now for
        // --listen and --health-listen, and its pods' listeners as soon as the supervisor
        // claimed or gave up what it adopted.
        let (settled, registry, mut shutdown) = (heartbeats.settled.clone(), registry.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !settled.load(std::sync::atomic::Ordering::Acquire) {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = shutdown.changed() => return,
                }
            }
            let keys = registry.snapshot().into_iter().map(|(facts, _)| facts.key()).collect();
            drop(tokio::task::spawn_blocking(move || taken.confirm(keys)));
        });
    }
    let stream = sensor.take_events().ok_or(AgentError::StreamTaken)?;
    let reader =
        Reader { owner, maps: maps.clone(), latency, counters: agent_counters.clone(), heartbeats: heartbeats.clone() };
    let mut reading =
        reader.start(stream, config.poll).map_err(|err| AgentError::Stream(StreamError::Register(err)))?;
    let mut shutdown_flag = shutdown.clone();
    let failure = loop {
        tokio::select! {
            error = reading.failed() => break Some(error),
            _ = shutdown_flag.changed() => break None,
            Some(ended) = loops.join_next() => match ended {
                // A loop that saw the shutdown flag before this one did: shutting down, no error.
                Ok(()) if *shutdown_flag.borrow() => break None,
                Ok(()) => log::error!("a background loop ended before shutdown"),
                Err(err) => log::error!("a background loop failed: {err}"),
            },
        }
    };
    if let Some(error) = failure {
        return Err(error.into());
    }
    log::info!("shutting down: detaching kernel programs");
    drop(reading.stop().await);
    drop(sensor);
    let _ = server.await;
    // The loops see the shutdown flag and return; one that does not within this is aborted.
    let joined =
        tokio::time::timeout(Duration::from_secs(5), async { while loops.join_next().await.is_some() {} }).await;
    if joined.is_err() {
        log::warn!("{} background loop(s) did not stop within 5 s: aborted", loops.len());
        loops.shutdown().await;
    }
    Ok(())
}

/// Writes `bytes` to `path` (readable by all: a certificate, nothing secret) by a rename, so a
/// reader never sees half of it.
fn write_public_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let staging = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&staging, bytes)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&staging, path)
}
