//! The stream translator on arbitrary bytes, all four ways (the first byte picks the
//! direction and the split): never a panic, and the output does not depend on how the input is split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::providers::translate::Translation;
use tidegate::providers::translate::stream::StreamTranslator;

fn run(t: Translation, pieces: &[&[u8]]) -> (Vec<u8>, bool, bool) {
    let mut tr = StreamTranslator::new(t, true, 1);
    let mut out = Vec::new();
    for p in pieces {
        tr.feed(p, &mut out);
    }
    tr.finish(&mut out);
    (out, tr.ended(), tr.broken())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let t = match selector % 4 {
        0 => Translation::ChatToMessages,
        1 => Translation::MessagesToChat,
        2 => Translation::ResponsesToChat,
        _ => Translation::ResponsesToMessages,
    };
    let whole = run(t, &[input]);
    assert!(whole.1, "finish always ends the client's stream");
    let cut = input.len() * usize::from(selector) / 255;
    let (a, b) = input.split_at(cut);
    assert_eq!(run(t, &[a, b]), whole, "split at {cut}");
    let pieces: Vec<&[u8]> = input.chunks(usize::from(selector % 7) + 1).collect();
    assert_eq!(run(t, &pieces), whole);
});
