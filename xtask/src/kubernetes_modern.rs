//! The parts of a current Kubernetes node (kubelet and kube-apiserver of
//! `KUBERNETES_MODERN_VERSION`, containerd 2.x, runc 1.3, etcd, the CNI plugins), provided once
//! per machine and cached outside the work tree, so every clone on the machine reuses them.
//!
//! The kubelet tier's node (`kubernetes.rs`) is 1.20, the newest Debian builds a kubelet from;
//! no registry reachable here ships newer kubelet or kube-apiserver binaries, and Debian's newer
//! containerd needs a runc this Debian does not have. So:
//! - kubelet and kube-apiserver are built with Go from the Go module proxy: `kubernetes-modern/go.mod`
//!   (beside this crate) requires `k8s.io/kubernetes` at the pin and replaces each staging module
//!   (`k8s.io/api`, `k8s.io/component-base`, ...) with its published `v0.<minor>.<patch>`: upstream's
//!   own go.mod points them at `./staging/...`, which a dependent module ignores. Its go.sum is
//!   committed and the build is `-mod=readonly`, so what is built is what was reviewed.
//! - runc is built the same way from `kubernetes-modern/runc/go.mod` (with cgo and seccomp, against
//!   this machine's libseccomp): Debian unstable's runc 1.3 is linked against glibc 2.38, and this
//!   Debian has 2.36 (`GLIBC_2.38' not found`).
//! - containerd, etcd and the CNI plugins come from Debian unstable through a private apt
//!   configuration whose only entry is derived at run time from this machine's own Debian archive
//!   (no archive host is written in the repository), downloaded with `apt-get download` and
//!   unpacked with `dpkg -x` into a private prefix: the system's packages, apt lists and caches
//!   are never touched. Their binaries are dynamically linked against glibc >= 2.34 only.
//!
//! Everything lives in `/var/cache/lifecycle/kubernetes-modern/<version>/` (or under
//! `$LIFECYCLE_KUBERNETES_MODERN_CACHE`): the Go module and build caches, the private apt state,
//! the prefix and `bin/` with every binary and a `BUILD` stamp. A run whose stamp matches the pin
//! and whose recorded go.mod/go.sum copies match the repository's does nothing, not even a network
//! call. One build at a time per machine (an flock); a failed build leaves the previous `bin/` in
//! place and the caches warm.

use std::{
    fs,
    os::unix::{fs::symlink, io::AsRawFd as _},
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{ensure, Context as _, Result};

use crate::{
    packages,
    shell::{capture, run},
    toolchain, workspace_root,
};

/// The release of kubelet and kube-apiserver (`KUBERNETES_MODERN_VERSION` in toolchains.env).
pub const VERSION: &str = toolchain::KUBERNETES_MODERN_VERSION;
/// The machine-level cache root, unless the environment names another.
const CACHE_ROOT: &str = "/var/cache/lifecycle/kubernetes-modern";
const CACHE_ENV: &str = "LIFECYCLE_KUBERNETES_MODERN_CACHE";
/// The Go packages built from `kubernetes-modern/go.mod`, installed under their last element.
const KUBERNETES_PACKAGES: &[&str] = &["k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-apiserver"];
/// The runc module in `kubernetes-modern/runc/go.mod` (its main package is the module root).
const RUNC_MODULE: &str = "github.com/opencontainers/runc";
/// The version variables Kubernetes' own build sets with -X, in both packages that carry them
/// (component-base's is what `--version` and /version print; client-go's is the user agent).
const VERSION_PACKAGES: &[&str] = &["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"];
/// The Debian suite the runtime packages come from: the only one with containerd 2.x.
const DEBIAN_SUITE: &str = "unstable";
/// Debian packages unpacked into the prefix, with the binaries linked from `bin/`.
const DEBIAN_PACKAGES: &[(&str, &[&str])] = &[
    ("containerd", &["usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr"]),
    ("etcd-server", &["usr/bin/etcd", "usr/bin/etcdutl"]),
    ("containernetworking-plugins", &[]),
];
/// Where the CNI plugins are inside the prefix.
const CNI_IN_PREFIX: &str = "usr/lib/cni";
/// The machine's Debian entries (deb822), else the one-line list.
const HOST_DEB822: &str = "/etc/apt/sources.list.d/debian.sources";
const HOST_ONE_LINE: &str = "/etc/apt/sources.list";
/// The machine's apt settings the private configuration keeps: how its archive is verified and
/// reached (a dated snapshot archive has an expired Valid-Until, which the machine's own
/// configuration already accepts), nothing else (no hooks, index targets or preferences).
const INHERITED_APT_SETTINGS: &[&str] = &[
    "Acquire::Check-Valid-Until",
    "Acquire::Check-Date",
    "Acquire::Max-ValidTime",
    "Acquire::Min-ValidTime",
    "Acquire::http::Proxy",
    "Acquire::https::Proxy",
];
/// The Go settings read from the user's environment (with `go env`, so a GOENV file counts) and
/// handed to the build, whose environment is otherwise cleared: where modules come from.
const INHERITED_GO_SETTINGS: &[&str] = &["GOPROXY", "GOSUMDB", "GONOSUMDB", "GONOPROXY", "GOPRIVATE", "GOINSECURE"];
/// Variables a module download may need that `go env` does not report.
const INHERITED_VARIABLES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// Where the node's binaries are.
pub struct Node {
    /// kubelet, kube-apiserver, runc, containerd, containerd-shim-runc-v2, ctr, etcd, etcdutl and
    /// the `BUILD` stamp.
    pub bin: PathBuf,
    /// The CNI plugins (bridge, host-local, loopback, ...).
    pub cni: PathBuf,
}

/// The cache root: `$LIFECYCLE_KUBERNETES_MODERN_CACHE` or [`CACHE_ROOT`].
fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(CACHE_ROOT), PathBuf::from)
}

