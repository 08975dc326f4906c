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
    /// RFC 3339 with nanoseconds, as containerd 1.6 wrote it (containerd 2.x writes a
    /// `{"seconds":..,"nanos":..}` object, rendered here as `<seconds>.<nanos>`).
    pub exited_at: String,
    /// The exit time in ns since the epoch (either form), for ordering exits.
    pub exited_at_ns: Option<u128>,
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
        let mut child = Command::new(self.containerd().ctr())
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
        exited_at: match &event["exited_at"] {
            serde_json::Value::String(text) => text.clone(),
            object @ serde_json::Value::Object(_) => {
                format!("{}.{:09}", object["seconds"].as_u64().unwrap_or(0), object["nanos"].as_u64().unwrap_or(0))
            }
            _ => String::new(),
        },
        exited_at_ns: exit_time_ns(&event["exited_at"]),
        seen: Instant::now(),
    })
}

/// `exited_at` in ns since the epoch: containerd 1.6's RFC 3339 UTC text
/// (`2026-11-22T22:55:35.398877093Z`) or containerd 2.x's protobuf timestamp object.
fn exit_time_ns(value: &serde_json::Value) -> Option<u128> {
    if let Some(seconds) = value["seconds"].as_u64() {
        return Some(u128::from(seconds) * 1_000_000_000 + u128::from(value["nanos"].as_u64().unwrap_or(0)));
    }
    let text = value.as_str()?.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = u128::try_from(days * 86_400 + hour * 3_600 + minute * 60 + second).ok()?;
    let digits: String = fraction.chars().take(9).collect();
    let nanos = if digits.is_empty() { 0 } else { format!("{digits:0<9}").parse::<u128>().ok()? };
    Some(seconds * 1_000_000_000 + nanos)
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
        // `date -u -d 2026-11-22T22:55:35Z +%s` = 1795388135.
        assert_eq!(exit.exited_at_ns, Some(1_795_388_135_398_877_093));
        // containerd 2.x: a protobuf timestamp object.
        let modern = r#"x k8s.io /tasks/exit {"container_id":"abc","id":"abc","pid":9,"exit_status":143,"exited_at":{"seconds":1795388135,"nanos":398877093}}"#;
        let exit = parse_exit(modern).expect("an exit");
        assert_eq!((exit.exit_status, exit.exited_at_ns), (143, Some(1_795_388_135_398_877_093)));
        assert_eq!(exit.exited_at, "1795388135.398877093");
        // exit_status 0 is omitted from the JSON.
        let clean = r#"x k8s.io /tasks/exit {"container_id":"abc","id":"abc","pid":7,"exited_at":"t"}"#;
        assert_eq!(parse_exit(clean).expect("an exit").exit_status, 0);
        let exec = r#"x k8s.io /tasks/exit {"container_id":"abc","id":"exec-1","pid":8,"exit_status":1}"#;
        assert!(parse_exit(exec).is_none());
        assert!(parse_exit("x k8s.io /tasks/start {\"container_id\":\"abc\"}").is_none());
    }
}
