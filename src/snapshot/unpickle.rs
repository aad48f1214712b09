//! Reading pickles: what `torch.cuda.memory._dump_snapshot` writes (Python's `pickle.dump` of
//! the snapshot dict) and what our own [`super::pickle`] writes, into a [`serde_json::Value`]
//! tree that [`super::json::from_value`] turns into a [`Snapshot`](super::Snapshot).
//!
//! A memory snapshot is plain data: dicts, lists, tuples, strings, integers, floats, booleans
//! and `None`. This reader runs the pickle machine for exactly the opcodes Python's pickler
//! (protocols 2 to 5) and PyTorch's own C++ pickler emit for those types:
//!
//! | what | opcodes |
//! |---|---|
//! | framing | `PROTO`, `FRAME`, `STOP` |
//! | containers | `EMPTY_DICT`, `DICT`, `SETITEM`, `SETITEMS`, `EMPTY_LIST`, `LIST`, `APPEND`, `APPENDS`, `EMPTY_TUPLE`, `TUPLE`, `TUPLE1`–`TUPLE3`, `EMPTY_SET`, `ADDITEMS`, `FROZENSET` (sets read as lists) |
//! | stack | `MARK`, `POP`, `POP_MARK`, `DUP` |
//! | scalars | `NONE`, `NEWTRUE`, `NEWFALSE`, `BININT`, `BININT1`, `BININT2`, `LONG1`, `LONG4`, `INT`, `LONG`, `BINFLOAT`, `FLOAT` |
//! | strings | `SHORT_BINUNICODE`, `BINUNICODE`, `BINUNICODE8`, `UNICODE` |
//! | memo | `MEMOIZE`, `PUT`, `BINPUT`, `LONG_BINPUT`, `GET`, `BINGET`, `LONG_BINGET` |
//!
//! Anything else (a class instance through `GLOBAL`/`REDUCE`, bytes, out-of-band buffers) is
//! not part of a snapshot and is an error naming the opcode and its offset.
//!
//! The memo holds *references*, as Python's does: a list is memoised when it is created,
//! empty, and filled afterwards, and a later `BINGET` of it must see its items (PyTorch shares
//! one frame list between the entries that have the same stack). So values live in an arena
//! while the machine runs and become a tree only at `STOP`. Integers must fit in 64 bits
//! (signed or unsigned); dict keys must be strings or integers (integers become their decimal
//! text).

use serde_json::{Map, Number, Value};
use std::collections::HashMap;
use std::fmt;

/// A pickle that could not be read: what and where (byte offset), in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpickleError {
    /// Byte offset of the opcode (or of the end of the data).
    pub offset: usize,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for UnpickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unreadable pickle at byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for UnpickleError {}

/// Whether `bytes` start like a pickle of protocol 2 or later (`\x80` and the protocol).
pub(crate) fn looks_like_pickle(bytes: &[u8]) -> bool {
    matches!(bytes, [0x80, 2..=5, ..])
}

/// Deepest nesting turned into a tree (a snapshot is about 6 levels deep; a memo cycle would
/// otherwise never end).
const MAX_DEPTH: usize = 200;

/// Reads one pickled object of plain data.
pub fn from_bytes(bytes: &[u8]) -> Result<Value, UnpickleError> {
    let p = parse(bytes)?;
    p.value(p.root, 0)
}

/// The objects of a pickle as the machine left them (shared objects stay shared), and its root.
pub(crate) struct Parsed {
    nodes: Vec<Node>,
    root: Id,
    /// The end of the data, for errors found afterwards.
    end: usize,
}

/// Runs the pickle machine over `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, UnpickleError> {
    let mut m =
        Machine { data: bytes, pos: 0, nodes: Vec::new(), stack: Vec::new(), marks: Vec::new(), memo: Memo::default() };
    let root = m.run()?;
    Ok(Parsed { nodes: m.nodes, root, end: m.pos })
}

impl Parsed {
    /// The root object, to read as a tree.
    pub(crate) fn root(&self) -> PickleNode<'_> {
        PickleNode { p: self, id: self.root }
    }
}

/// One object of a parsed pickle.
#[derive(Clone, Copy)]
pub(crate) struct PickleNode<'a> {
    p: &'a Parsed,
    id: Id,
}

impl<'a> PickleNode<'a> {
    fn node(self) -> &'a Node {
        &self.p.nodes[self.id]
    }
    fn at(self, id: Id) -> Self {
        PickleNode { p: self.p, id }
    }
}

