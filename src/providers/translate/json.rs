//! A borrowing JSON tree for the request converters: strings without escapes point into the
//! request body, objects are vectors of pairs in document order (a repeated key keeps its
//! last value, as `serde_json::Value` does), and the tree serialises itself. A hand-written
//! reader builds it (strings found eight bytes at a time, no serde visitor) and a
//! hand-written writer appends it to one buffer (runs without escapes copied whole); both
//! give byte for byte what the serde_json reader and writer of the tree give, which stay as
//! the fallback for bodies the reader leaves alone (and for errors) and as the tests' oracle.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
#[cfg(test)]
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

pub type Key<'a> = Cow<'a, str>;
pub type Pairs<'a> = Vec<(Key<'a>, J<'a>)>;

#[derive(Clone, Debug, PartialEq)]
pub enum J<'a> {
    Null,
    Bool(bool),
    U(u64),
    I(i64),
    F(f64),
    Str(Cow<'a, str>),
    Arr(Vec<J<'a>>),
    Obj(Pairs<'a>),
}

/// An object from `"key" => value` pairs (keys are literals).
macro_rules! jo {
    ($($k:literal => $v:expr),* $(,)?) => {
        $crate::providers::translate::json::J::Obj(vec![
            $((::std::borrow::Cow::Borrowed($k), $crate::providers::translate::json::J::from($v))),*
        ])
    };
}
pub(crate) use jo;

static NULL: J<'static> = J::Null;

impl<'a> J<'a> {
    /// The tree of `body`: read by the hand-written reader below, or by `serde_json`
    /// when that reader does not take the body (so a malformed body gets serde_json's
    /// error, and the rare document the reader leaves alone its tree).
    pub fn parse(body: &'a [u8]) -> Result<J<'a>, serde_json::Error> {
        match read(body, None, None) {
            Some(j) => Ok(j),
            None => serde_json::from_slice(body),
        }
    }

    /// [`J::parse`] of a body prepared by [`Unescaped::of`]: its strings with escapes are
    /// decoded into one buffer of `unescaped` (no string of its own per string) and the
    /// tree borrows them from there; the tree is the same. Returns `unescaped` to read, for
    /// an [`Out`] that copies strings from the body.
    pub fn parse_in(
        unescaped: &'a mut Unescaped<'a>,
    ) -> (Result<J<'a>, serde_json::Error>, &'a Unescaped<'a>) {
        let body = unescaped.body;
        let tree = match unescaped.body_text {
            Some(text) => read(body, Some(text), Some(&mut *unescaped)),
            None => None,
        };
        let unescaped: &'a Unescaped<'a> = unescaped;
        match tree {
            Some(mut j) => {
                if !unescaped.strings.is_empty() {
                    unescaped.fill(&mut j, &mut 0);
                }
                (Ok(j), unescaped)
            }
            None => (serde_json::from_slice(body), unescaped),
        }
    }

    pub fn get(&self, key: &str) -> Option<&J<'a>> {
        match self {
            J::Obj(p) => p.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The member `key`, or `null`.
    pub fn at(&self, key: &str) -> &J<'a> {
        self.get(key).unwrap_or(&NULL)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut J<'a>> {
        match self {
            J::Obj(p) => p.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, J::Null)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Vec<J<'a>>> {
        match self {
            J::Arr(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Pairs<'a>> {
        match self {
            J::Obj(p) => Some(p),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            J::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            J::U(n) => Some(*n),
            J::I(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            J::U(n) => Some(*n as f64),
            J::I(n) => Some(*n as f64),
            J::F(n) => Some(*n),
            _ => None,
        }
    }

    /// Sets `key` (replacing an earlier value) on an object.
    pub fn insert(&mut self, key: &'static str, v: J<'a>) {
        if let J::Obj(p) = self {
            match p.iter_mut().find(|(k, _)| k == key) {
                Some((_, old)) => *old = v,
                None => p.push((Cow::Borrowed(key), v)),
            }
        }
    }

    /// The tree as JSON, in a buffer of `capacity` bytes to start with (a translation's
    /// output is about the size of its input).
    pub fn to_vec_sized(&self, capacity: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(capacity);
        self.write(&mut out);
        out
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.to_vec_sized(256)
    }
}

/// Sets `key` in `pairs` (replacing an earlier value).
pub fn set<'a>(pairs: &mut Pairs<'a>, key: &'static str, v: J<'a>) {
    match pairs.iter_mut().find(|(k, _)| k == key) {
        Some((_, old)) => *old = v,
        None => pairs.push((Cow::Borrowed(key), v)),
    }
}

impl<'a> From<&'a str> for J<'a> {
    fn from(s: &'a str) -> Self {
        J::Str(Cow::Borrowed(s))
    }
}

impl From<String> for J<'_> {
    fn from(s: String) -> Self {
        J::Str(Cow::Owned(s))
    }
}

impl<'a> From<Cow<'a, str>> for J<'a> {
    fn from(s: Cow<'a, str>) -> Self {
        J::Str(s)
    }
}

impl From<u64> for J<'_> {
    fn from(n: u64) -> Self {
        J::U(n)
    }
}

impl From<bool> for J<'_> {
    fn from(b: bool) -> Self {
        J::Bool(b)
    }
}

