//! Keeps one probe listener per pod, inside the pod's network namespace, in step with the
//! containers the tracker sees running: a new container gets a [`PodProbe`]; a restarted one gets
//! a fresh probe on its new main process; a pod whose sandbox (netns) changed is rebound.
//! Host-network pods are served by the node listener (`/api/v1/probe/...`) instead.
//!
//! Plumbing: it reads /proc (namespaces) and binds sockets; decisions come from `probe::*`.

use crate::ErrorChain;
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    discovery::netns,
    model::node::{NodeTracker, RunningContainer},
    probe::{
        bind_in_netns, metrics::ProbeMetrics, metrics::ProbeTarget, pod::DEFAULT_REFRESH, query::Query,
        server::BlockingServer, CheckSpec, NodeProbes, PodProbe, ProbeAnswer,
    },
};

/// A running per-pod listener; dropping it stops its thread.
struct PodListener {
    netns: u32,
    _server: BlockingServer,
}

/// The supervisor's state across reconciliations.
pub struct ProbeSupervisor {
    probes: Arc<NodeProbes>,
    metrics: Arc<ProbeMetrics>,
    /// Port of the per-pod listeners; None serves only the node endpoint.
    pod_port: Option<u16>,
    host_netns: u32,
    listeners: HashMap<(String, String), PodListener>,
    /// Target -> (main pid, refresher stop).
    running: HashMap<ProbeTarget, (u32, watch::Sender<bool>)>,
    shutdown: watch::Receiver<bool>,
}

impl ProbeSupervisor {
    pub fn new(
        probes: Arc<NodeProbes>,
        metrics: Arc<ProbeMetrics>,
        pod_port: Option<u16>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            probes,
            metrics,
            pod_port,
            // The agent runs in the node's network namespace (hostNetwork), so its own netns is
            // the one host-network pods share.
            host_netns: netns::inode(&netns::own()).unwrap_or(0),
            listeners: HashMap::new(),
            running: HashMap::new(),
            shutdown,
        }
    }

    /// Brings probes and listeners in line with the containers running now.
    pub fn reconcile(&mut self, tracker: &Mutex<NodeTracker>) {
        let running = tracker.lock().unwrap_or_else(|poison| poison.into_inner()).running_containers();
        let mut seen = Vec::new();
        for RunningContainer { labels, main_pid: pid, .. } in running {
            let target = ProbeTarget {
                namespace: labels.namespace.clone(),
                pod: labels.pod.clone(),
                container: labels.container.clone(),
            };
            seen.push(target.clone());
            if self.running.get(&target).is_some_and(|(known, _)| *known == pid) {
                continue;
            }
            match PodProbe::new(target.clone(), pid, Some(self.metrics.clone())) {
                Ok(probe) => {
                    let probe = Arc::new(probe);
                    let netns = probe.netns();
                    self.probes.insert(probe.clone());
                    let (stop, stopped) = watch::channel(false);
                    tokio::spawn(probe.run_refresher(DEFAULT_REFRESH, stopped));
                    if let Some((_, old)) = self.running.insert(target.clone(), (pid, stop)) {
                        let _ = old.send(true);
                    }
                    self.ensure_listener(&labels.namespace, &labels.pod, pid, netns);
                }
                Err(err) => {
                    log::debug!(
                        "no probes for {}/{}/{} yet: {}",
                        target.namespace,
                        target.pod,
                        target.container,
                        ErrorChain(&err)
                    )
                }
            }
        }
        // Containers that stopped running keep their probe (it answers "gone") until their unit
        // expires from the tracker; then everything about them goes.
        let known: Vec<ProbeTarget> = self.running.keys().cloned().collect();
        let units = tracker.lock().unwrap_or_else(|poison| poison.into_inner()).unit_targets();
        for target in known {
            if !seen.contains(&target)
                && !units.contains(&(target.namespace.clone(), target.pod.clone(), target.container.clone()))
            {
                if let Some((_, stop)) = self.running.remove(&target) {
                    let _ = stop.send(true);
                }
                self.probes.remove(&target);
            }
        }
        let pods_alive: Vec<(String, String)> =
            self.running.keys().map(|t| (t.namespace.clone(), t.pod.clone())).collect();
        // Listeners of pods that are gone are dropped, which stops them.
        self.listeners.retain(|pod, _| pods_alive.contains(pod));
    }

    fn ensure_listener(&mut self, namespace: &str, pod: &str, pid: u32, netns: u32) {
        let Some(port) = self.pod_port else { return };
        // Host-network pods share the node's netns: the node endpoint serves them.
        if netns == 0 || netns == self.host_netns {
            return;
        }
        let key = (namespace.to_owned(), pod.to_owned());
        if self.listeners.get(&key).is_some_and(|l| l.netns == netns) {
            return;
        }
        let path = netns::of_pid(pid);
        match bind_in_netns(&path, SocketAddr::from(([0, 0, 0, 0], port))) {
            Ok(listener) => {
                let answer: Arc<dyn ProbeAnswer> =
                    Arc::new(PodAnswer { probes: self.probes.clone(), namespace: key.0.clone(), pod: key.1.clone() });
                match BlockingServer::start(listener, answer) {
                    Ok(server) => {
                        log::info!("probe listener for {namespace}/{pod} on port {port} in its network namespace");
                        // Replacing an old listener (the pod's sandbox changed) drops, and so stops, it.
                        self.listeners.insert(key, PodListener { netns, _server: server });
                    }
                    Err(err) => log::warn!("no probe listener for {namespace}/{pod}: {}", ErrorChain(&err)),
                }
            }
            Err(err) => log::warn!("no probe listener for {namespace}/{pod}: {}", ErrorChain(&err)),
        }
    }

    /// Runs reconciliation every `period` until shutdown.
    pub async fn run(mut self, tracker: Arc<Mutex<NodeTracker>>, period: Duration) {
        let mut ticker = tokio::time::interval(period);
        let mut shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                _ = ticker.tick() => self.reconcile(&tracker),
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Answers `/probe/<kind>?...[&container=<name>]` on a pod's listener.
struct PodAnswer {
    probes: Arc<NodeProbes>,
    namespace: String,
    pod: String,
}

impl ProbeAnswer for PodAnswer {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let Some(kind) = path.strip_prefix("/probe/") else {
            return (404, "probes live at /probe/tcp, /probe/process, /probe/file, /probe/all\n".to_owned());
        };
        let mut query = match Query::parse(query) {
            Ok(query) => query,
            Err(err) => return (400, format!("{err}\n")),
        };
        let container = match query.take("container") {
            Some(name) => name,
            None => {
                let containers = self.probes.containers_of(&self.namespace, &self.pod);
                match <[String; 1]>::try_from(containers) {
                    Ok([only]) => only,
                    Err(containers) => {
                        return (
                            400,
                            format!(
                                "pod has containers {}; add container=<name> to the query\n",
                                containers.join(", ")
                            ),
                        )
                    }
                }
            }
        };
        let spec = match CheckSpec::from_query(kind.trim_end_matches('/'), &query) {
            Ok(spec) => spec,
            Err(err) => return (400, format!("{err}\n")),
        };
        let target = ProbeTarget { namespace: self.namespace.clone(), pod: self.pod.clone(), container };
        self.probes.answer_check(&target, &spec)
    }
}
