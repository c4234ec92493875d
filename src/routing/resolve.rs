//! Model resolution: a combo name, `provider/model`, or a bare model found in a
//! provider's catalog, becomes an ordered list of [`Target`]s; each target's candidate
//! connections are the provider's enabled connections in priority order.

use super::model_name::ModelName;
use crate::config::{Config, ConnectionId, ProviderFormat, ProviderId};
use crate::error::{ErrorKind, GatewayError};

/// Longest model string accepted.
pub const MAX_MODEL_BYTES: usize = 256;

/// One (provider, upstream model) pair to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub provider: ProviderId,
    /// The model id sent upstream.
    pub model: ModelName,
}

/// Precomputed routing facts derived from the config once at start-up.
#[derive(Debug)]
pub struct RouteTable {
    /// Per provider id: enabled connections sorted by (priority, file order).
    by_provider: Vec<Vec<ConnectionId>>,
}

impl RouteTable {
    pub fn new(config: &Config) -> Self {
        let mut by_provider = vec![Vec::new(); config.ids.provider_bound()];
        for c in &config.connections {
            if c.enabled
                && let Some(list) = by_provider.get_mut(usize::from(c.provider.0))
            {
                list.push(c.id);
            }
        }
        for list in &mut by_provider {
            list.sort_by_key(|id| {
                (
                    config.connection(*id).priority,
                    config.connection_slot(*id).unwrap_or(usize::MAX),
                )
            });
        }
        Self { by_provider }
    }

    /// Enabled connections of `provider`, best first.
    pub fn connections(&self, provider: ProviderId) -> &[ConnectionId] {
        self.by_provider
            .get(usize::from(provider.0))
            .map_or(&[], Vec::as_slice)
    }
}

/// What a requested model resolved to.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    pub targets: Targets,
    /// The combo the model names (its index in `config.combos`), if it is one.
    pub combo: Option<usize>,
}

/// The targets a model resolved to, best first. A `provider/model` resolves to one target:
/// kept in place, so resolving it allocates nothing (a short model name is inline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    One(Target),
    Many(Vec<Target>),
}

impl std::ops::Deref for Targets {
    type Target = [Target];

    fn deref(&self) -> &[Target] {
        match self {
            Targets::One(t) => std::slice::from_ref(t),
            Targets::Many(v) => v,
        }
    }
}

impl IntoIterator for Targets {
    type Item = Target;
    type IntoIter = TargetsIter;

    fn into_iter(self) -> TargetsIter {
        match self {
            Targets::One(t) => TargetsIter::One(Some(t)),
            Targets::Many(v) => TargetsIter::Many(v.into_iter()),
        }
    }
}

/// [`Targets`] by value.
#[derive(Debug)]
pub enum TargetsIter {
    One(Option<Target>),
    Many(std::vec::IntoIter<Target>),
}

impl Iterator for TargetsIter {
    type Item = Target;

    fn next(&mut self) -> Option<Target> {
        match self {
            TargetsIter::One(t) => t.take(),
            TargetsIter::Many(v) => v.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            TargetsIter::One(t) => (usize::from(t.is_some()), Some(usize::from(t.is_some()))),
            TargetsIter::Many(v) => v.size_hint(),
        }
    }
}

/// The prefix that names a combo explicitly: `combo/<name>` is combo `<name>` (B §3.1).
pub const COMBO_PREFIX: &str = "combo/";

/// Resolves the `model` field of a request.
pub fn resolve(
    config: &Config,
    routes: &RouteTable,
    model: &str,
) -> Result<Resolved, GatewayError> {
    check_model(model)?;
    // An exact combo name, then `combo/<name>` (B §3.1), before provider/model routing.
    let combo = |name: &str| config.combos.iter().position(|c| c.name == name);
    let named = combo(model).or_else(|| model.strip_prefix(COMBO_PREFIX).and_then(combo));
    if let Some(i) = named {
        let targets = config.combos[i]
            .targets
            .iter()
            .map(|t| Target {
                provider: t.provider,
                model: ModelName::new(&t.model),
            })
            .collect();
        return Ok(Resolved {
            targets: Targets::Many(targets),
            combo: Some(i),
        });
    }
    Ok(Resolved {
        targets: direct_targets(config, routes, model)?,
        combo: None,
    })
}

fn check_model(model: &str) -> Result<(), GatewayError> {
    if model.is_empty() || model.len() > MAX_MODEL_BYTES {
        return Err(GatewayError::new(
            ErrorKind::InvalidJson,
            "model must be 1 to 256 bytes",
        ));
    }
    if has_control_char(model)
        || model
            .as_bytes()
            .split(|&b| b == b'/')
            .any(|seg| seg == b"..")
    {
        return Err(GatewayError::new(
            ErrorKind::InvalidJson,
            "model contains forbidden characters",
        ));
    }
    Ok(())
}

