//! A kubelet's effective configuration, merged as the kubelet merges it: its `--config` file,
//! then each drop-in of `--config-dir` in lexical order of their paths, each one a JSON merge
//! patch (RFC 7386: objects merge key by key, lists and scalars replace, `null` removes), then
//! the flags of its command line over the result (`kubeletConfigFlagPrecedence` in
//! `cmd/kubelet/app/server.go`: a flag always wins; `--feature-gates` is merged gate by gate),
//! then the defaults of `kubelet.config.k8s.io/v1beta1` (`pkg/kubelet/apis/config/v1beta1/defaults.go`)
//! for what none of them set.
//!
//! Pure: the files come in already parsed (YAML and JSON are both JSON values here), the
//! command line as the process's argument vector. Discovery reads them (`/proc/<pid>/cmdline`,
//! the files through `/proc/<pid>/root`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::time::SECOND;

/// Feature gates kept from one configuration: a kubelet knows a few hundred; more is not a
/// kubelet's configuration.
pub const MAX_GATES: usize = 512;

/// The kubelet's command line as far as its configuration goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandLine {
    /// `--config`: the configuration file, as the kubelet was given it (relative to its working
    /// directory when not absolute).
    pub config_file: Option<String>,
    /// `--config-dir`: the drop-in directory.
    pub config_dir: Option<String>,
    /// `--hostname-override`: the node's name when it is not the host's.
    pub hostname_override: Option<String>,
    /// `--feature-gates`, merged over the file's gate by gate.
    pub feature_gates: BTreeMap<String, bool>,
    /// The flags that set configuration fields, as those fields (`--cgroup-driver` ->
    /// `cgroupDriver`): they replace what the files say.
    pub fields: Map<String, Value>,
    /// Flag values the agent could not read (a `--feature-gates` entry that is not `Name=bool`).
    pub unreadable: Vec<String>,
}

/// How a flag's text becomes a configuration field.
#[derive(Clone, Copy)]
enum FlagValue {
    Text,
    Bool,
    Integer,
    /// `signal<quantity,signal<quantity` (`--eviction-hard`).
    Thresholds,
    /// `signal=duration,...` (`--eviction-soft-grace-period`).
    Pairs,
}

/// The kubelet flags that set a configuration field the agent reads (deprecated in favour of
/// the file, still honoured over it).
const FIELD_FLAGS: &[(&str, &str, FlagValue)] = &[
    ("cgroup-driver", "cgroupDriver", FlagValue::Text),
    ("cgroup-root", "cgroupRoot", FlagValue::Text),
    ("cgroups-per-qos", "cgroupsPerQOS", FlagValue::Bool),
    ("container-runtime-endpoint", "containerRuntimeEndpoint", FlagValue::Text),
    ("eviction-hard", "evictionHard", FlagValue::Thresholds),
    ("eviction-soft", "evictionSoft", FlagValue::Thresholds),
    ("eviction-soft-grace-period", "evictionSoftGracePeriod", FlagValue::Pairs),
    ("eviction-max-pod-grace-period", "evictionMaxPodGracePeriod", FlagValue::Integer),
];

