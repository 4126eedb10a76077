//! The one loader of every generated binding module: `cargo xtask bindgen` writes one call of
//! [`entry_points!`] into each (do not edit those modules), which names the library, the
//! module's "missing" result and each entry point's C signature, once. From that one list it
//! declares a table of the library's entry points, resolved at first use, the names and
//! presence checks that go with it, and a function per entry point. Where the library lacks an
//! entry point (it is older than the release that added it) its function returns the module's
//! "missing" result (or the entry's own, such as a null pointer for a string getter), which
//! [`crate::check_cu`] and friends report as [`crate::Error::MissingEntryPoints`]; each
//! module's `has` tells beforehand.

/// Declares, in the calling module, from one list of C signatures:
///
/// - the `Table` of the entry points (each an `Option<unsafe extern "C" fn(..) -> ..>` of the
///   signature given) and `table()`: `None` until [`crate::probe`] has loaded `library`; then
///   each entry, `None` where the library lacks the symbol;
/// - `ENTRY_POINTS` (the C names) and `has(name)`;
/// - one free function per entry point with the C name and signature: it calls the loaded
///   library's entry, or returns the "missing" value where the library lacks it: the entry's
///   own (`fn f(..) -> R = value;`) or else the module's (`missing: value;`).
///
/// ```text
/// crate::table::entry_points! {
///     library: Nvrtc,
///     missing: nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR;
///     fn nvrtcGetErrorString(result: nvrtcResult) -> *const ffi::c_char = ::core::ptr::null();
///     fn nvrtcDestroyProgram(prog: *mut nvrtcProgram) -> nvrtcResult;
/// }
/// ```
macro_rules! entry_points {
    (
        library: $library:ident,
        missing: $missing:expr;
        $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $(= $own:expr)?;)+
    ) => {
        /// The entry points, resolved from the loaded library.
        struct Table {
            $($name: Option<unsafe extern "C" fn($($ty),*) -> $ret>,)+
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
                        .get(concat!(stringify!($name), "\0").as_bytes())
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

        $(
            #[doc = concat!(
                "`", stringify!($name), "` of the loaded library (`",
                $crate::table::entry_points!(@doc [$($own)?] $missing),
                "` where it lacks it)."
            )]
            #[doc = ""]
            #[doc = "# Safety"]
            #[doc = "The C function's contract: valid pointers and handles, as its documentation says."]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                match table().and_then(|t| t.$name) {
                    // SAFETY: the caller keeps the C function's contract (see `# Safety`).
                    Some(entry__) => unsafe { entry__($($arg),*) },
                    None => $crate::table::entry_points!(@missing [$($own)?] $missing),
                }
            }
        )+
    };
    // The entry's own "missing" value where it gives one, else the module's; and its text.
    (@missing [$own:expr] $missing:expr) => { $own };
    (@missing [] $missing:expr) => { $missing };
    (@doc [$own:expr] $missing:expr) => { stringify!($own) };
    (@doc [] $missing:expr) => { stringify!($missing) };
}

pub(crate) use entry_points;

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
