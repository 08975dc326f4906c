//! How a container should be stopped, per its metadata: the grace periods, the preStop hook
//! (decoded from the kubelet's annotation) and the constants of the kubelet's rules.

use serde::{Deserialize, Serialize};

use crate::time::SECOND;

/// `SIGKILL`.
pub const SIGKILL: u8 = 9;
/// `SIGTERM`, the stop signal unless the image or the pod names another.
pub const SIGTERM: u8 = 15;
/// The pod's terminationGracePeriodSeconds when unset.
pub const DEFAULT_GRACE_NS: u64 = 30 * SECOND;
/// `minimumGracePeriodInSeconds`: the kubelet always leaves this long between the stop signal and
/// SIGKILL, even when the preStop hook used up the grace period.
pub const MINIMUM_GRACE_NS: u64 = 2 * SECOND;
/// `TASK_COMM_LEN - 1`: the kernel keeps this many bytes of a program's name.
pub const COMM_VISIBLE_LEN: usize = 15;

/// A container's preStop hook, from the `io.kubernetes.container.preStopHandler` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PreStopHandler {
    /// Runs in the container: visible to the kernel as an exec session.
    Exec { command: Vec<String> },
    /// The kubelet calls the container over HTTP: its duration is not visible here.
    HttpGet,
    /// Deprecated TCP handler (the kubelet only logs it): not visible here.
    TcpSocket,
    /// The kubelet sleeps (PodLifecycleSleepAction) before stopping: known duration.
    Sleep { seconds: u64 },
}

/// The annotation's JSON: a v1.LifecycleHandler with exactly one action set.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LifecycleHandlerJson {
    exec: Option<ExecActionJson>,
    http_get: Option<serde_json::Value>,
    tcp_socket: Option<serde_json::Value>,
    sleep: Option<SleepActionJson>,
}

#[derive(Deserialize)]
struct ExecActionJson {
    #[serde(default)]
    command: Vec<String>,
}

#[derive(Deserialize)]
struct SleepActionJson {
    seconds: i64,
}

impl PreStopHandler {
    /// Parses the kubelet's `io.kubernetes.container.preStopHandler` annotation
    /// (`{"exec":{"command":[...]}}`, `{"httpGet":{...}}`, `{"sleep":{"seconds":N}}`).
    pub fn from_annotation(json: &str) -> Result<Self, TerminationError> {
        let handler: LifecycleHandlerJson = serde_json::from_str(json)
            .map_err(|source| TerminationError::PreStopJson { json: json.to_owned(), source })?;
        let actions =
            [handler.exec.is_some(), handler.http_get.is_some(), handler.tcp_socket.is_some(), handler.sleep.is_some()];
        match actions.iter().filter(|set| **set).count() {
            0 => return Err(TerminationError::PreStopNoAction { json: json.to_owned() }),
            1 => {}
            _ => return Err(TerminationError::PreStopSeveralActions { json: json.to_owned() }),
        }
        if let Some(exec) = handler.exec {
            if exec.command.first().is_none_or(|program| program.is_empty()) {
                return Err(TerminationError::PreStopEmptyCommand { json: json.to_owned() });
            }
            return Ok(PreStopHandler::Exec { command: exec.command });
        }
        if let Some(sleep) = handler.sleep {
            let seconds = u64::try_from(sleep.seconds)
                .map_err(|_| TerminationError::PreStopNegativeSleep { seconds: sleep.seconds })?;
            return Ok(PreStopHandler::Sleep { seconds });
        }
        if handler.http_get.is_some() {
            return Ok(PreStopHandler::HttpGet);
        }
        Ok(PreStopHandler::TcpSocket)
    }

    /// The `comm` the exec hook's process has: the program's basename, cut to 15 bytes.
    pub fn exec_comm(&self) -> Option<String> {
        let PreStopHandler::Exec { command } = self else { return None };
        let program = command.first()?;
        let basename = program.rsplit('/').next().unwrap_or(program);
        let bytes = basename.as_bytes();
        let cut = &bytes[..bytes.len().min(COMM_VISIBLE_LEN)];
        // The kernel cuts bytes, and the decoder turns a split character into U+FFFD; do the same.
        Some(String::from_utf8_lossy(cut).into_owned())
    }
}

