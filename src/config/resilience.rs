//! (being written)
#[derive(Clone, Debug, Default)]
pub struct ResilienceSettings {}
