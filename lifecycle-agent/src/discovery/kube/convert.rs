//! Pod objects from the API decoded into the model's [`PodFacts`]: pure, so every field,
//! including the 1.33-1.35 ones an old API server does not serve (`restartPolicyRules`,
//! `lifecycle.stopSignal`, sidecar `restartPolicy`, RestartAllContainers), is tested with JSON
//! fixtures through this same path.
//!
//! A malformed field (an unknown restart policy, an unknown signal name) leaves that one fact at
//! its default and is reported, never failing the whole pod.

use k8s_openapi::{
    api::core::v1::{Container, ContainerState as ApiState, ContainerStatus, LifecycleHandler, Pod, Probe},
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::model::{
    container_state::{ExitCodeOperator, RestartPolicy, RestartRule, RestartRuleAction, RestartSpec},
    spec::{
        ContainerFacts, ContainerKind, Disruption, HttpProbe, PodFacts, ReportedContainer, ReportedPodStatus,
        ReportedState,
    },
    termination::PreStopHandler,
};

use crate::model::time::SECOND;

/// A field the agent could not use, with the pod's and the field's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecProblem {
    pub field: String,
    pub why: String,
}

/// Decodes one Pod; None when it has no uid (never the case for objects from a server).
pub fn pod_facts(pod: &Pod, problems: &mut Vec<SpecProblem>) -> Option<PodFacts> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone()?;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let restart_policy = match spec.and_then(|s| s.restart_policy.as_deref()) {
        None => RestartPolicy::Always,
        Some(raw) => restart_policy(raw).unwrap_or_else(|| {
            problems.push(problem("spec.restartPolicy", raw));
            RestartPolicy::Always
        }),
    };
    let mut containers = Vec::new();
    if let Some(spec) = spec {
        for c in spec.init_containers.iter().flatten() {
            containers.push(container_facts(c, true, restart_policy, problems));
        }
        for c in &spec.containers {
            containers.push(container_facts(c, false, restart_policy, problems));
        }
        for c in spec.ephemeral_containers.iter().flatten() {
            containers.push(ContainerFacts {
                name: c.name.clone(),
                kind: ContainerKind::Ephemeral,
                restart: RestartSpec {
                    pod_restart_policy: RestartPolicy::Never,
                    container_restart_policy: Some(RestartPolicy::Never),
                    ..RestartSpec::default()
                },
                stop_signal: None,
                pre_stop: None,
                liveness_grace_ns: None,
                startup_grace_ns: None,
                http_probes: Vec::new(),
            });
        }
    }
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let condition_true = |kind: &str| conditions.iter().find(|c| c.type_ == kind && c.status == "True");
    let condition = |kind: &str| conditions.iter().find(|c| c.type_ == kind).map(|c| c.status == "True");
    let disruption = match (status.and_then(|s| s.reason.as_deref()), condition_true("DisruptionTarget")) {
        (Some("Evicted"), _) => Some(Disruption::EvictedByKubelet),
        (Some("Terminated"), _) => Some(Disruption::NodeShutdown),
        (Some("DeadlineExceeded"), _) => Some(Disruption::DeadlineExceeded),
        (_, Some(target)) => match target.reason.as_deref() {
            Some("PreemptionByScheduler") | Some("PreemptionByKubeScheduler") => Some(Disruption::Preempted),
            Some("EvictionByEvictionAPI") => Some(Disruption::Evicted),
            Some("TerminationByKubelet") => Some(Disruption::EvictedByKubelet),
            _ => None,
        },
        _ => None,
    };
    let reported = status
        .map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
                .chain(s.ephemeral_container_statuses.iter().flatten())
                .map(|c| reported_container(c, problems))
                .collect()
        })
        .unwrap_or_default();
    Some(PodFacts {
        uid,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        restart_policy,
        grace_ns: spec.and_then(|s| s.termination_grace_period_seconds).map(seconds_ns),
        // A deletion is marked by its timestamp; the grace comes with it.
        deletion_grace_ns: meta
            .deletion_timestamp
            .as_ref()
            .map(|_| meta.deletion_grace_period_seconds.map(seconds_ns).unwrap_or(0)),
        disruption,
        restarting_all_containers: condition_true("AllContainersRestarting").is_some(),
        priority: spec.and_then(|s| s.priority),
        containers,
        reported_phase: status.and_then(|s| s.phase.clone()),
        reported,
        reported_status: ReportedPodStatus {
            ready_to_start_containers: condition("PodReadyToStartContainers"),
            initialized: condition("Initialized"),
            generation: meta.generation,
            observed_generation: status.and_then(|s| s.observed_generation),
        },
    })
}

