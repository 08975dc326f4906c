//! The model's one door in: every change the agent makes to the node model is a [`Command`],
//! data that says what happened (a kernel event, the runtime's answer, a pod's facts, a notice
//! of the kubelet, a tick of expiry, a repair's look at /proc and cgroupfs, a probe's sample),
//! and [`NodeTracker::handle`] is the one call that applies it, at a time the caller gives.
//!
//! Commands are plain data, `Debug` and serde-serializable: the agent can record the sequence it
//! handled (`LIFECYCLE_RECORD_COMMANDS`), a test replays one (`tests/replay.rs`) and the fuzzer
//! makes up others (`fuzz/fuzz_targets/model_commands.rs`). Nothing reads the model through this
//! door: readers take the owner's snapshots (`snapshot.rs`).

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use lifecycle_common::CgroupCounters;
use serde::{Deserialize, Serialize};

use super::{
    pods::NoticeFor, MemoryReading, NodeTracker, Notice, Outcome, ProbeKey, ProbeSample, ProbeWatch, SeedProcess,
    WatchKept,
};
use crate::{
    event::Event,
    kubelet::KubeletPolicy,
    metadata::ContainerMeta,
    oom::KernelOomKill,
    spec::{KillNotice, LivenessFailure, PodFacts, PodRef},
    systemd::SystemdUnit,
    time::{ns_of, BootTime},
};

/// One change to the node model (see the module header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// A kernel record, decoded (its time is its own).
    Event(Event),
    /// The kernel's last counts of a cgroup whose removal comes next: taken from its map entry
    /// before the entry is freed for reuse, kept with its unit.
    DepartingCounters {
        cgroup_id: u64,
        #[serde(with = "counters_serde")]
        counters: CgroupCounters,
    },
    /// What existed before the programs were attached: every cgroup on disk and every process in
    /// one of them, oldest first.
    Seed { cgroups: Vec<FoundCgroup>, processes: Vec<FoundProcess> },
    /// Cgroups on disk now, after an event named one the model did not know (its mkdir record
    /// was lost): those it does not know are seeded.
    Rescan { cgroups: Vec<FoundCgroup> },
    /// A look at /proc and cgroupfs after the ring lost records (see [`ResyncLook`]).
    Resync(ResyncLook),
    /// Every container the runtime lists now, with its metadata.
    RuntimeListed { containers: Vec<ContainerMeta> },
    /// The runtime did not answer.
    RuntimeUnreachable,
    /// The Kubernetes API is the pods' spec source from now on (it may still be unreachable).
    ApiConfigured,
    /// The API's current view of a pod of this node.
    Pod(PodFacts),
    /// A pod left the API (deleted, or moved off this node), with its last facts.
    PodGone(PodFacts),
    /// A pod left the API whose object could not be read: its uid only.
    PodForgotten { uid: String },
    /// The pod watch listed every pod again (or resumed): the API answers; after a relist, the
    /// pods it did not list (`listed`) are gone.
    PodsListed { listed: Option<Vec<String>> },
    /// The pod watch failed: verdicts are marked as made without a current spec until it lists.
    ApiUnreachable,
    /// The kubelet's Event that it kills a container (a failed liveness or startup probe).
    KillNotice(KillNotice),
    /// The kubelet's Event that it evicts a pod.
    EvictionNotice(PodRef),
    /// The kubelet's Event of a failed liveness probe, recorded `at` (on the boot clock).
    LivenessFailure { failure: LivenessFailure, at: BootTime },
    /// The kernel's `oom-kill:` log line of a kill.
    OomLog(KernelOomKill),
    /// Forget units idle for longer than `retention` (and gone pods, stale notices).
    Expire {
        #[serde(rename = "retention_ns", with = "crate::time::duration_ns")]
        retention: Duration,
    },
    /// Watch a container for its probes, replacing an earlier watch; `first` is the sample taken
    /// when probing began.
    WatchProbe { key: ProbeKey, watch: ProbeWatch, first: Option<ProbeSample> },
    /// Stop watching a container for its probes.
    UnwatchProbe { key: ProbeKey },
    /// What a /proc pass found for a probed container.
    SampleProbe { key: ProbeKey, sample: ProbeSample },
    /// What systemd says of the unit whose cgroup is `path`.
    SystemdUnit { path: String, facts: SystemdUnit },
    /// What the node's kubelet is expected to do from now on.
    Kubelet(KubeletPolicy),
    /// Running containers' memory readings (changes only); `left_out` were not read (a bound).
    MemoryReadings { readings: Vec<MemoryReading>, left_out: usize },
    /// Hand the warnings noted since the last flush to the Event sink (`Outcome::warnings`).
    FlushWarnings,
}

