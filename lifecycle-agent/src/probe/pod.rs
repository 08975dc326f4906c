//! One container's probes: the checks its pod declared, answered from the model's facts of the
//! container (its netns's listeners and its main process, `model::node::ProbeFacts`, published
//! by the model's owner as kernel events change them) and the declared files this layer reads.
//! The probe samples /proc for the model on a period (queues, drop counters, process state) and
//! never reads a kernel event itself.
//!
//! Only declared checks are answered, watched and exported ([`PodProbe::declare`]); a request for
//! anything else gets 403 and changes nothing. The request path ([`PodProbe::answer_check`])
//! compares, takes the lock, evaluates and counts metrics: no /proc work, no new state.

use crate::ErrorChain;
use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, MutexGuard};

use tokio::sync::watch;

use super::{
    check::{CheckSpec, Observed, Verdict},
    container::ProbedContainer,
    declaration::parse_request,
    files::{DeclaredFiles, FileReaders, FILE_READ_TIMEOUT},
    metrics::ProbeMetrics,
    server::{forbidden, ProbeAnswer},
};
use crate::{
    discovery::{
        clock::boottime_ns,
        netns,
        proc::{self, ObserveError},
        sockdiag::SockDiag,
    },
    model::{
        node::{Command, ListenerSample, PortSample, ProbeFacts, ProbeKey, ProbeSample, ProbeWatch},
        probe::ProcessState,
    },
    owner::ModelHandle,
};

/// How often /proc is sampled when no deadline comes sooner.
pub(crate) const DEFAULT_REFRESH: Duration = Duration::from_secs(2);

/// The probe state of one container.
pub struct PodProbe {
    container: ProbedContainer,
    netns: u32,
    main_pid: u32,
    /// The declared files and what was last read of them, inside the container's root, held
    /// open from when the probe was made: file checks resolve inside it even after the main
    /// process exits and its pid is reused. Read on threads of their own (`files.rs`).
    files: DeclaredFiles,
    metrics: Option<Arc<ProbeMetrics>>,
    /// Listener source in the pod's netns; None falls back to `/proc/<pid>/net/tcp.`
    diag: Option<SockDiag>,
    /// When the probe was made (boot ns): the model ignores older events of its netns and pid
    /// (see `model::node::ProbeWatch`).
    created_ns: u64,
    /// The model's facts of this container (its netns's listeners, its main process),
    /// published by the model's owner when they change (see `feeds.rs`).
    facts: watch::Receiver<Arc<ProbeFacts>>,
    state: Mutex<PodState>,
}

#[derive(Default)]
struct PodState {
    /// The declared checks, the only ones answered, each with the `check` label it is exported
    /// under (None for a check whose label an earlier one already has): re-evaluated when the
    /// facts change and at deadlines, for metrics.
    checks: Vec<(Option<String>, CheckSpec)>,
    /// The ports the declared checks name: the model tracks them whatever its cap.
    declared_ports: BTreeSet<u16>,
}

impl PodProbe {
    /// Starts probing `container` whose main process is `main_pid`: reads its netns and holds
    /// its root open. Its facts come from `facts` once the model watches it ([`Self::watch`],
    /// with a first [`Self::sample`]); its declared files are read by threads of `readers`.
    pub fn new(
        container: ProbedContainer,
        main_pid: u32,
        metrics: Option<Arc<ProbeMetrics>>,
        facts: watch::Receiver<Arc<ProbeFacts>>,
        readers: Arc<FileReaders>,
    ) -> Result<Self, ObserveError> {
        // A process that already exited (zombie or gone) has no namespaces left; it still gets a
        // probe (which fails, saying so), matching no TCP events.
        let netns = match proc::netns_inode(main_pid) {
            Ok(netns) => netns,
            Err(err) => match proc::process_state(main_pid)? {
                None => 0,
                Some(s) if s.state == ProcessState::Zombie || s.state == ProcessState::Dead => 0,
                Some(_) => return Err(err),
            },
        };
        let diag = match SockDiag::open_in(&netns::of_pid(main_pid)) {
            Ok(diag) => Some(diag),
            Err(err) => {
                log::warn!("probes of {container}: {}; reading /proc/{main_pid}/net/tcp instead", ErrorChain(&err));
                None
            }
        };
        let created_ns = boottime_ns();
        let root = proc::pin_root(main_pid).ok().map(Arc::new);
        let files = DeclaredFiles::new(root, main_pid, &container.key().uid, readers);
        Ok(Self {
            container,
            netns,
            main_pid,
            files,
            metrics,
            diag,
            created_ns,
            facts,
            state: Mutex::new(PodState::default()),
        })
    }

    /// The container it probes: its key and its names.
    pub fn container(&self) -> &ProbedContainer {
        &self.container
    }

    /// The container in the model: its pod's uid and its name.
    pub fn key(&self) -> &ProbeKey {
        self.container.key()
    }

    /// Inode of the pod's network namespace (the `netns` of the kernel's TCP events).
    pub fn netns(&self) -> u32 {
        self.netns
    }

