//! The checks of what the kernel offers and this process may do: kernel version, BTF, the
//! tracepoints and the programs themselves, capabilities, memlock, cgroup layout. Pure functions
//! over what [`super::node`] read.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use lifecycle_common::{defaults, names};

use super::Finding;
use crate::kernel::Feature;

// ---- kernel version -------------------------------------------------------------------------

/// `major.minor` of a kernel release string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KernelVersion {
    pub major: u32,
    pub minor: u32,
}

impl KernelVersion {
    /// The BPF ring buffer (BPF_MAP_TYPE_RINGBUF) and CAP_BPF/CAP_PERFMON.
    pub(crate) const RING_BUFFER: Self = Self { major: 5, minor: 8 };
    /// BPF memory charged to the memory cgroup instead of RLIMIT_MEMLOCK.
    pub(crate) const MEMCG_ACCOUNTING: Self = Self { major: 5, minor: 11 };

    /// Reads `6.18.44-fc-v669`, `5.15.0-91-generic`, `4.18.0-513.el8.x86_64`, `5.8`.
    pub(crate) fn parse(release: &str) -> Option<Self> {
        let mut parts = release.trim().split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor_digits: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
        Some(Self { major, minor: minor_digits.parse().ok()? })
    }
}

/// The ring buffer is the agent's only event channel: below 5.8 nothing is recorded at all.
pub(crate) fn check_kernel(release: &str) -> Finding {
    const CHECK: &str = "kernel";
    let release = release.trim();
    match KernelVersion::parse(release) {
        Some(version) if version >= KernelVersion::RING_BUFFER => {
            Finding::ok(CHECK, format!("Linux {release} (>= 5.8: BPF ring buffer, CAP_BPF, CAP_PERFMON)"))
        }
        Some(_) => Finding::missing(
            CHECK,
            format!("Linux {release}: the BPF ring buffer needs 5.8 or newer"),
            "run the node on a kernel >= 5.8 (any distribution kernel of 2021 or later)",
        ),
        None => Finding::warn(
            CHECK,
            format!("cannot read a version from kernel release {release:?}"),
            "check `uname -r` is Linux 5.8 or newer",
        ),
    }
}

// ---- BTF ------------------------------------------------------------------------------------

/// What reading the kernel's BTF gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BtfRead {
    /// No file at the path.
    Absent,
    /// The file exists but could not be read (the error).
    Unreadable(String),
    /// The file is empty (or hidden by an empty file).
    Empty,
    /// Not BTF, or the agent cannot find the struct members it needs in it (the error).
    Unusable(String),
    /// Parsed; the struct members some program reads that this kernel lacks (those programs'
    /// features are off: the programs line says which).
    Usable { bytes: usize, missing: Vec<String> },
}

/// The programs are CO-RE: their struct offsets come from this file, so it is mandatory.
pub(crate) fn check_btf(path: &Path, read: &BtfRead) -> Finding {
    const CHECK: &str = "btf";
    const FIX: &str = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's since 2020); \
                       in a pod, mount the host's /sys/kernel/btf";
    let path = path.display();
    match read {
        BtfRead::Usable { bytes, missing } if missing.is_empty() => {
            Finding::ok(CHECK, format!("{path} readable ({} KiB), struct offsets found", bytes / 1024))
        }
        BtfRead::Usable { bytes, missing } => Finding::ok(
            CHECK,
            format!(
                "{path} readable ({} KiB), struct offsets found but {} (the programs reading them are off: see \
                 the programs line)",
                bytes / 1024,
                missing.join(", ")
            ),
        ),
        BtfRead::Absent => Finding::missing(CHECK, format!("{path} does not exist"), FIX),
        BtfRead::Unreadable(why) => {
            Finding::missing(CHECK, format!("{path} cannot be read: {why}"), format!("make it readable; {FIX}"))
        }
        BtfRead::Empty => Finding::missing(CHECK, format!("{path} is empty"), FIX),
        BtfRead::Unusable(why) => Finding::missing(
            CHECK,
            format!("{path} is not usable: {why}"),
            "report the kernel version: the agent cannot read its struct layout",
        ),
    }
}

// ---- tracepoints ----------------------------------------------------------------------------

/// How a program reaches its tracepoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TracepointKind {
    /// `tp_btf`: found in BTF as `btf_trace_<name>`; needs no tracefs.
    Btf,
    /// A classic tracepoint `<category>/<name>` in tracefs.
    Tracefs(&'static str),
}

