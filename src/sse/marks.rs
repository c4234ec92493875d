//! One pass over an event for the few words the stream watchdog's readers look for before
//! they read it: `error` and `failed` (an event can be classified an error only when its
//! name or data holds one of them or a backslash, [`super::classify`]) and `"usage"` (only
//! data that mentions it can report token counts, [`super::usage`]).
//!
//! On a CPU with AVX2 the data is looked at 32 start positions per step for all four at
//! once ([`wide`]): a position is a candidate when its byte and one or two bytes further on
//! are those of a word (`e…r`, `f…d`, `"u…"`) or it is a backslash, and only a candidate is
//! compared with the word. Event data rarely has one, so an event of ~190 bytes costs about
//! 150 instructions. Elsewhere, a packed multi-pattern searcher (aho-corasick's Teddy) looks
//! for the words and `memchr` for a backslash (~670 and ~100 instructions per such event).
//! Both give the same marks (`the_wide_scan_finds_what_the_searchers_find`).

use std::sync::LazyLock;

use aho_corasick::packed::{MatchKind, Searcher};
use memchr::memmem::Finder;

use super::Event;

/// What one pass over an event found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// The name or the data holds `error`, `failed` or a backslash. Only such an event can
    /// be classified [`super::FrameKind::Error`]: that takes an `error` type, name or
    /// member, or a `response.failed` type or name, so its name or data holds `error` or
    /// `failed`, or a backslash (an escape that spells one of them). False lets a caller
    /// skip classifying events it needs only for errors
    /// (`nothing_classified_as_an_error_is_filtered_out`).
    pub may_be_error: bool,
    /// The data mentions `"usage"` (quotes included).
    pub usage: bool,
}

/// The words, in the order of their pattern ids.
const WORDS: [&[u8]; 3] = [b"error", b"failed", b"\"usage\""];
const USAGE: usize = 2;

/// The packed searcher for [`WORDS`]; `None` where the CPU has no Teddy (then one
/// substring search per word, [`Words::Finders`]).
enum Words {
    Packed(Searcher),
    Finders(Box<[Finder<'static>; 3]>),
}

static SEARCH: LazyLock<Words> = LazyLock::new(|| {
    let mut config = Searcher::config();
    config.match_kind(MatchKind::LeftmostFirst);
    match config.builder().extend(WORDS).build() {
        Some(s) => Words::Packed(s),
        None => Words::Finders(Box::new(WORDS.map(Finder::new))),
    }
});

impl Marks {
    /// The marks of `ev`: its data searched for every word, its name (short, when there is
    /// one) for the error words.
    pub fn of(ev: &Event<'_>) -> Marks {
        let mut marks = ev.data.map_or_else(Marks::default, of_data);
        if !marks.may_be_error && ev.name.is_some_and(short_may_be_error) {
            marks.may_be_error = true;
        }
        marks
    }
}

/// The marks of an event's data.
fn of_data(data: &[u8]) -> Marks {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return wide::marks_checked(data);
    }
    of_data_with(&SEARCH, data)
}

/// The marks of an event's data, searched with `words`.
fn of_data_with(words: &Words, data: &[u8]) -> Marks {
    let mut marks = Marks::default();
    match words {
        Words::Packed(s) => {
            // Matches do not overlap, and no word can start inside another one's match
            // (none begins with a letter or quote another ends with, but `"usage"` itself,
            // whose second match is not needed): every word present is found.
            for m in s.find_iter(data) {
                if m.pattern().as_usize() == USAGE {
                    marks.usage = true;
                } else {
                    marks.may_be_error = true;
                }
                if marks.usage && marks.may_be_error {
                    break;
                }
            }
        }
        Words::Finders(finders) => {
            let [error, failed, usage] = &**finders;
            marks.may_be_error |= error.find(data).is_some() || failed.find(data).is_some();
            marks.usage = usage.find(data).is_some();
        }
    }
    if !marks.may_be_error {
        marks.may_be_error = memchr::memchr(b'\\', data).is_some();
    }
    marks
}

/// What a candidate position of [`wide`] starts: the word compared in full.
#[cfg(target_arch = "x86_64")]
fn mark_at(rest: &[u8], marks: &mut Marks) {
    match rest.first() {
        Some(b'\\') => marks.may_be_error = true,
        Some(b'e') => marks.may_be_error |= rest.starts_with(b"error"),
        Some(b'f') => marks.may_be_error |= rest.starts_with(b"failed"),
        Some(b'"') => marks.usage |= rest.starts_with(b"\"usage\""),
        _ => {}
    }
}

/// The data scanned 32 start positions per step with AVX2 compares. A position is a
/// candidate when it holds a backslash, or `e` with `r` four bytes on (`error`), `f` with
/// `d` five on (`failed`), `"` with `u` next and `"` six on (`"usage"`): every start of a
/// word is one, and each candidate is compared with its word ([`mark_at`]).
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::{
        __m256i, _mm256_and_si256, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8,
        _mm256_or_si256, _mm256_set1_epi8,
    };