impl<'a> From<Vec<J<'a>>> for J<'a> {
    fn from(a: Vec<J<'a>>) -> Self {
        J::Arr(a)
    }
}

/// The tree as serde_json writes it: the oracle [`J::write`] is tested against.
#[cfg(test)]
impl Serialize for J<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            J::Null => s.serialize_unit(),
            J::Bool(b) => s.serialize_bool(*b),
            J::U(n) => s.serialize_u64(*n),
            J::I(n) => s.serialize_i64(*n),
            J::F(n) => s.serialize_f64(*n),
            J::Str(v) => s.serialize_str(v),
            J::Arr(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for x in a {
                    seq.serialize_element(x)?;
                }
                seq.end()
            }
            J::Obj(p) => {
                let mut map = s.serialize_map(Some(p.len()))?;
                for (k, v) in p {
                    map.serialize_entry(k.as_ref(), v)?;
                }
                map.end()
            }
        }
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<J<'de>, E> {
        Ok(J::Null)
    }

    fn visit_none<E>(self) -> Result<J<'de>, E> {
        Ok(J::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<J<'de>, E> {
        Ok(J::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<J<'de>, E> {
        Ok(J::U(n))
    }

    fn visit_i64<E>(self, n: i64) -> Result<J<'de>, E> {
        Ok(if n >= 0 { J::U(n as u64) } else { J::I(n) })
    }

    fn visit_f64<E>(self, n: f64) -> Result<J<'de>, E> {
        Ok(J::F(n))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<J<'de>, E> {
        Ok(J::Str(Cow::Owned(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J<'de>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4));
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(J::Arr(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J<'de>, A::Error> {
        let mut out: Pairs<'de> = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some(k) = map.next_key_seed(KeySeed)? {
            let v: J<'de> = map.next_value()?;
            match out.iter_mut().find(|(old, _)| *old == k) {
                Some((_, old)) => *old = v,
                None => out.push((k, v)),
            }
        }
        Ok(J::Obj(out))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for J<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J<'a>, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

/// A key that borrows when it can (`Cow<str>`'s own impl always copies).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<'de>, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
}

// ---------------------------------------------------------------------------------------
// The reader and the writer of the tree
// ---------------------------------------------------------------------------------------

/// Nesting past which the reader hands the document to `serde_json` (whose own limit is
/// 128): the reader never recurses deeper than this.
const READER_MAX_DEPTH: usize = 64;

/// The tree of a document by the hand-written reader, or `None` when the reader does not
/// take it — the document is not JSON, nests deeper than [`READER_MAX_DEPTH`], or has a
/// string escape it leaves to `serde_json` (a surrogate). It accepts only what
/// `serde_json` accepts and builds the same tree; `J::parse` falls back to `serde_json`
/// when it says `None`, so errors read as before. `text`: `body` as text, when the caller
/// has it. `into`: decode the strings with escapes into its buffer, leaving an empty
/// owned string in their place (what [`J::parse_in`] then fills); a repeated key whose
/// earlier or later value has such strings is left to serde_json (the places would no
/// longer be in document order).
fn read<'a>(
    body: &'a [u8],
    text: Option<&'a str>,
    into: Option<&mut Unescaped<'a>>,
) -> Option<J<'a>> {
    let text = match text {
        Some(t) => t,
        None => std::str::from_utf8(body).ok()?,
    };
    let mut r = Reader {
        text,
        b: body,
        i: 0,
        defer: into.is_some(),
        decoded: String::new(),
        strings: Vec::new(),
    };
    let v = r.value(0)?;
    r.ws();
    if r.i != body.len() {
        return None;
    }
    if let Some(u) = into {
        u.text = r.decoded;
        u.strings = r.strings;
    }
    Some(v)
}

struct Reader<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
    /// Whether strings with escapes are decoded into `decoded` (listed in `strings`, as in
    /// [`Unescaped`]) rather than each into its own string.
    defer: bool,
    decoded: String,
    strings: Vec<(usize, usize, usize, bool)>,
}

