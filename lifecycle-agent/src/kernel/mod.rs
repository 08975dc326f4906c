//! The sensor: lifecycle's kernel programs and maps, loaded, attached and read as one unit.
//!
//! This is the only module that imports aya. It computes struct offsets from BTF, mounts tracefs
//! when a classic tracepoint needs it, loads the embedded object, attaches each program, and
//! degrades feature by feature when a program cannot attach: only process exec/exit tracking is
//! essential. Dropping the [`Sensor`] detaches every program.

mod batch;
#[cfg(test)]
mod btf_fixture;
pub mod decode;
pub(crate) mod layout;
mod maps;
pub(crate) mod programs;
mod ring;

use crate::ErrorChain;
use std::{
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use parking_lot::Mutex;

use aya::{
    maps::{HashMap as BpfHashMap, PerCpuArray},
    programs::{BtfTracePoint, TracePoint},
    Btf, Ebpf, EbpfLoader,
};
use lifecycle_common::{names, ProgramSettings};

pub use self::maps::{MapRead, ProgramCost, SensorMaps, StatsError};
pub(crate) use self::ring::{EventStream, StreamError};
use self::{
    layout::{KernelBtf, LayoutError},
    programs::{Attach, Program},
};

/// The compiled kernel programs, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lifecycle"));

/// Groups of programs that are switched on or off together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    ProcessExec,
    ProcessExit,
    Signals,
    OomKills,
    TcpSockets,
    TcpAccepts,
    CgroupEvents,
}

impl Feature {
    pub(crate) const ALL: [Feature; 7] = [
        Feature::ProcessExec,
        Feature::ProcessExit,
        Feature::Signals,
        Feature::OomKills,
        Feature::TcpSockets,
        Feature::TcpAccepts,
        Feature::CgroupEvents,
    ];

    /// Label value for `lifecycle_feature_enabled{feature}`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Feature::ProcessExec => "process_exec",
            Feature::ProcessExit => "process_exit",
            Feature::Signals => "signals",
            Feature::OomKills => "oom_kills",
            Feature::TcpSockets => "tcp_sockets",
            Feature::TcpAccepts => "tcp_accepts",
            Feature::CgroupEvents => "cgroup_events",
        }
    }

    /// Without exec and exit there is no container state at all; everything else is optional.
    pub(crate) fn is_core(self) -> bool {
        matches!(self, Feature::ProcessExec | Feature::ProcessExit)
    }
}

/// Whether a feature runs, and why not when it does not.
#[derive(Clone, Debug)]
pub struct FeatureState {
    pub feature: Feature,
    pub enabled: bool,
    /// Why it is off; None when it runs.
    pub reason: Option<Arc<AttachError>>,
}

