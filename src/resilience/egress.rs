//! The egress-bucketed lock (spec A §7, upstream #10880): some upstreams count quota per
//! outbound IP rather than per account, so once one connection gets a 429 for quota or rate
//! limit, every other connection of the same provider family leaving through the same IP
//! will get the same answer. This module owns the pure decisions — whether the lock applies
//! to a failure ([`egress_cooldown_ms`], step 11 of `markAccountUnavailable`, run by
//! connection state) and whom else to cool ([`egress_siblings`]); the owner shards of the
//! connections apply them (the failing connection's owner and, by events, the siblings'
//! owners), so N−1 doomed upstream calls are never made.
//!
//! A connection **takes part** when its provider's kind is on OmniRoute's default allowlist
//! (`opencode-go`, `opencode-cli`: `Quirks::egress_lock_by_default`) or when it carries an
//! `egress` label (any provider). The lock applies to an account-wide failure only: status
//! 429, reason `quota_exhausted` or `rate_limit_exceeded`, neither a ban nor credit
//! exhaustion, no connection- or model-scoped provider rule (those are about one account or
//! one model: the connection-scope branch runs first), and a failing connection without
//! `disable_cooling`. Connection state reaches this step only when the failing connection
//! was neither terminal nor already cooling, so a repeated 429 during one cooldown never
//! extends the siblings. It cools the failing connection for the classified cooldown (or
//! 120 s when that is 0) and every sibling — taking part, same family, same egress — to the
//! same deadline. It is never terminal.
//!
//! The egress of a connection is its `egress` label; connections without one leave through
//! the gateway's own address, one shared egress.
//!
//! Deliberate deviations from OmniRoute:
//! - **Siblings come from configuration, not from logs.** OmniRoute looks up the last egress
//!   IP each connection used in its proxy logs (24 h window, best effort). Tidegate's
//!   connections declare their outbound IP with an `egress` label (or share the gateway's),
//!   so the siblings are exact and known at start-up.
//! - **The allowlist is a kind quirk.** `OMNIROUTE_EGRESS_IP_LOCK_PROVIDERS` is not read;
//!   a label opts any other connection in. The family of a provider (its kind's
//!   `egress_family`) keeps the opencode members together as upstream did; every other
//!   provider is its own family.
//! - **"Longer" means longer.** A sibling already cooling until the new deadline or later is
//!   left alone; one cooling for less is extended to the new deadline (the guide's intent;
//!   OmniRoute's code leaves any active cooldown alone, even a shorter one).
//! - **Siblings with `disable_cooling` are skipped** (OmniRoute did not check the sibling's
//!   flag), so the flag means the same for a connection whatever failed.

use super::{FallbackDecision, Reason, RuleScope};
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
}

/// What the caller's view knows of another connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiblingView<'a> {
    pub id: ConnectionId,
    pub family: &'a str,
    pub egress: Option<&'a str>,
    /// Takes part in the egress lock (labelled, or its kind's default).
    pub takes_part: bool,
    pub disable_cooling: bool,
    /// Banned, expired or credits exhausted.
    pub terminal: bool,
    /// Cooling until this instant (same clock as `until_ms`), if cooling.
    pub cooling_until_ms: Option<u64>,
}

/// Whether the egress lock applies to this failure, and for how long the failing
/// connection (and its siblings) cool. `status` is the status classification saw (after
/// restatement).
pub fn egress_cooldown_ms(
    takes_part: bool,
    disable_cooling: bool,
    status: u16,
    decision: &FallbackDecision,
) -> Option<u64> {
    let applies = takes_part
        && status == 429
        && matches!(
            decision.reason,
            Reason::QuotaExhausted | Reason::RateLimitExceeded
        )
        && !matches!(
            decision.rule_scope,
            Some(RuleScope::Connection | RuleScope::Model)
        )
        && !decision.permanent
        && !decision.credits_exhausted
        && !disable_cooling;
    applies.then_some(if decision.cooldown_ms > 0 {
        decision.cooldown_ms
    } else {
        EGRESS_DEFAULT_COOLDOWN_MS
    })
}

