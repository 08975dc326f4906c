//! The cgroup v2 filesystem: where it is mounted, and ids <-> paths.
//!
//! A cgroup's v2 id, as `bpf_get_current_cgroup_id()` reports it, is the inode number of its
//! directory. Hosts mount v2 either at /sys/fs/cgroup (unified, every production node) or at
//! /sys/fs/cgroup/unified beside the v1 controllers (hybrid); both are found from mountinfo.

use std::{
    collections::HashMap,
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// Problems with the cgroup filesystem.
#[derive(Debug, thiserror::Error)]
pub enum CgroupFsError {
    /// No cgroup2 mount in /proc/self/mountinfo.
    #[error("no cgroup v2 hierarchy is mounted (looked for fstype cgroup2 in /proc/self/mountinfo)")]
    NoV2Mount,
    /// mountinfo could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A path given by the user is not a cgroup directory under the v2 mount.
    #[error("{path} is not a cgroup directory under {root}")]
    NotACgroup { path: PathBuf, root: PathBuf },
}

/// The v2 hierarchy's mount point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRoot {
    mount: PathBuf,
}

impl CgroupRoot {
    /// Finds the v2 mount of this host.
    pub fn detect() -> Result<Self, CgroupFsError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let text = std::fs::read_to_string(&path).map_err(|source| CgroupFsError::Read { path, source })?;
        Self::from_mountinfo(&text).ok_or(CgroupFsError::NoV2Mount)
    }

    /// Picks the cgroup2 mount from mountinfo text; the shortest path wins if several exist
    /// (containers sometimes see extra bind mounts of sub-trees).
    pub(crate) fn from_mountinfo(text: &str) -> Option<Self> {
        text.lines()
            .filter_map(|line| {
                // Fields: id parent major:minor root mountpoint options [optional...] - fstype ...
                let (left, right) = line.split_once(" - ")?;
                let fstype = right.split_whitespace().next()?;
                let root = left.split_whitespace().nth(3)?;
                let mountpoint = left.split_whitespace().nth(4)?;
                (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(unescape(mountpoint)))
            })
            .min_by_key(|p| p.as_os_str().len())
            .map(|mount| Self { mount })
    }

    /// A root at a known mount point.
    #[cfg(test)]
    pub(crate) fn at(mount: impl Into<PathBuf>) -> Self {
        Self { mount: mount.into() }
    }

    /// The mount point.
    pub(crate) fn mount(&self) -> &Path {
        &self.mount
    }

    /// The directory of a cgroup path as the kernel spells it (`/a/b`).
    pub fn dir_of(&self, cgroup_path: &str) -> PathBuf {
        self.mount.join(cgroup_path.trim_start_matches('/'))
    }

    /// The v2 id of a cgroup: a directory under the mount, or a cgroup path as the kernel and
    /// `/proc/<pid>/cgroup` spell it (`/kubepods/...`, relative to the mount).
    pub fn id_of(&self, path: &Path) -> Result<u64, CgroupFsError> {
        let dir = if path.starts_with(&self.mount) { path.to_owned() } else { self.dir_of(&path.to_string_lossy()) };
        let meta = std::fs::metadata(&dir)
            .map_err(|_| CgroupFsError::NotACgroup { path: path.to_owned(), root: self.mount.clone() })?;
        if !meta.is_dir() || !dir.starts_with(&self.mount) {
            return Err(CgroupFsError::NotACgroup { path: path.to_owned(), root: self.mount.clone() });
        }
        Ok(meta.ino())
    }

    /// Every cgroup now present: id -> path (`/`-rooted, as the kernel prints it). Used once at
    /// start; afterwards mkdir/rmdir events keep the map current without rescanning.
    pub(crate) fn scan(&self) -> HashMap<u64, String> {
        let mut out = HashMap::new();
        let mut stack = vec![self.mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else { continue };
            let relative = dir.strip_prefix(&self.mount).unwrap_or(Path::new(""));
            out.insert(meta.ino(), format!("/{}", relative.display()));
            // Cgroups vanish while we walk; a directory that cannot be read is simply skipped.
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        out
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.clone().take(3).collect();
            if digits.len() == 3 {
                if let Ok(value) = u8::from_str_radix(&digits, 8) {
                    out.push(value as char);
                    for _ in 0..3 {
                        chars.next();
                    }
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";
    const UNIFIED: &str = "\
25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw
90 25 0:22 /kubepods /var/lib/x/cg rw - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_v2_mount_in_hybrid_and_unified_layouts() {
        assert_eq!(CgroupRoot::from_mountinfo(HYBRID), Some(CgroupRoot::at("/sys/fs/cgroup/unified")));
        // A bind mount of a sub-tree (root field not "/") is not the hierarchy's root.
        assert_eq!(CgroupRoot::from_mountinfo(UNIFIED), Some(CgroupRoot::at("/sys/fs/cgroup")));
        assert_eq!(CgroupRoot::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/vda rw"), None);
    }

    #[test]
    fn escaped_mount_points_are_unescaped() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\04"), r"/odd\04");
    }

    #[test]
    fn paths_map_to_directories_under_the_mount() {
        let root = CgroupRoot::at("/sys/fs/cgroup/unified");
        assert_eq!(root.dir_of("/kubepods/pod1"), PathBuf::from("/sys/fs/cgroup/unified/kubepods/pod1"));
        assert_eq!(root.dir_of("/"), PathBuf::from("/sys/fs/cgroup/unified/"));
    }

    #[test]
    fn ids_are_directory_inodes_and_non_cgroups_are_refused() {
        let dir = std::env::temp_dir();
        let root = CgroupRoot::at(&dir);
        let expected = std::fs::metadata(&dir).expect("tmp").ino();
        assert_eq!(root.id_of(&dir).expect("dir id"), expected);
        let name = dir.file_name().expect("name").to_string_lossy().into_owned();
        let parent = CgroupRoot::at(dir.parent().expect("parent"));
        assert_eq!(parent.id_of(Path::new(&format!("/{name}"))).expect("kernel-style path"), expected);
        let outside = root.id_of(Path::new("/etc/hostname")).expect_err("outside the cgroup mount");
        assert!(outside.to_string().contains("is not a cgroup directory"), "{outside}");
    }
}
