//! Ring-buffer records: `kernel::decode::decode` on arbitrary bytes, and on well-formed records
//! of every kind built from the input.
//!
//! Properties, raw bytes: a record decodes exactly when its first word is a known kind and it is
//! at least that kind's struct long, otherwise the error says which of the two and by how much;
//! errors are one line; a decoded event has the header's fields and kind, names without NUL, and
//! is one JSON line (what `lifecycle-agent events` prints). Built records: every field decodes to
//! the value the record holds (exit status vs signal split, flags, names cut at the first NUL).

#![no_main]

use std::{mem::size_of, time::Duration};

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::{
    kernel::decode::{decode, DecodeError},
    model::{
        event::{CgroupDetail, Detail, Event, SignalResult, TcpDetail},
        time::BootTime,
    },
};
use lifecycle_common::{
    CgroupEvent, EventHeader, EventKind, ExecEvent, ExitEvent, OomVictimEvent, SignalEvent, TcpEvent, CGROUP_PATH_LEN,
    EXEC_FLAG_CHILD_PID_NAMESPACE, EXEC_FLAG_NAMESPACE_INIT, TASK_COMM_LEN,
};
use lifecycle_fuzz::{assert_error_one_line, assert_one_line};

fuzz_target!(|data: &[u8]| {
    check_raw(data);
    if let Some((&pick, fields)) = data.split_first() {
        check_built(EventKind::ALL[usize::from(pick) % EventKind::ALL.len()], fields);
    }
});

/// The struct size of a kind's record.
fn record_size(kind: EventKind) -> usize {
    match kind {
        EventKind::Exec => size_of::<ExecEvent>(),
        EventKind::Exit => size_of::<ExitEvent>(),
        EventKind::Signal => size_of::<SignalEvent>(),
        EventKind::OomVictim => size_of::<OomVictimEvent>(),
        EventKind::TcpListen | EventKind::TcpListenClose | EventKind::TcpEstablished | EventKind::TcpAccept => {
            size_of::<TcpEvent>()
        }
        EventKind::CgroupMkdir | EventKind::CgroupRmdir => size_of::<CgroupEvent>(),
    }
}

/// Copies a record type out of `bytes` (at least its size long).
fn record<T: Copy>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>());
    // SAFETY: the length is checked above; read_unaligned allows any alignment; the record types
    // of lifecycle-common are repr(C) structs of integers with explicit padding, valid for every
    // bit pattern.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