impl<'a> super::tree::Tree<'a> for PickleNode<'a> {
    fn get(self, key: &str) -> Option<Self> {
        match self.node() {
            Node::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(&self.p.nodes[*k], Node::Str(s) if s == key))
                .map(|(_, v)| self.at(*v)),
            _ => None,
        }
    }
    fn u64(self) -> Option<u64> {
        match self.node() {
            Node::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
    fn i64(self) -> Option<i64> {
        match self.node() {
            Node::Int(i) => i64::try_from(*i).ok(),
            _ => None,
        }
    }
    fn f64(self) -> Option<f64> {
        match self.node() {
            Node::Float(f) => Some(*f),
            Node::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    fn bool(self) -> Option<bool> {
        match self.node() {
            Node::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn str(self) -> Option<&'a str> {
        match self.node() {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }
    fn items(self) -> Option<Vec<Self>> {
        match self.node() {
            Node::List(v) | Node::Tuple(v) => Some(v.iter().map(|&c| self.at(c)).collect()),
            _ => None,
        }
    }
    fn entries(self) -> Vec<(&'a str, Self)> {
        match self.node() {
            Node::Dict(items) => items
                .iter()
                .filter_map(|(k, v)| match &self.p.nodes[*k] {
                    Node::Str(s) => Some((s.as_str(), self.at(*v))),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
    fn to_value(self) -> Value {
        self.p.value(self.id, 0).unwrap_or(Value::Null)
    }
    fn id(self) -> usize {
        self.id
    }
}

type Id = usize;

#[derive(Debug)]
enum Node {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
}

/// The memo: dense indices (what `MEMOIZE` and Python's pickler give) in a vector, others in a
/// map.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Id>>,
    sparse: HashMap<u64, Id>,
}

impl Memo {
    fn put(&mut self, key: u64, id: Id) {
        match usize::try_from(key) {
            Ok(k) if k <= self.dense.len() + 1024 => {
                if self.dense.len() <= k {
                    self.dense.resize(k + 1, None);
                }
                self.dense[k] = Some(id);
            }
            _ => {
                self.sparse.insert(key, id);
            }
        }
    }
    fn get(&self, key: u64) -> Option<Id> {
        usize::try_from(key)
            .ok()
            .and_then(|k| self.dense.get(k).copied().flatten())
            .or_else(|| self.sparse.get(&key).copied())
    }
    fn len(&self) -> u64 {
        (self.dense.len() + self.sparse.len()) as u64
    }
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: Memo,
}

fn op_name(op: u8) -> &'static str {
    match op {
        b'c' => "GLOBAL (a Python class or function)",
        0x93 => "STACK_GLOBAL (a Python class or function)",
        b'R' => "REDUCE (a Python object)",
        0x81 => "NEWOBJ (a Python object)",
        0x92 => "NEWOBJ_EX (a Python object)",
        b'b' => "BUILD (a Python object)",
        b'i' => "INST (a Python object)",
        b'o' => "OBJ (a Python object)",
        b'P' | b'Q' => "PERSID/BINPERSID (a persistent reference)",
        b'B' | b'C' | 0x8e => "BINBYTES (a bytes object)",
        0x96 => "BYTEARRAY8 (a bytearray)",
        0x97 | 0x98 => "NEXT_BUFFER/READONLY_BUFFER (an out-of-band buffer)",
        b'S' | b'T' | b'U' => "STRING (a Python 2 byte string)",
        0x82..=0x84 => "EXT (an extension-registry object)",
        _ => "an unknown opcode",
    }
}

impl Machine<'_> {
    fn err(&self, offset: usize, message: impl Into<String>) -> UnpickleError {
        UnpickleError { offset, message: message.into() }
    }

    fn take(&mut self, n: usize, at: usize) -> Result<&[u8], UnpickleError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(at, format!("truncated: the opcode needs {n} more bytes, the data ends first"))),
        }
    }

    fn u8(&mut self, at: usize) -> Result<u8, UnpickleError> {
        Ok(self.take(1, at)?[0])
    }
    fn u16(&mut self, at: usize) -> Result<u16, UnpickleError> {
        let b = self.take(2, at)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, at: usize) -> Result<u32, UnpickleError> {
        let b = self.take(4, at)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, at: usize) -> Result<u64, UnpickleError> {
        let b = self.take(8, at)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn len64(&mut self, at: usize) -> Result<usize, UnpickleError> {
        let n = self.u64(at)?;
        usize::try_from(n).map_err(|_| self.err(at, format!("length {n} does not fit in memory")))
    }
    /// A text line (protocol-0 arguments), without its newline.
    fn line(&mut self, at: usize) -> Result<String, UnpickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err(at, "truncated: a text argument has no end of line"))?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| self.err(at, "a text argument is not UTF-8"))?.to_string();
        self.pos += n + 1;
        Ok(s)
    }
    fn text(&mut self, n: usize, at: usize) -> Result<String, UnpickleError> {
        let b = self.take(n, at)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(self.err(at, "a string is not valid UTF-8")),
        }
    }

    fn push(&mut self, n: Node) {
        self.nodes.push(n);
        self.stack.push(self.nodes.len() - 1);
    }
    fn pop(&mut self, at: usize) -> Result<Id, UnpickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err(at, "stack underflow (a malformed pickle)"));
        }
        Ok(self.stack.pop().unwrap_or_default())
    }
    fn top(&self, at: usize) -> Result<Id, UnpickleError> {
        self.stack.last().copied().ok_or_else(|| self.err(at, "stack underflow (a malformed pickle)"))
    }
    /// The items since the last MARK, removing the mark.
    fn pop_mark(&mut self, at: usize) -> Result<Vec<Id>, UnpickleError> {
        let m = self.marks.pop().ok_or_else(|| self.err(at, "no MARK before this opcode (a malformed pickle)"))?;
        Ok(self.stack.split_off(m))
    }
    fn memo_put(&mut self, key: u64, at: usize) -> Result<(), UnpickleError> {
        let id = self.top(at)?;
        self.memo.put(key, id);
        Ok(())
    }
    fn memo_get(&mut self, key: u64, at: usize) -> Result<(), UnpickleError> {
        let id = self.memo.get(key).ok_or_else(|| self.err(at, format!("memo entry {key} was never stored")))?;
        self.stack.push(id);
        Ok(())
    }
    fn append(&mut self, target: Id, items: Vec<Id>, at: usize) -> Result<(), UnpickleError> {
        match &mut self.nodes[target] {
            Node::List(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.err(at, "APPEND to something that is not a list")),
        }
    }
    fn set_items(&mut self, target: Id, items: Vec<Id>, at: usize) -> Result<(), UnpickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err(at, "SETITEMS with an odd number of items"));
        }
        match &mut self.nodes[target] {
            Node::Dict(d) => {
                d.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            _ => Err(self.err(at, "SETITEM on something that is not a dict")),
        }
    }
    fn long(&self, bytes: &[u8], at: usize) -> Result<i128, UnpickleError> {
        if bytes.len() > 16 {
            return Err(self.err(at, format!("an integer of {} bytes is too large", bytes.len())));
        }
        let mut v: i128 = 0;
        for (i, b) in bytes.iter().enumerate() {
            v |= i128::from(*b) << (8 * i);
        }
        if let Some(&last) = bytes.last()
            && last & 0x80 != 0
            && bytes.len() < 16
        {
            v -= 1i128 << (8 * bytes.len());
        }
        Ok(v)
    }

    fn run(&mut self) -> Result<Id, UnpickleError> {
        loop {
            let at = self.pos;
            let Some(&op) = self.data.get(self.pos) else {
                return Err(self.err(at, "truncated: the data ends before STOP"));
            };
            self.pos += 1;
            match op {
                0x80 => {
                    let v = self.u8(at)?;
                    if !(2..=5).contains(&v) {
                        return Err(self.err(at, format!("pickle protocol {v} (protocols 2 to 5 are read)")));
                    }
                }
                0x95 => {
                    self.u64(at)?;
                }
                b'.' => return self.pop(at),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let t = self.top(at)?;
                    self.stack.push(t);
                }
                b'}' => self.push(Node::Dict(Vec::new())),
                b'd' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Dict(Vec::new()));
                    let t = self.top(at)?;
                    self.set_items(t, items, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    let t = self.top(at)?;
                    self.set_items(t, vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    let t = self.top(at)?;
                    self.set_items(t, items, at)?;
                }
                b']' => self.push(Node::List(Vec::new())),
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::List(items));
                }
                b'a' => {
                    let v = self.pop(at)?;
                    let t = self.top(at)?;
                    self.append(t, vec![v], at)?;
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    let t = self.top(at)?;
                    self.append(t, items, at)?;
                }
                0x8f => self.push(Node::List(Vec::new())),
                0x90 => {
                    let items = self.pop_mark(at)?;
                    let t = self.top(at)?;
                    self.append(t, items, at)?;
                }
                0x91 => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::List(items));
                }
                b')' => self.push(Node::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < self.marks.last().copied().unwrap_or(0) + n {
                        return Err(self.err(at, "stack underflow (a malformed pickle)"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Node::Tuple(items));
                }
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                b'J' => {
                    let v = self.u32(at)? as i32;
                    self.push(Node::Int(i128::from(v)));
                }
                b'K' => {
                    let v = self.u8(at)?;
                    self.push(Node::Int(i128::from(v)));
                }
                b'M' => {
                    let v = self.u16(at)?;
                    self.push(Node::Int(i128::from(v)));
                }
                0x8a => {
                    let n = usize::from(self.u8(at)?);
                    let b = self.take(n, at)?.to_vec();
                    let v = self.long(&b, at)?;
                    self.push(Node::Int(v));
                }
                0x8b => {
                    let n = self.u32(at)? as usize;
                    let b = self.take(n, at)?.to_vec();
                    let v = self.long(&b, at)?;
                    self.push(Node::Int(v));
                }
                b'I' => {
                    let s = self.line(at)?;
                    let node = match s.as_str() {
                        "01" => Node::Bool(true),
                        "00" => Node::Bool(false),
                        t => Node::Int(t.parse().map_err(|_| self.err(at, format!("INT {t:?} is not an integer")))?),
                    };
                    self.push(node);
                }
                b'L' => {
                    let s = self.line(at)?;
                    let t = s.trim_end_matches('L');
                    let v = t.parse().map_err(|_| self.err(at, format!("LONG {s:?} is not an integer")))?;
                    self.push(Node::Int(v));
                }
                b'G' => {
                    let b = self.take(8, at)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Node::Float(f64::from_be_bytes(a)));
                }
                b'F' => {
                    let s = self.line(at)?;
                    let v = s.trim().parse().map_err(|_| self.err(at, format!("FLOAT {s:?} is not a number")))?;
                    self.push(Node::Float(v));
                }
                0x8c => {
                    let n = usize::from(self.u8(at)?);
                    let s = self.text(n, at)?;
                    self.push(Node::Str(s));
                }
                b'X' => {
                    let n = self.u32(at)? as usize;
                    let s = self.text(n, at)?;
                    self.push(Node::Str(s));
                }
                0x8d => {
                    let n = self.len64(at)?;
                    let s = self.text(n, at)?;
                    self.push(Node::Str(s));
                }
                b'V' => {
                    let s = self.line(at)?;
                    self.push(Node::Str(unescape_raw_unicode(&s)));
                }
                0x94 => {
                    let k = self.memo.len();
                    self.memo_put(k, at)?;
                }
                b'q' => {
                    let k = u64::from(self.u8(at)?);
                    self.memo_put(k, at)?;
                }
                b'r' => {
                    let k = u64::from(self.u32(at)?);
                    self.memo_put(k, at)?;
                }
                b'p' => {
                    let s = self.line(at)?;
                    let k = s.parse().map_err(|_| self.err(at, format!("PUT {s:?} is not an index")))?;
                    self.memo_put(k, at)?;
                }
                b'h' => {
                    let k = u64::from(self.u8(at)?);
                    self.memo_get(k, at)?;
                }
                b'j' => {
                    let k = u64::from(self.u32(at)?);
                    self.memo_get(k, at)?;
                }
                b'g' => {
                    let s = self.line(at)?;
                    let k = s.parse().map_err(|_| self.err(at, format!("GET {s:?} is not an index")))?;
                    self.memo_get(k, at)?;
                }
                other => {
                    let what = op_name(other);
                    let printable =
                        if other.is_ascii_graphic() { format!(" '{}'", other as char) } else { String::new() };
                    return Err(self.err(
                        at,
                        format!(
                            "opcode {other:#04x}{printable}, {what}: a memory snapshot holds only dicts, lists, strings \
                             and numbers"
                        ),
                    ));
                }
            }
        }
    }
}

