//! The management surface (`ARCHITECTURE.md` §5): liveness, the Prometheus exposition and
//! the management API with OmniRoute's paths and camelCase JSON. Every call that reads or
//! changes owner state is an owner call (`owners::health::client::admin`), to the one owner
//! of a connection or to every shard; settings changes replace the shared runtime settings
//! every shard adopts before its next request (`shard::settings`).

mod api;
mod connection;
pub mod patch;
mod routes;
pub mod scrape;

pub use routes::{Answer, Route, route};

use std::net::IpAddr;

use bytes::Bytes;

use crate::auth::{Caller, presented_key};
use crate::config::{Config, Scope};
use crate::error::{ErrorKind, GatewayError};
use crate::http1::RequestHead;
use crate::owners::Shard;

/// Answers an admin route. `peer` is the client's address (`None` if unknown: treated as
/// not loopback).
pub async fn serve(
    shard: &Shard,
    head: &RequestHead,
    route: Route,
    body: &Bytes,
    peer: Option<IpAddr>,
    caller: Caller,
) -> Result<Answer, GatewayError> {
    let generation = shard.current();
    let config = generation.config();
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
                shard.shards(),
                generation.shared().driver
            ),
        )),
        Route::Readyz => Ok((200, "application/json", "{\"status\":\"ready\"}".to_owned())),
        Route::Metrics => {
            authorize(config, head, peer, caller, Access::Metrics)?;
            Ok((
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                scrape::render(shard),
            ))
        }
        other => {
            authorize(config, head, peer, caller, Access::Manage)?;
            api::serve(shard, head, other, body).await
        }
    }
}

/// What a caller asks to reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `/api/*`.
    Manage,
    /// `/metrics`.
    Metrics,
}

fn is_loopback(peer: Option<IpAddr>) -> bool {
    match peer {
        Some(IpAddr::V4(a)) => a.is_loopback(),
        Some(IpAddr::V6(a)) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        None => false,
    }
}

/// Whether management credentials exist: the admin token or a key with scope `manage`.
fn credentials_configured(config: &Config) -> bool {
    config.server.admin_token.is_some()
        || config
            .client_keys
            .iter()
            .any(|k| k.has_scope(Scope::Manage))
}

/// The management API's access rule: the admin token, or a client key with scope
/// `manage`. With neither configured, loopback callers are answered without a credential
/// and every other caller is refused. `/metrics` also answers loopback callers without a
/// credential, and everyone when `server.metrics_public` is set.
pub fn decide(
    config: &Config,
    caller: Caller,
    presented: bool,
    peer: Option<IpAddr>,
    access: Access,
) -> Result<(), GatewayError> {
    if access == Access::Metrics && config.server.metrics_public {
        return Ok(());
    }
    let loopback = is_loopback(peer);
    match caller {
        Caller::Admin => return Ok(()),
        Caller::Key(i)
            if config
                .client_keys
                .get(i)
                .is_some_and(|k| k.has_scope(Scope::Manage)) =>
        {
            return Ok(());
        }
        Caller::Key(_) => {
            return Err(GatewayError::new(
                ErrorKind::Forbidden,
                "this key lacks the manage scope",
            ));
        }
        Caller::Open | Caller::Denied => {}
    }
    if !presented && loopback && (access == Access::Metrics || !credentials_configured(config)) {
        return Ok(());
    }
    if !credentials_configured(config) {
        // No credential can be valid. A loopback caller got here by presenting one anyway;
        // anyone else is not on loopback.
        let rule = if loopback {
            "loopback callers are answered without an Authorization header"
        } else {
            "the management API answers only loopback callers"
        };
        // The token's variable named in the file but missing from the environment.
        let why = match &config.server.admin_token_env {
            Some(var) => format!(
                "{rule}: {var} (server.admin_token_env) is not set in the gateway's \
                 environment and no client key has scope manage"
            ),
            None => format!(
                "{rule} until server.admin_token_env or a client key with scope manage is \
                 configured"
            ),
        };
        return Err(GatewayError::new(ErrorKind::Forbidden, why));
    }
    let why = if presented {
        "invalid admin token or key"
    } else {
        "the management API needs the admin token or a key with scope manage \
         (Authorization: Bearer <token>)"
    };
    Err(GatewayError::new(ErrorKind::Unauthorized, why))
}

