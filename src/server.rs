//! The server: the fleet of shards and everything that wires them — one shard per worker, each a thread pinned to a CPU running its own monoio
//! runtime (io_uring, or epoll when io_uring cannot start) and accepting on its own
//! `SO_REUSEPORT` listener. Start-up is all-or-nothing; shutdown stops accepting, lets
//! in-flight requests finish within the grace period, and joins every thread.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use monoio::time::TimeDriver;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

use crate::auth::KeyIndex;
use crate::clock::Clock as _;
use crate::config::Config;
use crate::mesh::ring::{Mesh, MeshEnd};
use crate::net::claim::{self, Claim};
use crate::net::downstream;
use crate::net::io::ClientStream;
use crate::net::listener::bind_shards;
use crate::net::tls::TlsConfigs;
use crate::owners::{Msg, Shard};
use crate::routing::resolve::RouteTable;
use crate::shard::Shared;
use crate::shard::metrics::SnapshotMetrics;
use crate::shard::settings::SettingsCell;
use crate::snapshot::state::Records;
use crate::snapshot::store;
use crate::snapshot::writer::{DeltaSink, ToWriter, WriteReport, Writer};

/// Entries of each io_uring submission queue (monoio's minimum). The kernel maps a ring's
/// queues into the process and they stay resident: at 4096 submission entries (and the
/// default completion queue of twice that) a shard's ring held 404 KiB, at 256 with
/// [`URING_CQ_ENTRIES`] 84 KiB. A loop turn that prepares more operations than fit
/// submits the full queue early (one extra `io_uring_enter`, counted at 0.01 per request
/// at 256 connections); the completion queue is the one sized for many connections.
const URING_ENTRIES: u32 = 256;
/// Entries of each io_uring completion queue: room for the completions of thousands of
/// connections between two loop turns (any beyond it wait in a kernel list and are still
/// delivered).
const URING_CQ_ENTRIES: u32 = 4096;
/// How often a draining shard checks whether its in-flight requests are done.
const DRAIN_POLL_MS: u64 = 10;
/// How long cut requests get to write their last answer after the grace period.
const CUT_FLUSH_MS: u64 = 1_000;
/// Stack of each shard thread: 16 MiB. A connection's request future (an attempt racing
/// the client, the deadlines and the watchdogs; a combo's hedged attempts) is large, and an
/// unoptimised build copies such futures through the stack while polling them: the 2 MiB
/// default overflowed in debug builds. It is virtual memory: only the pages a shard
/// actually touches cost resident memory, so the bound costs nothing per connection.
const SHARD_STACK_BYTES: usize = 16 * 1024 * 1024;

/// Records a shard collects for the snapshot writer in one step; a larger backlog is
/// collected over several steps, a millisecond apart, so the request loop is never held
/// for long (`tidegate_snapshot_collect_max_seconds` shows the longest step).
const SNAPSHOT_BATCH: usize = 64;

/// Which I/O driver the shards run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    IoUring,
    Epoll,
}

impl Driver {
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Epoll => "epoll",
        }
    }
}

/// What the operator asked for (`TIDEGATE_DRIVER=auto|io_uring|epoll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverChoice {
    Auto,
    IoUring,
    Epoll,
}

impl DriverChoice {
    /// The driver named by `TIDEGATE_DRIVER` (`auto`, `io_uring`, `epoll`, in any case and
    /// with surrounding blanks; unset or empty: auto); `None` for any other value.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(DriverChoice::Auto),
            "io_uring" | "iouring" | "uring" => Some(DriverChoice::IoUring),
            "epoll" | "legacy" => Some(DriverChoice::Epoll),
            _ => None,
        }
    }
}

/// A running fleet.
pub struct Fleet {
    pub addr: SocketAddr,
    pub shards: usize,
    pub driver: Driver,
    stops: Vec<flume::Sender<()>>,
    /// Each shard's inbox for a reloaded configuration.
    reloads: Vec<flume::Sender<Reload>>,
    /// The configuration the shards run (or are about to adopt).
    current: Arc<Shared>,
    /// Set when shutdown begins, before the listeners close.
    stopping: Arc<AtomicBool>,
    /// A second handle on every shard's listening socket, to stop listening at once.
    closers: Vec<std::net::TcpListener>,
    threads: Vec<JoinHandle<()>>,
    /// Writes the snapshot; finished after the shards (their last deltas) at stop.
    writer: Option<Writer>,
    /// Held until the fleet is stopped: the address's claim (see `net::claim`).
    _claim: Claim,
}

