//! `kubectl lifecycle status`: the selected containers from the agents that can have them: a
//! pod's node's agent, the agents of the nodes that run a namespace's pods, or every agent when
//! the user asks for every namespace (`-A`) or every node (`--all-nodes`).

use std::{collections::BTreeSet, process::ExitCode};

use anyhow::bail;
use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::{api::ListParams, Api};
use lifecycle_cli::{
    args::StatusFilter,
    table::{self, Answer},
    text::terminal_safe,
};

use crate::{cluster::words, gone, Session};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    filter: StatusFilter,
    /// Only the agent of this node (for a pod gone from the API too).
    #[arg(long, conflicts_with = "all_nodes")]
    node: Option<String>,
    /// Every node's agent, whatever the selection (pods gone from the API included).
    #[arg(long)]
    all_nodes: bool,
}

pub async fn run(session: &Session, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let selection = args.filter.selection(Some(&session.default_namespace));
    let output = args.filter.output;
    let nodes: Option<Vec<String>> = if args.all_nodes || args.filter.all_namespaces {
        None
    } else if let Some(node) = &args.node {
        Some(vec![node.clone()])
    } else {
        let namespace = selection.namespace.clone().unwrap_or_else(|| session.default_namespace.clone());
        let pods: Api<Pod> = Api::namespaced(session.client.clone(), &namespace);
        let nodes = match &selection.pod {
            Some(pod) => match pods
                .get_opt(pod)
                .await
                .map_err(|err| anyhow::anyhow!("cannot get pod {namespace}/{pod}: {}", words(&err)))?
            {
                Some(found) => found.spec.and_then(|spec| spec.node_name).into_iter().collect(),
                None => gone::nodes_of(&session.client, &namespace, pod).await?,
            },
            // The nodes that run the namespace's pods now.
            None => {
                let listed = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|err| anyhow::anyhow!("cannot list the pods of namespace {namespace}: {}", words(&err)))?;
                let nodes: BTreeSet<String> =
                    listed.items.into_iter().filter_map(|pod| pod.spec.and_then(|spec| spec.node_name)).collect();
                nodes.into_iter().collect()
            }
        };
        if nodes.is_empty() {
            match &selection.pod {
                Some(pod) => bail!(
                    "pod {}/{} runs on no node the API or its Events name: give --node, or ask every node with \
                     --all-nodes",
                    terminal_safe(&namespace, false),
                    terminal_safe(pod, false)
                ),
                None => {
                    // No pod of the namespace runs anywhere: kubectl's words, and no agent asked.
                    eprintln!("No resources found in {} namespace.", terminal_safe(&namespace, false));
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        Some(nodes)
    };
    let agents = session.agents().await?;
    let found = agents.on(nodes.as_deref()).await?;
    let answers = agents.ask_each(found, &selection.path()).await;
    let mut failed = false;
    let mut bodies = Vec::new();
    for (agent, answer) in &answers {
        match answer {
            Ok(body) => bodies.push(Answer { node: Some(&agent.node), body }),
            Err(err) => {
                failed = true;
                eprintln!("error: {}", terminal_safe(&err.to_string(), false));
            }
        }
    }
    print!("{}", table::render(&bodies, output)?);
    if let Some(note) = table::nothing_found(&bodies, output, selection.namespace.as_deref()) {
        eprintln!("{note}");
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
