//! The node's kubelet, read when the agent starts and again at each start of the kubelet, and
//! handed to the model (`NodeTracker::set_kubelet`): every container's restarts are then judged
//! by the back-off this kubelet uses, and the rules that changed between releases by its release
//! and gates. What it believes is served on `/metrics` (`lifecycle_kubelet_*`) and logged when it
//! changes.
//!
//! The model tells when a kubelet starts (`Notice::KubeletStarted`, from the kernel's exec
//! record); the owner passes the pid here without waiting. The command line and files are read
//! at once (a restarted kubelet may run with another configuration: its first restarts follow
//! it); its release is asked of the Node object then, and again a few seconds later, when the
//! new kubelet has reported its own. A read every [`REFRESH`] catches a Node object that changed
//! otherwise.

use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Registry};
use tokio::sync::{mpsc, watch};

use crate::{
    discovery::{
        kube::watch::KubeSource,
        kubelet::{self, KubeletReadError},
    },
    export::families::AgentFamily,
    model::{
        kubelet::{BackoffChoice, KubeletFacts, KubeletOverrides, KubeletPolicy, KubeletSource, KubeletVersion},
        time::seconds,
    },
    ErrorChain,
};
use crate::{model::node::Command, owner::ModelHandle};

/// How often the kubelet is read again without a start to tell of.
const REFRESH: Duration = Duration::from_secs(300);
/// After a kubelet start, when its release is asked again: the new kubelet reports it at its
/// first node status update (within `nodeStatusUpdateFrequency`, 10 s by default).
const AFTER_START: [Duration; 2] = [Duration::from_secs(5), Duration::from_secs(30)];
/// Kubelet starts waiting to be read; more at once are one read anyway.
const QUEUED_STARTS: usize = 8;

/// `lifecycle_kubelet_info`, `_backoff_seconds`, `_feature_gate_enabled`, `_config_reads_total`.
#[derive(Clone)]
pub(crate) struct KubeletMetrics {
    info: IntGaugeVec,
    backoff: prometheus::GaugeVec,
    gates: IntGaugeVec,
    reads: IntCounterVec,
}

impl KubeletMetrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let family = |id: AgentFamily| id.family();
        let info = IntGaugeVec::new(family(AgentFamily::KubeletInfo).opts(), family(AgentFamily::KubeletInfo).labels)?;
        let backoff = prometheus::GaugeVec::new(
            family(AgentFamily::KubeletBackoff).opts(),
            family(AgentFamily::KubeletBackoff).labels,
        )?;
        let gates = IntGaugeVec::new(
            family(AgentFamily::KubeletFeatureGate).opts(),
            family(AgentFamily::KubeletFeatureGate).labels,
        )?;
        let reads =
            IntCounterVec::new(family(AgentFamily::KubeletReads).opts(), family(AgentFamily::KubeletReads).labels)?;
        for collector in [Box::new(info.clone()) as Box<dyn prometheus::core::Collector>, Box::new(backoff.clone())] {
            registry.register(collector)?;
        }
        registry.register(Box::new(gates.clone()))?;
        registry.register(Box::new(reads.clone()))?;
        for result in ["read", "not_found", "unreadable"] {
            reads.with_label_values(&[result]);
        }
        Ok(Self { info, backoff, gates, reads })
    }

    /// Shows `policy` (replacing what was shown).
    fn show(&self, policy: &KubeletPolicy) {
        let version = policy.version().map_or("unknown", |v| v.text.as_str());
        let driver = match policy.facts.config.as_ref().map(|c| c.cgroup_driver.as_str()) {
            Some(driver @ ("cgroupfs" | "systemd")) => driver,
            Some(_) => "other",
            None => "unknown",
        };
        let known = match policy.backoff {
            BackoffChoice::Known { .. } => "known",
            BackoffChoice::Unknown { .. } => "unknown",
        };
        self.info.reset();
        self.info.with_label_values(&[version, driver, policy.facts.source.as_str(), known]).set(1);
        self.backoff.reset();
        if let Some(backoff) = policy.backoff.policy() {
            for (bound, ns) in
                [("initial", backoff.initial_ns), ("max", backoff.max_ns), ("reset", backoff.reset_after_ns)]
            {
                self.backoff.with_label_values(&[bound]).set(seconds(ns));
            }
        }
        self.gates.reset();
        for state in &policy.gates {
            if let Some(on) = state.enabled {
                self.gates.with_label_values(&[state.gate.as_str()]).set(i64::from(on));
            }
        }
    }
}

/// What the agent reads of its kubelet, and how it says so.
pub(crate) struct KubeletLink {
    node: String,
    kube: Option<KubeSource>,
    overrides: KubeletOverrides,
    metrics: Option<KubeletMetrics>,
    /// The last release read: kept while the API does not answer.
    version: Option<KubeletVersion>,
    /// What the last read said, in one line: logged again only when it changes.
    said: String,
    /// The last error of the Node object's read, logged once.
    version_error: Option<String>,
    /// Log what is read (the agent); `doctor` prints it instead.
    log: bool,
}

impl KubeletLink {
    pub(crate) fn new(
        node: String,
        kube: Option<KubeSource>,
        overrides: KubeletOverrides,
        metrics: Option<KubeletMetrics>,
    ) -> Self {
        Self { node, kube, overrides, metrics, version: None, said: String::new(), version_error: None, log: true }
    }

    /// Reads without logging (`doctor` reports what it found itself).
    pub(crate) fn quiet(self) -> Self {
        Self { log: false, ..self }
    }