#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Shard count for `workers` (0 = one per available core).
pub fn shard_count(workers: usize) -> usize {
    if workers > 0 {
        return workers;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn choose_driver(choice: DriverChoice) -> Driver {
    match choice {
        DriverChoice::Epoll => Driver::Epoll,
        DriverChoice::IoUring => Driver::IoUring,
        DriverChoice::Auto if monoio::utils::detect_uring() => Driver::IoUring,
        DriverChoice::Auto => {
            tracing::warn!("io_uring is unavailable here; shards use the epoll driver");
            Driver::Epoll
        }
    }
}

/// Raises the open-file soft limit to the hard limit: every client and upstream
/// connection is a file descriptor.
fn raise_nofile_limit() {
    if let Ok((soft, hard)) = rlimit::Resource::NOFILE.get()
        && soft < hard
        && let Err(e) = rlimit::Resource::NOFILE.set(hard, hard)
    {
        tracing::warn!("cannot raise the open-file limit to {hard}: {e}");
    }
}

fn config_pin(shared: &Shared) -> bool {
    shared.config.server.pin_threads
}

/// Binds, starts every shard, and returns once all of them accept. `uring_setup` applies
/// when the driver is io_uring.
pub fn start(
    config: Arc<Config>,
    choice: DriverChoice,
    uring_setup: UringSetup,
) -> Result<Fleet, StartError> {
    raise_nofile_limit();
    let shards = shard_count(config.server.workers);
    let driver = choose_driver(choice);
    let tls = TlsConfigs::build(&config).map_err(StartError)?;
    let keys = KeyIndex::new(&config);
    if keys.is_open() {
        tracing::warn!(
            "no [[client_keys]] configured: inference endpoints accept requests without a key"
        );
    }
    let listen = config.server.listen;
    let shared_listen = config.server.allow_shared_listen;
    let claim = claim::before_bind(listen, shared_listen)
        .map_err(|e| StartError(format!("cannot listen on {listen}: {e}")))?;
    let (addr, listeners) = bind_shards(listen, shards)
        .map_err(|e| StartError(format!("cannot listen on {listen}: {e}")))?;
    if listen.port() != 0 {
        claim::after_bind(addr, shared_listen, &listeners)
            .map_err(|e| StartError(format!("cannot listen on {listen}: {e}")))?;
    }
    let mut mesh_ends: Vec<Option<MeshEnd<Msg>>> = if shards > 1 {
        Mesh::<Msg>::with_capacity(shards, config.server.mesh_ring_capacity)
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None]
    };
    let mesh_stats = mesh_ends
        .first()
        .and_then(Option::as_ref)
        .map(|end| end.stats().clone());
    let snapshot_metrics = Arc::new(SnapshotMetrics::default());
    let (writer, restored, runtime) = open_snapshot(&config, snapshot_metrics.clone())?;
    let shared = Arc::new(Shared {
        snapshot: snapshot_metrics,
        mesh_stats,
        routes: RouteTable::new(&config),
        tls,
        keys,
        metrics: (0..shards)
            .map(|_| Arc::new(crate::shard::metrics::ShardMetrics::default()))
            .collect(),
        families: (0..shards)
            .map(|_| Arc::new(crate::proxy::observe::families(&config, None)))
            .collect(),
        shards,
        driver: driver.as_str(),
        runtime,
        started_wall_ms: {
            use crate::clock::Clock as _;
            crate::clock::MonoClock.now().wall_ms
        },
        config,
    });
    let cores = if config_pin(&shared) {
        core_affinity::get_core_ids().unwrap_or_default()
    } else {
        Vec::new()
    };
    let (ready_tx, ready_rx) = flume::unbounded::<Result<usize, String>>();
    let closers = listeners
        .iter()
        .map(std::net::TcpListener::try_clone)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StartError(format!("cannot listen on {listen}: {e}")))?;
    let stopping = Arc::new(AtomicBool::new(false));
    let mut stops = Vec::with_capacity(shards);
    let mut reloads = Vec::with_capacity(shards);
    let mut threads = Vec::with_capacity(shards);
    for (id, listener) in listeners.into_iter().enumerate() {
        let mesh_end = mesh_ends.get_mut(id).and_then(Option::take);
        let (stop_tx, stop_rx) = flume::bounded::<()>(1);
        let (reload_tx, reload_rx) = flume::unbounded::<Reload>();
        let core = if cores.is_empty() {
            None
        } else {
            cores.get(id % cores.len()).copied()
        };
        let shared = shared.clone();
        let ready = ready_tx.clone();
        let stopping = stopping.clone();
        let persist = Persist {
            sink: writer.sink(),
            restored: restored.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("tidegate-shard-{id}"))
            .stack_size(SHARD_STACK_BYTES)
            .spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                let stop = Stop {
                    flag: stopping,
                    signal: stop_rx,
                    reload: reload_rx,
                };
                let shard = ShardStart {
                    id,
                    listener,
                    shared,
                    mesh: mesh_end,
                    stop,
                    persist,
                    uring_setup,
                };
                if let Err(e) = run_shard(driver, shard, &ready) {
                    let _ = ready.send(Err(format!("shard {id}: {e}")));
                }
            })
            .map_err(|e| StartError(format!("cannot start shard thread: {e}")))?;
        stops.push(stop_tx);
        reloads.push(reload_tx);
        threads.push(handle);
    }
    drop(ready_tx);
    drop(restored);
    let fleet = Fleet {
        addr,
        shards,
        driver,
        stops,
        reloads,
        current: shared,
        stopping,
        closers,
        threads,
        writer: Some(writer),
        _claim: claim,
    };
    for _ in 0..shards {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                fleet.stop();
                return Err(StartError(e));
            }
            Err(_) => {
                fleet.stop();
                return Err(StartError("a shard did not start".into()));
            }
        }
    }
    Ok(fleet)
}

