//! Kernel struct layouts from BTF: the byte offsets the kernel programs read at.
//!
//! Struct layouts change between kernel builds (config options add and remove members), so the
//! programs never hard-code an offset: this module finds each member in
//! `/sys/kernel/btf/vmlinux`, following anonymous structs and unions, and the loader writes the
//! result into the object's `.rodata` before the verifier sees it.
//!
//! The file is read once and kept as raw bytes with one index (type id -> byte offset); the few
//! dozen lookups the loader makes walk the raw records. A full parse into owned types (what
//! general BTF libraries do) allocates every name and member of vmlinux's ~130,000 types, many
//! MB of small heap blocks only needed while loading; the same bytes then feed aya's own
//! parser (see [`KernelBtf::bytes`]), so the file is read once.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use lifecycle_common::KernelOffsets;

/// Why the layout could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The BTF file is missing or unreadable: the kernel lacks CONFIG_DEBUG_INFO_BTF.
    #[error("cannot read kernel BTF at {path} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
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
    /// The BTF data could not be decoded.
    #[error("kernel BTF is malformed: {0}")]
    Malformed(&'static str),
}

/// The offsets the programs read, and the members this kernel does not have.
#[derive(Debug)]
pub(crate) struct Offsets {
    /// Every offset found; a missing member's is 0.
    pub(crate) values: KernelOffsets,
    /// The members not found, with why.
    pub(crate) missing: Vec<(Member, Arc<LayoutError>)>,
}

impl Offsets {
    /// Why `member` has no offset here, if it has none.
    pub(crate) fn missing(&self, member: Member) -> Option<&Arc<LayoutError>> {
        self.missing.iter().find(|(m, _)| *m == member).map(|(_, error)| error)
    }
}

/// One parameter of a tracepoint, as a program reading it by position cares about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    /// An integer (or enum) of this many bytes.
    Int { bytes: u32 },
    /// A pointer to the named struct or union.
    StructPointer(String),
    /// Another pointer (to a string, to an integer, to a function).
    OtherPointer,
    /// Anything else.
    Other,
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Param::Int { bytes } => write!(f, "{}-bit integer", bytes * 8),
            Param::StructPointer(name) => write!(f, "struct {name} *"),
            Param::OtherPointer => f.write_str("pointer"),
            Param::Other => f.write_str("other"),
        }
    }
}

