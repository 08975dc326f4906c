//! `bench plugin`: what `kubectl lifecycle explain` of a pod already gone from the API costs on a
//! large cluster. N agents listen on loopback (one listener each, answering `/api/v1/history`:
//! the pod's stop on its node, nothing elsewhere); a stand-in API server (this seam only: the
//! plugin's requests, as a real one answers them) lists them as the DaemonSet's pods, mints the
//! reader token, answers 404 for the pod, names its node in a kubelet Event, and proxies
//! `pods/proxy` to the agents. The plugin binary runs against it: once finding the node from the
//! Events, once with `--all-nodes`. Counted: requests that reached agents, the time the command
//! took, and which bearer token the agents saw (the minted one only, never the kubeconfig's).

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, shell, workspace_root};

/// The token the kubeconfig authenticates with: it must never reach an agent.
const USER_TOKEN: &str = "the-users-own-credential";
/// The token the stand-in API server mints for the reader account.
const MINTED: &str = "minted-for-the-agents";
/// The gone pod's node.
fn pod_node(nodes: usize) -> usize {
    nodes * 2 / 3
}

/// What the agents saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    /// Every distinct `X-Lifecycle-Authorization` (and `Authorization`) value an agent received.
    credentials: Mutex<Vec<String>>,
}

pub fn run(nodes: usize, rounds: usize) -> Result<()> {
    raise_open_files(nodes)?;
    shell::run(cargo().args(["build", "--release", "-p", "kubectl-lifecycle"]))?;
    let plugin = workspace_root().join("target/release/kubectl-lifecycle");
    let seen = Arc::new(Seen::default());
    let history = history_json()?;
    let mut ports = Vec::with_capacity(nodes);
    for node in 0..nodes {
        let listener = TcpListener::bind("127.0.0.1:0").context("an agent's listener")?;
        ports.push(listener.local_addr()?.port());
        let answer = if node == pod_node(nodes) {
            history.clone()
        } else {
            r#"{"boot_to_unix_seconds":0.0,"stops":[]}"#.to_owned()
        };
        let seen = seen.clone();
        // Detached, with a small stack: a thousand of them serve until xtask exits.
        std::thread::Builder::new().stack_size(64 << 10).spawn(move || serve_agent(&listener, &answer, &seen))?;
    }
    let api = TcpListener::bind("127.0.0.1:0").context("the API server's listener")?;
    let api_port = api.local_addr()?.port();
    let ports = Arc::new(ports);
    std::thread::spawn(move || {
        for stream in api.incoming().flatten() {
            let ports = ports.clone();
            std::thread::spawn(move || {
                let _ = serve_api(stream, nodes, &ports);
            });
        }
    });
    let dir = std::env::temp_dir().join(format!("lifecycle-bench-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: bench\n\
             clusters: [{{name: bench, cluster: {{server: 'http://127.0.0.1:{api_port}'}}}}]\n\
             users: [{{name: user, user: {{token: {USER_TOKEN}}}}}]\n\
             contexts: [{{name: bench, context: {{cluster: bench, user: user, namespace: shop}}}}]\n"
        ),
    )?;
    eprintln!("xtask: {nodes} agents on loopback; the pod ran on node-{:04}", pod_node(nodes));
    let mut rows = Vec::new();
    for (label, extra) in [("node from the kubelet's Events", &[][..]), ("--all-nodes", &["--all-nodes"][..])] {
        let mut times = Vec::new();
        let mut requests = 0;
        for _ in 0..rounds {
            let before = seen.requests.load(Ordering::SeqCst);
            let began = Instant::now();
            let output = Command::new(&plugin)
                .args(["--kubeconfig"])
                .arg(&kubeconfig)
                .args(["explain", "web-1", "-o", "json"])
                .args(extra)
                .output()
                .context("running the plugin")?;
            let took = began.elapsed();
            if !output.status.success() || !String::from_utf8_lossy(&output.stdout).contains("SIGKILLed") {
                bail!("{label}: the plugin did not explain the pod: {output:?}");
            }
            requests = seen.requests.load(Ordering::SeqCst) - before;
            times.push(took);
        }
        times.sort();
        rows.push((label, requests, times[times.len() / 2], times[times.len() - 1]));
    }
    let credentials = seen.credentials.lock().map(|c| c.clone()).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    println!("| explain of a pod gone from the API, {nodes} agents on loopback | agent requests | median | max |");
    println!("|---|---|---|---|");
    for (label, requests, median, max) in &rows {
        println!("| {label} | {requests} | {:.1} ms | {:.1} ms |", ms(*median), ms(*max));
    }
    println!("bearer tokens the agents received: {credentials:?}");
    if credentials.iter().any(|c| c.contains(USER_TOKEN)) || credentials != [format!("Bearer {MINTED}")] {
        bail!("the agents received a credential other than the minted token: {credentials:?}");
    }
    Ok(())
}