/// This release's directory in the cache.
fn version_dir() -> PathBuf {
    cache_root().join(VERSION)
}

/// The Go modules of the repository (`xtask/kubernetes-modern`).
fn modules_dir() -> PathBuf {
    workspace_root().join("xtask/kubernetes-modern")
}

fn node() -> Node {
    let dir = version_dir();
    Node { bin: dir.join("bin"), cni: dir.join("prefix").join(CNI_IN_PREFIX) }
}

/// The files whose content decides what is built; copies are kept beside the stamp, so an edited
/// go.mod or go.sum rebuilds and an unchanged one is recognised without the network.
const INPUTS: &[&str] = &["go.mod", "go.sum", "runc/go.mod", "runc/go.sum"];

/// Returns where the node's binaries are, providing them first unless the cache has them.
pub fn ensure() -> Result<Node> {
    if let Some(summary) = cached() {
        eprintln!("xtask: kubernetes-modern {VERSION} cached in {} ({summary})", node().bin.display());
        return Ok(node());
    }
    let root = cache_root();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    // One build per machine at a time: a second xtask waits here, then finds the first one's work.
    let _lock = Lock::acquire(&root.join(".lock"))?;
    if let Some(summary) = cached() {
        eprintln!("xtask: kubernetes-modern {VERSION} cached in {} ({summary})", node().bin.display());
        return Ok(node());
    }
    let began = Instant::now();
    let modules = modules_dir();
    let go_mod = read(&modules.join("go.mod"))?;
    check_go_mod(&go_mod, VERSION)?;
    let runc_version = required_version(&read(&modules.join("runc/go.mod"))?, RUNC_MODULE)
        .context("kubernetes-modern/runc/go.mod requires no runc")?;
    eprintln!("xtask: providing kubernetes-modern {VERSION} in {} (once per machine)", version_dir().display());
    // runc is built with cgo against this machine's libseccomp.
    packages::ensure(packages::KUBERNETES_MODERN_BUILD)?;

    let dir = version_dir();
    let apt = PrivateApt::create(&dir.join("apt"))?;
    apt.update()?;
    let debs = apt.download(&DEBIAN_PACKAGES.iter().map(|(name, _)| *name).collect::<Vec<_>>(), &dir.join("debs"))?;
    let containerd = debs.iter().find(|d| d.package == "containerd").context("containerd was not downloaded")?;
    // The node's containerd configuration is version 3, which containerd 1.x does not read.
    ensure!(
        containerd.version.starts_with("2."),
        "Debian {DEBIAN_SUITE} has containerd {}, not 2.x; the node needs containerd 2",
        containerd.version
    );
    unpack(&debs, &dir.join("prefix"))?;

    let go = Go::new(&dir.join("go"))?;
    let staging = dir.join("bin.new");
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    go.build_kubernetes(&modules, &staging)?;
    go.build_runc(&modules.join("runc"), &runc_version, &staging)?;
    install(&staging, &debs, &go.version, &runc_version)?;
    let summary = cached().context("the binaries just installed do not pass the cache check")?;
    eprintln!(
        "xtask: kubernetes-modern {VERSION} ready in {:.0?}: {} ({summary})",
        began.elapsed(),
        node().bin.display()
    );
    Ok(node())
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The stamp's summary when `bin/` holds working binaries of the pin, built from the inputs the
/// repository has now. Local only: reads files and asks the kubelet its version.
fn cached() -> Option<String> {
    let dir = version_dir();
    let bin = dir.join("bin");
    let stamp = fs::read_to_string(bin.join("BUILD")).ok()?;
    if !stamp.lines().any(|line| line == format!("kubernetes={VERSION}")) {
        return None;
    }
    for input in INPUTS {
        let recorded = fs::read(bin.join("inputs").join(input)).ok()?;
        if fs::read(modules_dir().join(input)).ok()? != recorded {
            return None;
        }
    }
    let mut binaries = vec!["runc"];
    binaries.extend(KUBERNETES_PACKAGES.iter().filter_map(|p| p.rsplit('/').next()));
    binaries.extend(DEBIAN_PACKAGES.iter().flat_map(|(_, files)| files.iter().filter_map(|f| f.rsplit('/').next())));
    // A link into the prefix counts only when its target is there too.
    if !binaries.iter().all(|b| bin.join(b).is_file()) || !node().cni.join("bridge").is_file() {
        return None;
    }
    // The binary itself must agree (a truncated copy or a foreign file fails here).
    let version = Command::new(bin.join("kubelet")).arg("--version").output().ok()?;
    let printed = String::from_utf8_lossy(&version.stdout);
    if !version.status.success() || printed.split_whitespace().last() != Some(VERSION) {
        return None;
    }
    Some(stamp.lines().filter(|l| !l.starts_with("kubernetes=")).collect::<Vec<_>>().join(", "))
}

/// Fails unless `go.mod` requires `k8s.io/kubernetes` at `version` and replaces every `k8s.io/`
/// module with the same module at `v0.<minor>.<patch>` of that release: the pin and the go.mod
/// are two places that must say the same release.
fn check_go_mod(go_mod: &str, version: &str) -> Result<()> {
    let required =
        required_version(go_mod, "k8s.io/kubernetes").context("go.mod does not require k8s.io/kubernetes")?;
    ensure!(
        required == version,
        "xtask/kubernetes-modern/go.mod requires k8s.io/kubernetes {required}, toolchains.env pins {version}: \
         update the require and the replace block (see the comment at its top) and run `go mod tidy` there"
    );
    let staging = staging_version(version).with_context(|| format!("{version} is not v1.<minor>.<patch>"))?;
    let mut replaced = 0;
    for line in go_mod.lines().map(|l| l.split("//").next().unwrap_or_default().trim()) {
        let Some((from, to)) = line.trim_start_matches("replace").split_once("=>") else { continue };
        let from = from.trim();
        let to: Vec<&str> = to.split_whitespace().collect();
        ensure!(
            from.starts_with("k8s.io/") && to.len() == 2 && to[0] == from && to[1] == staging,
            "go.mod replaces `{line}`; every replacement must be a k8s.io staging module at its published {staging}"
        );
        replaced += 1;
    }
    ensure!(replaced > 0, "go.mod replaces no staging module: upstream's ./staging paths would not resolve");
    Ok(())
}

/// The version `go_mod` requires of `module` (in a `require` block or a one-line `require`).
fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.split("//").next().unwrap_or_default().trim();
        let line = line.strip_prefix("require ").unwrap_or(line);
        let mut words = line.split_whitespace();
        (words.next() == Some(module)).then(|| words.next().map(str::to_owned)).flatten()
    })
}

