//! Tests of reading the kernel's layout from BTF: this kernel's offsets and tracepoints, a
//! hand-made sample (anonymous unions, bitfields, 5.10's socket cgroup union, tracepoint
//! prototypes) and truncated or foreign data.
use super::*;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

fn btf() -> Option<KernelBtf> {
    if !Path::new(VMLINUX).exists() {
        eprintln!("skipped: {VMLINUX} not present on this kernel");
        return None;
    }
    Some(KernelBtf::open(Path::new(VMLINUX)).expect("parse vmlinux BTF"))
}

#[test]
fn offsets_keep_the_relations_every_kernel_layout_has() {
    let Some(btf) = btf() else { return };
    let found = btf.offsets();
    assert!(found.missing.is_empty(), "every member the programs read exists here: {:?}", found.missing);
    let offsets = found.values;
    assert!(offsets.task_tgid == offsets.task_pid + 4, "pid and tgid are adjacent pid_t");
    assert!(offsets.sock_dport < offsets.sock_num, "skc_dport precedes skc_num in skc_portpair");
    assert_eq!(offsets.sock_num - offsets.sock_dport, 2);
    // struct upid { int nr; struct pid_namespace *ns; }, struct k_sigaction starts with the
    // struct sigaction whose first member is the handler.
    assert_eq!((offsets.upid_nr, offsets.upid_size), (0, 16));
    assert_eq!(btf.offset_of("k_sigaction", "sa.sa_handler").expect("handler"), 0);
    assert!(offsets.k_sigaction_size >= 32, "handler, flags, restorer, mask");
}

#[test]
fn missing_members_and_structs_are_named_in_the_error() {
    let Some(btf) = btf() else { return };
    let err = btf.offset_of("task_struct", "no_such_member").expect_err("no such member");
    assert!(err.to_string().contains("task_struct has no member no_such_member"), "{err}");
    let err = btf.offset_of("no_such_struct", "x").expect_err("no such struct");
    assert!(err.to_string().contains("no struct no_such_struct"), "{err}");
}

#[test]
fn missing_btf_file_says_what_the_kernel_lacks() {
    let err = KernelBtf::open(Path::new("/nonexistent/vmlinux")).err().expect("must fail");
    assert!(err.to_string().contains("CONFIG_DEBUG_INFO_BTF"), "{err}");
}

#[test]
fn tracepoints_the_programs_use_exist_as_btf_tracepoints() {
    let Some(btf) = btf() else { return };
    for tp in ["sched_process_exec", "sched_process_exit", "signal_generate", "mark_victim"] {
        assert!(btf.has_raw_tracepoint(tp), "{tp}");
    }
    assert!(!btf.has_raw_tracepoint("no_such_tracepoint"));
}

/// A hand-built BTF: `struct outer { int a; union { int b; struct inner c; }; int d:3; }`.
fn sample() -> Vec<u8> {
    let strings = b"\0int\0outer\0a\0b\0c\0d\0inner\0x\0y\0".to_vec();
    let name = |s: &str| -> u32 {
        let needle = format!("\0{s}\0");
        strings.windows(needle.len()).position(|w| w == needle.as_bytes()).expect("string") as u32 + 1
    };
    let info = |kind: u32, vlen: u32, kind_flag: bool| (kind << 24) | vlen | (u32::from(kind_flag) << 31);
    let mut types: Vec<u32> = Vec::new();
    // 1: int (4 bytes)
    types.extend([name("int"), info(KIND_INT, 0, false), 4, 32]);
    // 2: struct inner { int x; int y; } (8 bytes)
    types.extend([name("inner"), info(KIND_STRUCT, 2, false), 8]);
    types.extend([name("x"), 1, 0, name("y"), 1, 32]);
    // 3: anonymous union { int b; struct inner c; } (8 bytes)
    types.extend([0, info(KIND_UNION, 2, false), 8]);
    types.extend([name("b"), 1, 0, name("c"), 2, 0]);
    // 4: struct outer, kind_flag set: member offsets carry bitfield sizes.
    types.extend([name("outer"), info(KIND_STRUCT, 3, true), 16]);
    types.extend([name("a"), 1, 0, 0, 3, 32, name("d"), 1, (3 << 24) | 96]);
    let type_bytes: Vec<u8> = types.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut data = Vec::new();
    data.extend(BTF_MAGIC.to_ne_bytes());
    data.extend([1u8, 0]);
    for value in [HEADER_LEN as u32, 0, type_bytes.len() as u32, type_bytes.len() as u32, strings.len() as u32] {
        data.extend(value.to_ne_bytes());
    }
    data.extend(type_bytes);
    data.extend(strings);
    data
}

