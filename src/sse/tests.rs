//! Table tests: every input is scanned whole, split at every byte offset and fed byte by
//! byte; the three transcripts must be identical and the whole one must match the table.
//! Then the classification of the three streaming shapes, and proptests.

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Event {
        name: Option<String>,
        data: Option<String>,
        comment: bool,
        frame: Frame,
    },
    TooLarge,
}

fn run(max: usize, pieces: &[&[u8]]) -> (Vec<Seen>, usize) {
    let mut s = Scanner::new(max);
    let mut seen = Vec::new();
    for p in pieces {
        s.feed(p, &mut |r| match r {
            Ok(ev) => {
                assert!(!ev.is_empty());
                seen.push(Seen::Event {
                    name: ev.name.map(|n| String::from_utf8_lossy(n).into_owned()),
                    data: ev.data.map(|d| String::from_utf8_lossy(d).into_owned()),
                    comment: ev.comment,
                    frame: classify(&ev),
                })
            }
            Err(SseError::EventTooLarge { limit }) => {
                assert_eq!(limit, max);
                seen.push(Seen::TooLarge)
            }
        });
        assert!(s.pending_len() <= max, "pending over the limit");
    }
    (seen, s.pending_len())
}

/// Scans whole, at every split point and byte by byte; returns the common transcript.
fn every_split(max: usize, input: &[u8]) -> Vec<Seen> {
    let whole = run(max, &[input]);
    for cut in 0..=input.len() {
        let (a, b) = input.split_at(cut);
        assert_eq!(run(max, &[a, b]), whole, "split at {cut}");
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(run(max, &bytes), whole, "byte by byte");
    whole.0
}

/// An event's fields: name, data, comment.
type Fields = (Option<String>, Option<String>, bool);

fn ev(
    name: Option<&str>,
    data: Option<&str>,
    comment: bool,
) -> (Option<String>, Option<String>, bool) {
    (name.map(str::to_owned), data.map(str::to_owned), comment)
}

fn fields(seen: &[Seen]) -> Vec<Fields> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Event {
                name,
                data,
                comment,
                ..
            } => Some((name.clone(), data.clone(), *comment)),
            Seen::TooLarge => None,
        })
        .collect()
}

#[test]
fn events_split_on_blank_lines_lf_and_crlf() {
    let rows: &[(&[u8], Vec<Fields>)] = &[
        (b"data: a\n\n", vec![ev(None, Some("a"), false)]),
        (b"data: a\r\n\r\n", vec![ev(None, Some("a"), false)]),
        (
            b"data:a\n\ndata: b\n\n",
            vec![ev(None, Some("a"), false), ev(None, Some("b"), false)],
        ),
        // Multi-line data joined with \n; only one leading space is stripped.
        (
            b"data: a\ndata:  b\ndata\n\n",
            vec![ev(None, Some("a\n b\n"), false)],
        ),
        (
            b"event: ping\ndata: {}\r\n\r\n",
            vec![ev(Some("ping"), Some("{}"), false)],
        ),
        // Mixed line ends inside one event.
        (
            b"event: x\r\ndata: 1\n\r\n",
            vec![ev(Some("x"), Some("1"), false)],
        ),
        (b": keep-alive\n\n", vec![ev(None, None, true)]),
        (b":\n: c\ndata: z\n\n", vec![ev(None, Some("z"), true)]),
        // Blank lines alone carry nothing; an unterminated event is held back.
        (b"\n\n\r\n\n", vec![]),
        (b"data: never ends\n", vec![]),
        (b"data: a\n\ndata: held", vec![ev(None, Some("a"), false)]),
        // id / retry / unknown fields are ignored; the last event name wins.
        (
            b"id: 7\nretry: 10\nfoo: bar\nevent: a\nevent: b\ndata: d\n\n",
            vec![ev(Some("b"), Some("d"), false)],
        ),
        // A lone CR is not a line end; "\r\r\n" is a line with content.
        (b"data: a\rb\n\n", vec![ev(None, Some("a\rb"), false)]),
        (b"data: a\n\r\r\n\n", vec![ev(None, Some("a"), false)]),
        (b"data: [DONE]\n\n", vec![ev(None, Some("[DONE]"), false)]),
    ];
    for (input, want) in rows {
        let got = every_split(1024, input);
        assert_eq!(&fields(&got), want, "{:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn an_oversize_event_is_one_typed_error_and_is_skipped_at_any_split() {
    let mut input = b"data: ok\n\n".to_vec();
    input.extend_from_slice(b"data: ");
    input.extend_from_slice(&[b'x'; 100]);
    input.extend_from_slice(b"\ndata: more\n\ndata: after\n\n");
    let got = every_split(64, &input);
    assert_eq!(got.len(), 3);
    assert!(matches!(&got[0], Seen::Event { data: Some(d), .. } if d == "ok"));
    assert_eq!(got[1], Seen::TooLarge);
    assert!(matches!(&got[2], Seen::Event { data: Some(d), .. } if d == "after"));
    // Exactly at the limit is fine; one byte over is not.
    let at = b"data: 0123456789\n\n";
    assert_eq!(every_split(at.len(), at).len(), 1);
    assert!(matches!(every_split(at.len(), at)[0], Seen::Event { .. }));
    assert_eq!(every_split(at.len() - 1, at), vec![Seen::TooLarge]);
}

#[test]
fn memory_stays_bounded_for_an_endless_event() {
    let mut s = Scanner::new(4096);
    let mut errors = 0;
    s.feed(b"data: ", &mut |_| {});
    for _ in 0..10_000 {
        s.feed(&[b'y'; 1000], &mut |r| {
            assert!(r.is_err());
            errors += 1;
        });
        assert!(s.pending_len() <= 4096);
        assert!(s.pending.capacity() <= 8192);
    }
    assert_eq!(errors, 1);
    let mut after = Vec::new();
    s.feed(b"\n\ndata: next\n\n", &mut |r| {
        if let Ok(ev) = r {
            after.push(ev.data.map(<[u8]>::to_vec));
        }
    });
    assert_eq!(after, vec![Some(b"next".to_vec())]);
}

fn frame_of(sse: &str) -> Frame {
    let got = every_split(64 * 1024, sse.as_bytes());
    assert_eq!(got.len(), 1, "{sse}");
    match &got[0] {
        Seen::Event { frame, .. } => *frame,
        Seen::TooLarge => unreachable!(),
    }
}

fn f(kind: FrameKind, output: bool) -> Frame {
    Frame {
        kind,
        output,
        done: false,
    }
}

#[test]
fn openai_chat_frames() {
    use FrameKind::*;
    let rows = [
        (
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
            f(Text, true),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"content":"\u00e9\n"}}]}"#,
            f(Text, true),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":""}}]}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"reasoning_details":[{"type":"reasoning.text"}]}}]}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
            f(Tool, true),
        ),
        (
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#,
            f(Usage, false),
        ),
        (r#"{"error":{"message":"overloaded"}}"#, f(Error, false)),
        // An error frame that still carries a delta is output.
        (
            r#"{"error":{"message":"x"},"choices":[{"delta":{"content":"more"}}]}"#,
            f(Text, true),
        ),
    ];
    for (json, want) in rows {
        assert_eq!(frame_of(&format!("data: {json}\n\n")), want, "{json}");
    }
    assert_eq!(
        frame_of("data: [DONE]\n\n"),
        Frame {
            kind: Lifecycle,
            output: false,
            done: true
        }
    );
    assert_eq!(frame_of(": OPENROUTER PROCESSING\n\n"), f(Comment, false));
    assert_eq!(frame_of("data: not json\n\n"), f(Other, false));
}

