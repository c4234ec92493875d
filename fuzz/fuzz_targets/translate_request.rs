//! Request translation on arbitrary bytes, both ways and from the Responses API to both:
//! never a panic; an accepted body is a JSON object naming the target model; a refusal says
//! why.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::providers::translate::request::{chat_to_messages, messages_to_chat};
use tidegate::providers::translate::responses::translate_request;

fuzz_target!(|data: &[u8]| {
    let responses = |anthropic| translate_request(data, "m", anthropic).map(|(body, _)| body);
    let results = [
        chat_to_messages(data, "m").map(|t| t.body),
        messages_to_chat(data, "m").map(|t| t.body),
        responses(false),
        responses(true),
    ];
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(body) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&body).expect("translated body is JSON");
                assert_eq!(v["model"], "m", "direction {i}");
            }
            // The path may be empty (a top-level key named ""); the reason never is.
            Err(r) => assert!(!r.why.is_empty()),
        }
    }
});
