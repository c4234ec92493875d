//! Relay of an answer from a provider of the other format (`providers::translate`): a
//! complete answer is read whole (bounded) and written translated with its own length; an
//! event stream goes through a [`StreamTranslator`] piece by piece, chunked. The stall
//! watchdog scans the upstream's own events; a failure after the first byte ends the stream
//! with an in-band error in the client's shape, as for untranslated streams — or, with
//! mid-stream continuation on, leaves it to the next candidate (the translated events go
//! through the continuation splice, which works on the client's format).

use std::pin::pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::access::AccessLog;
use super::continuation::Splice;
use super::deadline::Deadline;
use super::stream::{self, Buffered, break_stream, emit, relayed_never};
use super::upstream::Up;
use super::watchdog::{self, Watchdog};
use super::{After, respond};
use crate::config::{Connection, Provider};
use crate::error::{Dialect, ErrorKind, GatewayError};
use crate::http1::{Framing, Persist, RequestHead, write_last_chunk, write_response_head};
use crate::net::downstream::unless_client_gone;
use crate::net::io::{ClientStream, write_all};
use crate::owners::Req;
use crate::owners::health::protocol::Ended;
use crate::providers::Endpoint;
use crate::providers::translate::responses::{self, Echo};
use crate::providers::translate::stream::StreamTranslator;
use crate::providers::translate::{Refused, Translation, error, request, response};
use crate::shard::metrics::{Abandoned, bump};
use crate::sse::usage::Usage;

/// Longest complete (non-stream) answer read for translation.
const MAX_TRANSLATED_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The header naming the translation an answer went through.
pub const TRANSLATED_HEADER: &str = "x-tidegate-translated";

/// What the answer's translation needs to know about the request.
#[derive(Clone, Debug, Default)]
pub struct Carry {
    /// An OpenAI chat client asked for the usage chunk.
    pub include_usage: bool,
    /// A Responses client: the settings its response objects repeat.
    pub echo: Echo,
}

/// A request body translated for the provider, and what its answer's translation needs.
pub fn request_body(
    t: Translation,
    body: &[u8],
    model: &str,
) -> Result<(Bytes, Carry), GatewayError> {
    let plain = |tr: request::Translated| {
        let carry = Carry {
            include_usage: tr.include_usage,
            echo: Echo::default(),
        };
        (Bytes::from(tr.body), carry)
    };
    let with_echo = |(body, echo): (Vec<u8>, Echo)| {
        let carry = Carry {
            include_usage: false,
            echo,
        };
        (Bytes::from(body), carry)
    };
    let done = match t {
        Translation::ChatToMessages => request::chat_to_messages(body, model).map(plain),
        Translation::MessagesToChat => request::messages_to_chat(body, model).map(plain),
        Translation::ResponsesToChat => {
            responses::translate_request(body, model, false).map(with_echo)
        }
        Translation::ResponsesToMessages => {
            responses::translate_request(body, model, true).map(with_echo)
        }
    };
    done.map_err(|r| refused(t, r))
}

fn refused(t: Translation, r: Refused) -> GatewayError {
    let target = match t {
        Translation::ChatToMessages | Translation::ResponsesToMessages => {
            "an Anthropic-format provider"
        }
        Translation::MessagesToChat => "an OpenAI-format provider",
        Translation::ResponsesToChat => "a Chat-Completions-only provider",
    };
    GatewayError::new(
        ErrorKind::UntranslatableRequest,
        format!("{} (the request was to be translated for {target})", r),
    )
    .with_extra("param", serde_json::json!(r.field))
}

/// Re-shapes a buffered upstream error answer into the client's error format; the status
/// is kept.
pub fn reshape_error(b: &mut Buffered, t: Translation) {
    b.body = Bytes::from(error::reshape(&b.body, b.status, t));
    b.headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case("content-type"));
    b.headers
        .push(("content-type".to_owned(), b"application/json".to_vec()));
    b.headers
        .push((TRANSLATED_HEADER.to_owned(), t.label().as_bytes().to_vec()));
}

/// What [`commit`] needs besides the upstream answer.
pub struct Translated<'a> {
    pub translation: Translation,
    pub carry: Carry,
    pub provider: &'a Provider,
    pub conn: &'a Connection,
    pub attempts: usize,
    pub idle: Duration,
}

fn dialect(t: Translation) -> Dialect {
    match t {
        Translation::MessagesToChat => Dialect::Anthropic,
        _ => Dialect::OpenAi,
    }
}

