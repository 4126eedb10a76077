//! The GPU runtime for our own kernels: CUDA C++ shipped compiled for sm_80 and sm_90
//! ([`shipped`]), else compiled by NVRTC for the device's own architecture at first use and
//! cached on disk; loaded into a device's context and launched.
//!
//! Every crate's kernels go through here (the transport's copy, probe, latency and send/recv
//! kernels, the collectives' `coll.cu`): [`compile_cached_all`] is the one compile path (the
//! shipped cubins first, then an in-process
//! memo plus an on-disk cache keyed by the source, its macros, the target and the NVRTC release,
//! [`compiler`]; the sources missing from it compile in parallel threads, waited for at most
//! [`COMPILE_LIMIT`]), [`compile_cached`] its
//! one-source case; [`compile_all`] and [`compile`] are the uncached step under them, for CI's
//! compile checks. [`Module`] loads a cubin and launches its [`Function`]s on a [`Stream`].
//!
//! ```no_run
//! use p2p_mem::kernel::{Module, Source};
//! const K: Source = Source {
//!     name: "k.cu",
//!     code: "extern \"C\" __global__ void k() {}",
//!     defines: &[],
//!     shipped: &[],
//! };
//! let gpu = p2p_mem::Device::new(0)?;
//! let module = Module::build(&gpu, &K)?;
//! let k = module.function("k")?;
//! # Ok::<(), p2p_mem::Error>(())
//! ```

use std::ffi::{c_void, CString};
use std::sync::Arc;

use p2p_sys::{check_nvrtc, cu, cuda, nvrtc, Library};

use crate::device::{Device, Stream};
use crate::error::{Error, Result};

pub mod shipped;

/// A kernel source: its name, CUDA C++ text and the macros it is compiled with.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name, used in error messages.
    pub name: &'static str,
    /// The CUDA C++ code.
    pub code: &'static str,
    /// Macros defined for the compile, each `NAME` or `NAME=VALUE` (NVRTC's `-D`): one text
    /// compiled into several programs, e.g. a part of its kernels each (empty for most).
    pub defines: &'static [&'static str],
    /// The crate's archive of shipped cubins ([`shipped`]; `include_bytes!` of the file
    /// `cargo xtask kernels` writes), empty for none. An image in it is used only if it was
    /// compiled from this very source.
    pub shipped: &'static [u8],
}

impl Source {
    /// The name, with the macros if any: `coll.cu [COLL_PART=0]`.
    fn label(&self) -> String {
        if self.defines.is_empty() {
            self.name.to_string()
        } else {
            format!("{} [{}]", self.name, self.defines.join(" "))
        }
    }
}

/// `sm_90` for compute capability 9.0.
pub fn arch_for(device: &Device) -> String {
    let (major, minor) = device.compute_capability();
    format!("sm_{major}{minor}")
}

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
fn only(mut cubins: Vec<Vec<u8>>, source: &Source, arch: &str) -> Result<Vec<u8>> {
    cubins
        .pop()
        .ok_or_else(|| compile_error(source, arch, "no cubin"))
}

