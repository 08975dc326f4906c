//! A container's memory pressure as evidence: the kernel's `memory.events` counts (how often
//! the cgroup went over `memory.high`, hit `memory.max`, ran out of memory, had a process
//! OOM-killed) and its pressure stall information (`memory.pressure`: how long its tasks
//! stalled on memory), sampled while it runs, and what they say about the last minute before a
//! stop.
//!
//! Why PSI and not `memory.events high` for time: `high` counts the times the cgroup was over
//! `memory.high` when it charged memory (each one reclaims, and past the boundary the kernel
//! also sleeps the task: `mem_cgroup_handle_over_high`), a count, not a duration. The kernel
//! accounts both the reclaim and that sleep as a memory stall (`psi_memstall_enter`), so the
//! PSI total's growth is the time the container's tasks waited on memory. It is an upper bound
//! of the throttling at `memory.high`: reclaim at `memory.max`, refaults and swap-ins stall too.
//! The explanation says "stalled on memory" with the `high` count beside it, never more.
//!
//! Layouts: with cgroup v2's memory controller every count is there. On a hybrid host (v1
//! controllers, v2 beside them) the memory controller is v1's: no `memory.events`, no
//! `memory.high`; v1's `memory.oom_control` still has `oom_kill` (the same kernel counter), and
//! PSI is accounted on the v2 hierarchy whatever the controllers, so stalls are still measured.
//! What a layout lacks is absent (`None`), never zero.
//!
//! Pure: file contents in, counts out; the samples' times come from the caller.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::time::{BootTime, MICROSECOND, SECOND};

/// The counts of `memory.events` (v2), or what v1 has of them. None: this layout lacks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEvents {
    /// Times the cgroup was over `memory.high` and was throttled (reclaim, then a sleep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<u64>,
    /// Times its usage was about to go over `memory.max` (reclaim, then the OOM killer if that
    /// failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// Times it reached the OOM state (`memory.max` could not be kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<u64>,
    /// Its processes the OOM killer killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
}

impl MemoryEvents {
    /// Each count as its `memory.events` key, for metric labels; only the counts present.
    pub fn present(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [("high", self.high), ("max", self.max), ("oom", self.oom), ("oom_kill", self.oom_kill)]
            .into_iter()
            .filter_map(|(key, n)| Some((key, n?)))
    }

    /// What each count grew by from `earlier` (a count reset by a new cgroup is its value).
    fn since(&self, earlier: &MemoryEvents) -> MemoryEvents {
        let grew = |now: Option<u64>, then: Option<u64>| {
            now.map(|n| match then {
                Some(t) if t <= n => n - t,
                _ => n,
            })
        };
        MemoryEvents {
            high: grew(self.high, earlier.high),
            max: grew(self.max, earlier.max),
            oom: grew(self.oom, earlier.oom),
            oom_kill: grew(self.oom_kill, earlier.oom_kill),
        }
    }
}

/// The cumulative stall times of `memory.pressure`, nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallTotals {
    /// `some`: at least one task stalled on memory.
    pub some_ns: u64,
    /// `full`: every non-idle task stalled at once (the cgroup made no progress).
    pub full_ns: u64,
}

/// One reading of a container's memory files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySample {
    pub events: MemoryEvents,
    /// None where PSI is off (`psi=0`, a kernel without it) or the file is missing.
    pub stalls: Option<StallTotals>,
}

/// Reads `memory.events` (v2): `key value` lines; unknown keys (`low`, `oom_group_kill`, a
/// newer kernel's) are ignored, a line that does not parse is skipped.
pub fn parse_memory_events(text: &str) -> MemoryEvents {
    let mut events = MemoryEvents::default();
    for (key, value) in text.lines().filter_map(|line| line.split_once(' ')) {
        let Ok(value) = value.trim().parse::<u64>() else { continue };
        match key {
            "high" => events.high = Some(value),
            "max" => events.max = Some(value),
            "oom" => events.oom = Some(value),
            "oom_kill" => events.oom_kill = Some(value),
            _ => {}
        }
    }
    events
}

/// Reads v1's `memory.oom_control`: only its `oom_kill` count is one of `memory.events`' (the
/// kernel keeps one counter for both); `under_oom` is a state, not a count.
pub fn parse_oom_control(text: &str) -> MemoryEvents {
    let oom_kill = text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(key, _)| *key == "oom_kill")
        .and_then(|(_, value)| value.trim().parse().ok());
    MemoryEvents { oom_kill, ..MemoryEvents::default() }
}

