//! Fuzzing: the cargo-fuzz targets in `fuzz/` (a workspace of its own, built with the pinned
//! nightly because libFuzzer's instrumentation takes `-Z` flags), cargo-fuzz installed at the
//! pinned version, and each target run for a number of executions, one at a time, with its log
//! kept in `fuzz/target/logs/<target>.log` and a summary line per target printed at the end.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, packages, shell, toolchain, workspace_root};

/// Every target (`fuzz/fuzz_targets/<name>.rs`) with its longest input (libFuzzer's -max_len):
/// 4096 bytes covers a cgroup path, a query, a request head (the listener reads at most that), a
/// ring record (560 bytes at most) and the /proc files read; annotation maps get twice that so
/// the 4096-byte bound of the probe declaration is crossed; Pod JSON gets 16 KiB; a sequence of
/// the model's commands takes a few bytes each (512 at most), 4096 bytes is hundreds of them.
pub const TARGETS: [(&str, usize); 8] = [
    ("cgroup_identity", 4096),
    ("cri_annotations", 8192),
    ("probe_query", 4096),
    ("http_request_head", 4096),
    ("ring_record", 4096),
    ("proc_parsers", 4096),
    ("pod_spec", 16384),
    ("model_commands", 4096),
];

/// Executions per target in the checks tier's smoke run.
pub const SMOKE_RUNS: u64 = 5_000;
/// Time cap per target in the smoke run (each takes a few seconds once built).
const SMOKE_SECONDS: u64 = 30;

/// How the targets are compiled: optimised for the long runs of `xtask fuzz`; without
/// optimisation for the smoke run, which only shows every target builds and survives its seeds
/// and a few thousand inputs (the same sanitizer, debug assertions and overflow checks either
/// way). Optimised, the smoke run's cold build took 11 of a clean clone's 40 minutes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    Optimised,
    Unoptimised,
}

impl Build {
    /// cargo-fuzz's flag for it (`build` and `run` alike).
    fn flags(self) -> &'static [&'static str] {
        match self {
            Build::Optimised => &[],
            Build::Unoptimised => &["--dev"],
        }
    }
}

/// `xtask fuzz`: which targets, how long.
#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Executions per target (libFuzzer's -runs).
    #[arg(long, default_value_t = 1_000_000)]
    pub runs: u64,
    /// Run only this target (repeatable); every target when none is named.
    #[arg(long = "target", value_parser = clap::builder::PossibleValuesParser::new(TARGETS.map(|(name, _)| name)))]
    pub targets: Vec<String>,
    /// Stop a target after this many seconds even if its runs are not done (-max_total_time).
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
}

/// How one target's run went.
#[derive(Debug)]
struct Report {
    target: &'static str,
    stats: Stats,
    wall: Duration,
    /// Exit status was success; otherwise libFuzzer found a crash, leak, timeout or OOM.
    passed: bool,
}

/// What libFuzzer's `-print_final_stats=1` lines say.
#[derive(Debug, Default, PartialEq, Eq)]
struct Stats {
    executions: Option<u64>,
    new_units: Option<u64>,
    peak_rss_mb: Option<u64>,
}

/// Installs what fuzzing needs, builds every target and runs the chosen ones.
pub fn run(args: &FuzzArgs) -> Result<()> {
    let targets: Vec<(&'static str, usize)> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        TARGETS.into_iter().filter(|(name, _)| args.targets.iter().any(|t| t == name)).collect()
    };
    fuzz(&targets, args.runs, args.max_seconds, Build::Optimised)
}

/// The checks tier's part: the fuzz crate's formatting (outside the workspace, `cargo fmt --all`
/// does not see it), then every target for [`SMOKE_RUNS`] executions.
pub fn smoke() -> Result<()> {
    let stable = toolchain::STABLE;
    eprintln!("xtask: cargo +{stable} fmt --manifest-path fuzz/Cargo.toml -- --check");
    if let Err(err) = shell::run(cargo().args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"])) {
        bail!(
            "fuzz/ formatting differs from rustfmt.toml (the diff is above); run `cargo +{stable} fmt --manifest-path \
             fuzz/Cargo.toml` ({err:#})"
        );
    }
    fuzz(&TARGETS, SMOKE_RUNS, SMOKE_SECONDS, Build::Unoptimised)
}

