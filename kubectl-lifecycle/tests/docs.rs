//! Every `kubectl lifecycle` command the README, the deploy guide and the docs show is one the
//! plugin takes: run with `--help` appended, clap checks its subcommand, flags and values' shapes
//! and prints help instead of running (no cluster is needed). A flag renamed in code and not in a
//! document fails here, with the document's line.

use std::{path::Path, process::Command};

// The extraction is the testkit's (pure std); included by path so the plugin's dependency tree
// stays free of the agent's Linux-only crates.
#[path = "../../lifecycle-testkit/src/docs.rs"]
mod docs;

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-lifecycle");

#[test]
fn every_documented_plugin_command_is_one_it_takes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found: Vec<docs::DocCommand> = docs::documents(&root)
        .iter()
        .flat_map(|(name, text)| docs::commands(name, text, &["kubectl-lifecycle"]))
        .collect();
    for subcommand in ["explain", "status"] {
        assert!(
            found.iter().any(|c| c.args.first().is_some_and(|a| a == subcommand)),
            "no documented `kubectl lifecycle {subcommand}` found"
        );
    }
    let mut refused = Vec::new();
    for command in &found {
        let mut args = command.args.clone();
        if !args.iter().any(|arg| matches!(arg.as_str(), "--help" | "-h" | "--version" | "-V")) {
            args.push("--help".to_owned());
        }
        let output = Command::new(PLUGIN).args(&args).output().expect("run the plugin");
        if !output.status.success() || output.stdout.is_empty() {
            let why = String::from_utf8_lossy(&output.stderr).lines().next().unwrap_or("(no error)").to_owned();
            refused.push(format!("{}: kubectl lifecycle {}: {why}", command.at, command.args.join(" ")));
        }
    }
    assert!(refused.is_empty(), "documented commands the plugin refuses:\n{}", refused.join("\n"));
}
