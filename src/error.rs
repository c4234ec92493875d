//! The gateway's one error type. Every failure the gateway itself produces is a
//! [`GatewayError`]: a closed [`ErrorKind`], the side it came from, and whether the
//! request may move on to another target. `ErrorKind::status`/`code`/`error_type` are the
//! one exhaustive mapping to HTTP; `proxy::respond` is the one place that writes it.

use std::borrow::Cow;
use std::fmt;

/// Whether the request may be retried on another target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    Decided(bool),
    /// Only if the failure happened on a reused (pooled) connection, which may have been
    /// closed by the peer while idle.
    IfReused,
}

/// Phase of an upstream exchange that ran out of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutPhase {
    Connect,
    ResponseHeader,
    BodyIdle,
    /// The hard per-attempt deadline (`stream_watchdog.active_timeout_ms`), never reset by
    /// incoming bytes.
    Active,
}

impl TimeoutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutPhase::Connect => "connect",
            TimeoutPhase::ResponseHeader => "response_header",
            TimeoutPhase::BodyIdle => "body_idle",
            TimeoutPhase::Active => "active",
        }
    }
}

/// The closed set of gateway-made failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Request line or headers do not parse, or framing is contradictory.
    MalformedRequest,
    /// The request head did not arrive within `header_timeout_ms`.
    HeadTimeout,
    /// The request head exceeds the head byte or header count limit.
    HeadTooLarge,
    /// The request body exceeds `max_request_body_bytes`.
    BodyTooLarge,
    /// The body is not valid JSON, or lacks the fields the endpoint needs.
    InvalidJson,
    /// The body is a JSON object without a `model`.
    MissingModel,
    /// A transfer coding other than chunked.
    UnsupportedTransferEncoding,
    /// No valid client key.
    Unauthorized,
    /// The client key lacks the scope, or may not use any connection of the target.
    Forbidden,
    /// No such route.
    RouteNotFound,
    /// The route exists but not for this method.
    MethodNotAllowed,
    /// The model names no combo, provider model or catalog entry.
    ModelNotFound,
    /// The provider's wire format does not serve this endpoint.
    EndpointNotSupported,
    /// The request names a field the chosen provider's format cannot express
    /// (`providers::translate`).
    UntranslatableRequest,
    /// The target has no enabled connection.
    NoConnection,
    /// `x-omniroute-connection` names no configured connection.
    UnknownConnection,
    /// `x-omniroute-connection` names a connection that cannot serve this request (another
    /// provider's, disabled, or not allowed for the client key).
    ConnectionNotUsable,
    /// TCP or TLS connect to the upstream failed.
    UpstreamConnect,
    /// The upstream ran out of one of its time budgets.
    UpstreamTimeout(TimeoutPhase),
    /// The whole request (every attempt and wait) ran past `[server] request_timeout_ms`.
    RequestTimeout,
    /// The upstream answered with bytes that are not HTTP/1.1, or closed mid-response.
    UpstreamProtocol,
    /// A stream produced no model output within the content-stall budget (spec B §7.1).
    StreamContentStall,
    /// A stream's useful output stayed below the throughput watchdog's minimum (B §7.2).
    StreamThroughputTooLow,
    /// The provider (or connection) circuit breaker is open (spec A §1.8).
    ProviderCircuitOpen,
    /// Every connection of the requested model is cooling down (spec B §3.4 model-cooldown).
    ModelCooldown,
    /// Every target was excluded by a breaker, cooldown or lockout (spec B §3.4).
    AllTargetsCoolingDown,
    /// Every connection of the model is in a terminal state (banned, expired, credits).
    AllConnectionsTerminal,
    /// A combo whose every target is unavailable for good (B §3.4).
    NoExecutableTargets,
    /// Every combo target was ruled out before dispatch, no cooldown applies (B §3.4).
    AllTargetsSkipped,
    /// As [`ErrorKind::AllTargetsSkipped`], with a known time to retry: a 429.
    AllTargetsSkippedRateLimited,
    /// Combo targets were attempted but no upstream answered with a status (B §3.4).
    AllAccountsInactive,
    /// As [`ErrorKind::AllAccountsInactive`], with a known time to retry: a 429.
    AllAccountsInactiveRateLimited,
    /// `combo_timeout_ms` ran out (B §3.4).
    ComboTimeout,
    /// A combo request reached the loop-safety cap on attempts (B §3.4).
    MaxAttemptsExceeded,
    /// Every attempted combo target failed, with failures of different classes (#10501).
    AllTargetsFailed,
    /// Every connection of the model cools after network errors (DNS, connect, TLS): the
    /// upstream could not be reached, nothing was rate limited.
    UpstreamUnreachable,
    /// A cross-shard request (probe permit) could not be answered in time.
    MeshUnavailable,
    /// Waited for a concurrency permit past the queue budget (spec B §2.1).
    SemaphoreTimeout,
    /// A concurrency gate's wait queue was full.
    SemaphoreQueueFull,
    /// The connection's request queue is at `max_queue_depth` (spec B §1.4).
    RateLimitQueueFull,
    /// Queued past `max_wait_ms`; never reached the upstream (spec B §1.3).
    RateLimitQueueTimeout,
    /// Ran past the execution budget `execution_max_wait_ms` (spec B §1.3).
    RateLimitExecutionTimeout,
    /// The queue stopped making progress (wedge watchdog).
    RateLimitQueueWedged,
    /// The gateway is shutting down and takes no new requests.
    ShuttingDown,
    /// An exclusive-lease refusal (spec B §5): `error.type` `lease_error`, the spec's code.
    Lease(LeaseCode),
    /// A bug or an exhausted internal resource.
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::MalformedRequest => 400,
            ErrorKind::HeadTimeout => 408,
            ErrorKind::HeadTooLarge => 431,
            ErrorKind::BodyTooLarge => 413,
            ErrorKind::InvalidJson => 400,
            ErrorKind::MissingModel => 400,
            ErrorKind::UnsupportedTransferEncoding => 501,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::RouteNotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::ModelNotFound => 404,
            ErrorKind::EndpointNotSupported => 400,
            ErrorKind::UntranslatableRequest => 400,
            ErrorKind::NoConnection => 503,
            ErrorKind::UnknownConnection => 400,
            ErrorKind::ConnectionNotUsable => 400,
            ErrorKind::UpstreamConnect => 502,
            ErrorKind::UpstreamTimeout(_) => 504,
            ErrorKind::RequestTimeout => 504,
            ErrorKind::UpstreamProtocol => 502,
            ErrorKind::StreamContentStall => 502,
            ErrorKind::StreamThroughputTooLow => 502,
            ErrorKind::ProviderCircuitOpen => 503,
            ErrorKind::ModelCooldown => 429,
            ErrorKind::AllTargetsCoolingDown => 503,
            ErrorKind::AllConnectionsTerminal => 401,
            ErrorKind::NoExecutableTargets => 404,
            ErrorKind::AllTargetsSkipped => 503,
            ErrorKind::AllTargetsSkippedRateLimited => 429,
            ErrorKind::AllAccountsInactive => 503,
            ErrorKind::AllAccountsInactiveRateLimited => 429,
            ErrorKind::ComboTimeout => 504,
            ErrorKind::MaxAttemptsExceeded => 503,
            ErrorKind::AllTargetsFailed => 502,
            ErrorKind::UpstreamUnreachable => 503,
            ErrorKind::MeshUnavailable => 503,
            ErrorKind::SemaphoreTimeout => 429,
            ErrorKind::SemaphoreQueueFull => 429,
            ErrorKind::RateLimitQueueFull => 429,
            ErrorKind::RateLimitQueueTimeout => 503,
            ErrorKind::RateLimitExecutionTimeout => 504,
            ErrorKind::RateLimitQueueWedged => 503,
            ErrorKind::ShuttingDown => 503,
            ErrorKind::Lease(c) => c.status(),
            ErrorKind::Internal => 500,
        }
    }

    /// Machine-readable code: the body's `error.code` and the `x-tidegate-error` header.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::MalformedRequest => "bad_request",
            ErrorKind::HeadTimeout => "request_timeout",
            ErrorKind::HeadTooLarge => "request_header_fields_too_large",
            ErrorKind::BodyTooLarge => "request_too_large",
            ErrorKind::InvalidJson => "invalid_json",
            ErrorKind::MissingModel => "missing_model",
            ErrorKind::UnsupportedTransferEncoding => "unsupported_transfer_encoding",
            ErrorKind::Unauthorized => "invalid_api_key",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::RouteNotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::ModelNotFound => "model_not_found",
            ErrorKind::EndpointNotSupported => "endpoint_not_supported",
            ErrorKind::UntranslatableRequest => "untranslatable_request",
            ErrorKind::NoConnection => "no_available_connection",
            ErrorKind::UnknownConnection => "unknown_connection",
            ErrorKind::ConnectionNotUsable => "connection_not_usable",
            ErrorKind::UpstreamConnect => "upstream_connect_failed",
            ErrorKind::UpstreamTimeout(_) => "upstream_timeout",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::UpstreamProtocol => "bad_upstream_response",
            ErrorKind::StreamContentStall => "stream_content_stall",
            ErrorKind::StreamThroughputTooLow => "stream_throughput_too_low",
            ErrorKind::ProviderCircuitOpen => "provider_circuit_open",
            ErrorKind::ModelCooldown => "model_cooldown",
            ErrorKind::AllTargetsCoolingDown => "all_targets_cooling_down",
            ErrorKind::AllConnectionsTerminal => "all_connections_unavailable",
            ErrorKind::NoExecutableTargets => "no_executable_targets",
            ErrorKind::AllTargetsSkipped | ErrorKind::AllTargetsSkippedRateLimited => {
                "ALL_TARGETS_SKIPPED"
            }
            ErrorKind::AllAccountsInactive | ErrorKind::AllAccountsInactiveRateLimited => {
                "ALL_ACCOUNTS_INACTIVE"
            }
            ErrorKind::ComboTimeout => "COMBO_TIMEOUT",
            ErrorKind::MaxAttemptsExceeded => "max_attempts_exceeded",
            ErrorKind::AllTargetsFailed => "all_targets_failed",
            ErrorKind::UpstreamUnreachable => "upstream_unreachable",
            ErrorKind::MeshUnavailable => "shard_mesh_unavailable",
            ErrorKind::SemaphoreTimeout => "semaphore_timeout",
            ErrorKind::SemaphoreQueueFull => "semaphore_queue_full",
            ErrorKind::RateLimitQueueFull => "rate_limit_queue_full",
            ErrorKind::RateLimitQueueTimeout => "rate_limit_queue_timeout",
            ErrorKind::RateLimitExecutionTimeout => "rate_limit_execution_timeout",
            ErrorKind::RateLimitQueueWedged => "rate_limit_queue_wedged",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Lease(c) => c.code(),
            ErrorKind::Internal => "internal_server_error",
        }
    }

    /// OpenAI-style `error.type`, following the status table of the spec (B §8.5).
    pub fn error_type(self) -> &'static str {
        if self == ErrorKind::ProviderCircuitOpen {
            // The spec's breaker body says server_error although the status is 503.
            return "server_error";
        }
        if self == ErrorKind::StreamContentStall || self == ErrorKind::StreamThroughputTooLow {
            return "stream_error";
        }
        if self == ErrorKind::ComboTimeout {
            // B §3.4: the combo timeout's body says server_error.
            return "server_error";
        }
        if let ErrorKind::Lease(_) = self {
            // B §5.2: every lease error's envelope.
            return "lease_error";
        }
        match self.status() {
            401 => "authentication_error",
            402 => "billing_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            503 => "service_unavailable",
            504 => "gateway_timeout",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Anthropic's `error.type` for this failure, by status like Anthropic's own table: an
    /// Anthropic SDK reads the status for its exception class and this name for the body.
    /// A 503 is a temporary refusal (breaker, cooldown, queue, shutdown): `overloaded_error`,
    /// except a model with no enabled connection, which waiting does not fix.
    pub fn anthropic_type(self) -> &'static str {
        if self == ErrorKind::NoConnection {
            return "api_error";
        }
        match self.status() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// May the proxy try the next target after this failure (before any byte reached the
    /// client)?
    pub fn retry(self) -> Retry {
        match self {
            ErrorKind::UpstreamConnect | ErrorKind::UpstreamTimeout(TimeoutPhase::Connect) => {
                Retry::Decided(true)
            }
            ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader) => Retry::Decided(true),
            ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle) => Retry::Decided(false),
            // Another target may finish in time; the overall deadline still bounds the walk.
            ErrorKind::UpstreamTimeout(TimeoutPhase::Active) => Retry::Decided(true),
            // The request's own budget is spent: nothing more is tried.
            ErrorKind::RequestTimeout => Retry::Decided(false),
            ErrorKind::UpstreamProtocol => Retry::IfReused,
            // Another target may answer sooner (spec B §7.1: the stall fails over).
            ErrorKind::StreamContentStall => Retry::Decided(true),
            ErrorKind::StreamThroughputTooLow => Retry::Decided(true),
            ErrorKind::MalformedRequest
            | ErrorKind::HeadTimeout
            | ErrorKind::HeadTooLarge
            | ErrorKind::BodyTooLarge
            | ErrorKind::InvalidJson
            | ErrorKind::MissingModel
            | ErrorKind::UnsupportedTransferEncoding
            | ErrorKind::Unauthorized
            | ErrorKind::Forbidden
            | ErrorKind::RouteNotFound
            | ErrorKind::MethodNotAllowed
            | ErrorKind::ModelNotFound
            | ErrorKind::EndpointNotSupported
            | ErrorKind::UnknownConnection
            | ErrorKind::ConnectionNotUsable
            | ErrorKind::UntranslatableRequest
            | ErrorKind::NoConnection
            | ErrorKind::ProviderCircuitOpen
            | ErrorKind::ModelCooldown
            | ErrorKind::AllTargetsCoolingDown
            | ErrorKind::AllConnectionsTerminal
            | ErrorKind::NoExecutableTargets
            | ErrorKind::AllTargetsSkipped
            | ErrorKind::AllTargetsSkippedRateLimited
            | ErrorKind::AllAccountsInactive
            | ErrorKind::AllAccountsInactiveRateLimited
            | ErrorKind::ComboTimeout
            | ErrorKind::MaxAttemptsExceeded
            | ErrorKind::AllTargetsFailed
            | ErrorKind::UpstreamUnreachable
            | ErrorKind::MeshUnavailable
            | ErrorKind::ShuttingDown
            | ErrorKind::Lease(_)
            | ErrorKind::Internal => Retry::Decided(false),
            // A busy connection: another candidate may have room.
            ErrorKind::SemaphoreTimeout | ErrorKind::SemaphoreQueueFull => Retry::Decided(true),
            // Local limits of this connection: another candidate may have room; an
            // execution that ran out of budget is not retried.
            ErrorKind::RateLimitQueueFull
            | ErrorKind::RateLimitQueueTimeout
            | ErrorKind::RateLimitQueueWedged => Retry::Decided(true),
            ErrorKind::RateLimitExecutionTimeout => Retry::Decided(false),
        }
    }

    /// Whether the client connection must be closed after the error response (the request
    /// stream can no longer be trusted to be in sync).
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            ErrorKind::MalformedRequest
                | ErrorKind::HeadTimeout
                | ErrorKind::HeadTooLarge
                | ErrorKind::BodyTooLarge
                | ErrorKind::UnsupportedTransferEncoding
        )
    }
}

