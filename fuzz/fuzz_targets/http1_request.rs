//! Request heads followed by their bodies (and pipelined requests), decoded whole, split in
//! two and in small pieces: never a panic, always the same outcome.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate_fuzz::{Side, check_split_invariance};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    check_split_invariance(Side::Request, selector, input);
});
