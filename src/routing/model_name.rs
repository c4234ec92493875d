//! Model names a request carries — the `model` it asks for, the model each target sends
//! upstream: held inline up to [`INLINE_BYTES`], so a request naming a model of the usual
//! length (`gpt-4o-mini`, `openai/gpt-4o`) allocates no string for it; a longer name is
//! boxed, as a `String` was.

use std::fmt;

/// Names up to this many bytes are held inline.
pub const INLINE_BYTES: usize = 24;

/// A model name (any `str`; its rules are `resolve`'s), inline when short.
#[derive(Clone)]
pub struct ModelName(Repr);

#[derive(Clone)]
enum Repr {
    Inline(heapless::String<INLINE_BYTES>),
    Boxed(Box<str>),
}

impl ModelName {
    pub fn new(name: &str) -> Self {
        Self(match heapless::String::try_from(name) {
            Ok(inline) => Repr::Inline(inline),
            Err(()) => Repr::Boxed(name.into()),
        })
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline(s) => s.as_str(),
            Repr::Boxed(s) => s,
        }
    }
}

impl std::ops::Deref for ModelName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for ModelName {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl PartialEq for ModelName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ModelName {}

impl PartialEq<str> for ModelName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ModelName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ModelName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<ModelName> for String {
    fn eq(&self, other: &ModelName) -> bool {
        self == other.as_str()
    }
}

impl serde::Serialize for ModelName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Debug for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_names_are_inline_and_long_ones_boxed() {
        for (name, inline) in [
            ("", true),
            ("gpt-4o-mini", true),
            ("é日😀", true),
            ("x".repeat(INLINE_BYTES).as_str(), true),
            ("x".repeat(INLINE_BYTES + 1).as_str(), false),
            ("claude-sonnet-4-5-20250929", false),
        ] {
            let m = ModelName::new(name);
            assert_eq!(matches!(m.0, Repr::Inline(_)), inline, "{name:?}");
            assert_eq!(m.as_str(), name);
        }
        // Five words: two more than a `String`.
        assert!(std::mem::size_of::<ModelName>() <= 40);
    }

    proptest! {
        #[test]
        fn a_model_name_is_the_str_it_was_made_of(a in ".{0,40}", b in ".{0,40}") {
            let (ma, mb) = (ModelName::new(&a), ModelName::new(&b));
            prop_assert_eq!(&*ma, a.as_str());
            prop_assert_eq!(ma.to_string(), a.clone());
            prop_assert_eq!(format!("{ma:?}"), format!("{a:?}"));
            prop_assert_eq!(ma == mb, a == b);
            prop_assert!(ma == a.as_str());
            prop_assert!(ma == a);
            prop_assert!(a == ma);
            prop_assert_eq!(serde_json::to_string(&ma).unwrap(), serde_json::to_string(&a).unwrap());
            prop_assert_eq!(ma.clone(), ma);
        }
    }
}