/// The staging modules' version of a Kubernetes release: `v1.37.2` -> `v0.37.2`.
fn staging_version(version: &str) -> Option<String> {
    let rest = version.strip_prefix("v1.")?;
    let (minor, patch) = rest.split_once('.')?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (numeric(minor) && numeric(patch)).then(|| format!("v0.{minor}.{patch}"))
}

/// `-X` flags setting the version variables Kubernetes' release build sets, so the binaries
/// report `version` (`--version`, `/version`) instead of `v0.0.0-master`.
fn version_ldflags(version: &str) -> Option<String> {
    let (major, rest) = version.strip_prefix('v')?.split_once('.')?;
    let minor = rest.split('.').next()?;
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in VERSION_PACKAGES {
        for (name, value) in [
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            // No git commit exists for a module download; the default is a `$Format` placeholder.
            ("gitCommit", ""),
        ] {
            flags.push(format!("-X {package}.{name}={value}"));
        }
    }
    Some(flags.join(" "))
}

/// The Go toolchain and the build environment: the machine's `go` (the module's `go` line needs
/// 1.26; `GOTOOLCHAIN=local` makes an older one fail with that message rather than download
/// another), with module and build caches under `dir`.
struct Go {
    /// `$GOROOT/bin/go`.
    path: PathBuf,
    /// `go version`'s answer, for the stamp.
    version: String,
    /// The variables of every go command (the rest of the environment is cleared).
    env: Vec<(String, String)>,
}

