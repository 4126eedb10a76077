//! A communicator over ranks on several hosts: p2p's kernels inside each host, NCCL between
//! hosts.
//!
//! Every host runs the same number of ranks `L`, numbered host by host as torchrun numbers them
//! ([`HostLayout`]). Each rank holds three communicators:
//! - **local**: a process-per-GPU [`Communicator`] over its host's `L` ranks (its own rendezvous
//!   job inside the job's, [`Rendezvous::for_host`]);
//! - **rail**: an NCCL communicator over the ranks with its local rank on every host (`H` ranks,
//!   one per host), which carries what crosses hosts in the collectives below;
//! - **all**: an NCCL communicator over every rank, for all-to-all and send/recv.
//!
//! The collectives, for `n` elements per rank:
//! - all-reduce: a reduce-scatter inside the host (each rank gets a reduced shard of `n / L`),
//!   an all-reduce of the shard on the rail, an all-gather inside the host; the last
//!   `n mod L` elements by NCCL over every rank;
//! - all-gather: an all-gather on the rail (each rank's part from every host), then one
//!   all-gather inside the host per host's block;
//! - reduce-scatter: one reduce-scatter inside the host per host's block, then a reduce-scatter
//!   on the rail;
//! - broadcast: on the root's rail from the root, then inside every host from that rail's rank;
//! - reduce: inside every host to the rank on the root's rail, then on that rail to the root;
//! - all-to-all, send and recv: NCCL over every rank.
//!
//! NCCL's unique ids travel through torchrun's store (`MASTER_ADDR:MASTER_PORT`), sealed with
//! the job's key, or, where no store is named (`p2p-bench launch --hosts H`, every rank on one
//! machine), the job-wide socket ([`JobExchange`]). NCCL is loaded at run time; without it a
//! job over hosts is refused with the reason.
//!
//! Calls are queued on the caller's stream in order, as the local communicator's are; the
//! scratch memory the steps share is one buffer per communicator, so issue one communicator's
//! calls on one stream at a time (or order the streams).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use p2p_mem::abort::AbortHandle;
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, ExternalMemory, Stream};
use p2p_sys::nccl_rt::ncclRedOp_t;
use p2p_transport::nccl::{self, NcclComm, UniqueId};
use p2p_transport::rendezvous::{host_id, HostLayout, JobExchange, Rendezvous};

use crate::call::check::{check_args, Shape};
use crate::call::Buffers;
use crate::collectives::{CallBuffers, Collectives};
use crate::comm::{Communicator, Options};
use crate::error::{Error, Result};
use crate::types::{Call, DataType, Op, RedOp};

/// How often [`MultiHostCommunicator::synchronize`] looks for a failure while it waits.
const POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// How many communicators over hosts this process has made: each one's exchanges are labelled
/// with it (every rank makes them in the same order).
static MADE: AtomicUsize = AtomicUsize::new(0);

/// One rank of a communicator over several hosts (module docs).
///
/// ```no_run
/// // Two hosts of 2 GPUs: `torchrun --nnodes 2 --nproc-per-node 2 ...` on each host, or on one
/// // machine `p2p-bench launch -n 4 --hosts 2 -- ./my-program`.
/// use p2p_collective::{Collectives, DataType, MultiHostCommunicator, RedOp};
/// use p2p_mem::{DeviceBuffer, Stream};
/// let comm = MultiHostCommunicator::from_env()?;
/// let stream = Stream::new(comm.device())?;
/// let send = DeviceBuffer::from_host(comm.device(), &[comm.rank() as f32; 1024])?;
/// let mut recv = DeviceBuffer::<f32>::zeroed(comm.device(), 1024)?;
/// comm.all_reduce(&send, &mut recv, 1024, DataType::F32, RedOp::Sum, &stream)?;
/// comm.synchronize(&stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MultiHostCommunicator {
    layout: HostLayout,
    // Dropped in this order: the NCCL communicators, then the host's, then the scratch memory
    // (whose free waits for the GPU), then the exchange (the job-wide group).
    rail: NcclComm,
    all: NcclComm,
    local: Communicator,
    scratch: Mutex<Option<DeviceBuffer<u8>>>,
    /// Set by the job-wide group's monitor (where the job meets through one machine's socket)
    /// when any rank of the job fails, naming it in the job's numbering.
    job_failed: AbortHandle,
    _exchange: JobExchange,
}

