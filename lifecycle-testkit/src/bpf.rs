//! The machine's loaded BPF programs, as the kernel lists them: tests that run the agent in a pod
//! take the ids before and while it runs, and check that its programs are gone after it (the
//! agent pins nothing: they go with its file descriptors).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

/// The ids of the BPF programs loaded on the machine (`BPF_PROG_GET_NEXT_ID`), or `None` when the
/// kernel refuses to list them (no CAP_SYS_ADMIN, a seccomp filter).
pub fn program_ids() -> Option<BTreeSet<u32>> {
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    #[repr(C)]
    struct NextId {
        start_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut ids = BTreeSet::new();
    let mut attr = NextId { start_id: 0, next_id: 0, open_flags: 0 };
    loop {
        // SAFETY: bpf(2) reads and writes `attr`, a live value of the size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                &mut attr as *mut NextId,
                std::mem::size_of::<NextId>() as libc::c_uint,
            )
        };
        if rc != 0 {
            // ENOENT ends the list; anything else means the kernel does not let us list.
            let errno = std::io::Error::last_os_error().raw_os_error();
            return (errno == Some(libc::ENOENT)).then_some(ids);
        }
        ids.insert(attr.next_id);
        attr.start_id = attr.next_id;
    }
}

/// Waits until none of `ids` is loaded any more; returns how long that took, or the ids still
/// loaded after `within`. A program goes when the last file descriptor or link holding it
/// closes, which the kernel finishes shortly after the process's exit.
pub fn wait_programs_gone(ids: &BTreeSet<u32>, within: Duration) -> Result<Duration, Vec<u32>> {
    let began = Instant::now();
    loop {
        let left: Vec<u32> = program_ids().unwrap_or_default().intersection(ids).copied().collect();
        if left.is_empty() {
            return Ok(began.elapsed());
        }
        if began.elapsed() > within {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
