//! The chunked body decoder on arbitrary bytes: never a panic, the same content however the
//! bytes are split, and a body it accepts survives re-encoding with `write_chunk`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tidegate::http1::{BodyDecoder, BodyEvent, BodyKind, write_chunk, write_last_chunk};

/// Decodes a chunked body from `pieces`; `Some((content, leftover))` when it completed.
fn decode(pieces: &[&[u8]]) -> Result<Option<(Vec<u8>, Vec<u8>)>, String> {
    let mut dec = BodyDecoder::new(BodyKind::Chunked);
    let mut buf = BytesMut::new();
    let mut content = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf).map_err(|e| format!("{e:?}"))? {
                BodyEvent::Data(d) => {
                    assert!(!d.is_empty());
                    content.extend_from_slice(&d);
                }
                BodyEvent::NeedMore => break,
                BodyEvent::Done => {
                    let mut leftover = buf.to_vec();
                    for rest in pieces.iter().skip(i + 1) {
                        leftover.extend_from_slice(rest);
                    }
                    return Ok(Some((content, leftover)));
                }
            }
        }
    }
    assert!(dec.on_eof().is_err());
    Ok(None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let whole = decode(&[input]);
    let cut = input.len() * usize::from(selector) / 255;
    let (a, b) = input.split_at(cut);
    assert_eq!(decode(&[a, b]), whole, "split at {cut}");
    let pieces: Vec<&[u8]> = input.chunks(usize::from(selector % 7) + 1).collect();
    assert_eq!(decode(&pieces), whole);

    if let Ok(Some((content, _))) = whole {
        let mut wire = BytesMut::new();
        for chunk in content.chunks(usize::from(selector) + 1) {
            write_chunk(&mut wire, chunk);
        }
        write_last_chunk(&mut wire);
        assert_eq!(decode(&[&wire]), Ok(Some((content, Vec::new()))));
    }
});
