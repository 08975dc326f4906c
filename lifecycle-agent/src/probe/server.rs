//! The probe HTTP surface: the request head and its answer ([`respond`]), binding inside a pod's
//! network namespace, and the routers: [`NodeProbes`] holds every container's probe and serves
//! the host-network fallback `/probe/<namespace>/<pod>/<container>/<kind>`; [`PodRouter`] serves
//! one pod's listener. The per-pod listeners' serving loop is `listener.rs`.
//!
//! Probes are kept by container key (pod uid and container name); requests name containers, as
//! the kubelet knows them, and reach them through an index of names beside the probes: a name
//! belongs to the pod registered under it last (a pod recreated under its name takes it from
//! the departing one), and only that pod's removal frees it.
//!
//! Only declared checks answer (issue 10): anything else — undeclared, unparsable, an unknown
//! container — gets 403 with the body [`FORBIDDEN_BODY`] and creates no state and no series.
//!
//! Namespaces: [`bind_in_netns`] enters the pod's netns on a short-lived dedicated thread, binds
//! there, and hands the socket back; a socket keeps the netns it was created in, so the agent's
//! own threads never change namespace.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use parking_lot::RwLock;

use super::{check::CheckSpec, declaration::parse_request, metrics::ProbeMetrics, pod::PodProbe};
use crate::{
    discovery::netns::{self, NetnsError},
    model::node::{ProbeKey, UnitLabels},
};

/// Port of the per-pod probe listener unless configured otherwise.
pub const DEFAULT_POD_PORT: u16 = 9891;
/// The whole body of every refusal: no detail, so a refusal teaches the client nothing.
pub(crate) const FORBIDDEN_BODY: &str = "forbidden\n";

/// The answer to anything that is not a declared check of a known container.
pub(crate) fn forbidden() -> (u16, String) {
    (403, FORBIDDEN_BODY.to_owned())
}

/// Answers probe requests from cached state. Must not block.
pub trait ProbeAnswer: Send + Sync {
    /// Status code and body for a GET of `path` with `query`.
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String);
}

/// Why a probe listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The pod's network namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The address is taken or not available inside that namespace.
    #[error("cannot listen on {addr} in network namespace {path}")]
    Bind {
        addr: SocketAddr,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The listener's event loop or thread could not be started.
    #[error("cannot start the probe listener's event loop")]
    Start(#[source] io::Error),
}

/// Binds `addr` inside the network namespace at `netns` (e.g. `/proc/<pid>/ns/net` or
/// `/var/run/netns/<name>`), returning a listener that stays in that namespace.
pub fn bind_in_netns(netns: &Path, addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    let path = netns.to_path_buf();
    netns::run_in(netns, "probe-netns-bind", move || std::net::TcpListener::bind(addr))?
        .map_err(|source| ServerError::Bind { addr, path, source })
}

/// The whole response to a raw request head.
pub(super) fn response(head: &[u8], answer: &dyn ProbeAnswer) -> String {
    let (status, body, send_body) = respond(head, answer);
    let mut response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason_phrase(status),
        body.len()
    );
    if send_body {
        response.push_str(&body);
    }
    response
}

/// Longest request head a probe may send (the kubelet's are ~200 bytes).
pub(crate) const MAX_REQUEST_HEAD: usize = 4096;

/// Headers a probe request may carry (the kubelet sends four, plus the probe's own
/// `httpHeaders`); more is answered 431.
const MAX_HEADERS: usize = 32;

/// Whether `head` holds a whole request head, or enough to refuse it: the connection can be
/// answered. A head is parsed by httparse, hyper's parser, so the line endings and limits are
/// what an HTTP/1.1 server accepts.
pub(super) fn head_is_answerable(head: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    !matches!(httparse::Request::new(&mut headers).parse(head), Ok(httparse::Status::Partial))
}

