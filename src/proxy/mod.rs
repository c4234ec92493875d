//! `handle()`: the request phases of `docs/phases.md`, one function per phase —
//! route, authenticate, peek, resolve, select, forward, relay — each returning an owned
//! decision. Errors become responses only in `respond`.

pub mod access;
pub mod affinity;
pub mod classify;
pub mod combo;
pub mod continuation;
pub mod deadline;
pub mod forward;
pub mod lease;
pub mod models;
pub mod observe;
pub mod peek;
pub mod relay;
pub mod respond;
pub mod select;
pub mod strategy;
pub mod stream;
pub mod translate;
pub mod upstream;
pub mod watchdog;

use crate::net::io::ClientStream;
use bytes::{Bytes, BytesMut};

use crate::admin;
use crate::auth::Caller;
use crate::config::{ComboStrategy, Scope};
use crate::error::{Dialect, ErrorKind, GatewayError};
use crate::http1::{Method, Persist, RequestHead};
pub use crate::net::downstream::After;
use crate::net::downstream::{Handler, Limits, Served};
use crate::net::io::write_all;
use crate::owners::{Req, Shard};
use crate::providers::translate::Translation;
use crate::providers::{Endpoint, serves};
use crate::routing::resolve::resolve;
use crate::shard::metrics::{bump, drop_one};

use relay::Plan;
use respond::{keep_alive_now, note_error, send_error};

/// A shard serves its client connections: `net` reads requests, `handle` answers them.
impl Handler for Shard {
    type Request<'a> = Req<'a>;

    fn limits(&self) -> Limits {
        limits_of(&self.current().config().server)
    }

    fn body_limits(&self, request: &Req<'_>) -> Limits {
        limits_of(&request.config().server)
    }

    fn now_ns(&self) -> u64 {
        // The monotonic clock only: a read between requests (the keep-alive wait's
        // deadline) is outside any request's poll, and `now()` would read the wall clock
        // too (`clock::read_now`).
        self.mono_ns()
    }

    fn is_draining(&self) -> bool {
        Shard::is_draining(self)
    }

    fn connection_opened(&self) {
        bump(&self.metrics().connections_accepted);
        bump(&self.metrics().connections_open);
    }

    fn connection_closed(&self) {
        drop_one(&self.metrics().connections_open);
    }

    fn request_started(&self) -> Self::Request<'_> {
        // Runtime settings changed by the management API apply from this request on.
        self.refresh();
        bump(&self.metrics().requests);
        // The request takes the current configuration and keeps it to its end.
        Req::enter(self)
    }

    async fn handle(
        &self,
        req: &Self::Request<'_>,
        head: &RequestHead,
        body: Bytes,
        client: &mut ClientStream,
        pending: &mut BytesMut,
    ) -> Served {
        let route = observe::route_index(head.path());
        let started = self.now().mono_ns;
        let after = handle(req, head, body, client, pending).await;
        let f = req.families();
        f.requests.add(route, 1);
        // The last poll's reading: the request's duration, and the start of the connection's
        // idle wait for its next request.
        let end_ns = self.now().mono_ns;
        f.request_duration
            .observe_ns(route, end_ns.saturating_sub(started));
        Served { after, end_ns }
    }

    async fn reject(
        &self,
        head: Option<&RequestHead>,
        client: &mut ClientStream,
        err: &GatewayError,
    ) {
        let Some(head) = head else {
            send_error(self, client, err, Dialect::OpenAi, Persist::Close, None).await;
            return;
        };
        // A request refused while its body was read (413, a broken chunked body) has its
        // access-log line: its head is known, and its key when the key is valid.
        let current = self.current();
        let config = current.config();
        let log = access::AccessLog::under(self, config, head);
        if let Caller::Key(i) = current.shared().keys.identify(head)
            && let Some(k) = config.client_keys.get(i)
        {
            log.key(&k.id);
        }
        send_error(self, client, err, dialect(head), Persist::Close, Some(&log)).await;
        log.emit(self, head);
    }
}

