//! What a pod declared it wants probed: the only checks the agent answers for it (issue 10).
//!
//! A pod lists its probe paths in the `lifecycle.dev/probes` annotation
//! ([`crate::model::metadata::keys::PROBE_DECLARATION`]), one per line, exactly as the kubelet will
//! request them (`/probe/tcp?port=8080&stall=5s`, `/probe/file?path=/tmp/healthy&container=app`).
//! Every entry goes through [`Declaration::add`], the one way in: the other source, the `httpGet`
//! paths of a pod spec's probes that target the probe port (from the Kubernetes API), feeds the
//! same function, naming the container whose probe it is (`probe::supervisor`).
//!
//! A request is answered only when [`parse_request`] of it gives a (container, check) that equals
//! a declared one: the same parser reads both sides, so equal means "the same check", whatever
//! the spelling (`/probe/tcp?port=80` and `/probe/tcp?stall=5s&port=80` are one check).
//!
//! Pure: text in, checks and refusals out.

use std::fmt;

use super::{
    check::{CheckSpec, ParseError},
    query::Query,
};

/// Entries a pod may declare; the rest are refused ([`RefusalReason::TooMany`]).
pub(crate) const MAX_ENTRIES_PER_POD: usize = 16;
/// Top-level directories a file check may not name: the container's view of the kernel and of
/// devices (`/proc/1/environ` is where secrets live). Refused when declared.
pub(crate) const FORBIDDEN_ROOTS: [&str; 3] = ["proc", "sys", "dev"];
/// Longest excerpt of a refused entry kept for the log line.
const EXCERPT_CHARS: usize = 120;

/// One declared check: the container it speaks for (None: every container of the pod) and what
/// it checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeclaredCheck {
    pub container: Option<String>,
    pub spec: CheckSpec,
}

/// Why a declared entry was not taken (the `reason` label of
/// `lifecycle_probe_declarations_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Not a probe path the agent understands.
    Unparsable,
    /// A file check under /proc, /sys or /dev.
    ForbiddenPath,
    /// Past [`MAX_ENTRIES_PER_POD`].
    TooMany,
}

impl RefusalReason {
    pub(crate) const ALL: [RefusalReason; 3] = [Self::Unparsable, Self::ForbiddenPath, Self::TooMany];

    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Unparsable => "unparsable",
            Self::ForbiddenPath => "forbidden_path",
            Self::TooMany => "too_many",
        }
    }
}

/// One refused entry, to be logged once and counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// The entry, shortened to a log-friendly excerpt.
    pub entry: String,
    /// One line saying why.
    pub detail: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "probe entry {:?} refused: {}", self.entry, self.detail)
    }
}

/// The checks one pod declared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declaration {
    checks: Vec<DeclaredCheck>,
    /// Entries offered so far, taken or not (the bound counts them all).
    offered: usize,
}

impl Declaration {
    /// Parses the annotation's text: one probe path per line; blank lines and lines starting with
    /// `#` are skipped.
    pub fn from_annotation(text: &str) -> (Self, Vec<Refusal>) {
        let mut declaration = Self::default();
        let refusals = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| declaration.add(None, line).err())
            .collect();
        (declaration, refusals)
    }

    /// Declares the check `path` (`/probe/<kind>?<query>`, as the kubelet will send it) for
    /// `container`, or — when None — for the container the path's `container=` names, else for
    /// every container of the pod. The one entry point for every source of declarations.
    pub(crate) fn add(&mut self, container: Option<&str>, path: &str) -> Result<(), Refusal> {
        self.offered += 1;
        let refuse = |reason, detail: String| Refusal { reason, entry: excerpt(path), detail };
        if self.offered > MAX_ENTRIES_PER_POD {
            return Err(refuse(
                RefusalReason::TooMany,
                format!("a pod declares at most {MAX_ENTRIES_PER_POD} probe entries"),
            ));
        }
        let (raw_path, query) = match path.split_once('?') {
            Some((raw_path, query)) => (raw_path, Some(query)),
            None => (path, None),
        };
        let (named, spec) =
            parse_request(raw_path, query).map_err(|err| refuse(RefusalReason::Unparsable, err.to_string()))?;
        let container = match (container, named) {
            (Some(owner), Some(named)) if owner != named => {
                return Err(refuse(
                    RefusalReason::Unparsable,
                    // Escaped: these are the pod's words, on their way to the agent's log.
                    format!("container={named:?} in the path of a probe of container {owner:?}"),
                ));
            }
            (Some(owner), _) => Some(owner.to_owned()),
            (None, named) => named,
        };
        if let Some(path) = forbidden_file(&spec) {
            return Err(refuse(
                RefusalReason::ForbiddenPath,
                format!("file checks may not look under /proc, /sys or /dev ({path:?})"),
            ));
        }
        let check = DeclaredCheck { container, spec };
        if !self.checks.contains(&check) {
            self.checks.push(check);
        }
        Ok(())
    }

    /// The checks declared for `container` (its own and the pod-wide ones), without repeats.
    pub fn checks_for(&self, container: &str) -> Vec<CheckSpec> {
        let mut specs: Vec<CheckSpec> = Vec::new();
        for check in &self.checks {
            if check.container.as_deref().is_none_or(|c| c == container) && !specs.contains(&check.spec) {
                specs.push(check.spec.clone());
            }
        }
        specs
    }

    /// Every declared check.
    #[cfg(test)]
    pub(crate) fn checks(&self) -> &[DeclaredCheck] {
        &self.checks
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

/// Reads a probe request: `path` is `/probe/<kind>`, `query` the raw query. Returns the container
/// the query names with `container=` (taken out of the query) and the check. Requests and
/// declarations are read by this one function.
pub(crate) fn parse_request(path: &str, query: Option<&str>) -> Result<(Option<String>, CheckSpec), ParseError> {
    let kind = path
        .strip_prefix("/probe/")
        .map(|kind| kind.trim_end_matches('/'))
        .filter(|kind| !kind.contains('/'))
        .ok_or_else(|| ParseError::UnknownPath(path.to_owned()))?;
    let mut query = Query::parse(query)?;
    let containers = query.params().iter().filter(|(key, _)| key == "container").count();
    if containers > 1 {
        return Err(ParseError::Duplicate("container".to_owned()));
    }
    let container = query.take("container");
    if container.as_deref() == Some("") {
        return Err(ParseError::Missing { kind: "probe", param: "container" });
    }
    Ok((container, CheckSpec::from_query(kind, &query)?))
}

/// The first file path of `spec` whose first component is /proc, /sys or /dev.
fn forbidden_file(spec: &CheckSpec) -> Option<&str> {
    match spec {
        CheckSpec::File { path, .. } => {
            // `//proc` and `/./proc` resolve to /proc too: skip empty and `.` components.
            let first = path.split('/').find(|c| !c.is_empty() && *c != ".");
            first.is_some_and(|c| FORBIDDEN_ROOTS.contains(&c)).then_some(path.as_str())
        }
        CheckSpec::AllOf(checks) => checks.iter().find_map(forbidden_file),
        CheckSpec::Tcp { .. } | CheckSpec::Process { .. } => None,
    }
}

fn excerpt(entry: &str) -> String {
    if entry.chars().count() <= EXCERPT_CHARS {
        entry.to_owned()
    } else {
        format!("{}...", entry.chars().take(EXCERPT_CHARS).collect::<String>())
    }
}

#[cfg(test)]
#[path = "declaration_tests.rs"]
mod tests;