/// A connection to a TLS listener: the handshake (within `header_timeout_ms`), then the
/// requests. A failed handshake closes the connection (logged at DEBUG: scanners and
/// plain-HTTP clients are common).
async fn serve_tls(
    shard: Rc<Shard>,
    tls: Arc<rustls::ServerConfig>,
    stream: monoio::net::TcpStream,
) {
    let budget = Duration::from_millis(shard.current().config().server.header_timeout_ms);
    let acceptor = monoio_rustls::TlsAcceptor::from(tls);
    let peer = stream.peer_addr().ok();
    match crate::timer::timeout(budget, std::pin::pin!(acceptor.accept(stream))).await {
        Ok(Ok(tls)) => downstream::serve(shard, ClientStream::Tls(Box::new(tls), peer)).await,
        Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
        Err(_) => tracing::debug!("TLS handshake not complete within {budget:?}"),
    }
}

/// What a reload did: settings that cannot change live and were kept, the providers,
/// connections and combos it added or removed (one line each), and how many shards had
/// adopted it when [`Fleet::reload`] returned.
#[derive(Debug, Default)]
pub struct Reloaded {
    pub kept: Vec<String>,
    pub changes: Vec<String>,
    pub adopted: usize,
}

/// A reloaded configuration on its way to a shard, with where the shard says it adopted it.
struct Reload {
    shared: Arc<Shared>,
    adopted: flume::Sender<usize>,
}

/// How long [`Fleet::reload`] waits for every shard to say it adopted a reload. A shard
/// adopts it the next time its thread runs (it waits for no request), so this only bounds
/// a shard that is stuck.
const ADOPT_WAIT_MS: u64 = 5_000;

/// `connections: added c2; removed c1 (…)` for the names `new` has that `old` lacks and
/// back; `None` when both have the same names.
fn layout_change<'a>(
    what: &str,
    old: impl Iterator<Item = &'a str> + Clone,
    new: impl Iterator<Item = &'a str> + Clone,
) -> Option<String> {
    let added: Vec<&str> = new
        .clone()
        .filter(|n| !old.clone().any(|o| o == *n))
        .collect();
    let removed: Vec<&str> = old.filter(|o| !new.clone().any(|n| n == *o)).collect();
    let mut parts = Vec::new();
    if !added.is_empty() {
        parts.push(format!("added {}", added.join(", ")));
    }
    if !removed.is_empty() {
        parts.push(format!(
            "removed {} (their state is dropped; requests in flight on them finish)",
            removed.join(", ")
        ));
    }
    (!parts.is_empty()).then(|| format!("{what}: {}", parts.join("; ")))
}

