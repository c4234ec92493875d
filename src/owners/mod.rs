//! The owner-held mechanisms, one folder each: `protocol.rs` (the facts, requests and
//! replies that travel between shards), `owner.rs` (the handler on the key's owner shard,
//! over the pure tables of `resilience`/`flow`) and `client.rs` (the asker on any shard,
//! with the RAII guard that returns what it holds). `docs/architecture.md` walks through
//! adding one.
//!
//! This file registers them: the `mechanisms!` list below generates the closed enums that
//! carry each mechanism's messages inside the shard envelope, the owner tables of a shard,
//! and the dispatch from the pump to each mechanism. Adding a mechanism is a folder and one
//! line in that list.

pub mod affinity;
pub mod gates;
pub mod health;
pub mod leases;
pub mod queue;
pub mod quota_share;
pub mod tool_limits;

#[cfg(test)]
mod counter;
mod mesh_safe;

use std::cell::RefCell;

use crate::clock::Now;
use crate::config::{Config, ConnectionId, ProviderId};
use crate::flow::admission::{Admission, GateHome, QuotaShareHome, Resolved};
use crate::mesh::placement::{ConnectionKey, DOMAIN_GLOBAL, OwnerKey, ProviderKey, mix64};
use crate::mesh::safe::{MeshSafe, is_mesh_safe};
use crate::shard::call::{CallId, Protocol, caller_shard};
use crate::shard::metrics::FlowGauges;
use crate::shard::{self, App, Dest, Out};

use health::views::Views;

/// The application the shards run.
#[derive(Debug)]
pub struct Tidegate;

/// A shard of this application.
pub type Shard = shard::Shard<Tidegate>;
/// A request on a shard of this application, holding its configuration generation.
pub type Req<'a> = shard::Req<'a, Tidegate>;

/// `connection`'s admission settings under `req`'s configuration (resolved once per
/// configuration generation: [`Resolved`]).
pub fn admission(req: &Req<'_>, connection: ConnectionId) -> Admission {
    req.derived().get(req.config(), connection)
}

/// The envelope of this application's messages.
pub type Msg = shard::Msg<Tidegate>;
/// Views: owner → every shard.
pub type View = health::protocol::View;

impl OwnerKey for ProviderId {
    fn owner_hash(&self) -> u64 {
        ProviderKey(self.0).owner_hash()
    }
}

impl OwnerKey for ConnectionId {
    fn owner_hash(&self) -> u64 {
        ConnectionKey(self.0).owner_hash()
    }
}

// Where the flow mechanisms' homes live. The placement of a domain key is decided here, one
// layer above both the transport (which knows only hashes) and the pure tables (which know
// no shards): a gate home hashes like the key it stands for, the global homes have their own
// domain.
impl OwnerKey for GateHome {
    fn owner_hash(&self) -> u64 {
        match self {
            GateHome::Global => mix64(DOMAIN_GLOBAL),
            GateHome::Provider(p) => p.owner_hash(),
            GateHome::Connection(c) => c.owner_hash(),
        }
    }
}

impl OwnerKey for QuotaShareHome {
    fn owner_hash(&self) -> u64 {
        mix64(DOMAIN_GLOBAL | 1)
    }
}

/// What an owner handler sees and produces: read-only context, and the messages to send
/// once it returns (sent by the shard; nothing is handled re-entrantly).
pub struct Cx<'a> {
    pub config: &'a Config,
    /// This shard's replicas of every owner's views.
    pub views: &'a Views,
    pub now: Now,
    pub shards: usize,
    /// The shard the message came from.
    pub from: usize,
    out: Out<Tidegate>,
    /// Breaker transitions by the index of the state entered (for `/metrics`).
    breaker_transitions: [u64; 4],
}