    /// Reads the kubelet (its process, its Node object) and derives what the agent expects of it.
    pub(crate) async fn read(&mut self) -> KubeletPolicy {
        let node = self.node.clone();
        let read = tokio::task::spawn_blocking(move || kubelet::find(&node).and_then(kubelet::read)).await;
        self.read_version().await;
        let facts = match read {
            Ok(Ok(read)) => {
                if self.log && !read.changed_since_start.is_empty() {
                    log::warn!(
                        "the kubelet's configuration changed after the kubelet started ({}): the running kubelet \
                         read it before; judged by what the files say now",
                        read.changed_since_start.join(", ")
                    );
                }
                for flag in read.command_line.unreadable.iter().filter(|_| self.log) {
                    log::warn!("the kubelet's flag {flag} could not be read");
                }
                match read.config {
                    Ok(config) => self.facts(KubeletSource::Node, Some(read.pid), Some(config), read.origin),
                    Err(err) => {
                        let why = format!("{}: {}", read.origin, ErrorChain(&err));
                        self.facts(KubeletSource::Unreadable, Some(read.pid), None, why)
                    }
                }
            }
            Ok(Err(err @ KubeletReadError::NotFound)) => {
                self.facts(KubeletSource::NotFound, None, None, ErrorChain(&err).to_string())
            }
            Ok(Err(err)) => self.facts(KubeletSource::Unreadable, None, None, ErrorChain(&err).to_string()),
            Err(join) => self.facts(KubeletSource::Unreadable, None, None, format!("the read did not finish: {join}")),
        };
        if let Some(metrics) = &self.metrics {
            let result = match facts.source {
                KubeletSource::Node => "read",
                KubeletSource::NotFound => "not_found",
                _ => "unreadable",
            };
            metrics.reads.with_label_values(&[result]).inc();
        }
        let policy = KubeletPolicy::derive(facts, self.overrides);
        if let Some(metrics) = &self.metrics {
            metrics.show(&policy);
        }
        self.say(&policy);
        policy
    }

    fn facts(
        &self,
        source: KubeletSource,
        pid: Option<u32>,
        config: Option<crate::model::kubelet::KubeletConfig>,
        origin: String,
    ) -> KubeletFacts {
        KubeletFacts { source, pid, version: self.version.clone(), config, origin }
    }

    async fn read_version(&mut self) {
        let Some(kube) = &self.kube else { return };
        match kube.kubelet_version().await {
            Ok(Some(text)) => match KubeletVersion::parse(&text) {
                Ok(version) => {
                    self.version = Some(version);
                    self.version_error = None;
                }
                Err(err) => self.version_failed(err.to_string()),
            },
            Ok(None) => {}
            Err(err) => self.version_failed(crate::discovery::kube::words::ApiWords(&err).to_string()),
        }
    }

    fn version_failed(&mut self, why: String) {
        if self.log && self.version_error.as_deref() != Some(why.as_str()) {
            log::warn!(
                "the kubelet's release is not known ({why}): rules keyed by it are decided where every release agrees"
            );
        }
        self.version_error = Some(why);
    }

    /// One line when what the agent believes changed.
    fn say(&mut self, policy: &KubeletPolicy) {
        let release = policy.version().map_or_else(|| "of unknown release".to_owned(), |v| v.to_string());
        let line = match &policy.backoff {
            BackoffChoice::Known { policy: backoff } => format!(
                "kubelet {release} ({}; {}): restarts judged by its back-off, {:.0}s doubling to {:.0}s",
                policy.facts.source.as_str(),
                policy.facts.origin,
                seconds(backoff.initial_ns),
                seconds(backoff.max_ns)
            ),
            BackoffChoice::Unknown { why } => {
                format!("restarts after a container's first are not judged: {why}")
            }
        };
        if self.log && line != self.said {
            match policy.backoff {
                BackoffChoice::Known { .. } => log::info!("{line}"),
                BackoffChoice::Unknown { .. } => log::warn!("{line}"),
            }
            self.said = line;
        }
    }
}

/// The sending side of the kubelet starts, for the model's owner: never waits.
#[derive(Clone)]
pub(crate) struct KubeletStarts(mpsc::Sender<u32>);

impl KubeletStarts {
    pub(crate) fn new() -> (Self, mpsc::Receiver<u32>) {
        let (sender, receiver) = mpsc::channel(QUEUED_STARTS);
        (Self(sender), receiver)
    }

    /// A kubelet started as `pid`; a full queue means a read is due anyway.
    pub(crate) fn started(&self, pid: u32) {
        let _ = self.0.try_send(pid);
    }
}

/// Reads the kubelet at each of its starts and every [`REFRESH`], until shutdown.
pub(super) async fn kubelet_loop(
    mut link: KubeletLink,
    model: ModelHandle,
    mut starts: mpsc::Receiver<u32>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH, REFRESH);
    // Reads still due after a start, soonest first.
    let mut due: Vec<tokio::time::Instant> = Vec::new();
    loop {
        let next_due = due.first().copied();
        tokio::select! {
            start = starts.recv() => {
                let Some(pid) = start else { return };
                // Several starts at once are one read.
                while starts.try_recv().is_ok() {}
                log::info!("the kubelet started (pid {pid}): reading its configuration again");
                let now = tokio::time::Instant::now();
                due = AFTER_START.iter().map(|after| now + *after).collect();
            }
            _ = refresh.tick() => {}
            _ = async { tokio::time::sleep_until(next_due.unwrap_or_else(tokio::time::Instant::now)).await },
                if next_due.is_some() => { due.remove(0); }
            _ = shutdown.changed() => return,
        }
        let policy = link.read().await;
        model.update(Command::Kubelet(policy)).await;
    }
}
