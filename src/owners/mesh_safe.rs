//! Every type that crosses the mesh, declared [`MeshSafe`](crate::mesh::safe::MeshSafe)
//! field by field (`mesh_safe!` checks each list is exhaustive and each field's kind). A
//! mechanism's messages must be listed here (`Mechanism` requires it) — so a message that
//! carries an upstream body or a header list does not compile: a `String` is accepted only
//! as a marked name, and bounded text only as [`LastError`] (at most
//! [`MAX_LAST_ERROR_BYTES`](crate::resilience::connection::MAX_LAST_ERROR_BYTES) bytes).

use crate::config::{ComboId, ConnectionId, ProviderId};
use crate::flow::gates::GateError;
use crate::flow::queue::{QueueError, ResponseFacts};
use crate::mesh::safe::MeshSafe;
use crate::mesh_safe;
use crate::owners::health::protocol::LastError;
use crate::resilience::breaker::{BreakerKey, BreakerView, Failure, ProbeTicket};
use crate::resilience::connection::{ConnectionView, ProviderErrorType};
use crate::resilience::lockout::LockView;
use crate::resilience::{HintSource, Reason, RuleScope};

// Ids, numbers and closed enums: `Copy`, so they own no heap data at all.
mesh_safe!(copy:
    ComboId, ConnectionId, ProviderId, BreakerKey, BreakerView, ConnectionView, LockView, ProbeTicket,
    Failure, ProviderErrorType, Reason, HintSource, RuleScope, GateError, QueueError,
    ResponseFacts,
);

/// Bounded by construction: `LastError::new` sanitises and cuts the text to
/// `MAX_LAST_ERROR_BYTES` (500) bytes, and its field is private.
impl MeshSafe for LastError {}

mod health {
    use crate::mesh_safe;
    use crate::owners::health::protocol::{
        AdminRequest, BreakerEntry, ComboAttempt, ConnectionEntry, EgressCooled, Ended, Fact,
        LockEntry, Outcome, OwnerStatus, ProviderReport, Reply, Request, TrackerView, Verdict,
        View,
    };
    use crate::resilience::FallbackDecision;
    use crate::resilience::lockout::{KeyModel, LockKey, LockUpdate};
    use crate::resilience::tracker::TrackerKey;

    use crate::resilience::connection::ClearOutcome;

    mesh_safe!(copy: ProviderReport, TrackerKey, TrackerView, ComboAttempt, EgressCooled);
    // The management API's answers: ids, numbers, closed enums and names.
    mesh_safe!(copy: BreakerEntry, ConnectionEntry, ClearOutcome);
    mesh_safe!(enum Reply {
        Probe { key, ticket, retry_after_ms },
        Applied { egress },
        Reset { breakers, lockouts },
        Cleared { outcome, lockouts },
        Removed { any },
        Status(status),
    });
    mesh_safe!(struct OwnerStatus { breakers, connections, lockouts });
    mesh_safe!(struct LockEntry {
        provider @ name, model @ name, connection, reason @ copy, remaining_ms, failure_count,
    });
    mesh_safe!(enum AdminRequest {
        Reset,
        ClearConnection(connection),
        ClearLocks { provider @ name, model @ name },
        ClearAllLocks,
        Status,
    });
    mesh_safe!(enum View {
        Breaker { key, view },
        Connection { connection, view },
        Lockout(update),
        Tracker { key, view },
    });
    mesh_safe!(struct LockUpdate { key, lock, seq });
    mesh_safe!(struct LockKey { provider @ name, connection, model });
    mesh_safe!(enum KeyModel { Family(model @ name), Exact(model @ name) });
    mesh_safe!(enum Fact {
        Outcome(outcome),
        ProviderResult(report),
        ReleaseProbe { key, ticket },
        AutoDecay { connection },
        EgressCool { connection, until_ms, reason },
    });
    mesh_safe!(
        enum Request {
            Probe(key),
            Outcome(outcome),
            ProviderResult(report),
            EgressCool(cooled),
            Admin(request),
        }
    );
    mesh_safe!(struct Outcome { provider, connection, model @ name, ended, probe, combo });
    mesh_safe!(
        enum Ended {
            Success,
            Failed(verdict),
            StreamBroken { error_type, last_error },
            ClientAbort,
        }
    );
    mesh_safe!(struct Verdict { status, decision, breaker, error_type, credits_signal, last_error });
    mesh_safe!(struct FallbackDecision {
        should_fallback, cooldown_ms, base_cooldown_ms, new_backoff_level,
        used_upstream_retry_hint, retry_hint_source, reason, permanent, credits_exhausted,
        daily_quota_exhausted, ambiguous_auth, skip_provider_breaker, quota_reset_hint_ms,
        configured_cooldown_ms, rule_scope, level_scaled,
    });
}