/// The siblings to cool until `until_ms`, in the order given.
pub fn egress_siblings<'a>(
    failing: &FailingConnection<'_>,
    until_ms: u64,
    siblings: impl IntoIterator<Item = &'a SiblingView<'a>>,
) -> Vec<ConnectionId> {
    siblings
        .into_iter()
        .filter(|s| {
            s.id != failing.id
                && s.takes_part
                && s.family.eq_ignore_ascii_case(failing.family)
                && s.egress == failing.egress
                && !s.disable_cooling
                && !s.terminal
                && s.cooling_until_ms.is_none_or(|u| u < until_ms)
        })
        .map(|s| s.id)
        .collect()
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
            takes_part: true,
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
        let mut not_taking_part = sibling(6, "opencode", Some("office"));
        not_taking_part.takes_part = false;
        let siblings = [
            sibling(0, "opencode", Some("office")), // itself
            sibling(1, "opencode", Some("office")),
            sibling(2, "OpenCode", Some("office")),
            sibling(3, "opencode", Some("nat-eu")), // other egress
            sibling(4, "openai", Some("office")),   // other family
            sibling(5, "opencode", None),           // the gateway's own address
            not_taking_part,
        ];
        let until = NOW + 6_000;
        assert_eq!(
            egress_siblings(&failing(Some("office")), until, &siblings),
            vec![ConnectionId(1), ConnectionId(2)]
        );
        // Unlabelled connections share the gateway's egress.
        assert_eq!(
            egress_siblings(&failing(None), until, &siblings),
            vec![ConnectionId(5)]
        );
    }

    #[test]
    fn cooldown_and_zero_becomes_two_minutes() {
        assert_eq!(
            egress_cooldown_ms(true, false, 429, &rate_limited(6_000)),
            Some(6_000)
        );
        let quota = FallbackDecision::new(true, 3_600_000, Reason::QuotaExhausted);
        assert_eq!(
            egress_cooldown_ms(true, false, 429, &quota),
            Some(3_600_000)
        );
        assert_eq!(
            egress_cooldown_ms(true, false, 429, &rate_limited(0)),
            Some(EGRESS_DEFAULT_COOLDOWN_MS)
        );
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
        assert_eq!(
            egress_siblings(&failing(Some("office")), NOW + 10_000, &all),
            vec![ConnectionId(4), ConnectionId(6)]
        );
    }

    #[test]
    fn does_not_apply() {
        // Not a 429.
        assert_eq!(
            egress_cooldown_ms(true, false, 503, &rate_limited(1_000)),
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
            assert_eq!(egress_cooldown_ms(true, false, 429, &d), None, "{reason:?}");
        }
        // Ban or credits: never from an IP-level signal.
        let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
        d.credits_exhausted = true;
        assert_eq!(egress_cooldown_ms(true, false, 429, &d), None);
        let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
        d.permanent = true;
        assert_eq!(egress_cooldown_ms(true, false, 429, &d), None);
        // A connection- or model-scoped rule is about one account or one model.
        for scope in [RuleScope::Connection, RuleScope::Model] {
            let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
            d.rule_scope = Some(scope);
            assert_eq!(egress_cooldown_ms(true, false, 429, &d), None, "{scope:?}");
        }
        let mut d = FallbackDecision::new(true, 1_000, Reason::QuotaExhausted);
        d.rule_scope = Some(RuleScope::Provider);
        assert_eq!(egress_cooldown_ms(true, false, 429, &d), Some(1_000));
        // Not taking part, or the failing connection does not cool.
        assert_eq!(
            egress_cooldown_ms(false, false, 429, &rate_limited(1_000)),
            None
        );
        assert_eq!(
            egress_cooldown_ms(true, true, 429, &rate_limited(1_000)),
            None
        );
    }
}
