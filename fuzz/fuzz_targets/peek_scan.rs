//! The small-body scanner (`proxy::peek::scan`) against simd-json's tape path on arbitrary
//! bytes: whenever the scanner vouches for a body, the tape path accepts it with the same
//! model, stream flag, tool count, model span and background span; and `peek` (scanner
//! first) always answers what the tape path answers, error reasons included.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::proxy::peek::{peek, peek_tape, scan};

fuzz_target!(|data: &[u8]| {
    let tape = peek_tape(data, &mut Vec::new());
    if let Some(found) = scan::scan(data) {
        assert_eq!(Ok(&found), tape.as_ref());
    }
    assert_eq!(peek(data, &mut Vec::new()), tape);
});
