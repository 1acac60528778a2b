//! A restricted pickle decoder: it builds plain values and records class and function names,
//! and never imports or calls anything.
//!
//! SGLang's processes exchange pickled request and output objects over ZeroMQ (protocol 5 by
//! default). Python's own unpickler would execute what the stream names; this one only reads:
//! `GLOBAL`/`STACK_GLOBAL` become [`PyValue::Global`] (a name), `REDUCE`/`NEWOBJ`/`OBJ`/`INST`
//! become [`PyValue::Object`] (the callable or class, its arguments, and the state `BUILD`
//! gave it), so a dataclass, a msgspec struct (`msgspec._utils.rebuild(cls, fields)`) or a
//! `copyreg` reconstruction all come out as data that
//! [`PyRead::instance`](super::pyread::PyRead::instance) reads.
//!
//! Two ways out: [`loads`] builds the value, [`parse`] leaves the decoder's nodes to be read in
//! place ([`PyRef`]), which is what SGLang's decoder does with every message (it reads a few
//! of a batch's dozens of columns).
//!
//! Protocols 0 to 5: framing, the memo (shared and even self-referencing values, kept in an
//! arena so that later mutation is seen through every reference), out-of-band buffers (given by
//! the caller, or left as [`PyValue::Buffer`] placeholders). Hostile input fails the message
//! with an error, never the agent: every length is checked against the bytes left, nodes and
//! the expanded result are bounded, and `PERSID`/`EXT*` (which need the sender's tables) are
//! refused.
use std::{collections::HashMap, sync::Arc};

/// Nodes one message may create (each pickle opcode makes at most one).
const MAX_NODES: usize = 4 << 20;
/// Bytes the expanded result may take: each value its own size plus its text or bytes, counted
/// each time a shared reference repeats it (so a small pickle cannot expand into an
/// exponential tree, nor a big string memoized once into a thousand copies). SGLang's largest
/// messages expand to well under 1 MiB.
const MAX_EXPANDED_BYTES: usize = 16 << 20;
/// What one expanded value costs before its payload.
const VALUE_BYTES: usize = std::mem::size_of::<PyValue>();
/// Nesting of the expanded result; deeper (or cyclic) values are cut with an error.
const MAX_DEPTH: usize = 128;
/// Value ids: a node's index (below `MAX_NODES`), or a scalar that needs no node, tagged in the
/// top two bits: a 32-bit int in the low bits, a float's index in [`Tree::floats`], or None,
/// False or True ([`CONSTANTS`]). The BININT, BINFLOAT, NONE and bool opcodes (token ids,
/// counts, flags and time stamps: most of an SGLang batch's values) cost a stack slot that
/// way, not a 32-byte node each.
const TAG: usize = 0b11 << 62;
const INT: usize = 0b10 << 62;
const FLOAT: usize = 0b01 << 62;
const CONSTANT: usize = 0b11 << 62;
const _: () = assert!(usize::BITS == 64 && MAX_NODES & TAG == 0);
static CONSTANTS: [PyValue; 3] = [PyValue::None, PyValue::Bool(false), PyValue::Bool(true)];
const NONE_ID: usize = CONSTANT;
const FALSE_ID: usize = CONSTANT | 1;
const TRUE_ID: usize = CONSTANT | 2;

