//! The agent's log: env_logger's filter (`RUST_LOG`, `info` by default) and format (text, or one
//! JSON object per line), with other crates' lines rate-limited.
//!
//! The agent logs what changed, once (the API went away, came back); the crates under it log
//! every attempt. With the API server unreachable, kube-client's request layer wrote about three
//! ERROR lines a second (55 in 20 s), one per retry of each watch, for as long as the outage
//! lasted. Lines from other crates are therefore let through once per target and level per
//! [`WINDOW`]; the next one let through says how many were held back, and
//! `lifecycle_log_lines_suppressed_total` counts them. The agent's own lines are never held back.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

/// How often one target of another crate may write a line at one level.
pub const WINDOW: Duration = Duration::from_secs(30);
/// Most targets remembered; past it, the rest share one window (targets are module paths of the
/// crates linked in: a fixed set, but the bound does not rely on that).
const MAX_TARGETS: usize = 128;
/// The shared key for targets past [`MAX_TARGETS`].
const OTHER_TARGETS: &str = "(other targets)";

/// Lines held back since start, for the metrics.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Lines held back since the agent started.
pub fn suppressed_lines() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// Whether a line goes out, and with how many held back before it.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Write it; `held_back` lines of its target and level were not written since the last.
    Write { held_back: u64 },
    /// Hold it back.
    HoldBack,
}

/// One window per target and level.
#[derive(Debug, Default)]
pub struct Limiter {
    windows: HashMap<(String, log::Level), Window>,
}

#[derive(Debug)]
struct Window {
    opened: Instant,
    held_back: u64,
}

impl Limiter {
    /// Whether a line of `target` at `level` goes out at `now`.
    pub fn admit(&mut self, target: &str, level: log::Level, now: Instant) -> Admit {
        if is_own(target) {
            return Admit::Write { held_back: 0 };
        }
        let mut key = (target.to_owned(), level);
        if !self.windows.contains_key(&key) && self.windows.len() >= MAX_TARGETS {
            key.0 = OTHER_TARGETS.to_owned();
        }
        match self.windows.get_mut(&key) {
            Some(window) if now.duration_since(window.opened) < WINDOW => {
                window.held_back += 1;
                Admit::HoldBack
            }
            Some(window) => {
                let held_back = std::mem::take(&mut window.held_back);
                window.opened = now;
                Admit::Write { held_back }
            }
            None => {
                self.windows.insert(key, Window { opened: now, held_back: 0 });
                Admit::Write { held_back: 0 }
            }
        }
    }
}

/// The agent's own targets (`lifecycle_agent::...`, `lifecycle_model::...`).
fn is_own(target: &str) -> bool {
    target.starts_with("lifecycle")
}

/// env_logger behind the limiter.
struct AgentLog {
    inner: env_logger::Logger,
    limiter: Mutex<Limiter>,
}

impl log::Log for AgentLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.inner.matches(record) {
            return;
        }
        let admit = match self.limiter.lock() {
            Ok(mut limiter) => limiter.admit(record.target(), record.level(), Instant::now()),
            // A thread panicked while logging: write everything rather than nothing.
            Err(_) => Admit::Write { held_back: 0 },
        };
        match admit {
            Admit::HoldBack => {
                SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            }
            Admit::Write { held_back: 0 } => self.inner.log(record),
            Admit::Write { held_back } => self.inner.log(
                &log::Record::builder()
                    .args(format_args!(
                        "{} ({held_back} more like this from {} held back in the last {}s)",
                        record.args(),
                        record.target(),
                        WINDOW.as_secs()
                    ))
                    .level(record.level())
                    .target(record.target())
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            ),
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the agent's logger: text, or JSON lines when `json`.
pub fn install(json: bool) {
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if json {
        // One JSON object per line, for log pipelines; the verdict lines on stdout are JSON
        // whatever the format.
        builder.format(|out, record| {
            use std::io::Write as _;
            let line = serde_json::json!({
                "time": jiff::Timestamp::now().to_string(),
                "level": record.level().as_str(),
                "target": record.target(),
                "msg": record.args().to_string(),
            });
            writeln!(out, "{line}")
        });
    }
    let inner = builder.build();
    let max_level = inner.filter();
    if log::set_boxed_logger(Box::new(AgentLog { inner, limiter: Mutex::new(Limiter::default()) })).is_ok() {
        log::set_max_level(max_level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_crates_retries_are_one_line_per_window_and_say_how_many_were_held_back() {
        let mut limiter = Limiter::default();
        let start = Instant::now();
        let target = "kube_client::client::builder";
        assert_eq!(limiter.admit(target, log::Level::Error, start), Admit::Write { held_back: 0 });
        // Three a second for the rest of the window: all held back.
        for tenth in 1..90 {
            let now = start + Duration::from_millis(tenth * 333);
            assert_eq!(limiter.admit(target, log::Level::Error, now), Admit::HoldBack, "at {tenth}");
        }
        // Another level and another target have windows of their own.
        assert_eq!(limiter.admit(target, log::Level::Warn, start), Admit::Write { held_back: 0 });
        assert_eq!(limiter.admit("hyper_util::client", log::Level::Error, start), Admit::Write { held_back: 0 });
        assert_eq!(limiter.admit(target, log::Level::Error, start + WINDOW), Admit::Write { held_back: 89 });
        assert_eq!(limiter.admit(target, log::Level::Error, start + WINDOW * 3), Admit::Write { held_back: 0 });
    }

    #[test]
    fn the_agents_own_lines_are_never_held_back() {
        let mut limiter = Limiter::default();
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(
                limiter.admit("lifecycle_agent::agent::kube", log::Level::Warn, now),
                Admit::Write { held_back: 0 }
            );
        }
        assert!(limiter.windows.is_empty());
    }

    #[test]
    fn targets_past_the_bound_share_one_window() {
        let mut limiter = Limiter::default();
        let now = Instant::now();
        for index in 0..MAX_TARGETS {
            limiter.admit(&format!("crate_{index}"), log::Level::Info, now);
        }
        assert_eq!(limiter.admit("one_more", log::Level::Info, now), Admit::Write { held_back: 0 });
        assert_eq!(limiter.admit("and_another", log::Level::Info, now), Admit::HoldBack);
        assert_eq!(limiter.windows.len(), MAX_TARGETS + 1);
    }
}
