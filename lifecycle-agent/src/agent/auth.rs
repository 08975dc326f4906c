//! Who may read the JSON API (`/api/*` on `--listen`): with `--api-auth kubernetes`, a request
//! needs `Authorization: Bearer <token>`, and the API server must say the token is valid
//! (TokenReview) and that its user may read what the path shows (SubjectAccessReview on the
//! `lifecycle.dev` group: `list containers` for `/api/v1/containers` and any other path, `get
//! probes` named after the pod, in its namespace, for `/api/v1/probe/<namespace>/<pod>/...`; see
//! `discovery::kube::review`). `/metrics` and `/healthz` stay open, as Prometheus and the
//! kubelet's probes expect.
//!
//! Answers are cached per (token, access): allowed for [`ALLOWED_TTL`], refused for
//! [`REFUSED_TTL`], at most [`CACHE_ENTRIES`]. Reviews run at most [`REVIEWS_IN_FLIGHT`] at a time,
//! each within [`REVIEW_TIMEOUT`]: a client sending a new token on every request costs the API
//! server a bounded rate and delays no cached client (each connection is its own task). A request
//! without a token is refused at once, without asking anyone. When the API cannot answer, the
//! gate fails closed (503), and no answer is cached.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Mutex,
    time::{Duration, Instant},
};

use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::Semaphore;

use crate::{
    discovery::kube::review::{Access, AccessRequest},
    export::metrics::NAMESPACE,
};

/// How long an allowed (token, access) is trusted without asking again (a revoked binding or token
/// takes at most this long to bite; kube-rbac-proxy's default is 5 minutes).
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is remembered (a new binding takes at most this long to work).
pub const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Cached answers kept; when full, expired ones go, then all.
pub const CACHE_ENTRIES: usize = 1024;
/// Reviews the agent has in flight at once.
pub const REVIEWS_IN_FLIGHT: usize = 8;
/// The most one review (TokenReview + SubjectAccessReview), or the wait for a slot, may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Longer bearer tokens are refused unread (service-account tokens are ~1 KiB, OIDC ones a few).
pub const MAX_TOKEN_BYTES: usize = 8192;

/// The answer of a [`Reviewer`].
pub type ReviewFuture<'a> = Pin<Box<dyn Future<Output = Result<Access, String>> + Send + 'a>>;

/// Asks the API server about a token and an access (a seam: the real one is
/// `discovery::kube::review`, tests use a fake).
pub trait Reviewer: Send + Sync + 'static {
    fn review<'a>(&'a self, token: &'a str, request: &'a AccessRequest) -> ReviewFuture<'a>;
}

impl Reviewer for kube::Client {
    fn review<'a>(&'a self, token: &'a str, request: &'a AccessRequest) -> ReviewFuture<'a> {
        Box::pin(async move {
            crate::discovery::kube::review::review(self, token, request)
                .await
                .map_err(|err| crate::ErrorChain(&err).to_string())
        })
    }
}

/// What the gate decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Serve the request.
    Pass,
    /// 401: no token, a malformed one, or one the API server does not know.
    Unauthenticated,
    /// 403: a known user without `get` on the path.
    Forbidden,
    /// 503: the API server could not be asked (not configured, unreachable, too slow, busy).
    Unavailable,
}

/// The gate in front of `/api/*`.
pub struct ApiGate {
    /// None: authentication was asked for, but the agent has no Kubernetes API.
    reviewer: Option<Box<dyn Reviewer>>,
    cache: Mutex<HashMap<(String, AccessRequest), (Access, Instant)>>,
    slots: Semaphore,
    reviews: IntCounterVec,
}

impl ApiGate {
    /// A gate asking `reviewer` (None fails every request closed), counting reviews in
    /// `lifecycle_api_auth_reviews_total{result}` when a registry is given.
    pub fn new(reviewer: Option<Box<dyn Reviewer>>, registry: Option<&Registry>) -> Result<Self, prometheus::Error> {
        let reviews = IntCounterVec::new(
            Opts::new(
                "api_auth_reviews_total",
                "Token and access reviews the API server answered for requests to /api/* (--api-auth kubernetes), by result: allowed, denied, unauthenticated, error. Cached answers are not counted.",
            )
            .namespace(NAMESPACE),
            &["result"],
        )?;
        for result in ["allowed", "denied", "unauthenticated", "error"] {
            reviews.with_label_values(&[result]).inc_by(0);
        }
        if let Some(registry) = registry {
            registry.register(Box::new(reviews.clone()))?;
        }
        Ok(Self { reviewer, cache: Mutex::new(HashMap::new()), slots: Semaphore::new(REVIEWS_IN_FLIGHT), reviews })
    }

