//! Hand-built BTF for the tests of `layout` and `programs`: the shapes other kernels have (5.10's
//! `sock_cgroup_data` union, both `mark_victim` prototypes) without booting them.

use super::layout::{BTF_MAGIC, HEADER_LEN};

// BTF kinds (`BTF_KIND_*`) the fixtures use.
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC_PROTO: u32 = 13;

/// Builds a `.BTF` blob type by type; each method returns the new type's id.
pub(crate) struct BtfBuilder {
    words: Vec<u32>,
    strings: Vec<u8>,
    next_id: u32,
}

impl BtfBuilder {
    pub(crate) fn new() -> Self {
        Self { words: Vec::new(), strings: vec![0], next_id: 1 }
    }

    fn name(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let at = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        at
    }

    fn record(&mut self, name: &str, kind: u32, vlen: u32, kind_flag: bool, size_or_type: u32) -> u32 {
        let name_off = self.name(name);
        self.words.extend([name_off, (kind << 24) | vlen | (u32::from(kind_flag) << 31), size_or_type]);
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub(crate) fn int(&mut self, name: &str, bytes: u32) -> u32 {
        let id = self.record(name, KIND_INT, 0, false, bytes);
        self.words.push(bytes * 8);
        id
    }

    pub(crate) fn pointer(&mut self, to: u32) -> u32 {
        self.record("", KIND_PTR, 0, false, to)
    }

    pub(crate) fn typedef(&mut self, name: &str, to: u32) -> u32 {
        self.record(name, KIND_TYPEDEF, 0, false, to)
    }

    /// A struct (or, with `union`, a union) of `size` bytes; members are (name, type, bit offset,
    /// bitfield bits or 0).
    pub(crate) fn aggregate(&mut self, union: bool, name: &str, size: u32, members: &[(&str, u32, u32, u32)]) -> u32 {
        let kind_flag = members.iter().any(|m| m.3 != 0);
        let kind = if union { KIND_UNION } else { KIND_STRUCT };
        let id = self.record(name, kind, members.len() as u32, kind_flag, size);
        for &(member, type_id, bit_offset, bits) in members {
            let name_off = self.name(member);
            let offset = if kind_flag { (bits << 24) | bit_offset } else { bit_offset };
            self.words.extend([name_off, type_id, offset]);
        }
        id
    }

    /// `typedef void (*btf_trace_<name>)(void *__data, params...)`, as the kernel declares
    /// each BTF tracepoint.
    pub(crate) fn tracepoint(&mut self, name: &str, params: &[(&str, u32)]) -> u32 {
        let void_pointer = self.pointer(0);
        let proto = self.record("", KIND_FUNC_PROTO, params.len() as u32 + 1, false, 0);
        let data = self.name("__data");
        self.words.extend([data, void_pointer]);
        for &(param, type_id) in params {
            let name_off = self.name(param);
            self.words.extend([name_off, type_id]);
        }
        let pointer = self.pointer(proto);
        self.typedef(&format!("btf_trace_{name}"), pointer)
    }

    pub(crate) fn build(self) -> Vec<u8> {
        let types: Vec<u8> = self.words.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut data = Vec::new();
        data.extend(BTF_MAGIC.to_ne_bytes());
        data.extend([1u8, 0]);
        for value in [HEADER_LEN as u32, 0, types.len() as u32, types.len() as u32, self.strings.len() as u32] {
            data.extend(value.to_ne_bytes());
        }
        data.extend(types);
        data.extend(self.strings);
        data
    }
}

/// 5.10's `struct sock { ...; struct sock_cgroup_data sk_cgrp_data; }` where the data is a
/// union of net_prio/net_cls bitfields and `u64 val`, or the later form with a `cgroup` pointer;
/// `signal_generate`; and `mark_victim` taking a pid (`old`) or a task.
pub(crate) fn kernel(old: bool) -> Vec<u8> {
    let mut btf = BtfBuilder::new();
    let int = btf.int("int", 4);
    let u8_ = btf.int("u8", 1);
    let u16_ = btf.int("u16", 2);
    let u32_ = btf.int("u32", 4);
    let u64_ = btf.int("u64", 8);
    let task = btf.aggregate(false, "task_struct", 16, &[("pid", int, 0, 0), ("tgid", int, 32, 0)]);
    let task_pointer = btf.pointer(task);
    let cgroup = btf.aggregate(false, "cgroup", 8, &[("id", u64_, 0, 0)]);
    let cgroup_pointer = btf.pointer(cgroup);
    let data = if old {
        let bits = btf.aggregate(
            false,
            "",
            8,
            &[
                ("is_data", u8_, 0, 1),
                ("no_refcnt", u8_, 1, 1),
                ("unused", u8_, 2, 6),
                ("padding", u8_, 8, 0),
                ("prioidx", u16_, 16, 0),
                ("classid", u32_, 32, 0),
            ],
        );
        let union = btf.aggregate(true, "", 8, &[("", bits, 0, 0), ("val", u64_, 0, 0)]);
        btf.aggregate(false, "sock_cgroup_data", 8, &[("", union, 0, 0)])
    } else {
        btf.aggregate(false, "sock_cgroup_data", 16, &[("cgroup", cgroup_pointer, 0, 0), ("classid", u32_, 64, 0)])
    };
    btf.aggregate(false, "sock", 72, &[("sk_protocol", u16_, 0, 0), ("sk_cgrp_data", data, 64, 0)]);
    let siginfo = btf.aggregate(false, "kernel_siginfo", 48, &[("si_signo", int, 0, 0)]);
    let siginfo_pointer = btf.pointer(siginfo);
    btf.tracepoint(
        "signal_generate",
        &[("sig", int), ("info", siginfo_pointer), ("task", task_pointer), ("group", int), ("result", int)],
    );
    if old {
        btf.tracepoint("mark_victim", &[("pid", int)]);
    } else {
        let uid = btf.typedef("uid_t", u32_);
        btf.tracepoint("mark_victim", &[("task", task_pointer), ("uid", uid)]);
    }
    btf.build()
}
