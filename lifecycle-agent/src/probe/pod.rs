//! One container's probe state: the checks its pod declared, the cached [`Observed`] snapshot,
//! fed by kernel events (at once) and by /proc refreshes (on a period, and exactly at the next
//! stall deadline), and answered from that cache.
//!
//! Only declared checks are answered, watched and exported ([`PodProbe::declare`]); a request for
//! anything else gets 403 and changes nothing. The request path ([`PodProbe::answer_check`])
//! compares, takes the lock, evaluates and counts metrics: no /proc work, no new state.

use crate::ErrorChain;
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::watch;

use super::{
    check::{CheckSpec, FileFacts, Observed, ProcessFacts, ProcessState, Verdict, FILE_HEAD_BYTES},
    declaration::parse_request,
    metrics::{ProbeMetrics, ProbeTarget},
    server::{forbidden, ProbeAnswer},
    tcp::{AcceptProgress, QueueSample},
};
use crate::{
    discovery::{
        clock::{boottime_ns, wall_to_boottime},
        netns,
        proc::{self, ObserveError},
        sockdiag::SockDiag,
    },
    model::event::{Detail, Event},
};

/// How often /proc is sampled when no deadline comes sooner.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(2);

/// How long one pass over a container's declared files may take. A file on a hung mount fails
/// that container's file checks after this; nothing else waits for it.
pub const FILE_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// The probe state of one container.
pub struct PodProbe {
    target: ProbeTarget,
    netns: u32,
    main_pid: u32,
    /// The container's root directory, held open from when the probe was made: file checks
    /// resolve inside it even after the main process exits and its pid is reused.
    root: Option<Arc<std::fs::File>>,
    /// A pass over the files that has not returned (a hung mount): while it hangs, no other is
    /// started, so one container holds at most one stuck reader thread.
    files_stuck: Arc<AtomicBool>,
    metrics: Option<Arc<ProbeMetrics>>,
    /// Listener source in the pod's netns; None falls back to `/proc/<pid>/net/tcp.`
    diag: Option<SockDiag>,
    /// When the probe was made (boot ns). Older events belong to whoever had this netns inode
    /// or pid before (the kernel reuses both); the first refresh saw everything until then.
    created_ns: u64,
    state: Mutex<PodState>,
}

#[derive(Default)]
struct PodState {
    observed: Observed,
    /// Start time of the main process when first seen; a different one means the pid was reused.
    start_ticks: Option<u64>,
    /// The declared checks, the only ones answered, each with the `check` label it is exported
    /// under (None for a check whose label an earlier one already has): re-evaluated on events
    /// and deadlines for metrics.
    checks: Vec<(Option<String>, CheckSpec)>,
    /// The files the declared checks read, refreshed with the rest.
    watched_files: HashSet<String>,
    /// The ports the declared checks name: always tracked; others only while there is room.
    declared_ports: HashSet<u16>,
}

/// Ports tracked per container beyond the declared ones. A pod can listen on every port there
/// is; only a declared check reads a port's progress.
pub const MAX_TRACKED_PORTS: usize = 64;

impl PodState {
    /// The progress of `port`, made with `new` if there is room for it (see
    /// [`MAX_TRACKED_PORTS`]).
    fn port_progress(&mut self, port: u16, new: impl FnOnce() -> AcceptProgress) -> Option<&mut AcceptProgress> {
        if !self.observed.tcp.contains_key(&port) && !self.declared_ports.contains(&port) {
            // Only undeclared ports count against the cap (at most 64 + 16 entries to look at).
            let undeclared = self.observed.tcp.keys().filter(|p| !self.declared_ports.contains(p)).count();
            if undeclared >= MAX_TRACKED_PORTS {
                return None;
            }
        }
        Some(self.observed.tcp.entry(port).or_insert_with(new))
    }
}

