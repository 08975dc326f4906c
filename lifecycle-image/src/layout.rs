//! One root filesystem as a one-layer image, in an OCI image-layout tar archive (`oci-layout`,
//! `index.json`, `blobs/sha256/...`) that also holds docker's `manifest.json` naming the same
//! blobs, as `docker save` does since Docker 25: every loader finds the format it reads.
//!
//! Reproducible by construction: the layer and the archive are GNU tar with entries sorted by
//! name, mtime 0, owner and group 0 and no access times; the layer is gzip'd without a name or
//! time; JSON objects are written with sorted keys whatever serde_json's features are; the image
//! config's `created` is given (the commit's time for the release image). The same root
//! filesystem and config give the same digests.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{json, Value};

/// The CPU architecture of an image, as OCI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// AArch64.
    Arm64,
}

impl Arch {
    /// The OCI (and Go) name: `amd64`, `arm64`.
    pub fn oci_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target architecture (`std::env::consts::ARCH`) of this arch.
    pub fn rust_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// The architecture this program runs on, if it is one images are made for.
    pub fn host() -> Option<Arch> {
        [Arch::Amd64, Arch::Arm64].into_iter().find(|a| a.rust_name() == std::env::consts::ARCH)
    }
}

/// What the image runs, and its labels (the image config's `config` object).
#[derive(Clone, Debug)]
pub struct ImageConfig {
    pub architecture: Arch,
    /// `Entrypoint`: the program and its fixed arguments.
    pub entrypoint: Vec<String>,
    /// `Cmd`: the default arguments, replaced by a pod's `args`.
    pub cmd: Vec<String>,
    /// `Env`: `NAME=value` entries.
    pub env: Vec<String>,
    /// `User`, e.g. `0:0`; none leaves it to the runtime (root).
    pub user: Option<String>,
    /// `Labels`: `org.opencontainers.image.*` and the like.
    pub labels: BTreeMap<String, String>,
    /// `StopSignal` (e.g. `SIGUSR2`): what the runtime sends to stop a container of the image,
    /// unless its pod names another; none leaves SIGTERM.
    pub stop_signal: Option<String>,
    /// The image's creation time (RFC 3339), as `docker images` shows it: a fixed time for a
    /// reproducible image, e.g. the commit's ([`crate::agent::git_commit_time`]) or [`EPOCH`].
    pub created: String,
    /// How hard the layer is gzip'd: 1 (fast: a 230 MB debug binary in 3 s) to 9 (small);
    /// the release image uses 6 (gzip's default), the test images 1.
    pub gzip_level: u8,
}

/// The Unix epoch in RFC 3339, for images whose creation time means nothing.
pub const EPOCH: &str = "1970-01-01T00:00:00Z";

/// An archive written by [`pack`].
#[derive(Clone, Debug)]
pub struct Packed {
    pub archive: PathBuf,
    /// The manifest's digest, `sha256:<hex>`: what a registry and `ctr images ls` show.
    pub manifest_digest: String,
    /// The archive's size in bytes.
    pub bytes: u64,
}

/// Failures packing an image.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A file or directory of the layout could not be written, read or moved.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tool (tar, gzip, sha256sum) could not be started.
    #[error("cannot run {tool} (GNU tar, gzip and sha256sum must be on PATH)")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A tool exited non-zero.
    #[error("{tool} failed ({status}): {stderr}")]
    Tool { tool: &'static str, status: std::process::ExitStatus, stderr: String },
    /// sha256sum printed no digest.
    #[error("sha256sum printed no digest for {}", path.display())]
    NoDigest { path: PathBuf },
    /// The image name has no tag (`name:tag`), which docker's `RepoTags` needs.
    #[error("image name {name} has no :tag")]
    NoTag { name: String },
}

type Result<T> = std::result::Result<T, PackError>;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PackError + 'a {
    move |source| PackError::Io { what, path: path.to_owned(), source }
}

