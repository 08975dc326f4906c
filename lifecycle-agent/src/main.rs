//! `lifecycle-agent`: the command line over the library. Parses flags into validated settings,
//! starts the pieces, and prints the whole error chain in one place when something fails.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use lifecycle_agent::{
    agent::{self, AgentConfig},
    discovery::cgroupfs::CgroupRoot,
    kernel::{Feature, Sensor, SensorConfig},
    model::backoff::BackoffPolicy,
    model::container_state::RestartPolicy,
    model::event::Event,
    model::kubelet::KubeletOverrides,
    model::node::TrackerConfig,
    probe::source::AllowFrom,
};
use tokio::sync::watch;

mod client;

#[derive(Parser)]
#[command(
    name = "lifecycle-agent",
    version,
    about = "Watches every container on this node from the kernel and checks it against the Pod Lifecycle rules."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the kernel programs and serve /metrics and /healthz until SIGINT or SIGTERM.
    // Boxed: the run flags are many; the other commands' are few.
    Run(Box<RunArgs>),
    /// Print decoded kernel events as JSON lines (the debugging view).
    Events(EventsArgs),
    /// Show containers as a running agent sees them (kubectl-like table).
    Status(client::StatusArgs),
    /// Why a pod's containers stopped: a verdict and a timeline per container, from a running
    /// agent.
    Explain(client::ExplainArgs),
    /// Check whether this node can run the agent: one line per requirement, what is missing and
    /// what to do; exits non-zero when something is missing.
    Doctor(lifecycle_agent::cli::doctor::DoctorArgs),
    /// Hold the agent's listening sockets across its restarts (the DaemonSet's second
    /// container): the agent of this pod gives it each socket it serves and takes them back
    /// when it starts again, so the kubelet's probes through it are never refused.
    KeepSockets(KeepSocketsArgs),
}

#[derive(Args)]
struct KeepSocketsArgs {
    /// A directory only this pod's containers mount (an emptyDir); the agent's --keeper-dir.
    #[arg(long)]
    dir: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HostCgroups {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args)]