impl CommandLine {
    /// Reads the kubelet's argument vector (`argv[0]` first, as `/proc/<pid>/cmdline` has it).
    /// pflag's syntax: `--name=value` or `--name value`; `_` and `-` are the same in names; a
    /// bare `--name` is a boolean's true; `--` ends the flags. A running kubelet takes no other
    /// argument (it refuses one at start), so a word after a flag without `=` is that flag's value.
    pub fn parse(argv: &[String]) -> Self {
        let mut line = CommandLine::default();
        let mut args = argv.iter().skip(1).peekable();
        while let Some(arg) = args.next() {
            if arg == "--" {
                break;
            }
            let Some(flag) = arg.strip_prefix("--") else {
                // A shorthand (`-v=2`, `-v 2`): nothing the agent reads; skip its value too.
                if arg.starts_with('-') && !arg.contains('=') && args.peek().is_some_and(|next| !next.starts_with('-'))
                {
                    args.next();
                }
                continue;
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.replace('_', "-"), Some(value.to_owned())),
                None => {
                    let value = args.next_if(|next| !next.starts_with('-')).cloned();
                    (flag.replace('_', "-"), value)
                }
            };
            line.set(&name, value);
        }
        line
    }

    fn set(&mut self, name: &str, value: Option<String>) {
        match name {
            "config" => self.config_file = value.filter(|v| !v.is_empty()),
            "config-dir" => self.config_dir = value.filter(|v| !v.is_empty()),
            "hostname-override" => self.hostname_override = value.filter(|v| !v.is_empty()),
            "feature-gates" => {
                for entry in value.unwrap_or_default().split(',').map(str::trim).filter(|e| !e.is_empty()) {
                    match entry.split_once('=').map(|(k, v)| (k.trim(), v.trim().parse::<bool>())) {
                        Some((gate, Ok(on)))
                            if self.feature_gates.len() < MAX_GATES || self.feature_gates.contains_key(gate) =>
                        {
                            self.feature_gates.insert(gate.to_owned(), on);
                        }
                        _ => self.unreadable.push(format!("--feature-gates {entry}")),
                    }
                }
            }
            _ => {
                let Some((_, field, kind)) = FIELD_FLAGS.iter().find(|(flag, _, _)| *flag == name) else { return };
                let text = value.unwrap_or_default();
                let parsed = match kind {
                    FlagValue::Text => Some(Value::String(text.clone())),
                    // A bare boolean flag is true.
                    FlagValue::Bool if text.is_empty() => Some(Value::Bool(true)),
                    FlagValue::Bool => text.parse::<bool>().ok().map(Value::Bool),
                    FlagValue::Integer => text.parse::<i64>().ok().map(Value::from),
                    FlagValue::Thresholds => separated(&text, '<'),
                    FlagValue::Pairs => separated(&text, '='),
                };
                match parsed {
                    Some(parsed) => {
                        self.fields.insert((*field).to_owned(), parsed);
                    }
                    None => self.unreadable.push(format!("--{name} {text}")),
                }
            }
        }
    }
}

/// `a<b,c<d` (or `a=b,...`) as a JSON object; None when an entry lacks the separator.
fn separated(text: &str, separator: char) -> Option<Value> {
    let mut map = Map::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once(separator)?;
        map.insert(key.trim().to_owned(), Value::String(value.trim().to_owned()));
    }
    Some(Value::Object(map))
}

/// Applies `patch` to `target` as a JSON merge patch (RFC 7386), as the kubelet applies each
/// drop-in (`jsonpatch.MergePatch`).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else { return };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Why a configuration could not be taken as the kubelet's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A file is not a `KubeletConfiguration` of `kubelet.config.k8s.io`.
    #[error("{file} is a {kind:?} of {api_version:?}, not a KubeletConfiguration of kubelet.config.k8s.io")]
    NotKubeletConfiguration { file: String, kind: String, api_version: String },
    /// A field the agent reads has a value the kubelet would not have started with.
    #[error("{field}: {why}")]
    Field { field: &'static str, why: String },
}

/// One file of the configuration, parsed, with where it came from (for messages).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigFile {
    pub path: String,
    pub content: Value,
}