/// The exclusive-lease refusals of spec B §5.2 and §5.4, with the spec's codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseCode {
    /// No client key was presented.
    AuthenticationRequired,
    /// The presented key is not a configured one.
    ApiKeyInvalid,
    /// The body is not declared `application/json`.
    ContentTypeRequired,
    /// The body is not one of the four actions.
    ActionInvalid,
    /// The key lacks the `lease:exclusive` scope.
    ScopeRequired,
    /// A lease key without an explicit `allowed_connections` list.
    KeyConfigurationInvalid,
    /// `X-OmniRoute-Lease-Owner` (or, on inference, the generation) is missing.
    ContextRequired,
    /// A lease header is malformed.
    ContextInvalid,
    /// The acquire's model names nothing the gateway serves.
    ModelInvalid,
    /// Wrong generation, another owner or key, or a lease no longer active.
    FenceStale,
    /// None of the key's connections serves the model.
    NoEligibleConnection,
    /// The owner's lease is active under another key or connection (nothing rebound).
    OwnerActive,
    /// Every eligible connection is leased by another owner.
    CapacityUnavailable,
    /// Every connection that could serve the acquire's model is cooling, locked or behind
    /// an open breaker (none is terminal-only: that is `NoEligibleConnection`).
    EligibilityUnavailable,
    /// The lease owner did not answer.
    ServiceUnavailable,
    /// A managed key's inference request whose owner holds no lease.
    Required,
    /// The lease's connection cannot serve the request's model.
    ConnectionMismatch,
    /// The lease was acquired with another client key.
    AuthorizationMismatch,
    /// A managed key asked for a combo, which could dispatch to several connections.
    UnsupportedRoute,
}