/// Reads `memory.pressure`: `some avg10=.. avg60=.. avg300=.. total=<µs>` and the same for
/// `full`. None unless both totals are there.
pub fn parse_pressure(text: &str) -> Option<StallTotals> {
    let total = |kind: &str| -> Option<u64> {
        let line = text.lines().find(|line| line.split_whitespace().next() == Some(kind))?;
        let micros: u64 = line.split_whitespace().find_map(|field| field.strip_prefix("total="))?.parse().ok()?;
        Some(micros.saturating_mul(MICROSECOND))
    };
    Some(StallTotals { some_ns: total("some")?, full_ns: total("full")? })
}

/// How far back before a stop the evidence looks.
pub const WINDOW_NS: u64 = 60 * SECOND;
/// Readings kept per container: the sampler reads every second, and only a reading that
/// differs from the last is kept, so this covers at least the window of a container under
/// pressure the whole time (and much more of one that is not).
pub const MAX_READINGS: usize = 64;

/// A container's readings that differed from the one before, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryHistory {
    readings: VecDeque<(BootTime, MemorySample)>,
    /// When the cgroup read was made: every count was 0 then (a kill in a container's first
    /// second, before the first reading, still grew in the window).
    born: Option<BootTime>,
}

impl MemoryHistory {
    /// Keeps `sample` read at `at` if it differs from the last one; whether it did (a caller
    /// that publishes only changes skips the rest).
    pub fn record(&mut self, at: BootTime, sample: MemorySample) -> bool {
        if let Some((last_at, last)) = self.readings.back() {
            if *last == sample || at < *last_at {
                return false;
            }
        }
        if self.readings.len() >= MAX_READINGS {
            self.readings.pop_front();
        }
        self.readings.push_back((at, sample));
        true
    }

    /// The last reading.
    pub fn latest(&self) -> Option<&MemorySample> {
        self.readings.back().map(|(_, sample)| sample)
    }

    /// Forgets every reading: a new instance, whose cgroup was made at `born` and counts from
    /// zero.
    pub fn restart(&mut self, born: BootTime) {
        self.readings.clear();
        self.born = Some(born);
    }

    /// What the readings say about the [`WINDOW_NS`] before `end`: the growth from the value
    /// at the window's start (the last reading at or before it, else the first reading, which
    /// shortens the window to what was read) to the value at `end`. None without a reading at
    /// or before `end` and one before it.
    pub fn before(&self, end: BootTime) -> Option<MemoryAtStop> {
        let start = BootTime::from_ns(end.ns().saturating_sub(WINDOW_NS));
        let upto: Vec<&(BootTime, MemorySample)> = self.readings.iter().filter(|(at, _)| *at <= end).collect();
        let (_, last) = **upto.last()?;
        let (mut first_at, mut first) = **upto.iter().rev().find(|(at, _)| *at <= start).unwrap_or(upto.first()?);
        // The cgroup was made after the window began and before the first reading: it counted
        // from zero then (the counts this layout has, at 0).
        if let Some(born) = self.born.filter(|born| *born > start && *born <= first_at) {
            first = MemorySample {
                events: last.events.since(&last.events),
                stalls: last.stalls.map(|_| StallTotals::default()),
            };
            first_at = born;
        }
        let from = first_at.max(start);
        let stalls = last.stalls.zip(first.stalls).map(|(now, then)| StallTotals {
            some_ns: now.some_ns.saturating_sub(then.some_ns),
            full_ns: now.full_ns.saturating_sub(then.full_ns),
        });
        Some(MemoryAtStop { window_ns: end.since(from), stalls, events: last.events.since(&first.events) })
    }
}

/// A container's memory pressure in the window before its stop (the stop signal, else the
/// exit): what grew in it. Read every second, so its edges are a second wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAtStop {
    /// How long the readings cover, up to [`WINDOW_NS`].
    pub window_ns: u64,
    /// Time its tasks stalled on memory in the window (PSI), where PSI was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalls: Option<StallTotals>,
    /// What each `memory.events` count grew by in the window (the counts the layout has).
    pub events: MemoryEvents,
}

