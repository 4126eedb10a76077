//! Communicators: the ranks of a collective, their registered workspaces, and the calls.
//!
//! Every rank owns one workspace: a sync area (flags, per-block step counters, the failure
//! record) and a scratch area that peers push data into. Each rank holds every peer's
//! workspace address as its own GPU sees it, mapped by the transport's peer layer
//! (`p2p_transport::peer`): a plain pointer with peer access (one process driving several
//! GPUs), a cuMem fd or legacy IPC mapping (one process per GPU), or pinned host memory
//! shared by every rank (host-staged, where GPUs have no P2P). A call validates its
//! arguments, plans (`plan.rs`) and launches one kernel (`kernels/coll/`) on the caller's
//! stream, or for the copy-engine plans barrier kernels and copies, with work forked onto the
//! communicator's second stream and joined back; it never blocks the host, so it can be
//! captured in a CUDA graph.
//!
//! Calls on one communicator must be ordered on the GPU: use one stream per rank (or order
//! streams with events). Two calls on the same communicator running at once would share step
//! counters.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use p2p_mem::kernel::Source;
use p2p_mem::{Device, DeviceMemory, Stream};
use p2p_transport::config::Config;

use crate::settings::{Algorithm, Settings};
use p2p_mem::abort::{
    AbortHandle, KERNEL_FAILED, KERNEL_FAILED_MISMATCH, KERNEL_FAILED_PEER_SHIFT,
    KERNEL_FAILED_RANK_SHIFT,
};
use p2p_transport::peer::{LocalRegion, PeerRegion, Sharing};

use crate::error::{Error, Result};
use crate::plan::{self, Access, Plan, Tuning, MAX_RANKS};
use crate::types::{DataType, Op, RedOp};
use p2p_transport::rendezvous::{Group, Rendezvous};

/// The collective kernels (`coll_f32` ... `coll_u8`, each in seven families) and the send/recv
/// kernel (`p2p_sendrecv`), in one program: `coll.cu`, one translation unit made of the
/// interface header and the parts in `src/kernels/coll/`, in this order (each part uses only
/// what the ones before it define; see that folder's README).
pub const COLL: Source = Source {
    name: "coll.cu",
    code: concat!(
        include_str!("../kernels/coll_abi.h"),
        include_str!("../kernels/coll/base.cuh"),
        include_str!("../kernels/coll/sync.cuh"),
        include_str!("../kernels/coll/copy.cuh"),
        include_str!("../kernels/coll/reduce.cuh"),
        include_str!("../kernels/coll/ll.cuh"),
        include_str!("../kernels/coll/direct.cuh"),
        include_str!("../kernels/coll/ce.cuh"),
        include_str!("../kernels/coll/pipe.cuh"),
        include_str!("../kernels/coll/steps.cuh"),
        include_str!("../kernels/coll/p2p.cuh"),
    ),
    defines: &[],
    shipped: SHIPPED,
};

/// [`COLL_PARTS`] compiled for sm_80 and sm_90 (`cargo xtask kernels`; see
/// `p2p_mem::kernel::shipped`): a communicator needs no compiler on those GPUs.
pub const SHIPPED: &[u8] = include_bytes!("../kernels/shipped.p2pk.zst");

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

pub(crate) mod calls;
mod enqueue;
mod init;
mod kernel_set;
mod register;
mod split;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use enqueue::*;
pub(crate) use init::local_device;
use init::*;
pub(crate) use kernel_set::*;
pub use register::Registration;
use register::*;

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
    /// How this rank joined (process-per-GPU communicators): what a split derives its child's
    /// rendezvous from.
    rendezvous: Option<Rendezvous>,
    /// Splits made so far: every rank splits in the same order, so the count names the split.
    splits: AtomicU64,
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

/// A peer's workspace, kept alive as long as this rank may write into it (held, never read).
#[allow(dead_code)]
enum PeerMemory {
    Local(Arc<LocalRegion>),
    Imported(PeerRegion),
}

impl Communicator {
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
