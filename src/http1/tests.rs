//! Table tests for the whole codec: every input is decoded in one shot, split at every byte
//! offset, and fed byte by byte; all three transcripts (heads, concatenated body data, error,
//! leftover bytes) must be identical, and the one-shot one must match the table.

use bytes::BytesMut;
use proptest::prelude::*;

use super::encode::reason_phrase;
use super::*;

/// Calls `check` with every head of `heads` cut at every length, and with each of its bytes
/// in turn replaced by, and preceded by, each byte of `swaps` (the fast-path-against-slow-path
/// tests of the request and response heads).
pub(super) fn each_variant(heads: &[&[u8]], swaps: &[u8], mut check: impl FnMut(&[u8])) {
    for head in heads {
        for len in 0..=head.len() {
            check(&head[..len]);
        }
        for at in 0..head.len() {
            for &b in swaps {
                let mut v = head.to_vec();
                v[at] = b;
                check(&v);
                v.insert(at, b);
                check(&v);
            }
        }
    }
}

/// Which side of the gateway a driver plays: decoding requests, or responses to `Method`.
#[derive(Clone, Copy, Debug)]
enum Side {
    Request,
    Response(Method),
}

/// A decoded head, flattened to owned values so transcripts can be compared.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Msg {
    /// Method (requests) or status code and reason (responses).
    line: String,
    target: String,
    path: String,
    query: Option<String>,
    minor: u8,
    headers: Vec<(String, Vec<u8>)>,
    kind: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
    raw: Vec<u8>,
    body: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Head(HeadError),
    Body(BodyError),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Transcript {
    msgs: Vec<Msg>,
    failure: Option<Failure>,
    leftover: Vec<u8>,
}

fn request_msg(h: &RequestHead) -> Msg {
    assert_eq!(
        h.method().as_str() == h.method_str(),
        h.method() != Method::Other
    );
    assert_ne!(h.body_kind(), BodyKind::CloseDelimited);
    Msg {
        line: h.method_str().to_owned(),
        target: h.target().to_owned(),
        path: h.path().to_owned(),
        query: h.query().map(str::to_owned),
        minor: h.minor_version(),
        headers: h
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        kind: h.body_kind(),
        keep_alive: h.keep_alive(),
        expect_continue: h.expect_continue(),
        raw: h.raw().to_vec(),
        body: Vec::new(),
    }
}

fn response_msg(h: &ResponseHead) -> Msg {
    Msg {
        line: format!("{} {}", h.status(), h.reason()),
        target: String::new(),
        path: String::new(),
        query: None,
        minor: h.minor_version(),
        headers: h
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        kind: h.body_kind(),
        keep_alive: h.keep_alive(),
        expect_continue: false,
        raw: h.raw().to_vec(),
        body: Vec::new(),
    }
}

/// Feeds bytes as they "arrive" and decodes heads and bodies until it must wait.
struct Driver {
    side: Side,
    buf: BytesMut,
    current: Option<(Msg, BodyDecoder)>,
    out: Transcript,
}

