//! Every metric family the agent registers beside the exporter's own (`Metrics::new`: features,
//! build, ring, the kernel's statistics), made and registered in one call, [`register_all`],
//! before any loop starts: the wiring in `agent::run` takes its handles from one value instead of
//! registering between the components it builds, and a test checks that the exporter's
//! families and these together are exactly the agent's list in `export/families.rs` (nothing
//! listed is left unregistered, nothing is registered twice).

use std::sync::Arc;

use prometheus::{Histogram, IntCounterVec, Registry};

use super::{auth, events, http, kube, kubelet, routes::Waits, systemd, tasks};
use crate::{
    export::{families::AgentFamily, metrics::RuntimeMetrics},
    probe::{files::FileReaders, metrics::ProbeMetrics},
};

/// Which optional parts run, and so have families.
#[derive(Clone, Copy, Debug)]
pub(super) struct Wanted {
    /// The Kubernetes API is configured: its watch's health.
    pub kube: bool,
    /// Warnings are sent as Kubernetes Events.
    pub events: bool,
    /// `--api-auth kubernetes`: the gate's reviews.
    pub api_auth: bool,
}

/// The handles of every family registered by [`register_all`].
pub(super) struct AgentMetrics {
    /// `lifecycle_event_to_state_seconds`.
    pub event_to_state: Histogram,
    /// `lifecycle_state_repairs_total`.
    pub repairs: IntCounterVec,
    pub probes: Arc<ProbeMetrics>,
    pub file_readers: Arc<FileReaders>,
    pub systemd: systemd::SystemdCounts,
    pub kubelet: kubelet::KubeletMetrics,
    pub runtime: RuntimeMetrics,
    pub kube: Option<kube::KubeMetrics>,
    /// `lifecycle_kubernetes_events_total`, when Events are sent.
    pub events: Option<IntCounterVec>,
    /// `lifecycle_api_auth_reviews_total`, when the API gate runs.
    pub api_reviews: Option<IntCounterVec>,
    pub waits: Arc<Waits>,
    /// `lifecycle_http_connections_rejected_total`, both listeners'.
    pub rejections: IntCounterVec,
}

/// Makes and registers every family of the agent's components into `registry` (the exporter's
/// own are already there).
pub(super) fn register_all(registry: &Registry, wanted: Wanted) -> Result<AgentMetrics, prometheus::Error> {
    let event_to_state = Histogram::with_opts(
        AgentFamily::EventToState
            .family()
            .histogram_opts(vec![0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
    )?;
    registry.register(Box::new(event_to_state.clone()))?;
    Ok(AgentMetrics {
        event_to_state,
        repairs: tasks::register_repairs(registry)?,
        probes: ProbeMetrics::register(registry)?,
        file_readers: FileReaders::register(registry)?,
        systemd: systemd::SystemdCounts::register(registry)?,
        kubelet: kubelet::KubeletMetrics::register(registry)?,
        runtime: RuntimeMetrics::register(registry)?,
        kube: wanted.kube.then(|| kube::KubeMetrics::register(registry)).transpose()?,
        events: (wanted.kube && wanted.events).then(|| events::register(registry)).transpose()?,
        api_reviews: wanted.api_auth.then(|| auth::register_reviews(registry)).transpose()?,
        waits: Arc::new(Waits::new(Some(registry))?),
        rejections: http::Rejections::register(registry)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{
        families::AGENT,
        metrics::{AgentCounters, KernelStats, Metrics},
        units::AGENT_FAMILIES_WRITTEN,
    };
    use lifecycle_common::{KindStats, EVENT_KIND_COUNT};
    use prometheus::Opts;

    /// Kernel statistics of nothing: the exporter registers its collector over them.
    struct NoKernel;

    impl KernelStats for NoKernel {
        fn kind_stats(&self) -> [KindStats; EVENT_KIND_COUNT] {
            [KindStats::default(); EVENT_KIND_COUNT]
        }
        fn counter_entries(&self) -> usize {
            0
        }
    }

    #[test]
    fn the_exporter_and_register_all_register_exactly_the_agent_families() {
        let metrics = Metrics::new(Arc::new(NoKernel), &[], 16, 4096, Arc::new(AgentCounters::default()))
            .expect("the exporter's families");
        let everything = Wanted { kube: true, events: true, api_auth: true };
        register_all(metrics.registry(), everything).expect("every family registers once");
        // prometheus' registry does not list its collectors, and gathering leaves out a
        // labelled family without series; but it refuses a second collector under a name it
        // has (`AlreadyReg`), and accepts one under a name it lacks.
        let written = AGENT_FAMILIES_WRITTEN.iter().map(|id| id.family().name).collect::<Vec<_>>();
        let missing: Vec<_> = AGENT
            .iter()
            .filter(|family| !written.contains(&family.name))
            .filter(|family| {
                let again = prometheus::IntCounter::with_opts(family.opts()).expect("valid name");
                !matches!(metrics.registry().register(Box::new(again)), Err(prometheus::Error::AlreadyReg))
            })
            .map(|family| family.name)
            .collect();
        assert!(missing.is_empty(), "listed in export/families.rs, registered by nobody: {missing:?}");
        // ... and the written ones are not registered as well (they would be served twice).
        for name in written {
            let again = prometheus::IntCounter::with_opts(
                Opts::new(name.trim_start_matches("lifecycle_"), "x").namespace("lifecycle"),
            )
            .expect("valid name");
            assert!(metrics.registry().register(Box::new(again)).is_ok(), "{name} is written and registered");
        }
        let unlisted: Vec<_> = metrics
            .registry()
            .gather()
            .iter()
            .map(|family| family.name().to_owned())
            .filter(|name| !AGENT.iter().any(|family| family.name == name))
            .collect();
        assert!(unlisted.is_empty(), "registered, not listed in export/families.rs: {unlisted:?}");
    }
}
