//! Network namespaces: where a pod's listeners and sockets live, and the one way the agent does
//! work inside one.
//!
//! `setns(2)` changes the calling thread only, so work for another namespace runs on a short-lived
//! thread that enters it, does one thing (bind a listener, open a netlink socket) and ends. The
//! file descriptors it creates stay bound to that namespace after the thread is gone, and no other
//! code of the agent ever runs inside a pod's namespace.

use std::{
    fs::File,
    io,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// Why work in a network namespace could not be done.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened (the process is gone, or no such file).
    #[error("cannot open network namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// setns(CLONE_NEWNET) was refused (needs CAP_SYS_ADMIN) or the file is not a netns.
    #[error("cannot enter network namespace {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The thread could not be started, or it panicked.
    #[error("the thread working in network namespace {path} failed")]
    Thread { path: PathBuf },
}

/// The network namespace of process `pid`.
pub(crate) fn of_pid(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// The agent's own network namespace (the node's, with hostNetwork).
pub(crate) fn own() -> PathBuf {
    PathBuf::from("/proc/self/ns/net")
}

/// Inode of a network namespace (what the kernel events call `netns`; net_ns inodes are 32-bit).
pub(crate) fn inode(netns: &Path) -> io::Result<u32> {
    std::fs::metadata(netns).map(|m| m.ino() as u32)
}

/// Runs `work` on a new thread inside the network namespace at `netns` and returns its result.
/// `name` names the thread (it shows up in `ps -T` while it runs).
pub(crate) fn run_in<T, E>(
    netns: &Path,
    name: &str,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<Result<T, E>, NetnsError>
where
    T: Send + 'static,
    E: Send + 'static,
{
    let path = netns.to_path_buf();
    let file = File::open(&path).map_err(|source| NetnsError::Open { path: path.clone(), source })?;
    let entered = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // setns changes only this thread's netns, and this thread ends right after `work`,
            // so no other code ever runs in that namespace.
            use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
            move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))?;
            Ok(work())
        })
        .map_err(|_| NetnsError::Thread { path: path.clone() })?
        .join()
        .map_err(|_| NetnsError::Thread { path: path.clone() })?;
    entered.map_err(|source| NetnsError::Enter { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_file_is_named() {
        let err = run_in(Path::new("/nonexistent/ns/net"), "test-netns", || Ok::<_, ()>(())).expect_err("no file");
        assert!(matches!(err, NetnsError::Open { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/ns/net"));
    }

    #[test]
    fn own_namespace_has_an_inode() {
        assert!(inode(&own()).expect("own netns") > 0);
        assert_eq!(inode(&own()).ok(), inode(&of_pid(std::process::id())).ok());
    }
}
