//! The runtime's own record of every process exit: containerd's `/tasks/exit` events, streamed by
//! `ctr events` from the node's containerd. Ground truth that does not depend on the kubelet's
//! status reports (1 s resolution, and lost when the kubelet removes a container before
//! reporting it), with the exit time in nanoseconds.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::Kube;

/// One `/tasks/exit` event.
#[derive(Clone, Debug)]
pub struct TaskExit {
    /// The container (the pod sandbox's or an app container's id, without `containerd://`).
    pub container_id: String,
    /// The exited process (the container's init for its own task; an exec's otherwise).
    pub pid: u32,
    pub exit_status: u32,
    /// RFC 3339 with nanoseconds, as containerd wrote it.
    pub exited_at: String,
    /// When this process read the event.
    pub seen: Instant,
}

/// A running `ctr events` collecting task exits; stopped (by pid) on drop.
pub struct TaskExits {
    child: Child,
    exits: Arc<(Mutex<Vec<TaskExit>>, Condvar)>,
}

impl Kube {
    /// Starts collecting containerd's task exits from now on.
    pub fn watch_task_exits(&self) -> Result<TaskExits> {
        let mut child = Command::new("ctr")
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io", "events"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn ctr events")?;
        let stdout = child.stdout.take().context("ctr events stdout")?;
        let exits: Arc<(Mutex<Vec<TaskExit>>, Condvar)> = Arc::default();
        let sink = Arc::clone(&exits);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(exit) = parse_exit(&line) {
                    let (list, arrived) = &*sink;
                    list.lock().unwrap_or_else(|p| p.into_inner()).push(exit);
                    arrived.notify_all();
                }
            }
        });
        // The subscription is made asynchronously after the spawn; nothing tells when it is in
        // place. Events of the next 300 ms could be missed: callers act after this returns.
        std::thread::sleep(Duration::from_millis(300));
        Ok(TaskExits { child, exits })
    }
}

impl TaskExits {
    /// Every exit seen so far.
    pub fn all(&self) -> Vec<TaskExit> {
        self.exits.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for the exit of `container_id`'s task (its init process).
    pub fn wait_for(&self, container_id: &str, within: Duration) -> Result<TaskExit> {
        let id = container_id.trim_start_matches("containerd://");
        let (list, arrived) = &*self.exits;
        let deadline = Instant::now() + within;
        let mut exits = list.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // A container's own task has the container's id as its id (execs have others).
            if let Some(exit) = exits.iter().find(|e| e.container_id == id) {
                return Ok(exit.clone());
            }
            let now = Instant::now();
            if now > deadline {
                bail!("no /tasks/exit for container {id} within {within:?}; seen: {:?}", *exits);
            }
            exits = arrived.wait_timeout(exits, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for TaskExits {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `<time> <namespace> /tasks/exit {"container_id":..,"id":..,"pid":..,"exit_status":..,"exited_at":..}`
/// for the container's own task (id == container_id); None for any other line.
fn parse_exit(line: &str) -> Option<TaskExit> {
    let (_, json) = line.split_once(" /tasks/exit ")?;
    let event: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
    let container_id = event["container_id"].as_str()?.to_owned();
    if event["id"].as_str().is_some_and(|id| id != container_id) {
        return None;
    }
    Some(TaskExit {
        container_id,
        pid: u32::try_from(event["pid"].as_u64()?).ok()?,
        exit_status: u32::try_from(event["exit_status"].as_u64().unwrap_or(0)).ok()?,
        exited_at: event["exited_at"].as_str().unwrap_or_default().to_owned(),
        seen: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_exit;

    #[test]
    fn exit_events_are_read_from_ctr_lines() {
        let line = r#"2026-11-22 22:55:35.401977 +0000 UTC k8s.io /tasks/exit {"container_id":"abc","id":"abc","pid":4242,"exit_status":143,"exited_at":"2026-11-22T22:55:35.398877093Z"}"#;
        let exit = parse_exit(line).expect("an exit");
        assert_eq!((exit.container_id.as_str(), exit.pid, exit.exit_status), ("abc", 4242, 143));
        assert_eq!(exit.exited_at, "2026-11-22T22:55:35.398877093Z");
        // exit_status 0 is omitted from the JSON.
        let clean = r#"x k8s.io /tasks/exit {"container_id":"abc","id":"abc","pid":7,"exited_at":"t"}"#;
        assert_eq!(parse_exit(clean).expect("an exit").exit_status, 0);
        let exec = r#"x k8s.io /tasks/exit {"container_id":"abc","id":"exec-1","pid":8,"exit_status":1}"#;
        assert!(parse_exit(exec).is_none());
        assert!(parse_exit("x k8s.io /tasks/start {\"container_id\":\"abc\"}").is_none());
    }
}
