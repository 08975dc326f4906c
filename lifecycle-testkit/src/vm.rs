//! Virtual machines for the kernel-matrix tier: qemu (TCG, no KVM needed) booting a kernel with
//! its root filesystem on NVMe and a second, writable disk — the payload — that carries what the
//! guest runs and brings back what it collected.
//!
//! What this module owns, and removes: the qemu process it started (killed by pid on drop,
//! never by name), the temporary directory of each [`Payload`] (its files, its image and what
//! was read back from it). The root image is attached with `snapshot=on`: the guest's writes go
//! to a temporary overlay qemu deletes itself, so the cached image stays pristine. Images are
//! made with `mkfs.ext4 -d` and read back with `debugfs`: no mount, no loop device, no root
//! needed on the host.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};

/// The architectures the matrix boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The serial console the kernel writes to.
    pub fn console(self) -> &'static str {
        match self {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    fn machine_args(self) -> &'static [&'static str] {
        match self {
            // No KVM here (no virtualisation flag): TCG.
            Arch::Amd64 => &["-accel", "tcg"],
            // The virt board with every CPU feature qemu emulates (Debian's arm64 kernels run on it).
            Arch::Arm64 => &["-M", "virt", "-cpu", "max", "-accel", "tcg"],
        }
    }
}

/// Why this machine cannot boot VMs, if it cannot.
pub fn skip_reason(arch: Arch) -> Option<String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(arch.qemu()).is_file()));
    if !found {
        return Some(format!("{} is not installed (the matrix tier installs it)", arch.qemu()));
    }
    for tool in ["mkfs.ext4", "debugfs"] {
        if !["/usr/sbin", "/sbin"].iter().any(|dir| Path::new(dir).join(tool).is_file()) {
            return Some(format!("{tool} is missing (apt-get install e2fsprogs)"));
        }
    }
    None
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct VmSpec {
    pub arch: Arch,
    /// The kernel image (`vmlinuz`), booted directly (no boot loader, no initramfs).
    pub kernel: PathBuf,
    /// The kernel command line. The root and the payload are two namespaces of one NVMe
    /// controller, whose names (`nvme0n1`, `nvme0n2`) follow the order their scans finish:
    /// name the root by something of its own (a PARTUUID), the payload by its label.
    pub cmdline: String,
    /// The root filesystem image, attached read-only in effect (`snapshot=on`).
    pub root: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
}

/// A running qemu. Dropping it kills the process (by pid) if it still runs.
pub struct Vm {
    child: Child,
    serial: PathBuf,
    started: Instant,
}

impl Vm {
    /// Starts qemu with `payload`'s image as the second disk; the serial console goes to
    /// `serial` (a file).
    pub fn start(spec: &VmSpec, payload: &Payload, serial: &Path) -> Result<Self> {
        let image = payload.image.as_ref().context("the payload is not packed yet")?;
        let log = fs::File::create(serial).with_context(|| format!("creating {}", serial.display()))?;
        let mut command = Command::new(spec.arch.qemu());
        command
            .args(spec.arch.machine_args())
            .args(["-m", &spec.memory_mib.to_string(), "-smp", &spec.cpus.to_string()])
            .args(["-nographic", "-no-reboot", "-nic", "none"])
            .arg("-kernel")
            .arg(&spec.kernel)
            .args(["-append", &spec.cmdline])
            .arg("-drive")
            .arg(drive("root", &spec.root, true))
            .arg("-drive")
            .arg(drive("payload", image, false))
            // One controller, two namespaces (in either order of names: see `cmdline`).
            .args(["-device", "nvme,id=nvme0,serial=lifecycle-matrix"])
            .args(["-device", "nvme-ns,drive=root,bus=nvme0,nsid=1"])
            .args(["-device", "nvme-ns,drive=payload,bus=nvme0,nsid=2"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("serial log")?)
            .stderr(log);
        let child = command.spawn().with_context(|| format!("starting {}", spec.arch.qemu()))?;
        Ok(Self { child, serial: serial.to_owned(), started: Instant::now() })
    }

    /// Waits for the guest to power off; kills it and fails once `timeout` has passed.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = self.started + timeout;
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for qemu")? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "the guest did not power off within {timeout:?}; its console ended with:\n{}",
                    self.serial_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// How long since qemu started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The last `lines` lines of the serial console.
    pub fn serial_tail(&self, lines: usize) -> String {
        tail(&self.serial, lines)
    }

    fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // By pid: the process this value started and nothing else.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a text file (lossy), for failure messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn drive(id: &str, file: &Path, snapshot: bool) -> String {
    // A comma in a path would end the option: the paths here are the tier's own.
    format!("file={},if=none,id={id},format=raw,snapshot={}", file.display(), if snapshot { "on" } else { "off" })
}

/// The payload disk of one boot: files put in a temporary directory, packed into an ext4 image
/// the guest mounts at /payload, and the guest's `/results` read back after it powered off.
/// Dropping it removes the directory with everything in it.
pub struct Payload {
    dir: PathBuf,
    image: Option<PathBuf>,
}

impl Payload {
    /// An empty payload in a fresh temporary directory named after `name`.
    pub fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("lifecycle-matrix-{}-{name}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::create_dir_all(dir.join("files/results")).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir, image: None })
    }

    /// The directory whose contents become the disk.
    pub fn files(&self) -> PathBuf {
        self.dir.join("files")
    }

    /// A scratch directory beside the disk's files (not on the disk).
    pub fn scratch(&self) -> PathBuf {
        self.dir.clone()
    }

    /// Copies `from` onto the disk as `name` (mode kept).
    pub fn copy(&self, from: &Path, name: &str) -> Result<()> {
        fs::copy(from, self.files().join(name))
            .with_context(|| format!("copying {} onto the payload", from.display()))
            .map(drop)
    }

    /// Writes `name` on the disk.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<()> {
        fs::write(self.files().join(name), contents).with_context(|| format!("writing {name} onto the payload"))
    }

    /// Makes the ext4 image: the files plus `spare_mib` of room for the results.
    pub fn pack(&mut self, spare_mib: u64) -> Result<()> {
        let used = du_bytes(&self.files())?;
        let size_mib = used / (1 << 20) + spare_mib + 16;
        let image = self.dir.join("payload.ext4");
        let output = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "payload", "-d"])
            .arg(self.files())
            .arg(&image)
            .arg(format!("{size_mib}M"))
            .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
            .output()
            .context("running mkfs.ext4")?;
        ensure!(output.status.success(), "mkfs.ext4 -d failed: {}", String::from_utf8_lossy(&output.stderr));
        self.image = Some(image);
        Ok(())
    }

    /// Copies the guest's `/results` out of the image (after it powered off) and returns where.
    pub fn results(&self) -> Result<PathBuf> {
        let image = self.image.as_ref().context("the payload was never packed")?;
        let out = self.dir.join("collected");
        if out.exists() {
            fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
        }
        fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let output = Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump /results {}", out.display()))
            .arg(image)
            .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
            .output()
            .context("running debugfs")?;
        ensure!(output.status.success(), "debugfs rdump failed: {}", String::from_utf8_lossy(&output.stderr));
        Ok(out.join("results"))
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The bytes of regular files under `dir`.
fn du_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += du_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}
