//! Point-to-point: NCCL's `ncclSend` / `ncclRecv`, alone or in groups.
//!
//! A [`P2pGroup`] is NCCL's `ncclGroupStart` ... `ncclGroupEnd` around sends and receives: every
//! send and receive added to it runs in one kernel, so none waits for another and any pattern
//! of exchanges (a ring, an all-to-all with different sizes per peer, a pipeline stage that
//! sends forward and receives back) completes without deadlock. [`Communicator::send`],
//! [`recv`](Communicator::recv) and [`send_recv`](Communicator::send_recv) are groups of one or
//! two.
//!
//! How the kernel moves a message (`p2p_sendrecv` in `kernels/coll/p2p.cuh`): the receiver's
//! workspace holds an inbox per source rank ([`INBOX_BYTES`]): 32 lanes of two slots of 256 KiB.
//! A message is cut into one chunk per lane (at least 4 KiB), or two per lane once a lane's
//! share passes 128 KiB, so that a lane's chunks overlap (docs/performance.md, "Send and
//! receive", measured the choice). Each slot starts with a header of two LL lines (message number and size, with a
//! flag that no earlier use of the slot carried), which is the chunk's ready signal. A message
//! of at most 128 KiB travels as LL lines too (8 data bytes and two flags per 16-byte line; no
//! fence); a larger one is copied into the slot and fenced before its header. The receiver
//! copies each chunk out and raises a freed counter in the sender's sync area. The counters
//! live on the GPU, so a group captured in a CUDA graph replays correctly. The header carries
//! the message's number and size, so a receive of another size than the send is an error
//! ([`Error::Mismatch`]), never a silent shift of later messages.

use p2p_mem::{DeviceMemory, DeviceMemoryMut, Stream};

use crate::abi::{P2pArgs, P2P_BLOCKS, P2P_COPY, P2P_MAX_OPS, P2P_RECV, P2P_SEND};
use crate::call::check::{check_args, check_element, Shape};
use crate::call::{Buffers, Region};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::{Call, DataType};

// `P2pArgs` derives `Default`, which arrays have up to 32 elements.
const _: () = assert!(P2P_MAX_OPS <= 32);

/// The most operations one [`P2pGroup`] holds: its sends and receives, with each message a
/// rank sends to itself and its receive counted once.
pub const MAX_GROUP_OPS: usize = P2P_MAX_OPS;

/// Messages larger than this (per sender and receiver) complete only as the receiver takes them
/// in: a rank that sends more to a peer than this, outside a group that also holds what it
/// receives, waits for the peer.
pub const INBOX_BYTES: usize = crate::abi::P2P_INBOX_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// A send or receive as the group's layout sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    dir: Dir,
    peer: usize,
    ptr: u64,
    bytes: u64,
}

/// One operation of the kernel: `kind` is `P2P_SEND`, `P2P_RECV` or `P2P_COPY` (a message to
/// itself: `src` is the sent buffer, `ptr` the receiving one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelOp {
    kind: i32,
    peer: usize,
    ptr: u64,
    src: u64,
    bytes: u64,
}

/// A group's operations in kernel order, and its channels: `(first op, number of ops)`, one
/// channel per peer and direction.
#[derive(Debug, Default, PartialEq, Eq)]
struct Layout {
    ops: Vec<KernelOp>,
    channels: Vec<(usize, usize)>,
}

impl Layout {
    fn receiving_blocks(&self) -> usize {
        self.channels
            .iter()
            .filter(|(first, _)| self.ops[*first].kind == P2P_RECV)
            .count()
            * P2P_BLOCKS
    }
}

