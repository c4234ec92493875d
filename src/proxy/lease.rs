//! Exclusive session leases at the front door (B §5): `POST /api/v1/session-leases` with
//! its checks in the spec's order, and the fence an inference request of a lease-managed
//! key passes before dispatch (B §5.4). The leases themselves live on the lease-owner
//! shard (`owners::leases`).

use serde_json::{Value, json};

use crate::auth::{Caller, presented_key};
use crate::config::{ClientKey, Config, ConnectionId, Scope};
use crate::error::{ErrorKind, GatewayError, LeaseCode};
use crate::http1::RequestHead;
use crate::owners::Req;
use crate::owners::leases::client::{act, owner_hash};
use crate::owners::leases::protocol::{Action, Reply};
use crate::resilience::backoff::format_rfc3339_ms;
use crate::routing::lease::{AcquireRefused, Fence, LeaseInfo, MAX_RETRY_AFTER_S};
use crate::routing::resolve::resolve;

use super::relay::Plan;
use super::select::{Exclusion, Gate, gate};

/// The lease endpoint's path.
pub const LEASES_PATH: &str = "/api/v1/session-leases";
/// The owner token header.
const OWNER_HEADER: &str = "x-omniroute-lease-owner";
/// The generation header of inference requests.
const GENERATION_HEADER: &str = "x-omniroute-lease-generation";
/// The longest `model` of an acquire (B §5.2).
const MAX_ACQUIRE_MODEL_CHARS: usize = 512;
/// The largest generation accepted (JavaScript's safe-integer bound, B §5.4).
const MAX_GENERATION: u64 = (1 << 53) - 1;
/// The request fields an `OPTIONS` on the lease endpoint allows.
pub const LEASE_ALLOW_HEADERS: &str = "authorization, content-type, x-api-key, \
     x-omniroute-lease-owner, x-omniroute-lease-generation";

fn lease_error(
    code: LeaseCode,
    message: impl Into<std::borrow::Cow<'static, str>>,
) -> GatewayError {
    GatewayError::new(ErrorKind::Lease(code), message)
}

/// One of the four actions of the endpoint's body.
enum Asked {
    Acquire { model: String },
    Renew { generation: u64 },
    Release { generation: u64 },
    Status { generation: u64 },
}

/// `POST /api/v1/session-leases`: (status, content type, body) or a lease error.
pub async fn serve(
    shard: &Req<'_>,
    head: &RequestHead,
    body: &[u8],
) -> Result<(u16, &'static str, String), GatewayError> {
    let config = shard.config();
    // 1. A key, and a valid one.
    if presented_key(head).is_none() {
        return Err(lease_error(
            LeaseCode::AuthenticationRequired,
            "an API key is required (Authorization: Bearer <key> or x-api-key)",
        ));
    }
    let key = match shard.caller(head) {
        Caller::Key(i) => config.client_keys.get(i),
        Caller::Admin => None,
        Caller::Open | Caller::Denied => {
            return Err(lease_error(LeaseCode::ApiKeyInvalid, "invalid API key"));
        }
    };
    // 2. A JSON body.
    let json_type = head.header("content-type").is_some_and(|v| {
        let v = String::from_utf8_lossy(v);
        let media = v.split(';').next().unwrap_or_default().trim();
        media.eq_ignore_ascii_case("application/json")
    });
    if !json_type {
        return Err(lease_error(
            LeaseCode::ContentTypeRequired,
            "Content-Type: application/json is required",
        ));
    }
    // 3. One of the four actions.
    let asked = parse_action(body)?;
    // 4. The scope, and an explicit list of connections.
    let Some(key) = key.filter(|k| k.has_scope(Scope::LeaseExclusive)) else {
        return Err(lease_error(
            LeaseCode::ScopeRequired,
            "this key lacks the lease:exclusive scope",
        ));
    };
    let allowed = lease_connections(key)?;
    // 5. The owner.
    let owner = owner_of(head)?;
    let ttl_ms = config.server.lease_ttl_ms;
    let action = match asked {
        Asked::Acquire { model } => {
            let Eligibility {
                candidates,
                eligible,
            } = eligibility(shard, config, allowed, &model)?;
            Action::Acquire {
                candidates,
                eligible,
                ttl_ms,
            }
        }
        Asked::Renew { generation } => Action::Renew { generation, ttl_ms },
        Asked::Release { generation } => Action::Release { generation },
        Asked::Status { generation } => Action::Status { generation },
    };
    let status = matches!(action, Action::Status { .. });
    match act(shard, owner, &key.id, action).await? {
        Reply::Lease(info) => Ok((200, "application/json", answer(config, &info, status))),
        Reply::Stale => Err(lease_error(
            LeaseCode::FenceStale,
            "no active lease of this owner, key and generation",
        )),
        Reply::Refused(AcquireRefused::OwnerActive) => Err(lease_error(
            LeaseCode::OwnerActive,
            "this owner already holds an active lease through another key or connection",
        )),
        Reply::Refused(AcquireRefused::Capacity {
            eligible,
            free,
            retry_after_s,
        }) => Err(capacity(eligible, free, retry_after_s)),
        Reply::Fence(_) | Reply::Count(_) => Err(lease_error(
            LeaseCode::ServiceUnavailable,
            "the lease service answered out of turn",
        )),
    }
}

