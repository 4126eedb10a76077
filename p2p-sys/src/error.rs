//! One error type for every C library the project calls.
//!
//! A failed call becomes [`Error::Call`], which names the API, the function, the result code's
//! symbolic name and the library's own message, plus a hint for the codes users hit most.

use crate::probe::{self, Library};
use crate::{cuda, nccl_rt, nvrtc};
#[cfg(feature = "tools")]
use crate::{cudart, nccl};

/// Which C API a failed call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Api {
    /// The CUDA driver API (`cu*`).
    Driver,
    /// The CUDA runtime API (`cuda*`).
    Runtime,
    /// The NVRTC run-time compiler (`nvrtc*`).
    Nvrtc,
    /// NCCL (`nccl*`).
    Nccl,
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Api::Driver => "CUDA driver",
            Api::Runtime => "CUDA runtime",
            Api::Nvrtc => "NVRTC",
            Api::Nccl => "NCCL",
        })
    }
}

/// An error from the FFI layer.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shared library could not be loaded under any of its usual file names.
    #[error(
        "{library} was not found (searched: {}); install the NVIDIA driver or CUDA libraries, \
         or add their directory to LD_LIBRARY_PATH",
        searched.join(", ")
    )]
    LibraryNotFound {
        /// The library, e.g. `libcuda`.
        library: &'static str,
        /// Every file name that was tried.
        searched: Vec<String>,
    },
    /// A library loaded but lacks entry points that an API needs: the driver (or library) is
    /// older than the CUDA release that added them.
    #[error(
        "{library} ({file}) lacks {}: it is older than the CUDA release that added them; \
         update the NVIDIA driver (or library)",
        symbols.join(", ")
    )]
    MissingEntryPoints {
        /// The library and the API, e.g. `libcuda (checkpoint API)`.
        library: &'static str,
        /// The file that was loaded.
        file: String,
        /// The entry points it lacks.
        symbols: Vec<String>,
    },
    /// The driver supports an older CUDA release than p2p needs ([`crate::MIN_DRIVER_VERSION`]).
    #[error(
        "the NVIDIA driver ({file}) supports CUDA {} but p2p needs CUDA {} or newer (driver 550+); \
         update the NVIDIA driver",
        crate::version_text(*found),
        crate::version_text(*needed)
    )]
    DriverTooOld {
        /// The driver's CUDA version, `major * 1000 + minor * 10`.
        found: i32,
        /// The oldest p2p supports.
        needed: i32,
        /// The file that was loaded.
        file: String,
    },
    /// A C call returned an error code.
    #[error("{call} failed: {name} ({message}){}", hint_suffix(*api, name))]
    Call {
        /// The API the call belongs to.
        api: Api,
        /// The C function, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The numeric result code.
        code: i64,
        /// The code's symbolic name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The library's description of the code.
        message: String,
    },
}

crate::debug_as_display!(Error);

impl Error {
    /// Whether this is a failed driver call that returned `code`.
    pub fn is_driver(&self, code: cuda::CUresult) -> bool {
        matches!(self, Error::Call { api: Api::Driver, code: c, .. } if *c == i64::from(code.0))
    }

    /// The C function that failed, if this is a failed call.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Error::Call { call, .. } => Some(call),
            Error::LibraryNotFound { .. }
            | Error::MissingEntryPoints { .. }
            | Error::DriverTooOld { .. } => None,
        }
    }

    /// What to do about this error, where the project knows.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Error::Call { api, name, .. } => hint(*api, name),
            Error::LibraryNotFound { .. }
            | Error::MissingEntryPoints { .. }
            | Error::DriverTooOld { .. } => None,
        }
    }
}

