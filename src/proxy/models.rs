//! `GET /v1/models` and `GET /v1/models/{id}`: the models a client can use now, in
//! OpenAI's shapes — every `provider/model` of a provider with an enabled connection, and
//! every combo with at least one such target.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::config::Config;
use crate::error::{ErrorKind, GatewayError};
use crate::routing::resolve::RouteTable;

/// One servable model: its id and who owns it (a provider name, or `combo`).
fn servable<'c>(config: &'c Config, routes: &RouteTable) -> Vec<(Cow<'c, str>, &'c str)> {
    let enabled = |p: crate::config::ProviderId| !routes.connections(p).is_empty();
    let mut out = Vec::new();
    for p in &config.providers {
        if !enabled(p.id) {
            continue;
        }
        for m in &p.models {
            out.push((Cow::Owned(format!("{}/{m}", p.name)), p.name.as_str()));
        }
    }
    for c in &config.combos {
        if c.targets.iter().any(|t| enabled(t.provider)) {
            out.push((Cow::Borrowed(c.name.as_str()), "combo"));
        }
    }
    out
}

fn model_object(id: &str, owned_by: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": owned_by})
}

pub fn list(config: &Config, routes: &RouteTable) -> (u16, &'static str, String) {
    let data: Vec<Value> = servable(config, routes)
        .iter()
        .map(|(id, owner)| model_object(id, owner))
        .collect();
    (
        200,
        "application/json",
        json!({"object": "list", "data": data}).to_string(),
    )
}

/// One model of the listing by id (`raw_id` is the path segment, percent-encoded or not:
/// ids contain `/`, which some clients escape as `%2F`).
pub fn retrieve(
    config: &Config,
    routes: &RouteTable,
    raw_id: &str,
) -> Result<(u16, &'static str, String), GatewayError> {
    let id = percent_decode(raw_id);
    match servable(config, routes).iter().find(|(m, _)| *m == id) {
        Some((m, owner)) => Ok((200, "application/json", model_object(m, owner).to_string())),
        None => Err(GatewayError::new(
            ErrorKind::ModelNotFound,
            format!("The model '{id}' does not exist or you do not have access to it."),
        )
        .with_extra("param", json!("model"))),
    }
}

/// Decodes `%XX` escapes; an invalid escape (or one that does not decode to UTF-8) is kept
/// as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| hex(*c)),
                b.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn decodes_escaped_slashes_and_keeps_bad_escapes() {
        assert_eq!(percent_decode("openai%2Fgpt-4o"), "openai/gpt-4o");
        assert_eq!(percent_decode("a/b"), "a/b");
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(percent_decode("%zz%2f"), "%zz/");
    }
}