    use super::{Marks, mark_at};

    /// Start positions per step.
    const STEP: usize = 32;
    /// Bytes a step reads: its starts and the six bytes the last start's `"usage"` test
    /// reaches past them.
    const WINDOW: usize = STEP + 6;

    /// [`marks`] where the caller has seen that the CPU has AVX2.
    #[allow(unsafe_code)]
    pub(super) fn marks_checked(data: &[u8]) -> Marks {
        // SAFETY: called only once `is_x86_feature_detected!("avx2")` said yes; `marks`
        // needs nothing else.
        unsafe { marks(data) }
    }

    /// 32 bytes of `window` from `at` (at most 6) as a vector.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(window: &[u8; WINDOW], at: usize) -> __m256i {
        let bytes: &[u8; STEP] = window
            .get(at..at + STEP)
            .and_then(|s| s.try_into().ok())
            .unwrap_or(&[0; STEP]);
        // SAFETY: `bytes` is 32 readable bytes; the load has no alignment requirement.
        #[allow(unsafe_code)]
        unsafe {
            _mm256_loadu_si256(bytes.as_ptr().cast())
        }
    }

    /// The candidates among the first 32 starts of `window` (bit `i`: start `i`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn candidates(window: &[u8; WINDOW]) -> u32 {
        let eq = |v, b: u8| _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b as i8));
        let b0 = load(window, 0);
        let error = _mm256_and_si256(eq(b0, b'e'), eq(load(window, 4), b'r'));
        let failed = _mm256_and_si256(eq(b0, b'f'), eq(load(window, 5), b'd'));
        let usage = _mm256_and_si256(
            _mm256_and_si256(eq(b0, b'"'), eq(load(window, 1), b'u')),
            eq(load(window, 6), b'"'),
        );
        let any = _mm256_or_si256(
            _mm256_or_si256(error, failed),
            _mm256_or_si256(usage, eq(b0, b'\\')),
        );
        _mm256_movemask_epi8(any) as u32
    }

    /// The window of `data` from `at` (`at + WINDOW` is at most its length).
    #[inline]
    fn window(data: &[u8], at: usize) -> &[u8; WINDOW] {
        data.get(at..at + WINDOW)
            .and_then(|s| s.try_into().ok())
            .unwrap_or(&[0; WINDOW])
    }

    /// Compares every candidate in `bits` (starts from `at`) with its word.
    fn check(data: &[u8], at: usize, mut bits: u32, marks: &mut Marks) {
        while bits != 0 {
            let i = at + bits.trailing_zeros() as usize;
            mark_at(data.get(i..).unwrap_or_default(), marks);
            bits &= bits - 1;
        }
    }

    /// The marks of `data`.
    #[target_feature(enable = "avx2")]
    fn marks(data: &[u8]) -> Marks {
        let mut marks = Marks::default();
        let len = data.len();
        if len < WINDOW {
            // Short data in zeroed windows (a zero byte starts no candidate and completes
            // none): one step for up to 32 bytes, two for more.
            let mut w = [0u8; STEP + WINDOW];
            w[..len].copy_from_slice(data);
            let mut bits = u64::from(candidates(window(&w, 0)));
            if len > STEP {
                bits |= u64::from(candidates(window(&w, STEP))) << STEP;
            }
            while bits != 0 {
                mark_at(
                    data.get(bits.trailing_zeros() as usize..)
                        .unwrap_or_default(),
                    &mut marks,
                );
                bits &= bits - 1;
            }
            return marks;
        }
        let mut at = 0;
        while at + WINDOW <= len {
            let bits = candidates(window(data, at));
            if bits != 0 {
                check(data, at, bits, &mut marks);
            }
            at += STEP;
        }
        if at < len {
            // The last window ends with the data: its starts before `at` were seen.
            let last = len - WINDOW;
            let seen = u32::try_from(at - last).unwrap_or(u32::MAX);
            let bits = candidates(window(data, last))
                .checked_shr(seen)
                .unwrap_or(0);
            if bits != 0 {
                check(data, at, bits, &mut marks);
            }
            // The last six starts lie past every window: only a backslash or `error` /
            // `failed` fits there.
            let end = &data[len - 6..];
            if end.contains(&b'\\')
                || end.starts_with(b"error")
                || end.ends_with(b"error")
                || end == b"failed"
            {
                marks.may_be_error = true;
            }
        }
        marks
    }
}

