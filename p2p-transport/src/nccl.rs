//! NCCL between hosts: a communicator over ranks that may live on other hosts, through the NCCL
//! that p2p loads at run time ([`p2p_sys::nccl_rt`], NCCL 2.18 or later). It is the inter-host
//! half of `p2p_collective::MultiHostCommunicator` (see `docs/architecture.md`).
//!
//! Every NCCL communicator here is made non-blocking (`ncclConfig_t::blocking = 0`), so no call
//! waits inside NCCL: init and every collective are polled (`ncclCommGetAsyncError`) up to the
//! communicator's time limit, and a communicator past it, or failed, is aborted
//! (`ncclCommAbort`, itself waited for at most that limit) and reports which call and why.
//! Without libnccl every call is an error naming the library, never a panic.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use p2p_mem::{Device, DeviceMemory, DeviceMemoryMut, Stream};
use p2p_sys::nccl_rt::{self as nccl, ncclDataType_t, ncclRedOp_t, ncclResult_t};
use p2p_sys::Library;

use crate::error::{Error, Result};

/// The bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = nccl::NCCL_UNIQUE_ID_BYTES as usize;

/// An NCCL communicator's identity: made by one rank ([`UniqueId::new`]) and given to every
/// other (its bytes travel however the job's ranks meet). Whoever holds it can join, so it
/// travels only over channels the job trusts.
#[derive(Clone)]
pub struct UniqueId(nccl::ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed: it admits to the communicator.
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// A new id (`ncclGetUniqueId`, which also sets up NCCL's bootstrap listener).
    pub fn new() -> Result<UniqueId> {
        loaded(-1)?;
        let mut id = nccl::ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: libnccl is loaded; `id` is an out-parameter of the declared type.
        let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
        p2p_sys::check_nccl_rt("ncclGetUniqueId", r).map_err(on(-1))?;
        Ok(UniqueId(id))
    }

    /// The id's bytes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id from its bytes (`None` unless exactly [`UNIQUE_ID_BYTES`] long).
    pub fn from_bytes(bytes: &[u8]) -> Option<UniqueId> {
        let b: [u8; UNIQUE_ID_BYTES] = bytes.try_into().ok()?;
        Some(UniqueId(nccl::ncclUniqueId {
            internal: b.map(|x| x as std::ffi::c_char),
        }))
    }
}

/// One of NCCL's collectives, with what it needs beyond its buffers
/// ([`NcclComm::collective`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// `ncclAllReduce`: every rank gets the reduction of every rank's `send`.
    AllReduce(ncclRedOp_t),
    /// `ncclAllGather`: every rank's `count` elements into `recv` (`world * count`), in rank
    /// order.
    AllGather,
    /// `ncclReduceScatter`: the reduction of every rank's `send` (`world * count`), rank r
    /// getting part r (`count`).
    ReduceScatter(ncclRedOp_t),
    /// `ncclBroadcast`: `root`'s `send` into every rank's `recv`.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
    /// `ncclReduce`: the reduction of every rank's `send` into `root`'s `recv`.
    Reduce {
        /// The reduction.
        red: ncclRedOp_t,
        /// The rank that gets the result.
        root: usize,
    },
}

impl Collective {
    /// NCCL's name of the call, as errors say it.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "ncclAllReduce",
            Collective::AllGather => "ncclAllGather",
            Collective::ReduceScatter(_) => "ncclReduceScatter",
            Collective::Broadcast { .. } => "ncclBroadcast",
            Collective::Reduce { .. } => "ncclReduce",
        }
    }
}

/// One rank's NCCL communicator on one GPU. Freed on `Drop` (finalized within its time limit,
/// else aborted).
pub struct NcclComm {
    raw: nccl::ncclComm_t,
    device: Device,
    rank: usize,
    world: usize,
    timeout: Duration,
    /// Set once `ncclCommAbort` has freed the communicator: nothing may use or free it again.
    aborted: AtomicBool,
}

/// A communicator's handle moved into the thread that aborts it ([`NcclComm::abort`]).
struct RawComm(nccl::ncclComm_t);

/// Held by each `ncclCommAbort` while it runs: aborts never overlap in this process, even when
/// one is still stuck past its caller's limit (communicators launched in one group share NCCL's
/// group job, whose thread two overlapping aborts would both join).
static ONE_ABORT_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

// SAFETY: the handle is moved to one thread, for the one `ncclCommAbort` that ends its use;
// NCCL allows that call from any thread.
unsafe impl Send for RawComm {}

