//! Scaffolding shared by the benches that run two threads over the shard mesh.

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};
use tidegate::mesh::ring::MeshEnd;

/// Sends `msg` to shard `to`, spinning while the ring is full.
pub fn send_until_taken<T>(end: &MeshEnd<T>, to: usize, mut msg: T) {
    while let Err(back) = end.send(to, msg) {
        msg = back;
        std::hint::spin_loop();
    }
}

/// Runs `f` on the io_uring driver when the kernel has it (as the fleet does), else epoll.
pub fn run_monoio<F: std::future::Future>(f: F) -> Option<F::Output> {
    if monoio::utils::detect_uring() {
        let mut rt = RuntimeBuilder::<IoUringDriver>::new().build().ok()?;
        Some(rt.block_on(f))
    } else {
        let mut rt = RuntimeBuilder::<LegacyDriver>::new().build().ok()?;
        Some(rt.block_on(f))
    }
}
