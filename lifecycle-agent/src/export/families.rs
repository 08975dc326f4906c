//! Every metric family the agent serves, listed once: name, type, labels and help. The
//! registering code (the agent's health in `metrics.rs`, the probes', the Kubernetes link's,
//! the repairs', the Events', the API gate's) takes its options from here, and the per-container
//! text (`unit_text.rs`, `units.rs`) its names and help, so a family cannot be served under two
//! spellings or left out of `docs/metrics.md` (the tests below check both ways).

use prometheus::{HistogramOpts, Opts};

use super::metrics::NAMESPACE;

/// A family's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As `# TYPE` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One family.
#[derive(Debug)]
pub struct Family {
    /// The full name, `lifecycle_` included.
    pub name: &'static str,
    pub kind: Kind,
    /// Its labels, in the order the series carry them (`le` of histograms left out).
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

impl Family {
    /// The name without the namespace, as prometheus' options take it.
    fn short_name(&self) -> &'static str {
        // Every name below is written with the prefix; the tests check it.
        self.name.strip_prefix("lifecycle_").unwrap_or(self.name)
    }

    /// Options for a counter or gauge of this family.
    pub(crate) fn opts(&self) -> Opts {
        Opts::new(self.short_name(), self.help).namespace(NAMESPACE)
    }

    /// Options for a histogram of this family, with its buckets.
    pub(crate) fn histogram_opts(&self, buckets: Vec<f64>) -> HistogramOpts {
        HistogramOpts::new(self.short_name(), self.help).namespace(NAMESPACE).buckets(buckets)
    }
}

macro_rules! families {
    ($(#[$meta:meta])* $list:ident, $ids:ident {
        $($id:ident: $name:literal, $kind:ident, [$($label:literal),*], $help:literal;)*
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum $ids { $($id),* }

        pub(crate) const $list: &[Family] = &[$(Family {
            name: $name,
            kind: Kind::$kind,
            labels: &[$($label),*],
            help: $help,
        }),*];

        impl $ids {
            #[allow(dead_code, reason = "generated for every list; not every list is read by id (allow, not expect: the lists that are read would leave the expectation unfulfilled)")]
            pub(crate) fn family(self) -> &'static Family {
                &$list[self as usize]
            }
        }
    };
}

