//! Who may read the JSON API (`/api/*` on `--listen`): with `--api-auth kubernetes`, a request
//! needs `Authorization: Bearer <token>`, and the API server must say the token is valid
//! (TokenReview) and that its user may read what the path shows (SubjectAccessReview on the
//! `lifecycle.dev` group: `list containers` for `/api/v1/containers` and any other path, `get
//! probes` named after the pod, in its namespace, for `/api/v1/probe/<namespace>/<pod>/...`; see
//! `discovery::kube::review`). `/metrics` and `/healthz` stay open, as Prometheus and the
//! kubelet's probes expect.
//!
//! Answers are cached per (token, access), keyed by a keyed 128-bit digest of the token (the
//! tokens themselves are not kept): allowed for [`ALLOWED_TTL`], refused for [`REFUSED_TTL`], in
//! two tables of at most [`CACHE_ENTRIES`] each, so refusals — a client cycling forged tokens —
//! can never push out an allowed reader's answer. Reviews run at most [`REVIEWS_IN_FLIGHT`] at a
//! time, each within [`REVIEW_TIMEOUT`], plus [`TRUSTED_REVIEWS`] kept for tokens the API server
//! allowed within [`TRUSTED_MEMORY`]: a flood of new tokens costs the API server a bounded rate
//! and cannot make a reader already allowed wait for a slot. A request without a token is
//! refused at once, without asking anyone. When the API cannot answer, the gate fails closed
//! (503), and no answer is cached.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::{
    collections::{hash_map::RandomState, HashMap},
    future::Future,
    hash::BuildHasher as _,
    pin::Pin,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use prometheus::{IntCounterVec, Registry};
use tokio::sync::Semaphore;

use crate::discovery::kube::review::{Access, AccessRequest};

/// How long an allowed (token, access) is trusted without asking again (a revoked binding or token
/// takes at most this long to bite; kube-rbac-proxy's default is 5 minutes).
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is remembered (a new binding takes at most this long to work).
pub(crate) const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Cached answers kept, allowed and refused each; when full, expired ones go, then those that
/// expire soonest.
pub(crate) const CACHE_ENTRIES: usize = 1024;
/// Reviews the agent has in flight at once.
pub(crate) const REVIEWS_IN_FLIGHT: usize = 8;
/// Reviews kept for tokens allowed recently (see [`TRUSTED_MEMORY`]), beside the others.
pub(crate) const TRUSTED_REVIEWS: usize = 2;
/// How long a token the API server allowed keeps its place among [`TRUSTED_REVIEWS`].
pub(crate) const TRUSTED_MEMORY: Duration = Duration::from_secs(600);
/// The most one review (TokenReview + SubjectAccessReview), or the wait for a slot, may take.
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Longer bearer tokens are refused unread (service-account tokens are ~1 KiB, OIDC ones a few).
pub(crate) const MAX_TOKEN_BYTES: usize = 8192;

/// The answer of a [`Reviewer`].
pub(crate) type ReviewFuture<'a> = Pin<Box<dyn Future<Output = Result<Access, String>> + Send + 'a>>;

/// Asks the API server about a token and an access (a seam: the real one is
/// `discovery::kube::review`, tests use a fake).
pub(crate) trait Reviewer: Send + Sync + 'static {
    fn review<'a>(&'a self, token: &'a str, request: &'a AccessRequest) -> ReviewFuture<'a>;
}

/// The API server as the reviewer, with the audiences a token must be for (`--api-auth-audience`;
/// empty: the API server's own, so any token it accepts).
pub(crate) struct ApiServerReviewer {
    pub client: kube::Client,
    pub audiences: Vec<String>,
}

impl Reviewer for ApiServerReviewer {
    fn review<'a>(&'a self, token: &'a str, request: &'a AccessRequest) -> ReviewFuture<'a> {
        Box::pin(async move {
            crate::discovery::kube::review::review(&self.client, token, &self.audiences, request)
                .await
                .map_err(|err| crate::discovery::kube::words::ApiWords(&err).to_string())
        })
    }
}

/// What the gate decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve the request.
    Pass,
    /// 401: no token, a malformed one, or one the API server does not know.
    Unauthenticated,
    /// 403: a known user without `get` on the path.
    Forbidden,
    /// 503: the API server could not be asked (not configured, unreachable, too slow, busy).
    Unavailable,
}

/// A token's digest: two SipHash-1-3 outputs with keys random per process, so nobody outside can
/// make two tokens collide, and the tokens themselves are not kept.
type TokenDigest = u128;
type Key = (TokenDigest, AccessRequest);

