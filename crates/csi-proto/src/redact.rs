//! Formatting helpers for the `Debug` impls that `build.rs` generates for secret-bearing
//! messages. The non-secret helpers reproduce what prost's derived `Debug` prints, so
//! only the secret fields look different.

use core::fmt;
use core::marker::PhantomData;
use std::collections::HashMap;

/// An `i32` enum field, printed as prost prints it: the variant name, or the raw number
/// if the value is unknown.
pub(crate) struct Enum<'a, E> {
    value: &'a i32,
    enumeration: PhantomData<E>,
}

impl<'a, E> Enum<'a, E> {
    pub(crate) fn new(value: &'a i32) -> Self {
        Self {
            value,
            enumeration: PhantomData,
        }
    }
}

impl<E: TryFrom<i32> + fmt::Debug> fmt::Debug for Enum<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match E::try_from(*self.value) {
            Ok(known) => fmt::Debug::fmt(&known, f),
            Err(_) => fmt::Debug::fmt(self.value, f),
        }
    }
}

/// An `optional` enum field (`Option<i32>`).
pub(crate) struct OptionalEnum<'a, E> {
    value: &'a Option<i32>,
    enumeration: PhantomData<E>,
}

impl<'a, E> OptionalEnum<'a, E> {
    pub(crate) fn new(value: &'a Option<i32>) -> Self {
        Self {
            value,
            enumeration: PhantomData,
        }
    }
}

impl<E: TryFrom<i32> + fmt::Debug> fmt::Debug for OptionalEnum<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.value.as_ref().map(Enum::<E>::new), f)
    }
}

/// A `repeated` enum field.
pub(crate) struct EnumList<'a, E> {
    values: &'a [i32],
    enumeration: PhantomData<E>,
}

impl<'a, E> EnumList<'a, E> {
    pub(crate) fn new(values: &'a [i32]) -> Self {
        Self {
            values,
            enumeration: PhantomData,
        }
    }
}

impl<E: TryFrom<i32> + fmt::Debug> fmt::Debug for EnumList<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.values.iter().map(Enum::<E>::new))
            .finish()
    }
}

/// A map field whose values are an enum.
pub(crate) struct EnumValueMap<'a, K, E> {
    map: &'a HashMap<K, i32>,
    enumeration: PhantomData<E>,
}

impl<'a, K, E> EnumValueMap<'a, K, E> {
    pub(crate) fn new(map: &'a HashMap<K, i32>) -> Self {
        Self {
            map,
            enumeration: PhantomData,
        }
    }
}

impl<K: fmt::Debug, E: TryFrom<i32> + fmt::Debug> fmt::Debug for EnumValueMap<'_, K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.map.iter().map(|(k, v)| (k, Enum::<E>::new(v))))
            .finish()
    }
}

/// Stand-in for a secret field's value. It shows only the shape: how many map entries or
/// list items, or whether a single value is set. Map keys are not shown either, because
/// they can be sensitive too.
pub(crate) enum Redacted {
    Map(usize),
    List(usize),
    Value { present: bool },
}

impl Redacted {
    pub(crate) fn map(len: usize) -> Self {
        Self::Map(len)
    }

    pub(crate) fn list(len: usize) -> Self {
        Self::List(len)
    }

    pub(crate) fn value(present: bool) -> Self {
        Self::Value { present }
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Map(1) => f.write_str("<redacted 1 key>"),
            Self::Map(n) => write!(f, "<redacted {n} keys>"),
            Self::List(1) => f.write_str("<redacted 1 item>"),
            Self::List(n) => write!(f, "<redacted {n} items>"),
            Self::Value { present: true } => f.write_str("<redacted>"),
            Self::Value { present: false } => f.write_str("<empty>"),
        }
    }
}
