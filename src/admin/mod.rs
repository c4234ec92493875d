//! The management surface: liveness and the Prometheus exposition. (The resilience
//! management API of `ARCHITECTURE.md` §5 joins here as its mechanisms land.)

use crate::auth::Caller;
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{Method, RequestHead};
use crate::owners::Shard;
use crate::shard::metrics;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Healthz,
    /// Readiness for load balancers: 200 while serving, 503 while draining.
    Readyz,
    Metrics,
}

/// The admin route of a path, with the method it takes.
pub fn route(path: &str) -> Option<(Method, Route)> {
    match path {
        "/healthz" => Some((Method::Get, Route::Healthz)),
        "/readyz" => Some((Method::Get, Route::Readyz)),
        "/metrics" => Some((Method::Get, Route::Metrics)),
        _ => None,
    }
}

/// Answers an admin route: (status, content type, body).
pub fn serve(
    shard: &Shard,
    head: &RequestHead,
    route: Route,
) -> Result<(u16, &'static str, String), GatewayError> {
    match route {
        // While the shard drains for shutdown both say `draining`, so a load balancer
        // stops sending before the connections close.
        Route::Healthz | Route::Readyz if shard.is_draining() => Ok((
            503,
            "application/json",
            "{\"status\":\"draining\"}".to_owned(),
        )),
        Route::Healthz => Ok((
            200,
            "application/json",
            format!(
                "{{\"status\":\"ok\",\"shards\":{},\"driver\":\"{}\"}}",
                shard.shared().shards,
                shard.shared().driver
            ),
        )),
        Route::Readyz => Ok((200, "application/json", "{\"status\":\"ready\"}".to_owned())),
        Route::Metrics => {
            authorize_manage(shard, head)?;
            Ok((
                200,
                "text/plain; version=0.0.4",
                metrics::render(
                    &shard.shared().metrics,
                    shard.shared().mesh_stats.as_deref(),
                ),
            ))
        }
    }
}

/// The admin token, or a client key with scope `manage` (open when no keys and no token
/// are configured).
pub fn authorize_manage(shard: &Shard, head: &RequestHead) -> Result<(), GatewayError> {
    let open = shard.config().server.admin_token.is_none();
    match shard.shared().keys.identify(head) {
        Caller::Admin => Ok(()),
        Caller::Open if open => Ok(()),
        Caller::Key(i)
            if shard
                .config()
                .client_keys
                .get(i)
                .is_some_and(|k| k.has_scope(crate::config::Scope::Manage)) =>
        {
            Ok(())
        }
        Caller::Key(_) => Err(GatewayError::new(
            ErrorKind::Forbidden,
            "this key lacks the manage scope",
        )),
        Caller::Open | Caller::Denied => Err(GatewayError::new(
            ErrorKind::Unauthorized,
            "management endpoints need the admin token or a key with scope manage",
        )),
    }
}
