//! The one place that writes gateway-made responses: error bodies with their status,
//! OpenAI-shaped JSON and the `x-tidegate-error` header, and small JSON answers.

use bytes::BytesMut;
use serde_json::json;

use crate::error::GatewayError;
use crate::http1::{Framing, write_response_head};

/// Header that tells clients the gateway, not the upstream, made this error.
pub const ERROR_HEADER: &str = "x-tidegate-error";

/// The JSON body of a gateway error: `{"error":{"message","type","code"}}`.
pub fn error_body(err: &GatewayError) -> String {
    let mut error = serde_json::Map::new();
    error.insert("message".into(), json!(err.message));
    error.insert("type".into(), json!(err.kind.error_type()));
    error.insert("code".into(), json!(err.kind.code()));
    for (k, v) in &err.extra {
        error.insert((*k).into(), v.clone());
    }
    let mut body = serde_json::Map::new();
    body.insert("error".into(), serde_json::Value::Object(error));
    for (k, v) in &err.top_level {
        body.insert((*k).into(), v.clone());
    }
    serde_json::Value::Object(body).to_string()
}

/// Encodes a complete error response into `dst`.
pub fn write_error(dst: &mut BytesMut, err: &GatewayError, keep_alive: bool, head_only: bool) {
    let body = error_body(err);
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

/// Encodes a complete response with a body of the given content type.
pub fn write_body(
    dst: &mut BytesMut,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) {
    let headers: [(&str, &[u8]); 1] = [("content-type", content_type.as_bytes())];
    write_response_head(
        dst,
        status,
        headers,
        Framing::Length(body.len() as u64),
        keep_alive,
    );
    dst.extend_from_slice(body);
}

/// The in-band event that ends a stream broken after its first byte (no `[DONE]` follows).
pub fn stream_error_event(err: &GatewayError) -> String {
    format!("event: error\ndata: {}\n\n", error_body(err))
}