/// Where one value of [`KernelOffsets`] comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// A member's offset in a struct: the first of the dotted paths this kernel has.
    Member(&'static str, &'static [&'static str]),
    /// `sizeof` a struct.
    Size(&'static str),
    /// The sum of two members' offsets (an array's start plus a member's place in an element).
    Sum((&'static str, &'static str), (&'static str, &'static str)),
}

/// Declares [`Member`], one variant per [`KernelOffsets`] field, with where its value comes from.
macro_rules! members {
    ($($variant:ident => $field:ident: $source:expr,)*) => {
        /// One value of [`KernelOffsets`]: what a program reads, named so that what needs it can
        /// say so (`kernel::programs`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Member { $($variant,)* }

        impl Member {
            /// Every member, in [`KernelOffsets`]' order.
            pub(crate) const ALL: &'static [Member] = &[$(Member::$variant,)*];

            /// The [`KernelOffsets`] field it fills.
            pub(crate) fn field(self) -> &'static str {
                match self { $(Member::$variant => stringify!($field),)* }
            }

            fn set(self, offsets: &mut KernelOffsets, value: u32) {
                match self { $(Member::$variant => offsets.$field = value,)* }
            }

            fn source(self) -> Source {
                match self { $(Member::$variant => $source,)* }
            }
        }
    };
}

members! {
    TaskPid => task_pid: Source::Member("task_struct", &["pid"]),
    TaskTgid => task_tgid: Source::Member("task_struct", &["tgid"]),
    TaskRealParent => task_real_parent: Source::Member("task_struct", &["real_parent"]),
    TaskComm => task_comm: Source::Member("task_struct", &["comm"]),
    TaskExitCode => task_exit_code: Source::Member("task_struct", &["exit_code"]),
    TaskSignal => task_signal: Source::Member("task_struct", &["signal"]),
    TaskUtime => task_utime: Source::Member("task_struct", &["utime"]),
    TaskStime => task_stime: Source::Member("task_struct", &["stime"]),
    TaskStartBoottime => task_start_boottime: Source::Member("task_struct", &["start_boottime"]),
    TaskCgroups => task_cgroups: Source::Member("task_struct", &["cgroups"]),
    TaskFiles => task_files: Source::Member("task_struct", &["files"]),
    SignalLive => signal_live: Source::Member("signal_struct", &["live"]),
    SignalUtime => signal_utime: Source::Member("signal_struct", &["utime"]),
    SignalStime => signal_stime: Source::Member("signal_struct", &["stime"]),
    CssSetDflCgrp => css_set_dfl_cgrp: Source::Member("css_set", &["dfl_cgrp"]),
    CgroupKn => cgroup_kn: Source::Member("cgroup", &["kn"]),
    CgroupRoot => cgroup_root: Source::Member("cgroup", &["root"]),
    CgroupRootHierarchyId => cgroup_root_hierarchy_id: Source::Member("cgroup_root", &["hierarchy_id"]),
    KernfsNodeId => kernfs_node_id: Source::Member("kernfs_node", &["id"]),
    SockNum => sock_num: Source::Member("sock", &["__sk_common.skc_num"]),
    SockDport => sock_dport: Source::Member("sock", &["__sk_common.skc_dport"]),
    SockFamily => sock_family: Source::Member("sock", &["__sk_common.skc_family"]),
    SockNet => sock_net: Source::Member("sock", &["__sk_common.skc_net"]),
    SockProtocol => sock_protocol: Source::Member("sock", &["sk_protocol"]),
    // 5.15 made `struct sock_cgroup_data` a plain struct with a `cgroup` pointer; before, a union
    // of that pointer (as `u64 val`) and net_prio/net_cls bitfields. Both start at offset 0 of
    // the member; the program tells the two apart by the low bits (lifecycle-ebpf `tcp.rs`).
    SockCgroup => sock_cgroup: Source::Member("sock", &["sk_cgrp_data.cgroup", "sk_cgrp_data.val"]),
    NetNsInum => net_ns_inum: Source::Member("net", &["ns.inum"]),
    FilesFdt => files_fdt: Source::Member("files_struct", &["fdt"]),
    FdtableMaxFds => fdtable_max_fds: Source::Member("fdtable", &["max_fds"]),
    FdtableFd => fdtable_fd: Source::Member("fdtable", &["fd"]),
    FilePrivateData => file_private_data: Source::Member("file", &["private_data"]),
    SocketSk => socket_sk: Source::Member("socket", &["sk"]),
    TaskThreadPid => task_thread_pid: Source::Member("task_struct", &["thread_pid"]),
    PidLevel => pid_level: Source::Member("pid", &["level"]),
    PidNumbers => pid_numbers: Source::Member("pid", &["numbers"]),
    UpidNr => upid_nr: Source::Member("upid", &["nr"]),
    UpidSize => upid_size: Source::Size("upid"),
    TaskGroupLeader => task_group_leader: Source::Member("task_struct", &["group_leader"]),
    TaskSighand => task_sighand: Source::Member("task_struct", &["sighand"]),
    // `sighand->action[sig - 1].sa.sa_handler`: the array's start plus the handler's place in
    // one element; the element size is the stride.
    SighandActionHandler => sighand_action_handler:
        Source::Sum(("sighand_struct", "action"), ("k_sigaction", "sa.sa_handler")),
    KSigactionSize => k_sigaction_size: Source::Size("k_sigaction"),
    CssSetNrTasks => css_set_nr_tasks: Source::Member("css_set", &["nr_tasks"]),
    // Inside `kernel_siginfo`'s anonymous `__SIGINFO` struct.
    SiginfoCode => siginfo_code: Source::Member("kernel_siginfo", &["si_code"]),
}

/// `struct btf_header` is 24 bytes in every BTF version so far; `hdr_len` may announce more.
pub(crate) const HEADER_LEN: usize = 24;
pub(crate) const BTF_MAGIC: u16 = 0xeb9f;
/// `struct btf_type`: name_off, info, size/type.
const TYPE_LEN: usize = 12;

// BTF kinds (`BTF_KIND_*`).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One `struct btf_type` record, decoded.
#[derive(Clone, Copy, Debug)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` for structs, unions, ints; `type` for typedefs, qualifiers, pointers.
    size_or_type: u32,
    /// Byte offset of the kind-specific data following the record.
    extra: usize,
}

