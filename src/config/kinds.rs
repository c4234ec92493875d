//! Provider kinds: the one table of per-provider quirks. OmniRoute decides several
//! resilience rules by comparing a provider's id with known names ("nvidia", "codex", the
//! opencode family …). Tidegate resolves them once, at load, from the provider's `kind`
//! into typed [`Quirks`]; the rest of the gateway reads the quirks and never the id, so an
//! operator may name a provider anything.
//!
//! A kind's name is the provider id OmniRoute uses for it. `[[providers]] kind` picks one;
//! without it the kind is the id when the id names a kind (case-insensitive), `openai-compatible`
//! / `anthropic-compatible` when the id starts with that, else `generic` (no quirks).
//!
//! The built-in error rules (`resilience/rules.rs`) and status restatements
//! (`resilience/restate.rs`) are catalogued under these same names: classification is
//! given the kind's name, never the id.
//!
//! This module is a leaf (it imports nothing from the crate) so that config, resilience
//! and flow can all read it without an import cycle.

/// How a model's quota is keyed, for model lockouts (spec A §4.1) and limiter keys (B §1.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QuotaFamily {
    /// The model itself.
    #[default]
    Model,
    /// Codex: one quota per scope (`codex` / `spark`), limiter keyed by the account.
    Codex,
    /// Antigravity: models share a quota family (`family:gemini`, `family:claude`).
    Antigravity,
}

/// How the request limiter keys a connection's queue (B §1.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimiterKey {
    /// `<provider>:<connection>`.
    #[default]
    Connection,
    /// `codex:<account key>`.
    Codex,
    /// `<provider>:<connection>:<quota family or model>`.
    QuotaFamily,
    /// `<provider>:<connection>:<model>`: separate upstream buckets per model.
    Model,
}

/// The typed quirks of one provider, resolved at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quirks {
    pub kind: ProviderKind,
    /// `hasPerModelQuota` (A §4.5): a model's failure locks that model, the connection
    /// stays routable for the others. Also true for `auth = "local"` and the mock format.
    pub per_model_quota: bool,
    /// The egress-bucketed lock (A §7) applies to this provider's connections without an
    /// `egress` label (OmniRoute's default allowlist). Any labelled connection takes part.
    pub egress_lock_by_default: bool,
    /// Providers of one egress family cool each other behind a shared egress; `None`: the
    /// provider is its own family.
    pub egress_family: Option<&'static str>,
    pub quota_family: QuotaFamily,
    pub limiter_key: LimiterKey,
    /// A 410 means "model not found" (nvidia), like a 404.
    pub gone_is_not_found: bool,
    /// Quota 429s cool a per-scope child rather than locking the model (codex), so the
    /// per-model lock of A §3.5 step 13 is skipped.
    pub scoped_quota_cooldowns: bool,
    /// A model lock uses the exact key, not the quota family (antigravity).
    pub exact_model_locks: bool,
    /// Built-in sliding window: requests per minute per connection (nvidia 40).
    pub default_rpm: Option<u32>,
    /// Built-in per-connection concurrency cap (nvidia 6).
    pub default_concurrency: Option<u32>,
    /// Floor of the queue's wait budget (zai-web 60 s, maxai 300 s).
    pub max_wait_floor_ms: u64,
}

impl Quirks {
    const GENERIC: Quirks = Quirks {
        kind: ProviderKind::Generic,
        per_model_quota: false,
        egress_lock_by_default: false,
        egress_family: None,
        quota_family: QuotaFamily::Model,
        limiter_key: LimiterKey::Connection,
        gone_is_not_found: false,
        scoped_quota_cooldowns: false,
        exact_model_locks: false,
        default_rpm: None,
        default_concurrency: None,
        max_wait_floor_ms: 0,
    };
}

/// Queue wait floors (B §1.2).
pub const ZAI_WEB_MAX_WAIT_FLOOR_MS: u64 = 60_000;
pub const MAXAI_MAX_WAIT_FLOOR_MS: u64 = 300_000;
/// NVIDIA's built-in window and concurrency cap (B §1.2).
pub const NVIDIA_DEFAULT_RPM: u32 = 40;
pub const NVIDIA_DEFAULT_CONCURRENCY: u32 = 6;

macro_rules! kinds {
    ($($variant:ident = $name:literal),* $(,)?) => {
        /// A provider kind (see the module docs); its name is OmniRoute's provider id.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ProviderKind { $($variant),* }

        impl ProviderKind {
            /// Every kind, in documentation order.
            pub const ALL: &'static [ProviderKind] = &[$(ProviderKind::$variant),*];

            pub fn name(self) -> &'static str {
                match self { $(ProviderKind::$variant => $name),* }
            }
        }
    };
}

