//! What the request path records for `/metrics` beyond the plain counters: the label sets
//! of the labelled families (built from the configuration at start and again at each
//! reload, continuing the values of the label sets both have: closed sets and configured
//! ids only) and the index of each observation in them.

use crate::config::{Config, ConnectionId, ProviderId};
use crate::error::ErrorKind;
use crate::owners::health::owner::BREAKER_STATES;
use crate::providers::Endpoint;
use crate::resilience::Reason;
use crate::shard::metrics::{
    Counters, ERROR_KINDS, Families, Histograms, kind_phase, kind_position,
};

/// Route labels, in index order.
const ROUTES: [&str; 8] = [
    "chat_completions",
    "responses",
    "embeddings",
    "messages",
    "models",
    "management",
    "other",
    "count_tokens",
];

/// Upstream answer classes, in index order (`error`: no answer).
const CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "error"];

/// Every fallback reason of an upstream answer, in index order.
const REASONS: [Reason; 12] = [
    Reason::AuthError,
    Reason::QuotaExhausted,
    Reason::RateLimitExceeded,
    Reason::ModelCapacity,
    Reason::ServerError,
    Reason::Unknown,
    Reason::ServiceNotRunning,
    Reason::NotFound,
    Reason::ExecutorContractViolation,
    Reason::InvalidPreviousResponseBinding,
    Reason::ProviderModelUnsupported,
    Reason::NetworkError,
];

fn reason_index(r: Reason) -> usize {
    match r {
        Reason::AuthError => 0,
        Reason::QuotaExhausted => 1,
        Reason::RateLimitExceeded => 2,
        Reason::ModelCapacity => 3,
        Reason::ServerError => 4,
        Reason::Unknown => 5,
        Reason::ServiceNotRunning => 6,
        Reason::NotFound => 7,
        Reason::ExecutorContractViolation => 8,
        Reason::InvalidPreviousResponseBinding => 9,
        Reason::ProviderModelUnsupported => 10,
        Reason::NetworkError => 11,
    }
}

/// The labelled families of one shard for `config`, continuing `old`'s values (the same
/// shard's families before a reload) for the label sets both have.
pub fn families(config: &Config, old: Option<&Families>) -> Families {
    let routes: Vec<String> = ROUTES
        .iter()
        .map(|r| format!("{{route=\"{r}\"}}"))
        .collect();
    let mut attempts = Vec::new();
    for c in &config.connections {
        let p = &config.provider(c.provider).name;
        for class in CLASSES {
            attempts.push(format!(
                "{{provider=\"{p}\",connection=\"{}\",class=\"{class}\"}}",
                c.name
            ));
        }
    }
    let mut by_model = Vec::new();
    let mut model_base = Vec::with_capacity(config.providers.len());
    for p in &config.providers {
        model_base.push(by_model.len());
        for m in p.models.iter().map(String::as_str).chain(["other"]) {
            by_model.push(format!(
                "{{provider=\"{}\",model=\"{}\"}}",
                p.name,
                escape(m)
            ));
        }
    }
    let providers: Vec<String> = config
        .providers
        .iter()
        .map(|p| format!("{{provider=\"{}\"}}", p.name))
        .collect();
    let mut fallbacks: Vec<String> = REASONS
        .iter()
        .map(|r| format!("{{cause=\"upstream\",reason=\"{}\"}}", r.as_str()))
        .collect();
    fallbacks.extend(ERROR_KINDS.iter().map(|k| match kind_phase(*k) {
        "" => format!("{{cause=\"gateway\",reason=\"{}\"}}", k.code()),
        phase => format!(
            "{{cause=\"gateway\",reason=\"{}\",phase=\"{phase}\"}}",
            k.code()
        ),
    }));
    let transitions = BREAKER_STATES
        .iter()
        .map(|s| format!("{{to=\"{}\"}}", s.as_str()))
        .collect();
    Families {
        requests: Counters::carried(routes.clone(), old.map(|o| &o.requests)),
        request_duration: Histograms::carried(routes, old.map(|o| &o.request_duration)),
        attempts: Counters::carried(attempts, old.map(|o| &o.attempts)),
        attempts_by_model: Counters::carried(by_model, old.map(|o| &o.attempts_by_model)),
        upstream_head: Histograms::carried(providers.clone(), old.map(|o| &o.upstream_head)),
        upstream_ttfb: Histograms::carried(providers.clone(), old.map(|o| &o.upstream_ttfb)),
        admission_wait: Histograms::carried(providers, old.map(|o| &o.admission_wait)),
        fallbacks: Counters::carried(fallbacks, old.map(|o| &o.fallbacks)),
        breaker_transitions: Counters::carried(transitions, old.map(|o| &o.breaker_transitions)),
        model_base,
    }
}

