//! Writing a view with a wall clock: [`WithClock`] serializes any value through a serializer
//! that carries the clock down to every time field it meets, so the writer names the clock at
//! the one call that writes (`serde_json::to_string(&WithClock::new(&body, clock))`) and nothing
//! is ambient.
//!
//! A time field ([`super::at`]) writes its RFC 3339 text as a newtype struct of a name only this
//! module knows (`TEXT`), as `serde_json::value::RawValue` does: the serializer here turns it
//! into the text for its clock; any other serializer writes what the newtype holds, `null` for a
//! human-readable format (the field's boot-clock value beside it is written either way). The
//! newtype's content gives the boot-clock value only to a serializer that is not human-readable,
//! as `Capture` is.
//!
//! Hand-written (a pass-through of serde's `Serializer` and its seven compound traits): serde
//! has no serialization state, and no crate of serde's ecosystem adapts a serializer.

use std::fmt;

use serde::{
    ser::{self, Impossible},
    Serialize, Serializer,
};

use super::at::WallClock;
use crate::time::BootTime;

/// The newtype name of a time field's text (not a Rust identifier: no type has it by accident).
pub(super) const TEXT: &str = "$lifecycle::wire::at::text";

/// A time field's text: the newtype [`TEXT`] around its boot-clock value.
pub(super) struct Text(pub BootTime);

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_newtype_struct(TEXT, &BootNsForAClock(self.0))
    }
}

/// The boot-clock value, for a serializer that has a clock ([`Capture`], not human-readable);
/// `null` for any other (JSON without a clock).
struct BootNsForAClock(BootTime);

impl Serialize for BootNsForAClock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_none()
        } else {
            serializer.serialize_u64(self.0.ns())
        }
    }
}

/// `value`, written with `clock`: its time fields' RFC 3339 text is in that clock.
pub struct WithClock<'a, T: ?Sized> {
    value: &'a T,
    clock: WallClock,
}

impl<'a, T: ?Sized + Serialize> WithClock<'a, T> {
    pub fn new(value: &'a T, clock: WallClock) -> Self {
        WithClock { value, clock }
    }
}

impl<T: ?Sized + Serialize> Serialize for WithClock<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(Clocked { inner: serializer, clock: self.clock })
    }
}

/// A serializer passing everything to `inner` but a time field's text, which it writes in
/// `clock`.
struct Clocked<S> {
    inner: S,
    clock: WallClock,
}

/// A compound value (sequence, map, struct, ...) of a [`Clocked`] serializer: its elements are
/// written with the clock too.
struct Compound<C> {
    inner: C,
    clock: WallClock,
}

impl<C> Compound<C> {
    fn with<'a, T: ?Sized>(&self, value: &'a T) -> WithClock<'a, T> {
        WithClock { value, clock: self.clock }
    }
}

/// Methods whose value has no parts: passed on as they are.
macro_rules! pass_scalars {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method(self, v: $ty) -> Result<S::Ok, S::Error> {
            self.inner.$method(v)
        }
    )*};
}