/// The 429 capacity answer (B §5.2).
fn capacity(eligible: u32, free: u32, retry_after_s: u64) -> GatewayError {
    lease_error(
        LeaseCode::CapacityUnavailable,
        "capacity temporarily unavailable: every eligible connection is leased",
    )
    .with_retry_after(retry_after_s)
    .with_top_level("state", json!("WAITING_FOR_CAPACITY"))
    .with_top_level("reason", json!("NO_FREE_ELIGIBLE_CONNECTION"))
    .with_top_level("retryAfter", json!(retry_after_s.max(1)))
    .with_top_level("eligibleCount", json!(eligible))
    .with_top_level("freeCount", json!(free))
}

/// A lease's 200 body: never the connection's id, the key or the owner; `status` adds the
/// connection's provider. A Tidegate connection has no display name apart from its
/// configured id, so `displayName` is always `null`.
fn answer(config: &Config, info: &LeaseInfo, status: bool) -> String {
    let mut body = json!({
        "state": info.state.as_str(),
        "generation": info.generation,
        "acquiredAt": format_rfc3339_ms(info.acquired_wall_ms),
        "renewedAt": format_rfc3339_ms(info.renewed_wall_ms),
        "expiresAt": format_rfc3339_ms(info.expires_wall_ms),
    });
    if status && let Some(c) = config.connection_by_id(info.connection) {
        body["connection"] = json!({
            "displayName": null,
            "provider": config.provider(c.provider).name,
        });
    }
    body.to_string()
}

/// The key's explicit connections (B §5.2 step 4).
fn lease_connections(key: &ClientKey) -> Result<&[ConnectionId], GatewayError> {
    match key.allowed_connections.as_deref() {
        Some(list) if !list.is_empty() => Ok(list),
        _ => Err(lease_error(
            LeaseCode::KeyConfigurationInvalid,
            "exclusive lease keys require explicit allowed connections",
        )),
    }
}

/// The owner token of `X-OmniRoute-Lease-Owner`, as its digest (B §5.2 step 5).
fn owner_of(head: &RequestHead) -> Result<crate::routing::lease::OwnerHash, GatewayError> {
    let Some(raw) = head.header(OWNER_HEADER) else {
        return Err(lease_error(
            LeaseCode::ContextRequired,
            "X-OmniRoute-Lease-Owner is required",
        ));
    };
    let token = std::str::from_utf8(raw).unwrap_or_default().trim();
    if token.is_empty() {
        return Err(lease_error(
            LeaseCode::ContextRequired,
            "X-OmniRoute-Lease-Owner is required",
        ));
    }
    if !is_owner_token(token) {
        return Err(lease_error(
            LeaseCode::ContextInvalid,
            "X-OmniRoute-Lease-Owner must be vlo_ followed by 43 base64url characters",
        ));
    }
    Ok(owner_hash(token))
}

