//! Planning a call: which kernel path, how many blocks, how the data is cut into pieces.
//!
//! Pure arithmetic, tested on the host. The kernel (`kernels/coll.cu`) runs `chunks` rounds;
//! in each, block b of the grid handles `piece` elements starting at
//! `chunk * grid * piece + b * piece`. Every rank computes the same plan from the same call,
//! which keeps the per-block step counters in step across ranks.

use crate::settings::Algorithm;

use crate::types::{DataType, Op};

/// Largest all-reduce, in bytes, that can run LL (its lines take twice the data's size in
/// scratch); [`Tuning::ll_max_bytes`] is where the planner switches by default.
pub const LL_MAX_BYTES: usize = crate::abi::LL_MAX_BYTES;

/// Bytes of one (parity, source rank) slot of the LL region (`LL_SLOT_BYTES` in `coll_abi.h`).
pub const LL_SLOT_BYTES: usize = crate::abi::LL_SLOT_BYTES;

/// Chunks of a copy-engine all-reduce ([`Kind::AllReduceCe`], see [`ce_chunk`]): 6 and 8
/// halving chunks measured the same at 1 GiB on 2 x H200 and 6 better at 256 MiB; uniform
/// chunks left a large last chunk to reduce after every copy had landed (perf-notes §30).
pub const CE_CHUNKS: usize = crate::abi::CE_CHUNKS;
/// Chunk edges of a copy-engine all-reduce are multiples of this many bytes.
pub const CE_ALIGN: usize = crate::abi::CE_ALIGN;

/// Most ranks a communicator may have (the kernels' fixed-size peer tables).
pub const MAX_RANKS: usize = crate::abi::MAX_RANKS;
/// Most blocks a collective kernel may use (the sync area's fixed-size tables).
pub const MAX_BLOCKS: u32 = crate::abi::MAX_BLOCKS as u32;
/// Threads per block of every collective kernel (an LL call on two ranks may use fewer: see
/// [`LL2_PIECE`]).
pub const THREADS: u32 = crate::abi::THREADS as u32;
/// 8-byte units per block of an LL call on two ranks (and so its threads per block), while its
/// grid stays within the LL slot's blocks: blocks of 128 threads measured 1.99-2.03 us for a
/// 4 KiB all-reduce under graph where one block of 512 took 2.32, and 2.55 us at 64 KiB where
/// 16 blocks of 512 took 2.76 (perf-notes §28: one SM's stores into the peer are the limit).
pub const LL2_PIECE: u64 = 128;
/// Most blocks of an LL call: each block owns `THREADS` lines of each LL slot.
const LL_GRID: u64 = (LL_SLOT_BYTES / 16 / THREADS as usize) as u64;

/// On two ranks a reduce-scatter on registered buffers reads its part from the peer's input
/// (the direct kernel) only while all parts together are smaller than this: on 2 x H200 the
/// read measured 324 / 330 / 333 GB/s busbw at 256 MiB / 512 MiB / 1 GiB against 312 / 330 /
/// 346 for the push through the scratch (perf-notes section 31), as reads across the link are
/// slower than writes.
pub const RS_DIRECT_MAX_BYTES_TWO_RANKS: usize = 1 << 30;

/// Knobs of the planner; `Tuning::for_device` is what communicators use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Most blocks per call, counted in blocks of [`THREADS`] threads (at most [`MAX_BLOCKS`],
    /// and never more than can be resident at once, so no block waits for a peer block that
    /// cannot start). An LL call on two ranks runs smaller blocks, up to four times as many.
    pub max_blocks: u32,
    /// Most bytes one block moves per chunk (per source rank), a multiple of 16; sets the
    /// scratch size: block b's region of each slot starts at `b * piece_bytes`, whatever the
    /// call's own piece, so that a region is only ever used by the same block index.
    pub piece_bytes: usize,
    /// Bytes per block below which a call uses fewer blocks.
    pub block_bytes: usize,
    /// All-reduces up to `oneshot_max_bytes / n` bytes on n > 2 ranks run one-shot, larger ones
    /// two-shot (two ranks always run one-shot: it moves each byte once).
    pub oneshot_max_bytes: usize,
    /// LL (flags inside the data) runs while each source's data is at most this many bytes on
    /// two and three ranks, and `2 * ll_max_bytes / n` on more (see [`Tuning::ll_limit`]),
    /// unless an algorithm is forced or checking mode is on. 0 turns LL off. At most
    /// [`LL_MAX_BYTES`].
    pub ll_max_bytes: usize,
    /// Broadcasts and reduces on more than two ranks of at least this many bytes split the
    /// data among the non-roots (every GPU's links carry it about once) instead of the root
    /// sending to, or receiving from, every peer.
    pub split_min_bytes: usize,
    /// All-gathers, reduce-scatters and (on more than two ranks) all-to-alls on registered
    /// buffers run the direct kernels from this many bytes (all ranks' parts together) on more
    /// than two ranks, and from twice as many on two; below, the scratch path is faster
    /// (measured on 2 and 4 x H200: perf-notes section 18). On two ranks a reduce-scatter
    /// reads directly only below [`RS_DIRECT_MAX_BYTES_TWO_RANKS`].
    pub direct_min_bytes: usize,
    /// On two ranks, all-gathers and all-to-alls on registered buffers of at least this many
    /// bytes (all ranks' parts together) move the data with the copy engines instead of SMs,
    /// after a barrier kernel: one `cuMemcpyAsync` into each peer's registered output (an
    /// all-to-all out of place only), the own part copied beside it on a second stream when
    /// out of place, then a second barrier. Measured on 2 x H200 (perf-notes sections 29 and
    /// 30): all-gather 381-385 GB/s busbw at 1 GiB in or out of place against 361-362 for the
    /// direct kernel, all-to-all 380-382 against 350 for the SMs and 357-359 for NCCL's
    /// symmetric mode; slower below about 256 MiB. On more than two ranks
    /// [`ce_min_bytes_more_ranks`](Self::ce_min_bytes_more_ranks) takes its place; never in
    /// checking mode. Every rank must make the same choice: a rank whose buffers
    /// are not registered, or (for an all-to-all, and for an all-reduce under
    /// [`ce_all_reduce_min_bytes`](Self::ce_all_reduce_min_bytes)) that calls in place where the others do not,
    /// runs another plan. That is not detected (the barriers compare step numbers; only
    /// checking mode, which never uses the copy engines, compares calls): the results are
    /// undefined, and the call may end at the time limit or report nothing. The copies are
    /// queued whatever the barrier before them finds: after a call that fails (a time limit,
    /// an abort), the contents of the ranks' registered buffers are undefined.
    pub ce_min_bytes: usize,
    /// On more than two ranks, what [`ce_min_bytes`](Self::ce_min_bytes) is on two: all-gathers
    /// and all-to-alls on registered buffers of at least this many bytes (all ranks' parts
    /// together) move by the copy engines, one copy into each peer's output (staggered: rank r
    /// writes to r + 1 first), under the same conditions. Default `usize::MAX` (off): not yet
    /// run on more than two ranks. What it aims at: on 4 x H200 NCCL's copy-engine all-gather
    /// and all-to-all reached 361-387 GB/s busbw at 1 GiB where the direct kernels reached
    /// 342-348 (perf-notes sections 18 and 35).
    pub ce_min_bytes_more_ranks: usize,
    /// On two ranks, out-of-place all-reduces into a registered output of at least this many
    /// bytes run by the copy engines ([`Kind::AllReduceCe`]: each rank's input copied into the
    /// peer's output in [`CE_CHUNKS`] halving chunks while a kernel reduces each chunk as it
    /// lands), with [`ce_min_bytes`](Self::ce_min_bytes)'s conditions. Default 256 MiB: on 2 x
    /// H200 it measured 342-345 / 359-362 / 371-372 GB/s busbw at 256 MiB / 512 MiB / 1 GiB
    /// against 333-337 / 349-351 / 354-357 for one-shot in the same runs (f32 and bf16;
    /// perf-notes section 31). `usize::MAX` turns it off.
    pub ce_all_reduce_min_bytes: usize,
    /// On two ranks, all-reduces above LL's sizes and up to this many bytes run the pipelined
    /// one-shot ([`Kind::AllReducePipe`]: each block's push and reduction overlapped), when
    /// they fit one round of the scratch (`max_blocks * piece_bytes`, 16 MiB on H200). Default
    /// 0 (off): correct in the suites with ranks sharing one GPU, but not yet run across GPUs
    /// or measured (docs/perf-notes.md §33); `P2P_ALGO=pipe` forces it.
    pub pipe_max_bytes: usize,
    /// Bytes per sub-piece of the pipelined one-shot: each block pushes its piece in
    /// sub-pieces of this size, and gives its peers a flag after each. A multiple of 16.
    pub pipe_sub_bytes: usize,
    /// Out-of-place all-gathers and all-to-alls through the scratch of at least this many
    /// bytes (all parts together) copy this rank's own part into its output with the copy
    /// engine, on the communicator's second stream beside the kernel, instead of with the
    /// kernel's SMs ([`Plan::own_by_copy_engine`]). In place, nothing is copied either way.
    /// Default `usize::MAX` (off): correct with ranks sharing one GPU, not yet run across GPUs
    /// (docs/perf-notes.md §34).
    pub ce_own_min_bytes: usize,
    /// Streams that share each copy of an all-gather or all-to-all by the copy engines: 1 (the
    /// default) copies each peer's part in one `cuMemcpyAsync` on the caller's stream; 2 splits
    /// it in halves, the second on the communicator's second stream, so that two copy engines
    /// (an H200 has three) may carry one direction at once. Correct with ranks sharing one
    /// GPU, not yet run across GPUs (docs/perf-notes.md §36). 1 or 2.
    pub ce_streams: usize,
}

