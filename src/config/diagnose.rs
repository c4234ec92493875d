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
use super::{combo, resilience};

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

/// What a key's number means beyond its range, where a bare number would not say (the
/// keys are paths without indices).
const NUMBER_HINTS: &[(&str, &str)] = &[
    ("server.workers", "0 = one per core"),
    ("server.request_timeout_ms", "0 = no overall deadline"),
    ("server.pool_max_idle_per_host", "0 = no pooling"),
    ("connections.priority", "lower is tried first"),
];

/// The range a numeric key takes, where a table of bounds holds it (the resilience fields
/// and the combo config cascade; the other keys' ranges are checked, and said, by `validate`
/// once the value is a number).
fn range_of(key: &str) -> Option<(u64, u64)> {
    let key = strip_indices(key);
    if let Some(path) = key.strip_prefix("resilience.") {
        return resilience::num_fields()
            .into_iter()
            .find(|f| f.path == path)
            .map(|f| (f.min, f.max));
    }
    let (layer, name) = key.rsplit_once('.')?;
    let combo_layer = layer == "combo_defaults"
        || layer == "combos.config"
        || layer.starts_with("combo_provider_overrides.");
    combo_layer.then_some(())?;
    combo::BOUNDS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, lo, hi)| (*lo, *hi))
}

/// The unit a key's name carries (`_ms`, `_bytes`, …), as words.
fn unit_of(key: &str) -> Option<&'static str> {
    let name = key.rsplit('.').next().unwrap_or(key);
    [
        ("_ms", "milliseconds"),
        ("_sec", "seconds"),
        ("_minutes", "minutes"),
        ("_bytes", "bytes"),
        ("_percent", "percent"),
    ]
    .into_iter()
    .find(|(suffix, _)| name.ends_with(suffix))
    .map(|(_, words)| words)
}

/// The largest value of a Rust integer type serde names in `expected u32`.
fn type_max(rust: &str) -> Option<u64> {
    Some(match rust {
        "u8" => u64::from(u8::MAX),
        "u16" => u64::from(u16::MAX),
        "u32" => u64::from(u32::MAX),
        "u64" | "usize" => u64::MAX,
        _ => return None,
    })
}

/// serde's `string "two"` / ``integer `3` `` / `sequence`, as the value the file holds.
fn got_words(unexpected: &str) -> String {
    let ticked = |prefix: &str| {
        unexpected
            .strip_prefix(prefix)
            .map(|v| v.trim_matches('`').to_string())
    };
    if let Some(s) = unexpected.strip_prefix("string ") {
        return format!("the string {s}");
    }
    if let Some(v) = ticked("integer ")
        .or_else(|| ticked("floating point "))
        .or_else(|| ticked("boolean "))
    {
        return v;
    }
    match unexpected {
        "sequence" => "an array".to_string(),
        "map" => "a table".to_string(),
        "datetime" => "a date or time".to_string(),
        other => other.to_string(),
    }
}

/// serde's `invalid type: string "two", expected u32` for the value at `key` (a key path,
/// when the error is a value's), in the operator's terms: what the key takes — a whole
/// number (of the unit its name carries, in its range where a bounds table holds it, with
/// what 0 means where that is not plain), true or false, a string, an array, a table —
/// and what the file holds (`expected a whole number (0 = one per core), got the string
/// "two"`). A Rust type's range is never quoted, but for a number beyond what the key can
/// hold at all.
pub fn plain_message(key: Option<&str>, message: &str) -> String {
    let parsed = ["invalid type: ", "invalid value: "]
        .iter()
        .find_map(|p| message.strip_prefix(p))
        .and_then(|rest| rest.rsplit_once(", expected "));
    let Some((unexpected, expected)) = parsed else {
        return plain_shapes(message);
    };
    let got = got_words(unexpected);
    let want = match (expected, type_max(expected)) {
        (_, Some(type_max)) => {
            let mut want = "a whole number".to_string();
            if let Some(unit) = key.and_then(unit_of) {
                want = format!("{want} of {unit}");
            }
            let number: Option<i128> = got.parse().ok();
            let range = key.and_then(range_of);
            let hint = key.and_then(|k| {
                let k = strip_indices(k);
                NUMBER_HINTS
                    .iter()
                    .find(|(path, _)| *path == k)
                    .map(|(_, hint)| *hint)
            });
            match (range, number) {
                (Some((lo, hi)), _) => want = format!("{want} in {lo}..={hi}"),
                (None, Some(n)) if n < 0 => want = format!("{want}, 0 or more"),
                (None, Some(_)) => want = format!("{want} no larger than {type_max}"),
                (None, None) => {}
            }
            if let Some(hint) = hint {
                want = format!("{want} ({hint})");
            }
            want
        }
        ("i64", None) => "a whole number".to_string(),
        ("f64", None) => "a number".to_string(),
        ("a boolean", None) => "true or false".to_string(),
        ("a string", None) => "a string (in quotes)".to_string(),
        (other, None) => plain_shapes(&format!("expected {other}"))
            .trim_start_matches("expected ")
            .to_string(),
    };
    format!("expected {want}, got {got}")
}

