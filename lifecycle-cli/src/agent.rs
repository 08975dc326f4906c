//! Asking one agent directly (`lifecycle-agent status|explain --server`): the server named by
//! host name or address, resolved once; a deadline over the whole request, so an address that
//! never answers ends with a sentence, not a hang; plain HTTP or HTTPS trusting only a given CA;
//! the agent's own words when it refuses, with what to do about each refusal.

use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use hyper_util::rt::TokioIo;
use rustls_pki_types::{pem::PemObject as _, CertificateDer, ServerName};
use tokio::time::Instant;
use tokio_rustls::{rustls, TlsConnector};

use crate::text::one_line;

/// An agent's `--listen` as the user named it: `host:port`, `address:port` or `[v6]:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub host: String,
    pub port: u16,
}

/// A `--server` that is not `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not host:port (e.g. localhost:9890, 10.0.0.7:9890, [::1]:9890)")]
pub struct BadServer(String);

impl FromStr for Server {
    type Err = BadServer;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadServer(text.to_owned());
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.strip_suffix(']').ok_or_else(bad)?,
            None if host.contains(':') => return Err(bad()),
            None => host,
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self { host: host.to_owned(), port: port.parse().map_err(|_| bad())? })
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A [`Server`] with the addresses its name resolved to, tried in order.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub server: Server,
    pub addrs: Vec<SocketAddr>,
}

impl Resolved {
    /// Whether every address is a loopback one: what is sent there stays on this host.
    pub fn is_loopback(&self) -> bool {
        !self.addrs.is_empty() && self.addrs.iter().all(|addr| addr.ip().is_loopback())
    }
}

/// Why the agent could not be asked, or refused.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The host name did not resolve.
    #[error("cannot resolve {server}")]
    Resolve {
        server: Server,
        #[source]
        source: std::io::Error,
    },
    /// Nothing listens there, or the connection broke.
    #[error("cannot reach the agent at {server} (is `lifecycle-agent run` running there?)")]
    Connect {
        server: Server,
        #[source]
        source: std::io::Error,
    },
    /// The deadline passed before the answer was read.
    #[error("the agent at {server} did not answer within {}s ({stage})", timeout.as_secs_f64())]
    Timeout { server: Server, timeout: Duration, stage: Stage },
    /// The agent answered something other than 200: its own words, and what to do.
    #[error("the agent at {server} answered {code} {reason}{}{}", said(body), hint(*code).map(|h| format!(" ({h})")).unwrap_or_default())]
    Status { server: Server, code: u16, reason: String, body: String },
    /// The CA file could not be read.
    #[error("cannot read the CA certificates in {path}")]
    Ca {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The TLS setup or handshake failed (an untrusted or mismatched certificate).
    #[error("TLS with the agent at {server} failed")]
    Tls {
        server: Server,
        #[source]
        source: std::io::Error,
    },
}

/// `: <the body>` when the agent said something.
fn said(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

/// What to do about an agent's refusal, per status.
pub fn hint(code: u16) -> Option<&'static str> {
    match code {
        401 => Some(
            "the agent runs with --api-auth kubernetes and took no token from this request: give one with \
             --token-file, minted for the agents' audience: `kubectl create token lifecycle-reader -n \
             lifecycle-system --audience lifecycle-agent`",
        ),
        403 => Some(
            "the token's user may not read the agent's API: bind the lifecycle-api-reader ClusterRole to it \
             (RBAC, deploy/rbac.yaml)",
        ),
        503 => Some("the agent cannot reach the Kubernetes API server to check the token; try again shortly"),
        _ => None,
    }
}

/// Where a request was when its deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Connecting,
    Handshaking,
    Answering,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connecting => "no connection was made",
            Stage::Handshaking => "connected; the TLS handshake did not finish",
            Stage::Answering => "connected; no answer came",
        })
    }
}

/// How to reach the agent: plain HTTP, or HTTPS trusting the CA certificates in a PEM file (an
/// agent run with `--tls-cert-file`, or the CA of the certificate it made), for a certificate
/// naming the server as the user named it.
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

/// Largest answer read: a node's containers are a few MiB of JSON at most (1,000 are ~1 MiB).
const MAX_BODY: usize = 64 << 20;

/// Most of a refusal's body quoted in a message.
const MAX_SAID: usize = 300;

/// Resolves `server`'s name (a literal address resolves to itself), within `timeout`.
pub async fn resolve(server: &Server, timeout: Duration) -> Result<Resolved, AgentError> {
    let lookup = tokio::net::lookup_host((server.host.as_str(), server.port));
    let addrs = match tokio::time::timeout(timeout, lookup).await {
        Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
        Ok(Err(source)) => return Err(AgentError::Resolve { server: server.clone(), source }),
        Err(_) => return Err(AgentError::Timeout { server: server.clone(), timeout, stage: Stage::Connecting }),
    };
    if addrs.is_empty() {
        let source = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        return Err(AgentError::Resolve { server: server.clone(), source });
    }
    Ok(Resolved { server: server.clone(), addrs })
}