impl Cx<'_> {
    /// Answers call `id` (at its asking shard).
    pub fn reply(&mut self, id: CallId, reply: impl Into<Reply>) {
        self.out.push((
            Dest::Shard(caller_shard(id)),
            shard::Msg::Reply {
                id,
                reply: reply.into(),
            },
        ));
    }

    /// Broadcasts a view to every shard (this one applies it first).
    pub fn view(&mut self, view: View) {
        self.out.push((Dest::All, shard::Msg::View(view)));
    }

    /// Sends a fact to shard `to`.
    pub fn tell(&mut self, to: usize, fact: impl Into<Fact>) {
        self.out
            .push((Dest::Shard(to), shard::Msg::Fact(fact.into())));
    }

    /// Sends a fact to this shard at monotonic instant `at_ns` (an owner timer).
    pub fn at(&mut self, at_ns: u64, fact: impl Into<Fact>) {
        self.out
            .push((Dest::SelfAt(at_ns), shard::Msg::Fact(fact.into())));
    }

    /// Counts a breaker transition into the state of index `to` (see
    /// `health::owner::BREAKER_STATES`).
    pub fn count_breaker_transition(&mut self, to: usize) {
        if let Some(n) = self.breaker_transitions.get_mut(to) {
            *n += 1;
        }
    }

    /// The messages produced so far (the health owner reads which keys its views
    /// announce, for the snapshot; owner tests read them).
    pub fn sent(&self) -> &Out<Tidegate> {
        &self.out
    }

    /// A context for driving an owner table directly (owner tests, benches, and the
    /// snapshot's restore at start-up).
    pub fn detached<'a>(config: &'a Config, views: &'a Views, now: Now, shards: usize) -> Cx<'a> {
        Cx {
            config,
            views,
            now,
            shards,
            from: 0,
            out: Vec::new(),
            breaker_transitions: [0; 4],
        }
    }

    /// Takes the messages produced so far.
    pub fn take(&mut self) -> Out<Tidegate> {
        std::mem::take(&mut self.out)
    }
}

/// One owner-held mechanism: its messages, its owner table, and its handlers. The owner
/// side is pure and synchronous over `cx.now`; what it sends goes through `cx`.
pub trait Mechanism: Sized {
    /// Its messages cross the mesh: declared in `owners/mesh_safe.rs`.
    type Fact: MeshSafe;
    type Request: MeshSafe;
    type Reply: MeshSafe;
    /// The owner may keep a call waiting (giving up must cancel it).
    const HOLDS: bool;

    fn new(config: &Config) -> Self;
    fn fact(&mut self, cx: &mut Cx<'_>, fact: Self::Fact);
    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Self::Request);
    /// The asker of call `id` gave up. Owners that hold calls answer every cancel, so the
    /// asker can forget the waiter.
    fn cancel(&mut self, cx: &mut Cx<'_>, id: CallId) {
        let _ = (cx, id);
    }
    /// A reply of this mechanism reached a shard whose asker had given up (asker side):
    /// hand back what it grants.
    fn late(shard: &Shard, from: usize, id: CallId, reply: Self::Reply) {
        let _ = (shard, from, id, reply);
    }
    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        let _ = cx;
    }
    /// The runtime settings changed (`cx.config` holds the new ones): re-tune the table.
    fn settings_changed(&mut self, cx: &mut Cx<'_>) {
        let _ = cx;
    }
    /// Adds this table's occupancy to the shard's flow gauges.
    fn gauges(&self, gauges: &mut FlowGauges) {
        let _ = gauges;
    }
}

