//! Concurrency permits, uncontended: the pure gate table (acquire + release of an account and
//! a model gate), and the owner's full path — a `GateAcquire` message applied by the owner
//! tables, the grant, then `GateRelease`.
//!
//! - `owner_same_shard_acquire_release`: the asking shard is the owner, so both messages are
//!   applied in place (no mesh).
//! - `owner_remote_shard_acquire_release_{spin,parked}`: the owner's tables live on another
//!   thread (shard `owner_of(connection, 2)` of a two-shard mesh) whose pump receives from
//!   the mesh, applies each message and sends every `Dest::Shard` output back over the mesh —
//!   what `Shard::handle` + `Shard::dispatch` do. One iteration is: send `GateAcquire`, wait
//!   for the `GateGrant`, send `GateRelease`. The release is fire-and-forget, as in the
//!   gateway; the ring is FIFO, so the owner applies it before the next acquire. `spin`:
//!   both sides spin on `try_recv` (the latency floor); `parked`: both sides are monoio
//!   runtimes awaiting `recv()`, so the owner is woken from the other thread for the acquire
//!   (and possibly again for the release) and the asker for the grant. Compare with
//!   `benches/mesh.rs` `round_trip/mesh_spin` and `mesh_parked_monoio`: the difference is
//!   the owner's apply plus the extra release message.
//!
//! `admission_checks/*`: what every attempt pays before any message, deriving its admission
//! from config (`flow::admission`): whether the connection is gated, has a request queue
//! or a provider window — for a plain connection (the common case: all three no) and the
//! gate requirements of a gated one.
//!
//! Every variant uses the same config and a fixed `now` (the real pump reads the clock once
//! per message). The remote variants are timed with `iter_custom` on the crate's clock; on
//! a small shared VM read the medians, not the means.
#![allow(clippy::unreachable)]

#[path = "support/mod.rs"]
mod support;
use support::{run_monoio, send_until_taken};

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::clock::{Clock, MonoClock, Now};
use tidegate::config::{Config, ConnectionId, load_str};
use tidegate::flow::admission;
use tidegate::flow::gates::{Acquire, AcquireRequest, GateKey, GateReq, GateTable, QueueLimit};
use tidegate::mesh::placement::owner_of;
use tidegate::mesh::ring::{Mesh, MeshEnd};
use tidegate::owners::gates::Gates;
use tidegate::owners::gates::protocol as gp;
use tidegate::owners::health::views::Views;
use tidegate::owners::{Cx, Fact, Kind, Mechanism, Msg, Reply, Request};
use tidegate::shard::Dest;
use tidegate::shard::call::global_id as global_waiter_id;

/// Shards in the remote benches' mesh.
const SHARDS: usize = 2;

/// Tells a remote owner thread to stop. `Ack` is a reply the owner tables never act on, so
/// this id cannot be confused with gate traffic.
const STOP_ID: u64 = u64::MAX;

fn now() -> Now {
    Now {
        mono_ns: 1_000_000_000,
        wall_ms: 1_800_000_000_000,
    }
}

