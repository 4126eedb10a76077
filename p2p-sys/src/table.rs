//! The one loader of every generated binding module (`cargo xtask bindgen` writes a call of
//! [`entry_table!`] and of [`entry_fns!`] into each; do not edit those modules): a table of a
//! library's entry points, resolved at first use, the names and presence checks that go with
//! it, and a function per entry point. Where the library lacks an entry point (it is older than
//! the release that added it) its function returns the module's "missing" result (a null
//! pointer for a string getter), which [`crate::check_cu`] and friends report as
//! [`crate::Error::MissingEntryPoints`]; each module's `has` tells beforehand.

/// Declares, in the calling module, the `Table` of the listed entry points (each
/// `name: name_fn`, the function-pointer type bindgen's declaration gives), `table()` (`None`
/// until [`crate::probe`] has loaded `library`; then each entry, `None` where the library lacks
/// the symbol), `ENTRY_POINTS` (the C names) and `has(name)`.
macro_rules! entry_table {
    (library: $library:ident, entries: { $($name:ident: $ty:ty),+ $(,)? }) => {
        /// The entry points, resolved from the loaded library.
        struct Table {
            $($name: Option<$ty>,)+
        }

        /// The table, once the library is loaded (`None` before [`crate::probe::require`]
        /// found it).
        fn table() -> Option<&'static Table> {
            static TABLE: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
            if let Some(t) = TABLE.get() {
                return Some(t);
            }
            let lib = crate::probe::handle(crate::Library::$library)?;
            // SAFETY: each symbol is looked up with the signature its C header declares; a
            // symbol the library lacks stays `None`. The library stays loaded for the
            // process's life.
            Some(TABLE.get_or_init(|| unsafe {
                Table {
                    $($name: lib
                        .get::<$ty>(concat!(stringify!($name), "\0").as_bytes())
                        .ok()
                        .map(|s| *s),)+
                }
            }))
        }

        /// Every entry point of this module, by its C name.
        pub const ENTRY_POINTS: &[&str] = &[$(stringify!($name)),+];

        /// Whether the loaded library has the entry point `name` (false before it is loaded,
        /// and for a name not in [`ENTRY_POINTS`]).
        pub fn has(name: &str) -> bool {
            let Some(t) = table() else { return false };
            match name {
                $(stringify!($name) => t.$name.is_some(),)+
                _ => false,
            }
        }
    };
}

/// Declares, in the calling module (after [`entry_table!`]), one free function per entry point
/// with the C name and signature: it calls the loaded library's entry, or returns the given
/// "missing" value (documented by the string beside it) where the library lacks it.
macro_rules! entry_fns {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $missing:expr, $missing_doc:literal;)+) => {$(
        #[doc = concat!("`", stringify!($name), "` of the loaded library (`", $missing_doc, "` where it lacks it).")]
        #[doc = ""]
        #[doc = "# Safety"]
        #[doc = "The C function's contract: valid pointers and handles, as its documentation says."]
        #[inline]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            match table().and_then(|t| t.$name) {
                Some(entry__) => entry__($($arg),*),
                None => $missing,
            }
        }
    )+};
}

pub(crate) use entry_fns;
pub(crate) use entry_table;

#[cfg(test)]
mod tests {
    #[test]
    fn each_module_lists_its_entries_and_has_none_before_its_library_loads() {
        assert!(crate::cuda::ENTRY_POINTS.contains(&"cuLaunchKernelEx"));
        assert!(crate::nvrtc::ENTRY_POINTS.contains(&"nvrtcCompileProgram"));
        assert_eq!(crate::ctx_event::ENTRY_POINTS, ["cuCtxRecordEvent"]);
        assert!(!crate::cuda::has("cuNotAnEntryPoint"));
        // No library is loaded in a unit test on a machine without CUDA; where one is, the
        // real entry still answers and the unknown name still does not.
        if !crate::probe::is_loaded(crate::Library::Cuda) {
            assert!(!crate::cuda::has("cuLaunchKernelEx"));
        }
    }
}
