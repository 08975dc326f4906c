//! The arguments both clients take, defined once: `lifecycle-agent status|explain` (one agent,
//! `--server`) and `kubectl lifecycle status|explain` (any agent, through the API server) flatten
//! the same selection, target and output flags, and parse durations and pod names the same way.

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::table::{Output, Selection};

/// Which containers `status` lists.
#[derive(Args, Clone, Debug)]
pub struct StatusFilter {
    /// Only this pod: POD, or NAMESPACE/POD.
    pub pod: Option<String>,
    /// Only this namespace (`kubectl lifecycle`: default the context's namespace;
    /// `lifecycle-agent`: default every namespace the node runs).
    #[arg(long, short, conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(long, short = 'A', conflicts_with = "pod")]
    pub all_namespaces: bool,
    /// Only containers of this name.
    #[arg(long, short)]
    pub container: Option<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "table")]
    pub output: Output,
}

impl StatusFilter {
    /// The selection asked of the agents: NAMESPACE/POD wins, then --namespace, then
    /// `default_namespace` unless every namespace is asked for.
    pub fn selection(&self, default_namespace: Option<&str>) -> Selection {
        let namespace = || {
            self.namespace.clone().or_else(|| (!self.all_namespaces).then(|| default_namespace.map(str::to_owned))?)
        };
        let (namespace, pod) = match self.pod.as_deref().map(|pod| pod.split_once('/').ok_or(pod)) {
            Some(Ok((namespace, pod))) => (Some(namespace.to_owned()), Some(pod.to_owned())),
            Some(Err(pod)) => (namespace(), Some(pod.to_owned())),
            None => (namespace(), None),
        };
        Selection { namespace, pod, container: self.container.clone() }
    }
}

/// What `explain` explains.
#[derive(Args, Clone, Debug)]
pub struct ExplainTarget {
    /// The pod: NAMESPACE/POD, or POD with --namespace; a plain host's unit is `host/<its cgroup
    /// path>` (`host/system.slice/nginx.service`, `host/t`).
    pub pod: String,
    /// The pod's namespace, when POD has none (`kubectl lifecycle`: default the context's;
    /// `lifecycle-agent`: default `default`).
    #[arg(long, short)]
    pub namespace: Option<String>,
    /// Only this container.
    #[arg(long, short)]
    pub container: Option<String>,
    /// Every stop the node kept of the pod's containers, newest first, not only each
    /// container's last (a pod that is gone is explained from this history anyway).
    #[arg(long)]
    pub all_instances: bool,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: ExplainFormat,
}

impl ExplainTarget {
    /// (namespace, pod): NAMESPACE/POD, else --namespace, else `default_namespace`.
    pub fn pod_ref(&self, default_namespace: &str) -> (String, String) {
        match self.pod.split_once('/') {
            Some((namespace, pod)) => (namespace.to_owned(), pod.to_owned()),
            None => (self.namespace.clone().unwrap_or_else(|| default_namespace.to_owned()), self.pod.clone()),
        }
    }
}

/// How `explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExplainFormat {
    /// A verdict line and a timeline per stop.
    Text,
    /// The stories as JSON.
    Json,
}

/// A duration flag: `500ms`, `30s`, `1.5m`, `1h30m` (the model's one parser, as in probe URLs).
pub fn duration(text: &str) -> Result<Duration, String> {
    lifecycle_model::duration::parse_ns(text).map(Duration::from_nanos).map_err(|err| format!("{text:?}: {err}"))
}

/// `--request-timeout` as kubectl takes it: a duration (`10s`, `1m30s`) or a number of seconds;
/// `0` waits for ever (see [`or_a_day`]).
pub fn request_timeout(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => duration(text),
    }
}

/// A `--request-timeout` of 0 (none) as a deadline a client can still take: a day.
pub fn or_a_day(timeout: Duration) -> Duration {
    if timeout.is_zero() {
        Duration::from_secs(86_400)
    } else {
        timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Status {
        #[command(flatten)]
        filter: StatusFilter,
    }

    fn selection(args: &[&str], default: Option<&str>) -> Selection {
        Status::try_parse_from([&["status"], args].concat()).expect("parses").filter.selection(default)
    }

    #[test]
    fn the_selection_reads_pods_and_namespaces_as_kubectl_does() {
        let shop = Some("shop".to_owned());
        assert_eq!(selection(&[], Some("shop")).namespace, shop);
        assert_eq!(selection(&["-A"], Some("shop")).namespace, None);
        assert_eq!(selection(&["-n", "kube-system"], Some("shop")).namespace.as_deref(), Some("kube-system"));
        let one = selection(&["web/web-1", "-c", "app"], None);
        assert_eq!(
            (one.namespace.as_deref(), one.pod.as_deref(), one.container.as_deref()),
            (Some("web"), Some("web-1"), Some("app"))
        );
        assert_eq!(selection(&["web-1"], Some("shop")).namespace, shop);
        assert!(Status::try_parse_from(["status", "-A", "web-1"]).is_err());
    }

    #[test]
    fn durations_and_timeouts_take_compounds_and_plain_seconds() {
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(duration("90").is_err());
        assert_eq!(request_timeout("5"), Ok(Duration::from_secs(5)));
        assert_eq!(request_timeout("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(or_a_day(request_timeout("0").expect("0")), Duration::from_secs(86_400));
    }

    #[test]
    fn a_mistyped_flag_is_answered_with_the_one_meant() {
        // Issue 41 item 8: no "did you mean" for flag typos.
        let err = Status::try_parse_from(["status", "--namspace", "shop"]).err().expect("refused");
        assert!(err.to_string().contains("tip: a similar argument exists: '--namespace'"), "{err}");
    }
}
