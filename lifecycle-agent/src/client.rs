//! The client commands of the binary (`status`, `explain`): their flags, and reaching a running
//! agent with a token and the right transport. The work itself is in `lifecycle_agent::cli` and
//! `lifecycle_agent::export::explain`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Args, ValueEnum};

#[derive(Args)]
pub(crate) struct StatusArgs {
    /// Only this pod: POD, or NAMESPACE/POD.
    pod: Option<String>,
    /// Only this namespace (default: every namespace the node runs).
    #[arg(long, short, conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// Every namespace (the default on a node; taken for kubectl habits).
    #[arg(long, short = 'A')]
    all_namespaces: bool,
    /// Only containers of this name.
    #[arg(long, short)]
    container: Option<String>,
    #[command(flatten)]
    connection: Connection,
    /// Redraw at every change and at least every second, until interrupted.
    #[arg(long, short)]
    watch: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "table")]
    output: lifecycle_agent::cli::status::Output,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    /// The pod: NAMESPACE/POD, or POD with --namespace; a plain host's unit is `host/<its cgroup
    /// path>` (`host/system.slice/nginx.service`, `host/t`).
    pod: String,
    /// The pod's namespace, when POD has none.
    #[arg(long, short, default_value = "default")]
    namespace: String,
    /// Only this container.
    #[arg(long, short)]
    container: Option<String>,
    /// Every stop the node kept of the pod's containers, newest first, not only each
    /// container's last (a pod that is gone is explained from this history anyway).
    #[arg(long)]
    all_instances: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    output: ExplainFormat,
    #[command(flatten)]
    connection: Connection,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExplainFormat {
    Text,
    Json,
}

/// How a client command reaches a running agent.
#[derive(Args)]
struct Connection {
    /// The agent's listener.
    #[arg(long, default_value = "127.0.0.1:9890")]
    server: SocketAddr,
    /// A file holding the bearer token for an agent run with `--api-auth kubernetes` (default:
    /// the pod's service-account token, when there is one).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Send the token to a --server that is not a loopback address, over plain HTTP (anyone on
    /// the path could read and reuse it). Without this, a token is only sent to loopback or
    /// over TLS.
    #[arg(long)]
    insecure_send_token: bool,
    /// Speak HTTPS to --server, trusting the CA certificates in this PEM file; the agent's
    /// certificate must name --server's address. Default for a --server that is not a loopback
    /// address: the CA of the certificate the agent made at start
    /// (/run/lifecycle-agent/serving-ca.crt, as the DaemonSet runs it), when that file exists.
    #[arg(long)]
    ca_file: Option<PathBuf>,
}

/// Where the DaemonSet's agent (`--handoff-dir /run/lifecycle-agent`) writes the CA of the
/// certificate it made at start.
const DEFAULT_AGENT_CA: &str = "/run/lifecycle-agent/serving-ca.crt";

/// Where a pod's service-account token is mounted.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The token and transport a client command uses for `connection`: a token is read from
/// `--token-file` or the pod's service account, and sent in clear only to loopback.
fn reach(connection: &Connection) -> anyhow::Result<(Option<String>, lifecycle_agent::cli::status::Transport)> {
    let token = match &connection.token_file {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?),
        None => std::fs::read_to_string(SERVICE_ACCOUNT_TOKEN).ok(),
    };
    let token = token.as_deref().map(str::trim).map(str::to_owned);
    let ca_file = connection.ca_file.clone().or_else(|| {
        let made_at_start = PathBuf::from(DEFAULT_AGENT_CA);
        (!connection.server.ip().is_loopback() && made_at_start.is_file()).then_some(made_at_start)
    });
    let transport = match ca_file {
        Some(ca_file) => lifecycle_agent::cli::status::Transport::Tls { ca_file },
        None => lifecycle_agent::cli::status::Transport::Plain,
    };
    // A bearer token crossing the network in clear is a credential given away: only with consent.
    let token = match token {
        Some(_)
            if !connection.server.ip().is_loopback()
                && !transport.is_encrypted()
                && !connection.insecure_send_token =>
        {
            if connection.token_file.is_some() {
                anyhow::bail!(
                    "refusing to send the token to {} over plain HTTP (not a loopback address); serve \
                     --listen over TLS and pass --ca-file, or --insecure-send-token to send it anyway",
                    connection.server
                );
            }
            None
        }
        token => token,
    };
    Ok((token, transport))
}