/// Compiles several sources for `arch`, in parallel: one compile per core at a time (threads
/// of its own, each taking the next source), NVRTC's optimiser splitting each over the cores
/// left (`-split-compile`). Returns the cubins in the order of `sources`, or the error of a
/// source that failed. One large program cut into parts compiles several times faster this
/// way than whole (docs/perf-notes.md sections 39 and 41). It waits for NVRTC however long the
/// compile takes (work on the CPU, which ends): the compile at first use
/// ([`compile_cached_all`]) is the one with a limit.
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
    // 20-22 s two at a time (perf-notes section 41). Threads of our own, not a pool shared with
    // the caller's work (a pool's worker could wait on itself through the compile lock).
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
fn options(arch: &str) -> [String; 3] {
    [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
}

/// One NVRTC compile, its optimiser split over `split` threads (`-split-compile`; an NVRTC
/// that rejects the option compiles again on one thread).
fn compile_with(source: &Source, arch: &str, split: usize) -> Result<Vec<u8>> {
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

/// As [`compile`], but remembers the cubin: in this process, and on disk under
/// `$XDG_CACHE_HOME/p2p/kernels` (or `~/.cache/p2p/kernels`), keyed by a hash of the source, its
/// macros, the target and the NVRTC release (its version and library's build ID). Large kernels
/// take NVRTC seconds; a cache hit takes microseconds. A cache that cannot be read or written is
/// skipped, never an error.
pub fn compile_cached(source: &Source, arch: &str) -> Result<Vec<u8>> {
    only(
        compile_cached_all(std::slice::from_ref(source), arch)?,
        source,
        arch,
    )
}

/// As [`compile_all`] (the sources not cached compile in parallel), with [`compile_cached`]'s
/// cache. Returns the cubins in the order of `sources`. Processes that miss the same sources
/// at once compile them once: the first holds a lock file in the cache folder while it
/// compiles, the others wait for it (at most five minutes, then compile themselves) and read
/// its cubins, or return its compile error if it failed. A cubin that cannot be written to the
/// cache is logged as a warning.
///
/// Before any of that, the cubins shipped with the crates ([`shipped`]): where every one of
/// `sources` is shipped for `arch` (or a target whose cubins run on it) as it is now, they are
/// returned with no compiler loaded.
///
/// A compile has a limit, [`COMPILE_LIMIT`] ([`compile_cached_all_within`] takes another):
/// past it the call returns [`Error::CompileTimeout`], which says what to do, while the
/// compile goes on in its thread (`p2p-compile`) and, once it ends, fills the on-disk cache and
/// this process's memo, so that a later call (or process) finds the kernels.
pub fn compile_cached_all(sources: &[Source], arch: &str) -> Result<Vec<Vec<u8>>> {
    compile_cached_all_within(sources, arch, COMPILE_LIMIT)
}

/// As [`compile_cached_all`], with `limit` for the compile instead of [`COMPILE_LIMIT`] (the
/// wait for another process compiling the same kernels has its own limit, five minutes).
pub fn compile_cached_all_within(
    sources: &[Source],
    arch: &str,
    limit: std::time::Duration,
) -> Result<Vec<Vec<u8>>> {
    if !prefer_compile() {
        if let Some(cubins) = shipped::cubins(sources, arch) {
            return Ok(cubins);
        }
    }
    cubins_warned(sources, arch, Reuse::MemoAndDisk, Some(limit))
}

/// How long a compile at first use ([`compile_cached_all`], under [`Module::build`] and every
/// communicator's start) may take before the call gives up with [`Error::CompileTimeout`]:
/// far longer than a compile takes (the collective kernels: 8-11 s on 16 cores, 20-31 s on 2),
/// so that only a compiler that hangs, or a machine far too small, meets it. Filling the cache
/// ahead ([`cache_all`], `p2p-bench kernels`) has no limit.
pub const COMPILE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Whether `P2P_KERNELS=compile` asks for NVRTC (and its cache) instead of the shipped cubins:
/// to compile for the GPU's exact architecture (an sm_89 runs sm_80's cubins otherwise), or to
/// time one against the other. Any other value (the default, `shipped`) takes the shipped ones;
/// `p2p_transport::config` refuses values other than `shipped` and `compile`.
pub fn prefer_compile() -> bool {
    std::env::var("P2P_KERNELS").is_ok_and(|v| v == "compile")
}

/// [`cached_compile`]'s cubins, a cubin that could not be written to the cache logged as a
/// warning.
fn cubins_warned(
    sources: &[Source],
    arch: &str,
    reuse: Reuse,
    limit: Option<std::time::Duration>,
) -> Result<Vec<Vec<u8>>> {
    let done = cached_compile(sources, arch, reuse, limit)?;
    for why in &done.unstored {
        tracing::warn!("kernel cache: {why}; the next process compiles again");
    }
    Ok(done.cubins)
}

/// Compiles into the on-disk cache ([`cache_dir`]) those of `sources` that are not there yet,
/// as [`compile_cached_all`] does, and checks that every one is on disk afterwards: for
/// filling the cache ahead of a job (a container's build step), where a cache that was not
/// written must be an error, not a warning. Returns how many it compiled (0: all were cached).
pub fn cache_all(sources: &[Source], arch: &str) -> Result<usize> {
    let Some(dir) = cache_dir() else {
        return Err(Error::Cache {
            dir: "(none)".into(),
            why: "neither XDG_CACHE_HOME nor HOME is set".into(),
        });
    };
    // Past the memo: what this process compiled before may never have reached the disk. So
    // every cubin either was read from the disk or compiled now and written (or reported).
    // No limit: this is what a user runs when a compile at first use met its limit.
    let done = cached_compile(sources, arch, Reuse::Disk, None)?;
    match done.unstored.into_iter().next() {
        Some(why) => Err(Error::Cache {
            dir: dir.display().to_string(),
            why,
        }),
        None => Ok(done.compiled),
    }
}

/// How many of `sources` the on-disk cache ([`cache_dir`]) holds, whole, for `arch` with this
/// process's NVRTC ([`compiler`]); compiles nothing. For telling a user ahead of time whether
/// a first communicator will compile (`p2p-bench doctor`).
pub fn cached(sources: &[Source], arch: &str) -> Result<usize> {
    let mut n = 0;
    for source in sources {
        let file = cache_file(source, arch)?;
        n += usize::from(read_cubin(file.as_deref(), source, arch).is_some());
    }
    Ok(n)
}

/// The cache file of `source`'s cubin for `arch` with this process's NVRTC, whether or not it
/// exists (`None` without a cache folder: [`cache_dir`]).
pub fn cache_file(source: &Source, arch: &str) -> Result<Option<std::path::PathBuf>> {
    Ok(cache_entry(cache_dir().as_deref(), source, arch, &compiler()?).1)
}

/// The cache key of `source`'s cubin for `arch` with `compiler`, and its file in `dir`.
fn cache_entry(
    dir: Option<&std::path::Path>,
    source: &Source,
    arch: &str,
    compiler: &Compiler,
) -> (u64, Option<std::path::PathBuf>) {
    let key = cache_key(source, arch, compiler);
    (key, dir.map(|d| d.join(cache_name(source, arch, key))))
}

/// What [`cached_compile`] did.
struct Compiled {
    /// In the order of the sources.
    cubins: Vec<Vec<u8>>,
    /// How many it compiled (the others came from the memo or the disk).
    compiled: usize,
    /// Why a compiled cubin could not be written to the cache, one line each.
    unstored: Vec<String>,
}

/// The cubins this process compiled or read, by cache key.
type Memo = std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>;
static MEMO: std::sync::OnceLock<Memo> = std::sync::OnceLock::new();

fn memo_get(key: u64) -> Option<Vec<u8>> {
    MEMO.get()?.lock().ok()?.get(&key).cloned()
}

/// Which cubins [`cached_compile`] may take instead of compiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// This process's memo, then the disk.
    MemoAndDisk,
    /// The disk only (what the memo holds may never have reached it).
    Disk,
    /// None: every source compiles (a cached one was refused).
    Nothing,
}

/// The cubins of `sources`: from what `reuse` allows, else compiled (under the compile lock)
/// and written to the disk and the memo, waiting at most `limit` for the compile
/// ([`CompileJob::run_within`]).
fn cached_compile(
    sources: &[Source],
    arch: &str,
    reuse: Reuse,
    limit: Option<std::time::Duration>,
) -> Result<Compiled> {
    let remembered = |key, file: Option<&std::path::Path>, source| match reuse {
        Reuse::MemoAndDisk => memo_get(key).or_else(|| read_cubin(file, source, arch)),
        Reuse::Disk => read_cubin(file, source, arch),
        Reuse::Nothing => None,
    };
    let compiler = compiler()?;
    let dir = cache_dir();
    let mut keys = Vec::with_capacity(sources.len());
    let mut cubins: Vec<Option<Vec<u8>>> = Vec::with_capacity(sources.len());
    for source in sources {
        let (key, file) = cache_entry(dir.as_deref(), source, arch, &compiler);
        cubins.push(remembered(key, file.as_deref(), source));
        keys.push((key, file));
    }
    let mut missing: Vec<usize> = (0..sources.len())
        .filter(|&i| cubins[i].is_none())
        .collect();
    // One compile per machine: processes starting together (one per GPU) that miss the same
    // kernels take turns; the first compiles and writes the cache, the others then read it.
    let lock = match (&dir, missing.is_empty()) {
        (Some(d), false) => {
            let set: Vec<[u8; 8]> = missing.iter().map(|&i| keys[i].0.to_le_bytes()).collect();
            let set: Vec<&[u8]> = set.iter().map(|k| &k[..]).collect();
            compile_lock(d, fnv1a(&set), COMPILE_WAIT)
        }
        _ => None,
    };
    // What the lock's previous holder (another process, or a thread of this one) made.
    for &i in &missing {
        let (key, file) = &keys[i];
        cubins[i] = remembered(*key, file.as_deref(), &sources[i]);
    }
    missing.retain(|&i| cubins[i].is_none());
    // A holder we waited for failed to compile them: the same compile would fail here too, so
    // its error, at once, rather than every waiting rank failing in turn.
    if let (Some(&first), Some(failed)) = (missing.first(), lock.as_ref().and_then(|l| l.failure()))
    {
        let why = format!(
            "another process (or thread) compiled these kernels while this one waited, and failed: {failed}"
        );
        return Err(compile_error(&sources[first], arch, &why));
    }
    let mut unstored = Vec::new();
    if !missing.is_empty() {
        let job = CompileJob {
            todo: missing.iter().map(|&i| sources[i]).collect(),
            arch: arch.to_string(),
            dir: dir.clone(),
            entries: missing.iter().map(|&i| keys[i].clone()).collect(),
            lock,
        };
        let (compiled, not_written) = job.run_within(limit)?;
        unstored = not_written;
        for (&i, c) in missing.iter().zip(compiled) {
            cubins[i] = Some(c);
        }
    }
    let memo = MEMO.get_or_init(Default::default);
    let mut out = Vec::with_capacity(sources.len());
    for ((source, (key, _)), cubin) in sources.iter().zip(keys).zip(cubins) {
        let c = cubin.ok_or_else(|| compile_error(source, arch, "no cubin"))?;
        if let Ok(mut m) = memo.lock() {
            m.insert(key, c.clone());
        }
        out.push(c);
    }
    Ok(Compiled {
        cubins: out,
        compiled: missing.len(),
        unstored,
    })
}

/// The sources of one [`cached_compile`] that neither the memo nor the disk held: compiled,
/// then written to the disk and the memo, all under the compile lock, which is released once
/// they are written (so that a process waiting for it finds them).
struct CompileJob {
    todo: Vec<Source>,
    arch: String,
    dir: Option<std::path::PathBuf>,
    /// Each source's cache key and file.
    entries: Vec<(u64, Option<std::path::PathBuf>)>,
    lock: Option<CompileLock>,
}

impl CompileJob {
    /// Runs the job, waiting for it at most `limit` (`None`: for as long as it takes). The
    /// compile runs in a thread of its own (`p2p-compile`); past the limit the call returns
    /// [`Error::CompileTimeout`] and leaves that thread to finish: a compile is work on the
    /// CPU and ends, and what it makes then lands in the cache and the memo for the next call.
    /// Returns the cubins, in the order of the sources, and why any could not be written to
    /// the cache.
    fn run_within(self, limit: Option<std::time::Duration>) -> Result<(Vec<Vec<u8>>, Vec<String>)> {
        let Some(limit) = limit else {
            return self.run();
        };
        let names: Vec<String> = self.todo.iter().map(Source::label).collect();
        let arch = self.arch.clone();
        match in_thread_within("p2p-compile", limit, move || self.run()) {
            Ok(done) => done,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Compile {
                kernel: names.join(", "),
                arch,
                log: "the compile thread ended without an answer (it panicked)".into(),
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(kernels = ?names, %arch, "NVRTC did not finish within {limit:?}: giving up on it here; it goes on in thread p2p-compile and fills the kernel cache when it ends");
                Err(Error::CompileTimeout {
                    kernels: names.join(", "),
                    arch,
                    limit,
                })
            }
        }
    }

    /// Compiles the sources, writes the cubins to the cache and the memo, then lets the lock go.
    fn run(self) -> Result<(Vec<Vec<u8>>, Vec<String>)> {
        let CompileJob {
            todo,
            arch,
            dir,
            entries,
            lock,
        } = self;
        let arch = arch.as_str();
        let names: Vec<String> = todo.iter().map(Source::label).collect();
        // Said before as well as after: a first compile takes seconds, and a silent wait in
        // init looks like a hang.
        let place = dir
            .as_ref()
            .map_or("no cache folder".into(), |d| d.display().to_string());
        tracing::info!(kernels = ?names, %arch, "compiling (not in the kernel cache: {place}); seconds once, then cached");
        let t = std::time::Instant::now();
        let record = |failure: Option<&str>| lock.iter().for_each(|l| l.record(failure));
        record(None);
        let compiled = compile_all(&todo, arch).inspect_err(|e| {
            // A fault of the code, its options or the target, which every waiter would meet:
            // for their errors, which name their own first kernel and the target. Other
            // failures (NVRTC's memory, a thread) are not passed on: each waiter tries.
            if let Error::Compile { kernel, log, .. } = e {
                record(Some(&format!("{kernel}: {log}")));
            }
        })?;
        tracing::info!(kernels = ?names, %arch, "compiled in {:.1} s", t.elapsed().as_secs_f64());
        let mut unstored = Vec::new();
        let memo = MEMO.get_or_init(Default::default);
        for ((key, file), c) in entries.iter().zip(&compiled) {
            if let (Some(d), Some(f)) = (&dir, file) {
                if let Err(e) = store(d, f, c) {
                    unstored.push(format!("could not write {}: {e}", f.display()));
                }
            }
            if let Ok(mut m) = memo.lock() {
                m.insert(*key, c.clone());
            }
        }
        drop(lock);
        Ok((compiled, unstored))
    }
}

/// Runs `job` in a new thread named `name` and waits for it at most `limit`: its answer,
/// `Timeout` at the deadline (the thread is then left to finish on its own: for work that ends
/// by itself, such as a compile), or `Disconnected` if it panicked. Where no thread can start,
/// `job` runs in this one, unbounded.
fn in_thread_within<T: Send + 'static>(
    name: &str,
    limit: std::time::Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, std::sync::mpsc::RecvTimeoutError> {
    let (tx, rx) = std::sync::mpsc::channel();
    // The job moves into the thread; if the thread cannot start, it is taken back here.
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(job)));
    let theirs = slot.clone();
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let job = theirs.lock().ok().and_then(|mut j| j.take());
            if let Some(job) = job {
                let _ = tx.send(job());
            }
        });
    if let Err(e) = started {
        tracing::debug!("could not start thread {name} ({e}): running its work in this one");
        let job = slot.lock().ok().and_then(|mut j| j.take());
        return job
            .map(|job| job())
            .ok_or(std::sync::mpsc::RecvTimeoutError::Disconnected);
    }
    rx.recv_timeout(limit)
}

