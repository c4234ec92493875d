//! The management routes: which paths, which methods, and the answer's shape.

use crate::http1::Method;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Healthz,
    /// Readiness for load balancers: 200 while serving, 503 while draining.
    Readyz,
    Metrics,
    MonitoringHealth,
    ResilienceReset,
    Resilience,
    Cooldowns,
    ModelCooldowns,
    /// `PATCH /api/providers/{connectionId}`.
    Connection,
}

/// The prefix of `PATCH /api/providers/{connectionId}`.
pub const CONNECTION_PREFIX: &str = "/api/providers/";

/// The admin route of a path and the methods it takes.
pub fn route(path: &str) -> Option<(&'static [Method], Route)> {
    use Method::{Delete, Get, Patch, Post};
    Some(match path {
        "/healthz" => (&[Get], Route::Healthz),
        "/readyz" => (&[Get], Route::Readyz),
        "/metrics" => (&[Get], Route::Metrics),
        "/api/monitoring/health" => (&[Get], Route::MonitoringHealth),
        "/api/resilience/reset" => (&[Post], Route::ResilienceReset),
        "/api/resilience" => (&[Get, Patch], Route::Resilience),
        "/api/resilience/cooldowns" => (&[Get, Post], Route::Cooldowns),
        "/api/resilience/model-cooldowns" => (&[Get, Delete], Route::ModelCooldowns),
        p if p
            .strip_prefix(CONNECTION_PREFIX)
            .is_some_and(|id| !id.is_empty() && !id.contains('/')) =>
        {
            (&[Patch], Route::Connection)
        }
        _ => return None,
    })
}

/// A management answer: (status, content type, body).
pub type Answer = (u16, &'static str, String);
