//! Reading decoded Python values: one set of rules for a built [`PyValue`] tree and for a
//! pickle read in place ([`PyRef`]), so that a message's fields are found the same way whether
//! they came from msgpack (turned into `PyValue`s) or from a pickle that was never expanded.
//!
//! The implementors give the primitive shapes (a string, an int, a sequence, a dict's
//! entries, a class name, an object's parts); the rules built on them (a dict's key, an
//! instance's fields, an `array.array`'s ints) are written once, here.
use super::pickle::{PyRef, PyValue};

/// A Python value that can be read: `'v` is how long what it returns borrows.
pub trait PyRead<'v>: Copy + Sized {
    fn as_str(self) -> Option<&'v str>;
    /// An int, or a bool as one.
    fn as_i64(self) -> Option<i64>;
    /// A float, or an int as one.
    fn as_f64(self) -> Option<f64>;
    fn as_bytes(self) -> Option<&'v [u8]>;
    /// A module attribute's (module, name).
    fn global(self) -> Option<(&'v str, &'v str)>;
    /// How many elements a list or tuple has.
    fn seq_len(self) -> Option<usize>;
    /// Element `i` of a list or tuple.
    fn item(self, i: usize) -> Option<Self>;
    fn is_tuple(self) -> bool;
    /// How many entries a dict has.
    fn dict_len(self) -> Option<usize>;
    /// The value of a string key in a dict.
    fn get(self, key: &str) -> Option<Self>;
    /// What the stream would have built by calling something: (callable, args, BUILD state).
    fn object(self) -> Option<(Self, Self, Option<Self>)>;

    /// The elements of a list or tuple.
    fn items(self) -> Option<Vec<Self>> {
        let n = self.seq_len()?;
        (0..n).map(|i| self.item(i)).collect()
    }

    /// An instance of a named class with its fields: `cls.__new__` + BUILD(dict) (dataclasses,
    /// plain classes; also `(dict, slots)` states), or `f(cls, dict)` reconstructors such as
    /// msgspec's `rebuild` and `copyreg._reconstructor`. Returns (module, class name, fields).
    fn instance(self) -> Option<(&'v str, &'v str, Self)> {
        let (callable, args, state) = self.object()?;
        // f(cls, fields) reconstructors.
        if args.seq_len().is_some_and(|n| n >= 2)
            && let Some((module, name)) = args.item(0).and_then(PyRead::global)
            && let Some(fields) = args.item(1).and_then(instance_fields)
        {
            return Some((module, name, fields));
        }
        let (module, name) = callable.global()?;
        Some((module, name, instance_fields(state?)?))
    }

    /// A sequence of ints: a list or tuple of them, or an `array.array` of an integer type
    /// (pickled as `array._array_reconstructor(array, typecode, machine format, bytes)`; SGLang
    /// sends token ids that way).
    fn int_array(self) -> Option<Vec<i64>> {
        if let Some(n) = self.seq_len() {
            return (0..n).map(|i| self.item(i)?.as_i64()).collect();
        }
        let (format, bytes) = machine_array(self)?;
        machine_ints(format, bytes)
    }
}

/// The field dict of an instance state: the state itself, or the dict of a `(dict, slots)`
/// pair (the non-empty one when both are dicts).
fn instance_fields<'v, V: PyRead<'v>>(state: V) -> Option<V> {
    if state.dict_len().is_some() {
        return Some(state);
    }
    if !state.is_tuple() || state.seq_len() != Some(2) {
        return None;
    }
    let pair = [state.item(0)?, state.item(1)?];
    pair.into_iter()
        .find(|p| p.dict_len().is_some_and(|n| n > 0))
        .or_else(|| pair.into_iter().find(|p| p.dict_len().is_some()))
}

/// An `array.array`'s machine format and bytes.
fn machine_array<'v, V: PyRead<'v>>(v: V) -> Option<(i64, &'v [u8])> {
    let (callable, args, _) = v.object()?;
    if callable.global() != Some(("array", "_array_reconstructor")) {
        return None;
    }
    if args.seq_len() != Some(4) {
        return None;
    }
    Some((args.item(2)?.as_i64()?, args.item(3)?.as_bytes()?))
}

