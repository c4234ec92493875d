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
    let mut s = Splice::new(Endpoint::ChatCompletions, false).unwrap();
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
    let mut s = Splice::new(Endpoint::ChatCompletions, false).unwrap();
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
    let mut s = Splice::new(Endpoint::ChatCompletions, false).unwrap();
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

/// A Responses event as the translator writes it.
fn resp_event(v: Value) -> String {
    format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap_or(""))
}

/// The Responses events in `out` (de-chunked): `(type, data)`.
fn resp_events(out: &[u8]) -> Vec<(String, Value)> {
    let mut evs = Vec::new();
    for line in String::from_utf8_lossy(out).lines() {
        if let Some(d) = line.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(d)
        {
            evs.push((v["type"].as_str().unwrap_or("").to_owned(), v));
        }
    }
    evs
}

/// One part of a Responses stream: `response.created` (`id`), a reasoning item at output
/// index 0 (done), a message item `msg` at output index 1 with `text`, numbered from 0.
fn resp_part(id: &str, msg: &str, text: &str) -> Vec<String> {
    let r = json!({"id": id, "object": "response", "created_at": 7, "status": "in_progress",
        "output": [], "usage": null});
    let reasoning = json!({"id": "rs_1", "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Hmm."}]});
    [
        json!({"type": "response.created", "sequence_number": 0, "response": r}),
        json!({"type": "response.in_progress", "sequence_number": 1, "response": r}),
        json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 3,
            "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Hmm."}),
        json!({"type": "response.output_item.done", "sequence_number": 4, "output_index": 0,
            "item": reasoning}),
        json!({"type": "response.output_item.added", "sequence_number": 5, "output_index": 1,
            "item": {"id": msg, "type": "message", "status": "in_progress",
            "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "sequence_number": 6, "item_id": msg,
            "output_index": 1, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}),
        json!({"type": "response.output_text.delta", "sequence_number": 7, "item_id": msg,
            "output_index": 1, "content_index": 0, "delta": text}),
    ]
    .into_iter()
    .map(resp_event)
    .collect()
}

#[test]
fn a_responses_continuation_goes_on_in_the_clients_message_item_and_output() {
    let mut s = Splice::new(Endpoint::Responses, true).unwrap();
    let mut out = BytesMut::new();
    for ev in resp_part("resp_a", "msg_a", "Hello there, how") {
        s.pass(ev.as_bytes(), &mut out, false);
    }
    assert_eq!(resp_events(&out).len(), 8);
    s.begin(false);
    let mut out = BytesMut::new();
    let whole = "Hello there, how are you";
    let message = json!({"id": "msg_b", "type": "message", "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "there, how are you", "annotations": []}]});
    let mut later = resp_part("resp_b", "msg_b", "there, how are you");
    later.extend(
        [
            json!({"type": "response.output_text.done", "sequence_number": 8,
                "item_id": "msg_b", "output_index": 1, "content_index": 0,
                "text": "there, how are you"}),
            json!({"type": "response.content_part.done", "sequence_number": 9,
                "item_id": "msg_b", "output_index": 1, "content_index": 0,
                "part": {"type": "output_text", "text": "there, how are you",
                "annotations": []}}),
            json!({"type": "response.output_item.done", "sequence_number": 10,
                "output_index": 1, "item": message}),
            json!({"type": "response.completed", "sequence_number": 11,
                "response": {"id": "resp_b", "created_at": 9, "status": "completed",
                "output": [message], "usage": {"input_tokens": 30, "output_tokens": 5,
                "total_tokens": 35}}}),
        ]
        .into_iter()
        .map(resp_event),
    );
    for ev in later {
        s.pass(ev.as_bytes(), &mut out, true);
    }
    s.finish(&mut out, true);
    let evs = resp_events(&out);
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    // Its lifecycle start, reasoning and message start dropped; the 10 repeated characters
    // skipped; numbered on from the client's 8 events.
    assert_eq!(
        kinds,
        [
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let seq: Vec<u64> = evs
        .iter()
        .map(|(_, v)| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, [8, 9, 10, 11, 12]);
    assert_eq!(evs[0].1["delta"], " are you");
    for (_, v) in &evs[..3] {
        assert_eq!(
            (&v["item_id"], &v["output_index"]),
            (&json!("msg_a"), &json!(1))
        );
    }
    assert_eq!(evs[1].1["text"], whole);
    assert_eq!(evs[2].1["part"]["text"], whole);
    let item = &evs[3].1["item"];
    assert_eq!(
        (&item["id"], &item["content"][0]["text"]),
        (&json!("msg_a"), &json!(whole))
    );
    // The first part's id, creation time and reasoning item; usage: the prompt less the
    // first part's one delta, 1 + 5 output tokens.
    let r = &evs[4].1["response"];
    assert_eq!((&r["id"], &r["created_at"]), (&json!("resp_a"), &json!(7)));
    let reasoning = json!({"id": "rs_1", "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Hmm."}]});
    assert_eq!(r["output"], json!([reasoning, item]));
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 29, "output_tokens": 6, "total_tokens": 35})
    );
}

#[test]
fn a_responses_prefill_is_a_trailing_assistant_input_item() {
    let mut s = Splice::new(Endpoint::Responses, true).unwrap();
    s.delivered = "The answer ".to_owned();
    let body = |b: Option<Bytes>| serde_json::from_slice::<Value>(&b.unwrap()).unwrap();
    let got = body(s.prefill_body(br#"{"model":"m","input":"q"}"#, false));
    assert_eq!(
        got["input"],
        json!([{"role": "user", "content": "q"},
            {"role": "assistant", "content": "The answer "}])
    );
    let got = body(s.prefill_body(
        br#"{"input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi. "}]}]}"#,
        true,
    ));
    assert_eq!(
        got["input"][1]["content"],
        json!([{"type": "output_text", "text": "Hi. "},
            {"type": "output_text", "text": "The answer"}])
    );
    assert!(s.prefill_body(br#"{"messages":[]}"#, false).is_none());
    // A stream relayed as it is from a Responses provider is not continued.
    assert!(Splice::new(Endpoint::Responses, false).is_none());
}
