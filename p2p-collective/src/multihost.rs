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
use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};
use p2p_transport::nccl::{self, NcclComm, UniqueId};
use p2p_transport::rendezvous::{host_id, HostLayout, JobExchange, Rendezvous};

use crate::comm::{Communicator, Options};
use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

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
/// use p2p_collective::{DataType, MultiHostCommunicator, RedOp};
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

impl MultiHostCommunicator {
    /// Joins the job the environment describes (torchrun's `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`, or
    /// `p2p-bench launch --hosts H`'s), on GPU `LOCAL_RANK` (GPU 0 where the process sees one),
    /// with the options `P2P_*` sets.
    pub fn from_env() -> Result<MultiHostCommunicator> {
        let (job, layout) = Rendezvous::for_hosts_from_vars(|n| std::env::var(n).ok())?;
        let visible = Device::count()? as usize;
        let ordinal = if visible == 1 { 0 } else { layout.local_rank };
        if ordinal >= visible {
            return Err(Error::Bootstrap {
                rank: layout.rank,
                why: format!(
                    "LOCAL_RANK={} but this process sees {visible} GPU(s): start at most one rank per GPU",
                    layout.local_rank
                ),
            });
        }
        let device = Device::new(ordinal as i32)?;
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
            let host_failed = self
                .local
                .abort_handle()
                .reason()
                .map(|(local, why)| (self.layout.rank_of(self.layout.host, local), why));
            if let Some((peer, why)) = host_failed.or_else(|| self.job_failed.reason()) {
                self.abort();
                return Err(Error::PeerFailed {
                    op: "a call over hosts".into(),
                    failure: p2p_transport::PeerFailure {
                        rank: self.layout.rank,
                        peer,
                        why,
                    },
                });
            }
            if let Err(e) = self.rail.check().and_then(|()| self.all.check()) {
                self.abort();
                return Err(e.into());
            }
            if done {
                return self.local.check();
            }
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

    /// Stops every communicator of this rank: the host's (its kernels and peers learn at once)
    /// and both NCCL communicators (`ncclCommAbort`).
    pub fn abort(&self) {
        self.local.abort();
        self.rail.abort();
        self.all.abort();
    }

    /// All-reduces `count` elements of `send` into `recv` on every rank of every host.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let (es, op) = (dtype.size(), self.redop("all_reduce", dtype, redop)?);
        fits(self, "all_reduce", send, recv, count * es, count * es)?;
        let local = self.layout.local_world;
        let (shard, tail) = (count / local, count % local);
        if shard > 0 {
            let mut scratch = self.scratch(shard * es)?;
            let mut mine = part_mut(scratch_mem(&mut scratch)?, 0, shard * es)?;
            let body = part(send, 0, shard * local * es)?;
            self.local
                .reduce_scatter(&body, &mut mine, shard, dtype, redop, stream)?;
            let shard_in = part(&mine, 0, shard * es)?;
            self.rail
                .all_reduce(&shard_in, &mut mine, shard, nccl_type(dtype), op, stream)?;
            let mut out = part_mut(recv, 0, shard * local * es)?;
            self.local
                .all_gather(&mine, &mut out, shard, dtype, stream)?;
        }
        if tail > 0 {
            let at = shard * local * es;
            let mut out = part_mut(recv, at, tail * es)?;
            self.all.all_reduce(
                &part(send, at, tail * es)?,
                &mut out,
                tail,
                nccl_type(dtype),
                op,
                stream,
            )?;
        }
        Ok(())
    }

    /// Gathers every rank's `count` elements into every rank's `recv` (`world * count`), in
    /// rank order.
    pub fn all_gather(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        let (es, hosts, local) = (dtype.size(), self.layout.hosts, self.layout.local_world);
        let world = self.layout.world;
        fits(
            self,
            "all_gather",
            send,
            recv,
            count * es,
            world * count * es,
        )?;
        if count == 0 {
            return Ok(());
        }
        let mut scratch = self.scratch(hosts * count * es)?;
        let gathered = scratch_mem(&mut scratch)?;
        // Each rank's part from every host (the rail's all-gather), then each host's block.
        let mut rail_out = part_mut(gathered, 0, hosts * count * es)?;
        self.rail.all_gather(
            &part(send, 0, count * es)?,
            &mut rail_out,
            count,
            nccl_type(dtype),
            stream,
        )?;
        for h in 0..hosts {
            let mine = part(&rail_out, h * count * es, count * es)?;
            let mut block = part_mut(recv, h * local * count * es, local * count * es)?;
            self.local
                .all_gather(&mine, &mut block, count, dtype, stream)?;
        }
        Ok(())
    }

