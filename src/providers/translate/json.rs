//! A borrowing JSON tree for the request converters: strings without escapes point into the
//! request body, objects are vectors of pairs in document order (a repeated key keeps its
//! last value, as `serde_json::Value` does), and the tree serialises itself. Parsing into it
//! and writing it out costs a fraction of a `serde_json::Value` round (no string copies, no
//! map inserts).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
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
    pub fn parse(body: &'a [u8]) -> Result<J<'a>, serde_json::Error> {
        serde_json::from_slice(body)
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

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1024);
        let _ = serde_json::to_writer(&mut out, self);
        out
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

#[cfg(test)]
mod tests {
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
}