struct RunArgs {
    /// Address for /metrics, /healthz and the JSON API.
    #[arg(long, default_value = "127.0.0.1:9890")]
    listen: SocketAddr,
    /// Address for the kubelet's liveness probe of the agent: /healthz alone, on a listener
    /// whose places no client of --listen can take; it fails when the ring reader or the probe
    /// supervisor stops making progress (the DaemonSet sets 0.0.0.0:9892). Default: none; the
    /// same /healthz is served on --listen too.
    #[arg(long, default_value = "")]
    health_listen: String,
    /// Serve only these metric families on /metrics (comma-separated names, or `prefix*`);
    /// default: all. As kube-state-metrics' allow list.
    #[arg(long, value_delimiter = ',')]
    metric_allowlist: Vec<String>,
    /// Never serve these metric families (names or `prefix*`; wins over the allow list).
    #[arg(long, value_delimiter = ',')]
    metric_denylist: Vec<String>,
    /// Series for host cgroups (system.slice and the like, not containers): `auto` serves them
    /// on a plain host and not on a Kubernetes node (where only containers matter and host
    /// units would add series kube-state-metrics users do not expect).
    #[arg(long, value_enum, default_value = "auto")]
    host_cgroups: HostCgroups,
    /// The format of the agent's own log lines on stderr. Verdicts are JSON lines on stdout
    /// either way (one per judged stop, the API's fields plus the verdict in words).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// A directory (root only) where this agent hands its listening sockets (--listen,
    /// --health-listen, the pods' probe listeners) to the next agent on the node and takes them
    /// from the running one, so a rolling update fails no probe; `none` turns it off. A second
    /// agent on the same ports starts only through it (it takes them over); otherwise it
    /// refuses, naming the holder.
    #[arg(long, default_value = "/run/lifecycle-agent")]
    handoff_dir: String,
    /// The directory of this pod's socket keeper (`lifecycle-agent keep-sockets --dir`, the
    /// DaemonSet's second container), which holds the listening sockets across restarts of this
    /// agent (liveness, OOM kill, crash). Default: none (the sockets end with the process).
    #[arg(long)]
    keeper_dir: Option<PathBuf>,
    /// The container runtime's CRI socket (default: containerd's, then CRI-O's).
    #[arg(long)]
    cri_socket: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: in a pod, its service account; else
    /// KUBECONFIG). A file that cannot be read or used stops the start. With the API, verdicts
    /// use each pod's spec and status; without it, the runtime's labels.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This node's name, for the watch of its pods (default: NODE_NAME, else the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// Publish Warning events on pods (SIGKILL after grace, back-off deviations, status
    /// disagreements) for `kubectl describe pod`; needs the API and events create/patch.
    #[arg(long)]
    events: bool,
    /// Who may read the JSON API (`/api/*`: containers, pods, probe answers): `none` (anyone
    /// who reaches --listen), or `kubernetes`: a bearer token the API server validates
    /// (TokenReview) whose user may `list containers` or `get probes` (of the pod's namespace)
    /// in API group lifecycle.dev (SubjectAccessReview; deploy/rbac.yaml's lifecycle-api-reader
    /// role grants both); refused 401/403, and 503 while the API cannot answer. /metrics and
    /// /healthz stay open unless --metrics-auth says otherwise.
    #[arg(long, value_enum, default_value = "none")]
    api_auth: ApiAuthArg,
    /// Who may read /metrics: `none` (anyone who reaches --listen), or `kubernetes`: a bearer
    /// token whose user may `get` the non-resource URL /metrics (the RBAC Prometheus already has
    /// for the kubelet's metrics), as kube-rbac-proxy does. Needs --api-auth kubernetes.
    #[arg(long, value_enum, default_value = "none")]
    metrics_auth: ApiAuthArg,
    /// With --api-auth kubernetes: accept only tokens issued for this audience (repeatable),
    /// e.g. `kubectl create token <account> --audience lifecycle-agent`. A token minted for the
    /// agent is then useless against the API server if it leaks, and an API server token is
    /// refused here. Default: any token the API server accepts.
    #[arg(long = "api-auth-audience")]
    api_auth_audiences: Vec<String>,
    /// Serve --listen over HTTPS with this PEM certificate chain (and --tls-key-file): with
    /// --api-auth kubernetes, clients send bearer tokens, which must not cross the network in
    /// clear. The health and pod probe listeners stay plain HTTP.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// How long a departed container's status and series are kept (e.g. 10m, 90s).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    series_retention: Duration,
    /// Override the kubelet's ReduceDefaultCrashLoopBackOffDecay gate (back-off 1 s .. 60 s) as
    /// the agent reads it from the node (`--reduced-backoff-decay` alone: on; `=false`: off).
    /// Not needed where the agent can read the kubelet (hostPID): see docs/kubelet-behaviour.md.
    /// With either back-off flag, what the node does not tell is taken at the kubelet's defaults.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    reduced_backoff_decay: Option<bool>,
    /// Override the kubelet's crashLoopBackOff.maxContainerRestartPeriod (1s .. 300s, with its
    /// KubeletCrashLoopBackOffMax gate on) as the agent reads it from the node.
    #[arg(long, value_parser = parse_duration)]
    max_container_restart_period: Option<Duration>,
    /// Port of the probe listener the agent opens inside each pod's network namespace (0: none;
    /// the node endpoint /api/v1/probe/... always answers).
    #[arg(long, default_value_t = lifecycle_agent::probe::server::DEFAULT_POD_PORT)]
    pod_probe_port: u16,
    /// Who may connect to the per-pod probe listeners: `node` (the node's own addresses, where
    /// the kubelet probes from; loopback excepted), `any`, or a CIDR block. Repeatable.
    #[arg(long, default_value = "node")]
    probe_allow_from: Vec<AllowFrom>,
    /// The pod restartPolicy to assume (the runtime does not report it).
    #[arg(long, value_enum, default_value = "always")]
    restart_policy: RestartPolicyArg,
    #[command(flatten)]
    sensor: SensorArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ApiAuthArg {
    None,
    Kubernetes,
}

#[derive(Clone, Copy, ValueEnum)]
enum RestartPolicyArg {
    Always,
    OnFailure,
    Never,
}

/// Parses `500ms`, `30s`, `1.5m`, `1h30m` (the same parser as probe URLs and the clients').
fn parse_duration(text: &str) -> Result<Duration, String> {
    lifecycle_cli::args::duration(text)
}

#[derive(Args)]
struct EventsArgs {
    /// Only events that concern this cgroup: a v2 id, or a directory (absolute, or relative to the
    /// v2 mount). Repeatable.
    #[arg(long)]
    cgroup: Vec<String>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    #[command(flatten)]
    sensor: SensorArgs,
}

#[derive(Args)]
struct SensorArgs {
    /// Kernel BTF used to compute struct offsets.
    #[arg(long, default_value = "/sys/kernel/btf/vmlinux")]
    btf: PathBuf,
    /// Where tracefs is, or is mounted when missing.
    #[arg(long, default_value = "/sys/kernel/tracing")]
    tracefs: PathBuf,
    /// Ring buffer size in bytes (a power of two, a multiple of the page size, well above
    /// --wakeup-bytes). What arrives between the kernel's wake-up and the agent's read must fit;
    /// the default is twice the smallest size that lost nothing under a signal flood
    /// (BENCHMARKS.md: ring, rate). A full ring loses records, never counts
    /// (lifecycle_events_lost_total). Costs twice its size in RSS: the kernel maps it twice.
    #[arg(long, default_value_t = lifecycle_common::defaults::RING_BYTES)]
    ring_bytes: u32,
    /// Bytes waiting in the ring before the kernel wakes the agent (below that, the next poll
    /// reads them). Waking per record is costly on a busy node (BENCHMARKS.md: overhead); 256 KiB
    /// (~2,500 records) is one wake-up per batch and leaves most of the ring for what arrives
    /// before the agent runs. A container's end (its pid namespace's init exiting) and a
    /// cgroup's last process exiting (a plain-host unit's end) wake it at once regardless.
    #[arg(long, default_value_t = 256 * 1024)]
    wakeup_bytes: u64,
    /// How often the agent drains the ring when the kernel has not woken it, in milliseconds:
    /// the most an ordinary record waits on a quiet node. Shorter costs CPU, on busy and idle
    /// nodes alike (BENCHMARKS.md: overhead).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=1000))]
    poll_ms: u64,
    /// Capacity of the per-cgroup counters map: one entry per cgroup that ran, signalled or
    /// listened since it was created, freed when it is removed: about one per container
    /// (BENCHMARKS.md: memory); the default is four times a 1,000-container node's need. Each entry costs ~400
    /// bytes of kernel memory, charged to the agent's memory cgroup. When full, new cgroups'
    /// counts are lost (lifecycle_kernel_map_full_total; lifecycle_kernel_map_entries shows use
    /// and capacity).
    #[arg(long, default_value_t = lifecycle_common::defaults::COUNTER_ENTRIES)]
    counter_entries: u32,
    /// Kernel features not to attach. Repeatable.
    #[arg(long, value_enum)]
    disable: Vec<FeatureArg>,
    /// Have the kernel account each program's runs and time (BPF_ENABLE_STATS, held by the
    /// agent: lifecycle_kernel_program_run_seconds_total and _runs_total). While held, every BPF
    /// program on the node is accounted: two clock reads per run (docs/metrics.md gives the cost).
    #[arg(long, value_enum, default_value = "on")]
    kernel_stats: Switch,
}

/// On or off.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum FeatureArg {
    Signals,
    OomKills,
    TcpSockets,
    TcpAccepts,
    CgroupEvents,
}