    /// Reduces every rank's `send` (`world * count`) and gives rank r part r (`count`) in
    /// `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let (es, hosts, local) = (dtype.size(), self.layout.hosts, self.layout.local_world);
        let op = self.redop("reduce_scatter", dtype, redop)?;
        let world = self.layout.world;
        fits(
            self,
            "reduce_scatter",
            send,
            recv,
            world * count * es,
            count * es,
        )?;
        if count == 0 {
            return Ok(());
        }
        let mut scratch = self.scratch(hosts * count * es)?;
        let mut reduced = part_mut(scratch_mem(&mut scratch)?, 0, hosts * count * es)?;
        // Each host's block reduced inside the host, then across hosts on the rail.
        for h in 0..hosts {
            let block = part(send, h * local * count * es, local * count * es)?;
            let mut mine = part_mut(&mut reduced, h * count * es, count * es)?;
            self.local
                .reduce_scatter(&block, &mut mine, count, dtype, redop, stream)?;
        }
        let mut out = part_mut(recv, 0, count * es)?;
        self.rail
            .reduce_scatter(&reduced, &mut out, count, nccl_type(dtype), op, stream)?;
        Ok(())
    }

    /// Broadcasts `count` elements from `root`'s `send` into every rank's `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn broadcast(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let es = dtype.size();
        let (root_host, root_local) = self.root("broadcast", root)?;
        fits(self, "broadcast", send, recv, count * es, count * es)?;
        if count == 0 {
            return Ok(());
        }
        let mut out = part_mut(recv, 0, count * es)?;
        if self.layout.local_rank == root_local {
            self.rail.broadcast(
                &part(send, 0, count * es)?,
                &mut out,
                count,
                nccl_type(dtype),
                root_host,
                stream,
            )?;
        }
        self.local
            .broadcast_in_place(&mut out, count, dtype, root_local, stream)?;
        Ok(())
    }

    /// Reduces every rank's `send` into `root`'s `recv` (`recv` must fit `count` on every rank;
    /// only `root`'s is written).
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
        let es = dtype.size();
        let op = self.redop("reduce", dtype, redop)?;
        let (root_host, root_local) = self.root("reduce", root)?;
        fits(self, "reduce", send, recv, count * es, count * es)?;
        if count == 0 {
            return Ok(());
        }
        let mut scratch = self.scratch(count * es)?;
        let mut host_sum = part_mut(scratch_mem(&mut scratch)?, 0, count * es)?;
        self.local.reduce(
            &part(send, 0, count * es)?,
            &mut host_sum,
            count,
            dtype,
            redop,
            root_local,
            stream,
        )?;
        if self.layout.local_rank == root_local {
            let sum = part(&host_sum, 0, count * es)?;
            if self.layout.rank == root {
                let mut out = part_mut(recv, 0, count * es)?;
                self.rail.reduce(
                    &sum,
                    &mut out,
                    count,
                    nccl_type(dtype),
                    op,
                    root_host,
                    stream,
                )?;
            } else {
                self.rail.reduce(
                    &sum,
                    &mut host_sum,
                    count,
                    nccl_type(dtype),
                    op,
                    root_host,
                    stream,
                )?;
            }
        }
        Ok(())
    }

    /// Sends part q (`count` elements) of `send` to rank q and receives rank p's part for this
    /// rank into part p of `recv` (NCCL over every rank).
    pub fn all_to_all(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        let (es, world) = (dtype.size(), self.layout.world);
        fits(
            self,
            "all_to_all",
            send,
            recv,
            world * count * es,
            world * count * es,
        )?;
        if count == 0 {
            return Ok(());
        }
        let t = nccl_type(dtype);
        let mut parts = (0..world)
            .map(|p| {
                let at = p * count * es;
                Ok((part(send, at, count * es)?, part_mut(recv, at, count * es)?))
            })
            .collect::<Result<Vec<_>>>()?;
        nccl::group(std::slice::from_ref(&self.all), || {
            for (peer, (from, into)) in parts.iter_mut().enumerate() {
                self.all.send(from, count, t, peer, stream)?;
                self.all.recv(into, count, t, peer, stream)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Sends `count` elements of `send` to rank `peer` (on any host), which receives them with
    /// [`recv`](Self::recv).
    pub fn send(
        &self,
        send: &impl DeviceMemory,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.all.send(send, count, nccl_type(dtype), peer, stream)?;
        Ok(())
    }

    /// Receives `count` elements from rank `peer` into `recv`.
    pub fn recv(
        &self,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.all.recv(recv, count, nccl_type(dtype), peer, stream)?;
        Ok(())
    }

    /// The scratch buffer, at least `bytes` long (grown, never shrunk).
    fn scratch(&self, bytes: usize) -> Result<std::sync::MutexGuard<'_, Option<DeviceBuffer<u8>>>> {
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

    /// `root`'s host and local rank, or the refusal.
    fn root(&self, op: &'static str, root: usize) -> Result<(usize, usize)> {
        if root >= self.layout.world {
            return Err(Error::InvalidArgument {
                op,
                rank: self.layout.rank,
                what: format!("root {root} is not one of the {} ranks", self.layout.world),
            });
        }
        Ok(self.layout.place_of(root))
    }

    /// NCCL's reduction for `redop` on `dtype`, or the refusal: an average of integers would be
    /// truncated twice (inside the host, then across hosts), so it is refused.
    fn redop(&self, op: &'static str, dtype: DataType, redop: RedOp) -> Result<ncclRedOp_t> {
        let integer = matches!(dtype, DataType::I32 | DataType::I64 | DataType::U8);
        if redop == RedOp::Avg && integer {
            return Err(Error::InvalidArgument {
                op,
                rank: self.layout.rank,
                what: format!(
                    "an average of {} across hosts is not supported (it would be truncated inside each host and again across hosts): reduce with Sum and divide",
                    dtype.name()
                ),
            });
        }
        Ok(match redop {
            RedOp::Sum => ncclRedOp_t::ncclSum,
            RedOp::Prod => ncclRedOp_t::ncclProd,
            RedOp::Min => ncclRedOp_t::ncclMin,
            RedOp::Max => ncclRedOp_t::ncclMax,
            RedOp::Avg => ncclRedOp_t::ncclAvg,
        })
    }
}

/// NCCL's type for `dtype`.
fn nccl_type(dtype: DataType) -> ncclDataType_t {
    match dtype {
        DataType::F32 => ncclDataType_t::ncclFloat32,
        DataType::F64 => ncclDataType_t::ncclFloat64,
        DataType::F16 => ncclDataType_t::ncclFloat16,
        DataType::BF16 => ncclDataType_t::ncclBfloat16,
        DataType::I32 => ncclDataType_t::ncclInt32,
        DataType::I64 => ncclDataType_t::ncclInt64,
        DataType::U8 => ncclDataType_t::ncclUint8,
    }
}

/// The refusal unless `send` holds `send_bytes` and `recv` `recv_bytes`, both on this rank's GPU.
fn fits(
    comm: &MultiHostCommunicator,
    op: &'static str,
    send: &impl DeviceMemory,
    recv: &impl DeviceMemory,
    send_bytes: usize,
    recv_bytes: usize,
) -> Result<()> {
    for (what, mem, bytes) in [
        ("send", send.byte_len(), send_bytes),
        ("recv", recv.byte_len(), recv_bytes),
    ] {
        if mem < bytes {
            return Err(Error::InvalidArgument {
                op,
                rank: comm.layout.rank,
                what: format!("the {what} buffer has {mem} bytes; this call needs {bytes}"),
            });
        }
    }
    for (what, dev) in [("send", send.device()), ("recv", recv.device())] {
        if dev != comm.device() {
            return Err(Error::InvalidArgument {
                op,
                rank: comm.layout.rank,
                what: format!(
                    "the {what} buffer is on GPU {}, this rank's GPU is {}",
                    dev.ordinal(),
                    comm.device().ordinal()
                ),
            });
        }
    }
    Ok(())
}

/// The scratch buffer behind its guard (made by `scratch`, so present).
fn scratch_mem<'a>(
    guard: &'a mut std::sync::MutexGuard<'_, Option<DeviceBuffer<u8>>>,
) -> Result<&'a mut DeviceBuffer<u8>> {
    guard.as_mut().ok_or_else(|| Error::InvalidArgument {
        op: "a call over hosts",
        rank: 0,
        what: "no scratch memory".into(),
    })
}

/// `bytes` bytes of `mem` from byte `off`, as memory the calls accept.
#[allow(unsafe_code)] // a view of part of the caller's device memory
fn part(mem: &impl DeviceMemory, off: usize, bytes: usize) -> Result<ExternalMemory> {
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

/// [`part`] of memory this call may write.
fn part_mut(mem: &mut impl DeviceMemoryMut, off: usize, bytes: usize) -> Result<ExternalMemory> {
    part(&*mem, off, bytes)
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
    fn every_type_and_reduction_has_nccls() {
        for t in DataType::ALL {
            assert_eq!(
                p2p_transport::nccl::element_bytes(nccl_type(t)).unwrap(),
                t.size(),
                "{t:?}"
            );
        }
    }
}