/// A cgroup found on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundCgroup {
    pub id: u64,
    /// Its path below the cgroup root (`/kubepods.slice/...`).
    pub path: String,
}

/// A process found in /proc.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundProcess {
    pub tgid: u32,
    pub ppid: u32,
    pub cgroup_id: u64,
    /// Lives in a pid namespace below the host's.
    pub child_pid_namespace: bool,
    /// Its start (the kernel's start time, to the clock tick /proc gives).
    pub started_at: BootTime,
    pub comm: String,
    /// Exited, not yet reaped: no longer running.
    pub zombie: bool,
}

/// One look at the node after the ring lost records: what runs and what is on disk now. What
/// the model believes alive and this look does not find is suspect; what two looks in a row
/// (a second apart) do not find is repaired, so that a record still on its way through the ring
/// is applied first, with its real facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncLook {
    /// Every cgroup on disk.
    pub cgroups: Vec<FoundCgroup>,
    /// Every process in one of them, oldest first (those the model does not know are seeded).
    pub processes: Vec<FoundProcess>,
    /// How far a start time read from /proc may be from the kernel's (it is rounded to ticks).
    #[serde(rename = "start_tolerance_ns", with = "crate::time::duration_ns")]
    pub start_tolerance: Duration,
    /// The kernel's last counts of the cgroups this look removes, filled in by the model's owner
    /// from the kernel's map before the look is handled ([`NodeTracker::cgroups_a_look_removes`]).
    #[serde(default)]
    pub departing: Vec<DepartingCounters>,
}

/// The kernel's last counts of a departing cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepartingCounters {
    pub cgroup_id: u64,
    #[serde(with = "counters_serde")]
    pub counters: CgroupCounters,
}

/// What a repair suspects from its last look: processes (tgid, start) and cgroups it did not
/// find (see [`ResyncLook`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Suspects {
    processes: HashSet<(u32, u64)>,
    cgroups: HashSet<u64>,
}

