//! Reading the environment: the value of a variable and the strict parsers of the
//! resilience overrides (`RATE_LIMIT_MAX_WAIT_MS`, `OMNIROUTE_CIRCUIT_BREAKER_*`, …; the
//! full list is [`super::resilience::env_variables`], and `resilience` applies them under
//! the file). The environment is injected as a function so tests never touch the process
//! environment. An empty or whitespace-only value counts as unset. A leaf: it imports
//! nothing from the rest of `config/`.

/// The trimmed value of `name`, or `None` when unset or blank.
pub fn read(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `true`/`1`/`on`/`yes` or `false`/`0`/`off`/`no`, case-insensitive.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => Err(format!(
            "{value:?} is not a boolean (use true/false, 1/0, on/off or yes/no)"
        )),
    }
}

/// A non-negative whole number (digits only, `_` not allowed).
pub fn parse_u64(value: &str) -> Result<u64, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        value
            .parse::<u64>()
            .map_err(|_| format!("{value:?} is too large"))
    } else {
        Err(format!("{value:?} is not a non-negative whole number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing() {
        assert_eq!(parse_bool("ON"), Ok(true));
        assert_eq!(parse_bool("no"), Ok(false));
        assert!(parse_bool("enabled").is_err());
        assert_eq!(parse_u64("42"), Ok(42));
        assert!(parse_u64("-1").is_err());
        assert!(parse_u64("1.5").is_err());
        assert!(parse_u64("1e3").is_err());
        assert!(parse_u64("99999999999999999999999").is_err());
    }
}
