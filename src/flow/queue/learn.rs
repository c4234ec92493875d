//! What a limiter learns from upstream responses (B §1.2): the request-limit headers
//! (limit / remaining / reset), the over-limit header, a retry hint in an error body, and
//! a cap written in words ("N requests within M minutes"). Parsing is here; the limiter
//! only exposes the knobs (`force_min_time_ms`, `set_reservoir`, `relax`).
//!
//! Not done here: persisting learned caps (the spec's debounced settings store).

use super::limiter::{Limiter, LimiterTable, OVER_LIMIT_MIN_TIME_MS, RETRY_HINT_RESERVOIR};
use crate::clock::Now;
use crate::config::resilience::{HOUR_MS, MINUTE_MS, SECOND_MS};
use crate::resilience::Headers;
use crate::resilience::backoff::{json_hint, text_hint, upstream_retry_hint};

/// Reset period when the upstream gives none.
pub const DEFAULT_RESET_MS: u64 = 60_000;
/// Subtracted from `60000 / limit` so we stay just under the upstream's rate.
pub const HEADER_SPACING_MARGIN_MS: u64 = 10;
/// Longest body scanned for a cap in words.
pub const MAX_CAP_BODY_BYTES: usize = 64 * 1024;

/// What [`apply_headers`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HeaderLearn {
    pub over_limit: bool,
    /// New spacing from the request-limit header.
    pub min_time_ms: Option<u64>,
    /// Reservoir throttled to the remaining count.
    pub throttled: bool,
    /// Limits relaxed back to the configured ones.
    pub relaxed: bool,
}

/// What an upstream answer tells a request queue, read on the shard that saw the answer:
/// numbers only, so it can travel to the queue's owner without the answer's headers or
/// body (ARCHITECTURE §4: mesh messages carry ids, numbers and verdicts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseFacts {
    pub status: u16,
    /// `x-ratelimit-limit-requests` (or `x-ratelimit-limit`).
    pub limit: Option<u64>,
    /// `x-ratelimit-remaining-requests` (or `x-ratelimit-remaining`).
    pub remaining: Option<u64>,
    /// `x-ratelimit-reset-requests`, when positive.
    pub reset_ms: Option<u64>,
    /// `x-ratelimit-over-limit: yes`.
    pub over_limit: bool,
    /// A 429's retry hint (headers, then body); another error's hint in its body.
    pub retry_hint_ms: Option<u64>,
    /// A 429's cap in words: (N requests, window ms).
    pub cap: Option<(u64, u64)>,
}

impl ResponseFacts {
    /// Reads what a queue learns from an answer's status, headers and (error) body.
    pub fn read<H: Headers + ?Sized>(status: u16, headers: &H, body: &str, now: Now) -> Self {
        let retry_hint_ms = if status == 429 {
            upstream_retry_hint(headers, body, now.wall_ms).map(|(ms, _)| ms)
        } else if status >= 400 {
            json_hint(body, now.wall_ms)
                .map(|(ms, _)| ms)
                .or_else(|| text_hint(body, now.wall_ms))
        } else {
            None
        };
        Self {
            status,
            limit: header_u64(
                headers,
                &["x-ratelimit-limit-requests", "x-ratelimit-limit"],
            ),
            remaining: header_u64(
                headers,
                &["x-ratelimit-remaining-requests", "x-ratelimit-remaining"],
            ),
            reset_ms: headers
                .get("x-ratelimit-reset-requests")
                .and_then(parse_reset_duration_ms)
                .filter(|ms| *ms > 0),
            over_limit: headers
                .get("x-ratelimit-over-limit")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("yes")),
            retry_hint_ms,
            cap: if status == 429 {
                requests_within_cap(body)
            } else {
                None
            },
        }
    }

    /// Whether the answer teaches a queue anything at all.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.limit.is_none()
            && !self.over_limit
            && self.retry_hint_ms.is_none()
            && self.cap.is_none()
            && self.status < 400
    }
}

/// Applies the rate-limit headers of an upstream response to `limiter`.
#[cfg(test)]
pub fn observe_headers<H: Headers + ?Sized>(
    limiter: &mut Limiter,
    headers: &H,
    now: Now,
) -> HeaderLearn {
    apply_headers(limiter, &ResponseFacts::read(200, headers, "", now), now)
}

