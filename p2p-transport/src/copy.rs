//! Moving bytes between GPUs of one process: the data paths.
//!
//! [`Transport`] holds what the paths need per process: one compiled copy kernel per device,
//! the peer access it has enabled, and the staging pipelines. [`Transport::copy`] queues one
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

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use p2p_mem::{
    Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Event, PinnedHostBuffer, Stream,
};
use p2p_sys::cu;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernels::{self, Function, Module, SrKernels};
use crate::mode::{select, Direction, Endpoint, Engine, Mode, Route};
use crate::topo::Topology;

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

/// (source GPU, destination GPU, relay GPU or -1 for host-staged).
type PipelineKey = (i32, i32, i32);

struct Kernels {
    module: Module,
    copy: Function,
}

/// A lazily made resource, or the error its first attempt met (kept whole, shared by every
/// later use).
type Cached<T> = std::result::Result<T, Arc<Error>>;

fn earlier(what: &'static str, e: &Arc<Error>) -> Error {
    Error::Earlier {
        what,
        source: e.clone(),
    }
}

/// What one process needs to move data between its GPUs. Cheap to share across threads.
pub struct Transport {
    devices: Vec<Device>,
    kernels: Vec<OnceLock<Cached<Kernels>>>,
    peers: Mutex<HashSet<(i32, i32)>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Mutex<Pipeline>>>>,
    sm_grid: Mutex<SmGrid>,
    config: Mutex<Option<Config>>,
    routes: Mutex<HashMap<(usize, usize), Route>>,
    topology: OnceLock<Cached<Topology>>,
    bridges: Vec<OnceLock<Cached<Stream>>>,
    sendrecv: Vec<OnceLock<Cached<Arc<SrKernels>>>>,
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
        let kernels = devices.iter().map(|_| OnceLock::new()).collect();
        let n = devices.len();
        Transport {
            devices,
            kernels,
            peers: Mutex::new(HashSet::new()),
            pipelines: Mutex::new(HashMap::new()),
            sm_grid: Mutex::new(SmGrid::DEFAULT),
            sendrecv: (0..n).map(|_| OnceLock::new()).collect(),
            config: Mutex::new(None),
            routes: Mutex::new(HashMap::new()),
            topology: OnceLock::new(),
            bridges: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Uses `config` for [`copy_peer`](Self::copy_peer)'s mode selection instead of the
    /// `P2P_*` environment.
    pub fn set_config(&self, config: Config) {
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = Some(config);
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The route `copy_peer` takes from GPU `a` to GPU `b`: chosen (and logged) once per pair,
    /// then reused until [`set_config`](Self::set_config) changes the configuration.
    fn route(&self, a: usize, b: usize) -> Result<Route> {
        if let Some(r) = self
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(a, b))
        {
            return Ok(r.clone());
        }
        let ends = [
            Endpoint {
                rank: a,
                gpu: a,
                process: 0,
            },
            Endpoint {
                rank: b,
                gpu: b,
                process: 0,
            },
        ];
        let route = if a == b {
            Route {
                from: ends[0],
                to: ends[0],
                mode: Mode::Local,
                direction: Direction::Write,
                engine: Engine::CopyEngine,
                link: "same GPU".into(),
                reason: "both buffers on one GPU".into(),
            }
        } else {
            select(self.topology()?, &ends, &self.config()?)?
                .into_iter()
                .find(|r| r.from.gpu == a && r.to.gpu == b)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("no route from GPU {a} to GPU {b}"))
                })?
        };
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((a, b), route.clone());
        Ok(route)
    }

    fn config(&self) -> Result<Config> {
        if let Some(c) = self
            .config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(c);
        }
        Ok(Config::from_env_lenient()?)
    }

    fn topology(&self) -> Result<&Topology> {
        self.topology
            .get_or_init(|| crate::topo::discover().map_err(|e| Arc::new(e.into())))
            .as_ref()
            .map_err(|e| earlier("topology discovery", e))
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
        let route = self.route(a, b)?;
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
            let i = self.index_of(&runner)?;
            let bridge = self.bridges[i]
                .get_or_init(|| Stream::new(&runner).map_err(|e| Arc::new(e.into())))
                .as_ref()
                .map_err(|e| earlier("a bridge stream", e))?;
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
            .find(|d| d.ordinal() == ordinal)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {ordinal} is not one of this transport's devices ({:?})",
                    self.devices.iter().map(Device::ordinal).collect::<Vec<_>>()
                ))
            })
    }

    /// The position of `device` among this transport's devices.
    fn index_of(&self, device: &Device) -> Result<usize> {
        self.devices
            .iter()
            .position(|d| d == device)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {} is not part of this transport",
                    device.ordinal()
                ))
            })
    }

    fn kernels(&self, device: &Device) -> Result<&Kernels> {
        let i = self.index_of(device)?;
        self.kernels[i]
            .get_or_init(|| {
                let build = || -> p2p_mem::Result<Kernels> {
                    let module = Module::build(device, &kernels::COPY)?;
                    let copy = module.function("p2p_copy_bytes")?;
                    Ok(Kernels { module, copy })
                };
                build().map_err(|e| Arc::new(e.into()))
            })
            .as_ref()
            .map_err(|e| earlier("the SM copy kernel", e))
    }

    /// The send/recv kernels of `device`, compiled on first use.
    pub(crate) fn sendrecv_kernels(&self, device: &Device) -> Result<Arc<SrKernels>> {
        let i = self.index_of(device)?;
        self.sendrecv[i]
            .get_or_init(|| {
                SrKernels::build(device)
                    .map(Arc::new)
                    .map_err(|e| Arc::new(e.into()))
            })
            .clone()
            .map_err(|e| earlier("the send/recv kernels", &e))
    }

    /// Enables `device` to access `peer`'s memory, once per pair.
    pub fn ensure_peer_access(&self, device: &Device, peer: &Device) -> Result<()> {
        let key = (device.ordinal(), peer.ordinal());
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if device != peer && !peers.contains(&key) {
            device.enable_peer_access(peer)?;
            peers.insert(key);
        }
        Ok(())
    }

    /// Enables peer access in both directions between `a` and `b`.
    pub fn ensure_peer_access_both(&self, a: &Device, b: &Device) -> Result<()> {
        self.ensure_peer_access(a, b)?;
        self.ensure_peer_access(b, a)
    }

    /// The SM copy kernel's launch shape.
    pub fn sm_grid(&self) -> SmGrid {
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the SM copy kernel's launch shape (for tuning; the default is [`SmGrid::DEFAULT`]).
    pub fn set_sm_grid(&self, grid: SmGrid) {
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner()) = grid;
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
                let key = (
                    sd.ordinal(),
                    dd.ordinal(),
                    via.as_ref().map_or(-1, |v| v.ordinal()),
                );
                let pipeline = {
                    let mut map = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
                    match map.get(&key) {
                        Some(p) => p.clone(),
                        None => {
                            if let Some(v) = &via {
                                // The relay legs are peer copies: direct only with peer access.
                                self.ensure_peer_access_both(&sd, v)?;
                                self.ensure_peer_access_both(v, &dd)?;
                            }
                            let p = Arc::new(Mutex::new(Pipeline::new(&sd, &dd, via.as_ref())?));
                            map.insert(key, p.clone());
                            p
                        }
                    }
                };
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
        let k = self.kernels(runner)?;
        let vectors = bytes.div_ceil(16).div_ceil(4) as u64;
        let grid = self.sm_grid();
        let max_blocks = runner.sm_count().max(1) as u64 * grid.blocks_per_sm as u64;
        let blocks = vectors.div_ceil(grid.threads as u64).clamp(1, max_blocks) as u32;
        let (mut d, mut s, mut n) = (dst, src, bytes as u64);
        let mut params = [
            (&mut d as *mut u64).cast::<c_void>(),
            (&mut s as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: p2p_copy_bytes(unsigned char*, const unsigned char*, unsigned long long) matches
        // the three parameters; both ranges are `bytes` long and the runner can access both
        // (its own memory, and the peer's with access enabled above).
        unsafe {
            k.module
                .launch(k.copy, blocks, grid.threads, &mut params, stream)
        }?;
        Ok(())
    }
}

/// `cuMemcpyPeerAsync` in [`CE_CHUNK`] pieces on `stream`.
fn copy_engine(
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

enum Staging {
    Host(PinnedHostBuffer<u8>),
    Device(DeviceBuffer<u8>),
}

impl Staging {
    fn ptr(&self) -> u64 {
        match self {
            Staging::Host(b) => b.as_ptr() as u64,
            Staging::Device(b) => b.device_ptr(),
        }
    }
}

/// Two legs overlapped through [`STAGE_SLOTS`] buffers: leg one fills a slot on stream one, leg
/// two drains it on stream two, and a slot is refilled only after it was drained.
struct Pipeline {
    src_dev: Device,
    dst_dev: Device,
    mid: Option<Device>,
    slots: Vec<Staging>,
    s1: Stream,
    s2: Stream,
    filled: Vec<Event>,
    drained: Vec<Event>,
    used: Vec<bool>,
    done: Event,
}

impl Pipeline {
    fn new(src: &Device, dst: &Device, via: Option<&Device>) -> Result<Pipeline> {
        let (leg2_dev, slots) = match via {
            // Relay: leg one copies into the relay GPU, leg two out of it, both on copy engines.
            Some(v) => (
                v.clone(),
                (0..STAGE_SLOTS)
                    .map(|_| DeviceBuffer::<u8>::new(v, STAGE_CHUNK).map(Staging::Device))
                    .collect::<p2p_mem::Result<Vec<_>>>()?,
            ),
            // Host-staged: device-to-host on the source, host-to-device on the destination.
            None => (
                dst.clone(),
                (0..STAGE_SLOTS)
                    .map(|_| PinnedHostBuffer::<u8>::new(src, STAGE_CHUNK).map(Staging::Host))
                    .collect::<p2p_mem::Result<Vec<_>>>()?,
            ),
        };
        let s1 = Stream::new(src)?;
        let s2 = Stream::new(&leg2_dev)?;
        let filled = (0..STAGE_SLOTS)
            .map(|_| Event::new(src))
            .collect::<p2p_mem::Result<Vec<_>>>()?;
        let drained = (0..STAGE_SLOTS)
            .map(|_| Event::new(&leg2_dev))
            .collect::<p2p_mem::Result<Vec<_>>>()?;
        let done = Event::new(&leg2_dev)?;
        Ok(Pipeline {
            src_dev: src.clone(),
            dst_dev: dst.clone(),
            mid: via.cloned(),
            slots,
            s1,
            s2,
            filled,
            drained,
            used: vec![false; STAGE_SLOTS],
            done,
        })
    }

    fn run(&mut self, dst: u64, src: u64, bytes: usize, caller: &Stream) -> Result<()> {
        let start = Event::new(caller.device())?;
        start.record(caller)?;
        start.wait_on(&self.s1)?;
        let mut off = 0;
        let mut k = 0;
        while off < bytes {
            let len = STAGE_CHUNK.min(bytes - off);
            let slot = k % STAGE_SLOTS;
            if self.used[slot] {
                self.drained[slot].wait_on(&self.s1)?;
            }
            let buf = self.slots[slot].ptr();
            self.leg1(buf, src + off as u64, len)?;
            self.filled[slot].record(&self.s1)?;
            self.filled[slot].wait_on(&self.s2)?;
            self.leg2(dst + off as u64, buf, len)?;
            self.drained[slot].record(&self.s2)?;
            self.used[slot] = true;
            off += len;
            k += 1;
        }
        self.done.record(&self.s2)?;
        Ok(self.done.wait_on(caller)?)
    }

    fn leg1(&self, buf: u64, src: u64, len: usize) -> Result<()> {
        let (sd, s) = (&self.src_dev, &self.s1);
        match &self.mid {
            Some(mid) => copy_engine(buf, mid, src, sd, len, s),
            None => {
                sd.bind_to_thread()?;
                // SAFETY: `buf` is a pinned staging buffer of STAGE_CHUNK >= len bytes owned by the
                // pipeline; `src` lies in a live allocation.
                unsafe {
                    cu!(cuMemcpyDtoHAsync_v2(
                        buf as *mut c_void,
                        src,
                        len,
                        s.cu_stream()
                    ))
                }
                .map_err(crate::error::cuda(sd.ordinal(), None))
            }
        }
    }

    fn leg2(&self, dst: u64, buf: u64, len: usize) -> Result<()> {
        let (dd, s) = (&self.dst_dev, &self.s2);
        match &self.mid {
            Some(mid) => copy_engine(dst, dd, buf, mid, len, s),
            None => {
                dd.bind_to_thread()?;
                // SAFETY: as in leg1, in the other direction.
                unsafe {
                    cu!(cuMemcpyHtoDAsync_v2(
                        dst,
                        buf as *const c_void,
                        len,
                        s.cu_stream()
                    ))
                }
                .map_err(crate::error::cuda(dd.ordinal(), None))
            }
        }
    }
}