impl Tuning {
    /// The defaults for a GPU with `sm_count` SMs that holds `blocks_per_sm` resident blocks
    /// of the collective kernel: up to two blocks per SM (measured on H200: 256 blocks reach
    /// 355 GB/s all-reduce busbw at 1 GiB where 132 reach 310, as one block pushes while
    /// another on the same SM reduces; docs/perf-notes.md, section 10). The size thresholds
    /// come from the sweeps on 2, 3 and 4 x H200 (perf-notes section 18).
    pub fn for_device(sm_count: i32, blocks_per_sm: i32) -> Tuning {
        let per_sm = blocks_per_sm.clamp(1, 2) as u32;
        Tuning {
            max_blocks: (sm_count.max(1) as u32 * per_sm).min(MAX_BLOCKS),
            piece_bytes: 64 << 10,
            block_bytes: 16 << 10,
            oneshot_max_bytes: 3 << 20,
            ll_max_bytes: 512 << 10,
            split_min_bytes: 1 << 20,
            direct_min_bytes: 16 << 20,
            ce_min_bytes: 256 << 20,
            ce_min_bytes_more_ranks: usize::MAX,
            ce_all_reduce_min_bytes: 256 << 20,
            pipe_max_bytes: 0,
            pipe_sub_bytes: 4 << 10,
            ce_own_min_bytes: usize::MAX,
            ce_streams: 1,
        }
    }

    /// The tuning of one of `ranks_per_gpu` ranks that share a GPU: `max_blocks` divided among
    /// them (at least one block each), so that every rank's grid is resident beside the
    /// others' (their kernels wait for each other: a grid that could not start would stall its
    /// peers until the time limit). The same for one rank per GPU. Every rank of a communicator
    /// divides by the most ranks on any one of its GPUs, so that all plan alike.
    pub fn shared_by(self, ranks_per_gpu: usize) -> Tuning {
        let k = u32::try_from(ranks_per_gpu.max(1)).unwrap_or(u32::MAX);
        Tuning {
            max_blocks: (self.max_blocks / k).max(1),
            ..self
        }
    }

    /// How many words [`to_words`](Self::to_words) gives.
    pub const WORDS: usize = 14;

    /// Every knob as a word, for ranks to compare at start-up.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.max_blocks as u64,
            self.piece_bytes as u64,
            self.block_bytes as u64,
            self.oneshot_max_bytes as u64,
            self.ll_max_bytes as u64,
            self.split_min_bytes as u64,
            self.direct_min_bytes as u64,
            self.ce_min_bytes as u64,
            self.ce_min_bytes_more_ranks as u64,
            self.ce_all_reduce_min_bytes as u64,
            self.pipe_max_bytes as u64,
            self.pipe_sub_bytes as u64,
            self.ce_own_min_bytes as u64,
            self.ce_streams as u64,
        ]
    }

    /// The inverse of [`to_words`](Self::to_words); `None` for a wrong length or a value out
    /// of range.
    pub fn from_words(w: &[u64]) -> Option<Tuning> {
        let [b, p, bb, o, l, sp, d, ce, ce_more, ce_ar, pm, ps, own, ces] =
            <[u64; Self::WORDS]>::try_from(w).ok()?;
        Some(Tuning {
            max_blocks: u32::try_from(b).ok()?,
            piece_bytes: usize::try_from(p).ok()?,
            block_bytes: usize::try_from(bb).ok()?,
            oneshot_max_bytes: usize::try_from(o).ok()?,
            ll_max_bytes: usize::try_from(l).ok()?,
            split_min_bytes: usize::try_from(sp).ok()?,
            direct_min_bytes: usize::try_from(d).ok()?,
            ce_min_bytes: usize::try_from(ce).ok()?,
            ce_min_bytes_more_ranks: usize::try_from(ce_more).ok()?,
            ce_all_reduce_min_bytes: usize::try_from(ce_ar).ok()?,
            pipe_max_bytes: usize::try_from(pm).ok()?,
            pipe_sub_bytes: usize::try_from(ps).ok()?,
            ce_own_min_bytes: usize::try_from(own).ok()?,
            ce_streams: usize::try_from(ces).ok()?,
        })
    }

    /// Checks values that reach the kernels: `max_blocks` in `1..=`[`MAX_BLOCKS`] and at most
    /// `resident` (the blocks the GPU holds at once: more would wait for peers that cannot
    /// start), `piece_bytes` a multiple of 16 (it is the distance between blocks' regions of the
    /// scratch) from 1 KiB to 64 MiB, `block_bytes` nonzero, `ll_max_bytes` at most
    /// [`LL_MAX_BYTES`], `pipe_sub_bytes` a nonzero multiple of 16, `ce_streams` 1 or 2, and a
    /// workspace for `world` ranks that fits a `usize`.
    pub fn validate(&self, resident: u32, world: usize) -> Result<(), String> {
        if self.max_blocks == 0 || self.max_blocks > MAX_BLOCKS.min(resident.max(1)) {
            return Err(format!(
                "max_blocks = {} must be 1 to {} (the kernel's limit {MAX_BLOCKS}, and the {resident} blocks this GPU holds at once)",
                self.max_blocks,
                MAX_BLOCKS.min(resident.max(1))
            ));
        }
        if !(1 << 10..=64 << 20).contains(&self.piece_bytes) || self.piece_bytes % 16 != 0 {
            return Err(format!(
                "piece_bytes = {} must be a multiple of 16 from 1 KiB to 64 MiB",
                self.piece_bytes
            ));
        }
        if self.block_bytes == 0 {
            return Err("block_bytes must be nonzero".into());
        }
        if self.pipe_sub_bytes == 0 || self.pipe_sub_bytes % 16 != 0 {
            return Err(format!(
                "pipe_sub_bytes = {} must be a nonzero multiple of 16",
                self.pipe_sub_bytes
            ));
        }
        if !(1..=2).contains(&self.ce_streams) {
            return Err(format!("ce_streams = {} must be 1 or 2", self.ce_streams));
        }
        if self.ll_max_bytes > LL_MAX_BYTES {
            return Err(format!(
                "ll_max_bytes = {} is above LL_MAX_BYTES = {LL_MAX_BYTES}",
                self.ll_max_bytes
            ));
        }
        (self.max_blocks as usize)
            .checked_mul(self.piece_bytes)
            .and_then(|slot| slot.checked_mul(2 * world))
            .ok_or_else(|| "the workspace size overflows".to_string())?;
        Ok(())
    }

    /// Bytes of one (parity, source rank) slot of a rank's scratch.
    pub fn slot_bytes(&self) -> usize {
        (self.max_blocks as usize).saturating_mul(self.piece_bytes)
    }

    /// Most bytes per source that run LL by default on `world` ranks: `ll_max_bytes` on two and
    /// three ranks, `2 * ll_max_bytes / world` on more (each rank polls more sources, and LL's
    /// doubled bytes cost more: the crossover measured on 4 ranks was 256 KiB).
    pub fn ll_limit(&self, world: usize) -> usize {
        if world <= 3 {
            self.ll_max_bytes
        } else {
            self.ll_max_bytes.saturating_mul(2) / world
        }
    }
}

/// What a kernel launch does; the numbers are the `Kind` enum of `coll_abi.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Kind {
    /// All-reduce, one-shot.
    AllReduceOneShot = crate::abi::K_ALLREDUCE_ONESHOT,
    /// All-reduce, two-shot.
    AllReduceTwoShot = crate::abi::K_ALLREDUCE_TWOSHOT,
    /// Reduce to a root.
    Reduce = crate::abi::K_REDUCE,
    /// Broadcast from a root.
    Broadcast = crate::abi::K_BROADCAST,
    /// All-gather.
    AllGather = crate::abi::K_ALLGATHER,
    /// Reduce-scatter.
    ReduceScatter = crate::abi::K_REDUCESCATTER,
    /// All-to-all.
    AllToAll = crate::abi::K_ALLTOALL,
    /// All-reduce around a ring.
    AllReduceRing = crate::abi::K_ALLREDUCE_RING,
    /// All-reduce one-shot with flags inside the data (LL).
    AllReduceLl = crate::abi::K_ALLREDUCE_LL,
    /// Broadcast split among the non-roots: the root sends part j to the j-th non-root, which
    /// forwards it to the others.
    BroadcastSplit = crate::abi::K_BROADCAST_SPLIT,
    /// Reduce split among the non-roots: the j-th non-root reduces part j over every rank and
    /// sends it to the root.
    ReduceSplit = crate::abi::K_REDUCE_SPLIT,
    /// All-gather through LL lines.
    AllGatherLl = crate::abi::K_ALLGATHER_LL,
    /// Reduce-scatter through LL lines.
    ReduceScatterLl = crate::abi::K_REDUCESCATTER_LL,
    /// All-to-all through LL lines.
    AllToAllLl = crate::abi::K_ALLTOALL_LL,
    /// Broadcast through LL lines.
    BroadcastLl = crate::abi::K_BROADCAST_LL,
    /// Reduce through LL lines.
    ReduceLl = crate::abi::K_REDUCE_LL,
    /// All-reduce on registered buffers: each rank reads its part from every peer's input,
    /// reduces it and writes it into every peer's output.
    AllReduceDirect = crate::abi::K_ALLREDUCE_DIRECT,
    /// All-gather into every peer's registered output.
    AllGatherDirect = crate::abi::K_ALLGATHER_DIRECT,
    /// Reduce-scatter reading every peer's registered input.
    ReduceScatterDirect = crate::abi::K_REDUCESCATTER_DIRECT,
    /// All-to-all into every peer's registered output.
    AllToAllDirect = crate::abi::K_ALLTOALL_DIRECT,
    /// All-gather into every peer's registered output by the copy engines, between two
    /// barrier kernels (out of place, this rank's own part copied beside them on a second
    /// stream).
    AllGatherCe = crate::abi::K_ALLGATHER_CE,
    /// All-reduce on two ranks, out of place into registered outputs: after a barrier kernel
    /// the copy engines carry each rank's input into the peer's output in [`CE_CHUNKS`]
    /// chunks, each flagged when it lands, while a kernel on a second stream reduces each
    /// chunk as its flag arrives.
    AllReduceCe = crate::abi::K_ALLREDUCE_CE,
    /// All-to-all into every peer's registered output by the copy engines, between two barrier
    /// kernels, this rank's own part copied beside them on a second stream.
    AllToAllCe = crate::abi::K_ALLTOALL_CE,
    /// All-reduce, one-shot through the scratch with each block's push and reduction
    /// overlapped: half its warps push sub-pieces and flag each, the other half reduce each
    /// sub-piece as its flags arrive. One round of the scratch at most. Not yet run on a GPU
    /// (docs/perf-notes.md §33).
    AllReducePipe = crate::abi::K_ALLREDUCE_PIPE,
}