mod gates {
    use crate::mesh_safe;
    use crate::owners::gates::protocol::{Fact, Reply, Request};

    mesh_safe!(copy: Reply);
    mesh_safe!(enum Request {
        Acquire { connection, model @ name, deadline_ns },
        QsSlot { combo, connection, deadline_ns },
        ComboSlot { combo, connection, model @ name, deadline_ns, capacity, queue_depth },
    });
    mesh_safe!(enum Fact {
        Release { serial },
        Block { connection, model @ name, until_ns },
        Tick,
        Reconfigure,
    });
}

mod queue {
    use crate::mesh_safe;
    use crate::owners::queue::protocol::{Fact, Reply, Request};

    mesh_safe!(copy: Reply);
    mesh_safe!(enum Request { Acquire { connection, model @ name, waiting_since_ns } });
    mesh_safe!(enum Fact {
        Finish { id, learned },
        Learn { connection, model @ name, facts },
        Tick { key @ name },
    });
}

mod quota_share {
    use crate::mesh_safe;
    use crate::owners::quota_share::protocol::{Candidate, Fact, Pick, Reply, Request};

    mesh_safe!(struct Candidate { connection, execution_key @ name, weight });
    mesh_safe!(struct Pick { ordered, ticket });
    mesh_safe!(enum Request { Select { combo @ name, candidates } });
    mesh_safe!(
        enum Reply {
            Picked(pick),
        }
    );
    mesh_safe!(enum Fact { Release { serial } });
}

mod affinity {
    use crate::mesh_safe;
    use crate::owners::affinity::protocol::{Fact, Reply, Request};
    use crate::routing::affinity::Eligible;

    mesh_safe!(copy: Reply, Eligible);
    // The session is its key's SHA-256 digest (32 bytes), never the key.
    mesh_safe!(enum Request {
        Choose { provider, session @ copy, eligible, ttl_ms },
        Count,
    });
    mesh_safe!(enum Fact {
        Drop { provider, session @ copy, connection },
        Used { connection, at_ms },
    });
}

mod tool_limits {
    use crate::mesh_safe;
    use crate::owners::tool_limits::protocol::{Fact, Reply, Request};

    // No calls: both are empty enums (no value exists to cross).
    mesh_safe!(copy: Reply);
    impl crate::mesh::safe::MeshSafe for Request {}
    // The model is a configured model's name, never text from an upstream.
    mesh_safe!(enum Fact { Learned { provider, model @ name, tools, until_ms } });
}

mod leases {
    use crate::mesh_safe;
    use crate::owners::leases::protocol::{Action, Fact, Reply, Request};

    // Numbers, ids and closed enums (lease times, generations, counts).
    mesh_safe!(copy: Reply);
    // The owner is its token's SHA-256 digest, never the token; the key is a configured
    // client key's id.
    mesh_safe!(struct Request { owner @ copy, key @ name, action });
    mesh_safe!(enum Action {
        Acquire { candidates, eligible, ttl_ms },
        Renew { generation, ttl_ms },
        Release { generation },
        Status { generation },
        Fence { generation },
        Count,
    });
    // No facts: an empty enum (no value exists to cross).
    impl crate::mesh::safe::MeshSafe for Fact {}
}

#[cfg(test)]
mod tests {
    use crate::owners::health::protocol::{LastError, MAX_VERDICT_TEXT_BYTES};

    /// The one piece of text a verdict carries stays within its bound, whatever the
    /// upstream sent (here a 64 KiB error body with control characters).
    #[test]
    fn last_error_is_bounded_whatever_the_upstream_sent() {
        let body = format!("{{\"error\":\"{}\"}}\r\n", "x\u{7}é".repeat(16 * 1024));
        let e = LastError::new(&body);
        assert!(
            e.as_str().len() <= MAX_VERDICT_TEXT_BYTES,
            "{}",
            e.as_str().len()
        );
        assert_eq!(MAX_VERDICT_TEXT_BYTES, 500);
        assert!(!e.as_str().chars().any(char::is_control));
        let spaced: String = body
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        assert!(
            spaced.starts_with(e.as_str()),
            "a prefix of the body: {}",
            e.as_str()
        );
    }
}
