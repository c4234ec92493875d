//! Messages for the two problems serde reports in its own terms: an unknown key (which key
//! did the operator mean?) and a value of the wrong type (which key, and what kind of value
//! does it take — not which Rust type holds it). The known key names come from the raw
//! structs themselves (their serde field lists) and from the resilience field table, so a
//! key added to `raw` is suggested without a list to keep in step.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Visitor};

use super::raw::{
    RawClientKey, RawCombo, RawComboConfig, RawConfig, RawConnection, RawProvider,
    RawRateLimitOverrides, RawResilience, RawServer, RawWeightedTarget,
};
use super::resilience;

/// Stops a capture as soon as the field list is known.
#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field list captured")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop
    }
}

/// A deserializer that records the field names a struct asks for and deserializes nothing.
struct Capture<'a>(&'a Cell<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for Capture<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Stop> {
        self.0.set(fields);
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The keys a raw struct accepts.
fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let captured = Cell::new(&[][..]);
    let _ = T::deserialize(Capture(&captured));
    captured.get()
}

/// `connections[2].rate_limit_overrides` → `connections.rate_limit_overrides`.
fn strip_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut depth = 0usize;
    for c in path.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The keys known in `section` (a key path without indices; "" is the top level).
fn known_in(section: &str) -> Vec<&'static str> {
    let fixed: Option<&'static [&'static str]> = match section {
        "" => Some(fields_of::<RawConfig>()),
        "server" => Some(fields_of::<RawServer>()),
        "client_keys" => Some(fields_of::<RawClientKey>()),
        "providers" => Some(fields_of::<RawProvider>()),
        "connections" => Some(fields_of::<RawConnection>()),
        "connections.rate_limit_overrides" => Some(fields_of::<RawRateLimitOverrides>()),
        "combos" => Some(fields_of::<RawCombo>()),
        // Its flattened catch-all hides the field list from `fields_of`.
        "combos.targets" => Some(RawWeightedTarget::FIELDS),
        "combos.config" | "combo_defaults" => Some(fields_of::<RawComboConfig>()),
        "resilience" => Some(fields_of::<RawResilience>()),
        s if s.starts_with("combo_provider_overrides.") => Some(fields_of::<RawComboConfig>()),
        _ => None,
    };
    if let Some(f) = fixed {
        return f.to_vec();
    }
    // A resilience sub-table: the last segments of the paths under it.
    let mut out: Vec<&'static str> = Vec::new();
    if let Some(sub) = section.strip_prefix("resilience.") {
        let prefix = format!("{sub}.");
        let paths = resilience::num_fields()
            .into_iter()
            .map(|f| f.path)
            .chain(resilience::bool_fields().into_iter().map(|f| f.path));
        for path in paths {
            if let Some(rest) = path.strip_prefix(prefix.as_str()) {
                let seg = rest.split('.').next().unwrap_or(rest);
                if !out.contains(&seg) {
                    out.push(seg);
                }
            }
        }
    }
    out
}

/// Levenshtein distance over bytes (key names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diag = above;
        }
    }
    row[b.len()]
}

/// Lower case without `_` and `-`: `idleTimeoutMs` and `idle-timeout-ms` meet `idle_timeout_ms`.
fn folded(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The known key nearest to `name`, if it is near enough to be a slip.
fn nearest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    if let Some(k) = known.iter().find(|k| folded(k) == folded(name)) {
        return Some(k);
    }
    // A forgotten unit suffix: `max_wait` for `max_wait_ms`.
    if let Some(k) = known.iter().find(|k| {
        k.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('_'))
    }) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (distance(name, k), *k))
        .filter(|(d, _)| *d <= 2 || d * 4 <= name.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The message for the unknown key at `path` (`server.idle_timeot_ms`).
pub fn unknown_key(path: &str) -> String {
    let (section, name) = path.rsplit_once('.').unwrap_or(("", path));
    let name = name.split('[').next().unwrap_or(name);
    match nearest(name, &known_in(&strip_indices(section))) {
        Some(k) => format!("unknown key; did you mean `{k}`?"),
        None => "unknown key".to_string(),
    }
}

/// The key path of the value at byte `offset` of `text`: the key written on its line (or the
/// nearest line above that has one, for a value inside a multi-line array) under the last
/// table header before it, in this module's key style (`connections[1].weight`).
pub fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let mut key = None;
    for line in text
        .get(..line_start + line_len(text, line_start))?
        .lines()
        .rev()
    {
        let t = line.trim();
        if t.starts_with('[') {
            break;
        }
        if let Some((k, _)) = t.split_once('=')
            && !t.starts_with('#')
        {
            key = Some(k.trim().trim_matches('"').to_string());
            break;
        }
    }
    let key = key?;
    // The table header above the key, and for an array of tables its index.
    let mut section = String::new();
    for (pos, line) in line_starts(text) {
        if pos > line_start {
            break;
        }
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim();
            let count = text
                .get(..pos)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.trim()
                        .strip_prefix("[[")
                        .and_then(|r| r.split("]]").next())
                        .map(str::trim)
                        == Some(name)
                })
                .count();
            section = format!("{name}[{count}]");
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
            let name = name.trim();
            // A sub-table of the last array entry (`[connections.rate_limit_overrides]`).
            section = match section.split_once('[') {
                Some((arr, idx)) if name.starts_with(&format!("{arr}.")) => {
                    format!("{arr}[{idx}{}", name.get(arr.len()..).unwrap_or_default())
                }
                _ => name.to_string(),
            };
        }
    }
    Some(if section.is_empty() {
        key
    } else {
        format!("{section}.{key}")
    })
}

