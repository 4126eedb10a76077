//! Communicators: the ranks of a collective, their registered workspaces, and the calls.
//!
//! Every rank owns one workspace: a sync area (flags, per-block step counters, the failure
//! record) and a scratch area that peers push data into. Each rank holds every peer's
//! workspace address as its own GPU sees it, mapped by the transport's peer layer
//! (`p2p_transport::peer`): a plain pointer with peer access (one process driving several
//! GPUs), a cuMem fd or legacy IPC mapping (one process per GPU), or pinned host memory
//! shared by every rank (host-staged, where GPUs have no P2P). A call validates its
//! arguments, plans (`plan.rs`) and launches one kernel (`kernels/coll.cu`) on the caller's
//! stream, or for the copy-engine plans barrier kernels and copies, with work forked onto the
//! communicator's second stream and joined back; it never blocks the host, so it can be
//! captured in a CUDA graph.
//!
//! Calls on one communicator must be ordered on the GPU: use one stream per rank (or order
//! streams with events). Two calls on the same communicator running at once would share step
//! counters.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
use p2p_mem::kernel::{self as kernels, Function, Module, Source};
use p2p_mem::{check_peer_mappable, check_stream, Device, DeviceMemory, DeviceMemoryMut, Stream};
use p2p_transport::config::Config;

use crate::settings::{Algorithm, Settings};
use p2p_mem::abort::{
    AbortHandle, KERNEL_FAILED, KERNEL_FAILED_MISMATCH, KERNEL_FAILED_PEER_SHIFT,
    KERNEL_FAILED_RANK_SHIFT,
};
use p2p_transport::peer::{self, LocalRegion, PairP2p, PeerRegion, Sharing};

use crate::error::{Error, Result};
use crate::exchange::{self, decode_proposal, encode_proposal, Introduction};
use crate::plan::{self, Access, Kind, Plan, Tuning, MAX_RANKS, THREADS};
use crate::types::{DataType, Op, RedOp};
use p2p_transport::rendezvous::{Group, Rendezvous};

/// The collective kernels (`coll_f32` ... `coll_u8`, each in seven families) and the send/recv
/// kernel (`p2p_sendrecv`), in one program.
pub const COLL: Source = Source {
    name: "coll.cu",
    code: concat!(
        include_str!("kernels/coll_abi.h"),
        include_str!("kernels/coll.cu")
    ),
    defines: &[],
    shipped: SHIPPED,
};

/// [`COLL_PARTS`] compiled for sm_80 and sm_90 (`cargo xtask kernels`; see
/// `p2p_mem::kernel::shipped`): a communicator needs no compiler on those GPUs.
pub const SHIPPED: &[u8] = include_bytes!("kernels/shipped.p2pk.zst");

/// [`COLL`] as the parts a communicator compiles, in parallel and cached each on its own: part
/// `k` < 7 holds the kernels of `DataType::ALL[k]`, the last part `p2p_sendrecv`. Compiled
/// whole, NVRTC takes about a minute on one thread; in parts on 16 cores, 8-11 s
/// (docs/perf-notes.md section 39).
pub const COLL_PARTS: [Source; crate::abi::COLL_PARTS] = {
    const fn part(defines: &'static [&'static str]) -> Source {
        Source { defines, ..COLL }
    }
    [
        part(&["COLL_PART=0"]),
        part(&["COLL_PART=1"]),
        part(&["COLL_PART=2"]),
        part(&["COLL_PART=3"]),
        part(&["COLL_PART=4"]),
        part(&["COLL_PART=5"]),
        part(&["COLL_PART=6"]),
        part(&["COLL_PART=7"]),
    ]
};
const _: () = assert!(crate::abi::COLL_PART_P2P == crate::abi::COLL_PARTS - 1);
const _: () = assert!(crate::abi::COLL_PART_P2P == DataType::ALL.len());

use crate::abi::{CollArgs, F_ABORT, F_MISMATCH, F_TIMEOUT, STATUS_OFF, STATUS_WORDS, SYNC_BYTES};
const _: () = assert!((STATUS_OFF + STATUS_WORDS) * 8 <= SYNC_BYTES);
const _: () = assert!(STATUS_OFF + STATUS_WORDS <= crate::abi::P2P_FREED_OFF);
const _: () = assert!(crate::abi::P2P_END_OFF * 8 <= SYNC_BYTES);
const _: () = assert!((crate::abi::CE_FLAGS_OFF + crate::abi::CE_CHUNKS) * 8 <= SYNC_BYTES);

/// How far past the communicator's time limit [`Communicator::synchronize`] waits for its
/// stream: every call of ours ends by its time limit, and an aborted one within milliseconds.
pub const SYNC_GRACE: std::time::Duration = p2p_mem::DRAIN_GRACE;

/// Bytes of the one argument block that every collective kernel launch passes by value (the
/// `CollArgs` of `coll_abi.h`): what the driver copies into each launch. For host-cost
/// experiments (`p2p-bench host` launches an empty kernel with a block of this size).
pub const KERNEL_ARGS_BYTES: usize = std::mem::size_of::<CollArgs>();
// The kernels' values for the abort flag are the GPU runtime's (AbortHandle reads them).
const _: () = assert!(crate::abi::ABORT_KERNEL_FAILED == KERNEL_FAILED as usize);
const _: () = assert!(crate::abi::ABORT_PEER_SHIFT == KERNEL_FAILED_PEER_SHIFT as usize);
const _: () = assert!(crate::abi::ABORT_RANK_SHIFT == KERNEL_FAILED_RANK_SHIFT as usize);
const _: () = assert!(crate::abi::ABORT_MISMATCH == KERNEL_FAILED_MISMATCH as usize);

/// How a communicator behaves; [`Options::from_env`] reads the `P2P_*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Force one all-reduce algorithm (`None`: chosen by size and world size).
    pub algorithm: Option<Algorithm>,
    /// Check on the GPU that every rank made the same call (operation, type, reduction,
    /// root, count); a mismatch fails with [`Error::Mismatch`]. Costs one extra store per
    /// peer per block per call.
    pub check: bool,
    /// How long a kernel waits for a peer before giving up.
    pub timeout: Duration,
    /// Planner knobs (`None`: the defaults for the GPU).
    pub tuning: Option<Tuning>,
    /// The transport's settings: how ranks reach each other's memory (`P2P_DISABLE`,
    /// `P2P_MODE`, `P2P_CUMEM`; see [`p2p_transport::peer::choose`]).
    pub transport: Config,
}

impl Options {
    /// From the collectives' settings (`P2P_ALGO`, `P2P_CHECK`, `P2P_TIMEOUT_MS`) and the
    /// transport's configuration.
    pub fn from_settings(settings: Settings, transport: Config) -> Options {
        Options {
            algorithm: settings.algorithm,
            check: settings.check,
            timeout: settings.timeout,
            tuning: None,
            transport,
        }
    }

    /// From the process environment: a bad value is an error; an unknown `P2P_*` variable is
    /// a warning naming it (`p2p-bench` refuses it instead).
    pub fn from_env() -> Result<Options> {
        Ok(Self::from_settings(
            Settings::from_env()?,
            Config::from_env_lenient()?,
        ))
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::from_settings(Settings::default(), Config::default())
    }
}

/// One collective call, for [`Communicator::call`]: what the named methods build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The element type.
    pub dtype: DataType,
    /// Elements, in NCCL's convention (see [`Op::buffer_lens`]).
    pub count: usize,
    /// The reduction (ignored by operations that do not reduce).
    pub redop: RedOp,
    /// The root (ignored by operations without one).
    pub root: usize,
}

impl Call {
    /// `op` over `count` elements of `dtype`, with sum and root 0 until set otherwise.
    pub fn new(op: Op, dtype: DataType, count: usize) -> Call {
        Call {
            op,
            dtype,
            count,
            redop: RedOp::Sum,
            root: 0,
        }
    }

    /// The same call with reduction `redop`.
    pub fn redop(self, redop: RedOp) -> Call {
        Call { redop, ..self }
    }

    /// The same call with root `root`.
    pub fn root(self, root: usize) -> Call {
        Call { root, ..self }
    }
}

/// The kernel families of `coll.cu`, each one entry point per type (`coll_f32`, `coll_f32_ll`,
/// ...): separate entry points give each family its own register allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// Through the scratch, step by step (`coll_<type>`).
    Steps = 0,
    /// Flags inside the data (`coll_<type>_ll`).
    Ll = 1,
    /// On registered buffers (`coll_<type>_direct`).
    Direct = 2,
    /// Broadcast and reduce split among the non-roots (`coll_<type>_split`).
    Split = 3,
    /// LL all-reduce on two ranks, its kind and world size compiled in (`coll_<type>_ll2`).
    Ll2 = 4,
    /// The copy-engine all-reduce's reduction (`coll_<type>_ce`).
    Ce = 5,
    /// The pipelined one-shot all-reduce (`coll_<type>_pipe`).
    Pipe = 6,
    /// All-gather, all-to-all and reduce-scatter through the scratch where a part or a buffer
    /// lies off a 16-byte boundary: copies that realign their words (`coll_<type>_shift`).
    Shift = 7,
}

impl Family {
    const ALL: [Family; 8] = [
        Family::Steps,
        Family::Ll,
        Family::Direct,
        Family::Split,
        Family::Ll2,
        Family::Ce,
        Family::Pipe,
        Family::Shift,
    ];

    /// The family that runs `kind` on `world` ranks; `off16`: a rank's part or a buffer of the
    /// call lies off a 16-byte boundary.
    fn of(kind: Kind, world: usize, off16: bool) -> Family {
        if off16 && matches!(kind, Kind::AllGather | Kind::AllToAll | Kind::ReduceScatter) {
            Family::Shift
        } else if kind == Kind::AllReduceLl && world == 2 {
            Family::Ll2
        } else if kind.is_ll() {
            Family::Ll
        } else if kind == Kind::AllReduceCe {
            Family::Ce
        } else if kind == Kind::AllReducePipe {
            Family::Pipe
        } else if kind.is_direct() {
            Family::Direct
        } else if matches!(kind, Kind::BroadcastSplit | Kind::ReduceSplit) {
            Family::Split
        } else {
            Family::Steps
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Family::Steps => "",
            Family::Ll => "_ll",
            Family::Direct => "_direct",
            Family::Split => "_split",
            Family::Ll2 => "_ll2",
            Family::Ce => "_ce",
            Family::Pipe => "_pipe",
            Family::Shift => "_shift",
        }
    }
}

/// A kernel and the module it is in (which launches it).
#[derive(Clone, Copy)]
pub(crate) struct Kernel<'a> {
    pub(crate) module: &'a Module,
    pub(crate) function: &'a Function,
}

/// The kernels of [`COLL_PARTS`] loaded on one device.
pub(crate) struct Kernels {
    /// One per part of [`COLL_PARTS`].
    modules: Vec<Module>,
    /// `[family][type]`, in module `type`.
    functions: [[Function; 7]; 8],
    /// Send and recv (`p2p_sendrecv`), for every type, in the last module.
    sendrecv: Function,
    /// Resident blocks per SM of `p2p_sendrecv`.
    pub(crate) sendrecv_blocks_per_sm: i32,
    /// Resident blocks per SM of the least-occupant kernel.
    blocks_per_sm: i32,
}

/// The failure of a peer that `group` learnt of, as this rank's init reports it.
fn init_failure(group: &Group, rank: usize) -> Option<Error> {
    group.failure().map(|f| Error::PeerFailed {
        op: "init".into(),
        rank,
        peer: f.rank,
        why: f.why,
    })
}

/// [`Kernels::build`] in a thread of its own, started before the rendezvous.
struct KernelLoad {
    device: Device,
    done: Option<std::sync::mpsc::Receiver<Result<Arc<Kernels>>>>,
}

impl KernelLoad {
    fn start(device: &Device) -> KernelLoad {
        let (tx, rx) = std::sync::mpsc::channel();
        let d = device.clone();
        let started = std::thread::Builder::new()
            .name("p2p-kernels".into())
            .spawn(move || {
                let _ = tx.send(Kernels::for_device(&d));
            });
        KernelLoad {
            device: device.clone(),
            // No thread: the kernels load in `wait`.
            done: started.ok().map(|_| rx),
        }
    }

    /// The kernels, once loaded; a failure of a peer that `group` learns of meanwhile ends the
    /// wait at once (the load itself, bounded work, finishes in its thread and stays in the
    /// process's cache). If the rendezvous fails, `self` is dropped unwaited: the load goes on
    /// the same way (a process that exits meanwhile exits with it under way).
    fn wait(self, group: &Group, rank: usize) -> Result<Arc<Kernels>> {
        let Some(rx) = self.done else {
            return Kernels::for_device(&self.device);
        };
        loop {
            if let Some(e) = init_failure(group, rank) {
                return Err(e);
            }
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(kernels) => return kernels,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                // The thread ended without an answer (it panicked): load them here.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Kernels::for_device(&self.device)
                }
            }
        }
    }
}