    /// Decides on a request for `path` with the `Authorization` header `authorization`.
    pub async fn check(&self, authorization: Option<&[u8]>, path: &str) -> Verdict {
        let Some(token) = authorization.and_then(bearer_token) else { return Verdict::Unauthenticated };
        let Some(reviewer) = self.reviewer.as_deref() else { return Verdict::Unavailable };
        let key = (token.to_owned(), access_request(path));
        if let Some(access) = self.cached(&key, Instant::now()) {
            return verdict(&access);
        }
        let asked = tokio::time::timeout(REVIEW_TIMEOUT, async {
            let _slot = self.slots.acquire().await.ok()?;
            Some(reviewer.review(token, &key.1).await)
        })
        .await;
        match asked {
            Ok(Some(Ok(access))) => {
                let result = match &access {
                    Access::Allowed { .. } => "allowed",
                    Access::Denied { user } => {
                        log::debug!("API request for {path} by {user:?} denied by the API server's authorizer");
                        "denied"
                    }
                    Access::Unauthenticated => "unauthenticated",
                };
                self.reviews.with_label_values(&[result]).inc();
                let verdict = verdict(&access);
                self.remember(key, access, Instant::now());
                verdict
            }
            Ok(Some(Err(err))) => {
                self.reviews.with_label_values(&["error"]).inc();
                log::warn!("cannot review an API request's token: {err}");
                Verdict::Unavailable
            }
            Ok(None) | Err(_) => {
                self.reviews.with_label_values(&["error"]).inc();
                Verdict::Unavailable
            }
        }
    }

    fn cached(&self, key: &(String, AccessRequest), now: Instant) -> Option<Access> {
        let cache = self.cache.lock().unwrap_or_else(|poison| poison.into_inner());
        cache.get(key).filter(|(_, expires)| *expires > now).map(|(access, _)| access.clone())
    }

    fn remember(&self, key: (String, AccessRequest), access: Access, now: Instant) {
        let ttl = if matches!(access, Access::Allowed { .. }) { ALLOWED_TTL } else { REFUSED_TTL };
        let mut cache = self.cache.lock().unwrap_or_else(|poison| poison.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, (_, expires)| *expires > now);
        }
        if cache.len() >= CACHE_ENTRIES {
            // Full of live answers (a client cycling tokens): start over rather than grow.
            cache.clear();
        }
        cache.insert(key, (access, now + ttl));
    }

    #[cfg(test)]
    fn cached_entries(&self) -> usize {
        self.cache.lock().unwrap_or_else(|poison| poison.into_inner()).len()
    }
}

/// What reading `path` needs: the probe of one pod, or (for the container list and for anything
/// else, which answers 404 to whoever may list containers) the list of the node's containers.
pub fn access_request(path: &str) -> AccessRequest {
    let probe = path.strip_prefix("/api/v1/probe/").and_then(|rest| {
        let mut parts = rest.split('/');
        let (namespace, pod) = (parts.next()?, parts.next()?);
        (!namespace.is_empty() && !pod.is_empty())
            .then(|| AccessRequest::GetProbe { namespace: namespace.to_owned(), pod: pod.to_owned() })
    });
    probe.unwrap_or(AccessRequest::ListContainers)
}

fn verdict(access: &Access) -> Verdict {
    match access {
        Access::Allowed { .. } => Verdict::Pass,
        Access::Denied { .. } => Verdict::Forbidden,
        Access::Unauthenticated => Verdict::Unauthenticated,
    }
}