impl Fleet {
    /// Hands a validated configuration to every shard and waits (at most `ADOPT_WAIT_MS`)
    /// until each has adopted it. A shard adopts it at once: requests that start from then
    /// on run on it, requests in flight finish on the configuration they started with.
    /// Providers, connections and combos may be added, removed and reordered: the reloaded
    /// ones keep their ids by name (`config::renumber`), so the owner state keyed by them
    /// (breakers, cooldowns, lockouts, gates, pins, metrics) stays with its name, removed
    /// ones' state is dropped as each owner adopts the reload, and new ones start fresh.
    /// Settings that cannot change live (`listen`, `workers`, `allow_shared_listen`,
    /// `state_dir`) keep their running values and are reported; the rest applies. `Err`:
    /// nothing applied, one line per problem.
    pub fn reload(&mut self, mut config: Config) -> Result<Reloaded, Vec<String>> {
        let old = &self.current.config;
        let mut problems = Vec::new();
        if let Err(e) = crate::config::renumber::carry_ids(&mut config, old) {
            problems.push(e);
        }
        let tls = TlsConfigs::build(&config);
        let tls = match tls {
            Ok(t) => Some(t),
            Err(e) => {
                problems.push(e);
                None
            }
        };
        let Some(tls) = tls.filter(|_| problems.is_empty()) else {
            return Err(problems);
        };
        let mut reloaded = Reloaded::default();
        let names = |c: &Config| -> [Vec<String>; 3] {
            [
                c.providers.iter().map(|p| p.name.clone()).collect(),
                c.connections.iter().map(|c| c.name.clone()).collect(),
                c.combos.iter().map(|c| c.name.clone()).collect(),
            ]
        };
        let (before, after) = (names(old), names(&config));
        for ((what, o), n) in ["providers", "connections", "combos"]
            .into_iter()
            .zip(&before)
            .zip(&after)
        {
            let (o, n) = (o.iter().map(String::as_str), n.iter().map(String::as_str));
            reloaded.changes.extend(layout_change(what, o, n));
        }
        if config.server.listen != old.server.listen {
            reloaded.kept.push(format!(
                "server.listen changed to {} (kept {}; restart to apply)",
                config.server.listen, old.server.listen
            ));
            config.server.listen = old.server.listen;
        }
        if config.server.workers != old.server.workers {
            reloaded.kept.push(format!(
                "server.workers changed to {} (kept {}; restart to apply)",
                config.server.workers, old.server.workers
            ));
            config.server.workers = old.server.workers;
        }
        if config.server.allow_shared_listen != old.server.allow_shared_listen {
            reloaded.kept.push(format!(
                "server.allow_shared_listen changed to {} (kept {}; restart to apply)",
                config.server.allow_shared_listen, old.server.allow_shared_listen
            ));
            config.server.allow_shared_listen = old.server.allow_shared_listen;
        }
        if config.server.state_dir != old.server.state_dir {
            reloaded.kept.push(format!(
                "server.state_dir changed to {} (kept {}; restart to apply)",
                config.server.state_dir.display(),
                old.server.state_dir.display()
            ));
            config.server.state_dir = old.server.state_dir.clone();
        }
        let shared = Arc::new(Shared {
            snapshot: self.current.snapshot.clone(),
            mesh_stats: self.current.mesh_stats.clone(),
            routes: RouteTable::new(&config),
            tls,
            keys: KeyIndex::new(&config),
            metrics: self.current.metrics.clone(),
            families: self
                .current
                .families
                .iter()
                .map(|old| Arc::new(crate::proxy::observe::families(&config, Some(old))))
                .collect(),
            shards: self.current.shards,
            driver: self.current.driver,
            runtime: self.current.runtime.clone(),
            started_wall_ms: self.current.started_wall_ms,
            config: Arc::new(config),
        });
        // A reload replaces the settings PATCHed through the management API: the file
        // is what the operator just edited and asked for (docs/operations.md).
        shared
            .runtime
            .reset(crate::config::runtime::RuntimeSettings::from_config(
                &shared.config,
            ));
        let (adopted_tx, adopted_rx) = flume::unbounded::<usize>();
        for r in &self.reloads {
            let _ = r.send(Reload {
                shared: shared.clone(),
                adopted: adopted_tx.clone(),
            });
        }
        drop(adopted_tx);
        if let Some(w) = &self.writer {
            let _ = w.sink().send(ToWriter::Config(shared.config.clone()));
        }
        self.current = shared;
        let clock = crate::clock::MonoClock;
        let deadline_ns = clock.mono_ns().saturating_add(ADOPT_WAIT_MS * 1_000_000);
        while reloaded.adopted < self.reloads.len() {
            let left = Duration::from_nanos(deadline_ns.saturating_sub(clock.mono_ns()));
            if adopted_rx.recv_timeout(left).is_err() {
                break;
            }
            reloaded.adopted += 1;
        }
        Ok(reloaded)
    }

    /// Stops accepting on every shard, waits for in-flight requests (each shard gives
    /// them `shutdown_grace_ms`) and joins the threads.
    /// Stops listening now, on every shard's socket: from here the kernel hands new
    /// connections to other listeners of the address (a successor started with
    /// `allow_shared_listen`) or refuses them; none waits in a draining shard's backlog.
    /// Pending accepts fail and the shards see `stopping`. Called by [`Self::stop`]; call it
    /// first to log "shutting down" only once nothing listens any more.
    pub fn stop_listening(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        for l in std::mem::take(&mut self.closers) {
            if let Err(e) = socket2::SockRef::from(&l).shutdown(std::net::Shutdown::Read) {
                tracing::warn!("cannot close a listening socket: {e}");
            }
        }
    }

    pub fn stop(mut self) {
        self.stop_listening();
        for s in &self.stops {
            let _ = s.send(());
        }
        for t in self.threads {
            let _ = t.join();
        }
        // Every shard has sent its last delta: write them, then stop the writer.
        if let Some(w) = self.writer {
            w.finish();
        }
    }
}