fn limits_of(s: &crate::config::ServerConfig) -> Limits {
    Limits {
        idle_timeout_ms: s.idle_timeout_ms,
        header_timeout_ms: s.header_timeout_ms,
        max_request_body_bytes: s.max_request_body_bytes,
    }
}

/// The routes the gateway answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Inference(Endpoint),
    Models,
    /// `GET /v1/models/{id}`; the id is the rest of the path.
    Model,
    /// `POST /api/v1/session-leases` (B §5.2).
    SessionLeases,
    Admin(admin::Route),
}

const MODELS_PATH: &str = "/v1/models";

/// The error shape a request's client expects: Anthropic's on the Messages API, OpenAI's
/// everywhere else.
pub fn dialect(head: &RequestHead) -> Dialect {
    let path = head.path();
    match path.strip_prefix("/v1/messages") {
        Some("") => Dialect::Anthropic,
        Some(rest) if rest.starts_with('/') => Dialect::Anthropic,
        _ => Dialect::OpenAi,
    }
}

fn route(head: &RequestHead) -> Result<Route, GatewayError> {
    let path = head.path();
    let method = head.method();
    // `allow`: the `Allow` value when the path answers more methods than `m` (and `HEAD`).
    let want_also = |m: Method, allow: Option<&'static str>, r: Route| {
        if method == m || (m == Method::Get && method == Method::Head) {
            Ok(r)
        } else {
            let allow = match (m == Method::Get, allow) {
                (true, _) => "GET, HEAD",
                (false, Some(allow)) => allow,
                (false, None) => m.as_str(),
            };
            Err(GatewayError::new(
                ErrorKind::MethodNotAllowed,
                format!("{path} does not take {}", head.method_str()),
            )
            .with_header("allow", allow))
        }
    };
    let want = |m: Method, r: Route| want_also(m, None, r);
    if let Some(ep) = Endpoint::from_path(path) {
        return want(Method::Post, Route::Inference(ep));
    }
    if path == MODELS_PATH {
        return want(Method::Get, Route::Models);
    }
    if path == lease::LEASES_PATH {
        // It answers `OPTIONS` itself (`lease_options`), so `Allow` names it too.
        return want_also(Method::Post, Some("POST, OPTIONS"), Route::SessionLeases);
    }
    if path
        .strip_prefix(MODELS_PATH)
        .and_then(|r| r.strip_prefix('/'))
        .is_some_and(|id| !id.is_empty())
    {
        return want(Method::Get, Route::Model);
    }
    if let Some((methods, r)) = admin::route(path) {
        let takes = |m: Method| m == method || (m == Method::Get && method == Method::Head);
        if methods.iter().any(|m| takes(*m)) {
            return Ok(Route::Admin(r));
        }
        let allow: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
        return Err(GatewayError::new(
            ErrorKind::MethodNotAllowed,
            format!("{path} does not take {}", head.method_str()),
        )
        .with_header("allow", allow.join(", ")));
    }
    Err(GatewayError::new(
        ErrorKind::RouteNotFound,
        format!("no route for {path}"),
    ))
}