fn container_facts(
    c: &Container,
    init: bool,
    pod_policy: RestartPolicy,
    problems: &mut Vec<SpecProblem>,
) -> ContainerFacts {
    let field = |name: &str| format!("{}.{name}", c.name);
    let container_restart_policy = c.restart_policy.as_deref().and_then(|raw| {
        let policy = restart_policy(raw);
        if policy.is_none() {
            problems.push(problem(&field("restartPolicy"), raw));
        }
        policy
    });
    let mut rules = Vec::new();
    for rule in c.restart_policy_rules.iter().flatten() {
        let Some(codes) = &rule.exit_codes else { continue };
        let operator = match codes.operator.as_str() {
            "In" => ExitCodeOperator::In,
            "NotIn" => ExitCodeOperator::NotIn,
            other => {
                problems.push(problem(&field("restartPolicyRules.exitCodes.operator"), other));
                continue;
            }
        };
        let action = match rule.action.as_str() {
            "Restart" => RestartRuleAction::Restart,
            "RestartAllContainers" => RestartRuleAction::RestartAllContainers,
            other => {
                problems.push(problem(&field("restartPolicyRules.action"), other));
                continue;
            }
        };
        rules.push(RestartRule { action, operator, values: codes.values.clone().unwrap_or_default() });
    }
    let kind = match (init, container_restart_policy) {
        (true, Some(RestartPolicy::Always)) => ContainerKind::Sidecar,
        (true, _) => ContainerKind::Init,
        (false, _) => ContainerKind::Regular,
    };
    let lifecycle = c.lifecycle.as_ref();
    let stop_signal = lifecycle.and_then(|l| l.stop_signal.as_deref()).and_then(|raw| {
        let signal = signal_number(raw);
        if signal.is_none() {
            problems.push(problem(&field("lifecycle.stopSignal"), raw));
        }
        signal
    });
    let probe_grace =
        |probe: &Option<Probe>| probe.as_ref().and_then(|p| p.termination_grace_period_seconds).map(seconds_ns);
    let http_probes = [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
        .into_iter()
        .flatten()
        .filter_map(|probe| {
            let get = probe.http_get.as_ref()?;
            let port = match &get.port {
                IntOrString::Int(n) => u16::try_from(*n).ok()?,
                IntOrString::String(name) => c
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name))
                    .and_then(|p| u16::try_from(p.container_port).ok())?,
            };
            let path = get.path.as_deref().unwrap_or("/");
            // The path becomes a declaration and a `check` label value: bounded like the
            // annotation's entries, and refused (with the reason) past that.
            if path.len() > MAX_PROBE_PATH_BYTES {
                problems.push(SpecProblem {
                    field: field("httpGet.path"),
                    why: format!("longer than {MAX_PROBE_PATH_BYTES} bytes; not declared"),
                });
                return None;
            }
            Some(HttpProbe { port, path: path.to_owned() })
        })
        .collect();
    ContainerFacts {
        name: c.name.clone(),
        kind,
        restart: RestartSpec {
            pod_restart_policy: pod_policy,
            container_restart_policy,
            restart_policy_rules: rules,
            is_init_container: init,
            pod_terminating: false,
        },
        stop_signal,
        pre_stop: lifecycle.and_then(|l| l.pre_stop.as_ref()).and_then(pre_stop),
        liveness_grace_ns: probe_grace(&c.liveness_probe),
        startup_grace_ns: probe_grace(&c.startup_probe),
        http_probes,
    }
}

fn pre_stop(handler: &LifecycleHandler) -> Option<PreStopHandler> {
    if let Some(exec) = &handler.exec {
        return Some(PreStopHandler::Exec { command: exec.command.clone().unwrap_or_default() });
    }
    if let Some(sleep) = &handler.sleep {
        return Some(PreStopHandler::Sleep { seconds: u64::try_from(sleep.seconds).unwrap_or(0) });
    }
    if handler.http_get.is_some() {
        return Some(PreStopHandler::HttpGet);
    }
    handler.tcp_socket.as_ref().map(|_| PreStopHandler::TcpSocket)
}

