//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc loads each library lazily on its first call and *panics* when the library is missing.
//! Every path into cudarc in this workspace therefore goes through [`require`] first, which tries
//! exactly the file names cudarc will try and turns a miss into [`Error::LibraryNotFound`].

use std::sync::OnceLock;

use crate::Error;

/// A shared library the project loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Library {
    /// The CUDA driver, `libcuda.so.1`.
    Cuda,
    /// The CUDA runtime, `libcudart.so.13`.
    Cudart,
    /// The run-time compiler, `libnvrtc.so.13`.
    Nvrtc,
    /// NCCL, `libnccl.so.2`.
    Nccl,
    /// NVML, `libnvidia-ml.so.1` (used for topology discovery).
    Nvml,
}

impl Library {
    /// Every library, in the order `p2p-bench` reports them.
    pub const ALL: [Library; 5] = [
        Library::Cuda,
        Library::Cudart,
        Library::Nvrtc,
        Library::Nccl,
        Library::Nvml,
    ];

    /// The stem cudarc builds its candidate file names from (`cuda` for `libcuda.so.1`).
    pub fn stem(self) -> &'static str {
        match self {
            Library::Cuda => "cuda",
            Library::Cudart => "cudart",
            Library::Nvrtc => "nvrtc",
            Library::Nccl => "nccl",
            Library::Nvml => "nvidia-ml",
        }
    }

    /// The file names tried, in order. For the libraries cudarc loads these are exactly
    /// cudarc's candidates, so a successful probe guarantees cudarc's own load succeeds.
    pub fn candidates(self) -> Vec<String> {
        match self {
            // cudarc has no NVML bindings; this is the name NVML ships under everywhere.
            Library::Nvml => vec!["libnvidia-ml.so.1".into(), "libnvidia-ml.so".into()],
            _ => {
                let mut names = cudarc::get_lib_name_candidates(self.stem());
                let mut seen = std::collections::HashSet::new();
                names.retain(|n| seen.insert(n.clone()));
                names
            }
        }
    }
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tries each candidate file name with `dlopen` and returns the first that loads.
///
/// The library stays loaded for the life of the process (its handle is leaked on purpose), so
/// that cudarc's later `dlopen` of the same name is a cheap reference-count bump.
pub fn probe_names(library: &'static str, candidates: &[String]) -> Result<String, Error> {
    for name in candidates {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions on
        // our side; the handle is leaked so no symbol obtained later can outlive it.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                std::mem::forget(lib);
                return Ok(name.clone());
            }
            Err(_) => continue,
        }
    }
    Err(Error::LibraryNotFound {
        library,
        searched: candidates.to_vec(),
    })
}

fn slot(library: Library) -> &'static OnceLock<Result<String, Error>> {
    static CUDA: OnceLock<Result<String, Error>> = OnceLock::new();
    static CUDART: OnceLock<Result<String, Error>> = OnceLock::new();
    static NVRTC: OnceLock<Result<String, Error>> = OnceLock::new();
    static NCCL: OnceLock<Result<String, Error>> = OnceLock::new();
    static NVML: OnceLock<Result<String, Error>> = OnceLock::new();
    match library {
        Library::Cuda => &CUDA,
        Library::Cudart => &CUDART,
        Library::Nvrtc => &NVRTC,
        Library::Nccl => &NCCL,
        Library::Nvml => &NVML,
    }
}

impl Library {
    /// The library's name as users know it (`libcuda`).
    pub fn name(self) -> &'static str {
        match self {
            Library::Cuda => "libcuda",
            Library::Cudart => "libcudart",
            Library::Nvrtc => "libnvrtc",
            Library::Nccl => "libnccl",
            Library::Nvml => "libnvidia-ml",
        }
    }
}

/// Probes `library` once per process and returns the file name that loaded.
///
/// Call this before the first call into the matching cudarc `sys` module. The answer is cached:
/// a library installed while the process runs is not picked up.
pub fn require(library: Library) -> Result<&'static str, Error> {
    slot(library)
        .get_or_init(|| probe_names(library.name(), &library.candidates()))
        .as_ref()
        .map(String::as_str)
        .map_err(Clone::clone)
}

/// Whether `library` was already probed successfully (never loads anything itself).
pub fn is_loaded(library: Library) -> bool {
    matches!(slot(library).get(), Some(Ok(_)))
}
