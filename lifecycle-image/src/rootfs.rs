//! A minimal root filesystem for one dynamically linked program: the binary, the shared
//! libraries it needs and its dynamic loader, root's passwd and group entries, and the usual
//! mount points. No shell and no tools: nothing else runs in the agent's container.
//!
//! The libraries are found by reading the ELF files themselves (the loader from `PT_INTERP`, the
//! libraries from each file's `DT_NEEDED`, recursively), not by running `ldd`: `ldd` runs this
//! machine's loader, so it can list only this machine's architecture's binaries, and an arm64
//! image built on an amd64 machine needs its libraries from a cross sysroot (Debian's
//! `/usr/aarch64-linux-gnu`, from `libc6-dev-arm64-cross`). They land where the target's loader
//! looks without a cache: its multiarch directory (`/lib/aarch64-linux-gnu`), and the loader at
//! the path the binary names.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use object::{
    elf,
    read::elf::{ElfFile64, ProgramHeader as _},
    Endianness,
};

use crate::layout::Arch;

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
    /// A file is not a 64-bit little-endian ELF file this packer can read.
    #[error("{} is not an ELF file this packer reads: {why}", path.display())]
    Elf { path: PathBuf, why: String },
    /// The binary names no loader: a static binary, which this packer does not expect.
    #[error("{} names no dynamic loader (PT_INTERP): this packer expects a dynamically linked binary", path.display())]
    NoLoader { path: PathBuf },
    /// A library a file needs is in none of the places searched.
    #[error("{} needs {library}, which is in none of {}", needed_by.display(), searched.join(", "))]
    Missing { needed_by: PathBuf, library: String, searched: Vec<String> },
}

type Result<T> = std::result::Result<T, RootfsError>;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io { what, path: path.to_owned(), source }
}

/// Mount points and the directories a process expects; `tmp` is world-writable and sticky.
const DIRECTORIES: &[(&str, u32)] =
    &[("dev", 0o755), ("etc", 0o755), ("proc", 0o555), ("run", 0o755), ("sys", 0o555), ("tmp", 0o1777)];