fn reported_container(c: &ContainerStatus, problems: &mut Vec<SpecProblem>) -> ReportedContainer {
    ReportedContainer {
        name: c.name.clone(),
        restart_count: u32::try_from(c.restart_count).unwrap_or(0),
        state: c.state.as_ref().and_then(reported_state),
        last_state: c.last_state.as_ref().and_then(reported_state),
        stop_signal: c.stop_signal.as_deref().and_then(|raw| {
            let signal = signal_number(raw);
            if signal.is_none() {
                problems.push(problem(&format!("status.{}.stopSignal", c.name), raw));
            }
            signal
        }),
        container_id: c.container_id.as_deref().map(strip_runtime_prefix),
    }
}

fn reported_state(state: &ApiState) -> Option<ReportedState> {
    if let Some(t) = &state.terminated {
        return Some(ReportedState::Terminated {
            reason: t.reason.clone().unwrap_or_default(),
            exit_code: t.exit_code,
            signal: t.signal,
            container_id: t.container_id.as_deref().map(strip_runtime_prefix),
        });
    }
    if state.running.is_some() {
        return Some(ReportedState::Running);
    }
    state.waiting.as_ref().map(|w| ReportedState::Waiting { reason: w.reason.clone().unwrap_or_default() })
}

/// `containerd://c0ffee` -> `c0ffee`: the API prefixes ids with the runtime's name.
fn strip_runtime_prefix(id: &str) -> String {
    id.split_once("://").map_or(id, |(_, bare)| bare).to_owned()
}

fn restart_policy(raw: &str) -> Option<RestartPolicy> {
    match raw {
        "Always" => Some(RestartPolicy::Always),
        "OnFailure" => Some(RestartPolicy::OnFailure),
        "Never" => Some(RestartPolicy::Never),
        _ => None,
    }
}

/// `SIGTERM` -> 15: the API's signal names (x86-64 and arm64 Linux numbers agree for these).
pub fn signal_number(name: &str) -> Option<u8> {
    const NAMES: [(&str, u8); 31] = [
        ("SIGHUP", 1),
        ("SIGINT", 2),
        ("SIGQUIT", 3),
        ("SIGILL", 4),
        ("SIGTRAP", 5),
        ("SIGABRT", 6),
        ("SIGBUS", 7),
        ("SIGFPE", 8),
        ("SIGKILL", 9),
        ("SIGUSR1", 10),
        ("SIGSEGV", 11),
        ("SIGUSR2", 12),
        ("SIGPIPE", 13),
        ("SIGALRM", 14),
        ("SIGTERM", 15),
        ("SIGSTKFLT", 16),
        ("SIGCHLD", 17),
        ("SIGCONT", 18),
        ("SIGSTOP", 19),
        ("SIGTSTP", 20),
        ("SIGTTIN", 21),
        ("SIGTTOU", 22),
        ("SIGURG", 23),
        ("SIGXCPU", 24),
        ("SIGXFSZ", 25),
        ("SIGVTALRM", 26),
        ("SIGPROF", 27),
        ("SIGWINCH", 28),
        ("SIGIO", 29),
        ("SIGPWR", 30),
        ("SIGSYS", 31),
    ];
    if let Some(offset) = name.strip_prefix("SIGRTMIN+") {
        return offset.parse::<u8>().ok().filter(|n| *n <= 30).map(|n| 34 + n);
    }
    if let Some(offset) = name.strip_prefix("SIGRTMAX-") {
        return offset.parse::<u8>().ok().filter(|n| *n <= 30).map(|n| 64 - n);
    }
    match name {
        "SIGRTMIN" => Some(34),
        "SIGRTMAX" => Some(64),
        _ => NAMES.iter().find(|(n, _)| *n == name).map(|(_, number)| *number),
    }
}

fn seconds_ns(seconds: i64) -> u64 {
    u64::try_from(seconds).unwrap_or(0).saturating_mul(SECOND)
}

/// Longest `httpGet.path` taken as a probe declaration (a pod's whole annotation may be 4 KiB).
pub(crate) const MAX_PROBE_PATH_BYTES: usize = 512;

/// A field whose value is not understood; the value is quoted escaped and cut to 64 characters
/// (it reaches the logs, and the pod chose it).
fn problem(field: &str, value: &str) -> SpecProblem {
    let shown: String = value.chars().take(64).collect();
    let cut = if shown.len() < value.len() { "..." } else { "" };
    SpecProblem { field: field.to_owned(), why: format!("unknown value {shown:?}{cut}") }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