impl MemoryAtStop {
    /// Whether anything in it is pressure (a stall or a count that grew): only then is it worth
    /// a line in a story.
    pub fn under_pressure(&self) -> bool {
        self.stalls.is_some_and(|s| s.some_ns > 0) || self.events.present().any(|(_, n)| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> BootTime {
        BootTime::from_ns(seconds * SECOND)
    }

    fn sample(high: u64, some_s: u64) -> MemorySample {
        MemorySample {
            events: MemoryEvents { high: Some(high), max: Some(0), oom: Some(0), oom_kill: Some(0) },
            stalls: Some(StallTotals { some_ns: some_s * SECOND, full_ns: 0 }),
        }
    }

    #[test]
    fn the_kernels_files_are_read() {
        let v2 = "low 0\nhigh 340\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(
            parse_memory_events(v2),
            MemoryEvents { high: Some(340), max: Some(2), oom: Some(1), oom_kill: Some(1) }
        );
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_oom_control(v1), MemoryEvents { oom_kill: Some(3), ..MemoryEvents::default() });
        let psi = "some avg10=1.50 avg60=0.30 avg300=0.06 total=12400000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=3100\n";
        assert_eq!(parse_pressure(psi), Some(StallTotals { some_ns: 12_400_000_000, full_ns: 3_100_000 }));
        // A kernel before `full` for memory (never shipped) or a cut file is not half read.
        assert_eq!(parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"), None);
        assert_eq!(parse_memory_events("garbage\nhigh x\n"), MemoryEvents::default());
    }

    #[test]
    fn the_window_before_a_stop_is_the_growth_in_its_last_minute() {
        let mut history = MemoryHistory::default();
        assert!(history.record(at(10), sample(0, 0)));
        assert!(!history.record(at(11), sample(0, 0)), "an unchanged reading is not kept");
        assert!(history.record(at(50), sample(5, 1)));
        assert!(history.record(at(100), sample(340, 13)));
        assert!(history.record(at(130), sample(400, 20)), "after the stop: not counted");
        let window = history.before(at(110)).expect("present");
        // From the value at 50 (the last reading before 110 - 60) to the value at 100.
        assert_eq!(window.window_ns, WINDOW_NS);
        assert_eq!(window.stalls.expect("present").some_ns, 12 * SECOND);
        assert_eq!(window.events.high, Some(335));
        assert!(window.under_pressure());
        // A window that begins before the first reading is only as long as what was read.
        let short = history.before(at(55)).expect("present");
        assert_eq!(short.window_ns, 45 * SECOND);
        assert_eq!(short.events.high, Some(5));
        assert_eq!(history.before(at(5)), None, "nothing read before");
    }

    #[test]
    fn a_cgroup_made_in_the_window_counts_from_zero_at_its_birth() {
        // The OOM kill in the container's first second, before the first reading.
        let mut history = MemoryHistory::default();
        history.restart(at(100));
        history.record(at(101), sample(3, 2));
        let window = history.before(at(110)).expect("present");
        assert_eq!((window.window_ns, window.events.high), (10 * SECOND, Some(3)));
        assert_eq!(window.stalls.expect("present").some_ns, 2 * SECOND);
        // Born before the window: its counts at the window's start are the readings'.
        let mut old = MemoryHistory::default();
        old.restart(at(0));
        old.record(at(100), sample(3, 2));
        assert_eq!(old.before(at(110)).expect("present").events.high, Some(0));
    }

    #[test]
    fn what_a_layout_lacks_stays_absent_and_readings_are_bounded() {
        let mut history = MemoryHistory::default();
        let v1 = |kills: u64| MemorySample {
            events: MemoryEvents { oom_kill: Some(kills), ..MemoryEvents::default() },
            stalls: None,
        };
        for second in 0..(MAX_READINGS as u64 + 10) {
            history.record(at(second), v1(second));
        }
        assert_eq!(history.readings.len(), MAX_READINGS);
        let window = history.before(at(MAX_READINGS as u64 + 9)).expect("present");
        assert_eq!(window.events.high, None);
        assert_eq!(window.stalls, None);
        assert_eq!(window.events.oom_kill, Some(60));
        assert!(window.under_pressure());
        assert!(!MemoryAtStop { window_ns: 1, stalls: None, events: MemoryEvents::default() }.under_pressure());
    }
}