impl Driver {
    fn new(side: Side) -> Self {
        Driver {
            side,
            buf: BytesMut::new(),
            current: None,
            out: Transcript::default(),
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.pump();
    }

    fn pump(&mut self) {
        while self.out.failure.is_none() {
            if matches!(self.side, Side::Response(_))
                && self.current.is_none()
                && !self.out.msgs.is_empty()
            {
                return; // one response per request; what follows is not ours to read
            }
            let Some((msg, dec)) = self.current.as_mut() else {
                let before = self.buf.clone();
                let decoded = match self.side {
                    Side::Request => decode_request_head(&mut self.buf).map(|d| match d {
                        Decoded::Partial => None,
                        Decoded::Complete(h) => Some(request_msg(&h)),
                    }),
                    Side::Response(method) => {
                        decode_response_head(&mut self.buf, method).map(|d| match d {
                            Decoded::Partial => None,
                            Decoded::Complete(h) => Some(response_msg(&h)),
                        })
                    }
                };
                match decoded {
                    Ok(None) => {
                        // Requests: untouched. Responses: only interim heads may have gone.
                        match self.side {
                            Side::Request => {
                                assert_eq!(self.buf, before, "Partial touched the buffer")
                            }
                            Side::Response(_) => assert!(before.ends_with(&self.buf)),
                        }
                        return;
                    }
                    Ok(Some(msg)) => {
                        assert!(before.ends_with(&self.buf));
                        let dec = BodyDecoder::new(msg.kind);
                        self.current = Some((msg, dec));
                    }
                    Err(e) => self.out.failure = Some(Failure::Head(e)),
                }
                continue;
            };
            match dec.decode(&mut self.buf) {
                Ok(BodyEvent::Data(data)) => {
                    assert!(!data.is_empty(), "empty Data");
                    msg.body.extend_from_slice(&data);
                }
                Ok(BodyEvent::NeedMore) => {
                    assert!(!dec.is_done());
                    return;
                }
                Ok(BodyEvent::Done) => {
                    assert!(dec.is_done());
                    let before = self.buf.clone();
                    assert!(matches!(dec.decode(&mut self.buf), Ok(BodyEvent::Done)));
                    assert_eq!(self.buf, before, "Done must leave the next message alone");
                    if let Some((msg, _)) = self.current.take() {
                        self.out.msgs.push(msg);
                    }
                }
                Err(e) => self.out.failure = Some(Failure::Body(e)),
            }
        }
    }

    /// The peer closed.
    fn finish(mut self) -> Transcript {
        if self.out.failure.is_none()
            && let Some((msg, mut dec)) = self.current.take()
        {
            match dec.on_eof() {
                Ok(()) => {
                    assert!(dec.is_done());
                    self.out.msgs.push(msg);
                }
                Err(e) => self.out.failure = Some(Failure::Body(e)),
            }
        }
        self.out.leftover = self.buf.to_vec();
        self.out
    }
}

fn run(side: Side, pieces: &[&[u8]]) -> Transcript {
    let mut driver = Driver::new(side);
    for piece in pieces {
        driver.feed(piece);
    }
    driver.finish()
}

/// Decodes `input` one-shot, at every split point and byte by byte (large inputs: a sample
/// of split points and small pieces), asserts all agree, and returns the transcript.
fn decode_every_way(side: Side, input: &[u8]) -> Transcript {
    let whole = run(side, &[input]);
    let small = input.len() <= 4096;
    let splits: Vec<usize> = if small {
        (0..=input.len()).collect()
    } else {
        (0..=input.len())
            .filter(|k| {
                k % 251 == 0 || k.abs_diff(MAX_HEAD_BYTES) < 8 || k.abs_diff(input.len()) < 8
            })
            .collect()
    };
    for k in splits {
        let (a, b) = input.split_at(k);
        assert_eq!(run(side, &[a, b]), whole, "split at {k}");
    }
    let piece = if small { 1 } else { 97 };
    let pieces: Vec<&[u8]> = input.chunks(piece).collect();
    assert_eq!(run(side, &pieces), whole, "fed in pieces of {piece}");
    whole
}

/// What a table row expects of one decoded message.
struct Want {
    line: &'static str,
    target: &'static str,
    kind: BodyKind,
    keep_alive: bool,
    body: &'static [u8],
}

fn want(
    line: &'static str,
    target: &'static str,
    kind: BodyKind,
    keep_alive: bool,
    body: &'static [u8],
) -> Want {
    Want {
        line,
        target,
        kind,
        keep_alive,
        body,
    }
}

/// Name, input, the messages it must decode to, and the bytes left over.
type ValidRow = (&'static str, Vec<u8>, Vec<Want>, &'static [u8]);
/// The same, for responses to a given request method.
type ResponseRow = (&'static str, Side, Vec<u8>, Vec<Want>, &'static [u8]);

fn check(name: &str, got: &Transcript, wants: &[Want], failure: Option<Failure>, leftover: &[u8]) {
    assert_eq!(got.failure, failure, "{name}: failure");
    assert_eq!(got.msgs.len(), wants.len(), "{name}: message count");
    for (i, (m, w)) in got.msgs.iter().zip(wants).enumerate() {
        assert_eq!(m.line, w.line, "{name}[{i}]: line");
        assert_eq!(m.target, w.target, "{name}[{i}]: target");
        assert_eq!(m.kind, w.kind, "{name}[{i}]: body kind");
        assert_eq!(m.keep_alive, w.keep_alive, "{name}[{i}]: keep-alive");
        assert_eq!(m.body, w.body, "{name}[{i}]: body");
    }
    assert_eq!(got.leftover, leftover, "{name}: leftover");
}

fn headers_block(n: usize) -> String {
    (0..n).map(|i| format!("X-H{i}: v{i}\r\n")).collect()
}

/// A GET head of exactly `len` bytes.
fn head_of_len(len: usize) -> Vec<u8> {
    let start = "GET / HTTP/1.1\r\nX-Pad: ";
    let end = "\r\n\r\n";
    let pad = len - start.len() - end.len();
    format!("{start}{}{end}", "a".repeat(pad)).into_bytes()
}

const ORIGIN_FORM_GET: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: gw.local\r\nAccept: */*\r\n\r\n";

#[test]
fn valid_requests_decode_the_same_at_every_split() {
    use BodyKind::*;
    let cases: Vec<ValidRow> = vec![
        ("get", ORIGIN_FORM_GET.to_vec(), vec![want("GET", "/v1/models", Empty, true, b"")], b""),
        (
            "post_content_length",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"model\":\"gpt-4\"}".to_vec(),
            vec![want("POST", "/v1/chat/completions", Length(17), true, b"{\"model\":\"gpt-4\"}")],
            b"",
        ),
        (
            "chunked_extensions_trailers",
            b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;name=val\r\nhello\r\n6 ; a=\"q;x\"\r\n world\r\n000\r\nX-Checksum: abc\r\nX-Other:\t1 \r\n\r\n".to_vec(),
            vec![want("POST", "/up", Chunked, true, b"hello world")],
            b"",
        ),
        (
            "chunked_upper_hex_and_case",
            b"PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n".to_vec(),
            vec![want("PUT", "/x", Chunked, true, b"0123456789")],
            b"",
        ),
        (
            "pipelined",
            b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nPOST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /c HTTP/1.1\r\n".to_vec(),
            vec![want("GET", "/a", Empty, true, b""), want("POST", "/b", Length(3), true, b"abc")],
            b"GET /c HTTP/1.1\r\n",
        ),
        (
            "http10_keep_alive",
            b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n".to_vec(),
            vec![want("GET", "/", Empty, true, b"")],
            b"",
        ),
        ("http10_default_close", b"GET / HTTP/1.0\r\n\r\n".to_vec(), vec![want("GET", "/", Empty, false, b"")], b""),
        (
            "connection_token_list",
            b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, Close\r\n\r\n".to_vec(),
            vec![want("GET", "/", Empty, false, b"")],
            b"",
        ),
        (
            "http10_keep_alive_and_close",
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n".to_vec(),
            vec![want("GET", "/", Empty, false, b"")],
            b"",
        ),
        (
            "expect_continue",
            b"POST /v1/messages HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\nhi".to_vec(),
            vec![want("POST", "/v1/messages", Length(2), true, b"hi")],
            b"",
        ),
        (
            "leading_crlfs",
            b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            vec![want("GET", "/", Empty, true, b"")],
            b"",
        ),
        (
            "query",
            b"GET /search?q=a%20b&x=?1 HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            vec![want("GET", "/search?q=a%20b&x=?1", Empty, true, b"")],
            b"",
        ),
        (
            "repeated_identical_content_length",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3, 003\r\n\r\nxyz".to_vec(),
            vec![want("POST", "/", Length(3), true, b"xyz")],
            b"",
        ),
        (
            "content_length_zero",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n".to_vec(),
            vec![want("POST", "/", Length(0), true, b"")],
            b"",
        ),
        ("other_method", b"PROPFIND /d HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(), vec![want("PROPFIND", "/d", Empty, true, b"")], b""),
        (
            "empty_and_obs_text_values",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-Empty:\r\nX-Obs: caf\xe9\r\n\r\n".to_vec(),
            vec![want("GET", "/", Empty, true, b"")],
            b"",
        ),
        (
            "96_headers",
            format!("GET / HTTP/1.1\r\n{}\r\n", headers_block(96)).into_bytes(),
            vec![want("GET", "/", Empty, true, b"")],
            b"",
        ),
        ("head_at_limit", head_of_len(MAX_HEAD_BYTES), vec![want("GET", "/", Empty, true, b"")], b""),
    ];
    for (name, input, wants, leftover) in cases {
        let got = decode_every_way(Side::Request, &input);
        check(name, &got, &wants, None, leftover);
    }
}

/// `tchar` (RFC 9110 §5.6.2) is exactly the letters, digits and `!#$%&'*+-.^_`|~`.
#[test]
fn tchar_is_the_rfc_set() {
    let specials = b"!#$%&'*+-.^_`|~";
    for b in 0..=255u8 {
        let want = b.is_ascii_alphanumeric() || specials.contains(&b);
        assert_eq!(head::is_tchar(b), want, "byte {b:#04x}");
    }
}

/// Targets on either side of the length kept as a string of their own read the same:
/// the target as sent, its path up to the first `?`, the query after it, non-ASCII
/// (UTF-8) bytes included.
#[test]
fn request_targets_of_every_length_read_as_sent() {
    for len in [1usize, 2, 20, 63, 64, 65, 200, 4000] {
        for with_query in [false, true] {
            let path: String = std::iter::once('/')
                .chain("v1/é/models".chars().cycle())
                .take(len.max(1))
                .collect();
            let target = if with_query {
                format!("{path}?a=1&b=ü")
            } else {
                path.clone()
            };
            let mut buf =
                BytesMut::from(format!("GET {target} HTTP/1.1\r\nhost: x\r\n\r\n").as_str());
            let Ok(Decoded::Complete(h)) = decode_request_head(&mut buf) else {
                panic!("expected a head for {target:?}");
            };
            assert_eq!(h.target(), target);
            assert_eq!(h.path(), path);
            assert_eq!(h.query(), with_query.then_some("a=1&b=ü"));
            let copy = h.clone();
            assert_eq!(copy.target(), target);
            assert_eq!(copy, h);
        }
    }
}

#[test]
fn request_head_accessors() {
    let mut buf = BytesMut::from(
        &b"\r\nPOST /v1/chat/completions?beta=true HTTP/1.1\r\nHost: gw\r\nX-Stainless-Lang: js\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n{}"[..],
    );
    let start = buf.as_ptr() as usize;
    let Ok(Decoded::Complete(h)) = decode_request_head(&mut buf) else {
        panic!("expected a head");
    };
    assert_eq!(
        h.raw().as_ptr() as usize,
        start + 2,
        "the head is split off, not copied"
    );
    assert_eq!(h.method(), Method::Post);
    assert_eq!(h.method_str(), "POST");
    assert_eq!(h.path(), "/v1/chat/completions");
    assert_eq!(h.query(), Some("beta=true"));
    assert_eq!(h.minor_version(), 1);
    assert_eq!(h.header("x-stainless-lang"), Some(&b"js"[..]));
    assert_eq!(h.header("HOST"), Some(&b"gw"[..]));
    assert_eq!(h.header("missing"), None);
    assert_eq!(h.header_count(), 4);
    let names: Vec<&str> = h.headers().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["Host", "X-Stainless-Lang", "expect", "content-length"]
    );
    assert!(h.expect_continue());
    assert!(h.raw().starts_with(b"POST ") && h.raw().ends_with(b"\r\n\r\n"));
    assert_eq!(&buf[..], b"{}");

    let mut buf = BytesMut::from(
        &b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx"[..],
    );
    let Ok(Decoded::Complete(h)) = decode_request_head(&mut buf) else {
        panic!("expected a head");
    };
    assert!(!h.expect_continue(), "1.0 ignores 100-continue");
    assert_eq!(h.query(), None);
}

#[test]
fn invalid_requests_fail_the_same_at_every_split() {
    use HeadError::*;
    let head = |e| Some(Failure::Head(e));
    let body = |e| Some(Failure::Body(e));
    let chunked = |b: &str| {
        format!("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n{b}").into_bytes()
    };
    let with = |fields: &str| format!("POST / HTTP/1.1\r\nHost: h\r\n{fields}\r\n").into_bytes();
    let cases: Vec<(&str, Vec<u8>, Option<Failure>)> = vec![
        (
            "head_one_over_limit",
            head_of_len(MAX_HEAD_BYTES + 1),
            head(TooLarge),
        ),
        (
            "head_never_ends",
            format!("GET / HTTP/1.1\r\n{}", headers_block(1500)).into_bytes(),
            head(TooLarge),
        ),
        (
            "only_empty_lines",
            b"\r\n".repeat(MAX_HEAD_BYTES / 2),
            head(TooLarge),
        ),
        (
            "97_headers",
            format!("GET / HTTP/1.1\r\n{}\r\n", headers_block(97)).into_bytes(),
            head(TooManyHeaders),
        ),
        (
            "cl_and_te",
            with("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
            head(ConflictingFraming),
        ),
        (
            "te_and_bad_cl",
            with("Transfer-Encoding: chunked\r\nContent-Length: x\r\n"),
            head(ConflictingFraming),
        ),
        (
            "cl_alpha",
            with("Content-Length: abc\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_negative",
            with("Content-Length: -1\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_plus",
            with("Content-Length: +1\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_overflow",
            with("Content-Length: 18446744073709551616\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_differing",
            with("Content-Length: 5\r\nContent-Length: 6\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_list_differing",
            with("Content-Length: 1, 2\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_empty",
            with("Content-Length:\r\n"),
            head(BadContentLength),
        ),
        (
            "cl_inner_space",
            with("Content-Length: 1 2\r\n"),
            head(BadContentLength),
        ),
        (
            "te_gzip",
            with("Transfer-Encoding: gzip\r\n"),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_gzip_chunked",
            with("Transfer-Encoding: gzip, chunked\r\n"),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_chunked_twice",
            with("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_chunked_param",
            with("Transfer-Encoding: chunked;q=1\r\n"),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_empty",
            with("Transfer-Encoding:\r\n"),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_in_http10",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            head(UnsupportedTransferEncoding),
        ),
        (
            "h2_preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            head(UnsupportedVersion),
        ),
        (
            "http_1_2",
            b"GET / HTTP/1.2\r\nHost: h\r\n\r\n".to_vec(),
            head(UnsupportedVersion),
        ),
        (
            "space_before_colon",
            b"GET / HTTP/1.1\r\nHost : h\r\n\r\n".to_vec(),
            head(Malformed("invalid header name")),
        ),
        (
            "bare_lf_in_head",
            b"GET / HTTP/1.1\nHost: h\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_terminated",
            b"GET / HTTP/1.1\n\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        // Bare LFs at each kind of line end `httparse` accepts them at: the decoder's
        // whole-head fast path must hand each of these to the slow path.
        (
            "bare_lf_after_field",
            b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_empty_field",
            b"GET / HTTP/1.1\r\nX:\nHost: h\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_trailing_whitespace",
            b"GET / HTTP/1.1\r\nX: a \t\nHost: h\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_ends_head",
            b"GET / HTTP/1.1\r\nHost: h\r\n\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_skipped_lines",
            b"\r\n\r\nGET / HTTP/1.1\r\nHost: h\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "leading_bare_lf",
            b"\nGET / HTTP/1.1\r\n\r\n".to_vec(),
            head(Malformed("invalid request line")),
        ),
        (
            "tls_client_hello",
            vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc],
            head(Malformed("invalid request line")),
        ),
        (
            "space_in_target",
            b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            head(Malformed("invalid request line")),
        ),
        (
            "http_0_9",
            b"GET /\r\n\r\n".to_vec(),
            head(Malformed("invalid request line")),
        ),
        (
            "lowercase_version",
            b"GET / http/1.1\r\n\r\n".to_vec(),
            head(Malformed("invalid request line")),
        ),
        (
            "nul_in_value",
            b"GET / HTTP/1.1\r\nX: a\0b\r\n\r\n".to_vec(),
            head(Malformed("invalid header value")),
        ),
        (
            "bare_cr_in_value",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n".to_vec(),
            head(Malformed("invalid header value")),
        ),
        (
            "obs_fold",
            b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n".to_vec(),
            head(Malformed("invalid header name")),
        ),
        (
            "two_hosts",
            b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n".to_vec(),
            head(Malformed("more than one Host field")),
        ),
        (
            "chunk_size_not_hex",
            chunked("zz\r\n"),
            body(BodyError::Malformed("invalid chunk size")),
        ),
        (
            "chunk_size_trailing_space",
            chunked("3 \r\nabc\r\n"),
            body(BodyError::Malformed("invalid chunk size")),
        ),
        (
            "chunk_size_negative",
            chunked("-3\r\nabc\r\n"),
            body(BodyError::Malformed("invalid chunk size")),
        ),
        (
            "chunk_size_overflow",
            chunked("10000000000000000\r\n"),
            body(BodyError::Malformed("chunk size overflows")),
        ),
        (
            "chunk_bare_lf",
            chunked("3\nabc\r\n0\r\n\r\n"),
            body(BodyError::Malformed("bare LF")),
        ),
        (
            "chunk_missing_crlf",
            chunked("3\r\nabcX\r\n"),
            body(BodyError::Malformed("missing CRLF after chunk data")),
        ),
        (
            "chunk_lf_only_after_data",
            chunked("3\r\nabc\n0\r\n\r\n"),
            body(BodyError::Malformed("missing CRLF after chunk data")),
        ),
        (
            "chunk_ext_control",
            chunked("3;a\x01\r\nabc\r\n"),
            body(BodyError::Malformed("invalid chunk extension")),
        ),
        (
            "chunk_line_too_long",
            chunked(&format!(
                "3;{}\r\nabc\r\n",
                "e".repeat(MAX_CHUNK_LINE_BYTES)
            )),
            body(BodyError::Malformed("chunk-size line too long")),
        ),
        (
            "trailers_too_large",
            chunked(&format!(
                "0\r\nX-Big: {}\r\n\r\n",
                "t".repeat(MAX_TRAILER_BYTES)
            )),
            body(BodyError::Malformed("trailer section too large")),
        ),
        (
            "trailer_not_a_field",
            chunked("0\r\nnot a field\r\n\r\n"),
            body(BodyError::Malformed("invalid trailer field")),
        ),
        (
            "trailer_bare_lf",
            chunked("0\r\nX: y\n\r\n"),
            body(BodyError::Malformed("bare LF")),
        ),
        (
            "chunked_truncated",
            chunked("5\r\nhel"),
            body(BodyError::UnexpectedEof),
        ),
        (
            "chunked_no_last_chunk",
            chunked("5\r\nhello\r\n"),
            body(BodyError::UnexpectedEof),
        ),
        (
            "length_truncated",
            with("Content-Length: 10\r\n")
                .into_iter()
                .chain(*b"abc")
                .collect(),
            body(BodyError::UnexpectedEof),
        ),
    ];
    for (name, input, failure) in cases {
        let got = decode_every_way(Side::Request, &input);
        assert_eq!(got.failure, failure, "{name}");
        assert!(got.failure.is_some(), "{name}");
    }
}

#[test]
fn head_limit_is_exact() {
    let mut at = BytesMut::from(&head_of_len(MAX_HEAD_BYTES)[..]);
    assert!(matches!(
        decode_request_head(&mut at),
        Ok(Decoded::Complete(_))
    ));
    let mut over = BytesMut::from(&head_of_len(MAX_HEAD_BYTES + 1)[..]);
    assert_eq!(decode_request_head(&mut over), Err(HeadError::TooLarge));
    // One byte short of the limit and still incomplete: wait.
    let mut short = BytesMut::from(&head_of_len(MAX_HEAD_BYTES + 1)[..MAX_HEAD_BYTES - 1]);
    assert_eq!(decode_request_head(&mut short), Ok(Decoded::Partial));
}

#[test]
fn valid_responses_decode_the_same_at_every_split() {
    use BodyKind::*;
    let post = Side::Response(Method::Post);
    let cases: Vec<ResponseRow> = vec![
        (
            "200_content_length",
            post,
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}".to_vec(),
            vec![want("200 OK", "", Length(11), true, b"{\"ok\":true}")],
            b"",
        ),
        (
            "200_chunked_sse",
            post,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n11\r\ndata: {\"a\":1}\n\n\r\n\r\n0e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n".to_vec(),
            vec![want("200 OK", "", Chunked, true, b"data: {\"a\":1}\n\n\r\ndata: [DONE]\n\n")],
            b"",
        ),
        (
            "close_delimited",
            post,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end\r\n\r\nof the stream".to_vec(),
            vec![want("200 OK", "", CloseDelimited, false, b"until the end\r\n\r\nof the stream")],
            b"",
        ),
        ("204", post, b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(), vec![want("204 No Content", "", Empty, true, b"")], b""),
        (
            "204_framing_ignored",
            post,
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            vec![want("204 No Content", "", Empty, true, b"")],
            b"",
        ),
        (
            "304",
            Side::Response(Method::Get),
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\nETag: \"x\"\r\n\r\n".to_vec(),
            vec![want("304 Not Modified", "", Empty, true, b"")],
            b"",
        ),
        (
            "head_response",
            Side::Response(Method::Head),
            b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n".to_vec(),
            vec![want("200 OK", "", Empty, true, b"")],
            b"",
        ),
        (
            "100_continue_then_200",
            post,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            vec![want("200 OK", "", Length(2), true, b"ok")],
            b"",
        ),
        (
            "103_then_200",
            post,
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec(),
            vec![want("200 OK", "", Length(0), true, b"")],
            b"",
        ),
        (
            "101_is_final",
            Side::Response(Method::Get),
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec(),
            vec![want("101 Switching Protocols", "", Empty, true, b"")],
            b"",
        ),
        (
            "http10_length",
            post,
            b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
            vec![want("200 OK", "", Length(3), false, b"abc")],
            b"",
        ),
        (
            "http10_keep_alive",
            post,
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
            vec![want("200 OK", "", Length(3), true, b"abc")],
            b"",
        ),
        (
            "connection_close",
            post,
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
            vec![want("429 Too Many Requests", "", Length(2), false, b"{}")],
            b"",
        ),
        (
            "leading_crlf_no_reason",
            post,
            b"\r\nHTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            vec![want("200 ", "", Length(1), true, b"x")],
            b"",
        ),
        (
            "custom_status",
            post,
            b"HTTP/1.1 529 Overloaded\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            vec![want("529 Overloaded", "", Length(1), true, b"x")],
            b"",
        ),
        (
            "extra_bytes_after_length",
            post,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxyz".to_vec(),
            vec![want("200 OK", "", Length(1), true, b"x")],
            b"yz",
        ),
    ];
    for (name, side, input, wants, leftover) in cases {
        let got = decode_every_way(side, &input);
        check(name, &got, &wants, None, leftover);
    }
}

#[test]
fn invalid_responses_fail_the_same_at_every_split() {
    use HeadError::*;
    let head = |e| Some(Failure::Head(e));
    let post = Side::Response(Method::Post);
    let huge = format!(
        "HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n",
        "b".repeat(MAX_RESPONSE_HEAD_BYTES)
    );
    let cases: Vec<(&str, Vec<u8>, Option<Failure>)> = vec![
        (
            "cl_and_te",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            head(ConflictingFraming),
        ),
        (
            "bad_cl",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3x\r\n\r\n".to_vec(),
            head(BadContentLength),
        ),
        (
            "te_gzip",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            head(UnsupportedTransferEncoding),
        ),
        (
            "te_in_http10",
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            head(UnsupportedTransferEncoding),
        ),
        (
            "http2_status",
            b"HTTP/2.0 200 OK\r\n\r\n".to_vec(),
            head(UnsupportedVersion),
        ),
        (
            "no_space_after_version",
            b"HTTP/1.1200 OK\r\n\r\n".to_vec(),
            head(Malformed("invalid status line")),
        ),
        (
            "not_http",
            b"FOO/1.1 200 OK\r\n\r\n".to_vec(),
            head(Malformed("invalid status line")),
        ),
        (
            "short_status",
            b"HTTP/1.1 20 OK\r\n\r\n".to_vec(),
            head(Malformed("invalid status line")),
        ),
        (
            "status_below_100",
            b"HTTP/1.1 099 Odd\r\n\r\n".to_vec(),
            head(Malformed("invalid status line")),
        ),
        (
            "space_before_colon",
            b"HTTP/1.1 200 OK\r\nServer : x\r\n\r\n".to_vec(),
            head(Malformed("invalid header name")),
        ),
        ("too_large", huge.into_bytes(), head(TooLarge)),
        (
            "bare_lf_after_status_line",
            b"HTTP/1.1 200 OK\nServer: x\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_field",
            b"HTTP/1.1 200 OK\r\nServer: x\nContent-Length: 0\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_empty_field",
            b"HTTP/1.1 200 OK\r\nX:\nContent-Length: 0\r\n\r\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_ends_head",
            b"HTTP/1.1 204 No Content\r\nServer: x\r\n\n".to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "bare_lf_after_interim_head",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX: y \nContent-Length: 0\r\n\r\n"
                .to_vec(),
            head(Malformed("bare LF")),
        ),
        (
            "truncated_chunked",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nonly part".to_vec(),
            Some(Failure::Body(BodyError::UnexpectedEof)),
        ),
        (
            "truncated_length",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec(),
            Some(Failure::Body(BodyError::UnexpectedEof)),
        ),
        (
            "headless_eof",
            b"HTTP/1.1 200 OK\r\nContent-Le".to_vec(),
            None,
        ),
    ];
    for (name, input, failure) in cases {
        let got = decode_every_way(post, &input);
        assert_eq!(got.failure, failure, "{name}");
        assert!(got.msgs.is_empty(), "{name}");
    }
}

#[test]
fn interim_heads_are_consumed_before_partial() {
    let mut buf = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"[..]);
    assert_eq!(
        decode_response_head(&mut buf, Method::Post),
        Ok(Decoded::Partial)
    );
    assert_eq!(&buf[..], b"HTTP/1.1 200 OK\r\n");
}

#[test]
fn response_head_accessors() {
    let mut buf = BytesMut::from(&b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nx-request-id: abc\r\nContent-Length: 0\r\n\r\n"[..]);
    let Ok(Decoded::Complete(h)) = decode_response_head(&mut buf, Method::Post) else {
        panic!("expected a head");
    };
    assert_eq!(h.status(), 503);
    assert_eq!(h.reason(), "Service Unavailable");
    assert_eq!(h.minor_version(), 1);
    assert_eq!(h.header("retry-after"), Some(&b"7"[..]));
    assert_eq!(h.header("X-Request-Id"), Some(&b"abc"[..]));
    assert_eq!(h.header_count(), 3);
    assert_eq!(h.headers().count(), 3);
    assert_eq!(h.body_kind(), BodyKind::Length(0));
    assert!(h.keep_alive());
    assert!(buf.is_empty());
}

/// The keep-alive decision as the answer says it: echoed to an HTTP/1.0 request that asked
/// for it, implied for HTTP/1.1, `close` otherwise.
#[test]
fn request_persistence_by_version_and_connection_field() {
    let cases: [(&[u8], Persist); 6] = [
        (
            b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            Persist::Echo,
        ),
        (b"GET / HTTP/1.0\r\n\r\n", Persist::Close),
        (
            b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
            Persist::Close,
        ),
        (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", Persist::KeepAlive),
        (
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
            Persist::KeepAlive,
        ),
        (
            b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            Persist::Close,
        ),
    ];
    for (bytes, want) in cases {
        let mut buf = BytesMut::from(bytes);
        let Ok(Decoded::Complete(h)) = decode_request_head(&mut buf) else {
            panic!("expected a head: {:?}", String::from_utf8_lossy(bytes));
        };
        assert_eq!(h.persist(), want, "{:?}", String::from_utf8_lossy(bytes));
        assert_eq!(h.persist().is_kept(), h.keep_alive());
    }
    assert_eq!(Persist::Echo.and(false), Persist::Close);
    assert_eq!(Persist::Echo.and(true), Persist::Echo);
    assert_eq!(Persist::KeepAlive.and(true), Persist::KeepAlive);
}

// ---- encoder ----

#[test]
fn response_head_exact_bytes() {
    let mut dst = BytesMut::new();
    let headers: [(&str, &[u8]); 2] = [
        ("Content-Type", b"application/json"),
        ("x-tidegate-provider", b"openai"),
    ];
    write_response_head(
        &mut dst,
        200,
        headers,
        Framing::Length(42),
        Persist::KeepAlive,
    );
    assert_eq!(
        &dst[..],
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-tidegate-provider: openai\r\nContent-Length: 42\r\n\r\n"
    );

    dst.clear();
    write_response_head(
        &mut dst,
        503,
        [("Retry-After", &b"5"[..])],
        Framing::Chunked,
        Persist::Close,
    );
    assert_eq!(
        &dst[..],
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );

    dst.clear();
    write_response_head(&mut dst, 204, [], Framing::NoBody, Persist::KeepAlive);
    assert_eq!(&dst[..], b"HTTP/1.1 204 No Content\r\n\r\n");

    dst.clear();
    write_response_head(&mut dst, 200, [], Framing::Close, Persist::KeepAlive);
    assert_eq!(&dst[..], b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");

    dst.clear();
    write_response_head(&mut dst, 200, [], Framing::Length(2), Persist::Echo);
    assert_eq!(
        &dst[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n"
    );

    // A close-delimited body ends the connection, whatever the request asked.
    dst.clear();
    write_response_head(&mut dst, 200, [], Framing::Close, Persist::Echo);
    assert_eq!(&dst[..], b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");

    dst.clear();
    write_response_head(&mut dst, 599, [], Framing::Length(0), Persist::KeepAlive);
    assert_eq!(&dst[..], b"HTTP/1.1 599 \r\nContent-Length: 0\r\n\r\n");

    dst.clear();
    write_response_head(
        &mut dst,
        42,
        [],
        Framing::Length(u64::MAX),
        Persist::KeepAlive,
    );
    assert_eq!(
        &dst[..],
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 18446744073709551615\r\n\r\n"
    );
}

/// The status line and the length field read as `format!` writes them, for every
/// three-digit status and lengths at each digit count's edges.
#[test]
fn status_lines_and_lengths_read_as_format_writes_them() {
    let mut lengths = vec![0u64, u64::MAX];
    let mut p = 1u64;
    while let Some(next) = p.checked_mul(10) {
        lengths.extend([p - 1, p, p + 1]);
        p = next;
    }
    lengths.push(p);
    for (i, status) in (100u16..=999).enumerate() {
        let n = lengths[i % lengths.len()];
        let mut dst = BytesMut::new();
        write_response_head(&mut dst, status, [], Framing::Length(n), Persist::KeepAlive);
        let want = format!(
            "HTTP/1.1 {status} {}\r\nContent-Length: {n}\r\n\r\n",
            reason_phrase(status)
        );
        assert_eq!(&dst[..], want.as_bytes());
    }
}

#[test]
fn request_head_exact_bytes() {
    let mut dst = BytesMut::new();
    let headers: [(&str, &[u8]); 2] = [
        ("Authorization", b"Bearer sk-x"),
        ("Content-Type", b"application/json"),
    ];
    write_request_head(
        &mut dst,
        "POST",
        "/v1/chat/completions",
        "api.openai.com",
        headers,
        Framing::Length(2),
    );
    assert_eq!(
        &dst[..],
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nAuthorization: Bearer sk-x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    );

    dst.clear();
    write_request_head(
        &mut dst,
        "GET",
        "/v1/models",
        "localhost:8080",
        [],
        Framing::NoBody,
    );
    assert_eq!(
        &dst[..],
        b"GET /v1/models HTTP/1.1\r\nHost: localhost:8080\r\n\r\n"
    );

    dst.clear();
    write_request_head(&mut dst, "POST", "", "h", [], Framing::Close);
    assert_eq!(
        &dst[..],
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    );

    dst.clear();
    write_request_head(&mut dst, "PATCH", "/x", "h", [], Framing::Chunked);
    assert_eq!(
        &dst[..],
        b"PATCH /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
}

#[test]
fn encoder_drops_injection_and_framing_fields() {
    let evil: [(&str, &[u8]); 11] = [
        ("X-Ok", b"fine"),
        ("X-Inject", b"a\r\nSet-Cookie: x=1"),
        ("X-Lf", b"a\nb"),
        ("X-Nul", b"a\0b"),
        ("X-Ctl", b"a\x7fb"),
        ("Bad Name", b"v"),
        ("Bad:Name", b"v"),
        ("", b"v"),
        ("content-LENGTH", b"0"),
        ("Transfer-Encoding", b"chunked"),
        ("CONNECTION", b"keep-alive"),
    ];
    let mut dst = BytesMut::new();
    write_response_head(&mut dst, 200, evil, Framing::Length(1), Persist::KeepAlive);
    assert_eq!(
        &dst[..],
        b"HTTP/1.1 200 OK\r\nX-Ok: fine\r\nContent-Length: 1\r\n\r\n"
    );

    dst.clear();
    let with_host: [(&str, &[u8]); 2] = [
        ("host", b"evil.example"),
        ("X-Inject", b"\r\n\r\nGET /smuggled HTTP/1.1"),
    ];
    write_request_head(
        &mut dst,
        "GE T\r\n",
        "/a b\r\nX: y",
        "h\r\nX: 1",
        with_host,
        Framing::NoBody,
    );
    assert_eq!(
        &dst[..],
        b"GET /a%20b%0D%0AX:%20y HTTP/1.1\r\nHost: hX:1\r\n\r\n"
    );
    let mut buf = dst.clone();
    let Ok(Decoded::Complete(h)) = decode_request_head(&mut buf) else {
        panic!("sanitised head must parse");
    };
    assert_eq!(h.header_count(), 1);
    assert!(buf.is_empty());

    dst.clear();
    write_request_head(&mut dst, "GET", "/caf\u{e9}", "h", [], Framing::NoBody);
    assert_eq!(&dst[..], b"GET /caf%C3%A9 HTTP/1.1\r\nHost: h\r\n\r\n");
}

#[test]
fn chunks_exact_bytes() {
    let mut dst = BytesMut::new();
    write_chunk(&mut dst, b"");
    assert!(dst.is_empty(), "an empty chunk would end the body");
    write_chunk(&mut dst, b"hello");
    write_chunk(&mut dst, &[b'x'; 26]);
    write_last_chunk(&mut dst);
    let mut want = b"5\r\nhello\r\n1A\r\n".to_vec();
    want.extend_from_slice(&[b'x'; 26]);
    want.extend_from_slice(b"\r\n0\r\n\r\n");
    assert_eq!(&dst[..], &want[..]);
    assert_eq!(CONTINUE_100, b"HTTP/1.1 100 Continue\r\n\r\n");
    assert_eq!(reason_phrase(429), "Too Many Requests");
    assert_eq!(reason_phrase(1), "");
    for name in [
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    ] {
        assert!(is_hop_by_hop_name(name.as_bytes()), "{name}");
        assert!(
            is_hop_by_hop_name(name.to_ascii_lowercase().as_bytes()),
            "{name}"
        );
    }
    for name in [
        "content-type",
        "t",
        "tf",
        "trailers",
        "upgrades",
        "connectio",
        "x-te",
        "",
    ] {
        assert!(!is_hop_by_hop_name(name.as_bytes()), "{name}");
    }
}

/// `is_listed`'s length test only ever skips names no compare would have matched.
#[test]
fn listed_names_are_found_by_any_case_and_nothing_else() {
    let names = ["te", "host", "x-api-key", "authorization", "content-length"];
    let lengths = name_lengths(&names);
    let plain = |n: &[u8]| names.iter().any(|h| h.as_bytes().eq_ignore_ascii_case(n));
    for n in names {
        assert!(is_listed(n.as_bytes(), &names, lengths), "{n}");
        assert!(
            is_listed(n.to_ascii_uppercase().as_bytes(), &names, lengths),
            "{n}"
        );
    }
    let others: Vec<Vec<u8>> = (0..70)
        .flat_map(|len| {
            [
                vec![b'a'; len],
                vec![b'-'; len],
                b"x-api-kez".repeat(len / 9 + 1),
            ]
        })
        .chain(["Host", "hosT", "tE", "x-api-keys", "authorizatio"].map(|n| n.as_bytes().to_vec()))
        .collect();
    for n in &others {
        assert_eq!(is_listed(n, &names, lengths), plain(n), "{n:?}");
    }
}

#[test]
fn encode_decode_round_trip() {
    let headers: [(&str, &[u8]); 3] = [
        ("Content-Type", b"text/event-stream"),
        ("Cache-Control", b"no-cache"),
        ("X-Obs", b"caf\xc3\xa9"),
    ];
    let mut wire = BytesMut::new();
    write_response_head(
        &mut wire,
        200,
        headers,
        Framing::Chunked,
        Persist::KeepAlive,
    );
    for part in [&b"data: 1\n\n"[..], b"", b"data: [DONE]\n\n"] {
        write_chunk(&mut wire, part);
    }
    write_last_chunk(&mut wire);
    let got = decode_every_way(Side::Response(Method::Post), &wire);
    assert_eq!(got.failure, None);
    let [msg] = &got.msgs[..] else {
        panic!("one response");
    };
    assert_eq!(msg.line, "200 OK");
    assert_eq!(msg.kind, BodyKind::Chunked);
    assert_eq!(msg.body, b"data: 1\n\ndata: [DONE]\n\n");
    let mut want: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.to_vec()))
        .collect();
    want.push(("Transfer-Encoding".to_owned(), b"chunked".to_vec()));
    assert_eq!(msg.headers, want);

    let mut wire = BytesMut::new();
    write_request_head(
        &mut wire,
        "POST",
        "/v1/messages?beta=1",
        "api.anthropic.com",
        [("x-api-key", &b"k"[..])],
        Framing::Length(2),
    );
    wire.extend_from_slice(b"{}");
    let got = decode_every_way(Side::Request, &wire);
    let [msg] = &got.msgs[..] else {
        panic!("one request");
    };
    assert_eq!(
        (msg.line.as_str(), msg.path.as_str(), msg.query.as_deref()),
        ("POST", "/v1/messages", Some("beta=1"))
    );
    assert_eq!(msg.kind, BodyKind::Length(2));
    assert_eq!(msg.body, b"{}");
    assert_eq!(
        msg.headers[0],
        ("Host".to_owned(), b"api.anthropic.com".to_vec())
    );
    assert!(msg.keep_alive);
}

// ---- body decoder specifics ----

#[test]
fn body_decoder_contract() {
    let mut buf = BytesMut::from(&b"abcdef"[..]);
    let mut dec = BodyDecoder::new(BodyKind::Length(4));
    assert_eq!(dec.remaining(), Some(4));
    assert!(matches!(dec.decode(&mut buf), Ok(BodyEvent::Data(d)) if &d[..] == b"abcd"));
    assert!(matches!(dec.decode(&mut buf), Ok(BodyEvent::Done)));
    assert_eq!(&buf[..], b"ef");
    assert_eq!(dec.on_eof(), Ok(()));

    let mut empty = BodyDecoder::new(BodyKind::Empty);
    assert!(empty.is_done());
    assert!(matches!(empty.decode(&mut buf), Ok(BodyEvent::Done)));
    assert_eq!(&buf[..], b"ef");

    let mut close = BodyDecoder::new(BodyKind::CloseDelimited);
    assert!(matches!(close.decode(&mut buf), Ok(BodyEvent::Data(d)) if &d[..] == b"ef"));
    assert!(matches!(close.decode(&mut buf), Ok(BodyEvent::NeedMore)));
    assert!(!close.is_done());
    assert_eq!(close.on_eof(), Ok(()));
    assert!(close.is_done());

    let mut short = BodyDecoder::new(BodyKind::Length(3));
    assert!(matches!(
        short.decode(&mut BytesMut::new()),
        Ok(BodyEvent::NeedMore)
    ));
    assert_eq!(short.on_eof(), Err(BodyError::UnexpectedEof));

    // Huge lengths never overflow anything.
    let mut huge = BodyDecoder::new(BodyKind::Length(u64::MAX));
    let mut buf = BytesMut::from(&b"xy"[..]);
    assert!(matches!(huge.decode(&mut buf), Ok(BodyEvent::Data(d)) if d.len() == 2));
    assert_eq!(huge.remaining(), Some(u64::MAX - 2));
}

#[test]
fn chunked_data_is_zero_copy_and_framing_is_consumed() {
    let mut buf = BytesMut::from(&b"4;x=1\r\nwiki\r\n5\r\npedia\r\n0\r\nT: v\r\n\r\nNEXT"[..]);
    let start = buf.as_ptr() as usize;
    let mut dec = BodyDecoder::new(BodyKind::Chunked);
    let Ok(BodyEvent::Data(first)) = dec.decode(&mut buf) else {
        panic!("data");
    };
    assert_eq!(&first[..], b"wiki");
    assert_eq!(
        first.as_ptr() as usize,
        start + 7,
        "Data points into the read buffer"
    );
    assert!(matches!(dec.decode(&mut buf), Ok(BodyEvent::Data(d)) if &d[..] == b"pedia"));
    assert!(matches!(dec.decode(&mut buf), Ok(BodyEvent::Done)));
    assert_eq!(&buf[..], b"NEXT");
}

// ---- properties ----

/// Fragments that make random inputs look enough like HTTP to reach deep states.
fn http_ish() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop_oneof![
        Just(b"GET / HTTP/1.1\r\n".to_vec()),
        Just(b"POST /v1 HTTP/1.0\r\n".to_vec()),
        Just(b"HTTP/1.1 200 OK\r\n".to_vec()),
        Just(b"HTTP/1.1 100 Continue\r\n".to_vec()),
        Just(b"Host: a\r\n".to_vec()),
        Just(b"Content-Length: 3\r\n".to_vec()),
        Just(b"Content-Length: 0\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
        Just(b"Connection: close\r\n".to_vec()),
        Just(b"Expect: 100-continue\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"5\r\nhello\r\n".to_vec()),
        Just(b"3;x=y\r\n".to_vec()),
        Just(b"0\r\n\r\n".to_vec()),
        Just(b"X: y\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(fragment, 0..32).prop_map(|v| v.concat())
}

fn any_side() -> impl Strategy<Value = Side> {
    prop_oneof![
        Just(Side::Request),
        Just(Side::Response(Method::Get)),
        Just(Side::Response(Method::Head)),
        Just(Side::Response(Method::Post)),
    ]
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), side in any_side()) {
        let _ = run(side, &[&bytes]);
        for kind in [BodyKind::Empty, BodyKind::Length(7), BodyKind::Chunked, BodyKind::CloseDelimited] {
            let mut buf = BytesMut::from(&bytes[..]);
            let mut dec = BodyDecoder::new(kind);
            while let Ok(BodyEvent::Data(d)) = dec.decode(&mut buf) {
                prop_assert!(!d.is_empty());
            }
            let _ = dec.on_eof();
        }
    }

    #[test]
    fn any_split_gives_the_same_transcript(bytes in http_ish(), side in any_side(), cut in any::<prop::sample::Index>()) {
        let k = cut.index(bytes.len() + 1);
        let (a, b) = bytes.split_at(k);
        prop_assert_eq!(run(side, &[a, b]), run(side, &[&bytes]));
    }

    #[test]
    fn chunked_bodies_reassemble_at_any_split(
        body in prop::collection::vec(any::<u8>(), 0..4096),
        sizes in prop::collection::vec(1usize..700, 1..16),
        ext in any::<bool>(),
        trailer in any::<bool>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        let mut rest = &body[..];
        let mut i = 0;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(sizes[i % sizes.len()].min(rest.len()));
            if ext {
                wire.extend_from_slice(format!("{:x};i={i};q=\"a b\"\r\n", chunk.len()).as_bytes());
                wire.extend_from_slice(chunk);
                wire.extend_from_slice(b"\r\n");
            } else {
                write_chunk(&mut wire, chunk);
            }
            rest = tail;
            i += 1;
        }
        if trailer {
            wire.extend_from_slice(b"0\r\nX-Sum: 1\r\nX-More: two\r\n\r\n");
        } else {
            write_last_chunk(&mut wire);
        }
        wire.extend_from_slice(b"NEXT");

        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        points.sort_unstable();
        let mut dec = BodyDecoder::new(BodyKind::Chunked);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut done = false;
        let mut from = 0;
        for to in points.into_iter().chain([wire.len()]) {
            buf.extend_from_slice(&wire[from..to]);
            from = to;
            loop {
                match dec.decode(&mut buf) {
                    Ok(BodyEvent::Data(d)) => { prop_assert!(!d.is_empty()); got.extend_from_slice(&d) }
                    Ok(BodyEvent::NeedMore) => break,
                    Ok(BodyEvent::Done) => { done = true; break }
                    Err(e) => prop_assert!(false, "error {e:?}"),
                }
            }
        }
        prop_assert!(done);
        prop_assert_eq!(got, body);
        prop_assert_eq!(&buf[..], b"NEXT");
    }
}
