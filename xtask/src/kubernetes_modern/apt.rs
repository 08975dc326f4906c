//! The Debian side of the modern node: a private apt configuration for Debian unstable derived
//! from this machine's own archive entry, the download of containerd, etcd and the CNI plugins,
//! and their unpacking into a private prefix (`dpkg -x`); the system's packages are untouched.

use super::*;

/// A downloaded Debian package.
pub(super) struct Deb {
    pub(super) package: String,
    pub(super) version: String,
    pub(super) file: PathBuf,
}

/// apt with its own configuration, sources, lists and caches under `dir`: one entry for
/// [`DEBIAN_SUITE`] on the machine's own Debian archive. `APT_CONFIG` points at a file that also
/// replaces the main configuration and its parts, so none of the machine's hooks or index
/// targets run; the dpkg status it reads is an empty one of its own.
pub(super) struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    pub(super) fn create(dir: &Path) -> Result<Self> {
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

    pub(super) fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.arg("-q").env("APT_CONFIG", self.dir.join("apt.conf")).env("DEBIAN_FRONTEND", "noninteractive");
        command
    }

    pub(super) fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// Downloads the candidates of `packages` into `dir` (emptied first); returns what came.
    pub(super) fn download(&self, packages: &[&str], dir: &Path) -> Result<Vec<Deb>> {
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
pub(super) fn apt_config(dir: &Path, inherited: &str) -> String {
    let d = dir.display();
    format!(
        "// Written by xtask (kubernetes_modern/apt.rs) at every build; apt-get reads it through APT_CONFIG.\n\
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
pub(super) fn inherited_apt_settings(dump: &str) -> String {
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
pub(super) fn suite_stanza(text: &str, suite: &str) -> Option<String> {
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
pub(super) fn suite_line(text: &str, suite: &str) -> Option<String> {
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
pub(super) fn unpack(debs: &[Deb], prefix: &Path) -> Result<()> {
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
