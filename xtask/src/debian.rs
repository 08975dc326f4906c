//! Debian packages from suites this machine does not run, without touching its own apt: a
//! private apt configuration whose only entries are derived at run time from the machine's own
//! Debian archive entry (no archive host is written in the repository), downloads with
//! `apt-get download`, and unpacking into private prefixes with `dpkg -x`. Used by the modern
//! node (containerd's peers from unstable) and the kernel matrix (Debian's kernels of four
//! suites, arm64 packages).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Context as _, Result};

use crate::shell::{capture, run};

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

/// A downloaded Debian package.
pub struct Deb {
    pub package: String,
    pub version: String,
    pub file: PathBuf,
}

/// apt with its own configuration, sources, lists and caches under `dir`: one entry per suite
/// on the machine's own Debian archive. `APT_CONFIG` points at a file that also replaces the
/// main configuration and its parts, so none of the machine's hooks or index targets run; the
/// dpkg status it reads is an empty one of its own.
pub struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    /// The configuration for `suites` (main component) and package `architectures`.
    pub fn create(dir: &Path, suites: &[&str], architectures: &[&str]) -> Result<Self> {
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
        let (name, entry) = machine_entry(suites)?;
        let sources = dir.join("sources.list.d");
        for stale in fs::read_dir(&sources)?.flatten() {
            let _ = fs::remove_file(stale.path());
        }
        fs::write(sources.join(format!("lifecycle.{name}")), entry).context("writing the private apt sources")?;
        fs::write(dir.join("sources.list"), "").context("writing the private apt sources.list")?;
        fs::write(dir.join("status"), "").context("writing the private dpkg status")?;
        let mut machine = Command::new("apt-config");
        let dump =
            capture(machine.arg("dump").env_remove("APT_CONFIG")).context("reading the machine's apt settings")?;
        let config = apt_config(dir, architectures, &inherited_apt_settings(&dump));
        fs::write(dir.join("apt.conf"), config).context("writing the private apt.conf")?;
        Ok(Self { dir: dir.to_owned() })
    }

    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.arg("-q").env("APT_CONFIG", self.dir.join("apt.conf")).env("DEBIAN_FRONTEND", "noninteractive");
        command
    }

    pub fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// The `Depends` field of `package` (`name`, `name/suite` or `name:arch/suite`, as apt-cache
    /// takes it), as its entries' package names with their version constraints.
    pub fn depends(&self, package: &str) -> Result<Vec<String>> {
        let shown = capture(self.command("apt-cache").args(["show", "--no-all-versions", package]))?;
        let field = shown
            .lines()
            .find_map(|line| line.strip_prefix("Depends:"))
            .with_context(|| format!("apt-cache show {package}: no Depends"))?;
        Ok(field.split(',').map(|entry| entry.trim().to_owned()).filter(|e| !e.is_empty()).collect())
    }

    /// Downloads `packages` (anything `apt-get download` takes: `name`, `name=version`,
    /// `name:arch=version`) into `dir` (emptied first); returns what came, one per package.
    pub fn download(&self, packages: &[&str], dir: &Path) -> Result<Vec<Deb>> {
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
            let name = package.split(['=', ':', '/']).next().unwrap_or(package);
            ensure!(debs.iter().any(|d| d.package == name), "apt-get download left no {name} in {}", dir.display());
        }
        debs.sort_by(|a, b| a.package.cmp(&b.package));
        Ok(debs)
    }
}

/// The URI of the machine's Debian release archive (for debootstrap, which takes a mirror and
/// not a sources entry).
pub fn archive_uri() -> Result<String> {
    let (_, entry) = machine_entry(&["stable"])?;
    entry
        .lines()
        .find_map(|line| line.strip_prefix("URIs: "))
        .map(str::to_owned)
        .or_else(|| {
            // A one-line entry: `deb [options] URI suite main`.
            let rest = entry.trim().strip_prefix("deb ")?.trim();
            let rest = match rest.strip_prefix('[') {
                Some(inner) => inner.split_once(']')?.1.trim(),
                None => rest,
            };
            rest.split_whitespace().next().map(str::to_owned)
        })
        .context("the machine's Debian entry names no URI")
}

/// The machine's release archive as a private entry for `suites`: `("sources", deb822)` or
/// `("list", one-line entries)`.
fn machine_entry(suites: &[&str]) -> Result<(&'static str, String)> {
    let (name, entry) = if let Ok(deb822) = fs::read_to_string(HOST_DEB822) {
        ("sources", suite_stanza(&deb822, suites))
    } else {
        let one_line = fs::read_to_string(HOST_ONE_LINE)
            .with_context(|| format!("reading the machine's Debian sources ({HOST_DEB822}, {HOST_ONE_LINE})"))?;
        ("list", suite_line(&one_line, suites))
    };
    let entry = entry.with_context(|| {
        format!("no enabled Debian `deb` entry for a release archive in {HOST_DEB822} or {HOST_ONE_LINE}")
    })?;
    Ok((name, entry))
}

