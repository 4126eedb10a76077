//! Helpers shared by the integration tests of every p2p crate (a dev-dependency only): GPU
//! gating that fails rather than passes vacuously, deterministic random data with a seed that
//! changes per run, and running one role of a test in a second process (the test executable
//! re-runs itself with `P2PTEST_ROLE` set).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
use p2p_mem::{Device, DeviceCopy, DeviceMemory, Stream};

/// The first `n` devices, or a panic that says how many the test needs: a GPU test that finds
/// no GPU must fail, never pass vacuously.
pub fn gpus(n: usize) -> Vec<Device> {
    let mut all = all_gpus(n);
    all.truncate(n);
    all
}

/// Every visible device, at least `n` of them (or the same panic as [`gpus`]).
pub fn all_gpus(n: usize) -> Vec<Device> {
    let all = Device::all().unwrap_or_else(|e| panic!("this test needs {n} GPU(s): {e}"));
    assert!(
        all.len() >= n,
        "this test needs {n} GPU(s), found {}",
        all.len()
    );
    all
}

/// Asserts that `text` contains `words`, showing `text` when it does not.
#[track_caller]
pub fn assert_contains(text: &str, words: &str) {
    assert!(text.contains(words), "{text}");
}

/// Whether every element of `buf`, read back as `T`s, is `value`.
pub fn holds_only<T: DeviceCopy + Default + PartialEq>(buf: &impl DeviceMemory, value: T) -> bool {
    buf.to_host_vec::<T>()
        .expect("read")
        .iter()
        .all(|&v| v == value)
}

/// A reproducible stream of pseudo-random numbers (xorshift64*), different for every seed: for
/// test data and for fuzz and mutation tests, which must fail the same way when run again.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
    /// For mutation tests: `good` after 1-3 random changes (a flipped bit, a cut, an inserted
    /// byte, a replaced byte), or, one time in eight, up to 300 random bytes.
    pub fn mutated(&mut self, good: &[u8]) -> Vec<u8> {
        if self.below(8) == 0 {
            return (0..self.below(300)).map(|_| self.byte()).collect();
        }
        let mut m = good.to_vec();
        for _ in 0..=self.below(3) {
            if m.is_empty() {
                break;
            }
            let at = self.below(m.len());
            match self.below(4) {
                0 => m[at] ^= 1 << self.below(8),
                1 => m.truncate(at),
                2 => m.insert(at, self.byte()),
                _ => m[at] = self.byte(),
            }
        }
        m
    }
}

/// Deterministic pseudo-random data (xorshift64*), different for every seed.
pub fn random_u32(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() >> 32) as u32).collect()
}

/// Random bytes, from [`random_u32`].
pub fn random_u8(seed: u64, n: usize) -> Vec<u8> {
    random_u32(seed, n).into_iter().map(|v| v as u8).collect()
}

/// A seed that differs between runs, so every run checks fresh data (printed for replay).
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let seed = t ^ (std::process::id() as u64) << 32;
    eprintln!("seed = {seed}");
    seed
}

/// The role this process plays, when it is a child started by [`spawn_role`].
pub fn role() -> Option<String> {
    std::env::var("P2PTEST_ROLE").ok()
}

/// An environment variable a child was given.
pub fn child_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child started without {name}"))
}