impl RawComm {
    /// The handle (a method, so that a closure captures the whole `Send` wrapper).
    fn get(self) -> nccl::ncclComm_t {
        self.0
    }
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; every method
// takes `&self` only for calls NCCL allows to race (none here mutate the handle) and the handle
// is freed once: in `Drop`, or by the one `ncclCommAbort` of `abort` (after which every use
// checks the flag and stops).
unsafe impl Send for NcclComm {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rank, world, gpu) = (self.rank, self.world, self.device.ordinal());
        write!(f, "NcclComm(rank {rank} of {world} on GPU {gpu})")
    }
}

impl NcclComm {
    /// Joins the NCCL communicator `id` of `world` ranks as rank `rank` on `device`, waiting at
    /// most `timeout` for every rank to join (then aborting it and failing).
    pub fn init(
        device: &Device,
        id: &UniqueId,
        world: usize,
        rank: usize,
        timeout: Duration,
    ) -> Result<NcclComm> {
        let comm = Self::start(device, id, world, rank, timeout)?;
        comm.wait("init")?;
        Ok(comm)
    }

    /// The NCCL communicator of `devices`, all in this process (rank r on `devices[r]`).
    pub fn init_all(devices: &[Device], timeout: Duration) -> Result<Vec<NcclComm>> {
        let id = UniqueId::new()?;
        let world = devices.len();
        // Several ranks of one process join inside one group; each init returns at once (the
        // communicators are non-blocking) and is waited for afterwards.
        // SAFETY: libnccl is loaded (UniqueId::new checked); no arguments.
        p2p_sys::check_nccl_rt("ncclGroupStart", unsafe { nccl::ncclGroupStart() })
            .map_err(on(-1))?;
        let started: Vec<Result<NcclComm>> = devices
            .iter()
            .enumerate()
            .map(|(r, d)| Self::start(d, &id, world, r, timeout))
            .collect();
        // SAFETY: as above; closes the group opened above.
        let end = unsafe { nccl::ncclGroupEnd() };
        let comms = started.into_iter().collect::<Result<Vec<_>>>()?;
        if end != ncclResult_t::ncclInProgress {
            p2p_sys::check_nccl_rt("ncclGroupEnd", end).map_err(on(-1))?;
        }
        for c in &comms {
            c.wait("init")?;
        }
        Ok(comms)
    }

