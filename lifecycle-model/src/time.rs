//! Time as the model keeps it: points in time are [`BootTime`], nanoseconds of
//! `CLOCK_BOOTTIME` (the clock the kernel stamps events with); durations are nanoseconds in a
//! `u64` whose name ends in `_ns`, or a [`Duration`] where a kernel event or a command carries
//! one (serialized as its nanoseconds by [`duration_ns`]). The units are named here once, with the
//! one conversion to the seconds people and Prometheus read.
//!
//! A `BootTime` serializes as its nanoseconds. The API writes the views' points in time as RFC
//! 3339 with the exact boot-clock value beside: see [`crate::wire::at`].

use std::time::Duration;

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

/// A [`Duration`] on the wire as integer nanoseconds, the unit of the kernel's records and of
/// every `_ns` field (`#[serde(with = "crate::time::duration_ns")]`): recorded commands keep
/// the numbers they had when the field was a `u64`.
pub mod duration_ns {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `duration` as its nanoseconds, saturating at `u64::MAX` (584 years, forever to
    /// the model), as the `u64` fields did: a configured retention of "forever" must not make
    /// a recording fail.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        super::ns_of(*duration).serialize(serializer)
    }

    /// Reads nanoseconds as a [`Duration`].
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_nanos)
    }
}

/// `duration` in nanoseconds, saturating at `u64::MAX` (584 years): for arithmetic with the
/// `_ns` durations and raw kernel values.
pub fn ns_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
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

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Spent {
        #[serde(with = "duration_ns")]
        cpu: Duration,
    }

    #[test]
    fn durations_travel_as_their_nanoseconds() {
        let spent = Spent { cpu: Duration::new(2, 345) };
        let text = serde_json::to_string(&spent).expect("serializes");
        assert_eq!(text, r#"{"cpu":2000000345}"#, "the number is nanoseconds");
        assert_eq!(serde_json::from_str::<Spent>(&text).expect("deserializes"), spent, "round trip");
        let longest = Spent { cpu: Duration::from_nanos(u64::MAX) };
        let text = serde_json::to_string(&longest).expect("u64::MAX ns serializes");
        assert_eq!(serde_json::from_str::<Spent>(&text).expect("deserializes"), longest);
        let forever = serde_json::to_string(&Spent { cpu: Duration::MAX }).expect("saturates");
        assert_eq!(forever, format!(r#"{{"cpu":{}}}"#, u64::MAX), "too long for a u64 is its longest");
        assert!(serde_json::from_str::<Spent>(r#"{"cpu":-1}"#).is_err(), "no negative durations");
    }

    #[test]
    fn ns_of_saturates() {
        assert_eq!(ns_of(Duration::from_millis(3)), 3 * MILLISECOND);
        assert_eq!(ns_of(Duration::MAX), u64::MAX);
    }
}