/// The settings of the kubelet the agent's rules read, effective (merged and defaulted).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct KubeletConfig {
    /// `crashLoopBackOff.maxContainerRestartPeriod`; None when not set (the kubelet then uses
    /// 300 s, when its KubeletCrashLoopBackOffMax gate is on).
    pub max_container_restart_period_ns: Option<u64>,
    /// `featureGates`, the command line's merged over the files'.
    pub feature_gates: BTreeMap<String, bool>,
    /// `cgroupDriver` (`cgroupfs` by default; from 1.31 a runtime that reports its own driver
    /// wins: KubeletCgroupDriverFromCRI).
    pub cgroup_driver: String,
    /// `cgroupRoot` (`/` when not set).
    pub cgroup_root: String,
    /// `cgroupsPerQOS`.
    pub cgroups_per_qos: bool,
    /// `shutdownGracePeriod`: the graceful node shutdown's whole budget (0: off).
    pub shutdown_grace_period_ns: u64,
    /// `shutdownGracePeriodCriticalPods`: the part of it kept for critical pods.
    pub shutdown_grace_period_critical_pods_ns: u64,
    /// `shutdownGracePeriodByPodPriority`: (priority, whole seconds) per group, replacing the
    /// two fields above when set (GracefulNodeShutdownBasedOnPodPriority, beta and on from
    /// 1.24). At most [`MAX_SHUTDOWN_GROUPS`].
    pub shutdown_grace_period_by_pod_priority: Vec<(i32, i64)>,
    /// `memoryThrottlingFactor` (MemoryQoS: `memory.high` = factor x limit).
    pub memory_throttling_factor: f64,
    /// `evictionHard`: signal -> threshold.
    pub eviction_hard: BTreeMap<String, String>,
    /// `evictionSoft`.
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: signal -> how long a soft threshold must hold.
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod`: a soft eviction's grace cap, seconds (0: the pod's own).
    pub eviction_max_pod_grace_period_s: i64,
    /// `containerRuntimeEndpoint`.
    pub container_runtime_endpoint: String,
}

/// The v1beta1 defaults for `evictionHard` when nothing sets it (Linux).
const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("imagefs.available", "15%"),
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
];

/// The fields of the v1beta1 configuration the agent reads, as written.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Written {
    #[serde(default)]
    crash_loop_back_off: CrashLoopBackOff,
    feature_gates: Option<BTreeMap<String, bool>>,
    cgroup_driver: Option<String>,
    cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    shutdown_grace_period: Option<String>,
    shutdown_grace_period_critical_pods: Option<String>,
    shutdown_grace_period_by_pod_priority: Option<Vec<ShutdownGroup>>,
    memory_throttling_factor: Option<f64>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_max_pod_grace_period: Option<i64>,
    container_runtime_endpoint: Option<String>,
}

/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShutdownGroup {
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    shutdown_grace_period_seconds: i64,
}

/// Priority groups of a graceful node shutdown kept: a kubelet's configuration has a handful.
pub const MAX_SHUTDOWN_GROUPS: usize = 64;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct CrashLoopBackOff {
    max_container_restart_period: Option<String>,
}

/// The group every version of the kubelet's configuration is in.
const GROUP: &str = "kubelet.config.k8s.io";

/// The effective configuration of a kubelet started with `command_line`, whose `--config` file
/// held `file` (None: no `--config`) and whose `--config-dir` held `drop_ins` (in the order the
/// kubelet applies them: lexical order of their paths).
pub fn effective(
    file: Option<&ConfigFile>,
    drop_ins: &[ConfigFile],
    command_line: &CommandLine,
) -> Result<KubeletConfig, ConfigError> {
    let mut merged = Value::Object(Map::new());
    for part in file.into_iter().chain(drop_ins) {
        check_kind(part)?;
        merge_patch(&mut merged, &part.content);
    }
    // Flags over the files: each flag's field replaces what they say.
    if let Value::Object(fields) = &mut merged {
        for (field, value) in &command_line.fields {
            fields.insert(field.clone(), value.clone());
        }
    }
    let written: Written = serde_json::from_value(merged)
        .map_err(|err| ConfigError::Field { field: "(configuration)", why: err.to_string() })?;
    let mut feature_gates = written.feature_gates.unwrap_or_default();
    feature_gates.extend(command_line.feature_gates.iter().map(|(gate, on)| (gate.clone(), *on)));
    if feature_gates.len() > MAX_GATES {
        return Err(ConfigError::Field { field: "featureGates", why: format!("{} gates", feature_gates.len()) });
    }
    let duration = |field: &'static str, text: Option<String>| -> Result<Option<u64>, ConfigError> {
        text.map(|text| go_duration_ns(&text).map_err(|why| ConfigError::Field { field, why })).transpose()
    };
    let max_container_restart_period_ns = duration(
        "crashLoopBackOff.maxContainerRestartPeriod",
        written.crash_loop_back_off.max_container_restart_period,
    )?;
    let memory_throttling_factor = written.memory_throttling_factor.unwrap_or(0.9);
    if !(memory_throttling_factor > 0.0 && memory_throttling_factor <= 1.0) {
        return Err(ConfigError::Field {
            field: "memoryThrottlingFactor",
            why: format!("{memory_throttling_factor} is not in (0, 1]"),
        });
    }
    let eviction_hard = written.eviction_hard.unwrap_or_else(|| {
        DEFAULT_EVICTION_HARD
            .iter()
            .map(|(signal, threshold)| ((*signal).to_owned(), (*threshold).to_owned()))
            .collect()
    });
    Ok(KubeletConfig {
        max_container_restart_period_ns,
        feature_gates,
        cgroup_driver: written.cgroup_driver.filter(|d| !d.is_empty()).unwrap_or_else(|| "cgroupfs".into()),
        cgroup_root: written.cgroup_root.filter(|r| !r.is_empty()).unwrap_or_else(|| "/".into()),
        cgroups_per_qos: written.cgroups_per_qos.unwrap_or(true),
        shutdown_grace_period_ns: duration("shutdownGracePeriod", written.shutdown_grace_period)?.unwrap_or(0),
        shutdown_grace_period_critical_pods_ns: duration(
            "shutdownGracePeriodCriticalPods",
            written.shutdown_grace_period_critical_pods,
        )?
        .unwrap_or(0),
        shutdown_grace_period_by_pod_priority: match written.shutdown_grace_period_by_pod_priority {
            Some(groups) if groups.len() > MAX_SHUTDOWN_GROUPS => {
                return Err(ConfigError::Field {
                    field: "shutdownGracePeriodByPodPriority",
                    why: format!("{} groups", groups.len()),
                })
            }
            groups => {
                groups.unwrap_or_default().into_iter().map(|g| (g.priority, g.shutdown_grace_period_seconds)).collect()
            }
        },
        memory_throttling_factor,
        eviction_hard,
        eviction_soft: written.eviction_soft.unwrap_or_default(),
        eviction_soft_grace_period: written.eviction_soft_grace_period.unwrap_or_default(),
        eviction_max_pod_grace_period_s: written.eviction_max_pod_grace_period.unwrap_or(0),
        container_runtime_endpoint: written
            .container_runtime_endpoint
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into()),
    })
}

/// A file must say it is a KubeletConfiguration when it says anything (upstream refuses other
/// kinds; a drop-in must name both).
fn check_kind(file: &ConfigFile) -> Result<(), ConfigError> {
    let text = |key: &str| file.content.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let (kind, api_version) = (text("kind"), text("apiVersion"));
    let group = api_version.split_once('/').map_or("", |(group, _)| group);
    if (kind.is_empty() && api_version.is_empty()) || (kind == "KubeletConfiguration" && group == GROUP) {
        return Ok(());
    }
    Err(ConfigError::NotKubeletConfiguration { file: file.path.clone(), kind, api_version })
}

/// Parses a Go `time.Duration` as `metav1.Duration` writes and reads it: `20s`, `1m30s`, `2h`,
/// `500ms`, `1.5s`, `0s`, `0`.
pub fn go_duration_ns(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a duration (like 20s, 1m30s, 500ms)");
    if text == "0" {
        return Ok(0);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => SECOND as f64,
            "m" => 60.0 * SECOND as f64,
            "h" => 3600.0 * SECOND as f64,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    if !total.is_finite() || total > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn argv(words: &[&str]) -> Vec<String> {
        std::iter::once("/usr/bin/kubelet").chain(words.iter().copied()).map(str::to_owned).collect()
    }

    fn file(path: &str, content: Value) -> ConfigFile {
        ConfigFile { path: path.into(), content }
    }

    const HEAD: (&str, &str) = ("KubeletConfiguration", "kubelet.config.k8s.io/v1beta1");

    /// A file's content: the head and `extra`'s keys as written (a `null` kept).
    fn config(extra: Value) -> Value {
        let mut value = json!({"kind": HEAD.0, "apiVersion": HEAD.1});
        if let (Value::Object(map), Value::Object(extra)) = (&mut value, extra) {
            map.extend(extra);
        }
        value
    }

    #[test]
    fn the_command_line_gives_the_files_and_the_flags() {
        let line = CommandLine::parse(&argv(&[
            "--config=/var/lib/kubelet/config.yaml",
            "--config-dir",
            "/etc/kubernetes/kubelet.conf.d",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "-v=2",
            "--feature_gates=KubeletCrashLoopBackOffMax=true, ReduceDefaultCrashLoopBackOffDecay=false",
            "--feature-gates",
            "KubeletCrashLoopBackOffMax=false",
            "--cgroup-driver",
            "systemd",
            "--cgroups-per-qos",
            "--eviction-hard=memory.available<200Mi,nodefs.available<5%",
            "--hostname-override=node-a",
        ]));
        assert_eq!(line.config_file.as_deref(), Some("/var/lib/kubelet/config.yaml"));
        assert_eq!(line.config_dir.as_deref(), Some("/etc/kubernetes/kubelet.conf.d"));
        assert_eq!(line.hostname_override.as_deref(), Some("node-a"));
        // Repeated --feature-gates add up, the later one winning per gate.
        assert_eq!(
            line.feature_gates,
            BTreeMap::from([
                ("KubeletCrashLoopBackOffMax".into(), false),
                ("ReduceDefaultCrashLoopBackOffDecay".into(), false)
            ])
        );
        assert_eq!(line.fields["cgroupDriver"], "systemd");
        assert_eq!(line.fields["cgroupsPerQOS"], true);
        assert_eq!(line.fields["evictionHard"], json!({"memory.available": "200Mi", "nodefs.available": "5%"}));
        assert!(line.unreadable.is_empty(), "{:?}", line.unreadable);
    }

    #[test]
    fn flags_after_the_end_of_flags_and_unreadable_values_are_not_taken() {
        let line = CommandLine::parse(&argv(&["--feature-gates=Broken,Gate=maybe", "--", "--config=/elsewhere"]));
        assert_eq!(line.config_file, None);
        assert!(line.feature_gates.is_empty());
        assert_eq!(line.unreadable, ["--feature-gates Broken", "--feature-gates Gate=maybe"]);
    }

    #[test]
    fn merge_patch_is_rfc_7386() {
        let mut target = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x", "gone": 1});
        merge_patch(&mut target, &json!({"a": {"c": [3], "e": true}, "d": {"f": 1}, "gone": null}));
        assert_eq!(target, json!({"a": {"b": 1, "c": [3], "e": true}, "d": {"f": 1}}));
    }

    #[test]
    fn drop_ins_merge_over_the_file_and_flags_over_both() {
        // The example of the kubelet's "Kubelet Configuration Directory Merging" page, with the
        // fields the agent reads.
        let main = file(
            "/var/lib/kubelet/config.yaml",
            config(json!({
                "crashLoopBackOff": {"maxContainerRestartPeriod": "60s"},
                "featureGates": {"MemoryQoS": true, "KubeletCrashLoopBackOffMax": true},
                "cgroupDriver": "systemd",
                "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
                "shutdownGracePeriod": "30s",
                "shutdownGracePeriodCriticalPods": "10s",
            })),
        );
        let first = file(
            "/etc/kubelet.conf.d/10-cap.conf",
            config(
                json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "20s"}, "featureGates": {"MemoryQoS": false}}),
            ),
        );
        let second = file(
            "/etc/kubelet.conf.d/20-eviction.conf",
            config(json!({"evictionHard": {"memory.available": "500Mi"}, "shutdownGracePeriod": null})),
        );
        let line =
            CommandLine::parse(&argv(&["--feature-gates=KubeletCrashLoopBackOffMax=false", "--cgroup-root=/k8s"]));
        let effective = effective(Some(&main), &[first, second], &line).expect("valid");
        assert_eq!(effective.max_container_restart_period_ns, Some(20 * SECOND));
        assert_eq!(
            effective.feature_gates,
            BTreeMap::from([("KubeletCrashLoopBackOffMax".into(), false), ("MemoryQoS".into(), false)])
        );
        assert_eq!(effective.cgroup_driver, "systemd");
        assert_eq!(effective.cgroup_root, "/k8s");
        // Maps merge key by key; `null` removes.
        assert_eq!(
            effective.eviction_hard,
            BTreeMap::from([("memory.available".into(), "500Mi".into()), ("nodefs.available".into(), "10%".into())])
        );
        assert_eq!(effective.shutdown_grace_period_ns, 0);
        assert_eq!(effective.shutdown_grace_period_critical_pods_ns, 10 * SECOND);
    }

    #[test]
    fn what_nothing_sets_takes_the_v1beta1_defaults() {
        let effective = effective(None, &[], &CommandLine::default()).expect("valid");
        assert_eq!(effective.max_container_restart_period_ns, None);
        assert_eq!(effective.cgroup_driver, "cgroupfs");
        assert_eq!(effective.cgroup_root, "/");
        assert!(effective.cgroups_per_qos);
        assert_eq!(effective.memory_throttling_factor, 0.9);
        assert_eq!(effective.eviction_hard.get("memory.available").map(String::as_str), Some("100Mi"));
        assert_eq!(effective.eviction_max_pod_grace_period_s, 0);
    }

    #[test]
    fn other_kinds_and_bad_values_are_refused() {
        let pod = file("/etc/x.yaml", json!({"kind": "Pod", "apiVersion": "v1"}));
        assert!(matches!(
            effective(Some(&pod), &[], &CommandLine::default()),
            Err(ConfigError::NotKubeletConfiguration { .. })
        ));
        let bad = file("/c", config(json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "soon"}})));
        let error = effective(Some(&bad), &[], &CommandLine::default()).expect_err("refused");
        assert!(error.to_string().contains("maxContainerRestartPeriod"), "{error}");
        let factor = file("/c", config(json!({"memoryThrottlingFactor": 2.0})));
        assert!(effective(Some(&factor), &[], &CommandLine::default()).is_err());
        let typed = file("/c", config(json!({"cgroupsPerQOS": "yes"})));
        assert!(effective(Some(&typed), &[], &CommandLine::default()).is_err());
    }

    #[test]
    fn go_durations() {
        for (text, ns) in [
            ("20s", 20 * SECOND),
            ("1m30s", 90 * SECOND),
            ("5m0s", 300 * SECOND),
            ("500ms", SECOND / 2),
            ("1.5s", 3 * SECOND / 2),
            ("1h", 3600 * SECOND),
            ("0s", 0),
            ("0", 0),
            ("250us", 250_000),
        ] {
            assert_eq!(go_duration_ns(text), Ok(ns), "{text}");
        }
        for bad in ["", "s", "20", "-1s", "1d", "1s2", "1e9h"] {
            assert!(go_duration_ns(bad).is_err(), "{bad:?}");
        }
    }
}
