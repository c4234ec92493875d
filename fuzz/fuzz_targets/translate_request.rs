//! Request translation on arbitrary bytes, both ways: never a panic; an accepted body is a
//! JSON object naming the target model; a refusal says why.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::providers::translate::request::{chat_to_messages, messages_to_chat};

fuzz_target!(|data: &[u8]| {
    for (i, result) in [chat_to_messages(data, "m"), messages_to_chat(data, "m")]
        .into_iter()
        .enumerate()
    {
        match result {
            Ok(t) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&t.body).expect("translated body is JSON");
                assert_eq!(v["model"], "m", "direction {i}");
            }
            // The path may be empty (a top-level key named ""); the reason never is.
            Err(r) => assert!(!r.why.is_empty()),
        }
    }
});