/// The token of an `Authorization: Bearer <token>` header value (scheme case-insensitive), or
/// None for any other shape, an empty token, or one over [`MAX_TOKEN_BYTES`].
pub fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start();
    let well_formed =
        !token.is_empty() && token.len() <= MAX_TOKEN_BYTES && token.bytes().all(|b| b.is_ascii_graphic());
    (scheme.eq_ignore_ascii_case("bearer") && well_formed).then_some(token)
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use super::*;

    /// Allows token "good", denies "nobody", fails on "broken"; counts the calls.
    struct Fake {
        calls: Arc<AtomicUsize>,
    }

    impl Reviewer for Fake {
        fn review<'a>(&'a self, token: &'a str, request: &'a AccessRequest) -> ReviewFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "good" if *request == AccessRequest::ListContainers => Ok(Access::Allowed { user: "sre".into() }),
                    "good" | "nobody" => Ok(Access::Denied { user: token.into() }),
                    "broken" => Err("connection refused".into()),
                    _ => Ok(Access::Unauthenticated),
                }
            })
        }
    }

    fn gate() -> (ApiGate, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = ApiGate::new(Some(Box::new(Fake { calls: calls.clone() })), None).expect("gate");
        (gate, calls)
    }

    #[test]
    fn paths_map_to_what_they_read() {
        let probe = |ns: &str, pod: &str| AccessRequest::GetProbe { namespace: ns.into(), pod: pod.into() };
        assert_eq!(access_request("/api/v1/containers"), AccessRequest::ListContainers);
        assert_eq!(access_request("/api/v1/probe/team-a/web-0/app"), probe("team-a", "web-0"));
        assert_eq!(access_request("/api/v1/probe/team-a/web-0"), probe("team-a", "web-0"));
        for other in ["/api/v1/probe/", "/api/v1/probe/ns", "/api/v1/probe//pod/c", "/api/v2/x", "/api/"] {
            assert_eq!(access_request(other), AccessRequest::ListContainers, "{other}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_strictly() {
        assert_eq!(bearer_token(b"Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer_token(b"bearer  abc"), Some("abc"));
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer ", b"Bearer a b", b"abc", b"Bearer \xff"] {
            assert_eq!(bearer_token(bad), None, "{bad:?}");
        }
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(bearer_token(long.as_bytes()), None);
    }

    #[tokio::test]
    async fn no_token_is_refused_without_asking_the_api_server() {
        let (gate, calls) = gate();
        assert_eq!(gate.check(None, "/api/v1/containers").await, Verdict::Unauthenticated);
        assert_eq!(gate.check(Some(b"Basic dXNlcg=="), "/api/v1/containers").await, Verdict::Unauthenticated);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_api_servers_answers_decide_and_are_cached_per_token_and_path() {
        let (gate, calls) = gate();
        let good = Some(&b"Bearer good"[..]);
        assert_eq!(gate.check(good, "/api/v1/containers").await, Verdict::Pass);
        assert_eq!(gate.check(good, "/api/v1/containers").await, Verdict::Pass);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the second answer came from the cache");
        assert_eq!(gate.check(good, "/api/v1/probe/ns/pod/app").await, Verdict::Forbidden, "per access");
        assert_eq!(gate.check(good, "/api/v1/probe/ns/pod/other").await, Verdict::Forbidden);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one access per pod: the probe answer came from the cache");
        assert_eq!(gate.check(Some(b"Bearer nobody"), "/api/v1/containers").await, Verdict::Forbidden);
        assert_eq!(gate.check(Some(b"Bearer forged"), "/api/v1/containers").await, Verdict::Unauthenticated);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(gate.reviews.with_label_values(&["allowed"]).get(), 1);
        assert_eq!(gate.reviews.with_label_values(&["denied"]).get(), 2);
    }

    #[tokio::test]
    async fn failures_fail_closed_and_are_not_cached() {
        let (gate, calls) = gate();
        let broken = Some(&b"Bearer broken"[..]);
        assert_eq!(gate.check(broken, "/api/v1/containers").await, Verdict::Unavailable);
        assert_eq!(gate.check(broken, "/api/v1/containers").await, Verdict::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "asked again: an outage is not remembered");
        let without_api = ApiGate::new(None, None).expect("gate");
        assert_eq!(without_api.check(Some(b"Bearer good"), "/api/v1/containers").await, Verdict::Unavailable);
    }

    #[test]
    fn the_cache_stays_bounded_and_expires() {
        let (gate, _) = gate();
        let now = Instant::now();
        for n in 0..CACHE_ENTRIES * 3 {
            gate.remember((format!("t{n}"), AccessRequest::ListContainers), Access::Unauthenticated, now);
            assert!(gate.cached_entries() <= CACHE_ENTRIES);
        }
        let key = ("t".to_owned(), AccessRequest::ListContainers);
        gate.remember(key.clone(), Access::Allowed { user: "u".into() }, now);
        assert!(gate.cached(&key, now + ALLOWED_TTL - Duration::from_secs(1)).is_some());
        assert!(gate.cached(&key, now + ALLOWED_TTL).is_none(), "expired");
    }
}