/// Serves one request whose head and body have been read, writing the whole response.
pub async fn handle(
    shard: &Req<'_>,
    head: &RequestHead,
    body: Bytes,
    client: &mut ClientStream,
    pending: &mut BytesMut,
) -> After {
    // Whether the connection stays open is decided when the response head is written
    // (`keep_alive_now`), since shutdown may begin while the request is served.
    // An HTTP/1.0 request kept open hears so in every answer (`Persist::Echo`).
    let keep_alive = head.persist();
    let log = access::AccessLog::new(shard, head);
    // A preflight is an `OPTIONS` with `Origin`; one without is routed as any other request
    // (405 with `Allow` on a known path), as when CORS is off.
    if head.method() == Method::Options
        && head.header("origin").is_some()
        && !shard.config().server.cors_allow_origins.is_empty()
    {
        let after = preflight(shard, head, client, keep_alive, &log).await;
        log.emit(shard, head);
        return after;
    }
    // The lease endpoint answers `OPTIONS` itself, naming the lease headers (B §5.2).
    if head.method() == Method::Options && head.path() == lease::LEASES_PATH {
        let after = lease_options(shard, client, keep_alive, &log).await;
        log.emit(shard, head);
        return after;
    }
    let result = match route(head) {
        Ok(Route::Inference(ep)) => {
            let after = inference(shard, head, ep, body, client, pending, keep_alive, &log).await;
            log.emit(shard, head);
            return after;
        }
        Ok(Route::Models) => authorize(shard, head, Scope::Inference, &log)
            .map(|_| models::list(shard.config(), &shard.shared().routes)),
        Ok(Route::Model) => authorize(shard, head, Scope::Inference, &log).and_then(|_| {
            let id = head.path().get(MODELS_PATH.len() + 1..).unwrap_or_default();
            models::retrieve(shard.config(), &shard.shared().routes, id)
        }),
        Ok(Route::SessionLeases) => {
            if let Caller::Key(i) = shard.caller(head)
                && let Some(k) = shard.config().client_keys.get(i)
            {
                log.key(&k.id);
            }
            lease::serve(shard, head, &body).await
        }
        Ok(Route::Admin(r)) => {
            let peer = client.peer_addr().ok().map(|a| a.ip());
            // Identified once: for the access line and for the access decision.
            let caller = shard.shared().keys.identify(head);
            if let Some(who) = admin::caller_id(shard.config(), caller) {
                log.key(who);
            }
            admin::serve(shard, head, r, &body, peer, caller).await
        }
        Err(e) => Err(e),
    };
    let keep_alive = keep_alive_now(shard, keep_alive);
    let mut out = BytesMut::with_capacity(512);
    let head_only = head.method() == Method::Head;
    match result {
        Ok((status, content_type, body)) => {
            shard.metrics().response(status);
            log.responding(shard, status);
            let extra = log.response_headers();
            let b = body.as_bytes();
            respond::write_body(
                &mut out,
                status,
                content_type,
                b,
                keep_alive,
                head_only,
                &extra,
            );
        }
        Err(err) => {
            note_error(shard, &err);
            log.failed(shard, &err);
            let extra = log.response_headers();
            respond::write_error(&mut out, &err, dialect(head), keep_alive, head_only, &extra);
        }
    }
    log.sent(out.len());
    log.emit(shard, head);
    match write_all(client, out).await {
        Ok(_) if keep_alive.is_kept() => After::KeepAlive,
        _ => After::Close,
    }
}

/// Request fields a browser may send when `server.cors_allow_origins` does not echo its own.
const CORS_ALLOW_HEADERS: &str = "authorization, content-type, x-api-key, anthropic-version, \
     anthropic-beta, x-request-id, x-omniroute-lease-owner, x-omniroute-lease-generation";

/// A CORS preflight (`OPTIONS` with `Origin`): 204 with the allowed methods and fields when
/// the origin is allowed, 403 otherwise.
async fn preflight(
    shard: &Req<'_>,
    head: &RequestHead,
    client: &mut ClientStream,
    keep_alive: Persist,
    log: &access::AccessLog,
) -> After {
    let keep_alive = keep_alive_now(shard, keep_alive);
    let Some(origin) = &log.cors_origin else {
        let err = GatewayError::new(
            ErrorKind::Forbidden,
            "this origin is not in server.cors_allow_origins",
        );
        return send_error(shard, client, &err, dialect(head), keep_alive, Some(log)).await;
    };
    let requested = head
        .header("access-control-request-headers")
        .filter(|v| v.iter().all(|b| b.is_ascii_graphic() || *b == b' '))
        .unwrap_or(CORS_ALLOW_HEADERS.as_bytes());
    let headers: [(&str, &[u8]); 6] = [
        ("access-control-allow-origin", origin.as_bytes()),
        ("access-control-allow-methods", b"GET, POST, OPTIONS"),
        ("access-control-allow-headers", requested),
        ("access-control-max-age", b"600"),
        (
            "vary",
            b"origin, access-control-request-method, access-control-request-headers",
        ),
        (access::REQUEST_ID_HEADER, log.id.as_bytes()),
    ];
    no_content(shard, client, &headers, keep_alive, log).await
}