/// Writes a cubin into the cache: to a file of this write's own, then renamed into place, so
/// that a reader never sees part of one.
fn store(dir: &std::path::Path, file: &std::path::Path, cubin: &[u8]) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = file.with_extension(format!("tmp{}-{n}", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, cubin))
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The folder of [`compile_cached`]'s cubins: `$XDG_CACHE_HOME/p2p/kernels`, else
/// `$HOME/.cache/p2p/kernels`; `None` with neither variable set (nothing is cached then).
pub fn cache_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .map(|d| d.join("p2p").join("kernels"))
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
fn build_id(file: &std::path::Path) -> Option<String> {
    use object::Object;
    let cache = object::ReadCache::new(std::fs::File::open(file).ok()?);
    let id = object::File::parse(&cache).ok()?.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Changed by hand whenever a cached cubin could differ for another reason than the key's
/// other parts (the code, the target, the NVRTC release, the options and the macros).
const CACHE_FORMAT: &str = "p2p-kernel-cache-2";

/// The cache key of a compile: a hash of the code, the target, the compiler (NVRTC's version
/// and its library's build ID), the options and the macros.
fn cache_key(source: &Source, arch: &str, compiler: &Compiler) -> u64 {
    let (major, minor) = compiler.version;
    let (major, minor) = (major.to_le_bytes(), minor.to_le_bytes());
    let build = compiler.build_id.as_deref().unwrap_or("");
    let options = options(arch);
    let mut parts = vec![
        source.code.as_bytes(),
        arch.as_bytes(),
        &major[..],
        &minor[..],
        build.as_bytes(),
        CACHE_FORMAT.as_bytes(),
    ];
    parts.extend(options.iter().map(|o| o.as_bytes()));
    parts.extend(source.defines.iter().map(|d| d.as_bytes()));
    fnv1a(&parts)
}

fn cache_name(source: &Source, arch: &str, key: u64) -> String {
    format!("{}-{arch}-{key:016x}.cubin", source.name)
}

/// How long a process waits for another one compiling the same kernels before it compiles
/// them itself: far longer than a compile takes (10 s on 16 cores, 20-27 s on 2).
const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// A cached cubin, if `file` holds a whole one.
fn read_cubin(file: Option<&std::path::Path>, source: &Source, arch: &str) -> Option<Vec<u8>> {
    let c = std::fs::read(file?).ok().filter(|c| whole_elf(c))?;
    tracing::debug!(kernel = %source.label(), %arch, "kernel cache hit");
    Some(c)
}

/// Whether `c` is a whole 64-bit little-endian ELF image, as cubins are: its section header
/// table, which NVRTC writes last, ends inside it (a file cut short is not one), and so does
/// every section with contents and every segment it names (a damaged one could send the
/// driver's loader past the end).
fn whole_elf(c: &[u8]) -> bool {
    let at = |o: u64, n: usize| -> Option<u64> {
        let o = usize::try_from(o).ok()?;
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(c.get(o..o.checked_add(n)?)?);
        Some(u64::from_le_bytes(b))
    };
    let len = c.len() as u64;
    let inside = |offset: u64, size: u64| offset.checked_add(size).is_some_and(|end| end <= len);
    // Each entry of a table at `table` (`table_entry`, `table_count` at those header offsets):
    // where its contents start and their size (at `off` and `size` in the entry), and whether
    // it has contents in the file (`kind`: a section of type SHT_NOBITS has none).
    let entries_inside =
        |table: u64, entry: u64, count: u64, off: u64, size: u64, kind: Option<u64>| {
            (0..count).all(|i| {
                let base = table + i * entry;
                let has_bytes = kind.is_none_or(|k| at(base + k, 4) != Some(8));
                match (at(base + off, 8), at(base + size, 8)) {
                    (Some(o), Some(n)) => !has_bytes || inside(o, n),
                    _ => false,
                }
            })
        };
    let check = || -> Option<bool> {
        let (shoff, shentsize, shnum) = (at(0x28, 8)?, at(0x3a, 2)?, at(0x3c, 2)?);
        let (phoff, phentsize, phnum) = (at(0x20, 8)?, at(0x36, 2)?, at(0x38, 2)?);
        let shstrndx = at(0x3e, 2)?;
        Some(
            shnum > 0
                && shstrndx < shnum
                && shentsize >= 0x40
                && inside(shoff, shentsize * shnum)
                && entries_inside(shoff, shentsize, shnum, 0x18, 0x20, Some(4))
                && (phnum == 0
                    || (phentsize >= 0x38
                        && inside(phoff, phentsize * phnum)
                        && entries_inside(phoff, phentsize, phnum, 0x08, 0x20, None))),
        )
    };
    c.starts_with(b"\x7fELF\x02\x01") && check() == Some(true)
}

/// Checks that `image` is something [`Module::load`] may hand the driver, which takes no
/// length: a whole 64-bit cubin (its section and program header tables, and every section and
/// segment with contents, end inside it, and its section-name table is one of its sections) or
/// PTX: text (printable ASCII and whitespace) up to a NUL inside the slice. Anything else,
/// fatbins included, is refused. For a cubin this checks the layout, not the contents (symbol
/// and string tables, CUDA's own records): it catches files cut short or damaged in their
/// tables, the ways a cache file goes bad, not a crafted one.
///
/// ```
/// assert!(p2p_mem::kernel::check_image(b".version 8.0\0").is_ok());
/// assert!(p2p_mem::kernel::check_image(b".version 8.0").is_err());
/// ```
pub fn check_image(image: &[u8]) -> Result<()> {
    if image.starts_with(b"\x7fELF") {
        if whole_elf(image) {
            return Ok(());
        }
        return Err(Error::InvalidArgument(format!(
            "a {}-byte ELF image that is not a whole 64-bit cubin (a table, section or segment ends past it)",
            image.len()
        )));
    }
    let text = |b: &u8| b.is_ascii_graphic() || b.is_ascii_whitespace();
    match image.iter().position(|&b| b == 0) {
        Some(end) if end > 0 && image[..end].iter().all(text) => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "a {}-byte image that is neither a cubin (ELF) nor NUL-terminated PTX text",
            image.len()
        ))),
    }
}