/// The cached answers.
#[derive(Default)]
struct Cache {
    allowed: HashMap<Key, (Access, Instant)>,
    refused: HashMap<Key, (Access, Instant)>,
    /// Tokens allowed lately, until when their reviews may use the trusted slots.
    trusted: HashMap<TokenDigest, Instant>,
}

/// Makes room in `table` (at most [`CACHE_ENTRIES`]) for one more entry: expired ones go, then
/// the one expiring soonest.
fn make_room<K: Clone + Eq + std::hash::Hash, V>(
    table: &mut HashMap<K, V>,
    expires: impl Fn(&V) -> Instant,
    now: Instant,
) {
    if table.len() < CACHE_ENTRIES {
        return;
    }
    table.retain(|_, value| expires(value) > now);
    while table.len() >= CACHE_ENTRIES {
        let Some(soonest) = table.iter().min_by_key(|(_, value)| expires(value)).map(|(key, _)| key.clone()) else {
            return;
        };
        table.remove(&soonest);
    }
}

/// The gate in front of `/api/*`.
pub struct ApiGate {
    /// None: authentication was asked for, but the agent has no Kubernetes API.
    reviewer: Option<Box<dyn Reviewer>>,
    /// `/metrics` needs a token too (`--metrics-auth kubernetes`).
    metrics: bool,
    cache: Mutex<Cache>,
    digest_keys: (RandomState, RandomState),
    slots: Semaphore,
    trusted_slots: Semaphore,
    reviews: IntCounterVec,
}

/// `lifecycle_api_auth_reviews_total{result}`, each result shown from the start.
fn review_family() -> Result<IntCounterVec, prometheus::Error> {
    let reviews = vec_of(AgentFamily::ApiAuthReviews, IntCounterVec::new)?;
    for result in ["allowed", "denied", "unauthenticated", "error"] {
        reviews.with_label_values(&[result]).inc_by(0);
    }
    Ok(reviews)
}

/// The reviews' family, registered in `registry` (`families::register_all`).
pub(super) fn register_reviews(registry: &Registry) -> Result<IntCounterVec, prometheus::Error> {
    let reviews = review_family()?;
    registry.register(Box::new(reviews.clone()))?;
    Ok(reviews)
}

impl ApiGate {
    /// A gate asking `reviewer` (None fails every request closed), counting reviews in
    /// `reviews` (registered by [`register_reviews`]), or in a family of its own when None.
    pub(crate) fn new(
        reviewer: Option<Box<dyn Reviewer>>,
        reviews: Option<IntCounterVec>,
    ) -> Result<Self, prometheus::Error> {
        let reviews = match reviews {
            Some(reviews) => reviews,
            None => review_family()?,
        };
        Ok(Self {
            reviewer,
            metrics: false,
            cache: Mutex::new(Cache::default()),
            digest_keys: (RandomState::new(), RandomState::new()),
            slots: Semaphore::new(REVIEWS_IN_FLIGHT),
            trusted_slots: Semaphore::new(TRUSTED_REVIEWS),
            reviews,
        })
    }

    /// Puts `/metrics` behind the gate too: `get` on the non-resource URL `/metrics`.
    pub(crate) fn with_metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Whether `/metrics` is behind the gate.
    pub(crate) fn covers_metrics(&self) -> bool {
        self.metrics
    }

    fn digest(&self, token: &str) -> TokenDigest {
        let (a, b) = (self.digest_keys.0.hash_one(token), self.digest_keys.1.hash_one(token));
        (u128::from(a) << 64) | u128::from(b)
    }

    /// Decides on a request for `path` with the `Authorization` header `authorization`.
    pub(crate) async fn check(&self, authorization: Option<&[u8]>, path: &str) -> Verdict {
        self.check_at(authorization, path, Instant::now()).await
    }