/// CPython's machine formats of integer arrays (arraymodule.c `machine_format_code`: 0/1
/// unsigned/signed 8-bit, then 16, 32 and 64 bits, each as unsigned LE, unsigned BE, signed
/// LE, signed BE): (width, signed, big endian). None for the float formats.
fn machine_format(format: i64) -> Option<(usize, bool, bool)> {
    match format {
        0 => Some((1, false, false)),
        1 => Some((1, true, false)),
        2..=13 => {
            let k = format - 2;
            Some((2usize << (k / 4), k % 4 >= 2, k % 2 == 1))
        }
        _ => None,
    }
}

/// Integers of an `array` in one of CPython's machine formats; None for the float formats and
/// for unsigned 64-bit values beyond i64.
fn machine_ints(format: i64, bytes: &[u8]) -> Option<Vec<i64>> {
    let (width, signed, big_endian) = machine_format(format)?;
    if !bytes.len().is_multiple_of(width) {
        return None;
    }
    bytes
        .chunks_exact(width)
        .map(|chunk| {
            let mut wide = [0u8; 8];
            if big_endian {
                for (i, b) in chunk.iter().rev().enumerate() {
                    wide[i] = *b;
                }
            } else {
                wide[..width].copy_from_slice(chunk);
            }
            if signed && wide[width - 1] & 0x80 != 0 {
                wide[width..].fill(0xff);
            }
            let v = u64::from_le_bytes(wide);
            if signed {
                Some(v as i64)
            } else {
                i64::try_from(v).ok()
            }
        })
        .collect()
}

