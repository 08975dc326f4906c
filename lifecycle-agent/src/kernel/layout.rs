//! Kernel struct layouts from BTF: the byte offsets the kernel programs read at.
//!
//! Struct layouts change between kernel builds (config options add and remove members), so the
//! programs never hard-code an offset: this module finds each member in
//! `/sys/kernel/btf/vmlinux`, following anonymous structs and unions, and the loader writes the
//! result into the object's `.rodata` before the verifier sees it.

use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};
use lifecycle_common::KernelOffsets;

/// Why the layout could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The BTF file is missing or unreadable: the kernel lacks CONFIG_DEBUG_INFO_BTF.
    #[error("cannot read kernel BTF at {path} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: btf_rs::Error,
    },
    /// A struct the programs read is not described in this kernel's BTF.
    #[error("kernel BTF has no struct {0}")]
    NoStruct(&'static str),
    /// A member the programs read is missing from its struct.
    #[error("kernel BTF struct {strukt} has no member {member}")]
    NoMember { strukt: &'static str, member: String },
    /// The member is a bitfield, which a byte-offset read cannot extract.
    #[error("kernel BTF member {strukt}.{member} is a bitfield")]
    Bitfield { strukt: &'static str, member: String },
    /// A BTF record could not be decoded.
    #[error("kernel BTF is malformed near {context}")]
    Malformed {
        context: String,
        #[source]
        source: btf_rs::Error,
    },
}

/// Kernel BTF, parsed once (~100 ms for vmlinux).
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Parses the BTF file at `path` (normally `/sys/kernel/btf/vmlinux`).
    pub fn open(path: &Path) -> Result<Self, LayoutError> {
        let btf = Btf::from_file(path).map_err(|source| LayoutError::Unreadable { path: path.to_owned(), source })?;
        Ok(Self { btf })
    }

    /// Computes every offset the kernel programs need.
    pub fn offsets(&self) -> Result<KernelOffsets, LayoutError> {
        let at = |strukt: &'static str, path: &str| self.offset_of(strukt, path);
        Ok(KernelOffsets {
            task_pid: at("task_struct", "pid")?,
            task_tgid: at("task_struct", "tgid")?,
            task_real_parent: at("task_struct", "real_parent")?,
            task_comm: at("task_struct", "comm")?,
            task_exit_code: at("task_struct", "exit_code")?,
            task_signal: at("task_struct", "signal")?,
            task_utime: at("task_struct", "utime")?,
            task_stime: at("task_struct", "stime")?,
            task_start_boottime: at("task_struct", "start_boottime")?,
            task_cgroups: at("task_struct", "cgroups")?,
            task_files: at("task_struct", "files")?,
            signal_live: at("signal_struct", "live")?,
            signal_utime: at("signal_struct", "utime")?,
            signal_stime: at("signal_struct", "stime")?,
            css_set_dfl_cgrp: at("css_set", "dfl_cgrp")?,
            cgroup_kn: at("cgroup", "kn")?,
            cgroup_root: at("cgroup", "root")?,
            cgroup_root_hierarchy_id: at("cgroup_root", "hierarchy_id")?,
            kernfs_node_id: at("kernfs_node", "id")?,
            sock_num: at("sock", "__sk_common.skc_num")?,
            sock_dport: at("sock", "__sk_common.skc_dport")?,
            sock_family: at("sock", "__sk_common.skc_family")?,
            sock_net: at("sock", "__sk_common.skc_net")?,
            sock_protocol: at("sock", "sk_protocol")?,
            sock_cgroup: at("sock", "sk_cgrp_data.cgroup")?,
            net_ns_inum: at("net", "ns.inum")?,
            files_fdt: at("files_struct", "fdt")?,
            fdtable_max_fds: at("fdtable", "max_fds")?,
            fdtable_fd: at("fdtable", "fd")?,
            file_private_data: at("file", "private_data")?,
            socket_sk: at("socket", "sk")?,
            task_thread_pid: at("task_struct", "thread_pid")?,
            pid_level: at("pid", "level")?,
            pid_numbers: at("pid", "numbers")?,
            upid_nr: at("upid", "nr")?,
            upid_size: self.struct_size("upid")?,
        })
    }

    /// `sizeof(struct strukt)`.
    pub fn struct_size(&self, strukt: &'static str) -> Result<u32, LayoutError> {
        Ok(self.find_struct(strukt)?.size() as u32)
    }

    /// Byte offset of a dotted member path (`"a.b.c"`) inside `struct strukt`.
    pub fn offset_of(&self, strukt: &'static str, path: &str) -> Result<u32, LayoutError> {
        let mut current = self.find_struct(strukt)?;
        let mut total_bits = 0u32;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, name) in parts.iter().enumerate() {
            let (bits, member_type) = self
                .find_member(&current, name)?
                .ok_or_else(|| LayoutError::NoMember { strukt, member: path.to_owned() })?;
            total_bits += bits;
            if i + 1 < parts.len() {
                current = self
                    .strip_to_struct(member_type)
                    .ok_or_else(|| LayoutError::NoMember { strukt, member: path.to_owned() })?;
            }
        }
        if !total_bits.is_multiple_of(8) {
            return Err(LayoutError::Bitfield { strukt, member: path.to_owned() });
        }
        Ok(total_bits / 8)
    }

    fn find_struct(&self, name: &'static str) -> Result<btf_rs::Struct, LayoutError> {
        let types = self.btf.resolve_types_by_name(name).map_err(|_| LayoutError::NoStruct(name))?;
        types
            .into_iter()
            .find_map(|t| match t {
                // A forward declaration has no members; skip it in favour of the definition.
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or(LayoutError::NoStruct(name))
    }

    /// Finds `name` among the members of `strukt`, descending into anonymous structs and unions.
    /// Returns the member's bit offset within `strukt` and its type.
    fn find_member(&self, strukt: &btf_rs::Struct, name: &str) -> Result<Option<(u32, Type)>, LayoutError> {
        for member in &strukt.members {
            let member_name = self.btf.resolve_name(member).unwrap_or_default();
            let member_type = self
                .btf
                .resolve_chained_type(member)
                .map_err(|source| LayoutError::Malformed { context: format!("member {name}"), source })?;
            if member.bitfield_size().is_some_and(|size| size != 0) && member_name == name {
                return Err(LayoutError::Bitfield { strukt: "struct", member: name.to_owned() });
            }
            if member_name == name {
                return Ok(Some((member.bit_offset(), member_type)));
            }
            if member_name.is_empty() {
                if let Some(inner) = self.strip_to_struct(member_type) {
                    if let Some((bits, found)) = self.find_member(&inner, name)? {
                        return Ok(Some((member.bit_offset() + bits, found)));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers down to a struct or union.
    fn strip_to_struct(&self, mut ty: Type) -> Option<btf_rs::Struct> {
        for _ in 0..16 {
            ty = match ty {
                Type::Struct(s) | Type::Union(s) => return Some(s),
                Type::Typedef(_) | Type::Volatile(_) | Type::Const(_) | Type::Restrict(_) | Type::TypeTag(_) => {
                    let inner = ty.as_btf_type()?;
                    self.btf.resolve_chained_type(inner).ok()?
                }
                _ => return None,
            };
        }
        None
    }

    /// True when the kernel has a BTF tracepoint of this name (`btf_trace_<name>` typedef), which
    /// is what a `tp_btf` program attaches to.
    pub fn has_raw_tracepoint(&self, name: &str) -> bool {
        self.btf.resolve_ids_by_name(&format!("btf_trace_{name}")).is_ok_and(|ids| !ids.is_empty())
    }
}

#[cfg(test)]
mod tests {
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
        let offsets = btf.offsets().expect("every member the programs read exists");
        assert!(offsets.task_tgid == offsets.task_pid + 4, "pid and tgid are adjacent pid_t");
        assert!(offsets.sock_dport < offsets.sock_num, "skc_dport precedes skc_num in skc_portpair");
        assert_eq!(offsets.sock_num - offsets.sock_dport, 2);
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
}
