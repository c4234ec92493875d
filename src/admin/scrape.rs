//! `/metrics`: the shards' counters and histograms (summed and merged on read), the
//! replicated health views every shard holds (breaker states, cooling and terminal
//! connections, lockouts), the build and the process.

use std::fmt::Write as _;

use crate::owners::Shard;
use crate::resilience::breaker::{BreakerKey, BreakerState};
use crate::resilience::connection::Routability;
use crate::shard::metrics;

/// The whole exposition.
pub fn render(shard: &Shard) -> String {
    let generation = shard.current();
    let shared = generation.shared();
    let config = generation.config();
    let mut out = metrics::render(
        &shared.metrics,
        &shared.families,
        shared.mesh_stats.as_deref(),
        &shared.snapshot,
    );
    let now = shard.now();
    let views = shard.state().views.borrow();

    let _ = writeln!(
        out,
        "# HELP tidegate_breaker_state Circuit breakers by scope and state (1 = in that state), from the replicated views.\n# TYPE tidegate_breaker_state gauge"
    );
    let states = [
        BreakerState::Closed,
        BreakerState::Degraded,
        BreakerState::HalfOpen,
        BreakerState::Open,
    ];
    for p in &config.providers {
        let state = views
            .breaker(&BreakerKey::Provider(p.id))
            .map_or(BreakerState::Closed, |v| v.state);
        for s in states {
            let _ = writeln!(
                out,
                "tidegate_breaker_state{{scope=\"provider\",provider=\"{}\",state=\"{}\"}} {}",
                p.name,
                s.as_str(),
                u8::from(s == state)
            );
        }
    }
    let mut open_connections = [0u64; 4];
    for c in &config.connections {
        let state = views
            .breaker(&BreakerKey::Connection(c.id))
            .map_or(BreakerState::Closed, |v| v.state);
        if let Some(i) = states.iter().position(|s| *s == state) {
            open_connections[i] += 1;
        }
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_connection_breakers Connection-scoped breakers by state.\n# TYPE tidegate_connection_breakers gauge"
    );
    for (s, n) in states.iter().zip(open_connections) {
        let _ = writeln!(
            out,
            "tidegate_connection_breakers{{state=\"{}\"}} {n}",
            s.as_str()
        );
    }

    let _ = writeln!(
        out,
        "# HELP tidegate_connection_status Connections by provider and routability (cooling = in a cooldown, terminal = banned/expired/credits exhausted, disabled = switched off in the configuration, e.g. its key variable unset).\n# TYPE tidegate_connection_status gauge"
    );
    for p in &config.providers {
        let (mut routable, mut cooling, mut terminal, mut disabled) = (0u64, 0u64, 0u64, 0u64);
        for c in config.connections.iter().filter(|c| c.provider == p.id) {
            if !c.enabled {
                disabled += 1;
                continue;
            }
            match views.connections.routability(c.id, now) {
                Routability::Routable => routable += 1,
                Routability::NotUntil { .. } => cooling += 1,
                Routability::Terminal(_) => terminal += 1,
            }
        }
        for (status, n) in [
            ("routable", routable),
            ("cooling", cooling),
            ("terminal", terminal),
            ("disabled", disabled),
        ] {
            let _ = writeln!(
                out,
                "tidegate_connection_status{{provider=\"{}\",status=\"{status}\"}} {n}",
                p.name
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_model_lockouts Live model lockouts (all connections).\n# TYPE tidegate_model_lockouts gauge\ntidegate_model_lockouts {}",
        views.lockouts.live(now)
    );
    drop(views);

    let _ = writeln!(
        out,
        "# HELP tidegate_build_info Build of the running binary (always 1).\n# TYPE tidegate_build_info gauge\ntidegate_build_info{{version=\"{}\",driver=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        shared.driver
    );
    process(&mut out, shared.started_wall_ms);
    out
}

/// `process_*` in the conventional names, from `/proc/self` (left out where unreadable).
fn process(out: &mut String, started_wall_ms: u64) {
    let _ = writeln!(
        out,
        "# HELP process_start_time_seconds Start time of the process since the Unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}",
        started_wall_ms as f64 / 1000.0
    );
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
        && let Some((_, rest)) = stat.rsplit_once(')')
    {
        // Fields after the command: state is field 3; utime 14, stime 15, rss 24.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
        let ticks = 100.0; // USER_HZ on Linux
        if let (Some(u), Some(s)) = (num(14), num(15)) {
            let _ = writeln!(
                out,
                "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}",
                (u + s) as f64 / ticks
            );
        }
        if let Some(pages) = num(24) {
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}",
                pages * 4096
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        let _ = writeln!(
            out,
            "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}",
            fds.count()
        );
    }
}
