//! The Kubernetes API feeding the tracker: pod changes (spec, deletion, reported status) and the
//! kubelet's probe-kill notices. Without credentials the agent goes on exactly as without the
//! API (one line); an API that does not answer, at start or later, is retried with back-off
//! while the tracker marks verdicts made meanwhile as lacking the spec.

use crate::export::families::AgentFamily;
use std::{collections::HashSet, path::PathBuf};

use futures::StreamExt as _;
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::watch;

use crate::owner::ModelHandle;
use crate::{
    discovery::clock::{boottime_ns, wall_to_boottime},
    discovery::kube::{
        convert::pod_facts,
        watch::{KubeError, KubeSource, PodChange},
        words::ApiWords,
    },
    model::{
        node::Command,
        spec::{KillNotice, LivenessFailure, PodRef},
        time::BootTime,
    },
};

/// A source when credentials exist; None (after one clear line) when the agent runs without
/// them. A `--kubeconfig` that cannot be read or used is an error: the operator named it, and an
/// agent that quietly ran without the API would judge every stop without the pod's spec. A
/// `KUBECONFIG` that cannot be used is a warning (the environment may be inherited). An API
/// that does not answer at start is no reason to go without it for the agent's life: the
/// watches retry with back-off, and verdicts are marked `api_unreachable` (and
/// `lifecycle_kubernetes_api_up` is 0) until the first list arrives.
pub(super) async fn connect(
    kubeconfig: Option<PathBuf>,
    node_name: Option<String>,
) -> Result<Option<KubeSource>, super::AgentError> {
    let node = KubeSource::node_name(node_name);
    let explicit = kubeconfig.is_some();
    let source = match KubeSource::configure(kubeconfig, node.clone()).await {
        Ok(source) => source,
        Err(KubeError::NotConfigured) => {
            log::info!("no Kubernetes API configured: verdicts use the runtime's labels (CRI) and cgroups");
            return Ok(None);
        }
        Err(err) if explicit => return Err(super::AgentError::Kubeconfig(ApiWords(&err).to_string())),
        Err(err) => {
            log::warn!(
                "the Kubernetes API is not usable ({}): verdicts use the runtime's labels (CRI) and cgroups",
                ApiWords(&err)
            );
            return Ok(None);
        }
    };
    match source.check().await {
        Ok(()) => log::info!("pod specs and status from the Kubernetes API (pods of node {node})"),
        Err(err) => log::warn!(
            "the Kubernetes API does not answer yet ({}); retrying in the background, verdicts meanwhile are \
             marked api_unreachable",
            ApiWords(&err)
        ),
    }
    Ok(Some(source))
}

/// `lifecycle_kubernetes_api_up` and `lifecycle_kubernetes_api_watch_errors_total`.
#[derive(Clone)]
pub(super) struct KubeMetrics {
    up: IntGauge,
    errors: IntCounter,
    /// Notices whose Event names a pod of this node by the uid of another (forged).
    notices_refused: IntCounter,
}

impl KubeMetrics {
    pub(super) fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let up = IntGauge::with_opts(AgentFamily::KubernetesUp.family().opts())?;
        let errors = IntCounter::with_opts(AgentFamily::KubernetesWatchErrors.family().opts())?;
        let notices_refused = IntCounter::with_opts(AgentFamily::KubernetesNoticesRefused.family().opts())?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(notices_refused.clone()))?;
        Ok(Self { up, errors, notices_refused })
    }

    /// The count of forged notices, for the notice sink (the model refuses them).
    pub(super) fn notices_refused(&self) -> IntCounter {
        self.notices_refused.clone()
    }
}