/// A scalar carried in a value id (see [`TAG`]).
enum Inline {
    Int(i64),
    /// Its index in [`Tree::floats`].
    Float(usize),
    Constant(&'static PyValue),
}

/// What an id carries, if it is no node's.
fn inline(id: usize) -> Option<Inline> {
    match id & TAG {
        0 => None,
        INT => Some(Inline::Int(i64::from(id as u32 as i32))),
        FLOAT => Some(Inline::Float(id & !TAG)),
        _ => CONSTANTS.get(id & !TAG).map(Inline::Constant),
    }
}

const NOT_A_LIST: &str = "APPEND to a non-list";
const NOT_A_DICT: &str = "SETITEM on a non-dict";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PickleError {
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown opcode 0x{0:02x} at byte {1}")]
    UnknownOpcode(u8, usize),
    #[error("{0} is not supported (it needs the sender's tables)")]
    Unsupported(&'static str),
    #[error("malformed: {0} (byte {1})")]
    Malformed(&'static str, usize),
    #[error("too large: {0}")]
    TooLarge(&'static str),
    #[error("nested deeper than {MAX_DEPTH} levels (or a cycle)")]
    TooDeep,
}

/// A decoded Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i64),
    /// An int beyond i64: little-endian two's complement bytes, as pickle stores it.
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
    Set(Vec<PyValue>),
    /// A module attribute named by the stream (a class or a function), not imported. Shared:
    /// a pickle names a class once and refers to it again for every instance (an SGLang
    /// batch's arrays and time stats, per request), and each reference is a copy.
    Global(Arc<PyGlobal>),
    /// What the stream would have built by calling a callable or a class: nothing was called.
    Object(Box<PyObject>),
    /// An out-of-band buffer (protocol 5) the caller did not supply.
    Buffer(usize),
}

// The rare variants are boxed so that a value (most are ints and strings, by the thousand in
// an SGLang batch) takes 32 bytes, not 80: the decoder's time went into moving them.
const _: () = assert!(std::mem::size_of::<PyValue>() <= 32);

/// A module attribute: `module.name`.
#[derive(Clone, Debug, PartialEq)]
pub struct PyGlobal {
    pub module: String,
    pub name: String,
}

/// `callable(*args)` (REDUCE, OBJ, INST) or `cls.__new__(cls, *args)` (NEWOBJ), as data.
#[derive(Clone, Debug, PartialEq)]
pub struct PyObject {
    pub callable: PyValue,
    pub args: PyValue,
    /// `BUILD`'s state (usually the instance `__dict__`, or `(dict, slots)`).
    pub state: Option<PyValue>,
    /// Items a list or dict subclass received (APPEND(S), SETITEM(S)).
    pub items: Vec<PyValue>,
    pub entries: Vec<(PyValue, PyValue)>,
}

impl PyValue {
    pub fn global(module: impl Into<String>, name: impl Into<String>) -> Self {
        PyValue::Global(Arc::new(PyGlobal {
            module: module.into(),
            name: name.into(),
        }))
    }

    /// Elements of a list or tuple.
    pub fn as_seq(&self) -> Option<&[PyValue]> {
        match self {
            PyValue::List(v) | PyValue::Tuple(v) => Some(v),
            _ => None,
        }
    }
}

/// Arena node: containers refer to other nodes by index, so that a memoized value mutated
/// later (the usual EMPTY_LIST, MEMOIZE, MARK, ..., APPENDS) is seen by every reference.
#[derive(Debug)]
enum Node<'a> {
    Leaf(PyValue),
    /// A string's UTF-8 or bytes, where they lie in the pickle: copied only when [`loads`]
    /// builds the value (a [`PyRef`] reads them there). A string's UTF-8 is checked when it is
    /// read as one (most of an SGLang batch's strings never are; a key is matched by its
    /// bytes), so one bad string fails only what reads it.
    Text(&'a [u8]),
    Bytes(&'a [u8]),
    /// Containers: their children's node ids lie in [`Tree::items`] (dicts: key and value
    /// ids in [`Tree::pairs`]).
    List(Seq),
    Tuple(Seq),
    Dict(Seq),
    Set(Seq),
    Object(Box<ObjectNode>),
}

/// Where a container's children lie in their arena: `len` of them from `start`, in room for
/// `cap`.
#[derive(Clone, Copy, Debug, Default)]
struct Seq {
    start: usize,
    len: usize,
    cap: usize,
}

impl Seq {
    /// A new container's children, put at the end of `arena`.
    fn new<T>(arena: &mut Vec<T>, children: impl Iterator<Item = T>) -> Seq {
        let start = arena.len();
        arena.extend(children);
        let len = arena.len() - start;
        Seq {
            start,
            len,
            cap: len,
        }
    }

    fn of<T>(self, arena: &[T]) -> &[T] {
        &arena[self.start..self.start + self.len]
    }

    /// Add `children` after the container's others: in place while there is room, else
    /// moved to the end of `arena` with room for as many again, so that a pickle appending to
    /// containers in turn copies each child a bounded number of times.
    fn extend<T: Copy + Default>(
        &mut self,
        arena: &mut Vec<T>,
        children: impl ExactSizeIterator<Item = T>,
    ) {
        let needed = self.len + children.len();
        if needed > self.cap {
            if self.start + self.cap == arena.len() {
                // The last block in the arena grows where it is.
                self.cap = needed;
            } else {
                let start = arena.len();
                arena.extend_from_within(self.start..self.start + self.len);
                self.start = start;
                self.cap = needed.max(self.cap * 2);
            }
            arena.resize(self.start + self.cap, T::default());
        }
        let at = self.start + self.len;
        for (slot, child) in arena[at..needed + self.start].iter_mut().zip(children) {
            *slot = child;
        }
        self.len = needed;
    }
}

/// A pickle's values: its nodes, and its containers' children in two arenas shared by all
/// (an SGLang batch has a non-empty list or dict per request and column: one allocation each
/// when they had their own).
#[derive(Debug)]
struct Tree<'a> {
    nodes: Vec<Node<'a>>,
    /// The floats that ids carry (see [`TAG`]); no more than the pickle has BINFLOATs (nine
    /// bytes each).
    floats: Vec<f64>,
    items: Vec<usize>,
    pairs: Vec<(usize, usize)>,
}

/// An object's parts, as nodes.
#[derive(Debug)]
struct ObjectNode {
    callable: usize,
    args: usize,
    state: Option<usize>,
    /// Children of a list or dict subclass, in [`Tree::items`] and [`Tree::pairs`].
    items: Seq,
    entries: Seq,
}

impl Node<'_> {
    /// The string the node holds, if it is one (and valid UTF-8).
    fn text(&self) -> Option<&str> {
        match self {
            Node::Text(utf8) => std::str::from_utf8(utf8).ok(),
            Node::Leaf(PyValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The UTF-8 of the string the node holds, unchecked, if it is one.
    fn text_bytes(&self) -> Option<&[u8]> {
        match self {
            Node::Text(utf8) => Some(utf8),
            Node::Leaf(PyValue::Str(s)) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// APPEND(S): items into a list, a set or a list subclass.
    fn append(
        &mut self,
        arena: &mut Vec<usize>,
        ids: impl ExactSizeIterator<Item = usize>,
        at: usize,
    ) -> Result<(), PickleError> {
        match self {
            Node::List(seq) | Node::Set(seq) => seq.extend(arena, ids),
            Node::Object(object) => object.items.extend(arena, ids),
            _ => return Err(PickleError::Malformed(NOT_A_LIST, at)),
        }
        Ok(())
    }

    /// SETITEM(S): entries into a dict or a dict subclass.
    fn set_items(
        &mut self,
        arena: &mut Vec<(usize, usize)>,
        pairs: impl ExactSizeIterator<Item = (usize, usize)>,
        at: usize,
    ) -> Result<(), PickleError> {
        match self {
            Node::Dict(seq) => seq.extend(arena, pairs),
            Node::Object(object) => object.entries.extend(arena, pairs),
            _ => return Err(PickleError::Malformed(NOT_A_DICT, at)),
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Value(usize),
}

impl Slot {
    /// The node of a slot above the topmost MARK (where there are only values).
    fn id(&self) -> usize {
        match self {
            Slot::Value(id) => *id,
            Slot::Mark => unreachable!("no MARK above the topmost one"),
        }
    }
}

struct Machine<'a> {
    data: &'a [u8],
    at: usize,
    tree: Tree<'a>,
    stack: Vec<Slot>,
    /// PUT/MEMOIZE key -> node. Python's pickler numbers memo entries 0, 1, 2, ..., so they
    /// are kept in a vector; a key out of that order (another pickler) goes to the map.
    memo: Vec<usize>,
    memo_elsewhere: HashMap<u64, usize>,
    buffers: &'a [Vec<u8>],
    next_buffer: usize,
}

/// Decode one pickle. `buffers` are the out-of-band buffers sent next to it (protocol 5).
pub fn loads(data: &[u8], buffers: &[Vec<u8>]) -> Result<PyValue, PickleError> {
    loads_within(data, buffers, MAX_EXPANDED_BYTES)
}

/// Decode one pickle into its nodes, to be read in place ([`Pickle::root`]): nothing is
/// copied out of it but what the reader takes. An SGLang batch carries dozens of per-request
/// columns (texts, logprobs) of which the agent reads a few, and building them was a quarter
/// of its CPU. The nodes are bounded as [`loads`]' are; reading follows references without
/// expanding them, so sharing costs nothing and a cycle only as far as the reader walks it.
pub fn parse<'a>(data: &'a [u8], buffers: &'a [Vec<u8>]) -> Result<Pickle<'a>, PickleError> {
    parse_with(&mut Scratch::default(), data, buffers)
}

/// [`parse`], in the buffers a previous parse gave back ([`Pickle::recycle`]): a decoder that
/// parses message after message (SGLang's, a few each step) allocated and freed them for
/// each, 3-4 % of the agent's CPU on a live SGLang load.
pub fn parse_with<'a>(
    scratch: &mut Scratch,
    data: &'a [u8],
    buffers: &'a [Vec<u8>],
) -> Result<Pickle<'a>, PickleError> {
    let mut m = Machine::new(data, buffers, std::mem::take(scratch));
    let top = m.run();
    scratch.stack = kept(std::mem::take(&mut m.stack));
    scratch.memo = kept(std::mem::take(&mut m.memo));
    match top {
        Ok(top) => Ok(Pickle {
            data,
            tree: m.tree,
            top,
        }),
        Err(e) => {
            scratch.keep(m.tree);
            Err(e)
        }
    }
}

/// A parse's buffers, kept empty between parses ([`parse_with`]).
#[derive(Default)]
pub struct Scratch {
    nodes: Vec<Node<'static>>,
    floats: Vec<f64>,
    items: Vec<usize>,
    pairs: Vec<(usize, usize)>,
    stack: Vec<Slot>,
    memo: Vec<usize>,
}

/// A buffer of more than this (bytes) is not kept: one huge message does not pin its memory.
/// SGLang's messages of a few kilobytes take a few tens in all.
const MAX_KEPT_BYTES: usize = 256 << 10;

impl Scratch {
    /// Keep a finished tree's buffers, emptied, for the next parse.
    fn keep(&mut self, tree: Tree<'_>) {
        self.nodes = unborrowed(kept(tree.nodes));
        self.floats = kept(tree.floats);
        self.items = kept(tree.items);
        self.pairs = kept(tree.pairs);
    }
}

/// The buffer, emptied, or none when it is too large to keep ([`MAX_KEPT_BYTES`]).
fn kept<T>(mut v: Vec<T>) -> Vec<T> {
    if v.capacity().saturating_mul(std::mem::size_of::<T>()) > MAX_KEPT_BYTES {
        return Vec::new();
    }
    v.clear();
    v
}

fn with<T>(mut v: Vec<T>, room: usize) -> Vec<T> {
    v.reserve(room);
    v
}

/// The vector's allocation, emptied, for nodes of any lifetime: the standard library collects
/// a vector's own iterator into a vector of the same layout in place, so nothing is allocated.
fn unborrowed<'b>(mut nodes: Vec<Node<'_>>) -> Vec<Node<'b>> {
    nodes.clear();
    nodes
        .into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

/// A decoded pickle's nodes (see [`parse`]).
pub struct Pickle<'a> {
    /// The pickle's bytes, which its strings lie in.
    data: &'a [u8],
    tree: Tree<'a>,
    top: usize,
}

impl Pickle<'_> {
    /// Give the pickle's buffers back, for the next [`parse_with`].
    pub fn recycle(self, scratch: &mut Scratch) {
        scratch.keep(self.tree);
    }

    /// The value the pickle makes.
    pub fn root(&self) -> PyRef<'_> {
        PyRef {
            tree: &self.tree,
            id: self.top,
        }
    }

    /// The value of node `id`. Each value is paid for from `budget` before it is built (the
    /// root by the caller): the result's size is bounded, whatever the sharing in the pickle.
    fn expand(&self, id: usize, depth: usize, budget: &mut usize) -> Result<PyValue, PickleError> {
        if depth > MAX_DEPTH {
            return Err(PickleError::TooDeep);
        }
        let tree = &self.tree;
        let Some(node) = tree.nodes.get(id) else {
            // A scalar (its size is charged with it).
            let value = match inline(id) {
                Some(Inline::Int(i)) => Some(PyValue::Int(i)),
                Some(Inline::Float(i)) => tree.floats.get(i).copied().map(PyValue::Float),
                Some(Inline::Constant(v)) => Some(v.clone()),
                None => None,
            };
            return value.ok_or(PickleError::Malformed("value id of no value", 0));
        };
        Ok(match node {
            Node::Leaf(v) => {
                charge(budget, payload_len(v))?;
                v.clone()
            }
            Node::Text(utf8) => {
                charge(budget, utf8.len())?;
                let at = utf8.as_ptr().addr().wrapping_sub(self.data.as_ptr().addr());
                let text = std::str::from_utf8(utf8)
                    .map_err(|_| PickleError::Malformed("invalid UTF-8", at))?;
                PyValue::Str(text.to_owned())
            }
            Node::Bytes(bytes) => {
                charge(budget, bytes.len())?;
                PyValue::Bytes(bytes.to_vec())
            }
            Node::List(seq) => {
                PyValue::List(self.expand_all(seq.of(&tree.items), depth, budget)?)
            }
            Node::Tuple(seq) => {
                PyValue::Tuple(self.expand_all(seq.of(&tree.items), depth, budget)?)
            }
            Node::Set(seq) => PyValue::Set(self.expand_all(seq.of(&tree.items), depth, budget)?),
            Node::Dict(seq) => {
                PyValue::Dict(self.expand_pairs(seq.of(&tree.pairs), depth, budget)?)
            }
            Node::Object(object) => {
                let parts = 2 + usize::from(object.state.is_some());
                charge_values(budget, parts, std::mem::size_of::<PyObject>())?;
                PyValue::Object(Box::new(PyObject {
                    callable: self.expand(object.callable, depth + 1, budget)?,
                    args: self.expand(object.args, depth + 1, budget)?,
                    state: match object.state {
                        Some(s) => Some(self.expand(s, depth + 1, budget)?),
                        None => None,
                    },
                    items: self.expand_all(object.items.of(&tree.items), depth, budget)?,
                    entries: self.expand_pairs(object.entries.of(&tree.pairs), depth, budget)?,
                }))
            }
        })
    }

    /// The values of nodes `ids`, children of a value at `depth`.
    fn expand_all(
        &self,
        ids: &[usize],
        depth: usize,
        budget: &mut usize,
    ) -> Result<Vec<PyValue>, PickleError> {
        charge_values(budget, ids.len(), 0)?;
        let mut values = Vec::with_capacity(ids.len());
        for &id in ids {
            values.push(self.expand(id, depth + 1, budget)?);
        }
        Ok(values)
    }

    /// The (key, value) pairs of nodes `ids`, children of a value at `depth`.
    fn expand_pairs(
        &self,
        ids: &[(usize, usize)],
        depth: usize,
        budget: &mut usize,
    ) -> Result<Vec<(PyValue, PyValue)>, PickleError> {
        charge_values(budget, ids.len().saturating_mul(2), 0)?;
        let mut values = Vec::with_capacity(ids.len());
        for &(k, v) in ids {
            let key = self.expand(k, depth + 1, budget)?;
            values.push((key, self.expand(v, depth + 1, budget)?));
        }
        Ok(values)
    }
}

/// One value of a [`Pickle`], read with [`PyRead`](super::pyread::PyRead).
#[derive(Clone, Copy)]
pub struct PyRef<'p> {
    tree: &'p Tree<'p>,
    id: usize,
}

impl<'p> PyRef<'p> {
    /// Another node of the same pickle.
    pub(super) fn at(self, id: usize) -> Self {
        Self { id, ..self }
    }

