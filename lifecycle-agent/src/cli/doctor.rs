//! `lifecycle-agent doctor`: a preflight an operator runs on a node (or inside the DaemonSet's
//! pod) before trusting the agent there. Each requirement is one check and one line: `ok`,
//! `warn` (the agent runs, with less), `missing` (it cannot run, or not fully) or `skip` (does
//! not apply here), what was found, and what to do.
//!
//! Every check is a pure function over what was read, so fixtures test them without root or a
//! particular kernel; [`node`] is the thin layer that reads the real system (files under /proc and
//! /sys, the CRI socket, the API server, the ports, the clocks) and loads the kernel programs the
//! way `run` does. The exit status is non-zero exactly when a check says `missing`.

mod node;
#[cfg(test)]
mod tests;

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use lifecycle_common::{defaults, names};
use serde::Serialize;

use crate::kernel::Feature;

/// The flags of `doctor`: the same spellings and defaults as `run`'s, so an operator passes the
/// values the agent runs with.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The agent's --listen address (checked for being free).
    #[arg(long, default_value = "127.0.0.1:9890")]
    pub listen: SocketAddr,
    /// The agent's --health-listen address, if it uses one (the DaemonSet's is 0.0.0.0:9892).
    #[arg(long, default_value = "")]
    pub health_listen: String,
    /// The agent's --pod-probe-port (0: none).
    #[arg(long, default_value_t = crate::probe::server::DEFAULT_POD_PORT)]
    pub pod_probe_port: u16,
    /// The CRI socket the agent is given (default: the ones it tries, and the k3s/RKE2 and
    /// MicroK8s paths it does not).
    #[arg(long)]
    pub cri_socket: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API, when not in a pod (default: KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (default: NODE_NAME, else the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Kernel BTF.
    #[arg(long, default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
    /// Where tracefs is, or is mounted when missing (loading the programs mounts it, as `run`
    /// does).
    #[arg(long, default_value = "/sys/kernel/tracing")]
    pub tracefs: PathBuf,
    /// Do not load the kernel programs: judge them from BTF and tracefs alone.
    #[arg(long)]
    pub no_load: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: DoctorFormat,
}

/// How the report is printed.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DoctorFormat {
    /// Aligned columns, one line per check.
    Text,
    /// One JSON object: `ready` and the checks.
    Json,
}

/// Why `doctor` exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// At least one requirement is missing; the report says which and what to do.
    #[error("this node cannot run the agent fully: missing {}", .missing.join(", "))]
    NotReady { missing: Vec<&'static str> },
    /// The JSON report could not be written.
    #[error("cannot write the JSON report")]
    Json(#[source] serde_json::Error),
}

/// Runs every check on this node, prints the report, and fails when something is missing.
pub async fn run(args: DoctorArgs) -> Result<(), DoctorError> {
    let report = Report::new(node::examine(&args).await);
    match args.output {
        DoctorFormat::Text => print!("{}", render_text(&report)),
        DoctorFormat::Json => println!("{}", serde_json::to_string_pretty(&report).map_err(DoctorError::Json)?),
    }
    let missing: Vec<&'static str> = report
        .checks
        .iter()
        .filter(|finding| finding.result == Verdict::Missing)
        .map(|finding| finding.check)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DoctorError::NotReady { missing })
    }
}

/// The result of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// The agent runs, with a feature off or a caveat.
    Warn,
    /// The agent cannot run, or not fully.
    Missing,
    /// The check does not apply here (no Kubernetes API on a plain host).
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Missing => "missing",
            Verdict::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub result: Verdict,
    pub found: String,
    /// What to do; only when the result is not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, found: impl Into<String>) -> Self {
        Self { check, result: Verdict::Ok, found: found.into(), fix: None }
    }

    fn warn(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Warn, found: found.into(), fix: Some(fix.into()) }
    }

    fn missing(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Missing, found: found.into(), fix: Some(fix.into()) }
    }

    fn skip(check: &'static str, found: impl Into<String>) -> Self {
        Self { check, result: Verdict::Skip, found: found.into(), fix: None }
    }
}

/// Every check, and whether the agent can run fully.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub ready: bool,
    pub checks: Vec<Finding>,
}

impl Report {
    pub fn new(checks: Vec<Finding>) -> Self {
        Self { ready: checks.iter().all(|finding| finding.result != Verdict::Missing), checks }
    }
}

