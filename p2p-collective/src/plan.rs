//! Planning a call: which kernel path, how many blocks, how the data is cut into pieces.
//!
//! Pure arithmetic, tested on the host. The kernel (`kernels/coll.cu`) runs `chunks` rounds;
//! in each, block b of the grid handles `piece` elements starting at
//! `chunk * grid * piece + b * piece`. Every rank computes the same plan from the same call,
//! which keeps the per-block step counters in step across ranks.

use p2p_transport::config::Algorithm;

use crate::types::{DataType, Op};

/// Largest all-reduce, in bytes, that can run LL (its lines take twice the data's size in
/// scratch); [`Tuning::ll_max_bytes`] is where the planner switches by default.
pub const LL_MAX_BYTES: usize = 512 << 10;

/// Bytes of one (parity, source rank) slot of the LL region (`LL_SLOT_BYTES` in `coll.cu`).
pub const LL_SLOT_BYTES: usize = 2 * LL_MAX_BYTES;

/// Most ranks a communicator may have (the kernels' fixed-size peer tables).
pub const MAX_RANKS: usize = 8;
/// Most blocks a collective kernel may use (the sync area's fixed-size tables).
pub const MAX_BLOCKS: u32 = 256;
/// Threads per block of every collective kernel.
pub const THREADS: u32 = 512;

/// Knobs of the planner; `Tuning::for_device` is what communicators use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Most blocks per call (at most [`MAX_BLOCKS`], and never more than can be resident at
    /// once, so no block waits for a peer block that cannot start).
    pub max_blocks: u32,
    /// Most bytes one block moves per chunk (per source rank); sets the scratch size.
    pub piece_bytes: usize,
    /// Bytes per block below which a call uses fewer blocks.
    pub block_bytes: usize,
    /// Above this many bytes, all-reduce on more than two ranks goes two-shot.
    pub oneshot_max_bytes: usize,
    /// All-reduces up to this many bytes run LL (flags inside the data) on two ranks unless an
    /// algorithm is forced or checking mode is on; on n ranks, up to this over n - 1 (each rank
    /// sends its lines to every peer). 0 turns LL off. At most [`LL_MAX_BYTES`].
    pub ll_max_bytes: usize,
}

impl Tuning {
    /// The defaults for a GPU with `sm_count` SMs that holds `blocks_per_sm` resident blocks
    /// of the collective kernel: up to two blocks per SM (measured on H200: 256 blocks reach
    /// 355 GB/s all-reduce busbw at 1 GiB where 132 reach 310, as one block pushes while
    /// another on the same SM reduces; docs/perf-notes.md, section 10).
    pub fn for_device(sm_count: i32, blocks_per_sm: i32) -> Tuning {
        let per_sm = blocks_per_sm.clamp(1, 2) as u32;
        Tuning {
            max_blocks: (sm_count.max(1) as u32 * per_sm).min(MAX_BLOCKS),
            piece_bytes: 64 << 10,
            block_bytes: 16 << 10,
            oneshot_max_bytes: 256 << 10,
            ll_max_bytes: 512 << 10,
        }
    }

    /// How many words [`to_words`](Self::to_words) gives.
    pub const WORDS: usize = 5;

    /// Every knob as a word, for ranks to compare at start-up.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.max_blocks as u64,
            self.piece_bytes as u64,
            self.block_bytes as u64,
            self.oneshot_max_bytes as u64,
            self.ll_max_bytes as u64,
        ]
    }

    /// The inverse of [`to_words`](Self::to_words); `None` for a wrong length or a value out
    /// of range.
    pub fn from_words(w: &[u64]) -> Option<Tuning> {
        let [b, p, bb, o, l] = <[u64; Self::WORDS]>::try_from(w).ok()?;
        Some(Tuning {
            max_blocks: u32::try_from(b).ok()?,
            piece_bytes: usize::try_from(p).ok()?,
            block_bytes: usize::try_from(bb).ok()?,
            oneshot_max_bytes: usize::try_from(o).ok()?,
            ll_max_bytes: usize::try_from(l).ok()?,
        })
    }

    /// Bytes of one (parity, source rank) slot of a rank's scratch.
    pub fn slot_bytes(&self) -> usize {
        self.max_blocks as usize * self.piece_bytes
    }
}

/// What a kernel launch does; the numbers are the `Kind` enum of `coll.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Kind {
    /// All-reduce, one-shot.
    AllReduceOneShot = 0,
    /// All-reduce, two-shot.
    AllReduceTwoShot = 1,
    /// Reduce to a root.
    Reduce = 2,
    /// Broadcast from a root.
    Broadcast = 3,
    /// All-gather.
    AllGather = 4,
    /// Reduce-scatter.
    ReduceScatter = 5,
    /// All-to-all.
    AllToAll = 6,
    /// All-reduce around a ring.
    AllReduceRing = 7,
    /// All-reduce one-shot with flags inside the data (LL).
    AllReduceLl = 8,
}