/// Sorts `entries` (in the order they were added) into the kernel's channels: the receives
/// from each peer (peers in order), then the messages to itself (each send to itself paired
/// with the receive from itself of the same position), then the sends to each peer. Within a
/// channel the order of adding is kept: that is the order in which messages pair up with the
/// peer's.
fn layout(rank: usize, entries: &[Entry]) -> std::result::Result<Layout, GroupError> {
    let own = |dir: Dir| {
        entries
            .iter()
            .filter(move |e| e.peer == rank && e.dir == dir)
            .collect::<Vec<_>>()
    };
    let (sent, received) = (own(Dir::Send), own(Dir::Recv));
    if sent.len() != received.len() {
        return Err(GroupError::SelfUnpaired {
            rank,
            sent: sent.len(),
            received: received.len(),
        });
    }
    let mut copies = Vec::new();
    for (k, (s, r)) in sent.iter().zip(&received).enumerate() {
        if s.bytes != r.bytes {
            return Err(GroupError::SelfSizes {
                message: k,
                rank,
                sent: s.bytes,
                received: r.bytes,
            });
        }
        if s.ptr == r.ptr || s.bytes == 0 {
            continue; // nothing to move
        }
        if s.ptr < r.ptr + r.bytes && r.ptr < s.ptr + s.bytes {
            return Err(GroupError::SelfOverlap { message: k, rank });
        }
        copies.push(KernelOp {
            kind: P2P_COPY,
            peer: rank,
            ptr: r.ptr,
            src: s.ptr,
            bytes: s.bytes,
        });
    }
    let mut out = Layout::default();
    // Appends one channel (nothing when `ops` is empty).
    let channel = |ops: &mut dyn Iterator<Item = KernelOp>, out: &mut Layout| {
        let start = out.ops.len();
        out.ops.extend(ops);
        if out.ops.len() > start {
            out.channels.push((start, out.ops.len() - start));
        }
    };
    let mut peers: Vec<usize> = entries
        .iter()
        .map(|e| e.peer)
        .filter(|&p| p != rank)
        .collect();
    peers.sort_unstable();
    peers.dedup();
    let of = |dir: Dir, peer: usize| {
        entries
            .iter()
            .filter(move |e| e.dir == dir && e.peer == peer)
            .map(move |e| KernelOp {
                kind: if dir == Dir::Send { P2P_SEND } else { P2P_RECV },
                peer,
                ptr: e.ptr,
                src: 0,
                bytes: e.bytes,
            })
    };
    for &p in &peers {
        channel(&mut of(Dir::Recv, p), &mut out);
    }
    channel(&mut copies.into_iter(), &mut out);
    for &p in &peers {
        channel(&mut of(Dir::Send, p), &mut out);
    }
    if out.ops.len() > P2P_MAX_OPS {
        return Err(GroupError::TooManyOps(out.ops.len()));
    }
    Ok(out)
}

/// Whether `receiving` receiving blocks all run at once on GPU `gpu` (`sms` SMs, `per_sm` blocks
/// each, the share of one of `share` ranks on that GPU), with room for a sender: a sender waits
/// only for receivers, so then nothing ever waits for a block that cannot start.
fn fits(
    receiving: usize,
    gpu: i32,
    sms: usize,
    per_sm: usize,
    share: usize,
) -> std::result::Result<(), GroupError> {
    let share = share.max(1);
    let resident = sms * per_sm / share;
    if receiving == 0 || receiving < resident {
        return Ok(());
    }
    Err(GroupError::TooManyReceivers {
        receiving,
        gpu,
        resident,
        of: if share > 1 {
            format!("{sms} SMs x {per_sm}, shared by {share} ranks")
        } else {
            format!("{sms} SMs x {per_sm}")
        },
        fitting: peers_fitting(resident),
    })
}

