//! `kubectl lifecycle explain`: the stories of a pod's stops from the agent on its node. A pod the
//! API still has names its node; one gone from it is found on the nodes its kubelet's Events
//! name; every node is asked only with `--all-nodes`, never because a lookup found nothing.

use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use lifecycle_cli::{
    args::{ExplainFormat, ExplainTarget},
    text::{json_safe, terminal_safe},
};
use lifecycle_model::{
    explain::{self, ContainerStory},
    wire::{query, ContainersResponse, HistoryResponse},
};

use crate::{agents::Agents, cluster::words, gone, Session};

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    target: ExplainTarget,
    /// The node the pod ran on (default: the pod's, or for a pod gone from the API, the nodes
    /// its kubelet's Events name).
    #[arg(long, conflicts_with = "all_nodes")]
    node: Option<String>,
    /// Ask every node's agent for the pod's past stops (a pod gone from the API whose Events
    /// expired): one request per node.
    #[arg(long)]
    all_nodes: bool,
}

/// Where the pod's stories are asked for.
enum Nodes {
    /// The pod's node, from the API: its containers now, then its history.
    Current(String),
    /// Nodes it ran on (named, or from Events), or every node: their history.
    Past(Option<Vec<String>>),
}

pub async fn run(session: &Session, args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (namespace, pod) = args.target.pod_ref(&session.default_namespace);
    let host_unit = namespace == explain::HOST_NAMESPACE;
    let nodes = if args.all_nodes {
        Nodes::Past(None)
    } else if let Some(node) = &args.node {
        Nodes::Current(node.clone())
    } else if host_unit {
        bail!("a host unit is on one node: give it with --node");
    } else {
        let pods: Api<Pod> = Api::namespaced(session.client.clone(), &namespace);
        match pods
            .get_opt(&pod)
            .await
            .map_err(|err| anyhow::anyhow!("cannot get pod {namespace}/{pod}: {}", words(&err)))?
        {
            Some(found) => match found.spec.and_then(|spec| spec.node_name) {
                Some(node) => Nodes::Current(node),
                None => bail!("pod {namespace}/{pod} is not scheduled on a node yet"),
            },
            None => {
                let nodes = gone::nodes_of(&session.client, &namespace, &pod).await?;
                if nodes.is_empty() {
                    bail!(
                        "pod {}/{} is not in the API and no kubelet Event names its node (Events are kept an hour by \
                         default): give its node with --node, or ask every node with --all-nodes",
                        terminal_safe(&namespace, false),
                        terminal_safe(&pod, false)
                    );
                }
                Nodes::Past(Some(nodes))
            }
        }
    };
    let agents = session.agents().await?;
    let container = match host_unit {
        true => Some(format!("/{}", pod.trim_start_matches('/'))),
        false => args.target.container.clone(),
    };
    let pod = if host_unit { String::new() } else { pod };
    let selection = match &container {
        Some(path) if host_unit => query(&[("namespace", &namespace), ("container", path)]),
        _ => query(&[("namespace", &namespace), ("pod", &pod)]),
    };
    let (stories, clock) = match nodes {
        Nodes::Current(node) => {
            let found = agents.on(Some(&[node])).await?;
            let agent = &found[0];
            let mut stories = Vec::new();
            let mut clock = None;
            if !args.target.all_instances {
                let answer = agents.ask(agent, &format!("/api/v1/containers?{selection}")).await?;
                let answer: ContainersResponse =
                    serde_json::from_value(answer).context("the agent's answer is not the API's")?;
                clock = Some(answer.boot_to_unix_seconds);
                stories = explain::explain_at(&answer.containers, &namespace, &pod, container.as_deref(), answer.now);
                stories.retain(|story| !story.timeline.is_empty() || !host_unit);
            }
            if stories.is_empty() {
                let answer = agents.ask(agent, &format!("/api/v1/history?{selection}")).await?;
                let answer: HistoryResponse =
                    serde_json::from_value(answer).context("the agent's answer is not the API's")?;
                clock = Some(answer.boot_to_unix_seconds);
                stories = explain::explain_history(&answer.stops, container.as_deref());
            }
            (stories, clock)
        }
        Nodes::Past(nodes) => past_stories(&agents, nodes, &selection, container.as_deref()).await?,
    };
    if stories.is_empty() {
        bail!(
            "the agents asked know no container or stop of pod {}/{}",
            terminal_safe(&namespace, false),
            terminal_safe(&pod, false)
        );
    }
    match args.target.output {
        ExplainFormat::Json => println!("{}", json_safe(&serde_json::to_string_pretty(&stories)?)),
        ExplainFormat::Text => print!("{}", terminal_safe(&explain::render_text(&stories, clock), true)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The kept stops of the pod from the history of the agents on `nodes` (every node's when None);
/// a node that did not answer is said on stderr, the stories found are the answer.
async fn past_stories(
    agents: &Agents,
    nodes: Option<Vec<String>>,
    selection: &str,
    container: Option<&str>,
) -> anyhow::Result<(Vec<ContainerStory>, Option<f64>)> {
    let found = agents.on(nodes.as_deref()).await?;
    let answers = agents.ask_each(found, &format!("/api/v1/history?{selection}")).await;
    let mut stories = Vec::new();
    // Each node has a boot clock of its own: wall times are printed only when one node told.
    let mut clocks = Vec::new();
    for (agent, answer) in answers {
        match answer.map(serde_json::from_value::<HistoryResponse>) {
            Ok(Ok(answer)) => {
                let found = explain::explain_history(&answer.stops, container);
                if !found.is_empty() {
                    clocks.push(answer.boot_to_unix_seconds);
                }
                stories.extend(found);
            }
            Ok(Err(_)) => eprintln!("warning: node {}: the agent's answer is not the API's", agent.node),
            Err(err) => eprintln!("warning: {}", terminal_safe(&err.to_string(), false)),
        }
    }
    let clock = match clocks[..] {
        [clock] => Some(clock),
        _ => None,
    };
    Ok((stories, clock))
}
