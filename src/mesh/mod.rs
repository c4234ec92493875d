//! Transport between shards, and nothing else: the N×N mesh of bounded lock-free SPSC
//! rings (`ring`), the outbox that holds point-to-point messages while a ring is full
//! (`outbox`), and placement — which shard owns a key (`placement`). Generic over the
//! message type; it knows no domain type (the owner protocols live in `owners`). `safe`
//! states what a message may carry: ids, numbers and bounded text, never bodies.

pub mod outbox;
pub mod placement;
pub mod ring;
pub mod safe;