impl Kind {
    /// Every kind, by code.
    pub const ALL: [Kind; 24] = [
        Kind::AllReduceOneShot,
        Kind::AllReduceTwoShot,
        Kind::Reduce,
        Kind::Broadcast,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::AllToAll,
        Kind::AllReduceRing,
        Kind::AllReduceLl,
        Kind::BroadcastSplit,
        Kind::ReduceSplit,
        Kind::AllGatherLl,
        Kind::ReduceScatterLl,
        Kind::AllToAllLl,
        Kind::BroadcastLl,
        Kind::ReduceLl,
        Kind::AllReduceDirect,
        Kind::AllGatherDirect,
        Kind::ReduceScatterDirect,
        Kind::AllToAllDirect,
        Kind::AllGatherCe,
        Kind::AllReduceCe,
        Kind::AllToAllCe,
        Kind::AllReducePipe,
    ];

    /// The kind with code `code`, as the kernel records it in its status.
    pub fn from_code(code: u64) -> Option<Kind> {
        Kind::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// The collective this kind carries out.
    pub fn op(self) -> Op {
        match self {
            Kind::AllReduceOneShot
            | Kind::AllReduceTwoShot
            | Kind::AllReduceRing
            | Kind::AllReduceLl
            | Kind::AllReduceDirect
            | Kind::AllReduceCe
            | Kind::AllReducePipe => Op::AllReduce,
            Kind::Reduce | Kind::ReduceSplit | Kind::ReduceLl => Op::Reduce,
            Kind::Broadcast | Kind::BroadcastSplit | Kind::BroadcastLl => Op::Broadcast,
            Kind::AllGather | Kind::AllGatherLl | Kind::AllGatherDirect | Kind::AllGatherCe => {
                Op::AllGather
            }
            Kind::ReduceScatter | Kind::ReduceScatterLl | Kind::ReduceScatterDirect => {
                Op::ReduceScatter
            }
            Kind::AllToAll | Kind::AllToAllLl | Kind::AllToAllDirect | Kind::AllToAllCe => {
                Op::AllToAll
            }
        }
    }

    /// The all-reduce algorithm, for the all-reduce kinds that `P2P_ALGO` can force.
    pub fn algorithm(self) -> Option<Algorithm> {
        match self {
            Kind::AllReduceOneShot => Some(Algorithm::OneShot),
            Kind::AllReduceTwoShot => Some(Algorithm::TwoShot),
            Kind::AllReduceRing => Some(Algorithm::Ring),
            Kind::AllReduceLl => Some(Algorithm::Ll),
            Kind::AllReducePipe => Some(Algorithm::Pipe),
            _ => None,
        }
    }

    /// Whether the kind moves data through LL lines (one step, flags inside the data).
    pub fn is_ll(self) -> bool {
        matches!(
            self,
            Kind::AllReduceLl
                | Kind::AllGatherLl
                | Kind::ReduceScatterLl
                | Kind::AllToAllLl
                | Kind::BroadcastLl
                | Kind::ReduceLl
        )
    }

    /// Whether the kind reads or writes peers' registered buffers directly.
    pub fn is_direct(self) -> bool {
        matches!(
            self,
            Kind::AllReduceDirect
                | Kind::AllGatherDirect
                | Kind::ReduceScatterDirect
                | Kind::AllToAllDirect
        )
    }

    /// Whether the copy engines move the data (after a barrier kernel).
    pub fn is_ce(self) -> bool {
        matches!(
            self,
            Kind::AllGatherCe | Kind::AllReduceCe | Kind::AllToAllCe
        )
    }

    /// A short name for logs and results: `ll`, `direct`, `ce`, `split`, `oneshot`, ... or `-`.
    pub fn variant(self) -> &'static str {
        if self.is_ll() {
            "ll"
        } else if self.is_ce() {
            "ce"
        } else if self.is_direct() {
            "direct"
        } else if matches!(self, Kind::BroadcastSplit | Kind::ReduceSplit) {
            "split"
        } else {
            self.algorithm().map_or("-", Algorithm::name)
        }
    }
}

/// Which of a call's buffers peers can reach directly: every rank registered them
/// ([`Communicator::register`](crate::Communicator::register)), so the kernel reads peers'
/// inputs and writes peers' outputs without staging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Every rank's input is registered.
    pub input: bool,
    /// Every rank's output is registered.
    pub output: bool,
    /// The call is in place (an all-to-all in place cannot write into peers directly: a peer
    /// may still be reading the part it is about to receive).
    pub in_place: bool,
}

impl Access {
    /// Plain buffers: everything goes through the registered scratch.
    pub const NONE: Access = Access {
        input: false,
        output: false,
        in_place: false,
    };
}

/// How one call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The kernel path.
    pub kind: Kind,
    /// The type the kernel works in: the call's type for reductions, bytes (`U8`) for copies.
    pub kernel_type: DataType,
    /// Elements of `kernel_type` per segment (the whole call for all-reduce, broadcast and
    /// reduce; one rank's part for all-gather, reduce-scatter and all-to-all).
    pub units: u64,
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block: [`THREADS`], or for LL on two ranks `piece` rounded up to a warp.
    pub threads: u32,
    /// Elements per block per chunk (a whole number of 16-byte vectors); for LL, 8-byte units
    /// per block; for the direct kinds, elements per block of the rank's share.
    pub piece: u64,
    /// For [`Kind::AllReducePipe`], elements per sub-piece (a whole number of 16-byte
    /// vectors); 0 for the other kinds.
    pub sub: u64,
    /// An all-gather or all-to-all through the scratch, out of place, whose own part the copy
    /// engine copies on a second stream beside the kernel (see [`Tuning::ce_own_min_bytes`]).
    pub own_by_copy_engine: bool,
    /// Rounds over the data.
    pub chunks: u64,
    /// Why this algorithm, for the log.
    pub reason: &'static str,
}

impl Plan {
    /// Barrier steps each block takes (each a flag exchange with every peer, or for LL one
    /// exchange of lines).
    pub fn steps(&self, world: usize) -> u64 {
        let per_chunk = match self.kind {
            Kind::AllReduceTwoShot
            | Kind::BroadcastSplit
            | Kind::ReduceSplit
            | Kind::AllReduceDirect
            | Kind::AllGatherDirect
            | Kind::ReduceScatterDirect
            | Kind::AllToAllDirect => 2,
            // Two barrier kernels of two barriers each.
            Kind::AllGatherCe | Kind::AllToAllCe => 4,
            // One barrier kernel; the reduce kernel waits for flags, not steps.
            Kind::AllReduceCe => 2,
            Kind::AllReduceRing => (world as u64).saturating_sub(1).saturating_mul(2),
            // One flag per sub-piece, the count rounded up to odd (see `run_pipe`).
            Kind::AllReducePipe => self.piece.div_ceil(self.sub.max(1)) | 1,
            _ => 1,
        };
        self.chunks.saturating_mul(per_chunk)
    }
}

/// Plans `op` over `count` elements of `dtype` on `world` ranks, through the scratch (no
/// registered buffers).
///
/// `count` follows NCCL (see [`Op::buffer_lens`]). A count of 0 plans too, though
/// communicators never launch one (zero counts are no-ops).
pub fn plan(
    op: Op,
    dtype: DataType,
    count: usize,
    world: usize,
    forced: Option<Algorithm>,
    tuning: &Tuning,
) -> Plan {
    plan_with(op, dtype, count, world, forced, tuning, Access::NONE)
}