/// Aligned columns (result, check, what was found, `-> what to do`) and a closing sentence.
pub fn render_text(report: &Report) -> String {
    let check_width = report.checks.iter().map(|finding| finding.check.len()).max().unwrap_or(0);
    let mut out = String::new();
    for finding in &report.checks {
        let _ = write!(out, "{:<7}  {:<check_width$}  {}", finding.result.label(), finding.check, finding.found);
        if let Some(fix) = &finding.fix {
            let _ = write!(out, "  -> {fix}");
        }
        out.push('\n');
    }
    let count = |verdict| report.checks.iter().filter(|finding| finding.result == verdict).count();
    let (missing, warnings) = (count(Verdict::Missing), count(Verdict::Warn));
    let _ = match (missing, warnings) {
        (0, 0) => writeln!(out, "ready: the agent can run fully on this node"),
        (0, _) => writeln!(out, "ready: the agent can run fully on this node ({warnings} warning(s) above)"),
        _ => writeln!(out, "not ready: {missing} requirement(s) missing, {warnings} warning(s)"),
    };
    out
}

// ---- kernel version -------------------------------------------------------------------------

/// `major.minor` of a kernel release string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
}

impl KernelVersion {
    /// The BPF ring buffer (BPF_MAP_TYPE_RINGBUF) and CAP_BPF/CAP_PERFMON.
    pub const RING_BUFFER: Self = Self { major: 5, minor: 8 };
    /// BPF memory charged to the memory cgroup instead of RLIMIT_MEMLOCK.
    pub const MEMCG_ACCOUNTING: Self = Self { major: 5, minor: 11 };

    /// Reads `6.18.44-fc-v669`, `5.15.0-91-generic`, `4.18.0-513.el8.x86_64`, `5.8`.
    pub fn parse(release: &str) -> Option<Self> {
        let mut parts = release.trim().split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor_digits: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
        Some(Self { major, minor: minor_digits.parse().ok()? })
    }
}

