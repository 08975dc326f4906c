//! How each kernel record changes the node: the dispatch of [`Event`]s to the parts they
//! concern (cgroups, instances, processes, units' counters), and the life of a container cgroup
//! from its creation to the end of its instance. [`NodeTracker::apply`] (in `mod.rs`) runs this
//! and returns what the change produced.

use std::collections::BTreeMap;

use super::*;

impl NodeTracker {
    pub(super) fn apply_event(&mut self, event: &Event) {
        match &event.detail {
            // Ids are never reused within a boot: a cgroup already known was found by a scan
            // before its record arrived, and what was learned about it since is kept.
            Detail::CgroupMkdir(c) if !self.cgroups.contains_key(&c.id) => {
                self.on_cgroup_created(c.id, &c.path, event.at.ns())
            }
            Detail::CgroupMkdir(_) => {}
            Detail::CgroupRmdir(c) => {
                self.cgroups.remove(&c.id);
                self.on_instance_gone(c.id);
            }
            Detail::Exec { parent_tgid, parent_cgroup_id, started, comm, child_pid_namespace, .. } => {
                if comm == KUBELET_COMM && !self.is_container_cgroup(event.cgroup_id) {
                    self.on_kubelet_started(event.at);
                    self.staged.notices.push(Notice::KubeletStarted { pid: event.tgid });
                }
                if self.known_cgroup(event.cgroup_id) {
                    let exec = ExecFacts {
                        tgid: event.tgid,
                        parent_tgid: Some(*parent_tgid),
                        cgroup_id: event.cgroup_id,
                        parent_cgroup_id: *parent_cgroup_id,
                        child_pid_namespace: *child_pid_namespace,
                        exec_time: Some(event.at.ns()),
                        start_time_ns: started.ns(),
                    };
                    self.exec(exec, event.at.ns(), comm);
                }
            }
            Detail::Exit { exit_status, signal, group_dead, cpu_time, .. } => {
                if *group_dead {
                    self.exit(event.tgid, event.cgroup_id, event.at.ns(), *exit_status, *signal, *cpu_time);
                }
            }
            Detail::Signal { signal, target_tgid, target_cgroup_id, sender_comm, from_kernel, .. } => {
                let same = event.cgroup_id == *target_cgroup_id;
                // A process inside any container is never the runtime or the kubelet, whatever
                // it calls itself: a pod can name a process `containerd-shim`. A signal the kernel
                // generated is no one's request, whoever ran (a tenant's F_SETOWN pipe makes the
                // shim's read send it SIGIO, or SIGTERM with F_SETSIG).
                let sender = match SignalSender::from_comm(sender_comm, same, event.tgid) {
                    _ if *from_kernel => SignalSender::Kernel,
                    sender if sender.is_kubelet_side() && self.is_container_cgroup(event.cgroup_id) => {
                        SignalSender::other(sender_comm, event.tgid)
                    }
                    sender => sender,
                };
                let kind = sender.kind();
                if let Some(instance) = self.instances.get_mut(*target_cgroup_id) {
                    let to_init = instance.init.is_some_and(|i| i.tgid == *target_tgid);
                    let kept = instance.termination.on_signal(event.at.ns(), *signal as u8, sender, to_init);
                    self.dropped.note(DroppedKind::Signal, kept);
                    let init = instance.init.map(|i| i.tgid);
                    // The stop signal or the SIGKILL just came: who runs now (once each).
                    if let Some(moment) = instance.termination.scene_wanted() {
                        let processes = self.processes_of(*target_cgroup_id, init);
                        if let Some(instance) = self.instances.get_mut(*target_cgroup_id) {
                            instance.termination.on_scene(moment, processes);
                        }
                    }
                    let stop_now = to_init && *signal != u32::from(crate::termination::SIGKILL);
                    let mut turn_wanted = false;
                    if let Some(instance) = self.instances.get_mut(*target_cgroup_id) {
                        instance.termination.on_signal_to(*target_tgid, *signal as u8);
                        turn_wanted = stop_now && instance.termination.kubelet_stop_time() == Some(event.at.ns());
                    }
                    // A sidecar's stop signal: how long the kubelet held it for its turn.
                    if turn_wanted {
                        self.note_sidecar_turn(*target_cgroup_id, event.at.ns());
                    }
                }
                if let Some((counters, _)) = self.counters_of(*target_cgroup_id) {
                    *counters.signals.entry((*signal, kind)).or_default() += 1;
                }
            }
            Detail::OomVictim { victim_tgid, victim_cgroup_id, .. } => {
                if let Some(instance) = self.instances.get_mut(*victim_cgroup_id) {
                    let is_init = instance.init.is_some_and(|i| i.tgid == *victim_tgid);
                    let kept = instance.termination.on_oom_kill(event.at.ns(), is_init);
                    self.dropped.note(DroppedKind::OomKill, kept);
                }
                self.oom_victim_seen(event.at.ns(), *victim_tgid, *victim_cgroup_id);
                if let Some((counters, _)) = self.counters_of(*victim_cgroup_id) {
                    counters.oom_kills += 1;
                }
            }
            Detail::TcpListen(t) | Detail::TcpListenClose(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => {
                let time = event.at.ns();
                if let Some(instance) = self.instances.get_mut(t.socket_cgroup_id) {
                    let termination = &mut instance.termination;
                    let (kind, kept) = match event.detail {
                        Detail::TcpListen(_) => (DroppedKind::ListenerChange, termination.on_listen(time)),
                        Detail::TcpListenClose(_) => (DroppedKind::ListenerChange, termination.on_listen_close(time)),
                        Detail::TcpAccept(_) => (DroppedKind::Accept, termination.on_listener_accept(time)),
                        _ => (DroppedKind::Accept, Retention::Kept),
                    };
                    self.dropped.note(kind, kept);
                }
                if let Some((_, tcp)) = self.counters_of(t.socket_cgroup_id) {
                    let Some(port) = unit::port_entry(tcp, t.local_port) else {
                        self.dropped.add(DroppedKind::Port, 1);
                        return;
                    };
                    port.last_change_ns = port.last_change_ns.max(time);
                    match event.detail {
                        Detail::TcpListen(_) => port.listeners += 1,
                        Detail::TcpListenClose(_) => port.listeners = (port.listeners - 1).max(0),
                        Detail::TcpEstablished(_) => port.established += 1,
                        _ => {
                            port.accepts += 1;
                            port.last_accept_ns = Some(time);
                        }
                    }
                }
            }
        }
    }

    /// A kubelet process started on the host: every container's back-off starts over.
    fn on_kubelet_started(&mut self, at: BootTime) {
        self.kubelet_started_at = Some(at);
        for unit in self.units.values_mut() {
            if matches!(unit.key, UnitKey::Container { .. }) {
                unit.backoff.on_kubelet_restart(at);
            }
        }
    }

    fn is_container_cgroup(&self, id: u64) -> bool {
        self.instances.is_container(id)
    }

    fn known_cgroup(&mut self, id: u64) -> bool {
        if self.cgroups.contains_key(&id) {
            return true;
        }
        self.staged.notices.push(Notice::UnknownCgroup(id));
        false
    }

    /// Where a cgroup's counts go: its unit's, or the instance's own until it is linked.
    pub(super) fn counters_of(&mut self, cgroup_id: u64) -> Option<(&mut UnitCounters, &mut BTreeMap<u16, PortStats>)> {
        let instance = self.instances.get_mut(cgroup_id)?;
        match instance.unit.clone() {
            Some(key) => self.units.get_mut(&key).map(|u| (&mut u.counters, &mut u.tcp)),
            None => Some((&mut instance.pending_counters, &mut instance.pending_tcp)),
        }
    }

    pub(super) fn on_cgroup_created(&mut self, id: u64, path: &str, time: u64) {
        self.cgroups.insert(id, path.to_owned());
        match classify(path) {
            Ok(CgroupIdentity::Container { pod_uid, container_id, .. }) => {
                self.instances
                    .insert(id, Instance::new(InstanceKind::Container { container_id, pod_uid: pod_uid.into() }, time));
                // A reused cgroup id may replace an instance whose end was lost.
                self.live_inits.take();
                self.link(id);
            }
            // Host cgroups become units when a process runs in them; the rest hold no container.
            Ok(_) => {}
            // Named by its path when a process runs in it, as a host cgroup is (`exec`): its
            // processes are watched, its pod and container are not guessed.
            Err(error) => {
                self.dropped.add(DroppedKind::CgroupLayout, 1);
                self.staged.notices.push(Notice::BadCgroupPath { path: path.to_owned(), error: error.to_string() })
            }
        }
    }

    /// Instances whose cgroup is gone and that were linked or ignored since: finished with.
    pub(super) fn drop_departed(&mut self) {
        for cgroup_id in self.instances.departed_and_done() {
            self.on_instance_gone(cgroup_id);
        }
    }

    /// At most [`MAX_DEPARTED_WAITING`] gone instances wait for a name; the oldest go first.
    fn bound_departed(&mut self) {
        let excess = self.instances.departed_beyond(MAX_DEPARTED_WAITING);
        if excess.is_empty() {
            return;
        }
        for &cgroup_id in &excess {
            self.instances.remove(cgroup_id);
        }
        self.live_inits.take();
        self.dropped.add(DroppedKind::DepartedInstance, excess.len() as u64);
    }

    pub(super) fn on_instance_gone(&mut self, cgroup_id: u64) {
        // A provisional init (hostPID container) whose exit no real init followed: that was it.
        if let Some(instance) = self.instances.get_mut(cgroup_id) {
            if instance.exit.is_none() {
                if let Some(exit) = instance.provisional_exit.take() {
                    instance.exit = Some(exit);
                    self.live_inits.take();
                    self.finish(cgroup_id);
                }
            }
        }
        let Some(instance) = self.instances.get_mut(cgroup_id) else { return };
        let waiting_for_name =
            instance.unit.is_none() && !instance.ignored && matches!(instance.kind, InstanceKind::Container { .. });
        if waiting_for_name && !instance.departed {
            instance.departed = true;
            self.processes.remove_cgroup(cgroup_id);
            self.bound_departed();
            return;
        }
        let Some(instance) = self.instances.remove(cgroup_id) else { return };
        self.live_inits.take();
        if let Some(unit) = instance.unit.and_then(|k| self.units.get_mut(&k)) {
            if unit.cgroup_id == Some(cgroup_id) {
                unit.cgroup_id = None;
                unit.tcp.values_mut().for_each(|p| p.listeners = 0);
            }
        }
        self.processes.remove_cgroup(cgroup_id);
    }
}
