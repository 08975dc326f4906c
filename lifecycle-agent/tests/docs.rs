//! Unit tier: every `lifecycle-agent` command the README, the deploy guide and the docs show is
//! one the binary takes (the plugin's are checked in its own crate, `kubectl-lifecycle/tests`). Each is run with `--help` appended, so clap
//! checks its subcommand, flags and values' shapes and prints help instead of running; a flag
//! renamed in code and not in a document fails here, with the document's line.

use std::{path::Path, process::Command};

use lifecycle_testkit::docs::{commands, DocCommand};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");

/// The documents people copy commands from.
fn documents() -> Vec<(String, String)> {
    lifecycle_testkit::docs::documents(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// Runs `binary` with the command's words and `--help`; the failures, one line each.
fn refused(binary: &str, found: &[DocCommand]) -> Vec<String> {
    let mut refused = Vec::new();
    for command in found {
        let mut args = command.args.clone();
        if !args.iter().any(|arg| arg == "--help" || arg == "-h" || arg == "--version" || arg == "-V") {
            args.push("--help".to_owned());
        }
        let output = Command::new(binary).args(&args).output().expect("run the binary");
        if !output.status.success() || output.stdout.is_empty() {
            refused.push(format!(
                "{}: {} {}: {}",
                command.at,
                Path::new(binary).file_name().unwrap_or_default().to_string_lossy(),
                command.args.join(" "),
                String::from_utf8_lossy(&output.stderr).lines().next().unwrap_or("(no error)")
            ));
        }
    }
    refused
}

#[test]
fn every_documented_command_is_one_the_binaries_take() {
    let mut agent = Vec::new();
    for (name, text) in documents() {
        agent.extend(commands(&name, &text, &["lifecycle-agent"]));
    }
    // The documents do show these: finding none means the extraction broke, not that all is well.
    for subcommand in ["run", "status", "explain", "doctor", "events"] {
        assert!(
            agent.iter().any(|c| c.args.first().is_some_and(|a| a == subcommand)),
            "no documented `lifecycle-agent {subcommand}` found"
        );
    }

    let failures = refused(AGENT, &agent);
    assert!(failures.is_empty(), "documented commands the binaries refuse:\n{}", failures.join("\n"));
}

/// The rules of the ClusterRole `name` in a manifest file: (resource, verbs) pairs, as written.
fn cluster_role_rules(manifests: &str, name: &str) -> Vec<(String, Vec<String>)> {
    let list = |line: &str| -> Vec<String> {
        line.split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(inside, _)| inside.split(',').map(|item| item.trim().trim_matches('"').to_owned()).collect())
            .unwrap_or_default()
    };
    let role = manifests
        .split("\n---")
        .find(|doc| doc.contains("kind: ClusterRole\n") && doc.contains(&format!("  name: {name}\n")))
        .unwrap_or_else(|| panic!("no ClusterRole {name}"));
    let mut rules = Vec::new();
    let mut resources = Vec::new();
    for line in role.lines().map(str::trim) {
        if line.starts_with("resources:") {
            resources = list(line);
        } else if line.starts_with("verbs:") {
            let verbs = list(line);
            rules.extend(resources.drain(..).map(|resource| (resource, verbs.clone())));
        }
    }
    rules
}

#[test]
fn the_readme_names_every_permission_the_agent_is_granted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifests = std::fs::read_to_string(root.join("deploy/rbac.yaml")).expect("deploy/rbac.yaml");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let line = readme.split("- **RBAC**").nth(1).and_then(|rest| rest.split("\n- ").next()).expect("the RBAC line");
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    let rules = cluster_role_rules(&manifests, "lifecycle-agent");
    assert!(rules.len() >= 5, "the role's rules were read: {rules:?}");
    for (resource, verbs) in rules {
        let said = format!("{resource} {}", verbs.join("/"));
        assert!(line.contains(&said), "README's RBAC line does not say `{said}`: {line}");
    }
}