/// Applies the rate-limit fields of an answer to `limiter`: the request-limit header sets
/// the spacing (`60000 / limit − 10`); with it, remaining < 10 % of the limit holds the
/// reservoir to what is left until the reset, and remaining > 50 % relaxes the limiter back
/// to its configured spacing and reservoir — dropping the header's spacing too: far from
/// its limit, the upstream needs no pacing (B §1.2).
pub fn apply_headers(limiter: &mut Limiter, facts: &ResponseFacts, now: Now) -> HeaderLearn {
    let mut out = HeaderLearn::default();
    if let Some(limit) = facts.limit.filter(|l| *l > 0) {
        let remaining = facts.remaining;
        if remaining.is_some_and(|rem| rem.saturating_mul(2) > limit) {
            limiter.relax(now);
            out.relaxed = true;
        } else {
            let ms = (MINUTE_MS / limit).saturating_sub(HEADER_SPACING_MARGIN_MS);
            limiter.force_min_time_ms(ms);
            out.min_time_ms = Some(ms);
            // Remaining < 10 % of the limit: hold to what is left until the reset.
            if let Some(rem) = remaining.filter(|rem| rem.saturating_mul(10) < limit) {
                let reset_ms = facts.reset_ms.unwrap_or(DEFAULT_RESET_MS);
                let cap = u32::try_from(limit).unwrap_or(u32::MAX);
                let left = u32::try_from(rem).unwrap_or(u32::MAX);
                limiter.set_reservoir(cap, left, reset_ms, now);
                out.throttled = true;
            }
        }
    }
    if facts.over_limit {
        limiter.force_min_time_ms(OVER_LIMIT_MIN_TIME_MS);
        out.over_limit = true;
    }
    out
}

fn header_u64<H: Headers + ?Sized>(headers: &H, names: &[&str]) -> Option<u64> {
    names
        .iter()
        .find_map(|n| headers.get(n))
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A retry hint in an error body: the reservoir drops to 0 and is refilled to
/// [`RETRY_HINT_RESERVOIR`] every `retry_after_ms`.
pub fn observe_retry_hint(limiter: &mut Limiter, retry_after_ms: u64, now: Now) {
    limiter.set_reservoir(RETRY_HINT_RESERVOIR, 0, retry_after_ms.max(1), now);
}

/// A reset value: plain seconds (`"30"`, `"1.5"`) or Go-style durations (`"6m0s"`,
/// `"20ms"`, `"1h2m3.5s"`).
pub fn parse_reset_duration_ms(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then_some((secs * SECOND_MS as f64) as u64);
    }
    let b = v.as_bytes();
    let mut i = 0;
    let mut total = 0f64;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        let n: f64 = v.get(start..i)?.parse().ok()?;
        let ustart = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = match v.get(ustart..i)? {
            "ms" => 1.0,
            "s" => SECOND_MS as f64,
            "m" => MINUTE_MS as f64,
            "h" => HOUR_MS as f64,
            _ => return None,
        };
        total += n * unit;
    }
    Some(total as u64)
}

/// A cap stated in words in a 429 body: `"N requests within M minutes"` (also `per`,
/// `in`, `every`; units second/minute/hour). Returns (N, window ms).
pub fn requests_within_cap(body: &str) -> Option<(u64, u64)> {
    let mut end = body.len().min(MAX_CAP_BODY_BYTES);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    let text = body.get(..end)?.to_ascii_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '(' | ')' | '"' | ':' | ';'))
        .filter(|w| !w.is_empty())
        .collect();
    for i in 0..words.len() {
        let Ok(n) = words[i].parse::<u64>() else {
            continue;
        };
        if n == 0 || !words.get(i + 1).is_some_and(|w| w.starts_with("request")) {
            continue;
        }
        if !words
            .get(i + 2)
            .is_some_and(|w| matches!(*w, "within" | "per" | "in" | "every"))
        {
            continue;
        }
        // "per minute" (implicit 1) or "within 5 minutes".
        let (m, unit_at) = match words.get(i + 3).and_then(|w| w.parse::<u64>().ok()) {
            Some(m) => (m, i + 4),
            None => (1, i + 3),
        };
        let unit = words.get(unit_at).map(|w| w.trim_end_matches('.'));
        let unit_ms = match unit {
            Some(u) if u.starts_with("sec") => SECOND_MS,
            Some(u) if u.starts_with("min") => MINUTE_MS,
            Some(u) if u.starts_with("hour") || u == "hr" || u == "hrs" => HOUR_MS,
            _ => continue,
        };
        if m == 0 {
            continue;
        }
        return Some((n, m.saturating_mul(unit_ms)));
    }
    None
}

