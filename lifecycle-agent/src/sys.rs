//! The system calls no well-kept crate wraps, each made here once, safe to call, with errors that
//! name the call. Everything else the agent asks the kernel goes through `rustix` (already in the
//! tree through procfs), aya (BPF programs and maps) or std.
//!
//! What is here and why: `syslog(2)`'s read of the kernel log (rustix has no `klogctl`),
//! glibc's allocator controls (`mallopt`, `malloc_trim`: glibc's, not the kernel's),
//! `adjtimex(2)` in read-only mode, the `TCP_DEFER_ACCEPT` socket option (not among rustix's
//! typed options), `SO_PEERCRED` read as the kernel gives it (rustix's typed answer cannot hold
//! the pid 0 of a peer in a pid namespace this process cannot see), the BPF map batch lookup
//! (aya has no batch read) and a program's run statistics by its fd (aya 0.14 reads them only
//! through the `Ebpf` that owns the program, or by walking every program on the node:
//! `loaded_programs`, three system calls per program at every scrape on a node whose CNI loads
//! dozens).

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd},
};

/// A failed system call: which one, and the kernel's error.
#[derive(Debug, thiserror::Error)]
#[error("{call}")]
pub(crate) struct SysError {
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SysError {
    fn last(call: &'static str) -> Self {
        Self { call, source: io::Error::last_os_error() }
    }

    /// The kernel's error number.
    pub(crate) fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// `SYSLOG_ACTION_READ_ALL`: copies the last `len` bytes of the log, leaving it as it is.
const SYSLOG_READ_ALL: libc::c_int = 3;
/// `SYSLOG_ACTION_SIZE_BUFFER`: the log's size; a harmless way to ask whether reading is allowed.
const SYSLOG_SIZE_BUFFER: libc::c_int = 10;

/// The size of the kernel log's buffer: succeeds only when this process may read the log.
pub(crate) fn kernel_log_size() -> Result<usize, SysError> {
    // SAFETY: SIZE_BUFFER takes no buffer (null, 0) and only returns a number.
    let size = unsafe { libc::klogctl(SYSLOG_SIZE_BUFFER, std::ptr::null_mut(), 0) };
    usize::try_from(size).map_err(|_| SysError::last("syslog(SIZE_BUFFER)"))
}

/// Copies the tail of the kernel log into `buffer` (without consuming it); returns the bytes
/// written.
pub(crate) fn read_kernel_log_tail(buffer: &mut [u8]) -> Result<usize, SysError> {
    let len = libc::c_int::try_from(buffer.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: the buffer is valid for `len` writable bytes, and the length says so.
    let read = unsafe { libc::klogctl(SYSLOG_READ_ALL, buffer.as_mut_ptr().cast(), len) };
    let read = usize::try_from(read).map_err(|_| SysError::last("syslog(READ_ALL)"))?;
    Ok(read.min(buffer.len()))
}

/// Pins glibc's mmap and trim thresholds at `bytes` (see `kernel::pin_malloc_thresholds` for
/// why); a no-op on other C libraries.
pub(crate) fn pin_malloc_thresholds(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's tuning parameters; it has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
        libc::mallopt(libc::M_TRIM_THRESHOLD, bytes);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// Lets glibc's allocator keep at most `arenas` heaps (its default: one per thread, up to eight
/// per core); a no-op on other C libraries.
pub(crate) fn limit_malloc_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's tuning parameters; it has no preconditions.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Returns every whole free page of glibc's heap to the kernel; a no-op on other C libraries.
pub(crate) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas (taking their locks); no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The kernel's clock discipline, read with `adjtimex(2)` in read-only mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClockDiscipline {
    /// `TIME_ERROR` returned, or `STA_UNSYNC` set: the clock is not synchronised.
    pub unsynchronised: bool,
    /// The kernel's maximum error estimate, in microseconds.
    pub max_error_us: i64,
}

/// Reads the clock's synchronisation state (modes 0: changes nothing).
pub(crate) fn clock_discipline() -> Result<ClockDiscipline, SysError> {
    // SAFETY: an all-zero timex is a valid argument; modes 0 only reads the kernel's state.
    let mut timex: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: adjtimex reads and writes one timex through a valid pointer; modes 0 changes nothing.
    let state = unsafe { libc::adjtimex(&mut timex) };
    if state < 0 {
        return Err(SysError::last("adjtimex"));
    }
    Ok(ClockDiscipline {
        unsynchronised: state == libc::TIME_ERROR || timex.status & libc::STA_UNSYNC != 0,
        max_error_us: timex.maxerror as i64,
    })
}

/// `TCP_DEFER_ACCEPT`: a connection is handed to `accept` only once data arrived (or after
/// `seconds`), so a client that connects and sends nothing costs no wake-up.
pub(crate) fn set_tcp_defer_accept(socket: impl AsFd, seconds: i32) -> Result<(), SysError> {
    let seconds: libc::c_int = seconds;
    // SAFETY: setsockopt on a live socket, with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(SysError::last("setsockopt(TCP_DEFER_ACCEPT)"));
    }
    Ok(())
}

/// A Unix socket peer's credentials as the kernel gives them (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerCredentials {
    /// In this process's pid namespace; 0 when the peer's is not below it.
    pub pid: i32,
    /// In this process's user namespace (the overflow uid when not mapped).
    pub uid: u32,
}

/// `getsockopt(SO_PEERCRED)` of a connected Unix socket.
pub(crate) fn peer_credentials(socket: impl AsFd) -> Result<PeerCredentials, SysError> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt on a live socket, with a pointer to a live ucred and its size.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(SysError::last("getsockopt(SO_PEERCRED)"));
    }
    Ok(PeerCredentials { pid: cred.pid, uid: cred.uid })
}

