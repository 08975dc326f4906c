//! The running agent: the one owner of the loaded sensor, feeding kernel events to the tracker,
//! keeping runtime metadata current, and serving metrics and the API. Thin plumbing around the
//! pure core; every decision lives in `tracker` and below.

pub mod http;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::StatusCode;
use lifecycle_common::CgroupCounters;
use prometheus::{Histogram, HistogramOpts};
use serde::Serialize;
use tokio::sync::{watch, Notify};

use crate::{
    agent::http::{ApiHandler, HttpError, Routes},
    discovery::cgroupfs::{CgroupFsError, CgroupRoot},
    discovery::clock::{boottime_ns, unix_minus_boot_seconds},
    discovery::cri::{CriClient, CONTAINERD_SOCKET, CRIO_SOCKET},
    discovery::proc,
    export::metrics::{AgentCounters, Metrics, MetricsError},
    export::units::{KernelCounters, UnitMetrics},
    kernel::{Sensor, SensorConfig, SensorError, SensorMaps, StreamError},
    model::event::{Detail, Event},
    model::node::{ContainerView, NodeTracker, Notice, SeedProcess, TrackerConfig},
    probe::supervisor::{take_query_param, ProbeSupervisor},
    probe::{metrics::ProbeMetrics, NodeProbes, ProbeAnswer as _},
};

/// The sensor's counter map is where the exporters' kernel counters come from.
impl KernelCounters for SensorMaps {
    fn counters_of(&self, cgroup_id: u64) -> Option<CgroupCounters> {
        SensorMaps::counters_of(self, cgroup_id)
    }
}