/// Kernel BTF, read once and indexed: the file (5.5 MB for a 6.18 vmlinux) and 4 bytes per type.
pub(crate) struct KernelBtf {
    data: Vec<u8>,
    /// Start and end of the string section in `data`.
    strings: (usize, usize),
    /// Byte offset in `data` of each type, by id - 1 (id 0 is `void`).
    index: Vec<u32>,
}

impl KernelBtf {
    /// Reads and indexes the BTF file at `path` (normally `/sys/kernel/btf/vmlinux`).
    pub(crate) fn open(path: &Path) -> Result<Self, LayoutError> {
        let data = std::fs::read(path).map_err(|source| LayoutError::Unreadable { path: path.to_owned(), source })?;
        Self::from_bytes(data)
    }

    /// Indexes raw BTF (a `.BTF` section as the kernel exports it, in this machine's byte order).
    pub(crate) fn from_bytes(data: Vec<u8>) -> Result<Self, LayoutError> {
        let u16_at = |at: usize| data.get(at..at + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(LayoutError::Malformed("bad magic (not BTF, or another byte order)"));
        }
        let header_len = u32_at(&data, 4).ok_or(LayoutError::Malformed("short header"))? as usize;
        let field = |at: usize| u32_at(&data, at).map(|v| v as usize).ok_or(LayoutError::Malformed("short header"));
        let (type_off, type_len, str_off, str_len) = (field(8)?, field(12)?, field(16)?, field(20)?);
        if header_len < HEADER_LEN {
            return Err(LayoutError::Malformed("short header"));
        }
        let section = |off: usize, len: usize| {
            let start = header_len.checked_add(off)?;
            let end = start.checked_add(len)?;
            (end <= data.len()).then_some((start, end))
        };
        let (types_start, types_end) = section(type_off, type_len).ok_or(LayoutError::Malformed("type section"))?;
        let strings = section(str_off, str_len).ok_or(LayoutError::Malformed("string section"))?;
        let mut btf = Self { data, strings, index: Vec::new() };
        let mut at = types_start;
        while at < types_end {
            let offset = u32::try_from(at).map_err(|_| LayoutError::Malformed("type section too large"))?;
            btf.index.push(offset);
            let record = btf.record_at(at)?;
            at = record.extra + btf.extra_len(&record)?;
        }
        if at != types_end {
            return Err(LayoutError::Malformed("last type overruns its section"));
        }
        btf.index.shrink_to_fit();
        Ok(btf)
    }

    /// The raw BTF, for aya's own parser (which needs the kernel's type ids to attach).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Computes every offset the kernel programs need. A member this kernel lacks is listed in
    /// [`Offsets::missing`] (its value stays 0): only the programs that read it are switched off
    /// (`kernel::programs`), so one member a single feature needs stops nothing else.
    pub(crate) fn offsets(&self) -> Offsets {
        let mut offsets = Offsets { values: KernelOffsets::default(), missing: Vec::new() };
        for &member in Member::ALL {
            match self.resolve(member.source()) {
                Ok(value) => member.set(&mut offsets.values, value),
                Err(error) => offsets.missing.push((member, Arc::new(error))),
            }
        }
        offsets
    }

    /// The value of one [`Source`]: the first of its alternatives this kernel has.
    fn resolve(&self, source: Source) -> Result<u32, LayoutError> {
        match source {
            Source::Member(strukt, paths) => {
                let mut first_error = None;
                for path in paths {
                    match self.offset_of(strukt, path) {
                        Ok(offset) => return Ok(offset),
                        Err(error) => {
                            first_error.get_or_insert(error);
                        }
                    }
                }
                Err(first_error.unwrap_or(LayoutError::Malformed("a member with no path")))
            }
            Source::Size(strukt) => self.struct_size(strukt),
            Source::Sum((a, a_path), (b, b_path)) => Ok(self.offset_of(a, a_path)? + self.offset_of(b, b_path)?),
        }
    }