/// Why a group of sends and receives cannot launch as it is (checked before anything is
/// queued; reported as the call's [`Error::InvalidArgument`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum GroupError {
    /// The messages a rank sends itself and those it receives from itself do not pair up.
    #[error("rank {rank} sends {sent} message(s) to itself and receives {received} from itself in this group: each message to itself needs its receive in the same group")]
    SelfUnpaired {
        rank: usize,
        sent: usize,
        received: usize,
    },
    /// A message to itself and its receive differ in size.
    #[error("message {message} that rank {rank} sends to itself has {sent} bytes; its receive takes {received}")]
    SelfSizes {
        message: usize,
        rank: usize,
        sent: u64,
        received: u64,
    },
    /// A message to itself overlaps the buffer it is received into.
    #[error("message {message} that rank {rank} sends to itself overlaps its receive buffer")]
    SelfOverlap { message: usize, rank: usize },
    /// More operations than the kernel's channels hold.
    #[error("a group holds at most {P2P_MAX_OPS} operations (sends, receives, and each message to itself counted once); this one has {0}: launch it as several groups, each holding both ends of the exchanges it starts")]
    TooManyOps(usize),
    /// More receiving blocks than the GPU runs at once, with room for a sender.
    #[error("this group receives from {} ranks: {receiving} receiving blocks ({P2P_BLOCKS} per rank), but GPU {gpu} runs at most {resident} of them at once ({of}); receive from at most {fitting} other ranks per group", receiving / P2P_BLOCKS)]
    TooManyReceivers {
        receiving: usize,
        gpu: i32,
        resident: usize,
        of: String,
        fitting: usize,
    },
}

/// How many peers a group may receive from when `resident` blocks run at once: every
/// receiving block ([`P2P_BLOCKS`] per peer) resident, with room for a sender.
fn peers_fitting(resident: usize) -> usize {
    resident.saturating_sub(1) / P2P_BLOCKS
}

/// Sends and receives (and collectives) queued together, like NCCL's `ncclGroupStart` /
/// `ncclGroupEnd`; made by [`Communicator::group`], run by [`launch`](Self::launch).
///
/// Every send and receive of a group runs in one kernel, so none waits for another: a rank may
/// send to and receive from any number of peers (itself included) in one group, with any sizes,
/// and several messages to one peer arrive in the order they were added. A message needs a
/// matching receive on the peer, of the same size, in the peer's group or call in the same
/// order; a different size, or another order, is reported as [`Error::Mismatch`].
///
/// Collectives added to a group run first, in the order added, then every send and receive:
/// every rank must add the same collectives, in the same order, to a group of its own. Unlike
/// NCCL, which fuses a group's collectives and sends into one launch, a rank whose group holds
/// a collective and a send to a peer that calls the collective only after its receive waits
/// until the time limit.
///
/// Limits: at most [`MAX_GROUP_OPS`] operations, and every receiving block (32 per rank
/// received from) must run at once on the GPU: a group that receives from more ranks than the
/// GPU's SMs allow is refused with the number it allows (at two blocks per SM: every other rank
/// of 8 on an H100 or H200, 6 on an A100).
///
/// The buffers stay borrowed until the group is launched or dropped; dropping a group without
/// launching it queues nothing. Everything is checked before anything is queued; a CUDA launch
/// failure (which may come after the group's collectives were queued) aborts the communicator,
/// so that no peer waits for the rest: drop it then. Launching is asynchronous and can be
/// captured in a CUDA graph.
///
/// ```no_run
/// use p2p_collective::{Communicator, DataType};
/// use p2p_mem::{DeviceBuffer, Stream};
/// // All-to-all with a different size for every pair: rank r sends r + p + 1 elements to p.
/// let comm = Communicator::from_env()?;
/// let (rank, n) = (comm.rank(), comm.world_size());
/// let stream = Stream::new(comm.device())?;
/// let sends: Vec<DeviceBuffer<f32>> = (0..n)
///     .map(|p| DeviceBuffer::zeroed(comm.device(), rank + p + 1))
///     .collect::<Result<_, _>>()?;
/// let mut recvs: Vec<DeviceBuffer<f32>> = (0..n)
///     .map(|p| DeviceBuffer::zeroed(comm.device(), p + rank + 1))
///     .collect::<Result<_, _>>()?;
/// let mut group = comm.group(&stream);
/// for (p, buf) in sends.iter().enumerate() {
///     group.send(buf, rank + p + 1, DataType::F32, p)?;
/// }
/// for (p, buf) in recvs.iter_mut().enumerate() {
///     group.recv(buf, p + rank + 1, DataType::F32, p)?;
/// }
/// group.launch()?;
/// comm.synchronize(&stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct P2pGroup<'a> {
    comm: &'a Communicator,
    stream: &'a Stream,
    op: &'static str,
    entries: Vec<Entry>,
    calls: Vec<(Call, Region<'a>, Region<'a>)>,
}