/// `OPTIONS /api/v1/session-leases`: 204, allowing `POST` and the lease headers.
async fn lease_options(
    shard: &Req<'_>,
    client: &mut ClientStream,
    keep_alive: Persist,
    log: &access::AccessLog,
) -> After {
    let keep_alive = keep_alive_now(shard, keep_alive);
    let headers: [(&str, &[u8]); 3] = [
        ("access-control-allow-methods", b"POST, OPTIONS"),
        (
            "access-control-allow-headers",
            lease::LEASE_ALLOW_HEADERS.as_bytes(),
        ),
        (access::REQUEST_ID_HEADER, log.id.as_bytes()),
    ];
    no_content(shard, client, &headers, keep_alive, log).await
}

/// Answers 204 with `headers` (an `OPTIONS` answer), counted and logged.
async fn no_content(
    shard: &Req<'_>,
    client: &mut ClientStream,
    headers: &[(&str, &[u8])],
    keep_alive: Persist,
    log: &access::AccessLog,
) -> After {
    let mut out = BytesMut::with_capacity(512);
    crate::http1::write_response_head(
        &mut out,
        204,
        headers.iter().copied(),
        crate::http1::Framing::NoBody,
        keep_alive,
    );
    shard.metrics().response(204);
    log.responding(shard, 204);
    log.sent(out.len());
    match write_all(client, out).await {
        Ok(_) if keep_alive.is_kept() => After::KeepAlive,
        _ => After::Close,
    }
}

/// Checks the caller may use `scope`; returns the client key index when a key was used.
/// A valid key is logged, even one refused for want of the scope.
fn authorize(
    shard: &Req<'_>,
    head: &RequestHead,
    scope: Scope,
    log: &access::AccessLog,
) -> Result<Option<usize>, GatewayError> {
    match shard.caller(head) {
        Caller::Open => Ok(None),
        Caller::Admin if scope == Scope::Manage => Ok(None),
        Caller::Admin => Err(GatewayError::new(
            ErrorKind::Forbidden,
            "the admin token is for the management API",
        )),
        Caller::Key(i) => {
            let key = shard.config().client_keys.get(i);
            if let Some(k) = key {
                log.key(&k.id);
            }
            if key.is_some_and(|k| k.has_scope(scope)) {
                Ok(Some(i))
            } else {
                Err(GatewayError::new(
                    ErrorKind::Forbidden,
                    "this key lacks the scope for this endpoint",
                ))
            }
        }
        Caller::Denied => Err(GatewayError::new(
            ErrorKind::Unauthorized,
            "missing or invalid API key (Authorization: Bearer <key> or x-api-key)",
        )),
    }
}