pub(crate) async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    use lifecycle_model::{
        explain,
        wire::{ContainersResponse, HistoryResponse},
    };
    let (namespace, pod) = match args.pod.split_once('/') {
        Some((namespace, pod)) => (namespace.to_owned(), pod.to_owned()),
        None => (args.namespace.clone(), args.pod.clone()),
    };
    // A host unit: its cgroup path is the container, and it has no pod.
    let host_path = (namespace == explain::HOST_NAMESPACE).then(|| format!("/{}", pod.trim_start_matches('/')));
    let (pod, container) = match &host_path {
        Some(path) => (String::new(), Some(path.clone())),
        None => (pod, args.container.clone()),
    };
    let (token, transport) = reach(&args.connection)?;
    let query: String = match &host_path {
        Some(path) => url_query(&[("namespace", &namespace), ("container", path)]),
        None => url_query(&[("namespace", &namespace), ("pod", &pod)]),
    };
    let get = |path: String| {
        let (token, transport) = (token.clone(), transport.clone());
        async move {
            lifecycle_agent::cli::status::fetch_path(args.connection.server, &path, token.as_deref(), &transport).await
        }
    };
    let mut stories = Vec::new();
    let mut clock = None;
    if !args.all_instances {
        let body = get(format!("/api/v1/containers?{query}")).await?;
        let answer: ContainersResponse = serde_json::from_str(&body).context("the agent's answer is not the API's")?;
        clock = Some(answer.boot_to_unix_seconds);
        stories = explain::explain(&answer.containers, &namespace, &pod, container.as_deref());
        // A host unit between runs shows its last stop; one never stopped says so.
        stories.retain(|story| !story.timeline.is_empty() || host_path.is_none());
    }
    if stories.is_empty() {
        // Every kept stop, or a pod whose containers are gone: from the node's history.
        let body = get(format!("/api/v1/history?{query}")).await?;
        let answer: HistoryResponse = serde_json::from_str(&body).context("the agent's answer is not the API's")?;
        clock = Some(answer.boot_to_unix_seconds);
        stories = explain::explain_history(&answer.stops, container.as_deref());
    }
    if stories.is_empty() {
        let subject = match &host_path {
            Some(path) => format!("host unit {path}"),
            None => format!("pod {namespace}/{pod}"),
        };
        anyhow::bail!("the agent at {} knows no container or stop of {subject}", args.connection.server);
    }
    match args.output {
        ExplainFormat::Json => {
            println!("{}", lifecycle_agent::model::terminal::safe_json(serde_json::to_string_pretty(&stories)?))
        }
        ExplainFormat::Text => print!("{}", explain::render_text(&stories, clock)),
    }
    Ok(())
}

/// `key=value&...` with each value percent-encoded (names may hold any byte a client types).
fn url_query(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(key, value)| format!("{key}={}", lifecycle_agent::cli::status::percent_encoded(value)))
        .collect();
    pairs.join("&")
}

pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<()> {
    use lifecycle_agent::cli::status::{self, Answer, Output, Selection};
    let (token, transport) = reach(&args.connection)?;
    let token = token.as_deref();
    let (namespace, pod) = match args.pod.as_deref().map(|pod| pod.split_once('/').ok_or(pod)) {
        Some(Ok((namespace, pod))) => (Some(namespace.to_owned()), Some(pod.to_owned())),
        Some(Err(pod)) => (args.namespace.clone(), Some(pod.to_owned())),
        None => (args.namespace.clone(), None),
    };
    let selection = Selection { namespace, pod, container: args.container.clone() };
    // With --watch, each request after the first waits for a change (at most a second, for the
    // ages shown), so a new state is drawn as soon as the agent has it.
    let mut version: Option<String> = None;
    loop {
        let path = match &version {
            Some(version) => selection.waiting_path(version, 1),
            None => selection.path(),
        };
        let body = status::fetch_path(args.connection.server, &path, token, &transport).await?;
        let body: serde_json::Value = serde_json::from_str(&body).context("the agent's answer is not JSON")?;
        version = body["resource_version"].as_str().filter(|v| !v.is_empty()).map(str::to_owned);
        let shown = status::render(&[Answer { node: None, body: &body }], args.output)?;
        if args.watch && matches!(args.output, Output::Table | Output::Wide) {
            // Clear the screen and home the cursor, like `watch`.
            print!("\x1b[2J\x1b[H");
        }
        print!("{shown}");
        if !args.watch {
            return Ok(());
        }
        if version.is_none() {
            // An agent from before waits: redraw every second.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
