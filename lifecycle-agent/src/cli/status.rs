//! `lifecycle-agent status`: asks a running agent for its containers and prints them the way
//! `kubectl get pods` users read things — one row per container, newest facts first.

use std::{fmt::Write as _, net::SocketAddr, path::PathBuf, sync::Arc};

use hyper_util::rt::TokioIo;
use rustls_pki_types::{pem::PemObject as _, CertificateDer, ServerName};
use serde_json::Value;
use tokio_rustls::{rustls, TlsConnector};

pub use crate::export::explain_html::percent_encoded;

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Nothing listens there, or the connection broke.
    #[error("cannot reach the agent at {addr} (is `lifecycle-agent run` running there?)")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The agent answered something other than 200.
    #[error("the agent at {addr} answered: {status_line}")]
    Status { addr: SocketAddr, status_line: String },
    /// The CA file could not be read.
    #[error("cannot read the CA certificates in {path}")]
    Ca {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The TLS setup or handshake failed (an untrusted or mismatched certificate).
    #[error("TLS with the agent at {addr} failed")]
    Tls {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How to reach the agent: plain HTTP, or HTTPS trusting the CA certificates in a PEM file (an
/// agent run with `--tls-cert-file`), for a certificate naming the server's address.
#[derive(Clone, Debug, Default)]
pub enum Transport {
    #[default]
    Plain,
    Tls {
        ca_file: PathBuf,
    },
}

impl Transport {
    /// Whether what is sent is encrypted.
    pub fn is_encrypted(&self) -> bool {
        matches!(self, Transport::Tls { .. })
    }
}

/// The JSON body of `GET /api/v1/containers`, sending `token` as a bearer token when given (an
/// agent run with `--api-auth kubernetes` asks for one).
pub async fn fetch(addr: SocketAddr, token: Option<&str>, transport: &Transport) -> Result<String, StatusError> {
    fetch_path(addr, "/api/v1/containers", token, transport).await
}

/// Largest answer read: a node's containers are a few MiB of JSON at most (1,000 are ~1 MiB).
const MAX_BODY: usize = 64 << 20;

/// The body of `GET <path_and_query>` (an `/api/v1/...` path the caller built from escaped
/// parts), as [`fetch`]. Asked with hyper's HTTP/1.1 client over one connection.
pub async fn fetch_path(
    addr: SocketAddr,
    path_and_query: &str,
    token: Option<&str>,
    transport: &Transport,
) -> Result<String, StatusError> {
    let connect = |source| StatusError::Connect { addr, source };
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(connect)?;
    match transport {
        Transport::Plain => get(TokioIo::new(stream), addr, path_and_query, token).await,
        Transport::Tls { ca_file } => {
            let mut roots = rustls::RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
                .and_then(|certs| certs.collect())
                .map_err(|source| StatusError::Ca { path: ca_file.clone(), source })?;
            let tls = |source| StatusError::Tls { addr, source };
            for cert in certs {
                roots.add(cert).map_err(|err| tls(std::io::Error::other(err)))?;
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|err| tls(std::io::Error::other(err)))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = ServerName::IpAddress(addr.ip().into());
            let stream = TlsConnector::from(Arc::new(config)).connect(name, stream).await.map_err(tls)?;
            get(TokioIo::new(stream), addr, path_and_query, token).await
        }
    }
}

/// One GET on `io`, its body if the answer is 200.
async fn get(
    io: impl hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    addr: SocketAddr,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<String, StatusError> {
    use http_body_util::{BodyExt as _, Empty, Limited};
    use hyper::header::{AUTHORIZATION, HOST};
    let broken = |err: Box<dyn std::error::Error + Send + Sync>| StatusError::Connect {
        addr,
        source: std::io::Error::other(err),
    };
    let mut request = hyper::Request::get(path_and_query).header(HOST, "lifecycle");
    if let Some(token) = token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::<bytes::Bytes>::new()).map_err(|err| broken(err.into()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.map_err(|err| broken(err.into()))?;
    let exchange = async move {
        let response = sender.send_request(request).await.map_err(|err| broken(err.into()))?;
        let status = response.status();
        if status != hyper::StatusCode::OK {
            let status_line = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or_default());
            return Err(StatusError::Status { addr, status_line });
        }
        let body = Limited::new(response.into_body(), MAX_BODY).collect().await.map_err(broken)?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
        // The sender is dropped here: the connection below ends.
    };
    // The connection does the I/O while the exchange waits on it; it ends once the answer is
    // read and the sender is gone (a failure of its own shows in the exchange).
    let (answer, _) = tokio::join!(exchange, connection);
    answer
}

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
}

/// How `status` prints, as `kubectl get -o` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// The table with the container id, pod uid, listening ports and disagreements (and the
    /// node, for answers from several agents).
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
    #[error("the agent's answer is not the expected JSON (no `now` and `containers`)")]
    NotTheApi,
    #[error("cannot write YAML")]
    Yaml(#[from] serde_saphyr::SerializeError),
    #[error("cannot write JSON")]
    Json(#[from] serde_json::Error),
}

/// The answers printed as `output` says: one table over every answer, rows sorted by
/// namespace, pod, container and node; for JSON and YAML, the document of one agent as it
/// answered, or of several as a list of `{node, answer}`.
pub fn render(answers: &[Answer<'_>], output: Output) -> Result<String, RenderError> {
    let document = || match answers {
        [Answer { node: None, body }] => (*body).clone(),
        _ => Value::Array(answers.iter().map(|a| serde_json::json!({"node": a.node, "answer": a.body})).collect()),
    };
    match output {
        Output::Json => Ok(format!("{}\n", serde_json::to_string_pretty(&document())?)),
        Output::Yaml => Ok(serde_saphyr::to_string(&document())?),
        Output::Table | Output::Wide => tables(answers, output == Output::Wide),
    }
}

/// The container table and, when any pod is listed, the pod table under it.
fn tables(answers: &[Answer<'_>], wide: bool) -> Result<String, RenderError> {
    let with_node = wide && answers.iter().any(|a| a.node.is_some());
    let mut containers: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut pods: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for answer in answers {
        let body = answer.body;
        let now = body.get("now").and_then(Value::as_u64).ok_or(RenderError::NotTheApi)?;
        let node = answer.node.unwrap_or_default().to_owned();
        for c in body.get("containers").and_then(Value::as_array).ok_or(RenderError::NotTheApi)? {
            let mut cells = row(c, now).to_vec();
            if wide {
                cells.extend(wide_cells(c));
            }
            if with_node {
                cells.push(node.clone());
            }
            let key = vec![text(c, "namespace"), text(c, "pod"), text(c, "container"), node.clone()];
            containers.push((key, cells));
        }
        for p in body.get("pods").and_then(Value::as_array).into_iter().flatten() {
            let mut cells = pod_row(p).to_vec();
            if wide {
                cells.push(text(p, "uid"));
            }
            if with_node {
                cells.push(node.clone());
            }
            pods.push((vec![text(p, "namespace"), text(p, "pod"), node.clone()], cells));
        }
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

/// Renders one agent's API body as an aligned table; None when the body is not the API's JSON.
pub fn render_table(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    render(&[Answer { node: None, body: &value }], Output::Table).ok()
}

const HEADERS: [&str; 8] =
    ["NAMESPACE", "POD", "CONTAINER", "STATE", "REASON", "RESTARTS", "LAST EXIT", "LAST TERMINATION"];

const WIDE_HEADERS: [&str; 4] = ["CONTAINER ID", "POD UID", "LISTENING", "DISAGREEMENTS"];

/// The wide columns: the id as `crictl ps` shortens it, the pod uid, ports with a listener
/// open now, and the kinds of the kubelet's disagreements with the kernel.
fn wide_cells(c: &Value) -> [String; 4] {
    let id: String = text(c, "container_id").chars().take(13).collect();
    let listening: Vec<&str> = c
        .get("tcp")
        .and_then(Value::as_object)
        .map(|ports| {
            ports
                .iter()
                .filter(|(_, stats)| stats.get("listeners").and_then(Value::as_i64).unwrap_or(0) > 0)
                .map(|(port, _)| port.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut disagreements: Vec<String> = c
        .get("disagreements")
        .and_then(Value::as_array)
        .map(|all| all.iter().map(|d| text(d, "kind")).collect())
        .unwrap_or_default();
    disagreements.dedup();
    let or_dash = |cell: String| if cell.is_empty() { "-".to_owned() } else { cell };
    [or_dash(id), or_dash(text(c, "uid")), or_dash(listening.join(",")), or_dash(disagreements.join(","))]
}

const POD_HEADERS: [&str; 5] = ["NAMESPACE", "POD", "PHASE", "API PHASE", "RUNNING"];

fn pod_row(p: &Value) -> [String; 5] {
    let count = |key: &str| p.get(key).and_then(Value::as_u64).unwrap_or(0);
    let api = text(p, "api_phase");
    [
        text(p, "namespace"),
        text(p, "pod"),
        text(p, "phase"),
        if api.is_empty() { "-".to_owned() } else { api },
        format!("{}/{}", count("running_containers"), count("containers")),
    ]
}

/// Rows under their headers, columns padded to their widest cell.
fn aligned(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let header_row: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
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

fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn row(c: &Value, now: u64) -> [String; 8] {
    let state = c.get("state").cloned().unwrap_or(Value::Null);
    let state_name = text(&state, "state");
    let (shown_state, reason) = match state_name.as_str() {
        "running" => {
            let since = state.get("started_at_boot_ns").and_then(Value::as_u64).map(|t| age(now.saturating_sub(t)));
            (format!("Running{}", since.map(|s| format!(" ({s})")).unwrap_or_default()), String::new())
        }
        "waiting" => ("Waiting".to_owned(), text(&state, "reason")),
        "terminated" => ("Terminated".to_owned(), text(&state, "reason")),
        other => (other.to_owned(), String::new()),
    };
    let last = match state_name.as_str() {
        "terminated" => Some(state.clone()),
        _ => c.get("last_state").filter(|s| !s.is_null()).cloned(),
    };
    let last_exit = last
        .map(|s| {
            let code = s.get("exit_code").and_then(Value::as_i64).unwrap_or(-1);
            let signal = s.get("signal").and_then(Value::as_u64).map(|n| format!(", {}", signal_name(n)));
            let when = s
                .get("finished_at_boot_ns")
                .and_then(Value::as_u64)
                .map(|t| format!(" {} ago", age(now.saturating_sub(t))));
            format!("{} ({code}{}){}", text(&s, "reason"), signal.unwrap_or_default(), when.unwrap_or_default())
        })
        .unwrap_or_else(|| "-".to_owned());
    let termination = c
        .get("last_termination")
        .and_then(|t| t.get("outcome"))
        .map(|o| {
            let kind = text(o, "kind");
            match kind.as_str() {
                "sigkilled_after_grace" => {
                    let after = o.get("stop_to_kill_ns").and_then(Value::as_u64).map(age).unwrap_or_default();
                    format!("SIGKILLED after {after} (grace violated)")
                }
                "sigkilled_early" => {
                    let after = o.get("stop_to_kill_ns").and_then(Value::as_u64).map(age).unwrap_or_default();
                    let grace = o.get("grace_ns").and_then(Value::as_u64).map(age).unwrap_or_default();
                    format!("SIGKILLED early, after {after} of {grace} grace (not the app's overrun)")
                }
                "exited_within_grace" => {
                    let ratio = o.get("grace_used_ratio").and_then(Value::as_f64).unwrap_or(0.0);
                    format!("exited within grace ({:.0}% used)", ratio * 100.0)
                }
                other => other.replace('_', " "),
            }
        })
        .map(|verdict| {
            let cause = c.get("last_termination").map(|t| text(t, "cause")).filter(|cause| !cause.is_empty());
            match cause {
                Some(cause) => format!("{verdict}; {}", cause.replace('_', " ")),
                None => verdict,
            }
        })
        .unwrap_or_else(|| "-".to_owned());
    [
        text(c, "namespace"),
        text(c, "pod"),
        text(c, "container"),
        shown_state,
        reason,
        c.get("restart_count").and_then(Value::as_u64).unwrap_or(0).to_string(),
        last_exit,
        termination,
    ]
}

/// `SIGKILL` for 9: the names people read in `kill -l`.
fn signal_name(signal: u64) -> String {
    const NAMES: [&str; 16] = [
        "", "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
        "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
    ];
    match usize::try_from(signal).ok().and_then(|n| NAMES.get(n)).filter(|n| !n.is_empty()) {
        Some(name) => (*name).to_owned(),
        None => format!("signal {signal}"),
    }
}

/// `kubectl`-style ages: 45s, 3m12s, 2h5m, 3d4h; sub-second as ms.
fn age(ns: u64) -> String {
    let ms = ns / crate::model::time::MILLISECOND;
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

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(250_000_000), "250ms");
        assert_eq!(age(3_200_000_000), "3.2s");
        assert_eq!(age(45_000_000_000), "45s");
        assert_eq!(age(192_000_000_000), "3m12s");
        assert_eq!(age(7_500_000_000_000), "2h5m");
        assert_eq!(age(273_600_000_000_000), "3d4h");
    }

    #[test]
    fn the_table_names_violations_and_back_off() {
        let body = serde_json::json!({
            "now": 100_000_000_000u64,
            "boot_to_unix_seconds": 0.0,
            "containers": [
                {"namespace": "shop", "pod": "web-1", "container": "app", "uid": "u", "restart_count": 4,
                 "state": {"state": "waiting", "reason": "CrashLoopBackOff", "message": ""},
                 "last_state": {"state": "terminated", "reason": "Error", "exit_code": 1, "finished_at_boot_ns": 90_000_000_000u64},
                 "last_termination": {"outcome": {"kind": "exited_without_stop_signal"}}},
                {"namespace": "shop", "pod": "db-0", "container": "db", "uid": "v", "restart_count": 0,
                 "state": {"state": "terminated", "reason": "Error", "exit_code": 137, "signal": 9, "finished_at_boot_ns": 99_000_000_000u64},
                 "last_termination": {"cause": "deleted", "outcome": {"kind": "sigkilled_after_grace", "stop_to_kill_ns": 30_000_000_000u64}}}
            ],
            "pods": [
                {"namespace": "shop", "pod": "web-1", "uid": "u", "phase": "Running", "api_phase": "Running",
                 "running_containers": 0, "containers": 1},
                {"namespace": "shop", "pod": "db-0", "uid": "v", "phase": "Failed", "api_phase": null,
                 "running_containers": 0, "containers": 1}
            ]
        })
        .to_string();
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
    }

    fn container(namespace: &str, pod: &str, name: &str) -> Value {
        serde_json::json!({"namespace": namespace, "pod": pod, "container": name, "uid": format!("uid-{pod}"),
            "container_id": "0123456789abcdef0123", "restart_count": 0,
            "state": {"state": "running", "started_at_boot_ns": 1_000_000_000u64},
            "tcp": {"8080": {"listeners": 1, "established": 0, "accepts": 0},
                    "9090": {"listeners": 0, "established": 0, "accepts": 3}},
            "disagreements": [{"kind": "exit_code", "container_id": "x", "kubelet": "1", "kernel": "2"},
                              {"kind": "exit_code", "container_id": "y", "kubelet": "1", "kernel": "2"}]})
    }

    #[test]
    fn rows_from_several_agents_are_sorted_and_wide_names_the_node() {
        let node_b = serde_json::json!({"now": 2_000_000_000u64, "containers": [container("shop", "web", "app")]});
        let node_a = serde_json::json!({"now": 2_000_000_000u64,
            "containers": [container("shop", "web", "sidecar"), container("kube-system", "dns", "coredns")]});
        let answers = [Answer { node: Some("node-b"), body: &node_b }, Answer { node: Some("node-a"), body: &node_a }];
        let table = render(&answers, Output::Table).expect("renders");
        let firsts: Vec<String> =
            table.lines().skip(1).map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).collect();
        assert_eq!(firsts, ["kube-system dns coredns", "shop web app", "shop web sidecar"], "{table}");
        assert!(!table.contains("NODE"), "the node column is for -o wide: {table}");
        let wide = render(&answers, Output::Wide).expect("renders");
        let header = wide.lines().next().expect("header");
        assert!(header.ends_with("CONTAINER ID   POD UID  LISTENING  DISAGREEMENTS  NODE"), "{wide}");
        let web = wide.lines().find(|l| l.contains(" app ")).expect("the app row");
        assert!(web.ends_with("0123456789abc  uid-web  8080       exit_code      node-b"), "{wide}");
    }

    #[test]
    fn json_and_yaml_carry_the_agents_document() {
        let body = serde_json::json!({"now": 1u64, "containers": [container("shop", "web", "app")]});
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
    fn the_selection_is_the_apis_query_escaped() {
        assert_eq!(Selection::default().path(), "/api/v1/containers");
        let selection = Selection { namespace: Some("shop".into()), pod: Some("web 1&x".into()), container: None };
        assert_eq!(selection.path(), "/api/v1/containers?namespace=shop&pod=web%201%26x");
        let selection = Selection { container: Some("app".into()), ..Selection::default() };
        assert_eq!(selection.path(), "/api/v1/containers?container=app");
    }
}