impl std::fmt::Debug for MultiHostCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiHostCommunicator")
            .field("layout", &self.layout)
            .field("device", &self.local.device().ordinal())
            .finish()
    }
}

/// The NCCL-shaped calls, as [`Communicator`]'s (module docs: how each collective crosses
/// hosts); an all-to-all in place first copies `buf` aside (scratch memory).
impl Collectives for MultiHostCommunicator {
    fn queue(&self, call: &Call, buffers: CallBuffers<'_>, stream: &Stream) -> Result<()> {
        if !self.check_call(call, buffers.given(), stream)? {
            return Ok(());
        }
        match buffers {
            CallBuffers::Apart { send, recv } => {
                self.run(call, &whole(send), &whole(&*recv), stream)
            }
            CallBuffers::InPlace(buf) => self.in_place(call, &whole(&*buf), stream),
        }
        .map_err(|e| self.in_job_numbering(e))
    }
}

impl MultiHostCommunicator {
    /// Joins the job the environment describes (torchrun's `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`, or
    /// `p2p-bench launch --hosts H`'s), on GPU `LOCAL_RANK` (GPU 0 where the process sees one),
    /// with the options `P2P_*` sets.
    pub fn from_env() -> Result<MultiHostCommunicator> {
        let (job, layout) = Rendezvous::for_hosts_from_vars(|n| std::env::var(n).ok())?;
        let device = crate::comm::local_device(layout.rank, layout.local_rank)?;
        Self::init(&device, &job, &layout, Options::from_env()?)
    }

    /// Joins the whole job `job` (rank and world over every host, e.g. from
    /// [`Rendezvous::for_hosts_from_vars`]) as `layout` says, on `device`. Returns once the host's
    /// communicator and both NCCL communicators are made.
    pub fn init(
        device: &Device,
        job: &Rendezvous,
        layout: &HostLayout,
        options: Options,
    ) -> Result<MultiHostCommunicator> {
        let rank = layout.rank;
        let bootstrap = |why: String| Error::Bootstrap { rank, why };
        nccl::require().map_err(|e| {
            bootstrap(format!(
                "a job over {} hosts needs NCCL between them: {e}",
                layout.hosts
            ))
        })?;
        let n = MADE.fetch_add(1, Ordering::SeqCst);
        let mut exchange = JobExchange::open(job)?;
        check_hosts(
            layout,
            &exchange.all_gather(&format!("multihost-{n}/hosts"), host_id().as_bytes())?,
        )
        .map_err(bootstrap)?;
        // The rail's id from its rank on host 0; the whole job's from rank 0.
        let mut mine = Vec::new();
        if layout.host == 0 {
            mine.extend(UniqueId::new()?.to_bytes());
        }
        if rank == 0 {
            mine.extend(UniqueId::new()?.to_bytes());
        }
        let ids = exchange.all_gather(&format!("multihost-{n}/nccl"), &mine)?;
        let id_at = |r: usize, which: usize| {
            ids.get(r)
                .and_then(|b| b.get(which * nccl::UNIQUE_ID_BYTES..))
                .and_then(|b| b.get(..nccl::UNIQUE_ID_BYTES))
                .and_then(UniqueId::from_bytes)
                .ok_or_else(|| bootstrap(format!("rank {r} sent no NCCL id")))
        };
        let rail_id = id_at(layout.rank_of(0, layout.local_rank), 0)?;
        let all_id = id_at(0, 1)?;
        let local = Communicator::init(device, &job.for_host(layout), options)?;
        // Where the job meets through one machine's socket, its monitor learns of a rank's
        // death anywhere in the job at once: synchronize reads it here and aborts.
        let job_failed = AbortHandle::new(device)?;
        if let JobExchange::Group { group, .. } = &exchange {
            group.watch(&job_failed);
        }
        tracing::info!(
            rank,
            host = layout.host,
            hosts = layout.hosts,
            local_rank = layout.local_rank,
            "a communicator over hosts: p2p's kernels inside the host, NCCL between hosts"
        );
        let rail = NcclComm::init(device, &rail_id, layout.hosts, layout.host, job.timeout)?;
        let all = NcclComm::init(device, &all_id, layout.world, rank, job.timeout)?;
        Ok(MultiHostCommunicator {
            layout: *layout,
            rail,
            all,
            local,
            scratch: Mutex::new(None),
            job_failed,
            _exchange: exchange,
        })
    }

