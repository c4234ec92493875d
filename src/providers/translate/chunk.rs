//! Borrowing serde probes for OpenAI Chat Completions stream chunks (only the fields the
//! stream translators read), shared by the Messages and the Responses stream translators.

use std::borrow::Cow;

use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct OChunk<'a> {
    #[serde(default, borrow)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) choices: Option<Vec<OChoice<'a>>>,
    #[serde(default)]
    pub(super) usage: Option<OUsage>,
    #[serde(default)]
    pub(super) error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
pub(super) struct OChoice<'a> {
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(default, borrow)]
    pub(super) delta: Option<ODelta<'a>>,
    #[serde(default, borrow)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(super) struct ODelta<'a> {
    #[serde(default, borrow)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) tool_calls: Option<Vec<OToolDelta<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct OToolDelta<'a> {
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(default, borrow)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) function: Option<OFunction<'a>>,
}

#[derive(Deserialize)]
pub(super) struct OFunction<'a> {
    #[serde(default, borrow)]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
pub(super) struct OUsage {
    #[serde(default)]
    pub(super) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(super) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(super) prompt_tokens_details: Option<ODetails>,
}

#[derive(Deserialize, Default)]
pub(super) struct ODetails {
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
    #[serde(default)]
    pub(super) cache_creation_tokens: Option<u64>,
}
