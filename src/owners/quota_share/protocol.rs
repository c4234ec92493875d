//! The quota-share protocol: order a combo's candidates at the quota-share home.

use crate::config::ConnectionId;

/// One candidate of a quota-share dispatch (a combo target on one connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub connection: ConnectionId,
    /// `provider/model/connection`: the deficit round robin's key.
    pub execution_key: String,
    /// Target weight × connection weight.
    pub weight: u32,
}

/// The home's answer: the candidates' order (indices into the request's list) and the
/// chosen connection's in-flight ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub ordered: Vec<u32>,
    pub ticket: Option<u64>,
}

pub enum Request {
    /// Order these candidates of combo `combo` (its name) and count the chosen one in
    /// flight.
    Select {
        combo: String,
        candidates: Vec<Candidate>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Picked(Box<Pick>),
}

pub enum Fact {
    /// The dispatch holding in-flight ticket `serial` is over.
    Release { serial: u64 },
}
