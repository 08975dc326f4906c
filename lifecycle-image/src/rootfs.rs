//! A minimal root filesystem for one dynamically linked program: the binary, the shared
//! libraries and the dynamic loader `ldd` names for it (at the same paths, so the loader finds
//! them without a cache), root's passwd and group entries, and the usual mount points. No shell
//! and no tools: nothing else runs in the agent's container.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// Failures building a root filesystem.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A directory or file of the tree could not be created, copied or changed.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `ldd` could not be started.
    #[error("cannot run ldd")]
    Spawn(#[source] std::io::Error),
    /// `ldd` refused the binary (not dynamic, or built for another architecture).
    #[error("ldd {}: {stderr}", binary.display())]
    Ldd { binary: PathBuf, stderr: String },
    /// `ldd` found no file for a library the binary needs.
    #[error("{} needs {library}, which ldd does not find on this machine", binary.display())]
    Missing { binary: PathBuf, library: String },
    /// `ldd` listed no library at all: the loader is always listed for a dynamic binary.
    #[error("ldd lists no libraries for {} (a static binary needs none, but this packer expects the loader)", binary.display())]
    NoLibraries { binary: PathBuf },
}

type Result<T> = std::result::Result<T, RootfsError>;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io { what, path: path.to_owned(), source }
}

/// Mount points and the directories a process expects; `tmp` is world-writable and sticky.
const DIRECTORIES: &[(&str, u32)] =
    &[("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("run", 0o755), ("sys", 0o555), ("tmp", 0o1777)];

/// Builds in `rootfs` (emptied first) a tree holding `binary` at `at` (absolute) and its shared
/// libraries. Returns the libraries copied, as `ldd` named them.
pub fn for_binary(rootfs: &Path, binary: &Path, at: &str) -> Result<Vec<PathBuf>> {
    if rootfs.exists() {
        fs::remove_dir_all(rootfs).map_err(io("remove", rootfs))?;
    }
    for (dir, mode) in DIRECTORIES {
        let path = rootfs.join(dir);
        fs::create_dir_all(&path).map_err(io("create", &path))?;
        set_mode(&path, *mode)?;
    }
    // Names for uid and gid 0, for whatever resolves them (ps in a debug session, logs).
    for (file, text) in [("etc/passwd", "root:x:0:0:root:/:/sbin/nologin\n"), ("etc/group", "root:x:0:\n")] {
        let path = rootfs.join(file);
        fs::write(&path, text).map_err(io("write", &path))?;
        set_mode(&path, 0o644)?;
    }
    install(binary, &rootfs.join(at.trim_start_matches('/')), 0o755)?;
    let libraries = shared_libraries(binary)?;
    for library in &libraries {
        // fs::copy follows symlinks: the file lands under the name the loader asks for.
        install(library, &rootfs.join(library.strip_prefix("/").unwrap_or(library)), 0o755)?;
    }
    Ok(libraries)
}

/// Copies `from` to `to` (parents created, 0755) with mode `mode`.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    fs::copy(from, to).map_err(io("copy", from))?;
    set_mode(to, mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io("chmod", path))
}

/// The absolute paths `ldd` prints for `binary`: each `name => /path (addr)` and the loader's
/// `/path (addr)` line (the vDSO has no path). `ldd` runs the host's loader, so this works for
/// binaries of the host's architecture only.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd").arg(binary).env("LC_ALL", "C").output().map_err(RootfsError::Spawn)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        return Err(RootfsError::Ldd { binary: binary.to_owned(), stderr });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    if let Some(line) = text.lines().find(|l| l.contains("=> not found")) {
        let library = line.split("=>").next().unwrap_or_default().trim().to_owned();
        return Err(RootfsError::Missing { binary: binary.to_owned(), library });
    }
    let libraries = parse_ldd(&text);
    if libraries.is_empty() {
        return Err(RootfsError::NoLibraries { binary: binary.to_owned() });
    }
    Ok(libraries)
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    let mut libraries: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| {
            let path = line.split_once("=>").map_or(line, |(_, path)| path).split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    libraries.sort();
    libraries.dedup();
    libraries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_library_and_loader_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n\
                    \tlibmissing.so => not found\n";
        assert_eq!(
            parse_ldd(text),
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib64/ld-linux-x86-64.so.2"]
                .map(PathBuf::from)
        );
    }
}
