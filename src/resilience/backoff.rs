//! Cooldown arithmetic and upstream retry hints (spec A §3.3). This module owns the
//! formulas every cooldown in `resilience/` is built from — the scaled exponential
//! connection cooldown, the next backoff level — and the parsers that turn an upstream
//! failure's headers and body into "retry in N ms": `Retry-After` (seconds or HTTP date),
//! `X-RateLimit-Reset` (absolute epoch), the JSON hint fields (Google `RetryInfo`,
//! `retryAfter`, `retry_after_ms`) and the prose patterns providers write in error text.
//! It also holds the date handling those parsers need: RFC 7231 HTTP dates through the
//! `httpdate` crate, ISO 8601 timestamps lexed here and turned into instants by the `time`
//! crate, and the RFC 3339 form the gateway prints (`time` again). No calendar arithmetic is
//! written by hand.
//!
//! Everything here is a pure function of its arguments: wall-clock "now" comes in as
//! `now_wall_ms` (milliseconds since the Unix epoch), nothing reads a clock, nothing
//! allocates except the lower-cased copy the prose scanner works on.
//!
//! Classification (`classify.rs`) calls [`upstream_retry_hint`] (and the per-source parsers
//! when it needs a quota reset hint); connection state and model lockout call
//! [`scaled_cooldown`].
//!
//! Deliberate deviations from the spec (to be listed in `docs/compat.md`):
//! * **Header hints are capped at 30 days** ([`HEADER_HINT_CAP_MS`]). The spec gives the
//!   `Retry-After` / `X-RateLimit-Reset` headers no cap; a garbage header
//!   (`Retry-After: 99999999999`) must not park a connection for three thousand years.
//! * **A hint of zero is no hint.** `Retry-After: 0` (or an `X-RateLimit-Reset` equal to
//!   now) yields `None`, the same as a past date, so the scaled backoff applies instead of
//!   a zero-length "cooldown" that resets the level.
//! * **ISO timestamps without an offset are UTC.** JavaScript's `Date` reads a date-time
//!   without a zone as local time, which depends on the host; a gateway should not.
//! * **HTTP dates in all three RFC 7231 forms** (IMF-fixdate, RFC 850, asctime) are
//!   accepted, as RFC 7231 §7.1.1.1 requires of recipients, with names in any case; a
//!   weekday that disagrees with its date makes the date invalid (no hint).
//! * **Bounded input:** bodies longer than [`MAX_HINT_BODY_BYTES`] are not parsed as JSON
//!   and only their first [`MAX_HINT_BODY_BYTES`] bytes are scanned for prose hints.

use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

use super::{Headers, HintSource};
use crate::config::AuthKind;
use crate::config::resilience::{
    ConnectionCooldownProfile, DAY_MS, HOUR_MS, MINUTE_MS, ResilienceSettings, SECOND_MS,
};

/// Base cooldown when no provider profile is known (A §3.3).
pub const NO_PROFILE_BASE_COOLDOWN_MS: u64 = 5_000;
/// Backoff steps when no provider profile is known.
pub const NO_PROFILE_MAX_BACKOFF_STEPS: u32 = 15;
/// Cooldown cap when the profile has no positive `max_cooldown_ms`.
pub const DEFAULT_MAX_COOLDOWN_MS: u64 = 120_000;
/// Base used in the exponential step when the configured base is 0.
pub const ZERO_BASE_FALLBACK_MS: u64 = 1_000;

/// Cap of a Google `RetryInfo.retryDelay` hint.
pub const RETRY_INFO_CAP_MS: u64 = DAY_MS;
/// Cap of a JSON `retryAfter` timestamp or `retry_after_ms` hint.
pub const JSON_HINT_CAP_MS: u64 = 30 * DAY_MS;
/// Cap of a "please retry in N s" prose hint.
pub const TEXT_RETRY_IN_CAP_MS: u64 = DAY_MS;
/// Cap of the "reset after 1h2m3s" / "reset in N days" / "try again at `<ISO>`" prose hints.
pub const TEXT_RESET_CAP_MS: u64 = 30 * DAY_MS;
/// Cap of a header hint (Tidegate's; the spec has none — see the module docs).
pub const HEADER_HINT_CAP_MS: u64 = 30 * DAY_MS;
/// `X-RateLimit-Reset` values above this are epoch milliseconds, at or below it seconds.
pub const RATELIMIT_RESET_MS_THRESHOLD: u64 = 10_000_000_000;
/// Longest body parsed as JSON or scanned for prose hints.
pub const MAX_HINT_BODY_BYTES: usize = 256 * 1024;

// ---------------------------------------------------------------------------------------
// Scaled cooldown

/// The numbers the scaled cooldown is computed from: a connection-cooldown category
/// (`connectionCooldown.<oauth|apikey|local>`) plus the cap, which the spec takes from
/// `modelLockout.maxCooldownMs` (A §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffProfile {
    pub base_cooldown_ms: u64,
    pub max_backoff_steps: u32,
    /// 0 = [`DEFAULT_MAX_COOLDOWN_MS`].
    pub max_cooldown_ms: u64,
}

impl BackoffProfile {
    /// The profile used when the provider is unknown: 5 s, 15 steps, 120 s cap.
    pub const NO_PROFILE: Self = Self {
        base_cooldown_ms: NO_PROFILE_BASE_COOLDOWN_MS,
        max_backoff_steps: NO_PROFILE_MAX_BACKOFF_STEPS,
        max_cooldown_ms: DEFAULT_MAX_COOLDOWN_MS,
    };

    pub fn new(profile: &ConnectionCooldownProfile, max_cooldown_ms: u64) -> Self {
        Self {
            base_cooldown_ms: profile.base_cooldown_ms,
            max_backoff_steps: profile.max_backoff_steps,
            max_cooldown_ms,
        }
    }

    /// The runtime profile of a provider category (A §3.2: cap from `modelLockout`).
    pub fn from_settings(settings: &ResilienceSettings, auth: AuthKind) -> Self {
        Self::new(
            settings.connection_cooldown.get(auth),
            settings.model_lockout.max_cooldown_ms,
        )
    }

