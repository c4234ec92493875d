//! Shared driver for the http1 fuzz targets: decodes heads and bodies from bytes fed in
//! pieces, checks the codec's contract on every step, and returns a transcript so targets can
//! assert that how the bytes were split never changes the outcome.

use bytes::BytesMut;
use tidegate::http1::{
    BodyDecoder, BodyEvent, BodyKind, Decoded, Method, decode_request_head, decode_response_head,
};

/// Which heads to decode: requests, or the response to a request of the given method.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    Request,
    Response(Method),
}

/// One decoded message: its head bytes, framing and whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub head: Vec<u8>,
    pub kind: BodyKind,
    pub keep_alive: bool,
    pub body: Vec<u8>,
}

/// Everything observable about decoding one input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    pub msgs: Vec<Msg>,
    pub failure: Option<String>,
    pub leftover: Vec<u8>,
}

struct Driver {
    side: Side,
    buf: BytesMut,
    current: Option<(Msg, BodyDecoder)>,
    out: Transcript,
}

impl Driver {
    fn pump(&mut self) {
        while self.out.failure.is_none() {
            if matches!(self.side, Side::Response(_))
                && self.current.is_none()
                && !self.out.msgs.is_empty()
            {
                return;
            }
            let Some((msg, dec)) = self.current.as_mut() else {
                let before = self.buf.clone();
                let head = match self.side {
                    Side::Request => decode_request_head(&mut self.buf).map(|d| match d {
                        Decoded::Partial => None,
                        Decoded::Complete(h) => {
                            assert_ne!(h.body_kind(), BodyKind::CloseDelimited);
                            // Accessors must never panic.
                            let _ = (
                                h.method(),
                                h.method_str(),
                                h.path(),
                                h.query(),
                                h.header("host"),
                            );
                            Some((
                                h.raw().to_vec(),
                                h.body_kind(),
                                h.keep_alive(),
                                h.headers().count(),
                            ))
                        }
                    }),
                    Side::Response(m) => decode_response_head(&mut self.buf, m).map(|d| match d {
                        Decoded::Partial => None,
                        Decoded::Complete(h) => {
                            let _ = (h.status(), h.reason(), h.header("content-type"));
                            Some((
                                h.raw().to_vec(),
                                h.body_kind(),
                                h.keep_alive(),
                                h.headers().count(),
                            ))
                        }
                    }),
                };
                match head {
                    Ok(None) => {
                        match self.side {
                            Side::Request => {
                                assert_eq!(self.buf, before, "Partial touched the buffer")
                            }
                            Side::Response(_) => assert!(before.ends_with(&self.buf)),
                        }
                        return;
                    }
                    Ok(Some((head, kind, keep_alive, fields))) => {
                        assert!(fields <= tidegate::http1::MAX_HEADERS);
                        assert!(head.ends_with(b"\r\n\r\n"));
                        assert!(before.ends_with(&self.buf));
                        let msg = Msg {
                            head,
                            kind,
                            keep_alive,
                            body: Vec::new(),
                        };
                        self.current = Some((msg, BodyDecoder::new(kind)));
                    }
                    Err(e) => self.out.failure = Some(format!("head: {e:?}")),
                }
                continue;
            };
            match dec.decode(&mut self.buf) {
                Ok(BodyEvent::Data(d)) => {
                    assert!(!d.is_empty(), "empty Data");
                    msg.body.extend_from_slice(&d);
                }
                Ok(BodyEvent::NeedMore) => return,
                Ok(BodyEvent::Done) => {
                    assert!(dec.is_done());
                    if let Some((msg, _)) = self.current.take() {
                        self.out.msgs.push(msg);
                    }
                }
                Err(e) => self.out.failure = Some(format!("body: {e:?}")),
            }
        }
    }
}

/// Feeds `pieces` one after the other, then signals end of stream.
pub fn run(side: Side, pieces: &[&[u8]]) -> Transcript {
    let mut d = Driver {
        side,
        buf: BytesMut::new(),
        current: None,
        out: Transcript::default(),
    };
    for piece in pieces {
        d.buf.extend_from_slice(piece);
        d.pump();
    }
    if d.out.failure.is_none()
        && let Some((msg, mut dec)) = d.current.take()
    {
        match dec.on_eof() {
            Ok(()) => d.out.msgs.push(msg),
            Err(e) => d.out.failure = Some(format!("body: {e:?}")),
        }
    }
    d.out.leftover = d.buf.to_vec();
    d.out
}

/// Decodes `data` whole, split in two at a point chosen by `selector`, and in small pieces,
/// and asserts the three transcripts agree.
pub fn check_split_invariance(side: Side, selector: u8, data: &[u8]) -> Transcript {
    let whole = run(side, &[data]);
    let cut = data.len() * usize::from(selector) / 255;
    let (a, b) = data.split_at(cut);
    assert_eq!(run(side, &[a, b]), whole, "split at {cut}");
    let piece = usize::from(selector % 13) + 1;
    let pieces: Vec<&[u8]> = data.chunks(piece).collect();
    assert_eq!(run(side, &pieces), whole, "pieces of {piece}");
    whole
}
