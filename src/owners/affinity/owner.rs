//! The session-affinity owner: the pins of the sessions this shard owns, and what the
//! snapshot keeps of them (pins changed since the last collection; start-up adoption of
//! the pins this shard owns under the current shard count).

use std::collections::BTreeSet;

use crate::clock::Now;
use crate::config::{Config, ProviderId};
use crate::routing::affinity::{Choice, Pin, PinTable};
use crate::routing::session::SessionDigest;
use crate::shard::call::CallId;
use crate::snapshot::state::{PinKey, PinRecord, Records};

use super::protocol::{Fact, Reply, Request, Session};
use crate::owners::{Cx, Mechanism, Shard};

/// The pins of the sessions this shard owns.
#[derive(Debug, Default)]
pub struct Affinity {
    pub pins: PinTable,
    /// Pins made, touched or dropped since the snapshot last collected them.
    dirty: BTreeSet<PinKey>,
}

impl Affinity {
    fn touched(&mut self, provider: ProviderId, session: SessionDigest) {
        self.dirty.insert((provider, session));
    }

    /// Up to `max` changed pins, as the snapshot keeps them (instants in wall-clock ms).
    fn take_delta(&mut self, now: Now, max: usize) -> Vec<(PinKey, Option<PinRecord>)> {
        let now_ms = now.mono_ms();
        let wall = |mono_ms: u64| {
            if mono_ms >= now_ms {
                now.wall_ms.saturating_add(mono_ms - now_ms)
            } else {
                now.wall_ms.saturating_sub(now_ms - mono_ms)
            }
        };
        let mut out = Vec::new();
        while out.len() < max {
            let Some(key) = self.dirty.pop_first() else {
                break;
            };
            let record = self
                .pins
                .pin(key.0, key.1)
                .filter(|p| p.expires_ms > now_ms)
                .map(|p| PinRecord {
                    connection: p.connection,
                    created_wall_ms: wall(p.created_ms),
                    last_used_wall_ms: wall(p.last_used_ms),
                    expires_wall_ms: wall(p.expires_ms),
                });
            out.push((key, record));
        }
        out
    }

    /// Adopts the live pins of `records` for which `keep(session)` holds; the last uses of
    /// every pin count for the least-recently-used pick either way.
    fn restore(&mut self, now: Now, records: &Records, keep: &dyn Fn(SessionDigest) -> bool) {
        let now_ms = now.mono_ms();
        let mono = |wall_ms: u64| {
            if wall_ms >= now.wall_ms {
                now_ms.saturating_add(wall_ms - now.wall_ms)
            } else {
                now_ms.saturating_sub(now.wall_ms - wall_ms)
            }
        };
        for (&(provider, session), r) in &records.pins {
            if r.expires_wall_ms <= now.wall_ms {
                continue;
            }
            if keep(session) {
                let pin = Pin {
                    connection: r.connection,
                    created_ms: mono(r.created_wall_ms),
                    last_used_ms: mono(r.last_used_wall_ms),
                    expires_ms: mono(r.expires_wall_ms),
                };
                self.pins.adopt(provider, session, pin);
                // Re-reported, so the writer's copy follows this owner from now on.
                self.touched(provider, session);
            } else {
                self.pins.note_use(r.connection, mono(r.last_used_wall_ms));
            }
        }
    }
}

/// Collects up to `max` changed pins of this shard for the snapshot writer.
pub fn snapshot_delta(shard: &Shard, max: usize) -> Vec<(PinKey, Option<PinRecord>)> {
    let now = shard.now();
    shard
        .state()
        .owners
        .affinity
        .borrow_mut()
        .take_delta(now, max)
}

/// Start-up: this shard adopts the pins of the sessions it owns under the current shard
/// count.
pub fn restore(shard: &Shard, records: &Records) {
    if records.pins.is_empty() {
        return;
    }
    let me = shard.id();
    let keep = |session: SessionDigest| shard.owner(&Session(session)) == me;
    shard
        .state()
        .owners
        .affinity
        .borrow_mut()
        .restore(shard.now(), records, &keep);
}

impl Affinity {
    /// Drops the pins of providers and connections the configuration no longer has (a
    /// reload removed them).
    fn forget_removed(&mut self, config: &Config) {
        self.pins.retain(
            |p| config.provider_by_id(p).is_some(),
            |c| config.connection_by_id(c).is_some(),
        );
    }
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
        let now_ms = cx.now.mono_ms();
        let (provider, session, eligible, ttl_ms) = match request {
            Request::Choose {
                provider,
                session,
                eligible,
                ttl_ms,
            } => (provider, session, eligible, ttl_ms),
            Request::Count => {
                let (pins, sessions) = self.pins.live_counts(now_ms);
                let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
                cx.reply(
                    id,
                    Reply::Count {
                        pins: n(pins),
                        sessions: n(sessions),
                    },
                );
                return;
            }
        };
        self.touched(provider, session);
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
                if self.pins.drop_pin(provider, session, connection) {
                    self.touched(provider, session);
                }
            }
            Fact::Used { connection, at_ms } => self.pins.note_use(connection, at_ms),
        }
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        self.pins.sweep(cx.now.mono_ms());
        self.forget_removed(cx.config);
    }

    fn settings_changed(&mut self, cx: &mut Cx<'_>) {
        self.forget_removed(cx.config);
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