impl Kernels {
    /// This process's kernels for `device`: loaded by the first communicator on it and kept
    /// until the process exits, shared by every later one. Unloading a module does not give all
    /// of its GPU memory back (measured on H100, driver 580: about 1 MiB per load and unload
    /// of these modules, growing with every communicator made and dropped; perf-notes §50), so
    /// they are loaded once per GPU, as NCCL and the CUDA runtime load theirs. They keep the
    /// GPU's primary context retained until the process exits; resetting that context
    /// (`cuDevicePrimaryCtxReset`, `cudaDeviceReset`) after a communicator was made is not
    /// supported.
    fn for_device(device: &Device) -> Result<Arc<Kernels>> {
        type Slot = Arc<Mutex<Option<Arc<Kernels>>>>;
        static LOADED: Mutex<Vec<(i32, Slot)>> = Mutex::new(Vec::new());
        let slot = {
            let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
            match loaded.iter().find(|(o, _)| *o == device.ordinal()) {
                Some((_, slot)) => slot.clone(),
                None => {
                    let slot = Slot::default();
                    loaded.push((device.ordinal(), slot.clone()));
                    slot
                }
            }
        };
        // One load per GPU, also when communicators on it are made at once in several threads.
        let mut kernels = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &*kernels {
            return Ok(k.clone());
        }
        let k = Arc::new(Kernels::build(device)?);
        *kernels = Some(k.clone());
        tracing::debug!(
            device = device.ordinal(),
            "loaded the collective kernels; kept for this process's later communicators"
        );
        Ok(k)
    }

    /// Compiles [`COLL_PARTS`] for `device`'s architecture (or finds them in the kernel cache,
    /// or in this process's memo: GPUs of one architecture share one compile) and loads them,
    /// one module per part.
    fn build(device: &Device) -> Result<Kernels> {
        let modules = Module::build_all(device, &COLL_PARTS)?;
        let missing = |what: String| Error::InvalidArgument {
            op: "init",
            rank: 0,
            what,
        };
        if modules.len() != COLL_PARTS.len() {
            return Err(missing(format!(
                "{} modules for the {} parts of the collective kernels",
                modules.len(),
                COLL_PARTS.len()
            )));
        }
        let mut functions = Vec::with_capacity(Family::ALL.len());
        let mut blocks_per_sm = i32::MAX;
        for family in Family::ALL {
            let mut row = Vec::with_capacity(DataType::ALL.len());
            for d in DataType::ALL {
                let name = format!("{}{}", d.kernel(), family.suffix());
                let f = modules[d.index()].function(&name)?;
                blocks_per_sm = blocks_per_sm.min(f.max_blocks_per_sm(THREADS)?);
                row.push(f);
            }
            functions.push(row);
        }
        let functions = functions
            .into_iter()
            .map(<[Function; 7]>::try_from)
            .collect::<std::result::Result<Vec<_>, _>>()
            .ok()
            .and_then(|rows| <[[Function; 7]; 8]>::try_from(rows).ok())
            .ok_or_else(|| missing("the collective module is missing kernels".into()))?;
        let sendrecv = modules[crate::abi::COLL_PART_P2P].function("p2p_sendrecv")?;
        let sendrecv_blocks_per_sm = sendrecv.max_blocks_per_sm(THREADS)?;
        Ok(Kernels {
            modules,
            functions,
            sendrecv,
            sendrecv_blocks_per_sm,
            blocks_per_sm,
        })
    }

    /// The kernel of `family` for `dtype` ([`Family::of`] picks the family).
    fn function(&self, family: Family, dtype: DataType) -> Kernel<'_> {
        Kernel {
            module: &self.modules[dtype.index()],
            function: &self.functions[family as usize][dtype.index()],
        }
    }

    /// `p2p_sendrecv`.
    pub(crate) fn sendrecv(&self) -> Kernel<'_> {
        Kernel {
            module: &self.modules[crate::abi::COLL_PART_P2P],
            function: &self.sendrecv,
        }
    }
}

/// A buffer registered on every rank: this rank's range, and where every rank's registered
/// buffer is as this GPU addresses it.
struct Window {
    id: u64,
    base: u64,
    len: usize,
    /// Rank r's buffer as this GPU addresses it (this rank's: `base`).
    peers: [u64; MAX_RANKS],
    /// Process per GPU: the peers' buffers mapped by the peer layer, held while registered.
    _mappings: Vec<PeerRegion>,
}

/// One registered buffer on one rank, from [`Communicator::register`] or
/// [`Communicator::register_all`]; [`Communicator::deregister`] ends it. Dropping it does not:
/// the registration lasts until deregistered or until the communicator is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    id: u64,
    rank: usize,
    ptr: u64,
    len: usize,
}

impl Registration {
    /// The registered buffer's device address on its rank.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len
    }
}

/// A peer's workspace, kept alive as long as this rank may write into it (held, never read).
#[allow(dead_code)]
enum PeerMemory {
    Local(Arc<LocalRegion>),
    Imported(PeerRegion),
}

/// A region of a buffer, as a call sees it.
#[derive(Clone, Copy)]
pub(crate) struct Region<'a> {
    pub(crate) ptr: u64,
    bytes: usize,
    device: &'a Device,
}

/// Refuses a typed buffer whose elements are of another numeric type than `dtype` (a
/// `DeviceBuffer<f32>` reduced as `I32`): the sizes may agree while the results would be
/// garbage. Byte buffers (`u8`), other element types and untyped memory pass.
pub(crate) fn check_element(
    op: &'static str,
    rank: usize,
    dtype: DataType,
    which: &str,
    m: &(impl DeviceMemory + ?Sized),
) -> Result<()> {
    let Some(e) = m.element_type() else {
        return Ok(());
    };
    match DataType::of_element(e) {
        Some(d) if d != dtype => Err(Error::InvalidArgument {
            op,
            rank,
            what: format!(
                "the {which} buffer holds {} elements but the call says {dtype:?}: pass DataType::{d:?}, or a buffer of bytes (u8) to reinterpret memory",
                e.name
            ),
        }),
        _ => Ok(()),
    }
}

impl<'a> Region<'a> {
    /// The whole of `m`, checked to be usable on `stream` ([`check_stream`]).
    pub(crate) fn of<M: DeviceMemory + ?Sized>(m: &'a M, stream: &Stream) -> Result<Region<'a>> {
        check_stream(m, stream)?;
        Ok(Region {
            ptr: m.device_ptr(),
            bytes: m.byte_len(),
            device: m.device(),
        })
    }
}

/// One rank of a communicator.
///
/// Made by [`Communicator::init_all`] (one process, several GPUs: one handle per rank) or
/// [`Communicator::init`] / [`Communicator::from_env`] (one process per GPU). Every call is
/// asynchronous on the stream it is given; [`synchronize`](Self::synchronize) waits and
/// reports a stalled, aborted or mismatched call as an error.
pub struct Communicator {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: Device,
    pub(crate) options: Options,
    pub(crate) tuning: Tuning,
    pub(crate) bases: [u64; MAX_RANKS],
    /// How the ranks reach each other's workspaces (the peer layer's choice).
    sharing: Sharing,
    pub(crate) abort: AbortHandle,
    failed: Mutex<Option<String>>,
    /// The most ranks of this communicator on any one GPU (1 unless ranks share a GPU): each
    /// rank's grids are sized to fit beside the others' ([`Tuning::shared_by`]).
    pub(crate) share: usize,
    pub(crate) kernels: Arc<Kernels>,
    /// The other processes of the job (process-per-GPU communicators): exchanges and liveness.
    group: Option<Group>,
    /// Registered buffers (symmetric windows): calls on them read and write peers directly.
    windows: RwLock<Vec<Window>>,
    /// Where the last call that used a window ends: what [`deregister`](Self::deregister)
    /// waits for.
    window_calls: WindowCalls,
    /// The copy-engine plans' second stream.
    side: SideStream,
    // Freed last: peers' mappings, then this rank's workspace.
    _peers: Vec<PeerMemory>,
    workspace: Arc<LocalRegion>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device.ordinal())
            .field("options", &self.options)
            .finish()
    }
}

/// A stream beside the caller's for the copy-engine plans (the all-reduce's reduce kernel, the
/// own part's copy of an all-gather or all-to-all), with the events that start it after the
/// work queued so far on the caller's stream and make the caller's stream wait for it: a fork
/// and a join, which CUDA graph capture follows too.
struct SideStream {
    stream: Stream,
    fork: p2p_mem::Event,
    join: p2p_mem::Event,
}

impl SideStream {
    fn new(device: &Device) -> Result<SideStream> {
        Ok(SideStream {
            stream: Stream::new(device)?,
            fork: p2p_mem::Event::new(device)?,
            join: p2p_mem::Event::new(device)?,
        })
    }

    /// Work queued next on the side stream starts after everything queued so far on `stream`.
    fn fork(&self, stream: &Stream) -> Result<&Stream> {
        self.fork.record(stream)?;
        self.fork.wait_on(&self.stream)?;
        Ok(&self.stream)
    }

    /// Work queued next on `stream` starts after everything queued so far on the side stream.
    fn join(&self, stream: &Stream) -> Result<()> {
        self.join.record(&self.stream)?;
        self.join.wait_on(stream)?;
        Ok(())
    }
}

/// What [`Communicator::deregister`] knows of the calls that may still use a window: the
/// calls whose plans read or write the peers' registered buffers (the direct and copy-engine
/// kinds; below the LL threshold, and on unregistered buffers, calls record nothing). Calls on
/// one communicator run in order on the GPU (its documented rule), so the end of the last such
/// call is the end of them all: one event, recorded on the caller's stream after each, marks it.
struct WindowCalls {
    /// Recorded after the last eager call that used a window.
    done: p2p_mem::Event,
    /// A call that used a window was captured into a graph (its replays are not recorded here),
    /// or its event could not be recorded: from then on deregister waits for the whole GPU.
    untracked: AtomicBool,
}

impl WindowCalls {
    fn new(device: &Device) -> Result<WindowCalls> {
        Ok(WindowCalls {
            done: p2p_mem::Event::new(device)?,
            untracked: AtomicBool::new(false),
        })
    }

    /// After a call that used a window was queued on `stream`: its end is now the one to wait
    /// for. Never fails the call (it is queued): what cannot be recorded makes deregister wait
    /// for the whole GPU instead.
    fn queued(&self, rank: usize, stream: &Stream) {
        let recorded = match stream.is_capturing() {
            Ok(false) => self.done.record(stream).map(|()| true),
            Ok(true) => Ok(false),
            Err(e) => Err(e),
        };
        if !matches!(recorded, Ok(true)) && !self.untracked.swap(true, Ordering::Relaxed) {
            let why = match recorded {
                Err(e) => format!("its end could not be recorded ({e})"),
                _ => "it was captured into a graph, whose replays are not tracked".into(),
            };
            tracing::info!(
                rank,
                "a call on registered buffers: {why}; deregister waits for the whole GPU from now on"
            );
        }
    }
}

/// The sync area, the scratch (2 parities x `world` sources x a slot), the LL region
/// (2 x `world` x `LL_SLOT_BYTES`), then the send/recv inboxes (one per source rank).
fn workspace_bytes(world: usize, tuning: &Tuning) -> usize {
    inbox_offset(world, tuning, world)
}

/// Where, from the start of a workspace, the send/recv inbox for messages from rank `source`
/// begins (`source == world`: the end of the workspace).
pub(crate) fn inbox_offset(world: usize, tuning: &Tuning, source: usize) -> usize {
    SYNC_BYTES
        + 2 * world * tuning.slot_bytes()
        + 2 * world * plan::LL_SLOT_BYTES
        + source * crate::abi::P2P_INBOX_BYTES
}

fn check_world(world: usize) -> Result<()> {
    if world == 0 || world > MAX_RANKS {
        return Err(Error::InvalidArgument {
            op: "init",
            rank: 0,
            what: format!("a communicator has 1 to {MAX_RANKS} ranks, not {world}"),
        });
    }
    Ok(())
}

impl Communicator {
    /// Compiles the collective kernels for `arch` (`"sm_90"` for H100 and H200, `"sm_80"` for
    /// A100; [`p2p_mem::kernel::arch_for`] names a device's) into the on-disk kernel cache
    /// ([`p2p_mem::kernel::cache_dir`]), with no GPU: it needs libnvrtc only. Run where the
    /// program will run (the same cache folder and the same NVRTC, which is part of the key),
    /// e.g. in a container's build step, and the first communicator there finds the kernels
    /// cached instead of compiling them (about 10 s on 16 cores: docs/perf-notes.md section
    /// 39). What is cached already is not compiled again. Returns how many of the
    /// [`COLL_PARTS`] it compiled (0: all were cached); an error where they are not all in the
    /// cache afterwards (no cache folder, or one that cannot be written). `p2p-bench kernels`
    /// runs it.
    ///
    /// ```no_run
    /// let compiled = p2p_collective::Communicator::precompile("sm_90")?;
    /// # Ok::<(), p2p_collective::Error>(())
    /// ```
    pub fn precompile(arch: &str) -> Result<usize> {
        Ok(kernels::cache_all(&COLL_PARTS, arch)?)
    }

