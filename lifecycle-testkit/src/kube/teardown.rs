//! Taking the node down: [`Kube::stop`] and `Drop` stop the kubelet, remove every pod sandbox
//! through the CRI, stop the API server and etcd, keep the daemons' logs when asked, and undo
//! what the run recorded (see the module header of `kube`); [`Kube::abandon_as_if_crashed`]
//! leaves it all to the next start's sweep, as a killed test process would.

use std::{
    path::Path,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::{
    machine,
    run_dir::{MachineLock, DAEMONS},
    sweep_stale, Kube, MachineState, LIVE, LOG_ENV, STOP_GRACE,
};

impl Kube {
    /// Tears the node down (as `Drop` does) and returns the machine's state right after, taken
    /// while this node still holds the machine lock (no other node can have started).
    pub fn stop(mut self) -> MachineState {
        self.teardown();
        MachineState::capture()
    }

    /// Leaves every daemon, pod, mount, cgroup, sysctl and host path as it is, owned by a dead
    /// pid, as a SIGKILLed test process would. The machine lock stays taken until
    /// [`Abandoned::sweep`] has done what the next start would do.
    pub fn abandon_as_if_crashed(mut self) -> Abandoned {
        // pid 0 is never a live owner.
        if let Err(e) = std::fs::write(self.run.path.join("owner"), "0 abandoned") {
            panic!("cannot rewrite owner of {}: {e}", self.run.path.display());
        }
        if let Some(containerd) = self.containerd.take() {
            containerd.abandon_as_if_crashed();
        }
        // Dropping a Child neither kills nor waits for it.
        drop((self.kubelet.take(), self.apiserver.take(), self.etcd.take()));
        self.done = true;
        Abandoned { lock: self.lock.take() }
    }

    /// Removes every pod sandbox from containerd (their containers first, SIGKILL), bounded in
    /// time; returns what failed.
    fn remove_sandboxes(&self) -> Vec<String> {
        use k8s_cri::v1 as cri;
        let Some(containerd) = self.containerd.as_ref() else {
            return Vec::new();
        };
        let mut runtime = containerd.cri().runtime_service();
        containerd.block_on(async move {
            let timeout = Duration::from_secs(20);
            let mut failures = Vec::new();
            let list = tokio::time::timeout(timeout, runtime.list_pod_sandbox(cri::ListPodSandboxRequest::default()));
            let sandboxes = match list.await {
                Ok(Ok(answer)) => answer.into_inner().items,
                Ok(Err(status)) => return vec![format!("ListPodSandbox: {status}")],
                Err(_) => return vec!["ListPodSandbox: timed out".to_owned()],
            };
            for sandbox in sandboxes {
                let id = sandbox.id;
                let stop = cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() };
                match tokio::time::timeout(timeout, runtime.stop_pod_sandbox(stop)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(status)) => failures.push(format!("StopPodSandbox {id}: {status}")),
                    Err(_) => failures.push(format!("StopPodSandbox {id}: timed out")),
                }
                let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: id.clone() };
                match tokio::time::timeout(timeout, runtime.remove_pod_sandbox(remove)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(status)) => failures.push(format!("RemovePodSandbox {id}: {status}")),
                    Err(_) => failures.push(format!("RemovePodSandbox {id}: timed out")),
                }
            }
            failures
        })
    }

    /// Copies the daemons' logs to `$LIFECYCLE_KUBE_LOGS/<run>/` when that is set.
    fn keep_logs(&self) {
        let Some(dir) = std::env::var_os(LOG_ENV) else {
            return;
        };
        let name = self.run.path.file_name().unwrap_or_default();
        let target = Path::new(&dir).join(name);
        if std::fs::create_dir_all(&target).is_err() {
            return;
        }
        for daemon in DAEMONS {
            let _ = std::fs::copy(self.run.path.join(format!("{daemon}.log")), target.join(format!("{daemon}.log")));
        }
        if let Some(containerd) = &self.containerd {
            let _ = std::fs::copy(containerd.run_dir().join("containerd.log"), target.join("containerd.log"));
        }
    }
}

impl Kube {
    /// Stops the kubelet, removes every sandbox through the CRI, stops the API server and etcd,
    /// drops the containerd harness, then undoes what the run recorded.
    fn teardown(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let began = Instant::now();
        // The kubelet first: it would recreate what is being removed.
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop(STOP_GRACE);
        }
        let failures = self.remove_sandboxes();
        if !failures.is_empty() {
            eprintln!("kube: CRI cleanup left work for the sweep: {failures:?}");
        }
        for daemon in [self.apiserver.take(), self.etcd.take()].into_iter().flatten() {
            daemon.stop(STOP_GRACE);
        }
        self.keep_logs();
        // The cgroup root before the harness goes: its last user unmounts the hugetlb hierarchy
        // it mounted only when no cgroup is left in it.
        for problem in machine::remove_cgroup_root(&self.run.path) {
            eprintln!("kube cleanup: {problem}");
        }
        // The containerd harness stops containerd and sweeps its own run directory.
        drop(self.containerd.take());
        for problem in self.run.sweep() {
            eprintln!("kube cleanup: {problem}");
        }
        eprintln!("kube: node torn down in {:.1?}", began.elapsed());
    }
}

impl Drop for Kube {
    fn drop(&mut self) {
        self.teardown();
        LIVE.store(false, Ordering::SeqCst);
    }
}

/// What [`Kube::abandon_as_if_crashed`] left: the machine lock, until the sweep.
pub struct Abandoned {
    lock: Option<MachineLock>,
}

impl Abandoned {
    /// Sweeps the abandoned run as the next start would (and any other dead run), then returns
    /// the machine's state, still holding the machine lock.
    pub fn sweep(self) -> MachineState {
        sweep_stale();
        let state = MachineState::capture();
        drop(self.lock);
        state
    }
}
