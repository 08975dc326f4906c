//! A probed container's main process as the probes read it: its scheduler state and since
//! when, from /proc samples the agent feeds back and from the kernel's exit of the process.

/// Scheduler state of a process, from the state letter of `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProcessState {
    Running,
    Sleeping,
    /// D: uninterruptible sleep (usually I/O).
    Uninterruptible,
    /// T or t: stopped by a signal or traced.
    Stopped,
    /// Z: exited, not yet reaped.
    Zombie,
    /// X, or the process is gone, or its pid now belongs to another process.
    Dead,
    /// I (idle kernel thread) and anything else.
    Other(char),
}

/// One sample of `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessSample {
    pub state: ProcessState,
    /// Start time in clock ticks after boot: differs when the pid was reused.
    pub start_ticks: u64,
}

/// The container's main process as last observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFacts {
    pub pid: u32,
    pub state: ProcessState,
    /// When the process was first seen in `state` (uninterrupted since), `CLOCK_BOOTTIME` ns.
    pub state_since_ns: u64,
}

impl ProcessFacts {
    /// The facts after a new sample: keeps `state_since_ns` while the state is unchanged.
    pub fn after_sample(previous: Option<&ProcessFacts>, pid: u32, state: ProcessState, t: u64) -> Self {
        let since = match previous {
            Some(p) if p.pid == pid && p.state == state => p.state_since_ns,
            _ => t,
        };
        Self { pid, state, state_since_ns: since }
    }
}
