//! The snapshot writer: one plain thread, off every shard. Owner shards send it what
//! changed ([`Delta`]s, collected in small bounded batches on the shard); it keeps the
//! merged [`Records`] and, when something changed, encodes and writes the file at most
//! every `snapshot_interval_ms` — and once more when told to finish (shutdown). Encoding,
//! the fsyncs and the renames never run on a shard's thread.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Clock, MonoClock};
use crate::config::Config;
use crate::config::runtime::RuntimeSettings;

use super::state::{Delta, Records};
use super::store::Store;

/// A message to the writer.
#[derive(Debug)]
pub enum ToWriter {
    Delta(Delta),
    /// A reload's configuration: records are named by it from the next write on, and
    /// records of providers and connections it no longer has are left out.
    Config(Arc<Config>),
    /// Write what is pending and stop (shutdown, after every shard's last delta).
    Finish,
}

/// One attempt to write, for the caller's metrics.
#[derive(Clone, Copy, Debug)]
pub struct WriteReport {
    pub ok: bool,
    pub duration_ns: u64,
    pub bytes: usize,
    pub generation: u64,
}

/// The writer thread's handle.
#[derive(Debug)]
pub struct Writer {
    tx: mpsc::Sender<ToWriter>,
    thread: Option<JoinHandle<()>>,
}

/// The runtime settings when they changed: called with the generation the writer last
/// saw, it returns the newer generation and value, or `None`. The writer polls it each
/// round, so a PATCH reaches the file within two intervals without any shard's help.
pub type RuntimePoll = Box<dyn Fn(u64) -> Option<(u64, Arc<RuntimeSettings>)> + Send>;

/// Where shards send their deltas: std's unbounded channel, whose send takes no lock (a
/// writer thread descheduled mid-receive never holds a shard up).
pub type DeltaSink = mpsc::Sender<ToWriter>;

impl Writer {
    /// Starts the thread. `records` is what the store loaded (the writer's starting
    /// point: keys no shard reports again keep their loaded record).
    pub fn spawn(
        config: Arc<Config>,
        store: Store,
        records: Records,
        runtime: RuntimePoll,
        on_write: Box<dyn Fn(WriteReport) + Send>,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel();
        let interval = Duration::from_millis(config.server.snapshot_interval_ms.max(1));
        let thread = std::thread::Builder::new()
            .name("tidegate-snapshot".into())
            .spawn(move || {
                let inputs = Inputs {
                    rx: &rx,
                    runtime: &*runtime,
                    on_write: &*on_write,
                };
                run(config, store, records, &inputs, interval);
            })?;
        Ok(Writer {
            tx,
            thread: Some(thread),
        })
    }

    /// A sender for shards.
    pub fn sink(&self) -> DeltaSink {
        self.tx.clone()
    }

    /// Writes what is pending and joins the thread.
    pub fn finish(mut self) {
        let _ = self.tx.send(ToWriter::Finish);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the writer listens to and reports to.
struct Inputs<'a> {
    rx: &'a mpsc::Receiver<ToWriter>,
    runtime: &'a dyn Fn(u64) -> Option<(u64, Arc<RuntimeSettings>)>,
    on_write: &'a dyn Fn(WriteReport),
}

fn run(
    mut config: Arc<Config>,
    mut store: Store,
    mut records: Records,
    io: &Inputs<'_>,
    interval: Duration,
) {
    let (rx, on_write) = (io.rx, io.on_write);
    let clock = MonoClock;
    // The runtime settings the records hold: those loaded (generation 0 of the cell).
    let mut runtime_seen = 0u64;
    let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
    let mut dirty = false;
    // Failing writes are logged once until one succeeds again.
    let mut failing = false;
    // The last write's monotonic instant; the first write may happen at once.
    let mut last_write_ns: Option<u64> = None;
    // Another instance held `state_dir` at the last attempt (a handover); logged once.
    let mut waiting = false;
    let mut write =
        |config: &Config, records: &mut Records, last_write_ns: &mut Option<u64>| -> bool {
            let start = clock.now();
            match store.take_over() {
                Ok(true) if waiting => {
                    waiting = false;
                    tracing::info!(
                        dir = %store.dir().display(),
                        "snapshot: the previous instance released state_dir; writing from here on"
                    );
                }
                Ok(true) => {}
                Ok(false) => {
                    if !waiting {
                        tracing::info!(
                            dir = %store.dir().display(),
                            "snapshot: another instance still writes state_dir (a handover); \
                             writing waits until it exits"
                        );
                    }
                    waiting = true;
                    *last_write_ns = Some(clock.now().mono_ns);
                    return false;
                }
                // Not fatal: the write below reports why it cannot write.
                Err(e) => tracing::debug!("cannot take the state_dir lock: {e}"),
            }
            // Pins past their expiry are never restored; their owner sweeps them silently.
            records
                .pins
                .retain(|_, p| p.expires_wall_ms > start.wall_ms);
            let contents = records.to_contents(config);
            let result = store.write(contents, start.wall_ms);
            let end = clock.now().mono_ns;
            *last_write_ns = Some(end);
            let duration_ns = end.saturating_sub(start.mono_ns);
            match result {
                Ok(w) => {
                    if failing {
                        tracing::info!(file = %w.path.display(), "snapshot written again");
                    }
                    failing = false;
                    tracing::debug!(
                        file = %w.path.display(),
                        generation = w.generation,
                        bytes = w.bytes,
                        "snapshot written"
                    );
                    on_write(WriteReport {
                        ok: true,
                        duration_ns,
                        bytes: w.bytes,
                        generation: w.generation,
                    });
                    true
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            dir = %store.dir().display(),
                            "cannot write the snapshot: {e}; retrying every interval"
                        );
                    }
                    failing = true;
                    on_write(WriteReport {
                        ok: false,
                        duration_ns,
                        bytes: 0,
                        generation: 0,
                    });
                    false
                }
            }
        };
    loop {
        let now = clock.now().mono_ns;
        let due_in_ns = match last_write_ns {
            Some(t) if dirty => t.saturating_add(interval_ns).saturating_sub(now),
            None if dirty => 0,
            _ => interval_ns,
        };
        let finishing = match rx.recv_timeout(Duration::from_nanos(due_in_ns)) {
            Ok(ToWriter::Delta(d)) => {
                dirty |= !d.is_empty();
                records.apply(d);
                false
            }
            Ok(ToWriter::Config(c)) => {
                config = c;
                dirty = true;
                false
            }
            Ok(ToWriter::Finish) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
        };
        if let Some((generation, settings)) = (io.runtime)(runtime_seen) {
            runtime_seen = generation;
            if records.settings_patch != settings.resilience_patch
                || records.connection_overrides != settings.connections
            {
                records
                    .settings_patch
                    .clone_from(&settings.resilience_patch);
                records
                    .connection_overrides
                    .clone_from(&settings.connections);
                dirty = true;
            }
        }
        if finishing {
            while let Ok(m) = rx.try_recv() {
                match m {
                    ToWriter::Delta(d) => {
                        dirty |= !d.is_empty();
                        records.apply(d);
                    }
                    ToWriter::Config(c) => config = c,
                    ToWriter::Finish => {}
                }
            }
            if dirty {
                write(&config, &mut records, &mut last_write_ns);
            }
            return;
        }
        let now = clock.now().mono_ns;
        let due = last_write_ns.is_none_or(|t| now.saturating_sub(t) >= interval_ns);
        if dirty && due && write(&config, &mut records, &mut last_write_ns) {
            dirty = false;
        }
    }
}
