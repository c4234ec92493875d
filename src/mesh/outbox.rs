//! Point-to-point messages that must arrive — grants, releases, cancels, replies — wait here
//! when the ring to their destination is full, and are retried in order until delivered.
//! A lost grant or release would leak a permit or a queue slot for good (the owner thinks
//! it is held, nobody will return it), so these are never dropped for a full ring; only a
//! closed peer (shutdown) or a caller bug ends them. View broadcasts do not come here: a
//! dropped view only delays convergence (anti-entropy re-sends it).
//!
//! Order: per destination, messages leave in the order they were sent. A message for a
//! destination that already has messages waiting queues behind them even if its ring has
//! room again; other destinations are not held up.

use std::collections::VecDeque;

use super::ring::{DropReason, Rejected};

/// Messages waiting for room, oldest first.
#[derive(Debug)]
pub struct Outbox<T> {
    waiting: VecDeque<(usize, T)>,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
        }
    }
}

/// What happened to a message handed to [`Outbox::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Delivered,
    /// Kept for a retry (its ring was full, or older messages wait for the same shard).
    Waiting,
    /// Dropped: the destination is closed or does not exist.
    Dropped(DropReason),
}

impl<T> Outbox<T> {
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Sends `msg` to `to` through `try_send`, or keeps it.
    pub fn send(
        &mut self,
        to: usize,
        msg: T,
        try_send: &mut impl FnMut(usize, T) -> Result<(), Rejected<T>>,
    ) -> Sent {
        if self.waiting.iter().any(|(t, _)| *t == to) {
            self.waiting.push_back((to, msg));
            return Sent::Waiting;
        }
        match try_send(to, msg) {
            Ok(()) => Sent::Delivered,
            Err(Rejected {
                reason: DropReason::RingFull,
                msg,
            }) => {
                self.waiting.push_back((to, msg));
                Sent::Waiting
            }
            Err(r) => Sent::Dropped(r.reason),
        }
    }

    /// Retries every waiting message in order; a destination whose ring is still full keeps
    /// the rest of its messages waiting. Returns how many were dropped (closed peers).
    pub fn flush(
        &mut self,
        try_send: &mut impl FnMut(usize, T) -> Result<(), Rejected<T>>,
    ) -> usize {
        let mut full: Vec<usize> = Vec::new();
        let mut keep = VecDeque::with_capacity(self.waiting.len());
        let mut dropped = 0;
        for (to, msg) in self.waiting.drain(..) {
            if full.contains(&to) {
                keep.push_back((to, msg));
                continue;
            }
            match try_send(to, msg) {
                Ok(()) => {}
                Err(Rejected {
                    reason: DropReason::RingFull,
                    msg,
                }) => {
                    full.push(to);
                    keep.push_back((to, msg));
                }
                Err(_) => dropped += 1,
            }
        }
        self.waiting = keep;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rings of `room[to]` free slots; shard 9 is closed.
    struct Rings {
        room: Vec<usize>,
        got: Vec<(usize, u32)>,
    }

    impl Rings {
        fn try_send(&mut self, to: usize, msg: u32) -> Result<(), Rejected<u32>> {
            if to == 9 {
                return Err(Rejected {
                    reason: DropReason::PeerClosed,
                    msg,
                });
            }
            match self.room.get_mut(to) {
                Some(0) => Err(Rejected {
                    reason: DropReason::RingFull,
                    msg,
                }),
                Some(n) => {
                    *n -= 1;
                    self.got.push((to, msg));
                    Ok(())
                }
                None => Err(Rejected {
                    reason: DropReason::NoSuchShard,
                    msg,
                }),
            }
        }
    }

    #[test]
    fn full_rings_keep_messages_in_order_and_free_destinations_flow() {
        let mut rings = Rings {
            room: vec![1, 5],
            got: Vec::new(),
        };
        let mut ob = Outbox::default();
        let mut send = |to, m| rings.try_send(to, m);
        assert_eq!(ob.send(0, 1, &mut send), Sent::Delivered);
        assert_eq!(ob.send(0, 2, &mut send), Sent::Waiting, "ring 0 is full");
        assert_eq!(
            ob.send(1, 3, &mut send),
            Sent::Delivered,
            "ring 1 is not held up"
        );
        assert_eq!(ob.send(0, 4, &mut send), Sent::Waiting);
        assert_eq!(
            ob.send(9, 5, &mut send),
            Sent::Dropped(DropReason::PeerClosed)
        );
        assert_eq!(ob.len(), 2);
        // Still full: nothing moves.
        assert_eq!(ob.flush(&mut send), 0);
        assert_eq!(ob.len(), 2);
        // One slot frees: the older one goes first, the newer waits.
        rings.room[0] = 1;
        let mut send = |to, m| rings.try_send(to, m);
        assert_eq!(ob.flush(&mut send), 0);
        assert_eq!(ob.len(), 1);
        // Room again, but a new message queues behind the waiting one.
        rings.room[0] = 5;
        let mut send = |to, m| rings.try_send(to, m);
        assert_eq!(ob.send(0, 6, &mut send), Sent::Waiting);
        assert_eq!(ob.flush(&mut send), 0);
        assert!(ob.is_empty());
        assert_eq!(rings.got, vec![(0, 1), (1, 3), (0, 2), (0, 4), (0, 6)]);
    }

    #[test]
    fn closed_peers_are_dropped_on_flush() {
        let mut ob = Outbox::default();
        let mut full = |to, msg| {
            Err(Rejected {
                reason: if to == 0 {
                    DropReason::RingFull
                } else {
                    DropReason::PeerClosed
                },
                msg,
            })
        };
        assert_eq!(ob.send(0, 1u32, &mut full), Sent::Waiting);
        let mut closed = |_, msg| {
            Err(Rejected {
                reason: DropReason::PeerClosed,
                msg,
            })
        };
        assert_eq!(ob.flush(&mut closed), 1);
        assert!(ob.is_empty());
    }
}