    /// One communicator per GPU in `devices`, all in this process (like `ncclCommInitAll`):
    /// rank r is `devices[r]`. Options come from the `P2P_*` environment.
    ///
    /// Where every pair of GPUs has direct P2P the ranks reach each other's workspaces by plain
    /// pointer (peer access); where a pair has none, or with `P2P_DISABLE=1`, every workspace
    /// lives in pinned host memory instead (host-staged: correct, and slower). The choice and
    /// its reason are logged; [`sharing`](Self::sharing) says which.
    ///
    /// ```no_run
    /// use p2p_collective::{Communicator, DataType, RedOp};
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Stream};
    /// let gpus = Device::all()?;
    /// let comms = Communicator::init_all(&gpus)?;
    /// let streams = gpus.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let mut bufs = gpus
    ///     .iter()
    ///     .map(|g| DeviceBuffer::from_host(g, &[1.0f32; 1024]))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// // Calls never block the host: issue every rank's from one thread, or one thread each.
    /// for ((comm, buf), stream) in comms.iter().zip(&mut bufs).zip(&streams) {
    ///     comm.all_reduce_in_place(buf, 1024, DataType::F32, RedOp::Sum, stream)?;
    /// }
    /// for (comm, stream) in comms.iter().zip(&streams) {
    ///     comm.synchronize(stream)?;
    /// }
    /// assert_eq!(bufs[0].to_host_vec::<f32>()?[0], gpus.len() as f32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn init_all(devices: &[Device]) -> Result<Vec<Communicator>> {
        Self::init_all_with(devices, Options::from_env()?)
    }

    /// As [`init_all`](Self::init_all), with explicit options.
    pub fn init_all_with(devices: &[Device], options: Options) -> Result<Vec<Communicator>> {
        let world = devices.len();
        check_world(world)?;
        let mut pairs = Vec::new();
        for a in devices {
            // Ranks on one GPU reach each other's memory without P2P: only pairs of GPUs.
            for b in devices.iter().filter(|b| *b != a) {
                pairs.push(PairP2p::probe(a, b)?);
            }
        }
        let uuids: Vec<[u8; 16]> = devices.iter().map(|d| *d.uuid()).collect();
        let share = warn_shared_gpus(&uuids, |r| Some(devices[r].ordinal()));
        if let Some(advice) = (share > 1).then(few_queues).flatten() {
            p2p_transport::warn_user!("{advice}");
        }
        peer::limit_to_level(&options.transport, &mut pairs)?;
        warn_unused_settings(&options.transport, true);
        let (sharing, why) = peer::choose(&options.transport, true, &pairs);
        if sharing == Sharing::Pointer {
            for (i, a) in devices.iter().enumerate() {
                for b in devices.iter().filter(|b| *b != a) {
                    a.enable_peer_access(b).map_err(|e| Error::InvalidArgument {
                        op: "init_all",
                        rank: i,
                        what: format!(
                            "GPU {} cannot enable peer access to GPU {} ({e}); P2P_DISABLE=1 runs the collectives through host memory instead (see `p2p-bench doctor`)",
                            a.ordinal(),
                            b.ordinal()
                        ),
                    })?;
                }
            }
        }
        let mut loaded = Vec::with_capacity(world);
        for d in devices {
            loaded.push(Kernels::for_device(d)?);
        }
        let sms = devices.iter().map(|d| d.sm_count()).min().unwrap_or(1);
        let per_sm = loaded.iter().map(|k| k.blocks_per_sm).min().unwrap_or(1);
        let tuning = options.tuning.unwrap_or_else(|| {
            warn_occupancy(per_sm);
            Tuning::for_device(sms, per_sm)
        });
        check_tuning(&tuning, sms, per_sm, world, 0, options.timeout)?;
        let tuning = tuning.shared_by(share);
        let bytes = workspace_bytes(world, &tuning);
        log_tuning(&tuning, bytes);
        let mut workspaces = Vec::with_capacity(world);
        for d in devices {
            workspaces.push(Arc::new(LocalRegion::allocate(d, bytes, sharing)?));
        }
        let abort = AbortHandle::new(&devices[0])?;
        let mut bases = [0u64; MAX_RANKS];
        for (r, w) in workspaces.iter().enumerate() {
            // Device pointers with peer access, or pinned host memory: both are UVA addresses
            // that every GPU of the process reaches.
            bases[r] = w.device_ptr();
        }
        log_sharing(
            devices
                .iter()
                .enumerate()
                .map(|(r, d)| format!("{r}[GPU {}]", d.ordinal()))
                .collect(),
            sharing,
            &why,
        );
        let mut comms = Vec::with_capacity(world);
        for (r, d) in devices.iter().enumerate() {
            comms.push(Communicator {
                rank: r,
                world,
                device: d.clone(),
                options: options.clone(),
                tuning,
                bases,
                sharing,
                abort: abort.clone(),
                failed: Mutex::new(None),
                share,
                kernels: loaded[r].clone(),
                group: None,
                windows: RwLock::new(Vec::new()),
                window_calls: WindowCalls::new(d)?,
                side: SideStream::new(d)?,
                _peers: workspaces
                    .iter()
                    .enumerate()
                    .filter(|(p, _)| *p != r)
                    .map(|(_, w)| PeerMemory::Local(w.clone()))
                    .collect(),
                workspace: workspaces[r].clone(),
            });
        }
        Ok(comms)
    }

    /// This process's rank of a communicator with one process per GPU, from the environment
    /// `p2p-bench launch` (and torchrun) set: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, the job's
    /// identity and secret (see [`Rendezvous::from_vars`]); the GPU is `LOCAL_RANK` (or the only
    /// visible one). A peer that dies later is reported by every call as
    /// [`Error::PeerFailed`] or [`Error::Unusable`], naming it.
    ///
    /// ```no_run
    /// // Run as `p2p-bench launch -n 2 -- ./my-program`.
    /// use p2p_collective::{Communicator, DataType, RedOp};
    /// use p2p_mem::{DeviceBuffer, Stream};
    /// let comm = Communicator::from_env()?;
    /// let stream = Stream::new(comm.device())?;
    /// let mut buf = DeviceBuffer::from_host(comm.device(), &[comm.rank() as f32; 256])?;
    /// comm.all_reduce_in_place(&mut buf, 256, DataType::F32, RedOp::Max, &stream)?;
    /// comm.synchronize(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_env() -> Result<Communicator> {
        let rv = Rendezvous::from_env()?;
        // A launcher that gives each process one GPU (CUDA_VISIBLE_DEVICES) leaves device 0.
        let visible = Device::count()? as usize;
        let ordinal = if visible == 1 { 0 } else { rv.local_rank };
        if ordinal >= visible {
            return Err(Error::Bootstrap {
                rank: rv.rank,
                why: format!(
                    "LOCAL_RANK={} but this process sees {visible} GPU(s): start at most one rank per GPU",
                    rv.local_rank
                ),
            });
        }
        let device = Device::new(ordinal as i32)?;
        Self::init(&device, &rv, Options::from_env()?)
    }

    /// Joins the communicator described by `rv` with `device` as this rank's GPU. Returns once
    /// every rank has joined and mapped every other rank's workspace.
    ///
    /// The ranks share their workspaces as the peer layer chooses
    /// ([`p2p_transport::peer::choose`]): cuMem fds passed over Unix sockets by default, legacy
    /// IPC with `P2P_CUMEM=0`, pinned host memory with `P2P_DISABLE=1` or where a pair of GPUs
    /// has no P2P. Every rank proposes; the weakest proposal wins, so all ranks agree.
    pub fn init(device: &Device, rv: &Rendezvous, options: Options) -> Result<Communicator> {
        // A peer's death found by the group (in its exchanges or barriers) is this layer's
        // PeerFailed, like a death found anywhere else in init.
        Self::init_in_job(device, rv, options).map_err(|e| e.peer_failure_in("init"))
    }

    fn init_in_job(device: &Device, rv: &Rendezvous, options: Options) -> Result<Communicator> {
        check_world(rv.world)?;
        let rank = rv.rank;
        // Join the job first: from then on a peer's death anywhere in init (or later) is
        // found at once through the group, not by a time limit.
        let abort = AbortHandle::new(device)?;
        // The kernels load (tens of milliseconds) while the ranks meet, so that a peer's death
        // during the load is found within a millisecond, not after it.
        let loading = KernelLoad::start(device);
        let group = Group::join(rv)?;
        group.watch(&abort);
        let kernels = loading.wait(&group, rank)?;
        let tuning = options.tuning.unwrap_or_else(|| {
            warn_occupancy(kernels.blocks_per_sm);
            Tuning::for_device(device.sm_count(), kernels.blocks_per_sm)
        });
        check_tuning(
            &tuning,
            device.sm_count(),
            kernels.blocks_per_sm,
            rv.world,
            rank,
            options.timeout,
        )?;
        // Workspace handles travel over Unix sockets (fds need them): one listener per rank in a
        // private directory, its path in the group's first exchange.
        let dir = PrivateDir::new("coll")?;
        let listener = FdListener::bind(&dir.path().join("ws"))?;
        let host = p2p_transport::hostname();
        let path = listener.path().to_string_lossy().into_owned();
        let planner = planner_words(&options);
        let blob = Introduction {
            host: host.clone(),
            path,
            uuid: *device.uuid(),
            tuning: tuning.to_words(),
            planner,
        }
        .encode();
        let all = group.all_gather(&blob)?;
        let fail = |why: String| Error::Bootstrap { rank, why };
        let mut paths = Vec::with_capacity(rv.world);
        let mut pairs = Vec::new();
        let mut uuids = Vec::with_capacity(rv.world);
        for (r, b) in all.iter().enumerate() {
            let Introduction {
                host: their_host,
                path: their_path,
                uuid,
                tuning: theirs,
                planner: their_planner,
            } = Introduction::decode(b)
                .ok_or_else(|| fail(format!("rank {r} sent a malformed introduction")))?;
            if their_planner != planner {
                return Err(fail(format!(
                    "rank {r} plans with {}, this rank with {}: every rank needs the same P2P_ALGO and P2P_CHECK (Options::algorithm, Options::check), or ranks run different kernels for one call",
                    describe_planner_words(their_planner),
                    describe_planner_words(planner)
                )));
            }
            if theirs[..] != tuning.to_words()[..] {
                return Err(fail(format!(
                    "rank {r} plans with tuning {}, this rank with {tuning:?}: every rank needs the same GPU model and tuning",
                    Tuning::from_words(&theirs).map_or_else(|| format!("{theirs:?}"), |t| format!("{t:?}"))
                )));
            }
            if their_host != host {
                return Err(fail(format!(
                    "rank {r} runs on host {their_host:?}, this rank on {host:?}: process-per-GPU communicators need every rank on one host"
                )));
            }
            // Ranks on this rank's GPU reach its memory without P2P: only other GPUs are probed.
            if &uuid != device.uuid() {
                pairs.push(PairP2p::probe_uuid(device, &uuid)?);
            }
            uuids.push(uuid);
            paths.push(std::path::PathBuf::from(their_path));
        }
        // Every rank sees every UUID, so all divide the same tuning by the same share.
        let share = warn_shared_gpus(&uuids, |r| (r == rank).then(|| device.ordinal()));
        let tuning = tuning.shared_by(share);
        let bytes = workspace_bytes(rv.world, &tuning);
        log_tuning(&tuning, bytes);
        // Every rank proposes a sharing from its own view; the weakest wins everywhere.
        peer::limit_to_level(&options.transport, &mut pairs)?;
        if rank == 0 {
            warn_unused_settings(&options.transport, false);
        }
        let (mine, why) = peer::choose(&options.transport, false, &pairs);
        let proposals = group.all_gather(&encode_proposal(mine.code() as u16, &why))?;
        let (mut sharing, mut reason) = (mine, why);
        for (r, p) in proposals.iter().enumerate() {
            let (code, text) = decode_proposal(p)
                .ok_or_else(|| fail(format!("rank {r} sent a malformed proposal")))?;
            let theirs = u8::try_from(code)
                .ok()
                .and_then(Sharing::from_code)
                .ok_or_else(|| fail(format!("rank {r} proposed an unknown sharing")))?;
            if theirs.weaker(sharing) != sharing {
                sharing = theirs;
                reason = format!("rank {r}: {text}");
            }
        }
        let workspace = Arc::new(LocalRegion::allocate(device, bytes, sharing)?);
        let exported = workspace.export()?;
        // Send to every peer first (a connect completes in the listener's backlog), then take
        // every peer's: no rank waits on another in a cycle.
        let mut sent = Vec::with_capacity(rv.world);
        for (q, p) in paths.iter().enumerate() {
            if q != rank {
                let chan = FdChannel::connect(p).map_err(|e| {
                    fail(format!(
                        "connecting to rank {q}'s socket {}: {e}",
                        p.display()
                    ))
                })?;
                peer::send(&chan, rank, &exported)?;
                sent.push(chan);
            }
        }
        let mut bases = [0u64; MAX_RANKS];
        bases[rank] = workspace.device_ptr();
        let mut peers = Vec::new();
        let deadline = Instant::now() + options.timeout.max(Duration::from_secs(10));
        while peers.len() + 1 < rv.world {
            // Wait in short steps, so that a peer's death ends the wait at once.
            let chan = loop {
                if let Some(e) = init_failure(&group, rank) {
                    return Err(e);
                }
                if let Some(c) = listener
                    .accept_within(Duration::from_millis(5))
                    .map_err(|e| fail(format!("waiting for the peers' workspaces: {e}")))?
                {
                    break c;
                }
                if Instant::now() > deadline {
                    return Err(fail(
                        "the peers' workspaces did not arrive in time (are all ranks alive?)"
                            .into(),
                    ));
                }
            };
            // Only the job's ranks may hand this rank memory: the sender's pid (from the kernel)
            // must be the one that rank authenticated with at the rendezvous. A stranger's
            // connection is dropped, and the wait goes on.
            let pid = chan.peer_cred().map(|c| c.0).unwrap_or(0);
            let Some(r) =
                (0..rv.world).find(|&r| group.pids()[r] == pid && r != rank && bases[r] == 0)
            else {
                tracing::warn!(
                    rank,
                    "dropped a connection to this rank's workspace socket from pid {pid}, which is not a peer of this job"
                );
                continue;
            };
            let (from, e) = match peer::recv(&chan, sharing) {
                Ok(x) => x,
                Err(e) => return Err(fail(format!("rank {r}'s workspace: {e}"))),
            };
            if from != r {
                return Err(fail(format!(
                    "rank {r} (pid {pid}) sent its workspace under another rank's name"
                )));
            }
            let imported = peer::import(device, sharing, r, e)?;
            bases[r] = imported.device_ptr();
            peers.push(PeerMemory::Imported(imported));
        }
        log_sharing(
            vec![format!("{rank}[GPU {}]", device.ordinal())],
            sharing,
            &reason,
        );
        // Made before the barrier: a failure here stops this rank before its peers finish init.
        let side = SideStream::new(device)?;
        let window_calls = WindowCalls::new(device)?;
        // Every rank has mapped every workspace before anyone's kernels write into them.
        group.barrier()?;
        drop(sent);
        Ok(Communicator {
            rank,
            world: rv.world,
            device: device.clone(),
            options,
            tuning,
            bases,
            sharing,
            abort,
            failed: Mutex::new(None),
            share,
            kernels,
            group: Some(group),
            windows: RwLock::new(Vec::new()),
            window_calls,
            side,
            _peers: peers,
            workspace,
        })
    }

    /// How the ranks reach each other's memory: plain pointers (one process), cuMem fds or
    /// legacy IPC (one process per GPU), or host-staged (no P2P). Logged at init with why.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// This rank's GPU.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The most ranks of this communicator on any one GPU: 1 unless ranks share a GPU, when
    /// each rank's grids hold a 1/n share of the GPU's resident blocks ([`Tuning::shared_by`];
    /// [`tuning`](Self::tuning) is already divided).
    pub fn ranks_per_gpu(&self) -> usize {
        self.share
    }

    /// The planner's knobs.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// What the planner works from: the forced algorithm and the tuning. LL carries no call
    /// signature, so checking mode runs one-shot where LL is forced and never picks LL itself.
    fn planner_inputs(&self) -> (Option<Algorithm>, Tuning) {
        let mut tuning = self.tuning;
        if !self.options.check {
            return (self.options.algorithm, tuning);
        }
        tuning.ll_max_bytes = 0;
        // Nor the copy engines: their copies are queued whatever the first barrier finds, so
        // a mismatch found there could not stop them.
        tuning.ce_min_bytes = usize::MAX;
        tuning.ce_min_bytes_more_ranks = usize::MAX;
        tuning.ce_all_reduce_min_bytes = usize::MAX;
        let forced = match self.options.algorithm {
            Some(Algorithm::Ll) => Some(Algorithm::OneShot),
            a => a,
        };
        (forced, tuning)
    }

    /// How a call on plain (unregistered) buffers would run (algorithm, grid, pieces),
    /// without running it.
    pub fn plan(&self, call: &Call) -> Plan {
        self.plan_with(call, Access::NONE)
    }

    /// How a call would run with the buffers `access` describes (registered or not).
    pub fn plan_with(&self, call: &Call, access: Access) -> Plan {
        let (forced, tuning) = self.planner_inputs();
        plan::plan_with(
            call.op,
            call.dtype,
            call.count.max(1),
            self.world,
            forced,
            &tuning,
            access,
        )
    }

    /// Registers `buf`, this rank's part of a symmetric window, for a communicator with one
    /// process per GPU: every rank calls it, in the same order, with a buffer of the same size.
    /// Returns once every rank has registered and mapped every other rank's buffer (through
    /// CUDA IPC). Afterwards, calls whose input or output lies in the window at the same offset
    /// on every rank read and write the peers' buffers directly, with no staging copy
    /// ([`Access`]); calls on other buffers keep going through the scratch.
    ///
    /// The buffer must come from `cuMemAlloc` (a [`DeviceBuffer`](p2p_mem::DeviceBuffer), `cudaMalloc`, PyTorch's
    /// caching allocator); memory from a stream-ordered pool (cudarc's `CudaSlice`) or cuMem
    /// VMM is refused with the reason, on every rank.
    ///
    /// # Safety
    /// Peers' kernels write into and read from `buf` for as long as it is registered: it must
    /// stay allocated until [`deregister`](Self::deregister) (or this communicator's drop) on
    /// every rank, and calls that use the window must use the same offsets on every rank, as
    /// with NCCL's symmetric windows (`P2P_CHECK=1` checks the calls, not the offsets).
    ///
    /// ```no_run
    /// # use p2p_collective::{Communicator, DataType, RedOp};
    /// # use p2p_mem::{DeviceBuffer, Stream};
    /// let comm = Communicator::from_env()?;
    /// let stream = Stream::new(comm.device())?;
    /// let mut grads = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 24)?;
    /// // SAFETY: `grads` outlives the registration (deregistered below, on every rank).
    /// let reg = unsafe { comm.register(&grads)? };
    /// comm.all_reduce_in_place(&mut grads, 1 << 24, DataType::F32, RedOp::Sum, &stream)?;
    /// comm.synchronize(&stream)?;
    /// comm.deregister(reg)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[allow(unsafe_code)] // an unsafe contract (the buffer's lifetime); no unsafe inside
    pub unsafe fn register(&self, buf: &dyn DeviceMemory) -> Result<Registration> {
        let op = "register";
        self.usable(op)?;
        let Some(group) = &self.group else {
            return Err(Error::InvalidArgument {
                op,
                rank: self.rank,
                what: "this communicator drives every GPU of its process (init_all): register every rank's buffer at once with Communicator::register_all".into(),
            });
        };
        // Every rank learns every rank's outcome, so a refusal on one fails all of them at once
        // (nobody waits for a peer that gave up).
        let mine = self
            .check_registrable(buf)
            .and_then(|()| Ok(peer::export_memory(buf)?));
        let blob = match &mine {
            Ok(h) => exchange::Registration::Exported {
                len: buf.byte_len() as u64,
                header: h.header.clone(),
            },
            Err(e) => exchange::Registration::Refused(e.to_string()),
        }
        .encode();
        let all = group.all_gather(&blob)?;
        mine?;
        let fail = |why: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what: why,
        };
        let mut peers = [0u64; MAX_RANKS];
        let mut mappings = Vec::new();
        for (r, b) in all.iter().enumerate() {
            match exchange::Registration::decode(b) {
                Some(exchange::Registration::Exported { len, header }) => {
                    if len != buf.byte_len() as u64 {
                        return Err(fail(format!(
                            "rank {r} registered {len} bytes, this rank {}: every rank registers a buffer of the same size",
                            buf.byte_len()
                        )));
                    }
                    if r == self.rank {
                        peers[r] = buf.device_ptr();
                        continue;
                    }
                    let handle = peer::Exported { header, fd: None };
                    let imported = peer::import(&self.device, Sharing::LegacyIpc, r, handle)?;
                    peers[r] = imported.device_ptr();
                    mappings.push(imported);
                }
                Some(exchange::Registration::Refused(why)) => {
                    return Err(fail(format!(
                        "rank {r} could not register its buffer: {why}"
                    )))
                }
                None => return Err(fail(format!("rank {r} sent a malformed registration"))),
            }
        }
        Ok(self.add_window(buf, peers, mappings))
    }

    /// Registers one buffer per rank for the communicators of one process (made by
    /// [`init_all`](Self::init_all)): `bufs[r]` on `comms[r]` (communicators or references to
    /// them, in rank order), all the same size. The counterpart of [`register`](Self::register)
    /// for one process driving every GPU; returns one registration per rank.
    ///
    /// ```no_run
    /// use p2p_collective::{Communicator, DataType, RedOp};
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Stream};
    ///
    /// let gpus = Device::all()?;
    /// let comms = Communicator::init_all(&gpus)?;
    /// let streams = gpus.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let n = 64 << 20;
    /// let mut grads = gpus
    ///     .iter()
    ///     .map(|g| DeviceBuffer::<f32>::zeroed(g, n))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let views: Vec<&dyn DeviceMemory> = grads.iter().map(|b| b as &dyn DeviceMemory).collect();
    /// // SAFETY: `grads` outlives the registrations (deregistered below, before it is dropped).
    /// let regs = unsafe { Communicator::register_all(&comms, &views)? };
    /// for ((comm, buf), stream) in comms.iter().zip(&mut grads).zip(&streams) {
    ///     comm.all_reduce_in_place(buf, n, DataType::F32, RedOp::Sum, stream)?;
    /// }
    /// for ((comm, stream), reg) in comms.iter().zip(&streams).zip(regs) {
    ///     comm.synchronize(stream)?;
    ///     comm.deregister(reg)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// As for [`register`](Self::register): every buffer must stay allocated until it is
    /// deregistered on its rank (or the communicators are dropped).
    #[allow(unsafe_code)] // an unsafe contract (the buffers' lifetime); no unsafe inside
    pub unsafe fn register_all<C: std::borrow::Borrow<Communicator>>(
        comms: &[C],
        bufs: &[&dyn DeviceMemory],
    ) -> Result<Vec<Registration>> {
        let op = "register_all";
        let bad = |rank, what: String| Error::InvalidArgument { op, rank, what };
        let comms: Vec<&Communicator> = comms.iter().map(|c| c.borrow()).collect();
        let Some(first) = comms.first().copied() else {
            return Err(bad(0, "no communicators given".into()));
        };
        if comms.len() != first.world || bufs.len() != comms.len() {
            return Err(bad(
                0,
                format!(
                    "give every rank of the communicator ({}) and one buffer each: got {} communicators and {} buffers",
                    first.world,
                    comms.len(),
                    bufs.len()
                ),
            ));
        }
        let mut peers = [0u64; MAX_RANKS];
        for (r, (c, b)) in comms.iter().zip(bufs).enumerate() {
            if c.rank != r || c.group.is_some() || c.bases != first.bases {
                return Err(bad(
                    r,
                    "comms must be the communicators of one init_all, in rank order".into(),
                ));
            }
            c.usable(op)?;
            c.check_registrable(*b)?;
            if b.byte_len() != bufs[0].byte_len() {
                return Err(bad(
                    r,
                    format!(
                        "rank {r}'s buffer holds {} bytes, rank 0's {}: every rank registers a buffer of the same size",
                        b.byte_len(),
                        bufs[0].byte_len()
                    ),
                ));
            }
            peers[r] = b.device_ptr();
        }
        Ok(comms
            .iter()
            .zip(bufs)
            .map(|(c, b)| c.add_window(*b, peers, Vec::new()))
            .collect())
    }

    /// Ends a registration: waits for this rank's calls that may still use the window to
    /// finish, then forgets the window and unmaps the peers' buffers. Do it on every rank
    /// before the next call on that buffer, and before freeing it.
    ///
    /// The calls waited for are this rank's calls on registered buffers queued before, on
    /// whichever streams (those that read or write the peers' buffers: the direct and
    /// copy-engine plans); other work on the GPU is not waited for. Once a call on registered
    /// buffers was captured into a CUDA graph, whose replays cannot be told apart, the wait is
    /// for everything queued on the GPU instead. The wait has the limit of
    /// [`synchronize`](Self::synchronize) (the communicator's time limit plus [`SYNC_GRACE`]):
    /// past it, [`Error::StillInUse`], and the buffer stays registered (nothing was stopped:
    /// deregister again once the work has ended, or abort the communicator). In a communicator
    /// of one process per GPU, unmapping the peers' buffers then waits for the GPU as every
    /// mapping's `Drop` does (at most [`p2p_mem::DROP_WAIT`], polling; past it the mapping is
    /// left open, with an error logged, rather than pulled from under running work).
    pub fn deregister(&self, reg: Registration) -> Result<()> {
        if reg.rank != self.rank {
            return Err(Error::InvalidArgument {
                op: "deregister",
                rank: self.rank,
                what: format!("that registration belongs to rank {}", reg.rank),
            });
        }
        self.wait_windows_unused()?;
        let removed = {
            let mut windows = self.windows.write().map_err(|_| Error::InvalidArgument {
                op: "deregister",
                rank: self.rank,
                what: "the registration table's lock is poisoned".into(),
            })?;
            windows
                .iter()
                .position(|w| w.id == reg.id)
                .map(|i| windows.remove(i))
        };
        match removed {
            // Unmapped here, outside the table's lock: the mappings' own wait for the GPU
            // never holds up another thread's calls.
            Some(window) => {
                drop(window);
                Ok(())
            }
            None => Err(Error::InvalidArgument {
                op: "deregister",
                rank: self.rank,
                what: format!(
                    "{} bytes at {:#x} are not registered (deregistered twice?)",
                    reg.len, reg.ptr
                ),
            }),
        }
    }

    /// Waits, at most the limit of [`synchronize`](Self::synchronize), until no call queued so
    /// far on this rank can still use a window (see [`deregister`](Self::deregister)).
    fn wait_windows_unused(&self) -> Result<()> {
        let limit = self.options.timeout.saturating_add(SYNC_GRACE);
        let whole_gpu = self.window_calls.untracked.load(Ordering::Relaxed);
        let t = Instant::now();
        let idle = if whole_gpu {
            self.device.synchronize_within(limit)?
        } else {
            self.window_calls.done.synchronize_within(limit)?
        };
        tracing::debug!(
            rank = self.rank,
            "deregister: {} {} after {:?}",
            if whole_gpu {
                "the whole GPU (a call on registered buffers was captured into a graph, or its end was not recorded)"
            } else {
                "the last call on registered buffers"
            },
            if idle { "done" } else { "still running" },
            t.elapsed()
        );
        if idle {
            return Ok(());
        }
        Err(Error::StillInUse {
            rank: self.rank,
            device: self.device.ordinal(),
            waited: limit,
            waited_for: if whole_gpu {
                "the work queued on its GPU (a call on registered buffers was captured into a graph, whose replays are not tracked, or its end was not recorded)"
            } else {
                "its last call on registered buffers (or the work queued before it on that call's stream)"
            },
        })
    }

    /// Checks one rank's buffer before registering it.
    fn check_registrable(&self, buf: &dyn DeviceMemory) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument {
            op: "register",
            rank: self.rank,
            what,
        };
        if buf.device() != &self.device {
            return Err(bad(format!(
                "the buffer is on GPU {}, this rank's GPU is {}",
                buf.device().ordinal(),
                self.device.ordinal()
            )));
        }
        if !self.sharing.is_p2p() {
            return Err(bad(format!(
                "registered buffers are read and written across the link, and this communicator's ranks have no P2P between them (they reach each other {}): unregistered buffers work, through host memory",
                self.sharing.name()
            )));
        }
        check_peer_mappable(buf).map_err(|e| bad(e.to_string()))?;
        let (lo, hi) = (buf.device_ptr(), buf.device_ptr() + buf.byte_len() as u64);
        let windows = self
            .windows
            .read()
            .map_err(|_| bad("the registration table's lock is poisoned".into()))?;
        if let Some(w) = windows
            .iter()
            .find(|w| lo < w.base + w.len as u64 && w.base < hi)
        {
            return Err(bad(format!(
                "{} bytes at {lo:#x} overlap a registered buffer ({} bytes at {:#x}): deregister it first",
                buf.byte_len(),
                w.len,
                w.base
            )));
        }
        Ok(())
    }

    fn add_window(
        &self,
        buf: &dyn DeviceMemory,
        peers: [u64; MAX_RANKS],
        mappings: Vec<PeerRegion>,
    ) -> Registration {
        // Unique in the process, not only in this communicator, so that `deregister` never takes
        // another communicator's registration for one of its own.
        static NEXT_WINDOW: AtomicU64 = AtomicU64::new(0);
        let id = NEXT_WINDOW.fetch_add(1, Ordering::Relaxed);
        let reg = Registration {
            id,
            rank: self.rank,
            ptr: buf.device_ptr(),
            len: buf.byte_len(),
        };
        tracing::info!(
            rank = self.rank,
            "registered {} bytes at {:#x}: calls on them read and write the peers' buffers directly",
            reg.len,
            reg.ptr
        );
        if let Ok(mut w) = self.windows.write() {
            w.push(Window {
                id,
                base: reg.ptr,
                len: reg.len,
                peers,
                _mappings: mappings,
            });
        }
        reg
    }

    /// Every rank's address of the `bytes` at `ptr` if they lie in one of `windows` (at the same
    /// offset on every rank, as symmetric windows require).
    fn peers_of(&self, windows: &[Window], ptr: u64, bytes: usize) -> Option<[u64; MAX_RANKS]> {
        let w = windows
            .iter()
            .find(|w| ptr >= w.base && ptr + bytes as u64 <= w.base + w.len as u64)?;
        let off = ptr - w.base;
        let mut at = [0u64; MAX_RANKS];
        for (a, p) in at.iter_mut().zip(&w.peers).take(self.world) {
            *a = p + off;
        }
        Some(at)
    }

    /// A handle that aborts this communicator from any thread (in one process, every rank made
    /// by the same `init_all` shares it).
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Stops every running and queued call: each waiting kernel thread sees it within a few
    /// milliseconds (it reads the flag at most once every 6.4 ms), and later calls fail.
    pub fn abort(&self) {
        self.abort.abort();
    }

    /// Waits for everything queued on `stream`, then reports a call that stalled, was
    /// aborted or did not match its peers' as an error. After such an error the communicator
    /// is unusable.
    ///
    /// The wait has a limit: the communicator's time limit ([`Options`]'s `timeout`) plus
    /// [`SYNC_GRACE`], past which every call of ours has ended (each stops at its own time
    /// limit or an abort). A stream still running then holds other work (yours, queued
    /// before): that is [`Error::NotDrained`], and nothing is stopped.
    /// The report that follows reads the status words ([`check`](Self::check)) within
    /// [`SYNC_GRACE`] more.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let limit = self.options.timeout.saturating_add(SYNC_GRACE);
        match stream.synchronize_within(limit) {
            Ok(true) => self.check(),
            Ok(false) => Err(Error::NotDrained {
                rank: self.rank,
                device: self.device.ordinal(),
                waited: limit,
                aborted: self
                    .abort
                    .reason()
                    .map(|(r, why)| format!(" (the communicator was aborted by rank {r}: {why})"))
                    .unwrap_or_default(),
            }),
            Err(e) => {
                // A fault on this rank's stream: the other ranks would wait for it until their
                // time limit, so stop them now.
                self.abort
                    .abort_because(self.rank, format!("a CUDA error on its stream: {e}"));
                Err(e.into())
            }
        }
    }

    /// Reports a call that already stalled, was aborted or did not match, without waiting for
    /// the calls (what [`synchronize`](Self::synchronize) does after the stream is idle). Its
    /// read of the status words is a synchronous copy, which the driver orders after the work
    /// on the GPU's legacy default stream and blocking streams (anyone's, not p2p's): it waits
    /// for that at most [`SYNC_GRACE`], then fails with the memory layer's `Busy` error.
    pub fn check(&self) -> Result<()> {
        let mut st = [0u64; STATUS_WORDS];
        // Bounded: the read is a synchronous copy, ordered after the work of the GPU's legacy
        // default stream and blocking streams, which may be anyone's.
        self.workspace
            .copy_range_to_host_within(STATUS_OFF * 8, &mut st, SYNC_GRACE)?;
        if st[0] == 0 {
            return Ok(());
        }
        let op = match st[1] as usize {
            crate::abi::K_SEND => "send".to_string(),
            crate::abi::K_RECV | crate::abi::K_RECV_ORDER => "recv".to_string(),
            code => Kind::from_code(code as u64)
                .map(|k| k.op().name().to_string())
                .unwrap_or_else(|| "a collective".into()),
        };
        let (peer, block) = (st[2] as usize, st[3]);
        let err = match (st[0], self.abort.reason()) {
            (c, Some((failed, why))) if c == F_ABORT as u64 && failed != self.rank => {
                Error::PeerFailed {
                    op,
                    rank: self.rank,
                    peer: failed,
                    why,
                }
            }
            (c, _) => self.kernel_error(c, op, peer, block, &st),
        };
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| err.to_string());
        }
        Err(err)
    }

    /// The error a kernel's status words describe.
    fn kernel_error(&self, code: u64, op: String, peer: usize, block: u64, st: &[u64]) -> Error {
        match code {
            c if c == F_MISMATCH as u64 && st[1] == crate::abi::K_RECV_ORDER as u64 => {
                Error::Mismatch {
                    op,
                    rank: self.rank,
                    peer,
                    mine: format!("a recv as its message {} from rank {peer}", st[4]),
                    theirs: format!(
                        "a send as its message {} to rank {} (the order or number of messages between the two ranks differs)",
                        st[5], self.rank
                    ),
                }
            }
            c if c == F_MISMATCH as u64 && op == "recv" => Error::Mismatch {
                op,
                rank: self.rank,
                peer,
                mine: format!("recv of {} bytes", st[4]),
                theirs: format!("send of {} bytes", st[5]),
            },
            c if c == F_MISMATCH as u64 => Error::Mismatch {
                op,
                rank: self.rank,
                peer,
                mine: plan::describe(st[4]),
                theirs: plan::describe(st[5]),
            },
            code => Error::Stalled {
                op,
                rank: self.rank,
                device: self.device.ordinal(),
                peer,
                block,
                why: match code {
                    c if c == F_TIMEOUT as u64 => {
                        let mut why = format!("timed out after {:?}", self.options.timeout);
                        if self.share > 1 && self.group.is_none() {
                            if let Some(advice) = few_queues() {
                                why = format!("{why} (maybe not a peer's fault: {advice})");
                            }
                        }
                        why
                    }
                    c if c == F_ABORT as u64 => match self.abort.reason() {
                        Some((_, why)) => format!("was aborted ({why})"),
                        None => match self.abort.kernel_failure() {
                            Some(f) => format!("was stopped ({f}, on this process)"),
                            None => "was aborted".into(),
                        },
                    },
                    c => format!("failed (kernel status {c})"),
                },
            },
        }
    }

    /// Before queueing `op` on `stream`: the communicator is usable and the stream is on this
    /// rank's GPU.
    pub(crate) fn ready_on(&self, op: &'static str, stream: &Stream) -> Result<()> {
        self.usable(op)?;
        if stream.device() != &self.device {
            return Err(Error::InvalidArgument {
                op,
                rank: self.rank,
                what: format!(
                    "the stream is on GPU {}, this rank's GPU is {}",
                    stream.device().ordinal(),
                    self.device.ordinal()
                ),
            });
        }
        Ok(())
    }

    /// The `what` buffer of `op` is on this rank's GPU and holds `len` elements of `dtype`.
    pub(crate) fn check_region(
        &self,
        op: &'static str,
        what: &str,
        region: &Region<'_>,
        len: usize,
        dtype: DataType,
    ) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what,
        };
        if region.device != &self.device {
            return Err(bad(format!(
                "the {what} buffer is on GPU {}, this rank's GPU is {}",
                region.device.ordinal(),
                self.device.ordinal()
            )));
        }
        let need = len * dtype.size();
        if region.bytes < need {
            return Err(bad(format!(
                "the {what} buffer holds {} bytes; {len} elements of {dtype} need {need}",
                region.bytes
            )));
        }
        Ok(())
    }

    fn usable(&self, op: &'static str) -> Result<()> {
        if self.abort.is_aborted() {
            return Err(Error::Unusable {
                op,
                rank: self.rank,
                why: match self.abort.reason() {
                    Some((r, why)) if r != self.rank => format!("rank {r} failed: {why}"),
                    Some((_, why)) => format!("it was aborted: {why}"),
                    None => "it was aborted".into(),
                },
            });
        }
        if let Some(why) = self.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(Error::Unusable {
                op,
                rank: self.rank,
                why,
            });
        }
        Ok(())
    }

    /// Runs `call` out of place: reads `send`, writes `recv`. Buffers a rank does not use
    /// (the non-roots' `send` of a broadcast, `recv` of a reduce) are not touched.
    ///
    /// The buffers of a reduction (all-reduce, reduce, reduce-scatter) must start at a multiple
    /// of their element's size ([`Error::InvalidArgument`] otherwise, before anything is
    /// queued); the collectives that only move data copy bytes and are not checked. Buffers or
    /// ranks' parts off a 16-byte boundary take kernels that realign their copies.
    pub fn call(
        &self,
        call: &Call,
        send: &dyn DeviceMemory,
        recv: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        let op = call.op.name();
        check_element(op, self.rank, call.dtype, "send", send)?;
        check_element(op, self.rank, call.dtype, "receive", &*recv)?;
        let input = Region::of(send, stream)?;
        let output = Region::of(recv, stream)?;
        self.enqueue(call, input, output, stream)
    }

    /// Runs `call` in place in `buf`, as NCCL defines it: for all-gather this rank's input is
    /// its part (`buf[rank * count..]`) of the output; for reduce-scatter its result lands in
    /// its part of the input.
    pub fn call_in_place(
        &self,
        call: &Call,
        buf: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        check_element(call.op.name(), self.rank, call.dtype, "in-place", &*buf)?;
        let (input, output) = self.in_place(call, Region::of(buf, stream)?);
        self.enqueue(call, input, output, stream)
    }

    /// The input and output regions of `call` run in place in `whole`.
    pub(crate) fn in_place<'a>(&self, call: &Call, whole: Region<'a>) -> (Region<'a>, Region<'a>) {
        // Saturating: a count too large for the buffer is refused by `check_call` afterwards.
        let part_off = self
            .rank
            .saturating_mul(call.count)
            .saturating_mul(call.dtype.size());
        let part = Region {
            ptr: whole.ptr.saturating_add(part_off as u64),
            bytes: whole.bytes.saturating_sub(part_off),
            device: whole.device,
        };
        match call.op {
            Op::AllGather => (part, whole),
            Op::ReduceScatter => (whole, part),
            _ => (whole, whole),
        }
    }

    /// Checks `call`'s arguments: its input and output lengths in elements, or `None` for a
    /// call with nothing to do (count 0).
    pub(crate) fn check_call(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
    ) -> Result<Option<(usize, usize)>> {
        let op = call.op.name();
        let bad = |what: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what,
        };
        if call.op.rooted() && call.root >= self.world {
            return Err(bad(format!(
                "root {} is out of range: there are {} ranks",
                call.root, self.world
            )));
        }
        if call.count == 0 {
            return Ok(None);
        }
        if call.count >= 1 << 40
            || call
                .count
                .checked_mul(self.world * call.dtype.size())
                .is_none()
        {
            return Err(bad(format!("count {} is too large", call.count)));
        }
        let (in_len, out_len) = call
            .op
            .buffer_lens(call.count, self.world, self.rank, call.root);
        let size = call.dtype.size() as u64;
        for (what, region, len) in [("send", input, in_len), ("recv", output, out_len)] {
            if len > 0 {
                self.check_region(op, what, region, len, call.dtype)?;
                // The reductions load whole elements: one off its element's alignment would
                // stop the kernel with a misaligned-address fault, which ends the context. (The
                // collectives that only move data copy bytes, at any address.)
                if call.op.reduces() && region.ptr % size != 0 {
                    return Err(bad(format!(
                        "the {what} buffer starts at {:#x}, not a multiple of {size} bytes (the size of {}): \
                         reductions need buffers aligned to their element type",
                        region.ptr, call.dtype
                    )));
                }
            }
        }
        Ok(Some((in_len, out_len)))
    }

    pub(crate) fn enqueue(
        &self,
        call: &Call,
        input: Region<'_>,
        output: Region<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let op = call.op.name();
        self.ready_on(op, stream)?;
        let Some((in_len, out_len)) = self.check_call(call, &input, &output)? else {
            return Ok(());
        };
        let size = call.dtype.size();
        let (forced, tuning) = self.planner_inputs();
        // One read of the registration table per call (the common case: empty).
        let (in_peers, out_peers) = match self.windows.read() {
            Ok(w) if !w.is_empty() => (
                self.peers_of(&w, input.ptr, in_len * size),
                self.peers_of(&w, output.ptr, out_len * size),
            ),
            _ => (None, None),
        };
        let overlap = input.ptr < output.ptr + (out_len * size) as u64
            && output.ptr < input.ptr + (in_len * size) as u64;
        // An all-gather is in place only with its input exactly this rank's part of the output
        // (the copy engines' plan copies no own part then). Any other overlap (undefined, as
        // in NCCL; only unsafe code can make one) takes the scratch path: the direct and
        // copy-engine plans assume separate buffers.
        let (in_place, partial) = match call.op {
            Op::AllGather => {
                let exact = input.ptr == output.ptr + (self.rank * in_len * size) as u64;
                (exact, overlap && !exact)
            }
            _ => (overlap, false),
        };
        let access = Access {
            input: in_peers.is_some() && !partial,
            output: out_peers.is_some() && !partial,
            in_place,
        };
        let p = plan::plan_with(
            call.op, call.dtype, call.count, self.world, forced, &tuning, access,
        );
        let redop = if call.op.reduces() {
            call.redop.code()
        } else {
            0
        };
        let root = if call.op.rooted() { call.root } else { 0 };
        let mut args = CollArgs {
            input: input.ptr,
            output: output.ptr,
            abort_flag: self.abort.device_ptr(),
            count: p.units,
            piece: p.piece,
            sub: p.sub,
            slot_bytes: self.tuning.slot_bytes() as u64,
            stride: self.tuning.piece_bytes as u64,
            timeout_ns: self
                .options
                .timeout
                .min(crate::settings::MAX_TIMEOUT)
                .as_nanos() as u64,
            sig: plan::signature(p.kind, call.dtype, redop, root, call.count),
            kind: p.kind as i32,
            redop,
            rank: self.rank as i32,
            nranks: self.world as i32,
            root: root as i32,
            check: self.options.check as i32,
            ..CollArgs::default()
        };
        for r in 0..self.world {
            args.sync[r] = self.bases[r];
            args.scratch[r] = self.bases[r] + SYNC_BYTES as u64;
        }
        if p.kind.is_direct() {
            args.peer_in = in_peers.unwrap_or_default();
            args.peer_out = out_peers.unwrap_or_default();
        }
        tracing::debug!(
            rank = self.rank,
            "{op} {} {} x {}: {:?}, {} blocks of {} threads x {} chunks ({}){}",
            call.dtype,
            call.count,
            size,
            p.kind,
            p.grid,
            p.threads,
            p.chunks,
            p.reason,
            if p.own_by_copy_engine && !partial {
                "; own part by the copy engine beside the kernel (out of place, large)"
            } else {
                ""
            }
        );
        // LL runs one 8-byte unit per thread: a piece larger than the block would drop units.
        debug_assert!(!p.kind.is_ll() || p.piece <= p.threads as u64, "{p:?}");
        if p.kind.is_ce() {
            let peers = out_peers.ok_or_else(|| Error::InvalidArgument {
                op,
                rank: self.rank,
                what: "a copy-engine plan without a registered output".into(),
            })?;
            let queued = self.enqueue_ce(call, &p, &input, &output, peers, &mut args, stream);
            // After the join: the side stream's copies are behind it on `stream` too.
            self.window_calls.queued(self.rank, stream);
            return queued;
        }
        // Parts or buffers off a 16-byte boundary (3 ranks of a power-of-two count, say): the
        // `_shift` kernels' copies realign their words there (perf-notes §44).
        let off16 = (call.count * size) % 16 != 0 || input.ptr % 16 != 0 || output.ptr % 16 != 0;
        let family = Family::of(p.kind, self.world, off16);
        if family == Family::Shift {
            tracing::debug!(
                rank = self.rank,
                "{op}: a part or a buffer lies off a 16-byte boundary: the kernel whose copies realign their words"
            );
        }
        let function = self.kernels.function(family, p.kernel_type);
        // A partial overlap (undefined; only unsafe code makes one) keeps the kernel's copy.
        let queued = if !p.own_by_copy_engine || partial {
            self.launch(function, (p.grid, p.threads), &mut args, stream)
        } else {
            self.launch_beside_own_copy(call, &input, &output, function, &p, &mut args, stream)
        };
        if p.kind.is_direct() {
            // It reads or writes the peers' registered buffers (`peer_in`, `peer_out`).
            self.window_calls.queued(self.rank, stream);
        }
        self.abort_on_error(op, queued)
    }

    /// After an error queueing a call's work: the peers may already be waiting for this rank's
    /// kernel (or barrier), so stop them now rather than at their time limit.
    pub(crate) fn abort_on_error(&self, op: &str, queued: Result<()>) -> Result<()> {
        if let Err(e) = &queued {
            self.abort.abort_because(
                self.rank,
                format!("queueing {op} failed, so its peers would wait for this rank: {e}"),
            );
        }
        queued
    }

    /// The kernel of an out-of-place all-gather or all-to-all through the scratch, with this
    /// rank's own part copied by the copy engine on the side stream beside it
    /// (`Plan::own_by_copy_engine`).
    #[allow(clippy::too_many_arguments)]
    fn launch_beside_own_copy(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
        function: Kernel<'_>,
        p: &Plan,
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        args.own_done = 1;
        let side = self.side.fork(stream)?;
        // The fork orders the copy after the caller's earlier work on `stream`; the kernel on
        // `stream` neither reads the destination nor writes the source (`own_done`).
        let queued = self
            .copy_own_part(call, input, output, side)
            .and_then(|()| self.launch(function, (p.grid, p.threads), args, stream));
        // Joined whatever happened, so that `stream` waits for the copy and a capture ends with
        // its fork joined.
        let joined = self.side.join(stream);
        queued.and(joined)
    }

    /// Queues on `side` the copy of this rank's own part of an out-of-place all-gather or
    /// all-to-all (its input; part `rank` of an all-to-all's input) into part `rank` of its
    /// output.
    fn copy_own_part(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
        side: &Stream,
    ) -> Result<()> {
        let seg = (call.count * call.dtype.size()) as u64;
        let mine = self.rank as u64 * seg;
        let src = match call.op {
            Op::AllToAll => input.ptr + mine,
            _ => input.ptr,
        };
        // SAFETY: `check_call` found the input and output long enough for the call (an
        // all-to-all's input and output and an all-gather's output hold `world` parts of `seg`
        // bytes, an all-gather's input one), so both ranges lie inside them; they do not overlap
        // (the own part is copied only out of place, never for a partial overlap: `enqueue`).
        #[allow(unsafe_code)]
        let copied = unsafe { p2p_mem::copy_async(output.ptr + mine, src, seg as usize, side) };
        copied.map_err(Error::from)
    }

    /// A copy-engine plan (`Kind::is_ce`: all-gather and all-to-all on any world size, all-reduce
    /// on two ranks): a barrier kernel (every rank has entered
    /// the call, so every buffer is free), then [`queue_ce`](Self::queue_ce). The barriers are
    /// the direct kernel with no data.
    #[allow(clippy::too_many_arguments)]
    fn enqueue_ce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        output: &Region<'_>,
        peers: [u64; MAX_RANKS],
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        // The direct kernel with no data, under the plan's own kind (so that a failure in a
        // barrier names this collective).
        let mut barrier_args = CollArgs {
            kind: p.kind as i32,
            count: 0,
            piece: 1,
            peer_out: peers,
            ..*args
        };
        let barrier = self.kernels.function(Family::Direct, DataType::U8);
        let mut run_barrier = || self.launch(barrier, (1, THREADS), &mut barrier_args, stream);
        // The peers wait for this rank's first barrier, its copies and its second barrier: an
        // error queueing any of them stops every rank rather than leaving them to their time
        // limit.
        let queued = run_barrier()
            .and_then(|()| self.queue_ce(call, p, input, output, &peers, args, stream))
            .and_then(|()| {
                if p.kind == Kind::AllReduceCe {
                    Ok(())
                } else {
                    run_barrier()
                }
            });
        self.abort_on_error(call.op.name(), queued)
    }

    /// The work of [`enqueue_ce`](Self::enqueue_ce) after its first barrier, on the caller's
    /// stream and the side stream:
    /// - all-gather and all-to-all: this rank's part (its input; its part `q` of the input for
    ///   an all-to-all) into part `rank` of every peer's output, one `cuMemcpyAsync` each (with
    ///   `Tuning::ce_streams` 2, its second half on the side stream beside the first), and out
    ///   of place its own part into its own output on the side stream (first there); the
    ///   caller then queues a second barrier (every peer's copy into this rank's output
    ///   has finished: each peer runs it after its copies);
    /// - all-reduce (two ranks): the reduce kernel on the side stream, then the input into the
    ///   peer's output in [`plan::CE_CHUNKS`] chunks, each followed by a stream write of 1 into
    ///   the peer's flag for it, which the peer's reduce kernel waits for; the side stream
    ///   clears this rank's flags after its kernel. No second barrier: this rank's call ends
    ///   when every chunk of the peer's has landed and been reduced.
    #[allow(clippy::too_many_arguments)]
    fn queue_ce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        output: &Region<'_>,
        peers: &[u64; MAX_RANKS],
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        let me = self.rank;
        let seg = (call.count * call.dtype.size()) as u64;
        let part = |q: usize| match call.op {
            Op::AllToAll => input.ptr + q as u64 * seg,
            _ => input.ptr,
        };
        // Out of place, this rank's own part is one more copy, on the side stream beside the
        // peers' (first there: a local copy, it ends long before the peer copies).
        let own = p.kind != Kind::AllReduceCe && part(me) != output.ptr + me as u64 * seg;
        // With two streams, each peer copy's second half goes on the side stream
        // (`Tuning::ce_streams`), from a 4 KiB boundary.
        let half = if self.tuning.ce_streams > 1 {
            seg / 2 / 4096 * 4096
        } else {
            seg
        };
        if p.kind != Kind::AllReduceCe && !own && half == seg {
            return self.queue_ce_copies(seg, &part, peers, (0, seg), stream);
        }
        let side = self.side.fork(stream)?;
        let queued = if p.kind == Kind::AllReduceCe {
            self.queue_ce_all_reduce(call, p, input, peers, args, side, stream)
        } else {
            // (An all-gather here is out of place with its buffers apart: `enqueue` plans no
            // copy engines for a partial overlap; an all-to-all in place is never planned here.)
            let own_copied = if own {
                self.copy_own_part(call, input, output, side)
            } else {
                Ok(())
            };
            own_copied
                .and_then(|()| self.queue_ce_copies(seg, &part, peers, (half, seg), side))
                .and_then(|()| self.queue_ce_copies(seg, &part, peers, (0, half), stream))
        };
        // Joined whatever happened: the caller's stream must wait for whatever reached the side
        // stream (a reduce kernel writing the output, a copy reading the input), and a capture
        // must end with its fork joined.
        let joined = self.side.join(stream);
        queued.and(joined)
    }

    /// The copies of an all-gather or all-to-all by the copy engines: bytes `[lo, hi)` of this
    /// rank's part `q` (`part(q)`, `seg` bytes) into part `rank` of every peer q's output.
    #[allow(unsafe_code)]
    fn queue_ce_copies(
        &self,
        seg: u64,
        part: &dyn Fn(usize) -> u64,
        peers: &[u64; MAX_RANKS],
        (lo, hi): (u64, u64),
        stream: &Stream,
    ) -> Result<()> {
        let me = self.rank;
        if lo >= hi {
            return Ok(());
        }
        debug_assert!(hi <= seg);
        // Staggered, so that the ranks spread over their targets.
        for k in 1..self.world {
            let q = (me + k) % self.world;
            // SAFETY: `check_call` found the source long enough for the call, and every rank
            // registered an output of the same length (the window `peers` came from, which
            // holds this rank's whole output), so bytes [lo, hi) (hi <= seg) of part `me` of
            // rank q's output lie inside rank q's registered buffer, which stays mapped while
            // registered; they do not overlap this rank's source. On the success path the
            // first barrier kept every rank from copying before all had entered the call, and
            // the second keeps each rank's later work from starting before every copy into its
            // buffer has run. If the first barrier fails (a time limit, an abort, an earlier
            // failure), the copies still run: they stay inside the registered buffers, whose
            // contents are then undefined (documented on `Tuning::ce_min_bytes`), as after any
            // failed collective.
            unsafe {
                p2p_mem::copy_async(
                    peers[q] + me as u64 * seg + lo,
                    part(q) + lo,
                    (hi - lo) as usize,
                    stream,
                )
            }?;
        }
        Ok(())
    }

    /// The all-reduce by the copy engines after its barrier: the reduce kernel and the clearing
    /// of this rank's flags on `side`, the chunk copies into the peer's output and the flag
    /// writes into the peer's sync area on `stream`.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    fn queue_ce_all_reduce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        peers: &[u64; MAX_RANKS],
        args: &mut CollArgs,
        side: &Stream,
        stream: &Stream,
    ) -> Result<()> {
        let (me, size) = (self.rank, call.dtype.size());
        let peer = 1 - me;
        let reduce = self
            .kernels
            .function(Family::of(p.kind, self.world, false), p.kernel_type);
        self.launch(reduce, (p.grid, p.threads), args, side)?;
        let flags = |r: usize| self.bases[r] + (crate::abi::CE_FLAGS_OFF * 8) as u64;
        // SAFETY: CE_CHUNKS words of this rank's own sync area (`coll_abi.h` keeps them inside
        // it: asserted at the top of this file). On the success path the peer has written all
        // of them when the reduce kernel before this memset ends, and writes them again only
        // after the next call's barrier, which this rank enters after this memset (the join
        // orders it before anything later on `stream`). After a failed call (the kernel ended
        // early) a peer's write may land after the memset and leave a stale flag; a failure is
        // permanent (the communicator refuses every later call), so no kernel reads it.
        unsafe { p2p_mem::memset_async(flags(me), 0, plan::CE_CHUNKS * 8, side) }?;
        for k in 0..plan::CE_CHUNKS {
            let (lo, hi) = plan::ce_chunk(k, p.units, size);
            let (off, len) = (lo * size as u64, ((hi - lo) * size as u64) as usize);
            // SAFETY: `check_call` found the input and output `units` elements long, and every
            // rank registered an output of the same length (the window `peers` came from), so
            // chunk k lies inside this rank's input and the peer's registered output, which
            // stays mapped while registered; the call is out of place (the planner's
            // condition), so they do not overlap. On the success path the barrier before kept
            // this rank from writing the peer's output before the peer entered the call; if
            // that barrier fails, the copies still run, inside the peer's registered output,
            // whose contents are then undefined (documented on `Tuning::ce_min_bytes`).
            unsafe { p2p_mem::copy_async(peers[peer] + off, input.ptr + off, len, stream) }?;
            // SAFETY: word k of the peer's CE flags, in its sync area, mapped here for as long
            // as this communicator lives; written after the copy in stream order (also after a
            // failed barrier: see the memset above for why a stale flag is harmless).
            unsafe { p2p_mem::write_u64_async(flags(peer) + 8 * k as u64, 1, stream) }?;
        }
        Ok(())
    }

    /// All-reduce `count` elements of `send` into `recv` on every rank.
    pub fn all_reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::AllReduce, dtype, count).redop(redop),
            send,
            recv,
            stream,
        )
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::AllReduce, dtype, count).redop(redop),
            buf,
            stream,
        )
    }

    /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
    pub fn broadcast(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::Broadcast, dtype, count).root(root),
            send,
            recv,
            stream,
        )
    }

    /// Broadcast in place: `root`'s `buf` into every rank's `buf`.
    pub fn broadcast_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::Broadcast, dtype, count).root(root),
            buf,
            stream,
        )
    }

    /// Reduce every rank's `send` into `root`'s `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::Reduce, dtype, count).redop(redop).root(root),
            send,
            recv,
            stream,
        )
    }

    /// Reduce in place into `root`'s `buf`.
    pub fn reduce_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::Reduce, dtype, count).redop(redop).root(root),
            buf,
            stream,
        )
    }

    /// Gather every rank's `count` elements into every rank's `recv` (`world * count`), in rank order.
    pub fn all_gather(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call(&Call::new(Op::AllGather, dtype, count), send, recv, stream)
    }

    /// All-gather in place: this rank's input is `buf[rank * count..][..count]`.
    pub fn all_gather_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(&Call::new(Op::AllGather, dtype, count), buf, stream)
    }

    /// Reduce every rank's `send` (`world * count`) and give rank r part r (`count`) in `recv`.
    pub fn reduce_scatter(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::ReduceScatter, dtype, count).redop(redop),
            send,
            recv,
            stream,
        )
    }

    /// Reduce-scatter in place: the result lands in `buf[rank * count..][..count]`.
    pub fn reduce_scatter_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::ReduceScatter, dtype, count).redop(redop),
            buf,
            stream,
        )
    }

    /// Send part q (`count` elements) of `send` to rank q; receive rank p's part r into part p of `recv`.
    pub fn all_to_all(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call(&Call::new(Op::AllToAll, dtype, count), send, recv, stream)
    }

    /// All-to-all in place.
    pub fn all_to_all_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(&Call::new(Op::AllToAll, dtype, count), buf, stream)
    }
}