fn authorize(
    config: &Config,
    head: &RequestHead,
    peer: Option<IpAddr>,
    caller: Caller,
    access: Access,
) -> Result<(), GatewayError> {
    decide(config, caller, presented_key(head).is_some(), peer, access)
}

/// Who makes a management call, for the access line's `key=`: a client key's id, or
/// `admin-token` (`None`: no credential, or one that matched nothing).
pub fn caller_id(config: &Config, caller: Caller) -> Option<&str> {
    match caller {
        Caller::Key(i) => config.client_keys.get(i).map(|k| k.id.as_str()),
        Caller::Admin => Some(ADMIN_TOKEN_CALLER),
        Caller::Open | Caller::Denied => None,
    }
}

/// The access line's `key` for a call made with the admin token.
const ADMIN_TOKEN_CALLER: &str = "admin-token";

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn config(text: &str) -> Config {
        crate::config::load_str(text, &|v| (v == "TG_ADMIN").then(|| "tok".to_owned()))
            .map(|o| o.config)
            .unwrap_or_else(|e| panic!("config: {e}"))
    }

    const OTHER: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    const LOCAL: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));

    #[test]
    fn with_no_credentials_configured_only_loopback_is_answered() {
        let c = config("");
        assert!(decide(&c, Caller::Open, false, LOCAL, Access::Manage).is_ok());
        let v6 = Some(IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert!(decide(&c, Caller::Open, false, v6, Access::Manage).is_ok());
        let mapped = Some(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()));
        assert!(decide(&c, Caller::Open, false, mapped, Access::Manage).is_ok());
        let e = decide(&c, Caller::Open, false, OTHER, Access::Manage).err();
        assert_eq!(e.map(|e| e.kind), Some(ErrorKind::Forbidden));
        let e = decide(&c, Caller::Open, false, None, Access::Manage).err();
        assert_eq!(e.map(|e| e.kind), Some(ErrorKind::Forbidden));
        // A loopback caller presenting a credential none could match is told so (not that
        // only loopback is answered: it is on loopback).
        let e = decide(&c, Caller::Denied, true, LOCAL, Access::Manage)
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::Forbidden);
        assert!(
            e.message
                .starts_with("loopback callers are answered without an Authorization"),
            "{}",
            e.message
        );
    }

    #[test]
    fn once_a_token_is_configured_every_manage_caller_needs_one() {
        let c = config("[server]\nadmin_token_env = \"TG_ADMIN\"\n");
        let e = decide(&c, Caller::Open, false, LOCAL, Access::Manage).err();
        assert_eq!(e.map(|e| e.kind), Some(ErrorKind::Unauthorized));
        let e = decide(&c, Caller::Open, true, OTHER, Access::Manage).err();
        assert_eq!(e.map(|e| e.kind), Some(ErrorKind::Unauthorized));
        assert!(decide(&c, Caller::Admin, true, OTHER, Access::Manage).is_ok());
        // Metrics: loopback without a token, others with it, everyone when public.
        assert!(decide(&c, Caller::Open, false, LOCAL, Access::Metrics).is_ok());
        let e = decide(&c, Caller::Open, false, OTHER, Access::Metrics).err();
        assert_eq!(e.map(|e| e.kind), Some(ErrorKind::Unauthorized));
        assert!(decide(&c, Caller::Admin, true, OTHER, Access::Metrics).is_ok());
        let public = config("[server]\nadmin_token_env = \"TG_ADMIN\"\nmetrics_public = true\n");
        assert!(decide(&public, Caller::Open, false, OTHER, Access::Metrics).is_ok());
        assert!(decide(&public, Caller::Open, false, OTHER, Access::Manage).is_err());
    }
}
