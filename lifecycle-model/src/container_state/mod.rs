//! A container's status as the kubelet would show it — Waiting, Running, Terminated, the last
//! state and the restart count — built from what the kernel saw of its instances.
//!
//! Owns the state transitions (instance cgroup created -> Waiting/ContainerCreating; first exec
//! -> Running; init exit -> Terminated) and the restart decision: pod restartPolicy
//! Always/OnFailure/Never, init containers (Always acts as OnFailure), sidecars (init containers
//! with restartPolicy Always), and per-container `restartPolicyRules` (gate ContainerRestartRules),
//! evaluated before the container's own restartPolicy. While a restart is due but held by the
//! back-off, the status is Waiting/CrashLoopBackOff, as the kubelet's reason cache shows it.
//!
//! Pure: events and times in, a [`ContainerStatusSnapshot`] out.

use serde::{Deserialize, Serialize};

use crate::{backoff::BackoffTracker, time::BootTime};

/// Why a container is waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitingReason {
    /// Its cgroup exists (or it was never seen) and its init has not run yet.
    ContainerCreating,
    /// It exited, will be restarted, and the restart back-off holds it.
    CrashLoopBackOff,
}

crate::spelling::spelling!(WaitingReason {
    ContainerCreating => "ContainerCreating",
    CrashLoopBackOff => "CrashLoopBackOff",
});

/// Why a container terminated, as the kubelet and kube-state-metrics spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TerminatedReason {
    /// Exit status 0.
    Completed,
    /// A non-zero exit status, or death by a signal (exit code 128 + N, `signal` set), as the
    /// kubelet and kube-state-metrics report both.
    Error,
    /// The kernel's OOM killer killed the init (from the OOM event, not from exit code 137).
    OomKilled,
    /// The exit was seen without a status or a signal (a lost record): nothing to report.
    Unknown,
}

crate::spelling::spelling!(TerminatedReason {
    Completed => "Completed",
    Error => "Error",
    OomKilled => "OOMKilled",
    Unknown => "Unknown",
});

/// A container's state, as in the API's `ContainerState`. Times are `CLOCK_BOOTTIME` ns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ContainerState {
    Waiting {
        reason: WaitingReason,
        message: String,
    },
    Running {
        #[serde(flatten, with = "crate::wire::at::started_at")]
        started_at: BootTime,
    },
    Terminated {
        reason: TerminatedReason,
        /// As runtimes report it: the exit status, or 128 + the signal; -1 when unknown.
        exit_code: i32,
        signal: Option<u8>,
        /// None when the start was not seen.
        #[serde(flatten, with = "crate::wire::at::started_at")]
        started_at: Option<BootTime>,
        #[serde(flatten, with = "crate::wire::at::finished_at")]
        finished_at: BootTime,
    },
}

impl ContainerState {
    fn creating() -> Self {
        ContainerState::Waiting { reason: WaitingReason::ContainerCreating, message: String::new() }
    }
}

/// `restartPolicy` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

/// `restartPolicyRules[].exitCodes.operator`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitCodeOperator {
    In,
    NotIn,
}

/// `restartPolicyRules[].action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartRuleAction {
    /// This container alone restarts (ContainerRestartRules, beta 1.35).
    Restart,
    /// The kubelet stops every container of the pod and starts them all again, this one too
    /// (RestartAllContainers, beta 1.36).
    RestartAllContainers,
}

/// One `restartPolicyRules` entry: when the exit code matches, take the action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRule {
    pub action: RestartRuleAction,
    pub operator: ExitCodeOperator,
    pub values: Vec<i32>,
}

impl RestartRule {
    fn matches(&self, exit_code: i32) -> bool {
        let listed = self.values.contains(&exit_code);
        match self.operator {
            ExitCodeOperator::In => listed,
            ExitCodeOperator::NotIn => !listed,
        }
    }
}

/// Everything that decides whether an exited container is restarted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartSpec {
    /// The pod's `spec.restartPolicy`.
    pub pod_restart_policy: RestartPolicy,
    /// The container's own `restartPolicy`, which overrides the pod's.
    pub container_restart_policy: Option<RestartPolicy>,
    /// The container's `restartPolicyRules`, evaluated in order before any restartPolicy.
    pub restart_policy_rules: Vec<RestartRule>,
    /// Listed in `initContainers`.
    pub is_init_container: bool,
    /// The pod is being deleted: nothing is restarted any more.
    pub pod_terminating: bool,
}

impl RestartSpec {
    /// An init container with restartPolicy Always.
    pub fn is_sidecar(&self) -> bool {
        self.is_init_container && self.container_restart_policy == Some(RestartPolicy::Always)
    }

