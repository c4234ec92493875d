//! The SSE scanner on arbitrary bytes: never a panic, the same events (and oversize errors)
//! however the bytes are split, pending bytes never above the limit, and classification of
//! every event never fails.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::sse::{Frame, Scanner, SseError, classify};

type Seen = Vec<Result<(Option<Vec<u8>>, Option<Vec<u8>>, bool, Frame), SseError>>;

fn scan(limit: usize, pieces: &[&[u8]]) -> (Seen, usize) {
    let mut s = Scanner::new(limit);
    let mut seen = Vec::new();
    for p in pieces {
        s.feed(p, &mut |r| {
            seen.push(r.map(|ev| {
                assert!(!ev.is_empty());
                (
                    ev.name.map(<[u8]>::to_vec),
                    ev.data.map(<[u8]>::to_vec),
                    ev.comment,
                    classify(&ev),
                )
            }))
        });
        assert!(s.pending_len() <= limit);
    }
    (seen, s.pending_len())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    // Small limits exercise the oversize path, large ones the ordinary one.
    let limit = if selector & 1 == 0 {
        16 + usize::from(selector)
    } else {
        64 * 1024
    };
    let whole = scan(limit, &[input]);
    let cut = input.len() * usize::from(selector) / 255;
    let (a, b) = input.split_at(cut);
    assert_eq!(scan(limit, &[a, b]), whole, "split at {cut}");
    let pieces: Vec<&[u8]> = input.chunks(usize::from(selector % 7) + 1).collect();
    assert_eq!(scan(limit, &pieces), whole);
});