fn line_len(text: &str, start: usize) -> usize {
    text.get(start..)
        .map_or(0, |rest| rest.find('\n').unwrap_or(rest.len()))
}

fn line_starts(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut pos = 0;
    text.split('\n').map(move |line| {
        let here = pos;
        pos += line.len() + 1;
        (here, line)
    })
}

/// serde's `expected u32` / `struct RawServer` / `a sequence`, in the file's terms.
pub fn plain_types(message: &str) -> String {
    let mut out = message.to_string();
    for (rust, plain) in [
        ("expected u8", "expected a whole number (0..=255)"),
        ("expected u16", "expected a whole number (0..=65535)"),
        ("expected u32", "expected a whole number (0..=4294967295)"),
        ("expected u64", "expected a non-negative whole number"),
        ("expected usize", "expected a non-negative whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
    ] {
        if let Some(at) = out.find(rust) {
            let end = at + rust.len();
            // Whole words only (`u32` but not `u325`).
            let whole_word = !out
                .get(end..)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_alphanumeric()));
            if whole_word {
                out.replace_range(at..end, plain);
            }
        }
    }
    // The one untagged enum of the file: a combo target.
    const TARGET: &str = "data did not match any variant of untagged enum RawComboTarget";
    if let Some(at) = out.find(TARGET) {
        out.replace_range(
            at..at + TARGET.len(),
            "expected \"provider/model\" or a table with `model` or `combo` and a whole-number \
             `weight`",
        );
    }
    const STRUCT: &str = "expected struct ";
    if let Some(at) = out.find(STRUCT) {
        let name_start = at + STRUCT.len();
        let name_end = out
            .get(name_start..)
            .and_then(|rest| rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
            .map_or(out.len(), |e| name_start + e);
        out.replace_range(at..name_end, "expected a table");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_lists_come_from_the_raw_structs() {
        assert!(fields_of::<RawServer>().contains(&"idle_timeout_ms"));
        assert!(known_in("resilience.request_queue").contains(&"max_wait_ms"));
        assert!(known_in("resilience.provider_breaker").contains(&"apikey"));
        // The target table's list is written out: every key in it is a field, not "other".
        let all: String = RawWeightedTarget::FIELDS
            .iter()
            .map(|k| format!("{k} = {}\n", if *k == "weight" { "1" } else { "\"x\"" }))
            .collect();
        let t: RawWeightedTarget = toml::from_str(&all).unwrap();
        assert!(t.other.is_empty(), "{:?}", t.other);
        assert!(t.model.is_some() && t.combo.is_some() && t.weight.is_some());
    }

    #[test]
    fn unknown_keys_suggest_the_nearest_known_one() {
        assert_eq!(
            unknown_key("server.idle_timeot_ms"),
            "unknown key; did you mean `idle_timeout_ms`?"
        );
        assert_eq!(
            unknown_key("server.idleTimeoutMs"),
            "unknown key; did you mean `idle_timeout_ms`?"
        );
        assert_eq!(
            unknown_key("connections[3].prority"),
            "unknown key; did you mean `priority`?"
        );
        assert_eq!(
            unknown_key("resilience.request_queue.max_wait"),
            "unknown key; did you mean `max_wait_ms`?"
        );
        assert_eq!(unknown_key("server.bogus_setting"), "unknown key");
        assert_eq!(unknown_key("sever"), "unknown key; did you mean `server`?");
    }

    #[test]
    fn a_value_offset_names_its_key() {
        let text = "[server]\nworkers = \"two\"\n\n[[connections]]\nid = \"a\"\n\n\
                    [[connections]]\nid = \"b\"\npriority = \"x\"\n\
                    [connections.rate_limit_overrides]\nmax_wait_ms = true\n";
        let at = |needle: &str| text.find(needle).unwrap();
        assert_eq!(key_at(text, at("\"two\"")).unwrap(), "server.workers");
        assert_eq!(
            key_at(text, at("\"x\"")).unwrap(),
            "connections[1].priority"
        );
        assert_eq!(
            key_at(text, at("true")).unwrap(),
            "connections[1].rate_limit_overrides.max_wait_ms"
        );
    }

    #[test]
    fn rust_types_become_kinds_of_value() {
        assert_eq!(
            plain_types("invalid type: string \"x\", expected u32"),
            "invalid type: string \"x\", expected a whole number (0..=4294967295)"
        );
        assert_eq!(
            plain_types("invalid type: integer `3`, expected struct RawServer"),
            "invalid type: integer `3`, expected a table"
        );
        assert_eq!(
            plain_types("invalid type: string \"a\", expected a sequence"),
            "invalid type: string \"a\", expected an array"
        );
    }
}