/// The compile lock of one set of kernels, held while this lives: an exclusive advisory lock
/// (`flock`) on `dir/<set>.lock`, released when the file closes, and by the holder's death.
/// The file holds why the last holder's compile failed (empty: it did not fail, or died first).
/// A holder removes the file as it lets go (see `Drop`), so the cache folder does not keep one
/// per set of kernels ever compiled.
struct CompileLock {
    file: std::fs::File,
    /// Another holder had it first, and this process waited for it.
    waited: bool,
    /// Where `file` was opened (`None`: leave the file where it is).
    path: Option<std::path::PathBuf>,
}

impl Drop for CompileLock {
    /// Removes the lock file, still holding the lock, where its path still names this file: a
    /// holder that had waited on a file its predecessor removed leaves alone the new one that a
    /// later process made. Processes that had opened the removed file and wait on it take its
    /// lock in turn and read its record through their own handles; a process arriving later
    /// finds the cubins in the cache, or makes a new lock file.
    fn drop(&mut self) {
        let Some(path) = &self.path else { return };
        let same = match (rustix::fs::fstat(&self.file), rustix::fs::stat(path)) {
            (Ok(mine), Ok(there)) => mine.st_dev == there.st_dev && mine.st_ino == there.st_ino,
            _ => false,
        };
        if same {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::debug!("could not remove the compile lock {}: {e}", path.display());
            }
        }
    }
}

