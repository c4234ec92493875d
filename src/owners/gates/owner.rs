//! The gates owner: the composite gates of the connections whose gate home this shard is,
//! their permits, the timer for waiter deadlines and block ends, and temporary blocks.

use std::collections::HashMap;

use crate::config::{ComboId, Config, ConnectionId};
use crate::flow::admission::{
    account_capacity, combo_capacity, gate_capacity, gate_requirements, model_capacity,
};
use crate::flow::gates::GateReq;
use crate::flow::gates::{
    Acquire, AcquireRequest, GateError, GateKey, GateTable, Permit, QueueLimit, Wakeups,
};
use crate::flow::quota_share::{SlotAcquire, SlotRequest, acquire_slot};
use crate::shard::call::CallId;
use crate::shard::metrics::FlowGauges;

use super::protocol::{Fact, Reply, Request};
use crate::owners::{Cx, Mechanism, Shard};

/// The gate tables of one gate home.
#[derive(Debug, Default)]
pub struct Gates {
    pub gates: GateTable,
    /// Permits granted and not yet released, by serial.
    pub permits: HashMap<u64, Permit>,
    /// When the gate timer is armed for (monotonic ns).
    pub timer: Option<u64>,
}

impl Mechanism for Gates {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = true;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        self.tick(cx);
        match request {
            Request::Acquire {
                connection,
                model,
                deadline_ns,
            } => {
                let request = AcquireRequest {
                    id,
                    gates: gate_requirements(cx.config, connection, &model),
                    deadline: deadline_ns,
                    max_queue: QueueLimit::from_max_queue_depth(
                        cx.config.resilience.request_queue.max_queue_depth,
                    ),
                };
                match self.gates.acquire(request, cx.now) {
                    Acquire::Granted(permit) => self.grant(cx, id, permit),
                    Acquire::Queued => self.arm(cx),
                    Acquire::Rejected(error) => cx.reply(id, Reply::Denied(error)),
                }
            }
            Request::QsSlot {
                combo,
                connection,
                deadline_ns,
            } => {
                let queue_depth = cx
                    .config
                    .combo_by_id(combo)
                    .map_or(20, |c| c.settings.queue_depth as usize);
                let request = SlotRequest {
                    id,
                    connection: Some(connection),
                    max_concurrent: account_capacity(cx.config, connection),
                    deadline: deadline_ns,
                    queue_depth,
                };
                let enabled = cx.config.resilience.quota_share_concurrency_limit.enabled;
                match acquire_slot(&mut self.gates, enabled, request, cx.now) {
                    SlotAcquire::Slot(permit) => self.grant(cx, id, permit),
                    SlotAcquire::Queued => self.arm(cx),
                    SlotAcquire::NoSlot => cx.reply(id, Reply::Denied(GateError::QueueFull)),
                }
            }
            Request::ComboSlot {
                combo,
                connection,
                model,
                deadline_ns,
                capacity,
                queue_depth,
            } => {
                // A combo this home's configuration does not have yet (a reload added it
                // and this shard has not adopted it): the asker's reading of it.
                let (key, capacity, depth) = combo_gate(cx.config, combo, connection, &model)
                    .unwrap_or_else(|| {
                        let key = GateKey::Combo(combo.0, connection, model.into_boxed_str());
                        (key, capacity.max(1), queue_depth as usize)
                    });
                let request = AcquireRequest {
                    id,
                    gates: vec![GateReq::new(key, Some(capacity))],
                    deadline: deadline_ns,
                    max_queue: QueueLimit::AtMost(depth),
                };
                match self.gates.acquire(request, cx.now) {
                    Acquire::Granted(permit) => self.grant(cx, id, permit),
                    Acquire::Queued => self.arm(cx),
                    Acquire::Rejected(error) => cx.reply(id, Reply::Denied(error)),
                }
            }
        }
    }

    fn fact(&mut self, cx: &mut Cx<'_>, fact: Fact) {
        match fact {
            Fact::Release { serial } => {
                if let Some(permit) = self.permits.remove(&serial) {
                    let wakeups = self.gates.release(permit, cx.now);
                    self.wake(cx, wakeups);
                }
            }
            Fact::Block {
                connection,
                model,
                until_ns,
            } => self.block(cx, connection, model, until_ns),
            Fact::Tick => {
                self.timer = None;
                self.tick(cx);
                self.arm(cx);
            }
            Fact::Reconfigure => self.reconfigure(cx),
        }
    }

    fn settings_changed(&mut self, cx: &mut Cx<'_>) {
        self.reconfigure(cx);
    }

    fn cancel(&mut self, cx: &mut Cx<'_>, id: CallId) {
        // Answered either way, so the asker can forget the waiter (a grant already on its
        // way arrives first and is handed back by the asker's late hook).
        self.gates.cancel(id);
        cx.reply(id, Reply::Denied(GateError::Timeout));
    }

    fn late(shard: &Shard, from: usize, _id: CallId, reply: Reply) {
        if let Reply::Granted(serial) = reply {
            // The asker gave up before the grant arrived: the permit goes back to the
            // shard that granted it (the gate home).
            shard.send_fact(from, Fact::Release { serial }.into());
        }
    }

    fn gauges(&self, g: &mut FlowGauges) {
        g.gate_permits += self.gates.outstanding();
        g.gate_waiters += self.gates.queued();
    }
}