    /// Whether an exit with `exit_code` makes the kubelet restart every container of the pod:
    /// the first rule that matches says RestartAllContainers.
    pub fn restarts_all_containers(&self, exit_code: i32) -> bool {
        self.restart_policy_rules
            .iter()
            .find(|rule| rule.matches(exit_code))
            .is_some_and(|rule| rule.action == RestartRuleAction::RestartAllContainers)
    }

    /// Whether the kubelet restarts the container after it exited with `exit_code`.
    pub fn should_restart(&self, exit_code: i32) -> bool {
        if self.pod_terminating {
            return false;
        }
        if let Some(rule) = self.restart_policy_rules.iter().find(|rule| rule.matches(exit_code)) {
            return match rule.action {
                RestartRuleAction::Restart | RestartRuleAction::RestartAllContainers => true,
            };
        }
        let policy = match self.container_restart_policy {
            Some(policy) => policy,
            // A regular init container must succeed once: Always retries only failures.
            None if self.is_init_container && self.pod_restart_policy == RestartPolicy::Always => {
                RestartPolicy::OnFailure
            }
            None => self.pod_restart_policy,
        };
        match policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// The status of one container (pod uid + name) over its instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub pod_uid: String,
    pub container_name: String,
    state: ContainerState,
    last_state: Option<ContainerState>,
    restart_count: u32,
    /// When the current instance's cgroup appeared.
    #[serde(flatten, with = "crate::wire::at::instance_created_at")]
    instance_created_at: Option<BootTime>,
}

/// A container's status at a given time, for the API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatusSnapshot {
    pub pod_uid: String,
    pub container_name: String,
    pub state: ContainerState,
    pub last_state: Option<ContainerState>,
    pub restart_count: u32,
    /// When the current instance's cgroup appeared.
    #[serde(flatten, with = "crate::wire::at::instance_created_at")]
    pub instance_created_at: Option<BootTime>,
    /// The container exited and the kubelet will restart it.
    pub restart_expected: bool,
    /// How long the back-off still holds the restart (0 once it elapsed), while it does.
    pub back_off_remaining_ns: Option<u64>,
}

impl ContainerStatus {
    /// A container not created yet: Waiting/ContainerCreating, as the kubelet shows it.
    pub fn new(pod_uid: impl Into<String>, container_name: impl Into<String>) -> Self {
        Self {
            pod_uid: pod_uid.into(),
            container_name: container_name.into(),
            state: ContainerState::creating(),
            last_state: None,
            restart_count: 0,
            instance_created_at: None,
        }
    }

    pub fn state(&self) -> &ContainerState {
        &self.state
    }

    pub fn last_state(&self) -> Option<&ContainerState> {
        self.last_state.as_ref()
    }

    pub fn restart_count(&self) -> u32 {
        self.restart_count
    }

    /// A new instance's cgroup appeared. After a terminated instance this is a restart: the
    /// terminated state becomes the last state and the count goes up, as the kubelet counts
    /// created instances.
    pub fn on_instance_created(&mut self, time: BootTime) {
        match self.state {
            // The first instance, or a re-created one that never started: nothing to keep.
            ContainerState::Waiting { .. } => {}
            ContainerState::Terminated { .. } => {
                self.last_state = Some(std::mem::replace(&mut self.state, ContainerState::creating()));
                self.restart_count = self.restart_count.saturating_add(1);
            }
            // The previous instance's exit was missed: still a new instance, but there is no
            // terminated state to keep.
            ContainerState::Running { .. } => {
                self.state = ContainerState::creating();
                self.restart_count = self.restart_count.saturating_add(1);
            }
        }
        self.instance_created_at = Some(time);
    }

    /// The first exec in the instance's cgroup: Running. Later execs change nothing; a start
    /// after a terminated instance whose new cgroup was not seen counts as a new instance.
    pub fn on_init_started(&mut self, time: BootTime) {
        match self.state {
            ContainerState::Running { .. } => {}
            ContainerState::Terminated { .. } => {
                self.on_instance_created(time);
                self.state = ContainerState::Running { started_at: time };
            }
            ContainerState::Waiting { .. } => self.state = ContainerState::Running { started_at: time },
        }
    }

