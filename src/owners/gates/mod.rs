//! Gates: the composite concurrency gate (global → provider → account → model) and the
//! quota-share `qsconn` slots of the connections whose gate home this shard is
//! (`flow::admission`). Permits are taken all-or-nothing, FIFO, bounded by the queue budget
//! (`client::acquire`), and given back exactly once when the attempt ends (the guard).

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::Gates;
