//! The agent's JSON API as types: what it answers, written by the agent and read back by its
//! clients (`lifecycle-agent status`, the kubectl plugin) with the same definitions. Points in
//! time go out as RFC 3339 with their boot-clock value beside ([`at`]), in the wall clock the
//! writer gives ([`with_clock::WithClock`]).

pub mod at;
pub mod with_clock;

use serde::{Deserialize, Serialize};

use crate::{
    node::{ContainerView, PastStop, PodView},
    time::BootTime,
};

/// The body of `GET /api/v1/containers`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ContainersResponse {
    /// Unix time minus boot time, in seconds: what turns a `<field>_boot_ns` into wall time.
    pub boot_to_unix_seconds: f64,
    /// When this answer was made (boot-clock ns).
    pub now: BootTime,
    /// Which state of the node this answer shows, opaque: given back with `wait_seconds`, the
    /// next answer waits until the selected containers or their pods change from it. It moves
    /// with states, names and pods, not with counters (an exec, a signal, an accept), and never
    /// repeats across restarts of the agent. Empty from an agent that does not serve waits.
    #[serde(default)]
    pub resource_version: String,
    pub containers: Vec<ContainerView>,
    /// Every pod with its phase as the kernel saw it, and the API's.
    pub pods: Vec<PodView>,
}

/// The body of `GET /api/v1/history?namespace=...&pod=...`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HistoryResponse {
    /// As in [`ContainersResponse`].
    pub boot_to_unix_seconds: f64,
    /// The pod's judged stops the node kept (its containers and the pod may be gone), newest
    /// first.
    pub stops: Vec<PastStop>,
}

/// Percent-encodes a path segment or a query value of the API (names may hold any byte a client
/// types): what the agent's links and its clients' requests put in a URL.
pub fn percent_encoded(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `key=value&...` with each value percent-encoded.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<String> = pairs.iter().map(|(key, value)| format!("{key}={}", percent_encoded(value))).collect();
    pairs.join("&")
}

/// The header that carries a bearer token for the agent through the API server's pod proxy,
/// which keeps `Authorization` for itself: the kubectl plugin sends the token it minted for the
/// agents there, and the agent reads it as `Authorization` when that is absent.
pub const FORWARDED_AUTHORIZATION: &str = "x-lifecycle-authorization";