    /// The parameters of BTF tracepoint `name` as its programs see them (the prototype of the
    /// kernel's `btf_trace_<name>` typedef without its leading `void *__data`), or None when the
    /// kernel has no such tracepoint. Programs read their arguments by position: a tracepoint
    /// whose arguments changed between kernels (`mark_victim`) must be checked here, or a program
    /// reads an integer as a pointer and silently finds nothing.
    pub(crate) fn tracepoint_params(&self, name: &str) -> Result<Option<Vec<Param>>, LayoutError> {
        let wanted = format!("btf_trace_{name}");
        let mut typedef = None;
        for record in self.records() {
            let record = record?;
            if record.kind == KIND_TYPEDEF && self.name_is(&record, &wanted) {
                typedef = Some(record);
                break;
            }
        }
        let Some(typedef) = typedef else { return Ok(None) };
        let malformed = || LayoutError::Malformed("btf_trace typedef is not a function pointer");
        let pointer = self.record(self.skip_qualifiers(typedef.size_or_type)?)?.ok_or_else(malformed)?;
        if pointer.kind != KIND_PTR {
            return Err(malformed());
        }
        let proto = self.record(self.skip_qualifiers(pointer.size_or_type)?)?.ok_or_else(malformed)?;
        if proto.kind != KIND_FUNC_PROTO {
            return Err(malformed());
        }
        let mut params = Vec::with_capacity(proto.vlen.saturating_sub(1));
        for i in 1..proto.vlen {
            let param_type = u32_at(&self.data, proto.extra + i * 8 + 4).ok_or(LayoutError::Malformed("parameter"))?;
            params.push(self.param(param_type)?);
        }
        Ok(Some(params))
    }

    /// What a parameter of type `id` is, as far as a program reading it cares.
    fn param(&self, id: u32) -> Result<Param, LayoutError> {
        let Some(record) = self.record(self.skip_qualifiers(id)?)? else { return Ok(Param::Other) };
        Ok(match record.kind {
            KIND_INT | KIND_ENUM | KIND_ENUM64 => Param::Int { bytes: record.size_or_type },
            KIND_PTR => match self.record(self.skip_qualifiers(record.size_or_type)?)? {
                Some(target) if target.kind == KIND_STRUCT || target.kind == KIND_FWD || target.kind == KIND_UNION => {
                    Param::StructPointer(String::from_utf8_lossy(self.string(target.name_off)?).into_owned())
                }
                _ => Param::OtherPointer,
            },
            _ => Param::Other,
        })
    }

