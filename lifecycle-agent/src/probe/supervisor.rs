//! Keeps one probe listener per pod, inside the pod's network namespace, in step with the
//! containers the tracker sees running and the checks their pods declared: a container with
//! declared checks gets a [`PodProbe`]; a restarted one gets a fresh probe on its new main
//! process; a pod whose sandbox (netns) changed is rebound. Pods that declared nothing get no
//! probe and no listener. Host-network pods are served by the node endpoint
//! (`/api/v1/probe/...`) instead.
//!
//! What each pod declared is read by `pod_declarations.rs`.
//!
//! It follows the model's snapshots: a pass runs when one of another generation is published
//! (containers, their states, names or pods changed; at most one pass per [`MIN_PASS_GAP`]), not
//! on a poll; a tick (a second) beats its heartbeat and re-reads the node's addresses (the
//! listeners' default source filter), which each pass reads too before it binds a listener. The containers it probes it tells the model to watch (their netns, main pid and
//! declared ports, with a first /proc sample), and it opens each one's feed of facts first, so
//! a new probe answers from the model's facts from its first request.
//!
//! Plumbing: it reads /proc (namespaces) and binds sockets; decisions come from `probe::*`.

use crate::ErrorChain;
use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use crate::handoff::{
    holder::holder_of,
    registry::{Registration, Registry},
    verify, Serves, SocketFacts,
};
use crate::{
    discovery::{clock::boottime_ns, netns},
    model::node::{Command, NodeSnapshot, ProbeKey, RunningContainer},
    probe::{
        bind_in_netns,
        container::ProbedContainer,
        feeds::ProbeFeeds,
        files::FileReaders,
        listener::{ListenerLimits, ProbeListener, ProbeListeners},
        metrics::ProbeMetrics,
        pod::DEFAULT_REFRESH,
        pod_declarations::{DeclarationSources, PodDeclarations},
        server::{PodRouter, ServerError},
        source::SourceFilter,
        CheckSpec, NodeProbes, PodProbe, ProbeAnswer,
    },
};
use crate::{
    heartbeats::{Heartbeats, Loop},
    owner::ModelHandle,
};

/// A running per-pod listener; dropping it closes it.
struct PodListener {
    netns: u32,
    _server: ProbeListener,
    /// Offered to a successor agent, and kept by the socket keeper, while it serves (`handoff`).
    _handoff: Option<Registration>,
}

/// A container with a probe (its key and names are the probe's).
struct Probed {
    pid: u32,
    declared: Vec<CheckSpec>,
    probe: Arc<PodProbe>,
    /// Stops the probe's refresher.
    stop: watch::Sender<bool>,
}

/// A probe made in a pass, served once the model watches it.
struct Fresh {
    pid: u32,
    declared: Vec<CheckSpec>,
    probe: Arc<PodProbe>,
}

/// The supervisor's state across reconciliations.
pub(crate) struct ProbeSupervisor {
    probes: Arc<NodeProbes>,
    /// The probed containers' feeds of facts, opened here and published into by the model's owner.
    feeds: Arc<ProbeFeeds>,
    /// The model the probes' samples go to (set by [`Self::run`]).
    model: Option<ModelHandle>,
    /// Beaten per unit of work of a pass (each container, each listener), not only after the
    /// pass: liveness tells a pass that is stuck from one that is long (set by [`Self::run`]).
    heartbeats: Option<Arc<Heartbeats>>,
    /// The node's threads for reading declared files (the probes', bounded together).
    readers: Arc<FileReaders>,
    metrics: Arc<ProbeMetrics>,
    /// Port of the per-pod listeners; None serves only the node endpoint.
    pod_port: Option<u16>,
    /// Who may connect to the per-pod listeners.
    sources: SourceFilter,
    host_netns: u32,
    listeners: HashMap<(String, String), PodListener>,
    running: HashMap<ProbeKey, Probed>,
    /// Commands for the model from this pass, sent at its end.
    commands: Vec<Command>,
    declarations: PodDeclarations,
    shutdown: watch::Receiver<bool>,
    /// Listening sockets taken from the previous agent, by netns inode, until their pods claim
    /// them (or [`ADOPTION_WINDOW`] passes).
    adopted: Adopted,
    adopted_until: Instant,
    /// This agent's listeners, offered to its successor.
    registry: Arc<Registry>,
    /// Set once adopted listeners are claimed or given up (`/readyz`).
    settled: Arc<AtomicBool>,
    /// The one loop serving every pod listener, started with the first (last: the listeners
    /// above close through it when the supervisor goes).
    serving: Option<ProbeListeners>,
}

