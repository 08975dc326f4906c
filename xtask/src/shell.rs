//! Running commands with their command line in every error.

use std::process::Command;

use anyhow::{bail, Context as _, Result};

/// Runs a command with inherited stdio; fails when it exits non-zero.
pub fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its stdout; fails when it exits non-zero.
pub fn capture(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("starting {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    String::from_utf8(output.stdout).with_context(|| format!("{command:?} printed non-UTF-8"))
}