impl Kind {
    /// The kind with code `code`, as the kernel records it in its status.
    pub fn from_code(code: u64) -> Option<Kind> {
        Some(match code {
            0 => Kind::AllReduceOneShot,
            1 => Kind::AllReduceTwoShot,
            2 => Kind::Reduce,
            3 => Kind::Broadcast,
            4 => Kind::AllGather,
            5 => Kind::ReduceScatter,
            6 => Kind::AllToAll,
            7 => Kind::AllReduceRing,
            8 => Kind::AllReduceLl,
            _ => return None,
        })
    }

    /// The collective this kind carries out.
    pub fn op(self) -> Op {
        match self {
            Kind::AllReduceOneShot
            | Kind::AllReduceTwoShot
            | Kind::AllReduceRing
            | Kind::AllReduceLl => Op::AllReduce,
            Kind::Reduce => Op::Reduce,
            Kind::Broadcast => Op::Broadcast,
            Kind::AllGather => Op::AllGather,
            Kind::ReduceScatter => Op::ReduceScatter,
            Kind::AllToAll => Op::AllToAll,
        }
    }

    /// The all-reduce algorithm, for the all-reduce kinds.
    pub fn algorithm(self) -> Option<Algorithm> {
        match self {
            Kind::AllReduceOneShot => Some(Algorithm::OneShot),
            Kind::AllReduceTwoShot => Some(Algorithm::TwoShot),
            Kind::AllReduceRing => Some(Algorithm::Ring),
            Kind::AllReduceLl => Some(Algorithm::Ll),
            _ => None,
        }
    }
}

/// How one call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The kernel path.
    pub kind: Kind,
    /// The type the kernel works in: the call's type for reductions, bytes (`U8`) for copies.
    pub kernel_type: DataType,
    /// Elements of `kernel_type` per segment (the whole call for all-reduce; one rank's part
    /// for all-gather, reduce-scatter and all-to-all).
    pub units: u64,
    /// Blocks in the grid.
    pub grid: u32,
    /// Elements per block per chunk (a whole number of 16-byte vectors); for LL, 8-byte units
    /// per block.
    pub piece: u64,
    /// Rounds over the data.
    pub chunks: u64,
    /// Why this algorithm, for the log.
    pub reason: &'static str,
}

impl Plan {
    /// Barrier steps each block takes (each a flag exchange with every peer).
    pub fn steps(&self, world: usize) -> u64 {
        let per_chunk = match self.kind {
            Kind::AllReduceTwoShot => 2,
            Kind::AllReduceRing => 2 * (world as u64).saturating_sub(1),
            _ => 1,
        };
        self.chunks * per_chunk
    }
}

/// Plans `op` over `count` elements of `dtype` on `world` ranks.
///
/// `count` follows NCCL (see [`Op::buffer_lens`]); it must be nonzero (zero counts are no-ops
/// that never reach the planner).
pub fn plan(
    op: Op,
    dtype: DataType,
    count: usize,
    world: usize,
    forced: Option<Algorithm>,
    tuning: &Tuning,
) -> Plan {
    let (kind, reason) = match op {
        Op::AllReduce => choose_all_reduce(count * dtype.size(), world, forced, tuning),
        Op::Broadcast => (Kind::Broadcast, "the root pushes to every peer"),
        Op::Reduce => (Kind::Reduce, "every peer pushes to the root"),
        Op::AllGather => (Kind::AllGather, "every rank pushes to every peer"),
        Op::ReduceScatter => (
            Kind::ReduceScatter,
            "every rank pushes each part to its owner",
        ),
        Op::AllToAll => (Kind::AllToAll, "every rank pushes each part to its owner"),
    };
    if kind == Kind::AllReduceLl {
        // 8-byte units, one per thread; one round. Each block owns THREADS lines of the LL
        // region whatever the grid (see `coll.cu`); `ll_fits` kept the grid within the
        // tuning's resident blocks (at most LL_MAX_BYTES / 8 / THREADS = 128).
        let units = (count * dtype.size()).div_ceil(8) as u64;
        let grid = units.div_ceil(THREADS as u64).max(1) as u32;
        return Plan {
            kind,
            kernel_type: dtype,
            units: count as u64,
            grid,
            piece: units.div_ceil(grid as u64),
            chunks: 1,
            reason,
        };
    }
    let kernel_type = if op.reduces() { dtype } else { DataType::U8 };
    let elem = kernel_type.size();
    let units = (count * dtype.size() / elem) as u64;
    let bytes = units as usize * elem;
    let grid = bytes
        .div_ceil(tuning.block_bytes.max(16))
        .clamp(1, tuning.max_blocks.max(1) as usize) as u32;
    let piece_bytes = bytes
        .div_ceil(grid as usize)
        .next_multiple_of(16)
        .min(tuning.piece_bytes.max(16) / 16 * 16);
    let piece = (piece_bytes / elem) as u64;
    let chunks = units.div_ceil(piece * grid as u64);
    Plan {
        kind,
        kernel_type,
        units,
        grid,
        piece,
        chunks,
        reason,
    }
}