#[test]
fn members_are_found_through_anonymous_unions_and_bitfields_refused() {
    let btf = KernelBtf::from_bytes(sample()).expect("well-formed");
    assert_eq!(btf.offset_of("outer", "a").expect("a"), 0);
    assert_eq!(btf.offset_of("outer", "b").expect("b"), 4);
    assert_eq!(btf.offset_of("outer", "c.y").expect("c.y"), 8);
    assert_eq!(btf.struct_size("inner").expect("inner"), 8);
    let err = btf.offset_of("outer", "d").expect_err("bitfield");
    assert!(matches!(err, LayoutError::Bitfield { .. }), "{err}");
    assert!(!btf.has_raw_tracepoint("anything"));
}

#[test]
fn the_sockets_cgroup_word_is_found_in_5_10s_union_and_in_later_kernels_struct() {
    for old in [true, false] {
        let btf = KernelBtf::from_bytes(crate::kernel::btf_fixture::kernel(old)).expect("well-formed");
        let offsets = btf.offsets();
        assert!(offsets.missing(Member::SockCgroup).is_none(), "old={old}: {:?}", offsets.missing);
        assert_eq!(offsets.values.sock_cgroup, 8, "old={old}: sk_cgrp_data's first word");
        // The fixture has no task_struct.start_boottime: that member alone is missing, named.
        let why = offsets.missing(Member::TaskStartBoottime).expect("not in the fixture");
        assert!(why.to_string().contains("task_struct has no member start_boottime"), "{why}");
    }
}

#[test]
fn tracepoint_prototypes_are_read_without_the_leading_data_pointer() {
    let old = KernelBtf::from_bytes(crate::kernel::btf_fixture::kernel(true)).expect("well-formed");
    assert_eq!(old.tracepoint_params("mark_victim").expect("readable"), Some(vec![Param::Int { bytes: 4 }]));
    let new = KernelBtf::from_bytes(crate::kernel::btf_fixture::kernel(false)).expect("well-formed");
    assert_eq!(
        new.tracepoint_params("mark_victim").expect("readable"),
        Some(vec![Param::StructPointer("task_struct".into()), Param::Int { bytes: 4 }])
    );
    assert_eq!(new.tracepoint_params("no_such_tracepoint").expect("readable"), None);
}

#[test]
fn the_running_kernels_tracepoints_have_the_arguments_the_programs_read() {
    let Some(btf) = btf() else { return };
    let signal = btf.tracepoint_params("signal_generate").expect("readable").expect("present");
    assert_eq!(signal.get(2), Some(&Param::StructPointer("task_struct".into())), "{signal:?}");
    let sock = btf.tracepoint_params("inet_sock_set_state").expect("readable").expect("present");
    assert_eq!(sock.first(), Some(&Param::StructPointer("sock".into())), "{sock:?}");
}

#[test]
fn truncated_or_foreign_data_is_an_error_not_a_panic() {
    let whole = sample();
    for len in 0..whole.len() {
        // Every prefix either indexes (it ends on a record boundary and the header was
        // rewritten to match: never here) or fails cleanly.
        assert!(KernelBtf::from_bytes(whole[..len].to_vec()).is_err(), "prefix of {len} bytes");
    }
    let mut corrupt = whole.clone();
    corrupt[HEADER_LEN + 4 + 3] = 0x1f; // first type's kind: 31, unknown
    assert!(KernelBtf::from_bytes(corrupt).is_err());
    let mut bad_string = whole;
    bad_string[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
    let btf = KernelBtf::from_bytes(bad_string).expect("indexing does not read names");
    assert!(btf.offset_of("outer", "a").is_ok(), "struct outer is still found by its own name");
    assert!(btf.struct_size("int").is_err());
}
