//! A gate in front of timed work on every rank's stream: graph timing queues the gate, the
//! start events, every rank's graph launch and the stop events, then opens the gate, so that
//! the figure holds the GPUs' time and none of the host's cost of launching the graphs.
//!
//! Without it the start event of a rank that the host reaches last is recorded on an idle
//! stream, its timestamp taken at once, while its graph is still being launched behind the
//! other ranks'; a collective waits for its slowest rank, so every rank's figure then held the
//! host's launch cost of all the graphs (docs/performance.md, "How we measure").

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use p2p_mem::kernel::{Function, LaunchConfig, Module};
use p2p_mem::{Device, PinnedHostBuffer, Stream};

use crate::kernels::{self, abi};

/// How long a gate may hold its stream before it opens by itself (and says so).
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// One rank's loaded gate kernel.
struct Loaded {
    module: Module,
    function: Function<abi::GateArgs>,
}

/// The gate kernel on every rank's GPU, and the two flags it shares: `open` (the host sets it)
/// and `timed_out` (a gate that gave up sets it).
pub struct Gate {
    loaded: Vec<Loaded>,
    /// `[open, timed_out]`, pinned host memory every GPU reads through unified addressing.
    flags: PinnedHostBuffer<i32>,
}

impl Gate {
    /// Compiles (cached) and loads the gate on every device in `devices`.
    pub fn load(devices: &[Device]) -> p2p_mem::Result<Gate> {
        let first = devices.first().ok_or_else(|| {
            p2p_mem::Error::InvalidArgument("a gate needs at least one device".into())
        })?;
        let loaded = devices
            .iter()
            .map(|d| {
                let module = Module::build(d, &kernels::GATE)?;
                let function = module.function("p2p_gate")?;
                Ok(Loaded { module, function })
            })
            .collect::<p2p_mem::Result<_>>()?;
        Ok(Gate {
            loaded,
            flags: PinnedHostBuffer::new(first, 2)?,
        })
    }

    fn flag(&self, i: usize) -> &AtomicI32 {
        // SAFETY: the pinned buffer holds two aligned i32 and lives as long as `self`; the
        // kernels read and write them with volatile accesses, the host only atomically, through
        // a pointer no shared reference to the elements was made from.
        unsafe { AtomicI32::from_ptr(self.flags.as_raw_ptr().add(i)) }
    }

    /// Closes the gate and queues it on `streams[r]` (rank r's stream, on the GPU the gate
    /// was loaded for as rank r): the work queued behind it waits until [`open`](Self::open).
    pub fn close(&self, streams: &[&Stream]) -> Result<(), String> {
        if streams.len() != self.loaded.len() {
            return Err(format!(
                "a gate for {} ranks was given {} streams",
                self.loaded.len(),
                streams.len()
            ));
        }
        self.flag(0).store(0, Ordering::SeqCst);
        self.flag(1).store(0, Ordering::SeqCst);
        let base = self.flags.as_raw_ptr() as u64;
        for (l, s) in self.loaded.iter().zip(streams) {
            let args = abi::GateArgs {
                open: base,
                timed_out: base + 4,
                timeout_ns: TIMEOUT.as_nanos() as u64,
            };
            // SAFETY: p2p_gate takes one GateArgs (the layout generated from bench_abi.h); both
            // flags are pinned host memory that every GPU addresses through unified addressing,
            // and live as long as this gate, which the caller keeps until the streams ran it.
            unsafe {
                l.module
                    .launch(&l.function, LaunchConfig::new(1, 32), &args, s)
            }
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Opens the gate: the work queued behind it on every stream starts.
    pub fn open(&self) {
        self.flag(0).store(1, Ordering::SeqCst);
    }

    /// An error if a gate gave up waiting (the timed work then started before the host had
    /// queued all of it, and its figure is not to be trusted).
    pub fn check(&self) -> Result<(), String> {
        if self.flag(1).load(Ordering::SeqCst) != 0 {
            return Err(format!(
                "the timing gate opened by itself after {} s: the host took that long to queue one sample",
                TIMEOUT.as_secs()
            ));
        }
        Ok(())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // A gate still queued must not wait for its whole time limit on a flag that is about
        // to be freed: open it, and give the streams' owners the chance to drain first.
        self.open();
    }
}
