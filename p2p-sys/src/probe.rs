//! Finding and loading the CUDA libraries.
//!
//! [`require`] loads a library once per process by its usual file names and turns a miss into
//! [`Error::LibraryNotFound`]; the bindings ([`crate::cuda`], [`crate::nvrtc`]) resolve their
//! entry points from the handle it keeps. For the libraries the `tools` feature takes from
//! cudarc (NCCL, the runtime), it tries exactly cudarc's names, so that cudarc's own load, which
//! panics on a miss, then succeeds.

use std::sync::OnceLock;

use crate::Error;

/// A shared library the project loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Library {
    /// The CUDA driver, `libcuda.so.1`.
    Cuda,
    /// The CUDA runtime, `libcudart.so.13` (only `p2p-bench` uses it).
    Cudart,
    /// The run-time compiler, `libnvrtc.so.13` or `.12`.
    Nvrtc,
    /// NCCL, `libnccl.so.2` (only `p2p-bench` uses it).
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

    /// The stem of its file names (`cuda` for `libcuda.so.1`).
    pub fn stem(self) -> &'static str {
        match self {
            Library::Cuda => "cuda",
            Library::Cudart => "cudart",
            Library::Nvrtc => "nvrtc",
            Library::Nccl => "nccl",
            Library::Nvml => "nvidia-ml",
        }
    }

    /// One of the library's entry points, for finding the object that holds it
    /// ([`loaded_file`]).
    fn entry_point(self) -> &'static [u8] {
        match self {
            Library::Cuda => b"cuInit\0",
            Library::Cudart => b"cudaGetDeviceCount\0",
            Library::Nvrtc => b"nvrtcVersion\0",
            Library::Nccl => b"ncclGetVersion\0",
            Library::Nvml => b"nvmlInit_v2\0",
        }
    }

    /// The file names tried, in order: the sonames of every release p2p supports, newest
    /// first, then the development link. With the `tools` feature, NCCL's and the runtime's are
    /// exactly cudarc's, so a successful probe guarantees cudarc's own load succeeds.
    pub fn candidates(self) -> Vec<String> {
        let names: &[&str] = match self {
            Library::Cuda => &["libcuda.so.1", "libcuda.so"],
            Library::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            Library::Nvml => &["libnvidia-ml.so.1", "libnvidia-ml.so"],
            #[cfg(feature = "tools")]
            Library::Cudart | Library::Nccl => {
                let mut names = cudarc::get_lib_name_candidates(self.stem());
                let mut seen = std::collections::HashSet::new();
                names.retain(|n| seen.insert(n.clone()));
                return names;
            }
            #[cfg(not(feature = "tools"))]
            Library::Cudart => &["libcudart.so.13", "libcudart.so.12", "libcudart.so"],
            #[cfg(not(feature = "tools"))]
            Library::Nccl => &["libnccl.so.2", "libnccl.so"],
        };
        names.iter().map(|n| n.to_string()).collect()
    }
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tries each candidate file name with `dlopen` and returns the first that loads.
///
/// The library stays loaded for the life of the process (its handle is leaked on purpose).
pub fn probe_names(library: &'static str, candidates: &[String]) -> Result<String, Error> {
    open_first(library, candidates).map(|(name, _)| name)
}

/// The first candidate that loads, and its handle, leaked: no entry point resolved from it can
/// outlive it, and a later `dlopen` of the same name (cudarc's) is a reference-count bump.
fn open_first(
    library: &'static str,
    candidates: &[String],
) -> Result<(String, &'static libloading::Library), Error> {
    for name in candidates {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions on
        // our side.
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            return Ok((name.clone(), Box::leak(Box::new(lib))));
        }
    }
    Err(Error::LibraryNotFound {
        library,
        searched: candidates.to_vec(),
    })
}

type Slot = OnceLock<Result<(String, &'static libloading::Library), Error>>;

fn slot(library: Library) -> &'static Slot {
    static CUDA: Slot = OnceLock::new();
    static CUDART: Slot = OnceLock::new();
    static NVRTC: Slot = OnceLock::new();
    static NCCL: Slot = OnceLock::new();
    static NVML: Slot = OnceLock::new();
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
/// Call this before the first call into the matching bindings. The answer is cached: a library
/// installed while the process runs is not picked up.
pub fn require(library: Library) -> Result<&'static str, Error> {
    slot(library)
        .get_or_init(|| open_first(library.name(), &library.candidates()))
        .as_ref()
        .map(|(name, _)| name.as_str())
        .map_err(Clone::clone)
}

