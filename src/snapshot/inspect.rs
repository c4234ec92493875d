//! `tidegate snapshot inspect`: both slots' status and the newest valid slot's state as
//! JSON. Read-only: unlike start-up, it moves nothing aside.

use std::path::Path;

use serde_json::{Value, json};

use super::store::{SLOT_FILES, SlotRead, read_slot};
use crate::resilience::breaker::iso8601_utc;

/// The JSON `inspect` prints for `dir`.
pub fn inspect(dir: &Path) -> Value {
    let mut slots = Vec::new();
    let mut newest: Option<Box<super::store::Loaded>> = None;
    for (slot, name) in SLOT_FILES.iter().enumerate() {
        let path = dir.join(name);
        let entry = match read_slot(dir, slot) {
            SlotRead::Missing => json!({"file": path, "status": "missing"}),
            SlotRead::Invalid(problem) => {
                json!({"file": path, "status": "invalid", "problem": problem})
            }
            SlotRead::Valid(l) => {
                let e = json!({
                    "file": path,
                    "status": "valid",
                    "schemaVersion": l.header.schema_version,
                    "generation": l.header.generation,
                    "writtenAtMs": l.header.written_at_wall_ms,
                    "writtenAt": iso8601_utc(l.header.written_at_wall_ms),
                    "bytes": l.header.payload_len + super::file::HEADER_BYTES as u64,
                });
                if newest
                    .as_ref()
                    .is_none_or(|n| n.header.generation < l.header.generation)
                {
                    newest = Some(l);
                }
                e
            }
        };
        slots.push(entry);
    }
    let (file, generation, state) = match &newest {
        Some(l) => (
            json!(l.path),
            json!(l.header.generation),
            serde_json::to_value(&l.contents).unwrap_or(Value::Null),
        ),
        None => (Value::Null, Value::Null, Value::Null),
    };
    json!({
        "stateDir": dir,
        "slots": slots,
        "newest": file,
        "generation": generation,
        "state": state,
    })
}
