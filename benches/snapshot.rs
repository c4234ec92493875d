//! The snapshot at 10 000 connections, each cooling with a last error and an open
//! connection breaker (20 001 records, the worst case: every connection in trouble).
//!
//! - `encode_10k`: what the writer thread does before its fsyncs — records → named
//!   entries → rkyv sections, header and checksums (`Records::to_contents` + `file::encode`).
//! - `write_10k`: `Store::write` — encode, write the temp file, fsync, rename, fsync the
//!   directory (on the bench machine's disk; the fsyncs dominate).
//! - `decode_10k`: checking and decoding a file held in memory (`file::decode`: header,
//!   checksums, rkyv validated access, deserialize) and mapping names back to ids.
//! - `load_10k`: start-up's path from disk — `store::open` (read both slots through a
//!   memory map, decode) plus the mapping to ids.
//! - `shard_collect_batch`: what a shard's loop pays for one snapshot batch, the only
//!   snapshot work on a shard: `Health::take_delta` of `SNAPSHOT_BATCH` (64) keys from a
//!   backlog of 10 000 dirty connections. Timed with `iter_custom` on the crate's clock; the
//!   backlog is refilled outside the timed part.
#![allow(clippy::unreachable)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::clock::{Clock, MonoClock, Now};
use tidegate::config::{Config, ConnectionId, ProviderId, load_str};
use tidegate::owners::health::owner::Health;
use tidegate::owners::health::views::Views;
use tidegate::owners::{Cx, Mechanism};
use tidegate::resilience::Reason;
use tidegate::resilience::breaker::{
    BreakerKey, BreakerRecord, BreakerState, FailureKind, KindCounts,
};
use tidegate::resilience::connection::{
    ConnectionState, Cooldown, ErrorFields, ProviderErrorType, TestStatus,
};
use tidegate::snapshot::file;
use tidegate::snapshot::state::Records;
use tidegate::snapshot::store;

const CONNECTIONS: u32 = 10_000;
/// `server.rs`'s `SNAPSHOT_BATCH`.
const BATCH: usize = 64;

fn now() -> Now {
    Now {
        mono_ns: 1_000_000_000,
        wall_ms: 1_800_000_000_000,
    }
}

fn config() -> Config {
    let mut toml = String::from(
        "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n",
    );
    for i in 0..CONNECTIONS {
        toml.push_str(&format!(
            "[[connections]]\nid = \"conn-{i:05}\"\nprovider = \"p\"\n"
        ));
    }
    match load_str(&toml, &|_| None) {
        Ok(o) => o.config,
        Err(e) => unreachable!("bench config: {e}"),
    }
}

fn records() -> Records {
    let wall = now().wall_ms;
    let mut r = Records::default();
    r.breakers.insert(
        BreakerKey::Provider(ProviderId(0)),
        BreakerRecord {
            state: BreakerState::Degraded,
            failure_count: 3,
            last_failure_wall_ms: Some(wall),
            last_failure_kind: Some(FailureKind::Transient),
            open_cycle_count: 0,
            kind_failure_counts: KindCounts::default(),
            open_until_wall_ms: None,
        },
    );
    for i in 0..CONNECTIONS {
        r.breakers.insert(
            BreakerKey::Connection(ConnectionId(i)),
            BreakerRecord {
                state: BreakerState::Open,
                failure_count: 5,
                last_failure_wall_ms: Some(wall),
                last_failure_kind: Some(FailureKind::RateLimit),
                open_cycle_count: 1,
                kind_failure_counts: KindCounts {
                    transient: 0,
                    rate_limit: 5,
                    quota_exhausted: 0,
                },
                open_until_wall_ms: Some(wall + 60_000),
            },
        );
        r.connections.insert(
            ConnectionId(i),
            ConnectionState {
                cooldown: Some(Cooldown {
                    until_ms: wall + 30_000,
                    reason: Reason::RateLimitExceeded,
                }),
                test_status: TestStatus::Unavailable,
                error: Some(ErrorFields {
                    message: "Rate limit reached for requests per minute. Please try again in 20s."
                        .into(),
                    error_type: Some(ProviderErrorType::RateLimited),
                    code: Some(429),
                    at_ms: wall,
                }),
                backoff_level: 2,
                reject_streak: None,
                expired_strikes: None,
            },
        );
    }
    r
}

fn bench(c: &mut Criterion) {
    let config = config();
    let records = records();
    let bytes = match file::encode(1, now().wall_ms, records.to_contents(&config)) {
        Ok(b) => b,
        Err(e) => unreachable!("encode: {e}"),
    };
    let dir = std::env::temp_dir().join(format!("tidegate-bench-snapshot-{}", std::process::id()));
    let mut g = c.benchmark_group("snapshot_10k");
    g.throughput(criterion::Throughput::Bytes(bytes.len() as u64));
    g.bench_function("encode_10k", |b| {
        b.iter(|| file::encode(1, now().wall_ms, black_box(&records).to_contents(&config)))
    });
    g.bench_function("decode_10k", |b| {
        b.iter(|| match file::decode(black_box(&bytes)) {
            Ok((_, contents)) => Records::from_contents(&contents, &config),
            Err(e) => unreachable!("decode: {e}"),
        })
    });
    let mut opened = match store::open(&dir, now().wall_ms) {
        Ok(o) => o,
        Err(e) => unreachable!("open: {e}"),
    };
    let contents = records.to_contents(&config);
    g.sample_size(20);
    g.bench_function("write_10k", |b| {
        b.iter_batched(
            || contents.clone(),
            |c| opened.store.write(c, now().wall_ms),
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function("load_10k", |b| {
        b.iter(|| {
            let o = match store::open(&dir, now().wall_ms) {
                Ok(o) => o,
                Err(e) => unreachable!("open: {e}"),
            };
            o.loaded
                .map(|l| Records::from_contents(&l.contents, &config))
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);

    // One shard's collection step: 256 keys out of a 10 000-connection backlog.
    let views = Views::default();
    let mut health = Health::new(&config);
    let only_connections = Records {
        connections: records.connections.clone(),
        ..Records::default()
    };
    let refill = |h: &mut Health| {
        let mut cx = Cx::detached(&config, &views, now(), 1);
        h.restore(&mut cx, &only_connections, &|_| true);
    };
    refill(&mut health);
    c.bench_function("shard_collect_batch", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if !health.snapshot_dirty() {
                    refill(&mut health);
                }
                let start = MonoClock.now().mono_ns;
                black_box(health.take_delta(now(), BATCH));
                total += Duration::from_nanos(MonoClock.now().mono_ns - start);
            }
            total
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