/// How a shard learns shutdown began: the flag (read when an accept fails) and the
/// message that cancels its pending accept.
struct Stop {
    flag: Arc<AtomicBool>,
    signal: flume::Receiver<()>,
    /// Reloaded configurations, adopted as they arrive.
    reload: flume::Receiver<Reload>,
}

/// Opens `state_dir`: the newest valid snapshot slot becomes the records every shard
/// adopts its share of, and the writer continues from it. Untrusted files were moved
/// aside and logged by the store; only a directory that cannot be used stops start-up.
/// The runtime settings (PATCHes) the snapshot kept are put back onto the file's.
type Opened = (Writer, Arc<Records>, Arc<SettingsCell>);

fn open_snapshot(
    config: &Arc<Config>,
    metrics: Arc<SnapshotMetrics>,
) -> Result<Opened, StartError> {
    use crate::clock::Clock;
    let dir = &config.server.state_dir;
    let now = crate::clock::MonoClock.now();
    let opened = store::open(dir, now.wall_ms).map_err(|e| {
        StartError(format!(
            "cannot use server.state_dir {}: {e}",
            dir.display()
        ))
    })?;
    for r in &opened.rejected {
        let moved_to = r
            .moved_to
            .as_deref()
            .map_or_else(|| "(rename failed)".into(), |p| p.display().to_string());
        tracing::warn!(
            file = %r.path.display(),
            moved_to = %moved_to,
            "snapshot slot not trusted: {}; ignoring it",
            r.problem
        );
    }
    metrics.rejected_files.store(
        opened.rejected.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let records = match &opened.loaded {
        Some(l) => {
            let (records, dropped) = Records::from_contents(&l.contents, config);
            for line in &dropped {
                tracing::warn!("snapshot entry not restored: {line}");
            }
            for s in &l.contents.skipped_sections {
                tracing::info!(
                    tag = s.tag,
                    version = s.version,
                    "snapshot section {} not read by this release",
                    s.name
                );
            }
            tracing::info!(
                file = %l.path.display(),
                generation = l.header.generation,
                breakers = records.breakers.len(),
                connections = records.connections.len(),
                provider_cooldowns = records.trackers.len(),
                affinity_pins = records.pins.len(),
                leases = records.leases.len(),
                connection_overrides = records.connection_overrides.len(),
                settings_patched = !records.settings_patch.is_empty(),
                "snapshot restored"
            );
            records
        }
        None => Records::default(),
    };
    let mut records = records;
    let (settings, dropped) = crate::admin::patch::restore(config, &records);
    for line in &dropped {
        tracing::warn!("snapshot entry not restored: {line}");
    }
    // The writer starts from what is in force: a PATCH refused now is not written back.
    records
        .settings_patch
        .clone_from(&settings.resilience_patch);
    records
        .connection_overrides
        .clone_from(&settings.connections);
    let runtime = Arc::new(SettingsCell::new(settings));
    let on_write = Box::new(move |r: WriteReport| {
        metrics.record_write(r.ok, r.duration_ns, r.bytes, r.generation)
    });
    let poll = {
        let runtime = runtime.clone();
        Box::new(move |seen: u64| (runtime.generation() != seen).then(|| runtime.current()))
    };
    let writer = Writer::spawn(
        config.clone(),
        opened.store,
        records.clone(),
        poll,
        on_write,
    )
    .map_err(|e| StartError(format!("cannot start the snapshot writer: {e}")))?;
    Ok((writer, Arc::new(records), runtime))
}

/// What a shard needs of the snapshot: where to send its deltas, what to adopt.
struct Persist {
    sink: DeltaSink,
    restored: Arc<Records>,
}

/// Everything a shard thread starts from.
struct ShardStart {
    id: usize,
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mesh: Option<MeshEnd<Msg>>,
    stop: Stop,
    persist: Persist,
    uring_setup: UringSetup,
}

/// Sends one batch of this shard's changed records to the writer; true when more are
/// pending. The time it took is the longest a snapshot holds this shard's loop. The
/// preemption count is read before the step (one system call, idle or not) and after it
/// only when there was something to send.
fn collect_snapshot(shard: &Shard, sink: &DeltaSink) -> bool {
    let switches = preemptions();
    let start = shard.now().mono_ns;
    let mut delta =
        crate::owners::health::owner::snapshot_delta(shard, SNAPSHOT_BATCH).unwrap_or_default();
    let room = SNAPSHOT_BATCH.saturating_sub(delta.len());
    delta.pins = crate::owners::affinity::owner::snapshot_delta(shard, room);
    let room = SNAPSHOT_BATCH.saturating_sub(delta.len());
    delta.leases = crate::owners::leases::owner::snapshot_delta(shard, room);
    let more = delta.len() >= SNAPSHOT_BATCH;
    if !delta.is_empty() {
        let _ = sink.send(ToWriter::Delta(delta));
        let took = shard.now().mono_ns.saturating_sub(start);
        let preempted = switches.zip(preemptions()).map(|(a, b)| b != a);
        shard.metrics().snapshot_collected(took, preempted);
    }
    more
}

/// How often the OS has switched this thread out involuntarily
/// (`nonvoluntary_ctxt_switches` of `/proc/thread-self/status`): read around a collection
/// step, it tells the step's own time from a step the OS interrupted to run another
/// process (the step itself never blocks). The file is opened once per thread and kept:
/// each reading is one `pread` (read to a string, it was ten system calls — open, statx,
/// seven growing reads, close — on every shard's loop each second, idle or not). Not
/// `getrusage(RUSAGE_THREAD)`, one call too: valgrind 3.19 holds its thread lock through
/// `io_uring_enter`, and a shard whose only system calls are that and `getrusage` never
/// lets the main thread run, so `perf/ab_instructions.sh` under `DRIVER=io_uring` hangs at
/// start-up; a read lets it. `None` off Linux or when the file cannot be read.
#[cfg(target_os = "linux")]
fn preemptions() -> Option<u64> {
    status_count(b"nonvoluntary_ctxt_switches:")
}

/// The count on the line of this thread's status file that starts with `key`, read with one
/// `pread` of the file kept open (see [`preemptions`]).
#[cfg(target_os = "linux")]
fn status_count(key: &[u8]) -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    thread_local! {
        /// This thread's status file (`thread-self` is resolved by the thread that opens
        /// it) and the buffer it is read into, both made at the thread's first reading.
        static STATUS: Option<(std::fs::File, std::cell::RefCell<Vec<u8>>)> =
            std::fs::File::open("/proc/thread-self/status")
                .ok()
                .map(|f| (f, std::cell::RefCell::new(vec![0; STATUS_BUF])));
    }
    STATUS.with(|status| {
        let (file, buf) = status.as_ref()?;
        let mut buf = buf.try_borrow_mut().ok()?;
        let n = file.read_at(&mut buf, 0).ok()?;
        // The switch counts are its last lines: searched from the end.
        let line = buf
            .get(..n)?
            .split(|&b| b == b'\n')
            .rev()
            .find_map(|l| l.strip_prefix(key))?;
        std::str::from_utf8(line).ok()?.trim().parse().ok()
    })
}

