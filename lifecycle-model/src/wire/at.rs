//! Points in time on the wire: each [`BootTime`] field of a view is written as two fields, the
//! time in RFC 3339 (UTC, nanoseconds, as the Kubernetes API writes times) under its own name,
//! and the exact boot-clock value as `<field>_boot_ns` (for differences with the kernel's other
//! times). A field opts in by its type and one attribute,
//! `#[serde(flatten, with = "crate::wire::at::started_at")]`: nothing walks the output afterwards.
//!
//! The wall clock is the writer's to give, at the call that writes
//! ([`super::with_clock::WithClock`]): the model has no clock. Written without one, the RFC 3339
//! field is `null` and the boot-clock value stays. Reading takes `<field>_boot_ns` (the text is
//! derived from it).

use std::fmt;

use serde::{
    de::{self, IgnoredAny, MapAccess, Visitor},
    ser::SerializeMap as _,
    Deserializer, Serializer,
};

use super::with_clock::Text;
use crate::time::{BootTime, SECOND};

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
            // The text in the writer's clock (`WithClock`); null from a writer without one.
            map.serialize_entry(fields[0], &Text(time))?;
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
    use crate::{
        container_state::{ContainerState, TerminatedReason},
        wire::with_clock::WithClock,
    };

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
        let json =
            serde_json::to_value(WithClock::new(&state, WallClock::from_offset_seconds(CLOCK))).expect("serializes");
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
        let json =
            serde_json::to_value(WithClock::new(&state, WallClock::from_offset_seconds(CLOCK))).expect("serializes");
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
    fn each_writer_has_its_own_clock_at_every_depth() {
        // Two clocks a second apart, written into one document: each value's times are in the
        // clock it was given, a list's elements, an Option's content and a map's values too.
        let states = vec![terminated(Some(SECOND)), terminated(None)];
        let nested = json!({
            "early": serde_json::to_value(WithClock::new(&states, WallClock::from_offset_seconds(CLOCK))).expect("early"),
            "late": serde_json::to_value(WithClock::new(&Some(&states[0]), WallClock::from_offset_seconds(CLOCK + 1.0)))
                .expect("late"),
        });
        assert_eq!(nested["early"][0]["started_at"], "2023-11-14T22:13:21Z");
        assert_eq!(nested["early"][1]["finished_at"], "2023-11-14T22:13:22.000000001Z");
        assert_eq!(nested["late"]["started_at"], "2023-11-14T22:13:22Z");
        let by_name = std::collections::BTreeMap::from([("web", &states[0])]);
        let text =
            serde_json::to_string(&WithClock::new(&by_name, WallClock::from_offset_seconds(CLOCK))).expect("map");
        assert!(text.contains(r#""started_at":"2023-11-14T22:13:21Z""#), "{text}");
    }

    #[test]
    fn a_clock_changes_only_the_time_fields_text() {
        // Everything else is written as a writer without a clock writes it.
        let state = terminated(Some(SECOND));
        let mut with =
            serde_json::to_value(WithClock::new(&state, WallClock::from_offset_seconds(CLOCK))).expect("with");
        let without = serde_json::to_value(&state).expect("without");
        for field in ["started_at", "finished_at"] {
            assert!(with[field].is_string(), "{with}");
            with[field] = serde_json::Value::Null;
        }
        assert_eq!(with, without);
    }
}