impl Gates {
    fn grant(&mut self, cx: &mut Cx<'_>, id: CallId, permit: Permit) {
        let serial = permit.serial();
        self.permits.insert(serial, permit);
        cx.reply(id, Reply::Granted(serial));
    }

    fn block(&mut self, cx: &mut Cx<'_>, connection: ConnectionId, model: String, until_ns: u64) {
        let key = if account_capacity(cx.config, connection).is_some() {
            Some(GateKey::Account(connection))
        } else {
            model_capacity(cx.config, connection, &model)
                .map(|_| GateKey::Model(connection, model.into_boxed_str()))
        };
        if let Some(key) = key {
            self.gates.mark_blocked(key, until_ns, cx.now);
            self.arm(cx);
        }
    }

    /// Applies the capacities of the settings in force to every live gate: a rise grants
    /// the waiters it lets in at once, oldest first (a drop only stops new grants; permits
    /// held are kept).
    /// New settings or a reloaded file: every live gate takes its new capacity at once. The
    /// gate of a provider, connection or combo the file no longer has keeps the capacity it
    /// had: its holders and waiters are requests of the old file, which finish on it under
    /// the limit they were admitted with; the gate goes once it is idle.
    fn reconfigure(&mut self, cx: &mut Cx<'_>) {
        let config = cx.config;
        let wakeups = self.gates.reconfigure(
            |key, now| {
                if removed(config, key) {
                    Some(now)
                } else {
                    gate_capacity(config, key)
                }
            },
            cx.now,
        );
        self.wake(cx, wakeups);
        self.arm(cx);
    }

    /// Sends grants and timeouts produced by a release or an expiry.
    fn wake(&mut self, cx: &mut Cx<'_>, wakeups: Wakeups) {
        for (id, permit) in wakeups.granted {
            self.grant(cx, id, permit);
        }
        for (id, error) in wakeups.timed_out {
            cx.reply(id, Reply::Denied(error));
        }
    }

    /// Times out overdue waiters and lifts blocks that are over (granting who fits).
    fn tick(&mut self, cx: &mut Cx<'_>) {
        let wakeups = self.gates.tick(cx.now);
        self.wake(cx, wakeups);
    }

    /// Arms the gate timer for the table's next deadline (a waiter's or a block's end)
    /// unless an earlier one is armed already.
    fn arm(&mut self, cx: &mut Cx<'_>) {
        if let Some(at) = self.gates.next_deadline()
            && self.timer.is_none_or(|armed| at < armed)
        {
            self.timer = Some(at);
            cx.at(at, Fact::Tick);
        }
    }
}

/// Whether `key` names a provider, connection or combo `config` does not have (a reload
/// removed it).
fn removed(config: &Config, key: &GateKey) -> bool {
    let ids = &config.ids;
    match key {
        GateKey::Global => false,
        GateKey::Provider(p) => ids.provider_slot(*p).is_none(),
        GateKey::Account(c) | GateKey::Model(c, _) | GateKey::QuotaShare(c) => {
            ids.connection_slot(*c).is_none()
        }
        GateKey::Combo(combo, c, _) => {
            ids.combo_slot(ComboId(*combo)).is_none() || ids.connection_slot(*c).is_none()
        }
    }
}