/// Runs test `test_name` of this executable in a new process with `role` and `env` set, and
/// `P2PTEST_SOCKET` naming the parent's socket.
pub fn spawn_role(test_name: &str, role: &str, socket: &Path, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        test_name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("P2PTEST_ROLE", role)
    .env("P2PTEST_SOCKET", socket)
    // The child's own `test result` line must not mix into the parent's summary;
    // its panics and diagnostics go to stderr, which stays visible.
    .stdout(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawning the child process")
}

/// Runs test `test_name` of this executable in a new process as [`spawn_role`] does, listening
/// for it in `dir`, and accepts its connection within `limit`: the listener (to keep while the
/// child runs), the child, and the channel to it.
pub fn spawn_connected(
    test_name: &str,
    role: &str,
    dir: &PrivateDir,
    env: &[(&str, String)],
    limit: Duration,
) -> (FdListener, Child, FdChannel) {
    let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
    let child = spawn_role(test_name, role, listener.path(), env);
    let chan = listener.accept(limit).expect("accept");
    (listener, child, chan)
}

/// In a child started by [`spawn_connected`]: its channel to the parent.
pub fn parent_channel() -> FdChannel {
    FdChannel::connect(&PathBuf::from(child_env("P2PTEST_SOCKET"))).expect("connect")
}

/// The seed a child was given (`P2PTEST_SEED`).
pub fn child_seed() -> u64 {
    child_env("P2PTEST_SEED").parse().expect("seed")
}

/// The GPU a child was given (`P2PTEST_GPU`).
pub fn child_gpu() -> Device {
    Device::new(child_env("P2PTEST_GPU").parse().expect("gpu")).expect("device")
}

/// Waits for a child, killing it after `limit`; panics unless it exited successfully.
pub fn join(mut child: Child, limit: Duration) {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("waiting for the child") {
            Some(status) => {
                assert!(status.success(), "the child process failed: {status}");
                return;
            }
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child process did not finish within {limit:?}");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A kernel held on a stream until its flag is set ([`Held::release`], or the drop), with a
/// time limit of its own (60 s) so that a failed test never leaves the GPU busy for good: for
/// the tests of waits with a deadline. Compiled by NVRTC at first use, and loaded once per GPU
/// for the process: a module loaded while a held kernel runs can wait for that kernel to end
/// (the driver's module loads wait for the GPU's running work), which would stall a second
/// hold on a GPU that ranks share.
pub struct Held {
    flag: p2p_mem::abort::AbortHandle,
}

/// The hold kernel's module on each GPU that held one, by ordinal; loaded once and kept for
/// the process (a test helper: one small module per GPU).
fn hold_module(d: &Device) -> &'static p2p_mem::kernel::Module {
    use p2p_mem::kernel::{Module, Source};
    use std::sync::Mutex;
    const HOLD: Source = Source {
        name: "hold.cu",
        code: r#"extern "C" __global__ void hold(volatile int* flag, unsigned long long max_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        if (*flag) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < max_ns);
}
"#,
        defines: &[],
        shipped: &[],
    };
    static LOADED: Mutex<Vec<(i32, &'static Module)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, m)) = loaded.iter().find(|(o, _)| *o == d.ordinal()) {
        return m;
    }
    let m: &'static Module = Box::leak(Box::new(Module::build(d, &HOLD).expect("the hold kernel")));
    loaded.push((d.ordinal(), m));
    m
}

impl Held {
    /// Launches the held kernel on `stream`; panics (a test helper) if it cannot.
    pub fn on(stream: &Stream) -> Held {
        use p2p_mem::kernel::LaunchConfig;
        let d = stream.device();
        let module = hold_module(d);
        let f = module.function::<(u64, u64)>("hold").expect("hold");
        let flag = p2p_mem::abort::AbortHandle::new(d).expect("a flag in pinned memory");
        let max_ns: u64 = 60_000_000_000;
        // SAFETY: hold(volatile int*, unsigned long long): the device address of the pinned
        // flag, which `Held` keeps alive (the tests release the kernel and wait for it before
        // dropping it), and a u64 by value.
        unsafe {
            module.launch(
                &f,
                LaunchConfig::new(1, 1),
                &(flag.device_ptr(), max_ns),
                stream,
            )
        }
        .expect("launch");
        Held { flag }
    }

    /// A new stream of `d` and the held kernel on it.
    pub fn on_new_stream(d: &Device) -> (Stream, Held) {
        let stream = Stream::new(d).expect("stream");
        let held = Held::on(&stream);
        (stream, held)
    }

    /// Lets the kernel end.
    pub fn release(&self) {
        self.flag.abort();
    }

    /// Lets the kernel end and waits for `stream`, the one it was held on, to drain: within 10 s,
    /// or a panic.
    #[track_caller]
    pub fn release_and_wait(&self, stream: &Stream) {
        self.release();
        assert!(stream
            .synchronize_within(Duration::from_secs(10))
            .expect("the held kernel ended"));
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Fails (naming the stale ones and the command that rebuilds them) unless the shipped cubins
/// of `sources` are those of their current text: every crate's unit test of its kernel archive.
pub fn assert_shipped_current(sources: &[p2p_mem::kernel::Source]) {
    let t = Instant::now();
    let wrong = p2p_mem::kernel::shipped::check(sources);
    assert!(
        wrong.is_empty(),
        "run `cargo xtask kernels` (the kernels changed since their cubins were shipped): {wrong:?}"
    );
    eprintln!(
        "checked the shipped cubins of {} sources in {:?}",
        sources.len(),
        t.elapsed()
    );
}

/// Feeds `target` inputs for a fixed time: mutations of `seeds` (and of earlier inputs), some
/// random bytes, for `P2PTEST_FUZZ_MS` milliseconds (default 1000), from the seed
/// `P2PTEST_SEED` or a fresh one (printed, to replay a failure). An input that makes `target`
/// panic is printed in hex before the panic goes on. Returns how many inputs ran. The stable,
/// time-boxed side of the `fuzz/` targets, which take the same entry points.
pub fn fuzz(name: &str, seeds: &[Vec<u8>], target: impl Fn(&[u8])) -> usize {
    let ms = std::env::var("P2PTEST_FUZZ_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1000);
    let seed = std::env::var("P2PTEST_SEED")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(fresh_seed);
    let mut rng = Rng::new(seed);
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut last: Vec<u8> = seeds.first().cloned().unwrap_or_default();
    let mut runs = 0usize;
    for s in seeds {
        target(s);
    }
    while Instant::now() < deadline {
        let base = if seeds.is_empty() || rng.below(4) == 0 {
            last.clone()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        let input = rng.mutated(&base);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
        if let Err(panic) = outcome {
            eprintln!(
                "fuzz {name}: seed {seed}, input {} bytes: {input:02x?}",
                input.len()
            );
            std::panic::resume_unwind(panic);
        }
        last = input;
        runs += 1;
    }
    eprintln!("fuzz {name}: {runs} inputs in {ms} ms, seed {seed}");
    runs
}

/// One test per fuzz entry point of a crate's `fuzzing` module, each running [`fuzz`] from the
/// module's `seeds()` and asking for more than a thousand inputs in its time:
/// `fuzz_tests!(p2p_mem; handles, messages);` makes the tests `handles` and `messages` of
/// `p2p_mem::fuzzing`.
#[macro_export]
macro_rules! fuzz_tests {
    ($krate:ident; $($name:ident),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                let runs = $crate::fuzz(
                    stringify!($name),
                    &$krate::fuzzing::seeds(),
                    $krate::fuzzing::$name,
                );
                assert!(runs > 1000, "{} inputs only", runs);
            }
        )+
    };
}

/// Whether process `pid` is running: it exists and is not a zombie (ended, not yet reaped).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}