/// Every tracepoint the kernel programs attach to (lifecycle-ebpf), by feature.
pub(crate) const TRACEPOINTS: [(Feature, &str, TracepointKind); 9] = [
    (Feature::ProcessExec, names::PROG_EXEC, TracepointKind::Btf),
    (Feature::ProcessExit, names::PROG_EXIT, TracepointKind::Btf),
    (Feature::Signals, names::PROG_SIGNAL, TracepointKind::Btf),
    (Feature::OomKills, names::PROG_OOM, TracepointKind::Btf),
    (Feature::TcpSockets, names::PROG_SOCK_STATE, TracepointKind::Btf),
    (Feature::TcpAccepts, names::PROG_ACCEPT4, TracepointKind::Tracefs("syscalls")),
    (Feature::TcpAccepts, names::PROG_ACCEPT, TracepointKind::Tracefs("syscalls")),
    (Feature::CgroupEvents, names::PROG_CGROUP_MKDIR, TracepointKind::Btf),
    (Feature::CgroupEvents, names::PROG_CGROUP_RMDIR, TracepointKind::Btf),
];

/// Whether one tracepoint exists: None when it cannot be told (no BTF, or tracefs not mounted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TracepointSeen {
    pub feature: Feature,
    pub name: &'static str,
    pub kind: TracepointKind,
    pub present: Option<bool>,
}

/// A missing tracepoint turns its feature off; only exec and exit are essential.
pub(crate) fn check_tracepoints(seen: &[TracepointSeen]) -> Finding {
    const CHECK: &str = "tracepoints";
    let spell = |tracepoint: &TracepointSeen| match tracepoint.kind {
        TracepointKind::Btf => format!("tp_btf/{}", tracepoint.name),
        TracepointKind::Tracefs(category) => format!("{category}/{}", tracepoint.name),
    };
    let absent: Vec<&TracepointSeen> = seen.iter().filter(|t| t.present == Some(false)).collect();
    let unknown: Vec<String> = seen.iter().filter(|t| t.present.is_none()).map(spell).collect();
    let present = seen.iter().filter(|t| t.present == Some(true)).count();
    let mut features_off: Vec<&str> = absent.iter().map(|t| t.feature.name()).collect();
    features_off.dedup();
    let absent_names: Vec<String> = absent.iter().map(|t| spell(t)).collect();
    let mut found = format!("{present} of {} present", seen.len());
    if !absent_names.is_empty() {
        let _ = write!(found, "; absent: {}", absent_names.join(", "));
    }
    if !unknown.is_empty() {
        let _ = write!(found, "; not checked: {}", unknown.join(", "));
    }
    if absent.iter().any(|t| t.feature.is_core()) {
        return Finding::missing(
            CHECK,
            found,
            "process exec/exit tracking is essential: use a kernel with these BTF tracepoints (5.8+ with BTF)",
        );
    }
    if !absent.is_empty() {
        return Finding::warn(
            CHECK,
            found,
            format!(
                "the agent runs with {} off (lifecycle_feature_enabled); a kernel with them turns them on",
                features_off.join(", ")
            ),
        );
    }
    let unknown_kind = |btf: bool| seen.iter().any(|t| t.present.is_none() && (t.kind == TracepointKind::Btf) == btf);
    if unknown_kind(true) {
        return Finding::warn(CHECK, found, "BTF tracepoints are looked up in the kernel's BTF: see the btf line");
    }
    if unknown_kind(false) {
        return Finding::warn(
            CHECK,
            found,
            "tracefs is not mounted here: the agent mounts it at start (needs CAP_SYS_ADMIN); or mount it: \
             mount -t tracefs tracefs /sys/kernel/tracing",
        );
    }
    Finding::ok(CHECK, found)
}

// ---- loading the programs -------------------------------------------------------------------

