//! What a probe asks and how it is judged: [`CheckSpec`] parsed from the probe URL, and
//! [`CheckSpec::evaluate`] against an [`Observed`] snapshot at a given time.
//!
//! Pure: text in, spec out; snapshot and `CLOCK_BOOTTIME` ns in, [`Verdict`] out. No clock, no
//! /proc. The snapshot joins the model's facts of the container (its netns's listeners and its
//! main process, `model::node::ProbeFacts`) with the files the probe layer read.

use std::{collections::HashMap, fmt, sync::Arc};

use super::{query::Query, tcp};
use crate::model::duration;
pub(crate) use crate::model::probe::{AcceptFacts, ProcessFacts, ProcessState};

/// Stall limit of a tcp check that does not say `stall=`.
pub(crate) const DEFAULT_STALL_NS: u64 = 5_000_000_000;
/// Bytes of a file read for `contains=` (the match must fall in the first this-many bytes).
pub(crate) const FILE_HEAD_BYTES: usize = 4096;

/// One check, or several that must all pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckSpec {
    /// A listener on `port` in the pod's netns accepts what it is given within `stall_ns`.
    Tcp { port: u16, stall_ns: u64 },
    /// The container's main process is alive, not stopped, not a zombie, and (if set) not in
    /// uninterruptible sleep (D) for longer than the limit.
    Process { max_uninterruptible_ns: Option<u64> },
    /// A file in the container's root exists, optionally modified within `max_age_ns`, and
    /// optionally contains a string in its first [`FILE_HEAD_BYTES`].
    File { path: String, max_age_ns: Option<u64>, contains: Option<String> },
    /// Every member passes.
    AllOf(Vec<CheckSpec>),
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub pass: bool,
    /// One line, no trailing newline: why it failed, or what passed.
    pub reason: String,
}

impl Verdict {
    pub(crate) fn pass(reason: impl Into<String>) -> Self {
        Self { pass: true, reason: reason.into() }
    }

    pub(crate) fn fail(reason: impl Into<String>) -> Self {
        Self { pass: false, reason: reason.into() }
    }
}

/// Why a probe URL was refused (answered 400 with this as the one-line body).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The path is not one of the probe kinds.
    #[error("unknown probe path {0:?}: use /probe/tcp, /probe/process, /probe/file or /probe/all")]
    UnknownPath(String),
    /// A parameter this probe kind does not take.
    #[error("{kind} probe does not take parameter {param:?}")]
    UnknownParam { kind: &'static str, param: String },
    /// A required parameter is absent.
    #[error("{kind} probe needs {param}=")]
    Missing { kind: &'static str, param: &'static str },
    /// A parameter given twice where only one makes sense.
    #[error("parameter {0:?} given more than once")]
    Duplicate(String),
    /// Not a port number 1-65535.
    #[error("bad port {0:?}: expected 1-65535")]
    BadPort(String),
    /// Not a duration like 500ms, 5s, 1.5m.
    #[error("bad duration {value:?} for {param}: expected a number with ms, s, m or h, e.g. 5s")]
    BadDuration { param: &'static str, value: String },
    /// The file path is relative, has `..` or a control character (NUL, newline), or is empty.
    #[error("bad file path {0:?}: must be absolute, without '..' components or control characters")]
    BadPath(String),
    /// Percent-encoding that does not decode to UTF-8.
    #[error("bad percent-encoding in {0:?}")]
    BadEncoding(String),
    /// The raw query is past [`super::query::MAX_QUERY_BYTES`] or
    /// [`super::query::MAX_QUERY_PARAMS`]: refused before it is decoded.
    #[error("query too large: at most {max} {what}")]
    QueryTooLarge { what: &'static str, max: usize },
    /// `/probe/all` with nothing to check.
    #[error("all probe needs at least one of tcp=, process, file=")]
    EmptyAll,
}

/// A file in the container's root as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileFacts {
    Present {
        /// Last modification, converted to `CLOCK_BOOTTIME` ns by the reader.
        modified_ns: u64,
        /// The first [`FILE_HEAD_BYTES`] bytes.
        head: Vec<u8>,
    },
    /// Missing or refused; the one-line reason (e.g. "No such file or directory").
    Unreadable(String),
}

/// Everything the checks of one container look at: shared, so a request copies two pointers.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Listeners of the pod's netns by port (the model's).
    pub tcp: Arc<HashMap<u16, AcceptFacts>>,
    /// The main process; None until first observed (the model's).
    pub process: Option<ProcessFacts>,
    /// Files by path as given in the check (the probe layer's reads).
    pub files: Arc<HashMap<String, FileFacts>>,
}

