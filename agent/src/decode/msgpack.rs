//! Reading one msgpack value (vLLM's messages, SGLang's in msgpack mode): into an
//! `rmpv::Value`, or in place ([`Lazy`]).
//!
//! rmpv's own reader grows each array and map one element at a time (it never trusts a
//! length, rmpv issue 151): on vLLM's per-step messages, arrays of token ids and outputs, that
//! growing was a tenth of the live agent's time. Here an array or map is allocated at its
//! length, bounded by the bytes left (every element takes at least one byte), so a hostile
//! length cannot make it allocate more than the message's size. Markers and numbers are read
//! with `rmp`; a string that is not UTF-8 (rare) is left to rmpv, which keeps its bytes.
use rmp::{
    Marker,
    decode::{self, RmpRead},
};
use rmpv::Value;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MsgpackError {
    #[error("the value ends early")]
    Truncated,
    #[error("nested too deep")]
    TooDeep,
}

/// The value at the start of `rest`, nested at most `max_depth` deep as rmpv counts it (a
/// level per value, another per array, map or binary, two more per string or ext); `rest`
/// moves past it.
pub fn read_value(rest: &mut &[u8], max_depth: usize) -> Result<Value, MsgpackError> {
    let depth = deeper(max_depth)?;
    let start = *rest;
    let marker = decode::read_marker(rest).map_err(|_| MsgpackError::Truncated)?;
    if let Some(kind) = kind_of(marker) {
        let len = length(marker, rest)?;
        return Ok(match kind {
            Kind::Str => {
                deeper(deeper(depth)?)?;
                let bytes = take(rest, len)?;
                match std::str::from_utf8(bytes) {
                    Ok(text) => Value::String(text.into()),
                    Err(_) => {
                        let mut item = &start[..start.len() - rest.len()];
                        rmpv::decode::read_value(&mut item).map_err(|_| MsgpackError::Truncated)?
                    }
                }
            }
            Kind::Bin => {
                deeper(depth)?;
                Value::Binary(take(rest, len)?.to_vec())
            }
            Kind::Array => {
                let depth = deeper(depth)?;
                let mut items = Vec::with_capacity(len.min(rest.len()));
                for _ in 0..len {
                    items.push(read_value(rest, depth)?);
                }
                Value::Array(items)
            }
            Kind::Map => {
                let depth = deeper(depth)?;
                let mut entries = Vec::with_capacity(len.min(rest.len() / 2));
                for _ in 0..len {
                    let key = read_value(rest, depth)?;
                    entries.push((key, read_value(rest, depth)?));
                }
                Value::Map(entries)
            }
            Kind::Ext => {
                deeper(deeper(depth)?)?;
                let kind = number(rest.read_data_i8())?;
                Value::Ext(kind, take(rest, len)?.to_vec())
            }
        });
    }
    Ok(match marker {
        Marker::True => Value::Boolean(true),
        Marker::False => Value::Boolean(false),
        Marker::FixPos(n) => Value::from(n),
        Marker::FixNeg(n) => Value::from(n),
        Marker::U8 => Value::from(number(rest.read_data_u8())?),
        Marker::U16 => Value::from(number(rest.read_data_u16())?),
        Marker::U32 => Value::from(number(rest.read_data_u32())?),
        Marker::U64 => Value::from(number(rest.read_data_u64())?),
        Marker::I8 => Value::from(number(rest.read_data_i8())?),
        Marker::I16 => Value::from(number(rest.read_data_i16())?),
        Marker::I32 => Value::from(number(rest.read_data_i32())?),
        Marker::I64 => Value::from(number(rest.read_data_i64())?),
        Marker::F32 => Value::F32(number(rest.read_data_f32())?),
        Marker::F64 => Value::F64(number(rest.read_data_f64())?),
        // Nil, and the marker msgpack never uses (nil, as rmpv reads it); the others were
        // read above.
        _ => Value::Nil,
    })
}

/// A msgpack value read in place: checked whole once ([`Lazy::read`]; or item by item as it
/// is read, [`Lazy::unchecked`]), then its parts are looked at where they lie, with nothing
/// built or copied. vLLM's per-step messages were read
/// into a value tree (a vector per array, a string per id) only to pick fields out of it:
/// building and dropping the tree was most of their decoding. The default is an empty value,
/// read as nil.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lazy<'a> {
    /// Starts at the value's marker; the value may end before the slice does.
    bytes: &'a [u8],
    /// How deep the value may nest ([`read_value`]'s `max_depth`): its items are read with
    /// what is left of it, so that a value read unchecked is bounded as a checked one is.
    depth: usize,
}

