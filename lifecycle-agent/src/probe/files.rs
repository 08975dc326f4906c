//! The files a container's declared checks read: read on threads of their own, never by the
//! loop that asked, with the number of threads bounded on the node.
//!
//! A declared file may sit on a mount that never answers (a tenant's NFS export, a FUSE daemon
//! that stopped): a read of it blocks its thread until the mount returns, which may be never.
//! So nothing waits for a read. A pass over one container's files runs on a thread of its own
//! and puts what it read into the container's facts when it returns, however late (a mount that
//! comes back heals the check at once). The refresher that started it marks the files "not read
//! within 1s" at the deadline ([`DeclaredFiles::overdue`]), without waiting, and the probe
//! supervisor never reads a file at all (it did, for every new probe in its pass: three pods
//! with 16 containers on a stalled mount held a pass 48 s, and `/healthz` failed).
//!
//! Bounds: one pass per container at a time (while one hangs, the next is not started and the
//! files say why), [`MAX_FILE_READERS_PER_POD`] reader threads per pod and [`MAX_FILE_READERS`]
//! on the node; past those a pass is not started either. A pod's stalled mount so holds at most
//! two threads, and fails its own checks only: 32 pods would have to stall to take the node's
//! threads from the others. Each is counted in `lifecycle_probe_file_reads_skipped_total{reason}`,
//! and the threads alive in `lifecycle_probe_file_readers`.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use parking_lot::{Condvar, Mutex, MutexGuard};

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};
use tokio::sync::Notify;

use super::check::{FileFacts, FILE_HEAD_BYTES};
use crate::{
    discovery::{
        clock::{boottime_ns, wall_to_boottime},
        proc::{self, ObserveError},
    },
    export::{families::AgentFamily, metrics::vec_of},
};

/// How long a pass over a container's declared files may take before its files say "not read
/// within 1s"; the pass's thread goes on and its reads count when they come.
pub(crate) const FILE_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Reader threads alive on the node at most: a read of a healthy file takes microseconds, so
/// the threads alive are, in effect, the ones stuck on hung mounts.
pub const MAX_FILE_READERS: usize = 64;
/// Reader threads alive for one pod at most.
pub const MAX_FILE_READERS_PER_POD: usize = 2;

/// The node's reader threads: how many are alive, and the passes not started.
pub struct FileReaders {
    alive: AtomicUsize,
    cap: usize,
    /// Threads alive by pod (uid), each at most [`MAX_FILE_READERS_PER_POD`].
    per_pod: Mutex<HashMap<String, usize>>,
    /// Passes not started because the pod's reader threads are all alive.
    pod_cap: IntCounter,
    gauge: IntGauge,
    /// Passes not started because the container's last one has not returned.
    container_stuck: IntCounter,
    /// Passes not started because the node's reader threads are all alive.
    node_cap: IntCounter,
}

impl FileReaders {
    /// At most [`MAX_FILE_READERS`] threads, counted in families registered in `registry`.
    pub(crate) fn register(registry: &Registry) -> Result<Arc<Self>, prometheus::Error> {
        let (readers, skipped) = Self::with_cap(MAX_FILE_READERS)?;
        registry.register(Box::new(readers.gauge.clone()))?;
        registry.register(Box::new(skipped))?;
        Ok(Arc::new(readers))
    }

    /// At most `cap` threads, counted nowhere (tests, tools).
    pub fn unregistered(cap: usize) -> Arc<Self> {
        // Constant, valid families: cannot fail.
        Arc::new(Self::with_cap(cap).expect("valid metric families").0)
    }

