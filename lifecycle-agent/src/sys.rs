//! The system calls no well-kept crate wraps, each made here once, safe to call, with errors that
//! name the call. Everything else the agent asks the kernel goes through `rustix` (already in the
//! tree through procfs), aya (BPF programs and maps) or std.
//!
//! What is here and why: `syslog(2)`'s read of the kernel log (rustix has no `klogctl`),
//! glibc's allocator controls (`mallopt`, `malloc_trim`: glibc's, not the kernel's),
//! `adjtimex(2)` in read-only mode, the `TCP_DEFER_ACCEPT` socket option (not among rustix's
//! typed options) and the BPF map batch lookup (aya has no batch read).

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _},
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
