//! Builds the kernel programs with the pinned nightly and bpf-linker (both installed by
//! `xtask bootstrap`), leaving the object in OUT_DIR for `include_bytes_aligned!`.

use anyhow::{bail, Context as _};

/// The pin file at the workspace root; its EBPF_NIGHTLY builds `lifecycle-ebpf`. The same file
/// pins the stable toolchain and bpf-linker for xtask/x.sh and xtask.
const PINS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../toolchains.env");

/// The value of `key` in the pin file (the format xtask/x.sh and xtask's toolchain module parse):
/// the rest of the one line starting with `key=`, non-empty, of `[A-Za-z0-9._-]` only.
fn pin<'a>(text: &'a str, key: &str) -> anyhow::Result<&'a str> {
    let mut values = text.split('\n').filter_map(|line| line.strip_prefix(key)?.strip_prefix('='));
    let (Some(value), None) = (values.next(), values.next()) else {
        bail!("{PINS} needs exactly one line {key}=<version>");
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        bail!("{PINS}: {key}={value:?} is not a plain version ([A-Za-z0-9._-] only)");
    }
    Ok(value)
}

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed={PINS}");
    let pins = std::fs::read_to_string(PINS).with_context(|| format!("reading {PINS}"))?;
    let nightly = pin(&pins, "EBPF_NIGHTLY")?;
    let ebpf = aya_build::Package {
        name: "lifecycle-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../lifecycle-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom(nightly))
}
