//! What the kernel saw, as the model consumes it: one [`Event`] per kernel record, with raw
//! encodings already unpacked (exit status vs signal, NUL-padded names, big-endian ports,
//! nanoseconds as [`BootTime`] points and [`Duration`]s) by `kernel::decode`, so nothing in the
//! model needs to know the kernel's formats. On the wire (`lifecycle-agent events`, recorded
//! commands) the times keep the kernel's names and nanoseconds (`time_ns`, `start_time_ns`,
//! `cpu_time_ns`).

use std::time::Duration;

use lifecycle_common::EventKind;
use serde::Serialize;

use crate::time::BootTime;

/// A decoded kernel record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Event {
    /// When the kernel saw it (`CLOCK_BOOTTIME`).
    #[serde(rename = "time_ns")]
    pub at: BootTime,
    /// Thread id of the task running when it fired.
    pub pid: u32,
    /// Process id of the task running when it fired.
    pub tgid: u32,
    /// cgroup v2 id of the task running when it fired.
    pub cgroup_id: u64,
    #[serde(flatten)]
    pub detail: Detail,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Detail {
    Exec {
        parent_tgid: u32,
        /// The parent's cgroup: outside the process's own when the runtime started it.
        parent_cgroup_id: u64,
        /// PID 1 of its own pid namespace: a container's init.
        namespace_init: bool,
        /// Lives in a pid namespace below the host's (a container's, unless it shares the host's).
        child_pid_namespace: bool,
        /// The process's start (the kernel's `start_boottime`).
        #[serde(rename = "start_time_ns")]
        started: BootTime,
        comm: String,
    },
    Exit {
        /// The status passed to exit(), when the process exited by itself.
        exit_status: Option<u8>,
        /// The signal that terminated it, when one did.
        signal: Option<u8>,
        core_dumped: bool,
        /// Whether this was the process's last thread.
        group_dead: bool,
        parent_tgid: u32,
        /// The process's start (the kernel's `start_boottime`).
        #[serde(rename = "start_time_ns")]
        started: BootTime,
        /// User plus system CPU time: this thread's, plus its group's already-exited threads'
        /// when `group_dead`.
        #[serde(rename = "cpu_time_ns", with = "crate::time::duration_ns")]
        cpu_time: Duration,
        comm: String,
    },
    Signal {
        signal: u32,
        result: SignalResult,
        /// Sent to the whole process (kill) rather than one thread (tgkill).
        group: bool,
        target_pid: u32,
        target_tgid: u32,
        target_cgroup_id: u64,
        sender_comm: String,
        target_comm: String,
        /// The kernel generated it (SIGIO/SIGURG for a file's owner, a fault, the OOM killer):
        /// `current`, the sender named, did not ask for it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_kernel: bool,
    },
    OomVictim {
        victim_pid: u32,
        victim_tgid: u32,
        victim_cgroup_id: u64,
        victim_comm: String,
    },
    TcpListen(TcpDetail),
    TcpListenClose(TcpDetail),
    TcpEstablished(TcpDetail),
    TcpAccept(TcpDetail),
    CgroupMkdir(CgroupDetail),
    CgroupRmdir(CgroupDetail),
}

/// Socket facts shared by the TCP events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TcpDetail {
    /// The cgroup the socket is charged to (its creator's), which is not always `cgroup_id`.
    pub socket_cgroup_id: u64,
    pub netns: u32,
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    /// The fd accept returned, for accepts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fd: Option<i32>,
}

/// A cgroup directory that appeared or went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CgroupDetail {
    pub id: u64,
    /// Path below the v2 mount, starting with `/`.
    pub path: String,
    /// The kernel's path did not fit the record; resolve the id through cgroupfs instead.
    pub truncated: bool,
}

/// The outcome the `signal_generate` tracepoint reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalResult {
    Delivered,
    Ignored,
    AlreadyPending,
    OverflowFail,
    LoseInfo,
    Other(i32),
}

impl SignalResult {
    /// The tracepoint's raw result code.
    pub fn from_raw(raw: i32) -> Self {
        match raw {
            0 => Self::Delivered,
            1 => Self::Ignored,
            2 => Self::AlreadyPending,
            3 => Self::OverflowFail,
            4 => Self::LoseInfo,
            other => Self::Other(other),
        }
    }
}

impl Event {
    /// The kind of record this came from.
    pub fn kind(&self) -> EventKind {
        match self.detail {
            Detail::Exec { .. } => EventKind::Exec,
            Detail::Exit { .. } => EventKind::Exit,
            Detail::Signal { .. } => EventKind::Signal,
            Detail::OomVictim { .. } => EventKind::OomVictim,
            Detail::TcpListen(_) => EventKind::TcpListen,
            Detail::TcpListenClose(_) => EventKind::TcpListenClose,
            Detail::TcpEstablished(_) => EventKind::TcpEstablished,
            Detail::TcpAccept(_) => EventKind::TcpAccept,
            Detail::CgroupMkdir(_) => EventKind::CgroupMkdir,
            Detail::CgroupRmdir(_) => EventKind::CgroupRmdir,
        }
    }

    /// Every cgroup this event concerns: the running task's and the subject's.
    pub fn cgroups(&self) -> impl Iterator<Item = u64> {
        let subject = match &self.detail {
            Detail::Signal { target_cgroup_id, .. } => Some(*target_cgroup_id),
            Detail::OomVictim { victim_cgroup_id, .. } => Some(*victim_cgroup_id),
            Detail::TcpListen(t) | Detail::TcpListenClose(t) | Detail::TcpEstablished(t) | Detail::TcpAccept(t) => {
                Some(t.socket_cgroup_id)
            }
            Detail::CgroupMkdir(c) | Detail::CgroupRmdir(c) => Some(c.id),
            Detail::Exec { .. } | Detail::Exit { .. } => None,
        };
        std::iter::once(self.cgroup_id).chain(subject)
    }
}
