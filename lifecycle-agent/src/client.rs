//! The client commands of the binary (`status`, `explain`): reaching a running agent with a token
//! and the right transport. The flags they share with the kubectl plugin, the table and the HTTP
//! client are `lifecycle_cli`'s; what is this binary's own is how it finds a token and a CA on a
//! node.

use std::{io::IsTerminal as _, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;
use lifecycle_cli::{
    agent::{self, Resolved, Server, Transport},
    args::{ExplainFormat, ExplainTarget, StatusFilter},
    table::{self, Answer, Output},
    text::{json_safe, terminal_safe},
};

#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    filter: StatusFilter,
    #[command(flatten)]
    connection: Connection,
    /// Redraw at every change and at least every second, until interrupted.
    #[arg(long, short)]
    watch: bool,
}

#[derive(Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    target: ExplainTarget,
    #[command(flatten)]
    connection: Connection,
}

/// How a client command reaches a running agent.
#[derive(Args)]
struct Connection {
    /// The agent's listener: host:port (a name, e.g. localhost:9890, or an address).
    #[arg(long, default_value = "127.0.0.1:9890")]
    server: Server,
    /// A file holding the bearer token for an agent run with `--api-auth kubernetes` (default:
    /// the audience-bound token the DaemonSet mounts for the agent, else the pod's
    /// service-account token, when there is one).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Send the token to a --server that is not a loopback address, over plain HTTP (anyone on
    /// the path could read and reuse it). Without this, a token is only sent to loopback or
    /// over TLS.
    #[arg(long)]
    insecure_send_token: bool,
    /// Speak HTTPS to --server, trusting the CA certificates in this PEM file; the agent's
    /// certificate must name --server as given. Default for a --server that is not a loopback
    /// address: the CA of the certificate the agent made at start
    /// (/run/lifecycle-agent/serving-ca.crt, as the DaemonSet runs it), when that file exists.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// How long a request may take, connecting included (`10s`, `1m30s`, or seconds; 0: no
    /// limit), as kubectl's flag.
    #[arg(long, default_value = "10s", value_parser = lifecycle_cli::args::request_timeout)]
    request_timeout: Duration,
}

/// Where the DaemonSet's agent (`--handoff-dir /run/lifecycle-agent`) writes the CA of the
/// certificate it made at start.
const DEFAULT_AGENT_CA: &str = "/run/lifecycle-agent/serving-ca.crt";

/// Where the DaemonSet mounts a token minted for the agents' audience (a projected
/// service-account token, `--api-auth-audience lifecycle-agent`): what `status` run in the
/// agent's pod sends.
const AGENT_AUDIENCE_TOKEN: &str = "/var/run/secrets/lifecycle.dev/serviceaccount/token";

/// Where a pod's service-account token is mounted.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The resolved server, token and transport a client command uses for `connection`: a token is
/// read from `--token-file` or the pod's, and sent in clear only to loopback.
async fn reach(connection: &Connection) -> anyhow::Result<(Resolved, Option<String>, Transport)> {
    let timeout = lifecycle_cli::args::or_a_day(connection.request_timeout);
    let server = agent::resolve(&connection.server, timeout).await?;
    let token = match &connection.token_file {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?),
        None => std::fs::read_to_string(AGENT_AUDIENCE_TOKEN)
            .or_else(|_| std::fs::read_to_string(SERVICE_ACCOUNT_TOKEN))
            .ok(),
    };
    let token = token.as_deref().map(str::trim).map(str::to_owned);
    let ca_file = connection.ca_file.clone().or_else(|| {
        let made_at_start = PathBuf::from(DEFAULT_AGENT_CA);
        (!server.is_loopback() && made_at_start.is_file()).then_some(made_at_start)
    });
    let transport = match ca_file {
        Some(ca_file) => Transport::Tls { ca_file },
        None => Transport::Plain,
    };
    // A bearer token crossing the network in clear is a credential given away: only with consent.
    let token = match token {
        Some(_) if !server.is_loopback() && !transport.is_encrypted() && !connection.insecure_send_token => {
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
    Ok((server, token, transport))
}

pub(crate) async fn explain(args: ExplainArgs) -> anyhow::Result<()> {
    use lifecycle_model::{
        explain,
        wire::{query, ContainersResponse, HistoryResponse},
    };
    let (namespace, pod) = args.target.pod_ref("default");
    // A host unit: its cgroup path is the container, and it has no pod.
    let host_path = (namespace == explain::HOST_NAMESPACE).then(|| format!("/{}", pod.trim_start_matches('/')));
    let (pod, container) = match &host_path {
        Some(path) => (String::new(), Some(path.clone())),
        None => (pod, args.target.container.clone()),
    };
    let (server, token, transport) = reach(&args.connection).await?;
    let timeout = lifecycle_cli::args::or_a_day(args.connection.request_timeout);
    let query: String = match &host_path {
        Some(path) => query(&[("namespace", &namespace), ("container", path)]),
        None => query(&[("namespace", &namespace), ("pod", &pod)]),
    };
    let get = |path: String| {
        let (token, transport, server) = (token.clone(), transport.clone(), server.clone());
        async move { agent::fetch(&server, &path, token.as_deref(), &transport, timeout).await }
    };
    let mut stories = Vec::new();
    let mut clock = None;
    if !args.target.all_instances {
        let body = get(format!("/api/v1/containers?{query}")).await?;
        let answer: ContainersResponse = serde_json::from_str(&body).context("the agent's answer is not the API's")?;
        clock = Some(answer.boot_to_unix_seconds);
        stories = explain::explain_at(&answer.containers, &namespace, &pod, container.as_deref(), answer.now);
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
        anyhow::bail!(
            "the agent at {} knows no container or stop of {}",
            server.server,
            terminal_safe(&subject, false)
        );
    }
    match args.target.output {
        ExplainFormat::Json => println!("{}", json_safe(&serde_json::to_string_pretty(&stories)?)),
        ExplainFormat::Text => print!("{}", terminal_safe(&explain::render_text(&stories, clock), true)),
    }
    Ok(())
}

pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let (server, token, transport) = reach(&args.connection).await?;
    let timeout = lifecycle_cli::args::or_a_day(args.connection.request_timeout);
    let token = token.as_deref();
    // On a node, no namespace means every namespace the node runs.
    let selection = args.filter.selection(None);
    let output = args.filter.output;
    // Clear the screen between drawings only on a terminal: a pipe or a file gets the drawings
    // one after the other, with no escape sequence.
    let redraw = args.watch && matches!(output, Output::Table | Output::Wide) && std::io::stdout().is_terminal();
    // With --watch, each request after the first waits for a change (at most a second, for the
    // ages shown), so a new state is drawn as soon as the agent has it.
    let mut version: Option<String> = None;
    loop {
        let path = match &version {
            Some(version) => selection.waiting_path(version, 1),
            None => selection.path(),
        };
        let body = agent::fetch(&server, &path, token, &transport, timeout).await?;
        let body: serde_json::Value = serde_json::from_str(&body).context("the agent's answer is not JSON")?;
        version = body["resource_version"].as_str().filter(|v| !v.is_empty()).map(str::to_owned);
        let answers = [Answer { node: None, body: &body }];
        let shown = table::render(&answers, output)?;
        if redraw {
            // Clear the screen and home the cursor, like `watch`.
            print!("\x1b[2J\x1b[H");
        }
        print!("{shown}");
        if let Some(note) = table::nothing_found(&answers, output, selection.namespace.as_deref()) {
            eprintln!("{note}");
        }
        if !args.watch {
            return Ok(());
        }
        if version.is_none() {
            // An agent from before waits: redraw every second.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