fn choose_all_reduce(
    bytes: usize,
    world: usize,
    forced: Option<Algorithm>,
    tuning: &Tuning,
) -> (Kind, &'static str) {
    match forced {
        Some(Algorithm::OneShot) => return (Kind::AllReduceOneShot, "forced by P2P_ALGO/Options"),
        Some(Algorithm::TwoShot) => return (Kind::AllReduceTwoShot, "forced by P2P_ALGO/Options"),
        Some(Algorithm::Ring) => return (Kind::AllReduceRing, "forced by P2P_ALGO/Options"),
        Some(Algorithm::Ll) if ll_fits(bytes, tuning) => {
            return (Kind::AllReduceLl, "forced by P2P_ALGO/Options")
        }
        Some(Algorithm::Ll) => {
            return (
                Kind::AllReduceOneShot,
                "LL forced, but LL carries at most 512 KiB in one block per 4 KiB: one-shot",
            )
        }
        None => {}
    }
    if bytes.saturating_mul(world.max(2) - 1) <= tuning.ll_max_bytes && ll_fits(bytes, tuning) {
        (
            Kind::AllReduceLl,
            "small: flags inside the data (LL), one crossing, no fence or flag",
        )
    } else if world <= 2 {
        (
            Kind::AllReduceOneShot,
            "2 ranks: one-shot sends each byte once, as a ring would, in one step",
        )
    } else if bytes <= tuning.oneshot_max_bytes {
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

/// Whether an all-reduce of `bytes` fits LL: at most [`LL_MAX_BYTES`], and its grid (one block
/// per `THREADS` 8-byte units) within the tuning's resident blocks.
fn ll_fits(bytes: usize, tuning: &Tuning) -> bool {
    bytes <= LL_MAX_BYTES
        && bytes.div_ceil(8).div_ceil(THREADS as usize) <= tuning.max_blocks as usize
}

/// The 64-bit signature of a call that ranks compare in checking mode:
/// kind (4 bits), type (4), reduction (4), root (8), count (44).
pub fn signature(kind: Kind, dtype: DataType, redop: i32, root: usize, count: usize) -> u64 {
    (kind as u64 & 0xf)
        | ((dtype.index() as u64 & 0xf) << 4)
        | ((redop as u64 & 0xf) << 8)
        | ((root as u64 & 0xff) << 12)
        | ((count as u64 & ((1 << 44) - 1)) << 20)
}

/// A signature in words, e.g. `all_reduce (oneshot) float sum, count 1024`.
pub fn describe(sig: u64) -> String {
    let kind = Kind::from_code(sig & 0xf);
    let dtype = DataType::ALL.get(((sig >> 4) & 0xf) as usize);
    let redop = crate::types::RedOp::ALL.get(((sig >> 8) & 0xf) as usize);
    let root = (sig >> 12) & 0xff;
    let count = sig >> 20;
    let Some(kind) = kind else {
        return format!("an unknown call (signature {sig:#x})");
    };
    let op = kind.op();
    let mut s = op.name().to_string();
    if let Some(a) = kind.algorithm() {
        s += &format!(" ({})", a.name());
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
mod tests {
    use super::*;

    fn t() -> Tuning {
        Tuning::for_device(132, 1)
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
            plan(
                Op::AllReduce,
                DataType::F32,
                7,
                2,
                Some(Algorithm::Ring),
                &no_ll()
            )
            .kind,
            Kind::AllReduceRing
        );
    }

    #[test]
    fn pieces_cover_every_element_in_whole_vectors_and_fit_the_scratch() {
        let tuning = no_ll();
        for op in Op::ALL {
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
    fn steps_count_the_barriers_per_block() {
        let p = plan(
            Op::AllReduce,
            DataType::F32,
            1 << 26,
            4,
            Some(Algorithm::Ring),
            &t(),
        );
        assert_eq!(p.steps(4), p.chunks * 6);
        let p = plan(
            Op::AllReduce,
            DataType::F32,
            1 << 26,
            4,
            Some(Algorithm::TwoShot),
            &t(),
        );
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
        let limit = tuning.ll_max_bytes;
        for world in [2, 4, 8] {
            let most = limit / (world - 1) / 4;
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
                // Each block's lines stay inside its own THREADS-line part of the slot.
                assert!(p.piece <= THREADS as u64);
                assert!(p.grid as u64 * THREADS as u64 * 16 <= LL_SLOT_BYTES as u64);
                assert_eq!(p.steps(2), 1);
            }
        }
        let big = plan(
            Op::AllReduce,
            DataType::F32,
            LL_MAX_BYTES / 4 + 1,
            2,
            Some(Algorithm::Ll),
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
        assert_ne!(
            signature(Kind::Reduce, DataType::I32, 1, 0, 5),
            signature(Kind::Reduce, DataType::I32, 1, 0, 6)
        );
    }
}