/// Registers the mechanisms: `Variant => module::Type`. Generates `Fact`, `Request`,
/// `Reply` and `Kind` (one variant per mechanism), the shard's owner tables ([`Owners`]),
/// the pump's dispatch, and a [`Protocol`] for each mechanism's calls.
macro_rules! mechanisms {
    ($($(#[$attr:meta])* $variant:ident => $module:ident :: $ty:ident,)*) => {
        /// A fact for some mechanism's owner.
        pub enum Fact { $($(#[$attr])* $variant(<$module::$ty as Mechanism>::Fact),)* }
        /// A call to some mechanism's owner.
        pub enum Request { $($(#[$attr])* $variant(<$module::$ty as Mechanism>::Request),)* }
        /// An owner's answer to a call.
        pub enum Reply { $($(#[$attr])* $variant(<$module::$ty as Mechanism>::Reply),)* }
        /// Which mechanism a cancel is for.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Kind { $($(#[$attr])* $variant,)* }

        // Each carries one mechanism's messages, which are `MeshSafe` (a bound of `Mechanism`).
        impl MeshSafe for Fact {}
        impl MeshSafe for Request {}
        impl MeshSafe for Reply {}
        const _: fn(&Fact, &Request, &Reply) = |f, r, a| {
            match f { $($(#[$attr])* Fact::$variant(x) => is_mesh_safe(x),)* }
            match r { $($(#[$attr])* Request::$variant(x) => is_mesh_safe(x),)* }
            match a { $($(#[$attr])* Reply::$variant(x) => is_mesh_safe(x),)* }
        };

        /// The owner tables of one shard (the keys it owns), one per mechanism.
        pub struct Owners {
            $($(#[$attr])* pub $module: RefCell<$module::$ty>,)*
        }

        impl Owners {
            fn new(config: &Config) -> Self {
                Self { $($(#[$attr])* $module: RefCell::new(<$module::$ty as Mechanism>::new(config)),)* }
            }

            fn gauges(&self) -> FlowGauges {
                let mut g = FlowGauges::default();
                $($(#[$attr])* self.$module.borrow().gauges(&mut g);)*
                g
            }
        }

        $(
            $(#[$attr])*
            impl From<<$module::$ty as Mechanism>::Fact> for Fact {
                fn from(f: <$module::$ty as Mechanism>::Fact) -> Self { Fact::$variant(f) }
            }
            $(#[$attr])*
            impl From<<$module::$ty as Mechanism>::Reply> for Reply {
                fn from(r: <$module::$ty as Mechanism>::Reply) -> Self { Reply::$variant(r) }
            }
            $(#[$attr])*
            impl Protocol<Tidegate> for $module::$ty {
                type Request = <$module::$ty as Mechanism>::Request;
                type Reply = <$module::$ty as Mechanism>::Reply;
                const HOLDS: bool = <$module::$ty as Mechanism>::HOLDS;
                const KIND: Kind = Kind::$variant;
                fn wrap(request: Self::Request) -> Request { Request::$variant(request) }
                #[allow(unreachable_patterns)]
                fn unwrap(reply: Reply) -> Option<Self::Reply> {
                    match reply { Reply::$variant(r) => Some(r), _ => None }
                }
            }
        )*

        fn serve_fact(owners: &Owners, cx: &mut Cx<'_>, fact: Fact) {
            match fact { $($(#[$attr])* Fact::$variant(f) => owners.$module.borrow_mut().fact(cx, f),)* }
        }

        fn serve_call(owners: &Owners, cx: &mut Cx<'_>, id: CallId, request: Request) {
            match request { $($(#[$attr])* Request::$variant(r) => owners.$module.borrow_mut().call(cx, id, r),)* }
        }

        fn serve_cancel(owners: &Owners, cx: &mut Cx<'_>, id: CallId, kind: Kind) {
            match kind { $($(#[$attr])* Kind::$variant => owners.$module.borrow_mut().cancel(cx, id),)* }
        }

        fn late(shard: &Shard, from: usize, id: CallId, reply: Reply) {
            match reply { $($(#[$attr])* Reply::$variant(r) => <$module::$ty as Mechanism>::late(shard, from, id, r),)* }
        }

        fn housekeeping_all(owners: &Owners, cx: &mut Cx<'_>) {
            $($(#[$attr])* owners.$module.borrow_mut().housekeeping(cx);)*
        }

        fn settings_changed_all(owners: &Owners, cx: &mut Cx<'_>) {
            $($(#[$attr])* owners.$module.borrow_mut().settings_changed(cx);)*
        }
    };
}

mechanisms! {
    Health => health::Health,
    Gates => gates::Gates,
    Queue => queue::Queue,
    QuotaShare => quota_share::QuotaShare,
    Affinity => affinity::Affinity,
    Leases => leases::Leases,
    ToolLimits => tool_limits::ToolLimitTable,
    #[cfg(test)]
    Counter => counter::Counter,
}

/// A shard's application state: the owner tables, the view replicas, and the combo
/// strategies' state (this shard's own: rotations, draws, decks and usage counts are not
/// shared between shards).
pub struct State {
    pub views: RefCell<Views>,
    pub owners: Owners,
    pub strategies: RefCell<crate::routing::strategy::Strategies>,
}

impl App for Tidegate {
    type View = View;
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    type Kind = Kind;
    type State = State;
    type Derived = Resolved;

    fn derive(config: &Config) -> Resolved {
        Resolved::new(config)
    }

    fn state(config: &Config) -> State {
        State {
            views: RefCell::new(Views::default()),
            owners: Owners::new(config),
            strategies: RefCell::default(),
        }
    }

    fn apply_view(shard: &Shard, view: &View) {
        shard.state().views.borrow_mut().apply(view);
    }

    fn serve(shard: &Shard, from: usize, msg: Msg) {
        let owners = &shard.state().owners;
        run_owners(shard, from, |cx| match msg {
            shard::Msg::Fact(f) => serve_fact(owners, cx, f),
            shard::Msg::Call { id, request } => serve_call(owners, cx, id, request),
            shard::Msg::Cancel { id, kind } => serve_cancel(owners, cx, id, kind),
            shard::Msg::View(_) | shard::Msg::Reply { .. } => {}
        });
        shard.metrics().publish_flow(&owners.gauges());
    }

    fn late_reply(shard: &Shard, from: usize, id: CallId, reply: Reply) {
        late(shard, from, id, reply);
    }

    fn housekeeping(shard: &Shard) {
        run_owners(shard, shard.id(), |cx| {
            housekeeping_all(&shard.state().owners, cx);
        });
        // The sweeps change the tables' sizes: published even when no message arrives.
        shard.metrics().publish_flow(&shard.state().owners.gauges());
        health::owner::sweep_replicas(shard);
    }

    fn settings_changed(shard: &Shard) {
        run_owners(shard, shard.id(), |cx| {
            settings_changed_all(&shard.state().owners, cx);
        });
        // A reload drops the tables of removed providers and connections: shown at once.
        shard.metrics().publish_flow(&shard.state().owners.gauges());
    }
}

/// Runs owner handlers with a context over this shard's views and clock, then sends what
/// they produced (after every borrow is released).
fn run_owners(shard: &Shard, from: usize, handle: impl FnOnce(&mut Cx<'_>)) {
    let current = shard.current();
    let config = current.config();
    let (out, transitions) = {
        let views = shard.state().views.borrow();
        let mut cx = Cx {
            config,
            views: &views,
            now: shard.now(),
            shards: shard.shards(),
            from,
            out: Vec::new(),
            breaker_transitions: [0; 4],
        };
        handle(&mut cx);
        (cx.out, cx.breaker_transitions)
    };
    for (i, n) in transitions.into_iter().enumerate() {
        if n > 0 {
            current.families(shard.id()).breaker_transitions.add(i, n);
        }
    }
    shard.dispatch(out);
}

/// How long an asker waits for the answer to a call whose owner times the wait out
/// itself after `wait_ms` (0 = no deadline): that, plus a second for the reply. The bound
/// only guards a lost reply.
pub fn reply_bound(wait_ms: u64) -> std::time::Duration {
    if wait_ms > 0 {
        std::time::Duration::from_millis(wait_ms.saturating_add(1_000))
    } else {
        std::time::Duration::from_secs(24 * 3600)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mesh::placement::owner_of;

    /// One shard's read-only facts for an empty file.
    fn shared() -> std::sync::Arc<crate::shard::Shared> {
        shared_of("")
    }

    /// One shard's read-only facts for the file `toml` (unit tests that run a shard).
    pub(crate) fn shared_of(toml: &str) -> std::sync::Arc<crate::shard::Shared> {
        use std::sync::Arc;
        let config = crate::config::load_str(toml, &|_| None)
            .map(|o| o.config)
            .unwrap_or_else(|e| panic!("config: {e}"));
        Arc::new(crate::shard::Shared {
            routes: crate::routing::resolve::RouteTable::new(&config),
            tls: crate::net::tls::TlsConfigs::build(&config).unwrap_or_else(|e| panic!("{e}")),
            keys: crate::auth::KeyIndex::new(&config),
            metrics: vec![Arc::default()],
            families: vec![Arc::default()],
            shards: 1,
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

    fn head_with_key(key: &str) -> crate::http1::RequestHead {
        let mut buf = bytes::BytesMut::from(
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\n\r\n")
                .as_str(),
        );
        match crate::http1::decode_request_head(&mut buf) {
            Ok(crate::http1::Decoded::Complete(h)) => h,
            other => panic!("head: {other:?}"),
        }
    }

    fn keys_toml(keys: &[(&str, &str)]) -> String {
        keys.iter()
            .map(|(id, key)| format!("[[client_keys]]\nid = \"{id}\"\nkey = \"{key}\"\n\n"))
            .collect()
    }

    /// The keys a shard remembers belong to one configuration generation: after a reload
    /// a key is identified by the reloaded file (here the same key names another client),
    /// a key the reload removed is refused at once, and a request that started before the
    /// reload keeps its own configuration's answer.
    #[test]
    fn a_reload_forgets_remembered_keys_and_a_revoked_key_is_refused() {
        use crate::auth::Caller;
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let first = shared_of(&keys_toml(&[("a", "key-a"), ("b", "key-b")]));
            let shard = Shard::new(0, first, None);
            let before = Req::enter(&shard);
            for _ in 0..2 {
                assert_eq!(before.caller(&head_with_key("key-a")), Caller::Key(0));
                assert_eq!(before.caller(&head_with_key("key-b")), Caller::Key(1));
            }
            // The reload swaps the clients' order and revokes key-a.
            shard.adopt(shared_of(&keys_toml(&[("b", "key-b"), ("c", "key-c")])));
            let after = Req::enter(&shard);
            assert_eq!(after.caller(&head_with_key("key-b")), Caller::Key(0));
            assert_eq!(after.caller(&head_with_key("key-a")), Caller::Denied);
            assert_eq!(after.caller(&head_with_key("key-c")), Caller::Key(1));
            assert_eq!(after.caller(&head_with_key("key-a")), Caller::Denied);
            // The request that started before the reload still runs on its configuration.
            assert_eq!(before.caller(&head_with_key("key-a")), Caller::Key(0));
            // A runtime-settings change starts a new generation too: still identified.
            let changed = shard.current().shared().runtime.update(|current| {
                let mut next = current.clone();
                next.resilience.session_affinity_ttl_ms = 7;
                Ok::<_, ()>(next)
            });
            assert!(changed.is_ok());
            shard.refresh();
            let later = Req::enter(&shard);
            assert_eq!(later.caller(&head_with_key("key-b")), Caller::Key(0));
            assert_eq!(later.caller(&head_with_key("key-a")), Caller::Denied);
        });
    }

    /// A request keeps the generation it started with through any number of settings
    /// changes (as `PATCH /api/resilience` makes) and reloads; the shard keeps only the
    /// current one, and the request's is freed when the request ends.
    #[test]
    fn old_generations_are_freed_when_the_last_request_holding_them_ends() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let shared = shared();
            let shard = Shard::new(0, shared.clone(), None);
            let started = std::rc::Rc::downgrade(&shard.current());
            let request = Req::enter(&shard);
            let mut between = Vec::new();
            for ttl_ms in 1..=200u64 {
                let changed = shared.runtime.update(|current| {
                    let mut next = current.clone();
                    next.resilience.session_affinity_ttl_ms = ttl_ms;
                    Ok::<_, ()>(next)
                });
                assert!(changed.is_ok());
                shard.refresh();
                between.push(std::rc::Rc::downgrade(&shard.current()));
                assert_eq!(
                    shard.current().config().resilience.session_affinity_ttl_ms,
                    ttl_ms
                );
            }
            shard.adopt(shared.clone());
            // The request still reads the settings it started with.
            assert_eq!(request.config().resilience.session_affinity_ttl_ms, 0);
            assert!(started.upgrade().is_some());
            // Every generation between was freed as soon as the next replaced it.
            assert!(between.iter().all(|g| g.upgrade().is_none()));
            assert_eq!(shard.in_flight(), 1);
            drop(request);
            assert!(
                started.upgrade().is_none(),
                "the request's generation is freed"
            );
            assert_eq!(shard.in_flight(), 0);
            // A request that starts now runs on the reloaded file with the last settings.
            let next = Req::enter(&shard);
            assert_eq!(next.config().resilience.session_affinity_ttl_ms, 200);
        });
    }

    #[test]
    fn homes_hash_like_their_keys_and_global_has_its_own_domain() {
        let b = ConnectionId(1);
        for shards in [2, 3, 8] {
            assert_eq!(
                owner_of(&GateHome::Provider(ProviderId(1)), shards),
                owner_of(&ProviderId(1), shards)
            );
            assert_eq!(
                owner_of(&GateHome::Connection(b), shards),
                owner_of(&b, shards)
            );
            assert!(owner_of(&GateHome::Global, shards) < shards);
            assert!(owner_of(&QuotaShareHome, shards) < shards);
        }
    }
}