impl NodeTracker {
    /// Applies `command` at `now` (the boot clock when its sender or the owner took it; a kernel
    /// event carries its own time) and returns what it changed that the plumbing acts on.
    #[must_use = "the outcome carries judgements and notices the caller routes"]
    pub fn handle(&mut self, command: Command, now: BootTime) -> Outcome {
        let at = now.ns();
        match command {
            Command::Event(event) => self.apply(&event),
            Command::DepartingCounters { cgroup_id, counters } => {
                self.absorb_kernel_counters(cgroup_id, counters);
                self.counted_outcome()
            }
            Command::Seed { cgroups, processes } => {
                let mut outcome = Outcome::default();
                for cgroup in &cgroups {
                    outcome.extend(self.seed_cgroup(cgroup.id, &cgroup.path, at));
                }
                outcome.extend(self.seed_processes(&processes));
                outcome
            }
            Command::Rescan { cgroups } => {
                let on_disk: Vec<(u64, String)> = cgroups.into_iter().map(|c| (c.id, c.path)).collect();
                let (report, mut outcome) = self.resync(&[], &[], &on_disk, |_| None, at);
                outcome.notices.push(Notice::Repaired(report));
                outcome
            }
            Command::Resync(look) => self.resync_look(look, at),
            Command::RuntimeListed { containers } => self.set_metadata(containers),
            Command::RuntimeUnreachable => self.set_runtime_reachable(false),
            Command::ApiConfigured => {
                self.set_api_configured();
                self.outcome()
            }
            Command::Pod(facts) => self.apply_pod(facts, at),
            Command::PodGone(facts) => self.pod_gone(facts, at),
            Command::PodForgotten { uid } => {
                self.forget_pod(&uid);
                self.outcome()
            }
            Command::PodsListed { listed } => {
                if let Some(listed) = listed {
                    let listed: HashSet<String> = listed.into_iter().collect();
                    for uid in self.pod_uids().into_iter().filter(|uid| !listed.contains(uid)) {
                        self.forget_pod(&uid);
                    }
                }
                self.set_api_reachable(true);
                self.outcome()
            }
            Command::ApiUnreachable => {
                self.set_api_reachable(false);
                self.outcome()
            }
            Command::KillNotice(notice) => match self.refused(&notice.pod) {
                Some(refused) => refused,
                None => self.apply_kill_notice(notice, at),
            },
            Command::EvictionNotice(pod) => match self.refused(&pod) {
                Some(refused) => refused,
                None => self.apply_eviction_notice(&pod, at),
            },
            Command::LivenessFailure { failure, at: failed_at } => match self.refused(&failure.pod) {
                Some(refused) => refused,
                // The kubelet's clock may run ahead of ours: a failure is never later than now.
                None => self.apply_liveness_failure(failure, failed_at.min(now).ns(), at),
            },
            Command::OomLog(kill) => self.apply_oom_log(kill, at),
            Command::Expire { retention } => self.expire(at, ns_of(retention)),
            Command::WatchProbe { key, watch, first } => {
                let (kept, mut outcome) = self.watch_probe(key.clone(), watch, first.as_ref());
                if kept == WatchKept::Refused {
                    outcome.notices.push(Notice::ProbeWatchRefused { key });
                }
                outcome
            }
            Command::UnwatchProbe { key } => self.unwatch_probe(&key),
            Command::SampleProbe { key, sample } => self.sample_probe(&key, &sample),
            Command::SystemdUnit { path, facts } => self.set_systemd_unit(&path, facts),
            Command::Kubelet(policy) => self.set_kubelet(policy),
            Command::MemoryReadings { readings, left_out } => self.apply_memory_readings(readings, left_out),
            Command::FlushWarnings => {
                let warnings = self.take_warnings();
                let mut outcome = self.counted_outcome();
                outcome.warnings = warnings;
                outcome
            }
        }
    }

    /// The outcome of a notice that names a pod of this node's uid under another namespace or
    /// name (a forged Event): ignored, and told to the plumbing. None for any other notice.
    fn refused(&mut self, pod: &PodRef) -> Option<Outcome> {
        if self.notice_for(pod) != NoticeFor::OtherPod {
            return None;
        }
        let mut outcome = self.counted_outcome();
        outcome.notices.push(Notice::ForgedNotice { namespace: pod.namespace.clone(), name: pod.name.clone() });
        Some(outcome)
    }

    /// Hands processes found in /proc (oldest first) to the model; it skips those it knows. The
    /// first process of a cgroup whose parent runs outside it becomes the cgroup's init.
    fn seed_processes(&mut self, processes: &[FoundProcess]) -> Outcome {
        let cgroup_of: HashMap<u32, u64> = processes.iter().map(|p| (p.tgid, p.cgroup_id)).collect();
        let mut outcome = Outcome::default();
        for process in processes {
            outcome.extend(self.seed_process(SeedProcess {
                tgid: process.tgid,
                cgroup_id: process.cgroup_id,
                parent_cgroup_id: cgroup_of.get(&process.ppid).copied().unwrap_or(0),
                child_pid_namespace: process.child_pid_namespace,
                start_time_ns: process.started_at.ns(),
                comm: &process.comm,
            }));
        }
        outcome
    }