#[test]
fn anthropic_frames() {
    use FrameKind::*;
    let rows = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3}}}"#,
            f(Lifecycle, false),
        ),
        ("ping", r#"{"type": "ping"}"#, f(Lifecycle, false)),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            f(Lifecycle, false),
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            f(Reasoning, true),
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"x"}}"#,
            f(Reasoning, true),
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
            f(Tool, true),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            f(Text, true),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}"#,
            f(Text, true),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            f(Reasoning, true),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"text":"s","type":"signature_delta","signature":"EqQ"}}"#,
            f(Reasoning, true),
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}"#,
            f(Tool, true),
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
            f(Lifecycle, false),
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#,
            f(Usage, false),
        ),
        (
            "message_stop",
            r#"{"type":"message_stop"}"#,
            f(Lifecycle, false),
        ),
        (
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            f(Error, false),
        ),
    ];
    for (name, json, want) in rows {
        assert_eq!(
            frame_of(&format!("event: {name}\r\ndata: {json}\r\n\r\n")),
            want,
            "{json}"
        );
    }
    // The event name types the data when the JSON has no `type`.
    assert_eq!(frame_of("event: ping\ndata: {}\n\n"), f(Lifecycle, false));
    assert_eq!(frame_of("event: ping\n\n"), f(Lifecycle, false));
}

