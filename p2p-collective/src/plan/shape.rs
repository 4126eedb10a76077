//! How a call is cut for its kernel: blocks, threads, the piece each block takes per chunk, and
//! the chunks. Pure arithmetic; the kernels (`kernels/coll/`) read the same numbers.

use crate::types::Op;

use super::algo::{Algo, Proto};
use super::{Tuning, CE_ALIGN, CE_CHUNKS, LL2_PIECE, LL_MAX_BYTES, LL_SLOT_BYTES, THREADS};

/// Most blocks of an LL call: each block owns `THREADS` lines of each LL slot.
const LL_GRID: u64 = (LL_SLOT_BYTES / 16 / THREADS as usize) as u64;

/// A kernel's launch shape and cut of the data (see [`Plan`](super::Plan)'s fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub grid: u32,
    pub threads: u32,
    pub piece: u64,
    pub sub: u64,
    pub chunks: u64,
}

/// The shape of `op` by `(algo, proto)` over `units` elements of `elem` bytes per source
/// (`seg_bytes`), of which one rank moves `bytes` in all, on `world` ranks; `overlap`: a
/// stepped algorithm whose chunks' steps overlap, cut into at least
/// [`Tuning::overlap_chunks`] chunks.
pub(super) fn shape(
    op: Op,
    (algo, proto, overlap): (Algo, Proto, bool),
    (seg_bytes, bytes): (usize, usize),
    units: u64,
    elem: usize,
    world: usize,
    tuning: &Tuning,
) -> Shape {
    let whole = |grid, piece, sub| Shape {
        grid,
        threads: THREADS,
        piece,
        sub,
        chunks: 1,
    };
    // (`algo::fits` never lets a call past one round of the scratch plan `Pipe`.)
    let pipe = if algo == Algo::Pipe {
        pipe_shape(seg_bytes, elem, tuning)
    } else {
        None
    };
    match (algo, proto, pipe) {
        // No kernel moves data: one block runs each barrier around the copies; the all-reduce's
        // reduce kernel runs a block per SM (32 blocks lost 10-15 % at 256 MiB-1 GiB:
        // docs/performance.md, "The copy-engine all-reduce on two ranks").
        (_, Proto::CopyEngine, _) => whole(
            if op == Op::AllReduce {
                (tuning.max_blocks / 2).max(1)
            } else {
                1
            },
            1,
            0,
        ),
        // 8-byte units, one per thread; one round. Each block owns THREADS lines of each LL
        // slot whatever the grid, so at most LL_GRID = 128 blocks; `ll_fits` kept the grid
        // within the tuning's resident blocks.
        (_, Proto::Ll, _) => {
            let (grid, piece, threads) = ll_shape(seg_bytes, world);
            Shape {
                threads,
                ..whole(grid, piece, 0)
            }
        }
        // One pass, no scratch: each block takes a contiguous share of what this rank handles
        // (its part of the data for all-reduce, a rank's part for the others).
        (Algo::Direct, _, _) => {
            let grid = grid_for(bytes, tuning);
            let share = if op == Op::AllReduce {
                // This rank's part of the whole buffer.
                units.div_ceil(world as u64)
            } else {
                units
            };
            let per_vec = (16 / elem) as u64;
            let piece = share.div_ceil(grid as u64).div_ceil(per_vec).max(1) * per_vec;
            whole(grid, piece, 0)
        }
        (Algo::Pipe, _, Some((grid, piece, sub))) => whole(grid, piece, sub),
        // The stepped algorithms through the scratch: pieces of at most `piece_bytes` (a
        // block's region of a slot), as many rounds as it takes.
        _ => {
            let grid = grid_for(seg_bytes, tuning);
            let rounds = if overlap {
                tuning.overlap_chunks.max(1)
            } else {
                1
            };
            // (At least one vector: a count of 0, which communicators never launch, plans too.)
            let piece_bytes = seg_bytes
                .div_ceil(grid as usize * rounds)
                .next_multiple_of(16)
                .clamp(16, tuning.piece_bytes.max(16) / 16 * 16);
            let piece = (piece_bytes / elem) as u64;
            let chunks = units.div_ceil(piece * grid as u64);
            Shape {
                chunks,
                ..whole(grid, piece, 0)
            }
        }
    }
}

/// Blocks for `bytes`: about `block_bytes` per block, within the resident blocks.
pub(super) fn grid_for(bytes: usize, tuning: &Tuning) -> u32 {
    bytes
        .div_ceil(tuning.block_bytes.max(16))
        .clamp(1, tuning.max_blocks.max(1) as usize) as u32
}

/// The grid, piece and sub-piece (elements of `elem` bytes) of a pipelined all-reduce of
/// `bytes` ([`Algo::Pipe`]), or `None` for no data or where its piece would pass the tuning's
/// `piece_bytes` (the kernel runs one round of the scratch).
pub(super) fn pipe_shape(bytes: usize, elem: usize, tuning: &Tuning) -> Option<(u32, u64, u64)> {
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
pub(super) fn ll_shape(seg_bytes: usize, world: usize) -> (u32, u64, u32) {
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

/// Whether `bytes` per source fit LL: at most [`LL_MAX_BYTES`], and its grid (see
/// [`ll_shape`]) within the tuning's resident blocks, counted in blocks of `THREADS` threads.
pub(super) fn ll_fits(bytes: usize, world: usize, tuning: &Tuning) -> bool {
    let (grid, _, threads) = ll_shape(bytes, world);
    bytes <= LL_MAX_BYTES
        && (grid as u64 * threads as u64).div_ceil(THREADS as u64) <= tuning.max_blocks as u64
}

/// Elements `[lo, hi)` of chunk `k` (of [`CE_CHUNKS`]) of a copy-engine all-reduce of `n`
/// elements of `elem` bytes: half the data, a quarter, ..., the last chunk the rest, each edge
/// rounded down to [`CE_ALIGN`] bytes. The reduce kernel's `ce_chunk` (`algo/ce_reduce.cuh`) is
/// the same formula: the copies follow this one, the reduce kernel that one. A `k` past the
/// last chunk gives the empty range at `n`.
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