/// Settings for a running agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub listen: SocketAddr,
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
    pub tracker: TrackerConfig,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Sensor(#[from] SensorError),
    #[error(transparent)]
    CgroupFs(#[from] CgroupFsError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The sensor's event stream was already taken (a programming error).
    #[error("the sensor's event stream is already in use")]
    StreamTaken,
}

/// Runs until `shutdown` turns true, then detaches everything.
pub async fn run(config: AgentConfig, shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    let mut sensor = Sensor::load(&config.sensor)?;
    for state in sensor.features() {
        match (&state.reason, state.enabled) {
            (_, true) => log::info!("feature {} enabled", state.feature.name()),
            (Some(reason), false) => log::warn!("feature {} is off: {reason}", state.feature.name()),
            (None, false) => log::warn!("feature {} is off", state.feature.name()),
        }
    }
    let root = CgroupRoot::detect()?;
    let cri = connect_cri(config.cri_socket.as_deref()).await;
    let tracker_config = TrackerConfig { cri_available: cri.is_some(), ..config.tracker.clone() };
    let tracker = Arc::new(Mutex::new(NodeTracker::new(tracker_config)));
    seed(&tracker, &root);
    let maps = sensor.maps();
    let agent_counters = Arc::new(AgentCounters::default());
    let mut metrics = Metrics::new(
        maps.clone(),
        sensor.features(),
        config.sensor.counter_entries,
        config.sensor.ring_bytes,
        agent_counters.clone(),
    )?;
    let latency = Histogram::with_opts(
        HistogramOpts::new(
            "event_to_state_seconds",
            "From the kernel seeing a process exit to the container state reflecting it.",
        )
        .namespace(crate::export::metrics::NAMESPACE)
        .buckets(vec![0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
    )
    .map_err(MetricsError::from)?;
    metrics.registry().register(Box::new(latency.clone())).map_err(MetricsError::from)?;
    let units = Arc::new(UnitMetrics::new(
        tracker.clone(),
        maps.clone(),
        Box::new(boottime_ns),
        Box::new(unix_minus_boot_seconds),
    ));
    let scraped_units = units.clone();
    metrics.add_text_source(Box::new(move |out| scraped_units.render(out)));

    let node_probes = Arc::new(NodeProbes::default());
    let probe_metrics = ProbeMetrics::register(metrics.registry()).map_err(MetricsError::from)?;
    let supervisor = ProbeSupervisor::new(node_probes.clone(), probe_metrics, config.pod_probe_port, shutdown.clone());
    tokio::spawn(supervisor.run(tracker.clone(), Duration::from_secs(1)));

    let metadata_wanted = Arc::new(Notify::new());
    if let Some(cri) = cri {
        refresh_metadata(&cri, &tracker).await;
        tokio::spawn(metadata_loop(
            cri,
            tracker.clone(),
            metadata_wanted.clone(),
            config.cri_refresh,
            shutdown.clone(),
        ));
    }
    tokio::spawn(expiry_loop(tracker.clone(), config.series_retention, shutdown.clone()));

    let listener = http::bind(config.listen).await?;
    log::info!("serving /metrics, /healthz and /api/v1/containers on http://{}", config.listen);
    let api = ContainersApi { tracker: tracker.clone(), probes: node_probes.clone() };
    let routes = Arc::new(Routes { metrics, api: Some(Arc::new(api)) });
    let server = tokio::spawn(http::serve(listener, routes, shutdown.clone()));

    let mut stream = sensor.take_events().ok_or(AgentError::StreamTaken)?.into_async(config.poll)?;
    let mut batch: Vec<Event> = Vec::with_capacity(1024);
    let mut shutdown_flag = shutdown.clone();
    let mut last_rescan: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            read = stream.next_batch(&mut batch) => { read?; }
            _ = shutdown_flag.changed() => break,
        }
        if batch.is_empty() {
            continue;
        }
        agent_counters.events_read.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        agent_counters.decode_errors.store(stream.decode_errors(), std::sync::atomic::Ordering::Relaxed);
        let notices = {
            let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
            for event in &batch {
                if let Detail::CgroupRmdir(c) = &event.detail {
                    // The kernel's counts of a departing cgroup move to its unit before its map
                    // entry is freed for reuse.
                    if let Some(last) = maps.take_counters(c.id) {
                        tracker.absorb_kernel_counters(c.id, last);
                    }
                }
                tracker.apply(event);
                node_probes.on_event(event);
            }
            let now = boottime_ns();
            for event in &batch {
                if matches!(event.detail, Detail::Exit { group_dead: true, .. }) {
                    latency.observe(now.saturating_sub(event.time_ns) as f64 / 1e9);
                }
            }
            units.take_judgements(&mut tracker);
            tracker.take_notices()
        };
        batch.clear();
        handle_notices(notices, &tracker, &root, &metadata_wanted, &mut last_rescan);
    }
    log::info!("shutting down: detaching kernel programs");
    drop(stream);
    drop(sensor);
    let _ = server.await;
    Ok(())
}

fn handle_notices(
    notices: Vec<Notice>,
    tracker: &Mutex<NodeTracker>,
    root: &CgroupRoot,
    metadata_wanted: &Notify,
    last_rescan: &mut Option<std::time::Instant>,
) {
    let mut rescan = false;
    for notice in notices {
        match notice {
            Notice::MetadataNeeded { .. } => metadata_wanted.notify_one(),
            Notice::UnknownCgroup(_) => rescan = true,
            Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
        }
    }
    // A walk of cgroupfs costs milliseconds on a busy node: at most one a second, however many
    // events name an unknown cgroup (a vanished one would otherwise trigger a walk per batch).
    if rescan && last_rescan.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
        *last_rescan = Some(std::time::Instant::now());
        // A cgroup's mkdir record was lost (ring overflow, counted): learn it from cgroupfs.
        let found = root.scan();
        let now = boottime_ns();
        let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
        for (id, path) in found {
            tracker.seed_cgroup(id, &path, now);
        }
    }
}