impl Go {
    fn new(dir: &Path) -> Result<Self> {
        let goroot = capture(Command::new("go").args(["env", "GOROOT"]))
            .context("finding Go (`go` on PATH); the kubernetes-modern build needs Go 1.26 or newer")?;
        let path = PathBuf::from(goroot.trim()).join("bin/go");
        let mut asked = Command::new(&path);
        asked.arg("env");
        asked.args(INHERITED_GO_SETTINGS);
        let values = capture(&mut asked)?;
        let mut env: Vec<(String, String)> = INHERITED_GO_SETTINGS
            .iter()
            .zip(values.lines())
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| ((*name).to_owned(), value.to_owned()))
            .collect();
        env.extend(INHERITED_VARIABLES.iter().filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?))));
        let (modcache, cache, tmp) = (dir.join("mod"), dir.join("cache"), dir.join("tmp"));
        for sub in [&modcache, &cache, &tmp] {
            fs::create_dir_all(sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        let system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        let bin = path.parent().map(Path::to_path_buf).unwrap_or_default();
        env.extend(
            [
                ("PATH", format!("{}:{system_path}", bin.display())),
                ("HOME", std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned())),
                ("LANG", "C.UTF-8".to_owned()),
                ("TMPDIR", tmp.display().to_string()),
                ("GOMODCACHE", modcache.display().to_string()),
                ("GOCACHE", cache.display().to_string()),
                // Settings come from here only: a GOENV file's GOFLAGS or GOTOOLCHAIN do not apply.
                ("GOENV", "off".to_owned()),
                ("GOTOOLCHAIN", "local".to_owned()),
                // The module is built on its own, whatever go.work a parent directory may hold.
                ("GOWORK", "off".to_owned()),
                // readonly: go.mod and go.sum are used as committed, never rewritten; modcacherw:
                // the module cache can be deleted without chmod.
                ("GOFLAGS", "-mod=readonly -modcacherw -buildvcs=false".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let mut go = Self { path, version: String::new(), env };
        go.version = capture(go.command(Path::new("/")).arg("version"))?.trim().to_owned();
        Ok(go)
    }

    /// `nice -n 19 go ...` in `dir`: the builds share the machine with other work.
    fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new("nice");
        command.args(["-n", "19"]).arg(&self.path).current_dir(dir).env_clear();
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// kubelet and kube-apiserver, statically linked, into `out`.
    fn build_kubernetes(&self, module: &Path, out: &Path) -> Result<()> {
        let ldflags = version_ldflags(VERSION).with_context(|| format!("{VERSION} is not v<major>.<minor>..."))?;
        let began = Instant::now();
        eprintln!(
            "xtask: go build {} with {} (~12 min cold on 2 shared cores, niced; once per machine)",
            KUBERNETES_PACKAGES.join(" "),
            self.version
        );
        let mut build = self.command(module);
        build.env("CGO_ENABLED", "0").arg("build").arg("-trimpath").arg(format!("-ldflags={ldflags}"));
        // `-o dir/` with several main packages: one build, shared dependencies compiled once.
        run(build.arg("-o").arg(format!("{}/", out.display())).args(KUBERNETES_PACKAGES))?;
        eprintln!("xtask: kubelet and kube-apiserver built in {:.0?}", began.elapsed());
        Ok(())
    }

    /// runc as its own Makefile builds it (cgo for nsenter, libseccomp), into `out`.
    fn build_runc(&self, module: &Path, version: &str, out: &Path) -> Result<()> {
        let began = Instant::now();
        let mut build = self.command(module);
        build
            .env("CGO_ENABLED", "1")
            .args(["build", "-trimpath", "-tags", "seccomp urfave_cli_no_docs"])
            .arg(format!("-ldflags=-X main.version={}", version.trim_start_matches('v')))
            .arg("-o")
            .arg(out.join("runc"))
            .arg(RUNC_MODULE);
        run(&mut build)?;
        eprintln!("xtask: runc {version} built in {:.0?}", began.elapsed());
        Ok(())
    }
}

/// A downloaded Debian package.
struct Deb {
    package: String,
    version: String,
    file: PathBuf,
}

/// apt with its own configuration, sources, lists and caches under `dir`: one entry for
/// [`DEBIAN_SUITE`] on the machine's own Debian archive. `APT_CONFIG` points at a file that also
/// replaces the main configuration and its parts, so none of the machine's hooks or index
/// targets run; the dpkg status it reads is an empty one of its own.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn create(dir: &Path) -> Result<Self> {
        let (parts, preferences) = (dir.join("apt.conf.d"), dir.join("preferences.d"));
        for sub in [
            &parts,
            &preferences,
            &dir.join("sources.list.d"),
            &dir.join("lists/partial"),
            &dir.join("cache/archives/partial"),
        ] {
            fs::create_dir_all(sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        // Rewritten each time: they follow the machine's sources and settings, which may change.
        let (name, entry) = if let Ok(deb822) = fs::read_to_string(HOST_DEB822) {
            ("sources", suite_stanza(&deb822, DEBIAN_SUITE))
        } else {
            let one_line = fs::read_to_string(HOST_ONE_LINE)
                .with_context(|| format!("reading the machine's Debian sources ({HOST_DEB822}, {HOST_ONE_LINE})"))?;
            ("list", suite_line(&one_line, DEBIAN_SUITE))
        };
        let entry = entry.with_context(|| {
            format!("no enabled Debian `deb` entry for a release archive in {HOST_DEB822} or {HOST_ONE_LINE}")
        })?;
        let sources = dir.join("sources.list.d");
        for stale in fs::read_dir(&sources)?.flatten() {
            let _ = fs::remove_file(stale.path());
        }
        fs::write(sources.join(format!("lifecycle-{DEBIAN_SUITE}.{name}")), entry)
            .context("writing the private apt sources")?;
        fs::write(dir.join("sources.list"), "").context("writing the private apt sources.list")?;
        fs::write(dir.join("status"), "").context("writing the private dpkg status")?;
        let mut machine = Command::new("apt-config");
        let dump =
            capture(machine.arg("dump").env_remove("APT_CONFIG")).context("reading the machine's apt settings")?;
        let config = apt_config(dir, &inherited_apt_settings(&dump));
        fs::write(dir.join("apt.conf"), config).context("writing the private apt.conf")?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.arg("-q").env("APT_CONFIG", self.dir.join("apt.conf")).env("DEBIAN_FRONTEND", "noninteractive");
        command
    }

    fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// Downloads the candidates of `packages` into `dir` (emptied first); returns what came.
    fn download(&self, packages: &[&str], dir: &Path) -> Result<Vec<Deb>> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        run(self.command("apt-get").arg("download").args(packages).current_dir(dir))?;
        let mut debs = Vec::new();
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let file = entry?.path();
            if file.extension().is_none_or(|e| e != "deb") {
                continue;
            }
            let fields =
                capture(Command::new("dpkg-deb").arg("--show").arg("--showformat=${Package} ${Version}").arg(&file))?;
            let (package, version) =
                fields.trim().split_once(' ').with_context(|| format!("dpkg-deb --show {}", file.display()))?;
            debs.push(Deb { package: package.to_owned(), version: version.to_owned(), file });
        }
        for package in packages {
            ensure!(
                debs.iter().any(|d| d.package == *package),
                "apt-get download left no {package} in {}",
                dir.display()
            );
        }
        debs.sort_by(|a, b| a.package.cmp(&b.package));
        Ok(debs)
    }
}