impl<S: Serializer> Serializer for Clocked<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Compound<S::SerializeSeq>;
    type SerializeTuple = Compound<S::SerializeTuple>;
    type SerializeTupleStruct = Compound<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Compound<S::SerializeTupleVariant>;
    type SerializeMap = Compound<S::SerializeMap>;
    type SerializeStruct = Compound<S::SerializeStruct>;
    type SerializeStructVariant = Compound<S::SerializeStructVariant>;

    pass_scalars!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
    );

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_none()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.inner.serialize_some(&WithClock { value, clock: self.clock })
    }

    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit()
    }

    fn serialize_unit_struct(self, name: &'static str) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit_struct(name)
    }

    fn serialize_unit_variant(self, name: &'static str, index: u32, variant: &'static str) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit_variant(name, index, variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, name: &'static str, value: &T) -> Result<S::Ok, S::Error> {
        if name == TEXT {
            // A time field's text: its boot-clock value, in this clock. (A value that does not
            // give one, as when serde buffered it, is written as a clock-less writer would.)
            let text = value.serialize(Capture).ok().and_then(|ns| self.clock.rfc3339(BootTime::from_ns(ns)));
            return match text {
                Some(text) => self.inner.serialize_str(&text),
                None => self.inner.serialize_none(),
            };
        }
        self.inner.serialize_newtype_struct(name, &WithClock { value, clock: self.clock })
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.inner.serialize_newtype_variant(name, index, variant, &WithClock { value, clock: self.clock })
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        Ok(Compound { inner: self.inner.serialize_seq(len)?, clock: self.clock })
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        Ok(Compound { inner: self.inner.serialize_tuple(len)?, clock: self.clock })
    }

    fn serialize_tuple_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeTupleStruct, S::Error> {
        Ok(Compound { inner: self.inner.serialize_tuple_struct(name, len)?, clock: self.clock })
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        Ok(Compound { inner: self.inner.serialize_tuple_variant(name, index, variant, len)?, clock: self.clock })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        Ok(Compound { inner: self.inner.serialize_map(len)?, clock: self.clock })
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeStruct, S::Error> {
        Ok(Compound { inner: self.inner.serialize_struct(name, len)?, clock: self.clock })
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        Ok(Compound { inner: self.inner.serialize_struct_variant(name, index, variant, len)?, clock: self.clock })
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.inner.collect_str(value)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The compound traits whose elements are written one by one, each with the clock.
macro_rules! pass_elements {
    ($($trait:ident::$method:ident),* $(,)?) => {$(
        impl<C: ser::$trait> ser::$trait for Compound<C> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), C::Error> {
                let value = self.with(value);
                self.inner.$method(&value)
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                self.inner.end()
            }
        }
    )*};
}

pass_elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl<C: ser::SerializeMap> ser::SerializeMap for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), C::Error> {
        let key = self.with(key);
        self.inner.serialize_key(&key)
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), C::Error> {
        let value = self.with(value);
        self.inner.serialize_value(&value)
    }

    fn serialize_entry<K: ?Sized + Serialize, V: ?Sized + Serialize>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), C::Error> {
        let (key, value) = (self.with(key), self.with(value));
        self.inner.serialize_entry(&key, &value)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

/// The struct traits: named fields, each written with the clock; a skipped field stays skipped.
macro_rules! pass_fields {
    ($($trait:ident),* $(,)?) => {$(
        impl<C: ser::$trait> ser::$trait for Compound<C> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn serialize_field<T: ?Sized + Serialize>(&mut self, key: &'static str, value: &T) -> Result<(), C::Error> {
                let value = self.with(value);
                self.inner.serialize_field(key, &value)
            }

            fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
                self.inner.skip_field(key)
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                self.inner.end()
            }
        }
    )*};
}

pass_fields!(SerializeStruct, SerializeStructVariant);

/// Takes the boot-clock value out of a time field's text ([`BootNsForAClock`]); refuses
/// anything else.
struct Capture;

/// What [`Capture`] refuses: anything but one `u64`.
#[derive(Debug)]
struct NotATime;

impl fmt::Display for NotATime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a time field's boot-clock value")
    }
}

impl std::error::Error for NotATime {}

impl ser::Error for NotATime {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotATime
    }
}

/// Methods [`Capture`] refuses.
macro_rules! refuse {
    ($($method:ident($($ty:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $ty),*) -> Result<u64, NotATime> {
            Err(NotATime)
        }
    )*};
}

impl Serializer for Capture {
    type Ok = u64;
    type Error = NotATime;
    type SerializeSeq = Impossible<u64, NotATime>;
    type SerializeTuple = Impossible<u64, NotATime>;
    type SerializeTupleStruct = Impossible<u64, NotATime>;
    type SerializeTupleVariant = Impossible<u64, NotATime>;
    type SerializeMap = Impossible<u64, NotATime>;
    type SerializeStruct = Impossible<u64, NotATime>;
    type SerializeStructVariant = Impossible<u64, NotATime>;

    fn serialize_u64(self, ns: u64) -> Result<u64, NotATime> {
        Ok(ns)
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<u64, NotATime> {
        Err(NotATime)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, _: &T) -> Result<u64, NotATime> {
        Err(NotATime)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<u64, NotATime> {
        Err(NotATime)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotATime> {
        Err(NotATime)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotATime> {
        Err(NotATime)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, NotATime> {
        Err(NotATime)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotATime> {
        Err(NotATime)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotATime> {
        Err(NotATime)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, NotATime> {
        Err(NotATime)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotATime> {
        Err(NotATime)
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, _: &T) -> Result<u64, NotATime> {
        Err(NotATime)
    }
}