impl LeaseCode {
    /// Every code (`shard::metrics`' test that each has its counter).
    #[cfg(test)]
    pub const ALL: [LeaseCode; 19] = [
        LeaseCode::AuthenticationRequired,
        LeaseCode::ApiKeyInvalid,
        LeaseCode::ContentTypeRequired,
        LeaseCode::ActionInvalid,
        LeaseCode::ScopeRequired,
        LeaseCode::KeyConfigurationInvalid,
        LeaseCode::ContextRequired,
        LeaseCode::ContextInvalid,
        LeaseCode::ModelInvalid,
        LeaseCode::FenceStale,
        LeaseCode::NoEligibleConnection,
        LeaseCode::OwnerActive,
        LeaseCode::CapacityUnavailable,
        LeaseCode::EligibilityUnavailable,
        LeaseCode::ServiceUnavailable,
        LeaseCode::Required,
        LeaseCode::ConnectionMismatch,
        LeaseCode::AuthorizationMismatch,
        LeaseCode::UnsupportedRoute,
    ];

    pub fn status(self) -> u16 {
        match self {
            LeaseCode::AuthenticationRequired | LeaseCode::ApiKeyInvalid => 401,
            LeaseCode::ContentTypeRequired => 415,
            LeaseCode::ActionInvalid
            | LeaseCode::ContextRequired
            | LeaseCode::ContextInvalid
            | LeaseCode::ModelInvalid
            | LeaseCode::UnsupportedRoute => 400,
            LeaseCode::ScopeRequired | LeaseCode::KeyConfigurationInvalid => 403,
            LeaseCode::FenceStale
            | LeaseCode::NoEligibleConnection
            | LeaseCode::OwnerActive
            | LeaseCode::Required
            | LeaseCode::ConnectionMismatch
            | LeaseCode::AuthorizationMismatch => 409,
            LeaseCode::CapacityUnavailable | LeaseCode::EligibilityUnavailable => 429,
            LeaseCode::ServiceUnavailable => 503,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            LeaseCode::AuthenticationRequired => "LEASE_AUTHENTICATION_REQUIRED",
            LeaseCode::ApiKeyInvalid => "LEASE_API_KEY_INVALID",
            LeaseCode::ContentTypeRequired => "LEASE_CONTENT_TYPE_REQUIRED",
            LeaseCode::ActionInvalid => "LEASE_ACTION_INVALID",
            LeaseCode::ScopeRequired => "LEASE_SCOPE_REQUIRED",
            LeaseCode::KeyConfigurationInvalid => "LEASE_KEY_CONFIGURATION_INVALID",
            LeaseCode::ContextRequired => "LEASE_CONTEXT_REQUIRED",
            LeaseCode::ContextInvalid => "LEASE_CONTEXT_INVALID",
            LeaseCode::ModelInvalid => "LEASE_MODEL_INVALID",
            LeaseCode::FenceStale => "LEASE_FENCE_STALE",
            LeaseCode::NoEligibleConnection => "LEASE_NO_ELIGIBLE_CONNECTION",
            LeaseCode::OwnerActive => "LEASE_OWNER_ACTIVE",
            LeaseCode::CapacityUnavailable => "LEASE_CAPACITY_UNAVAILABLE",
            LeaseCode::EligibilityUnavailable => "LEASE_ELIGIBILITY_UNAVAILABLE",
            LeaseCode::ServiceUnavailable => "LEASE_SERVICE_UNAVAILABLE",
            LeaseCode::Required => "LEASE_REQUIRED",
            LeaseCode::ConnectionMismatch => "LEASE_CONNECTION_MISMATCH",
            LeaseCode::AuthorizationMismatch => "LEASE_AUTHORIZATION_MISMATCH",
            LeaseCode::UnsupportedRoute => "LEASE_UNSUPPORTED_ROUTE",
        }
    }
}