/// A body prepared for [`J::parse_in`]: its text (UTF-8 checked once), and, once read, the
/// decoded text of every string of it that has escapes, in document order, in one buffer
/// — the tree borrows those as it borrows the strings without escapes (no allocation per
/// string, and copying the tree's strings is free).
#[derive(Debug)]
pub struct Unescaped<'a> {
    body: &'a [u8],
    /// `body` as text, when it is UTF-8.
    body_text: Option<&'a str>,
    text: String,
    /// Per string with escapes (keys aside): where it starts in the body (after the
    /// quote), where it ends (after the closing quote), where its text ends in `text`, and
    /// whether its escapes are all the ones the writer would write (so the body's bytes
    /// can be copied).
    strings: Vec<(usize, usize, usize, bool)>,
}

impl<'a> Unescaped<'a> {
    pub fn of(body: &'a [u8]) -> Unescaped<'a> {
        Unescaped {
            body,
            body_text: std::str::from_utf8(body).ok(),
            text: String::new(),
            strings: Vec::new(),
        }
    }

    /// The decoded text of the `k`-th string with escapes.
    fn decoded(&self, k: usize) -> Option<&str> {
        let start = match k {
            0 => 0,
            k => self.strings.get(k - 1)?.2,
        };
        self.text.get(start..self.strings.get(k)?.2)
    }

    /// Puts the decoded strings in the places the reader left for them (`next`: how many
    /// are placed), in document order.
    fn fill(&'a self, j: &mut J<'a>, next: &mut usize) {
        if *next >= self.strings.len() {
            return;
        }
        match j {
            J::Str(s) => {
                if matches!(s, Cow::Owned(o) if o.capacity() == 0) {
                    if let Some(t) = self.decoded(*next) {
                        *s = Cow::Borrowed(t);
                    }
                    *next += 1;
                }
            }
            J::Arr(a) => {
                for x in a {
                    self.fill(x, next);
                }
            }
            J::Obj(p) => {
                for (_, v) in p {
                    self.fill(v, next);
                }
            }
            _ => {}
        }
    }

    /// `s` as JSON string contents ready to copy, when it is a string of this body whose
    /// bytes there are what [`write_str`] would write for it: one without escapes (the
    /// reader takes no control character), or one whose escapes are all the writer's own.
    fn raw<'s>(&'s self, s: &'s str) -> Option<&'s [u8]> {
        let p = s.as_ptr() as usize;
        let body = self.body.as_ptr() as usize;
        if p >= body && p + s.len() <= body + self.body.len() {
            return Some(s.as_bytes());
        }
        let text = self.text.as_ptr() as usize;
        if p < text || p + s.len() > text + self.text.len() {
            return None;
        }
        let (from, to) = (p - text, p - text + s.len());
        let k = self.strings.partition_point(|e| e.2 < to);
        let &(start, end, text_end, canonical) = self.strings.get(k)?;
        let text_start = match k {
            0 => 0,
            k => self.strings.get(k - 1)?.2,
        };
        (canonical && text_start == from && text_end == to).then(|| &self.body[start..end - 1])
    }
}

/// Whether a tree holds a place left for a decoded string.
fn has_place(j: &J<'_>) -> bool {
    match j {
        J::Str(Cow::Owned(o)) => o.capacity() == 0,
        J::Arr(a) => a.iter().any(has_place),
        J::Obj(p) => p.iter().any(|(_, v)| has_place(v)),
        _ => false,
    }
}

/// An output buffer that writes the strings of one body's tree by copying them from the
/// body when their bytes there are what the writer would write ([`Unescaped`] knows).
pub struct Out<'u> {
    pub buf: Vec<u8>,
    body: &'u Unescaped<'u>,
}