impl Communicator {
    /// Launches one collective kernel on `stream`: overlapped with the previous kernel on the
    /// stream (programmatic dependent launch), unless ranks share this GPU. There a kernel
    /// scheduled early would hold SM slots, waiting for its predecessor, that a peer rank's
    /// kernel on the same GPU needs to start: the predecessor waits for that peer, and the
    /// three would stall until the time limit (seen on one H100 with two ranks).
    #[allow(unsafe_code)]
    fn launch(
        &self,
        Kernel { module, function }: Kernel<'_>,
        (grid, threads): (u32, u32),
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        let mut params = [(args as *mut CollArgs).cast::<c_void>()];
        // SAFETY: `CollArgs` matches the kernel's one by-value parameter field for field. Its
        // pointers are this call's validated buffers (lengths checked against the plan), the
        // workspaces of every rank (alive while this communicator is, which synchronises
        // before freeing them) and the pinned abort flag (held by `self.abort`). The kernel
        // runs `griddepcontrol.wait` before touching any memory, as an overlapped launch
        // requires (and which a plain launch makes a no-op).
        unsafe {
            if self.share > 1 {
                module.launch(function, grid, threads, &mut params, stream)
            } else {
                module.launch_overlapped(function, grid, threads, &mut params, stream)
            }
        }?;
        Ok(())
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Kernels still running may write into peers' workspaces or wait on them: let them end
        // (at worst at their time limit), then let every process get here before memory goes.
        // Every wait has a deadline: past the time limit the calls are aborted; if the device is
        // still busy after that (someone else's endless kernel), the memory is leaked rather
        // than freed under a running kernel.
        let limit = self.options.timeout + Duration::from_secs(2);
        let t = std::time::Instant::now();
        let idle = wait_idle(&self.device, limit)
            || {
                tracing::error!(
                rank = self.rank,
                "GPU {} still busy {limit:?} after the communicator was dropped: aborting its calls",
                self.device.ordinal()
            );
                self.abort.abort_because(
                    self.rank,
                    "the communicator was dropped while its calls still ran",
                );
                wait_idle(&self.device, Duration::from_secs(5))
            };
        if !idle {
            tracing::error!(
                rank = self.rank,
                bytes = self.workspace.byte_len(),
                "GPU {} is still busy: leaking this rank's workspace ({} bytes) and its {} peer mappings rather than freeing memory a kernel may use",
                self.device.ordinal(),
                self.workspace.byte_len(),
                self._peers.len()
            );
            std::mem::forget(std::mem::take(&mut self._peers));
            std::mem::forget(self.workspace.clone());
        }
        tracing::debug!(
            rank = self.rank,
            "dropping the communicator: GPU {} {} after {:?}",
            self.device.ordinal(),
            if idle { "idle" } else { "still busy" },
            t.elapsed()
        );
        if let Some(g) = &self.group {
            // Fails at once if a rank is known to have failed.
            if let Err(e) = g.barrier() {
                tracing::warn!(rank = self.rank, "the closing barrier failed: {e}");
            }
        }
    }
}

