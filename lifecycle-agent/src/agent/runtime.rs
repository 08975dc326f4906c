//! The link to the container runtime's CRI socket, kept alive for the agent's whole life.
//!
//! The runtime restarts (node upgrades, crashes) and its socket is replaced with a new inode, so
//! the agent never holds on to one: every connection attempt resolves the socket path again (the
//! DaemonSet mounts the socket's directory, not the file, for the same reason). When a call
//! fails, the client is dropped, the tracker is told the runtime is unreachable (containers are
//! then named by pod uid + container id), and connecting is retried with back-off — sooner when a
//! new container asks for a name, but never more often than [`MIN_RETRY`]. While the runtime
//! answers, a container asking for its name is answered at once. The agent never needs a restart
//! of its own to see the runtime again.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{watch, Notify};

use crate::{
    discovery::cri::{CriClient, CONTAINERD_SOCKET, CRIO_SOCKET},
    export::metrics::RuntimeMetrics,
    model::{metadata::ContainerMeta, node::Command},
    owner::ModelHandle,
    ErrorChain,
};

/// Shortest gap between two connection attempts, however often a name is asked for.
const MIN_RETRY: Duration = Duration::from_millis(200);
/// Longest gap between two connection attempts while the runtime stays away.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// What one attempt found.
#[derive(Debug)]
pub(super) enum Answer {
    /// Every container the runtime has.
    Listed(Vec<ContainerMeta>),
    /// No runtime answered: containers are named by pod uid and container id meanwhile.
    Unreachable,
}

impl Answer {
    pub(super) fn answered(&self) -> bool {
        matches!(self, Answer::Listed(_))
    }

    /// The command that tells the model.
    pub(super) fn command(self) -> Command {
        match self {
            Answer::Listed(containers) => Command::RuntimeListed { containers },
            Answer::Unreachable => Command::RuntimeUnreachable,
        }
    }
}

/// The runtime connection and its state.
pub(super) struct RuntimeLink {
    candidates: Vec<PathBuf>,
    /// Whether `--cri-socket` named the socket (then its absence is a warning, not a plain host).
    configured: bool,
    client: Option<CriClient>,
    metrics: RuntimeMetrics,
    /// Whether the last attempt reached the runtime (logs only transitions).
    answered: Option<bool>,
}

impl RuntimeLink {
    /// The configured socket, else containerd's and CRI-O's default paths, tried in order.
    pub(super) fn new(configured: Option<PathBuf>, metrics: RuntimeMetrics) -> Self {
        let is_configured = configured.is_some();
        let candidates = match configured {
            Some(path) => vec![path],
            None => vec![PathBuf::from(CONTAINERD_SOCKET), PathBuf::from(CRIO_SOCKET)],
        };
        Self { candidates, configured: is_configured, client: None, metrics, answered: None }
    }

    /// One attempt: connect if needed, list every container.
    pub(super) async fn refresh(&mut self) -> Answer {
        if self.client.is_none() {
            match self.connect().await {
                Ok(client) => {
                    log::info!("container runtime metadata from {}", client.socket().display());
                    self.client = Some(client);
                }
                Err(errors) if self.is_plain_host() => {
                    // As `doctor` says: nothing wrong, there are no containers to name.
                    self.metrics.failed();
                    if self.answered.is_none() {
                        log::info!(
                            "no container runtime socket ({}): units are named by cgroup path, as on a plain host",
                            errors.join("; ")
                        );
                    }
                    self.answered = Some(false);
                    return Answer::Unreachable;
                }
                Err(errors) => {
                    return self.failed(|| {
                        format!(
                            "no container runtime answers ({}): containers are named by pod uid and container id until one does",
                            errors.join("; ")
                        )
                    });
                }
            }
        }
        let Some(client) = &self.client else { return Answer::Unreachable };
        match client.list_containers().await {
            Ok(list) => {
                self.metrics.succeeded();
                if self.answered == Some(false) {
                    log::info!("the container runtime answers again; containers named by id take their names");
                }
                self.answered = Some(true);
                Answer::Listed(list)
            }
            Err(err) => {
                let socket = client.socket().display().to_string();
                self.client = None;
                self.failed(|| format!("listing containers from {socket} failed: {}", ErrorChain(&err)))
            }
        }
    }