impl<'a> Lazy<'a> {
    /// The value at the start of `rest`, accepted exactly when [`read_value`] accepts it (the
    /// same depth count); `rest` moves past it.
    pub fn read(rest: &mut &'a [u8], max_depth: usize) -> Result<Self, MsgpackError> {
        let bytes = *rest;
        skip(rest, max_depth)?;
        Ok(Lazy {
            bytes,
            depth: max_depth,
        })
    }

    /// The value at the start of `bytes`, not walked first: each item is checked as it is read
    /// (nested at most `max_depth` deep, as [`Lazy::read`] counts it), and a reader that must
    /// reject what [`Lazy::read`] rejects reads every item and checks [`Items::failed`] and
    /// what follows. Spares a message read whole the walk that checks it first.
    pub fn unchecked(bytes: &'a [u8], max_depth: usize) -> Self {
        Lazy {
            bytes,
            depth: max_depth,
        }
    }

    fn marker(self) -> Marker {
        Marker::from_u8(self.bytes.first().copied().unwrap_or(0xc1))
    }

    /// The marker's payload: what follows it.
    fn after_marker(self) -> &'a [u8] {
        self.bytes.get(1..).unwrap_or_default()
    }

    /// Nil (or the marker msgpack never uses, which [`read_value`] reads as nil).
    pub fn is_nil(self) -> bool {
        matches!(self.marker(), Marker::Null | Marker::Reserved)
    }

    pub fn as_bool(self) -> Option<bool> {
        match self.marker() {
            Marker::True => Some(true),
            Marker::False => Some(false),
            _ => None,
        }
    }

    /// An integer as i128, whatever its encoding.
    fn integer(self) -> Option<i128> {
        let mut rest = self.after_marker();
        Some(match self.marker() {
            Marker::FixPos(n) => i128::from(n),
            Marker::FixNeg(n) => i128::from(n),
            Marker::U8 => i128::from(rest.read_data_u8().ok()?),
            Marker::U16 => i128::from(rest.read_data_u16().ok()?),
            Marker::U32 => i128::from(rest.read_data_u32().ok()?),
            Marker::U64 => i128::from(rest.read_data_u64().ok()?),
            Marker::I8 => i128::from(rest.read_data_i8().ok()?),
            Marker::I16 => i128::from(rest.read_data_i16().ok()?),
            Marker::I32 => i128::from(rest.read_data_i32().ok()?),
            Marker::I64 => i128::from(rest.read_data_i64().ok()?),
            _ => return None,
        })
    }

    /// An integer that fits a u64 (as `Value::as_u64`).
    pub fn as_u64(self) -> Option<u64> {
        u64::try_from(self.integer()?).ok()
    }

    /// An integer that fits an i64 (as `Value::as_i64`).
    pub fn as_i64(self) -> Option<i64> {
        i64::try_from(self.integer()?).ok()
    }

    /// A float (F32 or F64; not an integer).
    pub fn as_float(self) -> Option<f64> {
        let mut rest = self.after_marker();
        match self.marker() {
            Marker::F32 => rest.read_data_f32().ok().map(f64::from),
            Marker::F64 => rest.read_data_f64().ok(),
            _ => None,
        }
    }

    /// The length a container, string, binary or ext marker of `kind` gives, and the bytes
    /// after it; None for a value of another kind.
    fn sized(self, kind: Kind) -> Option<(usize, &'a [u8])> {
        let marker = self.marker();
        if kind_of(marker) != Some(kind) {
            return None;
        }
        let mut rest = self.after_marker();
        let len = length(marker, &mut rest).ok()?;
        Some((len, rest))
    }

    /// A string that is UTF-8 (as `Value::as_str`).
    pub fn as_str(self) -> Option<&'a str> {
        let (len, mut rest) = self.sized(Kind::Str)?;
        std::str::from_utf8(take(&mut rest, len).ok()?).ok()
    }

    /// An ext's type and bytes.
    pub fn as_ext(self) -> Option<(i8, &'a [u8])> {
        let (len, mut rest) = self.sized(Kind::Ext)?;
        let kind = rest.read_data_i8().ok()?;
        Some((kind, take(&mut rest, len).ok()?))
    }

    /// An array's items.
    pub fn as_array(self) -> Option<Items<'a>> {
        let (left, rest) = self.sized(Kind::Array)?;
        Some(Items {
            rest,
            left,
            depth: self.item_depth()?,
            failed: false,
        })
    }

    /// A map's entries.
    pub fn as_map(self) -> Option<LazyMap<'a>> {
        let (len, rest) = self.sized(Kind::Map)?;
        Some(LazyMap {
            rest,
            len,
            depth: self.item_depth()?,
        })
    }

    /// How deep a container's items may nest: a level for the value, one for the container
    /// (as [`skip`] counts them).
    fn item_depth(self) -> Option<usize> {
        self.depth.checked_sub(2)
    }

    /// What follows the value, found by walking it; an empty slice when it is not whole.
    pub fn after(self) -> &'a [u8] {
        let mut rest = self.bytes;
        skip(&mut rest, self.depth).map_or(&[], |()| rest)
    }

    /// The value as an `rmpv::Value` (for the rare field that is shown as it is).
    pub fn to_value(self) -> Value {
        read_value(&mut &self.bytes[..], self.depth).unwrap_or(Value::Nil)
    }
}

