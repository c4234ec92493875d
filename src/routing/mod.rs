//! Turning a requested model into an ordered list of targets, and targets into
//! candidate connections.

pub mod resolve;