/// Pod listeners taken from the previous agent or the socket keeper, by netns inode, not yet
/// checked (each is checked when its pod claims it).
pub(crate) type Adopted = std::collections::HashMap<u32, (SocketFacts, std::os::fd::OwnedFd)>;

/// How long sockets taken from the previous agent wait for their pods to be known again.
pub(crate) const ADOPTION_WINDOW: Duration = Duration::from_secs(30);
/// Least time between passes made on notice (`run`'s `wanted`): a node starting, or a burst of
/// pod updates, costs a pass per this, not one per update.
pub(crate) const MIN_PASS_GAP: Duration = Duration::from_millis(100);

impl ProbeSupervisor {
    /// Serves the listeners `adopted` from the previous agent or the socket keeper (`handoff`)
    /// instead of binding new ones, once each is checked to be its pod's; offers its own in
    /// `registry`, and sets `settled` once no adopted listener waits any more.
    pub(crate) fn with_handoff(mut self, adopted: Adopted, registry: Arc<Registry>, settled: Arc<AtomicBool>) -> Self {
        self.adopted = adopted;
        self.adopted_until = Instant::now() + ADOPTION_WINDOW;
        self.registry = registry;
        self.settled = settled;
        self
    }

    pub(crate) fn new(
        probes: Arc<NodeProbes>,
        feeds: Arc<ProbeFeeds>,
        metrics: Arc<ProbeMetrics>,
        pod_port: Option<u16>,
        sources: SourceFilter,
        readers: Arc<FileReaders>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            probes,
            feeds,
            model: None,
            heartbeats: None,
            readers,
            commands: Vec::new(),
            metrics,
            pod_port,
            sources,
            // The agent runs in the node's network namespace (hostNetwork), so its own netns is
            // the one host-network pods share.
            host_netns: netns::inode(&netns::own()).unwrap_or(0),
            listeners: HashMap::new(),
            running: HashMap::new(),
            declarations: PodDeclarations::default(),
            shutdown,
            adopted: Adopted::new(),
            adopted_until: Instant::now(),
            registry: Arc::default(),
            settled: Arc::new(AtomicBool::new(false)),
            serving: None,
        }
    }

    /// Brings probes and listeners in line with the containers running now and what their pods
    /// declared; `commit` runs the pass's commands on the model and returns once their facts are
    /// published, before new probes are served.
    pub(crate) fn reconcile(&mut self, model: &NodeSnapshot, commit: &dyn Fn(Vec<Command>)) {
        // A new pod's sandbox can bring the node a new address (the CNI bridge's, made with the
        // first pod), and the kubelet probes from it as soon as the listener is bound: read
        // them before binding, not only at the next tick.
        if let Err(err) = self.sources.refresh_node_addresses() {
            log::warn!("cannot read the node's addresses (probe listeners keep the last ones): {err}");
        }
        let running = model.running_containers();
        let mut seen = HashSet::new();
        let mut fresh = Vec::new();
        for container in running {
            self.beat();
            let sources = DeclarationSources::of(&container, self.pod_port);
            let RunningContainer { labels, main_pid: pid, .. } = container;
            let declared = self.declarations.checks_for(&labels, sources, &self.metrics);
            let container = ProbedContainer::new(labels);
            let key = container.key().clone();
            seen.insert(key.clone());
            if let Some(known) = self.running.get_mut(&key).filter(|known| known.pid == pid) {
                if known.declared != declared && !declared.is_empty() {
                    known.probe.declare(declared.clone());
                    known.declared = declared;
                    self.commands.push(Command::WatchProbe { key, watch: known.probe.watch(), first: None });
                    let (labels, netns) = (container.labels(), known.probe.netns());
                    self.ensure_listener(&labels.namespace, &labels.pod, pid, netns);
                } else if declared.is_empty() {
                    self.drop_probe(&key);
                }
                continue;
            }
            if declared.is_empty() {
                self.drop_probe(&key);
                continue;
            }
            let facts = self.feeds.open(&key);
            let readers = Arc::clone(&self.readers);
            let names = container.to_string();
            match PodProbe::new(container, pid, Some(self.metrics.clone()), facts, readers) {
                Ok(probe) => {
                    probe.declare(declared.clone());
                    let first = match probe.sample(boottime_ns()) {
                        Ok(sample) => Some(sample),
                        Err(err) => {
                            log::debug!("first probe sample of {names}: {}", ErrorChain(&err));
                            None
                        }
                    };
                    self.commands.push(Command::WatchProbe { key, watch: probe.watch(), first });
                    fresh.push(Fresh { pid, declared, probe: Arc::new(probe) });
                }
                Err(err) => {
                    self.feeds.close(&key);
                    log::debug!("no probes for {names} yet: {}", ErrorChain(&err))
                }
            }
        }
        // Containers that stopped running keep their probe (it answers "gone") until their unit
        // expires from the tracker; then everything about them goes.
        let unseen = self.running.keys().any(|key| !seen.contains(key));
        let units = if unseen { model.tracked_probe_keys() } else { HashSet::new() };
        let gone: Vec<ProbeKey> =
            self.running.keys().filter(|key| !seen.contains(*key) && !units.contains(*key)).cloned().collect();
        for key in gone {
            self.drop_probe(&key);
        }
        // The model watches the new probes, and their first facts are out, before they answer.
        let commands = std::mem::take(&mut self.commands);
        if !commands.is_empty() {
            commit(commands);
        }
        for Fresh { pid, declared, probe } in fresh {
            self.probes.insert(probe.clone());
            let (stop, stopped) = watch::channel(false);
            if let Some(model) = &self.model {
                tokio::spawn(probe.clone().run_refresher(DEFAULT_REFRESH, model.clone(), stopped));
            }
            let (key, labels, netns) = (probe.key().clone(), probe.container().labels().clone(), probe.netns());
            if let Some(old) = self.running.insert(key, Probed { pid, declared, probe, stop }) {
                let _ = old.stop.send(true);
            }
            self.ensure_listener(&labels.namespace, &labels.pod, pid, netns);
        }
        // Listeners are kept per pod name, which their router resolves requests by: one goes,
        // and so stops, once no probe of a pod under its name is left.
        let pods_alive: HashSet<(&str, &str)> = self
            .running
            .values()
            .map(|probed| probed.probe.container().labels())
            .map(|labels| (labels.namespace.as_str(), labels.pod.as_str()))
            .collect();
        self.listeners.retain(|(namespace, pod), _| pods_alive.contains(&(namespace.as_str(), pod.as_str())));
        // Declarations are kept, by pod uid, for pods running or probed: each is parsed (and
        // its refusals told) once per text, not once per pass.
        let pods_kept: HashSet<&str> = self.running.keys().chain(&seen).map(|key| key.uid.as_str()).collect();
        self.declarations.retain(|uid| pods_kept.contains(uid));
    }

    /// Closes sockets taken from the previous agent that no pod claimed within the window.
    fn settle_adoption(&mut self) {
        if !self.adopted.is_empty() && Instant::now() >= self.adopted_until {
            log::info!("{} probe listener(s) taken from the previous agent matched no pod; closed", self.adopted.len());
            self.adopted.clear();
        }
        if self.adopted.is_empty() {
            self.settled.store(true, Ordering::Release);
        }
    }

    /// Forgets a container's probe: its refresher stops, the model stops watching it, its
    /// series go.
    fn drop_probe(&mut self, key: &ProbeKey) {
        let Some(probed) = self.running.remove(key) else { return };
        let _ = probed.stop.send(true);
        self.feeds.close(key);
        self.commands.push(Command::UnwatchProbe { key: key.clone() });
        // Its series and its route go with it; a pod recreated under its name keeps its own.
        self.probes.remove(key);
        self.metrics.forget(key);
    }

    /// This loop made progress (see [`Self::heartbeats`]).
    fn beat(&self) {
        if let Some(heartbeats) = &self.heartbeats {
            heartbeats.beat(Loop::ProbeSupervisor);
        }
    }

    fn ensure_listener(&mut self, namespace: &str, pod: &str, pid: u32, netns: u32) {
        self.beat();
        let Some(port) = self.pod_port else { return };
        // Host-network pods share the node's netns: the node endpoint serves them.
        if netns == 0 || netns == self.host_netns {
            return;
        }
        let key = (namespace.to_owned(), pod.to_owned());
        if self.listeners.get(&key).is_some_and(|l| l.netns == netns) {
            return;
        }
        // The previous agent's socket for this netns, still listening (its backlog kept every
        // connection made meanwhile), if it is one bound where this pod's is, in this pod's
        // namespace (the sender's word is not taken); else a new one.
        let addr = SocketAddr::from(([0, 0, 0, 0], port));
        let pod_netns = netns::of_pid(pid);
        let adopted = self.adopted.remove(&netns).and_then(|(_, fd)| match verify::listener(fd, addr, &pod_netns) {
            Ok(listener) => Some(listener),
            Err(mismatch) => {
                log::warn!("the probe listener handed over for {namespace}/{pod} is not used: {mismatch}");
                None
            }
        });
        let was_adopted = adopted.is_some();
        let bound = match adopted {
            Some(listener) => Ok(listener),
            None => bind_in_netns(&pod_netns, addr),
        };
        match bound {
            Ok(listener) => {
                let serves = Serves::Pod { namespace: namespace.to_owned(), pod: pod.to_owned(), netns };
                let facts = SocketFacts { serves, addr };
                let handoff = match self.registry.register(facts, &listener) {
                    Ok(registration) => Some(registration),
                    Err(err) => {
                        log::warn!("the probe listener of {namespace}/{pod} cannot be offered to a successor: {err}");
                        None
                    }
                };
                let answer: Arc<dyn ProbeAnswer> = Arc::new(PodRouter::new(self.probes.clone(), &key.0, &key.1));
                let counters = self.metrics.connection_counters();
                let served = match self.serving.take() {
                    Some(serving) => Ok(serving),
                    None => ProbeListeners::start(ListenerLimits::default()),
                }
                .and_then(|serving| {
                    let served = serving.serve(listener, answer, self.sources.clone(), counters);
                    self.serving = Some(serving);
                    served
                });
                match served {
                    Ok(server) => {
                        let how = if was_adopted { "taken over from the previous agent" } else { "bound" };
                        log::info!(
                            "probe listener for {namespace}/{pod} on port {port} in its network namespace ({how})"
                        );
                        // Replacing an old listener (the pod's sandbox changed) drops, and so stops, it.
                        self.listeners.insert(key, PodListener { netns, _server: server, _handoff: handoff });
                    }
                    Err(err) => log::warn!("no probe listener for {namespace}/{pod}: {}", ErrorChain(&err)),
                }
            }
            Err(err) => {
                // Someone else listens there (the pod's own app, another agent): say who.
                let in_use =
                    matches!(&err, ServerError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse);
                let holder = in_use.then(|| holder_of(&pod_netns, port)).flatten();
                let held = holder.map(|holder| format!(" (held by {holder})")).unwrap_or_default();
                log::warn!("no probe listener for {namespace}/{pod}: {}{held}", ErrorChain(&err));
            }
        }
    }

    /// A newer agent serves this node's sockets now (`handoff`): every pod listener is closed
    /// here, none is bound again, and the successor's copies serve on alone.
    fn stop_serving(&mut self) {
        if self.pod_port.take().is_some() {
            log::info!("replaced: {} pod probe listener(s) are served by the newer agent alone", self.listeners.len());
        }
        self.listeners.clear();
    }

    /// Runs a pass each time `model` publishes a snapshot of another generation (containers,
    /// their states, names or pods changed; not when only counters moved), at most one per
    /// [`MIN_PASS_GAP`] (a node starting, or a burst of pod updates, costs a few passes, not one
    /// each), until shutdown. Every `period` it beats `heartbeats` (so `/healthz` tells a stuck supervisor),
    /// re-reads the node's addresses and settles the adopted listeners, without a pass unless a
    /// snapshot came meanwhile.
    ///
    /// Each pass runs on the blocking pool: it reads /proc and opens netlink sockets in pods'
    /// namespaces, which belong on no worker that answers requests. It never reads a declared
    /// file, nor waits for one (the probes' refreshers start those reads, `files.rs`), and it
    /// beats per container and listener.
    pub(crate) async fn run(self, model: ModelHandle, period: Duration, heartbeats: Arc<Heartbeats>) {
        let mut snapshots = model.snapshots();
        let mut ticker = tokio::time::interval(period);
        let mut shutdown = self.shutdown.clone();
        let mut supervisor = self;
        supervisor.model = Some(model.clone());
        supervisor.heartbeats = Some(heartbeats.clone());
        let mut last_pass = Instant::now();
        let mut reconciled: Option<u64> = None;
        let mut addresses_read = false;
        loop {
            let tick = tokio::select! {
                _ = ticker.tick() => true,
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Counters alone moved: nothing a pass would change, and nothing to wait for.
                    if reconciled == Some(snapshots.borrow_and_update().generation()) {
                        continue;
                    }
                    tokio::time::sleep(MIN_PASS_GAP.saturating_sub(last_pass.elapsed())).await;
                    false
                }
                _ = shutdown.changed() => return,
            };
            let snapshot = snapshots.borrow_and_update().clone();
            let mut new = reconciled != Some(snapshot.generation());
            if new && supervisor.running.is_empty() && !snapshot.declares_probes(supervisor.pod_port) {
                // Nothing probed, nothing declared (most nodes, most of the time): a pass would
                // change nothing, and a node with containers restarting would make ten a second.
                reconciled = Some(snapshot.generation());
                new = false;
            }
            let model = model.clone();
            let pass_snapshot = snapshot.clone();
            let read_addresses = tick || !addresses_read;
            addresses_read = true;
            let pass = tokio::task::spawn_blocking(move || {
                // The node's addresses (who may connect) are read every tick, and by every pass
                // (which runs only when containers changed and something is probed or declared).
                if read_addresses && !new {
                    if let Err(err) = supervisor.sources.refresh_node_addresses() {
                        log::warn!("cannot read the node's addresses (probe listeners keep the last ones): {err}");
                    }
                }
                if new {
                    let commit = |commands: Vec<Command>| model.update_all_blocking(commands);
                    supervisor.reconcile(&pass_snapshot, &commit);
                }
                supervisor.settle_adoption();
                supervisor
            });
            supervisor = match pass.await {
                Ok(supervisor) => supervisor,
                Err(err) => {
                    // Its heartbeat stops: /healthz fails and the kubelet restarts the agent.
                    log::error!("the probe supervisor failed: {err}; pod probe listeners are no longer kept");
                    return;
                }
            };
            if new {
                last_pass = Instant::now();
                reconciled = Some(snapshot.generation());
            }
            if heartbeats.handed_over.load(Ordering::Acquire) {
                supervisor.stop_serving();
            }
            heartbeats.beat(Loop::ProbeSupervisor);
        }
    }
}
