//! Reading one msgpack value (vLLM's messages, SGLang's in msgpack mode) into an `rmpv::Value`.
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
    Ok(match marker {
        Marker::Null => Value::Nil,
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
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
            let len = length(marker, rest)?;
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
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
            let len = length(marker, rest)?;
            deeper(depth)?;
            Value::Binary(take(rest, len)?.to_vec())
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let len = length(marker, rest)?;
            let depth = deeper(depth)?;
            let mut items = Vec::with_capacity(len.min(rest.len()));
            for _ in 0..len {
                items.push(read_value(rest, depth)?);
            }
            Value::Array(items)
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let len = length(marker, rest)?;
            let depth = deeper(depth)?;
            let mut entries = Vec::with_capacity(len.min(rest.len() / 2));
            for _ in 0..len {
                let key = read_value(rest, depth)?;
                entries.push((key, read_value(rest, depth)?));
            }
            Value::Map(entries)
        }
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => {
            let len = length(marker, rest)?;
            deeper(deeper(depth)?)?;
            let kind = number(rest.read_data_i8())?;
            Value::Ext(kind, take(rest, len)?.to_vec())
        }
        // The marker msgpack never uses: nil, as rmpv reads it.
        Marker::Reserved => Value::Nil,
    })
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

    #[test]
    fn every_kind_of_value_reads_as_rmpv_reads_it() {
        let value = Value::Array(vec![
            Value::Nil,
            Value::Boolean(true),
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
            Value::Map(vec![(
                Value::from("k"),
                Value::Array(vec![Value::from(1); 20]),
            )]),
            Value::Ext(3, vec![9; 4]),
            Value::Ext(-2, vec![9; 300]),
        ]);
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
}
