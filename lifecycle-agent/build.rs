//! Puts the kernel programs in OUT_DIR for `include_bytes_aligned!`: the checked-in object when
//! its inputs' digest matches the sources (no nightly, no bpf-linker needed) and its own bytes are
//! the recorded ones (else the build fails), otherwise a build from source with the pinned
//! nightly and bpf-linker (both installed by `xtask bootstrap` in that case).

use std::path::Path;

use anyhow::{bail, Context as _};

#[path = "build/ebpf_object.rs"]
mod ebpf_object;

/// The workspace root, where the pin file, the object and its inputs are.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
/// Set to 1 to build the programs from source even when the checked-in object is current.
const FROM_SOURCE: &str = "LIFECYCLE_EBPF_FROM_SOURCE";

/// The value of `key` in the pin file (the format xtask/x.sh and xtask's toolchain module parse):
/// the rest of the one line starting with `key=`, non-empty, of `[A-Za-z0-9._-]` only.
fn pin<'a>(text: &'a str, key: &str) -> anyhow::Result<&'a str> {
    let mut values = text.split('\n').filter_map(|line| line.strip_prefix(key)?.strip_prefix('='));
    let (Some(value), None) = (values.next(), values.next()) else {
        bail!("toolchains.env needs exactly one line {key}=<version>");
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        bail!("toolchains.env: {key}={value:?} is not a plain version ([A-Za-z0-9._-] only)");
    }
    Ok(value)
}

fn main() -> anyhow::Result<()> {
    let root = Path::new(ROOT);
    let pins_path = root.join("toolchains.env");
    println!("cargo:rerun-if-changed={}", pins_path.display());
    for input in ebpf_object::INPUTS {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    println!("cargo:rerun-if-changed={}", root.join(ebpf_object::OBJECT).display());
    println!("cargo:rerun-if-changed={}", root.join(ebpf_object::DIGESTS).display());
    println!("cargo:rerun-if-env-changed={FROM_SOURCE}");

    let pins = std::fs::read_to_string(&pins_path).with_context(|| format!("reading {}", pins_path.display()))?;
    let nightly = pin(&pins, "EBPF_NIGHTLY")?;
    let bpf_linker = pin(&pins, "BPF_LINKER_VERSION")?;
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let from_source = std::env::var_os(FROM_SOURCE).is_some_and(|value| value == "1");

    let digest = ebpf_object::digest(root, nightly, bpf_linker).context("hashing the eBPF object's inputs")?;
    let recorded =
        std::fs::read_to_string(root.join(ebpf_object::DIGESTS)).ok().and_then(|t| ebpf_object::Digests::parse(&t));
    let serves = ebpf_object::SERVES.contains(&arch.as_str());
    if let Some(recorded) = recorded.filter(|r| !from_source && serves && r.inputs == digest) {
        let object = std::fs::read(root.join(ebpf_object::OBJECT)).context("reading the checked-in eBPF object")?;
        // The object's own bytes, not only its inputs': a changed object fails the build here.
        if let Err(why) = ebpf_object::verify_object(&object, &recorded) {
            bail!("{why}");
        }
        let out = Path::new(&std::env::var("OUT_DIR").context("OUT_DIR not set")?).join("lifecycle");
        std::fs::write(&out, &object).context("writing the eBPF object to OUT_DIR")?;
        return Ok(());
    }
    if !from_source && serves {
        println!(
            "cargo:warning=lifecycle-ebpf/object is not current for these sources; building the programs \
             from source with {nightly} (`xtask/x.sh ebpf-object` brings the object up to date)"
        );
    }
    let ebpf = aya_build::Package {
        name: "lifecycle-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../lifecycle-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom(nightly))
}
