//! Matrix tier: the agent on Debian's own kernels, booted under qemu (TCG) — bullseye 5.10,
//! bookworm 6.1, trixie 6.12 and sid's newest, each on pure cgroup v2 and on hybrid, with
//! systemd as PID 1 and a real containerd; cgroup v1 alone once, where the agent must refuse;
//! and trixie's arm64 kernel with a busybox guest, where every program must load and an exit be
//! seen.
//!
//! `xtask/x.sh test --tier matrix` provides the kernels and root filesystems (cached per
//! machine) and names them in the manifest file [`MANIFEST_ENV`] points at; without it these
//! tests skip, saying so. Each test packs a payload disk (the agent this test binary was built
//! with, or the tree of the arm64 image xtask built, run in a chroot; the guest's check script,
//! the busybox image for containerd), boots, waits for the guest to power off, reads what it collected and judges it
//! here (`matrix/checks.rs`). Every check is judged before any assertion, and each boot's row
//! goes to the results directory, from which xtask writes docs/kernel-matrix.md.

#[path = "matrix/checks.rs"]
mod checks;
#[path = "matrix/collected.rs"]
mod collected;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use lifecycle_testkit::{
    containerd::{build_busybox_image, IMAGE},
    vm::{self, Arch, Payload, Vm, VmSpec},
};

use self::{
    checks::{judge, Check, Ids},
    collected::Collected,
};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
/// The manifest xtask writes: `key=value` lines naming kernels, root images, the arm64 agent
/// and where rows go.
const MANIFEST_ENV: &str = "LIFECYCLE_MATRIX_MANIFEST";
const CHECK_AMD64: &str = include_str!("matrix/check.py");
const CHECK_ARM64: &str = include_str!("matrix/check-arm64.sh");
/// Boot, workload and power-off of one guest, with room: a boot takes 15-20 s under TCG here.
const AMD64_TIMEOUT: Duration = Duration::from_secs(600);
const ARM64_TIMEOUT: Duration = Duration::from_secs(300);

/// The cgroup layout a boot asks systemd for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Pure cgroup v2 (systemd's default).
    Unified,
    /// v1 controllers with v2 at /sys/fs/cgroup/unified.
    Hybrid,
    /// cgroup v1 only: no v2 hierarchy at all.
    Legacy,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Unified => "unified",
            Mode::Hybrid => "hybrid",
            Mode::Legacy => "legacy",
        }
    }

    /// What the kernel command line tells systemd (252, bookworm's, still has both v1 modes).
    fn cmdline(self) -> &'static str {
        match self {
            Mode::Unified => "systemd.unified_cgroup_hierarchy=1",
            Mode::Hybrid => "systemd.unified_cgroup_hierarchy=0",
            Mode::Legacy => "systemd.unified_cgroup_hierarchy=0 systemd.legacy_systemd_cgroup_controller=1",
        }
    }
}

/// One boot of the matrix.
pub struct Boot {
    pub name: &'static str,
    /// Where its row goes in the table.
    pub order: u32,
    pub arch: Arch,
    pub suite: &'static str,
    pub mode: Mode,
}

impl Boot {
    pub fn arch_is_arm64(&self) -> bool {
        self.arch == Arch::Arm64
    }
}

/// The manifest's entries.
struct Manifest(BTreeMap<String, String>);

impl Manifest {
    fn from_env() -> Option<Self> {
        let path = std::env::var_os(MANIFEST_ENV)?;
        let text = fs::read_to_string(&path).ok()?;
        Some(Self(text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()))
    }

    fn get(&self, key: &str) -> &str {
        self.0.get(key).unwrap_or_else(|| panic!("the matrix manifest has no {key}: {:?}", self.0.keys()))
    }
}

