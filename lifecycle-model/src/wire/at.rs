//! Points in time on the wire: each [`BootTime`] field of a view is written as two fields, the
//! time in RFC 3339 (UTC, nanoseconds, as the Kubernetes API writes times) under its own name,
//! and the exact boot-clock value as `<field>_boot_ns` (for differences with the kernel's other
//! times). A field opts in by its type and one attribute,
//! `#[serde(flatten, with = "crate::wire::at::started_at")]`: nothing walks the output afterwards.
//!
//! The wall clock's offset is the writer's to give ([`WallClock::writing`]): the model has no
//! clock. Written without one, the RFC 3339 field is `null` and the boot-clock value stays.
//! Reading takes `<field>_boot_ns` (the text is derived from it).

use std::{cell::Cell, fmt};

use serde::{
    de::{self, IgnoredAny, MapAccess, Visitor},
    ser::SerializeMap as _,
    Deserializer, Serializer,
};

use crate::time::{BootTime, SECOND};

thread_local! {
    /// The clock of the serialization running on this thread, if its writer gave one.
    static WRITING_WITH: Cell<Option<WallClock>> = const { Cell::new(None) };
}

/// How the wall clock relates to the boot clock: Unix time minus boot time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WallClock {
    boot_to_unix_seconds: f64,
}

impl WallClock {
    /// From the offset in seconds (`boot_to_unix_seconds`, as the API writes it beside times).
    pub fn from_offset_seconds(boot_to_unix_seconds: f64) -> Self {
        WallClock { boot_to_unix_seconds }
    }

    /// Unix time minus boot time, in seconds.
    pub fn offset_seconds(self) -> f64 {
        self.boot_to_unix_seconds
    }

    /// The time in RFC 3339, UTC (None past what a timestamp can hold).
    pub fn rfc3339(self, time: BootTime) -> Option<String> {
        // The offset is whole nanoseconds of wall clock at boot; the time itself is added in
        // integers, which keeps its nanoseconds.
        let offset_ns = (self.boot_to_unix_seconds * SECOND as f64) as i128;
        let unix_ns = i128::from(time.ns()) + offset_ns;
        jiff::Timestamp::from_nanosecond(unix_ns).ok().map(|t| t.to_string())
    }

    /// Runs `write` (a serialization) with this clock: the time fields it writes on this thread
    /// get their RFC 3339 text from it. The clock before is back afterwards, a panic included.
    pub fn writing<R>(self, write: impl FnOnce() -> R) -> R {
        struct Restore(Option<WallClock>);
        impl Drop for Restore {
            fn drop(&mut self) {
                WRITING_WITH.with(|clock| clock.set(self.0));
            }
        }
        let _restore = Restore(WRITING_WITH.with(|clock| clock.replace(Some(self))));
        write()
    }
}

/// A point in time a view's field may hold: one, or perhaps one.
pub trait AsBootTime {
    fn boot_time(&self) -> Option<BootTime>;
}

impl AsBootTime for BootTime {
    fn boot_time(&self) -> Option<BootTime> {
        Some(*self)
    }
}

impl AsBootTime for Option<BootTime> {
    fn boot_time(&self) -> Option<BootTime> {
        *self
    }
}

/// The field's value from what was read: a `BootTime` needs one, an `Option` takes none too.
pub trait FromBootTime: Sized {
    fn from_boot_time<E: de::Error>(read: Option<BootTime>, boot_field: &'static str) -> Result<Self, E>;
}

impl FromBootTime for BootTime {
    fn from_boot_time<E: de::Error>(read: Option<BootTime>, boot_field: &'static str) -> Result<Self, E> {
        read.ok_or_else(|| E::missing_field(boot_field))
    }
}

impl FromBootTime for Option<BootTime> {
    fn from_boot_time<E: de::Error>(read: Option<BootTime>, _: &'static str) -> Result<Self, E> {
        Ok(read)
    }
}

/// Writes `[name, name_boot_ns]` into the struct the field is flattened into.
fn write<S: Serializer>(
    fields: &'static [&'static str],
    time: Option<BootTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(None)?;
    match time {
        None => map.serialize_entry(fields[0], &None::<String>)?,
        Some(time) => {
            let text = WRITING_WITH.with(Cell::get).and_then(|clock| clock.rfc3339(time));
            map.serialize_entry(fields[0], &text)?;
            map.serialize_entry(fields[1], &time.ns())?;
        }
    }
    map.end()
}

