//! docs/kernel-matrix.md, rewritten from the rows the matrix tests wrote (one `<boot>.row` file
//! per boot, lifecycle-agent/tests/matrix.rs): per boot the kernel it really ran, the cgroup
//! layout the guest had, each check's result and the times; then every failure with what was
//! found.
//!
//! A row is `key=value` lines plus one `check=<name>\t<pass|fail>\t<detail>` line per check, in
//! the table's order (plain text: no JSON parser in xtask, whose lock-file entries are an input
//! of the checked-in eBPF object's digest).

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::shell::capture;

/// One boot's row.
#[derive(Debug, Default)]
struct Row {
    fields: Vec<(String, String)>,
    /// (name, passed, detail)
    checks: Vec<(String, bool, String)>,
}

impl Row {
    fn parse(text: &str) -> Self {
        let mut row = Row::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            if key == "check" {
                let mut parts = value.splitn(3, '\t');
                let (name, result, detail) = (parts.next(), parts.next(), parts.next());
                if let (Some(name), Some(result)) = (name, result) {
                    row.checks.push((name.to_owned(), result == "pass", detail.unwrap_or("").to_owned()));
                }
            } else {
                row.fields.push((key.to_owned(), value.to_owned()));
            }
        }
        row
    }

    fn get(&self, key: &str) -> &str {
        self.fields.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v.as_str())
    }

    /// `key`, or `fallback` when it is empty.
    fn get_or<'a>(&'a self, key: &str, fallback: &str) -> &'a str {
        match self.get(key) {
            "" => self.get(fallback),
            value => value,
        }
    }
}

/// Renders every row in `rows` into `out`; returns how many rows there were (none: nothing is
/// written).
pub fn write(rows: &Path, out: &Path, command: &str) -> Result<usize> {
    let boots = read(rows)?;
    if boots.is_empty() {
        return Ok(0);
    }
    let date = capture(Command::new("date").args(["-u", "+%Y-%m-%d"])).unwrap_or_default();
    let commit =
        capture(Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(rows)).unwrap_or_default();
    fs::write(out, render(&boots, date.trim(), commit.trim(), command))
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(boots.len())
}

/// Every row in `rows`, in the matrix's order.
fn read(rows: &Path) -> Result<Vec<Row>> {
    let mut boots = Vec::new();
    for entry in fs::read_dir(rows).with_context(|| format!("reading {}", rows.display()))?.flatten() {
        if entry.path().extension().is_some_and(|e| e == "row") {
            boots.push(Row::parse(&fs::read_to_string(entry.path())?));
        }
    }
    boots.sort_by_key(|b| b.get("order").parse::<u32>().unwrap_or(u32::MAX));
    Ok(boots)
}

/// `<boot>: <check>: <detail>` for each failed check in `rows`: what the tier prints last, so
/// the end of a long log says what failed (a test's panic ends in its backtrace).
pub fn failures(rows: &Path) -> Vec<String> {
    let boots = read(rows).unwrap_or_default();
    boots
        .iter()
        .flat_map(|boot| {
            boot.checks
                .iter()
                .filter(|(_, passed, _)| !passed)
                .map(|(name, _, detail)| format!("{}: {name}: {detail}", boot.get("boot")))
        })
        .collect()
}

fn render(boots: &[Row], date: &str, commit: &str, command: &str) -> String {
    // The columns: every check any boot has, in the order they first appear.
    let mut columns: Vec<&str> = Vec::new();
    for (name, _, _) in boots.iter().flat_map(|b| &b.checks) {
        if !columns.contains(&name.as_str()) {
            columns.push(name);
        }
    }
    let mut text = format!(
        "# Kernel matrix\n\n\
         Written by `{command}` (`xtask/src/matrix/`, `lifecycle-agent/tests/matrix.rs`) on {date} at `{commit}`; \
         do not edit by hand. Each row is one boot of a Debian cloud kernel under qemu (TCG, 1 vCPU; no KVM): \
         amd64 guests run a Debian bookworm root filesystem with systemd 252 as PID 1, containerd and runc, \
         with the cgroup layout asked of systemd on the kernel command line; the arm64 guest runs busybox as \
         PID 1 and mounts cgroup2 itself. The agent is the debug build of this commit. `boot s` is the \
         guest's uptime when its check began, `check s` how long the check ran in the guest, `wall s` qemu's \
         whole run. What each check asserts: `lifecycle-agent/tests/matrix/checks.rs`.\n\n"
    );
    text.push_str("| boot | kernel (`uname -r`) | Debian package | cgroups |");
    for column in &columns {
        text.push_str(&format!(" {column} |"));
    }
    text.push_str(" boot s | check s | wall s |\n|---|---|---|---|");
    text.push_str(&"---|".repeat(columns.len() + 3));
    text.push('\n');
    for boot in boots {
        text.push_str(&format!(
            "| {} | {} | {} ({}) | {} |",
            boot.get("boot"),
            boot.get_or("uname", "release"),
            boot.get("package"),
            boot.get("suite"),
            boot.get_or("cgroup_mode", "mode"),
        ));
        for column in &columns {
            text.push_str(match boot.checks.iter().find(|(name, _, _)| name == column) {
                Some((_, true, _)) => " pass |",
                Some((_, false, _)) => " **FAIL** |",
                None => " — |",
            });
        }
        for field in ["boot_seconds", "check_seconds", "wall_seconds"] {
            match boot.get(field).parse::<f64>() {
                Ok(seconds) => text.push_str(&format!(" {seconds:.0} |")),
                Err(_) => text.push_str(" — |"),
            }
        }
        text.push('\n');
    }
    let mut failures = String::new();
    for boot in boots {
        for (name, _, detail) in boot.checks.iter().filter(|(_, passed, _)| !passed) {
            let detail: String = detail.chars().take(600).collect();
            failures.push_str(&format!("- {} `{name}`: {detail}\n", boot.get("boot")));
        }
    }
    if !failures.is_empty() {
        text.push_str("\n## Failures\n\n");
        text.push_str(&failures);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{render, Row};

    #[test]
    fn rows_become_a_table_with_the_failures_under_it() {
        let boots = [
            Row::parse(
                "boot=a_unified\norder=1\nuname=5.10.0-32-cloud-amd64\npackage=linux-image-5.10.0-32-cloud-amd64 \
                 5.10.223-1\nsuite=bullseye\ncgroup_mode=unified\nboot_seconds=14.2\ncheck_seconds=3.0\n\
                 wall_seconds=20.0\ncheck=starts\tfail\terror: no member\n",
            ),
            Row::parse(
                "boot=b_arm64\norder=2\nuname=\nrelease=6.12-arm64\npackage=p\nsuite=trixie\nmode=unified\n\
                 check=starts\tpass\t\ncheck=exit\tpass\tcode 7\n",
            ),
        ];
        let text = render(&boots, "2026-11-29", "abc", "xtask/x.sh test --tier matrix");
        let header =
            "| boot | kernel (`uname -r`) | Debian package | cgroups | starts | exit | boot s | check s | wall s |\n";
        assert!(text.contains(header), "{text}");
        let first = "| a_unified | 5.10.0-32-cloud-amd64 | linux-image-5.10.0-32-cloud-amd64 5.10.223-1 (bullseye) | \
                     unified | **FAIL** | — | 14 | 3 | 20 |";
        assert!(text.contains(first), "{text}");
        assert!(text.contains("| b_arm64 | 6.12-arm64 | p (trixie) | unified | pass | pass | — | — | — |"), "{text}");
        assert!(text.contains("- a_unified `starts`: error: no member\n"), "{text}");
    }
}
