//! OpenAI Chat Completions ⇄ Anthropic Messages, as sans-IO converters: bodies in, bodies
//! out, no socket or clock of their own. They run only when the client's endpoint and the
//! chosen provider's format differ; same-format traffic reaches only [`unsigned`], and is
//! parsed there only when it holds an empty thinking signature.
//!
//! - [`request`]: a client request body into the provider's format (a field that cannot be
//!   expressed there is refused, naming it — never dropped silently).
//! - [`response`]: a complete (non-stream) answer back into the client's format.
//! - [`stream`]: a stateful event-by-event stream translator fed arbitrary byte pieces.
//! - [`error`]: an upstream error body re-shaped into the client's error format.
//! - [`responses`]: the Responses API served by a Chat-Completions-only or an Anthropic
//!   provider (through the Chat Completions form and the converters above).
//! - [`unsigned`]: the unsigned thinking blocks the converters above give an Anthropic
//!   client, taken out when the client replays them to an Anthropic provider.
//!
//! `docs/translation.md` is the field map.

mod chunk;
pub mod error;
mod json;
pub mod request;
pub mod response;
pub mod responses;
pub mod stream;
pub mod unsigned;

use crate::config::{Provider, ProviderFormat};
use crate::providers::Endpoint;

/// Which way a request crosses formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Translation {
    /// An OpenAI Chat Completions client served by an Anthropic Messages provider.
    ChatToMessages,
    /// An Anthropic Messages client served by an OpenAI Chat Completions provider.
    MessagesToChat,
    /// An OpenAI Responses client served by an OpenAI-format provider that speaks only
    /// Chat Completions (`responses_api = false`).
    ResponsesToChat,
    /// An OpenAI Responses client served by an Anthropic Messages provider.
    ResponsesToMessages,
}

impl Translation {
    /// The translation a request on `endpoint` needs to reach `provider`, if any (and if
    /// one exists: `None` also when the provider serves the endpoint as is).
    pub fn between(endpoint: Endpoint, provider: &Provider) -> Option<Translation> {
        match (endpoint, provider.format) {
            (Endpoint::ChatCompletions, ProviderFormat::Anthropic) => {
                Some(Translation::ChatToMessages)
            }
            (Endpoint::Messages, ProviderFormat::Openai) => Some(Translation::MessagesToChat),
            (Endpoint::Responses, ProviderFormat::Openai) if !provider.responses_api => {
                Some(Translation::ResponsesToChat)
            }
            (Endpoint::Responses, ProviderFormat::Anthropic) => {
                Some(Translation::ResponsesToMessages)
            }
            _ => None,
        }
    }

    /// The provider's endpoint the translated request goes to.
    pub fn upstream_endpoint(self) -> Endpoint {
        match self {
            Translation::ChatToMessages | Translation::ResponsesToMessages => Endpoint::Messages,
            Translation::MessagesToChat | Translation::ResponsesToChat => Endpoint::ChatCompletions,
        }
    }

    /// The client's endpoint.
    pub fn client_endpoint(self) -> Endpoint {
        match self {
            Translation::ChatToMessages => Endpoint::ChatCompletions,
            Translation::MessagesToChat => Endpoint::Messages,
            Translation::ResponsesToChat | Translation::ResponsesToMessages => Endpoint::Responses,
        }
    }

    /// The value of the `x-tidegate-translated` response header.
    pub fn label(self) -> &'static str {
        match self {
            Translation::ChatToMessages => "openai-chat->anthropic-messages",
            Translation::MessagesToChat => "anthropic-messages->openai-chat",
            Translation::ResponsesToChat => "openai-responses->openai-chat",
            Translation::ResponsesToMessages => "openai-responses->anthropic-messages",
        }
    }
}

/// A request the target format cannot express: the JSON path of the field and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub field: String,
    pub why: String,
}

impl Refused {
    pub fn new(field: impl Into<String>, why: impl Into<String>) -> Refused {
        Refused {
            field: field.into(),
            why: why.into(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

#[cfg(test)]
mod tests;