fn fuzz(targets: &[(&'static str, usize)], runs: u64, max_seconds: u64, build: Build) -> Result<()> {
    packages::ensure(packages::FUZZ)?;
    ensure_cargo_fuzz()?;
    let flags = build.flags().join(" ");
    eprintln!("xtask: building the fuzz targets (cargo +{} fuzz build {flags})", toolchain::EBPF_NIGHTLY);
    shell::run(nightly_cargo().args(["fuzz", "build"]).args(build.flags()))?;
    let mut reports = Vec::new();
    for &(target, max_len) in targets {
        reports.push(run_target(target, max_len, runs, max_seconds, build)?);
    }
    println!("| target | executions | wall time | exec/s | new corpus units | peak RSS | result |");
    println!("|---|---|---|---|---|---|---|");
    for report in &reports {
        println!("{}", report.row(runs));
    }
    let failed: Vec<&str> = reports.iter().filter(|r| !r.passed).map(|r| r.target).collect();
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {}; the inputs are in fuzz/artifacts/<target>/ and the logs in fuzz/target/logs/",
            failed.join(", ")
        );
    }
    Ok(())
}

/// `cargo +<EBPF_NIGHTLY>` at the workspace root (cargo fuzz finds `fuzz/` from there).
fn nightly_cargo() -> Command {
    let mut command = Command::new("cargo");
    command.arg(format!("+{}", toolchain::EBPF_NIGHTLY)).current_dir(workspace_root());
    command
}

/// Whether `cargo fuzz --version` printed exactly the pinned version.
fn is_version(printed: &str, version: &str) -> bool {
    printed.lines().next().map(str::trim) == Some(format!("cargo-fuzz {version}").as_str())
}