/// Waits until `device` has no work left, at most `limit`: whether it got there. Polls an
/// event that holds all of the device's queued work ([`Device::synchronize_within`]; on a
/// CUDA 12.4 driver, a helper thread).
fn wait_idle(device: &Device, limit: Duration) -> bool {
    match device.synchronize_within(limit) {
        Ok(idle) => idle,
        Err(e) => {
            // A sticky CUDA error: nothing more will run on this context.
            tracing::error!("synchronising GPU {} before freeing: {e}", device.ordinal());
            true
        }
    }
}

/// The settings besides the tuning that the planner reads, as the words that ranks of a
/// process-per-GPU communicator compare at start-up: the forced algorithm (`P2P_ALGO`; its
/// position in [`Algorithm::NAMES`], 0 for `auto`) and checking mode (`P2P_CHECK`), which
/// turns LL and the copy engines off.
fn planner_words(options: &Options) -> [u64; 2] {
    let algorithm = Algorithm::NAMES
        .iter()
        .position(|(_, a)| *a == options.algorithm)
        .unwrap_or(0);
    [algorithm as u64, options.check as u64]
}

/// `planner_words` in words, e.g. `P2P_ALGO=ring P2P_CHECK=0`.
fn describe_planner_words([algorithm, check]: [u64; 2]) -> String {
    let name = usize::try_from(algorithm)
        .ok()
        .and_then(|i| Algorithm::NAMES.get(i))
        .map_or("(unknown)", |(name, _)| *name);
    format!("P2P_ALGO={name} P2P_CHECK={check}")
}