/// `vlo_` + 43 base64url characters (32 random bytes).
fn is_owner_token(token: &str) -> bool {
    token.strip_prefix("vlo_").is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// A positive integer no larger than [`MAX_GENERATION`].
fn generation_of(v: Option<&Value>) -> Option<u64> {
    v?.as_u64().filter(|g| (1..=MAX_GENERATION).contains(g))
}

fn parse_action(body: &[u8]) -> Result<Asked, GatewayError> {
    let invalid = || {
        lease_error(
            LeaseCode::ActionInvalid,
            "the body must be {\"action\":\"acquire\",\"model\":\"<1 to 512 characters>\"} or \
             {\"action\":\"renew\"|\"release\"|\"status\",\"generation\":<1 to 2^53-1>} \
             (release may add \"reason\":\"OWNER_EXIT\" or \"CLIENT_CANCELLED\")",
        )
    };
    let v: Value = serde_json::from_slice(body).map_err(|_| invalid())?;
    let action = v
        .get("action")
        .and_then(Value::as_str)
        .ok_or_else(invalid)?;
    let generation = || generation_of(v.get("generation")).ok_or_else(invalid);
    match action {
        "acquire" => {
            let model = v.get("model").and_then(Value::as_str).ok_or_else(invalid)?;
            let chars = model.chars().count();
            if chars == 0 || chars > MAX_ACQUIRE_MODEL_CHARS {
                return Err(invalid());
            }
            Ok(Asked::Acquire {
                model: model.to_owned(),
            })
        }
        "renew" => Ok(Asked::Renew {
            generation: generation()?,
        }),
        "release" => {
            let reason_ok = match v.get("reason") {
                None | Some(Value::Null) => true,
                Some(r) => matches!(r.as_str(), Some("OWNER_EXIT" | "CLIENT_CANCELLED")),
            };
            if !reason_ok {
                return Err(invalid());
            }
            Ok(Asked::Release {
                generation: generation()?,
            })
        }
        "status" => Ok(Asked::Status {
            generation: generation()?,
        }),
        _ => Err(invalid()),
    }
}

/// The connections an acquire may lease (B §5.2 step 7).
struct Eligibility {
    /// The key's connections that serve the model, in routing order, routable or not.
    candidates: Vec<ConnectionId>,
    /// Those of them routable now by this shard's views, in the same order.
    eligible: Vec<ConnectionId>,
}

/// How one candidate connection stands for an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Routable now (a half-open breaker counts: its probe goes to the lease's first
    /// request).
    Routable,
    /// Cooling, model-locked or behind an open breaker, for about this long (ms;
    /// `u64::MAX`: not known).
    Held(u64),
    /// Terminal (expired, banned, credits exhausted): never leased.
    Terminal,
}

