//! The one place that writes gateway-made responses: error bodies with their status, in
//! the caller's dialect (OpenAI's shape, or Anthropic's on `/v1/messages`) and the
//! `x-tidegate-error` header carrying the gateway's own code, and small JSON answers.

use crate::net::io::ClientStream;
use bytes::BytesMut;
use serde_json::json;

use super::access::AccessLog;
use crate::error::{Dialect, ErrorKind, GatewayError};
use crate::http1::{Framing, Persist, write_response_head};
use crate::net::downstream::After;
use crate::net::io::write_all;
use crate::owners::Shard;
use crate::providers::Endpoint;

/// Header that tells clients the gateway, not the upstream, made this error.
pub const ERROR_HEADER: &str = "x-tidegate-error";

/// The JSON body of a gateway error: OpenAI's `{"error":{"message","type","code"}}`, or
/// Anthropic's `{"type":"error","error":{"type","message"}}` (the code is in the header).
pub fn error_body(err: &GatewayError, dialect: Dialect) -> String {
    let mut error = serde_json::Map::new();
    let mut body = serde_json::Map::new();
    match dialect {
        Dialect::OpenAi => {
            error.insert("message".into(), json!(err.message));
            error.insert("type".into(), json!(err.kind.error_type()));
            error.insert("code".into(), json!(err.kind.code()));
        }
        Dialect::Anthropic => {
            body.insert("type".into(), json!("error"));
            error.insert("type".into(), json!(err.kind.anthropic_type()));
            error.insert("message".into(), json!(err.message));
        }
    }
    for (k, v) in &err.extra {
        error.insert((*k).into(), v.clone());
    }
    body.insert("error".into(), serde_json::Value::Object(error));
    for (k, v) in &err.top_level {
        body.insert((*k).into(), v.clone());
    }
    serde_json::Value::Object(body).to_string()
}

/// Encodes a complete error response into `dst`.
pub fn write_error(
    dst: &mut BytesMut,
    err: &GatewayError,
    dialect: Dialect,
    keep_alive: Persist,
    head_only: bool,
    extra: &[(&str, &[u8])],
) {
    let body = error_body(err, dialect);
    let code = err.kind.code();
    let retry_after = err.retry_after_s.map(|s| s.to_string());
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("content-type", b"application/json"),
        (ERROR_HEADER, code.as_bytes()),
    ];
    if let Some(ra) = &retry_after {
        headers.push(("retry-after", ra.as_bytes()));
    }
    if let Some((name, value)) = err.kind_header() {
        headers.push((name, value.as_bytes()));
    }
    for (name, value) in &err.headers {
        headers.push((name, value.as_bytes()));
    }
    headers.extend_from_slice(extra);
    write_response_head(
        dst,
        err.kind.status(),
        headers,
        Framing::Length(body.len() as u64),
        keep_alive,
    );
    if !head_only {
        dst.extend_from_slice(body.as_bytes());
    }
}

/// Encodes a complete response with a body of the given content type; for a `HEAD` request
/// (`head_only`) the head alone, with the `Content-Length` the `GET` would have had
/// (RFC 9110 §8.6: a HEAD's `Content-Length` must be that of the GET's content, or absent).
pub fn write_body(
    dst: &mut BytesMut,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: Persist,
    head_only: bool,
    extra: &[(&str, &[u8])],
) {
    let mut headers: Vec<(&str, &[u8])> = vec![("content-type", content_type.as_bytes())];
    headers.extend_from_slice(extra);
    write_response_head(
        dst,
        status,
        headers,
        Framing::Length(body.len() as u64),
        keep_alive,
    );
    if !head_only {
        dst.extend_from_slice(body);
    }
}