/// Refuses tuning values the kernels cannot run with (see [`Tuning::validate`]).
fn check_tuning(
    t: &Tuning,
    sms: i32,
    per_sm: i32,
    world: usize,
    rank: usize,
    timeout: Duration,
) -> Result<()> {
    if timeout.is_zero() || timeout > crate::settings::MAX_TIMEOUT {
        return Err(Error::InvalidArgument {
            op: "init",
            rank,
            what: format!(
                "Options::timeout = {timeout:?}: it must be above zero and at most {:?}",
                crate::settings::MAX_TIMEOUT
            ),
        });
    }
    let resident = (sms.max(1) as u32).saturating_mul(per_sm.max(1) as u32);
    t.validate(resident, world)
        .map_err(|what| Error::InvalidArgument {
            op: "init",
            rank,
            what: format!("Options::tuning: {what}"),
        })
}

/// The most ranks on any one GPU, from every rank's GPU UUID.
fn most_ranks_on_one_gpu(uuids: &[[u8; 16]]) -> usize {
    uuids
        .iter()
        .map(|u| uuids.iter().filter(|v| *v == u).count())
        .max()
        .unwrap_or(1)
}

/// Where ranks share a GPU, says so (which ranks, on which GPU, and what it costs) and returns
/// the most ranks on one GPU. `ordinal(r)` is rank r's GPU as this process numbers it, or
/// `None` for a rank of another process: a group of ranks is named by its first rank this
/// process drives.
fn warn_shared_gpus(uuids: &[[u8; 16]], ordinal: impl Fn(usize) -> Option<i32>) -> usize {
    let share = most_ranks_on_one_gpu(uuids);
    let mut named = Vec::new();
    for (r, u) in uuids.iter().enumerate() {
        let ranks: Vec<usize> = (0..uuids.len()).filter(|&q| uuids[q] == *u).collect();
        let Some(gpu) = ordinal(r) else { continue };
        if ranks.len() > 1 && !named.contains(u) {
            named.push(*u);
            p2p_transport::warn_user!(
                "ranks {ranks:?} share GPU {gpu}: their kernels run side by side (one process) or \
                 time-sliced (one process each), each rank with 1/{share} of the GPU's blocks; \
                 correct but slow, meant for development on fewer GPUs than ranks"
            );
        }
    }
    share
}