/// A round-robin combo's semaphore for `model` on `connection` (B §2.2): its key, capacity
/// (the connection's `max_concurrent` when set, else the combo's `concurrency_per_model`)
/// and queue depth. `None`: no such combo in `config` (a reload added or removed it, and
/// this shard has not adopted the reload yet or any more).
fn combo_gate(
    config: &Config,
    combo: ComboId,
    connection: ConnectionId,
    model: &str,
) -> Option<(GateKey, u32, usize)> {
    let settings = &config.combo_by_id(combo)?.settings;
    let capacity = combo_capacity(config, combo, connection)?;
    let key = GateKey::Combo(combo.0, connection, Box::from(model));
    Some((key, capacity, settings.queue_depth as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Now;
    use crate::owners::health::views::Views;
    use crate::owners::{Fact as AnyFact, Msg, Reply as AnyReply};
    use crate::shard::Dest;
    use crate::shard::call::global_id;

    /// What the owner sent, readable in a failure message (`Msg` is not `Debug`).
    fn show(out: &[(Dest, Msg)]) -> String {
        let items: Vec<String> = out
            .iter()
            .map(|(dest, msg)| {
                let msg = match msg {
                    Msg::Reply {
                        id,
                        reply: AnyReply::Gates(r),
                    } => format!("Reply {{ id: {id:#x}, Gates({r:?}) }}"),
                    Msg::Reply { id, .. } => format!("Reply {{ id: {id:#x}, <other mechanism> }}"),
                    Msg::Fact(AnyFact::Gates(Fact::Tick)) => "Fact(Gates(Tick))".to_owned(),
                    Msg::Fact(AnyFact::Gates(Fact::Release { serial })) => {
                        format!("Fact(Gates(Release {{ serial: {serial} }}))")
                    }
                    Msg::Fact(AnyFact::Gates(Fact::Block { until_ns, .. })) => {
                        format!("Fact(Gates(Block {{ until_ns: {until_ns} }}))")
                    }
                    Msg::Fact(_) => "Fact(<other mechanism>)".to_owned(),
                    Msg::Call { id, .. } => format!("Call {{ id: {id:#x} }}"),
                    Msg::Cancel { id, kind } => format!("Cancel {{ id: {id:#x}, {kind:?} }}"),
                    Msg::View(_) => "View".to_owned(),
                };
                format!("({dest:?}, {msg})")
            })
            .collect();
        format!("[{}]", items.join(", "))
    }

    /// A call to the gate home (2 shards), and what it sent.
    fn call(
        gates: &mut Gates,
        config: &Config,
        now: Now,
        id: CallId,
        request: Request,
    ) -> Vec<(Dest, Msg)> {
        let views = Views::default();
        let mut cx = Cx::detached(config, &views, now, 2);
        gates.call(&mut cx, id, request);
        cx.take()
    }

    /// A fact for the gate home (2 shards), and what it sent.
    fn fact(gates: &mut Gates, config: &Config, now: Now, fact: Fact) -> Vec<(Dest, Msg)> {
        let views = Views::default();
        let mut cx = Cx::detached(config, &views, now, 2);
        gates.fact(&mut cx, fact);
        cx.take()
    }

    /// The `qsconn` slot on the gate home (B §2.3): cap = the account capacity, a second
    /// request waits until the first releases, and a disabled limit gives no slot at once.
    #[test]
    fn quota_share_slot_serialises_and_fails_open_when_disabled() {
        let toml = |enabled: bool| {
            format!(
                "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                 [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 1\n\
                 [resilience.quota_share_concurrency_limit]\nenabled = {enabled}\n"
            )
        };
        let now = Now {
            mono_ns: 1_000_000_000,
            wall_ms: 1_800_000_000_000,
        };
        let slot = || Request::QsSlot {
            // No such combo: the default queue depth (20).
            combo: ComboId(0),
            connection: ConnectionId(0),
            deadline_ns: Some(now.mono_ns + 30_000_000_000),
        };
        let config = crate::config::load_str(&toml(true), &|_| None)
            .unwrap()
            .config;
        let mut gates = Gates::new(&config);
        let out = call(&mut gates, &config, now, global_id(1, 1), slot());
        let serial = match out.as_slice() {
            [
                (
                    Dest::Shard(1),
                    Msg::Reply {
                        reply: AnyReply::Gates(Reply::Granted(serial)),
                        ..
                    },
                ),
            ] => *serial,
            _ => panic!("first slot: {}", show(&out)),
        };
        // Queued: no answer, only the gate timer armed for its deadline.
        let out = call(&mut gates, &config, now, global_id(1, 2), slot());
        assert!(
            matches!(
                out.as_slice(),
                [(Dest::SelfAt(_), Msg::Fact(AnyFact::Gates(Fact::Tick)))]
            ),
            "second slot: {}",
            show(&out)
        );
        let out = fact(&mut gates, &config, now, Fact::Release { serial });
        match out.as_slice() {
            [
                (
                    Dest::Shard(1),
                    Msg::Reply {
                        id,
                        reply: AnyReply::Gates(Reply::Granted(_)),
                    },
                ),
            ] => {
                assert_eq!(*id, global_id(1, 2));
            }
            _ => panic!("the waiter was not granted on release: {}", show(&out)),
        }
        let config = crate::config::load_str(&toml(false), &|_| None)
            .unwrap()
            .config;
        let mut gates = Gates::new(&config);
        let out = call(&mut gates, &config, now, global_id(1, 1), slot());
        assert!(
            matches!(
                out.as_slice(),
                [(
                    Dest::Shard(1),
                    Msg::Reply {
                        reply: AnyReply::Gates(Reply::Denied(_)),
                        ..
                    }
                )]
            ),
            "disabled limit: {}",
            show(&out)
        );
    }

    /// A reload: a kept connection's gate takes its new `max_concurrent` at once (a raise
    /// admits its waiter), and a removed connection's gate keeps its old capacity for the
    /// requests of the old file still holding or waiting for it, until it drains.
    #[test]
    fn a_reload_retunes_kept_gates_at_once_and_drains_removed_ones_under_their_old_limit() {
        let file = |conns: &str| {
            format!(
                "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n{conns}"
            )
        };
        let old = crate::config::load_str(
            &file(
                "[[connections]]\nid = \"gone\"\nprovider = \"p\"\nmax_concurrent = 1\n\
                 [[connections]]\nid = \"kept\"\nprovider = \"p\"\nmax_concurrent = 1\n",
            ),
            &|_| None,
        )
        .unwrap()
        .config;
        let mut new = crate::config::load_str(
            &file("[[connections]]\nid = \"kept\"\nprovider = \"p\"\nmax_concurrent = 2\n"),
            &|_| None,
        )
        .unwrap()
        .config;
        crate::config::renumber::carry_ids(&mut new, &old).unwrap();
        let (gone, kept) = (ConnectionId(0), ConnectionId(1));
        assert_eq!(new.connections[0].id, kept);
        let now = Now {
            mono_ns: 1_000_000_000,
            wall_ms: 1_800_000_000_000,
        };
        let acquire = |connection| Request::Acquire {
            connection,
            model: "m".to_owned(),
            deadline_ns: Some(now.mono_ns + 60_000_000_000),
        };
        let granted = |out: &[(Dest, Msg)]| -> Vec<(CallId, u64)> {
            out.iter()
                .filter_map(|(_, m)| match m {
                    Msg::Reply {
                        id,
                        reply: AnyReply::Gates(Reply::Granted(serial)),
                    } => Some((*id, *serial)),
                    _ => None,
                })
                .collect()
        };
        let mut gates = Gates::new(&old);
        let mut held = Vec::new();
        for (n, c) in [(1, gone), (3, kept)] {
            let out = call(&mut gates, &old, now, global_id(1, n), acquire(c));
            held.extend(granted(&out));
            // A second request on each waits behind the first.
            let out = call(&mut gates, &old, now, global_id(1, n + 1), acquire(c));
            assert!(granted(&out).is_empty(), "{}", show(&out));
        }
        assert_eq!(held.len(), 2);
        let views = Views::default();
        let mut cx = Cx::detached(&new, &views, now, 2);
        gates.settings_changed(&mut cx);
        let out = cx.take();
        assert_eq!(
            granted(&out).iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![global_id(1, 4)],
            "the kept connection's raise admits its waiter; the removed one's waits: {}",
            show(&out)
        );
        // The removed connection's holder ends: its waiter gets the slot, then it drains.
        let out = fact(&mut gates, &new, now, Fact::Release { serial: held[0].1 });
        let next = granted(&out);
        assert_eq!(
            next.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![global_id(1, 2)]
        );
        let _ = fact(&mut gates, &new, now, Fact::Release { serial: next[0].1 });
        assert!(
            gates.gates.stats(&GateKey::Account(gone)).is_none(),
            "drained and gone"
        );
    }

    /// The gate home's timer on a manual clock: a queued waiter arms a tick at its deadline
    /// and is answered there; a block (an upstream 429's retry hint) arms a tick at its end,
    /// and the waiter queued behind it is granted then.
    #[test]
    fn gate_timer_answers_deadlines_and_lifts_blocks() {
        let toml = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 1\n";
        let config = crate::config::load_str(toml, &|_| None).unwrap().config;
        let mut gates = Gates::new(&config);
        let at = |ms: u64| Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_800_000_000_000 + ms,
        };
        let id = |n: u64| global_id(1, n);
        let acquire = |deadline_ms: u64| Request::Acquire {
            connection: ConnectionId(0),
            model: "m".to_owned(),
            deadline_ns: Some(deadline_ms * 1_000_000),
        };
        let out = call(&mut gates, &config, at(0), id(1), acquire(1_000));
        let serial = match out.as_slice() {
            [
                (
                    Dest::Shard(1),
                    Msg::Reply {
                        reply: AnyReply::Gates(Reply::Granted(serial)),
                        ..
                    },
                ),
            ] => *serial,
            _ => panic!("first acquire: {}", show(&out)),
        };
        // Queued with a 100 ms deadline: the timer is armed for it and answers it.
        let out = call(&mut gates, &config, at(0), id(2), acquire(100));
        assert!(
            matches!(
                out.as_slice(),
                [(Dest::SelfAt(t), Msg::Fact(AnyFact::Gates(Fact::Tick)))] if *t == 100 * 1_000_000
            ),
            "queued acquire: {}",
            show(&out)
        );
        let out = fact(&mut gates, &config, at(100), Fact::Tick);
        assert!(
            matches!(
                out.as_slice(),
                [(
                    Dest::Shard(1),
                    Msg::Reply {
                        reply: AnyReply::Gates(Reply::Denied(GateError::Timeout)),
                        ..
                    }
                )]
            ),
            "tick at the deadline: {}",
            show(&out)
        );
        // A block until 500 ms arms the timer; a waiter queued behind it is not granted by
        // the release, only by the tick that lifts the block.
        let block = Fact::Block {
            connection: ConnectionId(0),
            model: "m".to_owned(),
            until_ns: 500 * 1_000_000,
        };
        let out = fact(&mut gates, &config, at(200), block);
        assert!(
            matches!(
                out.as_slice(),
                [(Dest::SelfAt(t), Msg::Fact(AnyFact::Gates(Fact::Tick)))] if *t == 500 * 1_000_000
            ),
            "block: {}",
            show(&out)
        );
        let out = call(&mut gates, &config, at(300), id(3), acquire(10_000));
        assert!(
            out.is_empty(),
            "earlier timer already armed: {}",
            show(&out)
        );
        let out = fact(&mut gates, &config, at(400), Fact::Release { serial });
        assert!(out.is_empty(), "blocked: nobody granted: {}", show(&out));
        let out = fact(&mut gates, &config, at(500), Fact::Tick);
        assert!(
            out.iter().any(|(d, m)| *d == Dest::Shard(1)
                && matches!(
                    m,
                    Msg::Reply {
                        id: g,
                        reply: AnyReply::Gates(Reply::Granted(_)),
                    } if *g == id(3)
                )),
            "{}",
            show(&out)
        );
    }
}