impl<'u> Out<'u> {
    pub fn new(body: &'u Unescaped<'u>, capacity: usize) -> Out<'u> {
        Out {
            buf: Vec::with_capacity(capacity),
            body,
        }
    }

    /// `v` as JSON text, written as [`Out::j`] writes it.
    pub fn text_of(&self, v: &J<'_>) -> String {
        let mut o = Out::new(self.body, 64);
        o.j(v);
        String::from_utf8(o.buf).unwrap_or_default()
    }

    /// `s` as a JSON string.
    pub fn str(&mut self, s: &str) {
        match self.body.raw(s) {
            Some(raw) => {
                self.buf.reserve(raw.len() + 2);
                self.buf.push(b'"');
                self.buf.extend_from_slice(raw);
                self.buf.push(b'"');
            }
            None => write_str(&mut self.buf, s),
        }
    }

    /// `v` as JSON, byte for byte what [`J::write`] writes.
    pub fn j(&mut self, v: &J<'_>) {
        match v {
            J::Str(s) => self.str(s),
            J::Arr(a) => {
                self.buf.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.j(x);
                }
                self.buf.push(b']');
            }
            J::Obj(p) => {
                self.buf.push(b'{');
                for (i, (k, v)) in p.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.str(k);
                    self.buf.push(b':');
                    self.j(v);
                }
                self.buf.push(b'}');
            }
            _ => v.write(&mut self.buf),
        }
    }
}

impl std::ops::Deref for Out<'_> {
    type Target = Vec<u8>;

    fn deref(&self) -> &Vec<u8> {
        &self.buf
    }
}

impl std::ops::DerefMut for Out<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

/// Decodes the string whose contents start at `start` (first escape at `at`) of `text`,
/// appending to `out`; returns the index after its closing quote and whether every escape
/// is the one [`write_str`] writes for its character (`\"`, `\\`, the short forms, `\u00xx`
/// for other control characters), or `None` for what the reader leaves to serde_json (a
/// control character, a bad escape, a surrogate).
fn unescape(text: &str, start: usize, mut at: usize, out: &mut String) -> Option<(usize, bool)> {
    let b = text.as_bytes();
    let mut run = start;
    let mut canonical = true;
    loop {
        out.push_str(text.get(run..at)?);
        match b[at] {
            b'"' => return Some((at + 1, canonical)),
            b'\\' => {
                let e = *b.get(at + 1)?;
                at += 2;
                canonical &= e != b'/';
                out.push(match e {
                    b'"' => '"',
                    b'\\' => '\\',
                    b'/' => '/',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    // Surrogates (pairs and lone ones) are left to serde_json.
                    b'u' => {
                        let mut n = 0;
                        let digits = b.get(at..at + 4)?;
                        for &c in digits {
                            n = n * 16 + char::from(c).to_digit(16)?;
                        }
                        canonical &= n < 0x20
                            && !matches!(n, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d)
                            && digits[2..] == [HEX[(n >> 4) as usize], HEX[(n & 0xf) as usize]];
                        at += 4;
                        char::from_u32(n)?
                    }
                    _ => return None,
                });
                run = at;
            }
            _ => return None,
        }
        at = run + find_special(b.get(run..)?)?;
    }
}

