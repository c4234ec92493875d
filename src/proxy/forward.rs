//! Building the upstream request: target path under the provider's API root, the
//! client's headers minus hop-by-hop, client-auth, session and lease headers (and, when
//! the request is translated, minus its query and the client API's own `anthropic-*` or
//! `openai-*` fields), the provider's extra headers, and the connection's credentials.

use bytes::BytesMut;

use crate::config::{BaseUrl, Connection, Provider, ProviderFormat, Scheme};
use crate::http1::{
    Framing, RequestHead, is_hop_by_hop_name, is_listed, name_lengths, write_request_head_parts,
};
use crate::providers::{Endpoint, auth_headers};

/// Client fields never forwarded upstream besides the hop-by-hop ones
/// (`http1::is_hop_by_hop_name`): the host and framing the gateway recomputes, `expect`, the
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

/// The client's `Connection` field (the names it lists are hop-by-hop for this request)
/// and the lengths of its tokens as a bit set (bit `min(len, 63)`), taken once per
/// request: a field whose name has none of those lengths is named by no token, which one
/// bit test says (the SDKs send `Connection: keep-alive`, and splitting it for each of
/// their 16 fields cost ~60 instructions a field: −1 006 per SDK head, perf/RESULTS.md).
#[derive(Clone, Copy)]
struct ConnectionTokens<'a> {
    value: Option<&'a [u8]>,
    lengths: u64,
}

impl<'a> ConnectionTokens<'a> {
    fn bit(len: usize) -> u64 {
        1 << len.min(63)
    }

    fn new(value: Option<&'a [u8]>) -> Self {
        let lengths = value.map_or(0, |v| {
            v.split(|b| *b == b',')
                .fold(0, |set, t| set | Self::bit(t.trim_ascii().len()))
        });
        ConnectionTokens { value, lengths }
    }

    /// Does a token name this field?
    fn names(&self, name: &[u8]) -> bool {
        self.lengths & Self::bit(name.len()) != 0
            && self.value.is_some_and(|v| {
                v.split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
            })
    }
}

/// Is this client header forwarded?
fn forwarded(connection: ConnectionTokens<'_>, name: &[u8]) -> bool {
    const STRIPPED_LENGTHS: u64 = name_lengths(STRIPPED_HEADERS);
    !is_hop_by_hop_name(name)
        && !is_listed(name, STRIPPED_HEADERS, STRIPPED_LENGTHS)
        && !connection.names(name)
}

/// The port of the `Host` header for a base URL: only when not the scheme's default.
fn host_port(base: &BaseUrl) -> Option<u16> {
    match (base.scheme, base.port) {
        (Scheme::Http, 80) | (Scheme::Https, 443) => None,
        (_, port) => Some(port),
    }
}

/// Room for the upstream head of `client` (its own head plus what the gateway adds), so
/// the head and a small body can share one buffer without growing it.
pub fn head_capacity(client: &RequestHead, provider: &Provider, base: &BaseUrl) -> usize {
    let extra: usize = provider
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum();
    client.head_len() + base.host.len() + base.path.len() + extra + 256
}

/// Encodes the upstream request head for a body of `body_len` bytes into `dst`, directly:
/// no intermediate strings.
pub fn encode_head(
    dst: &mut BytesMut,
    client: &RequestHead,
    provider: &Provider,
    base: &BaseUrl,
    conn: &Connection,
    endpoint: Endpoint,
    body_len: usize,
) {
    // A translated request goes to another endpoint than the client's: the client's
    // query (Claude Code's `?beta=true`) and its API's version and beta fields
    // (`anthropic-*` for an OpenAI-format provider, `openai-*` for an Anthropic one)
    // belong to the client's endpoint and are not carried over.
    let translated = Endpoint::from_path(client.path()) != Some(endpoint);
    let foreign: &[u8] = match provider.format {
        ProviderFormat::Anthropic => b"openai-",
        ProviderFormat::Openai | ProviderFormat::Mock => b"anthropic-",
    };
    let query = client.query().filter(|_| !translated);
    let target = [
        base.path.as_str(),
        endpoint.upstream_suffix(),
        if query.is_some() { "?" } else { "" },
        query.unwrap_or_default(),
    ];
    let auth = auth_headers(provider, conn, client.header("anthropic-version").is_some());
    let auth = auth.iter().flatten();
    let connection = ConnectionTokens::new(client.header("connection"));
    let overridden = |name: &[u8]| {
        provider
            .headers
            .iter()
            .any(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            || auth
                .clone()
                .any(|f| f.name.as_bytes().eq_ignore_ascii_case(name))
    };
    let client_headers = client
        .header_fields()
        .filter(|(n, _)| forwarded(connection, n) && !overridden(n))
        .filter(|(n, _)| {
            !translated
                || !n
                    .get(..foreign.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(foreign))
        })
        .map(|(n, v)| (n, &b""[..], v));
    let extra = provider
        .headers
        .iter()
        .map(|(n, v)| (n.as_bytes(), &b""[..], v.as_bytes()));
    let auth = auth
        .clone()
        .map(|f| (f.name.as_bytes(), f.prefix.as_bytes(), f.value.as_bytes()));
    write_request_head_parts(
        dst,
        client.method_str(),
        &target,
        &base.host,
        host_port(base),
        client_headers.chain(extra).chain(auth),
        Framing::Length(body_len as u64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length set only skips what the token walk would refuse: every name against
    /// `Connection` values with tokens of every kind (spaces, empty elements, case, long).
    #[test]
    fn connection_tokens_name_what_the_walk_names() {
        let long = "x-".repeat(40);
        let values: Vec<Option<String>> = vec![
            None,
            Some(String::new()),
            Some("keep-alive".into()),
            Some("Keep-Alive, X-Foo".into()),
            Some(" close ,, x-foo\t, ,TE".into()),
            Some(format!("{long}, upgrade")),
            Some(format!("{long}a")),
            Some(",".into()),
        ];
        let names = [
            "x-foo",
            "X-FOO",
            "x-fo",
            "keep-alive",
            "user-agent",
            "te",
            "close",
            "upgrade",
            "accept",
            "",
            &long,
            &format!("{long}A"),
            &format!("{long}b"),
        ];
        for v in &values {
            let tokens = ConnectionTokens::new(v.as_deref().map(str::as_bytes));
            for name in names {
                let walk = v.as_deref().is_some_and(|v| {
                    v.as_bytes()
                        .split(|b| *b == b',')
                        .any(|t| t.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
                });
                assert_eq!(tokens.names(name.as_bytes()), walk, "{v:?} {name}");
            }
        }
    }
}