    /// The cap C: `max_cooldown_ms` if positive, else [`DEFAULT_MAX_COOLDOWN_MS`].
    pub fn cap_ms(&self) -> u64 {
        if self.max_cooldown_ms > 0 {
            self.max_cooldown_ms
        } else {
            DEFAULT_MAX_COOLDOWN_MS
        }
    }

    /// B': the base, or [`ZERO_BASE_FALLBACK_MS`] when the base is 0.
    pub fn effective_base_ms(&self) -> u64 {
        if self.base_cooldown_ms > 0 {
            self.base_cooldown_ms
        } else {
            ZERO_BASE_FALLBACK_MS
        }
    }
}

/// One step of the scaled cooldown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scaled {
    pub cooldown_ms: u64,
    /// B', the base the step was computed from.
    pub base_cooldown_ms: u64,
    pub new_backoff_level: u32,
}

/// `base × 2^exponent`, saturating.
pub fn exponential_ms(base_ms: u64, exponent: u32) -> u64 {
    base_ms.saturating_mul(1u64.checked_shl(exponent).unwrap_or(u64::MAX))
}

/// `min(B' × 2^min(L, S), C)` and the next level `min(L + 1, S)` (A §3.3).
pub fn scaled_cooldown(profile: &BackoffProfile, level: u32) -> Scaled {
    let base = profile.effective_base_ms();
    let exponent = level.min(profile.max_backoff_steps);
    Scaled {
        cooldown_ms: exponential_ms(base, exponent).min(profile.cap_ms()),
        base_cooldown_ms: base,
        new_backoff_level: new_backoff_level(level, profile.max_backoff_steps),
    }
}

/// `min(L + 1, S)`.
pub fn new_backoff_level(level: u32, max_backoff_steps: u32) -> u32 {
    level.saturating_add(1).min(max_backoff_steps)
}

// ---------------------------------------------------------------------------------------
// Retry hints

/// The first upstream retry hint found, in the spec's order (A §3.3): the `Retry-After`
/// header, the `X-RateLimit-Reset` header, the JSON body (Google `RetryInfo`, then
/// `retryAfter`, then `retry_after_ms`), then prose in the body. Returns the delay from
/// `now_wall_ms` in milliseconds (always > 0, already capped) and where it came from.
///
/// Whether a hint is *used* (`useUpstreamRetryHints`) is classification's decision.
pub fn upstream_retry_hint<H: Headers + ?Sized>(
    headers: &H,
    body: &str,
    now_wall_ms: u64,
) -> Option<(u64, HintSource)> {
    if let Some(ms) = header_hint(headers, now_wall_ms) {
        return Some((ms, HintSource::Header));
    }
    if let Some(hit) = json_hint(body, now_wall_ms) {
        return Some(hit);
    }
    text_hint(body, now_wall_ms).map(|ms| (ms, HintSource::Body))
}

/// `Retry-After`, then `X-RateLimit-Reset`.
pub fn header_hint<H: Headers + ?Sized>(headers: &H, now_wall_ms: u64) -> Option<u64> {
    headers
        .get("retry-after")
        .and_then(|v| retry_after_header(v, now_wall_ms))
        .or_else(|| {
            headers
                .get("x-ratelimit-reset")
                .and_then(|v| ratelimit_reset_header(v, now_wall_ms))
        })
}

/// A `Retry-After` value: an integer number of seconds (exactly digits after trimming),
/// else an HTTP date. Past dates and zero yield `None`; capped at [`HEADER_HINT_CAP_MS`].
pub fn retry_after_header(value: &str, now_wall_ms: u64) -> Option<u64> {
    let v = value.trim();
    let ms = if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits to fit is "very long": the cap applies.
        v.parse::<u64>()
            .map_or(u64::MAX, |s| s.saturating_mul(SECOND_MS))
    } else {
        parse_http_date(v)?.checked_sub(now_wall_ms)?
    };
    positive_capped(ms, HEADER_HINT_CAP_MS)
}

/// An `X-RateLimit-Reset` value: an absolute epoch, milliseconds when above 10¹⁰, else
/// seconds. A small delta such as `30` reads as 1970 and yields `None`.
pub fn ratelimit_reset_header(value: &str, now_wall_ms: u64) -> Option<u64> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = v.parse::<u64>().ok()?;
    let at_ms = if n > RATELIMIT_RESET_MS_THRESHOLD {
        n
    } else {
        n * SECOND_MS
    };
    positive_capped(at_ms.checked_sub(now_wall_ms)?, HEADER_HINT_CAP_MS)
}

/// The JSON body hints: Google `error.details[]` `RetryInfo.retryDelay` (cap 24 h), then
/// `error.retryAfter` / `retryAfter` as a future timestamp (cap 30 days), then
/// `retry_after_ms` / `retryAfterMs` at the top level or under `error` (cap 30 days).
/// A top-level array (Google's batch shape) is read through its first element.
pub fn json_hint(body: &str, now_wall_ms: u64) -> Option<(u64, HintSource)> {
    let body = body.trim();
    if body.len() > MAX_HINT_BODY_BYTES || !(body.starts_with('{') || body.starts_with('[')) {
        return None;
    }
    let root: serde_json::Value = serde_json::from_str(body).ok()?;
    let root = match &root {
        serde_json::Value::Array(items) => items.first()?,
        other => other,
    };
    let error = root.get("error");

    if let Some(details) = error
        .and_then(|e| e.get("details"))
        .and_then(|d| d.as_array())
    {
        for d in details {
            let is_retry_info = d
                .get("@type")
                .and_then(|t| t.as_str())
                .is_some_and(|t| t.contains("RetryInfo"));
            if !is_retry_info {
                continue;
            }
            if let Some(ms) = d
                .get("retryDelay")
                .and_then(retry_delay_ms)
                .and_then(|ms| positive_capped(ms, RETRY_INFO_CAP_MS))
            {
                return Some((ms, HintSource::GoogleRpcRetryInfo));
            }
        }
    }

    for obj in [error, Some(root)].into_iter().flatten() {
        if let Some(s) = obj.get("retryAfter").and_then(|v| v.as_str()) {
            let at = parse_iso8601(s).or_else(|| parse_http_date(s));
            if let Some(ms) = at
                .and_then(|at| at.checked_sub(now_wall_ms))
                .and_then(|ms| positive_capped(ms, JSON_HINT_CAP_MS))
            {
                return Some((ms, HintSource::Body));
            }
        }
    }

    for obj in [Some(root), error].into_iter().flatten() {
        for key in ["retry_after_ms", "retryAfterMs"] {
            if let Some(ms) = obj
                .get(key)
                .and_then(json_ms)
                .and_then(|ms| positive_capped(ms, JSON_HINT_CAP_MS))
            {
                return Some((ms, HintSource::Body));
            }
        }
    }
    None
}

