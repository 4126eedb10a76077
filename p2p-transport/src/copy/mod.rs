//! Moving bytes between GPUs of one process: the data paths.
//!
//! [`Transport`] holds what the paths need per process: per device its kernels and a bridge
//! stream, the peer access it has enabled, the staging pipelines (`staged.rs`) and the routes
//! of [`Transport::copy_peer`] (`routes.rs`), each made at its first use. [`Transport::copy`] queues one
//! copy on a stream by a chosen [`Path`]; [`Transport::copy_route`] runs the path a
//! [`Route`] from mode selection calls for. Every path is stream-ordered and asynchronous: it
//! starts after the work already queued on `stream` and the stream's later work waits for it.
//!
//! | path | what moves the bytes | which stream |
//! | --- | --- | --- |
//! | [`Path::CopyEngine`] | `cuMemcpyPeerAsync`, in chunks | any |
//! | [`Path::SmWrite`] | a kernel on the source GPU storing into the destination | the source GPU's |
//! | [`Path::SmRead`] | a kernel on the destination GPU loading from the source | the destination GPU's |
//! | [`Path::HostStaged`] | device-to-host and host-to-device copies through pinned double buffers, overlapped on two streams | any |
//! | [`Path::Relay`] | two copy-engine legs through buffers on a third GPU, overlapped | any |
//!
//! As with every asynchronous CUDA call, `src` and `dst` must stay allocated until the stream
//! has run the copy.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use p2p_mem::{Device, DeviceMemory, DeviceMemoryMut, Event, Stream};
use p2p_sys::cu;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernels::{self, abi, SrKernels};
use crate::mode::{Direction, Engine, Mode, Route};
use p2p_mem::kernel::{Function, LaunchConfig, Module};

mod routes;
mod staged;

use routes::Routes;
use staged::Pipelines;

/// How one copy moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The copy engines.
    CopyEngine,
    /// SM stores from the source GPU into the destination's memory.
    SmWrite,
    /// SM loads on the destination GPU from the source's memory.
    SmRead,
    /// Through pinned host memory.
    HostStaged,
    /// Through a third GPU (by ordinal), with the copy engines.
    Relay {
        /// The relaying GPU.
        via: i32,
    },
}

/// Copy-engine calls are split into chunks of this size, so a very long copy does not hold a
/// copy engine against other streams for its whole length. Each chunk costs a little: 64 MiB
/// chunks lost 1.5% at 256 MiB against one call (docs/perf-notes.md), so chunks are large.
pub const CE_CHUNK: usize = 1 << 30;
/// Chunk size of the staged pipelines (host and relay).
pub const STAGE_CHUNK: usize = 4 << 20;
/// Staging buffers per pipeline: four chunks in flight.
pub const STAGE_SLOTS: usize = 4;
/// Threads per block of the SM copy kernel.
pub const SM_THREADS: u32 = 512;
/// Blocks per SM of the SM copy kernel (the grid is capped by the data size).
pub const SM_BLOCKS_PER_SM: u32 = 2;

struct CopyKernel {
    module: Module,
    copy: Function<abi::CopyArgs>,
}

/// A resource made at its first use and kept, or the error its first attempt met (kept whole
/// and reported by every later use as [`Error::Earlier`]).
struct Lazy<T> {
    what: &'static str,
    cell: OnceLock<std::result::Result<T, Arc<Error>>>,
}

impl<T> Lazy<T> {
    const fn new(what: &'static str) -> Lazy<T> {
        Lazy {
            what,
            cell: OnceLock::new(),
        }
    }

    /// The resource, made by `make` if this is its first use.
    fn get(&self, make: impl FnOnce() -> Result<T>) -> Result<&T> {
        self.cell
            .get_or_init(|| make().map_err(Arc::new))
            .as_ref()
            .map_err(|e| Error::Earlier {
                what: self.what,
                source: e.clone(),
            })
    }
}

/// What the transport keeps for one of its GPUs, each made at its first use.
struct PerDevice {
    device: Device,
    /// The SM copy kernel.
    copy: Lazy<CopyKernel>,
    /// The send/recv kernels of the connections.
    sendrecv: Lazy<Arc<SrKernels>>,
    /// The stream a copy that must run on this GPU is bridged to from another GPU's stream.
    bridge: Lazy<Stream>,
}

impl PerDevice {
    fn new(device: Device) -> PerDevice {
        PerDevice {
            device,
            copy: Lazy::new("the SM copy kernel"),
            sendrecv: Lazy::new("the send/recv kernels"),
            bridge: Lazy::new("a bridge stream"),
        }
    }
}

/// The pairs of GPUs between which this process has enabled peer access.
#[derive(Default)]
struct PeerAccess {
    enabled: Mutex<HashSet<(i32, i32)>>,
}

