//! The node's clocks. The kernel stamps events with `CLOCK_BOOTTIME`, so the whole agent keeps
//! time in boot nanoseconds; the API converts to wall-clock time with the offset below.

use std::time::SystemTime;

use rustix::time::ClockId;

use crate::model::{
    time::{BootTime, SECOND},
    wire::at::WallClock,
};

/// `CLOCK_BOOTTIME` now, in ns: the clock the kernel stamps events with.
pub fn boottime_ns() -> u64 {
    let ts = rustix::time::clock_gettime(ClockId::Boottime);
    (ts.tv_sec as u64).saturating_mul(SECOND).saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_BOOTTIME` now, as the model's point in time.
pub(crate) fn boottime() -> BootTime {
    BootTime::from_ns(boottime_ns())
}

/// The wall clock as it relates to the boot clock now: what the API writes its times with.
pub(crate) fn wall_clock() -> WallClock {
    WallClock::from_offset_seconds(unix_minus_boot_seconds())
}

/// `CLOCK_REALTIME` now, in ns since the Unix epoch.
pub(crate) fn realtime_ns() -> u64 {
    let ts = rustix::time::clock_gettime(ClockId::Realtime);
    (ts.tv_sec as u64).saturating_mul(SECOND).saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_REALTIME - CLOCK_BOOTTIME`, in seconds: adds to a boot time to give a Unix time.
pub fn unix_minus_boot_seconds() -> f64 {
    let read = |clock| {
        let ts = rustix::time::clock_gettime(clock);
        ts.tv_sec as f64 + crate::model::time::seconds(ts.tv_nsec as u64)
    };
    read(ClockId::Realtime) - read(ClockId::Boottime)
}

/// Converts a wall-clock time to `CLOCK_BOOTTIME` ns, given both clocks read now.
/// Times before boot map to 0 (which reads as "very old").
pub(crate) fn wall_to_boottime(t: SystemTime, wall_now: SystemTime, boot_now: u64) -> u64 {
    match wall_now.duration_since(t) {
        Ok(age) => boot_now.saturating_sub(u64::try_from(age.as_nanos()).unwrap_or(u64::MAX)),
        Err(ahead) => boot_now.saturating_add(u64::try_from(ahead.duration().as_nanos()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_times_convert_to_boottime() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000);
        let earlier = now - std::time::Duration::from_secs(3);
        assert_eq!(wall_to_boottime(earlier, now, 10_000_000_000), 7_000_000_000);
        assert_eq!(wall_to_boottime(SystemTime::UNIX_EPOCH, now, 5), 0);
    }

    #[test]
    fn boot_time_advances_and_the_offset_is_positive() {
        let (a, b) = (boottime_ns(), boottime_ns());
        assert!(b >= a && a > 0);
        assert!(unix_minus_boot_seconds() > 1.0e9, "the Unix time of boot is after 2001");
    }
}
