//! Time as the model keeps it: points in time are [`BootTime`], nanoseconds of
//! `CLOCK_BOOTTIME` (the clock the kernel stamps events with); durations are nanoseconds in a
//! `u64` whose name ends in `_ns`. The units are named here once, with the one conversion to the
//! seconds people and Prometheus read.
//!
//! A `BootTime` serializes as its nanoseconds. The API writes the views' points in time as RFC
//! 3339 with the exact boot-clock value beside: see [`crate::wire::at`].

use serde::{Deserialize, Serialize};

/// One second, in nanoseconds.
pub const SECOND: u64 = 1_000_000_000;
/// One millisecond, in nanoseconds.
pub const MILLISECOND: u64 = 1_000_000;
/// Nanoseconds in a microsecond (systemd's unit of time).
pub const MICROSECOND: u64 = 1_000;

/// `ns` nanoseconds in seconds.
pub fn seconds(ns: u64) -> f64 {
    ns as f64 / SECOND as f64
}

/// A point in time: nanoseconds of `CLOCK_BOOTTIME` since boot. Kept apart from durations by
/// its type: two points give a duration ([`BootTime::since`]), a point and a duration give a
/// point ([`BootTime::after`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BootTime(u64);

impl BootTime {
    /// The point `ns` nanoseconds after boot (a kernel timestamp).
    pub const fn from_ns(ns: u64) -> Self {
        BootTime(ns)
    }

    /// Nanoseconds since boot.
    pub const fn ns(self) -> u64 {
        self.0
    }

    /// Nanoseconds from `earlier` to this point; 0 when `earlier` is later.
    pub const fn since(self, earlier: BootTime) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The point `ns` nanoseconds later (saturating).
    pub const fn after(self, ns: u64) -> BootTime {
        BootTime(self.0.saturating_add(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact_for_whole_and_half_seconds() {
        assert_eq!(seconds(3 * SECOND), 3.0);
        assert_eq!(seconds(SECOND / 2), 0.5);
        assert_eq!(seconds(250 * MILLISECOND), 0.25);
    }

    #[test]
    fn points_give_durations_and_durations_move_points() {
        let start = BootTime::from_ns(5 * SECOND);
        let end = start.after(2 * SECOND);
        assert_eq!(end.since(start), 2 * SECOND);
        assert_eq!(start.since(end), 0, "a later start gives no negative duration");
        assert_eq!(BootTime::from_ns(u64::MAX).after(1).ns(), u64::MAX);
        assert_eq!(serde_json::to_string(&end).expect("serializes"), "7000000000", "alone, a point is its nanoseconds");
    }
}
