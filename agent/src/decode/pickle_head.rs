//! The leading fields of a pickled msgspec Struct, read from the pickle's first bytes without
//! running it.
//!
//! pickle writes a msgspec Struct as `msgspec._utils.rebuild(cls, {field: value, ...})`, the
//! fields in declaration order:
//!
//! ```text
//! PROTO 5, FRAME n, 'msgspec._utils' 'rebuild' STACK_GLOBAL, '<module>' '<Class>' STACK_GLOBAL,
//! EMPTY_DICT, MARK, 'field' <value>, 'field' <value>, ... SETITEMS, TUPLE2, REDUCE, STOP
//! ```
//!
//! (each string and container followed by MEMOIZE). Where a reader needs only the first few
//! fields, and only to compare them (SGLang's output batches:
//! `engines/sglang/output_receipts.rs`), running the whole pickle ([`super::pickle`]) builds
//! every column to read none of them. This walks the opening opcodes and then one field at a
//! time, as long as each value has a shape it knows: None, booleans, ints, floats, short and
//! long strings, memo references, and lists and dicts of those. A value of any other shape
//! fails the walk, or, as the lone item of a list or dict (where it cannot be told from what
//! follows an empty one), ends its container before it, which the check for the next field's
//! key then finds ([`StructHead::at_field`]); the caller decodes such a pickle in full.
//! Nothing here is ever built or run.

/// Nesting of lists and dicts a walked value may have.
const MAX_NESTING: usize = 4;

/// A pickled msgspec Struct's class and the start of its fields.
#[derive(Debug)]
pub struct StructHead<'a> {
    pub module: &'a str,
    pub class: &'a str,
    /// The pickle from the field dict's first key on.
    fields: &'a [u8],
    /// How far the fields have been walked.
    at: usize,
}

/// The class of a pickled msgspec Struct and a walker over its fields; None for any other
/// pickle (or a layout this does not know).
pub fn struct_head(data: &[u8]) -> Option<StructHead<'_>> {
    let mut w = Walker { data, at: 0 };
    w.expect(0x80)?;
    w.take(1)?;
    if w.peek() == Some(0x95) {
        // FRAME and its 8-byte length.
        w.take(9)?;
    }
    let rebuild = (w.text()?, w.text()?);
    w.expect(0x93)?;
    w.memoize();
    if rebuild != ("msgspec._utils", "rebuild") {
        return None;
    }
    let (module, class) = (w.text()?, w.text()?);
    w.expect(0x93)?;
    w.memoize();
    w.expect(b'}')?;
    w.memoize();
    w.expect(b'(')?;
    Some(StructHead {
        module,
        class,
        fields: &data[w.at..],
        at: 0,
    })
}

impl<'a> StructHead<'a> {
    /// Walk the next field, which must be named `name`; false when it is not, or its value has
    /// a shape this does not know. Where its value ends is certain only once what follows is
    /// found to be the next field's key ([`Self::at_field`]).
    pub fn field(&mut self, name: &str) -> bool {
        let mut w = self.walker();
        let walked = w.string() == Some(name.as_bytes()) && w.value(MAX_NESTING).is_some();
        if walked {
            self.at = w.at;
        }
        walked
    }

    /// Walk the next field, which must be named `name` and hold a string: that string (what
    /// follows it is still to be checked with [`Self::at_field`]).
    pub fn text(&mut self, name: &str) -> Option<&'a str> {
        let mut w = self.walker();
        if w.string()? != name.as_bytes() {
            return None;
        }
        let text = w.text()?;
        self.at = w.at;
        Some(text)
    }

    /// Whether the next field is named `name`.
    pub fn at_field(&self, name: &str) -> bool {
        self.walker().string() == Some(name.as_bytes())
    }

    fn walker(&self) -> Walker<'a> {
        Walker {
            data: self.fields,
            at: self.at,
        }
    }

    /// The bytes of the fields walked so far, keys and values.
    pub fn walked(&self) -> &'a [u8] {
        &self.fields[..self.at]
    }
}