/// Room for a thread's status file (~1.5 KiB; a read from offset 0 gives it whole when it
/// fits), kept per thread: zeroing a fresh 8 KiB buffer was most of a reading's cost.
#[cfg(target_os = "linux")]
const STATUS_BUF: usize = 8192;

#[cfg(not(target_os = "linux"))]
fn preemptions() -> Option<u64> {
    None
}

/// How each shard's io_uring ring is set up (`TIDEGATE_URING_SETUP`). A shard's ring is
/// only ever entered by its own thread, which lets the kernel skip work it would do for a
/// ring shared between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UringSetup {
    /// No setup flags.
    Plain,
    /// `IORING_SETUP_COOP_TASKRUN`: a completion does not interrupt the shard thread while
    /// it runs user code; it is delivered when the thread next enters the kernel (the
    /// shard enters at every loop turn).
    Coop,
    /// `COOP_TASKRUN` + `SINGLE_ISSUER` + `DEFER_TASKRUN` (Linux 6.1+): completions are
    /// processed only when the shard thread waits for them, in one batch.
    Defer,
}

impl UringSetup {
    /// The setup named by `TIDEGATE_URING_SETUP` (`plain`, `coop`, `defer`, in any case and
    /// with surrounding blanks; unset or empty: the default, [`UringSetup::Coop`]); `None`
    /// for any other value.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "coop" => Some(UringSetup::Coop),
            "plain" => Some(UringSetup::Plain),
            "defer" => Some(UringSetup::Defer),
            _ => None,
        }
    }

    fn builder(self) -> io_uring::Builder {
        let mut b = io_uring::IoUring::builder();
        b.setup_cqsize(URING_CQ_ENTRIES);
        match self {
            UringSetup::Plain => {}
            UringSetup::Coop => {
                b.setup_coop_taskrun();
            }
            UringSetup::Defer => {
                b.setup_coop_taskrun()
                    .setup_single_issuer()
                    .setup_defer_taskrun();
            }
        }
        b
    }
}