    /// The value's node: None for a scalar carried in its id.
    fn node(self) -> Option<&'p Node<'p>> {
        self.tree.nodes.get(self.id)
    }

    /// A scalar kept in a node, or a constant (None, a bool) in its id.
    pub(super) fn leaf(self) -> Option<&'p PyValue> {
        match self.node() {
            Some(Node::Leaf(v)) => Some(v),
            None => match inline(self.id)? {
                Inline::Constant(v) => Some(v),
                _ => None,
            },
            _ => None,
        }
    }

    /// An int kept in its id, not in a node.
    pub(super) fn inline_int(self) -> Option<i64> {
        match inline(self.id)? {
            Inline::Int(i) => Some(i),
            _ => None,
        }
    }

    /// A float kept in the floats its id indexes, not in a node.
    pub(super) fn inline_float(self) -> Option<f64> {
        match inline(self.id)? {
            Inline::Float(i) => self.tree.floats.get(i).copied(),
            _ => None,
        }
    }

    pub(super) fn text(self) -> Option<&'p str> {
        self.node()?.text()
    }

    /// Whether the value is the string `key` (compared as UTF-8, which needs no check).
    pub(super) fn is_text(self, key: &str) -> bool {
        self.node()
            .and_then(Node::text_bytes)
            .is_some_and(|utf8| utf8 == key.as_bytes())
    }

    pub(super) fn byte_string(self) -> Option<&'p [u8]> {
        match self.node()? {
            Node::Bytes(b) => Some(b),
            Node::Leaf(PyValue::Bytes(b)) => Some(b),
            _ => None,
        }
    }

    /// A list's or tuple's element nodes.
    pub(super) fn sequence(self) -> Option<&'p [usize]> {
        match self.node()? {
            Node::List(seq) | Node::Tuple(seq) => Some(seq.of(&self.tree.items)),
            _ => None,
        }
    }

    pub(super) fn is_tuple_node(self) -> bool {
        matches!(self.node(), Some(Node::Tuple(_)))
    }

    /// A dict's (key, value) nodes.
    pub(super) fn dict(self) -> Option<&'p [(usize, usize)]> {
        match self.node()? {
            Node::Dict(seq) => Some(seq.of(&self.tree.pairs)),
            _ => None,
        }
    }

    pub(super) fn object_parts(self) -> Option<(Self, Self, Option<Self>)> {
        match self.node()? {
            Node::Object(o) => Some((
                self.at(o.callable),
                self.at(o.args),
                o.state.map(|s| self.at(s)),
            )),
            _ => None,
        }
    }
}

fn loads_within(
    data: &[u8],
    buffers: &[Vec<u8>],
    max_expanded: usize,
) -> Result<PyValue, PickleError> {
    let pickle = parse(data, buffers)?;
    let mut budget = max_expanded;
    charge_values(&mut budget, 1, 0)?;
    pickle.expand(pickle.top, 0, &mut budget)
}

/// Take `values` values' worth of bytes (plus `payload`) from what the expanded result may
/// still take: charged before anything is allocated for them, so that a small pickle cannot
/// expand into an exponential tree, nor a big string memoized once into a thousand copies.
fn charge_values(budget: &mut usize, values: usize, payload: usize) -> Result<(), PickleError> {
    charge(
        budget,
        values.saturating_mul(VALUE_BYTES).saturating_add(payload),
    )
}

