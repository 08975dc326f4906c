//! An exclusive flock(2) on a file: one build of a cached tool at a time per machine (the
//! Kubernetes builds), whichever xtask asks first.

use std::{fs, os::unix::io::AsRawFd as _, path::Path};

use anyhow::{Context as _, Result};

/// Held until dropped (or the process dies: the kernel releases it with the file).
pub struct Lock {
    _file: fs::File,
}

impl Lock {
    /// Waits for and takes the lock on `path` (created if missing).
    pub fn acquire(path: &Path) -> Result<Self> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", path.display()));
        }
        Ok(Self { _file: file })
    }
}
