//! `kubectl lifecycle ...`: the kubectl plugin (kubectl runs `kubectl-lifecycle` from PATH), the
//! agents' answers from anywhere in the cluster, on any laptop kubectl runs on: this crate
//! depends on nothing Linux-only (the checks tier type-checks it for macOS and Windows).
//!
//! - `cluster`: the Kubernetes client from kubectl's flags;
//! - `token`: the audience-bound token minted for the agents (never the user's own credential);
//! - `agents`: which pod is the agent on a node, checked, and asking it through the API server;
//! - `gone`: the node of a pod gone from the API, from the kubelet's Events;
//! - `explain`, `status`: the two commands.
//!
//! The flags, the table and the stories are shared with `lifecycle-agent` (`lifecycle_cli`,
//! `lifecycle_model`). Errors are printed as one line per cause, anyhow only here.

mod agents;
mod cluster;
mod explain;
mod gone;
mod status;
mod token;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kubectl-lifecycle",
    bin_name = "kubectl lifecycle",
    version,
    about = "Why pods stopped, from the lifecycle agents, anywhere in the cluster."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
    #[command(flatten)]
    agents: AgentArgs,
}

/// Where the agents are and how the plugin is known to them.
#[derive(Args, Clone, Debug)]
struct AgentArgs {
    /// The agents' namespace.
    #[arg(long, global = true, default_value = "lifecycle-system")]
    agent_namespace: String,
    /// The agents' DaemonSet: only its own pods are asked.
    #[arg(long, global = true, default_value = "lifecycle-agent")]
    agent_daemonset: String,
    /// The agents' --listen port.
    #[arg(long, global = true, default_value_t = 9890)]
    agent_port: u16,
    /// The audience the agents require (their --api-auth-audience).
    #[arg(long, global = true, default_value = "lifecycle-agent")]
    agent_audience: String,
    /// The ServiceAccount in the agents' namespace whose token is minted for the agents (bound
    /// to lifecycle-api-reader; you need `create serviceaccounts/token` on it).
    #[arg(long, global = true, default_value = "lifecycle-reader")]
    reader_account: String,
    /// Send the token in this file to the agents instead of minting one (for example one from
    /// `kubectl create token lifecycle-reader -n lifecycle-system --audience lifecycle-agent`).
    /// Never give your own credential: every agent asked receives it.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Why a pod's containers stopped: a verdict and a timeline per stop, from the agent on its
    /// node (for a pod gone from the API, the node its kubelet's Events name).
    Explain(explain::ExplainArgs),
    /// Containers as the agents see them: of one pod (from its node's agent), of a namespace
    /// (from the agents of the nodes that run its pods) or of every namespace (-A: every agent).
    Status(status::StatusArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            // One line per cause, each made safe for the terminal (an agent's words are in them).
            eprintln!("error: {}", lifecycle_cli::text::terminal_safe(&format!("{err:#}"), false));
            ExitCode::FAILURE
        }
    }
}

/// What every command needs: the client, the context's namespace, and the agents with their
/// token.
pub(crate) struct Session {
    pub client: kube::Client,
    pub default_namespace: String,
    pub request_timeout: std::time::Duration,
    agents: AgentArgs,
}

impl Session {
    /// The agents, with a token minted for them now (or the one in --token-file).
    pub async fn agents(&self) -> anyhow::Result<agents::Agents> {
        let token = match &self.agents.token_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?
                .trim()
                .to_owned(),
            None => {
                let minting = token::Minting {
                    namespace: self.agents.agent_namespace.clone(),
                    account: self.agents.reader_account.clone(),
                    audience: self.agents.agent_audience.clone(),
                };
                token::mint(&self.client, &minting).await?
            }
        };
        let location = agents::Location {
            namespace: self.agents.agent_namespace.clone(),
            daemonset: self.agents.agent_daemonset.clone(),
            port: self.agents.agent_port,
        };
        Ok(agents::Agents::new(self.client.clone(), location, token, self.request_timeout))
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let (client, default_namespace) = cluster::client(&cli.cluster).await?;
    let session = Session {
        client,
        default_namespace,
        request_timeout: lifecycle_cli::args::or_a_day(cli.cluster.request_timeout),
        agents: cli.agents,
    };
    match cli.command {
        Command::Explain(args) => explain::run(&session, args).await,
        Command::Status(args) => status::run(&session, args).await,
    }
}
