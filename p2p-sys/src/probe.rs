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

/// The file `library` was loaded from, as this process maps it (`/proc/self/maps`: links
/// resolved). `None` where it was not probed successfully ([`require`]) or the map cannot be
/// read. For what a file name does not say: which release of a library this is.
pub fn loaded_file(library: Library) -> Option<std::path::PathBuf> {
    if !is_loaded(library) {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    mapped_file(&maps, &format!("lib{}.so", library.stem()))
}

/// The first file of a `/proc/<pid>/maps` text whose name starts with `prefix`.
fn mapped_file(maps: &str, prefix: &str) -> Option<std::path::PathBuf> {
    // A line: address, permissions, offset, device, inode, then the path (the first `/`; none
    // of the fields before it holds one), which may hold spaces.
    maps.lines()
        .filter_map(|line| line.find('/').map(|at| std::path::Path::new(&line[at..])))
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(std::path::Path::to_path_buf)
}

/// Whether `library` was already probed successfully (never loads anything itself).
pub fn is_loaded(library: Library) -> bool {
    matches!(slot(library).get(), Some(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_is_found_in_the_process_map_by_its_file_name_not_a_look_alike() {
        let maps = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1311 /usr/bin/p2p-bench
7f10a0000000-7f10a0400000 r--p 00000000 fd:01 2042 /opt/my env/lib/libnvrtc-builtins.so.13.0
7f10b0000000-7f10b5000000 r-xp 00000000 fd:01 2041 /opt/my env/lib/libnvrtc.so.13
7f10c0000000-7f10c0021000 rw-p 00000000 00:00 0 
7ffd2c3f1000-7ffd2c412000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            mapped_file(maps, "libnvrtc.so"),
            Some("/opt/my env/lib/libnvrtc.so.13".into())
        );
        assert_eq!(mapped_file(maps, "libcuda.so"), None);
        assert_eq!(mapped_file("", "libnvrtc.so"), None);
    }

    #[test]
    fn a_library_not_loaded_has_no_file() {
        // Nothing in this test process probes NCCL.
        assert_eq!(loaded_file(Library::Nccl), None);
    }
}