kinds! {
    Generic = "generic",
    OpenaiCompatible = "openai-compatible",
    AnthropicCompatible = "anthropic-compatible",
    Agentrouter = "agentrouter",
    Antigravity = "antigravity",
    Agy = "agy",
    Claude = "claude",
    CloudflareAi = "cloudflare-ai",
    Codex = "codex",
    Gemini = "gemini",
    GeminiCli = "gemini-cli",
    Github = "github",
    Maxai = "maxai",
    Mx = "mx",
    Minimax = "minimax",
    MinimaxPassthrough = "minimax-passthrough",
    Nvidia = "nvidia",
    Opencode = "opencode",
    OpencodeCli = "opencode-cli",
    OpencodeGo = "opencode-go",
    OpencodeZen = "opencode-zen",
    Openrouter = "openrouter",
    Vertex = "vertex",
    ZaiWeb = "zai-web",
}

impl ProviderKind {
    /// The kind named `name` (case-insensitive, trimmed).
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.name().eq_ignore_ascii_case(name))
    }

    /// The kind of a provider whose `kind` key is absent: the id when it names a kind, the
    /// compatible passthroughs by prefix, else generic.
    pub fn default_for_id(id: &str) -> Self {
        if let Some(k) = Self::from_name(id) {
            return k;
        }
        let lower = id.trim().to_ascii_lowercase();
        if lower.starts_with("openai-compatible") {
            ProviderKind::OpenaiCompatible
        } else if lower.starts_with("anthropic-compatible") {
            ProviderKind::AnthropicCompatible
        } else {
            ProviderKind::Generic
        }
    }

    /// The quirks table.
    pub fn quirks(self) -> Quirks {
        use ProviderKind as K;
        let base = Quirks {
            kind: self,
            ..Quirks::GENERIC
        };
        // Passthrough providers (OmniRoute's `passthroughModels`) and the providers
        // `hasPerModelQuota` names.
        let per_model = Quirks {
            per_model_quota: true,
            ..base
        };
        let opencode = Quirks {
            egress_family: Some("opencode"),
            ..per_model
        };
        match self {
            K::Generic
            | K::Claude
            | K::CloudflareAi
            | K::Minimax
            | K::MinimaxPassthrough
            | K::Openrouter
            | K::GeminiCli
            | K::Vertex => base,
            K::OpenaiCompatible | K::AnthropicCompatible | K::Agentrouter => per_model,
            K::Gemini | K::Github => Quirks {
                limiter_key: LimiterKey::Model,
                ..per_model
            },
            K::Antigravity | K::Agy => Quirks {
                quota_family: QuotaFamily::Antigravity,
                limiter_key: LimiterKey::QuotaFamily,
                exact_model_locks: true,
                ..per_model
            },
            K::Codex => Quirks {
                quota_family: QuotaFamily::Codex,
                limiter_key: LimiterKey::Codex,
                scoped_quota_cooldowns: true,
                ..per_model
            },
            K::Nvidia => Quirks {
                gone_is_not_found: true,
                default_rpm: Some(NVIDIA_DEFAULT_RPM),
                default_concurrency: Some(NVIDIA_DEFAULT_CONCURRENCY),
                ..base
            },
            K::Opencode | K::OpencodeZen => opencode,
            K::OpencodeGo | K::OpencodeCli => Quirks {
                egress_lock_by_default: true,
                ..opencode
            },
            K::ZaiWeb => Quirks {
                max_wait_floor_ms: ZAI_WEB_MAX_WAIT_FLOOR_MS,
                ..base
            },
            K::Maxai | K::Mx => Quirks {
                max_wait_floor_ms: MAXAI_MAX_WAIT_FLOOR_MS,
                ..base
            },
        }
    }

    /// The known names, comma-separated (for error messages).
    pub fn names() -> String {
        Self::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_defaults() {
        for k in ProviderKind::ALL {
            assert_eq!(ProviderKind::from_name(k.name()), Some(*k));
            assert_eq!(k.quirks().kind, *k);
        }
        assert_eq!(
            ProviderKind::from_name(" NVIDIA "),
            Some(ProviderKind::Nvidia)
        );
        assert_eq!(
            ProviderKind::default_for_id("my-nim"),
            ProviderKind::Generic
        );
        assert_eq!(
            ProviderKind::default_for_id("openai-compatible-acme"),
            ProviderKind::OpenaiCompatible
        );
        assert_eq!(
            ProviderKind::default_for_id("opencode-go"),
            ProviderKind::OpencodeGo
        );
    }

    #[test]
    fn quirks_table() {
        let nv = ProviderKind::Nvidia.quirks();
        assert_eq!(
            (nv.default_rpm, nv.default_concurrency),
            (Some(40), Some(6))
        );
        assert!(nv.gone_is_not_found && !nv.per_model_quota);
        let go = ProviderKind::OpencodeGo.quirks();
        assert!(go.egress_lock_by_default && go.per_model_quota);
        assert_eq!(go.egress_family, Some("opencode"));
        let zen = ProviderKind::OpencodeZen.quirks();
        assert!(!zen.egress_lock_by_default);
        assert_eq!(zen.egress_family, Some("opencode"));
        assert!(ProviderKind::Agentrouter.quirks().per_model_quota);
        assert_eq!(
            ProviderKind::Codex.quirks().quota_family,
            QuotaFamily::Codex
        );
        assert_eq!(ProviderKind::Generic.quirks(), Quirks::GENERIC);
    }
}
