//! What may travel between shards: ids, numbers, small enums, names and bounded text —
//! never an upstream's body or its header list. [`MeshSafe`] marks such a type; the shard
//! runtime requires it of every application message type (`shard::App`), so a message
//! that could carry a body does not compile.
//!
//! The mark is never written by hand for a type with fields: [`mesh_safe!`](crate::mesh_safe) implements it
//! and, in the same breath, destructures the type exhaustively (every field of every
//! variant, no `..`), checking each field is itself `MeshSafe`, or a `Copy` type (which
//! owns no heap data, so no text and no list), or a `String` marked `@ name` (a model,
//! provider, combo or limiter key name: an identifier from the configuration or the
//! request's `model` field). A new field therefore fails to compile until it is listed and
//! its kind said. The only hand-written marks are below: numbers, and the containers of
//! safe things.

/// A type whose values may cross the mesh: see the module docs.
///
/// What compiles: ids, numbers and marked names, every field listed.
///
/// ```
/// struct Fine { status: u16, model: String, ticket: Option<u64> }
/// tidegate::mesh_safe!(struct Fine { status, model @ name, ticket });
/// fn safe<T: tidegate::mesh::safe::MeshSafe>() {}
/// safe::<Fine>();
/// safe::<Vec<Box<Fine>>>();
/// ```
///
/// What does not compile: a body, as text or bytes, a header list, or a field left out.
///
/// ```compile_fail,E0277
/// fn safe<T: tidegate::mesh::safe::MeshSafe>() {}
/// safe::<String>();
/// ```
/// ```compile_fail,E0277
/// fn safe<T: tidegate::mesh::safe::MeshSafe>() {}
/// safe::<Vec<u8>>();
/// ```
/// ```compile_fail,E0277
/// fn safe<T: tidegate::mesh::safe::MeshSafe>() {}
/// safe::<Vec<(String, String)>>();
/// ```
/// ```compile_fail,E0277
/// struct Leaky { status: u16, body: String }
/// tidegate::mesh_safe!(struct Leaky { status, body });
/// ```
/// ```compile_fail,E0027
/// struct Grown { status: u16, headers: Vec<(String, String)> }
/// tidegate::mesh_safe!(struct Grown { status });
/// ```
pub trait MeshSafe {}

/// Compile-time check that a field is mesh-safe (used by [`mesh_safe!`](crate::mesh_safe)).
pub fn is_mesh_safe<T: MeshSafe + ?Sized>(_: &T) {}

/// Compile-time check that a field is `Copy`: it owns no heap data (used by [`mesh_safe!`](crate::mesh_safe)).
pub fn is_copy<T: Copy>(_: &T) {}

/// Compile-time check that a field is a name (used by [`mesh_safe!`](crate::mesh_safe) for `@ name` fields).
#[allow(clippy::ptr_arg)] // exactly a `String` field, not any text
pub fn is_name(_: &String) {}

macro_rules! numbers {
    ($($t:ty),*) => { $(impl MeshSafe for $t {})* };
}
// No `u8`: `Vec<u8>` would be a body. A byte field is marked `@ copy`.
numbers!(u16, u32, u64, usize, i32, i64, bool);

impl<T: MeshSafe> MeshSafe for Option<T> {}
impl<T: MeshSafe + ?Sized> MeshSafe for Box<T> {}
/// A list of safe items (candidate lists, orders: bounded by the configuration).
impl<T: MeshSafe> MeshSafe for Vec<T> {}
impl<A: MeshSafe, B: MeshSafe> MeshSafe for (A, B) {}

/// Marks types mesh-safe after checking every field (see the module docs).
///
/// ```text
/// mesh_safe!(copy: ConnectionId, Reason);                 // Copy types
/// mesh_safe!(struct Outcome { provider, connection, model @ name, ended, probe @ copy });
/// mesh_safe!(enum Fact { Release { serial }, Tick, Outcome(o) });
/// ```
///
/// A field is checked as `MeshSafe` unless marked `@ copy` (checked `Copy`) or `@ name`
/// (checked `String`).
#[macro_export]
macro_rules! mesh_safe {
    (copy: $($t:ty),* $(,)?) => {
        $(
            impl $crate::mesh::safe::MeshSafe for $t {}
            const _: fn(&$t) = |v| $crate::mesh::safe::is_copy(v);
        )*
    };
    (struct $t:ident { $($f:ident $(@ $k:ident)?),* $(,)? }) => {
        impl $crate::mesh::safe::MeshSafe for $t {}
        const _: fn(&$t) = |v| {
            let $t { $($f),* } = v;
            $( $crate::mesh_safe!(@field $f $($k)?); )*
        };
    };
    (enum $t:ident {
        $($v:ident
            $( ( $($tf:ident $(@ $tk:ident)?),* ) )?
            $( { $($sf:ident $(@ $sk:ident)?),* } )?
        ),* $(,)?
    }) => {
        impl $crate::mesh::safe::MeshSafe for $t {}
        const _: fn(&$t) = |v| match v {
            $(
                $t::$v $( ( $($tf),* ) )? $( { $($sf),* } )? => {
                    $($( $crate::mesh_safe!(@field $tf $($tk)?); )*)?
                    $($( $crate::mesh_safe!(@field $sf $($sk)?); )*)?
                }
            )*
        };
    };
    (@field $f:ident) => { $crate::mesh::safe::is_mesh_safe($f) };
    (@field $f:ident copy) => { $crate::mesh::safe::is_copy($f) };
    (@field $f:ident name) => { $crate::mesh::safe::is_name($f) };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Small {
        id: u32,
        name: String,
        flag: Option<bool>,
    }
    crate::mesh_safe!(struct Small { id, name @ name, flag });

    enum Msg {
        Unit,
        Tuple(Small, u64),
        Named { at: u64, key: String },
    }
    crate::mesh_safe!(enum Msg { Unit, Tuple(a, b), Named { at, key @ name } });

    fn assert_safe<T: MeshSafe>() {}

    #[test]
    fn checked_types_are_mesh_safe() {
        assert_safe::<Small>();
        assert_safe::<Msg>();
        assert_safe::<Vec<Box<Msg>>>();
        // The values are built to show the fields exist and are what the lists say.
        let m = Msg::Tuple(
            Small {
                id: 1,
                name: "m".into(),
                flag: None,
            },
            2,
        );
        assert!(matches!(m, Msg::Tuple(Small { id: 1, .. }, 2)));
        let Msg::Tuple(s, _) = m else { return };
        assert_eq!((s.name.as_str(), s.flag), ("m", None));
        assert!(matches!(Msg::Unit, Msg::Unit));
        assert!(matches!(
            Msg::Named {
                at: 1,
                key: String::new()
            },
            Msg::Named { at: 1, .. }
        ));
    }
}