/// The private apt.conf: every directory apt reads or writes is under `dir`, plus the machine's
/// `inherited` settings.
pub(crate) fn apt_config(dir: &Path, architectures: &[&str], inherited: &str) -> String {
    let d = dir.display();
    let architectures: String = architectures.iter().map(|a| format!("\"{a}\"; ")).collect();
    format!(
        "// Written by xtask (debian.rs) at every use; apt-get reads it through APT_CONFIG.\n\
         Dir::Etc::Main \"/dev/null\";\n\
         Dir::Etc::Parts \"{d}/apt.conf.d\";\n\
         Dir::Etc::SourceList \"{d}/sources.list\";\n\
         Dir::Etc::SourceParts \"{d}/sources.list.d\";\n\
         Dir::Etc::Preferences \"{d}/preferences\";\n\
         Dir::Etc::PreferencesParts \"{d}/preferences.d\";\n\
         Dir::State::Lists \"{d}/lists\";\n\
         Dir::State::status \"{d}/status\";\n\
         Dir::Cache \"{d}/cache\";\n\
         APT::Architectures {{ {architectures}}};\n\
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
pub(crate) fn inherited_apt_settings(dump: &str) -> String {
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
/// without a `-security`/`-updates` part), rewritten for `suites` with only the main component,
/// keeping its URIs and key. A Signed-By holding an inline key keeps its continuation lines.
pub(crate) fn suite_stanza(text: &str, suites: &[&str]) -> Option<String> {
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
        let mut out = format!("Types: deb\nURIs: {uri}\nSuites: {}\nComponents: main\n", suites.join(" "));
        if let Some(key) = field("Signed-By") {
            out.push_str(&format!("Signed-By: {key}\n"));
        }
        return Some(out);
    }
    None
}

/// The first `deb` line of a one-line sources.list for a release archive, rewritten as one line
/// per suite of `suites` with only the main component (its options, such as signed-by, kept).
pub(crate) fn suite_line(text: &str, suites: &[&str]) -> Option<String> {
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
        (!release.contains('-'))
            .then(|| suites.iter().map(|suite| format!("deb {options}{uri} {suite} main\n")).collect())
    })
}

/// Unpacks `debs` into `prefix` (a fresh directory, renamed into place when complete).
pub fn unpack(debs: &[Deb], prefix: &Path) -> Result<()> {
    let name = prefix.file_name().context("unpacking into a directory without a name")?.to_string_lossy();
    let fresh = prefix.with_file_name(format!("{name}.new"));
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

#[cfg(test)]
mod tests {
    use super::{apt_config, inherited_apt_settings, suite_line, suite_stanza};

    const DEB822: &str = "Types: deb\n# http://snapshot.invalid/archive/debian/20250520T000000Z\n\
                          URIs: http://archive.invalid/debian\nSuites: bookworm bookworm-updates\n\
                          Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                          Types: deb\nURIs: http://archive.invalid/debian-security\nSuites: bookworm-security\n\
                          Components: main\n";

    #[test]
    fn the_release_archive_of_the_machine_becomes_the_suite_entry() {
        assert_eq!(
            suite_stanza(DEB822, &["unstable"]).as_deref(),
            Some(
                "Types: deb\nURIs: http://archive.invalid/debian\nSuites: unstable\nComponents: main\n\
                 Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
            )
        );
        assert!(suite_stanza(DEB822, &["bullseye", "sid"]).is_some_and(|s| s.contains("\nSuites: bullseye sid\n")));
        let security_first = {
            let mut stanzas: Vec<&str> = DEB822.split("\n\n").collect();
            stanzas.reverse();
            stanzas.join("\n\n")
        };
        assert!(suite_stanza(&security_first, &["unstable"]).is_some_and(|s| s.contains("archive.invalid/debian\n")));
        let disabled = DEB822.replace("Components: main contrib\n", "Components: main contrib\nEnabled: no\n");
        assert_eq!(suite_stanza(&disabled, &["unstable"]), None, "only the security archive is left");
        let inline = "Types: deb\nURIs: http://a.invalid/debian\nSuites: trixie\nComponents: main\n\
                      Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n";
        assert!(suite_stanza(inline, &["unstable"])
            .is_some_and(|s| s.ends_with("Signed-By: \n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n")));
    }

    #[test]
    fn the_release_line_of_a_one_line_list_becomes_the_suite_lines() {
        let text = "# comment\ndeb http://archive.invalid/debian-security bookworm-security main\n\
                    deb [signed-by=/k.gpg] http://archive.invalid/debian bookworm main contrib\n";
        assert_eq!(
            suite_line(text, &["unstable"]).as_deref(),
            Some("deb [signed-by=/k.gpg] http://archive.invalid/debian unstable main\n")
        );
        assert_eq!(
            suite_line(text, &["bullseye", "trixie"]).as_deref(),
            Some(
                "deb [signed-by=/k.gpg] http://archive.invalid/debian bullseye main\n\
                 deb [signed-by=/k.gpg] http://archive.invalid/debian trixie main\n"
            )
        );
        assert_eq!(suite_line("deb-src http://a.invalid/debian bookworm main\n", &["unstable"]), None);
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

    #[test]
    fn the_private_configuration_names_its_architectures() {
        let config = apt_config(std::path::Path::new("/c"), &["amd64", "arm64"], "");
        assert!(config.contains("APT::Architectures { \"amd64\"; \"arm64\"; };\n"), "{config}");
        assert!(config.contains("Dir::State::Lists \"/c/lists\";\n"), "{config}");
    }
}