impl std::fmt::Debug for P2pGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2pGroup")
            .field("rank", &self.comm.rank)
            .field("entries", &self.entries)
            .field("collectives", &self.calls.len())
            .finish()
    }
}

impl<'a> P2pGroup<'a> {
    /// Adds sending `count` elements of `buf` to rank `peer` (this rank too: then the group
    /// needs the matching [`recv`](Self::recv) from this rank).
    pub fn send<M: DeviceMemory + ?Sized>(
        &mut self,
        buf: &'a M,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<&mut Self> {
        check_element("send", self.comm.rank(), dtype, "send", buf)?;
        let region = Region::of(buf, self.stream)?;
        self.add(Dir::Send, region, count, dtype, peer)
    }

    /// Adds receiving `count` elements from rank `peer` into `buf`.
    pub fn recv<M: DeviceMemoryMut + ?Sized>(
        &mut self,
        buf: &'a mut M,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<&mut Self> {
        let buf: &'a M = buf;
        check_element("recv", self.comm.rank(), dtype, "receive", buf)?;
        let region = Region::of(buf, self.stream)?;
        self.add(Dir::Recv, region, count, dtype, peer)
    }

    /// Adds the collective `call`, out of place (see
    /// [`Collectives::call`](crate::Collectives::call)). It runs before the group's sends and
    /// receives.
    pub fn call(
        &mut self,
        call: &Call,
        send: &'a dyn DeviceMemory,
        recv: &'a mut dyn DeviceMemoryMut,
    ) -> Result<&mut Self> {
        let recv: &'a dyn DeviceMemoryMut = recv;
        self.add_call(call, Buffers::Apart { send, recv })
    }

    /// Adds the collective `call`, in place in `buf` (see
    /// [`Collectives::call_in_place`](crate::Collectives::call_in_place)).
    pub fn call_in_place(
        &mut self,
        call: &Call,
        buf: &'a mut dyn DeviceMemoryMut,
    ) -> Result<&mut Self> {
        let buf: &'a dyn DeviceMemoryMut = buf;
        self.add_call(call, Buffers::InPlace(buf))
    }

    /// Checks `call` now (the whole call is checked again when the group launches), and keeps
    /// its regions.
    fn add_call(&mut self, call: &Call, buffers: Buffers<'a>) -> Result<&mut Self> {
        if let Some(args) = check_args(&Shape::of(self.comm), call, buffers, self.stream)? {
            self.calls.push((*call, args.input, args.output));
        }
        Ok(self)
    }

    /// The operations added so far: sends, receives and collectives.
    pub fn len(&self) -> usize {
        self.entries.len() + self.calls.len()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.calls.is_empty()
    }

    fn add(
        &mut self,
        dir: Dir,
        region: Region<'_>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<&mut Self> {
        let comm = self.comm;
        let what = if dir == Dir::Send { "send" } else { "recv" };
        let bad = |what: String| Error::InvalidArgument {
            op: self.op,
            rank: comm.rank,
            what,
        };
        let bytes = count
            .checked_mul(dtype.size())
            .filter(|b| *b < 1 << 46)
            .ok_or_else(|| bad(format!("count {count} is too large")))?;
        if peer >= comm.world {
            return Err(bad(format!(
                "peer {peer} is out of range: there are {} ranks",
                comm.world
            )));
        }
        if bytes > 0 {
            region.holds(
                &Shape::of(comm),
                self.op,
                what,
                count,
                (dtype.size(), dtype.name()),
            )?;
        }
        self.entries.push(Entry {
            dir,
            peer,
            ptr: region.ptr,
            bytes: bytes as u64,
        });
        Ok(self)
    }

