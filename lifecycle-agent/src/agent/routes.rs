//! The agent's JSON API on `--listen`: `/api/v1/containers` (every unit's view) and
//! `/api/v1/probe/<namespace>/<pod>/<container>` (the probe answer for people, scripts and
//! host-network pods). `/metrics` and `/healthz` are served by `http.rs`.

use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use serde::Serialize;

use super::http::ApiHandler;
use crate::{
    discovery::clock::{boottime_ns, unix_minus_boot_seconds},
    model::node::{ContainerView, NodeTracker},
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
        let containers = self.tracker.lock().unwrap_or_else(|poison| poison.into_inner()).containers(now);
        let body = ContainersResponse { boot_to_unix_seconds: unix_minus_boot_seconds(), now, containers };
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
        let bad = |text: String| (StatusCode::BAD_REQUEST, text);
        let mut query = match Query::parse(query) {
            Ok(query) => query,
            Err(err) => return bad(format!("{err}\n")),
        };
        let Some(check) = query.take("check") else {
            return bad("add check=tcp|process|file|all to the query\n".to_owned());
        };
        let mut parts = target.trim_end_matches('/').splitn(3, '/');
        let (Some(namespace), Some(pod), Some(container)) = (parts.next(), parts.next(), parts.next()) else {
            return (StatusCode::NOT_FOUND, "probes live at /api/v1/probe/<namespace>/<pod>/<container>\n".to_owned());
        };
        let spec = match CheckSpec::from_query(&check, &query) {
            Ok(spec) => spec,
            Err(err) => return bad(format!("{err}\n")),
        };
        let target = ProbeTarget { namespace: namespace.into(), pod: pod.into(), container: container.into() };
        let (code, body) = self.probes.answer_check(&target, &spec);
        (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
    }
}
