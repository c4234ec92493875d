//! Turning a requested model into an ordered list of targets, and targets into
//! candidate connections; session keys, the session pins of session affinity, and the
//! exclusive session leases.

pub mod affinity;
pub mod lease;
pub mod model_name;
pub mod resolve;
pub mod session;
pub mod strategy;