/// Ranks of one process that share a GPU need a hardware queue per stream; [`queue_advice`]
/// for this process's `CUDA_DEVICE_MAX_CONNECTIONS`.
fn few_queues() -> Option<String> {
    queue_advice(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().as_deref())
}

/// What to do where `CUDA_DEVICE_MAX_CONNECTIONS` (`None`: unset) is below 32: with CUDA's
/// default of 8 hardware queues two ranks' streams can land on one, and a rank's kernel then
/// waits behind another rank's waiting kernel until the time limit.
fn queue_advice(value: Option<&str>) -> Option<String> {
    let queues = value
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(8);
    (queues < 32).then(|| {
        format!(
            "ranks of this process share a GPU and CUDA_DEVICE_MAX_CONNECTIONS is {}: a rank's kernel can queue behind another rank's waiting one until the time limit; set it to 32 before the first CUDA call",
            value.map_or("unset (8 queues)".to_string(), |v| format!("{v:?}"))
        )
    })
}

/// The planner assumes two resident blocks per SM; fewer halves every grid (and large
/// collectives lose up to 20 %), so say so where it happens.
fn warn_occupancy(blocks_per_sm: i32) {
    if blocks_per_sm < 2 {
        p2p_transport::warn_user!(
            "collective kernels fit {blocks_per_sm} block(s) of {THREADS} threads per SM, not 2: grids are halved and large collectives run slower"
        );
    }
}