impl Parsed {
    fn err(&self, offset: usize, message: impl Into<String>) -> UnpickleError {
        UnpickleError { offset, message: message.into() }
    }

    /// The tree under `id`.
    fn value(&self, id: Id, depth: usize) -> Result<Value, UnpickleError> {
        if depth > MAX_DEPTH {
            return Err(self.err(self.end, format!("nested more than {MAX_DEPTH} levels deep (a reference cycle?)")));
        }
        Ok(match &self.nodes[id] {
            Node::None => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(i) => Value::Number(self.number(*i)?),
            Node::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Node::Str(s) => Value::String(s.clone()),
            Node::List(v) | Node::Tuple(v) => {
                Value::Array(v.iter().map(|&c| self.value(c, depth + 1)).collect::<Result<_, _>>()?)
            }
            Node::Dict(items) => {
                let mut m = Map::new();
                for &(k, v) in items {
                    let key = match &self.nodes[k] {
                        Node::Str(s) => s.clone(),
                        Node::Int(i) => i.to_string(),
                        other => {
                            return Err(self.err(
                                self.end,
                                format!("a dict key is {} (only strings and integers are read)", kind(other)),
                            ));
                        }
                    };
                    m.insert(key, self.value(v, depth + 1)?);
                }
                Value::Object(m)
            }
        })
    }