/// Applies pod changes to the tracker until shutdown.
pub(super) async fn pod_loop(
    source: KubeSource,
    model: ModelHandle,
    metrics: KubeMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let stream = source.pods();
    let mut stream = std::pin::pin!(stream);
    let mut relisted: Option<HashSet<String>> = None;
    let mut up = true;
    loop {
        let change = tokio::select! {
            change = stream.next() => change,
            _ = shutdown.changed() => return,
        };
        let Some(change) = change else { return };
        match change {
            PodChange::Relisting => relisted = Some(HashSet::new()),
            PodChange::Pod(pod) => {
                let mut problems = Vec::new();
                if let Some(facts) = pod_facts(&pod, &mut problems) {
                    for problem in problems {
                        log::warn!("pod {}/{}: {}: {}", facts.namespace, facts.name, problem.field, problem.why);
                    }
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(facts.uid.clone());
                    }
                    // A new pod, or a changed declaration, reaches the probe supervisor in the
                    // snapshot this waits for: its listener is made before the kubelet's first
                    // probe, not at a tick.
                    model.update(Command::Pod(facts)).await;
                }
            }
            PodChange::Listed => {
                let listed = relisted.take().map(|seen| seen.into_iter().collect());
                model.update(Command::PodsListed { listed }).await;
                metrics.up.set(1);
                if !up {
                    log::info!("the Kubernetes API answers again");
                }
                up = true;
            }
            PodChange::Gone(pod) => {
                let mut problems = Vec::new();
                match pod_facts(&pod, &mut problems) {
                    Some(facts) => model.update(Command::PodGone(facts)).await,
                    None => {
                        if let Some(uid) = pod.metadata.uid.clone() {
                            model.update(Command::PodForgotten { uid }).await;
                        }
                    }
                }
            }
            PodChange::Unreachable(why) => {
                model.update(Command::ApiUnreachable).await;
                metrics.up.set(0);
                metrics.errors.inc();
                if up {
                    log::warn!("the pod watch failed ({why}); retrying, verdicts meanwhile are marked api_unreachable");
                }
                up = false;
            }
        }
    }
}

/// A notice from the kubelet's Events.
enum KubeletNotice {
    Kill(KillNotice),
    Eviction(PodRef),
    /// A failed liveness probe, and when the kubelet recorded it (wall clock).
    LivenessFailure(LivenessFailure, Option<std::time::SystemTime>),
}

/// Applies the kubelet's probe-kill and eviction notices and its liveness failures to the
/// tracker until shutdown.
pub(super) async fn kill_loop(
    source: KubeSource,
    model: ModelHandle,
    metrics: KubeMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let kills = source.kill_notices().map(|n| n.map(KubeletNotice::Kill));
    let evictions = source.eviction_notices().map(|n| n.map(KubeletNotice::Eviction));
    let failures =
        source.liveness_failures().map(|n| n.map(|(failure, at)| KubeletNotice::LivenessFailure(failure, at)));
    let stream = futures::stream::select(futures::stream::select(kills, evictions), failures);
    let mut stream = std::pin::pin!(stream);
    loop {
        let notice = tokio::select! {
            notice = stream.next() => notice,
            _ = shutdown.changed() => return,
        };
        match notice {
            None => return,
            Some(Ok(notice)) => {
                // Events are not selected by node: the model applies only those naming a pod of
                // this node by namespace, name and uid, and tells of a uid of this node's pod
                // under other names (forged: `Notice::ForgedNotice`, counted by the notice sink).
                let command = match notice {
                    KubeletNotice::Kill(notice) => Command::KillNotice(notice),
                    KubeletNotice::Eviction(pod) => Command::EvictionNotice(pod),
                    KubeletNotice::LivenessFailure(failure, recorded) => {
                        // The kubelet's time of the failure, on the kernel's clock (the model takes
                        // one ahead of its own clock as now).
                        let now = boottime_ns();
                        let at = recorded.map_or(now, |t| wall_to_boottime(t, std::time::SystemTime::now(), now));
                        Command::LivenessFailure { failure, at: BootTime::from_ns(at) }
                    }
                };
                model.update(command).await;
            }
            Some(Err(why)) => {
                metrics.errors.inc();
                log::debug!("the event watch failed ({why}); retrying");
            }
        }
    }
}