/// Cgroups and processes that existed before the programs were attached.
fn seed(tracker: &Mutex<NodeTracker>, root: &CgroupRoot) {
    let cgroups = root.scan();
    let by_path: std::collections::HashMap<&str, u64> = cgroups.iter().map(|(id, path)| (path.as_str(), *id)).collect();
    let now = boottime_ns();
    let processes = proc::processes_at_start(&by_path);
    let cgroup_of: std::collections::HashMap<u32, u64> = processes.iter().map(|p| (p.tgid, p.cgroup_id)).collect();
    let mut tracker = tracker.lock().unwrap_or_else(|poison| poison.into_inner());
    for (id, path) in &cgroups {
        tracker.seed_cgroup(*id, path, now);
    }
    for process in &processes {
        let parent_cgroup_id = cgroup_of.get(&process.ppid).copied().unwrap_or(0);
        tracker.seed_process(SeedProcess {
            tgid: process.tgid,
            cgroup_id: process.cgroup_id,
            parent_cgroup_id,
            child_pid_namespace: process.child_pid_namespace,
            start_time_ns: process.start_time_ns,
            comm: &process.comm,
        });
    }
    log::info!("found {} cgroups at start", cgroups.len());
}

async fn connect_cri(configured: Option<&std::path::Path>) -> Option<CriClient> {
    let candidates: Vec<PathBuf> = match configured {
        Some(path) => vec![path.to_owned()],
        None => vec![PathBuf::from(CONTAINERD_SOCKET), PathBuf::from(CRIO_SOCKET)],
    };
    let mut errors = Vec::new();
    for path in &candidates {
        match CriClient::connect(path).await {
            Ok(client) => {
                log::info!("container runtime metadata from {}", path.display());
                return Some(client);
            }
            Err(err) => errors.push(err.to_string()),
        }
    }
    log::warn!(
        "no container runtime answers ({}): containers are named by their cgroup (pod uid and container id), without pod names or grace periods",
        errors.join("; ")
    );
    None
}

async fn refresh_metadata(cri: &CriClient, tracker: &Mutex<NodeTracker>) {
    match cri.list_containers().await {
        Ok(list) => tracker.lock().unwrap_or_else(|poison| poison.into_inner()).set_metadata(list),
        Err(err) => log::warn!("listing containers from the runtime failed: {err}"),
    }
}

async fn metadata_loop(
    cri: CriClient,
    tracker: Arc<Mutex<NodeTracker>>,
    wanted: Arc<Notify>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = wanted.notified() => {}
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        refresh_metadata(&cri, &tracker).await;
    }
}

async fn expiry_loop(tracker: Arc<Mutex<NodeTracker>>, retention: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(30).min(retention.max(Duration::from_secs(1))));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let retention_ns = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
        tracker.lock().unwrap_or_else(|poison| poison.into_inner()).expire(boottime_ns(), retention_ns);
    }
}

/// The body of `GET /api/v1/containers`.
#[derive(Serialize)]
pub struct ContainersResponse {
    /// Add to any `*_at`/`time` field (CLOCK_BOOTTIME ns) / 1e9 to get Unix seconds.
    pub boot_to_unix_seconds: f64,
    /// CLOCK_BOOTTIME ns when this answer was made.
    pub now: u64,
    pub containers: Vec<ContainerView>,
}

struct ContainersApi {
    tracker: Arc<Mutex<NodeTracker>>,
    probes: Arc<NodeProbes>,
}

impl ApiHandler for ContainersApi {
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)> {
        if let Some(target) = path.strip_prefix("/api/v1/probe/") {
            return Some(self.probe(target, query));
        }
        if path != "/api/v1/containers" {
            return None;
        }
        let now = boottime_ns();
        let containers = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner()).containers(now);
        let body = ContainersResponse { boot_to_unix_seconds: unix_minus_boot_seconds(), now, containers };
        Some(match serde_json::to_string(&body) {
            Ok(json) => (StatusCode::OK, json),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{{\"error\":\"{err}\"}}")),
        })
    }
}

impl ContainersApi {
    /// `GET /api/v1/probe/<namespace>/<pod>/<container>?check=<tcp|process|file|all>&...`: the same
    /// answer the pod's own probe listener gives, for people, scripts and host-network pods.
    fn probe(&self, target: &str, query: Option<&str>) -> (StatusCode, String) {
        let (check, rest) = take_query_param(query, "check");
        let Some(check) = check else {
            return (StatusCode::BAD_REQUEST, "add check=tcp|process|file|all to the query\n".to_owned());
        };
        let (code, body) =
            self.probes.answer(&format!("/probe/{}/{check}", target.trim_end_matches('/')), rest.as_deref());
        (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
    }
}
