//! Planning a call: which kernel path, how many blocks, how the data is cut into pieces.
//!
//! Pure arithmetic, tested on the host. The kernel (`kernels/coll/steps.cuh`) runs `chunks` rounds;
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

#[cfg(test)]
mod tests;
mod tuning;
#[cfg(test)]
mod validate_tests;

pub use tuning::{Tuning, TuningError};

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