/// The connections of `allowed` that can serve `model` (resolved as an inference model),
/// in routing order (B §5.2 step 6), and which of them are routable now: the checks
/// selection makes (`select::gate`: connection cooldown and terminal state, model
/// lockout, breakers), on this shard's views. A connection serving several of the
/// model's targets stands as its best. None serves the model, or every one that does is
/// terminal: 409 `LEASE_NO_ELIGIBLE_CONNECTION`; every one that is not terminal is held:
/// 429 `LEASE_ELIGIBILITY_UNAVAILABLE`, `Retry-After` when the earliest is free again.
fn eligibility(
    shard: &Req<'_>,
    config: &Config,
    allowed: &[ConnectionId],
    model: &str,
) -> Result<Eligibility, GatewayError> {
    // The resolver's own words, as an inference request for the model would get them (they
    // name the model where it matters).
    let resolved = resolve(config, &shard.shared().routes, model)
        .map_err(|e| lease_error(LeaseCode::ModelInvalid, e.message))?;
    let now = shard.now();
    let views = shard.state().views.borrow();
    let mut standings: Vec<(ConnectionId, Standing)> = Vec::new();
    for t in resolved.targets.iter() {
        for c in shard.shared().routes.connections(t.provider) {
            if !allowed.contains(c) {
                continue;
            }
            let standing = match gate(&views, config, t, *c, now) {
                Gate::Pass | Gate::NeedProbe(_) => Standing::Routable,
                Gate::Skip(Exclusion::Terminal(_), _) => Standing::Terminal,
                Gate::Skip(_, retry_after_ms) => Standing::Held(retry_after_ms.unwrap_or(u64::MAX)),
            };
            match standings.iter_mut().find(|(seen, _)| seen == c) {
                Some((_, s)) => *s = better(*s, standing),
                None => standings.push((*c, standing)),
            }
        }
    }
    drop(views);
    let eligible: Vec<ConnectionId> = standings
        .iter()
        .filter(|(_, s)| *s == Standing::Routable)
        .map(|(c, _)| *c)
        .collect();
    if eligible.is_empty() {
        let held = standings.iter().filter_map(|(_, s)| match s {
            Standing::Held(ms) => Some(*ms),
            Standing::Routable | Standing::Terminal => None,
        });
        if let Some(ms) = held.min() {
            let mut e = lease_error(
                LeaseCode::EligibilityUnavailable,
                format!(
                    "every connection of this key that serves model {model:?} is cooling, \
                     locked or behind an open breaker"
                ),
            );
            if ms < u64::MAX {
                e = e.with_retry_after(ms.div_ceil(1_000).clamp(1, MAX_RETRY_AFTER_S));
            }
            return Err(e);
        }
        let message = if standings.is_empty() {
            // The key's connections of the model's provider may all be disabled
            // (`api_key_env` unset at load): say so, without naming them (a lease answer
            // names no connection; the start-up warning does).
            let disabled = allowed.iter().any(|c| {
                config.connection_by_id(*c).is_some_and(|c| {
                    !c.enabled && resolved.targets.iter().any(|t| t.provider == c.provider)
                })
            });
            let mut message = format!("none of this key's connections can serve model {model:?}");
            if disabled {
                message += " (its connections of that provider are disabled: api_key_env unset)";
            }
            message
        } else {
            format!("every connection of this key that serves model {model:?} is terminal")
        };
        return Err(lease_error(LeaseCode::NoEligibleConnection, message));
    }
    Ok(Eligibility {
        candidates: standings.into_iter().map(|(c, _)| c).collect(),
        eligible,
    })
}

/// The better of two standings of one connection (routable, then the shorter hold).
fn better(a: Standing, b: Standing) -> Standing {
    match (a, b) {
        (Standing::Routable, _) | (_, Standing::Routable) => Standing::Routable,
        (Standing::Held(x), Standing::Held(y)) => Standing::Held(x.min(y)),
        (Standing::Held(x), Standing::Terminal) | (Standing::Terminal, Standing::Held(x)) => {
            Standing::Held(x)
        }
        (Standing::Terminal, Standing::Terminal) => Standing::Terminal,
    }
}

/// Whether `key` is lease-managed: its inference requests pass the fence.
pub fn is_managed(config: &Config, key: Option<usize>) -> bool {
    key.and_then(|i| config.client_keys.get(i))
        .is_some_and(ClientKey::is_lease_managed)
}

