//! Building the upstream request: target path under the provider's API root, the
//! client's headers minus hop-by-hop, client-auth, session and lease headers, the
//! provider's extra headers, and the connection's credentials.

use bytes::BytesMut;

use crate::config::{BaseUrl, Connection, Provider, Scheme};
use crate::http1::{Framing, RequestHead, is_hop_by_hop, write_request_head};
use crate::providers::{Endpoint, auth_headers};

/// Client fields never forwarded upstream besides the hop-by-hop ones
/// (`http1::is_hop_by_hop`): the host and framing the gateway recomputes, `expect`, the
/// client's own credentials, the gateway's session, connection-forcing and lease headers, and
/// `accept-encoding` (so streams arrive as plain text the gateway can inspect).
pub const STRIPPED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "expect",
    "accept-encoding",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "x-session-id",
    "x-codex-session-id",
    "x-omniroute-session",
    "x-omniroute-connection",
    "x-omniroute-lease-owner",
    "x-omniroute-lease-generation",
];

fn listed_in_connection(head: &RequestHead, name: &str) -> bool {
    head.header("connection").is_some_and(|v| {
        v.split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
    })
}

/// Is this client header forwarded?
pub fn forwarded(head: &RequestHead, name: &str) -> bool {
    !is_hop_by_hop(name)
        && !STRIPPED_HEADERS
            .iter()
            .any(|s| s.eq_ignore_ascii_case(name))
        && !listed_in_connection(head, name)
}

/// The `Host` header value for a base URL (port only when not the scheme's default).
pub fn host_header(base: &BaseUrl) -> String {
    let default = matches!(
        (base.scheme, base.port),
        (Scheme::Http, 80) | (Scheme::Https, 443)
    );
    // IPv6 literals keep their brackets in `BaseUrl.host`.
    if default {
        base.host.clone()
    } else {
        format!("{}:{}", base.host, base.port)
    }
}

/// Encodes the upstream request head for a body of `body_len` bytes.
pub fn encode_head(
    dst: &mut BytesMut,
    client: &RequestHead,
    provider: &Provider,
    base: &BaseUrl,
    conn: &Connection,
    endpoint: Endpoint,
    body_len: usize,
) {
    let mut target = String::with_capacity(base.path.len() + 32);
    target.push_str(&base.path);
    target.push_str(endpoint.upstream_suffix());
    if let Some(q) = client.query() {
        target.push('?');
        target.push_str(q);
    }
    let mut injected: Vec<(&'static str, String)> = Vec::with_capacity(4);
    auth_headers(
        provider,
        conn,
        client.header("anthropic-version").is_some(),
        &mut injected,
    );
    let overridden = |name: &str| {
        provider
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
            || injected.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    let client_headers = client
        .headers()
        .filter(|(n, _)| forwarded(client, n) && !overridden(n));
    let extra = provider
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let auth = injected.iter().map(|(n, v)| (*n, v.as_bytes()));
    write_request_head(
        dst,
        client.method_str(),
        &target,
        &host_header(base),
        client_headers.chain(extra).chain(auth),
        Framing::Length(body_len as u64),
    );
}