#[allow(clippy::too_many_arguments)]
async fn inference(
    shard: &Req<'_>,
    head: &RequestHead,
    endpoint: Endpoint,
    body: Bytes,
    client: &mut ClientStream,
    pending: &mut BytesMut,
    keep_alive: Persist,
    log: &access::AccessLog,
) -> After {
    let mut plan = match plan(shard, head, endpoint, &body, log) {
        Ok(plan) => plan,
        Err(err) => {
            return send_error(shard, client, &err, dialect(head), keep_alive, Some(log)).await;
        }
    };
    // A lease-managed key's request passes its lease's fence first (B §5.4); boxed (built
    // in its box), so other requests' futures hold no room for the call to the lease owner.
    if lease::is_managed(shard.config(), plan.key) {
        let fenced = Box::into_pin(Box::write(
            Box::new_uninit(),
            lease::fence(shard, head, &mut plan),
        ))
        .await;
        if let Err(err) = fenced {
            return send_error(shard, client, &err, dialect(head), keep_alive, Some(log)).await;
        }
    }
    // When the shutdown grace period ends before anything was written to the client, the
    // request is answered 503 `shutting_down` (a stream under way ends in `stream::commit`).
    let committed = std::cell::Cell::new(false);
    {
        let downstream = relay::Downstream {
            client: &mut *client,
            pending,
            keep_alive,
            dialect: dialect(head),
            committed: &committed,
            log,
            splice: None,
        };
        // The plan stays here and is lent: moved into the work below (and on into
        // `relay::run`), each hand copied all of it.
        let ended = match plan.combo {
            // A combo runs by its settings (retries, failover order, timeouts, waits);
            // boxed, so a direct request's future holds no room for a combo's runner.
            // Allocated first, then built in place (as `net::downstream::serve`).
            Some(combo) => {
                let mut work = Box::into_pin(Box::write(
                    Box::new_uninit(),
                    combo::serve(shard, head, endpoint, body, &mut plan, combo, downstream),
                ));
                unless_cut(shard, &committed, work.as_mut()).await
            }
            // Pinned where it is made: awaited inside an `async` block (or awaited by
            // value), the 5 KiB future was copied twice on its way into this one.
            None => {
                let work = std::pin::pin!(relay::run(
                    shard, head, endpoint, body, &mut plan, downstream
                ));
                unless_cut(shard, &committed, work).await
            }
        };
        if let Some(after) = ended {
            return after;
        }
    }
    let err = GatewayError::new(
        ErrorKind::ShuttingDown,
        "the gateway is shutting down: the request did not finish within the grace period",
    );
    send_error(shard, client, &err, dialect(head), keep_alive, Some(log)).await
}

/// Runs `work` to its end (`Some`), unless the shutdown grace period ends before anything
/// was written to the client (`None`: the caller answers 503 `shutting_down`).
async fn unless_cut<F: std::future::Future<Output = After>>(
    shard: &Req<'_>,
    committed: &std::cell::Cell<bool>,
    mut work: std::pin::Pin<&mut F>,
) -> Option<After> {
    let mut cut = std::pin::pin!(shard.cut_signal());
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(after) = work.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(after));
        }
        if !committed.get() && cut.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(None);
        }
        std::task::Poll::Pending
    })
    .await
}