impl CheckSpec {
    /// Parses the part after `/probe` (e.g. `/tcp`) and the raw query.
    pub fn parse(kind_path: &str, query: Option<&str>) -> Result<Self, ParseError> {
        let kind = kind_path.trim_end_matches('/').strip_prefix('/').unwrap_or(kind_path);
        Self::from_query(kind, &Query::parse(query)?)
    }

    /// The check of `kind` (`tcp`, `process`, `file`, `all`) with the parameters of `query`.
    pub fn from_query(kind: &str, query: &Query) -> Result<Self, ParseError> {
        let params = query.params();
        match kind {
            "tcp" => {
                only(params, "tcp", &["port", "stall"])?;
                let port =
                    parse_port(single(params, "port")?.ok_or(ParseError::Missing { kind: "tcp", param: "port" })?)?;
                let stall_ns = single(params, "stall")?.map(|v| parse_duration("stall", v)).transpose()?;
                Ok(Self::Tcp { port, stall_ns: stall_ns.unwrap_or(DEFAULT_STALL_NS) })
            }
            "process" => {
                only(params, "process", &["max_d_state"])?;
                let max = single(params, "max_d_state")?.map(|v| parse_duration("max_d_state", v)).transpose()?;
                Ok(Self::Process { max_uninterruptible_ns: max })
            }
            "file" => {
                only(params, "file", &["path", "fresh", "contains"])?;
                let path = single(params, "path")?.ok_or(ParseError::Missing { kind: "file", param: "path" })?;
                file_spec(path, single(params, "fresh")?, single(params, "contains")?)
            }
            "all" => parse_all(params),
            other => Err(ParseError::UnknownPath(format!("/probe/{other}"))),
        }
    }

    /// Short label for metrics: `tcp`, `process`, `file` or `all`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Tcp { .. } => "tcp",
            Self::Process { .. } => "process",
            Self::File { .. } => "file",
            Self::AllOf(_) => "all",
        }
    }

    /// Judges the snapshot at `now` (`CLOCK_BOOTTIME` ns). AllOf reports the first failure.
    pub fn evaluate(&self, observed: &Observed, now: u64) -> Verdict {
        match self {
            Self::Tcp { port, stall_ns } => match observed.tcp.get(port) {
                Some(facts) => tcp::verdict(facts, *port, now, *stall_ns),
                None => Verdict::fail(format!("no listener on port {port}")),
            },
            Self::Process { max_uninterruptible_ns } => {
                process_verdict(observed.process.as_ref(), *max_uninterruptible_ns, now)
            }
            Self::File { path, max_age_ns, contains } => {
                file_verdict(path, observed.files.get(path), *max_age_ns, contains.as_deref(), now)
            }
            Self::AllOf(checks) => {
                let mut passed = Vec::with_capacity(checks.len());
                for check in checks {
                    let verdict = check.evaluate(observed, now);
                    if !verdict.pass {
                        return verdict;
                    }
                    passed.push(verdict.reason);
                }
                Verdict::pass(passed.join("; "))
            }
        }
    }

    /// The earliest time after `now` at which the verdict can change with no new input (a stall
    /// limit running out), so the caller can re-evaluate exactly then instead of polling.
    pub(crate) fn next_deadline(&self, observed: &Observed, now: u64) -> Option<u64> {
        match self {
            Self::Tcp { port, stall_ns } => observed.tcp.get(port).and_then(|f| tcp::next_deadline(f, now, *stall_ns)),
            Self::Process { max_uninterruptible_ns: Some(max) } => match &observed.process {
                Some(p) if p.state == ProcessState::Uninterruptible => {
                    Some(p.state_since_ns.saturating_add(*max)).filter(|&d| d > now)
                }
                _ => None,
            },
            Self::File { path, max_age_ns: Some(max), .. } => match observed.files.get(path) {
                Some(FileFacts::Present { modified_ns, .. }) => {
                    Some(modified_ns.saturating_add(*max)).filter(|&d| d > now)
                }
                _ => None,
            },
            Self::AllOf(checks) => checks.iter().filter_map(|c| c.next_deadline(observed, now)).min(),
            _ => None,
        }
    }

    /// Canonical text of the check (stable; used as the `check` label of per-pod metrics).
    ///
    /// At most [`MAX_CHECK_LABEL`] bytes: a longer one (a long file path) keeps its start and ends
    /// in a digest of the whole, so distinct checks keep distinct labels and the same check gets
    /// the same label after a restart.
    pub(crate) fn label(&self) -> String {
        let full = self.to_string();
        if full.len() <= MAX_CHECK_LABEL {
            return full;
        }
        // FNV-1a, 64 bits: stable across runs (series continue over restarts).
        let digest =
            full.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        let mut cut = MAX_CHECK_LABEL - 18;
        while !full.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}~{digest:016x}", &full[..cut])
    }
}

