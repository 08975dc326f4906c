//! The checks of what the agent talks to and binds: the CRI socket, the Kubernetes API and its
//! RBAC, the ports, and the clocks it converts times with. Pure functions over what
//! [`super::node`] read.

use std::{fmt::Write as _, net::SocketAddr, path::PathBuf};

use super::Finding;
use crate::model::{
    kubelet::{BackoffChoice, GateBasis, GateState, KubeletPolicy, KubeletSource},
    time::SECOND,
};

// ---- CRI socket -----------------------------------------------------------------------------

/// Where a CRI socket path comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocketOrigin {
    /// `--cri-socket`.
    Flag,
    /// One the agent tries by itself (containerd's, CRI-O's).
    Default,
    /// A distribution's path the agent does not try (k3s/RKE2, MicroK8s).
    Distribution,
}

/// The k3s/RKE2 and MicroK8s containerd sockets.
pub(crate) const DISTRIBUTION_SOCKETS: [&str; 2] =
    ["/run/k3s/containerd/containerd.sock", "/var/snap/microk8s/common/run/containerd.sock"];

/// What one socket path gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SocketState {
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
pub(crate) struct SocketProbe {
    pub path: PathBuf,
    pub origin: SocketOrigin,
    pub state: SocketState,
}

/// The socket the agent would use answers; else which flag makes it find one.
pub(crate) fn check_cri(probes: &[SocketProbe]) -> Finding {
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
pub(crate) struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
}

impl Permission {
    /// `list pods`, `create tokenreviews.authentication.k8s.io`.
    pub(crate) fn spelling(self) -> String {
        if self.group.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}.{}", self.verb, self.resource, self.group)
        }
    }
}

/// What deploy/rbac.yaml grants and the agent uses: its node's pods (list, watch), its Node
/// (get: the kubelet's release), tokens and access checks for `--api-auth kubernetes`, events
/// (events.k8s.io, kube's recorder) for `--events`.
pub(crate) const PERMISSIONS: [Permission; 8] = [
    Permission { verb: "list", group: "", resource: "pods" },
    Permission { verb: "watch", group: "", resource: "pods" },
    Permission { verb: "get", group: "", resource: "nodes" },
    // The kubelet's Killing and Evicted events: the cause of a probe kill, a resize, an eviction.
    Permission { verb: "list", group: "", resource: "events" },
    Permission { verb: "watch", group: "", resource: "events" },
    Permission { verb: "create", group: "authentication.k8s.io", resource: "tokenreviews" },
    Permission { verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews" },
    Permission { verb: "create", group: "events.k8s.io", resource: "events" },
];

/// What the API said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ApiReach {
    /// No in-cluster account, no kubeconfig.
    NotConfigured,
    /// Credentials exist but listing this node's pods failed (the error).
    Failed { node: String, why: String },
    /// This node's pods were listed; each permission's answer (Err: the review failed).
    Reached { node: String, answers: Vec<(Permission, Result<bool, String>)> },
}

