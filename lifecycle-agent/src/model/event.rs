//! Kernel records decoded into agent events.
//!
//! Pure: bytes in, [`Event`] out. Raw encodings are unpacked here once (exit status vs signal,
//! NUL-padded names, big-endian ports), so nothing downstream needs to know the kernel's formats.

use lifecycle_common::{
    CgroupEvent, EventHeader, EventKind, ExecEvent, ExitEvent, OomVictimEvent, SignalEvent, TcpEvent,
};
use serde::Serialize;

/// A decoded kernel record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// `CLOCK_BOOTTIME` nanoseconds when the kernel saw it.
    pub time_ns: u64,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
        start_time_ns: u64,
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
        start_time_ns: u64,
        cpu_time_ns: u64,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CgroupDetail {
    pub id: u64,
    /// Path below the v2 mount, starting with `/`.
    pub path: String,
    /// The kernel's path did not fit the record; resolve the id through cgroupfs instead.
    pub truncated: bool,
}

/// The outcome the `signal_generate` tracepoint reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    fn from_raw(raw: i32) -> Self {
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

/// Why a record could not be decoded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first word is not a known [`EventKind`].
    #[error("record of unknown kind {0}")]
    UnknownKind(u32),
    /// The record is shorter than its kind's struct.
    #[error("{kind:?} record is {got} bytes, expected {want}")]
    Short { kind: EventKind, got: usize, want: usize },
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let raw_kind = match bytes.get(..4) {
        Some(word) => u32::from_ne_bytes([word[0], word[1], word[2], word[3]]),
        None => return Err(DecodeError::UnknownKind(u32::MAX)),
    };
    let kind = EventKind::from_u32(raw_kind).ok_or(DecodeError::UnknownKind(raw_kind))?;
    let event = match kind {
        EventKind::Exec => {
            let r: ExecEvent = read(bytes, kind)?;
            with_header(
                &r.header,
                Detail::Exec {
                    parent_tgid: r.parent_tgid,
                    parent_cgroup_id: r.parent_cgroup_id,
                    namespace_init: r.flags & lifecycle_common::EXEC_FLAG_NAMESPACE_INIT != 0,
                    child_pid_namespace: r.flags & lifecycle_common::EXEC_FLAG_CHILD_PID_NAMESPACE != 0,
                    start_time_ns: r.start_time_ns,
                    comm: c_string(&r.comm),
                },
            )
        }
        EventKind::Exit => {
            let r: ExitEvent = read(bytes, kind)?;
            let (exit_status, signal, core_dumped) = split_exit_code(r.exit_code);
            with_header(
                &r.header,
                Detail::Exit {
                    exit_status,
                    signal,
                    core_dumped,
                    group_dead: r.group_dead != 0,
                    parent_tgid: r.parent_tgid,
                    start_time_ns: r.start_time_ns,
                    cpu_time_ns: r.cpu_time_ns,
                    comm: c_string(&r.comm),
                },
            )
        }
        EventKind::Signal => {
            let r: SignalEvent = read(bytes, kind)?;
            with_header(
                &r.header,
                Detail::Signal {
                    signal: r.signal,
                    result: SignalResult::from_raw(r.result),
                    group: r.group != 0,
                    target_pid: r.target_pid,
                    target_tgid: r.target_tgid,
                    target_cgroup_id: r.target_cgroup_id,
                    sender_comm: c_string(&r.sender_comm),
                    target_comm: c_string(&r.target_comm),
                },
            )
        }
        EventKind::OomVictim => {
            let r: OomVictimEvent = read(bytes, kind)?;
            with_header(
                &r.header,
                Detail::OomVictim {
                    victim_pid: r.victim_pid,
                    victim_tgid: r.victim_tgid,
                    victim_cgroup_id: r.victim_cgroup_id,
                    victim_comm: c_string(&r.victim_comm),
                },
            )
        }
        EventKind::TcpListen | EventKind::TcpListenClose | EventKind::TcpEstablished | EventKind::TcpAccept => {
            let r: TcpEvent = read(bytes, kind)?;
            let tcp = TcpDetail {
                socket_cgroup_id: r.socket_cgroup_id,
                netns: r.netns,
                family: r.family,
                local_port: r.local_port,
                remote_port: r.remote_port,
                fd: (kind == EventKind::TcpAccept).then_some(r.fd),
            };
            let detail = match kind {
                EventKind::TcpListen => Detail::TcpListen(tcp),
                EventKind::TcpListenClose => Detail::TcpListenClose(tcp),
                EventKind::TcpEstablished => Detail::TcpEstablished(tcp),
                _ => Detail::TcpAccept(tcp),
            };
            with_header(&r.header, detail)
        }
        EventKind::CgroupMkdir | EventKind::CgroupRmdir => {
            let r: CgroupEvent = read(bytes, kind)?;
            let cgroup = CgroupDetail { id: r.id, path: c_string(&r.path), truncated: r.truncated != 0 };
            let detail =
                if kind == EventKind::CgroupMkdir { Detail::CgroupMkdir(cgroup) } else { Detail::CgroupRmdir(cgroup) };
            with_header(&r.header, detail)
        }
    };
    Ok(event)
}

/// Splits `task_struct::exit_code` into (exit status, terminating signal, core dumped).
pub fn split_exit_code(code: u32) -> (Option<u8>, Option<u8>, bool) {
    let signal = (code & 0x7f) as u8;
    if signal == 0 {
        (Some(((code >> 8) & 0xff) as u8), None, false)
    } else {
        (None, Some(signal), code & 0x80 != 0)
    }
}