    /// `ncclCommInitRankConfig`, non-blocking: returns before the other ranks have joined.
    fn start(
        device: &Device,
        id: &UniqueId,
        world: usize,
        rank: usize,
        timeout: Duration,
    ) -> Result<NcclComm> {
        let ord = device.ordinal();
        loaded(ord)?;
        if world == 0 || rank >= world || world > i32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "NCCL rank {rank} of {world}: the rank must be below a world of at least one"
            )));
        }
        device.bind_to_thread()?;
        let mut config = non_blocking_config();
        let mut raw = std::ptr::null_mut();
        // SAFETY: libnccl is loaded; `raw` and `config` are valid for the call (NCCL copies the
        // config); this device's context is current, which NCCL binds the communicator to.
        let r = unsafe {
            nccl::ncclCommInitRankConfig(&mut raw, world as i32, id.0, rank as i32, &mut config)
        };
        if r != ncclResult_t::ncclInProgress {
            p2p_sys::check_nccl_rt("ncclCommInitRankConfig", r).map_err(on(ord))?;
        }
        if raw.is_null() {
            return Err(Error::InvalidArgument(format!(
                "ncclCommInitRankConfig gave no communicator on GPU {ord}"
            )));
        }
        Ok(NcclComm {
            raw,
            device: device.clone(),
            rank,
            world,
            timeout,
            aborted: AtomicBool::new(false),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The communicator's asynchronous state: `Ok(true)` ready, `Ok(false)` an operation still
    /// in progress, or the failure (`ncclCommGetAsyncError`).
    fn ready(&self, op: &'static str) -> Result<bool> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(self.failed(op, "the communicator was aborted earlier".into()));
        }
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: the communicator is alive; `state` is an out-parameter.
        let r = unsafe { nccl::ncclCommGetAsyncError(self.raw, &mut state) };
        p2p_sys::check_nccl_rt("ncclCommGetAsyncError", r).map_err(on(self.device.ordinal()))?;
        if state == ncclResult_t::ncclInProgress {
            return Ok(false);
        }
        p2p_sys::check_nccl_rt(op, state).map_err(|e| self.failed(op, e.to_string()))?;
        Ok(true)
    }

    /// Polls until the communicator's operations in progress have finished being issued, at
    /// most its time limit; past it, or on a failure, aborts it.
    fn wait(&self, op: &'static str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.ready(op) {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Ok(false) => {
                    self.abort();
                    return Err(self.failed(
                        op,
                        format!(
                            "still in progress after {:?} (are all ranks alive and calling it?)",
                            self.timeout
                        ),
                    ));
                }
                Err(e) => {
                    self.abort();
                    return Err(e);
                }
            }
        }
    }

    /// Aborts the communicator (once): its operations stop, its resources are freed, and later
    /// calls fail. Returns within the communicator's time limit: `ncclCommAbort` has no
    /// deadline of its own (it can wait for the communicator's other ranks on this host, or for
    /// its proxy thread), so it runs in a helper thread, one abort of this process at a time;
    /// one past the limit is logged and left to finish there, holding the communicator's
    /// resources until it does or the process ends (a process that then exits should leave by
    /// `_exit`, not through NCCL's and CUDA's exit handlers).
    pub fn abort(&self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        let (comm, rank, gpu, limit) = (
            RawComm(self.raw),
            self.rank,
            self.device.ordinal(),
            self.timeout,
        );
        // The thread holds the GPU (its context) until the abort has returned, even when this
        // communicator is dropped before.
        let device = self.device.clone();
        let aborted = p2p_mem::in_thread_within("p2p-nccl-abort", limit, move || {
            let _alone = ONE_ABORT_AT_A_TIME
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // SAFETY: the communicator is alive and aborted once (the flag above); nothing
            // else uses the handle after (every use checks the flag first, Drop included).
            let r = unsafe { nccl::ncclCommAbort(comm.get()) };
            drop(device);
            r
        });
        match aborted {
            Ok(r) => {
                if let Err(e) = p2p_sys::check_nccl_rt("ncclCommAbort", r) {
                    tracing::error!(rank, gpu, "aborting an NCCL communicator: {e}");
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::error!(
                rank,
                gpu,
                "ncclCommAbort on rank {rank} (GPU {gpu}) did not return within {limit:?}: left to finish in a helper thread (p2p-nccl-abort), which holds the communicator's resources until it does or the process exits"
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => tracing::error!(
                rank,
                gpu,
                "ncclCommAbort on rank {rank} (GPU {gpu}): its helper thread ended without an answer"
            ),
        }
    }

    /// Whether the communicator has failed since its last call (`ncclCommGetAsyncError`).
    pub fn check(&self) -> Result<()> {
        self.ready("a queued operation").map(|_| ())
    }

    fn failed(&self, op: &'static str, why: String) -> Error {
        Error::NcclFailed {
            op,
            rank: self.rank,
            device: self.device.ordinal(),
            why,
        }
    }

    /// Checks that `mem` holds `count` elements of `dtype` on this communicator's GPU.
    fn fits(
        &self,
        op: &'static str,
        what: &str,
        mem: &impl DeviceMemory,
        count: usize,
        dtype: ncclDataType_t,
    ) -> Result<()> {
        let bytes = count.checked_mul(element_bytes(dtype)?).ok_or_else(|| {
            Error::InvalidArgument(format!("NCCL {op}: {count} elements overflow"))
        })?;
        if mem.device() != &self.device || mem.byte_len() < bytes {
            return Err(Error::InvalidArgument(format!(
                "NCCL {op}: the {what} buffer ({} bytes on GPU {}) must hold {bytes} bytes on GPU {}",
                mem.byte_len(),
                mem.device().ordinal(),
                self.device.ordinal()
            )));
        }
        Ok(())
    }

    /// Issues `which` of `count` elements of `dtype` (`count` as NCCL counts it: per rank for
    /// all-gather and reduce-scatter, the whole buffer otherwise) from `send` into `recv` on
    /// `stream`. Both buffers are checked to hold what NCCL will touch on this GPU (the root's
    /// buffer of a broadcast or reduce only on the root: elsewhere it may be any buffer of this
    /// GPU, however small), and `stream` to be on it; a result of `ncclInProgress` is waited
    /// for.
    ///
    /// ```no_run
    /// # fn demo(nccl: &p2p_transport::nccl::NcclComm, send: &p2p_mem::DeviceBuffer<f32>,
    /// #         recv: &mut p2p_mem::DeviceBuffer<f32>, stream: &p2p_mem::Stream)
    /// #         -> p2p_transport::Result<()> {
    /// use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};
    /// use p2p_transport::nccl::Collective;
    /// let sum = Collective::AllReduce(ncclRedOp_t::ncclSum);
    /// nccl.collective(sum, send, recv, send.len(), ncclDataType_t::ncclFloat32, stream)
    /// # }
    /// ```
    pub fn collective(
        &self,
        which: Collective,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: ncclDataType_t,
        stream: &Stream,
    ) -> Result<()> {
        let op = which.name();
        let all = count.saturating_mul(self.world);
        let on_root = |root: usize| if self.rank == root { count } else { 0 };
        let (send_count, recv_count) = match which {
            Collective::AllReduce(_) => (count, count),
            Collective::AllGather => (count, all),
            Collective::ReduceScatter(_) => (all, count),
            Collective::Broadcast { root } => {
                self.check_peer(op, root)?;
                (on_root(root), count)
            }
            Collective::Reduce { root, .. } => {
                self.check_peer(op, root)?;
                (count, on_root(root))
            }
        };
        self.ready_to_issue(op, stream)?;
        self.fits(op, "send", send, send_count, dtype)?;
        self.fits(op, "recv", recv, recv_count, dtype)?;
        self.device.bind_to_thread()?;
        let (s, r) = (
            send.device_ptr() as *const c_void,
            recv.device_ptr() as *mut c_void,
        );
        let (comm, st) = (self.raw, stream.cu_stream());
        // SAFETY: both buffers were checked above to hold what NCCL touches on this GPU, the
        // stream to be on it and the communicator to be live (not aborted); the roots are
        // ranks of the communicator; the `DeviceMemory` contract keeps the buffers allocated
        // while the stream runs.
        let result = unsafe {
            match which {
                Collective::AllReduce(red) => {
                    nccl::ncclAllReduce(s, r, count, dtype, red, comm, st)
                }
                Collective::AllGather => nccl::ncclAllGather(s, r, count, dtype, comm, st),
                Collective::ReduceScatter(red) => {
                    nccl::ncclReduceScatter(s, r, count, dtype, red, comm, st)
                }
                Collective::Broadcast { root } => {
                    nccl::ncclBroadcast(s, r, count, dtype, root as i32, comm, st)
                }
                Collective::Reduce { red, root } => {
                    nccl::ncclReduce(s, r, count, dtype, red, root as i32, comm, st)
                }
            }
        };
        self.issued(op, result)
    }

    /// An error if this communicator was aborted or `stream` is on another GPU.
    fn ready_to_issue(&self, op: &'static str, stream: &Stream) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(self.failed(op, "the communicator was aborted earlier".into()));
        }
        if stream.device() != &self.device {
            return Err(Error::InvalidArgument(format!(
                "NCCL {op}: the stream is on GPU {}, the communicator's GPU is {}",
                stream.device().ordinal(),
                self.device.ordinal()
            )));
        }
        Ok(())
    }

    /// What an issuing call returned: waited for where still in progress, else checked.
    fn issued(&self, op: &'static str, result: ncclResult_t) -> Result<()> {
        match result {
            r if r == ncclResult_t::ncclInProgress => self.wait(op),
            r => p2p_sys::check_nccl_rt(op, r).map_err(|e| self.failed(op, e.to_string())),
        }
    }

    /// Sends `count` elements of `send` to rank `peer` (`ncclSend`), which receives them with
    /// [`recv`](Self::recv). Several sends and receives that must progress together (an
    /// all-to-all) go inside one [`group`].
    pub fn send(
        &self,
        send: &impl DeviceMemory,
        count: usize,
        dtype: ncclDataType_t,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer("send", peer)?;
        self.issue_one("ncclSend", send, count, dtype, stream, |p, comm, st| {
            // SAFETY: as `issue_one` says; `peer` is a rank of the communicator.
            unsafe { nccl::ncclSend(p, count, dtype, peer as i32, comm, st) }
        })
    }

    /// Receives `count` elements from rank `peer` into `recv` (`ncclRecv`).
    pub fn recv(
        &self,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: ncclDataType_t,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer("recv", peer)?;
        self.issue_one("ncclRecv", recv, count, dtype, stream, |p, comm, st| {
            // SAFETY: as `issue_one` says (the memory is writable: `recv` is
            // DeviceMemoryMut); `peer` is a rank of the communicator.
            unsafe { nccl::ncclRecv(p.cast_mut(), count, dtype, peer as i32, comm, st) }
        })
    }

    /// An error unless `peer` is a rank of this communicator.
    fn check_peer(&self, op: &str, peer: usize) -> Result<()> {
        check_rank(op, peer, self.world)
    }

    /// Issues a call on one buffer (send or receive), checked as
    /// [`collective`](Self::collective) checks its buffers; `call` gets the address, the
    /// communicator and the stream, which it passes to NCCL (its `unsafe` rests on these checks).
    fn issue_one(
        &self,
        op: &'static str,
        mem: &impl DeviceMemory,
        count: usize,
        dtype: ncclDataType_t,
        stream: &Stream,
        call: impl FnOnce(*const c_void, nccl::ncclComm_t, nccl::cudaStream_t) -> ncclResult_t,
    ) -> Result<()> {
        self.ready_to_issue(op, stream)?;
        self.fits(op, "data", mem, count, dtype)?;
        self.device.bind_to_thread()?;
        let r = call(
            mem.device_ptr() as *const c_void,
            self.raw,
            stream.cu_stream(),
        );
        self.issued(op, r)
    }
}

/// Issues the NCCL calls `calls` makes (on `comms`, ranks of this process) as one group
/// (`ncclGroupStart` / `ncclGroupEnd`), as NCCL needs when one thread drives several ranks,
/// then waits, within each communicator's time limit, until every one has issued its part.
///
/// The group ends whatever `calls` does, a panic included. If `calls` fails after issuing some
/// ranks' parts (a later rank's arguments refused), those parts would wait for the missing ones
/// forever: every communicator of `comms` is then aborted, and the error returned.
pub fn group<R>(comms: &[NcclComm], calls: impl FnOnce() -> Result<R>) -> Result<R> {
    loaded(-1)?;
    /// Ends the group when dropped (also while unwinding), once.
    struct Open(bool);
    impl Open {
        fn end(&mut self) -> ncclResult_t {
            self.0 = false;
            // SAFETY: libnccl is loaded; closes the group this guard opened.
            unsafe { nccl::ncclGroupEnd() }
        }
    }
    impl Drop for Open {
        fn drop(&mut self) {
            if self.0 {
                let _ = self.end();
            }
        }
    }
    // SAFETY: libnccl is loaded; the guard below closes the group on every path.
    p2p_sys::check_nccl_rt("ncclGroupStart", unsafe { nccl::ncclGroupStart() }).map_err(on(-1))?;
    let mut open = Open(true);
    let out = calls();
    let end = open.end();
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            comms.iter().for_each(NcclComm::abort);
            return Err(e);
        }
    };
    if end != ncclResult_t::ncclInProgress {
        p2p_sys::check_nccl_rt("ncclGroupEnd", end).map_err(on(-1))?;
    }
    for c in comms {
        c.wait("a group")?;
    }
    Ok(out)
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.aborted.load(Ordering::SeqCst) {
            return; // ncclCommAbort freed it
        }
        let _ = self.device.bind_to_thread();
        // Finalize (flushes the communicator's work) within its time limit, then destroy; a
        // failure or a finalize past the limit aborts instead (in `wait`, or here).
        // SAFETY: the communicator is alive and finalized once.
        let r = unsafe { nccl::ncclCommFinalize(self.raw) };
        let started = r == ncclResult_t::ncclInProgress
            || p2p_sys::check_nccl_rt("ncclCommFinalize", r).is_ok();
        if !(started && self.wait("ncclCommFinalize").is_ok()) {
            self.abort(); // at most once: a no-op where `wait` aborted already
            return;
        }
        // SAFETY: finalized above, destroyed once, never aborted.
        let r = unsafe { nccl::ncclCommDestroy(self.raw) };
        if let Err(e) = p2p_sys::check_nccl_rt("ncclCommDestroy", r) {
            tracing::error!(rank = self.rank, "freeing an NCCL communicator: {e}");
        }
    }
}