/// One descriptor per agent's listener, and connections besides: the soft limit raised to the
/// hard one, which must leave room.
fn raise_open_files(nodes: usize) -> Result<()> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        bail!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct it is given, nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        bail!("setrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
    }
    if (limit.rlim_cur as usize) < nodes + 256 {
        bail!("{nodes} agents need {} open files; the hard limit is {}", nodes + 256, limit.rlim_cur);
    }
    Ok(())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// `/api/v1/history`'s body with one stop of `shop/web-1`, SIGKILLed at its grace, as an agent
/// writes it.
fn history_json() -> Result<String> {
    use lifecycle_model::{
        node::PastStop,
        spec::{SpecSource, StopCause},
        termination::{SignalSender, StopRules, StopScene, StopSignalSeen, TerminationOutcome, TerminationReport},
        time::{BootTime, SECOND},
        wire::{at::WallClock, with_clock::WithClock, HistoryResponse},
    };
    let stop = BootTime::from_ns(100 * SECOND);
    let report = TerminationReport {
        stop_signal: Some(StopSignalSeen {
            time: stop,
            signal: 15,
            sender: SignalSender::Runtime,
            matches_configured: true,
        }),
        pre_stop: None,
        exit_time: stop.after(30 * SECOND),
        exit_status: None,
        exit_signal: Some(9),
        rules: StopRules::Kubelet,
        grace_ns: 30 * SECOND,
        expected_kill_after_ns: 30 * SECOND,
        expected_kill_exact: true,
        oom_kills: 0,
        is_sidecar: false,
        sidecar_turn: None,
        outcome: TerminationOutcome::SigkilledAfterGrace {
            grace_ns: 30 * SECOND,
            stop_to_kill_ns: 30 * SECOND,
            expected_kill_after_ns: 30 * SECOND,
            sender: Some(SignalSender::Runtime),
            accepts_after_stop: 0,
            still_listening: false,
        },
        oom_victim: None,
        oom_limit: None,
        cause: Some(StopCause::Deleted),
        kubelet_started_before_ns: None,
        memory: None,
        spec: SpecSource::default(),
        watched_since: None,
        scene: StopScene::default(),
    };
    let past = PastStop {
        seq: 1,
        namespace: "shop".into(),
        pod: "web-1".into(),
        uid: "uid-web-1".into(),
        container: "app".into(),
        container_id: None,
        restart_count: 0,
        last_termination: report,
    };
    let body = HistoryResponse { boot_to_unix_seconds: 0.0, stops: vec![past] };
    Ok(serde_json::to_string(&WithClock::new(&body, WallClock::from_offset_seconds(0.0)))?)
}

/// A request's line and headers, its body read and dropped.
fn read_request(reader: &mut BufReader<TcpStream>) -> Result<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.trim_end().split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let length: usize =
        headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((line.trim_end().to_owned(), headers))
}

fn respond(stream: &mut TcpStream, status: &str, body: &str) -> Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(())
}

/// One agent: every request answered with `answer`; what it was sent is noted.
fn serve_agent(listener: &TcpListener, answer: &str, seen: &Seen) {
    for stream in listener.incoming().flatten() {
        let Ok(clone) = stream.try_clone() else { continue };
        let mut reader = BufReader::new(clone);
        let Ok((_, headers)) = read_request(&mut reader) else { continue };
        seen.requests.fetch_add(1, Ordering::SeqCst);
        for (name, value) in &headers {
            if name == "x-lifecycle-authorization" || name == "authorization" {
                if let Ok(mut credentials) = seen.credentials.lock() {
                    if !credentials.contains(value) {
                        credentials.push(value.clone());
                    }
                }
            }
        }
        let mut stream = stream;
        let _ = respond(&mut stream, "200 OK", answer);
    }
}

/// `%XX` decoded.
fn decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()),
        ) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn agent_pod(node: usize) -> String {
    format!(
        r#"{{"metadata":{{"name":"lifecycle-agent-{node:04}","namespace":"lifecycle-system","labels":{{"app.kubernetes.io/name":"lifecycle-agent"}},"ownerReferences":[{{"apiVersion":"apps/v1","kind":"DaemonSet","name":"lifecycle-agent","uid":"ds-uid","controller":true}}]}},"spec":{{"nodeName":"node-{node:04}","serviceAccountName":"lifecycle-agent","containers":[]}},"status":{{"phase":"Running"}}}}"#
    )
}

