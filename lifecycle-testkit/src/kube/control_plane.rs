//! The control plane of the node: etcd on loopback with its data in the run directory, and
//! kube-apiserver on 127.0.0.1 with its own CA and serving certificate (made with openssl, so
//! clients verify it: kubectl, and the agent's rustls client), static tokens and RBAC, a
//! service-account signing key, and the `ServiceAccount` admission plugin off (no
//! controller-manager creates the accounts or their tokens). Privileged pods are allowed (the
//! agent's DaemonSet). Clients get a kubeconfig file.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{process::Daemon, NodeVersion};
use crate::{agent::free_port, containerd::host::run as run_command};

/// The node's service range; its first address is in the serving certificate.
const SERVICE_RANGE: &str = "10.97.0.0/24";
const SERVICE_IP: &str = "10.97.0.1";
/// The user name of the reader token (`Kube::reader_token`).
pub const READER: &str = "reader";

/// The service-account issuer (and audience).
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Credentials and files clients need, in `<run>/pki`.
#[derive(Clone)]
pub(super) struct Pki {
    pub(super) ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    service_account_key: PathBuf,
    pub(super) tokens: PathBuf,
    /// The admin token (group system:masters): kubectl and tests.
    pub(super) admin_token: String,
    /// The kubelet's token (user `system:node:<node>`, groups system:nodes and system:masters).
    pub(super) kubelet_token: String,
    /// A token of user `reader`, in no group: authenticated, and allowed nothing until a test
    /// binds a role to it.
    pub(super) reader_token: String,
}

impl Pki {
    /// A CA, the API server's certificate for 127.0.0.1 / localhost / the service names, a
    /// service-account key and the token file.
    pub(super) fn create(run: &Path, node: &str) -> Result<Self> {
        let dir = run.join("pki");
        fs::create_dir_all(&dir).context("create pki dir")?;
        let ca = dir.join("ca.crt");
        let ca_key = dir.join("ca.key");
        openssl(
            &dir,
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7", "-subj", "/CN=lifecycle-kube-ca"],
        )
        .arg("-keyout")
        .arg(&ca_key)
        .arg("-out")
        .arg(&ca)
        .run()?;
        let key = dir.join("apiserver.key");
        let csr = dir.join("apiserver.csr");
        openssl(&dir, &["req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr)
            .run()?;
        let extensions = dir.join("apiserver.ext");
        fs::write(
            &extensions,
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n\
                 subjectAltName=IP:127.0.0.1,IP:{SERVICE_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,\
                 DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            ),
        )
        .context("write certificate extensions")?;
        let cert = dir.join("apiserver.crt");
        openssl(&dir, &["x509", "-req", "-days", "7", "-CAcreateserial"])
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&ca)
            .arg("-CAkey")
            .arg(&ca_key)
            .arg("-extfile")
            .arg(&extensions)
            .arg("-out")
            .arg(&cert)
            .run()?;
        let service_account_key = dir.join("service-account.key");
        openssl(&dir, &["genrsa", "-traditional", "-out"]).arg(&service_account_key).arg("2048").run()?;
        let (admin_token, kubelet_token, reader_token) = (random_token()?, random_token()?, random_token()?);
        let tokens = dir.join("tokens.csv");
        let mut text = String::new();
        let _ = writeln!(text, "{admin_token},admin,admin,\"system:masters\"");
        let _ = writeln!(text, "{kubelet_token},system:node:{node},kubelet,\"system:nodes,system:masters\"");
        let _ = writeln!(text, "{reader_token},{READER},reader");
        fs::write(&tokens, text).context("write tokens")?;
        Ok(Self { ca, cert, key, service_account_key, tokens, admin_token, kubelet_token, reader_token })
    }
}

/// `openssl <args>` run in `dir`.
struct OpenSsl(Command);

fn openssl(dir: &Path, args: &[&str]) -> OpenSsl {
    let mut command = Command::new("openssl");
    command.args(args).current_dir(dir);
    OpenSsl(command)
}

impl OpenSsl {
    fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Self {
        self.0.arg(arg);
        self
    }

    fn run(mut self) -> Result<()> {
        run_command(&mut self.0)
    }
}

fn random_token() -> Result<String> {
    let uuid = fs::read_to_string("/proc/sys/kernel/random/uuid").context("read a random uuid")?;
    Ok(uuid.trim().replace('-', ""))
}

/// Spawns etcd on two free loopback ports; returns it and its client URL once `/health` says so.
pub(super) fn start_etcd(run: &Path, binary: &Path) -> Result<(Daemon, String)> {
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut etcd = Daemon::spawn(
        "etcd",
        run,
        Command::new(binary)
            .arg("--name=lifecycle")
            .arg(format!("--data-dir={}", run.join("etcd").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=lifecycle={peer_url}"))
            .arg("--initial-cluster-state=new")
            // A throwaway store: durability costs fsyncs the tests do not need.
            .arg("--unsafe-no-fsync")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        etcd.check_running()?;
        let addr = format!("127.0.0.1:{client}");
        if crate::agent::get(&addr, "/health").is_some_and(|(code, body)| code == 200 && body.contains("true")) {
            return Ok((etcd, client_url));
        }
        if Instant::now() > deadline {
            bail!("etcd not healthy after 20 s:\n{}", etcd.log_tail(30));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Spawns kube-apiserver against `etcd_url` on `port` of 127.0.0.1 (a free one when None);
/// returns it and its URL at once (the caller waits for /readyz). 1.37 has no insecure port to
/// turn off (the flag is gone) and gets the node's feature gates.
pub(super) fn spawn_apiserver(
    run: &Path,
    binary: &Path,
    version: NodeVersion,
    etcd_url: &str,
    pki: &Pki,
    port: Option<u16>,
) -> Result<(Daemon, String)> {
    let port = port.unwrap_or_else(free_port);
    let certs = run.join("apiserver");
    fs::create_dir_all(&certs).context("create the API server's cert dir")?;
    let mut command = Command::new(binary);
    command
        .arg(format!("--etcd-servers={etcd_url}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"));
    if version == NodeVersion::V1_20 {
        command.arg("--insecure-port=0");
    }
    if let Some(gates) = version.feature_gates() {
        command.arg(format!("--feature-gates={gates}"));
    }
    let apiserver = Daemon::spawn(
        "kube-apiserver",
        run,
        command
            .arg(format!("--cert-dir={}", certs.display()))
            .arg(format!("--tls-cert-file={}", pki.cert.display()))
            .arg(format!("--tls-private-key-file={}", pki.key.display()))
            .arg(format!("--client-ca-file={}", pki.ca.display()))
            .arg(format!("--token-auth-file={}", pki.tokens.display()))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-issuer={ISSUER}"))
            .arg(format!("--service-account-key-file={}", pki.service_account_key.display()))
            .arg(format!("--service-account-signing-key-file={}", pki.service_account_key.display()))
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--allow-privileged=true")
            .arg("--profiling=false")
            .arg("--v=1"),
    )?;
    Ok((apiserver, format!("https://127.0.0.1:{port}")))
}

/// A kubeconfig for `server` with `token`, verifying the server against `ca`.
pub(super) fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str, token: &str) -> Result<()> {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "lifecycle", "cluster": { "server": server, "certificate-authority": ca } }],
        "users": [{ "name": user, "user": { "token": token } }],
        "contexts": [{ "name": "lifecycle", "context": { "cluster": "lifecycle", "user": user, "namespace": "default" } }],
        "current-context": "lifecycle",
    });
    fs::write(path, serde_json::to_vec_pretty(&config).context("encode kubeconfig")?)
        .with_context(|| format!("write {}", path.display()))
}