families! {
    /// The families written per container straight into the exposition (`unit_text.rs`), in
    /// the order they are served, and the distributions beside them (`units.rs`).
    PER_CONTAINER, PerContainer {
        State: "lifecycle_container_state", Gauge, ["namespace", "pod", "container", "uid", "state"], "1 for the container's current state (waiting, running, terminated), 0 for the others.";
        Waiting: "lifecycle_container_waiting_reason", Gauge, ["namespace", "pod", "container", "uid", "reason"], "1 while the container waits for this reason (ContainerCreating, CrashLoopBackOff).";
        LastReason: "lifecycle_container_last_terminated_reason", Gauge, ["namespace", "pod", "container", "uid", "reason"], "1 for the reason of the container's last termination.";
        LastCode: "lifecycle_container_last_terminated_exit_code", Gauge, ["namespace", "pod", "container", "uid"], "Exit code of the last termination (128+signal when killed).";
        LastTime: "lifecycle_container_last_terminated_timestamp_seconds", Gauge, ["namespace", "pod", "container", "uid"], "When the last termination happened, Unix seconds.";
        Restarts: "lifecycle_container_restarts_total", Counter, ["namespace", "pod", "container", "uid"], "Restarts of the container seen by the agent.";
        Exits: "lifecycle_container_exits_total", Counter, ["namespace", "pod", "container", "uid", "reason", "exit_code", "signal"], "Exits of the container's main process by reason, exit code and signal.";
        Terminations: "lifecycle_terminations_total", Counter, ["namespace", "pod", "container", "uid", "outcome", "cause"], "Container terminations by outcome under the kubelet's rules.";
        Violations: "lifecycle_grace_period_violations_total", Counter, ["namespace", "pod", "container", "uid"], "Containers SIGKILLed after their grace period.";
        Disagreements: "lifecycle_status_disagreements_total", Counter, ["namespace", "pod", "container", "uid", "kind"], "Times the kubelet's reported container status disagreed with what the kernel saw, by kind.";
        LastStopSeconds: "lifecycle_container_last_termination_seconds", Gauge, ["namespace", "pod", "container", "uid"], "Stop signal to exit of the container's last termination that had a stop signal.";
        LastGraceRatio: "lifecycle_container_last_grace_used_ratio", Gauge, ["namespace", "pod", "container", "uid"], "Share of the grace period the last termination within grace used.";
        Duration: "lifecycle_termination_duration_seconds", Histogram, ["namespace", "outcome"], "Stop signal to exit, per namespace and outcome.";
        GraceUsed: "lifecycle_termination_grace_used_ratio", Histogram, ["namespace"], "Share of the grace period used by exits within grace, per namespace.";
        Observed: "lifecycle_backoff_observed_seconds", Gauge, ["namespace", "pod", "container", "uid"], "Delay between the last exit and the restart, as observed.";
        Expected: "lifecycle_backoff_expected_seconds", Gauge, ["namespace", "pod", "container", "uid"], "Delay the kubelet's back-off required for the last restart.";
        Verdicts: "lifecycle_backoff_verdicts_total", Counter, ["namespace", "pod", "container", "uid", "verdict"], "Restarts judged against the kubelet's back-off.";
        Signals: "lifecycle_signals_received_total", Counter, ["namespace", "pod", "container", "uid", "signal", "sender"], "Signals received by the container's processes, by signal and sender.";
        Oom: "lifecycle_oom_kills_total", Counter, ["namespace", "pod", "container", "uid"], "OOM kills in the container (kernel OOM events).";
        Execs: "lifecycle_process_execs_total", Counter, ["namespace", "pod", "container", "uid"], "Program executions in the container (kernel counter).";
        ProcessExits: "lifecycle_process_exits_total", Counter, ["namespace", "pod", "container", "uid"], "Process exits in the container (kernel counter).";
        Listeners: "lifecycle_tcp_listeners", Gauge, ["namespace", "pod", "container", "uid", "port"], "Listening TCP sockets of the container by port.";
        Established: "lifecycle_tcp_connections_established_total", Counter, ["namespace", "pod", "container", "uid", "port"], "Connections that completed the handshake into the container's listener.";
        Accepts: "lifecycle_tcp_accepts_total", Counter, ["namespace", "pod", "container", "uid", "port"], "Connections the application accepted.";
        QueueDepth: "lifecycle_tcp_accept_queue_depth", Gauge, ["namespace", "pod", "container", "uid", "port"], "Connections established but not accepted yet (kernel counts).";
        ExecProcesses: "lifecycle_exec_probe_processes_total", Counter, ["namespace", "pod", "container", "uid"], "Processes the runtime started into the container outside its init's tree (exec probes, hooks, exec sessions).";
        ExecCpu: "lifecycle_exec_probe_cpu_seconds_total", Counter, ["namespace", "pod", "container", "uid"], "CPU time of those processes.";
        MemoryEvents: "lifecycle_container_memory_events_total", Counter, ["namespace", "pod", "container", "uid", "event"], "The kernel's memory.events counts of the container's current cgroup, by event: high (times over memory.high, throttled), max (times at memory.max), oom, oom_kill. Only those this host has: on a cgroup v1 memory controller only oom_kill (v1's memory.oom_control).";
        MemoryStall: "lifecycle_container_memory_pressure_seconds_total", Counter, ["namespace", "pod", "container", "uid", "kind"], "Time the container's tasks stalled on memory (PSI, memory.pressure of its current cgroup), by kind: some (at least one task), full (all at once). Includes the throttling at memory.high.";
    }
}

