//! The Go side of the modern node: our go.mod's agreement with the pin (the `k8s.io/kubernetes`
//! release and each staging module's replace), the version ldflags Kubernetes' own build sets,
//! and the `go build` of kubelet, kube-apiserver and runc with caches under the version's
//! directory. [`Go`] and [`required_version`] also build helm (`crate::helm`).

use super::*;

/// Fails unless `go.mod` requires `k8s.io/kubernetes` at `version` and replaces every `k8s.io/`
/// module with the same module at `v0.<minor>.<patch>` of that release: the pin and the go.mod
/// are two places that must say the same release.
pub(super) fn check_go_mod(go_mod: &str, version: &str) -> Result<()> {
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
pub(crate) fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.split("//").next().unwrap_or_default().trim();
        let line = line.strip_prefix("require ").unwrap_or(line);
        let mut words = line.split_whitespace();
        (words.next() == Some(module)).then(|| words.next().map(str::to_owned)).flatten()
    })
}

/// The staging modules' version of a Kubernetes release: `v1.37.2` -> `v0.37.2`.
pub(super) fn staging_version(version: &str) -> Option<String> {
    let rest = version.strip_prefix("v1.")?;
    let (minor, patch) = rest.split_once('.')?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (numeric(minor) && numeric(patch)).then(|| format!("v0.{minor}.{patch}"))
}

/// `-X` flags setting the version variables Kubernetes' release build sets, so the binaries
/// report `version` (`--version`, `/version`) instead of `v0.0.0-master`.
pub(super) fn version_ldflags(version: &str) -> Option<String> {
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
pub(crate) struct Go {
    /// `$GOROOT/bin/go`.
    path: PathBuf,
    /// `go version`'s answer, for the stamp.
    pub(crate) version: String,
    /// The variables of every go command (the rest of the environment is cleared).
    env: Vec<(String, String)>,
}

impl Go {
    pub(crate) fn new(dir: &Path) -> Result<Self> {
        let goroot = capture(Command::new("go").args(["env", "GOROOT"]))
            .context("finding Go (`go` on PATH); the kubernetes-modern and helm builds need Go 1.26 or newer")?;
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
    pub(crate) fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new("nice");
        command.args(["-n", "19"]).arg(&self.path).current_dir(dir).env_clear();
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// kubelet and kube-apiserver, statically linked, into `out`.
    pub(super) fn build_kubernetes(&self, module: &Path, out: &Path) -> Result<()> {
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

    /// containerd's `packages` (the daemon, its runc shim, `ctr`) without cgo, as upstream's
    /// static releases are, with the version `containerd --version` prints, into `out`.
    pub(super) fn build_containerd(&self, module: &Path, version: &str, packages: &[&str], out: &Path) -> Result<()> {
        let began = Instant::now();
        let mut build = self.command(module);
        build
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath"])
            .arg(format!("-ldflags=-X github.com/containerd/containerd/v2/version.Version={version}"))
            .arg("-o")
            .arg(format!("{}/", out.display()))
            .args(packages);
        run(&mut build)?;
        eprintln!("xtask: containerd {version} built in {:.0?}", began.elapsed());
        Ok(())
    }

    /// runc as its own Makefile builds it (cgo for nsenter, libseccomp), into `out`.
    pub(super) fn build_runc(&self, module: &Path, version: &str, out: &Path) -> Result<()> {
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