/// GNU tar's options for a reproducible archive: sorted entries, no times but mtime 0, root
/// ownership by number, and the gnu format (no pax headers carrying atime or ctime).
const REPRODUCIBLE_TAR: &[&str] =
    &["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "--format=gnu", "--no-acls"];

/// One platform's image: a root filesystem and what runs in it.
#[derive(Clone, Copy, Debug)]
pub struct Platform<'a> {
    pub rootfs: &'a Path,
    pub config: &'a ImageConfig,
}

/// A manifest written into the layout's blobs.
struct Written {
    arch: Arch,
    manifest_digest: String,
    manifest_size: u64,
    config_digest: String,
    layer_digest: String,
}

/// Packs `rootfs` as one layer of an image named `name` (a full reference, e.g.
/// `docker.io/library/lifecycle-agent:0.1.0`) into the archive `archive`, using `work` (created,
/// then removed) for the layout.
pub fn pack(rootfs: &Path, name: &str, config: &ImageConfig, work: &Path, archive: &Path) -> Result<Packed> {
    pack_platforms(&[Platform { rootfs, config }], name, work, archive)
}

/// Packs one image per platform under one name: with one platform, `index.json` names its
/// manifest (what every tool reads); with several, it names an image index of theirs (a
/// multi-arch image, what a registry serves for `docker pull` on either), and `manifest.json`
/// (docker load, which knows one architecture per archive) holds the first platform's. The
/// returned digest is the manifest's or the index's: what a registry shows for the tag.
pub fn pack_platforms(platforms: &[Platform<'_>], name: &str, work: &Path, archive: &Path) -> Result<Packed> {
    let tag = tag_of(name).ok_or_else(|| PackError::NoTag { name: name.to_owned() })?;
    if work.exists() {
        fs::remove_dir_all(work).map_err(io("remove", work))?;
    }
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io("create", &blobs))?;
    let mut written = Vec::with_capacity(platforms.len());
    for (index, platform) in platforms.iter().enumerate() {
        written.push(write_manifest(platform, &blobs, &work.join(format!("layer-{index}")))?);
    }
    let descriptor = |w: &Written| {
        json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", w.manifest_digest),
            "size": w.manifest_size,
            "platform": { "architecture": w.arch.oci_name(), "os": "linux" },
        })
    };
    // containerd (`ctr images import`) names the image from the first; skopeo, podman and OCI
    // tools take the tag from the second.
    let names = json!({ "io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag });
    let (top, digest) = match &written[..] {
        [one] => {
            let mut top = descriptor(one);
            top["annotations"] = names;
            (top, one.manifest_digest.clone())
        }
        several => {
            let image_index = json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": several.iter().map(descriptor).collect::<Vec<_>>(),
            });
            let (index_digest, index_size) = add_json(&blobs, &image_index)?;
            let top = json!({
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": format!("sha256:{index_digest}"),
                "size": index_size,
                "annotations": names,
            });
            (top, index_digest)
        }
    };
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [top],
    });
    write(&layout.join("index.json"), &canonical(&index))?;
    write(&layout.join("oci-layout"), &canonical(&json!({ "imageLayoutVersion": "1.0.0" })))?;
    // docker load reads this (and ignores index.json): the same config and layer blobs.
    let first = &written[0];
    let docker = json!([{
        "Config": format!("blobs/sha256/{}", first.config_digest),
        "RepoTags": [docker_tag(name)],
        "Layers": [format!("blobs/sha256/{}", first.layer_digest)],
    }]);
    write(&layout.join("manifest.json"), &canonical(&docker))?;

    if let Some(parent) = archive.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    tool(
        Command::new("tar")
            .arg("--create")
            .args(REPRODUCIBLE_TAR)
            .arg("--mode=u=rwX,go=rX")
            .arg("--file")
            .arg(archive)
            .arg("-C")
            .arg(&layout)
            .args(["blobs", "index.json", "manifest.json", "oci-layout"]),
        "tar",
    )?;
    fs::remove_dir_all(work).map_err(io("remove", work))?;
    let bytes = fs::metadata(archive).map_err(io("stat", archive))?.len();
    Ok(Packed { archive: archive.to_owned(), manifest_digest: format!("sha256:{digest}"), bytes })
}