/// The stand-in API server: the plugin's requests, answered as a real one answers them.
fn serve_api(stream: TcpStream, nodes: usize, ports: &[u16]) -> Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let (line, headers) = read_request(&mut reader)?;
    let mut stream = stream;
    let target = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let (path, query) = target.split_once('?').map_or((target.as_str(), ""), |(p, q)| (p, q));
    let query = decoded(query);
    const AGENTS: &str = "/api/v1/namespaces/lifecycle-system/pods";
    if path == "/api/v1/namespaces/shop/pods/web-1" {
        return respond(
            &mut stream,
            "404 Not Found",
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"web-1\" not found","reason":"NotFound","code":404}"#,
        );
    }
    if path == "/api/v1/namespaces/shop/events" {
        let node = pod_node(nodes);
        return respond(
            &mut stream,
            "200 OK",
            &format!(
                r#"{{"apiVersion":"v1","kind":"EventList","metadata":{{}},"items":[{{"metadata":{{"name":"web-1.1","namespace":"shop"}},"involvedObject":{{"kind":"Pod","name":"web-1","namespace":"shop"}},"source":{{"component":"kubelet","host":"node-{node:04}"}},"reportingComponent":"kubelet","reportingInstance":"node-{node:04}","lastTimestamp":"2026-11-29T03:00:00Z","reason":"Killing","message":"Stopping container app"}}]}}"#
            ),
        );
    }
    if path == "/api/v1/namespaces/lifecycle-system/serviceaccounts/lifecycle-reader/token" {
        return respond(
            &mut stream,
            "201 Created",
            &format!(
                r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","metadata":{{"name":"lifecycle-reader"}},"spec":{{"audiences":["lifecycle-agent"]}},"status":{{"token":"{MINTED}","expirationTimestamp":"2026-11-29T04:00:00Z"}}}}"#
            ),
        );
    }
    if path == "/apis/apps/v1/namespaces/lifecycle-system/daemonsets/lifecycle-agent" {
        return respond(
            &mut stream,
            "200 OK",
            r#"{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"lifecycle-agent","namespace":"lifecycle-system","uid":"ds-uid"},"spec":{"selector":{"matchLabels":{"app.kubernetes.io/name":"lifecycle-agent"}},"template":{"spec":{"serviceAccountName":"lifecycle-agent","containers":[]}}}}"#,
        );
    }
    if path == AGENTS {
        let only = query.split('&').find_map(|pair| pair.strip_prefix("fieldSelector=spec.nodeName=node-"));
        let items: Vec<String> = match only.and_then(|n| n.parse::<usize>().ok()) {
            Some(node) if node < nodes => vec![agent_pod(node)],
            Some(_) => vec![],
            None => (0..nodes).map(agent_pod).collect(),
        };
        return respond(
            &mut stream,
            "200 OK",
            &format!(
                r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"resourceVersion":"1"}},"items":[{}]}}"#,
                items.join(",")
            ),
        );
    }
    if let Some(rest) = path.strip_prefix(&format!("{AGENTS}/https:lifecycle-agent-")) {
        // pods/proxy: <node>:9890/proxy<path>, forwarded to that agent with the headers the
        // API server passes on (X-Lifecycle-Authorization; it keeps Authorization).
        let (node, rest) = rest.split_once(':').context("a proxy path")?;
        let forwarded = rest.split_once("/proxy").map(|(_, p)| p).context("a proxy path")?;
        let port = ports[node.parse::<usize>()?];
        let mut agent = TcpStream::connect(("127.0.0.1", port))?;
        let mut forward = format!("GET {forwarded}?{query} HTTP/1.0\r\nhost: agent\r\n");
        for (name, value) in headers.iter().filter(|(name, _)| name == "x-lifecycle-authorization") {
            forward.push_str(&format!("{name}: {value}\r\n"));
        }
        forward.push_str("\r\n");
        agent.write_all(forward.as_bytes())?;
        let mut answer = String::new();
        agent.read_to_string(&mut answer)?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head.lines().next().and_then(|l| l.split_once(' ')).map_or("502 Bad Gateway", |(_, s)| s);
        return respond(&mut stream, status, body);
    }
    respond(&mut stream, "404 Not Found", r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}"#)
}