/// The items of an array read in place.
#[derive(Clone, Debug)]
pub struct Items<'a> {
    rest: &'a [u8],
    left: usize,
    /// How deep each item may nest.
    depth: usize,
    /// An item was not whole (only in a value read unchecked): no item is left.
    failed: bool,
}

impl<'a> Iterator for Items<'a> {
    type Item = Lazy<'a>;

    fn next(&mut self) -> Option<Lazy<'a>> {
        self.left = self.left.checked_sub(1)?;
        match Lazy::read(&mut self.rest, self.depth) {
            Ok(item) => Some(item),
            Err(_) => {
                self.left = 0;
                self.failed = true;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Items<'_> {}

impl<'a> Items<'a> {
    /// What follows the items read so far: once all are read, what follows the array.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// Whether the items ended early at one that is not whole (only in a value read
    /// [`Lazy::unchecked`]).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The next item as `read` reads it. `read` also gives what follows the item (a tail of
    /// the bytes it was handed: an array's [`Items::rest`] once its items are all read), so
    /// that moving past the item does not walk it a second time, as [`Iterator::next`] does.
    /// After an error no item is left.
    pub fn next_read<T, E>(
        &mut self,
        read: impl FnOnce(Lazy<'a>) -> Result<(T, &'a [u8]), E>,
    ) -> Option<Result<T, E>> {
        self.left = self.left.checked_sub(1)?;
        let item = Lazy {
            bytes: self.rest,
            depth: self.depth,
        };
        Some(match read(item) {
            Ok((value, rest)) => {
                debug_assert!(rest.len() <= self.rest.len(), "not a tail of the item");
                self.rest = rest;
                Ok(value)
            }
            Err(e) => {
                self.left = 0;
                self.failed = true;
                Err(e)
            }
        })
    }
}

/// A map read in place.
#[derive(Clone, Copy, Debug)]
pub struct LazyMap<'a> {
    rest: &'a [u8],
    len: usize,
    /// How deep each key and value may nest.
    depth: usize,
}

impl<'a> LazyMap<'a> {
    /// Its (key, value) pairs, in order.
    pub fn entries(self) -> impl Iterator<Item = (Lazy<'a>, Lazy<'a>)> {
        let mut items = Items {
            rest: self.rest,
            left: self.len.saturating_mul(2),
            depth: self.depth,
            failed: false,
        };
        std::iter::from_fn(move || Some((items.next()?, items.next()?)))
    }

    /// The value of the first entry whose key is the string `key` (nil included).
    pub fn get(self, key: &str) -> Option<Lazy<'a>> {
        self.entries()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// [`LazyMap::get`] of each of `keys`, in one walk over the entries (a `get` each walks
    /// them again: a request's sampling parameters are a map of some 30 entries).
    pub fn get_all<const N: usize>(self, keys: [&str; N]) -> [Option<Lazy<'a>>; N] {
        let mut found = [None; N];
        let mut left = N;
        for (k, v) in self.entries() {
            let Some(key) = k.as_str() else {
                continue;
            };
            if let Some(i) = keys.iter().position(|&wanted| wanted == key)
                && found[i].is_none()
            {
                found[i] = Some(v);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        found
    }
}

/// Move past the value at the start of `rest`, nested at most `max_depth` deep as
/// [`read_value`] counts it, failing exactly where it fails.
fn skip(rest: &mut &[u8], max_depth: usize) -> Result<(), MsgpackError> {
    let depth = deeper(max_depth)?;
    // Most of a message is small scalars (token ids, flags): their size is in their marker.
    if let Some(size) = rest.first().and_then(|&first| scalar_size(first)) {
        take(rest, size)?;
        return Ok(());
    }
    let marker = decode::read_marker(rest).map_err(|_| MsgpackError::Truncated)?;
    // Scalars were sized by their marker byte above.
    let Some(kind) = kind_of(marker) else {
        return Ok(());
    };
    let len = length(marker, rest)?;
    match kind {
        Kind::Str => {
            deeper(deeper(depth)?)?;
            take(rest, len)?;
        }
        Kind::Bin => {
            deeper(depth)?;
            take(rest, len)?;
        }
        Kind::Array | Kind::Map => {
            let depth = deeper(depth)?;
            let items = if kind == Kind::Map { len * 2 } else { len };
            for _ in 0..items {
                skip(rest, depth)?;
            }
        }
        Kind::Ext => {
            deeper(deeper(depth)?)?;
            // Its type byte, then its bytes.
            take(rest, 1 + len)?;
        }
    }
    Ok(())
}

/// What a marker that is not a scalar's starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

fn kind_of(marker: Marker) -> Option<Kind> {
    Some(match marker {
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => Kind::Str,
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => Kind::Bin,
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => Kind::Array,
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => Kind::Map,
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => Kind::Ext,
        _ => return None,
    })
}

/// The whole size of a scalar (nil, bool, int, float, the reserved marker) from its marker
/// byte; None for the others.
fn scalar_size(marker: u8) -> Option<usize> {
    match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xc0..=0xc3 => Some(1),
        0xcc | 0xd0 => Some(2),
        0xcd | 0xd1 => Some(3),
        0xca | 0xce | 0xd2 => Some(5),
        0xcb | 0xcf | 0xd3 => Some(9),
        _ => None,
    }
}

fn number<T, E>(read: Result<T, E>) -> Result<T, MsgpackError> {
    read.map_err(|_| MsgpackError::Truncated)
}

/// The length a marker gives, read after it when it is not part of it.
fn length(marker: Marker, rest: &mut &[u8]) -> Result<usize, MsgpackError> {
    Ok(match marker {
        Marker::FixStr(n) | Marker::FixArray(n) | Marker::FixMap(n) => usize::from(n),
        Marker::FixExt1 => 1,
        Marker::FixExt2 => 2,
        Marker::FixExt4 => 4,
        Marker::FixExt8 => 8,
        Marker::FixExt16 => 16,
        Marker::Str8 | Marker::Bin8 | Marker::Ext8 => usize::from(number(rest.read_data_u8())?),
        Marker::Str16 | Marker::Bin16 | Marker::Array16 | Marker::Map16 | Marker::Ext16 => {
            usize::from(number(rest.read_data_u16())?)
        }
        _ => number(rest.read_data_u32())? as usize,
    })
}

fn deeper(max_depth: usize) -> Result<usize, MsgpackError> {
    max_depth.checked_sub(1).ok_or(MsgpackError::TooDeep)
}

/// The next `len` bytes of `rest`.
fn take<'a>(rest: &mut &'a [u8], len: usize) -> Result<&'a [u8], MsgpackError> {
    if rest.len() < len {
        return Err(MsgpackError::Truncated);
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rmpv's reader, the reference.
    fn rmpv_reads(bytes: &[u8], max_depth: usize) -> Option<(Value, usize)> {
        let mut rest = bytes;
        let value = rmpv::decode::read_value_with_max_depth(&mut rest, max_depth).ok()?;
        Some((value, rest.len()))
    }

    fn ours(bytes: &[u8], max_depth: usize) -> Option<(Value, usize)> {
        let mut rest = bytes;
        let value = read_value(&mut rest, max_depth).ok()?;
        Some((value, rest.len()))
    }

    fn encoded(value: &Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).unwrap();
        bytes
    }

    /// `value` is read as rmpv reads it (or refused as it is) at each of `depths`.
    fn same_as_rmpv_at(value: &Value, depths: std::ops::RangeInclusive<usize>) {
        let bytes = encoded(value);
        for depth in depths {
            assert_eq!(
                ours(&bytes, depth),
                rmpv_reads(&bytes, depth),
                "{value:?} at depth {depth}"
            );
        }
    }

    /// A value of every kind and size class.
    fn every_kind() -> Value {
        Value::Array(vec![
            Value::Nil,
            Value::Boolean(true),
            Value::Boolean(false),
            Value::from(7),
            Value::from(-7),
            Value::from(300),
            Value::from(70_000),
            Value::from(u64::MAX),
            Value::from(-300),
            Value::from(i64::MIN),
            Value::F32(1.5),
            Value::F64(-2.25),
            Value::from("req-1"),
            Value::from("x".repeat(300)),
            Value::Binary(vec![1, 2, 3]),
            Value::Binary(vec![0; 70_000]),
            Value::Map(vec![
                (Value::from("k"), Value::Array(vec![Value::from(1); 20])),
                (Value::from(3), Value::Nil),
                (Value::from("m"), Value::Map(vec![])),
            ]),
            Value::Ext(3, vec![9; 4]),
            Value::Ext(-2, vec![9; 300]),
        ])
    }

    #[test]
    fn every_kind_of_value_reads_as_rmpv_reads_it() {
        let value = every_kind();
        let bytes = encoded(&value);
        // A string that is not UTF-8, and bytes after the value.
        let mut with_invalid = bytes.clone();
        let at = with_invalid.windows(5).position(|w| w == b"req-1").unwrap();
        with_invalid[at] = 0xff;
        with_invalid.extend_from_slice(b"tail");
        for input in [&bytes, &with_invalid] {
            assert_eq!(ours(input, 8), rmpv_reads(input, 8));
        }
        assert_eq!(ours(&bytes, 8).unwrap().0, value);
    }

    #[test]
    fn truncated_deep_and_lying_input_is_an_error() {
        let nested = (0..5).fold(Value::from(1), |v, _| Value::Array(vec![v]));
        same_as_rmpv_at(&nested, 9..=12);
        let bytes = encoded(&nested);
        assert_eq!(read_value(&mut &bytes[..], 10), Err(MsgpackError::TooDeep));
        assert!(ours(&bytes, 11).is_some());
        for end in 0..bytes.len() {
            assert!(ours(&bytes[..end], 64).is_none(), "cut at {end}");
        }
        // An array that says it holds 2^32 - 1 elements, in 6 bytes: no such allocation.
        assert_eq!(
            read_value(&mut &[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0][..], 8),
            Err(MsgpackError::Truncated)
        );
        assert_eq!(ours(&[0xc1], 8), rmpv_reads(&[0xc1], 8));
    }

    #[test]
    fn strings_binaries_and_exts_count_as_deep_as_rmpv_counts_them() {
        // Found by the fuzzer: an ext at the bottom of nested arrays was read by us and
        // refused by rmpv, which counts a level for a binary and two for a string or ext.
        for leaf in [
            Value::from("s"),
            Value::Binary(vec![1]),
            Value::Ext(-1, vec![255]),
            Value::from(1),
        ] {
            let nested = (0..3).fold(leaf, |v, _| Value::Array(vec![v]));
            same_as_rmpv_at(&nested, 0..=12);
        }
    }

    /// `lazy` shows what `value` holds, through every accessor, all the way down.
    fn shows(lazy: Lazy<'_>, value: &Value) {
        assert_eq!(lazy.is_nil(), value.is_nil(), "{value:?}");
        assert_eq!(lazy.as_bool(), value.as_bool(), "{value:?}");
        assert_eq!(lazy.as_u64(), value.as_u64(), "{value:?}");
        assert_eq!(lazy.as_i64(), value.as_i64(), "{value:?}");
        let float = match value {
            Value::F32(f) => Some(f64::from(*f)),
            Value::F64(f) => Some(*f),
            _ => None,
        };
        assert_eq!(lazy.as_float(), float, "{value:?}");
        assert_eq!(lazy.as_str(), value.as_str(), "{value:?}");
        let ext = match value {
            Value::Ext(kind, bytes) => Some((*kind, bytes.as_slice())),
            _ => None,
        };
        assert_eq!(lazy.as_ext(), ext, "{value:?}");
        assert_eq!(&lazy.to_value(), value);
        match (lazy.as_array(), value.as_array()) {
            (Some(items), Some(values)) => {
                assert_eq!(items.len(), values.len());
                for (item, value) in items.zip(values) {
                    shows(item, value);
                }
            }
            (None, None) => {}
            other => panic!("array or not: {other:?}"),
        }
        match (lazy.as_map(), value.as_map()) {
            (Some(map), Some(entries)) => {
                assert_eq!(map.entries().count(), entries.len());
                for ((k, v), (key, value)) in map.entries().zip(entries) {
                    shows(k, key);
                    shows(v, value);
                }
                for (key, value) in entries {
                    if let Some(key) = key.as_str() {
                        shows(map.get(key).expect("found"), value);
                        let [found, absent] = map.get_all([key, "no such key"]);
                        shows(found.expect("found in one walk"), value);
                        assert!(absent.is_none());
                    }
                }
                assert!(map.get("no such key").is_none());
            }
            (None, None) => {}
            other => panic!("map or not: {other:?}"),
        }
    }

    #[test]
    fn get_all_finds_each_key_as_get_does_in_one_walk() {
        let map = Value::Map(vec![
            (Value::from("a"), Value::from(1)),
            (Value::from(7), Value::from(3)),
            (Value::from("b"), Value::Nil),
            (Value::from("a"), Value::from(2)),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &map).unwrap();
        let map = Lazy::read(&mut &bytes[..], 16).unwrap().as_map().unwrap();
        let [b, a, c] = map.get_all(["b", "a", "c"]);
        assert!(b.expect("a nil value is found").is_nil());
        // The first entry of a key, as `get` finds it.
        assert_eq!(a.and_then(Lazy::as_u64), Some(1));
        assert_eq!(
            a.and_then(Lazy::as_u64),
            map.get("a").and_then(Lazy::as_u64)
        );
        assert!(c.is_none());
    }

    /// What [`Lazy::read`] accepts, and the bytes it leaves.
    fn lazily(bytes: &[u8], max_depth: usize) -> Option<usize> {
        let mut rest = bytes;
        Lazy::read(&mut rest, max_depth).ok()?;
        Some(rest.len())
    }

    #[test]
    fn a_value_read_in_place_shows_what_the_tree_holds() {
        let value = every_kind();
        let mut bytes = encoded(&value);
        bytes.extend_from_slice(b"tail");
        let mut rest = &bytes[..];
        let lazy = Lazy::read(&mut rest, 8).expect("read");
        assert_eq!(rest, b"tail");
        assert_eq!(lazy.after(), b"tail");
        shows(lazy, &value);
        // The reserved marker reads as nil.
        assert!(Lazy::read(&mut &[0xc1][..], 8).unwrap().is_nil());
    }

    #[test]
    fn items_read_with_their_end_move_on_as_items_skipped_over_do() {
        let value = Value::Array(vec![
            Value::Array(vec![Value::from(1), Value::from("a")]),
            Value::Array(vec![]),
            Value::Array(vec![Value::Array(vec![Value::from(2)]), Value::from(3)]),
        ]);
        let bytes = encoded(&value);
        let lazy = Lazy::read(&mut &bytes[..], 8).unwrap();
        /// How many items an item holds, and where they end.
        fn own_items(item: Lazy<'_>) -> Result<(usize, &[u8]), ()> {
            let mut items = item.as_array().ok_or(())?;
            let count = items.by_ref().count();
            Ok((count, items.rest()))
        }
        let mut items = lazy.as_array().unwrap();
        let counts: Vec<usize> = std::iter::from_fn(|| items.next_read(own_items))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(counts, [2, 0, 2]);
        assert!(items.rest().is_empty());
        // An error ends the items.
        let scalars = encoded(&Value::Array(vec![Value::from(1); 3]));
        let mut items = Lazy::read(&mut &scalars[..], 8)
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(items.next_read(own_items), Some(Err(())));
        assert!(items.next().is_none());
    }

    #[test]
    fn a_value_read_in_place_is_accepted_or_refused_as_the_tree_is() {
        let nested = (0..5).fold(Value::from("s"), |v, _| Value::Array(vec![v]));
        let map = Value::Map(vec![(Value::from("k"), Value::Ext(1, vec![2]))]);
        let scalars = [
            Value::Nil,
            Value::Boolean(true),
            Value::from(5),
            Value::from(-5),
            Value::from(200),
            Value::from(-100),
            Value::from(60_000),
            Value::from(-30_000),
            Value::from(4_000_000_000u64),
            Value::from(-2_000_000_000),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::F32(0.5),
            Value::F64(0.25),
        ];
        let value = Value::Array([vec![nested, map], scalars.to_vec()].concat());
        let mut bytes = encoded(&value);
        bytes.push(0xc0);
        for end in 0..=bytes.len() {
            for depth in 0..12 {
                let part = &bytes[..end];
                assert_eq!(
                    lazily(part, depth),
                    ours(part, depth).map(|(_, left)| left),
                    "cut at {end}, depth {depth}"
                );
            }
        }
        // A lying length allocates nothing and fails.
        assert_eq!(lazily(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0], 8), None);
    }
}