/// The error body shape a client expects: the API family of the endpoint it called.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error":{"message","type","code",…}}` (OpenAI, and every non-Anthropic route).
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message",…}}` (`/v1/messages`).
    Anthropic,
}

/// A gateway-made failure with a human message, and what the response adds for it:
/// a `Retry-After`, extra `error` fields and top-level fields (e.g. `diagnostics`).
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayError {
    pub kind: ErrorKind,
    pub message: Cow<'static, str>,
    /// Seconds for the `Retry-After` header (at least 1 when set).
    pub retry_after_s: Option<u64>,
    /// Extra members of the `error` object (e.g. `provider`, `retry_after`, `model`).
    pub extra: Vec<(&'static str, serde_json::Value)>,
    /// Extra top-level members of the body (e.g. `diagnostics`).
    pub top_level: Vec<(&'static str, serde_json::Value)>,
    /// Extra response headers (e.g. `Allow` on a 405).
    pub headers: Vec<(&'static str, Cow<'static, str>)>,
}

impl GatewayError {
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after_s: None,
            extra: Vec::new(),
            top_level: Vec::new(),
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    pub fn with_extra(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.extra.push((name, value));
        self
    }

    pub fn with_top_level(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.top_level.push((name, value));
        self
    }

    /// A header the response carries for this kind of error, beside `x-tidegate-error`.
    pub fn kind_header(&self) -> Option<(&'static str, &'static str)> {
        (self.kind == ErrorKind::ProviderCircuitOpen)
            .then_some(("x-omniroute-provider-breaker", "open"))
    }
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.kind.code(),
            self.kind.status(),
            self.message
        )
    }
}