/// A non-blocking configuration (what `NCCL_CONFIG_INITIALIZER` makes, with `blocking = 0`).
fn non_blocking_config() -> nccl::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    nccl::ncclConfig_t {
        size: std::mem::size_of::<nccl::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 18, 3) of the headers these bindings come from.
        version: 2 * 10_000 + 18 * 100 + 3,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
    }
}

/// The refusal unless `peer` is one of `world` ranks, naming the call's root (broadcast,
/// reduce) or peer (send, recv).
fn check_rank(op: &str, peer: usize, world: usize) -> Result<()> {
    if peer >= world {
        let role = if matches!(op, "broadcast" | "reduce" | "ncclBroadcast" | "ncclReduce") {
            "root"
        } else {
            "peer"
        };
        return Err(Error::InvalidArgument(format!(
            "NCCL {op}: {role} {peer} is not one of the {world} ranks"
        )));
    }
    Ok(())
}

/// Bytes of one element of `dtype`.
pub fn element_bytes(dtype: ncclDataType_t) -> Result<usize> {
    use ncclDataType_t as T;
    Ok(match dtype {
        T::ncclInt8 | T::ncclUint8 => 1,
        T::ncclFloat16 | T::ncclBfloat16 => 2,
        T::ncclInt32 | T::ncclUint32 | T::ncclFloat32 => 4,
        T::ncclInt64 | T::ncclUint64 | T::ncclFloat64 => 8,
        other => {
            return Err(Error::InvalidArgument(format!(
                "NCCL data type {} is not one p2p knows",
                other.0
            )))
        }
    })
}

