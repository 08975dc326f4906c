//! `lifecycle-agent status`: asks a running agent for its containers and prints them the way
//! `kubectl get pods` users read things — one row per container, newest facts first.

use std::{fmt::Write as _, net::SocketAddr, path::PathBuf, sync::Arc};

use rustls_pki_types::{pem::PemObject as _, CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_rustls::{rustls, TlsConnector};

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

/// The body of `GET <path_and_query>` (an `/api/v1/...` path the caller built from escaped
/// parts), as [`fetch`].
pub async fn fetch_path(
    addr: SocketAddr,
    path_and_query: &str,
    token: Option<&str>,
    transport: &Transport,
) -> Result<String, StatusError> {
    let connect = |source| StatusError::Connect { addr, source };
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(connect)?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: lifecycle\r\n{authorization}\r\n");
    let response = match transport {
        Transport::Plain => exchange(stream, &request).await.map_err(connect)?,
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
            exchange(stream, &request).await.map_err(connect)?
        }
    };
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status_line = head.lines().next().unwrap_or_default().to_owned();
    if !status_line.contains(" 200 ") {
        return Err(StatusError::Status { addr, status_line });
    }
    Ok(body.to_owned())
}

/// Sends `request` and reads the whole answer (HTTP/1.0: the server closes when done).
async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &str) -> std::io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // A TLS peer that closes without close_notify still sent everything before: keep it.
    match stream.read_to_end(&mut response).await {
        Ok(_) => Ok(response),
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => Ok(response),
        Err(err) => Err(err),
    }
}

const HEADERS: [&str; 8] =
    ["NAMESPACE", "POD", "CONTAINER", "STATE", "REASON", "RESTARTS", "LAST EXIT", "LAST TERMINATION"];

/// Renders the API body as an aligned table; None when the body is not the API's JSON.
pub fn render_table(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    let now = value.get("now")?.as_u64()?;
    let rows: Vec<[String; 8]> = value.get("containers")?.as_array()?.iter().map(|c| row(c, now)).collect();
    let mut out = aligned(&HEADERS, &rows);
    let pods: Vec<[String; 5]> =
        value.get("pods").and_then(Value::as_array).map(|pods| pods.iter().map(pod_row).collect()).unwrap_or_default();
    if !pods.is_empty() {
        out.push('\n');
        out.push_str(&aligned(&POD_HEADERS, &pods));
    }
    Some(out)
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
fn aligned<const N: usize>(headers: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = headers.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for cells in std::iter::once(headers.map(str::to_owned)).chain(rows.iter().cloned()) {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
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
    let ms = ns / 1_000_000;
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
        assert!(
            lines[1].contains("Waiting")
                && lines[1].contains("CrashLoopBackOff")
                && lines[1].contains("Error (1) 10s ago"),
            "{table}"
        );
        assert!(lines[4].starts_with("NAMESPACE  POD    PHASE    API PHASE  RUNNING"), "{table}");
        assert_eq!(lines[6], "shop       db-0   Failed   -          0/1", "{table}");
        assert!(
            lines[2].contains("SIGKILLED after 30s (grace violated); deleted")
                && lines[2].contains("Error (137, SIGKILL) 1s ago"),
            "{table}"
        );
        assert_eq!(render_table("not json"), None);
    }
}