/// Relays a 2xx answer from a provider of the other format, translated, and finalizes
/// once however it ended: the usage the upstream reported (in its own format, read by the
/// watchdog for a stream, from the whole body otherwise) goes into the token counters.
/// With mid-stream continuation on, the translated events go through the `splice` (in the
/// client's format), as an untranslated stream's bytes do in `stream::commit`: a cut after
/// the first byte leaves the stream open for the next candidate, and a continuation part
/// (of this format) writes into the client's open stream.
#[allow(clippy::too_many_arguments)]
pub async fn commit(
    shard: &Req<'_>,
    client_head: &RequestHead,
    up: Up,
    first: Option<Bytes>,
    tr: Translated<'_>,
    client: &mut ClientStream,
    pending: &mut BytesMut,
    keep_alive: Persist,
    wd: &mut Option<Watchdog>,
    log: &AccessLog,
    active: Option<Deadline>,
    mut splice: Option<&mut Splice>,
) -> (After, Ended) {
    let keep_alive = respond::keep_alive_now(shard, keep_alive);
    let created = shard.now().wall_ms / 1000;
    let continuing = splice.as_deref().is_some_and(Splice::continuing);
    if !up.is_event_stream() {
        if let Some(s) = splice.as_deref_mut() {
            if continuing {
                // The client's stream is open: a whole answer cannot go into it.
                let e = GatewayError::new(
                    ErrorKind::UpstreamProtocol,
                    "the continuation's answer is not an event stream",
                );
                if s.cut_by(&e) {
                    return (After::Close, stream::broken(&e));
                }
            }
            s.turn_off();
        }
        return commit_whole(shard, up, first, &tr, client, keep_alive, created, log).await;
    }
    let io = (client, pending);
    let ended = commit_stream(
        shard,
        client_head,
        up,
        first,
        tr,
        io,
        keep_alive,
        wd,
        log,
        active,
        splice.as_deref_mut(),
    )
    .await;
    if let (Some(s), Some(w)) = (splice.as_deref_mut(), wd.as_ref())
        && s.cut_pending()
    {
        s.upstream_prompt(w.usage().prompt_tokens);
    }
    // A spliced stream counts the usage of the whole answer once, when it is over.
    match splice {
        Some(s) if s.spliced() => {
            if !s.cut_pending() {
                s.count_usage(shard);
            }
        }
        _ => stream::count_usage(shard, wd.as_ref().map(Watchdog::usage)),
    }
    ended
}