    /// No socket named and none of the default ones exists: a host without a container runtime
    /// (yet).
    fn is_plain_host(&self) -> bool {
        !self.configured && self.candidates.iter().all(|path| !path.exists())
    }

    fn failed(&mut self, why: impl FnOnce() -> String) -> Answer {
        self.metrics.failed();
        if self.answered != Some(false) {
            log::warn!("{}", why());
        } else {
            log::debug!("{}", why());
        }
        self.answered = Some(false);
        Answer::Unreachable
    }

    async fn connect(&self) -> Result<CriClient, Vec<String>> {
        let mut errors = Vec::new();
        for path in &self.candidates {
            match CriClient::connect(path).await {
                Ok(client) => return Ok(client),
                Err(err) => errors.push(ErrorChain(&err).to_string()),
            }
        }
        Err(errors)
    }
}

/// Refreshes every `period`, when a container asks for a name (`wanted`), and while the runtime
/// is away with back-off from [`MIN_RETRY`] to [`MAX_RETRY`], until shutdown. Containers just
/// named reach the probe supervisor through the snapshot that shows them.
pub(super) async fn runtime_loop(
    mut link: RuntimeLink,
    model: ModelHandle,
    wanted: Arc<Notify>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut retry = MIN_RETRY;
    let mut last_attempt = Instant::now();
    let mut up = link.answered == Some(true);
    loop {
        let wait = if up { period } else { retry };
        tokio::select! {
            _ = wanted.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        // While the runtime answers, a container asking for its name is answered at once (it may
        // live for milliseconds). While it does not, many containers asking (a node starting)
        // make one attempt, not many.
        let since = last_attempt.elapsed();
        if !up && since < MIN_RETRY {
            tokio::select! {
                _ = tokio::time::sleep(MIN_RETRY - since) => {}
                _ = shutdown.changed() => return,
            }
        }
        last_attempt = Instant::now();
        let answer = link.refresh().await;
        up = answer.answered();
        model.update(answer.command()).await;
        retry = if up { MIN_RETRY } else { (retry * 2).min(MAX_RETRY) };
    }
}

// The model's own tests cover what naming means; these check what the link hands it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        event::{CgroupDetail, Detail, Event},
        node::{NodeTracker, TrackerConfig},
        time::BootTime,
    };

    const POD_UID: &str = "00000000-0000-0000-0000-000000000007";

    /// A tracker waiting for the runtime, with one container cgroup it cannot name yet.
    fn waiting_for_names() -> NodeTracker {
        let mut tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
        let path = format!("/kubepods/besteffort/pod{POD_UID}/{}", "cd".repeat(32));
        let mkdir = Detail::CgroupMkdir(CgroupDetail { id: 77, path, truncated: false });
        let outcome = tracker.apply(&Event { at: BootTime::from_ns(1), pid: 1, tgid: 1, cgroup_id: 1, detail: mkdir });
        assert!(!outcome.notices.is_empty(), "it asks for the runtime's metadata");
        assert_eq!(tracker.units().count(), 0, "not named yet");
        tracker
    }

    #[test]
    fn a_listing_names_the_containers_waiting_for_it() {
        let mut tracker = waiting_for_names();
        let meta = lifecycle_testkit::fixtures::running_container(&"cd".repeat(32), POD_UID, "shop", "web-0", "app");
        let answer = Answer::Listed(vec![meta]);
        assert!(answer.answered());
        let _ = tracker.handle(answer.command(), BootTime::from_ns(2));
        let names: Vec<String> = tracker.units().map(|u| u.labels().container.clone()).collect();
        assert_eq!(names, ["app"]);
    }

    #[test]
    fn an_unreachable_runtime_has_the_waiting_containers_named_by_id() {
        let mut tracker = waiting_for_names();
        let answer = Answer::Unreachable;
        assert!(!answer.answered());
        let _ = tracker.handle(answer.command(), BootTime::from_ns(2));
        let units: Vec<(String, bool)> = tracker.units().map(|u| (u.labels().uid.clone(), u.named_by_id())).collect();
        assert_eq!(units, [(POD_UID.to_owned(), true)]);
    }
}