impl PeerAccess {
    /// Enables `device` to access `peer`'s memory, once per pair.
    fn ensure(&self, device: &Device, peer: &Device) -> Result<()> {
        let key = (device.ordinal(), peer.ordinal());
        let mut enabled = self.enabled.lock().unwrap_or_else(|p| p.into_inner());
        if device != peer && !enabled.contains(&key) {
            device.enable_peer_access(peer)?;
            enabled.insert(key);
        }
        Ok(())
    }

    /// Enables peer access in both directions between `a` and `b`.
    fn ensure_both(&self, a: &Device, b: &Device) -> Result<()> {
        self.ensure(a, b)?;
        self.ensure(b, a)
    }
}

/// What one process needs to move data between its GPUs. Cheap to share across threads.
///
/// It is made of four parts, each filled as copies first need it: per GPU, the kernels and the
/// bridge stream; the peer access enabled so far; the staging pipelines
/// (`staged.rs`); and the routes of [`copy_peer`](Self::copy_peer) (`routes.rs`: topology,
/// configuration, one choice per pair).
pub struct Transport {
    devices: Vec<PerDevice>,
    peers: PeerAccess,
    pipelines: Pipelines,
    routes: Routes,
    sm_grid: Mutex<SmGrid>,
}

/// The launch shape of the SM copy kernel: blocks per SM (capped by the data) and threads per
/// block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmGrid {
    /// Blocks per streaming multiprocessor.
    pub blocks_per_sm: u32,
    /// Threads per block (a multiple of 32, at most 1024).
    pub threads: u32,
}

impl SmGrid {
    /// The default shape.
    pub const DEFAULT: SmGrid = SmGrid {
        blocks_per_sm: SM_BLOCKS_PER_SM,
        threads: SM_THREADS,
    };
}

impl Transport {
    /// A transport over `devices` (usually [`Device::all`]); kernels compile on first use.
    pub fn new(devices: Vec<Device>) -> Transport {
        Transport {
            devices: devices.into_iter().map(PerDevice::new).collect(),
            peers: PeerAccess::default(),
            pipelines: Pipelines::default(),
            routes: Routes::new(),
            sm_grid: Mutex::new(SmGrid::DEFAULT),
        }
    }

    /// Uses `config` for [`copy_peer`](Self::copy_peer)'s mode selection instead of the
    /// `P2P_*` environment.
    pub fn set_config(&self, config: Config) {
        self.routes.set_config(config);
    }