/// Longest `check` label value (Prometheus handles long ones, but every byte is repeated in each
/// of a check's series and scrape).
pub(crate) const MAX_CHECK_LABEL: usize = 128;

impl fmt::Display for CheckSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { port, .. } => write!(f, "tcp:{port}"),
            Self::Process { .. } => write!(f, "process"),
            Self::File { path, .. } => write!(f, "file:{path}"),
            Self::AllOf(checks) => {
                write!(f, "all")?;
                for (i, check) in checks.iter().enumerate() {
                    write!(f, "{}{check}", if i == 0 { ":" } else { "+" })?;
                }
                Ok(())
            }
        }
    }
}

fn process_verdict(facts: Option<&ProcessFacts>, max_d: Option<u64>, now: u64) -> Verdict {
    let Some(p) = facts else { return Verdict::fail("main process not observed yet") };
    let pid = p.pid;
    match p.state {
        ProcessState::Zombie => Verdict::fail(format!("main process {pid} is a zombie")),
        ProcessState::Dead => Verdict::fail(format!("main process {pid} is gone")),
        ProcessState::Stopped => Verdict::fail(format!("main process {pid} is stopped")),
        ProcessState::Uninterruptible => match max_d {
            Some(max) if now.saturating_sub(p.state_since_ns) >= max => Verdict::fail(format!(
                "main process {pid} in uninterruptible sleep (D) for {} (limit {})",
                seconds(now.saturating_sub(p.state_since_ns)),
                seconds(max)
            )),
            _ => Verdict::pass(format!("main process {pid} in D state")),
        },
        ProcessState::Running | ProcessState::Sleeping | ProcessState::Other(_) => {
            Verdict::pass(format!("main process {pid} alive"))
        }
    }
}

fn file_verdict(
    path: &str,
    facts: Option<&FileFacts>,
    max_age: Option<u64>,
    contains: Option<&str>,
    now: u64,
) -> Verdict {
    let (modified_ns, head) = match facts {
        None => return Verdict::fail(format!("file {path} not read yet")),
        Some(FileFacts::Unreadable(why)) => return Verdict::fail(format!("file {path}: {why}")),
        Some(FileFacts::Present { modified_ns, head }) => (*modified_ns, head),
    };
    if let Some(max) = max_age {
        let age = now.saturating_sub(modified_ns);
        if age > max {
            return Verdict::fail(format!(
                "file {path} last modified {} ago (fresh limit {})",
                seconds(age),
                seconds(max)
            ));
        }
    }
    if let Some(needle) = contains {
        let found = !needle.is_empty() && head.windows(needle.len()).any(|w| w == needle.as_bytes());
        if !found && !needle.is_empty() {
            return Verdict::fail(format!(
                "file {path} does not contain {needle:?} in its first {FILE_HEAD_BYTES} bytes"
            ));
        }
    }
    Verdict::pass(format!("file {path} ok"))
}