/// What happened to a learned cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapLearn {
    /// No cap in the body.
    None,
    /// Applied: the new spacing.
    Applied { min_time_ms: u64 },
    /// The connection's own `rpm` override wins over a learned cap.
    RefusedRpmOverride,
    /// The spacing would exceed the queue budget: every queued request would time out.
    RefusedExceedsQueueBudget { min_time_ms: u64 },
}

/// Learns a cap in words from a 429 body: spacing = window / N, never below the
/// configured spacing; refused when the connection overrides `rpm` or when the spacing
/// exceeds `max_wait_ms` (if there is a queue deadline).
#[cfg(test)]
pub fn learn_cap_from_body(limiter: &mut Limiter, body: &str) -> CapLearn {
    learn_cap(limiter, requests_within_cap(body))
}

/// Learns a cap (N requests, window ms) read from a 429 body; its body parse is [`requests_within_cap`].
pub fn learn_cap(limiter: &mut Limiter, cap: Option<(u64, u64)>) -> CapLearn {
    let Some((n, window_ms)) = cap else {
        return CapLearn::None;
    };
    let settings = *limiter.settings();
    if settings.rpm_overridden {
        return CapLearn::RefusedRpmOverride;
    }
    let min_time_ms = (window_ms / n).max(settings.min_time_ms);
    if settings.max_wait_ms > 0 && min_time_ms > settings.max_wait_ms {
        return CapLearn::RefusedExceedsQueueBudget { min_time_ms };
    }
    limiter.set_min_time_ms(min_time_ms);
    CapLearn::Applied { min_time_ms }
}

/// What [`apply_response`] learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLearn {
    pub headers: HeaderLearn,
    /// A 429: the cooldown remembered for the key (ms).
    pub cooldown_ms: Option<u64>,
    /// A retry hint in an error body emptied the reservoir (ms until the refill).
    pub retry_hint_ms: Option<u64>,
    pub cap: CapLearn,
}

/// The owner shard's one entry point for an upstream response on limiter `key`:
/// * every response: the rate-limit headers;
/// * 2xx: the remembered 429 cooldown is cleared;
/// * 429: learned limits are discarded, a cooldown (the upstream hint, default 60 s) is
///   remembered, and a cap in words in the body is learned;
/// * another error with a retry hint in its body: the reservoir is emptied until then.
///
/// A key without a limiter (protection disabled, or evicted) still gets its cooldown.
#[cfg(test)]
pub fn observe_response<H: Headers + ?Sized>(
    table: &mut LimiterTable,
    key: &str,
    status: u16,
    headers: &H,
    body: &str,
    now: Now,
) -> ResponseLearn {
    apply_response(
        table,
        key,
        &ResponseFacts::read(status, headers, body, now),
        now,
    )
}

/// What an answer teaches limiter `key`, from facts already read on the shard that saw
/// the answer (the owner shard's entry point; see `observe_response` above for the rules).
pub fn apply_response(
    table: &mut LimiterTable,
    key: &str,
    facts: &ResponseFacts,
    now: Now,
) -> ResponseLearn {
    let status = facts.status;
    let mut out = ResponseLearn {
        headers: HeaderLearn::default(),
        cooldown_ms: None,
        retry_hint_ms: None,
        cap: CapLearn::None,
    };
    if (200..300).contains(&status) {
        table.on_upstream_success(key);
    }
    if status == 429 {
        table.on_upstream_429(key, facts.retry_hint_ms, now);
        out.cooldown_ms = table.known_cooldown_ms(key, now);
    }
    let Some(limiter) = table.get_mut(key) else {
        return out;
    };
    out.headers = apply_headers(limiter, facts, now);
    if status == 429 {
        out.cap = learn_cap(limiter, facts.cap);
    } else if status >= 400
        && let Some(ms) = facts.retry_hint_ms
    {
        observe_retry_hint(limiter, ms, now);
        out.retry_hint_ms = Some(ms);
    }
    out
}
