//! The matrix guests' root filesystems, as disk images of one ext4 partition made with
//! `mkfs.ext4 -d` (no mount, no loop device) and booted with `snapshot=on`, so they stay as
//! built:
//! - amd64: Debian bookworm from `debootstrap` (its systemd 252 still runs hybrid and v1-only
//!   cgroups; trixie's does not) with systemd as PID 1, containerd, runc and python3, plus every
//!   amd64 kernel's modules (depmod'ed, so `modprobe overlay` works) and the unit that runs the
//!   payload's check at boot and powers off;
//! - arm64: busybox and the agent's libraries unpacked with `dpkg -x` (no foreign debootstrap),
//!   with a `/sbin/init` script that runs the payload's check and powers off.
//!
//! The debootstrap tree is cached under `<cache>/rootfs/<key>`, the images under
//! `<cache>/images/<arch>-<key>.img`; each key is a digest of what it was made from (suite,
//! packages, the files below, the kernels' releases), so a changed input makes a new one and
//! the old one is removed.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::kernels::Kernel;
use crate::{debian::Deb, shell::run};

/// The amd64 guest's Debian release.
const SUITE: &str = "bookworm";
/// What debootstrap adds to its minimal base: systemd as init, containerd and runc, what the
/// check script runs (python3, ip, ps, kill, modprobe).
const PACKAGES: &[&str] =
    &["systemd", "systemd-sysv", "udev", "kmod", "dbus", "containerd", "runc", "python3", "iproute2", "procps"];
/// The arm64 guest's packages (bookworm's, as the cross-linked agent's glibc is).
pub const ARM64_PACKAGES: &[&str] = &["busybox-static", "libc6", "libgcc-s1"];
/// Room left in the amd64 image for what the guest writes (containerd's image, logs), which goes
/// to qemu's temporary overlay anyway; the file is sparse.
const AMD64_IMAGE_MIB: u64 = 3 << 10;
const ARM64_IMAGE_MIB: u64 = 256;

/// The root images are disks with one partition (an MBR with this signature), so the kernel
/// finds its root by PARTUUID without an initramfs: NVMe names its namespaces in the order their
/// scans finish, so `/dev/nvme0n1` is the root on some boots and the payload on others.
const DISK_SIGNATURE: u32 = 0x4c49_4643;
/// Where the partition starts (1 MiB, as partitioning tools align it).
const PARTITION_OFFSET: u64 = 1 << 20;
/// The kernel's `root=` for these images.
pub fn root_argument() -> String {
    format!("root=PARTUUID={DISK_SIGNATURE:08x}-01")
}
/// The root as the kernel found it, and the payload disk by its label (lifecycle-testkit's
/// `vm::Payload` makes it so).
const FSTAB: &str = "/dev/root / ext4 rw 0 1\nLABEL=payload /payload ext4 rw,nofail 0 0\n";
/// Runs the payload's check once the system is up, then powers off whatever it did.
const CHECK_UNIT: &str = "\
[Unit]
Description=lifecycle kernel matrix: the check on the payload disk
After=basic.target containerd.service
RequiresMountsFor=/payload

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /payload/check.py
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
ExecStopPost=/usr/bin/systemctl --no-block poweroff

[Install]
WantedBy=multi-user.target
";
/// containerd with runc's systemd cgroup driver, as a kubelet with the systemd driver wants it.
const CONTAINERD_CONFIG: &str = "\
version = 2

[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]
  runtime_type = \"io.containerd.runc.v2\"

[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]
  SystemdCgroup = true
";
/// containerd's snapshotter needs overlayfs, a module in Debian's kernels.
const MODULES_LOAD: &str = "overlay\n";
/// Where the arm64 guest's PID 1 is: where the kernel looks first, so no `init=` is needed.
const ARM64_INIT_PATH: &str = "sbin/init";
/// The arm64 guest's PID 1.
const ARM64_INIT: &str = "\
#!/bin/busybox sh
# lifecycle kernel matrix: PID 1 of the arm64 guest. Runs the payload's check, then powers off.
bb=/bin/busybox
$bb mount -t proc proc /proc
$bb mount -t sysfs sysfs /sys
$bb mount -t devtmpfs devtmpfs /dev
$bb mount -t tmpfs tmpfs /tmp
$bb mount -t ext4 \"$($bb findfs LABEL=payload)\" /payload && $bb sh /payload/check.sh
$bb sync
$bb umount /payload
$bb poweroff -f
";

