//! Talking to the node as a user does: kubectl with the node's kubeconfig, pod manifests bound to
//! the node, and waits on what the API server reports about a pod.

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{Kube, IMAGE, NODE};

/// How often waits ask the API server.
const POLL: Duration = Duration::from_millis(200);

impl Kube {
    /// A kubectl command with the node's kubeconfig (nothing from `$KUBECONFIG`) and a cache
    /// in the run directory, for cases the helpers below do not cover.
    pub fn kubectl_command(&self) -> Command {
        let mut command = Command::new(&self.kubectl);
        command
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // Its discovery cache would otherwise go to ~/.kube/cache.
            .arg("--cache-dir")
            .arg(self.run.path.join("kubectl-cache"))
            .arg("--request-timeout=30s");
        command
    }

    /// Runs `kubectl <args>`; returns its stdout, or fails with its stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_with_input(args, None)
    }

    /// Runs `kubectl <args>` with `input` on its stdin.
    pub fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String> {
        let mut command = self.kubectl_command();
        command.args(args).stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child =
            command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("spawn kubectl (is it on PATH?)")?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(input.as_bytes()).context("write kubectl's stdin")?;
        }
        let output = child.wait_with_output().context("wait for kubectl")?;
        if !output.status.success() {
            bail!("kubectl {}: {}: {}", args.join(" "), output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        String::from_utf8(output.stdout).context("kubectl printed non-UTF-8")
    }

    /// `kubectl apply -f -` of a manifest (YAML or JSON, e.g. `pod_manifest(..).to_string()`).
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.kubectl_with_input(&["apply", "-f", "-"], Some(manifest))
    }

    /// A pod on this node running `command` in the busybox image (`imagePullPolicy: Never`),
    /// in the `default` namespace, one container named `app`. Tests change fields before
    /// applying it (`manifest["spec"]["restartPolicy"] = "Never".into()`).
    pub fn pod_manifest(&self, name: &str, command: &[&str]) -> Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": "default" },
            "spec": {
                "nodeName": NODE,
                "containers": [{
                    "name": "app",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                }],
            },
        })
    }

    /// The pod as the API server has it, or `None` when there is no such pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Result<Option<Value>> {
        let text = self.kubectl(&["get", "pod", "-n", namespace, name, "-o", "json", "--ignore-not-found"])?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text).map(Some).context("pod JSON")
    }

    /// Polls the pod until `done` holds; returns the pod. On timeout the error has the last
    /// status seen and the kubelet's log tail.
    pub fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + within;
        let mut last = None;
        loop {
            if let Some(pod) = self.pod(namespace, name)? {
                if done(&pod) {
                    return Ok(pod);
                }
                last = Some(pod);
            }
            if Instant::now() > deadline {
                let status = last.as_ref().map(|p| p["status"].to_string()).unwrap_or_else(|| "no such pod".into());
                bail!(
                    "pod {namespace}/{name}: not {what} after {within:?}; last status: {status}\nkubelet log:\n{}",
                    self.log_tail("kubelet", 20)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for `status.phase` to be `phase` (Pending, Running, Succeeded, Failed).
    pub fn wait_pod_phase(&self, namespace: &str, name: &str, phase: &str, within: Duration) -> Result<Value> {
        self.wait_pod(namespace, name, &format!("phase {phase}"), within, |pod| pod["status"]["phase"] == phase)
    }

    /// Waits for a pod condition (`Ready`, `ContainersReady`, `Initialized`, `PodScheduled`) to
    /// be True.
    pub fn wait_pod_condition(&self, namespace: &str, name: &str, condition: &str, within: Duration) -> Result<Value> {
        self.wait_pod(namespace, name, &format!("{condition}=True"), within, |pod| condition_is_true(pod, condition))
    }

    /// Waits until the API server has no such pod; returns how long that took.
    pub fn wait_pod_gone(&self, namespace: &str, name: &str, within: Duration) -> Result<Duration> {
        let began = Instant::now();
        loop {
            if self.pod(namespace, name)?.is_none() {
                return Ok(began.elapsed());
            }
            if began.elapsed() > within {
                bail!(
                    "pod {namespace}/{name} still exists after {within:?}\nkubelet log:\n{}",
                    self.log_tail("kubelet", 20)
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The `status.containerStatuses[]` (or `initContainerStatuses[]`) entry of `container`.
pub fn container_status<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|key| pod["status"][key].as_array())
        .flatten()
        .find(|status| status["name"] == container)
}

/// Whether an object's `status.conditions` has `kind` with status "True".
pub fn condition_is_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| conditions.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}