/// `retryDelay`: "33s", "26.66s", "1500ms", "2m", "1h", a bare number of seconds (string
/// or JSON number), or the proto3 object form `{"seconds": n, "nanos": n}`.
fn retry_delay_ms(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::String(s) => {
            let s = s.trim().to_ascii_lowercase();
            let (num, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
                (n, 1)
            } else if let Some(n) = s.strip_suffix('s') {
                (n, SECOND_MS)
            } else if let Some(n) = s.strip_suffix('m') {
                (n, MINUTE_MS)
            } else if let Some(n) = s.strip_suffix('h') {
                (n, HOUR_MS)
            } else {
                (s.as_str(), SECOND_MS)
            };
            parse_decimal_ms(num.trim(), unit_ms)
        }
        serde_json::Value::Number(_) => number_ms(v, SECOND_MS),
        serde_json::Value::Object(o) => {
            let secs = o.get("seconds").map_or(Some(0), |s| match s {
                serde_json::Value::String(s) => s.trim().parse::<u64>().ok(),
                other => other.as_u64(),
            })?;
            let nanos = o.get("nanos").and_then(|n| n.as_u64()).unwrap_or(0);
            Some(
                secs.saturating_mul(SECOND_MS)
                    .saturating_add(nanos.div_ceil(1_000_000)),
            )
        }
        _ => None,
    }
}

/// A JSON millisecond count: a non-negative number (fractions rounded up) or a numeric
/// string.
fn json_ms(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::String(s) => parse_decimal_ms(s.trim(), 1),
        serde_json::Value::Number(_) => number_ms(v, 1),
        _ => None,
    }
}

fn number_ms(v: &serde_json::Value, unit_ms: u64) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n.saturating_mul(unit_ms));
    }
    // Fractions: go through the decimal text so "26.66" stays exact.
    let f = v.as_f64()?;
    if !(f.is_finite() && f > 0.0) {
        return None;
    }
    parse_decimal_ms(&v.to_string(), unit_ms)
}

/// Prose hints, first match in this order (A §3.3 item 4), on the body lower-cased:
/// 1. "please retry in 26.66s" (number and unit adjacent; cap 24 h);
/// 2. an ISO timestamp after "try again at", "wait until", "reset at", "resets at",
///    "available at" or "retry after" (future only; cap 30 days);
/// 3. "reset after 1h2m3s", "will reset after 2h 5m", "reset in 45m", "resets in 1h30m"
///    (any subset of h/m/s; cap 30 days);
/// 4. "please retry in 30 s" (with a space; cap 24 h);
/// 5. "reset in 2 days", "resets in 1 day" (cap 30 days).
pub fn text_hint(text: &str, now_wall_ms: u64) -> Option<u64> {
    let text = truncate_at_char_boundary(text, MAX_HINT_BODY_BYTES);
    if text.is_empty() {
        return None;
    }
    let t = text.to_ascii_lowercase();
    let b = t.as_bytes();

    // 1. "please retry in N.Ns"
    if let Some(ms) = after_phrases(&t, &["please retry in"], |i| {
        retry_in_at(b, i, false).and_then(|ms| positive_capped(ms, TEXT_RETRY_IN_CAP_MS))
    }) {
        return Some(ms);
    }
    // 2. ISO timestamp after a phrase
    if let Some(ms) = after_phrases(
        &t,
        &[
            "try again at",
            "wait until",
            "reset at",
            "resets at",
            "available at",
            "retry after",
        ],
        |i| {
            let i = skip_ws(b, i);
            let i = if b.get(i) == Some(&b':') {
                skip_ws(b, i + 1)
            } else {
                i
            };
            let (at, _) = parse_iso8601_prefix(&t[i..])?;
            positive_capped(at.checked_sub(now_wall_ms)?, TEXT_RESET_CAP_MS)
        },
    ) {
        return Some(ms);
    }
    // 3. "reset after / reset in XhYmZs"
    if let Some(ms) = after_phrases(&t, &["reset after", "reset in", "resets in"], |i| {
        hms_at(b, i).and_then(|ms| positive_capped(ms, TEXT_RESET_CAP_MS))
    }) {
        return Some(ms);
    }
    // 4. "please retry in N s"
    if let Some(ms) = after_phrases(&t, &["please retry in"], |i| {
        retry_in_at(b, i, true).and_then(|ms| positive_capped(ms, TEXT_RETRY_IN_CAP_MS))
    }) {
        return Some(ms);
    }
    // 5. "reset(s) in N day(s)"
    after_phrases(&t, &["reset in", "resets in"], |i| {
        let i = skip_ws(b, i);
        let (int, frac, i) = scan_number(b, i)?;
        let (word, _) = scan_word(b, skip_ws(b, i));
        if word != b"day" && word != b"days" {
            return None;
        }
        let ms = decimal_to_ms(int, frac, DAY_MS)?;
        positive_capped(ms, TEXT_RESET_CAP_MS)
    })
}

/// Runs `f` at the end of every occurrence of every phrase (phrases in order, occurrences
/// left to right) and returns the first `Some`.
fn after_phrases(
    t: &str,
    phrases: &[&str],
    mut f: impl FnMut(usize) -> Option<u64>,
) -> Option<u64> {
    for p in phrases {
        let mut from = 0;
        while let Some(pos) = t[from..].find(p) {
            let end = from + pos + p.len();
            if let Some(ms) = f(end) {
                return Some(ms);
            }
            from = from + pos + 1;
        }
    }
    None
}

/// "N<unit>" after "please retry in"; `spaced` selects the form with whitespace between
/// the number and the unit (pattern 4) instead of the adjacent one (pattern 1).
fn retry_in_at(b: &[u8], i: usize, spaced: bool) -> Option<u64> {
    let i = skip_ws(b, i);
    let (int, frac, j) = scan_number(b, i)?;
    let k = skip_ws(b, j);
    if (k > j) != spaced {
        return None;
    }
    let (word, _) = scan_word(b, k);
    let unit_ms = unit_ms(word, true)?;
    decimal_to_ms(int, frac, unit_ms)
}