/// Builds a shard's io_uring runtime with `setup`; a kernel that refuses the setup flags
/// gets a ring without them.
fn uring_runtime(setup: UringSetup) -> std::io::Result<monoio::Runtime<TimeDriver<IoUringDriver>>> {
    let build = |setup: UringSetup| {
        RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(URING_ENTRIES)
            .uring_builder(setup.builder())
            .enable_timer()
            .build()
    };
    match build(setup) {
        Ok(rt) => Ok(rt),
        Err(_) if setup != UringSetup::Plain => build(UringSetup::Plain),
        Err(e) => Err(e),
    }
}

fn run_shard(
    driver: Driver,
    start: ShardStart,
    ready: &flume::Sender<Result<usize, String>>,
) -> Result<(), String> {
    let id = start.id;
    let setup = start.uring_setup;
    let task = shard_main(start, ready.clone());
    match driver {
        Driver::IoUring => {
            let built = uring_runtime(setup);
            match built {
                Ok(mut rt) => rt.block_on(task),
                Err(e) => {
                    tracing::warn!(
                        shard = id,
                        "io_uring runtime failed to start ({e}); using epoll"
                    );
                    let mut rt = RuntimeBuilder::<LegacyDriver>::new()
                        .enable_timer()
                        .build()
                        .map_err(|e| format!("runtime: {e}"))?;
                    rt.block_on(task)
                }
            }
        }
        Driver::Epoll => {
            let mut rt: monoio::Runtime<TimeDriver<LegacyDriver>> =
                RuntimeBuilder::<LegacyDriver>::new()
                    .enable_timer()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
            rt.block_on(task)
        }
    }
}