families! {
    /// The agent's own families: its health, the kernel's delivery, the runtime and API links,
    /// the probes and the API gate, registered with prometheus' registry.
    AGENT, AgentFamily {
        FeatureEnabled: "lifecycle_feature_enabled", Gauge, ["feature"], "1 when a kernel feature is attached, 0 when it is off (see the agent log for why).";
        BuildInfo: "lifecycle_build_info", Gauge, ["version"], "Always 1; labels carry the agent version.";
        RingBufferBytes: "lifecycle_ring_buffer_bytes", Gauge, [], "Size of the kernel event ring buffer.";
        Events: "lifecycle_events_total", Counter, ["kind"], "Event records the kernel programs sent to the agent, by kind.";
        EventsLost: "lifecycle_events_lost_total", Counter, ["kind"], "Event records lost because the ring buffer was full, by kind. Counters stay exact; only the records are missing.";
        EventsRateLimited: "lifecycle_events_rate_limited_total", Counter, ["kind"], "Event records not sent because the sending cgroup had spent its budget (signals: 200/s, bursts of 2,048), by kind. Counters stay exact.";
        KernelMapFull: "lifecycle_kernel_map_full_total", Counter, ["map", "kind"], "Updates a kernel map refused because it was full, by map and event kind.";
        EventDecodeErrors: "lifecycle_event_decode_errors_total", Counter, [], "Ring records the agent could not decode.";
        KernelMapEntries: "lifecycle_kernel_map_entries", Gauge, ["map"], "Entries in use in a kernel map.";
        KernelProgramRunSeconds: "lifecycle_kernel_program_run_seconds_total", Counter, ["program"], "Time the kernel spent running each of the agent's programs, as the kernel accounts it (BPF_ENABLE_STATS, held by the agent unless --kernel-stats off).";
        AgentCpu: "lifecycle_agent_cpu_seconds_total", Counter, [], "CPU time the agent's own process used, user and system (/proc/self/stat).";
        AgentResidentMemory: "lifecycle_agent_resident_memory_bytes", Gauge, [], "Resident memory of the agent's own process (/proc/self/statm).";
        LogLinesSuppressed: "lifecycle_log_lines_suppressed_total", Counter, [], "Log lines of the crates under the agent (the Kubernetes client's retries) held back: one per target and level is written every 30 s, saying how many it stands for.";
        KernelProgramRuns: "lifecycle_kernel_program_runs_total", Counter, ["program"], "Runs of each of the agent's programs, as the kernel accounts them (with lifecycle_kernel_program_run_seconds_total: the kernel's time per event).";
        KernelMapCapacity: "lifecycle_kernel_map_capacity", Gauge, ["map"], "Entries a kernel map can hold.";
        EventToState: "lifecycle_event_to_state_seconds", Histogram, [], "From the kernel seeing the exit of a container's main process (a host unit's last) to the container state reflecting it.";
        StateRepairs: "lifecycle_state_repairs_total", Counter, ["kind"], "State repaired from /proc and cgroupfs after ring records were lost, by kind: exit (a process found gone), cgroup_removed, cgroup_created.";
        StateDropped: "lifecycle_state_dropped_total", Counter, ["kind"], "Records the node model dropped to stay within its bounds (docs/security.md), by kind; verdicts never depend on them.";
        RuntimeUp: "lifecycle_runtime_metadata_up", Gauge, [], "1 when the container runtime's CRI socket answered the last refresh, 0 while containers are named by id.";
        RuntimeFailures: "lifecycle_runtime_metadata_refresh_failures_total", Counter, [], "Refreshes of runtime metadata that failed.";
        RuntimeLastSuccess: "lifecycle_runtime_metadata_last_success_timestamp_seconds", Gauge, [], "Unix time of the last refresh the runtime answered (0: never).";
        SystemdUnitReads: "lifecycle_systemd_unit_reads_total", Counter, ["result"], "Reads of a host unit's stop and restart settings from systemd over D-Bus, by result: read, failed (systemd refused, the unit was gone, or the link failed under the call 3 times), unreachable (no systemd answered: host units are judged by no grace), dropped (1,024 waited already; the unit's next run asks again).";
        KubeletInfo: "lifecycle_kubelet_info", Gauge, ["version", "cgroup_driver", "source", "backoff"], "Always 1; labels say what the agent believes about this node's kubelet: version (its release, from the Node object; unknown when not read), cgroup_driver (its configuration's: cgroupfs, systemd, other, unknown), source (node: its process's command line and configuration files; flags: the agent's own back-off flags; not_found: no kubelet process visible; unreadable) and backoff (known, or unknown: restarts after a container's first are not judged).";
        KubeletBackoff: "lifecycle_kubelet_backoff_seconds", Gauge, ["bound"], "The kubelet's restart back-off the agent judges containers by: bound initial (the first delay), max (the cap it doubles to) and reset (a run this long forgets it). Absent while the back-off is not known.";
        KubeletFeatureGate: "lifecycle_kubelet_feature_gate_enabled", Gauge, ["gate"], "1 when a kubelet feature gate the agent's rules depend on is on, 0 when off: from the kubelet's configuration and flags, else its release's default. Absent when the agent cannot tell.";
        KubeletReads: "lifecycle_kubelet_config_reads_total", Counter, ["result"], "Reads of the kubelet's command line and configuration files (at the agent's start, at each kubelet start, every 5 minutes), by result: read, not_found (no kubelet process visible), unreadable.";
        KubernetesUp: "lifecycle_kubernetes_api_up", Gauge, [], "1 while the watch of this node's pods works, 0 while it retries.";
        KubernetesWatchErrors: "lifecycle_kubernetes_api_watch_errors_total", Counter, [], "Failures of the pod and event watches (each is retried).";
        KubernetesNoticesRefused: "lifecycle_kubernetes_notices_refused_total", Counter, [], "Killing and Evicted Events from this node's kubelet that name a pod of this node by its uid under another namespace or name (forged: the API server checks only that an Event's namespace is its object's), ignored.";
        KubernetesEvents: "lifecycle_kubernetes_events_total", Counter, ["result"], "Warnings about pods sent as Kubernetes Events, by result.";
        HttpConnectionsRejected: "lifecycle_http_connections_rejected_total", Counter, ["listener", "reason"], "Connections to the agent's own listeners closed without an answer, by listener (listen: --listen; health: --health-listen) and reason: evicted (an idle connection gave its place to a newcomer), source (32 open from that address, none idle), busy (128 open, none idle; 64 waiting on health: the oldest is closed), rate (its source took places too often), timeout (no whole request head within 10 s; 1 s on health), lifetime (cut at the connection's 60 s life).";
        ApiWaits: "lifecycle_api_waits_total", Counter, ["result"], "Requests to /api/v1/containers that asked to wait for a change (wait_seconds), by how the wait ended: changed, timeout, behind (the resource_version given was not the current one: answered at once), busy (64 were waiting already: answered at once).";
        ApiAuthReviews: "lifecycle_api_auth_reviews_total", Counter, ["result"], "Token and access reviews the API server answered for requests to /api/* (--api-auth kubernetes), by result: allowed, denied, unauthenticated, error. Cached answers are not counted.";
        ProbeResult: "lifecycle_probe_result", Gauge, ["namespace", "pod", "container", "uid", "check"], "Last result of a declared agent probe check: 1 pass, 0 fail.";
        ProbeTransitions: "lifecycle_probe_transitions_total", Counter, ["namespace", "pod", "container", "uid", "check"], "Times a declared agent probe check changed between pass and fail.";
        ProbeRequests: "lifecycle_probe_requests_total", Counter, ["namespace", "pod", "container", "uid", "check", "code"], "Probe HTTP requests for declared checks answered, by HTTP status code.";
        ProbeDuration: "lifecycle_probe_duration_seconds", Histogram, ["check"], "Time to answer a probe request from cached state.";
        ProbeDeclarationsRefused: "lifecycle_probe_declarations_refused_total", Counter, ["reason"], "Entries of pods' probe declarations refused, by reason (unparsable, forbidden_path, too_many).";
        ProbeConnectionsRejected: "lifecycle_probe_connections_rejected_total", Counter, ["reason"], "Connections to pod probe listeners closed without an answer, by reason: source (address not allowed), busy (connection bound reached: the one kept longest is closed), timeout (request head too slow), rate (its source had connections kept waiting more than 16 a second, bursts of 32).";
        ProbeRequestsForbidden: "lifecycle_probe_requests_forbidden_total", Counter, [], "Probe requests answered 403: not a declared check of a known container, or not a probe request.";
        ProbeFileReaders: "lifecycle_probe_file_readers", Gauge, [], "Threads reading declared probe files now: one per container, two per pod and 64 on the node at most. A read of a healthy file takes microseconds, so a thread that stays is stuck on a hung filesystem.";
        ProbeFileReadsSkipped: "lifecycle_probe_file_reads_skipped_total", Counter, ["reason"], "Passes over a container's declared files not started, by reason: container_stuck (its last pass has not returned), pod_cap (two of its pod's have not), node_cap (64 reader threads are alive on the node). The files' checks fail saying why.";
        ProbeSeriesDropped: "lifecycle_probe_series_dropped_total", Counter, [], "Declared (container, check) pairs left without series because their pod reached the per-pod cap.";
        ProbePortsUntracked: "lifecycle_probe_ports_untracked_total", Counter, [], "Listener events and samples of undeclared ports not tracked because a container's probe already tracks 64 (declared ports always are).";
    }
}

