//! The owner's routing and its queue, driven by hand on the test's thread where the agent runs
//! it on the ring reader's.

use futures::FutureExt as _;
use lifecycle_testkit::fixtures::{main_exec, main_exit};

use tokio::sync::Notify;

use super::*;
use crate::{
    export::units::{KernelCounters, LiveCounters, UnitMetrics},
    model::{
        event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
        metadata::{ContainerMeta, KubeletAnnotations},
        node::{ProbeWatch, TrackerConfig, Unit},
        time::SECOND,
    },
    probe::feeds::ProbeFeeds,
};
const CGROUP: u64 = 4242;
const POD_UID: &str = "00000000-0000-0000-0000-000000000001";

struct NoKernel;

impl KernelCounters for NoKernel {
    fn read_all(&self, _: &mut LiveCounters) {}
}

fn container_id() -> String {
    "ab".repeat(32)
}

fn event(time_ns: u64, tgid: u32, cgroup_id: u64, detail: Detail) -> Event {
    Event { at: BootTime::from_ns(time_ns), pid: tgid, tgid, cgroup_id, detail }
}

fn meta() -> ContainerMeta {
    ContainerMeta {
        kubelet: KubeletAnnotations { termination_grace_period_ns: Some(30 * SECOND), ..Default::default() },
        ..lifecycle_testkit::fixtures::running_container(&container_id(), POD_UID, "shop", "web-1", "app")
    }
}

/// Notices as a test sees them: a container waiting for its name wakes `wanted`.
struct TestNotices {
    wanted: Arc<Notify>,
}

impl NoticeSink for TestNotices {
    fn notices(&mut self, notices: Vec<Notice>) {
        if notices.iter().any(|notice| matches!(notice, Notice::MetadataNeeded { .. })) {
            self.wanted.notify_one();
        }
    }

    fn warnings(&mut self, _: Vec<PodWarning>) {}
}

/// An owner with the sinks the agent gives it, and the pieces a test looks at.
struct Owned {
    owner: Owner,
    handle: ModelHandle,
    units: Arc<UnitMetrics>,
    feeds: Arc<ProbeFeeds>,
    wanted: Arc<Notify>,
}

fn owned() -> Owned {
    let tracker = NodeTracker::new(TrackerConfig { cri_available: true, ..TrackerConfig::default() });
    let snapshots = snapshots_of(&tracker);
    let units = Arc::new(UnitMetrics::new(snapshots.subscribe(), Arc::new(NoKernel), Box::new(|| 0.0)));
    let feeds = Arc::new(ProbeFeeds::default());
    let wanted = Arc::new(Notify::new());
    let sinks = Sinks {
        judgements: units.clone(),
        probes: feeds.clone(),
        notices: Box::new(TestNotices { wanted: wanted.clone() }),
    };
    let (owner, handle) = own(tracker, snapshots, sinks).expect("eventfd");
    Owned { owner, handle, units, feeds, wanted }
}

/// Hands `event` to the owner as the reader does; the instances it ended.
fn apply(owner: &mut Owner, event: Event) -> Vec<Ended> {
    let at = event.at;
    owner.handle_all([Command::Event(event)], at)
}

fn duration_count(units: &UnitMetrics) -> Option<String> {
    let mut text = String::new();
    units.scrape_into(&mut text);
    text.lines().find(|l| l.starts_with("lifecycle_termination_duration_seconds_count{")).map(str::to_owned)
}

/// The published state of the one container.
fn published_state(handle: &ModelHandle) -> Option<String> {
    let snapshot = handle.snapshots().borrow().clone();
    let state = snapshot.units().next().map(|unit: &Unit| format!("{:?}", unit.state()));
    state
}

fn running_container(owner: &mut Owner, wanted: &Notify) {
    let path = format!("/kubepods/burstable/pod{POD_UID}/{}", container_id());
    let mkdir = Detail::CgroupMkdir(CgroupDetail { id: CGROUP, path, truncated: false });
    apply(owner, event(SECOND, 1, 1, mkdir));
    // A container the runtime has not named yet: the runtime is asked at once.
    assert!(wanted.notified().now_or_never().is_some(), "MetadataNeeded woke the runtime link");
    owner.handle_all([Command::RuntimeListed { containers: vec![meta()] }], BootTime::from_ns(SECOND));
    apply(owner, event(2 * SECOND, 100, CGROUP, main_exec("app")));
    assert_eq!(owner.publish(), None);
}

#[test]
fn judgements_reach_the_distributions_before_the_snapshot_that_shows_the_stop() {
    let Owned { mut owner, handle, units, wanted, .. } = owned();
    running_container(&mut owner, &wanted);
    let term = Detail::Signal {
        signal: 15,
        result: SignalResult::Delivered,
        group: true,
        target_pid: 100,
        target_tgid: 100,
        target_cgroup_id: CGROUP,
        sender_comm: "containerd-shim".into(),
        target_comm: "app".into(),
        from_kernel: false,
    };
    apply(&mut owner, event(3 * SECOND, 7, 7, term));
    assert_eq!(duration_count(&units), None, "nothing judged yet");
    let exit = main_exit(0, "app");
    let ended = apply(&mut owner, event(4 * SECOND, 100, CGROUP, exit));
    assert_eq!(ended.len(), 1, "the exit ended the container");
    let count = duration_count(&units).expect("the stop is in the distributions");
    assert!(count.contains("namespace=\"shop\"") && count.ends_with(" 1"), "{count}");
    let running = published_state(&handle).expect("published");
    assert!(running.starts_with("Running"), "not published yet: readers still see {running}");
    assert_eq!(owner.publish(), None);
    let terminated = published_state(&handle).expect("published");
    assert!(terminated.starts_with("Terminated"), "{terminated}");
    // A scrape reads; it takes nothing from the model (a second one says the same).
    assert_eq!(duration_count(&units), Some(count));
}

