//! The egress-bucketed lock (spec A §7, upstream #10880): some upstreams count quota per
//! outbound IP rather than per account, so once one connection gets a 429 for quota or rate
//! limit, every other connection of the same provider family leaving through the same IP
//! will get the same answer. This module owns the pure decision of whom to cool and until
//! when; the owner shards of the connections apply it (the failing connection's owner and,
//! by events, the siblings' owners), so N−1 doomed upstream calls are never made.
//!
//! The lock applies when the classified status is 429, the reason is `quota_exhausted` or
//! `rate_limit_exceeded`, the failure is neither a ban nor credit exhaustion, and the failing
//! connection has an `egress` label and does not have `disable_cooling`. It cools the failing
//! connection for the classified cooldown (or 120 s when that is 0) and every sibling —
//! same family, same `egress` label — to the same deadline. It is never terminal.
//!
//! Deliberate deviations from OmniRoute:
//! - **Siblings come from configuration, not from logs.** OmniRoute looks up the last egress
//!   IP each connection used in its proxy logs (24 h window, best effort). Tidegate's
//!   connections declare their outbound IP with an `egress` label, so the siblings are
//!   exact and known at start-up.
//! - **Opt-in by label, not by provider allowlist.** `OMNIROUTE_EGRESS_IP_LOCK_PROVIDERS`
//!   is not read: a connection without an `egress` label never takes part. The family of a
//!   provider (its kind's `egress_family`) keeps the opencode members together as upstream did; every
//!   other provider is its own family.
//! - **"Longer" means longer.** A sibling already cooling until the new deadline or later is
//!   left alone; one cooling for less is extended to the new deadline (the guide's intent;
//!   OmniRoute's code leaves any active cooldown alone, even a shorter one).
//! - **Siblings with `disable_cooling` are skipped** (OmniRoute did not check the sibling's
//!   flag), so the flag means the same for a connection whatever failed.

use super::{FallbackDecision, Reason};
use crate::config::ConnectionId;

/// The failing connection's cooldown when classification gave none.
pub const EGRESS_DEFAULT_COOLDOWN_MS: u64 = 120_000;

/// The connection whose request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailingConnection<'a> {
    pub id: ConnectionId,
    /// Its provider kind's egress family (`Quirks::egress_family`), else the provider id.
    pub family: &'a str,
    pub egress: Option<&'a str>,
    pub disable_cooling: bool,
}

/// What the caller's view knows of another connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiblingView<'a> {
    pub id: ConnectionId,
    pub family: &'a str,
    pub egress: Option<&'a str>,
    pub disable_cooling: bool,
    /// Banned, expired or credits exhausted.
    pub terminal: bool,
    /// Cooling until this instant (same clock as `now_ms`), if cooling.
    pub cooling_until_ms: Option<u64>,
}

/// Whom to cool and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressLock {
    /// Until when the failing connection and the listed siblings cool.
    pub until_ms: u64,
    pub cooldown_ms: u64,
    /// The reason to record on each of them.
    pub reason: Reason,
    /// Siblings to cool, in the order given.
    pub siblings: Vec<ConnectionId>,
}