    /// The readers, and the family of the skipped passes their two series are in (each shown
    /// from the start).
    fn with_cap(cap: usize) -> Result<(Self, IntCounterVec), prometheus::Error> {
        let gauge = IntGauge::with_opts(AgentFamily::ProbeFileReaders.family().opts())?;
        let skipped = vec_of(AgentFamily::ProbeFileReadsSkipped, IntCounterVec::new)?;
        let readers = Self {
            alive: AtomicUsize::new(0),
            cap,
            per_pod: Mutex::default(),
            pod_cap: skipped.with_label_values(&["pod_cap"]),
            gauge,
            container_stuck: skipped.with_label_values(&["container_stuck"]),
            node_cap: skipped.with_label_values(&["node_cap"]),
        };
        Ok((readers, skipped))
    }

    /// A place for one more reader thread of pod `pod`, or why there is none.
    fn take(self: &Arc<Self>, pod: &str) -> Result<ReaderPlace, Skipped> {
        let mut per_pod = self.per_pod.lock();
        let of_pod = per_pod.get(pod).copied().unwrap_or(0);
        if of_pod >= MAX_FILE_READERS_PER_POD {
            self.pod_cap.inc();
            return Err(Skipped::Pod);
        }
        if self.alive.load(Ordering::Acquire) >= self.cap {
            self.node_cap.inc();
            return Err(Skipped::Node);
        }
        per_pod.insert(pod.to_owned(), of_pod + 1);
        self.alive.fetch_add(1, Ordering::AcqRel);
        self.gauge.inc();
        Ok(ReaderPlace { readers: Arc::clone(self), pod: pod.to_owned() })
    }

    /// Reader threads alive now.
    #[cfg(test)]
    fn alive(&self) -> usize {
        self.alive.load(Ordering::Acquire)
    }
}

/// Why no reader thread was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Skipped {
    /// The pod's threads are all alive.
    Pod,
    /// The node's threads are all alive.
    Node,
}

/// One reader thread's place, given back when the thread ends.
struct ReaderPlace {
    readers: Arc<FileReaders>,
    pod: String,
}

impl Drop for ReaderPlace {
    fn drop(&mut self) {
        let mut per_pod = self.readers.per_pod.lock();
        match per_pod.get_mut(&self.pod) {
            Some(alive) if *alive > 1 => *alive -= 1,
            _ => drop(per_pod.remove(&self.pod)),
        }
        self.readers.alive.fetch_sub(1, Ordering::AcqRel);
        self.readers.gauge.dec();
    }
}

/// A pass over a container's files, as [`DeclaredFiles::start`] returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass(u64);

/// One container's declared files and what was last read of them.
pub(crate) struct DeclaredFiles {
    shared: Arc<Shared>,
}

/// Reads one declared file (the container's, inside its root; another in tests).
type Reader = Box<dyn Fn(&str) -> FileFacts + Send + Sync>;

/// What the reader threads and the probe share.
struct Shared {
    read: Reader,
    readers: Arc<FileReaders>,
    /// The container's pod (uid): its reader threads count against the pod's share.
    pod: String,
    state: Mutex<FilesState>,
    /// Wakes a waiter of [`DeclaredFiles::read_now`] when a pass returns.
    returned: Condvar,
    /// Wakes the probe's refresher: facts came, or files were declared that are not read yet.
    changed: Notify,
}

#[derive(Default)]
struct FilesState {
    /// Files by path, as last read.
    facts: Arc<HashMap<String, FileFacts>>,
    /// The paths declared now.
    watched: HashSet<String>,
    /// The pass that has not returned, if one has not.
    reading: Option<u64>,
    passes: u64,
    /// Declared paths not read yet: the refresher reads them at once.
    wanted: bool,
}

impl DeclaredFiles {
    /// The files of a container of pod `pod` (uid) whose root is `root` (held open from when its
    /// probe was made, `proc::pin_root`; pid `pid` is named in reasons), read by threads of
    /// `readers`.
    pub(crate) fn new(root: Option<Arc<std::fs::File>>, pid: u32, pod: &str, readers: Arc<FileReaders>) -> Self {
        Self::read_by(Box::new(move |path| read_in_root(root.as_deref(), pid, path)), pod, readers)
    }