    /// The instance's init exited, with its exit status or the signal that killed it.
    /// `oom_killed` only when the kernel's OOM killer killed it (see the termination module);
    /// exit code 137 or a SIGKILL alone never makes OOMKilled. A second exit for the same
    /// instance changes nothing.
    pub fn on_init_exited(&mut self, time: BootTime, exit_status: Option<u8>, signal: Option<u8>, oom_killed: bool) {
        let started_at = match self.state {
            ContainerState::Terminated { .. } => return,
            ContainerState::Running { started_at } => Some(started_at),
            ContainerState::Waiting { .. } => None,
        };
        let (exit_code, reason) = match (signal, exit_status) {
            (Some(signal), _) => (128 + i32::from(signal), TerminatedReason::Error),
            (None, Some(0)) => (0, TerminatedReason::Completed),
            (None, Some(status)) => (i32::from(status), TerminatedReason::Error),
            (None, None) => (-1, TerminatedReason::Unknown),
        };
        let reason = if oom_killed { TerminatedReason::OomKilled } else { reason };
        self.state = ContainerState::Terminated { reason, exit_code, signal, started_at, finished_at: time };
    }

    /// The delay the back-off puts before this terminated container's restart, when there is
    /// one: the status then shows Waiting/CrashLoopBackOff. A fact of the status and the back-off,
    /// not of the time: it holds from the exit until the restart (an event) however long that
    /// takes, which is why a reader may keep what it derived from it until the unit changes
    /// (the scrape's cache, `export/units.rs` in the agent).
    pub fn pending_back_off_ns(&self, restart: &RestartSpec, backoff: &BackoffTracker) -> Option<u64> {
        self.held_by_back_off(restart, backoff).then(|| backoff.pending_delay_ns()).flatten()
    }

    /// Whether this terminated container waits on a back-off before its restart (the status
    /// shows Waiting/CrashLoopBackOff), whether or not the delay is known
    /// ([`Self::pending_back_off_ns`]). A fact of the unit, as that is.
    pub fn held_by_back_off(&self, restart: &RestartSpec, backoff: &BackoffTracker) -> bool {
        let ContainerState::Terminated { exit_code, finished_at, .. } = self.state else {
            return false;
        };
        // Only trust the tracker when it is waiting on this very exit.
        restart.should_restart(exit_code)
            && backoff.pending_finished_at() == Some(finished_at)
            && backoff.pending_held()
    }

    /// The status at `now`. A terminated container that will be restarted shows
    /// Waiting/CrashLoopBackOff (last state: the termination) from its exit until the restart when
    /// the back-off delays that restart — the kubelet keeps the reason until the start succeeds —
    /// and stays Terminated when the restart is immediate (first crash, reset back-off).
    /// `backoff` is this container's tracker, fed the same exit.
    pub fn state_at(&self, now: BootTime, restart: &RestartSpec, backoff: &BackoffTracker) -> ContainerStatusSnapshot {
        let mut snapshot = ContainerStatusSnapshot {
            pod_uid: self.pod_uid.clone(),
            container_name: self.container_name.clone(),
            state: self.state.clone(),
            last_state: self.last_state.clone(),
            restart_count: self.restart_count,
            instance_created_at: self.instance_created_at,
            restart_expected: false,
            back_off_remaining_ns: None,
        };
        let ContainerState::Terminated { exit_code, .. } = self.state else {
            return snapshot;
        };
        snapshot.restart_expected = restart.should_restart(exit_code);
        if !self.held_by_back_off(restart, backoff) {
            return snapshot;
        }
        snapshot.back_off_remaining_ns = backoff.expected_wait_remaining(now);
        snapshot.last_state = Some(self.state.clone());
        // The kubelet's wording ("back-off %s restarting failed container=%s pod=%s"), without
        // the delay when the node's back-off is not known; the pod is named by uid because the
        // name is not known here.
        let delay = backoff.pending_delay_ns().map(|delay| format!(" {}", go_duration(delay))).unwrap_or_default();
        snapshot.state = ContainerState::Waiting {
            reason: WaitingReason::CrashLoopBackOff,
            message: format!(
                "back-off{delay} restarting failed container={} pod={}",
                self.container_name, self.pod_uid
            ),
        };
        snapshot
    }
}

/// Formats a duration the way Go's `time.Duration.String` does for the values back-off takes
/// (`10s`, `1m20s`, `5m0s`, `1.5s`, `500ms`).
fn go_duration(ns: u64) -> String {
    use crate::time::SECOND;
    if ns == 0 {
        return "0s".to_owned();
    }
    if ns < SECOND {
        let millis = ns as f64 / 1e6;
        return format!("{millis}ms");
    }
    let seconds = ns / SECOND;
    let fraction = ns % SECOND;
    let (hours, minutes, secs) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    let secs =
        if fraction == 0 { secs.to_string() } else { format!("{secs}.{fraction:09}").trim_end_matches('0').to_owned() };
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests;