    async fn check_at(&self, authorization: Option<&[u8]>, path: &str, now: Instant) -> Verdict {
        let Some(token) = authorization.and_then(bearer_token) else { return Verdict::Unauthenticated };
        let Some(reviewer) = self.reviewer.as_deref() else { return Verdict::Unavailable };
        let key = (self.digest(token), access_request(path));
        if let Some(access) = self.cached(&key, now) {
            return verdict(&access);
        }
        let trusted = self.is_trusted(key.0, now);
        let asked = tokio::time::timeout(REVIEW_TIMEOUT, async {
            let slots = if trusted { &self.trusted_slots } else { &self.slots };
            let _slot = slots.acquire().await.ok()?;
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
                self.remember(key, access, now);
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

    fn cached(&self, key: &Key, now: Instant) -> Option<Access> {
        let cache = self.cache.lock();
        let live =
            |entry: Option<&(Access, Instant)>| entry.filter(|(_, expires)| *expires > now).map(|(a, _)| a.clone());
        live(cache.allowed.get(key)).or_else(|| live(cache.refused.get(key)))
    }

    fn is_trusted(&self, token: TokenDigest, now: Instant) -> bool {
        let cache = self.cache.lock();
        cache.trusted.get(&token).is_some_and(|until| *until > now)
    }

    fn remember(&self, key: Key, access: Access, now: Instant) {
        let mut cache = self.cache.lock();
        if matches!(access, Access::Allowed { .. }) {
            make_room(&mut cache.trusted, |until| *until, now);
            cache.trusted.insert(key.0, now + TRUSTED_MEMORY);
            make_room(&mut cache.allowed, |(_, expires)| *expires, now);
            cache.refused.remove(&key);
            cache.allowed.insert(key, (access, now + ALLOWED_TTL));
        } else {
            make_room(&mut cache.refused, |(_, expires)| *expires, now);
            cache.allowed.remove(&key);
            cache.refused.insert(key, (access, now + REFUSED_TTL));
        }
    }

    #[cfg(test)]
    fn cached_entries(&self) -> usize {
        let cache = self.cache.lock();
        cache.allowed.len() + cache.refused.len()
    }
}

/// What reading `path` needs: the probe of one pod, or (for the container list and for anything
/// else, which answers 404 to whoever may list containers) the list of the node's containers.
pub(crate) fn access_request(path: &str) -> AccessRequest {
    if path == "/metrics" {
        return AccessRequest::GetMetrics;
    }
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
pub(crate) fn bearer_token(value: &[u8]) -> Option<&str> {
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
        assert_eq!(access_request("/metrics"), AccessRequest::GetMetrics);
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
            gate.remember((gate.digest(&format!("t{n}")), AccessRequest::ListContainers), Access::Unauthenticated, now);
            assert!(gate.cached_entries() <= CACHE_ENTRIES);
        }
        let key = (gate.digest("t"), AccessRequest::ListContainers);
        gate.remember(key.clone(), Access::Allowed { user: "u".into() }, now);
        assert!(gate.cached(&key, now + ALLOWED_TTL - Duration::from_secs(1)).is_some());
        assert!(gate.cached(&key, now + ALLOWED_TTL).is_none(), "expired");
    }

    /// Allows "good"; leaves every "slow-*" token's review pending for ever; the rest are unknown.
    struct Stalling {
        calls: Arc<AtomicUsize>,
    }

    impl Reviewer for Stalling {
        fn review<'a>(&'a self, token: &'a str, _: &'a AccessRequest) -> ReviewFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "good" => Ok(Access::Allowed { user: "sre".into() }),
                    slow if slow.starts_with("slow-") => std::future::pending().await,
                    _ => Ok(Access::Unauthenticated),
                }
            })
        }
    }

    #[tokio::test]
    async fn a_flood_of_forged_tokens_neither_evicts_nor_delays_a_reader_already_allowed() {
        // Issue 18: forged tokens flushed the review cache (real readers locked out).
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(ApiGate::new(Some(Box::new(Stalling { calls: calls.clone() })), None).expect("gate"));
        let good = Some(&b"Bearer good"[..]);
        let t0 = Instant::now();
        assert_eq!(gate.check_at(good, "/api/v1/containers", t0).await, Verdict::Pass);
        for n in 0..CACHE_ENTRIES * 4 {
            let forged = format!("Bearer forged-{n}");
            assert_eq!(
                gate.check_at(Some(forged.as_bytes()), "/api/v1/containers", t0).await,
                Verdict::Unauthenticated
            );
        }
        let reviews = calls.load(Ordering::SeqCst);
        assert_eq!(gate.check_at(good, "/api/v1/containers", t0).await, Verdict::Pass);
        assert_eq!(calls.load(Ordering::SeqCst), reviews, "the reader's answer is still cached");
        // Every ordinary review slot held by reviews that never end...
        let stuck: Vec<_> = (0..REVIEWS_IN_FLIGHT)
            .map(|n| {
                let gate = Arc::clone(&gate);
                tokio::spawn(async move {
                    let token = format!("Bearer slow-{n}");
                    gate.check_at(Some(token.as_bytes()), "/api/v1/containers", t0).await
                })
            })
            .collect();
        while calls.load(Ordering::SeqCst) < reviews + REVIEWS_IN_FLIGHT {
            tokio::task::yield_now().await;
        }
        // ...the reader, its answer expired, is reviewed at once in a slot kept for it.
        let later = t0 + ALLOWED_TTL + Duration::from_secs(1);
        let asked = Instant::now();
        assert_eq!(gate.check_at(good, "/api/v1/containers", later).await, Verdict::Pass);
        assert!(asked.elapsed() < Duration::from_secs(1), "waited {:?}", asked.elapsed());
        for task in stuck {
            task.abort();
        }
    }
}