/// What loading the kernel programs as `run` does gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProgramLoad {
    /// Not attempted (why: no BTF, no capabilities, --no-load).
    NotTried(String),
    /// The sensor refused to start (the error chain).
    Failed(String),
    /// Loaded: each feature with the reason it is off, if it is.
    Loaded(Vec<(&'static str, Option<String>)>),
}

/// The real answer to "will the programs load here": the kernel's verifier, lockdown, seccomp and
/// LSMs all have a say that no file under /sys tells.
pub(crate) fn check_programs(load: &ProgramLoad) -> Finding {
    const CHECK: &str = "programs";
    match load {
        ProgramLoad::NotTried(why) => Finding::skip(CHECK, format!("not loaded: {why}")),
        ProgramLoad::Failed(why) => Finding::missing(
            CHECK,
            format!("loading failed: {why}"),
            "EPERM with every capability: kernel lockdown, a seccomp profile or an LSM (AppArmor, SELinux) \
             forbids bpf(); see deploy/daemonset.yaml's securityContext",
        ),
        ProgramLoad::Loaded(features) => {
            let off: Vec<String> = features
                .iter()
                .filter_map(|(name, reason)| reason.as_ref().map(|reason| format!("{name} ({reason})")))
                .collect();
            if off.is_empty() {
                Finding::ok(CHECK, format!("loaded and attached: {} features", features.len()))
            } else {
                Finding::warn(
                    CHECK,
                    format!("loaded; off: {}", off.join(", ")),
                    "the agent runs without these (lifecycle_feature_enabled says which)",
                )
            }
        }
    }
}

/// Whether each feature that attached made its record when `doctor` made the event
/// (`proof.rs`): a feature that attaches and sees nothing would have the agent claim what it
/// cannot do.
pub(crate) fn check_features(load: &ProgramLoad, proofs: Option<&[(Feature, super::proof::Proof)]>) -> Finding {
    use super::proof::Proof;
    const CHECK: &str = "features";
    let Some(proofs) = proofs else {
        return match load {
            ProgramLoad::Loaded(_) => {
                Finding::warn(CHECK, "not proven: the event stream was taken", "run doctor again")
            }
            _ => Finding::skip(CHECK, "not proven: the programs were not loaded"),
        };
    };
    let named = |wanted: fn(&Proof) -> bool| -> Vec<String> {
        proofs
            .iter()
            .filter(|(_, proof)| wanted(proof))
            .map(|(feature, proof)| match proof {
                Proof::Seen => feature.name().to_owned(),
                Proof::NotSeen(why) | Proof::NotMade(why) => format!("{} ({why})", feature.name()),
            })
            .collect()
    };
    let seen = named(|p| matches!(p, Proof::Seen));
    let not_seen = named(|p| matches!(p, Proof::NotSeen(_)));
    let not_made = named(|p| matches!(p, Proof::NotMade(_)));
    if !not_seen.is_empty() {
        return Finding::missing(
            CHECK,
            format!("attached but saw nothing: {}; proven: {}", not_seen.join(", "), seen.join(", ")),
            "the agent would report these features on while their events cannot arrive: report the kernel \
             version (`uname -r`) with this line",
        );
    }
    if !not_made.is_empty() {
        return Finding::warn(
            CHECK,
            format!("proven by their own records: {}; not proven here: {}", seen.join(", "), not_made.join(", ")),
            "the proof needs to make the event (a cgroup, a memory limit): run doctor as the agent runs",
        );
    }
    Finding::ok(CHECK, format!("proven by their own records: {}", seen.join(", ")))
}

/// What the kernel accounted for the programs while `doctor` proved them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KernelCost {
    /// (program, runs, nanoseconds) of each program.
    Accounted(Vec<(&'static str, u64, u64)>),
    /// `BPF_ENABLE_STATS` refused (why).
    NotAccounted(String),
}

/// The kernel's time per event of each program, over doctor's own events: what one event costs
/// the node on this kernel. The agent exports the same live
/// (`lifecycle_kernel_program_run_seconds_total`).
pub(crate) fn check_kernel_cost(load: &ProgramLoad, cost: Option<&KernelCost>) -> Finding {
    const CHECK: &str = "kernel-cost";
    match cost {
        None => match load {
            ProgramLoad::Loaded(_) => Finding::skip(CHECK, "not measured"),
            _ => Finding::skip(CHECK, "not measured: the programs were not loaded"),
        },
        Some(KernelCost::NotAccounted(why)) => Finding::warn(
            CHECK,
            format!("the kernel does not account the programs' runs: {why}"),
            "lifecycle_kernel_program_run_seconds_total will be missing; BPF_ENABLE_STATS needs Linux 5.8",
        ),
        Some(KernelCost::Accounted(programs)) => {
            let per_event: Vec<String> = programs
                .iter()
                .filter(|(_, runs, _)| *runs > 0)
                .map(|(program, runs, ns)| format!("{program} {:.2} µs", *ns as f64 / *runs as f64 / 1000.0))
                .collect();
            if per_event.is_empty() {
                return Finding::ok(CHECK, "accounted by the kernel; no program ran during the proofs");
            }
            Finding::ok(CHECK, format!("per event, over doctor's own events: {}", per_event.join(", ")))
        }
    }
}

// ---- capabilities ---------------------------------------------------------------------------

/// Capability bit numbers (linux/capability.h).
pub(crate) mod cap {
    pub(crate) const SYS_PTRACE: u32 = 19;
    pub(crate) const SYS_ADMIN: u32 = 21;
    pub(crate) const SYS_NICE: u32 = 23;
    pub(crate) const SYS_RESOURCE: u32 = 24;
    pub(crate) const SYSLOG: u32 = 34;
    pub(crate) const PERFMON: u32 = 38;
    pub(crate) const BPF: u32 = 39;
}

/// What deploy/daemonset.yaml grants, and why each one. NET_ADMIN is not among them (no program
/// attaches to a cgroup or a socket); SYS_RESOURCE only matters below 5.11 (the memlock check).
pub(crate) const REQUIRED_CAPABILITIES: [(u32, &str, &str); 4] = [
    (cap::BPF, "CAP_BPF", "load programs, create maps"),
    (cap::PERFMON, "CAP_PERFMON", "attach tracepoints"),
    (cap::SYS_ADMIN, "CAP_SYS_ADMIN", "setns into pods, mount tracefs"),
    (cap::SYS_PTRACE, "CAP_SYS_PTRACE", "read other users' /proc/<pid>/root and ns"),
];

/// Granted too, but the agent runs without them, less well.
pub(crate) const OPTIONAL_CAPABILITIES: [(u32, &str, &str); 2] = [
    (cap::SYSLOG, "CAP_SYSLOG", "read the kernel log: which memory limit an OOM kill answered"),
    (cap::SYS_NICE, "CAP_SYS_NICE", "run the ring reader ahead of the HTTP workers"),
];

/// Whether a capability is in an effective set.
pub(crate) fn has_capability(effective: u64, bit: u32) -> bool {
    effective & (1u64 << bit) != 0
}

/// Reads the hexadecimal `CapEff:` of `/proc/<pid>/status`.
pub(crate) fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Names each capability of the DaemonSet's list that this process lacks.
pub(crate) fn check_capabilities(effective: Option<u64>) -> Finding {
    const CHECK: &str = "capabilities";
    let Some(effective) = effective else {
        return Finding::warn(CHECK, "cannot read CapEff from /proc/self/status", "run as root with /proc mounted");
    };
    let missing: Vec<String> = REQUIRED_CAPABILITIES
        .iter()
        .filter(|(bit, _, _)| !has_capability(effective, *bit))
        .map(|(_, name, why)| format!("{name} ({why})"))
        .collect();
    if missing.is_empty() {
        let names: Vec<&str> = REQUIRED_CAPABILITIES.iter().map(|(_, name, _)| *name).collect();
        let lacking: Vec<_> =
            OPTIONAL_CAPABILITIES.iter().filter(|(bit, _, _)| !has_capability(effective, *bit)).collect();
        if !lacking.is_empty() {
            let named: Vec<String> = lacking.iter().map(|(_, name, why)| format!("{name} ({why})")).collect();
            // securityContext names a capability without its CAP_ prefix.
            let to_add: Vec<&str> = lacking.iter().map(|(_, name, _)| name.trim_start_matches("CAP_")).collect();
            return Finding::warn(
                CHECK,
                format!("CapEff {effective:016x}: {}; lacks {}", names.join(", "), named.join(", ")),
                format!(
                    "add {} to the container's securityContext (deploy/daemonset.yaml grants it)",
                    to_add.join(", ")
                ),
            );
        }
        return Finding::ok(CHECK, format!("CapEff {effective:016x}: {}", names.join(", ")));
    }
    Finding::missing(
        CHECK,
        format!("CapEff {effective:016x} lacks {}", missing.join(", ")),
        "run as root, or add BPF, PERFMON, SYS_ADMIN, SYS_PTRACE to the container's securityContext \
         (deploy/daemonset.yaml)",
    )
}

// ---- memlock --------------------------------------------------------------------------------

/// RLIMIT_MEMLOCK of this process, in bytes; `u64::MAX` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Memlock {
    pub soft: u64,
    pub hard: u64,
}

/// About what the agent's maps lock at the default sizes: the ring (mapped twice), the counters
/// (~400 bytes an entry), and the small maps and programs.
pub(crate) const MEMLOCK_NEEDED_BYTES: u64 =
    2 * defaults::RING_BYTES as u64 + defaults::COUNTER_ENTRIES as u64 * 512 + (4 << 20);

fn bytes_text(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".to_owned()
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Below 5.11 BPF memory counts against RLIMIT_MEMLOCK; aya raises it to unlimited when a load
/// fails with EPERM, which takes CAP_SYS_RESOURCE.
pub(crate) fn check_memlock(kernel: Option<KernelVersion>, limit: Option<Memlock>, can_raise: bool) -> Finding {
    const CHECK: &str = "memlock";
    let limit_text = limit.map_or("unknown".to_owned(), |l| bytes_text(l.soft));
    if kernel.is_some_and(|k| k >= KernelVersion::MEMCG_ACCOUNTING) {
        return Finding::ok(
            CHECK,
            format!("limit {limit_text}, not used: BPF memory is charged to the memory cgroup since 5.11"),
        );
    }
    let needed = bytes_text(MEMLOCK_NEEDED_BYTES);
    match limit {
        Some(limit) if limit.soft >= MEMLOCK_NEEDED_BYTES => {
            Finding::ok(CHECK, format!("limit {limit_text} (the maps need about {needed})"))
        }
        _ if can_raise => Finding::ok(
            CHECK,
            format!("limit {limit_text} < about {needed}, raised to unlimited at load (CAP_SYS_RESOURCE)"),
        ),
        _ => Finding::missing(
            CHECK,
            format!("limit {limit_text}, below the about {needed} the maps lock on kernels < 5.11"),
            "add the SYS_RESOURCE capability, or raise the limit (LimitMEMLOCK=infinity in the container \
             runtime's systemd unit; `ulimit -l unlimited` on a plain host)",
        ),
    }
}

// ---- cgroups --------------------------------------------------------------------------------

/// How the cgroup hierarchies are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CgroupLayout {
    /// cgroup v2 alone.
    Unified { v2: PathBuf },
    /// v1 controllers beside a v2 hierarchy (systemd's `unified` mount).
    Hybrid { v2: PathBuf, v1_controllers: Vec<String> },
    /// v1 controllers and no v2 hierarchy.
    V1Only { v1_controllers: Vec<String> },
    /// No cgroup filesystem at all.
    None,
}

/// Reads the layout from /proc/self/mountinfo text.
pub(crate) fn cgroup_layout(mountinfo: &str) -> CgroupLayout {
    let v2 = crate::discovery::cgroupfs::CgroupRoot::from_mountinfo(mountinfo).map(|root| root.mount().to_owned());
    let mut v1_controllers: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| {
            let (_, right) = line.split_once(" - ")?;
            let mut fields = right.split_whitespace();
            (fields.next()? == "cgroup").then_some(())?;
            let options = fields.nth(1)?;
            // The super options name the controllers (`rw,memory`) or a named hierarchy
            // (`rw,xattr,name=systemd`).
            let controllers: Vec<&str> = options
                .split(',')
                .filter(|option| !matches!(*option, "rw" | "ro" | "xattr" | "clone_children" | "nsdelegate"))
                .filter(|option| !option.starts_with("release_agent="))
                .collect();
            Some(controllers.join(","))
        })
        .filter(|controllers| !controllers.is_empty())
        .collect();
    v1_controllers.sort();
    v1_controllers.dedup();
    match (v2, v1_controllers.is_empty()) {
        (Some(v2), true) => CgroupLayout::Unified { v2 },
        (Some(v2), false) => CgroupLayout::Hybrid { v2, v1_controllers },
        (None, false) => CgroupLayout::V1Only { v1_controllers },
        (None, true) => CgroupLayout::None,
    }
}

/// The kernel reports v2 cgroup ids: the agent needs a v2 hierarchy, unified or hybrid.
pub(crate) fn check_cgroups(layout: &CgroupLayout) -> Finding {
    const CHECK: &str = "cgroups";
    const FIX: &str = "boot with systemd.unified_cgroup_hierarchy=1 (v2, what Kubernetes recommends), or mount \
                       cgroup2 at /sys/fs/cgroup/unified (hybrid); in a pod, mount the host's /sys/fs/cgroup";
    match layout {
        CgroupLayout::Unified { v2 } => Finding::ok(CHECK, format!("unified v2 at {}", v2.display())),
        CgroupLayout::Hybrid { v2, v1_controllers } => Finding::ok(
            CHECK,
            format!(
                "hybrid: v2 at {} (cgroup ids; works as unified), v1 controllers {}",
                v2.display(),
                v1_controllers.join(" ")
            ),
        ),
        CgroupLayout::V1Only { v1_controllers } => Finding::missing(
            CHECK,
            format!("v1 only ({}): no v2 hierarchy for the cgroup ids the kernel reports", v1_controllers.join(" ")),
            FIX,
        ),
        CgroupLayout::None => Finding::missing(CHECK, "no cgroup filesystem mounted", FIX),
    }
}