    /// Queues the group on its stream: the collectives first, in order, then one kernel with
    /// every send and receive. Everything is checked before anything is queued.
    pub fn launch(self) -> Result<()> {
        let comm = self.comm;
        crate::call::check::usable_on(comm, self.op, self.stream)?;
        let bad = |e: GroupError| Error::InvalidArgument {
            op: self.op,
            rank: comm.rank,
            what: e.to_string(),
        };
        let layout = layout(comm.rank, &self.entries).map_err(bad)?;
        fits(
            layout.receiving_blocks(),
            comm.device.ordinal(),
            comm.device.sm_count().max(1) as usize,
            comm.launcher.kernels.sendrecv_blocks_per_sm.max(1) as usize,
            comm.share,
        )
        .map_err(bad)?;
        for (call, input, output) in &self.calls {
            crate::call::queue(comm, call, Buffers::Regions(*input, *output), self.stream)?;
        }
        if layout.ops.is_empty() {
            return Ok(());
        }
        self.launch_kernel(&layout)
    }

    #[allow(unsafe_code)] // the kernel launch
    fn launch_kernel(&self, layout: &Layout) -> Result<()> {
        let comm = self.comm;
        let inbox = |owner: usize, source: usize| {
            comm.workspace
                .inbox(owner, comm.world, comm.tuning(), source)
        };
        let mut args = P2pArgs {
            my_sync: comm.workspace.sync(comm.rank),
            abort_flag: comm.health.abort.device_ptr(),
            timeout_ns: comm
                .options
                .timeout
                .min(crate::settings::MAX_TIMEOUT)
                .as_nanos() as u64,
            rank: comm.rank as i32,
            channels: layout.channels.len() as i32,
            ..P2pArgs::default()
        };
        for (k, op) in layout.ops.iter().enumerate() {
            args.kind[k] = op.kind;
            args.peer[k] = op.peer as i32;
            args.bytes[k] = op.bytes;
            args.peer_sync[k] = comm.workspace.sync(op.peer);
            (args.src[k], args.dst[k]) = match op.kind {
                P2P_SEND => (op.ptr, inbox(op.peer, comm.rank)),
                P2P_RECV => (inbox(comm.rank, op.peer), op.ptr),
                _ => (op.src, op.ptr),
            };
        }
        for (c, &(first, n)) in layout.channels.iter().enumerate() {
            args.chan_first[c] = first as i32;
            args.chan_ops[c] = n as i32;
        }
        let grid = (layout.channels.len() * P2P_BLOCKS) as u32;
        tracing::debug!(
            rank = comm.rank,
            "{}: {} operations in {} channels, {grid} blocks: {:?}",
            self.op,
            layout.ops.len(),
            layout.channels.len(),
            layout.ops
        );
        // SAFETY: `P2pArgs` matches the kernel's one by-value parameter field for field (the
        // layout is generated from coll_abi.h). Every user buffer was checked when added to hold
        // its bytes on this rank's GPU and stays borrowed by the group until this launch; the
        // inboxes and sync areas lie in the workspaces of this rank and its peers (alive while
        // the communicator is, which synchronises before freeing them); the abort flag is
        // pinned memory held by the communicator; the grid covers `channels` channels.
        let launched = unsafe { comm.launcher.launch_sendrecv(&args, grid, self.stream) };
        comm.health.abort_on_error(comm.rank, self.op, launched)
    }
}