#[allow(clippy::too_many_arguments)]
async fn commit_stream(
    shard: &Req<'_>,
    client_head: &RequestHead,
    mut up: Up,
    first: Option<Bytes>,
    tr: Translated<'_>,
    (client, pending): (&mut ClientStream, &mut BytesMut),
    keep_alive: Persist,
    wd: &mut Option<Watchdog>,
    log: &AccessLog,
    active: Option<Deadline>,
    mut splice: Option<&mut Splice>,
) -> (After, Ended) {
    let created = shard.now().wall_ms / 1000;
    let status = up.head.status();
    let t = tr.translation;
    let http11 = client_head.minor_version() == 1;
    // A continuation writes into the client's open stream: no head, its chunked framing.
    let continuing = splice.as_deref().is_some_and(Splice::continuing);
    let (framing, keep_alive) = if continuing {
        (
            Framing::Chunked,
            splice.as_deref().map_or(Persist::Close, Splice::keep_alive),
        )
    } else if http11 {
        (Framing::Chunked, keep_alive)
    } else {
        (Framing::Close, Persist::Close)
    };
    let chunked = framing == Framing::Chunked;
    if let Some(s) = splice.as_deref_mut()
        && !continuing
    {
        s.set_keep_alive(keep_alive);
        if !chunked {
            s.turn_off();
        }
    }
    let attempts_s = tr.attempts.to_string();
    let mut out = BytesMut::with_capacity(1024);
    if !continuing {
        let fields = up.head.fields();
        let relayed = fields
            .into_iter()
            .filter(|(n, _)| !relayed_never(n) && !n.eq_ignore_ascii_case("content-type"));
        let ours: [(&str, &[u8]); 5] = [
            ("content-type", b"text/event-stream"),
            (
                "x-omniroute-selected-connection-id",
                tr.conn.name.as_bytes(),
            ),
            ("x-tidegate-provider", tr.provider.name.as_bytes()),
            ("x-tidegate-attempts", attempts_s.as_bytes()),
            (TRANSLATED_HEADER, t.label().as_bytes()),
        ];
        let extra = log.response_headers();
        write_response_head(
            &mut out,
            status,
            relayed.chain(ours).chain(extra),
            framing,
            keep_alive,
        );
        log.responding(shard, status);
    }
    let mut translator =
        StreamTranslator::new(t, tr.carry.include_usage, created).with_echo(tr.carry.echo.clone());
    let mut piece_out: Vec<u8> = Vec::with_capacity(1024);
    let mut ended = first.is_none();
    if let Some(piece) = first {
        translator.feed(&piece, &mut piece_out);
    }
    loop {
        if !piece_out.is_empty() {
            emit(&mut out, &piece_out, chunked, splice.as_deref_mut());
            piece_out.clear();
        }
        // The upstream's body ended before its last event: with continuation on, a cut
        // the next candidate may go on from (rather than the translator's in-band error).
        let cut = ended
            && translator.incomplete()
            && splice
                .as_deref_mut()
                .is_some_and(|s| s.cut_by(&ended_early()));
        if cut {
            if !out.is_empty() {
                let _ = write_all(client, std::mem::take(&mut out)).await;
            }
            tracing::info!(connection = %tr.conn.name, "translated stream ended before its last event; looking for a continuation");
            return (After::Close, stream::broken(&ended_early()));
        }
        if ended {
            translator.finish(&mut piece_out);
            if !piece_out.is_empty() {
                emit(&mut out, &piece_out, chunked, splice.as_deref_mut());
                piece_out.clear();
            }
        }
        let over = ended || translator.ended();
        // The splice sends what it still holds; a replay that did not repeat the text the
        // client has ends the stream.
        let failed = if over {
            !stream::ended_well(&mut out, chunked, splice.as_deref_mut())
        } else {
            splice.as_deref().is_some_and(Splice::has_failed)
        };
        if failed {
            if !out.is_empty() {
                let _ = write_all(client, std::mem::take(&mut out)).await;
            }
            let e = splice
                .as_deref_mut()
                .and_then(Splice::failure)
                .unwrap_or_else(|| {
                    GatewayError::new(
                        ErrorKind::UpstreamProtocol,
                        "mid-stream continuation failed",
                    )
                });
            let endpoint = t.client_endpoint();
            let after = break_stream(shard, tr.conn, &e, chunked, true, endpoint, client).await;
            return (after, stream::broken(&e));
        }
        if ended && chunked && !translator.broken() {
            write_last_chunk(&mut out);
        }
        if !out.is_empty() && write_all(client, std::mem::take(&mut out)).await.is_err() {
            return client_gone(shard, up);
        }
        if over {
            break;
        }
        // Each wait raced against the client hanging up and bounded by the attempt's hard
        // deadline, as an untranslated stream's (proxy::stream::commit).
        let next = {
            let next = pin!(watchdog::next(shard, &mut up, tr.idle, wd.as_mut(), active));
            unless_client_gone(client, pending, next).await
        };
        let Some(next) = next else {
            return client_gone(shard, up);
        };
        match next {
            Ok(Some(piece)) => translator.feed(&piece, &mut piece_out),
            Ok(None) => ended = true,
            Err(e) => {
                // With continuation on, the walk looks for a candidate to go on with.
                if let Some(s) = splice.as_deref_mut()
                    && s.cut_by(&e)
                {
                    tracing::info!(connection = %tr.conn.name, "translated stream cut after the first byte: {e}; looking for a continuation");
                    return (After::Close, stream::broken(&e));
                }
                let after = break_stream(
                    shard,
                    tr.conn,
                    &e,
                    chunked,
                    true,
                    t.client_endpoint(),
                    client,
                )
                .await;
                return (after, stream::broken(&e));
            }
        }
    }
    if !ended && translator.broken() {
        // The upstream sent an error event: it went out in the client's shape, and the
        // stream ends as a broken one does (no chunked terminator); `relay::deliver`
        // classifies the event as the attempt's failure.
        bump(&shard.metrics().streams_broken);
        tracing::warn!(connection = %tr.conn.name, "the upstream sent an error event in its stream");
        let e = GatewayError::new(
            ErrorKind::UpstreamProtocol,
            "the upstream sent an error event in its stream",
        );
        return (After::Close, stream::broken(&e));
    }
    if !ended {
        // The client's stream is complete (its last event was translated); the upstream's
        // remainder is not read: the connection is not reused.
        let mut tail = BytesMut::with_capacity(8);
        if chunked {
            write_last_chunk(&mut tail);
            if write_all(client, tail).await.is_err() {
                return (After::Close, Ended::Success);
            }
        }
        let after = if keep_alive.is_kept() {
            After::KeepAlive
        } else {
            After::Close
        };
        return (after, Ended::Success);
    }
    if translator.broken() {
        // The upstream ended early: the in-band error went out, the body stays visibly
        // incomplete (no chunked terminator).
        bump(&shard.metrics().streams_broken);
        return (After::Close, stream::broken(&ended_early()));
    }
    up.finish(shard);
    let after = if keep_alive.is_kept() {
        After::KeepAlive
    } else {
        After::Close
    };
    (after, Ended::Success)
}