fn config() -> Config {
    let toml = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
                [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 4\n\
                [connections.rate_limit_overrides]\nmodel_concurrency = { \"m\" = 2 }\n";
    match load_str(toml, &|_| None) {
        Ok(o) => o.config,
        Err(e) => unreachable!("bench config: {e}"),
    }
}

fn acquire(id: u64) -> Msg {
    Msg::Call {
        id,
        request: Request::Gates(gp::Request::Acquire {
            connection: ConnectionId(0),
            model: "m".to_owned(),
            deadline_ns: None,
        }),
    }
}

fn release(serial: u64) -> Msg {
    Msg::Fact(Fact::Gates(gp::Fact::Release { serial }))
}

fn stop() -> Msg {
    Msg::Cancel {
        id: STOP_ID,
        kind: Kind::Gates,
    }
}

fn is_stop(msg: &Msg) -> bool {
    matches!(msg, Msg::Cancel { id: STOP_ID, .. })
}

fn grant_serial(msg: &Msg) -> u64 {
    match msg {
        Msg::Reply {
            reply: Reply::Gates(gp::Reply::Granted(serial)),
            ..
        } => *serial,
        _ => unreachable!("uncontended grant"),
    }
}

/// Applies one message to a gate table as its owner would; returns what it sends.
fn apply(gates: &mut Gates, config: &Config, views: &Views, msg: Msg) -> Vec<(Dest, Msg)> {
    let mut cx = Cx::detached(config, views, now(), SHARDS);
    match msg {
        Msg::Call {
            id,
            request: Request::Gates(r),
        } => gates.call(&mut cx, id, r),
        Msg::Fact(Fact::Gates(f)) => gates.fact(&mut cx, f),
        _ => {}
    }
    cx.take()
}

fn elapsed_since(start_ns: u64) -> Duration {
    Duration::from_nanos(MonoClock.now().mono_ns.saturating_sub(start_ns))
}

/// The owner of `ConnectionId(0)` and the asking shard, each with its mesh end.
fn ends() -> ((usize, MeshEnd<Msg>), (usize, MeshEnd<Msg>)) {
    let owner = owner_of(&ConnectionId(0), SHARDS);
    let asker = (owner + 1) % SHARDS;
    let mut ends: Vec<Option<MeshEnd<Msg>>> =
        Mesh::<Msg>::build(SHARDS).into_iter().map(Some).collect();
    match (
        ends.get_mut(owner).and_then(Option::take),
        ends.get_mut(asker).and_then(Option::take),
    ) {
        (Some(o), Some(a)) => ((owner, o), (asker, a)),
        _ => unreachable!("a two-shard mesh has two ends"),
    }
}

/// The owner's tables on their own thread: apply what arrives, send the replies back.
struct OwnerPump {
    config: Config,
    views: Views,
    gates: Gates,
}

impl OwnerPump {
    fn new(config: Config) -> Self {
        let gates = Gates::new(&config);
        Self {
            config,
            views: Views::default(),
            gates,
        }
    }

    fn handle(&mut self, end: &MeshEnd<Msg>, _from: usize, msg: Msg) {
        for (dest, out) in apply(&mut self.gates, &self.config, &self.views, msg) {
            // Uncontended acquires and releases produce no views and no timers.
            if let Dest::Shard(to) = dest {
                send_until_taken(end, to, out);
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let now = now();
    let mut g = c.benchmark_group("gates_uncontended");

    let mut table = GateTable::new();
    let mut id = 0u64;
    g.bench_function("gate_table_acquire_release", |b| {
        b.iter(|| {
            id += 1;
            let req = AcquireRequest {
                id,
                gates: vec![
                    GateReq::new(GateKey::Account(ConnectionId(0)), Some(4)),
                    GateReq::new(GateKey::Model(ConnectionId(0), "m".into()), Some(2)),
                ],
                deadline: None,
                max_queue: QueueLimit::Unbounded,
            };
            match table.acquire(black_box(req), now) {
                Acquire::Granted(p) => black_box(table.release(p, now)),
                Acquire::Queued | Acquire::Rejected(_) => unreachable!("uncontended"),
            };
        })
    });

    let config = config();
    let views = Views::default();
    let mut gates = Gates::new(&config);
    let mut wid = 0u64;
    g.bench_function("owner_same_shard_acquire_release", |b| {
        b.iter(|| {
            wid += 1;
            let out = apply(&mut gates, &config, &views, acquire(wid));
            let serial = match out.first() {
                Some((Dest::Shard(0), m)) => grant_serial(m),
                _ => unreachable!("uncontended grant"),
            };
            black_box(apply(&mut gates, &config, &views, release(serial)));
        })
    });

    // Remote owner, both sides spinning on try_recv.
    {
        let ((owner, owner_end), (asker, asker_end)) = ends();
        let mut pump = OwnerPump::new(config.clone());
        let owner_thread = std::thread::spawn(move || {
            loop {
                match owner_end.try_recv() {
                    Some((_, msg)) if is_stop(&msg) => break,
                    Some((from, msg)) => pump.handle(&owner_end, from, msg),
                    None => std::hint::spin_loop(),
                }
            }
        });
        let mut local = 0u64;
        g.bench_function("owner_remote_shard_acquire_release_spin", |b| {
            b.iter_custom(|iters| {
                let start = MonoClock.now().mono_ns;
                for _ in 0..iters {
                    local += 1;
                    send_until_taken(&asker_end, owner, acquire(global_waiter_id(asker, local)));
                    let serial = loop {
                        if let Some((_, msg)) = asker_end.try_recv() {
                            break grant_serial(&msg);
                        }
                        std::hint::spin_loop();
                    };
                    send_until_taken(&asker_end, owner, release(black_box(serial)));
                }
                elapsed_since(start)
            })
        });
        send_until_taken(&asker_end, owner, stop());
        let _ = owner_thread.join();
    }

    // Remote owner, both sides monoio runtimes parked in recv().await.
    {
        let ((owner, mut owner_end), (asker, mut asker_end)) = ends();
        let mut pump = OwnerPump::new(config.clone());
        let owner_thread = std::thread::spawn(move || {
            run_monoio(async move {
                loop {
                    let (from, msg) = owner_end.recv().await;
                    if is_stop(&msg) {
                        break;
                    }
                    pump.handle(&owner_end, from, msg);
                }
            })
        });
        let mut local = 0u64;
        g.bench_function("owner_remote_shard_acquire_release_parked", |b| {
            b.iter_custom(|iters| {
                run_monoio(async {
                    let start = MonoClock.now().mono_ns;
                    for _ in 0..iters {
                        local += 1;
                        let _ = asker_end.send(owner, acquire(global_waiter_id(asker, local)));
                        let (_, msg) = asker_end.recv().await;
                        let _ = asker_end.send(owner, release(black_box(grant_serial(&msg))));
                    }
                    elapsed_since(start)
                })
                .unwrap_or_default()
            })
        });
        let _ = asker_end.send(owner, stop());
        let _ = owner_thread.join();
    }
    g.finish();
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission_checks");
    let plain = match load_str(
        "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
         [[connections]]\nid = \"c\"\nprovider = \"p\"\n",
        &|_| None,
    ) {
        Ok(o) => o.config,
        Err(e) => unreachable!("bench config: {e}"),
    };
    let c0 = ConnectionId(0);
    // What a request checks: its connection's settings, resolved once per configuration
    // generation (`admission::Resolved`), and whether the gate, queue or window applies.
    let table = admission::Resolved::new(&plain);
    g.bench_function("plain_connection_gated_queue_window", |b| {
        b.iter(|| {
            let cfg = black_box(&plain);
            let a = black_box(&table).get(cfg, c0);
            black_box(a.gated(cfg, c0, "m") || a.queued())
        })
    });
    // What resolving them per request cost (before the table).
    g.bench_function("plain_connection_resolve", |b| {
        b.iter(|| black_box(admission::Admission::of(black_box(&plain), c0)))
    });
    let gated = config();
    g.bench_function("gated_connection_requirements", |b| {
        b.iter(|| black_box(admission::gate_requirements(black_box(&gated), c0, "m")))
    });
    g.finish();
}

criterion_group!(benches, bench, admission);
criterion_main!(benches);