/// A pod uid and a 64-hex container id of this boot's own.
fn ids(boot: &Boot) -> Ids {
    let seed = format!("{}-{}-{:?}", boot.name, std::process::id(), Instant::now());
    let hex: String = (0..4u8).map(|round| format!("{:016x}", fnv(&format!("{seed}/{round}")))).collect();
    let pod_uid = format!("{}-{}-4{}-8{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32]);
    Ids { pod_uid, container_id: hex }
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

fn run_boot(boot: Boot) {
    let Some(manifest) = Manifest::from_env() else {
        eprintln!("skipped: no {MANIFEST_ENV}: the matrix runs through `xtask/x.sh test --tier matrix`");
        return;
    };
    if let Some(reason) = vm::skip_reason(boot.arch) {
        eprintln!("skipped: {reason}");
        return;
    }
    let arch = if boot.arch_is_arm64() { "arm64" } else { "amd64" };
    let kernel = format!("kernel.{arch}.{}", boot.suite);
    let (release, package) = (manifest.get(&format!("{kernel}.release")), manifest.get(&format!("{kernel}.package")));
    let ids = ids(&boot);

    let mut payload = Payload::new(boot.name).expect("payload directory");
    if boot.arch_is_arm64() {
        // The agent as the arm64 image has it (`xtask/x.sh image --arch arm64`): its binary, its
        // libraries and its loader, run by the guest in a chroot of the image's tree.
        lifecycle_testkit::image::unpack(
            Path::new(manifest.get("image.arm64")),
            lifecycle_testkit::image::Arch::Arm64,
            &payload.files().join("rootfs"),
        )
        .expect("the arm64 image's tree");
        payload.write("check.sh", CHECK_ARM64).expect("check.sh");
    } else {
        payload.copy(Path::new(AGENT), "lifecycle-agent").expect("the agent");
        payload.write("check.py", CHECK_AMD64).expect("check.py");
        let image = build_busybox_image(&payload.scratch().join("image")).expect("the busybox image");
        payload.copy(&image, "image.tar").expect("image.tar");
        let boot_json = serde_json::json!({
            "pod_uid": ids.pod_uid, "container_id": ids.container_id, "image": IMAGE, "image_file": "image.tar",
        });
        payload.write("boot.json", boot_json.to_string()).expect("boot.json");
    }
    payload.pack(256).expect("the payload image");

    let spec = VmSpec {
        arch: boot.arch,
        kernel: PathBuf::from(manifest.get(&format!("{kernel}.vmlinuz"))),
        cmdline: format!(
            "{} rw console={} panic=-1 {}",
            manifest.get("rootfs.root"),
            boot.arch.console(),
            boot.mode.cmdline()
        ),
        root: PathBuf::from(manifest.get(&format!("rootfs.{arch}"))),
        memory_mib: if boot.arch_is_arm64() { 1024 } else { 2048 },
        cpus: 1,
    };
    let rows = PathBuf::from(manifest.get("rows"));
    fs::create_dir_all(&rows).expect("rows directory");
    let console = rows.join(format!("{}.console.log", boot.name));
    eprintln!("{}: booting {release} ({package}), {}", boot.name, boot.mode.name());
    let mut vm = Vm::start(&spec, &payload, &console).expect("qemu starts");
    let finished = vm.wait(if boot.arch_is_arm64() { ARM64_TIMEOUT } else { AMD64_TIMEOUT });
    let wall = vm.elapsed();
    drop(vm);

    // What the guest collected is kept beside the row (target/matrix/rows/<boot>.results), for
    // whoever reads a failure.
    let kept = rows.join(format!("{}.results", boot.name));
    let _ = fs::remove_dir_all(&kept);
    let got = match &finished {
        Ok(_) => {
            let results = payload.results().expect("the payload's results");
            // Kept when it can be moved (the same filesystem), else read where it is.
            Collected::read(if fs::rename(&results, &kept).is_ok() { &kept } else { &results })
        }
        Err(_) => Collected::read(&kept),
    };
    let mut checks = judge(&boot, &got, &ids);
    if let Err(err) = &finished {
        checks.insert(0, Check { name: "boot", passed: false, detail: format!("{err:#}") });
    } else if let Some(status) = finished.as_ref().ok().filter(|status| !status.success()) {
        let detail = format!("qemu exited with {status}; its console ended with:\n{}", vm::tail(&console, 15));
        checks.insert(0, Check { name: "boot", passed: false, detail });
    } else if got.facts.as_object().is_none_or(|facts| facts.is_empty()) {
        let detail = format!("the guest's check never ran; its console ended with:\n{}", vm::tail(&console, 15));
        checks.insert(0, Check { name: "boot", passed: false, detail });
    }
    write_row(&rows, &boot, release, package, &got, &checks, wall);

    let failed: Vec<String> =
        checks.iter().filter(|c| !c.passed).map(|c| format!("  {}: {}", c.name, c.detail)).collect();
    for c in &checks {
        eprintln!("{}: {} {}: {}", boot.name, if c.passed { "pass" } else { "FAIL" }, c.name, c.detail);
    }
    assert!(
        failed.is_empty(),
        "{} on {release}, {}: {} check(s) failed:\n{}\nagent log:\n{}\nconsole: {}",
        boot.name,
        boot.mode.name(),
        failed.len(),
        failed.join("\n"),
        got.agent_log_tail(15),
        console.display()
    );
}

/// The boot's row for docs/kernel-matrix.md, rendered by xtask (`xtask/src/matrix/table.rs`)
/// from every row: `key=value` lines, then `check=<name>\t<pass|fail>\t<detail>` per check.
fn write_row(
    rows: &Path,
    boot: &Boot,
    release: &str,
    package: &str,
    got: &Collected,
    checks: &[Check],
    wall: Duration,
) {
    let one_line = |text: &str| text.replace(['\n', '\t'], " ");
    let mut text = String::new();
    let fields = [
        ("boot", boot.name.to_owned()),
        ("order", boot.order.to_string()),
        ("arch", if boot.arch_is_arm64() { "arm64" } else { "amd64" }.to_owned()),
        ("suite", boot.suite.to_owned()),
        ("package", package.to_owned()),
        ("release", release.to_owned()),
        ("uname", got.fact_text("uname")),
        ("mode", boot.mode.name().to_owned()),
        ("cgroup_mode", got.fact_text("cgroup_mode")),
        ("boot_seconds", got.fact_text("uptime_at_check")),
        ("check_seconds", got.fact_text("check_seconds")),
        ("wall_seconds", format!("{:.1}", wall.as_secs_f64())),
    ];
    for (key, value) in fields {
        text.push_str(&format!("{key}={}\n", one_line(&value)));
    }
    for check in checks {
        let result = if check.passed { "pass" } else { "fail" };
        text.push_str(&format!("check={}\t{result}\t{}\n", check.name, one_line(&check.detail)));
    }
    let path = rows.join(format!("{}.row", boot.name));
    fs::write(&path, text).expect("writing the row");
}

macro_rules! boots {
    ($($test:ident: $order:literal $arch:ident $suite:literal $mode:ident;)*) => {$(
        #[test]
        fn $test() {
            run_boot(Boot {
                name: stringify!($test),
                order: $order,
                arch: Arch::$arch,
                suite: $suite,
                mode: Mode::$mode,
            });
        }
    )*};
}

boots! {
    bullseye_unified: 1 Amd64 "bullseye" Unified;
    bullseye_hybrid: 2 Amd64 "bullseye" Hybrid;
    bookworm_unified: 3 Amd64 "bookworm" Unified;
    bookworm_hybrid: 4 Amd64 "bookworm" Hybrid;
    bookworm_v1_only: 5 Amd64 "bookworm" Legacy;
    trixie_unified: 6 Amd64 "trixie" Unified;
    trixie_hybrid: 7 Amd64 "trixie" Hybrid;
    sid_unified: 8 Amd64 "sid" Unified;
    sid_hybrid: 9 Amd64 "sid" Hybrid;
    trixie_arm64: 10 Arm64 "trixie" Unified;
}