impl std::error::Error for GatewayError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_the_status_table() {
        assert_eq!(ErrorKind::Unauthorized.error_type(), "authentication_error");
        assert_eq!(ErrorKind::NoConnection.error_type(), "service_unavailable");
        assert_eq!(
            ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle).error_type(),
            "gateway_timeout"
        );
        assert_eq!(ErrorKind::UpstreamConnect.error_type(), "server_error");
        assert_eq!(
            ErrorKind::BodyTooLarge.error_type(),
            "invalid_request_error"
        );
    }

    /// The gateway's own refusals that the flow and breaker tables once mapped themselves
    /// (B §1.6, §2.1, A §1.8): this is their one map.
    #[test]
    fn local_limits_and_the_open_breaker() {
        let facts = |k: ErrorKind| (k.status(), k.code(), k.error_type());
        assert_eq!(
            facts(ErrorKind::SemaphoreTimeout),
            (429, "semaphore_timeout", "rate_limit_error")
        );
        assert_eq!(
            facts(ErrorKind::SemaphoreQueueFull),
            (429, "semaphore_queue_full", "rate_limit_error")
        );
        assert_eq!(
            facts(ErrorKind::ProviderCircuitOpen),
            (503, "provider_circuit_open", "server_error")
        );
        let open = GatewayError::new(ErrorKind::ProviderCircuitOpen, "open");
        assert_eq!(
            open.kind_header(),
            Some(("x-omniroute-provider-breaker", "open"))
        );
    }

    #[test]
    fn anthropic_types_follow_anthropics_table() {
        assert_eq!(
            ErrorKind::MissingModel.anthropic_type(),
            "invalid_request_error"
        );
        assert_eq!(
            ErrorKind::MethodNotAllowed.anthropic_type(),
            "invalid_request_error"
        );
        assert_eq!(
            ErrorKind::Unauthorized.anthropic_type(),
            "authentication_error"
        );
        assert_eq!(ErrorKind::Forbidden.anthropic_type(), "permission_error");
        assert_eq!(ErrorKind::ModelNotFound.anthropic_type(), "not_found_error");
        assert_eq!(
            ErrorKind::BodyTooLarge.anthropic_type(),
            "request_too_large"
        );
        assert_eq!(
            ErrorKind::ModelCooldown.anthropic_type(),
            "rate_limit_error"
        );
        assert_eq!(
            ErrorKind::ProviderCircuitOpen.anthropic_type(),
            "overloaded_error"
        );
        assert_eq!(ErrorKind::NoConnection.anthropic_type(), "api_error");
        assert_eq!(ErrorKind::UpstreamConnect.anthropic_type(), "api_error");
        assert_eq!(
            ErrorKind::UpstreamTimeout(TimeoutPhase::Connect).anthropic_type(),
            "api_error"
        );
    }

    #[test]
    fn bad_input_closes_the_connection() {
        assert!(ErrorKind::MalformedRequest.closes_connection());
        assert!(!ErrorKind::ModelNotFound.closes_connection());
    }
}