/// The in-band event that ends a stream broken after its first byte (no `[DONE]` follows),
/// in the endpoint's own shape: Anthropic Messages `event: error` with
/// `{"type":"error","error":{"type","message"}}`; Responses `event: error` with
/// `{"type":"error","code","message","param"}`; chat completions a `data:` line with the
/// gateway's `{"error":{…}}` body.
pub fn stream_error_event(err: &GatewayError, endpoint: Endpoint) -> String {
    match endpoint {
        // count_tokens is an Anthropic endpoint: its errors take the Messages shape.
        Endpoint::Messages | Endpoint::CountTokens => {
            let body = json!({
                "type": "error",
                "error": {
                    "type": err.kind.anthropic_type(),
                    "message": err.message,
                    "code": err.kind.code(),
                },
            });
            format!("event: error\ndata: {body}\n\n")
        }
        // The Responses API's own error event (`ResponseErrorEvent`): flat code and message.
        Endpoint::Responses => {
            let body = json!({
                "type": "error",
                "code": err.kind.code(),
                "message": err.message,
                "param": null,
            });
            format!("event: error\ndata: {body}\n\n")
        }
        Endpoint::ChatCompletions | Endpoint::Embeddings => {
            format!("data: {}\n\n", error_body(err, Dialect::OpenAi))
        }
    }
}

/// Writes a gateway error as the whole response.
pub async fn send_error(
    shard: &Shard,
    client: &mut ClientStream,
    err: &GatewayError,
    dialect: Dialect,
    keep_alive: Persist,
    log: Option<&AccessLog>,
) -> After {
    note_error(shard, err);
    if let Some(log) = log {
        log.failed(shard, err);
    }
    let keep_alive = keep_alive_now(shard, keep_alive).and(!err.kind.closes_connection());
    let mut out = BytesMut::with_capacity(256);
    let extra = log.map(AccessLog::response_headers).unwrap_or_default();
    write_error(&mut out, err, dialect, keep_alive, false, &extra);
    if let Some(log) = log {
        log.sent(out.len());
    }
    match write_all(client, out).await {
        Ok(_) if keep_alive.is_kept() => After::KeepAlive,
        _ => After::Close,
    }
}

/// The keep-alive decision at the moment a response head is written: never while the
/// shard drains for shutdown.
pub fn keep_alive_now(shard: &Shard, requested: Persist) -> Persist {
    requested.and(!shard.is_draining())
}

pub(super) fn note_error(shard: &Shard, err: &GatewayError) {
    shard.metrics().response(err.kind.status());
    shard.metrics().gateway_error(err.kind);
    if err.kind.status() >= 500 && !is_state_refusal(err.kind) {
        tracing::warn!(code = err.kind.code(), "{}", err.message);
    } else {
        tracing::debug!(code = err.kind.code(), "{}", err.message);
    }
}

/// A refusal the routing state decided (a breaker open, every connection cooling — after
/// network errors too, `upstream_unreachable` —, locked, terminal or disabled, the drain): not logged per request — the state's transitions are
/// logged once by their owners (`docs/operator-guide.md`), and each refused request has its
/// access-log line with the code. Logging every one at WARN would flood exactly when an
/// upstream is down.
fn is_state_refusal(kind: ErrorKind) -> bool {
    match kind {
        ErrorKind::ProviderCircuitOpen
        | ErrorKind::ModelCooldown
        | ErrorKind::AllTargetsCoolingDown
        | ErrorKind::AllConnectionsTerminal
        | ErrorKind::NoExecutableTargets
        | ErrorKind::AllTargetsSkipped
        | ErrorKind::AllTargetsSkippedRateLimited
        | ErrorKind::NoConnection
        | ErrorKind::UpstreamUnreachable
        | ErrorKind::ShuttingDown => true,
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
        | ErrorKind::UntranslatableRequest
        | ErrorKind::UnknownConnection
        | ErrorKind::ConnectionNotUsable
        | ErrorKind::UpstreamConnect
        | ErrorKind::UpstreamTimeout(_)
        | ErrorKind::RequestTimeout
        | ErrorKind::UpstreamProtocol
        | ErrorKind::StreamContentStall
        | ErrorKind::StreamThroughputTooLow
        | ErrorKind::AllAccountsInactive
        | ErrorKind::AllAccountsInactiveRateLimited
        | ErrorKind::ComboTimeout
        | ErrorKind::MaxAttemptsExceeded
        | ErrorKind::AllTargetsFailed
        | ErrorKind::MeshUnavailable
        | ErrorKind::SemaphoreTimeout
        | ErrorKind::SemaphoreQueueFull
        | ErrorKind::RateLimitQueueFull
        | ErrorKind::RateLimitQueueTimeout
        | ErrorKind::RateLimitExecutionTimeout
        | ErrorKind::RateLimitQueueWedged
        | ErrorKind::Lease(_)
        | ErrorKind::Internal => false,
    }
}