    fn number(&self, i: i128) -> Result<Number, UnpickleError> {
        if let Ok(u) = u64::try_from(i) {
            Ok(Number::from(u))
        } else if let Ok(s) = i64::try_from(i) {
            Ok(Number::from(s))
        } else {
            Err(self.err(self.end, format!("the integer {i} does not fit in 64 bits")))
        }
    }
}

fn kind(n: &Node) -> &'static str {
    match n {
        Node::None => "None",
        Node::Bool(_) => "a bool",
        Node::Int(_) => "an integer",
        Node::Float(_) => "a float",
        Node::Str(_) => "a string",
        Node::List(_) => "a list",
        Node::Tuple(_) => "a tuple",
        Node::Dict(_) => "a dict",
    }
}

/// Protocol 0's raw-unicode-escape text: `\uXXXX` and `\UXXXXXXXX` escapes, the rest Latin-1
/// as written.
fn unescape_raw_unicode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && matches!(chars.peek(), Some('u' | 'U')) {
            let n = if chars.next() == Some('u') { 4 } else { 8 };
            let hex: String = chars.by_ref().take(n).collect();
            match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                Some(ch) => out.push(ch),
                None => {
                    out.push('\\');
                    out.push_str(&hex);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn protocol_4_as_python_writes_it() {
        // pickle.dumps({'a': [1, -2, 70000, 2**40, None, True, 1.5, ('x', 'x')]}, protocol=4)
        let bytes: &[u8] = b"\x80\x04\x953\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffJp\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01N\x88G?\xf8\x00\x00\x00\x00\x00\x00\x8c\x01x\x94h\x03\x86\x94es.";
        let v = from_bytes(bytes).unwrap();
        assert_eq!(v, json!({"a": [1, -2, 70000, 1u64 << 40, null, true, 1.5, ["x", "x"]]}));
    }

    #[test]
    fn the_memo_holds_references_not_copies() {
        // l = []; d = {'p': l, 'q': l} pickled after l.append(1): the memoised empty list is
        // filled after it is stored; BINGET must see the item.
        let bytes: &[u8] = b"\x80\x02}q\x00(X\x01\x00\x00\x00pq\x01]q\x02K\x01aX\x01\x00\x00\x00qq\x03h\x02u.";
        assert_eq!(from_bytes(bytes).unwrap(), json!({"p": [1], "q": [1]}));
    }

    #[test]
    fn big_and_negative_integers() {
        assert_eq!(from_bytes(b"\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f.").unwrap(), json!(i64::MAX));
        assert_eq!(from_bytes(b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.").unwrap(), json!(u64::MAX));
        assert_eq!(from_bytes(b"\x80\x02\x8a\x01\xff.").unwrap(), json!(-1));
        assert_eq!(from_bytes(b"\x80\x02\x8a\x00.").unwrap(), json!(0));
        let e = from_bytes(b"\x80\x02\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap_err();
        assert!(e.message.contains("does not fit in 64 bits"), "{e}");
    }

    #[test]
    fn errors_name_the_opcode_and_offset_in_one_line() {
        let cases: &[(&[u8], &str)] = &[
            (b"\x80\x04cbuiltins\nset\n.", "GLOBAL"),
            (b"\x80\x03C\x02ab.", "bytes"),
            (b"\x80\x04}\x94(", "ends before STOP"),
            (b"\x80\x06N.", "protocol 6"),
            (b"\x80\x02X\x10\x00\x00\x00ab", "truncated"),
            (b"\x80\x02h\x05.", "never stored"),
            (b"\x80\x02e.", "no MARK"),
            (b"\x80\x02K\x01K\x02a.", "not a list"),
            (b"\x80\x02.", "underflow"),
        ];
        for (bytes, needle) in cases {
            let e = from_bytes(bytes).unwrap_err().to_string();
            assert!(e.contains(needle), "{bytes:?}: {e}");
            assert!(e.starts_with("unreadable pickle at byte "), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_memo_cycle_is_an_error_not_a_hang() {
        // l = []; l.append(l)
        let e = from_bytes(b"\x80\x02]q\x00h\x00a.").unwrap_err();
        assert!(e.message.contains("cycle"), "{e}");
    }

    #[test]
    fn recognises_pickles() {
        assert!(looks_like_pickle(b"\x80\x04\x95"));
        assert!(!looks_like_pickle(b"{\"segments\""));
        assert!(!looks_like_pickle(b"\x1f\x8b"));
    }
}