impl From<FeatureArg> for Feature {
    fn from(arg: FeatureArg) -> Self {
        match arg {
            FeatureArg::Signals => Feature::Signals,
            FeatureArg::OomKills => Feature::OomKills,
            FeatureArg::TcpSockets => Feature::TcpSockets,
            FeatureArg::TcpAccepts => Feature::TcpAccepts,
            FeatureArg::CgroupEvents => Feature::CgroupEvents,
        }
    }
}

impl SensorArgs {
    fn config(&self) -> SensorConfig {
        SensorConfig {
            btf_path: self.btf.clone(),
            tracefs_path: self.tracefs.clone(),
            ring_bytes: self.ring_bytes,
            counter_entries: self.counter_entries,
            wakeup_bytes: self.wakeup_bytes,
            ignore_tgid: std::process::id(),
            disabled: self.disable.iter().map(|&f| f.into()).collect(),
            kernel_stats: self.kernel_stats == Switch::On,
        }
    }

    fn load_for_events(&self) -> anyhow::Result<Sensor> {
        let sensor = Sensor::load(&self.config())?;
        sensor.log_features();
        Ok(sensor)
    }
}

fn main() -> ExitCode {
    // `doctor`'s proof children (`cli/doctor/proof.rs`): this binary doing one thing with nothing
    // else started, not a command people type.
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(lifecycle_agent::cli::doctor::proof::CHILD_COMMAND) {
        return lifecycle_agent::cli::doctor::proof::child(&args.next().unwrap_or_default());
    }
    let cli = Cli::parse();
    let json_logs = matches!(&cli.command, Command::Run(args) if args.log_format == LogFormat::Json);
    lifecycle_agent::agent::logging::install(json_logs);
    if let Command::KeepSockets(args) = &cli.command {
        // No runtime, no thread but its own: it holds sockets and answers one agent. SIGTERM
        // ends it (the default disposition).
        return match lifecycle_agent::handoff::keeper::keep(&args.dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {}", lifecycle_agent::ErrorChain(&err));
                ExitCode::FAILURE
            }
        };
    }
    // Before any thread starts, so none is given a heap of its own.
    lifecycle_agent::limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(*args).await,
            Command::Events(args) => events(args).await,
            Command::Status(args) => client::status(args).await,
            Command::Explain(args) => client::explain(args).await,
            Command::Doctor(args) => lifecycle_agent::cli::doctor::run_boxed(args).await.map_err(anyhow::Error::from),
            Command::KeepSockets(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves SIGINT or SIGTERM into a watch flag.
fn shutdown_signal() -> anyhow::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let shutdown = shutdown_signal()?;
    let max_container_restart_period_ns = match args.max_container_restart_period {
        Some(max) => {
            let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
            // Refused here as the kubelet refuses it, rather than judged by later.
            BackoffPolicy::default().with_max_restart_period(max_ns).context("--max-container-restart-period")?;
            Some(max_ns)
        }
        None => None,
    };
    let kubelet_overrides =
        KubeletOverrides { reduced_decay: args.reduced_backoff_decay, max_container_restart_period_ns };
    let restart_policy = match args.restart_policy {
        RestartPolicyArg::Always => RestartPolicy::Always,
        RestartPolicyArg::OnFailure => RestartPolicy::OnFailure,
        RestartPolicyArg::Never => RestartPolicy::Never,
    };
    let config = AgentConfig {
        listen: args.listen,
        handoff_dir: match args.handoff_dir.as_str() {
            "" | "none" => None,
            dir => Some(PathBuf::from(dir)),
        },
        keeper_dir: args.keeper_dir,
        host_cgroups: match args.host_cgroups {
            HostCgroups::Auto => None,
            HostCgroups::On => Some(true),
            HostCgroups::Off => Some(false),
        },
        metric_families: lifecycle_agent::export::metrics::FamilyFilter::new(
            args.metric_allowlist,
            args.metric_denylist,
        ),
        health_listen: match args.health_listen.as_str() {
            "" => None,
            addr => Some(addr.parse().with_context(|| format!("--health-listen {addr:?} is not an address:port"))?),
        },
        sensor: args.sensor.config(),
        poll: Duration::from_millis(args.sensor.poll_ms),
        cri_socket: args.cri_socket,
        kubeconfig: args.kubeconfig,
        node_name: args.node_name,
        events: args.events,
        api_auth: args.api_auth == ApiAuthArg::Kubernetes,
        metrics_auth: args.metrics_auth == ApiAuthArg::Kubernetes,
        api_auth_audiences: args.api_auth_audiences,
        tls: args.tls_cert_file.zip(args.tls_key_file),
        cri_refresh: Duration::from_secs(10),
        series_retention: args.series_retention,
        pod_probe_port: (args.pod_probe_port != 0).then_some(args.pod_probe_port),
        probe_allow_from: args.probe_allow_from,
        tracker: TrackerConfig { restart_policy, ..TrackerConfig::default() },
        kubelet_overrides,
    };
    agent::run_boxed(config, shutdown).await?;
    Ok(())
}