    /// Copies all of `src` into `dst` (on any GPUs of this process) the way mode selection
    /// decides for the pair (topology discovered once; configuration from the `P2P_*`
    /// variables or [`set_config`](Self::set_config)), queued on `stream`. Returns the route.
    ///
    /// The path may have to run on the other GPU (an SM read runs on the destination): the copy
    /// is then bridged to that GPU's stream with events, still ordered after `stream`'s earlier
    /// work and before its later work.
    ///
    /// ```no_run
    /// use p2p_mem::{Device, DeviceBuffer, Stream};
    /// use p2p_transport::copy::Transport;
    /// let t = Transport::new(Device::all()?);
    /// let (g0, g1) = (t.device(0)?.clone(), t.device(1)?.clone());
    /// let src = DeviceBuffer::<f32>::zeroed(&g0, 1 << 20)?;
    /// let mut dst = DeviceBuffer::<f32>::new(&g1, 1 << 20)?;
    /// let stream = Stream::new(&g0)?;
    /// let route = t.copy_peer(&mut dst, &src, &stream)?; // e.g. "0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)"
    /// stream.synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn copy_peer<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        dst: &mut D,
        src: &S,
        stream: &Stream,
    ) -> Result<Route> {
        p2p_mem::check_stream(dst, stream)?;
        p2p_mem::check_stream(src, stream)?;
        let (a, b) = (
            src.device().ordinal() as usize,
            dst.device().ordinal() as usize,
        );
        let route = self.routes.get(a, b)?;
        let runner = match (route.mode, route.engine, route.direction) {
            (Mode::DirectPointer, Engine::SmKernel, Direction::Read) => dst.device().clone(),
            _ => src.device().clone(),
        };
        if stream.device() == &runner
            || !matches!(route.mode, Mode::DirectPointer)
            || route.engine == Engine::CopyEngine
        {
            self.copy_route(&route, dst, src, stream)?;
        } else {
            // Bridge: the runner's stream waits for `stream`, runs the copy, and `stream` waits back.
            let bridge = self
                .slot(&runner)?
                .bridge
                .get(|| Ok(Stream::new(&runner)?))?;
            let before = Event::new(stream.device())?;
            before.record(stream)?;
            before.wait_on(bridge)?;
            self.copy_route(&route, dst, src, bridge)?;
            let after = Event::new(&runner)?;
            after.record(bridge)?;
            after.wait_on(stream)?;
        }
        Ok(route)
    }

    /// The device with this ordinal.
    pub fn device(&self, ordinal: i32) -> Result<&Device> {
        self.devices
            .iter()
            .map(|d| &d.device)
            .find(|d| d.ordinal() == ordinal)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {ordinal} is not one of this transport's devices ({:?})",
                    self.devices
                        .iter()
                        .map(|d| d.device.ordinal())
                        .collect::<Vec<_>>()
                ))
            })
    }

    /// What this transport keeps for `device`.
    fn slot(&self, device: &Device) -> Result<&PerDevice> {
        self.devices
            .iter()
            .find(|d| &d.device == device)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {} is not part of this transport",
                    device.ordinal()
                ))
            })
    }

    fn copy_kernel(&self, device: &Device) -> Result<&CopyKernel> {
        self.slot(device)?.copy.get(|| {
            let module = Module::build(device, &kernels::COPY)?;
            let copy = module.function("p2p_copy_bytes")?;
            Ok(CopyKernel { module, copy })
        })
    }

    /// The send/recv kernels of `device`, compiled on first use.
    pub(crate) fn sendrecv_kernels(&self, device: &Device) -> Result<Arc<SrKernels>> {
        self.slot(device)?
            .sendrecv
            .get(|| Ok(Arc::new(SrKernels::build(device)?)))
            .cloned()
    }

    /// Enables `device` to access `peer`'s memory, once per pair.
    pub fn ensure_peer_access(&self, device: &Device, peer: &Device) -> Result<()> {
        self.peers.ensure(device, peer)
    }

    /// Enables peer access in both directions between `a` and `b`.
    pub fn ensure_peer_access_both(&self, a: &Device, b: &Device) -> Result<()> {
        self.peers.ensure_both(a, b)
    }

    /// The SM copy kernel's launch shape.
    pub fn sm_grid(&self) -> SmGrid {
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the SM copy kernel's launch shape (for tuning; the default is [`SmGrid::DEFAULT`]).
    /// Refuses a shape no GPU runs: 1 to 32 blocks per SM of 32 to 1024 threads, a multiple of
    /// 32 (an SM holds at most 32 blocks and 2048 threads).
    pub fn set_sm_grid(&self, grid: SmGrid) -> Result<()> {
        if !(1..=32).contains(&grid.blocks_per_sm)
            || !(32..=1024).contains(&grid.threads)
            || grid.threads % 32 != 0
        {
            return Err(Error::InvalidArgument(format!(
                "SM copy grid {} blocks per SM x {} threads: use 1-32 blocks of 32-1024 threads, a multiple of 32",
                grid.blocks_per_sm, grid.threads
            )));
        }
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner()) = grid;
        Ok(())
    }

    /// Queues a copy of all of `src` into `dst` (the same size) on `stream` by `path`.
    pub fn copy<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        dst: &mut D,
        src: &S,
        path: Path,
        stream: &Stream,
    ) -> Result<()> {
        p2p_mem::check_stream(dst, stream)?;
        p2p_mem::check_stream(src, stream)?;
        let bytes = src.byte_len();
        if dst.byte_len() != bytes {
            return Err(Error::InvalidArgument(format!(
                "copy destination holds {} bytes but the source {bytes}: they must be equal",
                dst.byte_len()
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let (sd, dd) = (src.device().clone(), dst.device().clone());
        match path {
            Path::CopyEngine => {
                // Without peer access the driver stages peer copies through host memory
                // (measured: 38 GB/s instead of 393 on NV18).
                self.ensure_peer_access_both(&sd, &dd)?;
                copy_engine(dst.device_ptr(), &dd, src.device_ptr(), &sd, bytes, stream)
            }
            Path::SmWrite | Path::SmRead => {
                let (runner, other) = if path == Path::SmWrite {
                    (&sd, &dd)
                } else {
                    (&dd, &sd)
                };
                if stream.device() != runner {
                    let who = if path == Path::SmWrite {
                        "source"
                    } else {
                        "destination"
                    };
                    return Err(Error::InvalidArgument(format!(
                        "{path:?} runs on the {who} GPU {}, but the stream is on GPU {}",
                        runner.ordinal(),
                        stream.device().ordinal()
                    )));
                }
                self.ensure_peer_access(runner, other)?;
                self.sm_copy(runner, dst.device_ptr(), src.device_ptr(), bytes, stream)
            }
            Path::HostStaged | Path::Relay { .. } => {
                let via = if let Path::Relay { via } = path {
                    Some(self.device(via)?.clone())
                } else {
                    None
                };
                let pipeline = self.pipelines.get(&sd, &dd, via.as_ref(), &self.peers)?;
                let mut p = pipeline.lock().unwrap_or_else(|p| p.into_inner());
                p.run(dst.device_ptr(), src.device_ptr(), bytes, stream)
            }
        }
    }

    /// Queues the copy `route` calls for, for ranks within this process.
    pub fn copy_route<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        route: &Route,
        dst: &mut D,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        let path = match (route.mode, route.engine, route.direction) {
            (Mode::Local, _, _) | (Mode::DirectPointer, Engine::CopyEngine, _) => Path::CopyEngine,
            (Mode::DirectPointer, Engine::SmKernel, Direction::Write) => Path::SmWrite,
            (Mode::DirectPointer, Engine::SmKernel, Direction::Read) => Path::SmRead,
            (Mode::HostStaged, _, _) => Path::HostStaged,
            (Mode::Intermediate { via }, _, _) => Path::Relay { via: via as i32 },
            (Mode::LegacyIpc | Mode::CuMem, _, _) => {
                return Err(Error::InvalidArgument(format!(
                    "{route} is between processes: it needs a connection, not an in-process copy"
                )))
            }
        };
        tracing::debug!(target: "p2p_transport::copy", "{route}: {path:?}, {} bytes", src.byte_len());
        self.copy(dst, src, path, stream)
    }

    fn sm_copy(
        &self,
        runner: &Device,
        dst: u64,
        src: u64,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let k = self.copy_kernel(runner)?;
        let vectors = bytes.div_ceil(16).div_ceil(4) as u64;
        let grid = self.sm_grid();
        let max_blocks = runner.sm_count().max(1) as u64 * grid.blocks_per_sm as u64;
        let blocks = vectors.div_ceil(grid.threads as u64).clamp(1, max_blocks) as u32;
        let args = abi::CopyArgs {
            dst,
            src,
            bytes: bytes as u64,
        };
        // SAFETY: p2p_copy_bytes takes one CopyArgs (the layout generated from transport_abi.h);
        // both ranges are `bytes` long and the runner can access both (its own memory, and the
        // peer's with access enabled above).
        unsafe {
            k.module.launch(
                &k.copy,
                LaunchConfig::new(blocks, grid.threads),
                &args,
                stream,
            )
        }?;
        Ok(())
    }
}

/// `cuMemcpyPeerAsync` in [`CE_CHUNK`] pieces on `stream`.
pub(super) fn copy_engine(
    dst: u64,
    dd: &Device,
    src: u64,
    sd: &Device,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    stream.device().bind_to_thread()?;
    let mut off = 0;
    while off < bytes {
        let len = CE_CHUNK.min(bytes - off);
        // SAFETY: both ranges lie inside live allocations of `bytes` bytes; the contexts are retained.
        unsafe {
            cu!(cuMemcpyPeerAsync(
                dst + off as u64,
                dd.cu_context(),
                src + off as u64,
                sd.cu_context(),
                len,
                stream.cu_stream()
            ))
        }
        .map_err(crate::error::cuda(sd.ordinal(), Some(dd.ordinal())))?;
        off += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sm_grid_no_gpu_runs_is_refused_and_the_last_good_one_kept() {
        let t = Transport::new(Vec::new());
        for (blocks_per_sm, threads) in [(0, 512), (33, 512), (4, 0), (4, 16), (4, 1056), (4, 100)]
        {
            let bad = SmGrid {
                blocks_per_sm,
                threads,
            };
            assert!(t.set_sm_grid(bad).is_err(), "{bad:?}");
        }
        assert_eq!(t.sm_grid(), SmGrid::DEFAULT);
        let good = SmGrid {
            blocks_per_sm: 32,
            threads: 1024,
        };
        t.set_sm_grid(good).expect("a shape GPUs run");
        assert_eq!(t.sm_grid(), good);
    }

    #[test]
    fn a_lazy_resource_is_made_once_and_keeps_its_first_error() {
        let made = std::cell::Cell::new(0);
        let ok: Lazy<u32> = Lazy::new("a number");
        for _ in 0..3 {
            let v = ok.get(|| {
                made.set(made.get() + 1);
                Ok(7)
            });
            assert_eq!(*v.expect("made"), 7);
        }
        assert_eq!(made.get(), 1);
        let bad: Lazy<u32> = Lazy::new("the SM copy kernel");
        let first = bad
            .get(|| Err(Error::InvalidArgument("no NVRTC".into())))
            .expect_err("fails")
            .to_string();
        // A later use does not try again: it reports the first error, whole, with what failed.
        let later = bad
            .get(|| unreachable!("made again"))
            .expect_err("still fails");
        assert!(matches!(later, Error::Earlier { .. }), "{later:?}");
        assert!(
            first.contains("the SM copy kernel") && first.contains("no NVRTC"),
            "{first}"
        );
        assert_eq!(first, later.to_string());
    }
}