#[test]
fn a_pass_that_only_counted_publishes_within_the_counting_interval_and_a_state_change_at_once() {
    let Owned { mut owner, handle, wanted, .. } = owned();
    running_container(&mut owner, &wanted);
    let published = || handle.snapshots().borrow().clone();
    let before = published();
    // A process the runtime starts into the running container (an exec probe): counted only.
    apply(&mut owner, event(3 * SECOND, 101, CGROUP, main_exec("app")));
    let due = owner.publish().expect("a publish is pending");
    assert!(due <= COUNTING_PUBLISH_EVERY, "{due:?}");
    assert!(Arc::ptr_eq(&published(), &before), "not published within the interval");
    // The container's init exits: its state changes, and everything pending goes out at once.
    let exit = main_exit(1, "app");
    apply(&mut owner, event(4 * SECOND, 100, CGROUP, exit));
    assert_eq!(owner.publish(), None);
    let after = published();
    assert!(!Arc::ptr_eq(&after, &before), "published");
    let exec_sessions = after.containers(crate::model::time::BootTime::from_ns(5 * SECOND))[0].exec_sessions;
    assert_eq!(exec_sessions, 1, "the counted exec went out with the exit");
    assert_eq!(owner.publish(), None, "nothing left to publish");
}

#[test]
fn a_loops_command_is_run_by_the_owner_and_answered_once_its_snapshot_is_published() {
    let Owned { mut owner, handle, wanted, .. } = owned();
    running_container(&mut owner, &wanted);
    let mut answered = Box::pin(handle.update(Command::RuntimeUnreachable));
    assert!((&mut answered).now_or_never().is_none(), "queued: the owner has not run it");
    assert!(owner.run_queued(), "the owner ran it");
    assert!((&mut answered).now_or_never().is_none(), "run, but its snapshot is not published yet");
    assert_eq!(owner.publish(), None, "a pass that ran a command publishes at once");
    assert_eq!(answered.now_or_never(), Some(()));
}

#[test]
fn a_burst_of_commands_is_run_a_pass_at_a_time_and_the_owner_is_woken_for_the_rest() {
    let Owned { mut owner, handle, .. } = owned();
    let burst = COMMANDS_PER_PASS + 6;
    let mut senders: Vec<_> = (0..burst).map(|_| Box::pin(handle.update(Command::RuntimeUnreachable))).collect();
    for sender in &mut senders {
        assert!(sender.as_mut().now_or_never().is_none(), "queued");
    }
    let woken = |owner: &Owner| {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let fd = owner.wake_fd();
        let mut fds = [PollFd::new(&*fd, PollFlags::IN)];
        poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).expect("poll") == 1
    };
    assert!(woken(&owner), "the first command woke the owner");
    owner.clear_wake();
    assert!(!woken(&owner));
    assert!(owner.run_queued());
    assert!(woken(&owner), "commands are left: the next poll returns at once");
    owner.clear_wake();
    assert!(owner.run_queued());
    assert!(!woken(&owner), "the queue is empty");
    assert!(!owner.run_queued());
    owner.publish();
    for sender in senders {
        assert_eq!(sender.now_or_never(), Some(()), "every sender saw its command published");
    }
}

#[test]
fn a_probed_containers_facts_go_out_on_its_feed_as_a_command_runs_without_waiting_for_a_snapshot() {
    let Owned { mut owner, handle, feeds, wanted, .. } = owned();
    running_container(&mut owner, &wanted);
    let before = handle.snapshots().borrow().clone();
    let key = ProbeKey { uid: POD_UID.into(), container: "app".into() };
    let mut facts = feeds.open(&key);
    let watch = ProbeWatch { netns: 77, main_pid: 100, since_ns: 2 * SECOND, ports: [8080].into() };
    let told = handle.tell(Command::WatchProbe { key, watch, first: None });
    assert_eq!(told.now_or_never(), Some(()), "told: queued, not waiting for a snapshot");
    assert!(!facts.has_changed().expect("open"), "not run yet");
    assert!(owner.run_queued());
    assert!(facts.has_changed().expect("open"), "published on the feed as the command ran");
    assert_eq!(facts.borrow_and_update().netns, 77);
    // A listener in the pod's netns: counted for the node, a fact for the probe at once.
    let tcp = TcpDetail { socket_cgroup_id: CGROUP, netns: 77, family: 2, local_port: 8080, remote_port: 0, fd: None };
    apply(&mut owner, event(3 * SECOND, 100, CGROUP, Detail::TcpListen(tcp)));
    assert!(facts.borrow_and_update().tcp[&8080].listening, "the probe sees the listener at once");
    assert!(owner.publish().is_some(), "the node's snapshot waits for the counting interval");
    assert!(Arc::ptr_eq(&handle.snapshots().borrow().clone(), &before), "no snapshot was forced");
}