impl<'v> PyRead<'v> for &'v PyValue {
    fn as_str(self) -> Option<&'v str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_i64(self) -> Option<i64> {
        match self {
            PyValue::Int(i) => Some(*i),
            PyValue::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    fn as_f64(self) -> Option<f64> {
        match self {
            PyValue::Float(f) => Some(*f),
            PyValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    fn as_bytes(self) -> Option<&'v [u8]> {
        match self {
            PyValue::Bytes(b) => Some(b),
            _ => None,
        }
    }

    fn global(self) -> Option<(&'v str, &'v str)> {
        match self {
            PyValue::Global(g) => Some((g.module.as_str(), g.name.as_str())),
            _ => None,
        }
    }

    fn seq_len(self) -> Option<usize> {
        self.as_seq().map(<[PyValue]>::len)
    }

    fn item(self, i: usize) -> Option<Self> {
        self.as_seq()?.get(i)
    }

    fn is_tuple(self) -> bool {
        matches!(self, PyValue::Tuple(_))
    }

    fn dict_len(self) -> Option<usize> {
        match self {
            PyValue::Dict(entries) => Some(entries.len()),
            _ => None,
        }
    }

    fn get(self, key: &str) -> Option<Self> {
        match self {
            PyValue::Dict(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    fn object(self) -> Option<(Self, Self, Option<Self>)> {
        match self {
            PyValue::Object(o) => Some((&o.callable, &o.args, o.state.as_ref())),
            _ => None,
        }
    }
}

impl<'v> PyRead<'v> for PyRef<'v> {
    fn as_str(self) -> Option<&'v str> {
        self.text()
    }

    fn as_i64(self) -> Option<i64> {
        self.inline_int().or_else(|| self.leaf()?.as_i64())
    }

    fn as_f64(self) -> Option<f64> {
        match (self.inline_float(), self.inline_int()) {
            (Some(f), _) => Some(f),
            (None, Some(i)) => Some(i as f64),
            (None, None) => self.leaf()?.as_f64(),
        }
    }

    fn as_bytes(self) -> Option<&'v [u8]> {
        self.byte_string()
    }

    fn global(self) -> Option<(&'v str, &'v str)> {
        self.leaf()?.global()
    }

    fn seq_len(self) -> Option<usize> {
        self.sequence().map(<[usize]>::len)
    }

    fn item(self, i: usize) -> Option<Self> {
        Some(self.at(*self.sequence()?.get(i)?))
    }

    fn is_tuple(self) -> bool {
        self.is_tuple_node()
    }

    fn dict_len(self) -> Option<usize> {
        self.dict().map(<[(usize, usize)]>::len)
    }

    fn get(self, key: &str) -> Option<Self> {
        self.dict()?
            .iter()
            .find(|&&(k, _)| self.at(k).is_text(key))
            .map(|&(_, v)| self.at(v))
    }

    fn object(self) -> Option<(Self, Self, Option<Self>)> {
        self.object_parts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pickle::{loads, parse, short_unicode};

    #[test]
    fn machine_formats() {
        assert_eq!(machine_ints(5, &[0xff, 0xfe]), Some(vec![-2])); // int16 BE
        assert_eq!(machine_ints(2, &[0xff, 0xfe]), Some(vec![0xfeff])); // uint16 LE
        assert_eq!(machine_ints(8, &[1, 0, 0, 0, 2]), None); // ragged
        assert_eq!(machine_ints(10, &[0xff; 8]), None); // u64 beyond i64
        assert_eq!(machine_ints(14, &[0; 4]), None); // float
    }

    /// `array.array('<typecode>', ...)` pickled as CPython does (protocol 4), by hand:
    /// `array._array_reconstructor(array.array, typecode, format, bytes)`.
    fn pickled_array(format: u8, bytes: &[u8]) -> Vec<u8> {
        let mut p = vec![0x80, 4];
        let short = short_unicode;
        short(&mut p, "array");
        short(&mut p, "_array_reconstructor");
        p.push(0x93);
        p.push(b'(');
        short(&mut p, "array");
        short(&mut p, "array");
        p.push(0x93);
        short(&mut p, "Q");
        p.extend_from_slice(&[b'K', format, b'C', bytes.len() as u8]);
        p.extend_from_slice(bytes);
        p.extend_from_slice(b"tR.");
        p
    }

    #[test]
    fn an_array_reads_the_same_expanded_and_in_place() {
        let three = [3u64, 326, 7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>();
        let beyond = [u64::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>();
        for (bytes, ints) in [
            (three, Some(vec![3, 326, 7])),
            // Beyond i64: not ints.
            (beyond, None),
        ] {
            // Format 10: unsigned 64-bit little-endian.
            let p = pickled_array(10, &bytes);
            let expanded = loads(&p, &[]).unwrap();
            let pickle = parse(&p, &[]).unwrap();
            assert_eq!(expanded.int_array(), ints);
            assert_eq!(pickle.root().int_array(), ints);
        }
        // A float array has no ints.
        let p = pickled_array(18, &[0; 8]);
        assert_eq!(parse(&p, &[]).unwrap().root().int_array(), None);
        // A list has them only when every item is an int.
        let list = loads(b"(K\x01K\x02l.", &[]).unwrap();
        assert_eq!(list.int_array(), Some(vec![1, 2]));
        let mixed = loads(b"(K\x01Nl.", &[]).unwrap();
        assert_eq!(mixed.int_array(), None);
    }

    #[test]
    fn an_instance_state_of_dict_and_slots_gives_its_non_empty_dict() {
        // C.__new__(C) BUILD(({}, {"a": 1})), then BUILD(({}, {})) of another: protocol 4.
        let p = b"\x80\x04\x8c\x01m\x8c\x01C\x93)\x81}}\x8c\x01aK\x01s\x86b.";
        let pickle = parse(p, &[]).unwrap();
        let (module, class, fields) = pickle.root().instance().unwrap();
        assert_eq!((module, class), ("m", "C"));
        assert_eq!(fields.get("a").and_then(PyRead::as_i64), Some(1));
        let expanded = loads(p, &[]).unwrap();
        let (_, _, fields) = expanded.instance().unwrap();
        assert_eq!(fields.get("a").and_then(PyRead::as_i64), Some(1));
        let empty = b"\x80\x04\x8c\x01m\x8c\x01C\x93)\x81}}\x86b.";
        let pickle = parse(empty, &[]).unwrap();
        assert_eq!(
            pickle.root().instance().map(|(_, _, f)| f.dict_len()),
            Some(Some(0))
        );
    }
}
