//! Quota-share (B §2.3, §2.4): before the first attempt of a quota-share combo, the
//! quota-share home orders the combo's candidates (bucket gate, cap gate against live
//! in-flight counts, deficit round robin by weight, power of two choices) and counts the
//! chosen connection in flight until the request ends (the ticket's guard). Fails open: a
//! home that cannot be asked leaves the combo's own order.

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::QuotaShare;
