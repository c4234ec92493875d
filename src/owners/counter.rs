//! The worked example of `docs/architecture.md`: a toy owner-held counter. Its owner is
//! the owner of the counter's name; any shard adds to it with a call and reads the total
//! in the reply, or adds without waiting with a fact. Registered (for tests only) by one
//! line in `owners/mod.rs`; its test runs it on two real shards over the real mesh.

use std::collections::HashMap;

use crate::config::Config;
use crate::shard::call::{CallError, CallId};

use super::{Cx, Mechanism, Shard};

/// The counters this shard owns, by name.
#[derive(Debug, Default)]
pub struct Counter {
    totals: HashMap<String, u64>,
}

pub enum Request {
    /// Add `n` to counter `name`; the reply is the new total.
    Add { name: String, n: u64 },
}

pub enum Fact {
    /// Add `n` to counter `name`, nobody waits.
    Add { name: String, n: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Total(u64),
}

// What crosses the mesh, field by field (see `owners/mesh_safe.rs`).
crate::mesh_safe!(enum Request { Add { name @ name, n } });
crate::mesh_safe!(enum Fact { Add { name @ name, n } });
crate::mesh_safe!(copy: Reply);

impl Mechanism for Counter {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn fact(&mut self, _cx: &mut Cx<'_>, fact: Fact) {
        let Fact::Add { name, n } = fact;
        *self.totals.entry(name).or_default() += n;
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let Request::Add { name, n } = request;
        let total = self.totals.entry(name).or_default();
        *total += n;
        cx.reply(id, Reply::Total(*total));
    }
}

/// The client side: add `n` to `name` on its owner and return the total.
pub async fn add(shard: &Shard, name: &str, n: u64) -> Result<u64, CallError> {
    let owner = shard.owner(name);
    let request = Request::Add {
        name: name.to_owned(),
        n,
    };
    let bound = std::time::Duration::from_secs(5);
    let Reply::Total(total) = shard.call::<Counter>(owner, request, bound).await?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::mesh::placement::owner_of;
    use crate::mesh::ring::Mesh;
    use crate::owners::{Msg, Tidegate};
    use crate::shard::Shared;

    fn shared(shards: usize) -> Arc<Shared> {
        let config = crate::config::load_str("", &|_| None)
            .map(|o| o.config)
            .unwrap_or_else(|e| panic!("config: {e}"));
        Arc::new(Shared {
            routes: crate::routing::resolve::RouteTable::new(&config),
            tls: crate::net::tls::TlsConfigs::build(&config).unwrap_or_else(|e| panic!("{e}")),
            keys: crate::auth::KeyIndex::new(&config),
            metrics: (0..shards).map(|_| Arc::default()).collect(),
            families: (0..shards).map(|_| Arc::default()).collect(),
            shards,
            driver: "test",
            mesh_stats: None,
            runtime: Arc::new(crate::shard::settings::SettingsCell::new(
                crate::config::runtime::RuntimeSettings::from_config(&config),
            )),
            started_wall_ms: 0,
            snapshot: Arc::default(),
            config: Arc::new(config),
        })
    }

    /// Two shards, each in its own thread and runtime: shard 1 adds to a counter shard 0
    /// owns, with calls (answered with the total) and facts, and shard 0 calls itself
    /// through its own pump.
    #[test]
    fn a_counter_owned_by_one_shard_counts_calls_and_facts_from_both() {
        let name = (0..)
            .map(|i| format!("counter-{i}"))
            .find(|n| owner_of(n.as_str(), 2) == 0)
            .unwrap_or_default();
        let shared = shared(2);
        let mut ends = Mesh::<Msg>::build(2).into_iter();
        let (end0, end1) = match (ends.next(), ends.next()) {
            (Some(a), Some(b)) => (a, b),
            _ => panic!("two mesh ends"),
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let owner_shared = shared.clone();
        let owner_name = name.clone();
        let owner = std::thread::spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"));
            rt.block_on(async move {
                let (tx, rx) = end0.split();
                let shard = crate::shard::Shard::<Tidegate>::new(0, owner_shared, Some(tx));
                shard.start(Some(rx));
                // A self-call goes through the pump like any other.
                let total = add(&shard, &owner_name, 1).await;
                assert_eq!(total, Ok(1));
                while done_rx.try_recv().is_err() {
                    monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            });
        });
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let (tx, rx) = end1.split();
            let shard = crate::shard::Shard::<Tidegate>::new(1, shared, Some(tx));
            shard.start(Some(rx));
            // Wait for the owner's self-call (its total includes it).
            let mut total = 0;
            for _ in 0..5000 {
                total = add(&shard, &name, 0).await.unwrap_or(0);
                if total == 1 {
                    break;
                }
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert_eq!(total, 1);
            for _ in 0..10 {
                shard.send_fact(
                    0,
                    Fact::Add {
                        name: name.clone(),
                        n: 10,
                    }
                    .into(),
                );
            }
            // Facts and calls from one shard arrive in order: the call sees every fact.
            assert_eq!(add(&shard, &name, 5).await, Ok(106));
            assert_eq!(shard.outstanding_calls(), 0);
        });
        let _ = done_tx.send(());
        owner.join().unwrap_or_else(|_| panic!("owner thread"));
    }
}
