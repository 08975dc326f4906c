//! `lifecycle-agent doctor`: a preflight an operator runs on a node (or inside the DaemonSet's
//! pod) before trusting the agent there. Each requirement is one check and one line: `ok`,
//! `warn` (the agent runs, with less), `missing` (it cannot run, or not fully) or `skip` (does
//! not apply here), what was found, and what to do.
//!
//! Every check is a pure function over what was read (`kernel`: what the kernel offers and
//! this process may do; `services`: what the agent talks to and binds), so fixtures test them
//! without root or a particular kernel; `node` is the thin layer that reads the real system
//! (files under /proc and /sys, the CRI socket, the API server, the ports, the clocks) and loads
//! the kernel programs the way `run` does. The exit status is non-zero exactly when a check says `missing`.

mod kernel;
mod node;
pub mod proof;
mod services;
#[cfg(test)]
mod tests;

pub(crate) use self::{kernel::*, services::*};

use std::{fmt::Write as _, net::SocketAddr, path::PathBuf};

use serde::Serialize;

/// The flags of `doctor`: the same spellings and defaults as `run`'s, so an operator passes the
/// values the agent runs with.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The agent's --listen address (checked for being free).
    #[arg(long, default_value = "127.0.0.1:9890")]
    pub listen: SocketAddr,
    /// The agent's --health-listen address, if it uses one (the DaemonSet's is 0.0.0.0:9892).
    #[arg(long, default_value = "")]
    pub health_listen: String,
    /// The agent's --pod-probe-port (0: none).
    #[arg(long, default_value_t = crate::probe::server::DEFAULT_POD_PORT)]
    pub pod_probe_port: u16,
    /// The CRI socket the agent is given (default: the ones it tries, and the k3s/RKE2 and
    /// MicroK8s paths it does not).
    #[arg(long)]
    pub cri_socket: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API, when not in a pod (default: KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (default: NODE_NAME, else the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Kernel BTF.
    #[arg(long, default_value = "/sys/kernel/btf/vmlinux")]
    pub btf: PathBuf,
    /// Where tracefs is, or is mounted when missing (loading the programs mounts it, as `run`
    /// does).
    #[arg(long, default_value = "/sys/kernel/tracing")]
    pub tracefs: PathBuf,
    /// Do not load the kernel programs: judge them from BTF and tracefs alone.
    #[arg(long)]
    pub no_load: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: DoctorFormat,
}

/// How the report is printed.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DoctorFormat {
    /// Aligned columns, one line per check.
    Text,
    /// One JSON object: `ready` and the checks.
    Json,
}

/// Why `doctor` exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// At least one requirement is missing; the report says which and what to do.
    #[error("this node cannot run the agent fully: missing {}", .missing.join(", "))]
    NotReady { missing: Vec<&'static str> },
    /// The JSON report could not be written.
    #[error("cannot write the JSON report")]
    Json(#[source] serde_json::Error),
}

/// [`run`] as a boxed future made in this crate, for the binary to await (see
/// `agent::run_boxed` for why).
pub fn run_boxed(args: DoctorArgs) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DoctorError>>>> {
    Box::pin(run(args))
}

/// Runs every check on this node, prints the report, and fails when something is missing.
pub async fn run(args: DoctorArgs) -> Result<(), DoctorError> {
    let report = Report::new(node::examine(&args).await);
    let printed = match args.output {
        DoctorFormat::Text => render_text(&report),
        DoctorFormat::Json => serde_json::to_string_pretty(&report).map_err(DoctorError::Json)? + "\n",
    };
    // Not print!: a reader that closes the pipe early (`doctor | head`) would make it panic, and
    // the exit status must still say whether something is missing.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), printed.as_bytes());
    let missing: Vec<&'static str> = report
        .checks
        .iter()
        .filter(|finding| finding.result == Verdict::Missing)
        .map(|finding| finding.check)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DoctorError::NotReady { missing })
    }
}

/// The result of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    Ok,
    /// The agent runs, with a feature off or a caveat.
    Warn,
    /// The agent cannot run, or not fully.
    Missing,
    /// The check does not apply here (no Kubernetes API on a plain host).
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Missing => "missing",
            Verdict::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Finding {
    pub check: &'static str,
    pub result: Verdict,
    pub found: String,
    /// What to do; only when the result is not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, found: impl Into<String>) -> Self {
        Self { check, result: Verdict::Ok, found: found.into(), fix: None }
    }

    fn warn(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Warn, found: found.into(), fix: Some(fix.into()) }
    }

    fn missing(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Missing, found: found.into(), fix: Some(fix.into()) }
    }

    fn skip(check: &'static str, found: impl Into<String>) -> Self {
        Self { check, result: Verdict::Skip, found: found.into(), fix: None }
    }
}

/// Every check, and whether the agent can run fully.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub ready: bool,
    pub checks: Vec<Finding>,
}

impl Report {
    pub(crate) fn new(checks: Vec<Finding>) -> Self {
        Self { ready: checks.iter().all(|finding| finding.result != Verdict::Missing), checks }
    }
}

/// Aligned columns (result, check, what was found, `-> what to do`) and a closing sentence.
pub(crate) fn render_text(report: &Report) -> String {
    let check_width = report.checks.iter().map(|finding| finding.check.len()).max().unwrap_or(0);
    let mut out = String::new();
    for finding in &report.checks {
        let _ = write!(out, "{:<7}  {:<check_width$}  {}", finding.result.label(), finding.check, finding.found);
        if let Some(fix) = &finding.fix {
            let _ = write!(out, "  -> {fix}");
        }
        out.push('\n');
    }
    let count = |verdict| report.checks.iter().filter(|finding| finding.result == verdict).count();
    let (missing, warnings) = (count(Verdict::Missing), count(Verdict::Warn));
    let _ = match (missing, warnings) {
        (0, 0) => writeln!(out, "ready: the agent can run fully on this node"),
        (0, _) => writeln!(out, "ready: the agent can run fully on this node ({warnings} warning(s) above)"),
        _ => writeln!(out, "not ready: {missing} requirement(s) missing, {warnings} warning(s)"),
    };
    out
}
