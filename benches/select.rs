//! Target selection over 1 000 connections with views: the gate a request runs on each
//! candidate (connection cooldown / terminal, model lockout, both breakers), reading only
//! the shard-local views. Against a naive baseline that keys state by strings and
//! allocates per lookup, the way a dynamic-language gateway typically does.
#![allow(clippy::panic, clippy::cast_possible_wrap)]

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::clock::Now;
use tidegate::config::{Config, ConnectionId, ProviderId, load_str};
use tidegate::owners::health::views::Views;
use tidegate::proxy::select::{Gate, gate};
use tidegate::resilience::Reason;
use tidegate::resilience::breaker::{BreakerKey, BreakerState, BreakerView};
use tidegate::resilience::connection::{ConnectionView, Cooldown};
use tidegate::resilience::lockout::{LockKey, LockReason, LockUpdate, LockView};
use tidegate::routing::resolve::Target;

const CONNECTIONS: u32 = 1_000;
const NOW_WALL_MS: u64 = 1_800_000_000_000;

fn config() -> Config {
    let mut toml = String::from(
        "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n",
    );
    for i in 0..CONNECTIONS {
        toml.push_str(&format!(
            "[[connections]]\nid = \"c{i}\"\nprovider = \"p\"\npriority = {i}\n"
        ));
    }
    match load_str(&toml, &|_| None) {
        Ok(o) => o.config,
        Err(e) => panic!("bench config: {e}"),
    }
}

/// Views where the first `blocked` connections are, in turn, cooling, locked for the
/// model, behind an open breaker, or banned-like cooling; the rest are routable.
fn views(blocked: u32, now: Now) -> Views {
    let mut v = Views::default();
    for i in 0..blocked {
        let c = ConnectionId(i);
        match i % 3 {
            0 => {
                let view = ConnectionView {
                    epoch: 1,
                    cooldown: Some(Cooldown {
                        until_ms: now.wall_ms + 60_000,
                        reason: Reason::RateLimitExceeded,
                    }),
                    terminal: None,
                    backoff_level: 1,
                };
                v.connections.apply(c, &view);
            }
            1 => {
                v.lockouts.apply(&LockUpdate {
                    key: LockKey::exact("p", Some(c), "m"),
                    lock: Some(LockView {
                        until_ms: now.mono_ms() + 60_000,
                        reason: LockReason::RateLimited,
                    }),
                    seq: u64::from(i) + 1,
                });
            }
            _ => {
                v.apply_breaker(
                    BreakerKey::Connection(c),
                    &BreakerView {
                        state: BreakerState::Open,
                        until_mono_ms: Some(now.mono_ms() as i64 + 60_000),
                        until_wall_ms: Some(now.wall_ms + 60_000),
                        epoch: 1,
                    },
                );
            }
        }
    }
    // Every other connection has a view too (closed breakers, clean state).
    for i in blocked..CONNECTIONS {
        v.apply_breaker(
            BreakerKey::Connection(ConnectionId(i)),
            &BreakerView {
                state: BreakerState::Closed,
                until_mono_ms: None,
                until_wall_ms: None,
                epoch: 1,
            },
        );
    }
    v
}

/// The first candidate (in priority order) the gate lets through.
fn select(views: &Views, config: &Config, target: &Target, now: Now) -> Option<ConnectionId> {
    (0..CONNECTIONS)
        .map(ConnectionId)
        .find(|c| gate(views, config, target, *c, now) == Gate::Pass)
}

/// Baseline: state keyed by "provider:connection:model" strings, built per lookup.
struct Naive {
    cooling: HashMap<String, u64>,
    locks: HashMap<String, u64>,
    open: HashMap<String, u64>,
}

impl Naive {
    fn new(blocked: u32, now_ms: u64) -> Self {
        let mut n = Naive {
            cooling: HashMap::new(),
            locks: HashMap::new(),
            open: HashMap::new(),
        };
        for i in 0..blocked {
            let until = now_ms + 60_000;
            match i % 3 {
                0 => n.cooling.insert(format!("c{i}"), until),
                1 => n.locks.insert(format!("p:c{i}:m"), until),
                _ => n.open.insert(format!("p::conn::c{i}"), until),
            };
        }
        n
    }

    fn select(&self, now_ms: u64) -> Option<u32> {
        (0..CONNECTIONS).find(|i| {
            let name = format!("c{i}");
            let cool = self.cooling.get(&name).is_some_and(|u| *u > now_ms);
            let lock = self
                .locks
                .get(&format!("p:{name}:m"))
                .is_some_and(|u| *u > now_ms);
            let open = self
                .open
                .get(&format!("p::conn::{name}"))
                .is_some_and(|u| *u > now_ms);
            !cool && !lock && !open
        })
    }
}

fn bench(c: &mut Criterion) {
    let config = config();
    let now = Now {
        mono_ns: 10_000_000_000,
        wall_ms: NOW_WALL_MS,
    };
    let target = Target {
        provider: ProviderId(0),
        model: "m".into(),
    };
    let mut g = c.benchmark_group("select_1000_connections");
    for blocked in [0u32, 10, 100] {
        let v = views(blocked, now);
        assert_eq!(
            select(&v, &config, &target, now),
            Some(ConnectionId(blocked))
        );
        g.bench_function(format!("tidegate/first_{blocked}_blocked"), |b| {
            b.iter(|| select(black_box(&v), &config, black_box(&target), now))
        });
        let naive = Naive::new(blocked, NOW_WALL_MS);
        assert_eq!(naive.select(NOW_WALL_MS), Some(blocked));
        g.bench_function(format!("naive_string_keys/first_{blocked}_blocked"), |b| {
            b.iter(|| naive.select(black_box(NOW_WALL_MS)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
