//! `GET /v1/models`: the configured catalog in OpenAI's list shape — every
//! `provider/model`, and every combo.

use serde_json::{Value, json};

use crate::config::Config;

pub fn list(config: &Config) -> (u16, &'static str, String) {
    let mut data: Vec<Value> = Vec::new();
    for p in &config.providers {
        for m in &p.models {
            data.push(json!({"id": format!("{}/{m}", p.name), "object": "model", "created": 0, "owned_by": p.name}));
        }
    }
    for c in &config.combos {
        data.push(json!({"id": c.name, "object": "model", "created": 0, "owned_by": "combo"}));
    }
    (
        200,
        "application/json",
        json!({"object": "list", "data": data}).to_string(),
    )
}