/// Writes one platform's layer, config and manifest into `blobs`, staging the layer in `work`.
fn write_manifest(platform: &Platform<'_>, blobs: &Path, work: &Path) -> Result<Written> {
    let config = platform.config;
    fs::create_dir_all(work).map_err(io("create", work))?;
    let layer = work.join("layer.tar");
    tool(
        Command::new("tar")
            .arg("--create")
            .args(REPRODUCIBLE_TAR)
            .arg("--file")
            .arg(&layer)
            .arg("-C")
            .arg(platform.rootfs)
            .arg("."),
        "tar",
    )?;
    let diff_id = sha256(&layer)?;
    // -n: no name and no time in the gzip header.
    let level = format!("-{}", config.gzip_level.clamp(1, 9));
    tool(Command::new("gzip").args(["-n", &level, "--force"]).arg(&layer), "gzip")?;
    let (layer_digest, layer_size) = add_file(blobs, &work.join("layer.tar.gz"))?;

    let mut image_config = json!({
        "architecture": config.architecture.oci_name(),
        "os": "linux",
        "created": config.created,
        "config": {
            "Entrypoint": config.entrypoint,
            "Cmd": config.cmd,
            "Env": config.env,
            "User": config.user.clone().unwrap_or_default(),
            "WorkingDir": "/",
            "Labels": config.labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
        "history": [{ "created": config.created, "created_by": "lifecycle-image" }],
    });
    if let Some(signal) = &config.stop_signal {
        image_config["config"]["StopSignal"] = signal.clone().into();
    }
    let (config_digest, config_size) = add_json(blobs, &image_config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
        "annotations": config.labels,
    });
    let (manifest_digest, manifest_size) = add_json(blobs, &manifest)?;
    Ok(Written { arch: config.architecture, manifest_digest, manifest_size, config_digest, layer_digest })
}

/// Unpacks the root filesystem of `arch`'s image from an archive [`pack_platforms`] wrote (one
/// platform or several) into `into` (created): what a runtime would run, for a test to run it
/// another way (a guest without a container runtime).
pub fn unpack(archive: &Path, arch: Arch, into: &Path) -> Result<()> {
    let read = |name: &str| -> Result<Value> {
        let out = output(Command::new("tar").arg("-xOf").arg(archive).arg(name), "tar")?;
        serde_json::from_slice(&out).map_err(|err| PackError::Io {
            what: "parse",
            path: archive.join(name),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
        })
    };
    let blob = |descriptor: &Value| -> String {
        let digest = descriptor["digest"].as_str().unwrap_or_default();
        format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap_or(digest))
    };
    let missing = |what: &str| PackError::Io {
        what: "find",
        path: archive.join(what),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, format!("no {} {what}", arch.oci_name())),
    };
    let mut descriptor = read("index.json")?["manifests"][0].clone();
    // A multi-arch image: the index's manifest for `arch`.
    if descriptor["mediaType"] == "application/vnd.oci.image.index.v1+json" {
        let image_index = read(&blob(&descriptor))?;
        descriptor = image_index["manifests"]
            .as_array()
            .and_then(|all| all.iter().find(|m| m["platform"]["architecture"] == arch.oci_name()))
            .cloned()
            .ok_or_else(|| missing("manifest"))?;
    }
    let manifest = read(&blob(&descriptor))?;
    let layer = blob(&manifest["layers"][0]);
    fs::create_dir_all(into).map_err(io("create", into))?;
    let gz = into.join(".layer.tar.gz");
    let bytes = output(Command::new("tar").arg("-xOf").arg(archive).arg(&layer), "tar")?;
    fs::write(&gz, bytes).map_err(io("write", &gz))?;
    tool(Command::new("tar").arg("-xzf").arg(&gz).arg("-C").arg(into), "tar")?;
    fs::remove_file(&gz).map_err(io("remove", &gz))
}

/// The tag of a reference `[registry/]repository:tag` (a port's colon is before a slash).
fn tag_of(name: &str) -> Option<&str> {
    let last = name.rsplit('/').next()?;
    let (_, tag) = last.split_once(':')?;
    (!tag.is_empty()).then_some(tag)
}

