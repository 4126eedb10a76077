//! The shapes of C type that bindgen would write out again for every type of them, written
//! once: `cargo xtask bindgen` gathers a generated module's opaque handles, structs, enums and
//! newtype enums into one call each of [`handles!`], [`structs!`], [`enums!`] and
//! [`newtype_enums!`], which declare them exactly as bindgen does (the same names, `repr`,
//! derives, fields, constants and aliases).

/// Declares opaque C structs and the pointer types C passes them by: for each
/// `Handle = *mut Struct`, a zero-sized `#[repr(C)] pub struct Struct` standing for the C type
/// (only ever used behind a pointer) and `pub type Handle = *mut Struct`.
macro_rules! handles {
    ($($handle:ident = *mut $name:ident),+ $(,)?) => {$(
        #[repr(C)]
        #[derive(Debug)]
        pub struct $name {
            _unused: [u8; 0],
        }
        pub type $handle = *mut $name;
    )+};
}

/// Declares C structs as bindgen does: for each `struct Name as Alias, .. { field: Type, .. }`,
/// a `#[repr(C)]` struct of public fields deriving `Debug, Copy, Clone`, or the derives a
/// `#[derive(..)]` before it names (bindgen leaves `Debug` out where a field is a union), and
/// its aliases (the C typedefs, such as `CUuuid` and a versioned `_v1`).
macro_rules! structs {
    ($(
        $(#[derive($($derive:ident),+)])?
        struct $name:ident $(as $($alias:ident),+)? {
            $($field:ident: $ty:ty),* $(,)?
        }
    )+) => {$(
        $crate::ctypes::structs!(@one [$($($derive),+)?] $name { $($field: $ty),* });
        $($(pub type $alias = $name;)+)?
    )+};
    (@one [] $name:ident { $($field:ident: $ty:ty),* }) => {
        $crate::ctypes::structs!(@one [Debug, Copy, Clone] $name { $($field: $ty),* });
    };
    (@one [$($derive:ident),+] $name:ident { $($field:ident: $ty:ty),* }) => {
        #[repr(C)]
        #[derive($($derive),+)]
        pub struct $name {
            $(pub $field: $ty,)*
        }
    };
}

/// Declares C enums as Rust enums (bindgen's default style): for each
/// `enum Name: repr as Alias { VARIANT = value, .. } aliases { OTHER = VARIANT, .. }`, the enum
/// with that `repr` and the derives bindgen gives, `Alias` (the C typedef) and, for the
/// enumerators C gives a value another already has, associated constants.
macro_rules! enums {
    ($(
        enum $name:ident: $repr:ident $(as $alias:ident)? {
            $($variant:ident = $value:literal),+ $(,)?
        } $(aliases {
            $($other:ident = $same:ident),+ $(,)?
        })?
    )+) => {$(
        #[repr($repr)]
        #[derive(Debug, Copy, Clone, Hash, PartialEq, Eq)]
        pub enum $name {
            $($variant = $value,)+
        }
        $(pub use self::$name as $alias;)?
        $(impl $name {
            $(pub const $other: $name = $name::$same;)+
        })?
    )+};
}

/// Declares C enums as newtypes over their integer (bindgen's `--newtype-enum`, for result
/// codes and bit flags, where a value the headers do not name is still valid): for each
/// `Name(repr) as Alias { CONSTANT = value, .. }`, the newtype, its constants and `Alias`.
/// `#[named]` before one adds `name()`, the constant's name for a value.
macro_rules! newtype_enums {
    ($(
        $(#[$named:ident])?
        $name:ident($repr:ty) $(as $alias:ident)? {
            $($constant:ident = $value:literal),* $(,)?
        }
    )+) => {$(
        impl $name {
            $(pub const $constant: $name = $name($value);)*
        }
        #[repr(transparent)]
        #[derive(Debug, Copy, Clone, Hash, PartialEq, Eq)]
        pub struct $name(pub $repr);
        $(pub use self::$name as $alias;)?
        $crate::ctypes::newtype_enums!(@names [$($named)?] $name { $($constant = $value),* });
    )+};
    (@names [named] $name:ident { $($constant:ident = $value:literal),* }) => {
        impl $name {
            /// The code's symbolic name in the headers these bindings come from (`None` for a
            /// code added since; the first name where two share a value).
            #[allow(unreachable_patterns)]
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($constant)),)*
                    _ => None,
                }
            }
        }
    };
    (@names [] $name:ident { $($constant:ident = $value:literal),* }) => {};
}

pub(crate) use enums;
pub(crate) use handles;
pub(crate) use newtype_enums;
pub(crate) use structs;