/// A label value in the exposition's quoting.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The route label index of a request path.
pub fn route_index(path: &str) -> usize {
    match Endpoint::from_path(path) {
        Some(Endpoint::ChatCompletions) => 0,
        Some(Endpoint::Responses) => 1,
        Some(Endpoint::Embeddings) => 2,
        Some(Endpoint::Messages) => 3,
        Some(Endpoint::CountTokens) => 7,
        None if path.starts_with("/v1/models") => 4,
        None if path.starts_with("/api/")
            || path == "/metrics"
            || path == "/healthz"
            || path == "/readyz" =>
        {
            5
        }
        None => 6,
    }
}

fn class_index(status: Option<u16>) -> usize {
    match status {
        Some(200..=299) => 0,
        Some(300..=399) => 1,
        Some(400..=499) => 2,
        Some(500..=599) => 3,
        _ => 4,
    }
}

/// An upstream attempt on `connection` ended with an answer head of `status` (`None`: no
/// answer) after `head_ns`.
pub fn attempt(
    f: &Families,
    config: &Config,
    provider: ProviderId,
    connection: ConnectionId,
    model: &str,
    status: Option<u16>,
    head_ns: Option<u64>,
) {
    // Label sets follow the file's order (see `families`).
    if let Some(i) = config.connection_slot(connection) {
        f.attempts.add(i * CLASSES.len() + class_index(status), 1);
    }
    let Some(slot) = config.provider_slot(provider) else {
        return;
    };
    if let (Some(p), Some(base)) = (config.providers.get(slot), f.model_base.get(slot)) {
        let i = p
            .models
            .iter()
            .position(|x| x == model)
            .unwrap_or(p.models.len());
        f.attempts_by_model.add(base + i, 1);
    }
    if let Some(ns) = head_ns {
        f.upstream_head.observe_ns(slot, ns);
    }
}

/// The first body byte of an attempt arrived `ns` after its request was sent.
pub fn first_byte(f: &Families, config: &Config, provider: ProviderId, ns: u64) {
    if let Some(i) = config.provider_slot(provider) {
        f.upstream_ttfb.observe_ns(i, ns);
    }
}

/// An attempt on `provider` was admitted after waiting `ns`.
pub fn admitted(f: &Families, config: &Config, provider: ProviderId, ns: u64) {
    if let Some(i) = config.provider_slot(provider) {
        f.admission_wait.observe_ns(i, ns);
    }
}

/// An attempt ended in a failure the gateway moves on from: an upstream answer
/// (`Some(reason)`) or a gateway-made error (counted whether or not a candidate is left).
pub fn fallback(f: &Families, upstream: Option<Reason>, gateway: ErrorKind) {
    let i = match upstream {
        Some(r) => reason_index(r),
        None => REASONS.len() + kind_position(gateway),
    };
    f.fallbacks.add(i, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_index() {
        for (i, r) in REASONS.iter().enumerate() {
            assert_eq!(reason_index(*r), i);
        }
    }

    /// Each provider's models and `other` count at the label set the families list for
    /// them (the index the scan over every provider before it gave).
    #[test]
    fn attempts_count_at_their_model_s_label_set() {
        let toml = "[[providers]]\nid = \"a\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m1\", \"m2\"]\n\
             [[providers]]\nid = \"b\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
             [[providers]]\nid = \"c\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"x\", \"y\", \"z\"]\n\
             [[connections]]\nid = \"ca\"\nprovider = \"a\"\n\
             [[connections]]\nid = \"cc\"\nprovider = \"c\"\n";
        let config = match crate::config::load_str(toml, &|_| None) {
            Ok(o) => o.config,
            Err(e) => panic!("config: {e}"),
        };
        let f = families(&config, None);
        let mut base = 0;
        for p in &config.providers {
            for (i, m) in p
                .models
                .iter()
                .map(String::as_str)
                .chain(["nope"])
                .enumerate()
            {
                let at = base + i.min(p.models.len());
                let before = f.attempts_by_model.value(at);
                attempt(&f, &config, p.id, ConnectionId(0), m, Some(200), Some(1));
                assert_eq!(f.attempts_by_model.value(at), before + 1, "{} {m}", p.name);
            }
            base += p.models.len() + 1;
        }
        let total: u64 = (0..base).map(|i| f.attempts_by_model.value(i)).sum();
        assert_eq!(total, 3 + 2 + 4, "one count per attempt, none elsewhere");
        // An id this configuration does not have counts nowhere.
        attempt(
            &f,
            &config,
            ProviderId(77),
            ConnectionId(0),
            "m1",
            None,
            None,
        );
        let after: u64 = (0..base).map(|i| f.attempts_by_model.value(i)).sum();
        assert_eq!(after, total);
    }

    #[test]
    fn routes_are_labelled_from_the_path() {
        assert_eq!(
            ROUTES[route_index("/v1/chat/completions")],
            "chat_completions"
        );
        assert_eq!(ROUTES[route_index("/v1/models/x")], "models");
        assert_eq!(ROUTES[route_index("/api/resilience")], "management");
        assert_eq!(ROUTES[route_index("/nope")], "other");
    }
}
