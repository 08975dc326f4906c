//! `lifecycle-agent`: the command line over the library. Parses flags into validated settings,
//! starts the pieces, and prints the whole error chain in one place when something fails.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use lifecycle_agent::{
    cgroupfs::CgroupRoot,
    event::Event,
    http,
    metrics::{AgentCounters, Metrics},
    sensor::{Feature, Sensor, SensorConfig},
};
use tokio::sync::watch;

#[derive(Parser)]
#[command(name = "lifecycle-agent", version, about = "Watches every container on this node from the kernel and checks it against the Pod Lifecycle rules.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the kernel programs and serve /metrics and /healthz until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Print decoded kernel events as JSON lines (the debugging view).
    Events(EventsArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Address for /metrics, /healthz and the JSON API.
    #[arg(long, default_value = "127.0.0.1:9890")]
    listen: SocketAddr,
    #[command(flatten)]
    sensor: SensorArgs,
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
    /// Ring buffer size in bytes (a power of two, a multiple of the page size).
    #[arg(long, default_value_t = lifecycle_common::defaults::RING_BYTES)]
    ring_bytes: u32,
    /// Bytes waiting in the ring before the kernel wakes the agent.
    #[arg(long, default_value_t = 256 * 1024)]
    wakeup_bytes: u64,
    /// How often the agent drains the ring when the kernel has not woken it, in milliseconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    poll_ms: u64,
    /// Capacity of the per-cgroup counters map.
    #[arg(long, default_value_t = lifecycle_common::defaults::COUNTER_ENTRIES)]
    counter_entries: u32,
    /// Kernel features not to attach. Repeatable.
    #[arg(long, value_enum)]
    disable: Vec<FeatureArg>,
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
        }
    }

    fn load(&self) -> anyhow::Result<Sensor> {
        let sensor = Sensor::load(&self.config())?;
        for state in sensor.features() {
            match (&state.reason, state.enabled) {
                (_, true) => log::info!("feature {} enabled", state.feature.name()),
                (Some(reason), false) => log::warn!("feature {} is off: {reason}", state.feature.name()),
                (None, false) => log::warn!("feature {} is off", state.feature.name()),
            }
        }
        Ok(sensor)
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Events(args) => events(args).await,
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
    let mut shutdown = shutdown_signal()?;
    let config = args.sensor.config();
    let mut sensor = args.sensor.load()?;
    let agent = Arc::new(AgentCounters::default());
    let metrics = Metrics::new(sensor.maps(), sensor.features(), config.counter_entries, config.ring_bytes, Arc::clone(&agent))?;
    let listener = http::bind(args.listen).await?;
    log::info!("serving /metrics and /healthz on http://{}", args.listen);
    let routes = Arc::new(http::Routes { metrics, api: None });
    let server = tokio::spawn(http::serve(listener, routes, shutdown.clone()));

    let mut stream = sensor
        .take_events()
        .context("event stream already taken")?
        .into_async(Duration::from_millis(args.sensor.poll_ms))?;
    let mut batch = Vec::with_capacity(1024);
    loop {
        tokio::select! {
            read = stream.next_batch(&mut batch) => {
                read?;
                agent.events_read.fetch_add(batch.len() as u64, Ordering::Relaxed);
                agent.decode_errors.store(stream.decode_errors(), Ordering::Relaxed);
                batch.clear();
            }
            _ = shutdown.changed() => break,
        }
    }
    log::info!("shutting down: detaching kernel programs");
    drop(stream);
    drop(sensor);
    let _ = server.await;
    Ok(())
}

async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let mut shutdown = shutdown_signal()?;
    let filter = cgroup_filter(&args.cgroup)?;
    let mut sensor = args.sensor.load()?;
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