/// Status, body and whether to send the body (not for HEAD) for a raw request head.
pub fn respond(head: &[u8], answer: &dyn ProbeAnswer) -> (u16, String, bool) {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return (400, "incomplete request head\n".to_owned(), true),
        Err(httparse::Error::TooManyHeaders) => return (431, "too many headers\n".to_owned(), true),
        Err(httparse::Error::Version) => return (400, "only HTTP/1.x is served\n".to_owned(), true),
        Err(_) => return (400, "malformed request\n".to_owned(), true),
    }
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return (400, "malformed request\n".to_owned(), true);
    };
    let send_body = method != "HEAD";
    if method != "GET" && method != "HEAD" {
        return (405, "only GET is served\n".to_owned(), true);
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let (code, body) = answer.answer(path, query);
    (code, body, send_body)
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// The host-network fallback: every probed container by name.
///
/// Pods with `hostNetwork: true` share the node's netns, so they cannot each have a listener on
/// the same port there. Their probes are served by the node-side listener (the agent's own, on a
/// configurable port) at `/probe/<namespace>/<pod>/<container>/<kind>?...`; point the pod's
/// `httpGet` at that path with `port:` set to the agent's probe port (the pod IP is the node IP).
#[derive(Default)]
pub struct NodeProbes {
    routes: RwLock<Routes>,
    metrics: Option<Arc<ProbeMetrics>>,
}

/// The probes by key, and the index of names requests reach them by.
#[derive(Default)]
struct Routes {
    probes: BTreeMap<ProbeKey, Arc<PodProbe>>,
    /// Per pod name (namespace, pod), the key each container name resolves to: the one
    /// registered last under it.
    names: BTreeMap<(String, String), BTreeMap<String, ProbeKey>>,
}

impl Routes {
    /// Stops resolving `probe`'s names, if they still resolve to it (a pod registered later
    /// under them keeps them).
    fn unname(&mut self, probe: &PodProbe) {
        let UnitLabels { namespace, pod, container, .. } = probe.container().labels();
        let pod_name = (namespace.clone(), pod.clone());
        let Some(containers) = self.names.get_mut(&pod_name) else { return };
        if containers.get(container) == Some(probe.key()) {
            containers.remove(container);
        }
        if containers.is_empty() {
            self.names.remove(&pod_name);
        }
    }

    /// The probe `namespace/pod/container` resolves to.
    fn by_name(&self, namespace: &str, pod: &str, container: &str) -> Option<&Arc<PodProbe>> {
        let key = self.names.get(&(namespace.to_owned(), pod.to_owned()))?.get(container)?;
        self.probes.get(key)
    }
}

impl NodeProbes {
    /// An empty set whose refusals are counted in `metrics`.
    pub(crate) fn new(metrics: Option<Arc<ProbeMetrics>>) -> Self {
        Self { metrics, ..Self::default() }
    }

    /// Serves `probe`'s container: replaces an earlier probe of its key, and takes its names
    /// from whichever pod had them (see the module header).
    pub fn insert(&self, probe: Arc<PodProbe>) {
        let mut routes = self.routes.write();
        if let Some(earlier) = routes.probes.insert(probe.key().clone(), probe.clone()) {
            routes.unname(&earlier);
        }
        let UnitLabels { namespace, pod, container, .. } = probe.container().labels();
        let containers = routes.names.entry((namespace.clone(), pod.clone())).or_default();
        containers.insert(container.clone(), probe.key().clone());
    }

    /// Stops serving `key`'s container; its names stop resolving unless a pod registered later
    /// under them holds them.
    pub(crate) fn remove(&self, key: &ProbeKey) -> Option<Arc<PodProbe>> {
        let mut routes = self.routes.write();
        let probe = routes.probes.remove(key)?;
        routes.unname(&probe);
        Some(probe)
    }

    /// The probe the container `namespace/pod/container` resolves to.
    pub(crate) fn by_name(&self, namespace: &str, pod: &str, container: &str) -> Option<Arc<PodProbe>> {
        self.routes.read().by_name(namespace, pod, container).cloned()
    }

    /// Names of the containers of one pod (by name) that declared `spec`.
    pub(crate) fn declaring(&self, namespace: &str, pod: &str, spec: &CheckSpec) -> Vec<String> {
        let routes = self.routes.read();
        let Some(containers) = routes.names.get(&(namespace.to_owned(), pod.to_owned())) else { return Vec::new() };
        containers
            .iter()
            .filter(|(_, key)| routes.probes.get(*key).is_some_and(|probe| probe.is_declared(spec)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Judges `spec` for the container `namespace/pod/container`: 403 unless that container is
    /// tracked here and declared exactly this check.
    pub(crate) fn answer_check(&self, namespace: &str, pod: &str, container: &str, spec: &CheckSpec) -> (u16, String) {
        match self.by_name(namespace, pod, container) {
            Some(probe) => probe.answer_check(spec),
            None => self.forbidden(),
        }
    }

    /// Counts a refused request and gives its answer.
    pub(crate) fn forbidden(&self) -> (u16, String) {
        if let Some(metrics) = &self.metrics {
            metrics.record_forbidden();
        }
        forbidden()
    }
}

impl ProbeAnswer for NodeProbes {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let mut parts = path.strip_prefix("/probe/").unwrap_or("").splitn(4, '/');
        let (Some(namespace), Some(pod), Some(container), Some(kind)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return self.forbidden();
        };
        match parse_request(&format!("/probe/{kind}"), query) {
            Ok((None, spec)) => self.answer_check(namespace, pod, container, &spec),
            // The container is in the path; another one in the query is not a declared check.
            Ok((Some(_), _)) | Err(_) => self.forbidden(),
        }
    }
}

/// One pod's listener: `/probe/<kind>?...[&container=<name>]` goes to the container named, or
/// else to the one container of the pod that declared this check; 403 for anything else (nobody
/// declared it, or several containers did and the request does not say which).
pub struct PodRouter {
    probes: Arc<NodeProbes>,
    namespace: String,
    pod: String,
}

impl PodRouter {
    pub fn new(probes: Arc<NodeProbes>, namespace: &str, pod: &str) -> Self {
        Self { probes, namespace: namespace.to_owned(), pod: pod.to_owned() }
    }
}

impl ProbeAnswer for PodRouter {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let Ok((container, spec)) = parse_request(path, query) else { return self.probes.forbidden() };
        let container = match container {
            Some(name) => name,
            None => match <[String; 1]>::try_from(self.probes.declaring(&self.namespace, &self.pod, &spec)) {
                Ok([only]) => only,
                Err(_) => return self.probes.forbidden(),
            },
        };
        self.probes.answer_check(&self.namespace, &self.pod, &container, &spec)
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;

    struct Echo;

    impl ProbeAnswer for Echo {
        fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
            (200, format!("{path}|{}", query.unwrap_or("-")))
        }
    }

    #[test]
    fn request_lines_are_split_into_path_and_query() {
        let head = b"GET /probe/tcp?port=8080 HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(respond(head, &Echo), (200, "/probe/tcp|port=8080".to_owned(), true));
        assert_eq!(
            respond(b"HEAD /probe/process HTTP/1.0\r\n\r\n", &Echo),
            (200, "/probe/process|-".to_owned(), false)
        );
    }

    #[test]
    fn other_methods_and_garbage_are_refused() {
        assert_eq!(respond(b"POST /probe/tcp HTTP/1.1\r\n\r\n", &Echo).0, 405);
        assert_eq!(respond(b"GET /probe/tcp SPDY/3\r\n\r\n", &Echo).0, 400);
        assert_eq!(respond(b"nonsense\r\n\r\n", &Echo).0, 400);
        assert_eq!(respond(b"GET /probe/tcp HTTP/1.1\r\nNo colon here\r\n\r\n", &Echo).0, 400);
        let crowded = format!("GET /probe/tcp HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(respond(crowded.as_bytes(), &Echo).0, 431);
    }

    #[test]
    fn a_head_is_answerable_once_complete_or_once_it_cannot_be_valid() {
        let head = b"GET /probe/tcp?port=8080 HTTP/1.1\r\nHost: x\r\n\r\n";
        for end in 0..head.len() {
            assert!(!head_is_answerable(&head[..end]), "{:?}", String::from_utf8_lossy(&head[..end]));
        }
        assert!(head_is_answerable(head));
        // Bare line feeds end a head as well (HTTP/1.1 allows them).
        assert!(head_is_answerable(b"GET /probe/tcp HTTP/1.1\nHost: x\n\n"));
        assert!(head_is_answerable(b"\x16\x03\x01 not http"), "a TLS hello is refused at once, not waited on");
    }

    #[test]
    fn the_node_router_refuses_what_it_does_not_track() {
        let probes = NodeProbes::default();
        for (path, query) in [
            ("/probe/default/web/app/tcp", Some("port=8080")),
            ("/probe/default/web/app/file", Some("path=/proc/1/environ&contains=X")),
            ("/probe/default/web", None),
            ("/probe/default/web/app/tcp", Some("port=80a")),
        ] {
            assert_eq!(probes.answer(path, query), forbidden(), "{path}");
        }
        let head = b"GET /probe/default/web/app/process HTTP/1.1\r\n\r\n";
        assert_eq!(response(head, &probes), "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 10\r\nConnection: close\r\n\r\nforbidden\n");
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;
    use crate::model::{
        node::{ProbeChanges, ProbeFacts},
        probe::{ProcessFacts, ProcessState},
    };
    use crate::probe::{
        container::ProbedContainer,
        feeds::ProbeFeeds,
        files::{FileReaders, MAX_FILE_READERS},
    };

    /// A probe of this test's own process as container `db` of pod `shop/db-0` with the pod
    /// uid `uid`, declaring the process check; when `alive`, the model's facts say its main
    /// process runs (it answers 200), else it has none yet (503).
    fn db_0(feeds: &ProbeFeeds, uid: &str, alive: bool) -> Arc<PodProbe> {
        let labels =
            UnitLabels { namespace: "shop".into(), pod: "db-0".into(), container: "db".into(), uid: uid.into() };
        let container = ProbedContainer::new(labels);
        let key = container.key().clone();
        let facts = feeds.open(&key);
        let pid = std::process::id();
        let readers = FileReaders::unregistered(MAX_FILE_READERS);
        let probe = PodProbe::new(container, pid, None, facts, readers).expect("a probe of this process");
        probe.declare(vec![CheckSpec::Process { max_uninterruptible_ns: None }]);
        if alive {
            let process = Some(ProcessFacts { pid, state: ProcessState::Running, state_since_ns: 0 });
            let changes = ProbeChanges { changed: vec![key], untracked_ports: 0 };
            feeds.publish(changes, |_| Some(ProbeFacts { process: process.clone(), ..ProbeFacts::default() }));
        }
        Arc::new(probe)
    }

    #[test]
    fn a_name_belongs_to_the_pod_registered_last_and_only_its_removal_frees_it() {
        let feeds = ProbeFeeds::new(None);
        let probes = Arc::new(NodeProbes::default());
        let pod_router = PodRouter::new(probes.clone(), "shop", "db-0");
        let by_node = || probes.answer("/probe/shop/db-0/db/process", None);
        let by_pod = || pod_router.answer("/probe/process", None);
        let not_yet = (503, "main process not observed yet\n".to_owned());
        let ok = (200, "ok\n".to_owned());
        // The departing pod, then the pod recreated under its name: the newer answers.
        let (old, new) = (db_0(&feeds, "u-old", false), db_0(&feeds, "u-new", true));
        probes.insert(old.clone());
        assert_eq!((by_node(), by_pod()), (not_yet.clone(), not_yet));
        probes.insert(new.clone());
        assert_eq!((by_node(), by_pod()), (ok.clone(), ok.clone()));
        // The old pod goes: the new one still answers, by either route.
        assert!(probes.remove(old.key()).is_some_and(|gone| Arc::ptr_eq(&gone, &old)));
        assert_eq!((by_node(), by_pod()), (ok.clone(), ok.clone()));
        assert_eq!(probes.by_name("shop", "db-0", "db").map(|probe| probe.key().uid.clone()).as_deref(), Some("u-new"));
        // The new one goes: the name is gone.
        assert!(probes.remove(new.key()).is_some());
        assert_eq!((by_node(), by_pod()), (forbidden(), forbidden()));
        assert!(probes.routes.read().names.is_empty(), "no name is left behind");
        // A name freed by the newer pod's removal does not fall back to an older pod still kept.
        probes.insert(old.clone());
        probes.insert(new.clone());
        assert!(probes.remove(new.key()).is_some());
        assert_eq!(by_node(), forbidden());
        assert!(probes.remove(old.key()).is_some() && probes.remove(old.key()).is_none());
        assert!(probes.routes.read().names.is_empty() && probes.routes.read().probes.is_empty());
    }
}