/// Every family, per-container and the agent's.
pub fn all() -> impl Iterator<Item = &'static Family> {
    PER_CONTAINER.iter().chain(AGENT)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_typed_by_their_suffix() {
        let mut seen = HashSet::new();
        for family in all() {
            assert!(seen.insert(family.name), "{} listed twice", family.name);
            assert!(family.name.starts_with("lifecycle_"), "{}", family.name);
            // Prometheus' naming: counters end in _total, and only counters do.
            assert_eq!(family.kind == Kind::Counter, family.name.ends_with("_total"), "{}", family.name);
            assert!(!family.help.is_empty() && !family.labels.contains(&"le"), "{}", family.name);
        }
    }

    #[test]
    fn per_container_families_carry_the_kube_state_metrics_labels_and_uid() {
        // Issue 17: a recreated pod keeps its name; without `uid` its two containers would be
        // the same series. The rule holds for every family with series per container, the
        // probes' checks as well; the distributions are per namespace, bounded whatever the pods.
        for family in all().filter(|f| f.labels.contains(&"container")) {
            assert_eq!(&family.labels[..4], ["namespace", "pod", "container", "uid"], "{}", family.name);
        }
        for family in PER_CONTAINER.iter().filter(|f| f.kind != Kind::Histogram) {
            assert!(family.labels.contains(&"container"), "{}", family.name);
        }
    }

    #[test]
    fn docs_metrics_md_documents_every_family_and_no_other() {
        let docs = include_str!("../../../docs/metrics.md");
        for family in all() {
            assert!(docs.contains(&format!("`{}`", family.name)), "docs/metrics.md does not document {}", family.name);
        }
        let listed: HashSet<&str> = all().map(|f| f.name).collect();
        // Every family name the page writes in backquotes (a histogram's parts count as it).
        for word in docs.split('`').skip(1).step_by(2) {
            let name = word.split('{').next().unwrap_or(word);
            let is_name = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
            // The prefix alone, or a name with a wildcard, is not a family.
            if !name.starts_with("lifecycle_") || name.ends_with('_') || !name.chars().all(is_name) {
                continue;
            }
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
            assert!(
                listed.contains(name) || listed.contains(base),
                "docs/metrics.md names {name}, which the agent does not serve"
            );
        }
    }
}