impl<'a> Reader<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn value(&mut self, depth: usize) -> Option<J<'a>> {
        self.ws();
        match *self.b.get(self.i)? {
            b'{' if depth < READER_MAX_DEPTH => {
                self.i += 1;
                self.object(depth + 1)
            }
            b'[' if depth < READER_MAX_DEPTH => {
                self.i += 1;
                self.array(depth + 1)
            }
            b'"' => {
                self.i += 1;
                self.string(self.defer).map(J::Str)
            }
            b't' => self.literal(b"true", J::Bool(true)),
            b'f' => self.literal(b"false", J::Bool(false)),
            b'n' => self.literal(b"null", J::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], v: J<'a>) -> Option<J<'a>> {
        if self.b.get(self.i..self.i + word.len())? != word {
            return None;
        }
        self.i += word.len();
        Some(v)
    }

    fn object(&mut self, depth: usize) -> Option<J<'a>> {
        self.ws();
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Some(J::Obj(Vec::new()));
        }
        let mut out: Pairs<'a> = Vec::with_capacity(4);
        loop {
            self.ws();
            if self.next()? != b'"' {
                return None;
            }
            // Keys are decoded on their own (they are compared while reading).
            let k = self.string(false)?;
            self.ws();
            if self.next()? != b':' {
                return None;
            }
            let v = self.value(depth)?;
            // A repeated key keeps its first place and its last value (as serde_json's
            // map and the serde reader of this tree do).
            match out.iter_mut().find(|(old, _)| *old == k) {
                Some((_, old)) => {
                    // The value takes the earlier one's place: the places of decoded
                    // strings would no longer be in document order.
                    if self.defer && (has_place(old) || has_place(&v)) {
                        return None;
                    }
                    *old = v;
                }
                None => out.push((k, v)),
            }
            self.ws();
            match self.next()? {
                b',' => {}
                b'}' => return Some(J::Obj(out)),
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<J<'a>> {
        self.ws();
        if self.b.get(self.i) == Some(&b']') {
            self.i += 1;
            return Some(J::Arr(Vec::new()));
        }
        let mut out = Vec::with_capacity(4);
        loop {
            out.push(self.value(depth)?);
            self.ws();
            match self.next()? {
                b',' => {}
                b']' => return Some(J::Arr(out)),
                _ => return None,
            }
        }
    }

    /// A string's contents, the opening quote read: borrowed from the body when it has
    /// no escape; with escapes, decoded on its own, or when `defer` into the shared
    /// buffer, leaving an empty owned string as its place.
    fn string(&mut self, defer: bool) -> Option<Cow<'a, str>> {
        let start = self.i;
        let at = start + find_special(self.b.get(start..)?)?;
        match self.b[at] {
            b'"' => {
                self.i = at + 1;
                Some(Cow::Borrowed(self.text.get(start..at)?))
            }
            b'\\' if defer => {
                if self.decoded.capacity() == 0 {
                    // Decoded text is never longer than what is left of the body.
                    self.decoded.reserve(self.b.len() - start);
                }
                let (end, canonical) = unescape(self.text, start, at, &mut self.decoded)?;
                self.strings
                    .push((start, end, self.decoded.len(), canonical));
                self.i = end;
                Some(Cow::Owned(String::new()))
            }
            b'\\' => {
                let mut s = String::with_capacity(at - start + 32);
                self.i = unescape(self.text, start, at, &mut s)?.0;
                Some(Cow::Owned(s))
            }
            _ => None,
        }
    }

    /// A number: a non-negative integer of up to 19 digits is read here; any other
    /// (negative, fraction, exponent, larger) is checked against the grammar here and
    /// converted by serde_json, so floats round as before.
    fn number(&mut self) -> Option<J<'a>> {
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let negative = b[i] == b'-';
        if negative {
            i += 1;
        }
        let digits = |i: &mut usize| {
            let from = *i;
            while let Some(b'0'..=b'9') = b.get(*i) {
                *i += 1;
            }
            *i > from
        };
        match b.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => {
                digits(&mut i);
            }
            _ => return None,
        }
        let int_end = i;
        let mut integer = true;
        if b.get(i) == Some(&b'.') {
            integer = false;
            i += 1;
            if !digits(&mut i) {
                return None;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            integer = false;
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            if !digits(&mut i) {
                return None;
            }
        }
        self.i = i;
        if integer && !negative && int_end - start <= 19 {
            let n = b[start..int_end]
                .iter()
                .fold(0u64, |n, &c| n * 10 + u64::from(c - b'0'));
            return Some(J::U(n));
        }
        match serde_json::from_str::<J<'_>>(self.text.get(start..i)?).ok()? {
            J::U(n) => Some(J::U(n)),
            J::I(n) => Some(J::I(n)),
            J::F(n) => Some(J::F(n)),
            _ => None,
        }
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HEX: &[u8; 16] = b"0123456789abcdef";
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether a byte must be escaped in a JSON string (or ends one): `"`, `\` or a control
/// character.
fn special(c: u8) -> bool {
    c < 0x20 || c == b'"' || c == b'\\'
}

/// The index of the first byte of `b` that [`special`] holds for, eight bytes at a time.
/// (In each word the lowest flagged byte is exact; flags above it may be spurious and are
/// never read.)
fn find_special(b: &[u8]) -> Option<usize> {
    let mut words = b.chunks_exact(8);
    let mut base = 0;
    for w in words.by_ref() {
        let mut x = [0u8; 8];
        x.copy_from_slice(w);
        let x = u64::from_le_bytes(x);
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
        let flags = zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGHS);
        if flags != 0 {
            return Some(base + (flags.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&c| special(c))
        .map(|k| base + k)
}

/// `s` as a JSON string, escaped exactly as serde_json writes it (`\"`, `\\`, the short
/// forms `\b \f \n \r \t`, other control characters as `\u00xx`; nothing else).
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    let mut run = 0;
    while let Some(k) = find_special(&b[run..]) {
        let at = run + k;
        out.extend_from_slice(&b[run..at]);
        let c = b[at];
        let short = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            _ => 0,
        };
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xf)],
            ]);
        }
        run = at + 1;
    }
    out.extend_from_slice(&b[run..]);
    out.push(b'"');
}

fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

impl J<'_> {
    /// Appends the tree as compact JSON, byte for byte what `serde_json::to_writer` writes
    /// for it (floats are written by serde_json itself).
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            J::Null => out.extend_from_slice(b"null"),
            J::Bool(true) => out.extend_from_slice(b"true"),
            J::Bool(false) => out.extend_from_slice(b"false"),
            J::U(n) => write_u64(out, *n),
            J::I(n) => {
                if *n < 0 {
                    out.push(b'-');
                }
                write_u64(out, n.unsigned_abs());
            }
            J::F(n) => {
                let _ = serde_json::to_writer(&mut *out, n);
            }
            J::Str(s) => write_str(out, s),
            J::Arr(a) => {
                out.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    x.write(out);
                }
                out.push(b']');
            }
            J::Obj(p) => {
                out.push(b'{');
                for (i, (k, v)) in p.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(out, k);
                    out.push(b':');
                    v.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parses_and_writes_back_what_serde_json_reads() {
        let body = br#"{"a":[1,-2,0.5,"x\"y",true,null,{"b":{}}],"a":"last","c":"\u00e9"}"#;
        let j = J::parse(body).expect("parses");
        assert!(matches!(j.at("c"), J::Str(Cow::Owned(_))));
        assert!(matches!(j.at("a"), J::Str(Cow::Borrowed("last"))));
        assert!(matches!(&j, J::Obj(p) if matches!(p[0].0, Cow::Borrowed("a"))));
        let back: serde_json::Value = serde_json::from_slice(&j.to_vec()).expect("json");
        let direct: serde_json::Value = serde_json::from_slice(body).expect("json");
        assert_eq!(back, direct);
    }

    /// A tree for the writer: strings of every kind of character, numbers of every kind
    /// (floats include NaN and infinities, which serde_json writes as `null`).
    fn tree() -> impl Strategy<Value = J<'static>> {
        let text = prop_oneof!["[a-z ]{0,12}", "[\\x00-\\x1f\"\\\\/a\\x7f]{0,6}", ".{0,8}",];
        let leaf = prop_oneof![
            Just(J::Null),
            any::<bool>().prop_map(J::Bool),
            any::<u64>().prop_map(J::U),
            (i64::MIN..0).prop_map(J::I),
            any::<f64>().prop_map(J::F),
            text.clone().prop_map(J::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(J::Arr),
                prop::collection::vec((text.clone(), inner), 0..6)
                    .prop_map(|p| J::Obj(p.into_iter().map(|(k, v)| (Cow::Owned(k), v)).collect())),
            ]
        })
    }

    /// `j` spelled as JSON text with choices drawn from `r`: whitespace between tokens,
    /// characters written raw, as short escapes or as `\u` escapes (surrogate pairs
    /// beyond the BMP, either case of hex), numbers in plain or exponent form. Returns
    /// whether a surrogate escape was written (the fast reader leaves those to serde_json).
    fn spell(j: &J<'_>, r: &mut impl Iterator<Item = u8>, out: &mut String) -> bool {
        let mut pick = || r.next().unwrap_or(0);
        spell_with(j, &mut pick, out)
    }

    fn ws(c: u8, out: &mut String) {
        if c.is_multiple_of(4) {
            out.push([' ', '\n', '\t', '\r'][usize::from(c / 4 % 4)]);
        }
    }

    fn spell_str(s: &str, pick: &mut dyn FnMut() -> u8, out: &mut String) -> bool {
        let mut surrogate = false;
        out.push('"');
        for c in s.chars() {
            let how = pick() % 4;
            let short = match c {
                '"' => Some('"'),
                '\\' => Some('\\'),
                '/' => Some('/'),
                '\u{8}' => Some('b'),
                '\u{c}' => Some('f'),
                '\n' => Some('n'),
                '\r' => Some('r'),
                '\t' => Some('t'),
                _ => None,
            };
            let must = c < ' ' || c == '"' || c == '\\';
            if how == 0 || (must && short.is_none()) {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    surrogate |= (0xd800..0xe000).contains(u);
                    if pick().is_multiple_of(2) {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            } else if let (Some(e), true) = (short, how == 1 || must) {
                out.push('\\');
                out.push(e);
            } else {
                out.push(c);
            }
        }
        out.push('"');
        surrogate
    }

    fn spell_with(j: &J<'_>, pick: &mut dyn FnMut() -> u8, out: &mut String) -> bool {
        let mut surrogate = false;
        ws(pick(), out);
        match j {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::U(n) if pick().is_multiple_of(3) => out.push_str(&format!("{n}e0")),
            J::U(n) => out.push_str(&n.to_string()),
            J::I(n) => out.push_str(&n.to_string()),
            J::F(f) if pick().is_multiple_of(2) => out.push_str(&format!("{f:e}")),
            J::F(f) => out.push_str(&serde_json::to_string(f).unwrap_or_default()),
            J::Str(s) => surrogate |= spell_str(s, pick, out),
            J::Arr(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    surrogate |= spell_with(x, pick, out);
                }
                ws(pick(), out);
                out.push(']');
            }
            J::Obj(p) => {
                out.push('{');
                for (i, (k, v)) in p.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(pick(), out);
                    surrogate |= spell_str(k, pick, out);
                    ws(pick(), out);
                    out.push(':');
                    surrogate |= spell_with(v, pick, out);
                }
                ws(pick(), out);
                out.push('}');
            }
        }
        ws(pick(), out);
        surrogate
    }

    /// Whether an object of `j` has a key twice.
    fn repeated_keys(j: &J<'_>) -> bool {
        match j {
            J::Arr(a) => a.iter().any(repeated_keys),
            J::Obj(p) => {
                p.iter()
                    .enumerate()
                    .any(|(i, (k, _))| p[..i].iter().any(|(o, _)| o == k))
                    || p.iter().any(|(_, v)| repeated_keys(v))
            }
            _ => false,
        }
    }

    fn finite(j: &J<'_>) -> bool {
        match j {
            J::F(f) => f.is_finite(),
            J::Arr(a) => a.iter().all(finite),
            J::Obj(p) => p.iter().all(|(_, v)| finite(v)),
            _ => true,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The hand-written writer against serde_json's writer of the same tree.
        #[test]
        fn the_writer_writes_what_serde_json_writes(j in tree()) {
            let old = serde_json::to_vec(&j).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let new = j.to_vec();
            prop_assert_eq!(String::from_utf8_lossy(&new), String::from_utf8_lossy(&old));
        }

        /// The hand-written reader against serde_json's reader of the same text, spelled
        /// with every kind of whitespace, escape and number form.
        #[test]
        fn the_reader_reads_what_serde_json_reads(
            j in tree().prop_filter("finite", finite),
            choices in prop::collection::vec(any::<u8>(), 1..64),
        ) {
            let mut text = String::new();
            let surrogate = spell(&j, &mut choices.iter().copied().cycle(), &mut text);
            let old: J<'_> = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            let fast = read(text.as_bytes(), None, None);
            prop_assert!(fast.is_some() || surrogate, "the reader refused {}", text);
            if let Some(fast) = fast {
                prop_assert_eq!(&fast, &old);
            }
            // Decoding into one buffer: the reader takes the text (unless a repeated key
            // drops a value with escapes), and the filled tree is serde_json's.
            let mut unescaped = Unescaped::of(text.as_bytes());
            let deferred = read(text.as_bytes(), None, Some(&mut unescaped)).is_some();
            prop_assert!(deferred || surrogate || repeated_keys(&j), "the one-buffer reader refused {}", text);
            let mut unescaped = Unescaped::of(text.as_bytes());
            prop_assert_eq!(J::parse_in(&mut unescaped).0.ok(), Some(old.clone()));
            prop_assert_eq!(J::parse(text.as_bytes()).ok(), Some(old));
        }

        /// The writer that copies strings from the body ([`Out`]) against the tree's own
        /// writer, on texts spelled with every kind of escape (those the writer writes and
        /// those it does not, which it must not copy).
        #[test]
        fn the_copying_writer_writes_what_the_writer_writes(
            j in tree().prop_filter("finite", finite),
            choices in prop::collection::vec(any::<u8>(), 1..64),
        ) {
            let mut text = String::new();
            spell(&j, &mut choices.iter().copied().cycle(), &mut text);
            let mut unescaped = Unescaped::of(text.as_bytes());
            let (tree, unescaped) = J::parse_in(&mut unescaped);
            let tree = tree.map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            let mut out = Out::new(unescaped, 0);
            out.j(&tree);
            let expected = tree.to_vec();
            prop_assert_eq!(String::from_utf8_lossy(&out.buf), String::from_utf8_lossy(&expected), "{}", text);
        }

        /// A text one byte away from valid JSON: whatever the reader takes, serde_json takes
        /// with the same tree; what it refuses goes to serde_json (same result or error).
        #[test]
        fn the_reader_takes_nothing_serde_json_refuses(
            j in tree().prop_filter("finite", finite),
            choices in prop::collection::vec(any::<u8>(), 1..64),
            at in any::<prop::sample::Index>(),
            byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'}'), Just(b']'), Just(b'0'), Just(b'-'), Just(b'.'), Just(b'e'), Just(0x01u8), Just(0xc3u8), any::<u8>()],
            how in 0u8..3,
        ) {
            let mut text = String::new();
            spell(&j, &mut choices.iter().copied().cycle(), &mut text);
            let mut bytes = text.into_bytes();
            let at = at.index(bytes.len() + 1);
            match how {
                0 if at < bytes.len() => bytes[at] = byte,
                1 if at < bytes.len() => { bytes.remove(at); }
                _ => bytes.insert(at, byte),
            }
            let old = serde_json::from_slice::<J<'_>>(&bytes);
            if let Some(fast) = read(&bytes, None, None) {
                prop_assert_eq!(Some(&fast), old.as_ref().ok(), "{}", String::from_utf8_lossy(&bytes));
            }
            let mut unescaped = Unescaped::of(&bytes);
            let (one_buffer, _) = J::parse_in(&mut unescaped);
            prop_assert_eq!(one_buffer.as_ref().ok(), old.as_ref().ok(), "{}", String::from_utf8_lossy(&bytes));
            prop_assert_eq!(one_buffer.map_err(|e| e.to_string()).err(), old.as_ref().map_err(|e| e.to_string()).err());
            let new = J::parse(&bytes);
            prop_assert_eq!(new.as_ref().ok(), old.as_ref().ok());
            prop_assert_eq!(new.map_err(|e| e.to_string()).err(), old.map_err(|e| e.to_string()).err());
        }
    }

    /// A repeated key puts a later value in an earlier place: when either value has a
    /// string with escapes, the one-buffer reader leaves the body to serde_json (its places
    /// would be filled out of order — found by `the_reader_reads_what_serde_json_reads`).
    #[test]
    fn a_repeated_key_with_escaped_strings_reads_as_serde_json_reads_it() {
        for text in [
            r#"{"":null,"b":["a\u007f"],"":"a\u0061"}"#,
            r#"{"":"\u0061","b":["x\n"],"":1}"#,
            r#"{"a":{"k":"\n","k":"\t"},"b":"\r"}"#,
        ] {
            let mut unescaped = Unescaped::of(text.as_bytes());
            let (tree, _) = J::parse_in(&mut unescaped);
            assert_eq!(
                tree.ok(),
                serde_json::from_str::<J<'_>>(text).ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn the_reader_leaves_deep_nesting_and_surrogates_to_serde_json() {
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(read(deep.as_bytes(), None, None).is_none());
        assert_eq!(
            J::parse(deep.as_bytes()).ok(),
            serde_json::from_str::<J<'_>>(&deep).ok()
        );
        assert!(J::parse(format!("{}{}", "[".repeat(200), "]".repeat(200)).as_bytes()).is_err());
        let pair = br#""\ud83d\ude00""#;
        assert!(read(pair, None, None).is_none());
        assert_eq!(J::parse(pair).ok(), Some(J::from("\u{1f600}")));
        assert!(J::parse(br#""\ud83d""#).is_err());
        assert_eq!(
            read(b" 18446744073709551615 ", None, None),
            Some(J::U(u64::MAX))
        );
        assert_eq!(
            read(b"-0", None, None),
            serde_json::from_slice::<J<'_>>(b"-0").ok()
        );
        assert!(read(b"01", None, None).is_none() && J::parse(b"01").is_err());
    }
}