/// Pod specs and status make the verdicts exact; without the API the agent falls back to the
/// runtime's labels, which is right on a plain host and a loss on a node.
pub(crate) fn check_kubernetes(reach: &ApiReach) -> Finding {
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

// ---- kubelet --------------------------------------------------------------------------------

/// What the agent would judge this node's kubelet by: its release, its restart back-off and the
/// gates that change the rules, and where each came from. Without a kubelet and without the API
/// (a plain host) there is nothing to judge by.
pub(crate) fn check_kubelet(policy: &KubeletPolicy, api_configured: bool) -> Finding {
    const CHECK: &str = "kubelet";
    let facts = &policy.facts;
    if facts.source == KubeletSource::NotFound && !api_configured {
        return Finding::skip(CHECK, "no kubelet process and no Kubernetes API: a plain host");
    }
    let mut found = match policy.version() {
        Some(version) => format!("{version} (Node object)"),
        None => "release unknown".to_owned(),
    };
    match &policy.backoff {
        BackoffChoice::Known { policy: backoff } => {
            let cap = facts.config.as_ref().and_then(|c| c.max_container_restart_period_ns);
            let _ = write!(
                found,
                "; back-off {}s doubling to {}s (crashLoopBackOff.maxContainerRestartPeriod {})",
                backoff.initial_ns as f64 / SECOND as f64,
                backoff.max_ns as f64 / SECOND as f64,
                cap.map_or_else(|| "not set".to_owned(), |ns| format!("{}s", ns as f64 / SECOND as f64)),
            );
        }
        BackoffChoice::Unknown { why } => {
            let _ = write!(found, "; back-off not known, restarts after a container's first not judged: {why}");
        }
    }
    let gate = |state: &GateState| {
        let value = match state.enabled {
            Some(true) => "on",
            Some(false) => "off",
            None => "?",
        };
        let basis = match state.basis {
            GateBasis::Configured => "configured",
            GateBasis::AgentFlag => "agent flag",
            GateBasis::ReleaseDefault => "release default",
            GateBasis::NotInRelease => "not in release",
            GateBasis::OnSinceKnownRelease => "on since a known release",
            GateBasis::SameInEveryKnownRelease => "every release",
            GateBasis::ConfigurationUnread => "configuration unread",
            GateBasis::Unknown => "unknown",
        };
        format!("{}={value} ({basis})", state.gate.as_str())
    };
    let _ = write!(found, "; gates {}", policy.gates.iter().map(gate).collect::<Vec<_>>().join(", "));
    let _ = write!(found, "; read from {} ({})", facts.source.as_str(), facts.origin);
    match (&policy.backoff, policy.version(), facts.source) {
        (BackoffChoice::Unknown { .. }, _, KubeletSource::NotFound) => Finding::warn(
            CHECK,
            found,
            "run the agent in the host's PID namespace (hostPID, as deploy/daemonset.yaml does), or state the \
             back-off with --max-container-restart-period / --reduced-backoff-decay",
        ),
        (BackoffChoice::Unknown { .. }, None, _) => Finding::warn(
            CHECK,
            found,
            "grant the agent `get nodes` (deploy/rbac.yaml) so it knows the kubelet's release, or state the \
             back-off with --max-container-restart-period / --reduced-backoff-decay",
        ),
        (BackoffChoice::Unknown { .. }, Some(_), _) => Finding::warn(
            CHECK,
            found,
            "let the agent read the kubelet's configuration files (CAP_SYS_PTRACE reads /proc/<pid>/root), or \
             state the back-off with --max-container-restart-period / --reduced-backoff-decay",
        ),
        (BackoffChoice::Known { .. }, None, _) if api_configured => Finding::warn(
            CHECK,
            found,
            "grant the agent `get nodes` (deploy/rbac.yaml): rules that changed between releases are judged only \
             where every release agrees",
        ),
        _ => Finding::ok(CHECK, found),
    }
}

// ---- ports ----------------------------------------------------------------------------------

/// Which of the agent's listeners a port is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortRole {
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
pub(crate) struct Holder {
    pub pid: u32,
    pub command: String,
}

/// What binding a port gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PortState {
    Free,
    /// In use, by this process if it could be found.
    InUse(Option<Holder>),
    /// Binding failed otherwise (the error: no such address, permission).
    Unusable(String),
}

/// The agent's own name: a port it holds is a running agent, expected when doctor runs beside it.
const AGENT_COMMAND: &str = "lifecycle-agent";

/// A port the agent binds must be free, or held by a running agent.
pub(crate) fn check_port(role: PortRole, addr: SocketAddr, state: &PortState) -> Finding {
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
pub(crate) fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
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
pub(crate) fn check_clock(boot_ns: u64, realtime_ns: u64, btime_seconds: Option<u64>) -> Finding {
    const CHECK: &str = "clock";
    /// btime is whole seconds, and the two clocks are read a moment apart.
    const TOLERANCE_SECONDS: i64 = 2;
    /// 2001-09-09: a wall clock before it was never set.
    const SET_CLOCK_SECONDS: u64 = 1_000_000_000;
    if realtime_ns / SECOND < SET_CLOCK_SECONDS {
        return Finding::missing(
            CHECK,
            format!("CLOCK_REALTIME reads {} s since 1970: the clock was never set", realtime_ns / SECOND),
            "set the clock (NTP): wall times of events would be wrong",
        );
    }
    let Some(boot_wall_ns) = realtime_ns.checked_sub(boot_ns) else {
        return Finding::missing(CHECK, "CLOCK_BOOTTIME is ahead of CLOCK_REALTIME", "set the clock (NTP)");
    };
    let boot_wall_seconds = boot_wall_ns / SECOND;
    let uptime = format!("up {} s, booted at Unix {boot_wall_seconds}", boot_ns / SECOND);
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
pub(crate) enum ClockSync {
    /// Synchronised, with the kernel's maximum error estimate in microseconds.
    Synchronised { max_error_us: i64 },
    /// STA_UNSYNC set, or TIME_ERROR returned.
    Unsynchronised,
    /// The call failed (the error).
    Unknown(String),
}

/// An unsynchronised clock is not fatal: the agent's own timing is on CLOCK_BOOTTIME.
pub(crate) fn check_clock_sync(sync: &ClockSync) -> Finding {
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
