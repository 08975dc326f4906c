//! Pod sandboxes and containers, created, started, stopped and removed through the CRI the way
//! the kubelet calls it (labels, annotations, attempt = restart count, log paths, namespaces), and
//! the CRI half of the harness's teardown.

use std::{
    collections::HashMap,
    fs,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use lifecycle_agent::model::metadata::keys;

use super::{
    kubelet::{kubelet_namespaces, KubeletAnnotations},
    Containerd, CLEANUP_CALL_TIMEOUT, IMAGE,
};

/// A pod sandbox the harness created.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// cgroupfs parent, e.g. `/kubepods/burstable/pod<uid>`.
    pub cgroup_parent: String,
    config: cri::PodSandboxConfig,
}

impl Containerd {
    /// A pod sandbox as the kubelet creates one: host network, pid namespace per container,
    /// the kubelet's identity labels, the given cgroupfs parent.
    pub fn run_pod_sandbox(&mut self, name: &str, namespace: &str, uid: &str, cgroup_parent: &str) -> Result<Pod> {
        self.run_pod_sandbox_annotated(name, namespace, uid, cgroup_parent, &[])
    }

    /// [`Self::run_pod_sandbox`] with extra pod annotations, as the kubelet passes the pod's own
    /// (e.g. `lifecycle.dev/probes`).
    pub fn run_pod_sandbox_annotated(
        &mut self,
        name: &str,
        namespace: &str,
        uid: &str,
        cgroup_parent: &str,
        extra_annotations: &[(&str, &str)],
    ) -> Result<Pod> {
        self.run.record_cgroup_parent(cgroup_parent)?;
        let log_dir = self.run.path.join("logs").join(format!("{namespace}_{name}_{uid}"));
        fs::create_dir_all(&log_dir).context("create pod log dir")?;
        let namespaces = kubelet_namespaces();
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            // Host network: no CNI, and the kubelet leaves the hostname empty.
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: HashMap::from([
                (keys::POD_NAME.to_owned(), name.to_owned()),
                (keys::POD_NAMESPACE.to_owned(), namespace.to_owned()),
                (keys::POD_UID.to_owned(), uid.to_owned()),
            ]),
            annotations: [("kubernetes.io/config.source", "api")]
                .iter()
                .chain(extra_annotations)
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let request = cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        let mut runtime = self.runtime();
        let id = self
            .block_on(runtime.run_pod_sandbox(request))
            .with_context(|| format!("RunPodSandbox {namespace}/{name}\n{}", self.log_tail(20)))?
            .into_inner()
            .pod_sandbox_id;
        let pod = Pod {
            id,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
            cgroup_parent: cgroup_parent.to_owned(),
            config,
        };
        self.pods.push(pod.clone());
        Ok(pod)
    }

    /// A burstable pod in `default` with a fresh UID: `/kubepods/burstable/pod<uid>`.
    pub fn new_pod(&mut self, name: &str) -> Result<Pod> {
        let uid = fresh_uid()?;
        self.run_pod_sandbox(name, "default", &uid, &format!("/kubepods/burstable/pod{uid}"))
    }

    /// [`Self::new_pod`] with extra pod annotations.
    pub fn new_pod_annotated(&mut self, name: &str, annotations: &[(&str, &str)]) -> Result<Pod> {
        let uid = fresh_uid()?;
        self.run_pod_sandbox_annotated(name, "default", &uid, &format!("/kubepods/burstable/pod{uid}"), annotations)
    }

