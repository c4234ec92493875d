//! `runtime::mesh` against naive baselines.
//!
//! - `one_thread/*`: the uncontended cost of one send plus one receive on a single thread —
//!   to another shard's end, to our own (diagonal) ring — against a `VecDeque` (no
//!   synchronisation at all: the floor) and `std::sync::mpsc::sync_channel` (the naive bounded
//!   channel).
//! - `round_trip/*`: ping → pong between two real threads. `mesh_spin` spins on `try_recv` on
//!   both sides (the latency floor: two cache-line transfers each way); `mesh_parked_monoio`
//!   has both sides in a monoio runtime awaiting `recv()`, so every message wakes a parked
//!   runtime from the other thread (monoio's cross-thread waker queue + driver unpark). Against
//!   `flume` awaited on the same runtimes (what we would use otherwise) and a blocking
//!   `std::sync::mpsc` ping-pong (thread park/unpark).
//!
//! Round trips are measured with `iter_custom`, timed by the crate's clock (the only place
//! that reads time). The numbers depend heavily on the machine: on a 2-core VM shared with
//! other work, spinning threads get descheduled, so read the medians, not the means.
//!
//! First recorded run (2-vCPU VM, load average ~2.5 from other builds; medians):
//! `one_thread`: mesh 8.0 ns, self-send 7.9 ns, 8 shards (scan of 8 rings) 17.7 ns,
//! `VecDeque` 7.9 ns, std `sync_channel` 15.9 ns. `round_trip`: mesh spinning 88 ns; mesh
//! parked on monoio (io_uring) 37 µs, flume on monoio 38 µs, blocking std channel 44 µs — a
//! parked round trip is the OS wake-up path on both sides, which the mesh adds nothing to.
//!
//! Hand-written `AtomicWaker` → the `atomic-waker` crate (issue 8; only the parked path
//! touches the waker), `--warm-up-time 1 --measurement-time 5`, 2 vCPUs at load ~10 from
//! other builds, medians before → after: `round_trip/mesh_parked_monoio` 3.15 → 4.82 µs
//! while the blocking std channel of the same runs went 3.39 → 6.52 µs (mesh ÷ std 0.93 →
//! 0.74; criterion: no change, p = 0.79); `one_thread` mesh 48.3 → 21.0 ns with
//! `VecDeque` 34.0 → 12.7 ns (the load fell, no waker on that path). The crate costs no more.

#[path = "support/mod.rs"]
mod support;
use support::{run_monoio, send_until_taken};

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::clock::{Clock, MonoClock};
use tidegate::mesh::ring::{Mesh, MeshEnd};

/// The message that tells an echo thread to stop.
const STOP: u64 = u64::MAX;

fn elapsed_since(start_ns: u64) -> Duration {
    Duration::from_nanos(MonoClock.now().mono_ns.saturating_sub(start_ns))
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("one_thread");
    let ends = Mesh::<u64>::build(2);
    let mut i = 0u64;
    g.bench_function("mesh_send_try_recv", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let _ = ends[0].send(1, black_box(i));
            black_box(ends[1].try_recv())
        })
    });
    g.bench_function("mesh_self_send_try_recv", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let _ = ends[0].send(0, black_box(i));
            black_box(ends[0].try_recv())
        })
    });
    let ends8 = Mesh::<u64>::build(8);
    g.bench_function("mesh_send_try_recv_8_shards", |b| {
        // The receiver scans 8 inbound rings; the message sits in the last one it visits.
        b.iter(|| {
            i = i.wrapping_add(1);
            let _ = ends8[7].send(0, black_box(i));
            black_box(ends8[0].try_recv())
        })
    });
    let mut q = VecDeque::with_capacity(1024);
    g.bench_function("baseline_vecdeque", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            q.push_back(black_box(i));
            black_box(q.pop_front())
        })
    });
    let (tx, rx) = mpsc::sync_channel::<u64>(1024);
    g.bench_function("baseline_std_sync_channel", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let _ = tx.try_send(black_box(i));
            black_box(rx.try_recv().ok())
        })
    });
    g.finish();
}