/// Installs cargo-fuzz at [`toolchain::CARGO_FUZZ_VERSION`] into `$CARGO_HOME/bin` unless that
/// version is there (another version is replaced).
fn ensure_cargo_fuzz() -> Result<()> {
    let version = toolchain::CARGO_FUZZ_VERSION;
    let printed = nightly_cargo().args(["fuzz", "--version"]).output();
    if printed.is_ok_and(|out| out.status.success() && is_version(&String::from_utf8_lossy(&out.stdout), version)) {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz {version} with {} (~1 min, once)", toolchain::EBPF_NIGHTLY);
    shell::run(nightly_cargo().args(["install", "cargo-fuzz", "--version", version, "--locked"]))
}

/// libFuzzer's arguments after `--`.
fn libfuzzer_args(runs: u64, max_len: usize, max_seconds: u64) -> Vec<String> {
    vec![
        format!("-runs={runs}"),
        format!("-max_len={max_len}"),
        "-rss_limit_mb=2048".to_owned(),
        // One input taking this long is a hang, reported like a crash.
        "-timeout=10".to_owned(),
        format!("-max_total_time={max_seconds}"),
        "-print_final_stats=1".to_owned(),
    ]
}

/// Runs one target; its output goes to the log, which is shown (the end of it) when it fails.
fn run_target(target: &'static str, max_len: usize, runs: u64, max_seconds: u64, build: Build) -> Result<Report> {
    let root = workspace_root();
    let fuzz = root.join("fuzz");
    // libFuzzer adds what it finds to the first corpus folder: a scratch one, so the committed
    // seeds stay as they are; regressions (fixed crashes) are replayed on every run.
    let scratch = fuzz.join("target/corpus").join(target);
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let mut corpora = vec![scratch, fuzz.join("corpus").join(target)];
    corpora.extend(Some(fuzz.join("regressions").join(target)).filter(|dir| dir.is_dir()));
    let logs = fuzz.join("target/logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join(format!("{target}.log"));
    let log = File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the log file handle")?;

    let mut command = nightly_cargo();
    command
        .args(["fuzz", "run"])
        .args(build.flags())
        .arg(target)
        .args(&corpora)
        .arg("--")
        .args(libfuzzer_args(runs, max_len, max_seconds))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    eprintln!("xtask: fuzzing {target}: {runs} runs, at most {max_seconds} s (log: {})", relative(&log_path));
    let start = Instant::now();
    let status = command.status().with_context(|| format!("starting {command:?}"))?;
    let wall = start.elapsed();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let report = Report { target, stats: Stats::parse(&text), wall, passed: status.success() };
    if !report.passed {
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("xtask: {target} failed ({status}); the end of {}:", relative(&log_path));
        for line in &lines[lines.len().saturating_sub(60)..] {
            eprintln!("  {line}");
        }
    }
    eprintln!("{}", report.row(runs));
    Ok(report)
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace_root()).map(PathBuf::from).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

impl Stats {
    /// Reads the `stat::<name>: <value>` lines libFuzzer prints last.
    fn parse(log: &str) -> Self {
        let stat = |name: &str| {
            log.lines()
                .rev()
                .find_map(|line| line.strip_prefix("stat::")?.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().parse().ok())
        };
        Self {
            executions: stat("number_of_executed_units"),
            new_units: stat("new_units_added"),
            peak_rss_mb: stat("peak_rss_mb"),
        }
    }
}

impl Report {
    /// One markdown table row (BENCHMARKS.md takes them as printed).
    fn row(&self, runs: u64) -> String {
        let seconds = self.wall.as_secs_f64();
        let show = |value: Option<u64>| value.map_or_else(|| "?".to_owned(), |v| v.to_string());
        let rate = match self.stats.executions {
            Some(executions) if seconds > 0.0 => format!("{:.0}", executions as f64 / seconds),
            _ => "?".to_owned(),
        };
        let result = match (self.passed, self.stats.executions) {
            (false, _) => "FAILED (crash, timeout or OOM)".to_owned(),
            (true, Some(executions)) if executions < runs => format!("0 crashes; time cap reached before {runs} runs"),
            (true, _) => "0 crashes".to_owned(),
        };
        format!(
            "| {} | {} | {seconds:.1} s | {rate} | {} | {} MB | {result} |",
            self.target,
            show(self.stats.executions),
            show(self.stats.new_units),
            show(self.stats.peak_rss_mb),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{is_version, libfuzzer_args, Report, Stats, TARGETS};
    use crate::workspace_root;

    /// The end of a libFuzzer run with -print_final_stats=1.
    const LOG: &str = "#20000\tDONE   cov: 812 ft: 2417 corp: 506/27Kb lim: 4096 exec/s: 6666 rss: 251Mb\n\
                       Done 20000 runs in 3 second(s)\n\
                       stat::number_of_executed_units: 20000\n\
                       stat::average_exec_per_sec:     6666\n\
                       stat::new_units_added:          899\n\
                       stat::slowest_unit_time_sec:    0\n\
                       stat::peak_rss_mb:              251\n";

    #[test]
    fn final_stats_are_read() {
        let stats = Stats::parse(LOG);
        assert_eq!(stats, Stats { executions: Some(20_000), new_units: Some(899), peak_rss_mb: Some(251) });
        assert_eq!(Stats::parse("==1== ERROR: libFuzzer: deadly signal\n"), Stats::default());
    }

    #[test]
    fn rows_say_when_the_time_cap_cut_a_run_short() {
        let report = |executions, passed| Report {
            target: "probe_query",
            stats: Stats { executions: Some(executions), new_units: Some(3), peak_rss_mb: Some(40) },
            wall: std::time::Duration::from_secs(4),
            passed,
        };
        assert_eq!(report(20_000, true).row(20_000), "| probe_query | 20000 | 4.0 s | 5000 | 3 | 40 MB | 0 crashes |");
        assert!(report(100, true).row(20_000).ends_with("time cap reached before 20000 runs |"));
        assert!(report(100, false).row(20_000).contains("FAILED"));
    }

    #[test]
    fn the_installed_version_is_matched_exactly() {
        assert!(is_version("cargo-fuzz 0.13.2\n", "0.13.2"));
        assert!(!is_version("cargo-fuzz 0.13.1\n", "0.13.2"));
        assert!(!is_version("cargo-fuzz 0.13.20\n", "0.13.2"));
        assert!(!is_version("error: no such command: `fuzz`\n", "0.13.2"));
    }

    #[test]
    fn libfuzzer_gets_runs_length_and_time_cap() {
        let args = libfuzzer_args(7, 4096, 60);
        for wanted in ["-runs=7", "-max_len=4096", "-max_total_time=60", "-print_final_stats=1"] {
            assert!(args.iter().any(|a| a == wanted), "{wanted} missing from {args:?}");
        }
    }

    /// The list here, the [[bin]] entries of fuzz/Cargo.toml and the files in fuzz/fuzz_targets/
    /// name the same targets, each with a seed corpus.
    #[test]
    fn targets_match_the_fuzz_crate() {
        let fuzz = workspace_root().join("fuzz");
        let mut files: Vec<String> = std::fs::read_dir(fuzz.join("fuzz_targets"))
            .expect("fuzz/fuzz_targets")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok()?.strip_suffix(".rs").map(str::to_owned))
            .collect();
        files.sort();
        let mut listed: Vec<String> = TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
        listed.sort();
        assert_eq!(files, listed);
        let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
        for name in &listed {
            assert!(manifest.contains(&format!("name = \"{name}\"")), "fuzz/Cargo.toml has no [[bin]] {name}");
            let seeds = std::fs::read_dir(fuzz.join("corpus").join(name)).map(|dir| dir.count()).unwrap_or(0);
            assert!(seeds > 0, "fuzz/corpus/{name} has no seeds");
        }
    }
}