/// Whether `s` holds a control character (`char::is_control`: U+0000–U+001F and
/// U+007F–U+009F), read from the UTF-8 bytes without decoding: the C1 controls are the
/// two-byte sequences `C2 80` to `C2 9F`, and in valid UTF-8 `C2` only ever leads.
///
/// First one branch-free pass over the bytes for anything that may start a control
/// (a C0 byte, DEL or the `C2` lead byte); only a name with one of those is read again.
fn has_control_char(s: &str) -> bool {
    let b = s.as_bytes();
    let suspect = b.iter().fold(false, |any, &c| {
        any | (c < 0x20) | (c == 0x7f) | (c == 0xc2)
    });
    suspect
        && b.iter().enumerate().any(|(i, &c)| {
            c < 0x20
                || c == 0x7f
                || (c == 0xc2 && b.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)))
        })
}

/// `provider/model`, or a bare model found in the providers' catalogs.
fn direct_targets(
    config: &Config,
    routes: &RouteTable,
    model: &str,
) -> Result<Targets, GatewayError> {
    if let Some((prefix, rest)) = model.split_once('/')
        && let Some(p) = config.provider_by_name(prefix)
    {
        if rest.is_empty() {
            return Err(GatewayError::new(
                ErrorKind::ModelNotFound,
                format!("no model named after provider {prefix}/"),
            ));
        }
        return Ok(Targets::One(Target {
            provider: p.id,
            model: ModelName::new(rest),
        }));
    }
    // A bare model: every provider whose catalog lists it, those with an enabled
    // connection first, in file order. The mock never shadows a real model: when a real
    // provider lists the name, mock providers are left out (asking for a real model and
    // getting the mock's echo is worse than a 503).
    let mut hits: Vec<&crate::config::Provider> = config
        .providers
        .iter()
        .filter(|p| p.models.iter().any(|m| m == model))
        .collect();
    if hits.iter().any(|p| p.format != ProviderFormat::Mock) {
        hits.retain(|p| p.format != ProviderFormat::Mock);
    }
    hits.sort_by_key(|p| routes.connections(p.id).is_empty());
    if hits.is_empty() {
        return Err(GatewayError::new(
            ErrorKind::ModelNotFound,
            format!(
                "model {model:?} is not a combo, a provider/model, or in any provider's models"
            ),
        ));
    }
    Ok(Targets::Many(
        hits.into_iter()
            .map(|p| Target {
                provider: p.id,
                model: ModelName::new(model),
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_found_in_the_bytes_as_char_is_control_finds_them() {
        // Every scalar value up to U+3000 and the top of the range, alone and between
        // other characters (a C2 lead byte next to a continuation byte of another char
        // must not be read as a C1 control).
        let chars = (0u32..0x3000)
            .chain(0xfff0..0x1_0010)
            .filter_map(char::from_u32);
        for c in chars {
            for s in [
                c.to_string(),
                format!("a{c}b"),
                format!("é{c}\u{80}"),
                format!("{c}\u{c2}"),
            ] {
                assert_eq!(
                    has_control_char(&s),
                    s.chars().any(char::is_control),
                    "{s:?}"
                );
            }
        }
    }

    #[test]
    fn a_dot_dot_segment_is_refused_and_dots_inside_a_segment_are_not() {
        for bad in ["..", "../x", "p/..", "p/../x", "a\u{1}b", "a\u{9f}"] {
            assert!(check_model(bad).is_err(), "{bad:?}");
        }
        for good in ["p/m", "p/..m", "...", "p/m..", "é/ü", "a.b/c"] {
            assert!(check_model(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn combo_slash_name_names_the_combo_and_other_combo_slash_models_route_as_usual() {
        let text = r#"
            [[providers]]
            id = "combo"
            format = "mock"
            models = ["plain"]

            [[connections]]
            id = "c"
            provider = "combo"

            [[combos]]
            name = "team"
            targets = ["combo/plain"]
        "#;
        let config = crate::config::load_str(text, &|_| None)
            .map(|o| o.config)
            .unwrap_or_else(|e| panic!("config: {e}"));
        let routes = RouteTable::new(&config);
        let combo_of = |model: &str| resolve(&config, &routes, model).map(|r| r.combo);
        assert_eq!(combo_of("team").ok(), Some(Some(0)));
        assert_eq!(combo_of("combo/team").ok(), Some(Some(0)));
        // Not a combo's name: provider `combo`'s model, as any provider/model.
        assert_eq!(combo_of("combo/plain").ok(), Some(None));
    }
}
