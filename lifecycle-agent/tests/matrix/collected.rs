//! What a guest brought back on its payload disk (`results/`, written by check.py or
//! check-arm64.sh), read with the API's own wire types.

use std::{fs, path::Path};

use lifecycle_agent::model::{node::ContainerView, wire::ContainersResponse};
use serde_json::Value;

/// Everything the guest collected; a file it did not write reads as empty or `None`.
pub struct Collected {
    /// facts.json (amd64), or facts.env turned into strings (arm64).
    pub facts: Value,
    pub doctor: Option<Value>,
    pub agent_log: String,
    pub metrics_start: String,
    pub metrics: String,
    pub containers: Option<ContainersResponse>,
    /// The answer while the container ran (amd64).
    pub containers_running: Option<ContainersResponse>,
    /// `lifecycle-agent status -o json`.
    pub status: String,
    pub dmesg: String,
}

impl Collected {
    pub fn read(dir: &Path) -> Self {
        let text = |name: &str| fs::read(dir.join(name)).map(|b| String::from_utf8_lossy(&b).into_owned());
        let text_or_empty = |name: &str| text(name).unwrap_or_default();
        let facts = match text("facts.json") {
            Ok(json) => serde_json::from_str(&json).unwrap_or(Value::Null),
            Err(_) => env_facts(&text_or_empty("facts.env")),
        };
        Self {
            facts,
            doctor: text("doctor.json").ok().and_then(|t| serde_json::from_str(&t).ok()),
            agent_log: text_or_empty("agent.log"),
            metrics_start: text_or_empty("metrics-start.txt"),
            metrics: text_or_empty("metrics.txt"),
            containers: text("containers.json").ok().and_then(|t| serde_json::from_str(&t).ok()),
            containers_running: text("containers-running.json").ok().and_then(|t| serde_json::from_str(&t).ok()),
            status: text_or_empty("status.json"),
            dmesg: text_or_empty("dmesg.txt"),
        }
    }

    pub fn fact(&self, name: &str) -> &Value {
        &self.facts[name]
    }

    /// A fact as text (`facts.env` holds only text).
    pub fn fact_text(&self, name: &str) -> String {
        match &self.facts[name] {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }

    /// The host unit at cgroup `path` in the final answer.
    pub fn host_unit(&self, path: &str) -> Option<&ContainerView> {
        self.containers.as_ref()?.containers.iter().find(|c| c.labels.namespace == "host" && c.labels.container == path)
    }

    /// The last `lines` lines of the agent's log.
    pub fn agent_log_tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.agent_log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// `key=value` lines as a JSON object of strings.
fn env_facts(text: &str) -> Value {
    Value::Object(
        text.lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), Value::String(value.to_owned())))
            .collect(),
    )
}

/// The value of the sample of `family` whose labels include every `(name, value)` of `labels`,
/// summed over the samples that match (None when none does).
pub fn sample(metrics: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(family) else { continue };
        let (label_text, value) = match rest.strip_prefix('{') {
            Some(inner) => match inner.rsplit_once('}') {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let wanted = labels.iter().all(|(name, value)| label_text.contains(&format!("{name}=\"{value}\"")));
        if let (true, Ok(value)) = (wanted, value.trim().parse::<f64>()) {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn samples_are_matched_by_family_and_labels() {
        let text = "# HELP x y\nlifecycle_tcp_accepts_total{namespace=\"host\",container=\"/a\",port=\"80\"} 2\n\
                    lifecycle_tcp_accepts_total_other 9\nlifecycle_tcp_accepts_total{container=\"/b\",port=\"80\"} 1\n";
        assert_eq!(sample(text, "lifecycle_tcp_accepts_total", &[("container", "/a")]), Some(2.0));
        assert_eq!(sample(text, "lifecycle_tcp_accepts_total", &[("port", "80")]), Some(3.0));
        assert_eq!(sample(text, "lifecycle_tcp_accepts_total", &[("port", "0")]), None);
    }
}
