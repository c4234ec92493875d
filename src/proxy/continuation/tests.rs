use super::*;

fn chat_chunk(text: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"id":"c2","choices":[{"index":0,"delta":{"content":text},"finish_reason":null}]})
    )
}

fn body_text(out: &[u8]) -> String {
    // De-chunk and collect the content deltas.
    let mut s = String::new();
    let text = String::from_utf8_lossy(out);
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(d)
            && let Some(t) = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        {
            s.push_str(t);
        }
    }
    s
}

#[test]
fn overlap_needs_eight_characters() {
    assert_eq!(overlap("the quick brown fox", "brown fox jumps"), 9);
    assert_eq!(overlap("the quick brown fox", "fox jumps"), 0);
    assert_eq!(overlap("abc", "abcdefgh"), 0);
}

#[test]
fn events_cut_by_a_piece_boundary_wait_for_their_end() {
    let mut s = Splice::new(Endpoint::ChatCompletions).unwrap();
    let ev = chat_chunk("Hello");
    let mut out = BytesMut::new();
    s.pass(&ev.as_bytes()[..10], &mut out, false);
    assert!(out.is_empty());
    s.pass(&ev.as_bytes()[10..], &mut out, false);
    assert_eq!(&out[..], ev.as_bytes());
    assert_eq!(s.delivered, "Hello");
}

#[test]
fn a_prefill_part_skips_the_repeated_tail() {
    let mut s = Splice::new(Endpoint::ChatCompletions).unwrap();
    let mut out = BytesMut::new();
    s.pass(
        chat_chunk("The answer is forty").as_bytes(),
        &mut out,
        false,
    );
    s.begin(false);
    let mut out = BytesMut::new();
    s.pass(chat_chunk("answer is forty").as_bytes(), &mut out, false);
    s.pass(chat_chunk("-two.").as_bytes(), &mut out, false);
    s.finish(&mut out, true);
    assert_eq!(body_text(&out), "-two.");
}

#[test]
fn a_replay_that_differs_fails() {
    let mut s = Splice::new(Endpoint::ChatCompletions).unwrap();
    let mut out = BytesMut::new();
    s.pass(chat_chunk("Hello there").as_bytes(), &mut out, false);
    s.begin(true);
    let mut out = BytesMut::new();
    s.pass(chat_chunk("Hello world").as_bytes(), &mut out, false);
    assert!(s.failure().is_some());
    assert!(out.is_empty());
}

#[test]
fn prefill_refusals_are_recognised() {
    assert!(refuses_prefill(
        400,
        br#"{"error":{"message":"This model does not support assistant message prefill."}}"#
    ));
    assert!(!refuses_prefill(400, br#"{"error":{"message":"bad"}}"#));
    assert!(!refuses_prefill(500, b"prefill"));
}