    /// A container as the kubelet creates one (labels, annotations, attempt = restart count,
    /// log path, namespaces); `memory_limit_bytes` also caps swap, as the kubelet does.
    pub fn create_container(
        &mut self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &KubeletAnnotations,
        memory_limit_bytes: Option<i64>,
    ) -> Result<String> {
        let resources = cri::LinuxContainerResources {
            cpu_shares: 2,
            memory_limit_in_bytes: memory_limit_bytes.unwrap_or(0),
            memory_swap_limit_in_bytes: memory_limit_bytes.unwrap_or(0),
            ..Default::default()
        };
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.to_owned(), attempt: annotations.restart_count }),
            image: Some(cri::ImageSpec { image: IMAGE.to_owned(), ..Default::default() }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            labels: HashMap::from([
                (keys::POD_NAME.to_owned(), pod.name.clone()),
                (keys::POD_NAMESPACE.to_owned(), pod.namespace.clone()),
                (keys::POD_UID.to_owned(), pod.uid.clone()),
                (keys::CONTAINER_NAME.to_owned(), name.to_owned()),
            ]),
            annotations: annotations.to_map(),
            log_path: format!("{name}/{}.log", annotations.restart_count),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(kubelet_namespaces()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let mut runtime = self.runtime();
        let id = self
            .block_on(runtime.create_container(request))
            .with_context(|| format!("CreateContainer {name} in {}\n{}", pod.name, self.log_tail(20)))?
            .into_inner()
            .container_id;
        self.containers.push(id.clone());
        Ok(id)
    }

    /// StartContainer.
    pub fn start_container(&self, id: &str) -> Result<()> {
        let mut runtime = self.runtime();
        let request = cri::StartContainerRequest { container_id: id.to_owned() };
        self.block_on(runtime.start_container(request))
            .with_context(|| format!("StartContainer {id}\n{}", self.log_tail(20)))?;
        Ok(())
    }

    /// Create and start.
    pub fn run_container(
        &mut self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &KubeletAnnotations,
        memory_limit_bytes: Option<i64>,
    ) -> Result<String> {
        let id = self.create_container(pod, name, command, annotations, memory_limit_bytes)?;
        self.start_container(&id)?;
        Ok(id)
    }

    /// StopContainer as the kubelet's killContainer issues it; returns how long the call took
    /// (the runtime answers once the container has exited).
    pub fn stop_container(&self, id: &str, timeout_s: i64) -> Result<Duration> {
        let mut runtime = self.runtime();
        let request = cri::StopContainerRequest { container_id: id.to_owned(), timeout: timeout_s };
        let began = Instant::now();
        self.block_on(runtime.stop_container(request)).with_context(|| format!("StopContainer {id}"))?;
        Ok(began.elapsed())
    }

    /// ContainerStatus, raw.
    pub fn container_status(&self, id: &str) -> Result<cri::ContainerStatus> {
        let mut runtime = self.runtime();
        let request = cri::ContainerStatusRequest { container_id: id.to_owned(), verbose: false };
        self.block_on(runtime.container_status(request))
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("ContainerStatus {id}: empty answer"))
    }

    /// Polls ContainerStatus until the container has exited.
    pub fn wait_exited(&self, id: &str, within: Duration) -> Result<cri::ContainerStatus> {
        let deadline = Instant::now() + within;
        loop {
            let status = self.container_status(id)?;
            if status.state == cri::ContainerState::ContainerExited as i32 {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("container {id} still in state {} after {within:?}", status.state);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// RemoveContainer (the runtime kills it first if it still runs).
    pub fn remove_container(&mut self, id: &str) -> Result<()> {
        let mut runtime = self.runtime();
        let request = cri::RemoveContainerRequest { container_id: id.to_owned() };
        self.block_on(runtime.remove_container(request)).with_context(|| format!("RemoveContainer {id}"))?;
        self.containers.retain(|c| c != id);
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox (which removes the pod's containers too).
    pub fn remove_pod(&mut self, pod: &Pod) -> Result<()> {
        let mut runtime = self.runtime();
        let stop = cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() };
        self.block_on(runtime.stop_pod_sandbox(stop)).with_context(|| format!("StopPodSandbox {}", pod.id))?;
        let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() };
        self.block_on(runtime.remove_pod_sandbox(remove)).with_context(|| format!("RemovePodSandbox {}", pod.id))?;
        self.pods.retain(|p| p.id != pod.id);
        Ok(())
    }

    /// Removes, through the CRI, everything this harness created; returns what failed.
    pub(super) fn remove_all_through_cri(&mut self) -> Vec<String> {
        let Some(client) = self.cri.as_ref() else {
            return Vec::new();
        };
        let runtime = client.runtime_service();
        let containers = std::mem::take(&mut self.containers);
        let pods = std::mem::take(&mut self.pods);
        self.block_on(async move {
            let mut failures = Vec::new();
            let mut note =
                |what: String, result: Result<Result<(), tonic::Status>, tokio::time::error::Elapsed>| match result {
                    Ok(Ok(())) => {}
                    Ok(Err(status)) if status.code() == tonic::Code::NotFound => {}
                    Ok(Err(status)) => failures.push(format!("{what}: {status}")),
                    Err(_) => failures.push(format!("{what}: timed out")),
                };
            for id in containers.iter().rev() {
                let mut rt = runtime.clone();
                let stop = cri::StopContainerRequest { container_id: id.clone(), timeout: 0 };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.stop_container(stop)).await;
                note(format!("StopContainer {id}"), result.map(|r| r.map(drop)));
                let remove = cri::RemoveContainerRequest { container_id: id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.remove_container(remove)).await;
                note(format!("RemoveContainer {id}"), result.map(|r| r.map(drop)));
            }
            for pod in pods.iter().rev() {
                let mut rt = runtime.clone();
                let stop = cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.stop_pod_sandbox(stop)).await;
                note(format!("StopPodSandbox {}", pod.id), result.map(|r| r.map(drop)));
                let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() };
                let result = tokio::time::timeout(CLEANUP_CALL_TIMEOUT, rt.remove_pod_sandbox(remove)).await;
                note(format!("RemovePodSandbox {}", pod.id), result.map(|r| r.map(drop)));
            }
            failures
        })
    }
}

fn fresh_uid() -> Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/uuid").context("read a random uuid")?.trim().to_owned())
}