impl CompileLock {
    /// Why the holder this process waited for failed to compile (`None`: it did not fail, or
    /// this process did not wait, so a failure written there is an earlier run's).
    fn failure(&self) -> Option<String> {
        use std::io::{Read, Seek};
        if !self.waited {
            return None;
        }
        let mut bytes = Vec::new();
        let mut f = &self.file;
        f.rewind().ok()?;
        f.take(64 << 10).read_to_end(&mut bytes).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned()).filter(|t| !t.is_empty())
    }

    /// Records why this holder's compile failed (`None`: clears an earlier record).
    fn record(&self, failure: Option<&str>) {
        use std::io::{Seek, Write};
        let mut f = &self.file;
        let written = f
            .set_len(0)
            .and_then(|()| f.rewind())
            .and_then(|()| f.write_all(failure.unwrap_or("").as_bytes()));
        if let Err(e) = written {
            tracing::debug!("could not record in the compile lock: {e}");
        }
    }
}

/// Waits at most `wait` for the compile lock of kernel set `set` in `dir`. `None` where the lock
/// cannot be had (no folder, no `flock`, or the wait ran out), and the caller compiles
/// without it.
fn compile_lock(dir: &std::path::Path, set: u64, wait: std::time::Duration) -> Option<CompileLock> {
    use rustix::fs::{flock, FlockOperation};
    use rustix::io::Errno;
    let path = dir.join(format!("{set:016x}.lock"));
    let file = std::fs::create_dir_all(dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
        })
        .map_err(|e| tracing::debug!("no compile lock at {}: {e}", path.display()))
        .ok()?;
    let deadline = std::time::Instant::now() + wait;
    let mut waited = false;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                return Some(CompileLock {
                    file,
                    waited,
                    path: Some(path),
                })
            }
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {}
            Err(e) => {
                tracing::debug!("no compile lock at {}: {e}", path.display());
                return None;
            }
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                "another process (or thread) has been compiling the same kernels for {wait:?} (it holds {}): compiling them here",
                path.display()
            );
            return None;
        }
        if !waited {
            tracing::info!(
                "another process (or thread) is compiling the same kernels (it holds {}): waiting for it",
                path.display()
            );
            waited = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn compile_error(source: &Source, arch: &str, log: &str) -> Error {
    Error::Compile {
        kernel: source.label(),
        arch: arch.into(),
        log: log.into(),
    }
}

/// An NVRTC program, destroyed on `Drop`.
struct Program(nvrtc::nvrtcProgram);

impl Program {
    fn log(&self) -> String {
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

/// A kernel in a loaded [`Module`]. It keeps its module loaded, so its handle never dangles:
/// the module is unloaded when the [`Module`] and all its `Function`s are gone. It launches
/// only through that [`Module`].
#[derive(Clone)]
pub struct Function {
    raw: cuda::CUfunction,
    module: Arc<Loaded>,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("raw", &self.raw)
            .field("device", &self.module.device.ordinal())
            .finish()
    }
}

// SAFETY: a CUfunction is an immutable handle usable from any thread; its module (held) is too.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// How many blocks of `threads` threads can be resident on one SM at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, no dynamic shared memory).
    pub fn max_blocks_per_sm(&self, threads: u32) -> Result<i32> {
        let mut n = 0;
        // SAFETY: the function handle is live while its module is, which this holds; `n` is an
        // out-pointer.
        unsafe {
            p2p_sys::cu!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.raw,
                threads as i32,
                0
            ))
        }
        .map_err(|e| on(&self.module.device, e))?;
        Ok(n)
    }
}

