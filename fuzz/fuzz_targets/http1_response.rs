//! Upstream responses (interim 1xx heads, then the final head and its body) to a GET, HEAD
//! or POST: never a panic, and the same outcome however the bytes arrive.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::http1::Method;
use tidegate_fuzz::{Side, check_split_invariance};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let method = match selector % 3 {
        0 => Method::Get,
        1 => Method::Head,
        _ => Method::Post,
    };
    check_split_invariance(Side::Response(method), selector, input);
});
