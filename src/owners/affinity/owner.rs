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
