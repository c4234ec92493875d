//! Valid but dangerous or useless configurations: the warnings `tidegate check` and
//! `tidegate serve` print for a file that loads, yet would expose paid accounts or fail
//! every request — an open gateway or an inline key on an address other hosts can reach,
//! no enabled connection, an empty file, a combo that falls back to the mock while real
//! providers serve. `serve` refuses the open gateway outright ([`open_gateway_refusal`]).
//! Runs on the validated [`Config`] plus the raw file (to tell an inline key from one read
//! from a variable); it never adds a problem, only warnings.

use super::raw::RawConfig;
use super::{Config, Connection, ProviderFormat, Scope};

/// The shipped sample key: public, since it is printed in the README and the default file.
pub const SAMPLE_CLIENT_KEY: &str = "tidegate-dev-key";

/// True when the text holds nothing but blank lines and comments.
fn is_blank_file(text: &str) -> bool {
    text.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// The listener is reachable from other hosts (anything but a loopback address;
/// `0.0.0.0` and `::` included).
pub fn listens_beyond_loopback(config: &Config) -> bool {
    !config.server.listen.ip().is_loopback()
}

/// Why `serve` must not start: a listener other hosts can reach, no client keys, and no
/// `server.allow_open_gateway = true`.
pub fn open_gateway_refusal(config: &Config) -> Option<String> {
    if listens_beyond_loopback(config)
        && config.client_keys.is_empty()
        && !config.server.allow_open_gateway
    {
        Some(format!(
            "refusing to serve {} with no [[client_keys]]: anyone who can reach it would spend \
             your provider accounts; add a client key, listen on 127.0.0.1, or set \
             server.allow_open_gateway = true",
            config.server.listen
        ))
    } else {
        None
    }
}

/// The `api_key_env` variables of the disabled connections among `connections`, each once
/// in file order, joined for a message (`OPENAI_API_KEY, ANTHROPIC_API_KEY`).
pub fn unset_key_variables<'a>(connections: impl Iterator<Item = &'a Connection>) -> String {
    let mut names: Vec<&str> = Vec::new();
    for c in connections.filter(|c| !c.enabled) {
        if let Some(var) = c.api_key_env.as_deref()
            && !names.contains(&var)
        {
            names.push(var);
        }
    }
    names.join(", ")
}

/// One `<key>: <message>` line per dangerous or useless setting.
pub fn warnings(config: &Config, raw: &RawConfig, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let listen = config.server.listen;
    let exposed = listens_beyond_loopback(config);
    if is_blank_file(text) {
        out.push(
            "config: the file is empty: built-in defaults, with no provider, no connection \
             and no client key; every model request fails"
                .to_string(),
        );
    } else if config.connections.is_empty() {
        out.push(
            "connections: no [[connections]]: every model request fails with \
             no_available_connection"
                .to_string(),
        );
    } else if !config.connections.iter().any(|c| c.enabled) {
        let unset = unset_key_variables(config.connections.iter());
        out.push(format!(
            "connections: every connection is disabled ({unset} not set in this environment): \
             every model request fails with no_available_connection"
        ));
    }
    if let (Some(var), None) = (&config.server.admin_token_env, &config.server.admin_token) {
        let then = if config
            .client_keys
            .iter()
            .any(|k| k.has_scope(Scope::Manage))
        {
            "the management API accepts only client keys with scope \"manage\""
        } else {
            "and no client key has scope \"manage\": the management API answers loopback \
             callers without a credential and refuses every other caller"
        };
        out.push(format!("server.admin_token_env: {var} is not set; {then}"));
    }
    if exposed && config.client_keys.is_empty() {
        let consequence = if config.server.allow_open_gateway {
            "serving anyway because server.allow_open_gateway = true"
        } else {
            "`tidegate serve` refuses this unless server.allow_open_gateway = true"
        };
        out.push(format!(
            "server.listen: {listen} is reachable from other hosts and there are no \
             [[client_keys]]: an open gateway, anyone who reaches it spends your provider \
             accounts ({consequence})"
        ));
    }
    if exposed && config.server.tls.is_none() {
        out.push(format!(
            "server.listen: {listen} is reachable from other hosts without TLS: client keys and \
             prompts cross the network in clear text; set server.tls_cert_file and \
             server.tls_key_file, or terminate TLS in front"
        ));
    }
    if exposed {
        for (i, k) in raw.client_keys.iter().enumerate() {
            let Some(inline) = &k.key else { continue };
            let which = if inline == SAMPLE_CLIENT_KEY {
                "the shipped sample key, which is public"
            } else {
                "an inline key"
            };
            out.push(format!(
                "client_keys[{i}].key: {which} on {listen}, which other hosts can reach: \
                 anyone who can read this file can use it; use key_env or key_sha256"
            ));
        }
    }
    let real_enabled = config
        .connections
        .iter()
        .any(|c| c.enabled && config.provider(c.provider).format != ProviderFormat::Mock);
    if real_enabled {
        for (i, combo) in config.combos.iter().enumerate() {
            let has_real = combo
                .targets
                .iter()
                .any(|t| config.provider(t.provider).format != ProviderFormat::Mock);
            let mock = combo
                .targets
                .iter()
                .find(|t| config.provider(t.provider).format == ProviderFormat::Mock);
            if has_real && let Some(t) = mock {
                out.push(format!(
                    "combos[{i}].targets: combo {:?} falls back to the mock provider {:?} \
                     while real providers are enabled: clients would get the mock's canned \
                     answer instead of an error",
                    combo.name,
                    config.provider(t.provider).name
                ));
            }
        }
    }
    out
}
