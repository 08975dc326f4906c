//! Kernel records decoded into [`Event`]s.
//!
//! Pure: bytes in, [`Event`] out. Raw encodings are unpacked here once (exit status vs signal,
//! NUL-padded names, big-endian ports, nanoseconds as points in time and durations), so nothing
//! downstream needs to know the kernel's formats.

use std::time::Duration;

use lifecycle_common::{
    CgroupEvent, EventHeader, EventKind, ExecEvent, ExitEvent, OomVictimEvent, SignalEvent, TcpEvent,
};

use crate::model::{
    event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
    time::BootTime,
};

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
                    started: BootTime::from_ns(r.start_time_ns),
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
                    started: BootTime::from_ns(r.start_time_ns),
                    cpu_time: Duration::from_nanos(r.cpu_time_ns),
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
                    from_kernel: r.origin == lifecycle_common::SIGNAL_FROM_KERNEL,
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
pub(crate) fn split_exit_code(code: u32) -> (Option<u8>, Option<u8>, bool) {
    let signal = (code & 0x7f) as u8;
    if signal == 0 {
        (Some(((code >> 8) & 0xff) as u8), None, false)
    } else {
        (None, Some(signal), code & 0x80 != 0)
    }
}

fn with_header(header: &EventHeader, detail: Detail) -> Event {
    Event {
        at: BootTime::from_ns(header.time_ns),
        pid: header.pid,
        tgid: header.tgid,
        cgroup_id: header.cgroup_id,
        detail,
    }
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
                at: BootTime::from_ns(99),
                pid: 11,
                tgid: 10,
                cgroup_id: 7,
                detail: Detail::Exit {
                    exit_status: None,
                    signal: Some(11),
                    core_dumped: true,
                    group_dead: true,
                    parent_tgid: 4,
                    started: BootTime::from_ns(5),
                    cpu_time: Duration::from_nanos(6),
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
            origin: 0,
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
        assert!(json.get("from_kernel").is_none(), "only said when the kernel generated it");
        let generated = SignalEvent { origin: lifecycle_common::SIGNAL_FROM_KERNEL, ..record };
        let json = serde_json::to_value(decode(&encode(&generated)).expect("decodes")).expect("json");
        assert_eq!(json["from_kernel"], true);
    }
}