/// Problems with a container's termination settings.
#[derive(Debug, thiserror::Error)]
pub enum TerminationError {
    /// The preStopHandler annotation is not JSON of a lifecycle handler.
    #[error("preStopHandler annotation {json:?} is not a lifecycle handler")]
    PreStopJson {
        json: String,
        #[source]
        source: serde_json::Error,
    },
    /// The preStopHandler annotation sets no action.
    #[error("preStopHandler annotation {json:?} sets none of exec, httpGet, tcpSocket, sleep")]
    PreStopNoAction { json: String },
    /// The preStopHandler annotation sets more than one action (the API forbids it).
    #[error("preStopHandler annotation {json:?} sets more than one action")]
    PreStopSeveralActions { json: String },
    /// The exec action has no program to run.
    #[error("preStopHandler annotation {json:?} has an exec action with an empty command")]
    PreStopEmptyCommand { json: String },
    /// The sleep action's seconds are negative.
    #[error("preStopHandler sleep of {seconds} seconds is negative")]
    PreStopNegativeSleep { seconds: i64 },
}

/// Whose rules a stop is judged by: who promised the unit a grace period, if anyone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StopRules {
    /// The kubelet's `killContainer`: the pod's grace (or the deletion's), the preStop hook's
    /// time subtracted, the 2 s floor.
    #[default]
    Kubelet,
    /// systemd's stop of a unit: `KillSignal=`, then `FinalKillSignal=` once `TimeoutStopSec=`
    /// ran out (the grace here), no floor.
    Systemd,
    /// Nothing manages the cgroup (a hand-made one), or what does is not known: no grace was
    /// promised, so a SIGKILL after the stop signal is reported, not judged.
    Unmanaged,
}

crate::spelling::spelling!(StopRules {
    Kubelet => "kubelet",
    Systemd => "systemd",
    Unmanaged => "none",
});

/// What the container's metadata says about how it should be stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TerminationSettings {
    /// Whose rules apply (the grace fields below are that manager's).
    pub rules: StopRules,
    /// The pod's terminationGracePeriodSeconds (`io.kubernetes.pod.terminationGracePeriod`).
    pub grace_period_ns: u64,
    /// The pod's deletionGracePeriodSeconds, which wins when set.
    pub deletion_grace_ns: Option<u64>,
    pub pre_stop: Option<PreStopHandler>,
    /// The signal the runtime should send first (image STOPSIGNAL or lifecycle.stopSignal).
    pub stop_signal: u8,
    /// An init container with restartPolicy Always.
    pub is_sidecar: bool,
    /// How much earlier than the model the runtime's SIGKILL may come before it is flagged.
    /// The runtime's own timer is precise to milliseconds; this absorbs event timestamps.
    pub kill_tolerance_ns: u64,
}

impl Default for TerminationSettings {
    /// The API defaults: 30 s grace, SIGTERM, no hook, not a sidecar; 500 ms kill tolerance.
    fn default() -> Self {
        Self {
            rules: StopRules::Kubelet,
            grace_period_ns: DEFAULT_GRACE_NS,
            deletion_grace_ns: None,
            pre_stop: None,
            stop_signal: SIGTERM,
            is_sidecar: false,
            kill_tolerance_ns: SECOND / 2,
        }
    }
}

impl TerminationSettings {
    /// The grace period the kubelet uses: the deletion's, else the pod's.
    pub fn effective_grace_ns(&self) -> u64 {
        self.deletion_grace_ns.unwrap_or(self.grace_period_ns)
    }

    /// A systemd unit's: `KillSignal=` first, SIGKILL once `TimeoutStopSec=` ran out; None
    /// (`infinity`) means systemd never kills it, so no grace is judged.
    pub fn systemd(kill_signal: u8, timeout_stop_ns: Option<u64>) -> Self {
        match timeout_stop_ns {
            Some(timeout) => Self {
                rules: StopRules::Systemd,
                grace_period_ns: timeout,
                stop_signal: kill_signal,
                ..Self::default()
            },
            None => Self { stop_signal: kill_signal, ..Self::unmanaged() },
        }
    }

    /// A cgroup no manager stops: the usual stop signal, no grace.
    pub fn unmanaged() -> Self {
        Self { rules: StopRules::Unmanaged, grace_period_ns: 0, ..Self::default() }
    }

    /// Whether `signal` sent to the init from outside asks it to stop: the stop signal these
    /// rules name, or one of the signals people and service managers stop programs with
    /// (SIGTERM, SIGINT, SIGQUIT). SIGHUP and SIGUSR1/2 mostly ask a daemon to reload or reopen
    /// its logs (logrotate does it nightly): a stop that they are not is judged from the next
    /// real stop signal, or, when one of them kills the process, from that one.
    pub fn is_stop_request(&self, signal: u8) -> bool {
        const SIGINT: u8 = 2;
        const SIGQUIT: u8 = 3;
        signal != SIGKILL && (signal == self.stop_signal || matches!(signal, SIGTERM | SIGINT | SIGQUIT))
    }
}
