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
mod tests {
    use super::*;

    /// Renders one agent's API body as an aligned table; None when the body is not the API's JSON.
    fn render_table(body: &str) -> Option<String> {
        let value: Value = serde_json::from_str(body).ok()?;
        render(&[Answer { node: None, body: &value }], Output::Table).ok()
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(250_000_000), "250ms");
        assert_eq!(age(3_200_000_000), "3.2s");
        assert_eq!(age(45_000_000_000), "45s");
        assert_eq!(age(192_000_000_000), "3m12s");
        assert_eq!(age(7_500_000_000_000), "2h5m");
        assert_eq!(age(273_600_000_000_000), "3d4h");
    }

    use lifecycle_testkit::fixtures::{container_view, termination_report};

    use lifecycle_model::{
        container_state::{TerminatedReason, WaitingReason},
        node::{Disagreement, DisagreementKind, PodConditions, PodPhase, PortStats},
        spec::StopCause,
        termination::TerminationReport,
        time::SECOND,
        wire::{at::WallClock, with_clock::WithClock},
    };

    /// An agent's answer at `now_s` seconds after boot, as the agent writes it.
    fn answer(now_s: u64, containers: Vec<ContainerView>, pods: Vec<PodView>) -> Value {
        let body = ContainersResponse {
            boot_to_unix_seconds: 0.0,
            now: BootTime::from_ns(now_s * SECOND),
            resource_version: String::new(),
            containers,
            pods,
        };
        serde_json::to_value(WithClock::new(&body, WallClock::from_offset_seconds(0.0))).expect("serializes")
    }

    fn terminated(exit_code: i32, signal: Option<u8>, finished_s: u64) -> ContainerState {
        ContainerState::Terminated {
            reason: TerminatedReason::Error,
            exit_code,
            signal,
            started_at: None,
            finished_at: BootTime::from_ns(finished_s * SECOND),
        }
    }

    fn pod(name: &str, phase: PodPhase, api_phase: Option<&str>) -> PodView {
        PodView {
            namespace: "shop".into(),
            pod: name.into(),
            uid: format!("uid-{name}"),
            phase,
            api_phase: api_phase.map(str::to_owned),
            running_containers: 0,
            containers: 1,
            conditions: PodConditions::default(),
            api_status: None,
        }
    }

    #[test]
    fn the_table_names_violations_and_back_off() {
        let mut web = container_view(
            "shop",
            "web-1",
            "app",
            ContainerState::Waiting { reason: WaitingReason::CrashLoopBackOff, message: String::new() },
        );
        web.status.restart_count = 4;
        web.status.last_state = Some(terminated(1, None, 90));
        let exited = TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(1), signal: None };
        web.last_termination = Some(termination_report(exited, BootTime::from_ns(90 * SECOND)));
        let mut db = container_view("shop", "db-0", "db", terminated(137, Some(9), 99));
        let killed = TerminationOutcome::SigkilledAfterGrace {
            grace_ns: 30 * SECOND,
            stop_to_kill_ns: 30 * SECOND,
            expected_kill_after_ns: 30 * SECOND,
            sender: None,
            accepts_after_stop: 0,
            still_listening: false,
        };
        db.last_termination = Some(TerminationReport {
            cause: Some(StopCause::Deleted),
            ..termination_report(killed, BootTime::from_ns(99 * SECOND))
        });
        let pods = vec![pod("web-1", PodPhase::Running, Some("Running")), pod("db-0", PodPhase::Failed, None)];
        let body = answer(100, vec![web, db], pods).to_string();
        let table = render_table(&body).expect("renders");
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE  POD    CONTAINER  STATE"), "{table}");
        // Sorted by namespace, pod and container: db-0 before web-1.
        assert!(
            lines[2].contains("Waiting")
                && lines[2].contains("CrashLoopBackOff")
                && lines[2].contains("Error (1) 10s ago"),
            "{table}"
        );
        assert!(lines[4].starts_with("NAMESPACE  POD    PHASE    API PHASE  RUNNING"), "{table}");
        assert_eq!(lines[5], "shop       db-0   Failed   -          0/1", "{table}");
        assert!(
            lines[1].contains("SIGKILLED after 30s (grace violated); deleted")
                && lines[1].contains("Error (137, SIGKILL) 1s ago"),
            "{table}"
        );
        assert_eq!(render_table("not json"), None);
        // The README shows this very table (issue 41: its sample had drifted from the output).
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README");
        let shown = format!("```\n{}\n```", table.trim_end());
        assert!(readme.contains(&shown), "README.md's sample status table is not the output; it is:\n{shown}");
    }

    #[test]
    fn a_unit_killed_by_a_plain_kill_names_the_signal_and_its_sender_never_no_stop_signal() {
        use lifecycle_model::termination::{SignalSender, StopRules, StopSignalSeen};
        let mut unit = container_view("host", "", "/t", terminated(143, Some(15), 99));
        let killed = TerminationOutcome::ExitedAfterStopSignal { duration_ns: 1_000_000 };
        unit.last_termination = Some(TerminationReport {
            rules: StopRules::Unmanaged,
            exit_signal: Some(15),
            stop_signal: Some(StopSignalSeen {
                time: BootTime::from_ns(99 * SECOND),
                signal: 15,
                sender: SignalSender::other("bash", 812),
                matches_configured: true,
            }),
            ..termination_report(killed, BootTime::from_ns(99 * SECOND))
        });
        let table = render_table(&answer(100, vec![unit], vec![]).to_string()).expect("renders");
        assert!(
            table.contains("Error (143, SIGTERM) 1s ago") && table.contains("killed by SIGTERM from `bash` (pid 812)"),
            "{table}"
        );
        assert!(!table.contains("without stop signal"), "{table}");
    }

    fn container(namespace: &str, pod: &str, name: &str) -> ContainerView {
        let mut view =
            container_view(namespace, pod, name, ContainerState::Running { started_at: BootTime::from_ns(SECOND) });
        view.container_id = Some("0123456789abcdef0123".into());
        view.tcp.insert(8080, PortStats { listeners: 1, ..PortStats::default() });
        view.tcp.insert(9090, PortStats { accepts: 3, ..PortStats::default() });
        let disagreement = |id: &str| Disagreement {
            kind: DisagreementKind::ExitCode,
            container_id: id.into(),
            kubelet: "1".into(),
            kernel: "2".into(),
        };
        view.disagreements = vec![disagreement("x"), disagreement("y")];
        view
    }

    #[test]
    fn rows_from_several_agents_are_sorted_and_wide_names_the_node() {
        let node_b = answer(2, vec![container("shop", "web", "app")], vec![]);
        let node_a =
            answer(2, vec![container("shop", "web", "sidecar"), container("kube-system", "dns", "coredns")], vec![]);
        let answers = [Answer { node: Some("node-b"), body: &node_b }, Answer { node: Some("node-a"), body: &node_a }];
        let table = render(&answers, Output::Table).expect("renders");
        let firsts: Vec<String> =
            table.lines().skip(1).map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(firsts, ["kube-system dns coredns", "shop web app", "shop web sidecar"], "{table}");
        assert!(!table.contains("NODE"), "the node column is for -o wide: {table}");
        let wide = render(&answers, Output::Wide).expect("renders");
        let header = wide.lines().next().expect("header");
        assert!(header.ends_with("CONTAINER ID   POD UID  LISTENING  ACCEPT STALL  DISAGREEMENTS  NODE"), "{wide}");
        let web = wide.lines().find(|l| l.contains(" app ")).expect("the app row");
        assert!(web.ends_with("0123456789abc  uid-web  8080       -             exit_code      node-b"), "{wide}");
    }

    #[test]
    fn json_and_yaml_carry_the_agents_document() {
        let body = answer(1, vec![container("shop", "web", "app")], vec![]);
        let one = render(&[Answer { node: None, body: &body }], Output::Json).expect("JSON");
        assert_eq!(serde_json::from_str::<Value>(&one).expect("parses"), body);
        let yaml = render(&[Answer { node: None, body: &body }], Output::Yaml).expect("YAML");
        assert!(yaml.contains("namespace: shop") && yaml.contains("container_id: 0123456789abcdef0123"), "{yaml}");
        let several = render(&[Answer { node: Some("n1"), body: &body }], Output::Json).expect("JSON");
        let several: Value = serde_json::from_str(&several).expect("parses");
        assert_eq!(several, serde_json::json!([{"node": "n1", "answer": body}]));
        let not_the_api = serde_json::json!({"containers": []});
        assert!(render(&[Answer { node: None, body: &not_the_api }], Output::Table).is_err());
    }

    #[test]
    fn names_and_reasons_from_an_answer_cannot_write_to_the_terminal() {
        // Issue 37: an agent's answers were printed raw by `status`.
        let mut view = container("shop\u{1b}]0;owned\u{7}", "web\u{1b}[2J", "app\n");
        view.labels.uid = "uid\u{9b}1m".into();
        let body = answer(2, vec![view], vec![pod("web\u{1b}[H", PodPhase::Running, Some("Run\u{1b}ning"))]);
        for output in [Output::Table, Output::Wide, Output::Json, Output::Yaml] {
            let shown = render(&[Answer { node: Some("node\u{1b}c"), body: &body }], output).expect("renders");
            assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{output:?}: {shown:?}");
        }
        let table = render(&[Answer { node: None, body: &body }], Output::Wide).expect("renders");
        assert!(table.contains("web\\u{1b}[2J") && table.contains("uid\\u{9b}1m"), "{table}");
        assert_eq!(table.lines().count(), 5, "no row is split by a newline in a name: {table}");
    }

    #[test]
    fn the_selection_is_the_apis_query_escaped() {
        assert_eq!(Selection::default().path(), "/api/v1/containers");
        let selection = Selection { namespace: Some("shop".into()), pod: Some("web 1&x".into()), container: None };
        assert_eq!(selection.path(), "/api/v1/containers?namespace=shop&pod=web%201%26x");
        let selection = Selection { container: Some("app".into()), ..Selection::default() };
        assert_eq!(selection.path(), "/api/v1/containers?container=app");
        assert_eq!(
            selection.waiting_path("17-4", 1),
            "/api/v1/containers?container=app&wait_seconds=1&resource_version=17-4"
        );
        assert_eq!(
            Selection::default().waiting_path("a&b", 30),
            "/api/v1/containers?wait_seconds=30&resource_version=a%26b"
        );
    }

    #[test]
    fn an_empty_selection_says_no_resources_found_as_kubectl_does() {
        // Issue 41 item 8: an empty selection printed only a header.
        let empty = answer(1, vec![], vec![]);
        let answers = [Answer { node: None, body: &empty }];
        assert_eq!(render(&answers, Output::Table).expect("renders"), "");
        assert_eq!(render(&answers, Output::Wide).expect("renders"), "");
        let said = nothing_found(&answers, Output::Table, Some("shop"));
        assert_eq!(said.as_deref(), Some("No resources found in shop namespace."));
        assert_eq!(nothing_found(&answers, Output::Wide, None).as_deref(), Some("No resources found"));
        assert_eq!(nothing_found(&answers, Output::Json, Some("shop")), None, "JSON and YAML print the document");
        let full = answer(1, vec![container("shop", "web", "app")], vec![]);
        assert_eq!(nothing_found(&[Answer { node: None, body: &full }], Output::Table, Some("shop")), None);
    }

    /// A running container (since 1 s) whose listener on 8080 holds `established - accepts`
    /// connections the app has not accepted, the last accept at `last_accept_s`.
    fn stalled(established: u64, accepts: u64, last_accept_s: Option<u64>) -> ContainerView {
        let mut view = container("shop", "web", "app");
        view.tcp.clear();
        view.tcp.insert(
            8080,
            PortStats {
                listeners: 1,
                established,
                accepts,
                last_accept_ns: last_accept_s.map(|s| s * SECOND),
                ..PortStats::default()
            },
        );
        view
    }

    #[test]
    fn an_accept_stall_shows_in_wide_and_in_explain() {
        // Issue 41 item 6: a listener with connections queued and none accepted showed only
        // `Running, LISTENING 8080`.
        let wide = |view: ContainerView| {
            let body = answer(100, vec![view], vec![]);
            render(&[Answer { node: None, body: &body }], Output::Wide).expect("renders")
        };
        let never = wide(stalled(3, 0, None));
        assert!(
            never.contains("port 8080: 3 connections waiting, none accepted since it started 99.0s ago"),
            "{never}"
        );
        let since = wide(stalled(5, 2, Some(60)));
        assert!(since.contains("port 8080: 3 connections waiting, none accepted for 40.0s"), "{since}");
        let keeping_up = wide(stalled(5, 5, Some(99)));
        assert!(!keeping_up.contains("waiting"), "{keeping_up}");
        let view = stalled(3, 0, Some(60));
        let stories =
            lifecycle_model::explain::explain_at(&[view], "shop", "web", None, BootTime::from_ns(100 * SECOND));
        let text = lifecycle_model::explain::render_text(&stories, None);
        assert!(text.contains("kernel  port 8080: 3 connections waiting, none accepted for 40.0s"), "{text}");
    }

    #[test]
    fn escapes_in_an_agents_answer_never_reach_the_terminal() {
        // Issue 37 item 9: terminal escapes from an agent's answers were printed raw by `status`.
        let mut view = container("shop", "web\u{1b}]0;owned\u{7}", "app\u{1b}[2J");
        view.labels.uid = "uid\r\u{9b}31m".into();
        let body = answer(2, vec![view], vec![]);
        let answers = [Answer { node: None, body: &body }];
        for output in [Output::Table, Output::Wide, Output::Yaml, Output::Json] {
            let shown = render(&answers, output).expect("renders");
            assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{output:?}: {shown:?}");
            // JSON and YAML escape in their own way; the tables say `\u{1b}`.
            if matches!(output, Output::Table | Output::Wide) {
                assert!(shown.contains("app\\u{1b}[2J"), "{output:?}: {shown}");
            }
        }
    }
}