/// The private apt.conf: every directory apt reads or writes is under `dir`, plus the machine's
/// `inherited` settings.
fn apt_config(dir: &Path, inherited: &str) -> String {
    let d = dir.display();
    format!(
        "// Written by xtask (kubernetes_modern.rs) at every build; apt-get reads it through APT_CONFIG.\n\
         Dir::Etc::Main \"/dev/null\";\n\
         Dir::Etc::Parts \"{d}/apt.conf.d\";\n\
         Dir::Etc::SourceList \"{d}/sources.list\";\n\
         Dir::Etc::SourceParts \"{d}/sources.list.d\";\n\
         Dir::Etc::Preferences \"{d}/preferences\";\n\
         Dir::Etc::PreferencesParts \"{d}/preferences.d\";\n\
         Dir::State::Lists \"{d}/lists\";\n\
         Dir::State::status \"{d}/status\";\n\
         Dir::Cache \"{d}/cache\";\n\
         APT::Architectures {{ \"amd64\"; }};\n\
         Acquire::Languages \"none\";\n\
         Acquire::GzipIndexes \"true\";\n\
         // The private directories are root's; apt's download user may not reach them. The\n\
         // downloads are checked against the signed index either way.\n\
         APT::Sandbox::User \"root\";\n\
         {inherited}"
    )
}