fn charge(budget: &mut usize, bytes: usize) -> Result<(), PickleError> {
    *budget = budget
        .checked_sub(bytes)
        .ok_or(PickleError::TooLarge("expanded result"))?;
    Ok(())
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8], buffers: &'a [Vec<u8>], scratch: Scratch) -> Self {
        // Sized for SGLang's batches (a node per 6 bytes, a memo entry per 16), so that they
        // are not copied as they grow (5-7 % of the decoding time); buffers kept from an
        // earlier parse are most often large enough already.
        Machine {
            data,
            at: 0,
            tree: Tree {
                nodes: with(unborrowed(scratch.nodes), data.len() / 4),
                floats: with(scratch.floats, data.len() / 16),
                items: with(scratch.items, data.len() / 8),
                pairs: with(scratch.pairs, data.len() / 32),
            },
            stack: with(scratch.stack, 64),
            memo: with(scratch.memo, data.len() / 8),
            memo_elsewhere: HashMap::new(),
            buffers,
            next_buffer: 0,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(PickleError::Truncated(self.data.len()))?;
        let data = self.data;
        let bytes = &data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A length field of `N` bytes, checked against what is left.
    fn len<const N: usize>(&mut self) -> Result<usize, PickleError> {
        let mut wide = [0u8; 8];
        wide[..N].copy_from_slice(&self.le::<N>()?);
        let n = u64::from_le_bytes(wide);
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.data.len() - self.at)
            .ok_or(PickleError::Truncated(self.data.len()))
    }

    /// A text line (protocol 0 arguments), without its newline.
    fn line(&mut self) -> Result<&[u8], PickleError> {
        let rest = &self.data[self.at..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(PickleError::Truncated(self.data.len()))?;
        self.at += n + 1;
        Ok(&rest[..n])
    }

    fn node(&mut self, node: Node<'a>) -> Result<usize, PickleError> {
        let nodes = &mut self.tree.nodes;
        if nodes.len() >= MAX_NODES {
            return Err(PickleError::TooLarge("too many values"));
        }
        nodes.push(node);
        Ok(nodes.len() - 1)
    }

    fn push(&mut self, node: Node<'a>) -> Result<(), PickleError> {
        let id = self.node(node)?;
        self.stack.push(Slot::Value(id));
        Ok(())
    }

    fn leaf(&mut self, v: PyValue) -> Result<(), PickleError> {
        self.push(Node::Leaf(v))
    }

    /// A scalar carried in its id (see [`TAG`]).
    fn inline(&mut self, id: usize) {
        self.stack.push(Slot::Value(id));
    }

    fn int(&mut self, v: i32) {
        self.inline(INT | v as u32 as usize);
    }

    fn float(&mut self, v: f64) {
        self.inline(FLOAT | self.tree.floats.len());
        self.tree.floats.push(v);
    }

    fn pop(&mut self) -> Result<usize, PickleError> {
        match self.stack.pop() {
            Some(Slot::Value(id)) => Ok(id),
            Some(Slot::Mark) => Err(PickleError::Malformed("unexpected MARK", self.at)),
            None => Err(PickleError::Malformed("stack underflow", self.at)),
        }
    }

    fn top(&self) -> Result<usize, PickleError> {
        match self.stack.last() {
            Some(Slot::Value(id)) => Ok(*id),
            _ => Err(PickleError::Malformed("no value on the stack", self.at)),
        }
    }

    /// Where the topmost MARK is on the stack.
    fn mark(&self) -> Result<usize, PickleError> {
        self.stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or(PickleError::Malformed("no MARK", self.at))
    }

    /// Everything above the topmost MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Seq, PickleError> {
        let mark = self.mark()?;
        let ids = self.stack[mark + 1..].iter().map(Slot::id);
        let items = Seq::new(&mut self.tree.items, ids);
        self.stack.truncate(mark);
        Ok(items)
    }

    /// APPENDS (`as_pairs` false) and SETITEMS (true): everything above the topmost MARK goes
    /// into the container below it, with no list of its own in between (an SGLang batch is
    /// mostly such lists).
    fn extend_from_mark(&mut self, as_pairs: bool) -> Result<(), PickleError> {
        let at = self.at;
        let mark = self.mark()?;
        let Some(&Slot::Value(target)) = mark.checked_sub(1).and_then(|i| self.stack.get(i)) else {
            return Err(PickleError::Malformed("no value on the stack", at));
        };
        let added = &self.stack[mark + 1..];
        let Tree {
            nodes,
            items,
            pairs,
            ..
        } = &mut self.tree;
        let target = target_node(nodes, target, as_pairs, at)?;
        if as_pairs {
            if !added.len().is_multiple_of(2) {
                return Err(PickleError::Malformed("odd number of dict items", at));
            }
            let added = added.chunks_exact(2).map(|p| (p[0].id(), p[1].id()));
            target.set_items(pairs, added, at)?;
        } else {
            target.append(items, added.iter().map(Slot::id), at)?;
        }
        self.stack.truncate(mark);
        Ok(())
    }

    fn text(&self, bytes: &[u8]) -> Result<String, PickleError> {
        String::from_utf8(bytes.to_vec())
            .map_err(|_| PickleError::Malformed("invalid UTF-8", self.at))
    }

    /// Everything above the topmost MARK (which is removed), alternating keys and values, as
    /// a new dict's entries.
    fn pop_mark_pairs(&mut self) -> Result<Seq, PickleError> {
        let mark = self.mark()?;
        let flat = &self.stack[mark + 1..];
        if !flat.len().is_multiple_of(2) {
            return Err(PickleError::Malformed("odd number of dict items", self.at));
        }
        let pairs = flat.chunks_exact(2).map(|p| (p[0].id(), p[1].id()));
        let entries = Seq::new(&mut self.tree.pairs, pairs);
        self.stack.truncate(mark);
        Ok(entries)
    }

    fn object(
        &mut self,
        callable: usize,
        args: usize,
        state: Option<usize>,
    ) -> Result<(), PickleError> {
        self.push(Node::Object(Box::new(ObjectNode {
            callable,
            args,
            state,
            items: Seq::default(),
            entries: Seq::default(),
        })))
    }

    fn global(&mut self, module: String, name: String) -> Result<(), PickleError> {
        self.leaf(PyValue::global(module, name))
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let id = self.top()?;
        if self.memo_len() >= MAX_NODES {
            return Err(PickleError::TooLarge("memo"));
        }
        match usize::try_from(key) {
            Ok(k) if k < self.memo.len() => self.memo[k] = id,
            Ok(k) if k == self.memo.len() => self.memo.push(id),
            _ => {
                self.memo_elsewhere.insert(key, id);
            }
        }
        Ok(())
    }

    fn memo_len(&self) -> usize {
        self.memo.len() + self.memo_elsewhere.len()
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let in_order = usize::try_from(key).ok().and_then(|k| self.memo.get(k));
        let id = *in_order
            .or_else(|| self.memo_elsewhere.get(&key))
            .ok_or(PickleError::Malformed("memo key not found", self.at))?;
        self.stack.push(Slot::Value(id));
        Ok(())
    }

    /// Runs the opcodes up to STOP; returns the top value.
    fn run(&mut self) -> Result<usize, PickleError> {
        loop {
            let at = self.at;
            let op = self.u8()?;
            match op {
                b'.' => return self.pop(),
                0x80 => {
                    // PROTO: any version up to 5 is read the same way.
                    if self.u8()? > 5 {
                        return Err(PickleError::Malformed("protocol above 5", at));
                    }
                }
                0x95 => {
                    // FRAME: a length prefix for buffering; the opcodes continue inline.
                    self.le::<8>()?;
                }
                b'(' => self.stack.push(Slot::Mark),
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or(PickleError::Malformed("stack underflow", at))?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let id = self.top()?;
                    self.stack.push(Slot::Value(id));
                }
                b'N' => self.inline(NONE_ID),
                0x88 => self.inline(TRUE_ID),
                0x89 => self.inline(FALSE_ID),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.int(v)
                }
                b'K' => {
                    let v = self.u8()?;
                    self.int(v.into())
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.int(v.into())
                }
                0x8a => {
                    let n = self.len::<1>()?;
                    let bytes = self.take(n)?.to_vec();
                    self.leaf(long(bytes))?
                }
                0x8b => {
                    let n = self.len::<4>()?;
                    let bytes = self.take(n)?.to_vec();
                    self.leaf(long(bytes))?
                }
                b'I' => {
                    let line = self.line()?.to_vec();
                    let v = match line.as_slice() {
                        b"00" => PyValue::Bool(false),
                        b"01" => PyValue::Bool(true),
                        text => text_int(text).ok_or(PickleError::Malformed("INT", at))?,
                    };
                    self.leaf(v)?
                }
                b'L' => {
                    let line = self.line()?.to_vec();
                    let text = line.strip_suffix(b"L").unwrap_or(&line);
                    let v = text_int(text).ok_or(PickleError::Malformed("LONG", at))?;
                    self.leaf(v)?
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.float(v)
                }
                b'F' => {
                    let line = self.line()?;
                    let v = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or(PickleError::Malformed("FLOAT", at))?;
                    self.leaf(PyValue::Float(v))?
                }
                // Unicode strings.
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'X' => self.len::<4>()?,
                        0x8c => self.len::<1>()?,
                        _ => self.len::<8>()?,
                    };
                    let utf8 = self.take(n)?;
                    self.push(Node::Text(utf8))?
                }
                b'V' => {
                    let line = self.line()?.to_vec();
                    let s =
                        raw_unicode_escape(&line).ok_or(PickleError::Malformed("UNICODE", at))?;
                    self.leaf(PyValue::Str(s))?
                }
                // Byte strings (Python 2 str in protocols 0-2 reads as bytes).
                b'B' | b'C' | 0x8e | b'T' | b'U' | 0x96 => {
                    let n = match op {
                        b'B' | b'T' => self.len::<4>()?,
                        b'C' | b'U' => self.len::<1>()?,
                        _ => self.len::<8>()?,
                    };
                    let bytes = self.take(n)?;
                    self.push(Node::Bytes(bytes))?
                }
                b'S' => {
                    let line = self.line()?.to_vec();
                    let quoted = line
                        .strip_prefix(b"'")
                        .and_then(|l| l.strip_suffix(b"'"))
                        .or_else(|| line.strip_prefix(b"\"").and_then(|l| l.strip_suffix(b"\"")))
                        .ok_or(PickleError::Malformed("STRING", at))?;
                    self.leaf(PyValue::Bytes(quoted.to_vec()))?
                }
                0x97 => {
                    let index = self.next_buffer;
                    self.next_buffer += 1;
                    let v = match self.buffers.get(index) {
                        Some(b) => PyValue::Bytes(b.clone()),
                        None => PyValue::Buffer(index),
                    };
                    self.leaf(v)?
                }
                0x98 => {
                    // READONLY_BUFFER: no change to a decoded value.
                    self.top()?;
                }
                b']' => self.push(Node::List(Seq::default()))?,
                b')' => self.push(Node::Tuple(Seq::default()))?,
                b'}' => self.push(Node::Dict(Seq::default()))?,
                0x8f => self.push(Node::Set(Seq::default()))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Node::List(items))?
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items))?
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    // The errors `pop` would give, popping them one by one.
                    for i in 1..=n {
                        match self.stack.len().checked_sub(i).map(|j| self.stack[j]) {
                            Some(Slot::Value(_)) => {}
                            Some(Slot::Mark) => {
                                return Err(PickleError::Malformed("unexpected MARK", self.at));
                            }
                            None => return Err(PickleError::Malformed("stack underflow", self.at)),
                        }
                    }
                    let first = self.stack.len() - n;
                    let ids = self.stack[first..].iter().map(Slot::id);
                    let items = Seq::new(&mut self.tree.items, ids);
                    self.stack.truncate(first);
                    self.push(Node::Tuple(items))?
                }
                b'd' => {
                    let pairs = self.pop_mark_pairs()?;
                    self.push(Node::Dict(pairs))?
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Node::Set(items))?
                }
                b'a' => {
                    let item = self.pop()?;
                    let list = self.top()?;
                    let Tree { nodes, items, .. } = &mut self.tree;
                    target_node(nodes, list, false, at)?.append(items, std::iter::once(item), at)?
                }
                b'e' | 0x90 => self.extend_from_mark(false)?,
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let dict = self.top()?;
                    let Tree { nodes, pairs, .. } = &mut self.tree;
                    target_node(nodes, dict, true, at)?.set_items(
                        pairs,
                        std::iter::once((key, value)),
                        at,
                    )?
                }
                b'u' => self.extend_from_mark(true)?,
                b'c' => {
                    let module = self.line()?.to_vec();
                    let name = self.line()?.to_vec();
                    let (module, name) = (self.text(&module)?, self.text(&name)?);
                    self.global(module, name)?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let text = |m: &Self, id: usize| {
                        m.tree
                            .nodes
                            .get(id)
                            .and_then(Node::text)
                            .map(str::to_owned)
                            .ok_or(PickleError::Malformed("STACK_GLOBAL of non-strings", at))
                    };
                    let (module, name) = (text(self, module)?, text(self, name)?);
                    self.global(module, name)?
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    self.object(callable, args, None)?
                }
                0x92 => {
                    // NEWOBJ_EX: cls, args, kwargs; kwargs are kept as the state.
                    let kwargs = self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    self.object(cls, args, Some(kwargs))?
                }
                b'o' => {
                    let mut items = self.pop_mark()?;
                    if items.len == 0 {
                        return Err(PickleError::Malformed("OBJ without a class", at));
                    }
                    let cls = self.tree.items[items.start];
                    (items.start, items.len, items.cap) =
                        (items.start + 1, items.len - 1, items.cap - 1);
                    let args = self.node(Node::Tuple(items))?;
                    self.object(cls, args, None)?
                }
                b'i' => {
                    let module = self.line()?.to_vec();
                    let name = self.line()?.to_vec();
                    let (module, name) = (self.text(&module)?, self.text(&name)?);
                    let items = self.pop_mark()?;
                    let cls = self.node(Node::Leaf(PyValue::global(module, name)))?;
                    let args = self.node(Node::Tuple(items))?;
                    self.object(cls, args, None)?
                }
                b'b' => {
                    let new_state = self.pop()?;
                    let target = self.top()?;
                    match self.tree.nodes.get_mut(target) {
                        Some(Node::Object(object)) => object.state = Some(new_state),
                        _ => return Err(PickleError::Malformed("BUILD on a non-object", at)),
                    }
                }
                b'p' => {
                    let line = self.line()?;
                    let key = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or(PickleError::Malformed("PUT", at))?;
                    self.memo_put(key)?
                }
                b'q' => {
                    let key = self.u8()?.into();
                    self.memo_put(key)?
                }
                b'r' => {
                    let key = u32::from_le_bytes(self.le()?).into();
                    self.memo_put(key)?
                }
                0x94 => {
                    let key = self.memo_len() as u64;
                    self.memo_put(key)?
                }
                b'g' => {
                    let line = self.line()?;
                    let key = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or(PickleError::Malformed("GET", at))?;
                    self.memo_get(key)?
                }
                b'h' => {
                    let key = self.u8()?.into();
                    self.memo_get(key)?
                }
                b'j' => {
                    let key = u32::from_le_bytes(self.le()?).into();
                    self.memo_get(key)?
                }
                b'P' | b'Q' => return Err(PickleError::Unsupported("persistent ids")),
                0x82..=0x84 => return Err(PickleError::Unsupported("the extension registry")),
                other => return Err(PickleError::UnknownOpcode(other, at)),
            }
        }
    }
}

