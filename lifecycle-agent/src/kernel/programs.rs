//! What each kernel program needs from the running kernel, and which programs a feature runs.
//!
//! A program needs its tracepoint, the tracepoint's arguments in the places and of the kinds it
//! reads them, and the struct members it reads (offsets from BTF, `layout.rs`). Kernels differ in
//! all three: 5.10's `struct sock_cgroup_data` has no `cgroup` member, `mark_victim` took a pid
//! before 6.1.130 and a task since. A feature runs the first of its program sets whose needs the
//! kernel meets, and is off, with every unmet need named, when none does: never attached to a
//! tracepoint whose arguments it would misread, so `lifecycle_feature_enabled` is 1 only where
//! the feature's events can arrive.

use std::{fmt, sync::Arc};

use lifecycle_common::names;

use super::{
    layout::{KernelBtf, LayoutError, Member, Offsets, Param},
    Feature,
};

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attach {
    /// A BTF-typed raw tracepoint (`tp_btf`) of this name; needs BTF, not tracefs.
    Btf(&'static str),
    /// A classic tracepoint `<category>/<name>`; needs tracefs. Its record layout is fixed by
    /// the syscall ABI, so only its presence is checked (at attach).
    Tracefs(&'static str, &'static str),
}

/// How a program reads one tracepoint argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// As an integer.
    Int,
    /// As a pointer to the named struct.
    Struct(&'static str),
    /// As a pointer to anything else (a string).
    Pointer,
}

impl Reads {
    fn accepts(self, param: &Param) -> bool {
        match (self, param) {
            (Reads::Int, Param::Int { .. }) => true,
            (Reads::Struct(wanted), Param::StructPointer(name)) => wanted == name,
            (Reads::Pointer, Param::OtherPointer | Param::StructPointer(_)) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Reads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reads::Int => f.write_str("an integer"),
            Reads::Struct(name) => write!(f, "struct {name} *"),
            Reads::Pointer => f.write_str("a pointer"),
        }
    }
}

/// One program of the object: its name there, where it attaches, what it reads.
#[derive(Debug)]
pub(crate) struct Program {
    pub(crate) name: &'static str,
    pub(crate) attach: Attach,
    /// The tracepoint arguments it reads: position (0 is the first after `__data`) and how.
    pub(crate) args: &'static [(usize, Reads)],
    /// The struct members it reads.
    pub(crate) members: &'static [Member],
}

use Member::*;

/// `task->cgroups->dfl_cgrp->kn->id`.
macro_rules! task_cgroup {
    () => {
        [TaskCgroups, CssSetDflCgrp, CgroupKn, KernfsNodeId]
    };
}
/// The task's pid in its own namespace (`thread_pid->numbers[level].nr`).
macro_rules! pid_namespace {
    () => {
        [TaskThreadPid, PidLevel, PidNumbers, UpidSize, UpidNr]
    };
}
/// A socket's facts (`tcp.rs`'s `socket_facts` and `is_tcp`).
macro_rules! socket {
    () => {
        [SockCgroup, CgroupKn, KernfsNodeId, SockNet, NetNsInum, SockFamily, SockProtocol, SockNum, SockDport]
    };
}

/// Concatenates member arrays into one `&'static [Member]`.
macro_rules! members {
    ($($part:expr),* $(,)?) => {{
        const LEN: usize = 0 $(+ $part.len())*;
        const ALL: [Member; LEN] = {
            let mut all = [TaskPid; LEN];
            let mut at = 0;
            $(
                let part = $part;
                let mut i = 0;
                while i < part.len() {
                    all[at] = part[i];
                    at += 1;
                    i += 1;
                }
            )*
            all
        };
        &ALL
    }};
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`: the
/// task read directly (BTF-checked loads); `EXEC_PROBE` reads it with helpers, for a verifier
/// that refuses the first (see `Sensor::load`).
const EXEC: Program = Program {
    name: names::PROG_EXEC,
    attach: Attach::Btf("sched_process_exec"),
    args: &[(0, Reads::Struct("task_struct"))],
    members: EXEC_MEMBERS,
};
const EXEC_PROBE: Program = Program { name: names::PROG_EXEC_PROBE, ..EXEC };
const EXEC_MEMBERS: &[Member] =
    members!([TaskRealParent, TaskTgid, TaskStartBoottime, TaskComm], task_cgroup!(), pid_namespace!());

/// `sched_process_exit(struct task_struct *p, ...)`, as the exec program: direct, then helpers.
const EXIT: Program = Program {
    name: names::PROG_EXIT,
    attach: Attach::Btf("sched_process_exit"),
    args: &[(0, Reads::Struct("task_struct"))],
    members: members!(
        [TaskSignal, SignalLive, TaskUtime, TaskStime, SignalUtime, SignalStime, TaskComm],
        [TaskRealParent, TaskTgid, TaskExitCode, TaskStartBoottime, TaskCgroups, CssSetNrTasks],
        pid_namespace!(),
    ),
};
const EXIT_PROBE: Program = Program { name: names::PROG_EXIT_PROBE, ..EXIT };

/// `signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task, int group,
/// int result)`.
const SIGNAL: Program = Program {
    name: names::PROG_SIGNAL,
    attach: Attach::Btf("signal_generate"),
    args: &[
        (0, Reads::Int),
        (1, Reads::Struct("kernel_siginfo")),
        (2, Reads::Struct("task_struct")),
        (3, Reads::Int),
        (4, Reads::Int),
    ],
    members: members!(
        [TaskPid, TaskTgid, TaskComm, TaskGroupLeader, TaskSighand, SighandActionHandler, KSigactionSize, SiginfoCode],
        task_cgroup!(),
        pid_namespace!(),
    ),
};

/// `mark_victim(struct task_struct *task, uid_t uid)` (6.1.130 and later).
const OOM_BY_TASK: Program = Program {
    name: names::PROG_OOM,
    attach: Attach::Btf("mark_victim"),
    args: &[(0, Reads::Struct("task_struct"))],
    members: members!([TaskPid, TaskTgid, TaskComm], task_cgroup!()),
};

/// `mark_victim(int pid)` (before 6.1.130), with the kernel's SIGKILLs remembered for it.
const OOM_BY_PID: Program = Program {
    name: names::PROG_OOM_BY_PID,
    attach: Attach::Btf("mark_victim"),
    args: &[(0, Reads::Int)],
    members: &[TaskComm],
};
const OOM_KILL_SIGNAL: Program = Program {
    name: names::PROG_OOM_KILL_SIGNAL,
    attach: Attach::Btf("signal_generate"),
    args: &[(0, Reads::Int), (1, Reads::Struct("kernel_siginfo")), (2, Reads::Struct("task_struct"))],
    members: members!([TaskPid, TaskTgid, TaskComm], task_cgroup!()),
};

/// `inet_sock_set_state(const struct sock *sk, const int oldstate, const int newstate)`.
const SOCK_STATE: Program = Program {
    name: names::PROG_SOCK_STATE,
    attach: Attach::Btf("inet_sock_set_state"),
    args: &[(0, Reads::Struct("sock")), (1, Reads::Int), (2, Reads::Int)],
    members: members!(socket!()),
};

/// The accepted fd -> file -> socket -> sock.
const ACCEPT_MEMBERS: &[Member] =
    members!([TaskFiles, FilesFdt, FdtableMaxFds, FdtableFd, FilePrivateData, SocketSk], socket!());
const ACCEPT4: Program = Program {
    name: names::PROG_ACCEPT4,
    attach: Attach::Tracefs("syscalls", "sys_exit_accept4"),
    args: &[],
    members: ACCEPT_MEMBERS,
};
const ACCEPT: Program = Program {
    name: names::PROG_ACCEPT,
    attach: Attach::Tracefs("syscalls", "sys_exit_accept"),
    args: &[],
    members: ACCEPT_MEMBERS,
};

/// `cgroup_mkdir(struct cgroup *cgrp, const char *path)`, `cgroup_rmdir` alike.
const CGROUP_MEMBERS: &[Member] = &[CgroupRoot, CgroupRootHierarchyId, CgroupKn, KernfsNodeId];
const CGROUP_ARGS: &[(usize, Reads)] = &[(0, Reads::Struct("cgroup")), (1, Reads::Pointer)];
const CGROUP_MKDIR: Program = Program {
    name: names::PROG_CGROUP_MKDIR,
    attach: Attach::Btf("cgroup_mkdir"),
    args: CGROUP_ARGS,
    members: CGROUP_MEMBERS,
};
const CGROUP_RMDIR: Program = Program {
    name: names::PROG_CGROUP_RMDIR,
    attach: Attach::Btf("cgroup_rmdir"),
    args: CGROUP_ARGS,
    members: CGROUP_MEMBERS,
};

/// A feature's program sets, preferred first: it runs the first whose needs the kernel meets.
pub(crate) fn variants(feature: Feature) -> &'static [&'static [Program]] {
    match feature {
        Feature::ProcessExec => &[&[EXEC], &[EXEC_PROBE]],
        Feature::ProcessExit => &[&[EXIT], &[EXIT_PROBE]],
        Feature::Signals => &[&[SIGNAL]],
        Feature::OomKills => &[&[OOM_BY_TASK], &[OOM_BY_PID, OOM_KILL_SIGNAL]],
        Feature::TcpSockets => &[&[SOCK_STATE]],
        Feature::TcpAccepts => &[&[ACCEPT4, ACCEPT]],
        Feature::CgroupEvents => &[&[CGROUP_MKDIR, CGROUP_RMDIR]],
    }
}

/// One need of a program the kernel does not meet.
#[derive(Debug, thiserror::Error)]
pub enum Unmet {
    /// The kernel has no such BTF tracepoint (too old, or configured without it).
    #[error("kernel has no tracepoint {0}")]
    NoTracepoint(&'static str),
    /// The tracepoint's arguments are not what the program reads.
    #[error("tracepoint {tracepoint} takes ({found}) where {program} reads argument {index} as {reads}")]
    Prototype { tracepoint: &'static str, program: &'static str, index: usize, reads: Reads, found: String },
    /// A struct member the program reads is not in this kernel's BTF.
    #[error("{program} reads {}, not in this kernel", member.field())]
    Member {
        program: &'static str,
        member: Member,
        #[source]
        source: Arc<LayoutError>,
    },
    /// The BTF could not be read for this check.
    #[error("kernel BTF: {0}")]
    Btf(#[source] LayoutError),
}

/// Why none of a feature's program sets can run: each set's first unmet need.
#[derive(Debug)]
pub struct NoVariant(pub Vec<Unmet>);

impl fmt::Display for NoVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, unmet) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; or: ")?;
            }
            write!(f, "{unmet}")?;
            match unmet {
                Unmet::Member { source, .. } => write!(f, " ({source})")?,
                Unmet::Btf(source) => write!(f, " ({source})")?,
                Unmet::NoTracepoint(_) | Unmet::Prototype { .. } => {}
            }
        }
        Ok(())
    }
}

