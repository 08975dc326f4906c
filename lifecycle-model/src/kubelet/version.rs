//! A kubelet's version as the Node object reports it (`status.nodeInfo.kubeletVersion`): the
//! release the gates of [`super::gates`] and the back-off of [`super::policy`] are keyed by.
//!
//! Distributions append their own suffix to the upstream `gitVersion` (`v1.30.4-eks-a737599`,
//! `v1.29.3+k3s1`, `v1.28.5-gke.1217000`): only `v<major>.<minor>.<patch>` counts, and the text
//! is kept (bounded) for the label and for people.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest version text kept: it becomes a label value.
pub const MAX_TEXT: usize = 64;

/// A kubelet release.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KubeletVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The text it was read from (at most [`MAX_TEXT`] bytes, printable ASCII).
    pub text: String,
}

/// A version text that is not `v<major>.<minor>.<patch>[suffix]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kubelet version {text:?} is not v<major>.<minor>.<patch>")]
pub struct VersionError {
    pub text: String,
}

impl KubeletVersion {
    /// Reads `v1.37.2`, `1.37.2`, `v1.30.4-eks-a737599`, `v1.29.3+k3s1`.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let error = || VersionError { text: text.chars().take(MAX_TEXT).collect() };
        let bare = text.trim().strip_prefix('v').unwrap_or(text.trim());
        let mut numbers = bare.splitn(3, '.');
        let major = numbers.next().and_then(|n| n.parse().ok()).ok_or_else(error)?;
        let minor = numbers.next().and_then(|n| n.parse().ok()).ok_or_else(error)?;
        let rest = numbers.next().ok_or_else(error)?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let patch = rest[..digits].parse().map_err(|_| error())?;
        // A label value and a log word: printable ASCII, bounded.
        let kept: String = text.trim().chars().filter(|c| c.is_ascii_graphic()).take(MAX_TEXT).collect();
        Ok(Self { major, minor, patch, text: kept })
    }

    /// A version made from its numbers (tests, and the gate tables' own releases).
    pub fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch, text: format!("v{major}.{minor}.{patch}") }
    }

    /// The release as numbers, for ordering.
    pub fn release(&self) -> (u32, u32, u32) {
        (self.major, self.minor, self.patch)
    }

    /// The minor release within 1.x, which the rule tables are keyed by; None for another major.
    pub fn minor_of_1(&self) -> Option<u32> {
        (self.major == 1).then_some(self.minor)
    }

    /// Whether this release is `1.<minor>` or later.
    pub fn at_least(&self, minor: u32) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= minor)
    }
}

impl fmt::Display for KubeletVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_and_distribution_versions() {
        for (text, release) in [
            ("v1.37.2", (1, 37, 2)),
            ("1.20.2", (1, 20, 2)),
            ("v1.30.4-eks-a737599", (1, 30, 4)),
            ("v1.29.3+k3s1", (1, 29, 3)),
            ("v1.28.5-gke.1217000", (1, 28, 5)),
            ("v1.31.0-rc.1", (1, 31, 0)),
        ] {
            let version = KubeletVersion::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(version.release(), release, "{text}");
            assert_eq!(version.text, text);
        }
    }

    #[test]
    fn what_is_not_a_version_is_refused() {
        for text in ["", "v", "v1", "v1.x.3", "vv1.2.3", "1.2", "v1.2.x", "latest"] {
            assert!(KubeletVersion::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn hostile_text_is_bounded_and_printable() {
        let long = format!("v1.37.2-{}\n\u{1b}[31m", "x".repeat(500));
        let version = KubeletVersion::parse(&long).expect("parses");
        assert_eq!(version.text.len(), MAX_TEXT);
        assert!(version.text.chars().all(|c| c.is_ascii_graphic()), "{:?}", version.text);
    }

    #[test]
    fn releases_compare_by_number() {
        let v = KubeletVersion::parse("v1.36.0").expect("parses");
        assert!(v.at_least(36) && !v.at_least(37));
        assert_eq!(v.minor_of_1(), Some(36));
        assert_eq!(KubeletVersion::new(2, 0, 0).minor_of_1(), None);
        assert!(KubeletVersion::new(2, 0, 0).at_least(99));
    }
}
