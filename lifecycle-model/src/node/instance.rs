//! One container instance (a container cgroup) and the processes in it: which process is its
//! init, which were started into it by the runtime (exec sessions), and when it ended. Starts
//! and ends are handed to the unit (see `unit.rs`).

use std::{collections::BTreeMap, time::Duration};

use super::{
    bounds::DroppedKind,
    processes::ProcessEntry,
    unit::{start_unit, CarriedCounters},
    NodeTracker, PortStats, UnitCounters, UnitKey,
};
use crate::{
    identity::{classify, CgroupIdentity},
    termination::{TerminationSettings, TerminationTracker},
    time::{ns_of, BootTime},
};

#[derive(Clone, Copy, Debug)]
pub(super) struct InitProcess {
    pub(super) tgid: u32,
    pub(super) started_at: u64,
    /// Started from outside but in the host's pid namespace: the runtime's own setup process
    /// (runc re-executing itself inside the new cgroup), or the init of a hostPID container. A
    /// process in the container's pid namespace replaces it; its exit ends the instance only if
    /// none comes before the cgroup goes.
    pub(super) provisional: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct InitExit {
    pub(super) time: u64,
    pub(super) exit_status: Option<u8>,
    pub(super) signal: Option<u8>,
}

#[derive(Clone, Debug)]
pub(super) enum InstanceKind {
    /// The pod uid is shared with the snapshots that list the pods with a process.
    Container {
        container_id: String,
        pod_uid: std::sync::Arc<str>,
    },
    Host {
        path: String,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Instance {
    pub(super) kind: InstanceKind,
    pub(super) unit: Option<UnitKey>,
    /// The runtime lists no such container: a pod sandbox (pause) or not the kubelet's.
    pub(super) ignored: bool,
    pub(super) created_at: u64,
    pub(super) init: Option<InitProcess>,
    pub(super) exit: Option<InitExit>,
    /// The exit was applied to the unit (it is linked and judged).
    pub(super) finished: bool,
    /// A provisional init's exit, applied only if no real init shows up before the cgroup goes.
    pub(super) provisional_exit: Option<InitExit>,
    pub(super) termination: TerminationTracker,
    pub(super) spec_hash: Option<String>,
    /// Counted before the instance was linked; merged into the unit on linking.
    pub(super) pending_counters: UnitCounters,
    pub(super) pending_tcp: BTreeMap<u16, PortStats>,
    /// Kernel counters of departed cgroups carried over when the instance changes units.
    pub(super) pending_kernel_counters: CarriedCounters,
    /// Its cgroup is gone while it still waited for its name: kept until the next metadata links
    /// (and judges) or ignores it, so a container that lives for milliseconds is not lost.
    pub(super) departed: bool,
    /// Linked to a unit named by pod uid + container id because the runtime could not name it;
    /// re-linked to its real unit when metadata arrives.
    pub(super) named_by_id: bool,
}

/// A process found in /proc at start.
#[derive(Clone, Copy, Debug)]
pub struct SeedProcess<'a> {
    pub tgid: u32,
    pub cgroup_id: u64,
    pub parent_cgroup_id: u64,
    /// In a pid namespace below the host's (NSpid has more than one entry).
    pub child_pid_namespace: bool,
    pub start_time_ns: u64,
    pub comm: &'a str,
}

/// What an exec (seen or seeded) says about the process.
#[derive(Clone, Copy, Debug)]
pub(super) struct ExecFacts {
    pub(super) tgid: u32,
    pub(super) parent_tgid: Option<u32>,
    pub(super) cgroup_id: u64,
    pub(super) parent_cgroup_id: u64,
    pub(super) child_pid_namespace: bool,
    pub(super) exec_time: Option<u64>,
    pub(super) start_time_ns: u64,
}

impl Instance {
    pub(super) fn new(kind: InstanceKind, created_at: u64) -> Self {
        Self {
            kind,
            unit: None,
            ignored: false,
            created_at,
            init: None,
            exit: None,
            finished: false,
            provisional_exit: None,
            termination: TerminationTracker::new(TerminationSettings::default()),
            spec_hash: None,
            pending_counters: UnitCounters::default(),
            pending_tcp: BTreeMap::new(),
            pending_kernel_counters: CarriedCounters::default(),
            named_by_id: false,
            departed: false,
        }
    }
}

impl NodeTracker {
    pub(super) fn exec(&mut self, facts: ExecFacts, time: u64, comm: &str) {
        let ExecFacts { tgid, parent_tgid, cgroup_id, parent_cgroup_id, child_pid_namespace, exec_time, start_time_ns } =
            facts;
        // A process that execs again (sh -c exec ...) keeps its role; only its name changes.
        if self.processes.renamed(tgid, cgroup_id, start_time_ns, comm) {
            return;
        }
        if !self.instances.contains(cgroup_id) {
            // A plain-host cgroup becomes a unit when something runs in it; so does a cgroup
            // under kubepods in a layout the agent does not know (counted when it appeared).
            let Some(path) = self.cgroups.get(&cgroup_id).cloned() else { return };
            if !matches!(classify(&path), Ok(CgroupIdentity::HostUnit { .. }) | Err(_)) {
                return;
            }
            self.instances.insert(cgroup_id, Instance::new(InstanceKind::Host { path }, time));
            self.link(cgroup_id);
        }
        let from_outside = parent_cgroup_id != cgroup_id;
        self.restart_host_unit_if_over(cgroup_id, time);
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let is_container = matches!(instance.kind, InstanceKind::Container { .. });
        let no_real_init = instance.init.is_none_or(|init| init.provisional);
        let mut exec_session = false;
        if is_container
            && from_outside
            && instance.exit.is_none()
            && (instance.init.is_none() || (no_real_init && child_pid_namespace))
        {
            // The container's init: started by the runtime, in the container's pid namespace
            // (provisionally when it shares the host's, see InitProcess::provisional).
            let replaces_provisional = instance.init.is_some();
            let started_at = exec_time.unwrap_or(start_time_ns);
            instance.init = Some(InitProcess { tgid, started_at, provisional: !child_pid_namespace });
            self.staged.states_changed = true;
            self.live_inits.take();
            instance.provisional_exit = None;
            let (unit_key, spec_hash) = (instance.unit.clone(), instance.spec_hash.clone());
            if !replaces_provisional {
                if let Some(key) = unit_key {
                    if let Some(unit) = self.units.get_mut(&key) {
                        start_unit(unit, started_at, spec_hash);
                    }
                    if let UnitKey::Container { pod_uid, .. } = &key {
                        self.recognise_sidecars(&pod_uid.clone());
                    }
                }
            }
        } else if !is_container && instance.init.is_none() && instance.exit.is_none() {
            let started_at = exec_time.unwrap_or(start_time_ns);
            instance.init = Some(InitProcess { tgid, started_at, provisional: false });
            self.staged.states_changed = true;
            let (unit_key, spec_hash) = (instance.unit.clone(), instance.spec_hash.clone());
            if let Some(unit) = unit_key.and_then(|k| self.units.get_mut(&k)) {
                start_unit(unit, started_at, spec_hash);
            }
        } else if from_outside && is_container {
            // Started into the container by the runtime without descending from its init.
            exec_session = true;
            let kept = instance.termination.on_exec_session(start_time_ns, None, comm);
            self.dropped.note(DroppedKind::ExecSession, kept);
            if let Some((counters, _)) = self.counters_of(cgroup_id) {
                counters.exec_sessions += 1;
            }
        } else {
            // Forked by something inside: part of an exec session if its parent was.
            exec_session = parent_tgid
                .and_then(|parent| self.processes.get(parent))
                .is_some_and(|parent| parent.cgroup_id == cgroup_id && parent.exec_session);
        }
        self.processes.insert(tgid, ProcessEntry { cgroup_id, start_time_ns, exec_session, comm: comm.to_owned() });
    }

