//! The `status` table: one row per container, the way `kubectl get pods` users read things,
//! newest facts first, from one agent's answer or from several (the plugin's). Read through the
//! API's own types; every cell from an agent is made safe for a terminal.

use std::fmt::Write as _;

use serde::Deserialize as _;
use serde_json::Value;

use lifecycle_model::{
    container_state::ContainerState,
    explain::accept_stalls,
    node::{ContainerView, PodView},
    termination::TerminationOutcome,
    time::BootTime,
    wire::{percent_encoded, ContainersResponse},
};

use crate::text::{json_safe, terminal_safe};

/// Which containers `status` asks for: the selection `/api/v1/containers` takes (the agent
/// filters, so a client after one pod is not sent the whole node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

impl Selection {
    /// `/api/v1/containers` with this selection as its query, each value percent-encoded.
    pub fn path(&self) -> String {
        let pairs: Vec<String> = [("namespace", &self.namespace), ("pod", &self.pod), ("container", &self.container)]
            .into_iter()
            .filter_map(|(key, value)| value.as_deref().map(|value| format!("{key}={}", percent_encoded(value))))
            .collect();
        match pairs.is_empty() {
            true => "/api/v1/containers".to_owned(),
            false => format!("/api/v1/containers?{}", pairs.join("&")),
        }
    }

    /// [`Self::path`] asking the agent to answer when the selection changes from
    /// `resource_version` (an earlier answer's), or after `seconds` with the answer as it stands.
    pub fn waiting_path(&self, resource_version: &str, seconds: u64) -> String {
        let path = self.path();
        let separator = if path.contains('?') { '&' } else { '?' };
        format!("{path}{separator}wait_seconds={seconds}&resource_version={}", percent_encoded(resource_version))
    }
}

/// How `status` prints, as `kubectl get -o` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// The table with the container id, pod uid, listening ports, accept stalls and
    /// disagreements (and the node, for answers from several agents).
    Wide,
    /// The agent's JSON.
    Json,
    /// The same document as YAML.
    Yaml,
}

/// One agent's answer to `GET /api/v1/containers`, and the node it came from when the caller
/// asked several (the kubectl plugin).
#[derive(Clone, Copy, Debug)]
pub struct Answer<'a> {
    pub node: Option<&'a str>,
    pub body: &'a Value,
}