/// As [`plan`], knowing which buffers peers can reach directly.
pub fn plan_with(
    op: Op,
    dtype: DataType,
    count: usize,
    world: usize,
    forced: Option<Algorithm>,
    tuning: &Tuning,
    access: Access,
) -> Plan {
    let world = world.max(1);
    // Bytes of one source's data: the whole buffer, or one rank's part. (Saturating: a count no
    // communicator accepts, 2^40 elements or more, still plans, as the largest size.)
    let seg_bytes = count.saturating_mul(dtype.size());
    let all_parts = seg_bytes.saturating_mul(world);
    // The direct kernels on rank parts need the parts 16-byte aligned (else they copy bytes:
    // 3 ranks of a power-of-two size measured 1.5x slower than the scratch path) and enough
    // data to pay for their start and end barriers across every peer.
    let direct_min = if world > 2 {
        tuning.direct_min_bytes
    } else {
        tuning.direct_min_bytes.saturating_mul(2)
    };
    let parts_direct = seg_bytes % 16 == 0 && all_parts >= direct_min;
    // The copy engines for a registered all-gather or all-to-all, all parts together.
    let ce_min = if world > 2 {
        tuning.ce_min_bytes_more_ranks
    } else {
        tuning.ce_min_bytes
    };
    let ce_parts = world >= 2 && all_parts >= ce_min;
    let (kind, reason) = match op {
        Op::AllReduce => choose_all_reduce(seg_bytes, world, forced, tuning, access),
        _ if ll_default(seg_bytes, world, tuning) => (
            ll_kind(op),
            "small: flags inside the data (LL), one crossing, no fence or flag",
        ),
        Op::Broadcast if world > 2 && seg_bytes >= tuning.split_min_bytes => (
            Kind::BroadcastSplit,
            "large on > 2 ranks: the root sends each non-root a part, which it forwards to the others",
        ),
        Op::Broadcast => (Kind::Broadcast, "the root pushes to every peer"),
        Op::Reduce if world > 2 && seg_bytes >= tuning.split_min_bytes => (
            Kind::ReduceSplit,
            "large on > 2 ranks: each non-root reduces a part over every rank and sends it to the root",
        ),
        Op::Reduce => (Kind::Reduce, "every peer pushes to the root"),
        Op::AllGather if access.output && ce_parts => (
            Kind::AllGatherCe,
            if world == 2 {
                "registered, large, 2 ranks: the copy engines write into the peer's buffer"
            } else {
                "registered, large (ce_min_bytes_more_ranks): the copy engines write into every peer's buffer"
            },
        ),
        Op::AllGather if access.output && parts_direct => (
            Kind::AllGatherDirect,
            "registered output: every rank writes into every peer's output",
        ),
        Op::AllGather => (Kind::AllGather, "every rank pushes to every peer"),
        Op::ReduceScatter
            if access.input
                && parts_direct
                && (world != 2 || all_parts < RS_DIRECT_MAX_BYTES_TWO_RANKS) =>
        {
            (
                Kind::ReduceScatterDirect,
                "registered input: every rank reads its part from every peer's input",
            )
        }
        Op::ReduceScatter if access.input && parts_direct => (
            Kind::ReduceScatter,
            "registered input, but 1 GiB or more on 2 ranks: pushing through the scratch measured faster than reading the peer's input",
        ),
        Op::ReduceScatter => (
            Kind::ReduceScatter,
            "every rank pushes each part to its owner",
        ),
        Op::AllToAll if access.output && !access.in_place && ce_parts => (
            Kind::AllToAllCe,
            if world == 2 {
                "registered output, large, 2 ranks: the copy engines write the peer's part into its output"
            } else {
                "registered output, large (ce_min_bytes_more_ranks): the copy engines write each peer's part into its output"
            },
        ),
        Op::AllToAll if access.output && !access.in_place && world > 2 && parts_direct => (
            Kind::AllToAllDirect,
            "registered output: every rank writes each part into its owner's output",
        ),
        Op::AllToAll => (Kind::AllToAll, "every rank pushes each part to its owner"),
    };
    let kernel_type = if op.reduces() { dtype } else { DataType::U8 };
    let elem = kernel_type.size();
    let units = (seg_bytes / elem) as u64;
    // What one rank moves: the whole buffer for all-reduce, broadcast and reduce; its n parts
    // for the others.
    let bytes = match op {
        Op::AllGather | Op::ReduceScatter | Op::AllToAll => all_parts,
        _ => seg_bytes,
    };
    let pipe = match kind {
        Kind::AllReducePipe => pipe_shape(seg_bytes, elem, tuning),
        _ => None,
    };
    // (grid, threads, piece, sub, chunks)
    let (kind, shape) = if kind.is_ce() {
        // No kernel moves data: one block runs each barrier around the copies; the all-reduce's
        // reduce kernel runs a block per SM (measured: 32 blocks lost 10-15 % at 256 MiB-1 GiB,
        // perf-notes §30).
        let grid = if kind == Kind::AllReduceCe {
            (tuning.max_blocks / 2).max(1)
        } else {
            1
        };
        (kind, (grid, THREADS, 1, 0, 1))
    } else if kind.is_ll() {
        // 8-byte units, one per thread; one round. Each block owns THREADS lines of each LL
        // slot whatever the grid (see `coll.cu`), so at most LL_GRID = 128 blocks; `ll_fits`
        // kept the grid within the tuning's resident blocks.
        let (grid, piece, threads) = ll_shape(seg_bytes, world);
        (kind, (grid, threads, piece, 0, 1))
    } else if kind.is_direct() {
        // One pass, no scratch: each block takes a contiguous share of what this rank handles
        // (its part of the data for all-reduce, a rank's part for the others).
        let grid = grid_for(bytes, tuning);
        let share = if kind == Kind::AllReduceDirect {
            units.div_ceil(world as u64)
        } else {
            units
        };
        let per_vec = (16 / elem) as u64;
        let piece = share.div_ceil(grid as u64).div_ceil(per_vec).max(1) * per_vec;
        (kind, (grid, THREADS, piece, 0, 1))
    } else if let Some((grid, piece, sub)) = pipe {
        (kind, (grid, THREADS, piece, sub, 1))
    } else {
        // The stepped kinds through the scratch: pieces of at most `piece_bytes` (a block's
        // region of a slot), as many rounds as it takes. (A pipelined plan that would not fit
        // one round, which `choose_all_reduce` never makes, runs one-shot.)
        let kind = match kind {
            Kind::AllReducePipe => Kind::AllReduceOneShot,
            k => k,
        };
        let grid = grid_for(seg_bytes, tuning);
        // (At least one vector: a count of 0, which communicators never launch, plans too.)
        let piece_bytes = seg_bytes
            .div_ceil(grid as usize)
            .next_multiple_of(16)
            .clamp(16, tuning.piece_bytes.max(16) / 16 * 16);
        let piece = (piece_bytes / elem) as u64;
        let chunks = units.div_ceil(piece * grid as u64);
        (kind, (grid, THREADS, piece, 0, chunks))
    };
    let (grid, threads, piece, sub, chunks) = shape;
    let own_by_copy_engine = matches!(kind, Kind::AllGather | Kind::AllToAll)
        && !access.in_place
        && bytes >= tuning.ce_own_min_bytes;
    Plan {
        kind,
        kernel_type,
        units,
        grid,
        threads,
        piece,
        sub,
        own_by_copy_engine,
        chunks,
        reason,
    }
}

/// Blocks for `bytes`: about `block_bytes` per block, within the resident blocks.
fn grid_for(bytes: usize, tuning: &Tuning) -> u32 {
    bytes
        .div_ceil(tuning.block_bytes.max(16))
        .clamp(1, tuning.max_blocks.max(1) as usize) as u32
}

/// The grid, piece and sub-piece (elements of `elem` bytes) of a pipelined all-reduce of
/// `bytes` ([`Kind::AllReducePipe`]), or `None` for no data or where its piece would pass the
/// tuning's `piece_bytes` (the kernel runs one round of the scratch).
fn pipe_shape(bytes: usize, elem: usize, tuning: &Tuning) -> Option<(u32, u64, u64)> {
    let grid = grid_for(bytes, tuning);
    let piece_bytes = bytes.div_ceil(grid as usize).next_multiple_of(16);
    if piece_bytes == 0 || piece_bytes > tuning.piece_bytes {
        return None;
    }
    let sub_bytes = (tuning.pipe_sub_bytes / 16 * 16).clamp(16, piece_bytes);
    let elem = elem.max(1);
    Some((grid, (piece_bytes / elem) as u64, (sub_bytes / elem) as u64))
}

/// The grid, piece (8-byte units per block) and threads per block of an LL call whose sources
/// send `seg_bytes` each. Two ranks: pieces of [`LL2_PIECE`] units (more where the grid would
/// pass the slot's blocks), one warp-rounded thread per unit. More ranks: up to `THREADS` units
/// per block, as measured on 4 GPUs (smaller blocks there are not measured yet).
fn ll_shape(seg_bytes: usize, world: usize) -> (u32, u64, u32) {
    let units8 = (seg_bytes.div_ceil(8) as u64).max(1);
    if world == 2 {
        let grid = units8.div_ceil(LL2_PIECE).min(LL_GRID);
        let piece = units8.div_ceil(grid);
        let threads = piece.next_multiple_of(32).min(THREADS as u64) as u32;
        return (grid as u32, piece, threads);
    }
    let grid = units8.div_ceil(THREADS as u64);
    (grid as u32, units8.div_ceil(grid), THREADS)
}

fn ll_kind(op: Op) -> Kind {
    match op {
        Op::AllReduce => Kind::AllReduceLl,
        Op::AllGather => Kind::AllGatherLl,
        Op::ReduceScatter => Kind::ReduceScatterLl,
        Op::AllToAll => Kind::AllToAllLl,
        Op::Broadcast => Kind::BroadcastLl,
        Op::Reduce => Kind::ReduceLl,
    }
}

/// Whether LL runs by default for `seg_bytes` per source on `world` ranks.
fn ll_default(seg_bytes: usize, world: usize, tuning: &Tuning) -> bool {
    seg_bytes <= tuning.ll_limit(world) && ll_fits(seg_bytes, world, tuning)
}

fn choose_all_reduce(
    bytes: usize,
    world: usize,
    forced: Option<Algorithm>,
    tuning: &Tuning,
    access: Access,
) -> (Kind, &'static str) {
    match forced {
        Some(Algorithm::OneShot) => return (Kind::AllReduceOneShot, "forced by P2P_ALGO/Options"),
        Some(Algorithm::TwoShot) => return (Kind::AllReduceTwoShot, "forced by P2P_ALGO/Options"),
        // The ring's steps are 2(n-1): on one rank none, and its last copy would read a slot
        // that nothing wrote.
        Some(Algorithm::Ring) if world == 1 => {
            return (
                Kind::AllReduceOneShot,
                "ring forced, but a ring of one rank has no steps: one-shot",
            )
        }
        Some(Algorithm::Ring) => return (Kind::AllReduceRing, "forced by P2P_ALGO/Options"),
        Some(Algorithm::Ll) if ll_fits(bytes, world, tuning) => {
            return (Kind::AllReduceLl, "forced by P2P_ALGO/Options")
        }
        Some(Algorithm::Ll) => {
            return (
                Kind::AllReduceOneShot,
                "LL forced, but the call passes LL's 512 KiB or the resident blocks: one-shot",
            )
        }
        Some(Algorithm::Pipe) if pipe_shape(bytes, 1, tuning).is_some() => {
            return (Kind::AllReducePipe, "forced by P2P_ALGO/Options")
        }
        Some(Algorithm::Pipe) => {
            return (
                Kind::AllReduceOneShot,
                "pipe forced, but the call passes one round of the scratch (max_blocks x piece_bytes): one-shot",
            )
        }
        None => {}
    }
    if ll_default(bytes, world, tuning) {
        (
            Kind::AllReduceLl,
            "small: flags inside the data (LL), one crossing, no fence or flag",
        )
    } else if world == 2
        && access.output
        && !access.in_place
        && bytes >= tuning.ce_all_reduce_min_bytes
    {
        (
            Kind::AllReduceCe,
            "registered output, out of place, large, 2 ranks: the copy engines carry each input into the peer's output while a kernel reduces each chunk as it lands",
        )
    } else if world == 2 && bytes <= tuning.pipe_max_bytes && pipe_shape(bytes, 1, tuning).is_some()
    {
        (
            Kind::AllReducePipe,
            "2 ranks, within one round of the scratch: one-shot with each block's push and reduction overlapped",
        )
    } else if access.input && access.output && world > 2 {
        // On two ranks one-shot already moves each byte once; direct measured no faster.
        (
            Kind::AllReduceDirect,
            "registered buffers: each rank reads its part from every peer, reduces it and writes it into every peer",
        )
    } else if world <= 2 {
        (
            Kind::AllReduceOneShot,
            "2 ranks: one-shot sends each byte once, as a ring would, in one step",
        )
    } else if bytes <= tuning.oneshot_max_bytes / world {
        (
            Kind::AllReduceOneShot,
            "small: one step beats the extra bytes",
        )
    } else {
        (
            Kind::AllReduceTwoShot,
            "large: two-shot moves 2(n-1)/n of the data in two steps",
        )
    }
}