/// Builds in `rootfs` (emptied first) a tree holding `binary` (of architecture `arch`) at `at`
/// (absolute) and its shared libraries. Returns the libraries copied: where each came from and
/// where it is in the tree.
pub fn for_binary(rootfs: &Path, binary: &Path, arch: Arch, at: &str) -> Result<Vec<Library>> {
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
    let libraries = shared_libraries(binary, arch)?;
    for library in &libraries {
        // fs::copy follows symlinks: the file lands under the name the loader asks for.
        install(&library.from, &rootfs.join(library.at.strip_prefix("/").unwrap_or(&library.at)), 0o755)?;
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

/// A file the binary needs at run time: the loader or a shared library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// Where it is on this machine.
    pub from: PathBuf,
    /// Where it goes in the image (absolute).
    pub at: PathBuf,
}

/// Where `arch`'s libraries are on this machine, in search order, and the image directory they
/// go to: this machine's own for its architecture (at the same paths), a cross sysroot's for
/// another, placed in the target's multiarch directory.
fn library_dirs(arch: Arch) -> (Vec<PathBuf>, Option<PathBuf>) {
    let triplet = format!("{}-linux-gnu", arch.rust_name());
    if Arch::host() == Some(arch) {
        let dirs = [
            format!("/lib/{triplet}"),
            format!("/usr/lib/{triplet}"),
            "/lib64".into(),
            "/lib".into(),
            "/usr/lib".into(),
        ];
        (dirs.into_iter().map(PathBuf::from).collect(), None)
    } else {
        // Debian's cross C library (libc6-<arch>-cross), or the architecture's own packages
        // installed multiarch (libc6:<arch>).
        let dirs = [format!("/usr/{triplet}/lib"), format!("/usr/lib/{triplet}"), format!("/lib/{triplet}")];
        (dirs.into_iter().map(PathBuf::from).collect(), Some(PathBuf::from(format!("/lib/{triplet}"))))
    }
}

/// What an ELF file says it needs: its loader (`PT_INTERP`, executables only) and the sonames in
/// its `DT_NEEDED` entries.
fn needs(path: &Path) -> Result<(Option<String>, Vec<String>)> {
    let elf_error = |why: String| RootfsError::Elf { path: path.to_owned(), why };
    let data = fs::read(path).map_err(io("read", path))?;
    let file = ElfFile64::<Endianness>::parse(&*data).map_err(|err| elf_error(err.to_string()))?;
    let endian = file.endian();
    let mut loader = None;
    for header in file.elf_program_headers() {
        if let Some(interp) = header.interpreter(endian, &*data).map_err(|err| elf_error(err.to_string()))? {
            loader = Some(String::from_utf8_lossy(interp).into_owned());
        }
    }
    let table = file.elf_dynamic_table().map_err(|err| elf_error(err.to_string()))?;
    let mut needed = Vec::new();
    for entry in &table {
        if entry.tag == elf::DT_NEEDED {
            let name = table.string(entry).map_err(|err| elf_error(err.to_string()))?;
            needed.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok((loader, needed))
}

/// The loader and every shared library `binary` (of architecture `arch`) needs, recursively,
/// sorted by their place in the image.
pub fn shared_libraries(binary: &Path, arch: Arch) -> Result<Vec<Library>> {
    let (dirs, image_dir) = library_dirs(arch);
    let (loader, mut pending) = needs(binary)?;
    let loader = loader.ok_or_else(|| RootfsError::NoLoader { path: binary.to_owned() })?;
    let loader_name = Path::new(&loader).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut found: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    // The loader: at the path the binary names; on this machine there, or in a sysroot's
    // directories for another architecture.
    let loader_from = if image_dir.is_none() {
        PathBuf::from(&loader)
    } else {
        dirs.iter()
            .map(|dir| dir.join(&loader_name))
            .find(|path| path.exists())
            .unwrap_or_else(|| PathBuf::from(&loader))
    };
    if !loader_from.exists() {
        return Err(RootfsError::Missing {
            needed_by: binary.to_owned(),
            library: loader,
            searched: dirs.iter().map(|d| d.display().to_string()).collect(),
        });
    }
    found.insert(PathBuf::from(&loader), loader_from);
    let mut needed_by: Vec<PathBuf> = vec![binary.to_owned(); pending.len()];
    let mut seen: Vec<String> = Vec::new();
    while let Some(name) = pending.pop() {
        let parent = needed_by.pop().unwrap_or_else(|| binary.to_owned());
        // The loader satisfies its own soname (libc names it); it is already in place.
        if name == loader_name || seen.contains(&name) {
            continue;
        }
        seen.push(name.clone());
        let Some((dir, from)) = dirs.iter().map(|dir| (dir, dir.join(&name))).find(|(_, path)| path.exists()) else {
            return Err(RootfsError::Missing {
                needed_by: parent,
                library: name,
                searched: dirs.iter().map(|d| d.display().to_string()).collect(),
            });
        };
        let at = image_dir.as_deref().unwrap_or(dir).join(&name);
        let (_, more) = needs(&from)?;
        needed_by.extend(std::iter::repeat_n(from.clone(), more.len()));
        pending.extend(more);
        found.insert(at, from);
    }
    Ok(found.into_iter().map(|(at, from)| Library { from, at }).collect())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// The absolute paths `ldd` prints for `binary` (the loader's own line included).
    fn ldd(binary: &Path) -> Vec<PathBuf> {
        let output = Command::new("ldd").arg(binary).env("LC_ALL", "C").output().expect("ldd");
        let mut paths: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let path = line.split_once("=>").map_or(line, |(_, path)| path).split_whitespace().next()?;
                path.starts_with('/').then(|| PathBuf::from(path))
            })
            .collect();
        paths.sort();
        paths
    }

    #[test]
    fn a_binarys_libraries_read_from_its_elf_are_the_ones_its_loader_loads() {
        let me = std::env::current_exe().expect("current exe");
        let arch = Arch::host().expect("an image architecture");
        let libraries = shared_libraries(&me, arch).expect("libraries");
        let mut placed: Vec<PathBuf> = libraries.iter().map(|l| l.at.clone()).collect();
        placed.sort();
        // ldd (this machine's loader) resolves the same files at the same paths.
        let resolved: Vec<PathBuf> = ldd(&me).into_iter().map(|p| fs::canonicalize(&p).unwrap_or(p)).collect();
        let ours: Vec<PathBuf> = libraries.iter().map(|l| fs::canonicalize(&l.from).expect("exists")).collect();
        let (mut resolved, mut ours) = (resolved, ours);
        resolved.sort();
        ours.sort();
        assert_eq!(ours, resolved);
        assert_eq!(placed, ldd(&me), "each at the path the loader looks");
    }

    #[test]
    fn a_file_that_is_not_elf_is_named() {
        let dir = std::env::temp_dir().join(format!("lifecycle-image-elf-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        let script = dir.join("script");
        fs::write(&script, "#!/bin/sh\n").expect("write");
        let arch = Arch::host().expect("an image architecture");
        assert!(matches!(shared_libraries(&script, arch), Err(RootfsError::Elf { .. })));
        let _ = fs::remove_dir_all(&dir);
    }
}