/// Why a feature's programs could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Switched off with `--disable`.
    #[error("disabled by flag")]
    Disabled,
    /// The kernel lacks what the feature's programs need: a tracepoint, the arguments they read,
    /// a struct member.
    #[error(transparent)]
    Kernel(#[from] programs::NoVariant),
    /// The embedded object lacks the program (a build mismatch).
    #[error("object has no program {0}")]
    NoProgram(&'static str),
    /// aya refused the program: wrong type, verifier rejection, or attach failure.
    #[error("{stage} {program}")]
    Program {
        stage: &'static str,
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Classic tracepoints need tracefs, which is unavailable.
    #[error("{program} needs tracefs")]
    Tracefs {
        program: &'static str,
        #[source]
        source: Arc<TracefsError>,
    },
}

/// tracefs is not mounted and could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// mount(2) failed (no CAP_SYS_ADMIN in the mount namespace, or no tracefs in the kernel).
    #[error("tracefs is not mounted and mounting it at {path} failed")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Settings for loading the sensor.
#[derive(Clone, Debug)]
pub struct SensorConfig {
    /// Kernel BTF, normally /sys/kernel/btf/vmlinux.
    pub btf_path: PathBuf,
    /// Where tracefs is (or gets) mounted, normally /sys/kernel/tracing.
    pub tracefs_path: PathBuf,
    /// Ring buffer size in bytes: a power of two and a multiple of the page size.
    pub ring_bytes: u32,
    /// Capacity of the per-cgroup counters map.
    pub counter_entries: u32,
    /// Bytes waiting in the ring before the kernel wakes the reader.
    pub wakeup_bytes: u64,
    /// A process whose own events are not recorded (the agent's pid), or 0.
    pub ignore_tgid: u32,
    /// Features not to attach at all.
    pub disabled: Vec<Feature>,
    /// Hold `BPF_ENABLE_STATS` so the kernel accounts each program's runs and time (every BPF
    /// program on the node is accounted while it is held: two clock reads per run).
    pub kernel_stats: bool,
}

impl Default for SensorConfig {
    fn default() -> Self {
        Self {
            btf_path: PathBuf::from("/sys/kernel/btf/vmlinux"),
            tracefs_path: PathBuf::from("/sys/kernel/tracing"),
            ring_bytes: lifecycle_common::defaults::RING_BYTES,
            counter_entries: lifecycle_common::defaults::COUNTER_ENTRIES,
            wakeup_bytes: ProgramSettings::default().wakeup_bytes,
            ignore_tgid: 0,
            disabled: Vec::new(),
            kernel_stats: true,
        }
    }
}

/// Why the sensor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SensorError {
    /// The process lacks the capabilities to load eBPF programs.
    #[error("lifecycle-agent needs root, or CAP_BPF with CAP_PERFMON (or CAP_SYS_ADMIN), to load its kernel programs")]
    NotPrivileged,
    /// Kernel BTF is missing or lacks something the programs read.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The ring size is not usable by the kernel.
    #[error("ring buffer size {0} is not a power of two and a multiple of the page size")]
    BadRingSize(u32),
    /// aya could not parse or prepare the object.
    #[error("cannot load the kernel programs")]
    Load(#[source] Box<aya::EbpfError>),
    /// An essential program failed; without it nothing can be tracked.
    #[error("cannot start essential feature {feature}")]
    CoreFeature {
        feature: &'static str,
        #[source]
        source: Arc<AttachError>,
    },
    /// A map the agent reads is absent from the object.
    #[error("kernel object has no map {0}")]
    MissingMap(&'static str),
    /// A map exists but could not be opened as the expected type.
    #[error("kernel map {name} cannot be used")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// The loaded programs. Dropping it detaches them all.
pub struct Sensor {
    _ebpf: Ebpf,
    features: Vec<FeatureState>,
    maps: Arc<SensorMaps>,
    events: Option<EventStream>,
}

impl Sensor {
    /// Loads and attaches everything the kernel allows. Fails only when core tracking (process
    /// exec and exit) is impossible; other failures are reported in [`Sensor::features`].
    pub fn load(config: &SensorConfig) -> Result<Self, SensorError> {
        if !has_bpf_privileges() {
            return Err(SensorError::NotPrivileged);
        }
        let page = page_size();
        if !config.ring_bytes.is_power_of_two() || !(config.ring_bytes as usize).is_multiple_of(page) {
            return Err(SensorError::BadRingSize(config.ring_bytes));
        }
        let settings = ProgramSettings { wakeup_bytes: config.wakeup_bytes, agent_tgid: config.ignore_tgid, _pad: 0 };
        pin_malloc_thresholds();
        // The kernel's BTF is only needed while loading: the offsets, which tracepoints exist, and
        // for aya the type ids tp_btf programs attach to. Read the file once, and let every parse
        // of it go before the agent settles (see `release_load_memory`).
        let (mut ebpf, features) = {
            let kernel_btf = KernelBtf::open(&config.btf_path)?;
            let offsets = kernel_btf.offsets();
            // Which programs each feature runs here; a feature whose needs this kernel does not
            // meet is off, named with why, before anything is loaded.
            let chosen: Vec<(Feature, Eligible)> =
                Feature::ALL.iter().map(|&f| (f, programs::eligible(f, &kernel_btf, &offsets))).collect();
            // `EbpfLoader::new` always parses /sys/kernel/btf/vmlinux itself: drop that copy
            // before making ours (from the bytes already read, and from `config.btf_path`), so
            // the two never coexist.
            let mut loader = EbpfLoader::new();
            loader.btf(None);
            let aya_btf = Btf::parse(kernel_btf.bytes(), aya::Endianness::default())
                .map_err(|e| SensorError::Load(Box::new(aya::EbpfError::BtfError(e))))?;
            drop(kernel_btf);
            let mut ebpf = loader
                .btf(Some(&aya_btf))
                .override_global(names::OFFSETS_GLOBAL, &offsets.values, true)
                .override_global(names::SETTINGS_GLOBAL, &settings, true)
                .map_max_entries(names::EVENTS_MAP, config.ring_bytes)
                .map_max_entries(names::COUNTERS_MAP, config.counter_entries)
                .load(OBJECT)
                .map_err(|e| SensorError::Load(Box::new(e)))?;

            let tracefs = ensure_tracefs(&config.tracefs_path).map_err(Arc::new);
            let mut features = Vec::new();
            for (feature, programs) in chosen {
                let attached = if config.disabled.contains(&feature) {
                    Err(AttachError::Disabled)
                } else {
                    programs
                        .map_err(AttachError::from)
                        .and_then(|sets| attach_first(&mut ebpf, &sets, &aya_btf, &tracefs))
                };
                let state = match attached {
                    Ok(()) => FeatureState { feature, enabled: true, reason: None },
                    Err(reason) if feature.is_core() && !matches!(reason, AttachError::Disabled) => {
                        return Err(SensorError::CoreFeature { feature: feature.name(), source: Arc::new(reason) })
                    }
                    Err(reason) => FeatureState { feature, enabled: false, reason: Some(Arc::new(reason)) },
                };
                features.push(state);
            }
            (ebpf, features)
        };
        release_load_memory();

        // Before the first event: a program's costs count from its first run.
        let accounting = match config.kernel_stats {
            false => Err(Arc::new(StatsError::Off)),
            true => aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|err| Arc::new(StatsError::Refused(io::Error::other(err)))),
        };
        let programs = attached_programs(&ebpf, &features);
        let counters = take_map(&mut ebpf, names::COUNTERS_MAP)?;
        let counters =
            BpfHashMap::try_from(counters).map_err(|source| SensorError::Map { name: names::COUNTERS_MAP, source })?;
        let stats = take_map(&mut ebpf, names::STATS_MAP)?;
        let stats =
            PerCpuArray::try_from(stats).map_err(|source| SensorError::Map { name: names::STATS_MAP, source })?;
        let ring = take_map(&mut ebpf, names::EVENTS_MAP)?;
        let ring = aya::maps::RingBuf::try_from(ring)
            .map_err(|source| SensorError::Map { name: names::EVENTS_MAP, source })?;
        Ok(Self {
            _ebpf: ebpf,
            features,
            maps: Arc::new(SensorMaps {
                counters: Mutex::new(counters),
                batch_buffers: Default::default(),
                stats,
                last_read: Mutex::new(None),
                programs,
                accounting,
            }),
            events: Some(EventStream::new(ring)),
        })
    }

    /// What runs and what does not, with reasons.
    pub fn features(&self) -> &[FeatureState] {
        &self.features
    }

    /// Logs which features run, and why the others do not.
    pub fn log_features(&self) {
        for state in &self.features {
            match (&state.reason, state.enabled) {
                (_, true) => log::info!("feature {} enabled", state.feature.name()),
                (Some(reason), false) => {
                    log::warn!("feature {} is off: {}", state.feature.name(), ErrorChain(reason.as_ref()))
                }
                (None, false) => log::warn!("feature {} is off", state.feature.name()),
            }
        }
    }

    /// Shared handle on the counter and statistics maps.
    pub fn maps(&self) -> Arc<SensorMaps> {
        Arc::clone(&self.maps)
    }

    /// The event stream; there is one, handed out once.
    pub fn take_events(&mut self) -> Option<EventStream> {
        self.events.take()
    }
}

/// Each program of the attached features, with a copy of its fd (the `Ebpf` keeps its own).
fn attached_programs(ebpf: &Ebpf, features: &[FeatureState]) -> Vec<(&'static str, aya::programs::ProgramFd)> {
    let names: Vec<&'static str> = Feature::ALL
        .iter()
        .filter(|f| features.iter().any(|s| s.feature == **f && s.enabled))
        .flat_map(|&f| programs::variants(f).iter().flat_map(|set| set.iter().map(|p| p.name)))
        .collect();
    names
        .into_iter()
        .filter_map(|name| {
            let fd = ebpf.program(name)?.fd().ok()?.try_clone().ok()?;
            Some((name, fd))
        })
        .collect()
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, SensorError> {
    ebpf.take_map(name).ok_or(SensorError::MissingMap(name))
}

/// The program sets a feature may run here, preferred first, or why none.
type Eligible = Result<Vec<&'static [Program]>, programs::NoVariant>;

/// Attaches the first of `sets` the kernel takes: a set the verifier refuses is unloaded and the
/// next tried (the exec and exit programs read the task directly where the verifier allows it,
/// with helpers elsewhere). The error is the first set's.
fn attach_first(
    ebpf: &mut Ebpf,
    sets: &[&'static [Program]],
    aya_btf: &Btf,
    tracefs: &Result<(), Arc<TracefsError>>,
) -> Result<(), AttachError> {
    let mut first_error = None;
    for (index, set) in sets.iter().enumerate() {
        match attach_all(ebpf, set, aya_btf, tracefs) {
            Ok(()) => {
                if let Some(error) = &first_error {
                    log::info!("loaded {} instead: {}", set[0].name, ErrorChain(error));
                }
                return Ok(());
            }
            Err(error) => {
                unload_all(ebpf, set);
                if index + 1 < sets.len() {
                    log::debug!("{} refused, trying the next: {}", set[0].name, ErrorChain(&error));
                }
                first_error.get_or_insert(error);
            }
        }
    }
    Err(first_error.unwrap_or(AttachError::NoProgram("(no program set)")))
}

/// Detaches and unloads what a failed set loaded, so its programs neither run nor hold memory.
fn unload_all(ebpf: &mut Ebpf, set: &[Program]) {
    for program in set {
        let Some(loaded) = ebpf.program_mut(program.name) else { continue };
        let _ = match loaded {
            aya::programs::Program::BtfTracePoint(p) => p.unload(),
            aya::programs::Program::TracePoint(p) => p.unload(),
            _ => Ok(()),
        };
    }
}

/// Loads and attaches every program of a feature's chosen set, or says why not.
fn attach_all(
    ebpf: &mut Ebpf,
    programs: &[Program],
    aya_btf: &Btf,
    tracefs: &Result<(), Arc<TracefsError>>,
) -> Result<(), AttachError> {
    let failed = |stage, program| move |source| AttachError::Program { stage, program, source };
    for program in programs {
        let name = program.name;
        match program.attach {
            Attach::Btf(tracepoint) => {
                let loaded: &mut BtfTracePoint = program_mut(ebpf, name)?;
                loaded.load(tracepoint, aya_btf).map_err(failed("loading", name))?;
                loaded.attach().map_err(failed("attaching", name))?;
            }
            Attach::Tracefs(category, tracepoint) => {
                if let Err(source) = tracefs {
                    return Err(AttachError::Tracefs { program: name, source: source.clone() });
                }
                let loaded: &mut TracePoint = program_mut(ebpf, name)?;
                loaded.load().map_err(failed("loading", name))?;
                loaded.attach(category, tracepoint).map_err(failed("attaching", name))?;
            }
        }
    }
    Ok(())
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, AttachError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(AttachError::NoProgram(name))?;
    program.try_into().map_err(|source| AttachError::Program { stage: "preparing", program: name, source })
}

/// Makes sure tracefs is reachable, mounting it when the host has not. Classic tracepoints need
/// it; aya looks at /sys/kernel/tracing, then /sys/kernel/debug/tracing, and caches the answer, so
/// this runs before the first attach.
fn ensure_tracefs(path: &Path) -> Result<(), TracefsError> {
    let debugfs_tracing = Path::new("/sys/kernel/debug/tracing/events");
    if path.join("events").is_dir() || debugfs_tracing.is_dir() {
        return Ok(());
    }
    let mounted = rustix::mount::mount("tracefs", path, "tracefs", rustix::mount::MountFlags::empty(), None);
    if let Err(errno) = mounted {
        let source = io::Error::from(errno);
        // Another process (a second agent starting at the same moment) may have mounted it in
        // between: EBUSY then means it is there.
        if path.join("events").is_dir() {
            return Ok(());
        }
        return Err(TracefsError::Mount { path: path.to_owned(), source });
    }
    log::info!("mounted tracefs at {}", path.display());
    Ok(())
}

/// Keeps glibc's thresholds at its defaults (128 KiB) for the life of the process.
///
/// glibc serves an allocation of at least the mmap threshold with its own mapping, returned to
/// the kernel when freed, but it raises that threshold to the size of every such block freed (up
/// to 32 MiB), and the trim threshold with it. Loading frees multi-megabyte buffers (the BTF
/// file, its parses), which would leave every later large buffer (a /metrics body or an API
/// answer for 1,000 containers, ~1 MB each) in the heap, resident after it is freed. Setting the
/// thresholds explicitly turns that adjustment off.
fn pin_malloc_thresholds() {
    crate::sys::pin_malloc_thresholds(128 * 1024);
}

/// Hands the memory that only loading needed back to the system.
///
/// Loading parses the kernel's BTF (5-6 MB of file) into tens of thousands of small heap
/// allocations (aya's parse, which lives until the last program is attached), plus the object's
/// own sections. All of it is freed by then, but glibc keeps freed heap pages resident: measured
/// on a 6.18 kernel, 28 MB of a 48 MB idle RSS was such free heap. `malloc_trim(0)` returns every
/// whole free page to the kernel.
fn release_load_memory() {
    crate::sys::release_free_heap();
}

/// CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON, in the effective set.
fn has_bpf_privileges() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let Some(effective) = crate::discovery::proc::effective_capabilities() else {
        // Without /proc we cannot tell; let the kernel decide at load time.
        return true;
    };
    let has = |cap: u32| effective & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

fn page_size() -> usize {
    rustix::param::page_size()
}