/// `bpf(BPF_MAP_LOOKUP_BATCH, attr)`.
///
/// # Safety
/// `attr` must be a `bpf_attr` for `BPF_MAP_LOOKUP_BATCH` whose pointers name buffers that stay
/// valid for the call and are as large as its `count` entries of the map's key and value sizes.
pub(crate) unsafe fn bpf_map_lookup_batch<A>(attr: &mut A) -> Result<(), SysError> {
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    // SAFETY: the caller guarantees attr's contents; its size is passed alongside.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, attr as *mut A, std::mem::size_of::<A>()) };
    if rc < 0 {
        return Err(SysError::last("bpf(BPF_MAP_LOOKUP_BATCH)"));
    }
    Ok(())
}

/// What `bpf_prog_info` says of a program's cost since `BPF_ENABLE_STATS` was first held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProgramRunStats {
    /// Nanoseconds spent in the program, summed over every run.
    pub(crate) run_time_ns: u64,
    /// Runs counted.
    pub(crate) run_count: u64,
}

/// `struct bpf_prog_info` up to `run_cnt`, the fields the statistics need (the kernel fills what
/// fits the size given and zeroes nothing beyond it; layout from `include/uapi/linux/bpf.h`,
/// unchanged since 5.1 for these offsets).
#[repr(C)]
struct ProgInfoHead {
    before_run_time: [u8; 192],
    run_time_ns: u64,
    run_cnt: u64,
}

/// The `info` member of `union bpf_attr`.
#[repr(C)]
struct ObjInfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `bpf(BPF_OBJ_GET_INFO_BY_FD)` for the run statistics of the program behind `program`.
pub(crate) fn bpf_prog_run_stats(program: BorrowedFd<'_>) -> Result<ProgramRunStats, SysError> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let mut info = ProgInfoHead { before_run_time: [0; 192], run_time_ns: 0, run_cnt: 0 };
    let mut attr = ObjInfoAttr {
        bpf_fd: program.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoHead>() as u32,
        info: std::ptr::addr_of_mut!(info) as u64,
    };
    // SAFETY: `attr` points at `info`, which lives for the call and is `info_len` bytes long;
    // the kernel writes at most that many.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            std::ptr::addr_of_mut!(attr),
            std::mem::size_of::<ObjInfoAttr>(),
        )
    };
    if rc < 0 {
        return Err(SysError::last("bpf(BPF_OBJ_GET_INFO_BY_FD)"));
    }
    Ok(ProgramRunStats { run_time_ns: info.run_time_ns, run_count: info.run_cnt })
}