/// The first 12 hex digits of the SHA-256 of `parts`, each ended by a NUL.
fn digest(parts: &[&str]) -> String {
    let mut hash = hmac_sha256::Hash::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update(b"\0");
    }
    hash.finalize().iter().take(6).map(|byte| format!("{byte:02x}")).collect()
}

/// The debootstrap tree (made once per key).
pub fn debootstrap_tree(cache: &Path, mirror: &dyn Fn() -> Result<String>) -> Result<PathBuf> {
    let key = digest(&[SUITE, &PACKAGES.join(",")]);
    let dir = cache.join("rootfs").join(format!("{SUITE}-{key}"));
    let tree = dir.join("tree");
    if dir.join("DONE").is_file() {
        return Ok(tree);
    }
    remove_siblings(&cache.join("rootfs"), &dir)?;
    let fresh = dir.join("tree.new");
    if fresh.exists() {
        fs::remove_dir_all(&fresh).with_context(|| format!("removing {}", fresh.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("xtask: matrix: debootstrap {SUITE} ({}) into {}", PACKAGES.join(" "), tree.display());
    run(Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={}", PACKAGES.join(","))])
        .arg(SUITE)
        .arg(&fresh)
        .arg(mirror()?)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))?;
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    fs::rename(&fresh, &tree).context("moving the debootstrap tree into place")?;
    fs::write(dir.join("DONE"), format!("{SUITE} {}\n", PACKAGES.join(" "))).context("writing DONE")?;
    Ok(tree)
}

/// The amd64 image: the tree, the kernels' modules and the guest's files.
pub fn amd64_image(cache: &Path, tree: &Path, kernels: &[&Kernel]) -> Result<PathBuf> {
    let tree_key = tree.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
    let mut parts = vec![tree_key.unwrap_or_default(), FSTAB.into(), CHECK_UNIT.into(), CONTAINERD_CONFIG.into()];
    parts.push(MODULES_LOAD.into());
    parts.extend(kernels.iter().map(|k| format!("{}={}", k.resolved.package, k.resolved.version)));
    let key = digest(&parts.iter().map(String::as_str).collect::<Vec<_>>());
    let image = cache.join("images").join(format!("amd64-{key}.img"));
    if image.is_file() {
        return Ok(image);
    }
    let staging = cache.join("images").join(format!("amd64-{key}.staging"));
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(staging.parent().unwrap_or(cache)).context("creating the images directory")?;
    eprintln!("xtask: matrix: making the amd64 root image {}", image.display());
    // A copy, not links: the files written below must not reach the cached tree.
    run(Command::new("cp").arg("-a").arg(tree).arg(&staging))?;
    let modules = staging.join("usr/lib/modules");
    fs::create_dir_all(&modules).context("creating usr/lib/modules")?;
    for kernel in kernels {
        let from = kernel.modules().with_context(|| format!("{} has no modules", kernel.release))?;
        run(Command::new("cp").arg("-a").arg(&from).arg(modules.join(&kernel.release)))?;
        // The guest's own depmod, so the indexes are what its kmod reads.
        run(Command::new("chroot").arg(&staging).args(["/usr/sbin/depmod", &kernel.release]))?;
    }
    write(&staging, "etc/fstab", FSTAB)?;
    write(&staging, "etc/hostname", "lifecycle-matrix\n")?;
    write(&staging, "etc/systemd/system/lifecycle-matrix.service", CHECK_UNIT)?;
    let wants = staging.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants).context("creating multi-user.target.wants")?;
    symlink("/etc/systemd/system/lifecycle-matrix.service", wants.join("lifecycle-matrix.service"))
        .context("enabling lifecycle-matrix.service")?;
    write(&staging, "etc/containerd/config.toml", CONTAINERD_CONFIG)?;
    write(&staging, "etc/modules-load.d/lifecycle-matrix.conf", MODULES_LOAD)?;
    fs::create_dir_all(staging.join("payload")).context("creating /payload")?;
    mkfs(&staging, &image, "root", AMD64_IMAGE_MIB)?;
    fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    remove_siblings_with_prefix(&cache.join("images"), "amd64-", &image)?;
    Ok(image)
}

/// A digest of how the arm64 image is made (its packages' names and `/init`).
pub fn arm64_recipe() -> String {
    digest(&[&ARM64_PACKAGES.join(","), ARM64_INIT_PATH, ARM64_INIT])
}

/// The arm64 image: `debs` unpacked, the usual directories and `/init`.
pub fn arm64_image(cache: &Path, debs: &[Deb]) -> Result<PathBuf> {
    let mut parts: Vec<String> = debs.iter().map(|d| format!("{}={}", d.package, d.version)).collect();
    parts.push(ARM64_INIT_PATH.into());
    parts.push(ARM64_INIT.into());
    let key = digest(&parts.iter().map(String::as_str).collect::<Vec<_>>());
    let image = cache.join("images").join(format!("arm64-{key}.img"));
    if image.is_file() {
        return Ok(image);
    }
    let staging = cache.join("images").join(format!("arm64-{key}.staging"));
    crate::debian::unpack(debs, &staging)?;
    for dir in ["proc", "sys", "dev", "tmp", "run", "payload", "sbin"] {
        fs::create_dir_all(staging.join(dir)).with_context(|| format!("creating {dir}"))?;
    }
    write(&staging, ARM64_INIT_PATH, ARM64_INIT)?;
    run(Command::new("chmod").arg("0755").arg(staging.join(ARM64_INIT_PATH)))?;
    mkfs(&staging, &image, "root", ARM64_IMAGE_MIB)?;
    fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    remove_siblings_with_prefix(&cache.join("images"), "arm64-", &image)?;
    Ok(image)
}

fn write(root: &Path, path: &str, contents: &str) -> Result<()> {
    let to = root.join(path);
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    // Replace, never write through: a file may be a link into another tree.
    let _ = fs::remove_file(&to);
    fs::write(&to, contents).with_context(|| format!("writing {}", to.display()))
}

/// A disk image of `dir`: `mkfs.ext4 -d` of `size_mib` at [`PARTITION_OFFSET`], and an MBR
/// naming that one partition; renamed into place when complete.
fn mkfs(dir: &Path, image: &Path, label: &str, size_mib: u64) -> Result<()> {
    let fresh = image.with_extension("img.new");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", label, "-E", &format!("offset={PARTITION_OFFSET}"), "-d"])
        .arg(dir)
        .arg(&fresh)
        .arg(format!("{size_mib}M"))
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))?;
    let mut file = fs::OpenOptions::new().write(true).open(&fresh).context("opening the new image")?;
    file.write_all(&mbr(size_mib << 20)).context("writing the partition table")?;
    drop(file);
    fs::rename(&fresh, image).with_context(|| format!("moving {} into place", image.display()))
}