/// Declares `send` and `recv` on a communicator, each with its buffer, `count`, `dtype`,
/// `peer` and `stream`, carried out `by group` (a group of that one operation on `stream`,
/// launched, named after the method in errors: [`Communicator`]) or `by nccl` (the same call of
/// the type's NCCL communicator over every rank, `self.all`:
/// [`MultiHostCommunicator`](crate::MultiHostCommunicator)).
macro_rules! one_op_calls {
    (@body group, $s:ident, $name:ident, $buf:ident, $count:ident, $dtype:ident, $peer:ident, $stream:ident) => {{
        let mut g = $s.group_as(stringify!($name), $stream);
        g.$name($buf, $count, $dtype, $peer)?;
        g.launch()
    }};
    (@body nccl, $s:ident, $name:ident, $buf:ident, $count:ident, $dtype:ident, $peer:ident, $stream:ident) => {{
        $s.all.$name($buf, $count, $dtype.nccl(), $peer, $stream)?;
        Ok(())
    }};
    (by $via:ident; $($(#[$doc:meta])* fn $name:ident($buf:ident: $ty:ty);)+) => {
        $(
            $(#[$doc])*
            pub fn $name(
                &self,
                $buf: $ty,
                count: usize,
                dtype: $crate::types::DataType,
                peer: usize,
                stream: &$crate::p2p_mem::Stream,
            ) -> $crate::error::Result<()> {
                $crate::p2p::one_op_calls!(@body $via, self, $name, $buf, count, dtype, peer, stream)
            }
        )+
    };
}
pub(crate) use one_op_calls;

/// Point-to-point: NCCL's `ncclSend` / `ncclRecv`, and their groups.
impl Communicator {
    /// A group of sends and receives (and collectives) queued on `stream` together when
    /// launched: NCCL's `ncclGroupStart` / `ncclGroupEnd` (see [`P2pGroup`]).
    pub fn group<'a>(&'a self, stream: &'a Stream) -> P2pGroup<'a> {
        self.group_as("group", stream)
    }

    fn group_as<'a>(&'a self, op: &'static str, stream: &'a Stream) -> P2pGroup<'a> {
        P2pGroup {
            comm: self,
            stream,
            op,
            entries: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// The most other ranks one [`group`](Self::group) on this rank may receive from: every
    /// receiving block must run at once on this rank's GPU (its share of the GPU where ranks
    /// share one), with room for a sender, else the group is refused with
    /// [`Error::InvalidArgument`] rather than left to wait. 8 on an H100 or H200 with a GPU per
    /// rank, so a full all-to-all group of 8 ranks fits; fewer on smaller GPUs or where ranks
    /// share a GPU (2 with 4 ranks on one H100).
    pub fn max_group_receive_peers(&self) -> usize {
        let sms = self.device.sm_count().max(1) as usize;
        let per_sm = self.launcher.kernels.sendrecv_blocks_per_sm.max(1) as usize;
        peers_fitting(sms * per_sm / self.share.max(1))
    }

    one_op_calls! {
        by group;
        /// Sends `count` elements of `buf` to rank `peer`, which calls [`recv`](Self::recv) (or
        /// receives in a group) with the same count and type. Queued on `stream` like the
        /// collectives (asynchronous, capturable in a CUDA graph); a count of zero still pairs
        /// with the peer's receive of zero.
        ///
        /// The message travels through `peer`'s inbox for this rank ([`INBOX_BYTES`]), so a send
        /// larger than that completes only as `peer` receives: two ranks that exchange messages
        /// must use [`send_recv`](Self::send_recv) or a [`group`](Self::group), not a `send` each
        /// followed by a `recv` (that waits until the time limit, as NCCL would hang outside a
        /// group). A receive of a different size is reported as [`Error::Mismatch`] by the
        /// receiver.
        ///
        /// ```no_run
        /// use p2p_collective::{Communicator, DataType};
        /// use p2p_mem::{DeviceBuffer, Stream};
        /// let comm = Communicator::from_env()?;
        /// let stream = Stream::new(comm.device())?;
        /// let mut buf = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 20)?;
        /// if comm.rank() == 0 {
        ///     comm.send(&buf, 1 << 20, DataType::F32, 1, &stream)?;
        /// } else if comm.rank() == 1 {
        ///     comm.recv(&mut buf, 1 << 20, DataType::F32, 0, &stream)?;
        /// }
        /// comm.synchronize(&stream)?;
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        fn send(buf: &impl DeviceMemory);

        /// Receives `count` elements from rank `peer` into `buf` (see [`send`](Self::send)).
        fn recv(buf: &mut impl DeviceMemoryMut);
    }

    /// Sends `count` elements of `send` to rank `to` and receives `count` elements from rank
    /// `from` into `recv`, both in one kernel, so that neither waits for the other: the
    /// exchange of a ring or a pipeline stage (a [`group`](Self::group) of two). `to` and
    /// `from` may be the same rank; both may be this rank (a local copy).
    #[allow(clippy::too_many_arguments)]
    pub fn send_recv(
        &self,
        send: &impl DeviceMemory,
        to: usize,
        recv: &mut impl DeviceMemoryMut,
        from: usize,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        let mut g = self.group_as("send_recv", stream);
        g.send(send, count, dtype, to)?;
        g.recv(recv, count, dtype, from)?;
        g.launch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(dir: Dir, peer: usize, ptr: u64, bytes: u64) -> Entry {
        Entry {
            dir,
            peer,
            ptr,
            bytes,
        }
    }

    /// `layout` refuses `entries` on `rank` (`what`: the fault), saying `words`.
    fn assert_refused(rank: usize, entries: &[Entry], what: &str, words: &str) {
        let e = layout(rank, entries).expect_err(what).to_string();
        assert!(e.contains(words), "{e}");
    }

    #[test]
    fn receives_come_first_then_copies_then_sends_each_peer_in_adding_order() {
        use Dir::{Recv, Send};
        let entries = [
            e(Send, 2, 0x100, 8),
            e(Recv, 1, 0x200, 4),
            e(Send, 1, 0x300, 16),
            e(Send, 0, 0x400, 32), // to itself (rank 0)
            e(Recv, 2, 0x500, 8),
            e(Send, 2, 0x600, 0),
            e(Recv, 0, 0x700, 32),
            e(Recv, 1, 0x800, 12),
        ];
        let l = layout(0, &entries).expect("layout");
        let got: Vec<(i32, usize, u64)> = l.ops.iter().map(|o| (o.kind, o.peer, o.ptr)).collect();
        assert_eq!(
            got,
            [
                (P2P_RECV, 1, 0x200),
                (P2P_RECV, 1, 0x800),
                (P2P_RECV, 2, 0x500),
                (P2P_COPY, 0, 0x700),
                (P2P_SEND, 1, 0x300),
                (P2P_SEND, 2, 0x100),
                (P2P_SEND, 2, 0x600),
            ]
        );
        assert_eq!(l.ops[3].src, 0x400);
        assert_eq!(l.ops[3].bytes, 32);
        assert_eq!(l.channels, [(0, 2), (2, 1), (3, 1), (4, 1), (5, 2)]);
        assert_eq!(l.receiving_blocks(), 2 * P2P_BLOCKS);
    }

    #[test]
    fn messages_to_itself_pair_in_order_and_must_match() {
        use Dir::{Recv, Send};
        for (entries, what, words) in [
            (
                vec![e(Send, 1, 0x100, 8)],
                "no receive",
                "sends 1 message(s) to itself and receives 0",
            ),
            (
                vec![e(Send, 1, 0x100, 8), e(Recv, 1, 0x200, 4)],
                "sizes differ",
                "has 8 bytes; its receive takes 4",
            ),
            (
                vec![e(Send, 1, 0x100, 64), e(Recv, 1, 0x120, 64)],
                "overlap",
                "overlaps",
            ),
        ] {
            assert_refused(1, &entries, what, words);
        }
        // The same buffer, or nothing to move: no copy at all.
        let same = layout(1, &[e(Send, 1, 0x100, 64), e(Recv, 1, 0x100, 64)]).expect("same");
        assert!(same.ops.is_empty() && same.channels.is_empty());
        let two = [
            e(Recv, 1, 0x300, 8),
            e(Send, 1, 0x100, 16),
            e(Send, 1, 0x200, 8),
            e(Recv, 1, 0x400, 8),
        ];
        assert_refused(1, &two, "the first pair differs", "message 0");
    }

    #[test]
    fn a_full_all_to_all_on_eight_ranks_fits_and_one_more_op_does_not() {
        let mut entries = Vec::new();
        for p in 0..8usize {
            entries.push(e(Dir::Send, p, 0x1000 * (p as u64 + 1), 64));
            entries.push(e(Dir::Recv, p, 0x100000 * (p as u64 + 1), 64));
        }
        let l = layout(3, &entries).expect("15 operations");
        assert_eq!(l.ops.len(), 15); // 7 receives, 1 copy, 7 sends
        assert_eq!(l.channels.len(), 15);
        assert_eq!(l.receiving_blocks(), 7 * P2P_BLOCKS);
        let mut many: Vec<Entry> = (0..=P2P_MAX_OPS as u64)
            .map(|k| e(Dir::Send, 1, 0x10 * k, 8))
            .collect();
        assert!(layout(0, &many[..P2P_MAX_OPS]).is_ok());
        assert_refused(0, &many, "one too many", "at most 32");
        many.clear();
        assert_eq!(layout(0, &many).expect("empty"), Layout::default());
    }

    #[test]
    fn every_receiving_block_must_fit_on_the_gpu() {
        // H200: 132 SMs x 2: receiving from all 7 others of 8 ranks fits.
        assert!(fits(7 * P2P_BLOCKS, 0, 132, 2, 1).is_ok());
        // A100: 108 SMs x 2 = 216 blocks: 7 x 32 = 224 do not; 6 x 32 = 192 do.
        let e = fits(7 * P2P_BLOCKS, 3, 108, 2, 1)
            .expect_err("224 of 216")
            .to_string();
        assert!(
            e.contains("GPU 3 runs at most 216") && e.contains("at most 6 other ranks"),
            "{e}"
        );
        assert!(fits(6 * P2P_BLOCKS, 3, 108, 2, 1).is_ok());
        // Exactly full leaves no room for a sender.
        assert!(fits(64, 0, 32, 2, 1).is_err());
        assert!(fits(0, 0, 1, 1, 1).is_ok());
    }

    #[test]
    fn ranks_sharing_a_gpu_share_its_receiving_blocks() {
        // 4 ranks on one H100 (132 x 2 / 4 = 66 each): receiving from the 3 others needs 96.
        let e = fits(3 * P2P_BLOCKS, 0, 132, 2, 4)
            .expect_err("96 of 66")
            .to_string();
        assert!(
            e.contains("at most 66")
                && e.contains("shared by 4 ranks")
                && e.contains("at most 2 other"),
            "{e}"
        );
        assert!(fits(2 * P2P_BLOCKS, 0, 132, 2, 4).is_ok());
        // Two ranks on one GPU: 132 each, so 3 x 32 still fit.
        assert!(fits(3 * P2P_BLOCKS, 0, 132, 2, 2).is_ok());
        // A share of 0 counts as 1; a GPU too small for one block refuses without a panic.
        assert!(fits(3 * P2P_BLOCKS, 0, 132, 2, 0).is_ok());
        assert!(fits(32, 0, 1, 1, 4).is_err());
    }

    #[test]
    fn the_peers_a_group_may_receive_from_match_what_fits_accepts() {
        for (sms, per_sm, share) in [
            (132, 2, 1),
            (108, 2, 1),
            (132, 2, 4),
            (132, 2, 3),
            (40, 1, 1),
        ] {
            let peers = peers_fitting(sms * per_sm / share);
            assert!(fits(peers * P2P_BLOCKS, 0, sms, per_sm, share).is_ok());
            assert!(fits((peers + 1) * P2P_BLOCKS, 0, sms, per_sm, share).is_err());
        }
        assert_eq!(peers_fitting(132 * 2), 8);
        assert_eq!(peers_fitting(66), 2);
        assert_eq!(peers_fitting(0), 0);
    }
}