/// A cubin loaded into one device's context; unloaded once it and every [`Function`] taken
/// from it are dropped.
pub struct Module {
    inner: Arc<Loaded>,
}

/// A loaded module's handle, shared by the [`Module`] and its [`Function`]s; unloads on `Drop`.
struct Loaded {
    device: Device,
    raw: cuda::CUmodule,
}

// SAFETY: a CUmodule may be used from any thread; each use binds the device first.
unsafe impl Send for Loaded {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Loaded {}

impl Module {
    /// Compiles `source` for `device`'s architecture (cached: [`compile_cached`]) and loads it.
    pub fn build(device: &Device, source: &Source) -> Result<Module> {
        let mut modules = Self::build_all(device, std::slice::from_ref(source))?;
        modules
            .pop()
            .ok_or_else(|| compile_error(source, &arch_for(device), "no module"))
    }

    /// Compiles `sources` for `device`'s architecture (cached: [`compile_cached_all`]; the ones
    /// missing from the cache in parallel) and loads one module each, in their order.
    ///
    /// A cubin the driver refuses as an invalid image (a damaged cache file that still looks
    /// whole) is compiled again, replaced in the cache and loaded once more, with a warning; a
    /// fresh cubin's refusal is an error.
    pub fn build_all(device: &Device, sources: &[Source]) -> Result<Vec<Module>> {
        let arch = arch_for(device);
        let cubins = compile_cached_all(sources, &arch)?;
        let mut modules = Vec::with_capacity(sources.len());
        for (source, cubin) in sources.iter().zip(&cubins) {
            let module = match Self::load(device, cubin) {
                // A damaged image (a fresh compile's would not be): compiled again, past the
                // memo and the disk, which the new cubin then replaces in both.
                Err(Error::Cuda { source: e, .. })
                    if e.is_driver(cuda::cudaError_enum::CUDA_ERROR_INVALID_IMAGE) =>
                {
                    tracing::warn!(device = device.ordinal(), kernel = %source.label(), %arch, "the driver refused a cached cubin ({e}): compiling it again and replacing it in the cache");
                    let fresh = cubins_warned(
                        std::slice::from_ref(source),
                        &arch,
                        Reuse::Nothing,
                        Some(COMPILE_LIMIT),
                    )?;
                    let cubin = only(fresh, source, &arch)?;
                    Self::load(device, &cubin)?
                }
                loaded => loaded?,
            };
            modules.push(module);
        }
        Ok(modules)
    }

    /// Loads a cubin (or NUL-terminated PTX) into `device`'s context. Anything else is refused
    /// before the driver sees it (it takes no length, so it could read past the slice); see
    /// [`check_image`] for what is checked.
    pub fn load(device: &Device, cubin: &[u8]) -> Result<Module> {
        check_image(cubin)?;
        device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a context is current; `cubin` is a whole ELF image or ends with a NUL inside
        // the slice (check_image), and outlives the call.
        unsafe { cu!(cuModuleLoadData(&mut raw, cubin.as_ptr().cast())) }
            .map_err(|e| on(device, e))?;
        Ok(Module {
            inner: Arc::new(Loaded {
                device: device.clone(),
                raw,
            }),
        })
    }

    /// Looks up a kernel by name, for [`launch`](Self::launch).
    pub fn function(&self, name: &str) -> Result<Function> {
        let Loaded { device, raw } = &*self.inner;
        device.bind_to_thread()?;
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: the module is loaded; `cname` is NUL-terminated.
        unsafe { cu!(cuModuleGetFunction(&mut f, *raw, cname.as_ptr())) }
            .map_err(|e| on(device, e))?;
        Ok(Function {
            raw: f,
            module: self.inner.clone(),
        })
    }

    /// Queues `function` (one of this module's) on `stream` (which must be on this module's
    /// device).
    ///
    /// # Safety
    /// As for [`launch_sync`](Self::launch_sync); in addition every buffer the kernel touches
    /// must stay allocated until the stream has run it.
    pub unsafe fn launch(
        &self,
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(function, stream)?;
        // SAFETY: the caller guarantees `params`; the function belongs to this loaded module.
        unsafe { self.raw_launch(function.raw, grid, block, params, stream.cu_stream()) }
    }