/// "1h2m3s", "2h 5m", "45 minutes", "1 hour 30 minutes": components in h, m, s order, each
/// at most once, at least one.
fn hms_at(b: &[u8], i: usize) -> Option<u64> {
    let mut i = skip_ws(b, i);
    let mut total: u64 = 0;
    let mut last_unit = u64::MAX;
    let mut found = false;
    while let Some((int, frac, j)) = scan_number(b, i) {
        let (word, k) = scan_word(b, skip_ws(b, j));
        let Some(unit) = unit_ms(word, false) else {
            break;
        };
        if unit >= last_unit {
            break;
        }
        total = total.checked_add(decimal_to_ms(int, frac, unit)?)?;
        last_unit = unit;
        found = true;
        i = skip_ws(b, k);
        // Allow "1h, 2m" and "1 hour and 2 minutes".
        if b.get(i) == Some(&b',') {
            i = skip_ws(b, i + 1);
        }
        if b[i..].starts_with(b"and ") {
            i = skip_ws(b, i + 3);
        }
    }
    found.then_some(total)
}

/// The milliseconds of a unit word; `ms` is accepted only where `with_ms`.
fn unit_ms(word: &[u8], with_ms: bool) -> Option<u64> {
    match word {
        b"h" | b"hr" | b"hrs" | b"hour" | b"hours" => Some(HOUR_MS),
        b"m" | b"min" | b"mins" | b"minute" | b"minutes" => Some(MINUTE_MS),
        b"s" | b"sec" | b"secs" | b"second" | b"seconds" => Some(SECOND_MS),
        b"ms" | b"millisecond" | b"milliseconds" if with_ms => Some(1),
        _ => None,
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// A decimal number at `i`: (integer digits, fraction digits, end). At least one digit.
fn scan_number(b: &[u8], i: usize) -> Option<(&[u8], &[u8], usize)> {
    let mut j = i;
    while b.get(j).is_some_and(u8::is_ascii_digit) {
        j += 1;
    }
    let int = &b[i..j];
    let mut frac: &[u8] = &[];
    if b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit) {
        let f0 = j + 1;
        let mut k = f0;
        while b.get(k).is_some_and(u8::is_ascii_digit) {
            k += 1;
        }
        frac = &b[f0..k];
        j = k;
    }
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    Some((int, frac, j))
}

/// The ASCII-letter run at `i` and its end.
fn scan_word(b: &[u8], i: usize) -> (&[u8], usize) {
    let mut j = i;
    while b.get(j).is_some_and(u8::is_ascii_alphabetic) {
        j += 1;
    }
    (&b[i..j], j)
}

/// A decimal string ("26.66", "1500", ".5") times `unit_ms`, rounded up to a whole
/// millisecond. Exact (no floating point). `None` for anything else or on overflow.
pub fn parse_decimal_ms(s: &str, unit_ms: u64) -> Option<u64> {
    let b = s.as_bytes();
    let (int, frac, end) = scan_number(b, 0)?;
    if end != b.len() {
        return None;
    }
    decimal_to_ms(int, frac, unit_ms)
}

fn decimal_to_ms(int: &[u8], frac: &[u8], unit_ms: u64) -> Option<u64> {
    let mut total: u64 = 0;
    for &d in int {
        total = total.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    let mut total = total.checked_mul(unit_ms)?;
    if !frac.is_empty() {
        // Nine digits keep `num × unit_ms` far from overflow (< 10⁹ × 8.64·10⁷).
        let used = &frac[..frac.len().min(9)];
        let mut num: u64 = 0;
        for &d in used {
            num = num * 10 + u64::from(d - b'0');
        }
        let den = 10u64.pow(used.len() as u32);
        let scaled = num * unit_ms;
        let rest_nonzero = frac[used.len()..].iter().any(|&d| d != b'0');
        let mut part = scaled / den;
        if !scaled.is_multiple_of(den) || rest_nonzero {
            part += 1;
        }
        total = total.checked_add(part)?;
    }
    Some(total)
}

fn positive_capped(ms: u64, cap: u64) -> Option<u64> {
    (ms > 0).then(|| ms.min(cap))
}

fn truncate_at_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---------------------------------------------------------------------------------------
// Calendar arithmetic: the `time` crate turns fields into instants and back, `httpdate`
// parses RFC 7231 dates. What stays here is the lexing of the forms the parsers accept.

/// The last instant [`format_rfc3339_ms`] can print, `9999-12-31T23:59:59.999Z` (the end of
/// the `time` crate's range); later instants print as it.
#[cfg(test)]
pub const MAX_FORMATTED_MS: u64 = 253_402_300_799_999;

/// An HTTP date (RFC 7231 §7.1.1.1) as epoch milliseconds: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), or the obsolete RFC 850
/// (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`) forms, as
/// the `httpdate` crate reads them: fixed field widths, the weekday must agree with the
/// date, years 1970–9999, no leap second. Names are matched case-insensitively (folded to
/// the RFC's spelling first).
pub fn parse_http_date(s: &str) -> Option<u64> {
    let at = httpdate::parse_http_date(&canonical_case(s.trim())).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    u64::try_from(ms).ok()
}

/// `s` with every word capitalised (`thu, 15 JAN` → `Thu, 15 Jan`) and a trailing zone
/// `GMT` in capitals: the spelling `httpdate` compares names against.
fn canonical_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_word = false;
    for c in s.chars() {
        let letter = c.is_ascii_alphabetic();
        out.push(if letter && !in_word {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        in_word = letter;
    }
    if out.ends_with(" Gmt") {
        let n = out.len();
        out.replace_range(n - 2.., "MT");
    }
    out
}

/// A whole string as an ISO 8601 / RFC 3339 timestamp (surrounding whitespace ignored).
pub fn parse_iso8601(s: &str) -> Option<u64> {
    let s = s.trim();
    let (ms, used) = parse_iso8601_prefix(s)?;
    (used == s.len()).then_some(ms)
}

/// An ISO 8601 timestamp at the start of `s` and the bytes it used:
/// `YYYY-MM-DD[(T|t|space)HH:MM[:SS[.fff…]]][Z|z|±HH[:]MM|±HH]`. A date alone is midnight
/// UTC; a date-time without an offset is UTC. Fractions beyond milliseconds are truncated.
/// `None` for an invalid date or time (checked by the `time` crate; a leap second `:60` is
/// invalid, as in JavaScript) or an instant before 1970.
pub fn parse_iso8601_prefix(s: &str) -> Option<(u64, usize)> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<u16> {
        let part = b.get(from..from + len)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0u16, |a, &d| a * 10 + u16::from(d - b'0')))
    };
    let two = |from: usize| num(from, 2).and_then(|n| u8::try_from(n).ok());
    let y = num(0, 4)?;
    if b.get(4) != Some(&b'-') {
        return None;
    }
    let mo = two(5)?;
    if b.get(7) != Some(&b'-') {
        return None;
    }
    let d = two(8)?;
    let mut i = 10;
    let (mut h, mut mi, mut sec, mut ms) = (0, 0, 0, 0u16);
    let mut offset_s: i32 = 0;
    let has_time = matches!(b.get(i), Some(b'T' | b't' | b' '))
        && b.get(i + 1).is_some_and(u8::is_ascii_digit);
    if has_time {
        h = two(i + 1)?;
        if b.get(i + 3) != Some(&b':') {
            return None;
        }
        mi = two(i + 4)?;
        i += 6;
        if b.get(i) == Some(&b':') {
            sec = two(i + 1)?;
            i += 3;
            if matches!(b.get(i), Some(b'.' | b',')) && b.get(i + 1).is_some_and(u8::is_ascii_digit)
            {
                i += 1;
                let mut digits = 0;
                while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
                    if digits < 3 {
                        ms = ms * 10 + u16::from(c - b'0');
                    }
                    digits += 1;
                    i += 1;
                }
                for _ in digits..3 {
                    ms *= 10;
                }
            }
        }
        match b.get(i) {
            Some(b'Z' | b'z') => i += 1,
            Some(&sign @ (b'+' | b'-')) => {
                let oh = num(i + 1, 2)?;
                let (om, used) = if b.get(i + 3) == Some(&b':') {
                    (num(i + 4, 2)?, 6)
                } else if let Some(om) = num(i + 3, 2) {
                    (om, 5)
                } else {
                    (0, 3)
                };
                if oh > 23 || om > 59 {
                    return None;
                }
                let off = i32::from(oh) * 3_600 + i32::from(om) * 60;
                offset_s = if sign == b'-' { -off } else { off };
                i += used;
            }
            _ => {}
        }
    }
    let date = Date::from_calendar_date(i32::from(y), Month::try_from(mo).ok()?, d).ok()?;
    let time = Time::from_hms_milli(h, mi, sec, ms).ok()?;
    let offset = UtcOffset::from_whole_seconds(offset_s).ok()?;
    let nanos = PrimitiveDateTime::new(date, time)
        .assume_offset(offset)
        .unix_timestamp_nanos();
    Some((u64::try_from(nanos / 1_000_000).ok()?, i))
}