/// Logs how the ranks `who` (each as `rank[GPU ordinal]`) reach their peers, and why.
fn log_sharing(who: Vec<String>, sharing: Sharing, why: &str) {
    tracing::info!(
        "ranks {} reach every peer via {} ({why})",
        who.join(", "),
        sharing.name()
    );
}

fn log_tuning(t: &Tuning, workspace: usize) {
    tracing::info!(
        "collectives plan with up to {} blocks x {} threads, {} KiB pieces; workspace {} MiB per rank",
        t.max_blocks,
        THREADS,
        t.piece_bytes >> 10,
        workspace >> 20
    );
}

/// Transport settings that the collectives do not use, each with why: a user who sets one
/// expecting it to change the collectives is told so (once per communicator, by rank 0) instead
/// of being ignored silently.
fn unused_settings(cfg: &Config, one_process: bool) -> Vec<String> {
    use p2p_transport::config::{ForcedMode, Switch};
    let mut out = Vec::new();
    if cfg.read != Switch::Auto {
        let v = if cfg.read == Switch::On { "on" } else { "off" };
        out.push(format!("P2P_READ={v} (the collective kernels read and write peer memory as each algorithm needs)"));
    }
    if cfg.use_copy_engine {
        out.push("P2P_USE_COPY_ENGINE=1 (the collectives move data with their own kernels; the copy engines only for large all-gathers and all-to-alls on registered buffers, Tuning::ce_min_bytes and ce_min_bytes_more_ranks)".into());
    }
    if !cfg.intermediate {
        out.push("P2P_INTERMEDIATE=0 (the collectives never relay through a third GPU)".into());
    }
    match cfg.force_mode {
        Some(ForcedMode::Intermediate) => out.push(
            "P2P_MODE=intermediate (the collectives never relay through a third GPU; without P2P they go host-staged)".into(),
        ),
        Some(ForcedMode::Direct) if !one_process => out.push(
            "P2P_MODE=direct (ranks in different processes share memory with cuMem fds or legacy IPC)".into(),
        ),
        Some(m @ (ForcedMode::Ipc | ForcedMode::CuMem)) if one_process => out.push(format!(
            "P2P_MODE={} (one process shares plain pointers: IPC handles cannot be opened in the process that made them)",
            if m == ForcedMode::Ipc { "ipc" } else { "cumem" }
        )),
        _ => {}
    }
    if cfg.direct_disable && one_process {
        out.push("P2P_DIRECT_DISABLE=1 (one process shares plain pointers: IPC handles cannot be opened in the process that made them)".into());
    }
    out
}

fn warn_unused_settings(cfg: &Config, one_process: bool) {
    for what in unused_settings(cfg, one_process) {
        p2p_transport::warn_user!("not used by the collectives: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::{
        describe_planner_words, most_ranks_on_one_gpu, planner_words, queue_advice,
        unused_settings, warn_shared_gpus, Options,
    };
    use crate::settings::Algorithm;
    use p2p_transport::config::Config;

    #[test]
    fn the_shipped_cubins_are_those_of_the_sources() {
        let t = std::time::Instant::now();
        let wrong = p2p_mem::kernel::shipped::check(&super::COLL_PARTS);
        assert!(
            wrong.is_empty(),
            "run `cargo xtask kernels` (the kernels changed since their cubins were shipped): {wrong:?}"
        );
        eprintln!("checked the shipped archive in {:?}", t.elapsed());
    }

    /// The `_shift` kernels run only all-gather, all-to-all and reduce-scatter through the
    /// scratch (coll.cu returns at once from every other kind, and its peers would wait): the
    /// host picks them for those kinds off a 16-byte boundary, and for nothing else.
    #[test]
    fn the_shift_kernels_are_picked_only_off_a_boundary_and_only_for_the_kinds_they_run() {
        use super::Family;
        use crate::plan::Kind;
        let shifted = [Kind::AllGather, Kind::AllToAll, Kind::ReduceScatter];
        for kind in Kind::ALL {
            for world in 2..=8 {
                let aligned = Family::of(kind, world, false);
                assert_ne!(aligned, Family::Shift, "{kind:?} on {world} ranks, aligned");
                let off = Family::of(kind, world, true);
                if shifted.contains(&kind) {
                    assert_eq!(aligned, Family::Steps, "{kind:?}");
                    assert_eq!(
                        off,
                        Family::Shift,
                        "{kind:?} on {world} ranks, off a boundary"
                    );
                } else {
                    assert_eq!(off, aligned, "{kind:?} on {world} ranks: its family stays");
                }
            }
        }
    }

    #[test]
    fn ranks_sharing_a_gpu_in_one_process_are_told_to_raise_the_hardware_queues() {
        let unset = queue_advice(None).expect("8 queues by default");
        assert!(unset.contains("unset (8 queues)"), "{unset}");
        assert!(unset.contains("set it to 32"), "{unset}");
        assert!(queue_advice(Some("8")).is_some_and(|a| a.contains("is \"8\"")));
        assert!(queue_advice(Some("junk")).is_some());
        assert_eq!(queue_advice(Some("32")), None);
        assert_eq!(queue_advice(Some(" 32 ")), None);
    }

    #[test]
    fn the_most_ranks_on_one_gpu_sizes_every_ranks_grid() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(most_ranks_on_one_gpu(&[]), 1);
        assert_eq!(most_ranks_on_one_gpu(&[a]), 1);
        assert_eq!(most_ranks_on_one_gpu(&[a, b]), 1);
        assert_eq!(most_ranks_on_one_gpu(&[a, a]), 2);
        // Three ranks on one GPU and one on another: every rank divides by 3.
        assert_eq!(most_ranks_on_one_gpu(&[a, b, a, a]), 3);
        assert_eq!(most_ranks_on_one_gpu(&[a, b, b, a]), 2);
        // The warning's share is the same whichever ranks this process drives.
        assert_eq!(warn_shared_gpus(&[a, b, a, a], |r| Some(r as i32)), 3);
        assert_eq!(
            warn_shared_gpus(&[a, b, a, a], |r| (r == 1).then_some(0)),
            3
        );
    }

    #[test]
    fn ranks_compare_the_forced_algorithm_and_checking_mode() {
        let auto = Options::from_settings(Default::default(), Config::default());
        assert_eq!(planner_words(&auto), [0, 0]);
        let mut seen = vec![planner_words(&auto)];
        for (name, algorithm) in Algorithm::NAMES.into_iter().skip(1) {
            let forced = Options {
                algorithm,
                ..auto.clone()
            };
            let w = planner_words(&forced);
            assert!(!seen.contains(&w), "{name}: {w:?} taken");
            assert_eq!(
                describe_planner_words(w),
                format!("P2P_ALGO={name} P2P_CHECK=0")
            );
            seen.push(w);
        }
        let check = Options {
            check: true,
            ..auto.clone()
        };
        assert_ne!(planner_words(&check), planner_words(&auto));
        assert_eq!(
            describe_planner_words(planner_words(&check)),
            "P2P_ALGO=auto P2P_CHECK=1"
        );
        assert_eq!(
            describe_planner_words([99, 0]),
            "P2P_ALGO=(unknown) P2P_CHECK=0"
        );
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .expect("valid settings")
    }

    #[test]
    fn the_defaults_leave_nothing_unused() {
        assert!(unused_settings(&Config::default(), true).is_empty());
        assert!(unused_settings(&Config::default(), false).is_empty());
        // The settings the collectives do use are not reported.
        let used = cfg(&[
            ("P2P_LEVEL", "NVL"),
            ("P2P_CUMEM", "0"),
            ("P2P_MODE", "host"),
        ]);
        assert!(unused_settings(&used, false).is_empty());
    }

    #[test]
    fn transport_only_settings_are_named() {
        let c = cfg(&[
            ("P2P_READ", "on"),
            ("P2P_USE_COPY_ENGINE", "1"),
            ("P2P_INTERMEDIATE", "0"),
        ]);
        let unused = unused_settings(&c, false);
        assert_eq!(unused.len(), 3, "{unused:?}");
        assert!(unused[0].starts_with("P2P_READ=on"), "{unused:?}");
        assert!(unused[1].starts_with("P2P_USE_COPY_ENGINE=1"));
        assert!(unused[2].starts_with("P2P_INTERMEDIATE=0"));
    }

    #[test]
    fn forced_modes_that_cannot_apply_are_named() {
        let direct = cfg(&[("P2P_MODE", "direct")]);
        assert!(unused_settings(&direct, true).is_empty());
        assert!(unused_settings(&direct, false)[0].starts_with("P2P_MODE=direct"));
        let ipc = cfg(&[("P2P_MODE", "ipc")]);
        assert!(unused_settings(&ipc, false).is_empty());
        assert!(unused_settings(&ipc, true)[0].starts_with("P2P_MODE=ipc"));
        let relay = cfg(&[("P2P_MODE", "intermediate")]);
        assert!(unused_settings(&relay, false)[0].starts_with("P2P_MODE=intermediate"));
    }
}