impl std::error::Error for NoVariant {}

/// The program set `feature` runs on this kernel (the preferred one), or why it can run none.
#[cfg(test)]
pub(crate) fn choose(feature: Feature, btf: &KernelBtf, offsets: &Offsets) -> Result<&'static [Program], NoVariant> {
    eligible(feature, btf, offsets).map(|sets| sets[0])
}

/// Every program set of `feature` whose needs this kernel meets, preferred first (never empty),
/// or why there is none: the loader tries the next when the verifier refuses one.
pub(crate) fn eligible(
    feature: Feature,
    btf: &KernelBtf,
    offsets: &Offsets,
) -> Result<Vec<&'static [Program]>, NoVariant> {
    let mut unmet = Vec::new();
    let mut sets = Vec::new();
    for &set in variants(feature) {
        match set.iter().try_for_each(|program| check(program, btf, offsets)) {
            Ok(()) => sets.push(set),
            Err(why) => unmet.push(why),
        }
    }
    if sets.is_empty() {
        return Err(NoVariant(unmet));
    }
    Ok(sets)
}

/// The first need of `program` this kernel does not meet.
fn check(program: &Program, btf: &KernelBtf, offsets: &Offsets) -> Result<(), Unmet> {
    if let Attach::Btf(tracepoint) = program.attach {
        let params = btf.tracepoint_params(tracepoint).map_err(Unmet::Btf)?.ok_or(Unmet::NoTracepoint(tracepoint))?;
        for &(index, reads) in program.args {
            if !params.get(index).is_some_and(|param| reads.accepts(param)) {
                let found = params.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                return Err(Unmet::Prototype { tracepoint, program: program.name, index, reads, found });
            }
        }
    }
    for &member in program.members {
        if let Some(error) = offsets.missing(member) {
            return Err(Unmet::Member { program: program.name, member, source: Arc::clone(error) });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf_fixture::{self, BtfBuilder};
    use lifecycle_common::KernelOffsets;

    /// Offsets with every member found, so only the tracepoints decide.
    fn all_members() -> Offsets {
        Offsets { values: KernelOffsets::default(), missing: Vec::new() }
    }

    fn names(set: &[Program]) -> Vec<&'static str> {
        set.iter().map(|p| p.name).collect()
    }

    #[test]
    fn oom_kills_use_the_program_that_reads_mark_victims_arguments_as_this_kernel_passes_them() {
        let new = KernelBtf::from_bytes(btf_fixture::kernel(false)).expect("well-formed");
        let chosen = choose(Feature::OomKills, &new, &all_members()).expect("the task form");
        assert_eq!(names(chosen), [names::PROG_OOM]);
        // 5.10 and 6.1 before 6.1.130: `mark_victim(int pid)`. Reading that int as a task
        // pointer found nothing while the feature said it was on.
        let old = KernelBtf::from_bytes(btf_fixture::kernel(true)).expect("well-formed");
        let chosen = choose(Feature::OomKills, &old, &all_members()).expect("the pid form");
        assert_eq!(names(chosen), [names::PROG_OOM_BY_PID, names::PROG_OOM_KILL_SIGNAL]);
    }

    #[test]
    fn a_prototype_no_program_reads_turns_the_feature_off_naming_what_the_kernel_has() {
        let mut btf = BtfBuilder::new();
        let char_ = btf.int("char", 1);
        let string = btf.pointer(char_);
        btf.tracepoint("mark_victim", &[("comm", string)]);
        let btf = KernelBtf::from_bytes(btf.build()).expect("well-formed");
        let why = choose(Feature::OomKills, &btf, &all_members()).expect_err("neither form").to_string();
        assert!(
            why.contains("mark_victim takes (pointer) where mark_victim reads argument 0 as struct task_struct *"),
            "{why}"
        );
        assert!(why.contains("mark_victim_pid reads argument 0 as an integer"), "{why}");
        let why = choose(Feature::Signals, &btf, &all_members()).expect_err("no signal_generate").to_string();
        assert_eq!(why, "kernel has no tracepoint signal_generate");
    }

    #[test]
    fn a_member_missing_from_btf_turns_off_only_the_features_that_read_it() {
        let btf = KernelBtf::from_bytes(btf_fixture::kernel(false)).expect("well-formed");
        let mut offsets = all_members();
        offsets.missing.push((Member::SockCgroup, Arc::new(LayoutError::NoStruct("sock_cgroup_data"))));
        let why = choose(Feature::TcpAccepts, &btf, &offsets).expect_err("reads the socket's cgroup").to_string();
        assert!(why.contains("sys_exit_accept4 reads sock_cgroup, not in this kernel"), "{why}");
        assert!(choose(Feature::OomKills, &btf, &offsets).is_ok(), "OOM kills read no socket");
    }

    #[test]
    fn every_offset_is_read_by_some_program_and_every_program_is_in_a_feature() {
        let programs: Vec<&Program> =
            Feature::ALL.iter().flat_map(|&f| variants(f).iter().flat_map(|set| set.iter())).collect();
        for member in Member::ALL {
            assert!(
                programs.iter().any(|p| p.members.contains(member)),
                "{} is computed but no program reads it",
                member.field()
            );
        }
        let mut names: Vec<&str> = programs.iter().map(|p| p.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a program belongs to one feature set only");
    }
}