/// The body of `GET <path_and_query>` (an `/api/v1/...` path the caller built from escaped
/// parts), sending `token` as a bearer token when given, all within `timeout` (connecting, the
/// TLS handshake and the whole answer). Asked with hyper's HTTP/1.1 client over one connection.
pub async fn fetch(
    to: &Resolved,
    path_and_query: &str,
    token: Option<&str>,
    transport: &Transport,
    timeout: Duration,
) -> Result<String, AgentError> {
    let deadline = Instant::now() + timeout;
    let server = &to.server;
    let late = |stage| AgentError::Timeout { server: server.clone(), timeout, stage };
    let stream = tokio::time::timeout_at(deadline, connect(to)).await.map_err(|_| late(Stage::Connecting))??;
    match transport {
        Transport::Plain => tokio::time::timeout_at(deadline, get(TokioIo::new(stream), server, path_and_query, token))
            .await
            .map_err(|_| late(Stage::Answering))?,
        Transport::Tls { ca_file } => {
            let connector = tls_connector(server, ca_file)?;
            let tls = |source| AgentError::Tls { server: server.clone(), source };
            let name = match server.host.parse::<std::net::IpAddr>() {
                Ok(ip) => ServerName::IpAddress(ip.into()),
                Err(_) => ServerName::try_from(server.host.clone()).map_err(|err| tls(std::io::Error::other(err)))?,
            };
            let stream = tokio::time::timeout_at(deadline, connector.connect(name, stream))
                .await
                .map_err(|_| late(Stage::Handshaking))?
                .map_err(tls)?;
            tokio::time::timeout_at(deadline, get(TokioIo::new(stream), server, path_and_query, token))
                .await
                .map_err(|_| late(Stage::Answering))?
        }
    }
}

/// A connection to the first of `to`'s addresses that takes one.
async fn connect(to: &Resolved) -> Result<tokio::net::TcpStream, AgentError> {
    let mut last = None;
    for addr in &to.addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    let source = last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"));
    Err(AgentError::Connect { server: to.server.clone(), source })
}

/// A TLS client trusting only the CA certificates in `ca_file`.
fn tls_connector(server: &Server, ca_file: &PathBuf) -> Result<TlsConnector, AgentError> {
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
        .and_then(|certs| certs.collect())
        .map_err(|source| AgentError::Ca { path: ca_file.clone(), source })?;
    let tls = |source| AgentError::Tls { server: server.clone(), source };
    for cert in certs {
        roots.add(cert).map_err(|err| tls(std::io::Error::other(err)))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| tls(std::io::Error::other(err)))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One GET on `io`: its body if the answer is 200, else the agent's words.
async fn get(
    io: impl hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    server: &Server,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<String, AgentError> {
    use http_body_util::{BodyExt as _, Empty, Limited};
    use hyper::header::{AUTHORIZATION, HOST};
    let broken = |err: Box<dyn std::error::Error + Send + Sync>| AgentError::Connect {
        server: server.clone(),
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
        let body = Limited::new(response.into_body(), MAX_BODY).collect().await.map_err(broken)?.to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        if status != hyper::StatusCode::OK {
            return Err(AgentError::Status {
                server: server.clone(),
                code: status.as_u16(),
                reason: status.canonical_reason().unwrap_or_default().to_owned(),
                body: one_line(&body, MAX_SAID),
            });
        }
        Ok(body)
        // The sender is dropped here: the connection below ends.
    };
    // The connection does the I/O while the exchange waits on it; it ends once the answer is
    // read and the sender is gone (a failure of its own shows in the exchange).
    let (answer, _) = tokio::join!(exchange, connection);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_named_by_host_or_address() {
        // Issue 41 item 3: `--server localhost:39890` was refused (`invalid socket address syntax`).
        assert_eq!("localhost:39890".parse(), Ok(Server { host: "localhost".into(), port: 39890 }));
        assert_eq!("10.0.0.7:9890".parse(), Ok(Server { host: "10.0.0.7".into(), port: 9890 }));
        assert_eq!("[::1]:9890".parse(), Ok(Server { host: "::1".into(), port: 9890 }));
        assert_eq!(Server { host: "::1".into(), port: 9890 }.to_string(), "[::1]:9890");
        for bad in ["localhost", ":9890", "::1:9890", "host:port", "[::1:9890"] {
            assert!(bad.parse::<Server>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refusal_says_the_agents_words_and_what_to_do() {
        let server: Server = "localhost:9890".parse().expect("server");
        let refused = |code: u16, reason: &str, body: &str| {
            AgentError::Status { server: server.clone(), code, reason: reason.into(), body: body.into() }.to_string()
        };
        let unauthorized = refused(401, "Unauthorized", "no bearer token");
        assert!(unauthorized.starts_with("the agent at localhost:9890 answered 401 Unauthorized: no bearer token ("));
        assert!(unauthorized.contains("--token-file"), "{unauthorized}");
        assert!(refused(403, "Forbidden", "forbidden").contains("lifecycle-api-reader"));
        assert!(refused(503, "Service Unavailable", "").contains("cannot reach the Kubernetes API server"));
        assert_eq!(
            refused(404, "Not Found", "no such path"),
            "the agent at localhost:9890 answered 404 Not Found: no such path"
        );
    }
}
