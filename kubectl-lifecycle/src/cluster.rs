//! The Kubernetes client, made from kubectl's own flags: `--kubeconfig` (a file named there must
//! exist), `--context`, `--request-timeout`; the context's namespace is the default one.

use std::{path::PathBuf, time::Duration};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// `--kubeconfig` names no file: meant, so not silently replaced by another.
    #[error("--kubeconfig {}: no such file", path.display())]
    MissingKubeconfig { path: PathBuf },
    /// The kubeconfig could not be read or has no usable context.
    #[error("cannot use the kubeconfig{}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Kubeconfig {
        path: Option<PathBuf>,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor in-cluster credentials were found.
    #[error("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a pod")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot make a Kubernetes client")]
    Client(#[source] kube::Error),
}

/// kubectl's flags that say which cluster, as whom, and how long to wait.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArgs {
    /// The kubeconfig file (default: KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// How long each request may take (`10s`, `1m30s`, or seconds; 0: no limit), to the API
    /// server and to each agent through it.
    #[arg(long, global = true, default_value = "10s", value_parser = lifecycle_cli::args::request_timeout)]
    pub request_timeout: Duration,
}

/// A client for the cluster `args` name, and the namespace its context defaults to.
pub async fn client(args: &ClusterArgs) -> Result<(kube::Client, String), ClusterError> {
    let options = KubeConfigOptions { context: args.context.clone(), ..KubeConfigOptions::default() };
    let kubeconfig = |source| ClusterError::Kubeconfig { path: args.kubeconfig.clone(), source };
    let mut config = match &args.kubeconfig {
        Some(path) if !path.is_file() => return Err(ClusterError::MissingKubeconfig { path: path.clone() }),
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(kubeconfig)?;
            kube::Config::from_custom_kubeconfig(file, &options).await.map_err(kubeconfig)?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options).await.map_err(kubeconfig)?,
        None => kube::Config::infer().await.map_err(ClusterError::Infer)?,
    };
    if !args.request_timeout.is_zero() {
        let timeout = args.request_timeout;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    }
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(ClusterError::Client)?;
    Ok((client, namespace))
}

/// The API server's (or the agent's, through its proxy) status code of an error answer.
pub fn code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The reason kube gives an error answer whose body was not a `Status`.
const NOT_A_STATUS: &str = "Failed to parse error data";

/// A kube error as one line of words: the API server's status code, reason and message, not a
/// debug dump of its structure.
pub fn words(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            let code = status.code;
            // kube's own placeholder for an answer that was not a Status (an agent's text through
            // the proxy, a gateway's page): not the server's reason.
            let reason = match status.reason.as_str() {
                NOT_A_STATUS => "",
                reason => reason,
            };
            let message = lifecycle_cli::text::one_line(&status.message, 300);
            match (reason, message.is_empty()) {
                ("", true) => format!("{code}"),
                ("", false) => format!("{code}: {message}"),
                (reason, true) => format!("{code} {reason}"),
                (reason, false) => format!("{code} {reason}: {message}"),
            }
        }
        other => {
            let mut text = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(error) = cause {
                let said = error.to_string();
                if !text.contains(&said) {
                    text.push_str(": ");
                    text.push_str(&said);
                }
                cause = error.source();
            }
            lifecycle_cli::text::one_line(&text, 500)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_named_on_the_command_line_must_exist() {
        // Issue 41 item 7: an explicit --kubeconfig naming a missing file fell back to another.
        let args = ClusterArgs {
            kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
            context: None,
            request_timeout: Duration::ZERO,
        };
        let err = client(&args).await.err().expect("refused");
        assert_eq!(err.to_string(), "--kubeconfig /nonexistent/kubeconfig: no such file");
    }

    #[tokio::test]
    async fn the_contexts_namespace_is_the_default() {
        let dir = std::env::temp_dir().join(format!("kubectl-lifecycle-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: a\n\
             clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: a, context: {cluster: k, user: u, namespace: shop}}, \
                        {name: b, context: {cluster: k, user: u}}]\n",
        )
        .expect("kubeconfig");
        let args = |context: Option<&str>| ClusterArgs {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_owned),
            request_timeout: Duration::ZERO,
        };
        assert_eq!(client(&args(None)).await.expect("client").1, "shop");
        assert_eq!(client(&args(Some("b"))).await.expect("client").1, "default");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_api_error_is_one_line_of_words() {
        // Issue 41 item 7: a non-API answer was printed as Rust Debug text.
        let status = kube::core::Status::failure("pods \"web\" is forbidden:\n user x", "Forbidden").with_code(403);
        assert_eq!(words(&kube::Error::Api(status.boxed())), "403 Forbidden: pods \"web\" is forbidden: user x");
        let proxy = kube::core::Status::failure("<html>\u{1b}[2J bad gateway</html>", NOT_A_STATUS).with_code(502);
        assert_eq!(words(&kube::Error::Api(proxy.boxed())), "502: <html>\\u{1b}[2J bad gateway</html>");
    }
}