/// The failure of a translated stream whose upstream body ended before its last event.
fn ended_early() -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamProtocol,
        "the upstream stream ended before its last event",
    )
}

/// A complete answer: read whole, translated, written with its length.
#[allow(clippy::too_many_arguments)]
async fn commit_whole(
    shard: &Req<'_>,
    mut up: Up,
    first: Option<Bytes>,
    tr: &Translated<'_>,
    client: &mut ClientStream,
    keep_alive: Persist,
    created: u64,
    log: &AccessLog,
) -> (After, Ended) {
    let t = tr.translation;
    let status = up.head.status();
    let relayed: Vec<(String, Vec<u8>)> = up
        .head
        .fields()
        .into_iter()
        .filter(|(n, _)| !relayed_never(n) && !n.eq_ignore_ascii_case("content-type"))
        .map(|(n, v)| (n.to_owned(), v.to_vec()))
        .collect();
    let mut body = BytesMut::new();
    if let Some(f) = first {
        body.extend_from_slice(&f);
    }
    loop {
        match up.next(tr.idle).await {
            Ok(Some(p)) if body.len() + p.len() <= MAX_TRANSLATED_BODY_BYTES => {
                body.extend_from_slice(&p)
            }
            Ok(Some(_)) => {
                let e = GatewayError::new(
                    ErrorKind::UpstreamProtocol,
                    "the upstream answer is too large to translate",
                );
                let after =
                    respond::send_error(shard, client, &e, dialect(t), keep_alive, Some(log)).await;
                return (after, stream::broken(&e));
            }
            Ok(None) => break,
            Err(e) => {
                let after =
                    respond::send_error(shard, client, &e, dialect(t), keep_alive, Some(log)).await;
                return (after, stream::broken(&e));
            }
        }
    }
    let anthropic = t.upstream_endpoint() == Endpoint::Messages;
    let translated = match t {
        _ if !response::is_answer(&body, anthropic) => None,
        Translation::ChatToMessages => response::message_to_completion(&body, created).ok(),
        Translation::MessagesToChat => response::completion_to_message(&body).ok(),
        Translation::ResponsesToChat => {
            responses::translate_answer(&body, false, &tr.carry.echo, created).ok()
        }
        Translation::ResponsesToMessages => {
            responses::translate_answer(&body, true, &tr.carry.echo, created).ok()
        }
    };
    let Some(translated) = translated else {
        let e = GatewayError::new(
            ErrorKind::UpstreamProtocol,
            format!(
                "the answer of provider {} is not {} and cannot be translated (is the provider's format set right?)",
                tr.provider.name,
                if anthropic {
                    "an Anthropic Messages answer (a JSON object with a content array)"
                } else {
                    "a Chat Completions answer (a JSON object with a choices array)"
                }
            ),
        );
        let after = respond::send_error(shard, client, &e, dialect(t), keep_alive, Some(log)).await;
        return (after, stream::broken(&e));
    };
    up.finish(shard);
    stream::count_usage(shard, Usage::of_answer(&body));
    let attempts_s = tr.attempts.to_string();
    let mut out = BytesMut::with_capacity(512 + translated.len());
    {
        let relayed = relayed.iter().map(|(n, v)| (n.as_str(), v.as_slice()));
        let ours: [(&str, &[u8]); 5] = [
            ("content-type", b"application/json"),
            (
                "x-omniroute-selected-connection-id",
                tr.conn.name.as_bytes(),
            ),
            ("x-tidegate-provider", tr.provider.name.as_bytes()),
            ("x-tidegate-attempts", attempts_s.as_bytes()),
            (TRANSLATED_HEADER, t.label().as_bytes()),
        ];
        write_response_head(
            &mut out,
            status,
            relayed.chain(ours).chain(log.response_headers()),
            Framing::Length(translated.len() as u64),
            keep_alive,
        );
    }
    out.extend_from_slice(&translated);
    log.responding(shard, status);
    let after = match write_all(client, out).await {
        Ok(_) if keep_alive.is_kept() => After::KeepAlive,
        _ => After::Close,
    };
    (after, Ended::Success)
}

/// The client went away mid-answer: the upstream connection is dropped (the upstream sees
/// the hang-up), the request is counted as abandoned while streaming, and nothing counts
/// against the upstream.
fn client_gone(shard: &Req<'_>, up: Up) -> (After, Ended) {
    drop(up);
    shard.metrics().abandoned(Abandoned::Streaming);
    (After::Close, Ended::ClientAbort)
}