/// A cursor over pickle opcodes.
struct Walker<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Walker<'a> {
    fn peek(&self) -> Option<u8> {
        self.data.get(self.at).copied()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }

    fn expect(&mut self, opcode: u8) -> Option<()> {
        (self.take(1)?[0] == opcode).then_some(())
    }

    /// A MEMOIZE, if one is next.
    fn memoize(&mut self) {
        if self.peek() == Some(0x94) {
            self.at += 1;
        }
    }

    fn length<const N: usize>(&mut self) -> Option<usize> {
        let mut wide = [0u8; 8];
        wide[..N].copy_from_slice(self.take(N)?);
        usize::try_from(u64::from_le_bytes(wide)).ok()
    }

    /// A SHORT_BINUNICODE or BINUNICODE string (and its MEMOIZE), as its bytes: walked over
    /// or compared, a string's UTF-8 need not be checked (the values walked are compared
    /// byte for byte; checking them was most of the walk's time).
    fn string(&mut self) -> Option<&'a [u8]> {
        let len = match self.take(1)?[0] {
            0x8c => self.length::<1>()?,
            b'X' => self.length::<4>()?,
            _ => return None,
        };
        let bytes = self.take(len)?;
        self.memoize();
        Some(bytes)
    }

    /// A string that is read: checked to be UTF-8.
    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.string()?).ok()
    }

    /// One value of a known shape, nested at most `nesting` deep.
    fn value(&mut self, nesting: usize) -> Option<()> {
        let opcode = self.peek()?;
        match opcode {
            0x8c | b'X' => {
                self.string()?;
            }
            _ => {
                self.at += 1;
                let argument = match opcode {
                    b'N' | 0x88 | 0x89 => 0,
                    b'K' | b'h' => 1,
                    b'M' => 2,
                    b'J' | b'j' => 4,
                    b'G' => 8,
                    b']' => return self.container(nesting, b'a', b'e', 1),
                    b'}' => return self.container(nesting, b's', b'u', 2),
                    _ => return None,
                };
                self.take(argument)?;
            }
        }
        Some(())
    }

    /// A list (values appended one at a time with `one`, or after a MARK with `many`) or a
    /// dict (key-value pairs: `arity` 2), its EMPTY_* opcode already taken.
    fn container(&mut self, nesting: usize, one: u8, many: u8, arity: usize) -> Option<()> {
        let nesting = nesting.checked_sub(1)?;
        self.memoize();
        loop {
            match self.peek() {
                Some(b'(') => {
                    self.at += 1;
                    while self.peek()? != many {
                        self.value(nesting)?;
                    }
                    self.at += 1;
                }
                // A single item: its values, then `one`. Else no item at all (what was walked
                // is what follows the container), or an item of a shape not known: the
                // container ends here, and whoever reads on finds what is not the next key
                // ([`StructHead::at_field`]).
                Some(_) => {
                    let before = self.at;
                    let single = (0..arity).try_for_each(|_| self.value(nesting)).is_some()
                        && self.peek() == Some(one);
                    if !single {
                        self.at = before;
                        return Some(());
                    }
                    self.at += 1;
                }
                None => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Python 3.11's pickle (protocol 5) writes for a msgspec Struct
    /// `Batch(rids=['a', 'b'], http_worker_ipcs=None, finished_reasons=[None, {'type':
    /// 'length', 'length': 64}], output_strs=['x'])` of module `m`.
    fn batch() -> Vec<u8> {
        let mut p = vec![0x80, 5, 0x95];
        p.extend(0u64.to_le_bytes());
        let s = |p: &mut Vec<u8>, text: &str| {
            p.push(0x8c);
            p.push(text.len() as u8);
            p.extend(text.as_bytes());
            p.push(0x94);
        };
        s(&mut p, "msgspec._utils");
        s(&mut p, "rebuild");
        p.extend([0x93, 0x94]);
        s(&mut p, "m");
        s(&mut p, "Batch");
        p.extend([0x93, 0x94, b'}', 0x94, b'(']);
        s(&mut p, "rids");
        p.extend([b']', 0x94, b'(']);
        s(&mut p, "a");
        s(&mut p, "b");
        p.push(b'e');
        s(&mut p, "http_worker_ipcs");
        p.push(b'N');
        s(&mut p, "finished_reasons");
        p.extend([b']', 0x94, b'(', b'N', b'}', 0x94, b'(']);
        s(&mut p, "type");
        s(&mut p, "length");
        p.extend([b'h', 16, b'K', 64, b'u', b'e']);
        s(&mut p, "output_strs");
        p.extend([b']', 0x94]);
        s(&mut p, "x");
        p.extend([b'a', b'u', 0x86, 0x94, b'R', 0x94, b'.']);
        p
    }

    #[test]
    fn a_structs_leading_fields_are_walked_one_at_a_time() {
        let p = batch();
        let mut head = struct_head(&p).unwrap();
        assert_eq!((head.module, head.class), ("m", "Batch"));
        assert!(head.walked().is_empty());
        assert!(head.field("rids"));
        let after_rids = head.walked().len();
        assert!(!head.field("finished_reasons"), "not the next field");
        assert_eq!(
            head.walked().len(),
            after_rids,
            "a failed walk moves nothing"
        );
        assert!(head.field("http_worker_ipcs"));
        assert!(head.field("finished_reasons"));
        assert!(head.at_field("output_strs") && !head.at_field("rids"));
        assert!(head.field("output_strs"), "a list of one item");
        let walked = head.walked();
        assert!(walked.starts_with(b"\x8c\x04rids\x94]\x94(\x8c\x01a"));
        assert!(walked.ends_with(b"\x8c\x01x\x94a"));
        assert!(!head.field("more"), "the fields end");
    }

    #[test]
    fn a_string_field_is_read() {
        let mut p = batch();
        // rids='a': a string where the list was.
        let start = p.windows(6).position(|w| w == b"rids\x94]").unwrap() + 5;
        let end = p.windows(2).position(|w| w == b"e\x8c").unwrap() + 1;
        p.splice(start..end, [0x8c, 1, b'a', 0x94]);
        let mut head = struct_head(&p).unwrap();
        assert_eq!(head.text("http_worker_ipcs"), None, "not the next field");
        assert_eq!(head.text("rids"), Some("a"));
        assert!(head.at_field("http_worker_ipcs"));
        assert_eq!(head.text("http_worker_ipcs"), None, "None is no string");
        assert!(
            head.at_field("http_worker_ipcs"),
            "a failed read moves nothing"
        );
        // A string read is checked to be UTF-8; one walked over is not.
        let at = p.windows(3).position(|w| w == b"\x8c\x01a").unwrap() + 2;
        p[at] = 0xff;
        assert_eq!(struct_head(&p).unwrap().text("rids"), None);
        assert!(struct_head(&p).unwrap().field("rids"));
    }

    #[test]
    fn an_empty_list_is_followed_by_the_next_key() {
        let mut p = batch();
        // rids=[]: EMPTY_LIST, MEMOIZE, then the next key.
        let start = p.windows(6).position(|w| w == b"rids\x94]").unwrap() + 7;
        let end = p.windows(2).position(|w| w == b"e\x8c").unwrap() + 1;
        p.drain(start..end);
        let mut head = struct_head(&p).unwrap();
        assert!(head.field("rids"));
        assert!(head.field("http_worker_ipcs"));
    }

    #[test]
    fn other_pickles_and_unknown_shapes_are_not_walked() {
        let p = batch();
        // Not a msgspec rebuild.
        let mut other = p.clone();
        let at = other.windows(7).position(|w| w == b"rebuild").unwrap();
        other[at] = b'R';
        assert!(struct_head(&other).is_none());
        // A tuple value (TUPLE1) is a shape the walker does not know.
        let mut tuple = p.clone();
        let at = tuple.windows(2).position(|w| w == b"\x94N").unwrap() + 1;
        tuple.splice(at..at + 1, [b'N', 0x85]);
        let mut head = struct_head(&tuple).unwrap();
        assert!(head.field("rids"));
        assert!(head.field("http_worker_ipcs"));
        assert!(!head.at_field("finished_reasons"), "TUPLE1 is not a key");
        assert!(!head.field("finished_reasons"));
        // An item of a shape not known in a list of one: the list seems to end before it, and
        // what follows is not the next key.
        let mut item = p.clone();
        let at = item.windows(3).position(|w| w == b"(N}").unwrap();
        item.splice(at..at + 2, [b')']);
        item.remove(item.windows(2).position(|w| w == b"ue").unwrap() + 1);
        item.insert(
            item.windows(2).position(|w| w == b"u\x8c").unwrap() + 1,
            b'a',
        );
        let mut head = struct_head(&item).unwrap();
        assert!(head.field("rids") && head.field("http_worker_ipcs"));
        assert!(head.field("finished_reasons"));
        assert!(!head.at_field("output_strs"));
        // Every prefix ends the walk without a panic.
        for end in 0..p.len() {
            if let Some(mut head) = struct_head(&p[..end]) {
                let _ = head.field("rids") && head.field("http_worker_ipcs");
            }
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_not_walked() {
        let mut p = batch();
        // rids = [[[[[]]]]]: five lists deep.
        let start = p.windows(6).position(|w| w == b"rids\x94]").unwrap() + 5;
        let end = p.windows(2).position(|w| w == b"e\x8c").unwrap() + 1;
        let mut nested = vec![b']', 0x94];
        for _ in 0..4 {
            nested = [vec![b']', 0x94], nested, vec![b'a']].concat();
        }
        p.splice(start..end, nested);
        let mut head = struct_head(&p).unwrap();
        assert!(head.field("rids"), "the outermost list seems to end early");
        assert!(!head.at_field("http_worker_ipcs"));
    }
}
