//! Upstream status restatement (spec A §6.1): some upstreams report a temporary quota
//! shortage with a status that clients treat as final (agentrouter answers 403, sometimes
//! 400, with `额度不足` where it means 429). This module owns the per-provider registry of
//! such misstatements and the pure function that corrects the status once per upstream
//! error response, before classification, so the client, the fallback logic and the
//! combo aggregation all see the real, retryable nature of the failure.
//!
//! The output carries two views:
//! - for the client: the corrected status and the `Retry-After` to send in place of the
//!   upstream's ([`Restatement::client_retry_after_secs`]);
//! - for classification: the corrected status ([`Restatement::status`]) with the
//!   upstream's own headers. The synthetic retry window is only advertised to the client;
//!   internal cooldowns come from classification and the connection backoff, so the
//!   router may legitimately retry a connection before the advertised window ends.
//!
//! Errors inside a 200 SSE stream are not restated (the caller only calls this for an
//! error status). A 429 is never restated (no rule lists it as a source status).

/// One restatement rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestatementRule {
    pub id: &'static str,
    pub from_statuses: &'static [u16],
    pub to_status: u16,
    /// Lower-case markers; any one must appear in the error text.
    pub text_markers: &'static [&'static str],
    /// Lower-case markers; any one vetoes the rule (a permanent error that must keep its
    /// status).
    pub exclude_markers: &'static [&'static str],
    /// Retry window told to the client when the upstream gave none.
    pub default_retry_after_ms: Option<u64>,
}

/// agentrouter reports "user quota insufficient" as 403/400; "no access to the model"
/// (`无权访问…`) is a real permission error and keeps its status.
pub const AGENTROUTER_QUOTA_MISSTATUS: RestatementRule = RestatementRule {
    id: "agentrouter-quota-misstatus",
    from_statuses: &[403, 400],
    to_status: 429,
    text_markers: &["额度不足"],
    exclude_markers: &["无权访问"],
    default_retry_after_ms: Some(60_000),
};

/// Provider id (lower-case) → ordered rules; the first match wins.
const REGISTRY: &[(&str, &[RestatementRule])] = &[("agentrouter", &[AGENTROUTER_QUOTA_MISSTATUS])];

/// The restatement rules of a provider (compared case-insensitively), in order.
pub fn restatement_rules(provider: &str) -> &'static [RestatementRule] {
    let provider = provider.trim();
    REGISTRY
        .iter()
        .find(|(p, _)| p.eq_ignore_ascii_case(provider))
        .map_or(&[], |(_, rules)| rules)
}

/// The outcome of [`apply_status_restatement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restatement {
    /// The status the client sees and classification classifies.
    pub status: u16,
    /// The upstream's status.
    pub from_status: u16,
    /// The rule that restated it, if any.
    pub rule_id: Option<&'static str>,
    /// The retry window: the upstream's own when it gave one, else the rule default when
    /// restated, else none.
    pub retry_after_ms: Option<u64>,
}

impl Restatement {
    fn passthrough(status: u16, retry_after_ms: Option<u64>) -> Self {
        Self {
            status,
            from_status: status,
            rule_id: None,
            retry_after_ms,
        }
    }

    pub fn is_restated(&self) -> bool {
        self.rule_id.is_some()
    }

    /// The `Retry-After` (whole seconds, rounded up) the client response must carry instead
    /// of the upstream's, when the status was restated; `None` = relay the upstream's
    /// headers unchanged.
    pub fn client_retry_after_secs(&self) -> Option<u64> {
        if !self.is_restated() {
            return None;
        }
        self.retry_after_ms.map(|ms| ms.div_ceil(1_000))
    }
}

/// Corrects a misstated upstream status. `message` is the parsed error message (empty if
/// none), `body` the raw error body, `retry_after_ms` the upstream's own retry window if it
/// sent one. Without a provider, without rules for it, or with a blank text, the status
/// passes through.
pub fn apply_status_restatement(
    provider: Option<&str>,
    status: u16,
    message: &str,
    body: &str,
    retry_after_ms: Option<u64>,
) -> Restatement {
    let rules = match provider {
        Some(p) => restatement_rules(p),
        None => &[],
    };
    if rules.is_empty() {
        return Restatement::passthrough(status, retry_after_ms);
    }
    let haystack = format!("{message} {body}").to_lowercase();
    if haystack.trim().is_empty() {
        return Restatement::passthrough(status, retry_after_ms);
    }
    let hit = rules.iter().find(|r| {
        r.from_statuses.contains(&status)
            && r.text_markers.iter().any(|m| haystack.contains(m))
            && !r.exclude_markers.iter().any(|m| haystack.contains(m))
    });
    match hit {
        Some(rule) => Restatement {
            status: rule.to_status,
            from_status: status,
            rule_id: Some(rule.id),
            retry_after_ms: retry_after_ms
                .filter(|ms| *ms > 0)
                .or(rule.default_retry_after_ms),
        },
        None => Restatement::passthrough(status, retry_after_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agentrouter_quota_403_becomes_429_with_retry_after_60() {
        let body =
            r#"{"error":{"message":"用户额度不足, 剩余额度: $0.00","type":"new_api_error"}}"#;
        let r = apply_status_restatement(Some("agentrouter"), 403, "", body, None);
        assert_eq!(
            r,
            Restatement {
                status: 429,
                from_status: 403,
                rule_id: Some("agentrouter-quota-misstatus"),
                retry_after_ms: Some(60_000),
            }
        );
        assert!(r.is_restated());
        assert_eq!(r.client_retry_after_secs(), Some(60));

        // 400 too, and the marker found in the message alone; provider id case-insensitive.
        let r = apply_status_restatement(Some("AgentRouter"), 400, "额度不足", "", None);
        assert_eq!((r.status, r.from_status), (429, 400));
    }

    #[test]
    fn upstream_retry_window_wins_over_the_default() {
        let r = apply_status_restatement(Some("agentrouter"), 403, "额度不足", "", Some(1_500));
        assert_eq!(r.retry_after_ms, Some(1_500));
        assert_eq!(r.client_retry_after_secs(), Some(2));
        let r = apply_status_restatement(Some("agentrouter"), 403, "额度不足", "", Some(0));
        assert_eq!(r.retry_after_ms, Some(60_000));
    }

    #[test]
    fn exclude_markers_stop_it() {
        let r = apply_status_restatement(
            Some("agentrouter"),
            403,
            "",
            "用户额度不足 且 无权访问模型 gpt-5",
            None,
        );
        assert_eq!(r, Restatement::passthrough(403, None));
        assert!(!r.is_restated());
        assert_eq!(r.client_retry_after_secs(), None);
    }

    #[test]
    fn passthrough_cases() {
        // Wrong status (429 is never a source), no marker, other provider, no provider, blank.
        for (provider, status, text) in [
            (Some("agentrouter"), 429, "额度不足"),
            (Some("agentrouter"), 500, "额度不足"),
            (Some("agentrouter"), 403, "forbidden"),
            (Some("openai"), 403, "额度不足"),
            (None, 403, "额度不足"),
            (Some("agentrouter"), 403, "   "),
        ] {
            let r = apply_status_restatement(provider, status, text, "", Some(7_000));
            assert_eq!(
                r,
                Restatement::passthrough(status, Some(7_000)),
                "{provider:?} {status} {text}"
            );
        }
        assert!(restatement_rules("openai").is_empty());
        assert_eq!(restatement_rules(" agentrouter ").len(), 1);
    }
}