/// The lines of `apt-config dump` that set one of [`INHERITED_APT_SETTINGS`] (or a key below it,
/// such as a per-host proxy).
fn inherited_apt_settings(dump: &str) -> String {
    dump.lines()
        .filter(|line| {
            let key = line.split_whitespace().next().unwrap_or_default();
            INHERITED_APT_SETTINGS
                .iter()
                .any(|setting| key.strip_prefix(setting).is_some_and(|rest| rest.is_empty() || rest.starts_with("::")))
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The fields of an enabled deb822 stanza for `deb` entries of a release archive (a suite
/// without a `-security`/`-updates` part), rewritten for `suite` with only the main component,
/// keeping its URIs and key. A Signed-By holding an inline key keeps its continuation lines.
fn suite_stanza(text: &str, suite: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let lines: Vec<&str> = stanza.lines().filter(|l| !l.starts_with('#')).collect();
        // A field is its line plus the indented continuation lines after it.
        let field = |name: &str| -> Option<String> {
            let start = lines.iter().position(|line| {
                line.split_once(':')
                    .is_some_and(|(key, _)| !key.starts_with([' ', '\t']) && key.eq_ignore_ascii_case(name))
            })?;
            let mut value = lines[start].split_once(':')?.1.trim().to_owned();
            for more in lines[start + 1..].iter().take_while(|l| l.starts_with([' ', '\t'])) {
                value.push('\n');
                value.push_str(more);
            }
            Some(value)
        };
        let has_deb = field("Types").is_some_and(|types| types.split_whitespace().any(|t| t == "deb"));
        let enabled = field("Enabled").is_none_or(|value| !value.eq_ignore_ascii_case("no"));
        let release = field("Suites").is_some_and(|suites| suites.split_whitespace().any(|s| !s.contains('-')));
        let Some(uri) = field("URIs").and_then(|uris| uris.split_whitespace().next().map(str::to_owned)) else {
            continue;
        };
        if !has_deb || !enabled || !release {
            continue;
        }
        let mut out = format!("Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n");
        if let Some(key) = field("Signed-By") {
            out.push_str(&format!("Signed-By: {key}\n"));
        }
        return Some(out);
    }
    None
}

/// The first `deb` line of a one-line sources.list for a release archive, rewritten for `suite`
/// with only the main component (its options, such as signed-by, kept).
fn suite_line(text: &str, suite: &str) -> Option<String> {
    text.lines().map(str::trim).find_map(|line| {
        let rest = line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t"))?.trim();
        let (options, rest) = match rest.strip_prefix('[') {
            Some(inner) => {
                let (options, after) = inner.split_once(']')?;
                (format!("[{}] ", options.trim()), after.trim())
            }
            None => (String::new(), rest),
        };
        let mut words = rest.split_whitespace();
        let (uri, release) = (words.next()?, words.next()?);
        (!release.contains('-')).then(|| format!("deb {options}{uri} {suite} main\n"))
    })
}

/// Unpacks `debs` into `prefix` (a fresh directory, renamed into place when complete).
fn unpack(debs: &[Deb], prefix: &Path) -> Result<()> {
    let fresh = prefix.with_extension("new");
    if fresh.exists() {
        fs::remove_dir_all(&fresh).with_context(|| format!("removing {}", fresh.display()))?;
    }
    fs::create_dir_all(&fresh).with_context(|| format!("creating {}", fresh.display()))?;
    for deb in debs {
        run(Command::new("dpkg").arg("-x").arg(&deb.file).arg(&fresh))?;
    }
    if prefix.exists() {
        fs::remove_dir_all(prefix).with_context(|| format!("removing {}", prefix.display()))?;
    }
    fs::rename(&fresh, prefix).with_context(|| format!("moving {} to {}", fresh.display(), prefix.display()))
}

/// Completes `staging` (the Go-built binaries) with links into the prefix, the input copies and
/// the stamp, and puts it in place of `bin/`.
fn install(staging: &Path, debs: &[Deb], go_version: &str, runc_version: &str) -> Result<()> {
    for (_, files) in DEBIAN_PACKAGES {
        for file in *files {
            let name = file.rsplit('/').next().unwrap_or(file);
            // Relative, so the version directory can move as a whole.
            symlink(Path::new("../prefix").join(file), staging.join(name))
                .with_context(|| format!("linking {name}"))?;
        }
    }
    for input in INPUTS {
        let to = staging.join("inputs").join(input);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        fs::copy(modules_dir().join(input), &to).with_context(|| format!("copying {input}"))?;
    }
    let mut stamp = format!("kubernetes={VERSION}\ngo={go_version}\nrunc={runc_version} (built)\n");
    for deb in debs {
        stamp.push_str(&format!("{}={} (Debian {DEBIAN_SUITE})\n", deb.package, deb.version));
    }
    fs::write(staging.join("BUILD"), stamp).context("writing the build stamp")?;
    let bin = node().bin;
    if bin.exists() {
        fs::remove_dir_all(&bin).with_context(|| format!("removing {}", bin.display()))?;
    }
    fs::rename(staging, &bin).with_context(|| format!("moving {} to {}", staging.display(), bin.display()))
}

/// An exclusive flock(2) on a file, released when the file is closed (dropped, or the process dies).
struct Lock {
    _file: fs::File,
}

impl Lock {
    fn acquire(path: &Path) -> Result<Self> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", path.display()));
        }
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::{
        check_go_mod, inherited_apt_settings, modules_dir, required_version, staging_version, suite_line, suite_stanza,
        version_ldflags, RUNC_MODULE, VERSION,
    };

    #[test]
    fn the_committed_go_mod_builds_the_pinned_release() {
        let go_mod = std::fs::read_to_string(modules_dir().join("go.mod")).unwrap_or_default();
        assert!(check_go_mod(&go_mod, VERSION).is_ok(), "{:?}", check_go_mod(&go_mod, VERSION));
        let runc = std::fs::read_to_string(modules_dir().join("runc/go.mod")).unwrap_or_default();
        assert!(required_version(&runc, RUNC_MODULE).is_some_and(|v| v.starts_with("v1.3.")));
    }

    #[test]
    fn go_mod_checks_catch_a_pin_and_go_mod_that_disagree() {
        let good = "module x\n\nrequire (\n\tk8s.io/kubernetes v1.37.2\n\tother v1.0.0 // indirect\n)\n\n\
                    replace (\n\tk8s.io/api => k8s.io/api v0.37.2\n)\n";
        assert!(check_go_mod(good, "v1.37.2").is_ok());
        assert!(check_go_mod(good, "v1.37.3").is_err(), "the require differs from the pin");
        let stale = good.replace("k8s.io/api v0.37.2", "k8s.io/api v0.37.1");
        assert!(check_go_mod(&stale, "v1.37.2").is_err(), "a staging module of another release");
        let local = good.replace("k8s.io/api v0.37.2", "./staging/src/k8s.io/api");
        assert!(check_go_mod(&local, "v1.37.2").is_err(), "upstream's path replacement");
        let one_line = "module x\nrequire k8s.io/kubernetes v1.37.2\nreplace k8s.io/api => k8s.io/api v0.37.2\n";
        assert!(check_go_mod(one_line, "v1.37.2").is_ok());
        assert!(check_go_mod("module x\nrequire k8s.io/kubernetes v1.37.2\n", "v1.37.2").is_err(), "no replace");
    }

    #[test]
    fn versions_derive_from_the_release() {
        assert_eq!(staging_version("v1.37.2").as_deref(), Some("v0.37.2"));
        assert_eq!(staging_version("v1.37"), None);
        assert_eq!(staging_version("1.37.2"), None);
        let flags = version_ldflags("v1.37.2").unwrap_or_default();
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"), "{flags}");
        assert!(flags.contains("-X k8s.io/component-base/version.gitMinor=37"), "{flags}");
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMajor=1"), "{flags}");
    }

    const DEB822: &str = "Types: deb\n# http://snapshot.invalid/archive/debian/20250520T000000Z\n\
                          URIs: http://archive.invalid/debian\nSuites: bookworm bookworm-updates\n\
                          Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                          Types: deb\nURIs: http://archive.invalid/debian-security\nSuites: bookworm-security\n\
                          Components: main\n";

    #[test]
    fn the_release_archive_of_the_machine_becomes_the_suite_entry() {
        assert_eq!(
            suite_stanza(DEB822, "unstable").as_deref(),
            Some(
                "Types: deb\nURIs: http://archive.invalid/debian\nSuites: unstable\nComponents: main\n\
                 Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
            )
        );
        let security_first = {
            let mut stanzas: Vec<&str> = DEB822.split("\n\n").collect();
            stanzas.reverse();
            stanzas.join("\n\n")
        };
        assert!(suite_stanza(&security_first, "unstable").is_some_and(|s| s.contains("archive.invalid/debian\n")));
        let disabled = DEB822.replace("Components: main contrib\n", "Components: main contrib\nEnabled: no\n");
        assert_eq!(suite_stanza(&disabled, "unstable"), None, "only the security archive is left");
        let inline = "Types: deb\nURIs: http://a.invalid/debian\nSuites: trixie\nComponents: main\n\
                      Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n";
        assert!(suite_stanza(inline, "unstable")
            .is_some_and(|s| s.ends_with("Signed-By: \n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n")));
    }

    #[test]
    fn the_release_line_of_a_one_line_list_becomes_the_suite_line() {
        let text = "# comment\ndeb http://archive.invalid/debian-security bookworm-security main\n\
                    deb [signed-by=/k.gpg] http://archive.invalid/debian bookworm main contrib\n";
        assert_eq!(
            suite_line(text, "unstable").as_deref(),
            Some("deb [signed-by=/k.gpg] http://archive.invalid/debian unstable main\n")
        );
        assert_eq!(suite_line("deb-src http://a.invalid/debian bookworm main\n", "unstable"), None);
    }

    #[test]
    fn only_the_verification_and_proxy_settings_are_inherited() {
        let dump = "Acquire::Check-Valid-Until \"false\";\nAcquire::Check-Date \"false\";\n\
                    Acquire::Check-Valid-Until-Extra \"1\";\nAcquire::http::Proxy::archive.invalid \"DIRECT\";\n\
                    Acquire::IndexTargets::deb::DEP-11 \"\";\nDPkg::Post-Invoke:: \"true\";\n";
        assert_eq!(
            inherited_apt_settings(dump),
            "Acquire::Check-Valid-Until \"false\";\nAcquire::Check-Date \"false\";\n\
             Acquire::http::Proxy::archive.invalid \"DIRECT\";\n"
        );
    }
}