/// Reads `name_boot_ns` from the struct the field is flattened into (None when absent or null).
fn read<'de, D: Deserializer<'de>>(
    fields: &'static [&'static str],
    deserializer: D,
) -> Result<Option<BootTime>, D::Error> {
    struct BootNs(&'static str);
    impl<'de> Visitor<'de> for BootNs {
        type Value = Option<BootTime>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a time with {}", self.0)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut read = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == self.0 {
                    read = map.next_value::<Option<u64>>()?.map(BootTime::from_ns);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(read)
        }
    }
    deserializer.deserialize_struct("BootTime", fields, BootNs(fields[1]))
}

/// One module per time field's name, for `#[serde(flatten, with = "...")]`.
macro_rules! time_fields {
    ($($field:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($field), "` and `", stringify!($field), "_boot_ns`.")]
        pub mod $field {
            use super::{AsBootTime, FromBootTime};

            const FIELDS: &[&str] = &[stringify!($field), concat!(stringify!($field), "_boot_ns")];

            pub fn serialize<T: AsBootTime, S: serde::Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
                super::write(FIELDS, value.boot_time(), serializer)
            }

            pub fn deserialize<'de, T: FromBootTime, D: serde::Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
                T::from_boot_time(super::read(FIELDS, deserializer)?, FIELDS[1])
            }
        }
    )*};
}

time_fields!(
    started_at,
    finished_at,
    ended_at,
    exit_time,
    time,
    instance_created_at,
    watched_since,
    stop_signal_at,
    last_main_exit,
);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::container_state::{ContainerState, TerminatedReason};

    const CLOCK: f64 = 1_700_000_000.0;

    fn terminated(started_at: Option<u64>) -> ContainerState {
        ContainerState::Terminated {
            reason: TerminatedReason::Error,
            exit_code: 137,
            signal: Some(9),
            started_at: started_at.map(BootTime::from_ns),
            finished_at: BootTime::from_ns(2_000_000_001),
        }
    }

    #[test]
    fn a_time_is_written_in_rfc3339_with_its_boot_ns_beside_and_read_back_exactly() {
        let state = terminated(Some(SECOND));
        let json = WallClock::from_offset_seconds(CLOCK).writing(|| serde_json::to_value(&state)).expect("serializes");
        assert_eq!(
            json,
            json!({
                "state": "terminated", "reason": "Error", "exit_code": 137, "signal": 9,
                "started_at": "2023-11-14T22:13:21Z", "started_at_boot_ns": SECOND,
                "finished_at": "2023-11-14T22:13:22.000000001Z", "finished_at_boot_ns": 2_000_000_001u64,
            })
        );
        assert_eq!(serde_json::from_value::<ContainerState>(json).expect("reads back"), state);
    }

    #[test]
    fn a_time_not_known_is_null_without_boot_ns_and_reads_back_as_none() {
        let state = terminated(None);
        let json = WallClock::from_offset_seconds(CLOCK).writing(|| serde_json::to_value(&state)).expect("serializes");
        assert_eq!(json["started_at"], serde_json::Value::Null);
        assert!(json.get("started_at_boot_ns").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<ContainerState>(json).expect("reads back"), state);
    }

    #[test]
    fn written_without_a_clock_the_text_is_null_and_the_boot_clock_value_stays() {
        let json = serde_json::to_value(terminated(Some(SECOND))).expect("serializes");
        assert_eq!(json["finished_at"], serde_json::Value::Null);
        assert_eq!(json["finished_at_boot_ns"], 2_000_000_001u64);
    }

    #[test]
    fn a_required_time_without_its_boot_ns_is_refused() {
        let json = json!({"state": "running", "started_at": "2023-11-14T22:13:21Z"});
        let err = serde_json::from_value::<ContainerState>(json).expect_err("refused");
        assert!(err.to_string().contains("started_at_boot_ns"), "{err}");
    }

    #[test]
    fn the_clock_before_is_back_after_a_writer_panics() {
        let outer = WallClock::from_offset_seconds(CLOCK);
        outer.writing(|| {
            let inner = WallClock::from_offset_seconds(0.0);
            let panicked = std::panic::catch_unwind(|| inner.writing(|| panic!("a writer's bug")));
            assert!(panicked.is_err());
            assert_eq!(WRITING_WITH.with(Cell::get), Some(outer));
        });
        assert_eq!(WRITING_WITH.with(Cell::get), None);
    }
}