/// Elements `[lo, hi)` of chunk `k` (of [`CE_CHUNKS`]) of a copy-engine all-reduce of `n`
/// elements of `elem` bytes: half the data, a quarter, ..., the last chunk the rest, each edge
/// rounded down to [`CE_ALIGN`] bytes. `coll.cu`'s `ce_chunk` is the same formula: the copies
/// follow this one, the reduce kernel that one.
/// A `k` past the last chunk gives the empty range at `n`.
pub fn ce_chunk(k: usize, n: u64, elem: usize) -> (u64, u64) {
    if k >= CE_CHUNKS {
        return (n, n);
    }
    let align = (CE_ALIGN / elem.max(1)).max(1) as u64;
    let edge = |j: usize| (n - (n >> j)) / align * align;
    let lo = if k == 0 { 0 } else { edge(k) };
    let hi = if k + 1 == CE_CHUNKS { n } else { edge(k + 1) };
    (lo, hi)
}

/// Whether `bytes` per source fit LL: at most [`LL_MAX_BYTES`], and its grid (see `ll_shape`)
/// within the tuning's resident blocks, counted in blocks of `THREADS` threads.
fn ll_fits(bytes: usize, world: usize, tuning: &Tuning) -> bool {
    let (grid, _, threads) = ll_shape(bytes, world);
    bytes <= LL_MAX_BYTES
        && (grid as u64 * threads as u64).div_ceil(THREADS as u64) <= tuning.max_blocks as u64
}

/// The 64-bit signature of a call that ranks compare in checking mode:
/// kind (5 bits), type (4), reduction (3), root (8), count (44).
pub fn signature(kind: Kind, dtype: DataType, redop: i32, root: usize, count: usize) -> u64 {
    (kind as u64 & 0x1f)
        | ((dtype.index() as u64 & 0xf) << 5)
        | ((redop as u64 & 0x7) << 9)
        | ((root as u64 & 0xff) << 12)
        | ((count as u64 & ((1 << 44) - 1)) << 20)
}

/// A signature in words, e.g. `all_reduce (oneshot) float sum, count 1024`.
pub fn describe(sig: u64) -> String {
    let kind = Kind::from_code(sig & 0x1f);
    let dtype = DataType::ALL.get(((sig >> 5) & 0xf) as usize);
    let redop = crate::types::RedOp::ALL.get(((sig >> 9) & 0x7) as usize);
    let root = (sig >> 12) & 0xff;
    let count = sig >> 20;
    let Some(kind) = kind else {
        return format!("an unknown call (signature {sig:#x})");
    };
    let op = kind.op();
    let mut s = op.name().to_string();
    if kind.variant() != "-" {
        s += &format!(" ({})", kind.variant());
    }
    if let Some(d) = dtype {
        s += &format!(" {d}");
    }
    if op.reduces() {
        if let Some(r) = redop {
            s += &format!(" {r}");
        }
    }
    if op.rooted() {
        s += &format!(" root {root}");
    }
    s + &format!(", count {count}")
}

#[cfg(test)]
mod validate_tests {
    use super::*;

    #[test]
    fn tuning_values_that_would_break_the_kernels_are_refused() {
        let ok = Tuning::for_device(132, 2);
        assert_eq!(ok.validate(264, 8), Ok(()));
        let bad = [
            Tuning {
                max_blocks: 0,
                ..ok
            },
            Tuning {
                max_blocks: MAX_BLOCKS + 1,
                ..ok
            },
            Tuning {
                max_blocks: 200,
                ..ok
            }, // more than 132 x 1 resident
            Tuning {
                piece_bytes: 0,
                ..ok
            },
            Tuning {
                piece_bytes: usize::MAX / 2,
                ..ok
            },
            Tuning {
                block_bytes: 0,
                ..ok
            },
            Tuning {
                ll_max_bytes: LL_MAX_BYTES + 1,
                ..ok
            },
            Tuning {
                piece_bytes: (64 << 10) + 4,
                ..ok
            },
            Tuning {
                pipe_sub_bytes: 0,
                ..ok
            },
            Tuning {
                pipe_sub_bytes: 4100,
                ..ok
            },
            Tuning {
                ce_streams: 0,
                ..ok
            },
            Tuning {
                ce_streams: 3,
                ..ok
            },
        ];
        assert_eq!(
            Tuning {
                ce_streams: 2,
                ..ok
            }
            .validate(264, 8),
            Ok(())
        );
        for t in bad {
            assert!(t.validate(132, 8).is_err(), "{t:?} accepted");
        }
    }

