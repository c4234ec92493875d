//! The session-affinity owner: the pins of the sessions this shard owns.

use crate::config::Config;
use crate::routing::affinity::{Choice, PinTable};
use crate::shard::call::CallId;

use super::protocol::{Fact, Reply, Request};
use crate::owners::{Cx, Mechanism};

/// The pins of the sessions this shard owns.
#[derive(Debug, Default)]
pub struct Affinity {
    pub pins: PinTable,
}

impl Mechanism for Affinity {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let Request::Choose {
            provider,
            session,
            eligible,
            ttl_ms,
        } = request;
        let now_ms = cx.now.mono_ms();
        let choice = self
            .pins
            .choose(provider, session, &eligible, ttl_ms, now_ms);
        if let Choice::Made(connection) = choice {
            // Other sessions' owners learn of the use (this shard's own copy is a no-op).
            for shard in 0..cx.shards {
                let used = Fact::Used {
                    connection,
                    at_ms: now_ms,
                };
                cx.tell(shard, used);
            }
        }
        cx.reply(id, Reply::Use(choice.connection()));
    }

    fn fact(&mut self, _cx: &mut Cx<'_>, fact: Fact) {
        match fact {
            Fact::Drop {
                provider,
                session,
                connection,
            } => {
                self.pins.drop_pin(provider, session, connection);
            }
            Fact::Used { connection, at_ms } => self.pins.note_use(connection, at_ms),
        }
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        self.pins.sweep(cx.now.mono_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Now;
    use crate::config::{ConnectionId, ProviderId, load_str};
    use crate::owners::health::views::Views;
    use crate::owners::{Fact as AnyFact, Reply as AnyReply};
    use crate::routing::affinity::Eligible;
    use crate::shard::call::global_id;
    use crate::shard::{Dest, Msg};

    fn eligible() -> Vec<Eligible> {
        [0, 1]
            .map(|c| Eligible {
                connection: ConnectionId(c),
                priority: 1,
            })
            .to_vec()
    }

    #[test]
    fn a_new_pin_is_announced_to_every_shard_and_a_kept_one_is_not() {
        let config = match load_str("", &|_| None) {
            Ok(o) => o.config,
            Err(e) => panic!("{e}"),
        };
        let views = Views::default();
        let now = Now {
            mono_ns: 5_000_000,
            wall_ms: 0,
        };
        let mut owner = Affinity::default();
        let choose = || Request::Choose {
            provider: ProviderId(0),
            session: [7; 32],
            eligible: eligible(),
            ttl_ms: 60_000,
        };
        let mut cx = Cx::detached(&config, &views, now, 3);
        owner.call(&mut cx, global_id(2, 1), choose());
        let out = cx.take();
        let told: Vec<usize> = out
            .iter()
            .filter_map(|(dest, msg)| match (dest, msg) {
                (
                    Dest::Shard(s),
                    Msg::Fact(AnyFact::Affinity(Fact::Used { connection, at_ms })),
                ) if *connection == ConnectionId(0) && *at_ms == 5 => Some(*s),
                _ => None,
            })
            .collect();
        assert_eq!(told, vec![0, 1, 2]);
        let replied = out.iter().any(|(dest, msg)| {
            matches!(
                (dest, msg),
                (Dest::Shard(2), Msg::Reply { reply: AnyReply::Affinity(Reply::Use(Some(c))), .. })
                    if *c == ConnectionId(0)
            )
        });
        assert!(replied);
        // The same session again: the pin is kept, nothing is announced.
        let mut cx = Cx::detached(&config, &views, now, 3);
        owner.call(&mut cx, global_id(2, 2), choose());
        let out = cx.take();
        assert_eq!(out.len(), 1, "only the reply");
        // A drop for another connection leaves the pin; for its own removes it.
        let mut cx = Cx::detached(&config, &views, now, 3);
        let drop_for = |c| Fact::Drop {
            provider: ProviderId(0),
            session: [7; 32],
            connection: ConnectionId(c),
        };
        owner.fact(&mut cx, drop_for(1));
        assert!(!owner.pins.is_empty());
        owner.fact(&mut cx, drop_for(0));
        assert!(owner.pins.is_empty());
    }
}