async fn shard_main(
    start: ShardStart,
    ready: flume::Sender<Result<usize, String>>,
) -> Result<(), String> {
    let ShardStart {
        id,
        listener,
        shared,
        mesh,
        stop,
        persist,
        uring_setup: _,
    } = start;
    let listener =
        monoio::net::TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
    let (sender, receiver) = match mesh {
        Some(end) => {
            let (s, r) = end.split();
            (Some(s), Some(r))
        }
        None => (None, None),
    };
    // The shard's pump (every message for its owner tables and views, its own included)
    // and its housekeeping (pool sweep, anti-entropy, sweeps).
    let shard = Shard::new(id, shared, sender);
    // The keys this shard owns under the current shard count, and replicas of the rest,
    // from the snapshot — before the pump and the first request.
    crate::owners::health::owner::restore(&shard, &persist.restored);
    crate::owners::affinity::owner::restore(&shard, &persist.restored);
    crate::owners::leases::owner::restore(&shard, &persist.restored);
    drop(persist.restored);
    shard.start(receiver);
    {
        let shard = shard.clone();
        let reload = stop.reload;
        monoio::spawn(async move {
            // Adopted at once, whatever is in flight: each request holds the configuration
            // it started with to its end (`shard::Req`), new ones take this one.
            while let Ok(next) = reload.recv_async().await {
                shard.adopt(next.shared);
                tracing::debug!(shard = id, "reloaded configuration adopted");
                let _ = next.adopted.send(id);
            }
        });
    }
    {
        // The snapshot collector: every `snapshot_interval_ms` (read each round, so a
        // reload applies), this shard's changed records go to the writer in small steps.
        let shard = shard.clone();
        let sink = persist.sink.clone();
        monoio::spawn(async move {
            loop {
                let every = shard.current().config().server.snapshot_interval_ms.max(1);
                monoio::time::sleep(Duration::from_millis(every)).await;
                if shard.is_draining() {
                    break;
                }
                while collect_snapshot(&shard, &sink) {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
    }
    let _ = ready.send(Ok(id));
    drop(ready);
    // Stopping cancels the pending accept. A cancelled io_uring accept may still have
    // completed with a connection; such a late connection is closed at once, never left
    // accepted and unserved.
    let stopping = Rc::new(std::cell::Cell::new(false));
    let canceller = monoio::io::Canceller::new();
    let cancel = canceller.handle();
    {
        let stopping = stopping.clone();
        let signal = stop.signal;
        monoio::spawn(async move {
            let _ = signal.recv_async().await;
            stopping.set(true);
            let _ = canceller.cancel();
        });
    }
    while !stopping.get() {
        match listener.cancelable_accept(cancel.clone()).await {
            Ok((stream, _)) if stopping.get() || stop.flag.load(Ordering::SeqCst) => drop(stream),
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                match shard.current().shared().tls.listener.clone() {
                    None => {
                        monoio::spawn(downstream::serve(
                            shard.clone(),
                            ClientStream::Plain(stream),
                        ));
                    }
                    Some(tls) => {
                        monoio::spawn(serve_tls(shard.clone(), tls, stream));
                    }
                }
            }
            Err(_) if stopping.get() || stop.flag.load(Ordering::SeqCst) => break,
            Err(e) => {
                // Out of file descriptors or a transient error: back off briefly.
                tracing::warn!(shard = id, "accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    shard.start_draining();
    let grace = Duration::from_millis(shard.current().config().server.shutdown_grace_ms);
    let start = shard.now().mono_ns;
    while shard.in_flight() > 0 {
        let waited = Duration::from_nanos(shard.now().mono_ns.saturating_sub(start));
        if waited >= grace {
            tracing::warn!(
                shard = id,
                in_flight = shard.in_flight(),
                "grace period over; cutting requests"
            );
            break;
        }
        monoio::time::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
    }
    if shard.in_flight() > 0 {
        // Pending requests are answered 503 `shutting_down`, streams get their in-band
        // error event; a client too slow to take even that is not waited for long.
        shard.cut_in_flight();
        let cut_at = shard.now().mono_ns;
        while shard.in_flight() > 0
            && shard.now().mono_ns.saturating_sub(cut_at) < CUT_FLUSH_MS * 1_000_000
        {
            monoio::time::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
        }
    }
    // The last changes, for the write at shutdown: nothing is served any more.
    while collect_snapshot(&shard, &persist.sink) {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{URING_CQ_ENTRIES, URING_ENTRIES, UringSetup, preemptions, uring_runtime};
    use crate::config::{DEFAULT_MESH_RING_CAPACITY, MAX_MESH_RING_CAPACITY};
    use crate::mesh::ring::{MAX_RING_CAPACITY, RING_CAPACITY};

    /// A ring has the queue sizes asked for, and every setup gives a runtime (a kernel too
    /// old for a setup's flags gets a plain ring). Skipped where io_uring is unavailable.
    #[test]
    fn uring_rings_have_the_queue_sizes() {
        if !monoio::utils::detect_uring() {
            return;
        }
        for setup in [UringSetup::Plain, UringSetup::Coop, UringSetup::Defer] {
            match setup.builder().build(URING_ENTRIES) {
                Ok(ring) => {
                    assert_eq!(ring.params().sq_entries(), URING_ENTRIES, "{setup:?}");
                    assert_eq!(ring.params().cq_entries(), URING_CQ_ENTRIES, "{setup:?}");
                }
                Err(e) => assert_ne!(setup, UringSetup::Plain, "a plain ring: {e}"),
            }
            assert!(uring_runtime(setup).is_ok(), "{setup:?}");
        }
    }

    /// The count read with one `pread` of the kept file is the one a fresh read of the
    /// status file gives (read between two readings: never less than the first, never more
    /// than the second).
    #[test]
    #[cfg(target_os = "linux")]
    fn preemptions_are_the_status_file_s_nonvoluntary_switches() {
        let from_status = || -> u64 {
            let s = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
            s.lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(u64::MAX)
        };
        // The kept file is read afresh each time: a sleep is a voluntary switch.
        let voluntary = || super::status_count(b"voluntary_ctxt_switches:");
        let slept = voluntary();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(voluntary() > slept, "{slept:?} {:?}", voluntary());
        for _ in 0..100 {
            let before = preemptions();
            let status = from_status();
            let after = preemptions();
            let (Some(before), Some(after)) = (before, after) else {
                panic!("the status file could not be read");
            };
            assert!(
                before <= status && status <= after,
                "{before} {status} {after}"
            );
        }
    }

    /// The driver variables are read trimmed and in any case by their own parsers, so every
    /// caller (`serve`, `check`) reads them alike; anything else is refused.
    #[test]
    fn driver_and_setup_names_are_read_trimmed_and_in_any_case() {
        use super::DriverChoice;
        for (s, want) in [
            ("", Some(DriverChoice::Auto)),
            (" AUTO ", Some(DriverChoice::Auto)),
            ("Io_Uring", Some(DriverChoice::IoUring)),
            ("\tepoll\n", Some(DriverChoice::Epoll)),
            ("e poll", None),
            ("kqueue", None),
        ] {
            assert_eq!(DriverChoice::parse(s), want, "{s:?}");
        }
        for (s, want) in [
            ("  ", Some(UringSetup::Coop)),
            ("Defer", Some(UringSetup::Defer)),
            (" plain\t", Some(UringSetup::Plain)),
            ("sqpoll", None),
        ] {
            assert_eq!(UringSetup::parse(s), want, "{s:?}");
        }
    }

    /// The configuration layer may not import the mesh, so it states the ring's default and
    /// limit itself; they must stay the mesh's.
    #[test]
    fn config_ring_capacity_bounds_are_the_mesh_s() {
        assert_eq!(DEFAULT_MESH_RING_CAPACITY, RING_CAPACITY);
        assert_eq!(MAX_MESH_RING_CAPACITY, MAX_RING_CAPACITY);
    }
}