async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let mut shutdown = shutdown_signal()?;
    let filter = cgroup_filter(&args.cgroup)?;
    let mut sensor = args.sensor.load_for_events()?;
    let mut stream = sensor
        .take_events()
        .context("event stream already taken")?
        .into_async(Duration::from_millis(args.sensor.poll_ms))?;
    let mut batch: Vec<Event> = Vec::with_capacity(1024);
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        tokio::select! {
            read = stream.next_batch(&mut batch) => { read?; }
            _ = shutdown.changed() => return Ok(()),
        }
        let mut out = stdout.lock();
        for event in batch.drain(..) {
            if !filter.is_empty() && !event.cgroups().any(|id| filter.contains(&id)) {
                continue;
            }
            use std::io::Write as _;
            serde_json::to_writer(&mut out, &event).context("writing an event")?;
            // A closed pipe (`| head`) ends the command quietly.
            if writeln!(out).is_err() {
                return Ok(());
            }
            printed += 1;
            if args.count.is_some_and(|limit| printed >= limit) {
                return Ok(());
            }
        }
        use std::io::Write as _;
        let _ = out.flush();
    }
}

/// Turns `--cgroup` values (ids or directories) into ids.
fn cgroup_filter(values: &[String]) -> anyhow::Result<Vec<u64>> {
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let root = CgroupRoot::detect()?;
    values
        .iter()
        .map(|value| match value.parse::<u64>() {
            Ok(id) => Ok(id),
            Err(_) => root.id_of(std::path::Path::new(value)).with_context(|| format!("--cgroup {value}")),
        })
        .collect()
}