/// A master boot record with one Linux partition of `bytes` at [`PARTITION_OFFSET`].
fn mbr(bytes: u64) -> [u8; 512] {
    let mut sector = [0u8; 512];
    sector[440..444].copy_from_slice(&DISK_SIGNATURE.to_le_bytes());
    let start = u32::try_from(PARTITION_OFFSET / 512).unwrap_or(u32::MAX);
    let sectors = u32::try_from(bytes / 512).unwrap_or(u32::MAX);
    // Not bootable, CHS fields saturated (LBA only), type 0x83 (Linux).
    let mut entry = vec![0x00, 0xfe, 0xff, 0xff, 0x83, 0xfe, 0xff, 0xff];
    entry.extend(start.to_le_bytes());
    entry.extend(sectors.to_le_bytes());
    sector[446..462].copy_from_slice(&entry);
    sector[510] = 0x55;
    sector[511] = 0xaa;
    sector
}

/// Removes the entries of `parent` other than `kept` (trees of other keys).
fn remove_siblings(parent: &Path, kept: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(parent) else { return Ok(()) };
    for entry in entries.flatten() {
        if entry.path() != kept {
            eprintln!("xtask: matrix: removing {}", entry.path().display());
            fs::remove_dir_all(entry.path()).with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Removes the files of `parent` named `<prefix>...` other than `kept` (images of other keys).
fn remove_siblings_with_prefix(parent: &Path, prefix: &str, kept: &Path) -> Result<()> {
    for entry in fs::read_dir(parent).with_context(|| format!("reading {}", parent.display()))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && entry.path() != kept {
            let path = entry.path();
            let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
            removed.with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}