    #[test]
    fn ranks_sharing_a_gpu_split_its_resident_blocks() {
        // H100/H200: 132 SMs x 2 blocks = 264 resident, capped at MAX_BLOCKS.
        let one = Tuning::for_device(132, 2);
        assert_eq!(one.shared_by(1), one);
        assert_eq!(one.shared_by(0), one);
        for k in 2..=MAX_RANKS {
            let t = one.shared_by(k);
            assert_eq!(t.max_blocks, one.max_blocks / k as u32);
            // Every rank's grid fits beside the others', and the rest is unchanged.
            assert!(t.max_blocks as usize * k <= 264, "{k} ranks: {t:?}");
            assert_eq!(t.validate(264 / k as u32, k), Ok(()));
            assert_eq!(
                Tuning {
                    max_blocks: one.max_blocks,
                    ..t
                },
                one
            );
        }
        // Never below one block, whatever the share.
        let small = Tuning {
            max_blocks: 3,
            ..one
        };
        assert_eq!(small.shared_by(8).max_blocks, 1);
        assert_eq!(small.shared_by(usize::MAX).max_blocks, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of a call's buffers are registered, and whether it is in place.
    fn access(input: bool, output: bool, in_place: bool) -> Access {
        Access {
            input,
            output,
            in_place,
        }
    }

    fn t() -> Tuning {
        Tuning::for_device(132, 1)
    }

    /// The plan of an all-reduce of `count` elements of `dtype` on `world` ranks with
    /// `algorithm` forced.
    fn forced(
        dtype: DataType,
        count: usize,
        world: usize,
        algorithm: Algorithm,
        tuning: &Tuning,
    ) -> Plan {
        plan(Op::AllReduce, dtype, count, world, Some(algorithm), tuning)
    }

    /// As `t()` with LL off: the plans of the pushed-data kinds at every size.
    fn no_ll() -> Tuning {
        Tuning {
            ll_max_bytes: 0,
            ..t()
        }
    }

    #[test]
    fn without_ll_two_ranks_go_one_shot_and_more_go_two_shot_when_large() {
        for count in [1, 1000, 1 << 28] {
            assert_eq!(
                plan(Op::AllReduce, DataType::F32, count, 2, None, &no_ll()).kind,
                Kind::AllReduceOneShot
            );
        }
        assert_eq!(
            plan(Op::AllReduce, DataType::F32, 1024, 8, None, &no_ll()).kind,
            Kind::AllReduceOneShot
        );
        assert_eq!(
            plan(Op::AllReduce, DataType::F32, 1 << 20, 8, None, &no_ll()).kind,
            Kind::AllReduceTwoShot
        );
        assert_eq!(
            forced(DataType::F32, 7, 2, Algorithm::Ring, &no_ll()).kind,
            Kind::AllReduceRing
        );
    }

    #[test]
    fn pieces_cover_every_element_in_whole_vectors_and_fit_the_scratch() {
        let pipelined = Tuning {
            pipe_max_bytes: 16 << 20,
            ..no_ll()
        };
        for (tuning, op) in [no_ll(), pipelined]
            .into_iter()
            .flat_map(|t| Op::ALL.map(|op| (t, op)))
        {
            for dtype in DataType::ALL {
                for count in [1usize, 7, 1023, 65537, (1 << 20) + 3, 64 << 20] {
                    for world in [2, 3, 8] {
                        let p = plan(op, dtype, count, world, None, &tuning);
                        let elem = p.kernel_type.size();
                        assert_eq!(p.units as usize * elem, count * dtype.size());
                        assert!(p.grid >= 1 && p.grid <= tuning.max_blocks);
                        assert_eq!(p.piece as usize * elem % 16, 0, "{op} {dtype} {count}");
                        assert!(p.piece as usize * elem <= tuning.piece_bytes);
                        assert!(p.chunks * p.piece * p.grid as u64 >= p.units);
                        // No chunk is wholly empty.
                        assert!((p.chunks - 1) * p.piece * (p.grid as u64) < p.units);
                        assert!(p.grid as usize * p.piece as usize * elem <= tuning.slot_bytes());
                    }
                }
            }
        }
    }

    #[test]
    fn small_calls_use_one_block_and_large_ones_all() {
        let p = plan(Op::AllReduce, DataType::F32, 2048, 2, None, &no_ll());
        assert_eq!((p.grid, p.chunks), (1, 1));
        let p = plan(Op::AllReduce, DataType::F32, 1 << 28, 2, None, &no_ll());
        assert_eq!(p.grid, 132);
        assert_eq!(p.piece * 4, 64 << 10);
        // Two resident blocks per SM double the grid, within MAX_BLOCKS.
        let two = Tuning::for_device(132, 2);
        assert_eq!(two.max_blocks, 256);
        assert_eq!(
            plan(Op::AllReduce, DataType::F32, 1 << 28, 2, None, &two).grid,
            256
        );
        assert_eq!(Tuning::for_device(100, 4).max_blocks, 200);
    }

    #[test]
    fn copies_move_bytes_and_reductions_elements() {
        let p = plan(Op::AllGather, DataType::F64, 10, 2, None, &t());
        assert_eq!((p.kernel_type, p.units), (DataType::U8, 80));
        let p = plan(Op::ReduceScatter, DataType::BF16, 10, 2, None, &t());
        assert_eq!((p.kernel_type, p.units), (DataType::BF16, 10));
    }

    #[test]
    fn the_planner_never_overflows_on_extreme_counts_or_tunings() {
        // A tuning that turns the direct kernels off with the largest value, as the other
        // thresholds are turned off (`direct_min_bytes * 2` used to overflow), and counts no
        // communicator accepts: every plan is still made, and makes sense.
        let t = Tuning {
            direct_min_bytes: usize::MAX,
            ..Tuning::for_device(132, 2)
        };
        assert!(t.validate(264, 2).is_ok());
        let registered = Access {
            input: true,
            output: true,
            in_place: false,
        };
        for world in [1, 2, 3, 8] {
            for op in Op::ALL {
                for count in [1024, 1 << 40, usize::MAX] {
                    let p = plan_with(op, DataType::F32, count, world, None, &t, registered);
                    // (All-reduce has thresholds of its own.)
                    if matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll) {
                        assert!(
                            !p.kind.is_direct(),
                            "{op:?} {count} on {world}: {:?}",
                            p.kind
                        );
                    }
                    assert!(p.steps(world) >= 1);
                }
            }
        }
        assert_eq!(ce_chunk(63, 1000, 4), (1000, 1000));
        assert_eq!(ce_chunk(CE_CHUNKS, 1000, 4), (1000, 1000));
        let wide = Tuning {
            ll_max_bytes: usize::MAX,
            piece_bytes: usize::MAX,
            ..t
        };
        assert_eq!(wide.ll_limit(4), usize::MAX / 4);
        assert_eq!(wide.slot_bytes(), usize::MAX);
    }

    #[test]
    fn a_forced_ring_on_one_rank_runs_one_shot() {
        let p = forced(DataType::F32, 1 << 20, 1, Algorithm::Ring, &t());
        assert_eq!(p.kind, Kind::AllReduceOneShot);
        assert!(p.reason.contains("ring of one rank"), "{}", p.reason);
        let p = forced(DataType::F32, 1 << 20, 2, Algorithm::Ring, &t());
        assert_eq!(p.kind, Kind::AllReduceRing);
    }

    #[test]
    fn steps_count_the_barriers_per_block() {
        let p = forced(DataType::F32, 1 << 26, 4, Algorithm::Ring, &t());
        assert_eq!(p.steps(4), p.chunks * 6);
        let p = forced(DataType::F32, 1 << 26, 4, Algorithm::TwoShot, &t());
        assert_eq!(p.steps(4), p.chunks * 2);
    }

    #[test]
    fn tuning_round_trips_through_words() {
        let t = Tuning {
            ll_max_bytes: 12345,
            ..t()
        };
        assert_eq!(Tuning::from_words(&t.to_words()), Some(t));
        assert_eq!(Tuning::from_words(&t.to_words()[..4]), None);
    }

    #[test]
    fn auto_picks_ll_up_to_the_tuned_size_and_only_where_the_grid_fits() {
        let mut tuning = t();
        // Measured crossovers: 512 KiB on 2 and 3 ranks, 256 KiB on 4.
        for (world, limit) in [
            (2, 512 << 10),
            (3, 512 << 10),
            (4, 256 << 10),
            (8, 128 << 10),
        ] {
            assert_eq!(tuning.ll_limit(world), limit);
            let most = limit / 4;
            let p = plan(Op::AllReduce, DataType::F32, most, world, None, &tuning);
            assert_eq!(p.kind, Kind::AllReduceLl, "world {world}");
            assert!(p.reason.contains("LL"));
            let p = plan(Op::AllReduce, DataType::F32, most + 1, world, None, &tuning);
            assert_ne!(p.kind, Kind::AllReduceLl, "world {world}");
        }
        tuning.ll_max_bytes = 0;
        let p = plan(Op::AllReduce, DataType::F32, 1, 2, None, &tuning);
        assert_eq!(p.kind, Kind::AllReduceOneShot);
        // A GPU with few resident blocks: LL only where its grid is resident.
        tuning.ll_max_bytes = LL_MAX_BYTES;
        tuning.max_blocks = 4;
        let fits = 4 * THREADS as usize * 8;
        assert_eq!(
            plan(Op::AllReduce, DataType::U8, fits, 2, None, &tuning).kind,
            Kind::AllReduceLl
        );
        assert_eq!(
            plan(Op::AllReduce, DataType::U8, fits + 1, 2, None, &tuning).kind,
            Kind::AllReduceOneShot
        );
    }

    #[test]
    fn two_ranks_pipeline_all_reduces_from_ll_up_to_one_round_of_the_scratch() {
        // Off by default until measured (perf-notes §33).
        let default = Tuning::for_device(132, 2);
        assert_eq!(default.pipe_max_bytes, 0);
        let p = plan(Op::AllReduce, DataType::F32, 1 << 20, 2, None, &default);
        assert_eq!(p.kind, Kind::AllReduceOneShot);
        let tuning = Tuning {
            pipe_max_bytes: 16 << 20,
            ..default
        };
        let round = tuning.slot_bytes();
        assert_eq!(round, 16 << 20, "H200: 256 blocks of 64 KiB");
        for dtype in [DataType::F32, DataType::BF16, DataType::F64, DataType::U8] {
            let e = dtype.size();
            for bytes in [
                LL_MAX_BYTES + 16,
                1 << 20,
                (3 << 20) + 48,
                4 << 20,
                tuning.pipe_max_bytes,
            ] {
                let count = bytes / e;
                let p = plan(Op::AllReduce, dtype, count, 2, None, &tuning);
                assert_eq!(p.kind, Kind::AllReducePipe, "{dtype} {bytes}");
                assert_eq!(p.chunks, 1);
                assert!(
                    p.grid as u64 * p.piece >= p.units,
                    "{dtype} {bytes}: one round"
                );
                assert!(p.piece as usize * e <= tuning.piece_bytes);
                assert_eq!(p.piece as usize * e % 16, 0);
                assert_eq!(
                    p.sub as usize * e,
                    tuning.pipe_sub_bytes.min(p.piece as usize * e)
                );
                assert_eq!(p.steps(2) % 2, 1, "the counter moves on by an odd number");
                assert_eq!(p.steps(2), p.piece.div_ceil(p.sub) | 1);
            }
            // Past the knob or one round: one-shot; more ranks: not by default.
            let big = plan(Op::AllReduce, dtype, (round + 16) / e, 2, None, &tuning);
            assert_eq!(big.kind, Kind::AllReduceOneShot);
            let four = plan(Op::AllReduce, dtype, (4 << 20) / e, 4, None, &tuning);
            assert_ne!(four.kind, Kind::AllReducePipe);
        }
        // Forced (whatever the knob): on any world size within one round; past it, one-shot,
        // saying why.
        let forced = |count, world| forced(DataType::F32, count, world, Algorithm::Pipe, &default);
        assert_eq!(forced(1 << 20, 4).kind, Kind::AllReducePipe);
        // No data: no pipe shape (the public planner must not panic on a count of 0).
        assert_eq!(forced(0, 2).kind, Kind::AllReduceOneShot);
        for op in Op::ALL {
            for algorithm in [None, Some(Algorithm::Ring), Some(Algorithm::TwoShot)] {
                for world in [1, 2, 3, 8] {
                    let p = plan(op, DataType::F32, 0, world, algorithm, &default);
                    assert_eq!(p.units, 0, "{op} {world} {p:?}");
                }
            }
        }
        let p = forced(64 << 20, 2);
        assert_eq!(p.kind, Kind::AllReduceOneShot);
        assert!(p.reason.contains("pipe forced"), "{}", p.reason);
    }

    #[test]
    fn the_own_part_goes_to_the_copy_engine_only_out_of_place_through_the_scratch() {
        let default = Tuning::for_device(132, 2);
        assert_eq!(default.ce_own_min_bytes, usize::MAX, "off until measured");
        let on = Tuning {
            ce_own_min_bytes: 64 << 20,
            ..default
        };
        let out_of_place = Access::NONE;
        let in_place = access(false, false, true);
        let registered = access(true, true, false);
        // 32 MiB per part on 2 ranks: 64 MiB in all.
        let count = 8 << 20;
        let own = |op, tuning: &Tuning, access| {
            plan_with(op, DataType::F32, count, 2, None, tuning, access).own_by_copy_engine
        };
        for op in [Op::AllGather, Op::AllToAll] {
            assert!(!own(op, &default, out_of_place), "{op}");
            assert!(own(op, &on, out_of_place), "{op}");
            assert!(!own(op, &on, in_place), "{op}");
            // Registered: the direct kinds (all-gather), which copy the own part their way; an
            // all-to-all on two ranks stays on the scratch below the copy engines' size.
            let r = plan_with(op, DataType::F32, count, 2, None, &on, registered);
            assert_eq!(
                r.own_by_copy_engine,
                r.kind == Kind::AllToAll,
                "{op}: {r:?}"
            );
            // Below the knob (all parts together), and LL-sized calls.
            let small = plan_with(op, DataType::F32, count / 2 - 4, 2, None, &on, out_of_place);
            assert!(!small.own_by_copy_engine, "{op}");
            let ll = plan_with(op, DataType::F32, 16, 2, None, &on, out_of_place);
            assert!(ll.kind.is_ll() && !ll.own_by_copy_engine, "{op}");
        }
        for op in [Op::AllReduce, Op::Broadcast, Op::Reduce, Op::ReduceScatter] {
            assert!(!own(op, &on, out_of_place), "{op}");
        }
    }

    #[test]
    fn every_collective_runs_ll_while_each_source_sends_little() {
        let tuning = t();
        for op in Op::ALL {
            for world in [2, 3, 4, 8] {
                // `count` is per rank for the parted collectives: the limit is per source.
                let most = tuning.ll_limit(world) / 4;
                let p = plan(op, DataType::F32, most, world, None, &tuning);
                assert!(p.kind.is_ll(), "{op} world {world}: {:?}", p.kind);
                assert_eq!(p.kind.op(), op);
                assert_eq!(p.steps(world), 1);
                let p = plan(op, DataType::F32, most + 1, world, None, &tuning);
                assert!(!p.kind.is_ll(), "{op} world {world}");
            }
        }
        // Checking mode turns LL off through the tuning.
        let off = Tuning {
            ll_max_bytes: 0,
            ..tuning
        };
        assert_eq!(
            plan(Op::AllGather, DataType::F32, 1, 4, None, &off).kind,
            Kind::AllGather
        );
    }

    #[test]
    fn large_broadcasts_and_reduces_split_among_the_non_roots_on_more_than_two_ranks() {
        let tuning = no_ll();
        let big = tuning.split_min_bytes / 4;
        for (op, split, plain) in [
            (Op::Broadcast, Kind::BroadcastSplit, Kind::Broadcast),
            (Op::Reduce, Kind::ReduceSplit, Kind::Reduce),
        ] {
            assert_eq!(plan(op, DataType::F32, big, 4, None, &tuning).kind, split);
            assert_eq!(plan(op, DataType::F32, big, 3, None, &tuning).kind, split);
            assert_eq!(plan(op, DataType::F32, big, 2, None, &tuning).kind, plain);
            assert_eq!(
                plan(op, DataType::F32, big - 1, 4, None, &tuning).kind,
                plain
            );
            let p = plan(op, DataType::F32, 1 << 28, 4, None, &tuning);
            assert_eq!(p.steps(4), 2 * p.chunks);
        }
    }

    #[test]
    fn one_shot_gives_way_to_two_shot_at_three_mib_over_n() {
        let tuning = no_ll();
        let f = |count, world| plan(Op::AllReduce, DataType::F32, count, world, None, &tuning).kind;
        // 3 ranks: one-shot up to 1 MiB; 4 ranks: up to 768 KiB.
        assert_eq!(f(256 << 10, 3), Kind::AllReduceOneShot);
        assert_eq!(f((256 << 10) + 1, 3), Kind::AllReduceTwoShot);
        assert_eq!(f(192 << 10, 4), Kind::AllReduceOneShot);
        assert_eq!(f((192 << 10) + 1, 4), Kind::AllReduceTwoShot);
    }

    #[test]
    fn registered_buffers_go_direct_where_the_kernel_can_reach_them() {
        let tuning = t();
        let big = 1 << 24; // 64 MiB of f32
        let both = access(true, true, false);
        let f = |op, access| plan_with(op, DataType::F32, big, 4, None, &tuning, access);
        assert_eq!(f(Op::AllReduce, both).kind, Kind::AllReduceDirect);
        assert_eq!(f(Op::AllGather, both).kind, Kind::AllGatherDirect);
        assert_eq!(f(Op::ReduceScatter, both).kind, Kind::ReduceScatterDirect);
        assert_eq!(f(Op::AllToAll, both).kind, Kind::AllToAllDirect);
        // What each needs: all-reduce both sides, all-gather and all-to-all the output,
        // reduce-scatter the input; all-to-all never in place.
        let only_in = access(true, false, false);
        let only_out = access(false, true, false);
        assert_eq!(f(Op::AllReduce, only_in).kind, Kind::AllReduceTwoShot);
        assert_eq!(f(Op::AllGather, only_in).kind, Kind::AllGather);
        assert_eq!(f(Op::ReduceScatter, only_out).kind, Kind::ReduceScatter);
        assert_eq!(f(Op::AllGather, only_out).kind, Kind::AllGatherDirect);
        let in_place = access(true, true, true);
        assert_eq!(f(Op::AllToAll, in_place).kind, Kind::AllToAll);
        assert_eq!(f(Op::AllReduce, in_place).kind, Kind::AllReduceDirect);
        // Below the direct threshold, with parts not 16-byte aligned, and on two ranks for
        // all-reduce and all-to-all, the scratch path (measured faster there).
        let small = plan_with(
            Op::AllGather,
            DataType::F32,
            1 << 19,
            4,
            None,
            &tuning,
            both,
        );
        assert_eq!(small.kind, Kind::AllGather);
        let odd = plan_with(
            Op::AllGather,
            DataType::F32,
            (1 << 22) + 1,
            4,
            None,
            &tuning,
            both,
        );
        assert_eq!(odd.kind, Kind::AllGather);
        let two = |op| plan_with(op, DataType::F32, big, 2, None, &tuning, both).kind;
        assert_eq!(two(Op::AllReduce), Kind::AllReduceOneShot);
        assert_eq!(two(Op::AllToAll), Kind::AllToAll);
        assert_eq!(two(Op::AllGather), Kind::AllGatherDirect);
        assert_eq!(two(Op::ReduceScatter), Kind::ReduceScatterDirect);
        // Reduce-scatter on two ranks reads directly only below RS_DIRECT_MAX_BYTES_TWO_RANKS
        // (all parts); on more ranks at any size.
        let rs = |count, world| {
            plan_with(
                Op::ReduceScatter,
                DataType::F32,
                count,
                world,
                None,
                &tuning,
                both,
            )
            .kind
        };
        let under = (RS_DIRECT_MAX_BYTES_TWO_RANKS - 16 * 2) / 4 / 2;
        let at = RS_DIRECT_MAX_BYTES_TWO_RANKS / 4 / 2;
        assert_eq!(rs(under, 2), Kind::ReduceScatterDirect);
        assert_eq!(rs(at, 2), Kind::ReduceScatter);
        assert_eq!(rs(at, 4), Kind::ReduceScatterDirect);
        // Small calls still run LL; a forced algorithm wins over registration.
        assert!(
            plan_with(Op::AllReduce, DataType::F32, 16, 4, None, &tuning, both)
                .kind
                .is_ll()
        );
        assert_eq!(
            plan_with(
                Op::AllReduce,
                DataType::F32,
                big,
                4,
                Some(Algorithm::Ring),
                &tuning,
                both
            )
            .kind,
            Kind::AllReduceRing
        );
    }

    #[test]
    fn direct_shares_cover_every_element_in_whole_vectors() {
        let tuning = t();
        let both = access(true, true, false);
        for op in [
            Op::AllReduce,
            Op::AllGather,
            Op::ReduceScatter,
            Op::AllToAll,
        ] {
            for dtype in DataType::ALL {
                for count in [(1usize << 22) + 4, 64 << 20] {
                    for world in [3, 4, 8] {
                        let p = plan_with(op, dtype, count * 16, world, None, &tuning, both);
                        assert!(p.kind.is_direct(), "{op} {dtype} {count} {world}");
                        let elem = p.kernel_type.size() as u64;
                        assert_eq!(p.piece * elem % 16, 0);
                        let share = if p.kind == Kind::AllReduceDirect {
                            p.units.div_ceil(world as u64)
                        } else {
                            p.units
                        };
                        assert!(
                            p.piece * p.grid as u64 >= share,
                            "{op} {dtype} {count} {world}"
                        );
                        assert_eq!((p.chunks, p.steps(world)), (1, 2));
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernel_enum_matches_kind_code_for_code() {
        // `enum Kind` in coll_abi.h, e.g. `K_ALLREDUCE_LL = 8,`: same names (case and underscores
        // aside) and the same numbers, in order.
        let src = include_str!("kernels/coll_abi.h");
        let start = src.find("enum Kind {").expect("enum Kind in coll_abi.h");
        let body = &src[start..start + src[start..].find("};").expect("end of enum Kind")];
        let entries: Vec<(String, usize)> = body
            .lines()
            .filter_map(|l| {
                let (name, value) = l.trim().trim_end_matches(',').split_once(" = ")?;
                Some((
                    name.trim_start_matches("K_")
                        .replace('_', "")
                        .to_lowercase(),
                    value.parse().ok()?,
                ))
            })
            .collect();
        assert_eq!(entries.len(), Kind::ALL.len(), "{entries:?}");
        for (k, (name, value)) in Kind::ALL.iter().zip(&entries) {
            assert_eq!(*k as usize, *value, "{k:?}");
            assert_eq!(format!("{k:?}").to_lowercase(), *name, "{k:?}");
        }
    }

    #[test]
    fn every_kind_round_trips_through_its_code() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(Kind::from_code(i as u64), Some(*k));
        }
        assert_eq!(Kind::from_code(Kind::ALL.len() as u64), None);
    }

    #[test]
    fn copy_engines_for_large_registered_calls_on_two_ranks_and_more_when_asked() {
        let mut tuning = t();
        let in_place = access(true, true, true);
        let out = access(true, true, false);
        let out_only = access(false, true, false);
        assert_eq!(tuning.ce_min_bytes, 256 << 20);
        assert_eq!(tuning.ce_all_reduce_min_bytes, 256 << 20);
        // The all-reduce has its own threshold: not with ce_min_bytes alone.
        let whole = (64 << 20) / 4;
        tuning.ce_min_bytes = 64 << 20;
        let p = plan_with(
            Op::AllReduce,
            DataType::F32,
            whole,
            2,
            None,
            &tuning,
            out_only,
        );
        assert_eq!(p.kind, Kind::AllReduceOneShot);
        tuning.ce_all_reduce_min_bytes = 64 << 20;
        for world in [2, 3, 4] {
            let two = world == 2;
            let count = (64 << 20) / 4 / world;
            let kind = |op, count, access| {
                plan_with(op, DataType::F32, count, world, None, &tuning, access).kind
            };
            let p = plan_with(
                Op::AllGather,
                DataType::F32,
                count,
                world,
                None,
                &tuning,
                in_place,
            );
            if two {
                assert_eq!((p.kind, p.grid, p.threads), (Kind::AllGatherCe, 1, THREADS));
                assert_eq!((p.kind.variant(), p.kind.op()), ("ce", Op::AllGather));
            } else {
                // More ranks: off by default (not measured), the kernels.
                assert!(!p.kind.is_ce(), "{p:?}");
            }
            for access in [out, out_only] {
                let k = kind(Op::AllGather, count, access);
                assert_eq!(k == Kind::AllGatherCe, two, "{k:?}");
            }
            // All-to-all and all-reduce: out of place only, into a registered output.
            let a2a = kind(Op::AllToAll, count, out_only);
            assert_eq!(a2a == Kind::AllToAllCe, two, "{a2a:?}");
            assert!(!kind(Op::AllToAll, count, in_place).is_ce());
            let whole = count * world; // an all-reduce's count is the whole buffer
            let ar = plan_with(
                Op::AllReduce,
                DataType::F32,
                whole,
                world,
                None,
                &tuning,
                out_only,
            );
            assert_eq!(ar.kind == Kind::AllReduceCe, two, "{ar:?}");
            if two {
                assert_eq!(
                    (ar.grid, ar.threads, ar.kernel_type),
                    (tuning.max_blocks / 2, THREADS, DataType::F32)
                );
                assert_eq!(ar.kind.op(), Op::AllReduce);
                // Forcing an algorithm turns the copy engines off.
                let forced = plan_with(
                    Op::AllReduce,
                    DataType::F32,
                    whole,
                    world,
                    Some(Algorithm::OneShot),
                    &tuning,
                    out_only,
                );
                assert_eq!(forced.kind, Kind::AllReduceOneShot);
            }
            assert!(!kind(Op::AllReduce, whole, in_place).is_ce());
            // Below the threshold or not registered: no copy engines.
            for op in [Op::AllGather, Op::AllToAll] {
                assert!(!kind(op, count - 4, out).is_ce(), "{op}");
                assert!(!kind(op, count, Access::NONE).is_ce(), "{op}");
            }
            assert!(!kind(Op::AllReduce, whole - 4, out).is_ce());
            assert!(!kind(Op::AllReduce, whole, Access::NONE).is_ce());
            // The other collectives never.
            for op in [Op::ReduceScatter, Op::Broadcast, Op::Reduce] {
                for access in [in_place, out] {
                    assert!(!kind(op, count, access).is_ce(), "{op} {access:?}");
                }
            }
        }
        // Small calls stay LL.
        let p = plan_with(Op::AllGather, DataType::F32, 16, 2, None, &tuning, in_place);
        assert_eq!(p.kind, Kind::AllGatherLl);

        // More ranks with their own threshold: all-gather and all-to-all (the all-reduce by the
        // copy engines is for two ranks only); two ranks keep theirs.
        assert_eq!(t().ce_min_bytes_more_ranks, usize::MAX);
        let more = Tuning {
            ce_min_bytes: usize::MAX,
            ce_min_bytes_more_ranks: 64 << 20,
            ..tuning
        };
        for world in [2, 3, 4, 8] {
            let count = (64usize << 20).div_ceil(4 * world);
            let kind = |op, count, access| {
                plan_with(op, DataType::F32, count, world, None, &more, access).kind
            };
            for access in [in_place, out, out_only] {
                let k = kind(Op::AllGather, count, access);
                assert_eq!(k == Kind::AllGatherCe, world > 2, "{world} {k:?}");
                assert!(!kind(Op::AllGather, count - 4, access).is_ce());
            }
            let a2a = kind(Op::AllToAll, count, out_only);
            assert_eq!(a2a == Kind::AllToAllCe, world > 2, "{world} {a2a:?}");
            assert!(!kind(Op::AllToAll, count, in_place).is_ce());
            assert!(!kind(Op::AllToAll, count, Access::NONE).is_ce());
            let ar = kind(Op::AllReduce, count * world, out_only);
            assert_eq!(ar == Kind::AllReduceCe, world == 2, "{world} {ar:?}");
            if world > 2 {
                let p = plan_with(Op::AllGather, DataType::F32, count, world, None, &more, out);
                assert_eq!(
                    (p.grid, p.threads, p.kernel_type),
                    (1, THREADS, DataType::U8)
                );
                assert!(p.reason.contains("ce_min_bytes_more_ranks"), "{}", p.reason);
            }
        }
    }

    #[test]
    fn copy_engine_all_reduce_chunks_halve_and_cover_the_buffer() {
        for elem in [1usize, 2, 4, 8] {
            for n in [0u64, 1, 7, 16_383, 70_001, 1 << 20, (1 << 28) + 3] {
                let mut next = 0;
                for k in 0..CE_CHUNKS {
                    let (lo, hi) = ce_chunk(k, n, elem);
                    assert_eq!(lo, next, "elem {elem} n {n} chunk {k}");
                    assert!(hi >= lo && hi <= n, "elem {elem} n {n} chunk {k}");
                    if hi != n {
                        assert_eq!(hi * elem as u64 % CE_ALIGN as u64, 0);
                    }
                    next = hi;
                }
                assert_eq!(next, n, "elem {elem} n {n}");
            }
        }
        // Halving: at 1 GiB of f32, 512 MiB, 256, 128, 64, 32 and the last 32.
        let n = (1u64 << 30) / 4;
        let mibs: Vec<u64> = (0..CE_CHUNKS)
            .map(|k| {
                let (lo, hi) = ce_chunk(k, n, 4);
                ((hi - lo) * 4) >> 20
            })
            .collect();
        assert_eq!(mibs, [512, 256, 128, 64, 32, 32]);
    }

    #[test]
    fn two_rank_ll_runs_small_blocks_and_more_ranks_full_ones() {
        let tuning = t();
        // (bytes, grid, piece, threads) on two ranks: LL2_PIECE units a block while the grid
        // stays within the slot's 128 blocks, then bigger pieces.
        for (bytes, grid, piece, threads) in [
            (8, 1, 1, 32),
            (4096, 4, 128, 128),
            (4100, 5, 103, 128),
            (64 << 10, 64, 128, 128),
            (128 << 10, 128, 128, 128),
            (256 << 10, 128, 256, 256),
            (LL_MAX_BYTES, 128, 512, 512),
        ] {
            let p = forced(DataType::U8, bytes, 2, Algorithm::Ll, &tuning);
            assert_eq!(p.kind, Kind::AllReduceLl, "{bytes}");
            assert_eq!(
                (p.grid, p.piece, p.threads),
                (grid, piece, threads),
                "{bytes}"
            );
        }
        // More ranks: one block per THREADS units, THREADS threads, as before.
        let p = forced(DataType::U8, 4096, 4, Algorithm::Ll, &tuning);
        assert_eq!((p.grid, p.piece, p.threads), (1, 512, THREADS));
        let p = plan(Op::AllGather, DataType::U8, 64 << 10, 3, None, &tuning);
        assert_eq!(
            (p.kind, p.grid, p.threads),
            (Kind::AllGatherLl, 16, THREADS)
        );
        // Every other kind launches THREADS threads.
        let p = plan(Op::AllReduce, DataType::F32, 1 << 24, 2, None, &tuning);
        assert_eq!(p.threads, THREADS);
    }

    #[test]
    fn ll_covers_every_byte_in_one_round_and_only_small_calls() {
        let tuning = t();
        for dtype in DataType::ALL {
            for count in [1usize, 7, 1023, 8191, 50_001, LL_MAX_BYTES / dtype.size()] {
                let p = plan(Op::AllReduce, dtype, count, 2, Some(Algorithm::Ll), &tuning);
                assert_eq!(p.kind, Kind::AllReduceLl, "{dtype} {count}");
                let units = (count * dtype.size()).div_ceil(8) as u64;
                assert_eq!((p.chunks, p.units), (1, count as u64));
                assert!(p.piece * p.grid as u64 >= units && p.piece * (p.grid as u64 - 1) < units);
                assert!(units * 16 <= LL_SLOT_BYTES as u64);
                // Each block's lines stay inside its own THREADS-line part of the slot, one
                // thread per unit.
                assert!(p.piece <= p.threads as u64 && p.threads <= THREADS);
                assert_eq!(p.threads % 32, 0);
                assert!(p.grid as u64 * THREADS as u64 * 16 <= LL_SLOT_BYTES as u64);
                assert_eq!(p.steps(2), 1);
            }
        }
        let big = forced(
            DataType::F32,
            LL_MAX_BYTES / 4 + 1,
            2,
            Algorithm::Ll,
            &tuning,
        );
        assert_eq!(big.kind, Kind::AllReduceOneShot);
        assert!(big.reason.contains("512 KiB"));
    }

    #[test]
    fn signatures_round_trip_into_words() {
        let s = signature(Kind::AllReduceOneShot, DataType::F32, 0, 0, 1024);
        assert_eq!(describe(s), "all_reduce (oneshot) float sum, count 1024");
        let s = signature(Kind::Broadcast, DataType::BF16, 0, 3, 7);
        assert_eq!(describe(s), "broadcast bfloat16 root 3, count 7");
        let s = signature(Kind::AllToAllDirect, DataType::F16, 0, 0, 1 << 40);
        assert_eq!(describe(s), "all_to_all (direct) half, count 1099511627776");
        let s = signature(Kind::ReduceSplit, DataType::I64, 4, 7, 3);
        assert_eq!(describe(s), "reduce (split) int64 avg root 7, count 3");
        assert_ne!(
            signature(Kind::Reduce, DataType::I32, 1, 0, 5),
            signature(Kind::Reduce, DataType::I32, 1, 0, 6)
        );
    }
}