/// Loads libnccl (once per process), or says why it cannot: what a caller checks before it
/// plans on NCCL (a job over hosts without it is refused with this reason).
pub fn require() -> Result<()> {
    loaded(-1)
}

/// libnccl, loaded or the reason it is not (on GPU `device`, -1 for none).
fn loaded(device: i32) -> Result<()> {
    p2p_sys::probe::require(Library::Nccl)
        .map(|_| ())
        .map_err(on(device))
}

/// An NCCL call's failure as the transport's error on GPU `device` (-1: none yet).
fn on(device: i32) -> impl Fn(p2p_sys::Error) -> Error {
    move |source| Error::Cuda {
        device,
        peer: None,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_or_peer_outside_the_communicator_is_named() {
        assert!(check_rank("broadcast", 0, 1).is_ok());
        // The words gpu_nccl's refusal test looks for (it ran on a GPU with "root 1").
        let e = check_rank("broadcast", 1, 1)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("NCCL broadcast: root 1 is not one of the 1 ranks"),
            "{e}"
        );
        let e = check_rank(
            Collective::Reduce {
                red: ncclRedOp_t::ncclSum,
                root: 2,
            }
            .name(),
            2,
            2,
        );
        assert!(e.is_err_and(|e| e.to_string().contains("root 2")));
        let e = check_rank("send", 4, 4).expect_err("refused").to_string();
        assert!(e.contains("peer 4"), "{e}");
    }

    #[test]
    fn an_id_round_trips_through_its_bytes_and_only_its_length_is_accepted() {
        let bytes: Vec<u8> = (0..UNIQUE_ID_BYTES).map(|i| (i * 7) as u8).collect();
        let id = UniqueId::from_bytes(&bytes).expect("128 bytes");
        assert_eq!(id.to_bytes().to_vec(), bytes);
        assert!(UniqueId::from_bytes(&bytes[1..]).is_none());
        assert_eq!(format!("{id:?}"), "UniqueId(..)");
    }

    #[test]
    fn the_config_is_nccls_initializer_but_non_blocking() {
        let c = non_blocking_config();
        assert_eq!(c.size, std::mem::size_of::<nccl::ncclConfig_t>());
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21803, 0));
        assert_eq!(
            (c.cgaClusterSize, c.minCTAs, c.maxCTAs, c.splitShare),
            (i32::MIN, i32::MIN, i32::MIN, i32::MIN)
        );
    }

    #[test]
    fn element_sizes_follow_ncclx_types() {
        use ncclDataType_t as T;
        for (t, b) in [
            (T::ncclInt8, 1),
            (T::ncclUint8, 1),
            (T::ncclFloat16, 2),
            (T::ncclBfloat16, 2),
            (T::ncclInt32, 4),
            (T::ncclFloat32, 4),
            (T::ncclInt64, 8),
            (T::ncclFloat64, 8),
        ] {
            assert_eq!(element_bytes(t).expect("known"), b, "{t:?}");
        }
        assert!(element_bytes(T(42)).is_err());
    }

    #[test]
    fn without_libnccl_an_id_is_an_error_naming_the_library() {
        if p2p_sys::probe::require(Library::Nccl).is_ok() {
            return; // a machine with NCCL: the GPU tests cover it
        }
        let e = UniqueId::new().expect_err("no libnccl here");
        assert!(e.to_string().contains("nccl"), "{e}");
        // What a job over hosts checks first, and refuses with.
        let e = require().expect_err("no libnccl here");
        assert!(e.to_string().contains("nccl"), "{e}");
    }
}