    fn read_by(read: Reader, pod: &str, readers: Arc<FileReaders>) -> Self {
        let shared = Shared {
            read,
            readers,
            pod: pod.to_owned(),
            state: Mutex::new(FilesState::default()),
            returned: Condvar::new(),
            changed: Notify::new(),
        };
        Self { shared: Arc::new(shared) }
    }

    fn lock(&self) -> MutexGuard<'_, FilesState> {
        self.shared.lock()
    }

    /// Makes `paths` the declared files: facts of the others are dropped, and a path not read
    /// yet wakes the refresher ([`Self::take_wanted`]). Reads nothing.
    pub(crate) fn declare(&self, paths: HashSet<String>) {
        let mut state = self.lock();
        let state = &mut *state;
        Arc::make_mut(&mut state.facts).retain(|path, _| paths.contains(path));
        if paths.iter().any(|path| !state.facts.contains_key(path)) {
            state.wanted = true;
            self.shared.changed.notify_one();
        }
        state.watched = paths;
    }

    /// Whether declared files wait for their first read (cleared by the call).
    pub(crate) fn take_wanted(&self) -> bool {
        std::mem::take(&mut self.lock().wanted)
    }

    /// The facts as last read (a file not read yet has none).
    pub(crate) fn facts(&self) -> Arc<HashMap<String, FileFacts>> {
        self.lock().facts.clone()
    }

    /// Wakes when facts came or files were declared (see the module header).
    pub(crate) async fn changed(&self) {
        self.shared.changed.notified().await;
    }

    /// Starts a pass over the declared files on a thread of its own and returns at once; its
    /// reads land when it returns. None when no pass started: nothing declared, the last pass
    /// has not returned, or the node's reader threads are all alive (the files say which).
    pub(crate) fn start(&self) -> Option<Pass> {
        let mut state = self.lock();
        let paths: Vec<String> = state.watched.iter().cloned().collect();
        if paths.is_empty() {
            return None;
        }
        state.wanted = false;
        if state.reading.is_some() {
            self.shared.readers.container_stuck.inc();
            let why = "an earlier read of this container's files has not returned (a hung filesystem?)";
            mark(&mut state, &paths, why);
            return None;
        }
        let place = match self.shared.readers.take(&self.shared.pod) {
            Ok(place) => place,
            Err(skipped) => {
                let why = match skipped {
                    Skipped::Pod => format!(
                        "not read: {MAX_FILE_READERS_PER_POD} reads of this pod's files have not returned (a hung filesystem?)"
                    ),
                    Skipped::Node => format!(
                        "not read: {} readers of probe files are stuck on this node (hung filesystems?)",
                        self.shared.readers.cap
                    ),
                };
                mark(&mut state, &paths, &why);
                return None;
            }
        };
        state.passes += 1;
        let pass = state.passes;
        state.reading = Some(pass);
        drop(state);
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new().name("probe-files".into()).spawn(move || {
            let read: Vec<(String, FileFacts)> =
                paths.into_iter().map(|path| (path.clone(), (shared.read)(&path))).collect();
            // Returned: its place is free before anyone hears it returned.
            drop(place);
            let mut state = shared.lock();
            let state = &mut *state;
            let kept = Arc::make_mut(&mut state.facts);
            for (path, facts) in read {
                // A file no longer declared while it was being read is not kept.
                if state.watched.contains(&path) {
                    kept.insert(path, facts);
                }
            }
            state.reading = None;
            shared.returned.notify_all();
            shared.changed.notify_one();
        });
        if started.is_err() {
            let mut state = self.lock();
            state.reading = None;
            let paths: Vec<String> = state.watched.iter().cloned().collect();
            mark(&mut state, &paths, "no thread to read the files with");
            return None;
        }
        Some(Pass(pass))
    }

    /// `pass` reached its deadline: if it has not returned, its files are "not read within 1s".
    /// Its reads still count when they come.
    pub(crate) fn overdue(&self, pass: Pass) {
        let mut state = self.lock();
        if state.reading == Some(pass.0) {
            let paths: Vec<String> = state.watched.iter().cloned().collect();
            mark(&mut state, &paths, &format!("not read within {FILE_READ_TIMEOUT:?} (a hung filesystem?)"));
        }
    }

    /// Reads the declared files now, waiting for the pass at most [`FILE_READ_TIMEOUT`]: for
    /// tests and tools, never for a loop of the agent.
    pub(crate) fn read_now(&self) {
        let Some(pass) = self.start() else { return };
        let deadline = Instant::now() + FILE_READ_TIMEOUT;
        let mut state = self.lock();
        while state.reading == Some(pass.0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.shared.returned.wait_for(&mut state, left);
        }
        drop(state);
        self.overdue(pass);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FilesState> {
        self.state.lock()
    }
}