/// `error`, `failed` or a backslash in a short field (an event name), byte by byte.
fn short_may_be_error(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(i, &b)| match b {
        b'\\' => true,
        b'e' => bytes[i..].starts_with(b"error"),
        b'f' => bytes[i..].starts_with(b"failed"),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::*;

    /// The marks as separate substring searches give them: the reference.
    fn naive(ev: &Event<'_>) -> Marks {
        let has = |b: &[u8], w: &[u8]| b.windows(w.len()).any(|x| x == w);
        let err = |b: &[u8]| has(b, b"error") || has(b, b"failed") || b.contains(&b'\\');
        Marks {
            may_be_error: ev.name.is_some_and(err) || ev.data.is_some_and(err),
            usage: ev.data.is_some_and(|d| has(d, b"\"usage\"")),
        }
    }

    /// Text made of pieces of the words and their neighbours, so that whole words, cut
    /// words, words run into each other and near misses all come up, at every length
    /// (shorter and longer than the packed searcher's minimum).
    fn text() -> impl Strategy<Value = Vec<u8>> {
        let pieces = select(vec![
            &b"error"[..],
            b"err",
            b"or",
            b"rror",
            b"Error",
            b"failed",
            b"fail",
            b"ailed",
            b"\"usage\"",
            b"\"usage",
            b"usage\"",
            b"usage",
            b"\"",
            b"\\",
            b"e",
            b"f",
            b" ",
            b"\n",
            b"{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}",
            b"0123456789abcdef0123456789abcdef",
            "h\u{e9}".as_bytes(),
        ]);
        vec(pieces, 0..40).prop_map(|ps| ps.concat())
    }

    #[test]
    fn words_are_found_wherever_they_lie() {
        let filler = [b'x'; 100];
        for word in [&b"error"[..], b"failed", b"\"usage\"", b"\\"] {
            for len in 0..100 {
                for at in 0..=len {
                    let mut data = filler[..len].to_vec();
                    data.splice(at..at, word.iter().copied());
                    let ev = Event {
                        name: None,
                        data: Some(&data),
                        comment: false,
                    };
                    assert_eq!(Marks::of(&ev), naive(&ev), "{word:?} at {at} of {len}");
                }
            }
        }
    }

    /// Each word, and each near miss of it, at every offset of data of 0–100 bytes whose
    /// other bytes are the words' first and last bytes: the marks the searchers give.
    #[test]
    fn words_among_their_own_letters_are_found_as_the_searchers_find_them() {
        let words: [&[u8]; 8] = [
            b"error",
            b"failed",
            b"\"usage\"",
            b"\\",
            b"errer",
            b"faile",
            b"\"usag\"",
            b"\"Usage\"",
        ];
        for filler in [b'e', b'r', b'f', b'd', b'"', b'u', b'x'] {
            for word in words {
                for len in 0..100 {
                    for at in 0..=len {
                        let mut data = vec![filler; len];
                        data.splice(at..at, word.iter().copied());
                        let ev = Event {
                            name: None,
                            data: Some(&data),
                            comment: false,
                        };
                        assert_eq!(
                            Marks::of(&ev),
                            of_data_with(&SEARCH, &data),
                            "{word:?} at {at} of {len} in {filler}"
                        );
                        assert_eq!(Marks::of(&ev), naive(&ev), "{word:?} at {at} of {len}");
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// One pass finds what separate searches find, in the data and in the name.
        #[test]
        fn one_pass_finds_what_separate_searches_find(
            data in proptest::option::of(text()),
            name in proptest::option::of(text()),
        ) {
            let ev = Event { name: name.as_deref(), data: data.as_deref(), comment: false };
            prop_assert_eq!(Marks::of(&ev), naive(&ev));
        }

        /// The wide scan gives the marks the searchers give, on data of every length.
        #[test]
        fn the_wide_scan_finds_what_the_searchers_find(data in text()) {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                prop_assert_eq!(wide::marks_checked(&data), of_data_with(&SEARCH, &data));
            }
        }

        /// Without Teddy, the substring searches give the same marks.
        #[test]
        fn the_fallback_finds_what_the_packed_search_finds(data in text()) {
            let finders = Words::Finders(Box::new(WORDS.map(Finder::new)));
            prop_assert_eq!(of_data_with(&finders, &data), of_data(&data));
        }
    }
}