/// The node APPEND(S) (`as_pairs` false) or SETITEM(S) adds to, with the error a scalar's node
/// gave when the target is a scalar carried in its id.
fn target_node<'t, 'a>(
    nodes: &'t mut [Node<'a>],
    id: usize,
    as_pairs: bool,
    at: usize,
) -> Result<&'t mut Node<'a>, PickleError> {
    let what = match as_pairs {
        false => NOT_A_LIST,
        true => NOT_A_DICT,
    };
    nodes.get_mut(id).ok_or(PickleError::Malformed(what, at))
}

/// The text or bytes a leaf value carries (its copy's cost on top of the value itself).
fn payload_len(v: &PyValue) -> usize {
    match v {
        PyValue::Str(s) => s.len(),
        PyValue::Bytes(b) | PyValue::BigInt(b) => b.len(),
        PyValue::Global(global) => {
            std::mem::size_of::<PyGlobal>() + global.module.len() + global.name.len()
        }
        _ => 0,
    }
}

/// LONG1/LONG4 payload: little-endian two's complement.
fn long(bytes: Vec<u8>) -> PyValue {
    if bytes.is_empty() {
        return PyValue::Int(0);
    }
    if bytes.len() <= 8 {
        let fill = if bytes[bytes.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut wide = [fill; 8];
        wide[..bytes.len()].copy_from_slice(&bytes);
        return PyValue::Int(i64::from_le_bytes(wide));
    }
    PyValue::BigInt(bytes)
}

/// Protocol 0 decimal ints; beyond i64 they are kept as two's complement bytes like LONG.
fn text_int(text: &[u8]) -> Option<PyValue> {
    let s = std::str::from_utf8(text).ok()?.trim();
    if let Ok(v) = s.parse::<i64>() {
        return Some(PyValue::Int(v));
    }
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4096 {
        return None;
    }
    // Magnitude as little-endian base-256, by repeated multiply-add.
    let mut mag: Vec<u8> = vec![0];
    for d in digits.bytes() {
        let mut carry = u16::from(d - b'0');
        for byte in mag.iter_mut() {
            let v = u16::from(*byte) * 10 + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
        if carry > 0 {
            mag.push(carry as u8);
        }
    }
    mag.push(0); // room for the sign bit
    if negative {
        let mut carry = 1u16;
        for byte in mag.iter_mut() {
            let v = u16::from(!*byte) + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
    }
    Some(PyValue::BigInt(mag))
}

/// Protocol 0 UNICODE arguments: raw-unicode-escape (`\uXXXX`, `\UXXXXXXXX`, Latin-1 bytes).
fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 1 < bytes.len() && matches!(bytes[i + 1], b'u' | b'U') {
            let n = if bytes[i + 1] == b'u' { 4 } else { 8 };
            let hex = std::str::from_utf8(bytes.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
            i += 2 + n;
        } else {
            out.push(char::from(bytes[i]));
            i += 1;
        }
    }
    Some(out)
}

/// SHORT_BINUNICODE `s`, for tests that write pickles by hand.
#[cfg(test)]
pub(crate) fn short_unicode(p: &mut Vec<u8>, s: &str) {
    p.push(0x8c);
    p.push(s.len() as u8);
    p.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pyread::PyRead;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// `pickle.dumps(TokenizedGenerateReqInput("abc123", [1, 2, 3, 300, 70000, -5, 2**40],
    /// {"max_new_tokens": 8, "temperature": 0.0}, True), protocol=P)` of a dataclass in a
    /// module named sglang.srt.managers.io_struct, by CPython 3.11.
    const REQ_P2: &str = "80026373676c616e672e7372742e6d616e61676572732e696f5f7374727563740a546f6b656e697a656447656e6572617465526571496e7075740a7100298171017d71022858030000007269647103580600000061626331323371045809000000696e7075745f69647371055d7106284b014b024b034d2c014a701101004afbffffff8a0600000000000165580800000073616d706c696e6771077d710828580e0000006d61785f6e65775f746f6b656e7371094b08580b00000074656d7065726174757265710a47000000000000000075580600000073747265616d710b8875622e";
    const REQ_P5: &str = "800595c4000000000000008c1d73676c616e672e7372742e6d616e61676572732e696f5f737472756374948c19546f6b656e697a656447656e6572617465526571496e7075749493942981947d94288c03726964948c06616263313233948c09696e7075745f696473945d94284b014b024b034d2c014a701101004afbffffff8a06000000000001658c0873616d706c696e67947d94288c0e6d61785f6e65775f746f6b656e73944b088c0b74656d706572617475726594470000000000000000758c0673747265616d948875622e";

    #[test]
    fn containers_filled_in_turn_keep_their_own_children_in_bounded_arenas() {
        // Two lists and two dicts, appended to one item at a time in turn (through the memo),
        // then returned as a 4-tuple: each container's children move to the arena's end when
        // another's came after them.
        let mut p = vec![
            0x80, 2, b']', b'q', 0, b']', b'q', 1, b'}', b'q', 2, b'}', b'q', 3,
        ];
        const ROUNDS: u8 = 200;
        for i in 0..ROUNDS {
            p.extend([b'h', 0, b'K', i, b'a', b'0']);
            p.extend([b'h', 1, b'(', b'K', i, b'K', i, b'e', b'0']);
            p.extend([b'h', 2, b'K', i, b'K', i, b's', b'0']);
            p.extend([b'h', 3, b'(', b'K', i, b'K', 1, b'u', b'0']);
        }
        p.extend([b'(', b'h', 0, b'h', 1, b'h', 2, b'h', 3, b't', b'.']);
        let list = |n| {
            (0..ROUNDS)
                .flat_map(|i| vec![PyValue::Int(i64::from(i)); n])
                .collect()
        };
        let dict = |v: fn(u8) -> i64| {
            (0..ROUNDS)
                .map(|i| (PyValue::Int(i64::from(i)), PyValue::Int(v(i))))
                .collect()
        };
        assert_eq!(
            loads(&p, &[]).unwrap(),
            PyValue::Tuple(vec![
                PyValue::List(list(1)),
                PyValue::List(list(2)),
                PyValue::Dict(dict(i64::from)),
                PyValue::Dict(dict(|_| 1)),
            ])
        );
        let pickle = parse(&p, &[]).unwrap();
        let children = 3 * usize::from(ROUNDS) + 4;
        assert!(
            pickle.tree.items.len() <= 4 * children,
            "{}",
            pickle.tree.items.len()
        );
        assert!(pickle.tree.pairs.len() <= 4 * 2 * usize::from(ROUNDS));
    }

    #[test]
    fn a_parse_reuses_the_buffers_the_previous_one_gave_back() {
        let data = unhex(REQ_P5);
        let mut scratch = Scratch::default();
        let pickle = parse_with(&mut scratch, &data, &[]).unwrap();
        let nodes = pickle.tree.nodes.as_ptr();
        pickle.recycle(&mut scratch);
        assert!(scratch.nodes.is_empty() && scratch.nodes.capacity() >= data.len() / 4);
        assert_eq!(
            scratch.nodes.as_ptr(),
            nodes,
            "the same allocation, emptied"
        );
        // The next parse fills them, and reads as a fresh one does.
        let pickle = parse_with(&mut scratch, &data, &[]).unwrap();
        assert_eq!(pickle.tree.nodes.as_ptr(), nodes);
        let fresh = parse(&data, &[]).unwrap();
        let (mut budget, mut fresh_budget) = (usize::MAX, usize::MAX);
        assert_eq!(
            pickle.expand(pickle.top, 0, &mut budget),
            fresh.expand(fresh.top, 0, &mut fresh_budget)
        );
        pickle.recycle(&mut scratch);
        // A parse that fails gives them back too.
        assert!(parse_with(&mut scratch, &data[..data.len() - 3], &[]).is_err());
        assert_eq!(scratch.nodes.as_ptr(), nodes);
        assert!(scratch.stack.capacity() > 0 && scratch.memo.capacity() > 0);
        // Huge buffers are let go, the machine's stack and memo as the tree's.
        let mut huge = Scratch::default();
        let big = [&[0x80, 5, b']'][..], &vec![b'N'; 200_000], b"."].concat();
        let _ = parse_with(&mut huge, &big, &[]).map(|p| p.recycle(&mut huge));
        assert_eq!(huge.nodes.capacity(), 0);
        assert_eq!(huge.stack.capacity(), 0, "200,000 values were stacked");
        assert!(huge.memo.capacity() > 0, "a buffer under the bound is kept");
    }

    #[test]
    fn dataclass_instances_in_protocols_2_and_5() {
        for hex in [REQ_P2, REQ_P5] {
            let v = loads(&unhex(hex), &[]).unwrap();
            let (module, class, fields) = v.instance().expect("an instance");
            assert_eq!(module, "sglang.srt.managers.io_struct");
            assert_eq!(class, "TokenizedGenerateReqInput");
            assert_eq!(fields.get("rid").and_then(PyRead::as_str), Some("abc123"));
            let ids: Vec<i64> = fields
                .get("input_ids")
                .and_then(PyValue::as_seq)
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            assert_eq!(ids, [1, 2, 3, 300, 70000, -5, 1 << 40]);
            let sampling = fields.get("sampling").unwrap();
            assert_eq!(
                sampling.get("max_new_tokens").and_then(PyRead::as_i64),
                Some(8)
            );
            assert_eq!(
                sampling.get("temperature").and_then(PyRead::as_f64),
                Some(0.0)
            );
            assert_eq!(fields.get("stream"), Some(&PyValue::Bool(true)));
            // Read in place, the same.
            let data = unhex(hex);
            let pickle = parse(&data, &[]).unwrap();
            let (module, class, fields) = pickle.root().instance().expect("an instance");
            assert_eq!(
                (module, class),
                ("sglang.srt.managers.io_struct", "TokenizedGenerateReqInput")
            );
            assert_eq!(fields.get("rid").and_then(PyRead::as_str), Some("abc123"));
            let ids = fields.get("input_ids").and_then(PyRead::int_array);
            assert_eq!(ids, Some(vec![1, 2, 3, 300, 70000, -5, 1 << 40]));
            let sampling = fields.get("sampling").unwrap();
            assert_eq!(
                sampling.get("max_new_tokens").and_then(PyRead::as_i64),
                Some(8)
            );
            assert_eq!(
                sampling.get("temperature").and_then(PyRead::as_f64),
                Some(0.0)
            );
            assert_eq!(fields.get("stream").and_then(PyRead::as_i64), Some(1));
        }
    }

    #[test]
    fn read_in_place_a_pickle_is_bounded_by_its_nodes_not_its_expansion() {
        // {"a": 1, "b": <a shared list doubled 30 times>}: too large expanded, not read in
        // place, where a shared value is one node however often it is referred to.
        let mut p = b"\x80\x04}\x8c\x01aK\x01s\x8c\x01b]\x940".to_vec();
        for i in 0..30u8 {
            p.extend_from_slice(&[b'h', i, b'h', i, 0x86, 0x94, b'0']);
        }
        p.extend_from_slice(b"h\x1es.");
        assert_eq!(
            loads(&p, &[]),
            Err(PickleError::TooLarge("expanded result"))
        );
        let pickle = parse(&p, &[]).unwrap();
        assert_eq!(pickle.root().get("a").and_then(PyRead::as_i64), Some(1));
        let b = pickle.root().get("b").unwrap();
        assert_eq!(b.seq_len(), Some(2));
        assert_eq!(b.item(0).and_then(PyRead::seq_len), Some(2));
        // l = []; l.append(l): a cycle is as deep as the reader walks it.
        let cyclic = unhex("80049506000000000000005d946800612e");
        let pickle = parse(&cyclic, &[]).unwrap();
        let l = pickle.root();
        assert_eq!(
            l.item(0).and_then(|x| x.item(0)).and_then(PyRead::seq_len),
            Some(1)
        );
    }

    #[test]
    fn text_is_checked_when_it_is_read() {
        // {"a": 1, "b": <SHORT_BINUNICODE of invalid UTF-8>}: "a" reads, "b" is no string,
        // and the whole value does not build.
        let pickle = b"}(\x8c\x01aK\x01\x8c\x01b\x8c\x02\xff\xfeu.";
        let parsed = parse(pickle, &[]).unwrap();
        assert_eq!(parsed.root().get("a").and_then(PyRead::as_i64), Some(1));
        let b = parsed.root().get("b").expect("b's value");
        assert_eq!(b.as_str(), None);
        assert_eq!(
            loads(pickle, &[]),
            Err(PickleError::Malformed("invalid UTF-8", 12))
        );
        let both = b"}(\x8c\x01aC\x02\x00\x01\x8c\x01b\x8c\x02hiu.";
        assert_eq!(
            loads(both, &[]).unwrap(),
            PyValue::Dict(vec![
                (PyValue::Str("a".into()), PyValue::Bytes(vec![0, 1])),
                (PyValue::Str("b".into()), PyValue::Str("hi".into())),
            ])
        );
        let pickle = parse(both, &[]).unwrap();
        assert_eq!(
            pickle.root().get("a").and_then(PyRead::as_bytes),
            Some(&[0u8, 1][..])
        );
        assert_eq!(pickle.root().get("b").and_then(PyRead::as_str), Some("hi"));
    }

    #[test]
    fn memo_keys_out_of_order() {
        // INT 7, PUT 9, POP, GET 9, STOP (protocol 0: keys are whatever the pickler wrote).
        assert_eq!(loads(b"I7\np9\n0g9\n.", &[]).unwrap(), PyValue::Int(7));
        // BINPUT 0 twice (a key overwritten), BINGET 0.
        assert_eq!(
            loads(b"K\x01q\x000K\x02q\x000h\x00.", &[]).unwrap(),
            PyValue::Int(2)
        );
    }

    /// An object value built by `callable(*args)`, with `state`.
    fn object(callable: PyValue, args: PyValue, state: Option<PyValue>) -> PyValue {
        PyValue::Object(Box::new(PyObject {
            callable,
            args,
            state,
            items: vec![],
            entries: vec![],
        }))
    }

    #[test]
    fn a_slots_state_gives_its_non_empty_dict() {
        let field = || PyValue::Dict(vec![(PyValue::Str("a".into()), PyValue::Int(1))]);
        let state = PyValue::Tuple(vec![PyValue::Dict(vec![]), field()]);
        let v = object(
            PyValue::global("m", "C"),
            PyValue::Tuple(vec![]),
            Some(state),
        );
        assert_eq!(v.instance(), Some(("m", "C", &field())));
        // The same state handed to a reconstructor, f(cls, (dict, slots)).
        let PyValue::Object(parts) = v else {
            unreachable!()
        };
        let reconstructed = object(
            PyValue::global("copyreg", "_reconstructor"),
            PyValue::Tuple(vec![parts.callable, parts.state.unwrap()]),
            None,
        );
        assert_eq!(reconstructed.instance(), Some(("m", "C", &field())));
    }

    #[test]
    fn shared_and_cyclic_references() {
        // x = [1, 2]; pickle.dumps([x, x, {"a": x}], protocol=4)
        let v = loads(
            &unhex("80049518000000000000005d94285d94284b014b026568017d948c016194680173652e"),
            &[],
        )
        .unwrap();
        let x = PyValue::List(vec![PyValue::Int(1), PyValue::Int(2)]);
        assert_eq!(
            v,
            PyValue::List(vec![
                x.clone(),
                x.clone(),
                PyValue::Dict(vec![(PyValue::Str("a".into()), x)])
            ])
        );
        // l = []; l.append(l): a cycle is cut, not followed forever.
        assert_eq!(
            loads(&unhex("80049506000000000000005d946800612e"), &[]),
            Err(PickleError::TooDeep)
        );
    }

    #[test]
    fn every_scalar_and_container_kind() {
        // (None, True, False, 1.5, b"by", bytearray(b"ba"), {1, 2}, frozenset([3]), 2**70,
        //  -(2**70), "é", (1,), (1, 2), (1, 2, 3), ()), protocol 5
        let v = loads(&unhex("8005955c00000000000000284e8889473ff800000000000043026279949602000000000000006261948f94284b014b0290284b0391948a090000000000000000408a090000000000000000c08c02c3a9944b0185944b014b0286944b014b024b0387942974942e"), &[]).unwrap();
        let items = v.as_seq().unwrap();
        assert_eq!(items[0], PyValue::None);
        assert_eq!(items[3], PyValue::Float(1.5));
        assert_eq!(items[4], PyValue::Bytes(b"by".to_vec()));
        assert_eq!(items[5], PyValue::Bytes(b"ba".to_vec()));
        assert_eq!(
            items[6],
            PyValue::Set(vec![PyValue::Int(1), PyValue::Int(2)])
        );
        assert_eq!(items[7], PyValue::Set(vec![PyValue::Int(3)]));
        assert_eq!(items[8], PyValue::BigInt(unhex("000000000000000040")));
        assert_eq!(items[9], PyValue::BigInt(unhex("0000000000000000c0")));
        assert_eq!(items[10], PyValue::Str("é".into()));
        assert_eq!(items[13].as_seq().unwrap().len(), 3);
        assert_eq!(items[14], PyValue::Tuple(vec![]));
    }

    #[test]
    fn protocol_0_text_opcodes() {
        // [1, "s", 2.5, None, {"k": (1, 2)}, 2**70], protocol 0
        let v = loads(&unhex("286c70300a49310a6156730a70310a6146322e350a614e61286470320a566b0a70330a2849310a49320a7470340a73614c313138303539313632303731373431313330333432344c0a612e"), &[]).unwrap();
        let items = v.as_seq().unwrap();
        assert_eq!(items[0], PyValue::Int(1));
        assert_eq!(items[1], PyValue::Str("s".into()));
        assert_eq!(items[2], PyValue::Float(2.5));
        assert_eq!(
            items[4].get("k"),
            Some(&PyValue::Tuple(vec![PyValue::Int(1), PyValue::Int(2)]))
        );
        // 2**70 as two's complement, like LONG1 gives it.
        assert_eq!(items[5], PyValue::BigInt(unhex("00000000000000004000")));
    }

    #[test]
    fn out_of_band_buffers() {
        // pickle.dumps(PickleBuffer(b"outofband"), protocol=5, buffer_callback=...)
        let data = unhex("800597982e");
        assert_eq!(
            loads(&data, &[b"outofband".to_vec()]),
            Ok(PyValue::Bytes(b"outofband".to_vec()))
        );
        assert_eq!(loads(&data, &[]), Ok(PyValue::Buffer(0)));
    }

    #[test]
    fn reconstructors_and_globals_are_data_not_calls() {
        // msgspec's pickling of a Struct: rebuild(cls, {field: value}), built by hand.
        let mut p = vec![0x80, 4];
        let short = short_unicode;
        short(&mut p, "msgspec._utils");
        short(&mut p, "rebuild");
        p.push(0x93);
        short(&mut p, "sglang.srt.managers.io_struct");
        short(&mut p, "BatchTokenIDOutput");
        p.push(0x93);
        p.extend_from_slice(b"}(");
        short(&mut p, "rids");
        p.extend_from_slice(b"]");
        short(&mut p, "r1");
        p.extend_from_slice(b"au\x86R.");
        let v = loads(&p, &[]).unwrap();
        let (module, class, fields) = v.instance().unwrap();
        assert_eq!(
            (module, class),
            ("sglang.srt.managers.io_struct", "BatchTokenIDOutput")
        );
        assert_eq!(
            fields.get("rids"),
            Some(&PyValue::List(vec![PyValue::Str("r1".into())]))
        );
        let pickle = parse(&p, &[]).unwrap();
        let (module, class, fields) = pickle.root().instance().unwrap();
        assert_eq!(
            (module, class),
            ("sglang.srt.managers.io_struct", "BatchTokenIDOutput")
        );
        let rids = fields.get("rids").and_then(PyRead::items).unwrap();
        assert_eq!(
            rids.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            [Some("r1")]
        );
        // os.system("x") is just a name and an argument.
        let v = loads(b"cos\nsystem\n(S'x'\ntR.", &[]).unwrap();
        assert_eq!(
            v,
            object(
                PyValue::global("os", "system"),
                PyValue::Tuple(vec![PyValue::Bytes(b"x".to_vec())]),
                None
            )
        );
    }

    #[test]
    fn int_arrays() {
        // array('q', [3, 326, -1]) as SGLang pickles input_ids.
        let mut bytes = Vec::new();
        for v in [3i64, 326, -1] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let args = PyValue::Tuple(vec![
            PyValue::global("array", "array"),
            PyValue::Str("q".into()),
            PyValue::Int(12),
            PyValue::Bytes(bytes),
        ]);
        let arr = object(PyValue::global("array", "_array_reconstructor"), args, None);
        assert_eq!(arr.int_array(), Some(vec![3, 326, -1]));
        assert_eq!(
            PyValue::List(vec![PyValue::Int(1), PyValue::Int(2)]).int_array(),
            Some(vec![1, 2])
        );
    }

    #[test]
    fn scalars_are_kept_in_their_ids_and_read_as_nodes_were() {
        // [i32::MIN, -1, 0, 255, 65535, i32::MAX] with BININT, BININT1 and BININT2.
        let mut p = vec![0x80, 4, b']', b'('];
        for v in [i32::MIN, -1] {
            p.push(b'J');
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&[b'K', 0, b'K', 255, b'M', 255, 255, b'J']);
        p.extend_from_slice(&i32::MAX.to_le_bytes());
        p.extend_from_slice(b"e.");
        let want = [i32::MIN.into(), -1, 0, 255, 65535, i32::MAX.into()];
        let built = loads(&p, &[]).unwrap();
        let built: Vec<i64> = built
            .as_seq()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(built, want);
        let parsed = parse(&p, &[]).unwrap();
        let root = parsed.root();
        assert_eq!(root.int_array(), Some(want.to_vec()));
        assert_eq!(root.item(0).unwrap().as_f64(), Some(f64::from(i32::MIN)));
        // No node each: the list is the only one.
        assert_eq!(parsed.tree.nodes.len(), 1);
        // (None, True, False, -2.5, 7.0)
        let mut p = vec![0x80, 4, b'(', b'N', 0x88, 0x89, b'G'];
        p.extend_from_slice(&(-2.5f64).to_be_bytes());
        p.push(b'G');
        p.extend_from_slice(&7f64.to_be_bytes());
        p.extend_from_slice(b"t.");
        let want = [
            PyValue::None,
            PyValue::Bool(true),
            PyValue::Bool(false),
            PyValue::Float(-2.5),
            PyValue::Float(7.0),
        ];
        assert_eq!(loads(&p, &[]), Ok(PyValue::Tuple(want.to_vec())));
        let parsed = parse(&p, &[]).unwrap();
        let items = parsed.root().items().unwrap();
        assert_eq!(parsed.tree.nodes.len(), 1);
        assert_eq!(items[0].leaf(), Some(&PyValue::None));
        assert_eq!(items[1].as_i64(), Some(1));
        assert_eq!(items[2].as_i64(), Some(0));
        assert_eq!((items[3].as_f64(), items[3].as_i64()), (Some(-2.5), None));
        assert_eq!(items[4].as_f64(), Some(7.0));
        // A scalar is no container, whatever adds to it.
        for (bad, error) in [
            (&b"K\x01K\x02a."[..], NOT_A_LIST),
            (b"K\x01(K\x02e.", NOT_A_LIST),
            (b"K\x01K\x02K\x03s.", NOT_A_DICT),
            (b"K\x01(K\x02K\x03u.", NOT_A_DICT),
            (b"NK\x01a.", NOT_A_LIST),
            (b"G@\0\0\0\0\0\0\0K\x01K\x02s.", NOT_A_DICT),
        ] {
            assert!(
                matches!(loads(bad, &[]), Err(PickleError::Malformed(e, _)) if e == error),
                "{bad:?}"
            );
        }
        assert_eq!(
            loads(b"K\x01K\x02b.", &[]),
            Err(PickleError::Malformed("BUILD on a non-object", 4))
        );
    }

    #[test]
    fn hostile_input_is_an_error() {
        let p5 = unhex(REQ_P5);
        for cut in 0..p5.len() {
            assert!(loads(&p5[..cut], &[]).is_err(), "prefix of {cut} bytes");
        }
        for bad in [
            &b"\x80\x05\xff."[..],                    // unknown opcode
            b"Pid\n.",                                // persistent id
            b"\x82\x01.",                             // extension registry
            b"\x80\x06N.",                            // protocol 6
            b"a.",                                    // APPEND on an empty stack
            b"N(a.",                                  // APPEND after a mark
            b"h\x05.",                                // memo key never stored
            b"X\xff\xff\xff\xffabc.",                 // length beyond the data
            b"\x8d\xff\xff\xff\xff\xff\xff\xff\x7f.", // huge 8-byte length
            b"KK\x01b.",                              // BUILD on an int
            b"}(K\x01u.",                             // odd SETITEMS
            b"X\x02\x00\x00\x00\xff\xfe.",            // invalid UTF-8
            b"",
        ] {
            assert!(loads(bad, &[]).is_err(), "{bad:?}");
        }
        // Doubling a shared list 30 times is a small pickle and an enormous tree.
        let mut p = vec![0x80, 4, b']', 0x94];
        for i in 0..30u8 {
            p.extend_from_slice(&[b'h', i, b'h', i, 0x86, 0x94]);
        }
        p.push(b'.');
        assert_eq!(
            loads_within(&p, &[], 100_000),
            Err(PickleError::TooLarge("expanded result"))
        );
        assert_eq!(
            loads(&p, &[]),
            Err(PickleError::TooLarge("expanded result"))
        );
        // A megabyte string memoized once and referenced a hundred times over.
        let mut p = vec![0x80, 4, 0x8d];
        p.extend_from_slice(&(1u64 << 20).to_le_bytes());
        p.extend(std::iter::repeat_n(b'x', 1 << 20));
        p.extend_from_slice(&[0x94, b'(']);
        p.extend(std::iter::repeat_n([b'h', 0], 100).flatten());
        p.extend_from_slice(b"l.");
        assert_eq!(
            loads(&p, &[]),
            Err(PickleError::TooLarge("expanded result"))
        );
        // Deep nesting fails cleanly.
        let mut deep = vec![0x80, 4];
        deep.extend(std::iter::repeat_n(b']', 10_000));
        deep.extend(std::iter::repeat_n(b'a', 9_999));
        deep.push(b'.');
        assert_eq!(loads(&deep, &[]), Err(PickleError::TooDeep));
    }
}