    /// This rank in the whole job.
    pub fn rank(&self) -> usize {
        self.layout.rank
    }

    /// Ranks in the whole job.
    pub fn world_size(&self) -> usize {
        self.layout.world
    }

    /// Where this rank sits: its host and its place there.
    pub fn layout(&self) -> &HostLayout {
        &self.layout
    }

    /// This rank's GPU.
    pub fn device(&self) -> &Device {
        self.local.device()
    }

    /// The communicator over this host's ranks (p2p's kernels).
    pub fn local(&self) -> &Communicator {
        &self.local
    }

    /// The NCCL communicator over every rank (for what p2p does not wrap, and to measure NCCL
    /// beside p2p on the same layout).
    pub fn nccl_all(&self) -> &NcclComm {
        &self.all
    }

    /// Waits for what was queued on `stream`, within the communicator's time limit (its
    /// [`Options`]' `timeout` and [`SYNC_GRACE`](crate::comm::SYNC_GRACE)), watching all the
    /// while for a failure anywhere in the job: a rank of this host (the host's communicator),
    /// any rank where the job meets through one machine's socket (its monitor), or an
    /// asynchronous NCCL error (a rank on another host that died or failed). On one, every
    /// communicator of this rank is aborted (so that nothing queued waits on) and the failure
    /// returned; the communicator is then unusable.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let limit = self
            .local
            .options()
            .timeout
            .saturating_add(crate::comm::SYNC_GRACE);
        let deadline = std::time::Instant::now() + limit;
        loop {
            let done = stream.synchronize_within(POLL)?;
            if done {
                // Everything queued ended: a failure found now concerns later calls (they
                // report it); NCCL's own errors and the host's status words are read here.
                self.check_nccl()?;
                return self.local.check().map_err(|e| self.in_job_numbering(e));
            }
            let host_failed = self
                .local
                .abort_handle()
                .reason()
                .map(|(local, why)| (self.layout.rank_of(self.layout.host, local), why));
            let elsewhere = |peer: usize| peer / self.layout.local_world != self.layout.host;
            // A death on another host, as the job's socket names it, before this host's report
            // of it (which names the rank of this host that passed it on).
            let failed = match (self.job_failed.reason(), host_failed) {
                (Some(job), _) if elsewhere(job.0) => Some(job),
                (job, host) => host.or(job),
            };
            if let Some((peer, why)) = failed {
                if elsewhere(peer) {
                    // Learnt through the job: tell this host's peers whom it concerns (their
                    // own monitors may not have heard yet).
                    self.abort_because(format!("it learnt that rank {peer} failed: {why}"));
                } else {
                    self.abort();
                }
                return Err(Error::PeerFailed {
                    op: "a call over hosts".into(),
                    failure: p2p_transport::PeerFailure {
                        rank: self.layout.rank,
                        peer,
                        why,
                    },
                });
            }
            self.check_nccl()?;
            if std::time::Instant::now() >= deadline {
                return Err(Error::NotDrained {
                    rank: self.layout.rank,
                    device: self.device().ordinal(),
                    waited: limit,
                    aborted: String::new(),
                });
            }
        }
    }

    /// Whether the host's communicator and the NCCL communicators are still well (a failure
    /// found earlier, or an asynchronous NCCL error).
    pub fn check(&self) -> Result<()> {
        self.local.check()?;
        self.rail.check()?;
        self.all.check()?;
        Ok(())
    }

    /// Both NCCL communicators' asynchronous errors; on one, every communicator of this rank is
    /// aborted and the host's peers learn why (which NCCL communicator, its error), not only
    /// that this rank stopped.
    fn check_nccl(&self) -> Result<()> {
        let found = match (self.rail.check(), self.all.check()) {
            (Err(e), _) => Some(("the rail to the other hosts (NCCL ranks are hosts)", e)),
            (Ok(()), Err(e)) => Some(("NCCL over every rank", e)),
            (Ok(()), Ok(())) => None,
        };
        match found {
            Some((which, e)) => {
                self.abort_because(format!("it found an error on {which}: {e}"));
                Err(e.into())
            }
            None => Ok(()),
        }
    }

    /// [`abort`](Self::abort), with `why` for the host's peers (they report this rank as
    /// failed, and why, instead of "aborted by the user").
    fn abort_because(&self, why: String) {
        self.local
            .abort_handle()
            .abort_because(self.layout.local_rank, why);
        self.abort();
    }

    /// Stops every communicator of this rank: the host's (its kernels and peers learn at once)
    /// and both NCCL communicators (`ncclCommAbort`, each waited for at most its time limit,
    /// `P2P_RENDEZVOUS_TIMEOUT_MS`).
    pub fn abort(&self) {
        self.local.abort();
        self.rail.abort();
        self.all.abort();
    }

    /// [`call_in_place`](Self::call_in_place) on `buf`, checked.
    fn in_place(&self, call: &Call, buf: &ExternalMemory, stream: &Stream) -> Result<()> {
        let buf = part(buf, 0, buf.byte_len())?;
        let mine = self.layout.rank * call.count * call.dtype.size();
        let part_bytes = call.count * call.dtype.size();
        match call.op {
            Op::AllGather => self.run(call, &part(&buf, mine, part_bytes)?, &buf, stream),
            Op::ReduceScatter => self.run(call, &buf, &part(&buf, mine, part_bytes)?, stream),
            Op::AllToAll => {
                let bytes = buf.byte_len();
                let (_scratch, aside) = self.scratch_part(bytes)?;
                if bytes > 0 {
                    // SAFETY: both ranges are `bytes` long on this rank's GPU (`aside` was just
                    // cut to that size from the scratch buffer, `buf` is the caller's), and do
                    // not overlap; the copy is queued on `stream`, before the calls that read it.
                    #[allow(unsafe_code)]
                    unsafe {
                        p2p_mem::copy_async(aside.device_ptr(), buf.device_ptr(), bytes, stream)?
                    };
                }
                self.all_to_all_on(&Step {
                    c: call,
                    send: &aside,
                    recv: &buf,
                    stream,
                })
            }
            _ => self.run(call, &buf, &buf, stream),
        }
    }

    /// Whether `call` with `buffers` has anything to do, after the checks every communicator
    /// makes (the job's ranks, the buffers' lengths and devices: `call::check`) and this one's
    /// own (no average of integers).
    fn check_call(&self, call: &Call, buffers: Buffers<'_>, stream: &Stream) -> Result<bool> {
        if call.op.reduces() {
            self.redop(call)?;
        }
        let shape = Shape {
            rank: self.layout.rank,
            world: self.layout.world,
            device: self.device(),
        };
        Ok(check_args(&shape, call, buffers, stream)?.is_some())
    }

    /// [`in_job_numbering`] for this rank.
    fn in_job_numbering(&self, e: Error) -> Error {
        in_job_numbering(&self.layout, e)
    }

    /// `call` (checked) from `send` into `recv`.
    fn run(
        &self,
        c: &Call,
        send: &ExternalMemory,
        recv: &ExternalMemory,
        stream: &Stream,
    ) -> Result<()> {
        let step = &Step {
            c,
            send,
            recv,
            stream,
        };
        match c.op {
            Op::AllReduce => self.all_reduce_on(step),
            Op::AllGather => self.all_gather_on(step),
            Op::ReduceScatter => self.reduce_scatter_on(step),
            Op::Broadcast => self.broadcast_on(step),
            Op::Reduce => self.reduce_on(step),
            Op::AllToAll => self.all_to_all_on(step),
        }
    }

    /// All-reduce: a reduce-scatter inside the host, an all-reduce of each rank's shard on its
    /// rail, an all-gather inside the host; the last `count mod L` elements by NCCL over every
    /// rank.
    fn all_reduce_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (es, op) = (c.dtype.size(), self.redop(c)?);
        let local = self.layout.local_world;
        let (shard, tail) = (c.count / local, c.count % local);
        if shard > 0 {
            let (_scratch, mut mine) = self.scratch_part(shard * es)?;
            let body = part(send, 0, shard * local * es)?;
            self.local
                .reduce_scatter(&body, &mut mine, shard, c.dtype, c.redop, stream)?;
            let shard_in = part(&mine, 0, shard * es)?;
            let sum = nccl::Collective::AllReduce(op);
            self.rail
                .collective(sum, &shard_in, &mut mine, shard, c.dtype.nccl(), stream)?;
            let mut out = part(recv, 0, shard * local * es)?;
            self.local
                .all_gather(&mine, &mut out, shard, c.dtype, stream)?;
        }
        if tail > 0 {
            let at = shard * local * es;
            let mut out = part(recv, at, tail * es)?;
            let t = c.dtype.nccl();
            let sum = nccl::Collective::AllReduce(op);
            let tail_in = part(send, at, tail * es)?;
            self.all
                .collective(sum, &tail_in, &mut out, tail, t, stream)?;
        }
        Ok(())
    }

    /// All-gather: each rank's part from every host on its rail, then each host's block inside
    /// the host.
    fn all_gather_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (es, n) = (c.dtype.size(), c.count);
        let (hosts, local) = (self.layout.hosts, self.layout.local_world);
        let (_scratch, mut gathered) = self.scratch_part(hosts * n * es)?;
        let t = c.dtype.nccl();
        let mine = part(send, 0, n * es)?;
        self.rail.collective(
            nccl::Collective::AllGather,
            &mine,
            &mut gathered,
            n,
            t,
            stream,
        )?;
        for h in 0..hosts {
            let mine = part(&gathered, h * n * es, n * es)?;
            let mut block = part(recv, h * local * n * es, local * n * es)?;
            self.local
                .all_gather(&mine, &mut block, n, c.dtype, stream)?;
        }
        Ok(())
    }

    /// Reduce-scatter: each host's block reduced inside the host, then across hosts on the
    /// rail.
    fn reduce_scatter_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (es, n, op) = (c.dtype.size(), c.count, self.redop(c)?);
        let (hosts, local) = (self.layout.hosts, self.layout.local_world);
        let (_scratch, reduced) = self.scratch_part(hosts * n * es)?;
        for h in 0..hosts {
            let block = part(send, h * local * n * es, local * n * es)?;
            let mut mine = part(&reduced, h * n * es, n * es)?;
            self.local
                .reduce_scatter(&block, &mut mine, n, c.dtype, c.redop, stream)?;
        }
        let mut out = part(recv, 0, n * es)?;
        let scatter = nccl::Collective::ReduceScatter(op);
        self.rail
            .collective(scatter, &reduced, &mut out, n, c.dtype.nccl(), stream)?;
        Ok(())
    }

    /// Broadcast: on the root's rail from the root, then inside every host from that rail's
    /// rank.
    fn broadcast_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (es, n) = (c.dtype.size(), c.count);
        let (root_host, root_local) = self.layout.place_of(c.root);
        let mut out = part(recv, 0, n * es)?;
        if self.layout.local_rank == root_local {
            // Off the root NCCL reads no send buffer (and the caller need give none): pass the
            // output, as an in-place broadcast would.
            let src = if self.layout.rank == c.root {
                part(send, 0, n * es)?
            } else {
                part(&out, 0, n * es)?
            };
            let t = c.dtype.nccl();
            let root = nccl::Collective::Broadcast { root: root_host };
            self.rail.collective(root, &src, &mut out, n, t, stream)?;
        }
        self.local
            .broadcast_in_place(&mut out, n, c.dtype, root_local, stream)?;
        Ok(())
    }

    /// Reduce: inside every host to the rank on the root's rail, then on that rail to the
    /// root.
    fn reduce_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (es, n, op) = (c.dtype.size(), c.count, self.redop(c)?);
        let (root_host, root_local) = self.layout.place_of(c.root);
        let (_scratch, mut host_sum) = self.scratch_part(n * es)?;
        let input = part(send, 0, n * es)?;
        self.local.reduce(
            &input,
            &mut host_sum,
            n,
            c.dtype,
            c.redop,
            root_local,
            stream,
        )?;
        if self.layout.local_rank == root_local {
            // The root's result lands in its `recv`; the rail's other ranks reduce in place
            // in their scratch (NCCL writes nothing there).
            let mut out = if self.layout.rank == c.root {
                part(recv, 0, n * es)?
            } else {
                part(&host_sum, 0, n * es)?
            };
            let t = c.dtype.nccl();
            let root = nccl::Collective::Reduce {
                red: op,
                root: root_host,
            };
            self.rail
                .collective(root, &host_sum, &mut out, n, t, stream)?;
        }
        Ok(())
    }

    /// All-to-all: NCCL's sends and receives over every rank, in one group.
    fn all_to_all_on(&self, step: &Step<'_>) -> Result<()> {
        let (c, send, recv, stream) = (step.c, step.send, step.recv, step.stream);
        let (bytes, t) = (c.count * c.dtype.size(), c.dtype.nccl());
        let mut parts = (0..self.layout.world)
            .map(|p| Ok((part(send, p * bytes, bytes)?, part(recv, p * bytes, bytes)?)))
            .collect::<Result<Vec<_>>>()?;
        nccl::group(std::slice::from_ref(&self.all), || {
            for (peer, (from, into)) in parts.iter_mut().enumerate() {
                self.all.send(from, c.count, t, peer, stream)?;
                self.all.recv(into, c.count, t, peer, stream)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    crate::p2p::one_op_calls! {
        by nccl;
        /// Sends `count` elements of `buf` to rank `peer` (on any host; NCCL over every rank),
        /// which receives them with [`recv`](Self::recv). As NCCL's, a send and a receive that
        /// must progress together need a group: use [`nccl_all`](Self::nccl_all) and
        /// [`p2p_transport::nccl::group`] for more than one at a time.
        fn send(buf: &impl DeviceMemory);

        /// Receives `count` elements from rank `peer` into `buf`.
        fn recv(buf: &mut impl DeviceMemoryMut);
    }

    /// The first `bytes` of the scratch buffer, and the guard that keeps it this call's until
    /// the call has queued its work.
    fn scratch_part(&self, bytes: usize) -> Result<(ScratchGuard<'_>, ExternalMemory)> {
        let mut guard = self.scratch(bytes)?;
        let view = part(scratch_mem(&mut guard)?, 0, bytes)?;
        Ok((guard, view))
    }

    /// The scratch buffer, at least `bytes` long (grown, never shrunk).
    fn scratch(&self, bytes: usize) -> Result<ScratchGuard<'_>> {
        let mut guard = self.scratch.lock().map_err(|_| Error::InvalidArgument {
            op: "a call over hosts",
            rank: self.layout.rank,
            what: "an earlier call panicked while it held the scratch memory".into(),
        })?;
        if guard.as_ref().is_none_or(|b| b.byte_len() < bytes) {
            // The old buffer's free waits until the GPU no longer uses it.
            *guard = None;
            *guard = Some(DeviceBuffer::<u8>::zeroed(self.device(), bytes.max(1))?);
        }
        Ok(guard)
    }

    /// NCCL's reduction for `c`'s, or the refusal: an average of integers would be truncated
    /// twice (inside the host, then across hosts), so it is refused.
    fn redop(&self, c: &Call) -> Result<ncclRedOp_t> {
        let integer = matches!(c.dtype, DataType::I32 | DataType::I64 | DataType::U8);
        if c.redop == RedOp::Avg && integer {
            return Err(Error::InvalidArgument {
                op: c.op.name(),
                rank: self.layout.rank,
                what: format!(
                    "an average of {} across hosts is not supported (it would be truncated inside each host and again across hosts): reduce with Sum and divide",
                    c.dtype.name()
                ),
            });
        }
        Ok(c.redop.nccl())
    }
}

/// A peer's failure the host's communicator reported (ranks numbered on the host of `layout`),
/// renumbered in the whole job; any other error as it is.
fn in_job_numbering(layout: &HostLayout, e: Error) -> Error {
    match e {
        Error::PeerFailed { op, failure } => Error::PeerFailed {
            op,
            failure: p2p_transport::PeerFailure {
                rank: layout.rank,
                peer: layout.rank_of(layout.host, failure.peer),
                why: failure.why,
            },
        },
        e => e,
    }
}

/// The scratch buffer, held by one call while it queues its work.
type ScratchGuard<'a> = std::sync::MutexGuard<'a, Option<DeviceBuffer<u8>>>;

/// One call's arguments, as the algorithms take them: the call, its whole send and receive
/// memory (the same memory in place), the stream.
#[derive(Clone, Copy)]
struct Step<'a> {
    c: &'a Call,
    send: &'a ExternalMemory,
    recv: &'a ExternalMemory,
    stream: &'a Stream,
}

/// The scratch buffer behind its guard (made by `scratch`, so present).
fn scratch_mem<'a>(guard: &'a mut ScratchGuard<'_>) -> Result<&'a mut DeviceBuffer<u8>> {
    guard.as_mut().ok_or_else(|| Error::InvalidArgument {
        op: "a call over hosts",
        rank: 0,
        what: "no scratch memory".into(),
    })
}

/// `bytes` bytes of `mem` from byte `off`, as memory the calls accept. Written to only where
/// `mem` is memory the caller lent this call mutably (`recv`, `buf`) or the scratch buffer.
#[allow(unsafe_code)] // a view of part of the caller's device memory
fn part(mem: &dyn DeviceMemory, off: usize, bytes: usize) -> Result<ExternalMemory> {
    let end = off.checked_add(bytes).filter(|&e| e <= mem.byte_len());
    if end.is_none() {
        return Err(Error::InvalidArgument {
            op: "a call over hosts",
            rank: 0,
            what: format!(
                "bytes {off}..{} of a {}-byte buffer",
                off.saturating_add(bytes),
                mem.byte_len()
            ),
        });
    }
    // SAFETY: the range lies inside `mem` (checked above), which the caller keeps alive and
    // borrowed for the whole call that uses the part; the calls queue work on the caller's
    // stream, in the order the caller's own memory rules already require.
    Ok(unsafe { ExternalMemory::from_raw(mem.device(), mem.device_ptr() + off as u64, bytes) })
}

/// All of `mem`, as [`part`] gives it.
fn whole(mem: &dyn DeviceMemory) -> ExternalMemory {
    // SAFETY: as in `part`, the whole range.
    #[allow(unsafe_code)]
    unsafe {
        ExternalMemory::from_raw(mem.device(), mem.device_ptr(), mem.byte_len())
    }
}

/// The refusal unless the ranks of one host share one host identity (they share memory), each
/// host's differing from the others' (where two hosts share one, NCCL would treat them as one
/// host: a warning, not an error).
fn check_hosts(layout: &HostLayout, ids: &[Vec<u8>]) -> std::result::Result<(), String> {
    let id = |r: usize| String::from_utf8_lossy(&ids[r]).into_owned();
    if ids.len() != layout.world {
        return Err(format!(
            "{} host identities for {} ranks",
            ids.len(),
            layout.world
        ));
    }
    for h in 0..layout.hosts {
        let first = id(layout.rank_of(h, 0));
        for l in 1..layout.local_world {
            let r = layout.rank_of(h, l);
            if id(r) != first {
                return Err(format!(
                    "ranks {} and {r} are both on host {h} (GROUP_RANK) but run on {first:?} and {:?}: the ranks of one host must share its memory",
                    layout.rank_of(h, 0),
                    id(r)
                ));
            }
        }
        if let Some(other) = (0..h).find(|&o| id(layout.rank_of(o, 0)) == first) {
            tracing::warn!(
                host = h,
                other,
                id = %first,
                "two hosts of the job report one host identity: set P2P_HOST_ID and NCCL_HOSTID per host when one machine poses as several"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn layout(world: usize, local_world: usize, rank: usize) -> HostLayout {
        HostLayout {
            world,
            rank,
            hosts: world / local_world,
            host: rank / local_world,
            local_world,
            local_rank: rank % local_world,
        }
    }

    #[test]
    fn ranks_of_one_host_must_share_its_identity() {
        let l = layout(4, 2, 0);
        let ids = |v: [&str; 4]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(check_hosts(&l, &ids(["a", "a", "b", "b"])), Ok(()));
        // Two hosts on one identity: allowed (a warning).
        assert_eq!(check_hosts(&l, &ids(["a", "a", "a", "a"])), Ok(()));
        let e = check_hosts(&l, &ids(["a", "a", "b", "c"])).unwrap_err();
        assert!(
            e.contains("ranks 2 and 3") && e.contains("share its memory"),
            "{e}"
        );
        assert!(check_hosts(&l, &ids(["a", "a", "b", "b"])[..3]).is_err());
    }

    #[test]
    fn a_failure_inside_the_host_is_named_in_the_jobs_numbering() {
        // Rank 2 of 4 is local rank 0 of host 1; its host's communicator says local rank 1.
        let local = Error::PeerFailed {
            op: "all_reduce".into(),
            failure: p2p_transport::PeerFailure {
                rank: 0,
                peer: 1,
                why: "its process exited".into(),
            },
        };
        let e = in_job_numbering(&layout(4, 2, 2), local).to_string();
        assert!(
            e.contains("on rank 2: rank 3 failed: its process exited"),
            "{e}"
        );
    }
}
