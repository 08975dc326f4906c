//! The agent's JSON API on `--listen`: `/api/v1/containers` (every unit's view) and
//! `/api/v1/probe/<namespace>/<pod>/<container>` (the probe answer for people, scripts and
//! host-network pods: declared checks only, 403 otherwise). `/metrics` and `/healthz` are served
//! by `http.rs`.

use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use serde::Serialize;

use super::http::ApiHandler;
use crate::{
    discovery::clock::{boottime_ns, unix_minus_boot_seconds},
    model::node::{ContainerView, NodeTracker, PodView},
    probe::{metrics::ProbeTarget, query::Query, CheckSpec, NodeProbes},
};

/// The body of `GET /api/v1/containers`.
#[derive(Serialize)]
pub struct ContainersResponse {
    /// Add to any `*_at`/`time` field (CLOCK_BOOTTIME ns) / 1e9 to get Unix seconds.
    pub boot_to_unix_seconds: f64,
    /// CLOCK_BOOTTIME ns when this answer was made.
    pub now: u64,
    pub containers: Vec<ContainerView>,
    /// Every pod with its phase as the kernel saw it, and the API's.
    pub pods: Vec<PodView>,
}

pub(super) struct ContainersApi {
    pub(super) tracker: Arc<Mutex<NodeTracker>>,
    pub(super) probes: Arc<NodeProbes>,
}

impl ApiHandler for ContainersApi {
    fn get(&self, path: &str, query: Option<&str>) -> Option<(StatusCode, String)> {
        if let Some(target) = path.strip_prefix("/api/v1/probe/") {
            return Some(self.probe(target, query));
        }
        if path != "/api/v1/containers" {
            return None;
        }
        let now = boottime_ns();
        let (containers, pods) = {
            let tracker = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner());
            (tracker.containers(now), tracker.pods(now))
        };
        let boot_to_unix = unix_minus_boot_seconds();
        let body = ContainersResponse { boot_to_unix_seconds: boot_to_unix, now, containers, pods };
        Some(match serde_json::to_value(&body) {
            Ok(mut json) => {
                rfc3339_times(&mut json, boot_to_unix);
                (StatusCode::OK, json.to_string())
            }
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{{\"error\":\"{err}\"}}")),
        })
    }
}

/// Fields holding a point in time (`CLOCK_BOOTTIME` ns in the model).
const TIME_FIELDS: [&str; 6] =
    ["started_at", "finished_at", "exit_time", "time", "instance_created_at", "watched_since"];

/// Points in time as RFC 3339 (UTC, nanoseconds), as the Kubernetes API writes them; the exact
/// boot-clock value stays beside each as `<field>_boot_ns` (for differences with the kernel's
/// other times).
fn rfc3339_times(value: &mut serde_json::Value, boot_to_unix: f64) {
    match value {
        serde_json::Value::Object(map) => {
            for field in TIME_FIELDS {
                let Some(ns) = map.get(field).and_then(serde_json::Value::as_u64) else { continue };
                map.insert(format!("{field}_boot_ns"), ns.into());
                map.insert(field.to_owned(), rfc3339(ns, boot_to_unix).into());
            }
            map.values_mut().for_each(|v| rfc3339_times(v, boot_to_unix));
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| rfc3339_times(v, boot_to_unix)),
        _ => {}
    }
}

/// A boot time as RFC 3339 in UTC.
fn rfc3339(boot_ns: u64, boot_to_unix: f64) -> String {
    // The offset is whole nanoseconds of wall clock at boot; adding in integers keeps ns detail.
    let offset_ns = (boot_to_unix * 1e9) as i128;
    let unix_ns = i128::from(boot_ns) + offset_ns;
    jiff::Timestamp::from_nanosecond(unix_ns).map(|t| t.to_string()).unwrap_or_default()
}

impl ContainersApi {
    /// `GET /api/v1/probe/<namespace>/<pod>/<container>?check=<tcp|process|file|all>&...`: the same
    /// answer the pod's own probe listener gives, for people, scripts and host-network pods.
    fn probe(&self, target: &str, query: Option<&str>) -> (StatusCode, String) {
        // Only a declared check of a known container answers: the rest is 403 with no detail,
        // like the pod listener's. A request without check= is the one usage error (400).
        let Ok(mut query) = Query::parse(query) else { return forbidden(self.probes.forbidden()) };
        let Some(check) = query.take("check") else {
            return (StatusCode::BAD_REQUEST, "add check=tcp|process|file|all to the query\n".to_owned());
        };
        let mut parts = target.trim_end_matches('/').splitn(3, '/');
        let (Some(namespace), Some(pod), Some(container)) = (parts.next(), parts.next(), parts.next()) else {
            return forbidden(self.probes.forbidden());
        };
        let Ok(spec) = CheckSpec::from_query(&check, &query) else { return forbidden(self.probes.forbidden()) };
        let target = ProbeTarget { namespace: namespace.into(), pod: pod.into(), container: container.into() };
        let (code, body) = self.probes.answer_check(&target, &spec);
        (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
    }
}

fn forbidden((_, body): (u16, String)) -> (StatusCode, String) {
    (StatusCode::FORBIDDEN, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_with_the_boot_ns_beside() {
        let mut json = serde_json::json!({
            "containers": [{"state": {"state": "running", "started_at": 2_000_000_001u64}, "exit_code": 3}]
        });
        rfc3339_times(&mut json, 1_700_000_000.0);
        let state = &json["containers"][0]["state"];
        assert_eq!(state["started_at"], "2023-11-14T22:13:22.000000001Z");
        assert_eq!(state["started_at_boot_ns"], 2_000_000_001u64);
        assert_eq!(json["containers"][0]["exit_code"], 3, "other numbers stay");
    }
}
