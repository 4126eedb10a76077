//! Compiling a source to a cubin with NVRTC (no GPU needed), and which NVRTC that is.

use std::ffi::CString;

use p2p_sys::{check_nvrtc, nvrtc, Library};

use crate::error::{Error, Result};

use super::*;

/// Compiles `source` to a cubin for `arch` (e.g. `sm_90`). Needs libnvrtc, but no GPU.
/// NVRTC's optimiser runs on every core (`-split-compile`, which leaves the code unchanged).
pub fn compile(source: &Source, arch: &str) -> Result<Vec<u8>> {
    only(
        compile_all(std::slice::from_ref(source), arch)?,
        source,
        arch,
    )
}

/// The one cubin of a one-source compile.
pub(super) fn only(mut cubins: Vec<Vec<u8>>, source: &Source, arch: &str) -> Result<Vec<u8>> {
    cubins
        .pop()
        .ok_or_else(|| compile_error(source, arch, "no cubin"))
}

/// Compiles several sources for `arch`, in parallel: one compile per core at a time (threads
/// of its own, each taking the next source), NVRTC's optimiser splitting each over the cores
/// left (`-split-compile`). Returns the cubins in the order of `sources`, or the error of a
/// source that failed. One large program cut into parts compiles several times faster this
/// way than whole (docs/performance.md, "The first compile and the kernel cache"). It waits
/// for NVRTC however long the compile takes (work on the CPU, which ends): the compile at
/// first use ([`compile_cached_all`]) is the one with a limit.
pub fn compile_all(sources: &[Source], arch: &str) -> Result<Vec<Vec<u8>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    p2p_sys::probe::require(Library::Nvrtc)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let split = (cores / sources.len().max(1)).max(1);
    if sources.len() <= 1 {
        return sources
            .iter()
            .map(|s| compile_with(s, arch, split))
            .collect();
    }
    // Not more compiles at once than cores: on 2 cores, eight at once took 28-31 s against
    // 20-22 s two at a time (docs/performance.md, "The first compile and the kernel cache").
    // Threads of our own, not a pool shared with the caller's work (a pool's worker could wait
    // on itself through the compile lock).
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(source) = sources.get(i) else {
                return done;
            };
            done.push((i, compile_with(source, arch, split)));
        }
    };
    // Per thread: the (source, cubin) pairs it compiled; `None` if it did not start or panicked.
    type Done = Option<Vec<(usize, Result<Vec<u8>>)>>;
    let finished: Vec<Done> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cores.min(sources.len()))
            .map(|_| {
                std::thread::Builder::new()
                    .name("p2p-nvrtc".into())
                    .spawn_scoped(s, work)
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.ok().and_then(|w| w.join().ok()))
            .collect()
    });
    let mut cubins: Vec<Option<Result<Vec<u8>>>> = sources.iter().map(|_| None).collect();
    for (i, r) in finished.into_iter().flatten().flatten() {
        cubins[i] = Some(r);
    }
    // A thread that could not start, or panicked, leaves its sources unanswered: compile them
    // here.
    sources
        .iter()
        .zip(cubins)
        .map(|(source, c)| c.unwrap_or_else(|| compile_with(source, arch, 1)))
        .collect()
}