impl PodProbe {
    /// Starts tracking the container whose main process is `main_pid`: reads its netns, its
    /// listeners (already listening before the agent saw them) and its process state.
    pub fn new(target: ProbeTarget, main_pid: u32, metrics: Option<Arc<ProbeMetrics>>) -> Result<Self, ObserveError> {
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
                log::warn!(
                    "probes of {}/{}: {}; reading /proc/{main_pid}/net/tcp instead",
                    target.namespace,
                    target.pod,
                    ErrorChain(&err)
                );
                None
            }
        };
        let created_ns = boottime_ns();
        let root = proc::pin_root(main_pid).ok().map(Arc::new);
        let probe = Self {
            target,
            netns,
            main_pid,
            root,
            files_stuck: Arc::new(AtomicBool::new(false)),
            metrics,
            diag,
            created_ns,
            state: Mutex::new(PodState::default()),
        };
        probe.refresh(boottime_ns())?;
        Ok(probe)
    }

    pub fn target(&self) -> &ProbeTarget {
        &self.target
    }

    /// Inode of the pod's network namespace (the `netns` of the kernel's TCP events).
    pub fn netns(&self) -> u32 {
        self.netns
    }

    /// When the probe was made (boot ns): events before it are not its netns's (see `on_event`).
    pub fn created_ns(&self) -> u64 {
        self.created_ns
    }

    pub fn main_pid(&self) -> u32 {
        self.main_pid
    }

    fn lock(&self) -> MutexGuard<'_, PodState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one kernel event; returns whether it concerned this pod. Verdicts of the checks
    /// asked so far are re-evaluated at the event's time, so a listener close flips the
    /// `lifecycle_probe_result` series at once, not at the next request.
    pub fn on_event(&self, event: &Event) -> bool {
        let t = event.time_ns;
        if t < self.created_ns {
            return false;
        }
        // Decided before the lock: most events concern no probe.
        let concerns_us = match &event.detail {
            Detail::TcpListen(tcp)
            | Detail::TcpListenClose(tcp)
            | Detail::TcpEstablished(tcp)
            | Detail::TcpAccept(tcp) => tcp.netns == self.netns,
            Detail::Exit { group_dead: true, .. } => event.tgid == self.main_pid,
            _ => false,
        };
        if !concerns_us {
            return false;
        }
        let mut state = self.lock();
        match &event.detail {
            Detail::TcpListen(tcp)
            | Detail::TcpListenClose(tcp)
            | Detail::TcpEstablished(tcp)
            | Detail::TcpAccept(tcp)
                if tcp.netns == self.netns =>
            {
                let Some(progress) = state.port_progress(tcp.local_port, AcceptProgress::default) else {
                    self.count_untracked_port();
                    return false;
                };
                match event.detail {
                    Detail::TcpListen(_) => progress.on_listen(t),
                    Detail::TcpListenClose(_) => progress.on_close(t),
                    Detail::TcpEstablished(_) => progress.on_established(t),
                    _ => progress.on_accept(t),
                }
            }
            Detail::Exit { group_dead: true, .. } if event.tgid == self.main_pid => {
                let previous = state.observed.process.take();
                state.observed.process =
                    Some(ProcessFacts::after_sample(previous.as_ref(), self.main_pid, ProcessState::Dead, t));
            }
            _ => return false,
        }
        self.record_all(&state, t);
        true
    }

    /// Samples /proc: accept queues and drops of the netns, the main process, watched files.
    pub fn refresh(&self, now: u64) -> Result<(), ObserveError> {
        // Read outside the lock; apply under it.
        let listeners = match &self.diag {
            Some(diag) => diag.listeners().map_err(ObserveError::from),
            None => proc::listeners_from_proc(self.main_pid),
        };
        let drops = proc::netstat_overflows(self.main_pid).map(|c| c.drops);
        let process = proc::process_state(self.main_pid)?;
        let watched: Vec<String> = self.lock().watched_files.iter().cloned().collect();
        let files = self.read_files(watched);

        let mut state = self.lock();
        state.apply_process(self.main_pid, process, now);
        // A vanished process has no /proc/<pid>/net: keep the last tcp state then.
        if let (Ok(listeners), Ok(drops)) = (listeners, drops) {
            let mut by_port: HashMap<u16, (u32, u32, Option<u32>)> = HashMap::new();
            for l in &listeners {
                let entry = by_port.entry(l.port).or_insert((0, 0, Some(0)));
                *entry = (entry.0 + 1, entry.1 + l.queue_depth, entry.2.zip(l.backlog).map(|(a, b)| a + b));
            }
            let sole_listener = by_port.len() == 1;
            // Ports tracked but no longer listed by the kernel were closed unseen (a lost record).
            for (port, progress) in state.observed.tcp.iter_mut() {
                if !by_port.contains_key(port) {
                    progress.reconcile_listeners(now, 0);
                }
            }
            for (port, (count, depth, backlog)) in by_port {
                let Some(progress) = state.port_progress(port, || AcceptProgress::already_listening(count)) else {
                    self.count_untracked_port();
                    continue;
                };
                progress.reconcile_listeners(now, count);
                if progress.is_listening() {
                    progress.observe_queue(now, QueueSample { depth, backlog, netns_drops: drops, sole_listener });
                }
            }
        }
        for (path, facts) in files {
            // A file no longer declared while it was being read is not kept.
            if state.watched_files.contains(&path) {
                state.observed.files.insert(path, facts);
            }
        }
        self.record_all(&state, now);
        Ok(())
    }

    fn count_untracked_port(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.record_untracked_port();
        }
    }

    fn read_file(root: Option<&std::fs::File>, pid: u32, path: &str) -> FileFacts {
        let Some(root) = root else {
            return FileFacts::Unreadable(format!("the root of pid {pid} could not be held open when probing began"));
        };
        match proc::read_file_in_pinned_root(root, pid, path, FILE_HEAD_BYTES) {
            Ok(read) => FileFacts::Present {
                modified_ns: wall_to_boottime(read.modified, SystemTime::now(), boottime_ns()),
                head: read.head,
            },
            Err(ObserveError::Open { source, .. }) => FileFacts::Unreadable(source.to_string()),
            Err(other) => FileFacts::Unreadable(other.to_string()),
        }
    }

    /// Reads each file (outside the lock), paired with its path, on a thread of its own for at
    /// most [`FILE_READ_TIMEOUT`]: a file on a hung mount fails this container's checks and
    /// holds nothing else up.
    fn read_files(&self, paths: Vec<String>) -> Vec<(String, FileFacts)> {
        if paths.is_empty() {
            return Vec::new();
        }
        let unreadable = |why: &str| paths.iter().map(|p| (p.clone(), FileFacts::Unreadable(why.to_owned()))).collect();
        if self.files_stuck.load(Ordering::Acquire) {
            return unreadable("an earlier read of this container's files has not returned (a hung filesystem?)");
        }
        let (send, receive) = std::sync::mpsc::sync_channel(1);
        let (root, pid, stuck) = (self.root.clone(), self.main_pid, Arc::clone(&self.files_stuck));
        let wanted = paths.clone();
        stuck.store(true, Ordering::Release);
        let started = std::thread::Builder::new().name("probe-files".into()).spawn(move || {
            let read: Vec<(String, FileFacts)> =
                wanted.into_iter().map(|path| (path.clone(), Self::read_file(root.as_deref(), pid, &path))).collect();
            stuck.store(false, Ordering::Release);
            let _ = send.send(read);
        });
        if started.is_err() {
            self.files_stuck.store(false, Ordering::Release);
            return unreadable("no thread to read the files with");
        }
        match receive.recv_timeout(FILE_READ_TIMEOUT) {
            Ok(read) => read,
            Err(_) => unreadable(&format!("not read within {FILE_READ_TIMEOUT:?} (a hung filesystem?)")),
        }
    }

    /// Makes `checks` the container's declared checks: the only ones it answers, watches and
    /// exports. Files they name are read now; series of checks no longer declared are dropped.
    pub fn declare(&self, checks: Vec<CheckSpec>) {
        let files: HashSet<String> = checks.iter().flat_map(file_paths).map(str::to_owned).collect();
        let missing: Vec<String> = {
            let state = self.lock();
            files.iter().filter(|p| !state.observed.files.contains_key(*p)).cloned().collect()
        };
        let first_reads = self.read_files(missing);
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
                    metrics.forget_check(&self.target, label);
                }
            }
        }
        state.observed.files.retain(|path, _| files.contains(path));
        for (path, facts) in first_reads {
            state.observed.files.insert(path, facts);
        }
        state.watched_files = files;
        state.declared_ports = labelled.iter().flat_map(|(_, spec)| tcp_ports(spec)).collect();
        state.checks = labelled;
        self.record_all(&state, boottime_ns());
    }

    /// The declared checks.
    pub fn declared(&self) -> Vec<CheckSpec> {
        self.lock().checks.iter().map(|(_, spec)| spec.clone()).collect()
    }

    /// Whether `spec` is one of the declared checks.
    pub fn is_declared(&self, spec: &CheckSpec) -> bool {
        self.lock().checks.iter().any(|(_, known)| known == spec)
    }

    /// Evaluates `spec` at `now` from the cache; reads nothing and keeps nothing (a file no
    /// declared check names has no facts: "not read yet").
    pub fn evaluate(&self, spec: &CheckSpec, now: u64) -> Verdict {
        spec.evaluate(&self.lock().observed, now)
    }

    /// Re-evaluates every declared check at `now` (recording results), and returns the earliest
    /// time a verdict can change on its own: schedule the next call then.
    pub fn reevaluate(&self, now: u64) -> Option<u64> {
        let state = self.lock();
        self.record_all(&state, now);
        state.checks.iter().filter_map(|(_, c)| c.next_deadline(&state.observed, now)).min()
    }

    fn record_all(&self, state: &PodState, now: u64) {
        if let Some(metrics) = &self.metrics {
            for (label, spec) in &state.checks {
                if let Some(label) = label {
                    metrics.record_result(&self.target, label, &spec.evaluate(&state.observed, now));
                }
            }
        }
    }

    /// A copy of the cached snapshot (for tests and debugging).
    pub fn snapshot(&self) -> Observed {
        self.lock().observed.clone()
    }

    /// Refreshes every `period`, and exactly at each check's next deadline, until `shutdown`.
    pub async fn run_refresher(self: Arc<Self>, period: Duration, mut shutdown: watch::Receiver<bool>) {
        loop {
            let now = boottime_ns();
            // /proc and netlink reads block: keep them off the runtime that answers requests.
            let probe = Arc::clone(&self);
            match tokio::task::spawn_blocking(move || probe.refresh(now)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    log::debug!("probe refresh of {}/{}: {}", self.target.namespace, self.target.pod, ErrorChain(&err))
                }
                Err(err) => {
                    log::warn!("probe refresh of {}/{} panicked: {err}", self.target.namespace, self.target.pod)
                }
            }
            let deadline = self.reevaluate(now);
            let wait = deadline.map_or(period, |d| period.min(Duration::from_nanos(d.saturating_sub(now))));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

impl PodState {
    fn apply_process(&mut self, pid: u32, sample: Option<proc::ProcessSample>, now: u64) {
        let previous = self.observed.process.take();
        let state = match sample {
            None => ProcessState::Dead,
            Some(s) => match self.start_ticks {
                Some(start) if start != s.start_ticks => ProcessState::Dead,
                _ => {
                    self.start_ticks = Some(s.start_ticks);
                    s.state
                }
            },
        };
        // Once dead, a pid stays dead for this probe (a reused pid is another process).
        let state =
            if previous.as_ref().is_some_and(|p| p.state == ProcessState::Dead) { ProcessState::Dead } else { state };
        self.observed.process = Some(ProcessFacts::after_sample(previous.as_ref(), pid, state, now));
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
    pub fn answer_check(&self, spec: &CheckSpec) -> (u16, String) {
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
            let verdict = spec.evaluate(&state.observed, now);
            if let (Some(metrics), Some(label)) = (&self.metrics, label) {
                metrics.record_result(&self.target, label, &verdict);
            }
            (verdict, label.clone())
        };
        let (code, body) = if verdict.pass { (200, "ok\n".to_owned()) } else { (503, format!("{}\n", verdict.reason)) };
        if let (Some(metrics), Some(label)) = (&self.metrics, label) {
            metrics.record_request(&self.target, &label, spec.kind(), code, started.elapsed().as_secs_f64());
        }
        (code, body)
    }
}

/// This container's own answer to `/probe/<kind>?...` (tests, tools): the pod listener routes
/// through [`super::NodeProbes`] instead.
impl ProbeAnswer for PodProbe {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        match parse_request(path, query) {
            Ok((container, spec)) if container.as_deref().is_none_or(|c| c == self.target.container) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_listening_on_every_port_keeps_a_bounded_probe_state_and_its_declared_ports() {
        // Issue 18: a pod listening on every port grew the probe's per-port state without bound.
        let mut state = PodState { declared_ports: [8080, 9090].into_iter().collect(), ..PodState::default() };
        let tracked =
            (1..=20_000u16).filter(|&port| state.port_progress(port, AcceptProgress::default).is_some()).count();
        assert_eq!(tracked, MAX_TRACKED_PORTS + 2, "the declared ports are tracked beyond the 64 others");
        assert!(state.observed.tcp.contains_key(&8080) && state.observed.tcp.contains_key(&9090));
        assert!(state.observed.tcp.len() <= MAX_TRACKED_PORTS + 2);
        assert!(state.port_progress(30_000, AcceptProgress::default).is_none(), "full: an undeclared port is left out");
    }
}