/// The handle of `library` once [`require`] loaded it (never loads anything itself): where the
/// bindings resolve their entry points.
pub fn handle(library: Library) -> Option<&'static libloading::Library> {
    match slot(library).get() {
        Some(Ok((_, lib))) => Some(lib),
        _ => None,
    }
}

/// The file `library` was loaded from: the object that holds its entry points in this process
/// (`dladdr` on one of them gives the object's load address; `/proc/self/maps` the file mapped
/// there, links resolved). `None` where it was not probed successfully ([`require`]), the
/// lookup fails, or the file was deleted or replaced since it was loaded. For what a file name
/// does not say: which release of a library this is.
pub fn loaded_file(library: Library) -> Option<std::path::PathBuf> {
    let (name, _) = slot(library).get()?.as_ref().ok()?;
    // SAFETY: the library is loaded (probed), so this only takes another reference to it
    // (RTLD_NOLOAD: never loads anything) and runs no initialiser.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(name.as_str()),
            libloading::os::unix::RTLD_NOW | libc::RTLD_NOLOAD,
        )
    }
    .ok()?;
    // SAFETY: the symbol is only looked up for its address, never called or read.
    let symbol = unsafe { lib.get::<*const std::ffi::c_void>(library.entry_point()) }.ok()?;
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid out-pointer; the address is the symbol's, in a loaded object.
    if unsafe { libc::dladdr(*symbol, &mut info) } == 0 {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    mapped_at(&maps, info.dli_fbase as usize)
}

/// The file of a `/proc/<pid>/maps` text mapped at `base`; `None` for none, or for one deleted
/// (or replaced) since it was mapped.
fn mapped_at(maps: &str, base: usize) -> Option<std::path::PathBuf> {
    // A line: start-end, permissions, offset, device, inode, then the path (from the first
    // `/`: no field before it holds one), which may hold spaces.
    let line = maps.lines().find(|line| {
        line.split('-')
            .next()
            .and_then(|start| usize::from_str_radix(start, 16).ok())
            == Some(base)
    })?;
    let path = &line[line.find('/')?..];
    (!path.ends_with(" (deleted)")).then(|| path.into())
}

/// Whether `library` was already probed successfully (never loads anything itself).
pub fn is_loaded(library: Library) -> bool {
    matches!(slot(library).get(), Some(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_is_found_in_the_process_map_at_its_load_address() {
        let maps = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1311 /usr/bin/p2p-bench
7f10a0000000-7f10a0400000 r--p 00000000 fd:01 2042 /opt/my env/lib/libnvrtc.so.13
7f10b0000000-7f10b5000000 r--p 00000000 fd:01 2041 /usr/local/cuda/lib64/libnvrtc.so.13.0.88
7f10b5000000-7f10b9000000 r-xp 05000000 fd:01 2041 /usr/local/cuda/lib64/libnvrtc.so.13.0.88
7f10c0000000-7f10c0021000 r--p 00000000 fd:01 2050 /tmp/old/libnvrtc.so.13 (deleted)
7f10d0000000-7f10d0021000 rw-p 00000000 00:00 0 
";
        let at = |base: usize| mapped_at(maps, base);
        assert_eq!(
            at(0x7f10b0000000),
            Some("/usr/local/cuda/lib64/libnvrtc.so.13.0.88".into())
        );
        assert_eq!(
            at(0x7f10a0000000),
            Some("/opt/my env/lib/libnvrtc.so.13".into())
        );
        // Replaced since it was loaded: its build is not that file's.
        assert_eq!(at(0x7f10c0000000), None);
        // Anonymous memory, or nothing mapped there.
        assert_eq!(at(0x7f10d0000000), None);
        assert_eq!(at(0x1000), None);
    }

    #[test]
    fn a_library_not_loaded_has_no_file() {
        // Nothing in this test process probes NCCL.
        assert_eq!(loaded_file(Library::Nccl), None);
    }
}