/// The fence of a lease-managed key's inference request (B §5.4): both lease headers, a
/// single route, and the owner's valid lease; the plan keeps only the leased connection.
pub async fn fence(
    shard: &Req<'_>,
    head: &RequestHead,
    plan: &mut Plan,
) -> Result<(), GatewayError> {
    let config = shard.config();
    let Some(key) = plan.key.and_then(|i| config.client_keys.get(i)) else {
        return Ok(());
    };
    let owner = owner_of(head)?;
    let Some(raw) = head.header(GENERATION_HEADER) else {
        return Err(lease_error(
            LeaseCode::ContextRequired,
            "X-OmniRoute-Lease-Generation is required",
        ));
    };
    let text = std::str::from_utf8(raw).unwrap_or_default().trim();
    let generation = is_generation(text)
        .then(|| text.parse::<u64>().ok())
        .flatten()
        .filter(|g| *g <= MAX_GENERATION)
        .ok_or_else(|| {
            lease_error(
                LeaseCode::ContextInvalid,
                "X-OmniRoute-Lease-Generation must be a positive integer",
            )
        })?;
    if plan.combo.is_some() {
        return Err(lease_error(
            LeaseCode::UnsupportedRoute,
            "a lease-managed key cannot use a combo (it could dispatch to several connections)",
        ));
    }
    let reply = act(shard, owner, &key.id, Action::Fence { generation }).await?;
    let connection = match reply {
        Reply::Fence(Fence::Valid(c)) => c,
        Reply::Fence(Fence::Required) => {
            return Err(lease_error(LeaseCode::Required, "LEASE REQUIRED"));
        }
        Reply::Fence(Fence::Stale) => {
            return Err(lease_error(LeaseCode::FenceStale, "LEASE FENCE STALE"));
        }
        Reply::Fence(Fence::AuthorizationMismatch) => {
            return Err(lease_error(
                LeaseCode::AuthorizationMismatch,
                "LEASE AUTHORIZATION MISMATCH",
            ));
        }
        Reply::Lease(_) | Reply::Refused(_) | Reply::Stale | Reply::Count(_) => {
            return Err(lease_error(
                LeaseCode::ServiceUnavailable,
                "the lease service answered out of turn",
            ));
        }
    };
    plan.candidates.retain(|(_, c)| *c == connection);
    if plan.candidates.is_empty() {
        return Err(lease_error(
            LeaseCode::ConnectionMismatch,
            "LEASE CONNECTION MISMATCH",
        ));
    }
    Ok(())
}

/// `^[1-9][0-9]*$`.
fn is_generation(text: &str) -> bool {
    let mut bytes = text.bytes();
    matches!(bytes.next(), Some(b'1'..=b'9')) && bytes.all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_and_generations_are_checked_exactly() {
        let good = format!("vlo_{}", "a".repeat(43));
        assert!(is_owner_token(&good));
        assert!(is_owner_token(&format!("vlo_{}-_", "Z9".repeat(20) + "x")));
        assert!(!is_owner_token(&format!("vlo_{}", "a".repeat(42))));
        assert!(!is_owner_token(&format!("vlo_{}", "a".repeat(44))));
        assert!(!is_owner_token(&format!("vlx_{}", "a".repeat(43))));
        assert!(!is_owner_token(&format!("vlo_{}=", "a".repeat(42))));
        assert!(is_generation("1") && is_generation("120"));
        assert!(!is_generation("0") && !is_generation("01") && !is_generation("-1"));
        assert!(!is_generation("") && !is_generation("1.0") && !is_generation("+1"));
    }

    #[test]
    fn bodies_are_one_of_the_four_actions() {
        let ok = |b: &str| parse_action(b.as_bytes()).is_ok();
        assert!(ok(r#"{"action":"acquire","model":"mock/echo"}"#));
        assert!(ok(r#"{"action":"renew","generation":3}"#));
        assert!(ok(
            r#"{"action":"release","generation":1,"reason":"OWNER_EXIT"}"#
        ));
        assert!(ok(r#"{"action":"release","generation":1}"#));
        assert!(ok(r#"{"action":"status","generation":1}"#));
        assert!(!ok(r#"{"action":"acquire","model":""}"#));
        assert!(!ok(&format!(
            r#"{{"action":"acquire","model":"{}"}}"#,
            "m".repeat(513)
        )));
        assert!(!ok(r#"{"action":"renew","generation":0}"#));
        assert!(!ok(r#"{"action":"renew","generation":1.5}"#));
        assert!(!ok(r#"{"action":"renew","generation":"1"}"#));
        assert!(!ok(r#"{"action":"renew","generation":9007199254740992}"#));
        assert!(!ok(
            r#"{"action":"release","generation":1,"reason":"BORED"}"#
        ));
        assert!(!ok(r#"{"action":"steal"}"#));
        assert!(!ok("[]"));
        assert!(!ok("not json"));
    }
}
