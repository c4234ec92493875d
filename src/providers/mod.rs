//! Wire formats of the providers: which client endpoints each format serves, where they
//! go upstream, and how a connection's credentials are presented.

pub mod mock;
pub mod translate;

use crate::config::{AuthKind, Connection, Provider, ProviderFormat};

/// The client-facing inference endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Responses,
    Embeddings,
    Messages,
    /// Anthropic's `POST /v1/messages/count_tokens`: forwarded to Anthropic-format providers.
    CountTokens,
}

impl Endpoint {
    /// The path after the API root (`base_url` includes the version segment).
    pub fn upstream_suffix(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Responses => "/responses",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Messages => "/messages",
            Endpoint::CountTokens => "/messages/count_tokens",
        }
    }

    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            "/v1/messages" => Some(Endpoint::Messages),
            "/v1/messages/count_tokens" => Some(Endpoint::CountTokens),
            _ => None,
        }
    }

    /// Can this endpoint stream?
    pub fn streams(self) -> bool {
        !matches!(self, Endpoint::Embeddings | Endpoint::CountTokens)
    }
}

/// Does the provider serve the endpoint as is (no translation)?
pub fn serves(provider: &Provider, endpoint: Endpoint) -> bool {
    match provider.format {
        ProviderFormat::Openai => match endpoint {
            Endpoint::ChatCompletions | Endpoint::Embeddings => true,
            Endpoint::Responses => provider.responses_api,
            Endpoint::Messages | Endpoint::CountTokens => false,
        },
        ProviderFormat::Anthropic => matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens),
        ProviderFormat::Mock => true,
    }
}

/// The Anthropic API version sent when the client did not name one.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Beta flag Anthropic requires for OAuth (subscription) bearer tokens.
pub const ANTHROPIC_OAUTH_BETA: &str = "oauth-2025-04-20";

/// One credential field for the upstream request: its value is `prefix` then `value`
/// (`Bearer ` and the key), written straight into the request head, never joined first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthField<'a> {
    pub name: &'static str,
    pub prefix: &'static str,
    pub value: &'a str,
}

impl<'a> AuthField<'a> {
    fn new(name: &'static str, prefix: &'static str, value: &'a str) -> Option<Self> {
        Some(Self {
            name,
            prefix,
            value,
        })
    }
}

/// Headers that present the connection's credentials upstream (at most three, in this
/// order). `client_has_version` says whether the client already sent `anthropic-version`
/// (it is passed through).
pub fn auth_headers<'a>(
    provider: &Provider,
    conn: &'a Connection,
    client_has_version: bool,
) -> [Option<AuthField<'a>>; 3] {
    let key = conn.api_key.as_deref();
    match provider.format {
        ProviderFormat::Openai => [
            key.and_then(|k| AuthField::new("authorization", "Bearer ", k)),
            None,
            None,
        ],
        ProviderFormat::Anthropic => {
            let version = if client_has_version {
                None
            } else {
                AuthField::new("anthropic-version", "", ANTHROPIC_VERSION)
            };
            match (provider.auth, key) {
                (AuthKind::OAuth, Some(k)) => [
                    AuthField::new("authorization", "Bearer ", k),
                    AuthField::new("anthropic-beta", "", ANTHROPIC_OAUTH_BETA),
                    version,
                ],
                (AuthKind::ApiKey | AuthKind::Local, Some(k)) => {
                    [AuthField::new("x-api-key", "", k), version, None]
                }
                (_, None) => [version, None, None],
            }
        }
        ProviderFormat::Mock => [None, None, None],
    }
}
