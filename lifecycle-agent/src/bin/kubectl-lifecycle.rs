//! `kubectl lifecycle ...`: the kubectl plugin (kubectl runs `kubectl-lifecycle` from PATH). Thin:
//! flags here, the work in `lifecycle_agent::cli::plugin`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use lifecycle_agent::{
    cli::{
        plugin::{self, AgentLocation},
        status,
    },
    model::{explain, terminal},
    ErrorChain,
};

#[derive(Parser)]
#[command(
    name = "kubectl-lifecycle",
    version,
    about = "Why pods stopped, from the lifecycle agents, anywhere in the cluster."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    access: Access,
}

#[derive(Args)]
struct Access {
    /// Bearer token passed to the agent (default: your kubeconfig's).
    #[arg(long, global = true)]
    token: Option<String>,
    /// A file holding that token.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// The agents' namespace.
    #[arg(long, global = true, default_value = "lifecycle-system")]
    agent_namespace: String,
    /// The agents' --listen port.
    #[arg(long, global = true, default_value_t = 9890)]
    agent_port: u16,
}

#[derive(Subcommand)]
enum Command {
    /// Why a pod's containers stopped: a verdict and a timeline per stop.
    Explain {
        /// NAMESPACE/POD, or POD with --namespace.
        pod: String,
        #[arg(long, short, default_value = "default")]
        namespace: String,
        #[arg(long, short)]
        container: Option<String>,
        /// The node the pod ran on, for a pod that is gone from the API (without it, every
        /// node's agent is asked for the pod's past stops).
        #[arg(long)]
        node: Option<String>,
        /// Every stop the node kept, not only each container's last.
        #[arg(long)]
        all_instances: bool,
        #[arg(long, short, value_enum, default_value = "text")]
        output: Format,
    },
    /// Containers as the agents see them: of one pod (from its node's agent), of a namespace
    /// or of every namespace (-A, from every node's agent).
    Status {
        /// Only this pod: POD, or NAMESPACE/POD.
        pod: Option<String>,
        /// Only this namespace (default: your kubeconfig's).
        #[arg(long, short, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(long, short = 'A', conflicts_with = "pod")]
        all_namespaces: bool,
        /// Only containers of this name.
        #[arg(long, short)]
        container: Option<String>,
        /// Only the agent of this node (for a pod that is gone from the API too).
        #[arg(long)]
        node: Option<String>,
        #[arg(long, short, value_enum, default_value = "table")]
        output: status::Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
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
            eprintln!("error: {}", ErrorChain(&*err));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error + Send + Sync>> {
    let client = kube::Client::try_default().await?;
    let location = AgentLocation {
        namespace: cli.access.agent_namespace.clone(),
        port: cli.access.agent_port,
        ..AgentLocation::default()
    };
    let token = plugin::token(cli.access.token, cli.access.token_file).await?;
    match cli.command {
        Command::Explain { pod, namespace, container, node, all_instances, output } => {
            let (namespace, pod) = match pod.split_once('/') {
                Some((n, p)) => (n.to_owned(), p.to_owned()),
                None => (namespace, pod),
            };
            let request = plugin::ExplainRequest { namespace, pod, node, container, all_instances };
            let stories = plugin::explain_pod(&client, &location, &request, &token).await?;
            match output {
                Format::Json => println!("{}", terminal::safe_json(serde_json::to_string_pretty(&stories)?)),
                Format::Text => print!("{}", explain::render_text(&stories, None)),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { pod, namespace, all_namespaces, container, node, output } => {
            let default_namespace = || (!all_namespaces).then(|| client.default_namespace().to_owned());
            let (namespace, pod) = match pod.as_deref().map(|pod| pod.split_once('/').ok_or(pod)) {
                Some(Ok((namespace, pod))) => (Some(namespace.to_owned()), Some(pod.to_owned())),
                Some(Err(pod)) => (namespace.or_else(default_namespace), Some(pod.to_owned())),
                None => (namespace.or_else(default_namespace), None),
            };
            let request = plugin::StatusRequest { selection: status::Selection { namespace, pod, container }, node };
            let answers = plugin::status(&client, &location, &request, &token, Duration::from_secs(10)).await?;
            let mut failed = false;
            let mut bodies = Vec::new();
            for answer in &answers {
                match &answer.answer {
                    Ok(body) => bodies.push(status::Answer { node: Some(&answer.node), body }),
                    Err(err) => {
                        failed = true;
                        eprintln!("node {}: no answer: {}", answer.node, ErrorChain(err));
                    }
                }
            }
            print!("{}", status::render(&bodies, output)?);
            Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
    }
}