/// Reads `path` inside `root` (the container's, from `proc::pin_root` of `pid`).
fn read_in_root(root: Option<&std::fs::File>, pid: u32, path: &str) -> FileFacts {
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

/// Marks `paths` unreadable for `why` (still declared ones only).
fn mark(state: &mut FilesState, paths: &[String], why: &str) {
    let kept = Arc::make_mut(&mut state.facts);
    for path in paths.iter().filter(|path| state.watched.contains(*path)) {
        kept.insert(path.clone(), FileFacts::Unreadable(why.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files of this process's own root.
    fn own_files(readers: &Arc<FileReaders>) -> DeclaredFiles {
        let root = proc::pin_root(std::process::id()).ok().map(Arc::new);
        DeclaredFiles::new(root, std::process::id(), "pod-a", Arc::clone(readers))
    }

    #[test]
    fn declaring_reads_nothing_and_a_pass_puts_its_reads_in_the_facts() {
        let dir = std::env::temp_dir().join(format!("lifecycle-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let healthy = dir.join("healthy");
        std::fs::write(&healthy, "ok\n").expect("write");
        let path = healthy.to_string_lossy().into_owned();
        let readers = FileReaders::unregistered(MAX_FILE_READERS);
        let files = own_files(&readers);
        files.declare(HashSet::from([path.clone()]));
        assert!(files.facts().is_empty(), "declaring read nothing");
        assert!(files.take_wanted(), "the refresher is told to read");
        files.read_now();
        assert!(matches!(files.facts().get(&path), Some(FileFacts::Present { head, .. }) if head == b"ok\n"));
        assert_eq!(readers.alive(), 0, "the thread ended");
        // No longer declared: its facts go.
        files.declare(HashSet::new());
        assert!(files.facts().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Files of a container of `pod` read by a reader that blocks until `gate` is dropped (a
    /// hung mount), then finds every file with the content `ok`.
    fn hanging_files(pod: &str, readers: &Arc<FileReaders>) -> (DeclaredFiles, std::sync::mpsc::SyncSender<()>) {
        let (gate, wait) = std::sync::mpsc::sync_channel::<()>(0);
        let wait = Mutex::new(wait);
        let read = move |_: &str| {
            let _ = wait.lock().recv();
            FileFacts::Present { modified_ns: 1, head: b"ok".to_vec() }
        };
        (DeclaredFiles::read_by(Box::new(read), pod, Arc::clone(readers)), gate)
    }

    fn reason(files: &DeclaredFiles, path: &str) -> String {
        match files.facts().get(path) {
            Some(FileFacts::Unreadable(why)) => why.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_pass_that_hangs_holds_no_caller_and_back_the_next_and_the_caps_hold() {
        // Issue 37: the supervisor read declared files in its pass, up to 1 s each; a stalled
        // mount under 48 probes held it 48 s.
        let readers = FileReaders::unregistered(3);
        let (hung, gate) = hanging_files("stalled", &readers);
        hung.declare(HashSet::from(["/stall/a".to_owned()]));
        let began = Instant::now();
        let pass = hung.start().expect("a pass starts");
        assert!(began.elapsed() < Duration::from_millis(100), "starting waits for nothing: {:?}", began.elapsed());
        assert_eq!(readers.alive(), 1);
        // The container's next pass is not started while this one hangs...
        assert_eq!(hung.start(), None);
        assert!(reason(&hung, "/stall/a").contains("has not returned"), "{}", reason(&hung, "/stall/a"));
        assert_eq!(readers.container_stuck.get(), 1);
        hung.overdue(pass);
        assert_eq!(reason(&hung, "/stall/a"), "not read within 1s (a hung filesystem?)");
        // ...its pod gets a second thread, and no third...
        let (second, _second_gate) = hanging_files("stalled", &readers);
        second.declare(HashSet::from(["/stall/b".to_owned()]));
        assert!(second.start().is_some());
        let (third, _third_gate) = hanging_files("stalled", &readers);
        third.declare(HashSet::from(["/stall/c".to_owned()]));
        assert_eq!(third.start(), None);
        assert!(
            reason(&third, "/stall/c").starts_with("not read: 2 reads of this pod's files"),
            "{}",
            reason(&third, "/stall/c")
        );
        assert_eq!(readers.pod_cap.get(), 1);
        // ...another pod's is read, and past the node's cap (3 here) none is.
        let (other, _other_gate) = hanging_files("healthy", &readers);
        other.declare(HashSet::from(["/b".to_owned()]));
        assert!(other.start().is_some(), "another pod is not held back by this one's stall");
        let (fourth, _fourth_gate) = hanging_files("another", &readers);
        fourth.declare(HashSet::from(["/d".to_owned()]));
        assert_eq!(fourth.start(), None);
        assert!(
            reason(&fourth, "/d").starts_with("not read: 3 readers of probe files are stuck"),
            "{}",
            reason(&fourth, "/d")
        );
        assert_eq!(readers.node_cap.get(), 1);
        // The mount answers: the late reads land, the thread's place is given back.
        drop(gate);
        let deadline = Instant::now() + Duration::from_secs(10);
        while readers.alive() > 2 || !matches!(hung.facts().get("/stall/a"), Some(FileFacts::Present { .. })) {
            assert!(Instant::now() < deadline, "the late reads never landed: {}", reason(&hung, "/stall/a"));
            std::thread::sleep(Duration::from_millis(5));
        }
        // A late overdue mark of that pass changes nothing now.
        hung.overdue(pass);
        assert!(matches!(hung.facts().get("/stall/a"), Some(FileFacts::Present { .. })));
        assert!(fourth.start().is_some(), "a place is free again");
    }

    #[test]
    fn the_registered_families_are_the_ones_counted() {
        let registry = Registry::new();
        let readers = FileReaders::register(&registry).expect("registered");
        let places: Vec<ReaderPlace> =
            (0..MAX_FILE_READERS).map_while(|pod| readers.take(&format!("pod-{pod}")).ok()).collect();
        assert_eq!(places.len(), MAX_FILE_READERS);
        assert_eq!(readers.take("one-more").err(), Some(Skipped::Node));
        let text = {
            let mut out = Vec::new();
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out).expect("encode");
            String::from_utf8(out).expect("utf8")
        };
        assert!(text.contains("lifecycle_probe_file_readers 64\n"), "{text}");
        assert!(text.contains("lifecycle_probe_file_reads_skipped_total{reason=\"node_cap\"} 1\n"), "{text}");
        assert!(text.contains("lifecycle_probe_file_reads_skipped_total{reason=\"container_stuck\"} 0\n"), "{text}");
        assert!(text.contains("lifecycle_probe_file_reads_skipped_total{reason=\"pod_cap\"} 0\n"), "{text}");
        drop(places);
        assert_eq!(readers.alive(), 0);
    }
}