/// RFC 3339 in UTC with milliseconds, as JavaScript's `toISOString()` prints it:
/// `2026-08-12T10:00:00.000Z`. Instants after the end of year 9999 print as its last
/// millisecond.
pub fn format_rfc3339_ms(epoch_ms: u64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(epoch_ms) * 1_000_000)
        .unwrap_or(PrimitiveDateTime::MAX.assume_utc());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    )
}

/// Milliseconds until the next midnight in a zone `utc_offset_ms` east of UTC. A result
/// outside (0, 25 h] becomes 24 h, as the spec's daily-reset helpers do (A §3.4 g, §4.4).
pub fn ms_until_next_midnight(now_wall_ms: u64, utc_offset_ms: i64) -> u64 {
    let local = i128::from(now_wall_ms) + i128::from(utc_offset_ms);
    let day = i128::from(DAY_MS);
    let into_day = local.rem_euclid(day);
    let ms = day - into_day;
    if ms <= 0 || ms > 25 * i128::from(HOUR_MS) {
        DAY_MS
    } else {
        u64::try_from(ms).unwrap_or(DAY_MS)
    }
}

/// "1h 2m 3s", "2m 5s", "7s" (seconds rounded up; at least "0s").
pub fn human_duration(ms: u64) -> String {
    let secs = ms.div_ceil(SECOND_MS);
    let (h, m, s) = (secs / 3_600, secs % 3_600 / 60, secs % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-15T12:00:00Z
    const NOW: u64 = 1_768_478_400_000;

    fn hdrs<'a>(v: &'a [(&'a str, &'a str)]) -> &'a [(&'a str, &'a str)] {
        v
    }

    #[test]
    fn now_constant_is_what_it_says() {
        assert_eq!(format_rfc3339_ms(NOW), "2026-01-15T12:00:00.000Z");
    }

    #[test]
    fn apikey_ladder_3_to_96_seconds_then_stays() {
        let p = BackoffProfile::from_settings(&ResilienceSettings::default(), AuthKind::ApiKey);
        let mut level = 0;
        let mut got = Vec::new();
        for _ in 0..8 {
            let s = scaled_cooldown(&p, level);
            got.push(s.cooldown_ms / 1_000);
            level = s.new_backoff_level;
        }
        assert_eq!(got, vec![3, 6, 12, 24, 48, 96, 96, 96]);
        assert_eq!(level, 5);
    }

    #[test]
    fn oauth_ladder_5_to_1280_seconds() {
        let p = BackoffProfile::from_settings(&ResilienceSettings::default(), AuthKind::OAuth);
        let got: Vec<u64> = (0..10)
            .map(|l| scaled_cooldown(&p, l).cooldown_ms / 1_000)
            .collect();
        assert_eq!(got, vec![5, 10, 20, 40, 80, 160, 320, 640, 1280, 1280]);
        assert_eq!(scaled_cooldown(&p, 20).new_backoff_level, 8);
    }

    #[test]
    fn no_profile_and_zero_base_and_cap() {
        let p = BackoffProfile::NO_PROFILE;
        assert_eq!(scaled_cooldown(&p, 0).cooldown_ms, 5_000);
        assert_eq!(scaled_cooldown(&p, 4).cooldown_ms, 80_000);
        // 5 s × 2^5 = 160 s > 120 s cap.
        assert_eq!(scaled_cooldown(&p, 5).cooldown_ms, 120_000);
        assert_eq!(scaled_cooldown(&p, 99).new_backoff_level, 15);

        let zero = BackoffProfile {
            base_cooldown_ms: 0,
            max_backoff_steps: 3,
            max_cooldown_ms: 0,
        };
        let s = scaled_cooldown(&zero, 2);
        assert_eq!((s.cooldown_ms, s.base_cooldown_ms), (4_000, 1_000));
        // Huge exponents saturate instead of overflowing.
        let huge = BackoffProfile {
            base_cooldown_ms: DAY_MS,
            max_backoff_steps: 32,
            max_cooldown_ms: u64::MAX,
        };
        assert_eq!(scaled_cooldown(&huge, 32).cooldown_ms, DAY_MS << 32);
        assert_eq!(exponential_ms(DAY_MS, 64), u64::MAX);
        // Zero steps: the level never moves and the cooldown is the base.
        let flat = BackoffProfile {
            base_cooldown_ms: 3_000,
            max_backoff_steps: 0,
            max_cooldown_ms: 0,
        };
        assert_eq!(
            scaled_cooldown(&flat, 7),
            Scaled {
                cooldown_ms: 3_000,
                base_cooldown_ms: 3_000,
                new_backoff_level: 0
            }
        );
    }

    #[test]
    fn retry_after_header_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("30", Some(30_000)),
            (" 7 ", Some(7_000)),
            ("0", None),
            ("-5", None),
            ("1.5", None),
            ("", None),
            ("soon", None),
            // 30 days cap
            ("99999999999", Some(HEADER_HINT_CAP_MS)),
            ("999999999999999999999999", Some(HEADER_HINT_CAP_MS)),
            ("Thu, 15 Jan 2026 12:01:00 GMT", Some(60_000)),
            ("thu, 15 jan 2026 12:00:30 gmt", Some(30_000)),
            ("Thursday, 15-Jan-26 12:00:10 GMT", Some(10_000)),
            ("Thu Jan 15 12:00:05 2026", Some(5_000)),
            // past and exactly now
            ("Thu, 15 Jan 2026 11:59:00 GMT", None),
            ("Thu, 15 Jan 2026 12:00:00 GMT", None),
            // wrong zone, bad day, trailing junk
            ("Thu, 15 Jan 2026 12:01:00 PST", None),
            ("Thu, 32 Jan 2026 12:01:00 GMT", None),
            ("Thu, 15 Jan 2026 12:01:00 GMT x", None),
            ("Thu, 15 Foo 2026 12:01:00 GMT", None),
        ];
        for (v, want) in cases {
            assert_eq!(retry_after_header(v, NOW), *want, "Retry-After: {v:?}");
        }
    }

    #[test]
    fn ratelimit_reset_header_table() {
        let secs = (NOW / 1000 + 90).to_string();
        let millis = (NOW + 1_500).to_string();
        let past = (NOW / 1000 - 1).to_string();
        let far = (NOW / 1000 + 40 * 86_400).to_string();
        let cases: Vec<(&str, Option<u64>)> = vec![
            (secs.as_str(), Some(90_000)),
            (millis.as_str(), Some(1_500)),
            (past.as_str(), None),
            ("30", None), // a delta reads as 1970
            (far.as_str(), Some(HEADER_HINT_CAP_MS)),
            ("abc", None),
            ("", None),
        ];
        for (v, want) in cases {
            assert_eq!(
                ratelimit_reset_header(v, NOW),
                want,
                "X-RateLimit-Reset: {v:?}"
            );
        }
    }

    #[test]
    fn headers_win_in_order_and_case_insensitively() {
        let reset = (NOW / 1000 + 90).to_string();
        let h = [("X-RateLimit-Reset", reset.as_str()), ("RETRY-AFTER", "12")];
        assert_eq!(header_hint(hdrs(&h), NOW), Some(12_000));
        let h = [
            ("x-ratelimit-reset", reset.as_str()),
            ("retry-after", "garbage"),
        ];
        assert_eq!(header_hint(hdrs(&h), NOW), Some(90_000));
        // Headers beat the body.
        let h = [("Retry-After", "3")];
        assert_eq!(
            upstream_retry_hint(hdrs(&h), "please retry in 20s", NOW),
            Some((3_000, HintSource::Header))
        );
        let none: [(&str, &str); 0] = [];
        assert_eq!(upstream_retry_hint(hdrs(&none), "", NOW), None);
    }

    fn google(delay: &str) -> String {
        format!(
            r#"{{"error":{{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
                {{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[]}},
                {{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{delay}}}]}}}}"#
        )
    }

    #[test]
    fn google_retry_info_table() {
        let cases: &[(&str, Option<u64>)] = &[
            (r#""33s""#, Some(33_000)),
            (r#""26.66s""#, Some(26_660)),
            (r#""0.0005s""#, Some(1)),
            (r#""1500ms""#, Some(1_500)),
            (r#""2m""#, Some(120_000)),
            (r#""1h""#, Some(HOUR_MS)),
            (r#""45""#, Some(45_000)),
            ("45", Some(45_000)),
            ("1.25", Some(1_250)),
            (r#"{"seconds":"12","nanos":500000000}"#, Some(12_500)),
            (r#""48h""#, Some(RETRY_INFO_CAP_MS)),
            (r#""0s""#, None),
            (r#""soon""#, None),
        ];
        for (delay, want) in cases {
            let want = want.map(|ms| (ms, HintSource::GoogleRpcRetryInfo));
            assert_eq!(json_hint(&google(delay), NOW), want, "retryDelay {delay}");
        }
        // Google's array shape.
        let arr = format!("[{}]", google(r#""7s""#));
        assert_eq!(
            json_hint(&arr, NOW),
            Some((7_000, HintSource::GoogleRpcRetryInfo))
        );
        let h: [(&str, &str); 0] = [];
        assert_eq!(
            upstream_retry_hint(hdrs(&h), &google(r#""26.66s""#), NOW),
            Some((26_660, HintSource::GoogleRpcRetryInfo))
        );
    }

    #[test]
    fn json_retry_after_and_ms_table() {
        let cases: &[(&str, Option<u64>)] = &[
            (
                r#"{"error":{"retryAfter":"2026-01-15T12:05:00Z"}}"#,
                Some(5 * MINUTE_MS),
            ),
            (r#"{"retryAfter":"2026-01-15T13:00:00+01:00"}"#, None), // = 12:00Z, not future
            (
                r#"{"retryAfter":"2026-01-15T14:00:00+01:00"}"#,
                Some(HOUR_MS),
            ),
            (r#"{"retryAfter":"2026-01-15T11:00:00Z"}"#, None),
            (
                r#"{"retryAfter":"2027-01-15T12:00:00Z"}"#,
                Some(JSON_HINT_CAP_MS),
            ),
            (
                r#"{"retryAfter":"Thu, 15 Jan 2026 12:00:09 GMT"}"#,
                Some(9_000),
            ),
            (r#"{"retry_after_ms":2500}"#, Some(2_500)),
            (r#"{"retryAfterMs":"750"}"#, Some(750)),
            (r#"{"error":{"retry_after_ms":12.2}}"#, Some(13)),
            (r#"{"retry_after_ms":0}"#, None),
            (r#"{"retry_after_ms":-5}"#, None),
            (
                r#"{"retry_after_ms":99999999999999}"#,
                Some(JSON_HINT_CAP_MS),
            ),
            (r#"{"error":{"message":"nothing here"}}"#, None),
            ("not json", None),
            ("{broken", None),
        ];
        for (body, want) in cases {
            let want = want.map(|ms| (ms, HintSource::Body));
            assert_eq!(json_hint(body, NOW), want, "{body}");
        }
        // retryAfter (timestamp) is checked before retry_after_ms.
        let both = r#"{"retry_after_ms":100,"error":{"retryAfter":"2026-01-15T12:00:02Z"}}"#;
        assert_eq!(json_hint(both, NOW), Some((2_000, HintSource::Body)));
    }

    #[test]
    fn text_hint_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("Quota exceeded. Please retry in 26.662s.", Some(26_662)),
            ("please retry in 500ms", Some(500)),
            ("Please retry in 2h", Some(2 * HOUR_MS)),
            ("Please retry in 30h", Some(TEXT_RETRY_IN_CAP_MS)),
            ("Please retry in 30 s", Some(30_000)),
            ("please retry in 1.5 seconds", Some(1_500)),
            (
                "Please try again at 2026-01-15T12:10:00Z.",
                Some(10 * MINUTE_MS),
            ),
            ("wait until 2026-01-15 12:00:30", Some(30_000)),
            ("Your limit resets at 2026-01-15T12:00:01.250Z", Some(1_250)),
            ("available at: 2026-01-15T13:00:00+00:00", Some(HOUR_MS)),
            ("retry after 2026-01-15T11:00:00Z", None),
            ("try again at 2026-03-15T12:00:00Z", Some(TEXT_RESET_CAP_MS)),
            ("Usage limit reached, reset after 1h2m3s", Some(3_723_000)),
            (
                "limit will reset after 2h 5m",
                Some(2 * HOUR_MS + 5 * MINUTE_MS),
            ),
            ("Your quota resets in 45m", Some(45 * MINUTE_MS)),
            ("resets in 1 hour 30 minutes", Some(90 * MINUTE_MS)),
            ("reset in 20s", Some(20_000)),
            ("reset after 900h", Some(TEXT_RESET_CAP_MS)),
            ("The weekly limit resets in 3 days", Some(3 * DAY_MS)),
            ("reset in 1 day", Some(DAY_MS)),
            ("resets in 45 days", Some(TEXT_RESET_CAP_MS)),
            ("reset in soon", None),
            ("rate limited", None),
            ("please retry in 0s", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(text_hint(text, NOW), *want, "{text:?}");
        }
    }

    #[test]
    fn text_patterns_are_tried_in_order() {
        // "please retry in N.Ns" beats a reset duration earlier in the text.
        assert_eq!(
            text_hint("reset after 1h; please retry in 5s", NOW),
            Some(5_000)
        );
        // A timestamp phrase beats "reset in" durations.
        assert_eq!(
            text_hint("resets in 2h (try again at 2026-01-15T12:00:10Z)", NOW),
            Some(10_000)
        );
        // A later occurrence of the same phrase is found when the first does not parse.
        assert_eq!(
            text_hint("reset in a bit. quota will reset in 10m", NOW),
            Some(10 * MINUTE_MS)
        );
        // The body source is "body" for prose.
        let h: [(&str, &str); 0] = [];
        assert_eq!(
            upstream_retry_hint(hdrs(&h), "please retry in 4s", NOW),
            Some((4_000, HintSource::Body))
        );
        // A JSON body with prose in its message is still scanned as text.
        let body = r#"{"error":{"message":"Rate limit. Please retry in 3s"}}"#;
        assert_eq!(
            upstream_retry_hint(hdrs(&h), body, NOW),
            Some((3_000, HintSource::Body))
        );
    }

    #[test]
    fn oversized_bodies_are_bounded() {
        let mut body = "x".repeat(MAX_HINT_BODY_BYTES);
        body.push_str(" please retry in 5s");
        assert_eq!(text_hint(&body, NOW), None);
        let mut multi = "é".repeat(MAX_HINT_BODY_BYTES / 2 + 1);
        multi.push_str("please retry in 5s");
        assert_eq!(text_hint(&multi, NOW), None);
    }

    #[test]
    fn iso8601_forms() {
        let base = 1_768_478_400_000; // 2026-01-15T12:00:00Z
        let cases: &[(&str, Option<u64>)] = &[
            ("2026-01-15T12:00:00Z", Some(base)),
            ("2026-01-15t12:00:00z", Some(base)),
            ("2026-01-15T12:00:00.5Z", Some(base + 500)),
            ("2026-01-15T12:00:00.123456Z", Some(base + 123)),
            ("2026-01-15T14:00:00+02:00", Some(base)),
            ("2026-01-15T10:30:00-0130", Some(base)),
            ("2026-01-15T17:00:00+05", Some(base)),
            ("2026-01-15T12:00", Some(base)),
            ("2026-01-15", Some(base - 12 * HOUR_MS)),
            ("2026-02-29T00:00:00Z", None),
            ("2024-02-29T00:00:00Z", Some(1_709_164_800_000)),
            ("1969-12-31T23:59:59Z", None),
            ("2026-13-01", None),
            ("2026-01-15T25:00:00Z", None),
            ("20260115", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_iso8601(s), *want, "{s}");
        }
        assert_eq!(
            parse_iso8601_prefix("2026-01-15T12:00:00Z and more"),
            Some((base, 20))
        );
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339_ms(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
    }

    #[test]
    fn http_date_edge_cases() {
        let iso = |s: &str| parse_iso8601(s).unwrap();
        // Leap days: 2024 and 2000 are leap years; 2100 and 2026 are not.
        assert_eq!(
            parse_http_date("Thu, 29 Feb 2024 12:00:00 GMT"),
            Some(1_709_208_000_000)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(951_782_400_000)
        );
        for s in [
            "Mon, 29 Feb 2100 00:00:00 GMT",
            "Sun, 29 Feb 2026 00:00:00 GMT",
            "Fri, 31 Apr 2026 00:00:00 GMT",
            "Thu, 00 Jan 2026 12:00:00 GMT",
            "Thu, 15 Jan 2026 24:00:00 GMT",
            "Thu, 15 Jan 2026 12:60:00 GMT",
            "Thu, 15 Jan 2026 23:59:60 GMT", // no leap second
            "Fri, 15 Jan 2026 12:00:00 GMT", // 15 Jan 2026 is a Thursday
            "Thu, 15 Jan 2026 12:00:00 UTC",
            "Thu, 15 Jan 2026 12:00:00",
            "Wed, 31 Dec 1969 23:59:59 GMT", // before the epoch
            "Th\u{fc}, 15 Jan 2026 12:00:00 GMT",
            "2026-01-15T12:00:00Z",
            "",
        ] {
            assert_eq!(parse_http_date(s), None, "{s:?}");
        }
        // Far future: the last second of year 9999 (and a hint that far out is capped).
        assert_eq!(
            parse_http_date("Fri, 31 Dec 9999 23:59:59 GMT"),
            Some(MAX_FORMATTED_MS - 999)
        );
        assert_eq!(
            retry_after_header("Fri, 31 Dec 9999 23:59:59 GMT", NOW),
            Some(HEADER_HINT_CAP_MS)
        );
        // RFC 850 two-digit years: 00–69 are 20xx, 70–99 are 19xx.
        assert_eq!(
            parse_http_date("Saturday, 01-Jun-69 00:00:00 GMT"),
            Some(iso("2069-06-01"))
        );
        assert_eq!(
            parse_http_date("Thursday, 01-Jan-70 00:00:01 GMT"),
            Some(1_000)
        );
        // asctime pads a one-digit day with a space; names in any case.
        let sunday = Some(iso("1994-11-06T08:49:37Z"));
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), sunday);
        assert_eq!(parse_http_date("SUN, 06 NOV 1994 08:49:37 GMT"), sunday);
        assert_eq!(parse_http_date(" Sun, 06 Nov 1994 08:49:37 GMT "), sunday);
    }

    #[test]
    fn iso8601_edge_cases() {
        for s in [
            "1900-02-29",
            "2100-02-29T00:00:00Z",
            "2026-04-31",
            "2026-00-10",
            "2026-01-00",
            "2026-01-15T23:59:60Z", // no leap second, as in JavaScript
            "2026-01-15T12:60:00Z",
            "2026-01-15T12:00:00+24:00",
            "2026-01-15T12:00:00+05:60",
            "1970-01-01T00:30:00+01:00", // 1969 in UTC
            "2026-1-15",
            "",
        ] {
            assert_eq!(parse_iso8601(s), None, "{s:?}");
        }
        assert_eq!(parse_iso8601("2000-02-29"), Some(951_782_400_000));
        assert_eq!(parse_iso8601("1970-01-01T00:00:00Z"), Some(0));
        // An offset may carry a local time before 1970 to an instant after it.
        assert_eq!(
            parse_iso8601("1969-12-31T23:30:00-01:00"),
            Some(30 * MINUTE_MS)
        );
        // Far future: the end of year 9999 parses; printing saturates there.
        assert_eq!(
            parse_iso8601("9999-12-31T23:59:59.999Z"),
            Some(MAX_FORMATTED_MS)
        );
        for ms in [MAX_FORMATTED_MS, MAX_FORMATTED_MS + 1, u64::MAX] {
            assert_eq!(format_rfc3339_ms(ms), "9999-12-31T23:59:59.999Z");
        }
        // The formatter and the parser agree.
        for ms in [
            0,
            1,
            951_782_400_123,
            NOW + 1,
            4_107_542_399_999,
            MAX_FORMATTED_MS,
        ] {
            assert_eq!(parse_iso8601(&format_rfc3339_ms(ms)), Some(ms), "{ms}");
        }
    }

    #[test]
    fn midnight_and_human() {
        assert_eq!(ms_until_next_midnight(NOW, 0), 12 * HOUR_MS);
        assert_eq!(
            ms_until_next_midnight(NOW, 2 * HOUR_MS as i64),
            10 * HOUR_MS
        );
        assert_eq!(ms_until_next_midnight(NOW, -13 * HOUR_MS as i64), HOUR_MS);
        // Exactly midnight: a full day.
        assert_eq!(ms_until_next_midnight(NOW - 12 * HOUR_MS, 0), DAY_MS);
        assert_eq!(human_duration(3_723_000), "1h 2m 3s");
        assert_eq!(human_duration(3_600_000), "1h 0m 0s");
        assert_eq!(human_duration(125_000), "2m 5s");
        assert_eq!(human_duration(1), "1s");
        assert_eq!(human_duration(0), "0s");
    }

    #[test]
    fn decimal_parsing_is_exact() {
        assert_eq!(parse_decimal_ms("26.66", 1_000), Some(26_660));
        assert_eq!(parse_decimal_ms(".5", 1_000), Some(500));
        assert_eq!(parse_decimal_ms("0.0001", 1_000), Some(1));
        assert_eq!(parse_decimal_ms("1.0000000000001", 1_000), Some(1_001));
        assert_eq!(parse_decimal_ms("1e3", 1_000), None);
        assert_eq!(parse_decimal_ms("", 1_000), None);
        assert_eq!(parse_decimal_ms("99999999999999999999", 1_000), None);
    }
}