/// The options of every compile for `arch` (part of the cache key), before the macros.
pub(super) fn options(arch: &str) -> [String; 3] {
    [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
}

/// One NVRTC compile, its optimiser split over `split` threads (`-split-compile`; an NVRTC
/// that rejects the option compiles again on one thread).
pub(super) fn compile_with(source: &Source, arch: &str, split: usize) -> Result<Vec<u8>> {
    let code = CString::new(source.code)
        .map_err(|_| compile_error(source, arch, "source contains a NUL byte"))?;
    let name = CString::new(source.name)
        .map_err(|_| compile_error(source, arch, "name contains a NUL byte"))?;
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: libnvrtc is loaded; the strings are NUL-terminated and outlive the call.
    check_nvrtc("nvrtcCreateProgram", unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            code.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let program = Program(prog);
    let mut opts = options(arch).to_vec();
    opts.extend(source.defines.iter().map(|d| format!("--define-macro={d}")));
    if split > 1 {
        opts.push(format!("-split-compile={split}"));
    }
    let opts: Vec<CString> = opts
        .into_iter()
        .map(CString::new)
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| compile_error(source, arch, "a macro contains a NUL byte"))?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the program is live; `opt_ptrs` holds `len` NUL-terminated strings that outlive the call.
    let compiled =
        unsafe { nvrtc::nvrtcCompileProgram(program.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if compiled == nvrtc::nvrtcResult::NVRTC_ERROR_INVALID_OPTION {
        let log = program.log();
        if split > 1 {
            // NVRTC before -split-compile rejects it; any other bad option fails again below.
            tracing::debug!(kernel = %source.label(), "NVRTC rejected an option ({log}); compiling again without -split-compile");
            return compile_with(source, arch, 1);
        }
        return Err(compile_error(
            source,
            arch,
            &format!("NVRTC rejected an option of {opts:?}: {log}"),
        ));
    }
    if compiled == nvrtc::nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Err(compile_error(source, arch, &program.log()));
    }
    if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        // Not the code's fault (memory, NVRTC's builtins): an error of NVRTC's, which another
        // try may not meet, so the compile lock does not pass it on to its waiters.
        let log = program.log();
        if !log.trim().is_empty() {
            tracing::warn!(kernel = %source.label(), %arch, "NVRTC's log: {log}");
        }
        check_nvrtc("nvrtcCompileProgram", compiled)?;
    }
    let mut size = 0;
    // SAFETY: the program compiled; `size` is an out-pointer.
    check_nvrtc("nvrtcGetCUBINSize", unsafe {
        nvrtc::nvrtcGetCUBINSize(program.0, &mut size)
    })?;
    if size == 0 {
        // NVRTC's answer for a virtual target (`compute_90`): PTX only.
        return Err(compile_error(
            source,
            arch,
            "no cubin for this target (a virtual architecture?): name a real one, e.g. sm_90",
        ));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the size NVRTC reported.
    check_nvrtc("nvrtcGetCUBIN", unsafe {
        nvrtc::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast())
    })?;
    Ok(cubin)
}

/// The NVRTC this process compiles with: what the kernel cache's key holds of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiler {
    /// NVRTC's (major, minor) version.
    pub version: (i32, i32),
    /// The libnvrtc file loaded (`None` where the process's map cannot be read).
    pub file: Option<std::path::PathBuf>,
    /// That file's GNU build ID, in hex: it tells apart releases that report the same
    /// major.minor (13.0.48 and 13.0.88), so a cubin cached by one is not taken for the
    /// other's. `None` where it cannot be read: the key then holds major.minor alone.
    pub build_id: Option<String>,
}

impl std::fmt::Display for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.version;
        write!(f, "NVRTC {major}.{minor}")?;
        if let Some(file) = &self.file {
            write!(f, ", {}", file.display())?;
        }
        match &self.build_id {
            Some(id) => write!(f, ", build {id}"),
            None => f.write_str(", build ID unknown"),
        }
    }
}

/// The NVRTC this process compiles with (loads libnvrtc; read once per process).
///
/// ```no_run
/// // e.g. "NVRTC 13.0, /usr/local/cuda/lib64/libnvrtc.so.13, build 65be0db3…"
/// println!("{}", p2p_mem::kernel::compiler()?);
/// # Ok::<(), p2p_mem::Error>(())
/// ```
pub fn compiler() -> Result<Compiler> {
    static COMPILER: std::sync::OnceLock<Compiler> = std::sync::OnceLock::new();
    p2p_sys::probe::require(Library::Nvrtc)?;
    Ok(COMPILER
        .get_or_init(|| {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: libnvrtc is loaded (probed above); both are out-pointers.
            unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
            let file = p2p_sys::probe::loaded_file(Library::Nvrtc);
            let build_id = file.as_deref().and_then(build_id);
            if build_id.is_none() {
                tracing::debug!(
                    ?file,
                    "no build ID of libnvrtc: the kernel cache keys on NVRTC {major}.{minor} alone"
                );
            }
            Compiler {
                version: (major, minor),
                file,
                build_id,
            }
        })
        .clone())
}

/// The GNU build ID of an ELF file, in hex (reads its headers and notes only).
pub(super) fn build_id(file: &std::path::Path) -> Option<String> {
    use object::Object;
    let cache = object::ReadCache::new(std::fs::File::open(file).ok()?);
    let id = object::File::parse(&cache).ok()?.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

pub(super) fn compile_error(source: &Source, arch: &str, log: &str) -> Error {
    Error::Compile {
        kernel: source.label(),
        arch: arch.into(),
        log: log.into(),
    }
}

/// An NVRTC program, destroyed on `Drop`.
pub(super) struct Program(nvrtc::nvrtcProgram);

impl Program {
    pub(super) fn log(&self) -> String {
        let mut size = 0;
        // SAFETY: the program is live; `size` is an out-pointer.
        if unsafe { nvrtc::nvrtcGetProgramLogSize(self.0, &mut size) }
            != nvrtc::nvrtcResult::NVRTC_SUCCESS
        {
            return "(no log)".into();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` has the size NVRTC reported.
        unsafe { nvrtc::nvrtcGetProgramLog(self.0, log.as_mut_ptr().cast()) };
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once.
        unsafe { nvrtc::nvrtcDestroyProgram(&mut self.0) };
    }
}