/// docker's short form of a Docker Hub library reference (`docker.io/library/x:t` -> `x:t`),
/// which is how `docker images` lists it; other references unchanged.
fn docker_tag(name: &str) -> &str {
    name.strip_prefix("docker.io/library/").unwrap_or(name)
}

/// `value` as JSON with every object's keys in sorted order: serde_json keeps insertion order
/// when some crate in the build enables its `preserve_order`, so the order is set here.
fn canonical(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> = map.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(io("write", path))
}

/// Stores `value` (canonical JSON) as a blob; returns (hex digest, size).
fn add_json(blobs: &Path, value: &Value) -> Result<(String, u64)> {
    let staging = blobs.join("staging");
    write(&staging, &canonical(value))?;
    add_file(blobs, &staging)
}

/// Moves `file` into `blobs` under its sha256; returns (hex digest, size).
fn add_file(blobs: &Path, file: &Path) -> Result<(String, u64)> {
    let digest = sha256(file)?;
    let size = fs::metadata(file).map_err(io("stat", file))?.len();
    let blob = blobs.join(&digest);
    fs::rename(file, &blob).map_err(io("move into blobs", file))?;
    Ok((digest, size))
}

/// The hex sha256 of `path` (sha256sum).
fn sha256(path: &Path) -> Result<String> {
    let output = output(Command::new("sha256sum").arg(path), "sha256sum")?;
    String::from_utf8_lossy(&output)
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
        .ok_or_else(|| PackError::NoDigest { path: path.to_owned() })
}

fn tool(command: &mut Command, name: &'static str) -> Result<()> {
    output(command, name).map(drop)
}

