//! Answer and error translation on arbitrary bytes, both ways and into the Responses API:
//! never a panic; whatever is produced is JSON in the client's shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::providers::translate::responses::{Echo, translate_answer};
use tidegate::providers::translate::{Translation, error, response};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = response::message_to_completion(data, 1) {
        let v: serde_json::Value = serde_json::from_slice(&b).expect("completion is JSON");
        assert_eq!(v["object"], "chat.completion");
    }
    if let Ok(b) = response::completion_to_message(data) {
        let v: serde_json::Value = serde_json::from_slice(&b).expect("message is JSON");
        assert_eq!(v["type"], "message");
    }
    for anthropic in [false, true] {
        if let Ok(b) = translate_answer(data, anthropic, &Echo::default(), 1) {
            let v: serde_json::Value = serde_json::from_slice(&b).expect("response is JSON");
            assert_eq!(v["object"], "response");
        }
    }
    for t in [Translation::ChatToMessages, Translation::MessagesToChat, Translation::ResponsesToMessages] {
        let b = error::reshape(data, 429, t);
        let v: serde_json::Value = serde_json::from_slice(&b).expect("error is JSON");
        assert!(v["error"].is_object());
    }
});
