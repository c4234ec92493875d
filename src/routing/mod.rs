//! Turning a requested model into an ordered list of targets, and targets into
//! candidate connections; session keys and the session pins of session affinity.

pub mod affinity;
pub mod model_name;
pub mod resolve;
pub mod session;
pub mod strategy;
