//! Concurrency permits, uncontended: the pure gate table (acquire + release of an account and
//! a model gate), and the owner's full path as the same shard runs it — a `GateAcquire`
//! message applied by the owner tables, the grant, then `GateRelease`. A remote shard adds
//! one mesh round trip each way (`benches/mesh.rs`: ~90 ns spinning, ~40 µs when the owner's
//! thread is parked).
#![allow(clippy::unreachable)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::clock::Now;
use tidegate::config::{ConnectionId, load_str};
use tidegate::flow::gates::{Acquire, AcquireRequest, GateKey, GateReq, GateTable, QueueLimit};
use tidegate::runtime::msg::Msg;
use tidegate::shard::owned::{Dest, Owned};
use tidegate::shard::views::Views;

fn bench(c: &mut Criterion) {
    let now = Now {
        mono_ns: 1_000_000_000,
        wall_ms: 1_800_000_000_000,
    };
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

    let toml = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
                [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 4\n\
                [connections.rate_limit_overrides]\nmodel_concurrency = { \"m\" = 2 }\n";
    let config = match load_str(toml, &|_| None) {
        Ok(o) => o.config,
        Err(e) => unreachable!("bench config: {e}"),
    };
    let views = Views::default();
    let mut owned = Owned::new(&config);
    let mut wid = 0u64;
    g.bench_function("owner_same_shard_acquire_release", |b| {
        b.iter(|| {
            wid += 1;
            let acquire = Msg::GateAcquire {
                id: wid,
                connection: ConnectionId(0),
                model: "m".to_owned(),
                deadline_ns: None,
            };
            let out = owned.apply(&config, &views, 1, 0, acquire, now);
            let serial = match out.first() {
                Some((Dest::Shard(0), Msg::GateGrant { serial, .. })) => *serial,
                _ => unreachable!("uncontended grant"),
            };
            black_box(owned.apply(
                &config,
                &views,
                1,
                0,
                Msg::GateRelease {
                    connection: ConnectionId(0),
                    serial,
                },
                now,
            ));
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
