//! The one compile path: the shipped cubins first, then an in-process memo and an on-disk
//! cache (keyed by the source, its macros, the target and the NVRTC release, guarded by lock
//! files), compiling what is missing in threads waited for at most [`COMPILE_LIMIT`].

use crate::error::{Error, Result};

use super::*;

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
pub(super) fn cubins_warned(
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
pub(super) fn cache_entry(
    dir: Option<&std::path::Path>,
    source: &Source,
    arch: &str,
    compiler: &Compiler,
) -> (u64, Option<std::path::PathBuf>) {
    let key = cache_key(source, arch, compiler);
    (key, dir.map(|d| d.join(cache_name(source, arch, key))))
}

/// What [`cached_compile`] did.
pub(super) struct Compiled {
    /// In the order of the sources.
    pub(super) cubins: Vec<Vec<u8>>,
    /// How many it compiled (the others came from the memo or the disk).
    pub(super) compiled: usize,
    /// Why a compiled cubin could not be written to the cache, one line each.
    pub(super) unstored: Vec<String>,
}

/// The cubins this process compiled or read, by cache key.
pub(super) type Memo = std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>;
pub(super) static MEMO: std::sync::OnceLock<Memo> = std::sync::OnceLock::new();

pub(super) fn memo_get(key: u64) -> Option<Vec<u8>> {
    MEMO.get()?.lock().ok()?.get(&key).cloned()
}

/// Which cubins [`cached_compile`] may take instead of compiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reuse {
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
pub(super) fn cached_compile(
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
            compile_lock(d, digest64(&set), COMPILE_WAIT)
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
pub(super) struct CompileJob {
    pub(super) todo: Vec<Source>,
    pub(super) arch: String,
    pub(super) dir: Option<std::path::PathBuf>,
    /// Each source's cache key and file.
    pub(super) entries: Vec<(u64, Option<std::path::PathBuf>)>,
    pub(super) lock: Option<CompileLock>,
}

impl CompileJob {
    /// Runs the job, waiting for it at most `limit` (`None`: for as long as it takes). The
    /// compile runs in a thread of its own (`p2p-compile`); past the limit the call returns
    /// [`Error::CompileTimeout`] and leaves that thread to finish: a compile is work on the
    /// CPU and ends, and what it makes then lands in the cache and the memo for the next call.
    /// Returns the cubins, in the order of the sources, and why any could not be written to
    /// the cache.
    pub(super) fn run_within(
        self,
        limit: Option<std::time::Duration>,
    ) -> Result<(Vec<Vec<u8>>, Vec<String>)> {
        let Some(limit) = limit else {
            return self.run();
        };
        let names: Vec<String> = self.todo.iter().map(Source::label).collect();
        let arch = self.arch.clone();
        match crate::in_thread_within("p2p-compile", limit, move || self.run()) {
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
    pub(super) fn run(self) -> Result<(Vec<Vec<u8>>, Vec<String>)> {
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

/// Writes a cubin into the cache: to a file of this write's own, then renamed into place, so
/// that a reader never sees part of one.
pub(super) fn store(
    dir: &std::path::Path,
    file: &std::path::Path,
    cubin: &[u8],
) -> std::io::Result<()> {
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

/// Changed by hand whenever a cached cubin could differ for another reason than the key's
/// other parts (the code, the target, the NVRTC release, the options and the macros).
pub(super) const CACHE_FORMAT: &str = "p2p-kernel-cache-3";

/// The cache key of a compile: a hash of the code, the target, the compiler (NVRTC's version
/// and its library's build ID), the options and the macros.
pub(super) fn cache_key(source: &Source, arch: &str, compiler: &Compiler) -> u64 {
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
    digest64(&parts)
}

pub(super) fn cache_name(source: &Source, arch: &str, key: u64) -> String {
    format!("{}-{arch}-{key:016x}.cubin", source.name)
}

/// How long a process waits for another one compiling the same kernels before it compiles
/// them itself: far longer than a compile takes (10 s on 16 cores, 20-27 s on 2).
pub(super) const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// A cached cubin, if `file` holds a whole one.
pub(super) fn read_cubin(
    file: Option<&std::path::Path>,
    source: &Source,
    arch: &str,
) -> Option<Vec<u8>> {
    let c = std::fs::read(file?).ok().filter(|c| whole_elf(c))?;
    tracing::debug!(kernel = %source.label(), %arch, "kernel cache hit");
    Some(c)
}

/// Whether `c` is a whole 64-bit little-endian ELF image, as cubins are: its section header
/// table, which NVRTC writes last, ends inside it (a file cut short is not one), and so does
/// every section with contents and every segment it names (a damaged one could send the
/// driver's loader past the end).
pub(super) fn whole_elf(c: &[u8]) -> bool {
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
pub(super) struct CompileLock {
    pub(super) file: std::fs::File,
    /// Another holder had it first, and this process waited for it.
    pub(super) waited: bool,
    /// Where `file` was opened (`None`: leave the file where it is).
    pub(super) path: Option<std::path::PathBuf>,
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
    pub(super) fn failure(&self) -> Option<String> {
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
    pub(super) fn record(&self, failure: Option<&str>) {
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
pub(super) fn compile_lock(
    dir: &std::path::Path,
    set: u64,
    wait: std::time::Duration,
) -> Option<CompileLock> {
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

/// A 64-bit key of `parts`: the first 8 bytes of SHA-256 over each part with its length
/// before it (so that no two lists of parts share a key by where their bytes split).
pub(super) fn digest64(parts: &[&[u8]]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_le_bytes(first)
}
