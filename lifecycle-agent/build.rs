//! Builds the kernel programs with the pinned nightly and bpf-linker (both installed by
//! `xtask bootstrap`), leaving the object in OUT_DIR for `include_bytes_aligned!`.

/// The nightly that builds `lifecycle-ebpf`; keep in step with xtask/src/toolchain.rs.
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    let ebpf = aya_build::Package {
        name: "lifecycle-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../lifecycle-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}