/// serde's names of shapes (`a sequence`, `struct RawServer`, the combo target's untagged
/// enum) in the file's terms.
fn plain_shapes(message: &str) -> String {
    let mut out = message.to_string();
    for (rust, plain) in [
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected a table"),
    ] {
        if let Some(at) = out.find(rust) {
            out.replace_range(at..at + rust.len(), plain);
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
        let plain = |key: &str, m: &str| plain_message(Some(key), m);
        assert_eq!(
            plain(
                "server.workers",
                "invalid type: string \"two\", expected u32"
            ),
            "expected a whole number (0 = one per core), got the string \"two\""
        );
        // The unit of the key's name; a resilience or combo key's range from its table.
        assert_eq!(
            plain(
                "server.idle_timeout_ms",
                "invalid type: string \"5s\", expected u64"
            ),
            "expected a whole number of milliseconds, got the string \"5s\""
        );
        assert_eq!(
            plain(
                "resilience.request_queue.max_wait_ms",
                "invalid type: floating point `1.5`, expected u64"
            ),
            "expected a whole number of milliseconds in 0..=86400000, got 1.5"
        );
        assert_eq!(
            plain(
                "combos[2].config.max_retries",
                "invalid value: integer `-1`, expected u32"
            ),
            "expected a whole number in 0..=10, got -1"
        );
        // Outside any table: below 0, or beyond what the key can hold at all.
        assert_eq!(
            plain(
                "connections[0].weight",
                "invalid value: integer `-1`, expected u32"
            ),
            "expected a whole number, 0 or more, got -1"
        );
        assert_eq!(
            plain(
                "resilience.model_lockout.error_codes",
                "invalid value: integer `70000`, expected u16"
            ),
            "expected a whole number no larger than 65535, got 70000"
        );
        assert_eq!(
            plain(
                "connections[0].disable_cooling",
                "invalid type: string \"yes\", expected a boolean"
            ),
            "expected true or false, got the string \"yes\""
        );
        assert_eq!(
            plain(
                "server.admin_token_env",
                "invalid type: integer `3`, expected a string"
            ),
            "expected a string (in quotes), got 3"
        );
        assert_eq!(
            plain(
                "server",
                "invalid type: integer `3`, expected struct RawServer"
            ),
            "expected a table, got 3"
        );
        assert_eq!(
            plain(
                "providers[0].models",
                "invalid type: string \"a\", expected a sequence"
            ),
            "expected an array, got the string \"a\""
        );
        assert_eq!(
            plain("server.listen", "invalid type: sequence, expected a string"),
            "expected a string (in quotes), got an array"
        );
        // Not a value's type: the shapes only.
        assert_eq!(
            plain_message(None, "missing field `status`"),
            "missing field `status`"
        );
    }

    #[test]
    fn every_scalar_raw_key_gets_a_plain_type_message() {
        // Each key of the server, connection, provider and combo tables, given a value of
        // the wrong type, reads back without a Rust type name.
        for (table, fields) in [
            ("server", fields_of::<RawServer>()),
            ("connections", fields_of::<RawConnection>()),
            ("providers", fields_of::<RawProvider>()),
            ("combo_defaults", fields_of::<RawComboConfig>()),
        ] {
            for field in fields {
                let header = if table == "connections" || table == "providers" {
                    format!("[[{table}]]")
                } else {
                    format!("[{table}]")
                };
                // No scalar or array key takes a table (a table-valued one fails inside).
                let text = format!("{header}\n{field} = {{ x = 1 }}\n");
                let Err(e) = toml::from_str::<RawConfig>(&text) else {
                    continue;
                };
                let key = key_at(&text, e.span().map_or(0, |s| s.start));
                let m = plain_message(key.as_deref(), e.message());
                for rust in [
                    "u8", "u16", "u32", "u64", "i64", "struct ", "sequence", " map",
                ] {
                    assert!(!m.contains(rust), "{table}.{field}: {m}");
                }
                assert!(m.starts_with("expected "), "{table}.{field}: {m}");
                assert!(m.contains(", got "), "{table}.{field}: {m}");
            }
        }
    }
}