/// Two mesh ends, shard 0 for the bench thread and shard 1 for the echo thread.
fn pair() -> (MeshEnd<u64>, MeshEnd<u64>) {
    let mut ends = Mesh::<u64>::build(2).into_iter();
    match (ends.next(), ends.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => unreachable!("a two-shard mesh has two ends"),
    }
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip");
    g.measurement_time(Duration::from_secs(4));

    // Both sides spin on try_recv.
    {
        let (a, b) = pair();
        let echo: JoinHandle<()> = std::thread::spawn(move || {
            loop {
                match b.try_recv() {
                    Some((_, STOP)) => break,
                    Some((from, v)) => send_until_taken(&b, from, v),
                    None => std::hint::spin_loop(),
                }
            }
        });
        g.bench_function("mesh_spin", |bench| {
            bench.iter_custom(|iters| {
                let start = MonoClock.now().mono_ns;
                for i in 0..iters {
                    send_until_taken(&a, 1, i);
                    loop {
                        if let Some((_, v)) = a.try_recv() {
                            black_box(v);
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
                elapsed_since(start)
            })
        });
        send_until_taken(&a, 1, STOP);
        let _ = echo.join();
    }

    // Both sides are monoio runtimes parked in recv().await.
    {
        let (mut a, mut b) = pair();
        let echo = std::thread::spawn(move || {
            run_monoio(async move {
                loop {
                    let (from, v) = b.recv().await;
                    if v == STOP {
                        break;
                    }
                    let _ = b.send(from, v);
                }
            })
        });
        g.bench_function("mesh_parked_monoio", |bench| {
            bench.iter_custom(|iters| {
                run_monoio(async {
                    let start = MonoClock.now().mono_ns;
                    for i in 0..iters {
                        let _ = a.send(1, i);
                        black_box(a.recv().await);
                    }
                    elapsed_since(start)
                })
                .unwrap_or_default()
            })
        });
        let _ = a.send(1, STOP);
        let _ = echo.join();
    }

    // Baseline: flume bounded channels awaited on the same kind of runtimes.
    {
        let (ping_tx, ping_rx) = flume::bounded::<u64>(1024);
        let (pong_tx, pong_rx) = flume::bounded::<u64>(1024);
        let echo = std::thread::spawn(move || {
            run_monoio(async move {
                while let Ok(v) = ping_rx.recv_async().await {
                    if v == STOP || pong_tx.send_async(v).await.is_err() {
                        break;
                    }
                }
            })
        });
        g.bench_function("baseline_flume_parked_monoio", |bench| {
            bench.iter_custom(|iters| {
                run_monoio(async {
                    let start = MonoClock.now().mono_ns;
                    for i in 0..iters {
                        let _ = ping_tx.send_async(i).await;
                        black_box(pong_rx.recv_async().await.ok());
                    }
                    elapsed_since(start)
                })
                .unwrap_or_default()
            })
        });
        let _ = ping_tx.send(STOP);
        let _ = echo.join();
    }

    // Baseline: blocking std channels (the threads park in the kernel).
    {
        let (ping_tx, ping_rx) = mpsc::sync_channel::<u64>(1024);
        let (pong_tx, pong_rx) = mpsc::sync_channel::<u64>(1024);
        let echo = std::thread::spawn(move || {
            while let Ok(v) = ping_rx.recv() {
                if v == STOP || pong_tx.send(v).is_err() {
                    break;
                }
            }
        });
        g.bench_function("baseline_std_sync_channel_blocking", |bench| {
            bench.iter_custom(|iters| {
                let start = MonoClock.now().mono_ns;
                for i in 0..iters {
                    let _ = ping_tx.send(i);
                    black_box(pong_rx.recv().ok());
                }
                elapsed_since(start)
            })
        });
        let _ = ping_tx.send(STOP);
        let _ = echo.join();
    }
    g.finish();
}

criterion_group!(benches, one_thread, round_trip);
criterion_main!(benches);