/// Why answers could not be printed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// An answer does not read as `/api/v1/containers`' body.
    #[error("the agent's answer is not the API's JSON")]
    NotTheApi(#[source] serde_json::Error),
    /// The YAML writer failed.
    #[error("cannot write YAML")]
    Yaml(#[from] serde_saphyr::SerializeError),
    /// The JSON writer failed.
    #[error("cannot write JSON")]
    Json(#[from] serde_json::Error),
}

/// The answers printed as `output` says: one table over every answer, rows sorted by
/// namespace, pod, container and node; for JSON and YAML, the document of one agent as it
/// answered (fields this client does not know included), or of several as a list of
/// `{node, answer}`. A table with no row is empty: see [`nothing_found`].
pub fn render(answers: &[Answer<'_>], output: Output) -> Result<String, RenderError> {
    let document = || match answers {
        [Answer { node: None, body }] => (*body).clone(),
        _ => Value::Array(answers.iter().map(|a| serde_json::json!({"node": a.node, "answer": a.body})).collect()),
    };
    match output {
        Output::Json => Ok(format!("{}\n", json_safe(&serde_json::to_string_pretty(&document())?))),
        // YAML may carry a pod's strings as they are: made safe for a terminal, lines kept.
        Output::Yaml => Ok(terminal_safe(&serde_saphyr::to_string(&document())?, true)),
        Output::Table | Output::Wide => tables(answers, output == Output::Wide),
    }
}

/// What kubectl says on stderr when a selection lists nothing (`No resources found in shop
/// namespace.`), for a table or wide output with no row; None otherwise.
pub fn nothing_found(answers: &[Answer<'_>], output: Output, namespace: Option<&str>) -> Option<String> {
    if !matches!(output, Output::Table | Output::Wide) {
        return None;
    }
    let empty = answers.iter().all(|a| {
        ContainersResponse::deserialize(a.body).is_ok_and(|body| body.containers.is_empty() && body.pods.is_empty())
    });
    empty.then(|| match namespace {
        Some(namespace) => format!("No resources found in {} namespace.", terminal_safe(namespace, false)),
        None => "No resources found".to_owned(),
    })
}

/// The container table and, when any pod is listed, the pod table under it: read through the
/// API's own types.
fn tables(answers: &[Answer<'_>], wide: bool) -> Result<String, RenderError> {
    let with_node = wide && answers.iter().any(|a| a.node.is_some());
    let mut containers: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut pods: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for answer in answers {
        let body = ContainersResponse::deserialize(answer.body).map_err(RenderError::NotTheApi)?;
        let node = answer.node.unwrap_or_default().to_owned();
        for c in &body.containers {
            let mut cells = row(c, body.now).to_vec();
            if wide {
                cells.extend(wide_cells(c, body.now));
            }
            if with_node {
                cells.push(node.clone());
            }
            let labels = &c.labels;
            let key = vec![labels.namespace.clone(), labels.pod.clone(), labels.container.clone(), node.clone()];
            containers.push((key, cells));
        }
        for p in &body.pods {
            let mut cells = pod_row(p).to_vec();
            if wide {
                cells.push(p.uid.clone());
            }
            if with_node {
                cells.push(node.clone());
            }
            pods.push((vec![p.namespace.clone(), p.pod.clone(), node.clone()], cells));
        }
    }
    if containers.is_empty() && pods.is_empty() {
        return Ok(String::new());
    }
    containers.sort();
    pods.sort();
    let mut headers = HEADERS.to_vec();
    let mut pod_headers = POD_HEADERS.to_vec();
    if wide {
        headers.extend(WIDE_HEADERS);
        pod_headers.push("UID");
    }
    if with_node {
        headers.push("NODE");
        pod_headers.push("NODE");
    }
    let mut out = aligned(&headers, containers.into_iter().map(|(_, cells)| cells));
    if !pods.is_empty() {
        out.push('\n');
        out.push_str(&aligned(&pod_headers, pods.into_iter().map(|(_, cells)| cells)));
    }
    Ok(out)
}

const HEADERS: [&str; 8] =
    ["NAMESPACE", "POD", "CONTAINER", "STATE", "REASON", "RESTARTS", "LAST EXIT", "LAST TERMINATION"];

const WIDE_HEADERS: [&str; 5] = ["CONTAINER ID", "POD UID", "LISTENING", "ACCEPT STALL", "DISAGREEMENTS"];

/// The wide columns: the id as `crictl ps` shortens it, the pod uid, ports with a listener
/// open now, a running container's accept stalls (connections waiting that the app does not
/// accept) and the kinds of the kubelet's disagreements with the kernel.
fn wide_cells(c: &ContainerView, now: BootTime) -> [String; 5] {
    let id: String = c.container_id.as_deref().unwrap_or_default().chars().take(13).collect();
    let listening: Vec<String> =
        c.tcp.iter().filter(|(_, stats)| stats.listeners > 0).map(|(port, _)| port.to_string()).collect();
    let mut disagreements: Vec<&str> = c.disagreements.iter().map(|d| d.kind.as_str()).collect();
    disagreements.dedup();
    let or_dash = |cell: String| if cell.is_empty() { "-".to_owned() } else { cell };
    [
        or_dash(id),
        or_dash(c.labels.uid.clone()),
        or_dash(listening.join(",")),
        or_dash(accept_stalls(c, now).join("; ")),
        or_dash(disagreements.join(",")),
    ]
}

const POD_HEADERS: [&str; 5] = ["NAMESPACE", "POD", "PHASE", "API PHASE", "RUNNING"];

fn pod_row(p: &PodView) -> [String; 5] {
    [
        p.namespace.clone(),
        p.pod.clone(),
        p.phase.as_str().to_owned(),
        p.api_phase.clone().unwrap_or_else(|| "-".to_owned()),
        format!("{}/{}", p.running_containers, p.containers),
    ]
}

/// Rows under their headers, columns padded to their widest cell.
fn aligned(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let header_row: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    // Cells come from the agents (pod and container names, the kubelet's words): no escape
    // sequence, no line break, reaches the terminal from one.
    let rows = rows.map(|cells| cells.iter().map(|cell| terminal_safe(cell, false)).collect());
    let rows: Vec<Vec<String>> = std::iter::once(header_row).chain(rows).collect();
    let mut widths = vec![0; headers.len()];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for cells in rows {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    }
    out
}

fn row(c: &ContainerView, now: BootTime) -> [String; 8] {
    let state = &c.status.state;
    let (shown_state, reason) = match state {
        ContainerState::Running { started_at } => (format!("Running ({})", age(now.since(*started_at))), String::new()),
        ContainerState::Waiting { reason, .. } => ("Waiting".to_owned(), reason.as_str().to_owned()),
        ContainerState::Terminated { reason, .. } => ("Terminated".to_owned(), reason.as_str().to_owned()),
    };
    let last = match state {
        ContainerState::Terminated { .. } => Some(state),
        _ => c.status.last_state.as_ref(),
    };
    let last_exit = match last {
        Some(ContainerState::Terminated { reason, exit_code, signal, finished_at, .. }) => {
            let signal = signal.map(|n| format!(", {}", lifecycle_model::signal::name(n.into()))).unwrap_or_default();
            let ago = age(now.since(*finished_at));
            format!("{} ({exit_code}{signal}) {ago} ago", reason.as_str())
        }
        _ => "-".to_owned(),
    };
    let termination = match &c.last_termination {
        Some(report) => {
            let stop = report.stop_signal.as_ref();
            let stop_name =
                stop.map_or_else(|| "the stop signal".to_owned(), |s| lifecycle_model::signal::name(s.signal.into()));
            let from = stop.map(|s| format!(" from {}", s.sender.describe())).unwrap_or_default();
            let killed_by_stop = stop.is_some_and(|s| report.exit_signal == Some(s.signal));
            let verdict = match &report.outcome {
                TerminationOutcome::ExitedWithinGrace { .. } | TerminationOutcome::ExitedAfterStopSignal { .. }
                    if killed_by_stop =>
                {
                    format!("killed by {stop_name}{from}")
                }
                TerminationOutcome::SigkilledAfterStopSignal { stop_to_kill_ns, .. } => {
                    format!("SIGKILLED {} after {stop_name}{from} (no grace applies)", age(*stop_to_kill_ns))
                }
                TerminationOutcome::ExitedAfterStopSignal { duration_ns } => {
                    format!("exited {} after {stop_name}{from}", age(*duration_ns))
                }
                TerminationOutcome::SigkilledAfterGrace { stop_to_kill_ns, .. } => {
                    format!("SIGKILLED after {} (grace violated)", age(*stop_to_kill_ns))
                }
                TerminationOutcome::SigkilledEarly { stop_to_kill_ns, grace_ns, .. } => format!(
                    "SIGKILLED early, after {} of {} grace (not the app's overrun)",
                    age(*stop_to_kill_ns),
                    age(*grace_ns)
                ),
                TerminationOutcome::ExitedWithinGrace { grace_used_ratio, .. } => {
                    format!("exited within grace ({:.0}% used)", grace_used_ratio * 100.0)
                }
                other => other.kind().as_str().replace('_', " "),
            };
            match report.cause {
                Some(cause) => format!("{verdict}; {}", cause.as_str().replace('_', " ")),
                None => verdict,
            }
        }
        None => "-".to_owned(),
    };
    [
        c.labels.namespace.clone(),
        c.labels.pod.clone(),
        c.labels.container.clone(),
        shown_state,
        reason,
        c.status.restart_count.to_string(),
        last_exit,
        termination,
    ]
}

/// `kubectl`-style ages: 45s, 3m12s, 2h5m, 3d4h; sub-second as ms.
fn age(ns: u64) -> String {
    let ms = ns / lifecycle_model::time::MILLISECOND;
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 if !ms.is_multiple_of(1000) && s < 10 => format!("{:.1}s", ms as f64 / 1000.0),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
