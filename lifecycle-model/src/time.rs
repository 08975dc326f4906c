//! Time as the model keeps it: nanoseconds of `CLOCK_BOOTTIME` (the clock the kernel stamps
//! events with) in a `u64`. Its units are named here once, with the one conversion to the
//! seconds people and Prometheus read.

/// One second, in nanoseconds.
pub const SECOND: u64 = 1_000_000_000;
/// One millisecond, in nanoseconds.
pub const MILLISECOND: u64 = 1_000_000;

/// `ns` nanoseconds in seconds.
pub fn seconds(ns: u64) -> f64 {
    ns as f64 / SECOND as f64
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
}