#[test]
fn responses_frames() {
    use FrameKind::*;
    let rows = [
        (
            r#"{"type":"response.created","response":{"id":"r"}}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"type":"response.in_progress","response":{"id":"r"}}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"type":"response.output_item.added","item":{"type":"message","role":"assistant"}}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"type":"response.output_item.added","item":{"type":"reasoning","id":"rs"}}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"type":"response.output_item.done","item":{"type":"reasoning","id":"rs"}}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"type":"response.output_item.added","item":{"type":"function_call","name":"f"}}"#,
            f(Tool, true),
        ),
        (
            r#"{"type":"response.reasoning_summary_text.delta","delta":"x"}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"type":"response.reasoning_summary_part.added","part":{}}"#,
            f(Reasoning, true),
        ),
        (
            r#"{"type":"response.content_part.added","part":{"type":"output_text","text":""}}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
            f(Text, true),
        ),
        (
            r#"{"type":"response.output_text.delta","delta":""}"#,
            f(Text, true),
        ),
        (
            r#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
            f(Tool, true),
        ),
        (
            r#"{"type":"response.audio.delta","delta":"AAA"}"#,
            f(Other, true),
        ),
        (
            r#"{"type":"response.output_text.done","text":"Hi"}"#,
            f(Lifecycle, false),
        ),
        (
            r#"{"type":"response.completed","response":{"usage":{"input_tokens":1}}}"#,
            f(Usage, false),
        ),
        (
            r#"{"type":"response.failed","response":{"error":{}}}"#,
            f(Error, false),
        ),
        (
            r#"{"type":"error","code":"x","message":"boom"}"#,
            f(Error, false),
        ),
    ];
    for (json, want) in rows {
        let ty = serde_json::from_str::<serde_json::Value>(json).unwrap()["type"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            frame_of(&format!("event: {ty}\ndata: {json}\n\n")),
            want,
            "{json}"
        );
    }
}

#[test]
fn odd_json_never_fails_classification() {
    for json in [
        r#"{"type":7}"#,
        r#"{"type":null,"choices":null}"#,
        r#"{"choices":{"a":1}}"#,
        r#"{"choices":[null,1,"x",{"delta":null},{"delta":{"content":7}}]}"#,
        r#"{"delta":[1,2],"item":"x","content_block":null}"#,
        r#"[1,2,3]"#,
        r#""str""#,
        r#"{"type":"\u0070ing"}"#,
    ] {
        let fr = frame_of(&format!("data: {json}\n\n"));
        assert!(!fr.output || json.contains("ing"), "{json}: {fr:?}");
    }
    assert_eq!(
        frame_of("data: {\"type\":\"\\u0070ing\"}\n\n"),
        f(FrameKind::Lifecycle, false)
    );
}

/// `parse` as it was before session 7: lines split by a closure per byte.
fn parse_by_split<'a>(raw: &'a [u8], joined: &'a mut Vec<u8>) -> Event<'a> {
    event_of_lines(raw.split(|&b| b == b'\n'), joined)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// An event's lines read with memchr give what splitting by a closure gave.
    #[test]
    fn parse_reads_lines_as_a_split_did(
        parts in proptest::collection::vec(proptest::sample::select(vec![
            "\n", "\r", ":", " ", "data", "event", "x",
        ]), 0..40),
    ) {
        let raw = parts.concat().into_bytes();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        prop_assert_eq!(parse(&raw, &mut a), parse_by_split(&raw, &mut b));
    }

    /// However arbitrary bytes are split, the events (and errors) are the same.
    #[test]
    fn any_split_gives_the_same_events(
        input in proptest::collection::vec(prop_oneof![
            Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), Just(b'd'), Just(b'a'),
            Just(b't'), Just(b'{'), Just(b'}'), any::<u8>(),
        ], 0..300),
        cuts in proptest::collection::vec(0usize..300, 0..6),
        max in 8usize..200,
    ) {
        let whole = run(max, &[&input]);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut at = 0;
        for c in cuts {
            pieces.push(&input[at..c]);
            at = c;
        }
        pieces.push(&input[at..]);
        prop_assert_eq!(run(max, &pieces), whole);
    }

    /// Events read line by line as the scanner finds their lines (each event whole in one
    /// piece) are the events read from the held bytes (each event cut, fed byte by byte).
    #[test]
    fn events_read_in_place_are_the_events_read_from_held_bytes(
        input in proptest::collection::vec(proptest::sample::select(vec![
            "\n", "\r", ":", " ", "data", "event", "data: x", "event: e", ": c", "id: 1",
            "\r\n", "\n\n", "{\"a\":1}",
        ]), 0..60),
        max in 2usize..400,
    ) {
        let input = input.concat().into_bytes();
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        prop_assert_eq!(run(max, &[&input]), run(max, &bytes));
    }

    /// Well-formed events come out exactly as written, with either line end.
    #[test]
    fn written_events_come_back(
        events in proptest::collection::vec(
            (proptest::option::of("[a-z_.]{1,12}"), proptest::collection::vec("[ -~]{0,20}", 1..4)),
            0..8),
        crlf in any::<bool>(),
        piece in 1usize..17,
    ) {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut wire = String::new();
        for (name, lines) in &events {
            if let Some(n) = name {
                wire.push_str(&format!("event: {n}{nl}"));
            }
            for l in lines {
                wire.push_str(&format!("data: {l}{nl}"));
            }
            wire.push_str(nl);
        }
        let bytes = wire.as_bytes();
        let pieces: Vec<&[u8]> = bytes.chunks(piece).collect();
        let (seen, pending) = run(1 << 16, &pieces);
        prop_assert_eq!(pending, 0);
        let want: Vec<_> = events
            .iter()
            .map(|(n, lines)| (n.clone(), Some(lines.join("\n")), false))
            .collect();
        prop_assert_eq!(fields(&seen), want);
    }
}