fn hint(api: Api, name: &str) -> Option<&'static str> {
    if api != Api::Driver {
        return None;
    }
    Some(match name {
        "CUDA_ERROR_TOO_MANY_PEERS" => {
            "a GPU can have peer access enabled to at most 8 others; disable one first"
        }
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED" => {
            "these two GPUs cannot map each other's memory; use a host-staged or relayed path"
        }
        "CUDA_ERROR_OUT_OF_MEMORY" => "free device memory or use smaller buffers",
        "CUDA_ERROR_NO_DEVICE" | "CUDA_ERROR_INVALID_DEVICE" => {
            "check nvidia-smi and CUDA_VISIBLE_DEVICES"
        }
        "CUDA_ERROR_NOT_PERMITTED" => {
            "the driver refused the operation; fabric handles need an IMEX channel \
             (/dev/nvidia-caps-imex-channels)"
        }
        "CUDA_ERROR_ILLEGAL_ADDRESS" => {
            "a kernel or copy touched unmapped memory; the context is now unusable, restart the process"
        }
        "CUDA_ERROR_INVALID_HANDLE" => {
            "the handle is stale or from another driver instance; re-export it"
        }
        "CUDA_ERROR_NO_BINARY_FOR_GPU" | "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" => {
            "the driver cannot load code from this NVRTC: use an NVRTC no newer than the driver's \
             CUDA version (nvidia-smi), or update the driver; `p2p-bench kernels` names the NVRTC \
             loaded"
        }
        "CUDA_ERROR_MISALIGNED_ADDRESS" => {
            "a kernel accessed memory off its alignment; the context is now unusable, restart the \
             process"
        }
        _ => return None,
    })
}

fn hint_suffix(api: Api, name: &str) -> String {
    hint(api, name)
        .map(|h| format!("; {h}"))
        .unwrap_or_default()
}