/// The ring buffer is the agent's only event channel: below 5.8 nothing is recorded at all.
pub fn check_kernel(release: &str) -> Finding {
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
pub enum BtfRead {
    /// No file at the path.
    Absent,
    /// The file exists but could not be read (the error).
    Unreadable(String),
    /// The file is empty (or hidden by an empty file).
    Empty,
    /// Not BTF, or the agent cannot find the struct members it needs in it (the error).
    Unusable(String),
    /// Parsed, and every offset the programs need was found.
    Usable { bytes: usize },
}

/// The programs are CO-RE: their struct offsets come from this file, so it is mandatory.
pub fn check_btf(path: &Path, read: &BtfRead) -> Finding {
    const CHECK: &str = "btf";
    const FIX: &str = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's since 2020); \
                       in a pod, mount the host's /sys/kernel/btf";
    let path = path.display();
    match read {
        BtfRead::Usable { bytes } => {
            Finding::ok(CHECK, format!("{path} readable ({} KiB), struct offsets found", bytes / 1024))
        }
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
pub enum TracepointKind {
    /// `tp_btf`: found in BTF as `btf_trace_<name>`; needs no tracefs.
    Btf,
    /// A classic tracepoint `<category>/<name>` in tracefs.
    Tracefs(&'static str),
}

/// Every tracepoint the kernel programs attach to (lifecycle-ebpf), by feature.
pub const TRACEPOINTS: [(Feature, &str, TracepointKind); 9] = [
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
pub struct TracepointSeen {
    pub feature: Feature,
    pub name: &'static str,
    pub kind: TracepointKind,
    pub present: Option<bool>,
}

/// A missing tracepoint turns its feature off; only exec and exit are essential.
pub fn check_tracepoints(seen: &[TracepointSeen]) -> Finding {
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
pub enum ProgramLoad {
    /// Not attempted (why: no BTF, no capabilities, --no-load).
    NotTried(String),
    /// The sensor refused to start (the error chain).
    Failed(String),
    /// Loaded: each feature with the reason it is off, if it is.
    Loaded(Vec<(&'static str, Option<String>)>),
}

/// The real answer to "will the programs load here": the kernel's verifier, lockdown, seccomp and
/// LSMs all have a say that no file under /sys tells.
pub fn check_programs(load: &ProgramLoad) -> Finding {
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

// ---- capabilities ---------------------------------------------------------------------------

/// Capability bit numbers (linux/capability.h).
pub mod cap {
    pub const SYS_PTRACE: u32 = 19;
    pub const SYS_ADMIN: u32 = 21;
    pub const SYS_RESOURCE: u32 = 24;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
}

/// What deploy/daemonset.yaml grants, and why each one. NET_ADMIN is not among them (SYS_ADMIN
/// covers the sock_ops attachment); SYS_RESOURCE only matters below 5.11 (the memlock check).
pub const REQUIRED_CAPABILITIES: [(u32, &str, &str); 4] = [
    (cap::BPF, "CAP_BPF", "load programs, create maps"),
    (cap::PERFMON, "CAP_PERFMON", "attach tracepoints"),
    (cap::SYS_ADMIN, "CAP_SYS_ADMIN", "setns into pods, sock_ops, mount tracefs"),
    (cap::SYS_PTRACE, "CAP_SYS_PTRACE", "read other users' /proc/<pid>/root and ns"),
];

/// Whether a capability is in an effective set.
pub fn has_capability(effective: u64, bit: u32) -> bool {
    effective & (1u64 << bit) != 0
}

/// Reads the hexadecimal `CapEff:` of /proc/<pid>/status.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Names each capability of the DaemonSet's list that this process lacks.
pub fn check_capabilities(effective: Option<u64>) -> Finding {
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
pub struct Memlock {
    pub soft: u64,
    pub hard: u64,
}

/// About what the agent's maps lock at the default sizes: the ring (mapped twice), the counters
/// (~400 bytes an entry), and the small maps and programs.
pub const MEMLOCK_NEEDED_BYTES: u64 =
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
pub fn check_memlock(kernel: Option<KernelVersion>, limit: Option<Memlock>, can_raise: bool) -> Finding {
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
pub enum CgroupLayout {
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
pub fn cgroup_layout(mountinfo: &str) -> CgroupLayout {
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
pub fn check_cgroups(layout: &CgroupLayout) -> Finding {
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

// ---- CRI socket -----------------------------------------------------------------------------

/// Where a CRI socket path comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketOrigin {
    /// `--cri-socket`.
    Flag,
    /// One the agent tries by itself (containerd's, CRI-O's).
    Default,
    /// A distribution's path the agent does not try (k3s/RKE2, MicroK8s).
    Distribution,
}

/// The k3s/RKE2 and MicroK8s containerd sockets.
pub const DISTRIBUTION_SOCKETS: [&str; 2] =
    ["/run/k3s/containerd/containerd.sock", "/var/snap/microk8s/common/run/containerd.sock"];

/// What one socket path gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketState {
    Absent,
    /// A CRI `Version` call answered.
    Answered {
        runtime: String,
    },
    /// It exists but did not answer (the error).
    Failed(String),
    /// Its directory cannot be searched by this process (the error): whether it exists is unknown.
    NoAccess(String),
}

/// One path tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketProbe {
    pub path: PathBuf,
    pub origin: SocketOrigin,
    pub state: SocketState,
}

/// The socket the agent would use answers; else which flag makes it find one.
pub fn check_cri(probes: &[SocketProbe]) -> Finding {
    const CHECK: &str = "cri";
    let describe = |probe: &SocketProbe| {
        let state = match &probe.state {
            SocketState::Absent => "absent".to_owned(),
            SocketState::Answered { runtime } => format!("answers ({runtime})"),
            SocketState::Failed(why) => format!("does not answer: {why}"),
            SocketState::NoAccess(why) => format!("cannot be looked at: {why}"),
        };
        format!("{} {state}", probe.path.display())
    };
    let tried: Vec<String> = probes.iter().filter(|p| p.state != SocketState::Absent).map(describe).collect();
    let all_absent = || {
        format!("none of {} exists", probes.iter().map(|p| p.path.display().to_string()).collect::<Vec<_>>().join(", "))
    };
    let found = if tried.is_empty() { all_absent() } else { tried.join("; ") };
    let answers = |origin: SocketOrigin| {
        probes.iter().find(|p| p.origin == origin && matches!(p.state, SocketState::Answered { .. }))
    };
    if probes.iter().any(|p| p.origin == SocketOrigin::Flag) {
        return match answers(SocketOrigin::Flag) {
            Some(_) => Finding::ok(CHECK, found),
            None => Finding::missing(CHECK, found, "start the runtime, or pass the --cri-socket it serves"),
        };
    }
    if answers(SocketOrigin::Default).is_some() {
        return Finding::ok(CHECK, found);
    }
    if let Some(other) = answers(SocketOrigin::Distribution) {
        return Finding::missing(
            CHECK,
            found,
            format!(
                "the agent does not look there by itself: pass --cri-socket {} (and mount its directory in the pod)",
                other.path.display()
            ),
        );
    }
    if probes.iter().all(|p| p.state == SocketState::Absent) {
        return Finding::warn(
            CHECK,
            found,
            "no container runtime found: units are named by cgroup path (fine on a plain host); on a \
             Kubernetes node pass --cri-socket",
        );
    }
    if probes.iter().any(|p| matches!(p.state, SocketState::NoAccess(_))) {
        return Finding::missing(
            CHECK,
            found,
            "run doctor as the agent runs (root, with its capabilities), or make the socket's directory \
             searchable by root: the agent must connect to it",
        );
    }
    Finding::missing(CHECK, found, "the runtime is not serving its socket: restart it, or pass --cri-socket")
}

// ---- Kubernetes API -------------------------------------------------------------------------

/// A permission the agent uses, checked with a SelfSubjectAccessReview.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
}

impl Permission {
    /// `list pods`, `create tokenreviews.authentication.k8s.io`.
    pub fn spelling(self) -> String {
        if self.group.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}.{}", self.verb, self.resource, self.group)
        }
    }
}

/// What deploy/rbac.yaml grants and the agent uses: its node's pods (list, watch), tokens and
/// access checks for `--api-auth kubernetes`, events (events.k8s.io, kube's recorder) for
/// `--events`.
pub const PERMISSIONS: [Permission; 5] = [
    Permission { verb: "list", group: "", resource: "pods" },
    Permission { verb: "watch", group: "", resource: "pods" },
    Permission { verb: "create", group: "authentication.k8s.io", resource: "tokenreviews" },
    Permission { verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews" },
    Permission { verb: "create", group: "events.k8s.io", resource: "events" },
];

/// What the API said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiReach {
    /// No in-cluster account, no kubeconfig.
    NotConfigured,
    /// Credentials exist but listing this node's pods failed (the error).
    Failed { node: String, why: String },
    /// This node's pods were listed; each permission's answer (Err: the review failed).
    Reached { node: String, answers: Vec<(Permission, Result<bool, String>)> },
}

/// Pod specs and status make the verdicts exact; without the API the agent falls back to the
/// runtime's labels, which is right on a plain host and a loss on a node.
pub fn check_kubernetes(reach: &ApiReach) -> Finding {
    const CHECK: &str = "kubernetes";
    match reach {
        ApiReach::NotConfigured => Finding::skip(
            CHECK,
            "no API configured (not in a pod; no --kubeconfig or KUBECONFIG): verdicts use the runtime's labels",
        ),
        ApiReach::Failed { node, why } => Finding::missing(
            CHECK,
            format!("cannot list the pods of node {node}: {why}"),
            "check the API server address and credentials; in a pod, the ServiceAccount and ClusterRole of \
             deploy/rbac.yaml",
        ),
        ApiReach::Reached { node, answers } => {
            let denied: Vec<String> =
                answers.iter().filter(|(_, answer)| answer == &Ok(false)).map(|(p, _)| p.spelling()).collect();
            let failed: Vec<String> = answers
                .iter()
                .filter_map(|(p, answer)| answer.as_ref().err().map(|why| format!("{} ({why})", p.spelling())))
                .collect();
            let mut found = format!("lists the pods of node {node}");
            if denied.is_empty() && failed.is_empty() {
                let _ = write!(
                    found,
                    "; allowed: {}",
                    answers.iter().map(|(p, _)| p.spelling()).collect::<Vec<_>>().join(", ")
                );
                return Finding::ok(CHECK, found);
            }
            if !denied.is_empty() {
                let _ = write!(found, "; denied: {}", denied.join(", "));
            }
            if !failed.is_empty() {
                let _ = write!(found, "; could not ask: {}", failed.join(", "));
            }
            Finding::missing(CHECK, found, "grant the agent's account the ClusterRole of deploy/rbac.yaml")
        }
    }
}

// ---- ports ----------------------------------------------------------------------------------

/// Which of the agent's listeners a port is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortRole {
    /// `--listen`: /metrics and the API.
    Listen,
    /// `--health-listen`: the kubelet's probes of the agent.
    Health,
    /// `--pod-probe-port`: bound in each pod's network namespace, not this one.
    PodProbe,
}

impl PortRole {
    fn check(self) -> &'static str {
        match self {
            PortRole::Listen => "listen",
            PortRole::Health => "health-listen",
            PortRole::PodProbe => "pod-probe-port",
        }
    }
}

/// A process holding a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
}

/// What binding a port gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortState {
    Free,
    /// In use, by this process if it could be found.
    InUse(Option<Holder>),
    /// Binding failed otherwise (the error: no such address, permission).
    Unusable(String),
}

/// The agent's own name: a port it holds is a running agent, expected when doctor runs beside it.
const AGENT_COMMAND: &str = "lifecycle-agent";

/// A port the agent binds must be free, or held by a running agent.
pub fn check_port(role: PortRole, addr: SocketAddr, state: &PortState) -> Finding {
    let check = role.check();
    let holder_text = |holder: &Option<Holder>| match holder {
        Some(holder) => format!("{} (pid {})", holder.command, holder.pid),
        None => "another process".to_owned(),
    };
    match (role, state) {
        (PortRole::PodProbe, PortState::Free) => {
            Finding::ok(check, format!("{} free here (bound in each pod's network namespace)", addr.port()))
        }
        (_, PortState::Free) => Finding::ok(check, format!("{addr} free")),
        (_, PortState::InUse(Some(holder))) if holder.command == AGENT_COMMAND => {
            Finding::ok(check, format!("{addr} held by a running lifecycle-agent (pid {})", holder.pid))
        }
        (PortRole::PodProbe, PortState::InUse(holder)) => Finding::warn(
            check,
            format!("{} held here by {}", addr.port(), holder_text(holder)),
            "the agent binds it inside each pod's network namespace: a pod listening on it loses its probe \
             listener; pick another --pod-probe-port if pods use this one",
        ),
        (_, PortState::InUse(holder)) => Finding::missing(
            check,
            format!("{addr} held by {}", holder_text(holder)),
            format!("stop it, or give the agent another --{check}"),
        ),
        (_, PortState::Unusable(why)) => Finding::missing(
            check,
            format!("cannot bind {addr}: {why}"),
            format!("pass an address of this host to --{check}"),
        ),
    }
}

/// The inodes of the sockets listening on `port` in /proc/net/tcp or tcp6 text.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *fields.get(3)? == LISTEN).then_some(())?;
            fields.get(9)?.parse().ok()
        })
        .collect()
}

// ---- clock ----------------------------------------------------------------------------------

/// The agent turns kernel (CLOCK_BOOTTIME) times into wall times with REALTIME - BOOTTIME: that
/// difference is the boot time, which the kernel also reports (`btime` of /proc/stat).
pub fn check_clock(boot_ns: u64, realtime_ns: u64, btime_seconds: Option<u64>) -> Finding {
    const CHECK: &str = "clock";
    /// btime is whole seconds, and the two clocks are read a moment apart.
    const TOLERANCE_SECONDS: i64 = 2;
    /// 2001-09-09: a wall clock before it was never set.
    const SET_CLOCK_SECONDS: u64 = 1_000_000_000;
    if realtime_ns / 1_000_000_000 < SET_CLOCK_SECONDS {
        return Finding::missing(
            CHECK,
            format!("CLOCK_REALTIME reads {} s since 1970: the clock was never set", realtime_ns / 1_000_000_000),
            "set the clock (NTP): wall times of events would be wrong",
        );
    }
    let Some(boot_wall_ns) = realtime_ns.checked_sub(boot_ns) else {
        return Finding::missing(CHECK, "CLOCK_BOOTTIME is ahead of CLOCK_REALTIME", "set the clock (NTP)");
    };
    let boot_wall_seconds = boot_wall_ns / 1_000_000_000;
    let uptime = format!("up {} s, booted at Unix {boot_wall_seconds}", boot_ns / 1_000_000_000);
    match btime_seconds {
        Some(btime) if (boot_wall_seconds as i64 - btime as i64).abs() > TOLERANCE_SECONDS => Finding::warn(
            CHECK,
            format!("{uptime}, but /proc/stat says {btime}: the wall clock jumped since boot"),
            "wall times of past events shift with the clock; keep it synchronised (NTP)",
        ),
        Some(_) => Finding::ok(CHECK, format!("{uptime} (agrees with /proc/stat)")),
        None => Finding::ok(CHECK, uptime),
    }
}

/// What adjtimex(2) said about synchronisation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClockSync {
    /// Synchronised, with the kernel's maximum error estimate in microseconds.
    Synchronised { max_error_us: i64 },
    /// STA_UNSYNC set, or TIME_ERROR returned.
    Unsynchronised,
    /// The call failed (the error).
    Unknown(String),
}

/// An unsynchronised clock is not fatal: the agent's own timing is on CLOCK_BOOTTIME.
pub fn check_clock_sync(sync: &ClockSync) -> Finding {
    const CHECK: &str = "clock-sync";
    match sync {
        ClockSync::Synchronised { max_error_us } => {
            Finding::ok(CHECK, format!("synchronised (maximum error {} ms)", max_error_us / 1000))
        }
        ClockSync::Unsynchronised => Finding::warn(
            CHECK,
            "not synchronised (adjtimex: STA_UNSYNC)",
            "run an NTP client (chrony, systemd-timesyncd): event times in the API and events compare with other \
             nodes' only on synchronised clocks",
        ),
        ClockSync::Unknown(why) => Finding::warn(CHECK, format!("cannot tell: {why}"), "check `timedatectl`"),
    }
}