    /// Follows typedefs and qualifiers from type `id` to the type they name.
    fn skip_qualifiers(&self, mut id: u32) -> Result<u32, LayoutError> {
        for _ in 0..16 {
            let Some(record) = self.record(id)? else { return Ok(id) };
            match record.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = record.size_or_type,
                _ => return Ok(id),
            }
        }
        Err(LayoutError::Malformed("qualifiers nest too deep"))
    }

    /// `sizeof(struct strukt)`.
    pub(crate) fn struct_size(&self, strukt: &'static str) -> Result<u32, LayoutError> {
        Ok(self.find_struct(strukt)?.size_or_type)
    }

    /// Byte offset of a dotted member path (`"a.b.c"`) inside `struct strukt`.
    pub(crate) fn offset_of(&self, strukt: &'static str, path: &str) -> Result<u32, LayoutError> {
        let no_member = || LayoutError::NoMember { strukt, member: path.to_owned() };
        let mut current = self.find_struct(strukt)?;
        let mut total_bits = 0u32;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, name) in parts.iter().enumerate() {
            let (bits, member_type) = self.find_member(&current, name, strukt, 0)?.ok_or_else(no_member)?;
            total_bits += bits;
            if i + 1 < parts.len() {
                current = self.strip_to_struct(member_type)?.ok_or_else(no_member)?;
            }
        }
        if !total_bits.is_multiple_of(8) {
            return Err(LayoutError::Bitfield { strukt, member: path.to_owned() });
        }
        Ok(total_bits / 8)
    }

    /// True when the kernel has a BTF tracepoint of this name (`btf_trace_<name>` typedef), which
    /// is what a `tp_btf` program attaches to.
    pub(crate) fn has_raw_tracepoint(&self, name: &str) -> bool {
        let wanted = format!("btf_trace_{name}");
        self.records().any(|record| record.is_ok_and(|r| r.kind == KIND_TYPEDEF && self.name_is(&r, &wanted)))
    }

    /// The struct definition named `name` (a forward declaration has no members and is skipped).
    fn find_struct(&self, name: &'static str) -> Result<TypeRecord, LayoutError> {
        for record in self.records() {
            let record = record?;
            if record.kind == KIND_STRUCT && record.vlen > 0 && self.name_is(&record, name) {
                return Ok(record);
            }
        }
        Err(LayoutError::NoStruct(name))
    }

    /// Finds `name` among the members of `strukt`, descending into anonymous structs and unions.
    /// Returns the member's bit offset within `strukt` and its type id.
    fn find_member(
        &self,
        strukt: &TypeRecord,
        name: &str,
        outer: &'static str,
        depth: usize,
    ) -> Result<Option<(u32, u32)>, LayoutError> {
        // Anonymous members nest a handful deep in practice; the bound only stops a cycle.
        if depth > 16 {
            return Err(LayoutError::Malformed("anonymous members nest too deep"));
        }
        for i in 0..strukt.vlen {
            let at = strukt.extra + i * 12;
            let field = |delta: usize| u32_at(&self.data, at + delta).ok_or(LayoutError::Malformed("member"));
            let (name_off, member_type, offset) = (field(0)?, field(4)?, field(8)?);
            // With kind_flag set, the offset word packs the bitfield size above 24 bits of offset.
            let (bit_offset, bitfield_size) =
                if strukt.kind_flag { (offset & 0x00ff_ffff, offset >> 24) } else { (offset, 0) };
            let member_name = self.string(name_off)?;
            if member_name == name.as_bytes() {
                if bitfield_size != 0 {
                    return Err(LayoutError::Bitfield { strukt: outer, member: name.to_owned() });
                }
                return Ok(Some((bit_offset, member_type)));
            }
            if member_name.is_empty() {
                if let Some(inner) = self.strip_to_struct(member_type)? {
                    if let Some((bits, found)) = self.find_member(&inner, name, outer, depth + 1)? {
                        return Ok(Some((bit_offset + bits, found)));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers from type `id` down to a struct or union.
    fn strip_to_struct(&self, mut id: u32) -> Result<Option<TypeRecord>, LayoutError> {
        for _ in 0..16 {
            let Some(record) = self.record(id)? else { return Ok(None) };
            match record.kind {
                KIND_STRUCT | KIND_UNION => return Ok(Some(record)),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = record.size_or_type,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// The record of type `id`; None for `void` (id 0).
    fn record(&self, id: u32) -> Result<Option<TypeRecord>, LayoutError> {
        if id == 0 {
            return Ok(None);
        }
        let at = *self.index.get(id as usize - 1).ok_or(LayoutError::Malformed("type id out of range"))?;
        self.record_at(at as usize).map(Some)
    }

    fn records(&self) -> impl Iterator<Item = Result<TypeRecord, LayoutError>> + '_ {
        self.index.iter().map(|&at| self.record_at(at as usize))
    }

    fn record_at(&self, at: usize) -> Result<TypeRecord, LayoutError> {
        let field = |delta: usize| u32_at(&self.data, at + delta).ok_or(LayoutError::Malformed("type record"));
        let (name_off, info, size_or_type) = (field(0)?, field(4)?, field(8)?);
        Ok(TypeRecord {
            name_off,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 != 0,
            size_or_type,
            extra: at + TYPE_LEN,
        })
    }

    /// Bytes of kind-specific data after a record.
    fn extra_len(&self, record: &TypeRecord) -> Result<usize, LayoutError> {
        Ok(match record.kind {
            KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
            KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_FUNC
            | KIND_FLOAT | KIND_TYPE_TAG => 0,
            KIND_ARRAY => 12,
            KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => record.vlen * 12,
            KIND_ENUM | KIND_FUNC_PROTO => record.vlen * 8,
            _ => return Err(LayoutError::Malformed("unknown type kind")),
        })
    }

    /// The NUL-terminated string at `offset` in the string section, without the NUL.
    fn string(&self, offset: u32) -> Result<&[u8], LayoutError> {
        let (start, end) = self.strings;
        let from = start.checked_add(offset as usize).filter(|&from| from < end);
        let tail = from.map(|from| &self.data[from..end]).ok_or(LayoutError::Malformed("string offset"))?;
        let len = tail.iter().position(|&b| b == 0).ok_or(LayoutError::Malformed("unterminated string"))?;
        Ok(&tail[..len])
    }

    fn name_is(&self, record: &TypeRecord, name: &str) -> bool {
        self.string(record.name_off).is_ok_and(|found| found == name.as_bytes())
    }
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    data.get(at..at.checked_add(4)?).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
