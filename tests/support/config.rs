//! The inline configuration most tests start from: one `openai`-format provider `up` at a
//! mock's base URL, models `m1` and `m2`, one connection `c1`.

/// `workers` shards; `connection_extra` goes inside `[[connections]]` (after its keys, so it
/// may open `[connections.rate_limit_overrides]`); `tail` is appended (e.g. `[resilience…]`).
pub fn one_upstream(base_url: &str, workers: usize, connection_extra: &str, tail: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = {workers}

[[providers]]
id = "up"
format = "openai"
base_url = "{base_url}"
models = ["m1", "m2"]

[[connections]]
id = "c1"
provider = "up"
{connection_extra}

{tail}
"#
    )
}

/// A `[[providers]]` table: an `openai`-format provider at `base_url`.
pub fn provider(id: &str, base_url: &str, models: &[&str]) -> String {
    let models: Vec<String> = models.iter().map(|m| format!("{m:?}")).collect();
    format!(
        "[[providers]]\nid = \"{id}\"\nformat = \"openai\"\nbase_url = \"{base_url}\"\nmodels = [{}]\n\n",
        models.join(", ")
    )
}

/// A `[[connections]]` table.
pub fn connection(id: &str, provider: &str) -> String {
    format!("[[connections]]\nid = \"{id}\"\nprovider = \"{provider}\"\n\n")
}