/// Decides the egress-bucketed lock for one failure; `None` when it does not apply (the
/// caller then takes its ordinary cooldown path). `status` is the status classification
/// saw (after restatement); `now_ms` and every `cooling_until_ms` share one clock.
pub fn egress_lock<'a>(
    failing: &FailingConnection<'_>,
    status: u16,
    decision: &FallbackDecision,
    siblings: impl IntoIterator<Item = &'a SiblingView<'a>>,
    now_ms: u64,
) -> Option<EgressLock> {
    let egress = failing.egress?;
    let applies = status == 429
        && matches!(
            decision.reason,
            Reason::QuotaExhausted | Reason::RateLimitExceeded
        )
        && !decision.permanent
        && !decision.credits_exhausted
        && !failing.disable_cooling;
    if !applies {
        return None;
    }
    let cooldown_ms = if decision.cooldown_ms > 0 {
        decision.cooldown_ms
    } else {
        EGRESS_DEFAULT_COOLDOWN_MS
    };
    let until_ms = now_ms.saturating_add(cooldown_ms);
    let siblings = siblings
        .into_iter()
        .filter(|s| {
            s.id != failing.id
                && s.family.eq_ignore_ascii_case(failing.family)
                && s.egress == Some(egress)
                && !s.disable_cooling
                && !s.terminal
                && s.cooling_until_ms.is_none_or(|u| u < until_ms)
        })
        .map(|s| s.id)
        .collect();
    Some(EgressLock {
        until_ms,
        cooldown_ms,
        reason: decision.reason,
        siblings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn failing(egress: Option<&str>) -> FailingConnection<'_> {
        FailingConnection {
            id: ConnectionId(0),
            family: "opencode",
            egress,
            disable_cooling: false,
        }
    }

    fn sibling(
        id: u32,
        family: &'static str,
        egress: Option<&'static str>,
    ) -> SiblingView<'static> {
        SiblingView {
            id: ConnectionId(id),
            family,
            egress,
            disable_cooling: false,
            terminal: false,
            cooling_until_ms: None,
        }
    }

    fn rate_limited(cooldown_ms: u64) -> FallbackDecision {
        FallbackDecision::new(true, cooldown_ms, Reason::RateLimitExceeded)
    }

    #[test]
    fn a_family_cools_together() {
        let siblings = [
            sibling(0, "opencode", Some("office")), // itself
            sibling(1, "opencode", Some("office")),
            sibling(2, "OpenCode", Some("office")),
            sibling(3, "opencode", Some("nat-eu")), // other egress
            sibling(4, "openai", Some("office")),   // other family
            sibling(5, "opencode", None),
        ];
        let lock = egress_lock(
            &failing(Some("office")),
            429,
            &rate_limited(6_000),
            &siblings,
            NOW,
        )
        .unwrap();
        assert_eq!(
            lock,
            EgressLock {
                until_ms: NOW + 6_000,
                cooldown_ms: 6_000,
                reason: Reason::RateLimitExceeded,
                siblings: vec![ConnectionId(1), ConnectionId(2)],
            }
        );
        let quota = FallbackDecision::new(true, 3_600_000, Reason::QuotaExhausted);
        let lock = egress_lock(&failing(Some("office")), 429, &quota, &siblings, NOW).unwrap();
        assert_eq!(
            (lock.reason, lock.until_ms),
            (Reason::QuotaExhausted, NOW + 3_600_000)
        );
    }

    #[test]
    fn zero_cooldown_becomes_two_minutes() {
        let lock = egress_lock(&failing(Some("office")), 429, &rate_limited(0), &[], NOW).unwrap();
        assert_eq!(lock.cooldown_ms, EGRESS_DEFAULT_COOLDOWN_MS);
        assert!(lock.siblings.is_empty());
    }

    #[test]
    fn terminal_longer_cooling_and_disable_cooling_siblings_are_left_alone() {
        let mut terminal = sibling(1, "opencode", Some("office"));
        terminal.terminal = true;
        let mut longer = sibling(2, "opencode", Some("office"));
        longer.cooling_until_ms = Some(NOW + 60_000);
        let mut equal = sibling(3, "opencode", Some("office"));
        equal.cooling_until_ms = Some(NOW + 10_000);
        let mut shorter = sibling(4, "opencode", Some("office"));
        shorter.cooling_until_ms = Some(NOW + 1_000);
        let mut no_cooling = sibling(5, "opencode", Some("office"));
        no_cooling.disable_cooling = true;
        let mut expired = sibling(6, "opencode", Some("office"));
        expired.cooling_until_ms = Some(NOW - 1);
        let all = [terminal, longer, equal, shorter, no_cooling, expired];
        let lock = egress_lock(
            &failing(Some("office")),
            429,
            &rate_limited(10_000),
            &all,
            NOW,
        )
        .unwrap();
        assert_eq!(lock.siblings, vec![ConnectionId(4), ConnectionId(6)]);
    }

    #[test]
    fn does_not_apply() {
        let siblings = [sibling(1, "opencode", Some("office"))];
        let f = failing(Some("office"));
        // Not a 429.
        assert_eq!(
            egress_lock(&f, 503, &rate_limited(1_000), &siblings, NOW),
            None
        );
        // Other reasons.
        for reason in [
            Reason::ServerError,
            Reason::AuthError,
            Reason::ModelCapacity,
            Reason::Unknown,
        ] {
            let d = FallbackDecision::new(true, 1_000, reason);
            assert_eq!(egress_lock(&f, 429, &d, &siblings, NOW), None, "{reason:?}");
        }
        // Ban or credits: never from an IP-level signal.
        let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
        d.credits_exhausted = true;
        assert_eq!(egress_lock(&f, 429, &d, &siblings, NOW), None);
        let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
        d.permanent = true;
        assert_eq!(egress_lock(&f, 429, &d, &siblings, NOW), None);
        // No label, or the failing connection does not cool.
        assert_eq!(
            egress_lock(&failing(None), 429, &rate_limited(1_000), &siblings, NOW),
            None
        );
        let mut f = failing(Some("office"));
        f.disable_cooling = true;
        assert_eq!(
            egress_lock(&f, 429, &rate_limited(1_000), &siblings, NOW),
            None
        );
    }
}