/// Seconds with one decimal, e.g. `7.2s`; whole seconds print without the decimal (`5s`).
pub(crate) fn seconds(ns: u64) -> String {
    let tenths = (ns + 50_000_000) / 100_000_000;
    if tenths.is_multiple_of(10) {
        format!("{}s", tenths / 10)
    } else {
        format!("{}.{}s", tenths / 10, tenths % 10)
    }
}

fn parse_all(params: &[(String, Option<String>)]) -> Result<CheckSpec, ParseError> {
    only(params, "all", &["tcp", "stall", "process", "max_d_state", "file", "fresh", "contains"])?;
    // The modifiers are read once, before the checks: one pass each over the pairs, so the
    // parse is linear in them (it read `fresh` and `contains` again for every `file=`).
    let stall_ns =
        single(params, "stall")?.map(|v| parse_duration("stall", v)).transpose()?.unwrap_or(DEFAULT_STALL_NS);
    let max_d_state = single(params, "max_d_state")?.map(|v| parse_duration("max_d_state", v)).transpose()?;
    let (fresh, contains) = (single(params, "fresh")?, single(params, "contains")?);
    let mut checks = Vec::new();
    let mut process = false;
    for (key, value) in params {
        match key.as_str() {
            "tcp" => {
                let value = value.as_deref().ok_or(ParseError::Missing { kind: "all", param: "tcp" })?;
                checks.push(CheckSpec::Tcp { port: parse_port(value)?, stall_ns });
            }
            "process" if value.as_deref().is_some_and(|v| !v.is_empty()) => {
                return Err(ParseError::UnknownParam {
                    kind: "all",
                    param: format!("process={}", value.as_deref().unwrap_or("")),
                })
            }
            "process" => {
                if process {
                    return Err(ParseError::Duplicate("process".into()));
                }
                process = true;
                checks.push(CheckSpec::Process { max_uninterruptible_ns: max_d_state });
            }
            "file" => {
                let path = value.as_deref().ok_or(ParseError::Missing { kind: "all", param: "file" })?;
                checks.push(file_spec(path, fresh, contains)?);
            }
            _ => {}
        }
    }
    if checks.is_empty() {
        return Err(ParseError::EmptyAll);
    }
    Ok(CheckSpec::AllOf(checks))
}

fn file_spec(path: &str, fresh: Option<&str>, contains: Option<&str>) -> Result<CheckSpec, ParseError> {
    // A control character (`%0A`) would reach the `check` label and the log lines that quote it
    // as a line of its own: no file a probe means has one.
    let bad = path.is_empty()
        || !path.starts_with('/')
        || path.chars().any(char::is_control)
        || path.split('/').any(|c| c == "..");
    if bad {
        return Err(ParseError::BadPath(path.to_owned()));
    }
    let max_age_ns = fresh.map(|v| parse_duration("fresh", v)).transpose()?;
    Ok(CheckSpec::File { path: path.to_owned(), max_age_ns, contains: contains.map(str::to_owned) })
}

fn only(params: &[(String, Option<String>)], kind: &'static str, allowed: &[&str]) -> Result<(), ParseError> {
    match params.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, _)) => Err(ParseError::UnknownParam { kind, param: k.clone() }),
        None => Ok(()),
    }
}

fn single<'a>(params: &'a [(String, Option<String>)], key: &str) -> Result<Option<&'a str>, ParseError> {
    let mut found = params.iter().filter(|(k, _)| k == key);
    let first = found.next();
    if found.next().is_some() {
        return Err(ParseError::Duplicate(key.to_owned()));
    }
    Ok(first.map(|(_, v)| v.as_deref().unwrap_or("")))
}

fn parse_port(value: &str) -> Result<u16, ParseError> {
    match value.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(ParseError::BadPort(value.to_owned())),
    }
}

/// A probe parameter's duration in ns (see [`crate::model::duration`]).
pub(crate) fn parse_duration(param: &'static str, value: &str) -> Result<u64, ParseError> {
    duration::parse_ns(value).map_err(|_| ParseError::BadDuration { param, value: value.to_owned() })
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
