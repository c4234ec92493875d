//! One pass over an event for the few words the stream watchdog's readers look for before
//! they read it: `error` and `failed` (an event can be classified an error only when its
//! name or data holds one of them or a backslash, [`super::classify`]) and `"usage"` (only
//! data that mentions it can report token counts, [`super::usage`]). The data is searched
//! once for all three words with a packed multi-pattern searcher (aho-corasick's Teddy,
//! which looks at 16 or 32 bytes per step) and once for a backslash, where three substring
//! searches and a backslash search ran before (~790 instructions per event).

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

        /// Without Teddy, the substring searches give the same marks.
        #[test]
        fn the_fallback_finds_what_the_packed_search_finds(data in text()) {
            let finders = Words::Finders(Box::new(WORDS.map(Finder::new)));
            prop_assert_eq!(of_data_with(&finders, &data), of_data(&data));
        }
    }
}