fn output(command: &mut Command, tool: &'static str) -> Result<Vec<u8>> {
    // A fixed locale: tar's --sort=name and messages must not depend on the caller's.
    let output = command.env("LC_ALL", "C").output().map_err(|source| PackError::Spawn { tool, source })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        return Err(PackError::Tool { tool, status: output.status, stderr });
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_give_their_tag_and_docker_name() {
        assert_eq!(tag_of("docker.io/library/lifecycle-agent:0.1.0"), Some("0.1.0"));
        assert_eq!(tag_of("registry.invalid:5000/team/agent:v1"), Some("v1"));
        assert_eq!(tag_of("registry.invalid:5000/team/agent"), None, "a port is no tag");
        assert_eq!(tag_of("agent:"), None);
        assert_eq!(docker_tag("docker.io/library/lifecycle-agent:0.1.0"), "lifecycle-agent:0.1.0");
        assert_eq!(docker_tag("registry.invalid/team/agent:v1"), "registry.invalid/team/agent:v1");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let value = json!({"b": 1, "a": {"z": [{"y": 1, "x": 2}], "c": null}});
        assert_eq!(canonical(&value), r#"{"a":{"c":null,"z":[{"x":2,"y":1}]},"b":1}"#);
    }

    fn config() -> ImageConfig {
        ImageConfig {
            architecture: Arch::Amd64,
            entrypoint: vec!["/bin/tool".into()],
            cmd: vec!["run".into()],
            env: vec!["PATH=/bin".into()],
            user: Some("0:0".into()),
            labels: BTreeMap::from([("org.opencontainers.image.version".into(), "1.2.3".into())]),
            stop_signal: None,
            created: EPOCH.to_owned(),
            gzip_level: 6,
        }
    }

    /// Packs a small tree twice, with different file times and creation order: same archive.
    #[test]
    fn the_same_tree_packs_to_the_same_bytes() {
        let base = std::env::temp_dir().join(format!("lifecycle-image-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let mut archives = Vec::new();
        for (round, names) in [["a", "b"], ["b", "a"]].iter().enumerate() {
            let rootfs = base.join(format!("rootfs{round}"));
            fs::create_dir_all(rootfs.join("bin")).expect("rootfs");
            for name in names {
                fs::write(rootfs.join("bin").join(name), format!("file {name}\n")).expect("file");
            }
            if round == 1 {
                // A different mtime on the second tree.
                std::thread::sleep(std::time::Duration::from_millis(1100));
                fs::write(rootfs.join("bin/a"), "file a\n").expect("touch");
            }
            let archive = base.join(format!("image{round}.tar"));
            let packed = pack(&rootfs, "docker.io/library/test:1", &config(), &base.join("work"), &archive);
            archives.push((packed.expect("pack"), fs::read(&archive).expect("read archive")));
        }
        assert_eq!(archives[0].0.manifest_digest, archives[1].0.manifest_digest);
        assert!(archives[0].1 == archives[1].1, "the archives differ byte for byte");
        let listing =
            Command::new("tar").arg("--list").arg("--file").arg(&archives[0].0.archive).output().expect("tar");
        let listing = String::from_utf8_lossy(&listing.stdout);
        for entry in ["oci-layout", "index.json", "manifest.json", "blobs/sha256/"] {
            assert!(listing.lines().any(|l| l == entry), "{entry} in\n{listing}");
        }
        let _ = fs::remove_dir_all(&base);
    }

    /// A file of an archive, read with tar.
    fn member(archive: &Path, name: &str) -> Value {
        let out = Command::new("tar").arg("-xOf").arg(archive).arg(name).output().expect("tar");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|err| panic!("{name}: {err}"))
    }

    #[test]
    fn two_platforms_make_one_multi_arch_image_under_one_name() {
        let base = std::env::temp_dir().join(format!("lifecycle-image-multi-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let (amd64, arm64) = (base.join("amd64"), base.join("arm64"));
        for (rootfs, text) in [(&amd64, "x86-64"), (&arm64, "aarch64")] {
            fs::create_dir_all(rootfs.join("bin")).expect("rootfs");
            fs::write(rootfs.join("bin/agent"), text).expect("file");
        }
        let config_amd64 = config();
        let config_arm64 = ImageConfig { architecture: Arch::Arm64, ..config() };
        let archive = base.join("multi.tar");
        let platforms =
            [Platform { rootfs: &amd64, config: &config_amd64 }, Platform { rootfs: &arm64, config: &config_arm64 }];
        let packed =
            pack_platforms(&platforms, "docker.io/library/test:1", &base.join("work"), &archive).expect("pack");
        let index = member(&archive, "index.json");
        let top = &index["manifests"][0];
        assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1));
        assert_eq!(top["mediaType"], "application/vnd.oci.image.index.v1+json");
        assert_eq!(top["annotations"]["org.opencontainers.image.ref.name"], "1");
        assert_eq!(top["digest"], packed.manifest_digest.as_str(), "the digest returned is the index's");
        let digest = top["digest"].as_str().and_then(|d| d.strip_prefix("sha256:")).expect("digest");
        let image_index = member(&archive, &format!("blobs/sha256/{digest}"));
        let platforms: Vec<&str> = image_index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().expect("architecture"))
            .collect();
        assert_eq!(platforms, ["amd64", "arm64"]);
        for manifest in image_index["manifests"].as_array().expect("manifests") {
            let digest = manifest["digest"].as_str().and_then(|d| d.strip_prefix("sha256:")).expect("digest");
            let manifest = member(&archive, &format!("blobs/sha256/{digest}"));
            let config_digest =
                manifest["config"]["digest"].as_str().and_then(|d| d.strip_prefix("sha256:")).expect("config");
            let image_config = member(&archive, &format!("blobs/sha256/{config_digest}"));
            assert_eq!(image_config["architecture"], manifest_platform(&image_index, digest));
        }
        // docker load knows one architecture per archive: the first.
        let docker = member(&archive, "manifest.json");
        assert_eq!(docker.as_array().map(Vec::len), Some(1));
        // Each platform's tree comes back out.
        unpack(&archive, Arch::Arm64, &base.join("out")).expect("unpack");
        assert_eq!(fs::read_to_string(base.join("out/bin/agent")).expect("unpacked"), "aarch64");
        let _ = fs::remove_dir_all(&base);
    }

    /// The architecture the image index says the manifest `digest` is for.
    fn manifest_platform(image_index: &Value, digest: &str) -> Value {
        image_index["manifests"]
            .as_array()
            .and_then(|all| all.iter().find(|m| m["digest"] == format!("sha256:{digest}").as_str()))
            .map(|m| m["platform"]["architecture"].clone())
            .unwrap_or_default()
    }
}