/// Authenticate → peek → resolve → select.
fn plan(
    shard: &Req<'_>,
    head: &RequestHead,
    endpoint: Endpoint,
    body: &[u8],
    log: &access::AccessLog,
) -> Result<Plan, GatewayError> {
    let key = authorize(shard, head, Scope::Inference, log)?;
    let config = shard.config();
    let peek = {
        let mut scratch = shard.scratch().borrow_mut();
        peek::peek(body, &mut scratch).map_err(peek_error)?
    };
    // Logged before it is resolved: a model no route serves is in its 404's line.
    log.model(&peek.model);
    let resolved = resolve(config, &shard.shared().routes, &peek.model)?;
    if let Some(c) = resolved.combo.and_then(|i| config.combos.get(i)) {
        log.combo(&c.name);
    }
    // Sized for one connection per target (the common case): no regrowth on the first push.
    let mut candidates = Vec::with_capacity(resolved.targets.len());
    let mut any_enabled = false;
    let mut any_format = false;
    for t in resolved.targets {
        let provider = config.provider(t.provider);
        // A provider of the other format is reached through translation.
        let reachable =
            serves(provider, endpoint) || Translation::between(endpoint, provider).is_some();
        if !reachable {
            continue;
        }
        any_format = true;
        let connections = shard.shared().routes.connections(t.provider);
        any_enabled |= !connections.is_empty();
        let client = key.and_then(|i| config.client_keys.get(i));
        let mut allowed = connections
            .iter()
            .copied()
            .filter(|c| client.is_none_or(|k| k.may_use(*c)))
            .peekable();
        // The target goes with its last candidate; only the others take a copy of it
        // (one connection per target, the common case, copies no model name).
        while let Some(c) = allowed.next() {
            if allowed.peek().is_some() {
                candidates.push((t.clone(), c));
            } else {
                candidates.push((t, c));
                break;
            }
        }
    }
    // `x-omniroute-connection` forces one connection (B §4): unknown or unusable is a hard
    // failure, and the session's pin is not consulted.
    let forced = forced_connection(config, head)?;
    if let Some(c) = forced {
        candidates.retain(|(_, candidate)| *candidate == c);
        if candidates.is_empty() {
            return Err(GatewayError::new(
                ErrorKind::ConnectionNotUsable,
                format!(
                    "x-omniroute-connection: connection {:?} cannot serve model {:?} here \
                     (another provider's, disabled, or not allowed for this key)",
                    config.connection(c).name,
                    peek.model
                ),
            ));
        }
    }
    if candidates.is_empty() {
        let (kind, why) = if !any_format {
            (
                ErrorKind::EndpointNotSupported,
                format!("no provider of model {:?} serves this endpoint", peek.model),
            )
        } else if !any_enabled {
            // The error path only: resolved again to name the variables of its providers.
            let providers: Vec<_> = resolve(config, &shard.shared().routes, &peek.model)
                .map(|r| r.targets.into_iter().map(|t| t.provider).collect())
                .unwrap_or_default();
            let unset = crate::config::exposure::unset_key_variables(
                config
                    .connections
                    .iter()
                    .filter(|c| providers.contains(&c.provider)),
            );
            let why = if unset.is_empty() {
                format!("model {:?} has no enabled connection", peek.model)
            } else {
                format!(
                    "model {:?} has no enabled connection: {unset} not set in the gateway's \
                     environment",
                    peek.model
                )
            };
            (ErrorKind::NoConnection, why)
        } else {
            (
                ErrorKind::Forbidden,
                format!(
                    "this key may not use any connection of model {:?}",
                    peek.model
                ),
            )
        };
        return Err(GatewayError::new(kind, why));
    }
    let quota_share = resolved
        .combo
        .filter(|i| config.combos[*i].strategy == ComboStrategy::QuotaShare);
    let session = if forced.is_none() {
        crate::owners::affinity::client::session_of(shard, head, body)
    } else {
        None
    };
    Ok(Plan {
        peek,
        candidates,
        combo: resolved.combo,
        quota_share,
        session,
        key,
    })
}

/// The connection `x-omniroute-connection` names, if the header is there.
fn forced_connection(
    config: &crate::config::Config,
    head: &RequestHead,
) -> Result<Option<crate::config::ConnectionId>, GatewayError> {
    let Some(raw) = head.header("x-omniroute-connection") else {
        return Ok(None);
    };
    let name = String::from_utf8_lossy(raw);
    let name = name.trim();
    match config.connections.iter().find(|c| c.name == name) {
        Some(c) => Ok(Some(c.id)),
        None => {
            let shown: String = name.chars().take(64).collect();
            Err(GatewayError::new(
                ErrorKind::UnknownConnection,
                format!("x-omniroute-connection: no connection is named {shown:?}"),
            )
            .with_extra("param", serde_json::json!("x-omniroute-connection")))
        }
    }
}

fn peek_error(e: peek::PeekError) -> GatewayError {
    if e == peek::PeekError::MissingModel {
        // OpenAI's own wording for a body without a model.
        return GatewayError::new(
            ErrorKind::MissingModel,
            "you must provide a model parameter",
        )
        .with_extra("param", serde_json::json!("model"));
    }
    GatewayError::new(ErrorKind::InvalidJson, peek_message(&e))
}

fn peek_message(e: &peek::PeekError) -> String {
    match e {
        peek::PeekError::InvalidJson(why) => format!("request body is not valid JSON: {why}"),
        peek::PeekError::NotAnObject => "request body must be a JSON object".to_owned(),
        peek::PeekError::MissingModel => "request body has no \"model\"".to_owned(),
        peek::PeekError::ModelNotString => "\"model\" must be a string".to_owned(),
        peek::PeekError::StreamNotBool => "\"stream\" must be a boolean".to_owned(),
    }
}