    /// When the probe was made (boot ns): events before it are not its netns's.
    pub fn created_ns(&self) -> u64 {
        self.created_ns
    }

    fn lock(&self) -> MutexGuard<'_, PodState> {
        self.state.lock()
    }

    /// What the model is to watch for this container: its netns, main pid and declared ports.
    pub fn watch(&self) -> ProbeWatch {
        ProbeWatch {
            netns: self.netns,
            main_pid: self.main_pid,
            since_ns: self.created_ns,
            ports: self.lock().declared_ports.clone(),
        }
    }

    /// Samples /proc at `now` for the model: the netns's listeners, queues and drop counter,
    /// and the main process. Blocks on /proc and netlink: call it off the request path.
    pub fn sample(&self, now: u64) -> Result<ProbeSample, ObserveError> {
        let listeners = match &self.diag {
            Some(diag) => diag.listeners().map_err(ObserveError::from),
            None => proc::listeners_from_proc(self.main_pid),
        };
        let drops = proc::netstat_overflows(self.main_pid).map(|c| c.drops);
        let process = proc::process_state(self.main_pid)?;
        // A vanished process has no /proc/<pid>/net: the model keeps the last tcp state then.
        let listeners = match (listeners, drops) {
            (Ok(listeners), Ok(netns_drops)) => {
                let mut ports: Vec<PortSample> = Vec::new();
                for l in &listeners {
                    match ports.iter_mut().find(|p| p.port == l.port) {
                        Some(p) => {
                            p.count += 1;
                            p.depth += l.queue_depth;
                            p.backlog = p.backlog.zip(l.backlog).map(|(a, b)| a + b);
                        }
                        None => {
                            ports.push(PortSample { port: l.port, count: 1, depth: l.queue_depth, backlog: l.backlog })
                        }
                    }
                }
                Some(ListenerSample { ports, netns_drops })
            }
            _ => None,
        };
        Ok(ProbeSample { at_ns: now, process, listeners })
    }

    /// Reads the declared files now, waiting at most [`FILE_READ_TIMEOUT`] (tests and tools: the
    /// agent's refresher never waits for a read, `files.rs`).
    pub fn refresh_files(&self) {
        self.files.read_now();
    }

    /// Makes `checks` the container's declared checks: the only ones it answers, watches and
    /// exports. Reads nothing: files they name not read yet are read by the refresher at once
    /// (and answer "not read yet" until then); series of checks no longer declared are
    /// dropped. The ports they name change [`Self::watch`]: tell the model.
    pub fn declare(&self, checks: Vec<CheckSpec>) {
        let files: HashSet<String> = checks.iter().flat_map(file_paths).map(str::to_owned).collect();
        let mut labelled: Vec<(Option<String>, CheckSpec)> = Vec::with_capacity(checks.len());
        for spec in checks {
            if labelled.iter().any(|(_, known)| *known == spec) {
                continue;
            }
            let label = spec.label();
            let taken = labelled.iter().any(|(l, _)| l.as_deref() == Some(label.as_str()));
            labelled.push(((!taken).then_some(label), spec));
        }
        let mut state = self.lock();
        if let Some(metrics) = &self.metrics {
            for (label, _) in &state.checks {
                if let Some(label) =
                    label.as_deref().filter(|l| !labelled.iter().any(|(n, _)| n.as_deref() == Some(*l)))
                {
                    metrics.forget_check(self.key(), label);
                }
            }
        }
        self.files.declare(files);
        state.declared_ports = labelled.iter().flat_map(|(_, spec)| tcp_ports(spec)).collect();
        state.checks = labelled;
        self.record_all(&state, boottime_ns());
    }

    /// The declared checks.
    pub fn declared(&self) -> Vec<CheckSpec> {
        self.lock().checks.iter().map(|(_, spec)| spec.clone()).collect()
    }

    /// Whether `spec` is one of the declared checks.
    pub(crate) fn is_declared(&self, spec: &CheckSpec) -> bool {
        self.lock().checks.iter().any(|(_, known)| known == spec)
    }

    /// What the checks look at now: the model's last published facts and the files last read.
    fn observed(&self, _state: &PodState) -> Observed {
        let facts = self.facts.borrow();
        Observed { tcp: facts.tcp.clone(), process: facts.process.clone(), files: self.files.facts() }
    }

    /// Evaluates `spec` at `now` from the facts; reads nothing and keeps nothing (a file no
    /// declared check names has no facts: "not read yet").
    pub fn evaluate(&self, spec: &CheckSpec, now: u64) -> Verdict {
        let state = self.lock();
        spec.evaluate(&self.observed(&state), now)
    }

    /// Re-evaluates every declared check at `now` (recording results), and returns the earliest
    /// time a verdict can change on its own: schedule the next call then.
    pub fn reevaluate(&self, now: u64) -> Option<u64> {
        let state = self.lock();
        self.record_all(&state, now);
        let observed = self.observed(&state);
        state.checks.iter().filter_map(|(_, c)| c.next_deadline(&observed, now)).min()
    }

    fn record_all(&self, state: &PodState, now: u64) {
        if let Some(metrics) = &self.metrics {
            let observed = self.observed(state);
            for (label, spec) in &state.checks {
                if let Some(label) = label {
                    metrics.record_result(&self.container, label, &spec.evaluate(&observed, now));
                }
            }
        }
    }

    /// What the checks look at now (for tests and debugging).
    pub fn snapshot(&self) -> Observed {
        self.observed(&self.lock())
    }

    /// Samples /proc every `period` and hands the samples to `model`, and starts a pass over
    /// the declared files then and whenever files are declared that are not read yet (never
    /// waiting for one: a pass not back within [`FILE_READ_TIMEOUT`] marks its files, and its
    /// reads count when they come); re-evaluates the declared checks whenever the model
    /// publishes new facts, files are read, and exactly at each check's next deadline, so a
    /// listener's close flips its `lifecycle_probe_result` series at once, not at the next
    /// request. Ends at `shutdown`, or when the model no longer publishes this container's
    /// facts (the probe was replaced).
    pub(crate) async fn run_refresher(
        self: Arc<Self>,
        period: Duration,
        model: ModelHandle,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut facts = self.facts.clone();
        let mut next_sample = Instant::now();
        // The pass over the files not back yet, and when it is overdue.
        let mut reading: Option<(super::files::Pass, Instant)> = None;
        loop {
            let sampling = Instant::now() >= next_sample;
            if sampling || self.files.take_wanted() {
                if let Some(pass) = self.files.start() {
                    reading = Some((pass, Instant::now() + FILE_READ_TIMEOUT));
                }
            }
            if let Some((pass, _)) = reading.filter(|(_, overdue)| Instant::now() >= *overdue) {
                self.files.overdue(pass);
                reading = None;
            }
            if sampling {
                next_sample = Instant::now() + period;
                // /proc and netlink reads block: keep them off the runtime that answers requests.
                let probe = Arc::clone(&self);
                match tokio::task::spawn_blocking(move || probe.sample(boottime_ns())).await {
                    Ok(Ok(sample)) => {
                        let key = self.key().clone();
                        model.tell(Command::SampleProbe { key, sample }).await;
                    }
                    Ok(Err(err)) => log::debug!("probe refresh of {}: {}", self.container, ErrorChain(&err)),
                    Err(err) => log::warn!("probe refresh of {} panicked: {err}", self.container),
                }
            }
            let now = boottime_ns();
            let deadline = self.reevaluate(now);
            let mut wait = next_sample.saturating_duration_since(Instant::now());
            if let Some((_, overdue)) = reading {
                wait = wait.min(overdue.saturating_duration_since(Instant::now()));
            }
            let wait = deadline.map_or(wait, |d| wait.min(Duration::from_nanos(d.saturating_sub(now))));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                changed = facts.changed() => if changed.is_err() { return },
                () = self.files.changed() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

fn tcp_ports(spec: &CheckSpec) -> Vec<u16> {
    match spec {
        CheckSpec::Tcp { port, .. } => vec![*port],
        CheckSpec::AllOf(checks) => checks.iter().flat_map(tcp_ports).collect(),
        _ => Vec::new(),
    }
}

fn file_paths(spec: &CheckSpec) -> Vec<&str> {
    match spec {
        CheckSpec::File { path, .. } => vec![path.as_str()],
        CheckSpec::AllOf(checks) => checks.iter().flat_map(file_paths).collect(),
        _ => Vec::new(),
    }
}

impl PodProbe {
    /// Judges one check now: 200 `ok`, or 503 with the one-line reason, and records the request;
    /// 403 `forbidden` (counted, nothing else recorded) unless `spec` is declared.
    pub(crate) fn answer_check(&self, spec: &CheckSpec) -> (u16, String) {
        let started = Instant::now();
        let now = boottime_ns();
        let (verdict, label) = {
            let state = self.lock();
            let Some((label, _)) = state.checks.iter().find(|(_, known)| known == spec) else {
                drop(state);
                if let Some(metrics) = &self.metrics {
                    metrics.record_forbidden();
                }
                return forbidden();
            };
            let verdict = spec.evaluate(&self.observed(&state), now);
            if let (Some(metrics), Some(label)) = (&self.metrics, label) {
                metrics.record_result(&self.container, label, &verdict);
            }
            (verdict, label.clone())
        };
        let (code, body) = if verdict.pass { (200, "ok\n".to_owned()) } else { (503, format!("{}\n", verdict.reason)) };
        if let (Some(metrics), Some(label)) = (&self.metrics, label) {
            metrics.record_request(self.key(), &label, spec.kind(), code, started.elapsed().as_secs_f64());
        }
        (code, body)
    }
}

/// This container's own answer to `/probe/<kind>?...` (tests, tools): the pod listener routes
/// through [`super::NodeProbes`] instead.
impl ProbeAnswer for PodProbe {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        match parse_request(path, query) {
            Ok((container, spec)) if container.as_deref().is_none_or(|c| c == self.key().container) => {
                self.answer_check(&spec)
            }
            _ => {
                if let Some(metrics) = &self.metrics {
                    metrics.record_forbidden();
                }
                forbidden()
            }
        }
    }
}