fn check_raw(data: &[u8]) {
    let word = data.get(..4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    match decode(data) {
        Ok(event) => {
            let kind = word.and_then(EventKind::from_u32).expect("decoded a record of no known kind");
            assert!(data.len() >= record_size(kind), "decoded a short {kind:?} record of {} bytes", data.len());
            assert_eq!(event.kind(), kind);
            let header: EventHeader = record(data);
            assert_eq!(
                (event.at.ns(), event.pid, event.tgid, event.cgroup_id),
                (header.time_ns, header.pid, header.tgid, header.cgroup_id)
            );
            check_names(&event);
            let json = serde_json::to_string(&event).expect("an event serialises");
            assert_one_line("event JSON", &json);
        }
        Err(err) => {
            assert_error_one_line("DecodeError", &err, 100);
            match err {
                DecodeError::UnknownKind(raw) => match word {
                    None => assert_eq!(raw, u32::MAX),
                    Some(word) => assert!(raw == word && EventKind::from_u32(word).is_none(), "{err}"),
                },
                DecodeError::Short { kind, got, want } => {
                    assert_eq!(word.and_then(EventKind::from_u32), Some(kind));
                    assert_eq!((got, want), (data.len(), record_size(kind)));
                    assert!(got < want, "{err}");
                }
            }
        }
    }
}

/// Names are cut at the first NUL and are at most their array long.
fn check_names(event: &Event) {
    let names: Vec<(&String, usize)> = match &event.detail {
        Detail::Exec { comm, .. } | Detail::Exit { comm, .. } => vec![(comm, TASK_COMM_LEN)],
        Detail::Signal { sender_comm, target_comm, .. } => {
            vec![(sender_comm, TASK_COMM_LEN), (target_comm, TASK_COMM_LEN)]
        }
        Detail::OomVictim { victim_comm, .. } => vec![(victim_comm, TASK_COMM_LEN)],
        Detail::CgroupMkdir(cgroup) | Detail::CgroupRmdir(cgroup) => vec![(&cgroup.path, CGROUP_PATH_LEN)],
        _ => vec![],
    };
    for (name, max) in names {
        assert!(!name.contains('\0') && name.chars().count() <= max, "{name:?}");
    }
}

/// A NUL-padded name as the decoder should give it.
fn name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A record of `kind` with its fields taken from `fields` (zero past the end), decoded and
/// compared field by field.
fn check_built(kind: EventKind, fields: &[u8]) {
    let mut bytes = vec![0u8; record_size(kind)];
    let n = fields.len().min(bytes.len());
    bytes[..n].copy_from_slice(&fields[..n]);
    bytes[..4].copy_from_slice(&(kind as u32).to_ne_bytes());
    let event = decode(&bytes).unwrap_or_else(|err| panic!("a whole {kind:?} record failed: {err}"));
    let header: EventHeader = record(&bytes);
    let detail = match kind {
        EventKind::Exec => {
            let r: ExecEvent = record(&bytes);
            Detail::Exec {
                parent_tgid: r.parent_tgid,
                parent_cgroup_id: r.parent_cgroup_id,
                namespace_init: r.flags & EXEC_FLAG_NAMESPACE_INIT != 0,
                child_pid_namespace: r.flags & EXEC_FLAG_CHILD_PID_NAMESPACE != 0,
                started: BootTime::from_ns(r.start_time_ns),
                comm: name(&r.comm),
            }
        }
        EventKind::Exit => {
            let r: ExitEvent = record(&bytes);
            // wait(2)'s encoding: low 7 bits the signal (0: exited), bit 7 core dump, bits 8-15 status.
            let signal = (r.exit_code & 0x7f) as u8;
            let (exit_status, signal, core_dumped) = if signal == 0 {
                (Some((r.exit_code >> 8) as u8), None, false)
            } else {
                (None, Some(signal), r.exit_code & 0x80 != 0)
            };
            Detail::Exit {
                exit_status,
                signal,
                core_dumped,
                group_dead: r.group_dead != 0,
                parent_tgid: r.parent_tgid,
                started: BootTime::from_ns(r.start_time_ns),
                cpu_time: Duration::from_nanos(r.cpu_time_ns),
                comm: name(&r.comm),
            }
        }
        EventKind::Signal => {
            let r: SignalEvent = record(&bytes);
            Detail::Signal {
                signal: r.signal,
                result: SignalResult::from_raw(r.result),
                group: r.group != 0,
                target_pid: r.target_pid,
                target_tgid: r.target_tgid,
                target_cgroup_id: r.target_cgroup_id,
                sender_comm: name(&r.sender_comm),
                target_comm: name(&r.target_comm),
                from_kernel: r.origin == lifecycle_common::SIGNAL_FROM_KERNEL,
            }
        }
        EventKind::OomVictim => {
            let r: OomVictimEvent = record(&bytes);
            Detail::OomVictim {
                victim_pid: r.victim_pid,
                victim_tgid: r.victim_tgid,
                victim_cgroup_id: r.victim_cgroup_id,
                victim_comm: name(&r.victim_comm),
            }
        }
        EventKind::TcpListen | EventKind::TcpListenClose | EventKind::TcpEstablished | EventKind::TcpAccept => {
            let r: TcpEvent = record(&bytes);
            let tcp = TcpDetail {
                socket_cgroup_id: r.socket_cgroup_id,
                netns: r.netns,
                family: r.family,
                local_port: r.local_port,
                remote_port: r.remote_port,
                fd: (kind == EventKind::TcpAccept).then_some(r.fd),
            };
            match kind {
                EventKind::TcpListen => Detail::TcpListen(tcp),
                EventKind::TcpListenClose => Detail::TcpListenClose(tcp),
                EventKind::TcpEstablished => Detail::TcpEstablished(tcp),
                _ => Detail::TcpAccept(tcp),
            }
        }
        EventKind::CgroupMkdir | EventKind::CgroupRmdir => {
            let r: CgroupEvent = record(&bytes);
            let cgroup = CgroupDetail { id: r.id, path: name(&r.path), truncated: r.truncated != 0 };
            if kind == EventKind::CgroupMkdir {
                Detail::CgroupMkdir(cgroup)
            } else {
                Detail::CgroupRmdir(cgroup)
            }
        }
    };
    let want = Event {
        at: BootTime::from_ns(header.time_ns),
        pid: header.pid,
        tgid: header.tgid,
        cgroup_id: header.cgroup_id,
        detail,
    };
    assert_eq!(event, want, "{kind:?} record {bytes:?}");
}