/// Copies a C string the library owns into a `String`.
fn owned(ptr: *const std::ffi::c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the error-string functions return pointers to static, NUL-terminated strings.
    Some(
        unsafe { std::ffi::CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}

const NOT_LOADED: &str = "no message: the library is not loaded";

/// [`Error::Call`]: `call` of `api` returned `code`, called `name`, with the library's `message`
/// for it (none where the library is not loaded).
fn call_failed(
    api: Api,
    call: &'static str,
    code: i64,
    name: String,
    message: Option<String>,
) -> Error {
    Error::Call {
        api,
        call,
        code,
        name,
        message: message.unwrap_or_else(|| NOT_LOADED.into()),
    }
}

/// An entry point the loaded `library` lacks, as [`Error::MissingEntryPoints`].
fn missing(library: Library, call: &'static str) -> Error {
    Error::MissingEntryPoints {
        library: library.name(),
        file: probe::require(library).unwrap_or("not loaded").to_string(),
        symbols: vec![call.to_string()],
    }
}

/// Turns a driver result into `Ok(())` or [`Error::Call`] naming `call` (or
/// [`Error::MissingEntryPoints`] where the driver lacks `call`).
pub fn check_cu(call: &'static str, result: cuda::CUresult) -> Result<(), Error> {
    if result == cuda::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    if result == cuda::CUresult::CUDA_ERROR_NOT_FOUND
        && probe::is_loaded(Library::Cuda)
        && cuda::ENTRY_POINTS.contains(&call)
        && !cuda::has(call)
    {
        return Err(missing(Library::Cuda, call));
    }
    let (mut message, mut name) = (None, result.name().map(str::to_string));
    if probe::is_loaded(Library::Cuda) {
        let mut ptr = std::ptr::null();
        // SAFETY: libcuda is loaded (probed); cuGetErrorString writes a static string pointer.
        if unsafe { cuda::cuGetErrorString(result, &mut ptr) } == cuda::CUresult::CUDA_SUCCESS {
            message = owned(ptr);
        }
        if name.is_none() {
            let mut ptr = std::ptr::null();
            // SAFETY: as above, for the code's name (the driver knows codes newer than our
            // headers).
            let r = unsafe { cuda::cuGetErrorName(result, &mut ptr) };
            if r == cuda::CUresult::CUDA_SUCCESS {
                name = owned(ptr);
            }
        }
    }
    Err(call_failed(
        Api::Driver,
        call,
        i64::from(result.0),
        name.unwrap_or_else(|| format!("CUresult {}", result.0)),
        message,
    ))
}

/// Turns a runtime result into `Ok(())` or [`Error::Call`] naming `call` (feature `tools`).
#[cfg(feature = "tools")]
pub fn check_cudart(call: &'static str, result: cudart::cudaError_t) -> Result<(), Error> {
    if result == cudart::cudaError_t::cudaSuccess {
        return Ok(());
    }
    // SAFETY: libcudart is loaded (probed); the returned string is static.
    let message = probe::is_loaded(Library::Cudart)
        .then(|| owned(unsafe { cudart::cudaGetErrorString(result) }));
    let (code, name) = (result as u32 as i64, format!("{result:?}"));
    Err(call_failed(
        Api::Runtime,
        call,
        code,
        name,
        message.flatten(),
    ))
}

/// Writes the check of a library that p2p loads at run time with a table of entry points
/// (`crate::table`): `Ok(())` on `$ok`, [`Error::MissingEntryPoints`] where the loaded library
/// lacks the call, else [`Error::Call`] with the code's name and the library's message for it.
macro_rules! check_loaded {
    ($(#[$doc:meta])* $check:ident: $module:ident::$result:ident, $ok:ident, $library:ident, $message:ident) => {
        $(#[$doc])*
        pub fn $check(call: &'static str, result: $module::$result) -> Result<(), Error> {
            if result == $module::$result::$ok {
                return Ok(());
            }
            let loaded = probe::is_loaded(Library::$library);
            if loaded && $module::ENTRY_POINTS.contains(&call) && !$module::has(call) {
                return Err(missing(Library::$library, call));
            }
            // SAFETY: the library is loaded (probed); the returned string is static (null if
            // the library lacks the function).
            let message = loaded.then(|| owned(unsafe { $module::$message(result) }));
            let name = result.name().map(str::to_string);
            let name = name.unwrap_or_else(|| format!("{} {}", stringify!($result), result.0));
            Err(call_failed(Api::$library, call, i64::from(result.0), name, message.flatten()))
        }
    };
}

check_loaded!(
    /// Turns an NVRTC result into `Ok(())` or [`Error::Call`] naming `call` (or
    /// [`Error::MissingEntryPoints`] where the loaded NVRTC lacks `call`).
    check_nvrtc: nvrtc::nvrtcResult, NVRTC_SUCCESS, Nvrtc, nvrtcGetErrorString
);

check_loaded!(
    /// Turns a result of the NCCL that p2p loads at run time ([`crate::nccl_rt`]) into `Ok(())`
    /// or [`Error::Call`] naming `call` (or [`Error::MissingEntryPoints`] where the loaded NCCL
    /// lacks `call`).
    check_nccl_rt: nccl_rt::ncclResult_t, ncclSuccess, Nccl, ncclGetErrorString
);

/// Turns an NCCL result of cudarc's bindings into `Ok(())` or [`Error::Call`] naming `call`
/// (feature `tools`): the same library and codes as [`check_nccl_rt`], which reads it.
#[cfg(feature = "tools")]
pub fn check_nccl(call: &'static str, result: nccl::ncclResult_t) -> Result<(), Error> {
    check_nccl_rt(call, nccl_rt::ncclResult_t(result as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `err`'s message starts with `start` and holds `also`.
    fn says(err: &Error, start: &str, also: &str) {
        let text = err.to_string();
        assert!(text.starts_with(start), "{text}");
        assert!(text.contains(also), "{text}");
    }

    #[test]
    fn an_nccl_failure_names_the_call_and_the_code_loaded_or_not() {
        assert_eq!(
            check_nccl_rt("ncclAllReduce", nccl_rt::ncclResult_t::ncclSuccess),
            Ok(())
        );
        let e = check_nccl_rt(
            "ncclCommInitRankConfig",
            nccl_rt::ncclResult_t::ncclRemoteError,
        )
        .expect_err("an error");
        assert!(
            matches!(&e, Error::Call { api: Api::Nccl, code: 6, name, .. } if name == "ncclRemoteError"),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("ncclCommInitRankConfig failed: ncclRemoteError"),
            "{e}"
        );
        let newer = check_nccl_rt("ncclSend", nccl_rt::ncclResult_t(77)).expect_err("an error");
        assert!(newer.to_string().contains("ncclResult_t 77"), "{newer}");
    }

    #[test]
    fn success_is_ok_for_every_api() {
        assert_eq!(check_cu("cuInit", cuda::CUresult::CUDA_SUCCESS), Ok(()));
        assert_eq!(
            check_nvrtc("nvrtcCompileProgram", nvrtc::nvrtcResult::NVRTC_SUCCESS),
            Ok(())
        );
    }

    #[cfg(feature = "tools")]
    #[test]
    fn the_tools_apis_succeed_too() {
        assert_eq!(
            check_cudart("cudaFree", cudart::cudaError_t::cudaSuccess),
            Ok(())
        );
        assert_eq!(
            check_nccl("ncclAllReduce", nccl::ncclResult_t::ncclSuccess),
            Ok(())
        );
    }

    #[test]
    fn a_code_newer_than_the_headers_keeps_its_number() {
        // A driver newer than CUDA 12.4 may return a code our headers lack: it must not be
        // undefined behaviour (the result type is a newtype, not a Rust enum) and must print.
        let err = check_cu("cuMemAlloc_v2", cuda::CUresult(4242)).expect_err("an error");
        let Error::Call { code, name, .. } = &err else {
            panic!("expected Error::Call, got {err:?}");
        };
        assert_eq!(*code, 4242);
        if !probe::is_loaded(Library::Cuda) {
            assert_eq!(name, "CUresult 4242");
        }
        assert!(
            err.to_string().starts_with("cuMemAlloc_v2 failed: "),
            "{err}"
        );
    }

    #[test]
    fn an_old_driver_is_refused_with_both_versions() {
        let err = Error::DriverTooOld {
            found: 12020,
            needed: crate::MIN_DRIVER_VERSION,
            file: "libcuda.so.1".into(),
        };
        says(
            &err,
            "the NVIDIA driver (libcuda.so.1) supports CUDA 12.2 but p2p needs CUDA 12.4 or newer",
            "update the NVIDIA driver",
        );
    }

    #[test]
    fn missing_entry_points_are_named_with_what_to_do() {
        let err = Error::MissingEntryPoints {
            library: "libcuda (checkpoint API)",
            file: "libcuda.so.1".into(),
            symbols: vec![
                "cuCheckpointProcessLock".into(),
                "cuCheckpointProcessUnlock".into(),
            ],
        };
        assert_eq!(err.call(), None);
        says(&err, "libcuda (checkpoint API) (libcuda.so.1) lacks cuCheckpointProcessLock, cuCheckpointProcessUnlock:", "update the NVIDIA driver");
    }

    #[test]
    fn driver_error_names_call_code_and_hint() {
        let err = check_cu(
            "cuCtxEnablePeerAccess",
            cuda::CUresult::CUDA_ERROR_TOO_MANY_PEERS,
        )
        .expect_err("an error code must map to Err");
        assert!(err.is_driver(cuda::CUresult::CUDA_ERROR_TOO_MANY_PEERS));
        assert!(!err.is_driver(cuda::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(err.call(), Some("cuCtxEnablePeerAccess"));
        let Error::Call {
            api, code, name, ..
        } = &err
        else {
            panic!("expected Error::Call, got {err:?}");
        };
        assert_eq!(*api, Api::Driver);
        assert_eq!(*code, 711);
        assert_eq!(name, "CUDA_ERROR_TOO_MANY_PEERS");
        says(
            &err,
            "cuCtxEnablePeerAccess failed: CUDA_ERROR_TOO_MANY_PEERS",
            "at most 8",
        );
        // A cubin the driver cannot run: no retry helps, the hint says what does.
        let err = check_cu(
            "cuModuleLoadData",
            cuda::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
        )
        .expect_err("an error");
        assert!(
            err.to_string()
                .contains("no newer than the driver's CUDA version"),
            "{err}"
        );
    }

    #[test]
    fn nvrtc_codes_keep_their_names() {
        let code = nvrtc::nvrtcResult::NVRTC_ERROR_COMPILATION;
        let e = check_nvrtc("nvrtcCompileProgram", code).expect_err("error");
        assert!(
            matches!(&e, Error::Call { api: Api::Nvrtc, code: 6, name, .. } if name == "NVRTC_ERROR_COMPILATION")
        );
    }

    #[cfg(feature = "tools")]
    #[test]
    fn runtime_and_nccl_codes_keep_their_names() {
        let e = check_cudart("cudaMalloc", cudart::cudaError_t::cudaErrorMemoryAllocation)
            .expect_err("error");
        assert!(
            matches!(&e, Error::Call { api: Api::Runtime, code: 2, name, .. } if name == "cudaErrorMemoryAllocation")
        );
        assert_eq!(e.hint(), None);
        let e = check_nccl("ncclCommInitAll", nccl::ncclResult_t::ncclInvalidArgument)
            .expect_err("error");
        assert!(
            matches!(&e, Error::Call { api: Api::Nccl, code: 4, name, .. } if name == "ncclInvalidArgument")
        );
        assert!(e
            .to_string()
            .starts_with("ncclCommInitAll failed: ncclInvalidArgument"));
    }

    #[test]
    fn library_not_found_lists_every_name() {
        let e = Error::LibraryNotFound {
            library: "libcuda",
            searched: vec!["a.so".into(), "b.so".into()],
        };
        let text = e.to_string();
        assert!(
            text.contains("libcuda was not found (searched: a.so, b.so)"),
            "{text}"
        );
        assert_eq!(e.call(), None);
    }
}