fn with_header(header: &EventHeader, detail: Detail) -> Event {
    Event { time_ns: header.time_ns, pid: header.pid, tgid: header.tgid, cgroup_id: header.cgroup_id, detail }
}

/// Copies a `T` out of a record after checking the length. Only called with the plain-integer
/// `#[repr(C)]` record types of lifecycle-common, for which any bit pattern is valid.
fn read<T: Copy>(bytes: &[u8], kind: EventKind) -> Result<T, DecodeError> {
    let want = std::mem::size_of::<T>();
    if bytes.len() < want {
        return Err(DecodeError::Short { kind, got: bytes.len(), want });
    }
    // SAFETY: the length was checked; read_unaligned tolerates any alignment; T is a repr(C)
    // struct of integers (see above), valid for every bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Encodes a record the way the kernel does; for tests of the decoder and of consumers.
#[cfg(test)]
pub(crate) fn encode<T: Copy>(record: &T) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let mut out = vec![0u8; size];
    // SAFETY: copying the bytes of a plain repr(C) value into a buffer of its exact size.
    unsafe { std::ptr::copy_nonoverlapping((record as *const T).cast::<u8>(), out.as_mut_ptr(), size) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifecycle_common::TASK_COMM_LEN;

    fn header(kind: EventKind) -> EventHeader {
        EventHeader { kind: kind as u32, pid: 11, tgid: 10, _pad: 0, time_ns: 99, cgroup_id: 7 }
    }

    fn comm(name: &str) -> [u8; TASK_COMM_LEN] {
        let mut out = [0u8; TASK_COMM_LEN];
        out[..name.len()].copy_from_slice(name.as_bytes());
        out
    }

    #[test]
    fn exit_codes_split_into_status_or_signal() {
        assert_eq!(split_exit_code(3 << 8), (Some(3), None, false));
        assert_eq!(split_exit_code(0), (Some(0), None, false));
        assert_eq!(split_exit_code(15), (None, Some(15), false));
        assert_eq!(split_exit_code(9), (None, Some(9), false));
        assert_eq!(split_exit_code(0x80 | 11), (None, Some(11), true));
    }

    #[test]
    fn exit_record_decodes_every_field() {
        let record = ExitEvent {
            header: header(EventKind::Exit),
            exit_code: 0x8b,
            group_dead: 1,
            parent_tgid: 4,
            _pad: 0,
            start_time_ns: 5,
            cpu_time_ns: 6,
            comm: comm("sh"),
        };
        let event = decode(&encode(&record)).expect("decodes");
        assert_eq!(
            event,
            Event {
                time_ns: 99,
                pid: 11,
                tgid: 10,
                cgroup_id: 7,
                detail: Detail::Exit {
                    exit_status: None,
                    signal: Some(11),
                    core_dumped: true,
                    group_dead: true,
                    parent_tgid: 4,
                    start_time_ns: 5,
                    cpu_time_ns: 6,
                    comm: "sh".into(),
                },
            }
        );
        assert_eq!(event.kind(), EventKind::Exit);
    }

    #[test]
    fn tcp_records_keep_the_socket_cgroup_and_fd_only_for_accepts() {
        let mut record = TcpEvent {
            header: header(EventKind::TcpEstablished),
            socket_cgroup_id: 42,
            netns: 4026531840,
            family: 2,
            local_port: 8080,
            remote_port: 5555,
            _pad: 0,
            fd: -1,
        };
        let event = decode(&encode(&record)).expect("decodes");
        let Detail::TcpEstablished(tcp) = &event.detail else { panic!("{event:?}") };
        assert_eq!((tcp.socket_cgroup_id, tcp.fd), (42, None));
        assert_eq!(event.cgroups().collect::<Vec<_>>(), vec![7, 42]);

        record.header.kind = EventKind::TcpAccept as u32;
        record.fd = 5;
        let event = decode(&encode(&record)).expect("decodes");
        assert!(matches!(event.detail, Detail::TcpAccept(TcpDetail { fd: Some(5), .. })));
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        let record = ExecEvent {
            header: header(EventKind::Exec),
            parent_tgid: 1,
            flags: 0,
            start_time_ns: 2,
            parent_cgroup_id: 3,
            comm: comm("true"),
        };
        let bytes = encode(&record);
        assert_eq!(decode(&bytes[..40]), Err(DecodeError::Short { kind: EventKind::Exec, got: 40, want: bytes.len() }));
        let mut unknown = bytes.clone();
        unknown[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(decode(&unknown), Err(DecodeError::UnknownKind(1000)));
        assert_eq!(decode(&[]), Err(DecodeError::UnknownKind(u32::MAX)));
    }

    #[test]
    fn events_serialize_as_flat_json_with_a_kind_tag() {
        let record = SignalEvent {
            header: header(EventKind::Signal),
            signal: 15,
            result: 0,
            target_pid: 20,
            target_tgid: 20,
            target_cgroup_id: 8,
            group: 1,
            _pad: 0,
            sender_comm: comm("containerd-shim"),
            target_comm: comm("app"),
        };
        let json = serde_json::to_value(decode(&encode(&record)).expect("decodes")).expect("json");
        assert_eq!(json["kind"], "signal");
        assert_eq!(json["signal"], 15);
        assert_eq!(json["result"], "delivered");
        assert_eq!(json["sender_comm"], "containerd-shim");
        assert_eq!(json["target_cgroup_id"], 8);
        assert_eq!(json["cgroup_id"], 7);
    }
}