    /// What `look` finds missing: the tracked processes it does not see running, and the
    /// tracked cgroups not on disk.
    fn missing_in(&self, look: &ResyncLook) -> Suspects {
        let running: HashMap<u32, u64> =
            look.processes.iter().filter(|p| !p.zombie).map(|p| (p.tgid, p.started_at.ns())).collect();
        let processes = self
            .tracked_processes()
            .into_iter()
            .filter(|(tgid, start)| {
                running.get(tgid).is_none_or(|found| found.abs_diff(*start) > ns_of(look.start_tolerance))
            })
            .collect();
        let on_disk: HashSet<u64> = look.cgroups.iter().map(|c| c.id).collect();
        let cgroups = self.cgroups.keys().copied().filter(|id| !on_disk.contains(id)).collect();
        Suspects { processes, cgroups }
    }

    /// The cgroups handling `look` would remove: tracked, missing from it and from the look
    /// before. The owner takes their kernel counts into [`ResyncLook::departing`] first.
    pub fn cgroups_a_look_removes(&self, look: &ResyncLook) -> Vec<u64> {
        let Some(suspects) = &self.suspects else { return Vec::new() };
        self.missing_in(look).cgroups.intersection(&suspects.cgroups).copied().collect()
    }

    /// Applies one look after lost records (see [`ResyncLook`]).
    fn resync_look(&mut self, look: ResyncLook, now: u64) -> Outcome {
        let mut missing = self.missing_in(&look);
        // Missing twice in a row: repaired now. Missing for the first time: suspect.
        let (dead, gone): (Vec<(u32, u64)>, Vec<u64>) = match self.suspects.take() {
            Some(was) => (
                missing.processes.intersection(&was.processes).copied().collect(),
                missing.cgroups.intersection(&was.cgroups).copied().collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        missing.processes.retain(|process| !dead.contains(process));
        missing.cgroups.retain(|id| !gone.contains(id));
        if !missing.processes.is_empty() || !missing.cgroups.is_empty() {
            self.suspects = Some(missing);
        }
        let dead: Vec<u32> = dead.into_iter().map(|(tgid, _)| tgid).collect();
        let ResyncLook { cgroups, processes, departing, .. } = look;
        let departing: HashMap<u64, CgroupCounters> =
            departing.into_iter().map(|d| (d.cgroup_id, d.counters)).collect();
        let on_disk: Vec<(u64, String)> = cgroups.into_iter().map(|c| (c.id, c.path)).collect();
        let (report, mut outcome) = self.resync(&dead, &gone, &on_disk, |id| departing.get(&id).copied(), now);
        // Processes whose exec records were lost (in cgroups found now, or in known ones).
        outcome.extend(self.seed_processes(&processes));
        outcome.notices.push(Notice::Repaired(report));
        outcome
    }
}

/// `CgroupCounters` (the kernel's `#[repr(C)]` type, without serde in its `no_std` crate) as
/// its fields.
mod counters_serde {
    use lifecycle_common::{CgroupCounters, SIGNAL_SLOTS};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "CgroupCounters")]
    struct Fields {
        execs: u64,
        process_exits: u64,
        signals_received: u64,
        signals_sent: u64,
        oom_kills: u64,
        tcp_listens: u64,
        tcp_established: u64,
        tcp_accepts: u64,
        events_lost: u64,
        unrecorded_signals: [u64; SIGNAL_SLOTS],
    }

    pub(super) fn serialize<S: Serializer>(counters: &CgroupCounters, serializer: S) -> Result<S::Ok, S::Error> {
        Fields::serialize(counters, serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<CgroupCounters, D::Error> {
        Fields::deserialize(deserializer)
    }
}