    pub(super) fn exit(
        &mut self,
        tgid: u32,
        cgroup_id: u64,
        time: u64,
        exit_status: Option<u8>,
        signal: Option<u8>,
        cpu_time: Duration,
    ) {
        let process = self.processes.remove(tgid);
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        if let Some(process) = &process {
            if process.exec_session {
                let kept = instance.termination.on_exec_session(process.start_time_ns, Some(time), &process.comm);
                self.dropped.note(DroppedKind::ExecSession, kept);
                if let Some((counters, _)) = self.counters_of(cgroup_id) {
                    counters.exec_session_cpu_ns += ns_of(cpu_time);
                }
            }
        }
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let Some(init) = instance.init.filter(|init| init.tgid == tgid) else { return };
        if instance.exit.is_some() {
            return;
        }
        if init.provisional {
            // Wait for the container's real init, or for the cgroup to go (see on_instance_gone).
            instance.provisional_exit = Some(InitExit { time, exit_status, signal });
            return;
        }
        if matches!(instance.kind, InstanceKind::Host { .. }) {
            // On a plain host the unit runs while any of its processes does: hand the main role
            // to the oldest remaining process instead of ending the unit.
            let heir = self
                .processes
                .in_cgroup(cgroup_id)
                .min_by_key(|(pid, p)| (p.start_time_ns, *pid))
                .map(|(pid, p)| InitProcess { tgid: pid, started_at: p.start_time_ns, provisional: false });
            if let Some(heir) = heir {
                let started_at = instance.init.map_or(heir.started_at, |i| i.started_at);
                instance.init = Some(InitProcess { tgid: heir.tgid, started_at, provisional: false });
                self.live_inits.take();
                return;
            }
        }
        instance.exit = Some(InitExit { time, exit_status, signal });
        self.live_inits.take();
        self.staged.ended.push(super::Ended { cgroup_id, exit: BootTime::from_ns(time) });
        if instance.unit.is_some() {
            self.finish(cgroup_id);
        }
    }

    /// A plain-host cgroup whose processes all ended and that runs something again: a new run.
    fn restart_host_unit_if_over(&mut self, cgroup_id: u64, time: u64) {
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let InstanceKind::Host { path } = &instance.kind else { return };
        if instance.exit.is_none() {
            return;
        }
        let mut fresh = Instance::new(InstanceKind::Host { path: path.clone() }, time);
        fresh.unit = instance.unit.clone();
        let key = fresh.unit.clone();
        *instance = fresh;
        if let Some(key) = key {
            let settings = self.settings_for(&key, None);
            if let Some(instance) = self.instances.get_mut(cgroup_id) {
                instance.termination.set_settings(settings);
            }
            // Its settings may have changed since the last run (`daemon-reload`).
            if let UnitKey::Host { path } = &key {
                if let Some(unit) = crate::systemd::unit_of_path(path) {
                    self.staged
                        .notices
                        .push(super::Notice::SystemdUnitWanted { path: path.clone(), unit: unit.to_owned() });
                }
            }
        }
        if let Some(unit) = self.unit_of(cgroup_id) {
            unit.status.on_instance_created(BootTime::from_ns(time));
        }
        self.staged.states_changed = true;
    }
}
