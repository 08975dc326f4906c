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
        let body = ContainersResponse { boot_to_unix_seconds: unix_minus_boot_seconds(), now, containers, pods };
        Some(match serde_json::to_string(&body) {
            Ok(json) => (StatusCode::OK, json),
            Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{{\"error\":\"{err}\"}}")),
        })
    }
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