    /// `cuLaunchKernel` of one of this module's functions on `stream` (null: the legacy default
    /// stream), with this module's device current.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); `f` must belong to this module.
    unsafe fn raw_launch(
        &self,
        f: cuda::CUfunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: cuda::CUstream,
    ) -> Result<()> {
        self.inner.device.bind_to_thread()?;
        // SAFETY: the caller guarantees `params` and `f`; dimensions are plain numbers.
        unsafe {
            cu!(cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| on(&self.inner.device, e))
    }

    /// As [`launch`](Self::launch), with programmatic dependent launch on GPUs of compute
    /// capability 9.0 and newer: the kernel may be scheduled while the previous kernel on the
    /// stream is still running, hiding the launch gap between the two. Elsewhere a plain launch.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); in addition the kernel must execute
    /// `griddepcontrol.wait` before it touches memory that earlier work on the stream writes
    /// (that instruction waits for the previous kernel to finish and its writes to land).
    pub unsafe fn launch_overlapped(
        &self,
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        if self.inner.device.compute_capability().0 < 9 {
            // SAFETY: the caller's guarantees are those of `launch`.
            return unsafe { self.launch(function, grid, block, params, stream) };
        }
        self.check_stream(function, stream)?;
        self.inner.device.bind_to_thread()?;
        // SAFETY: an all-zero attribute is a valid "no attribute"; we set the id and value.
        let mut attr: cuda::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = cuda::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = cuda::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `config` and `attr` outlive the call; the caller guarantees `params` and the
        // kernel's wait; the function belongs to this loaded module.
        unsafe {
            cu!(cuLaunchKernelEx(
                &config,
                function.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| on(&self.inner.device, e))
    }

    fn check_stream(&self, function: &Function, stream: &Stream) -> Result<()> {
        if !Arc::ptr_eq(&function.module, &self.inner) {
            return Err(Error::InvalidArgument(
                "a kernel launched through a module it does not belong to".into(),
            ));
        }
        if stream.device() != &self.inner.device {
            return Err(Error::InvalidArgument(format!(
                "a kernel of GPU {} launched on a stream of GPU {}",
                self.inner.device.ordinal(),
                stream.device().ordinal()
            )));
        }
        Ok(())
    }

    /// Launches `function` on the legacy default stream and waits for it.
    ///
    /// # Safety
    /// `params` must match the kernel's parameters in number, order and type, and every device
    /// pointer among them must be valid for what the kernel accesses.
    pub unsafe fn launch_sync(
        &self,
        function: &str,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(function)?.raw;
        // SAFETY: the caller guarantees `params`; `f` was just looked up in this module.
        unsafe { self.raw_launch(f, grid, block, params, std::ptr::null_mut()) }?;
        self.inner.device.synchronize_default_stream()
    }
}

fn on(device: &Device, source: p2p_sys::Error) -> Error {
    Error::Cuda {
        device: device.ordinal(),
        source,
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = self.device.bind_to_thread();
        // SAFETY: loaded by cuModuleLoadData and unloaded once.
        if let Err(e) = unsafe { cu!(cuModuleUnload(self.raw)) } {
            tracing::error!(device = self.device.ordinal(), "unloading a module: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn work_in_a_thread_is_waited_for_at_most_its_limit_and_finishes_after() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc::RecvTimeoutError;
        use std::sync::Arc;
        // Quick work: its answer.
        assert_eq!(
            in_thread_within("p2p-test", Duration::from_secs(10), || 7),
            Ok(7)
        );
        // Slow work (a compile that takes longer than its limit): given up at the limit, and
        // it still finishes afterwards, in its own thread (what fills the kernel cache later).
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let limit = Duration::from_millis(100);
        let t = Instant::now();
        let r = in_thread_within("p2p-test", limit, move || {
            std::thread::sleep(Duration::from_millis(600));
            flag.store(true, Ordering::SeqCst);
            1
        });
        let took = t.elapsed();
        assert_eq!(r, Err(RecvTimeoutError::Timeout));
        assert!(
            took >= limit && took < limit + Duration::from_millis(300),
            "{took:?}"
        );
        assert!(!finished.load(Ordering::SeqCst));
        let t = Instant::now();
        while !finished.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            finished.load(Ordering::SeqCst),
            "the work went on and ended"
        );
        // A panic is not mistaken for a late answer.
        let r: std::result::Result<(), _> =
            in_thread_within("p2p-test", Duration::from_secs(10), || {
                panic!("in the test")
            });
        assert_eq!(r, Err(RecvTimeoutError::Disconnected));
    }

    #[test]
    fn a_compile_past_its_limit_says_what_goes_on_and_what_to_do() {
        let e = Error::CompileTimeout {
            kernels: "coll.cu [COLL_PART=0]".into(),
            arch: "sm_100".into(),
            limit: COMPILE_LIMIT,
        };
        let text = e.to_string();
        for part in [
            "coll.cu [COLL_PART=0]",
            "sm_100",
            "600s",
            "fills the kernel cache",
            "P2P_KERNELS=shipped",
            "p2p-bench kernels",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }

    #[test]
    fn a_compile_lock_waits_for_its_holder_gives_up_at_its_limit_and_is_free_once_dropped() {
        let dir = std::env::temp_dir().join(format!("p2p-compile-lock-{}", std::process::id()));
        let first = compile_lock(&dir, 7, Duration::ZERO).expect("a free lock");
        // Held: another holder (its own open file, as another process has) waits, then gives up.
        let t = Instant::now();
        assert!(compile_lock(&dir, 7, Duration::from_millis(200)).is_none());
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // Another set of kernels has its own lock.
        assert!(compile_lock(&dir, 8, Duration::ZERO).is_some());
        // Released when the holder lets go, while a waiter waits.
        let waiter = std::thread::spawn({
            let dir = dir.clone();
            move || {
                let t = Instant::now();
                (
                    compile_lock(&dir, 7, Duration::from_secs(10)).map(|l| l.waited),
                    t.elapsed(),
                )
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(first);
        let (got, waited) = waiter.join().expect("the waiter");
        assert_eq!(
            got,
            Some(true),
            "the lock was handed over to one that waited"
        );
        assert!(
            waited >= Duration::from_millis(100) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_last_holder_removes_the_lock_file_but_never_a_newer_one() {
        let dir = std::env::temp_dir().join(format!("p2p-compile-gone-{}", std::process::id()));
        let path = dir.join(format!("{:016x}.lock", 11));
        let first = compile_lock(&dir, 11, Duration::ZERO).expect("a free lock");
        assert!(path.exists());
        // A waiter has opened the same file before the holder lets go (as compile_lock does
        // before it polls), and takes its lock after.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        drop(first);
        assert!(!path.exists(), "removed by the holder as it let go");
        rustix::fs::flock(
            &opened,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )
        .expect("the removed file's lock is free");
        let waiter = CompileLock {
            file: opened,
            waited: true,
            path: Some(path.clone()),
        };
        // A later process makes a new file and holds its lock beside the waiter (on the
        // removed one); the waiter, done, leaves the new file alone.
        let later = compile_lock(&dir, 11, Duration::ZERO).expect("a new lock file");
        drop(waiter);
        assert!(
            path.exists(),
            "the later holder's file stays while it holds it"
        );
        drop(later);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_waiter_learns_that_the_holder_it_waited_for_failed_and_a_later_process_compiles_anew() {
        let dir = std::env::temp_dir().join(format!("p2p-compile-fail-{}", std::process::id()));
        let holder = compile_lock(&dir, 9, Duration::ZERO).expect("a free lock");
        assert!(!holder.waited);
        holder.record(None);
        holder.record(Some("coll.cu: error: something \u{e9}"));
        // What the next holder sees of the record, had it waited or not (compile_lock's own
        // test shows that a holder that waited knows it).
        let next = |waited| {
            let file = std::fs::File::open(dir.join(format!("{:016x}.lock", 9))).expect("open");
            CompileLock {
                file,
                waited,
                path: None,
            }
            .failure()
        };
        assert_eq!(
            next(true).as_deref(),
            Some("coll.cu: error: something \u{e9}")
        );
        // One that did not wait takes the record for an earlier run's (and clears it as it
        // compiles).
        assert_eq!(next(false), None);
        holder.record(None);
        assert_eq!(
            next(true),
            None,
            "cleared: the holder it waited for succeeded"
        );
        drop(holder);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An ELF64 header whose one section header (64 bytes) lies at 64, and that table.
    fn tiny_elf() -> Vec<u8> {
        let mut c = vec![0u8; 128];
        c[..6].copy_from_slice(b"\x7fELF\x02\x01");
        c[0x28] = 64; // e_shoff
        c[0x3a] = 64; // e_shentsize
        c[0x3c] = 1; // e_shnum
        c
    }

    #[test]
    fn only_whole_cubins_and_terminated_ptx_reach_the_driver() {
        // tiny_elf's one section header is at 64..128, all zeros: a null section.
        let elf = tiny_elf();
        assert!(check_image(&elf).is_ok());
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut c = tiny_elf();
            f(&mut c);
            c
        };
        let set =
            |c: &mut Vec<u8>, at: usize, v: u64| c[at..at + 8].copy_from_slice(&v.to_le_bytes());
        // A section whose contents end past the image (offset 100, 64 bytes).
        let past = with(&|c| {
            set(c, 64 + 0x18, 100);
            set(c, 64 + 0x20, 64);
        });
        assert!(check_image(&past).is_err());
        // The same as SHT_NOBITS (no bytes in the file): fine.
        let nobits = with(&|c| {
            set(c, 64 + 0x18, 100);
            set(c, 64 + 0x20, 64);
            c[64 + 4] = 8;
        });
        assert!(check_image(&nobits).is_ok());
        // Offsets that overflow, a program header table past the end, a short entry size.
        let wraps = with(&|c| {
            set(c, 64 + 0x18, u64::MAX);
            set(c, 64 + 0x20, 2);
        });
        assert!(check_image(&wraps).is_err());
        let segments = with(&|c| {
            set(c, 0x20, 120);
            c[0x36] = 0x38;
            c[0x38] = 1;
        });
        assert!(check_image(&segments).is_err());
        let short = with(&|c| c[0x3a] = 16);
        assert!(check_image(&short).is_err());
        assert!(check_image(&elf[..100]).is_err());
        // PTX is text the driver reads to its NUL.
        assert!(check_image(b".version 8.0\n.target sm_90\n\0").is_ok());
        let e = check_image(b".version 8.0").expect_err("no NUL");
        assert!(e.to_string().contains("NUL-terminated PTX"), "{e}");
        assert!(check_image(b"").is_err());
        // A fatbin (its magic is not text), binary data with a NUL somewhere, an empty string.
        assert!(check_image(&[0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0]).is_err());
        assert!(check_image(b"abc\xff\0").is_err());
        assert!(check_image(b"\0").is_err());
        // A section-name table index past the sections.
        let names = with(&|c| c[0x3e] = 1);
        assert!(check_image(&names).is_err());
    }

    #[test]
    fn a_cache_file_that_is_not_a_whole_cubin_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("p2p-cubin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let source = Source {
            name: "k.cu",
            code: "",
            defines: &[],
            shipped: &[],
        };
        let elf = tiny_elf();
        let cases: [(&str, &[u8], bool); 4] = [
            ("whole.cubin", &elf, true),
            ("cut.cubin", &elf[..100], false),
            ("empty.cubin", b"", false),
            ("junk.cubin", b"half a write", false),
        ];
        for (name, bytes, hit) in cases {
            let f = dir.join(name);
            std::fs::write(&f, bytes).expect("written");
            assert_eq!(
                read_cubin(Some(&f), &source, "sm_90").is_some(),
                hit,
                "{name}"
            );
        }
        assert!(read_cubin(Some(&dir.join("none.cubin")), &source, "sm_90").is_none());
        assert!(read_cubin(None, &source, "sm_90").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cache_write_lands_whole_under_its_name_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("p2p-store-{}", std::process::id()));
        let file = dir.join("k.cu-sm_90-0123.cubin");
        store(&dir, &file, &tiny_elf()).expect("stored");
        assert!(whole_elf(&std::fs::read(&file).expect("read back")));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("the folder")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A folder that cannot be made: an error, and nothing left behind.
        let blocked = dir.join("k.cu-sm_90-0123.cubin").join("sub");
        assert!(store(&blocked, &blocked.join("x.cubin"), &tiny_elf()).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_key_changes_with_every_part_of_a_compile() {
        let base = Source {
            name: "k.cu",
            code: "a",
            defines: &["X=1"],
            shipped: &[],
        };
        let nvrtc = |version, build_id: Option<&str>| Compiler {
            version,
            file: None,
            build_id: build_id.map(String::from),
        };
        let c13 = nvrtc((13, 0), Some("65be0db3"));
        let key = |s: &Source, arch: &str| cache_key(s, arch, &c13);
        let k = key(&base, "sm_90");
        assert_eq!(k, key(&base, "sm_90"));
        assert_ne!(k, key(&Source { code: "b", ..base }, "sm_90"));
        let x2 = Source {
            defines: &["X=2"],
            ..base
        };
        assert_ne!(k, key(&x2, "sm_90"));
        let plain = Source {
            defines: &[],
            ..base
        };
        assert_ne!(k, key(&plain, "sm_90"));
        assert_ne!(k, key(&base, "sm_80"));
        for other in [
            nvrtc((13, 1), Some("65be0db3")),
            nvrtc((12, 0), Some("65be0db3")),
            // A patch release: the same major.minor, another library.
            nvrtc((13, 0), Some("0e1f0a2b")),
            nvrtc((13, 0), None),
        ] {
            assert_ne!(k, cache_key(&base, "sm_90", &other), "{other}");
        }
    }
}
