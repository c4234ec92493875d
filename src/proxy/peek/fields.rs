//! The routing fields read out of one request body: what both readers, [`super::scan`] and
//! the simd-json tape path, answer (a module of its own so the scanner does not import the
//! module that calls it).

use std::ops::Range;

use crate::routing::model_name::ModelName;

/// The routing fields of one request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The decoded top-level `model` string.
    pub model: ModelName,
    /// The top-level `stream` flag; `false` when absent or `null`.
    pub stream: bool,
    /// Whether the top-level `tools` is present and non-empty.
    pub has_tools: bool,
    /// byte range of the model VALUE including its quotes
    pub model_span: Range<usize>,
    /// How many tools the top-level `tools` lists (array items or object members).
    pub tool_count: usize,
    /// Byte range of the top-level `background` value when it is `true` (a Responses
    /// request the gateway serves synchronously, spec guide "background degradation").
    pub background_span: Option<Range<usize>>,
}
