//! The planner's knobs ([`Tuning`]): per device, shared by ranks on one GPU, carried between
//! ranks as words.

use super::*;

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
    /// (measured on 2 and 4 x H200: docs/performance.md, "Planner thresholds at four ranks"). On two ranks a reduce-scatter
    /// reads directly only below [`RS_DIRECT_MAX_BYTES_TWO_RANKS`].
    pub direct_min_bytes: usize,
    /// On two ranks, all-gathers and all-to-alls on registered buffers of at least this many
    /// bytes (all ranks' parts together) move the data with the copy engines instead of SMs,
    /// after a barrier kernel: one `cuMemcpyAsync` into each peer's registered output (an
    /// all-to-all out of place only), the own part copied beside it on a second stream when
    /// out of place, then a second barrier. Measured on 2 x H200 (docs/performance.md, "Copy
    /// engines for all-gather and all-to-all"): all-gather 381-385 GB/s busbw at 1 GiB in or out of place against 361-362 for the
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
    /// 342-348 (docs/performance.md, "Copy engines for all-gather and all-to-all").
    pub ce_min_bytes_more_ranks: usize,
    /// On two ranks, out-of-place all-reduces into a registered output of at least this many
    /// bytes run by the copy engines (the copy-engine protocol: each rank's input copied into the
    /// peer's output in [`CE_CHUNKS`] halving chunks while a kernel reduces each chunk as it
    /// lands), with [`ce_min_bytes`](Self::ce_min_bytes)'s conditions. Default 256 MiB: on 2 x
    /// H200 it measured 342-345 / 359-362 / 371-372 GB/s busbw at 256 MiB / 512 MiB / 1 GiB
    /// against 333-337 / 349-351 / 354-357 for one-shot in the same runs (f32 and bf16;
    /// docs/performance.md, "The copy-engine all-reduce on two ranks"). `usize::MAX` turns it
    /// off.
    pub ce_all_reduce_min_bytes: usize,
    /// On two ranks, all-reduces above LL's sizes and up to this many bytes run the pipelined
    /// one-shot ([`Algo::Pipe`]: each block's push and reduction overlapped), when
    /// they fit one round of the scratch (`max_blocks * piece_bytes`, 16 MiB on H200). Default
    /// 0 (off): correct in the suites with ranks sharing one GPU, but not yet run across GPUs
    /// or measured (docs/performance.md, "The pipelined one-shot all-reduce"); `P2P_ALGO=pipe` forces it.
    pub pipe_max_bytes: usize,
    /// Bytes per sub-piece of the pipelined one-shot: each block pushes its piece in
    /// sub-pieces of this size, and gives its peers a flag after each. A multiple of 16.
    pub pipe_sub_bytes: usize,
    /// Out-of-place all-gathers and all-to-alls through the scratch of at least this many
    /// bytes (all parts together) copy this rank's own part into its output with the copy
    /// engine, on the communicator's second stream beside the kernel, instead of with the
    /// kernel's SMs ([`Plan::own_by_copy_engine`]). In place, nothing is copied either way.
    /// Default `usize::MAX` (off): correct with ranks sharing one GPU, not yet run across GPUs
    /// (docs/performance.md, "The own part by the copy engine").
    pub ce_own_min_bytes: usize,
    /// Streams that share each copy of an all-gather or all-to-all by the copy engines: 1 (the
    /// default) copies each peer's part in one `cuMemcpyAsync` on the caller's stream; 2 splits
    /// it in halves, the second on the communicator's second stream, so that two copy engines
    /// (an H200 has three) may carry one direction at once. Correct with ranks sharing one
    /// GPU, not yet run across GPUs (docs/performance.md, "Copy engines for all-gather and all-to-all"). 1 or 2.
    pub ce_streams: usize,
    /// Two-shot all-reduces, split broadcasts and reduces, and one-shot all-gathers,
    /// reduce-scatters and all-to-alls (aligned) of at least this many bytes per source overlap
    /// their chunks' steps ([`Plan::overlap`]): cut into at least `overlap_chunks` chunks,
    /// chunk c + 1 travels while chunk c is reduced or copied out, one barrier a step. Default `usize::MAX` (off): correct with ranks sharing
    /// one GPU, not yet measured across GPUs (docs/performance.md, "Overlapped steps").
    pub overlap_min_bytes: usize,
    /// The fewest chunks an overlapped call, and every relayed broadcast ([`Algo::Relay`]), is
    /// cut into (more where a block's piece would pass `piece_bytes`). 1 to
    /// [`MAX_OVERLAP_CHUNKS`].
    pub overlap_chunks: usize,
}

/// The most chunks [`Tuning::overlap_chunks`] may ask for.
pub const MAX_OVERLAP_CHUNKS: usize = 64;

impl Tuning {
    /// The defaults for a GPU with `sm_count` SMs that holds `blocks_per_sm` resident blocks
    /// of the collective kernel: up to two blocks per SM (measured on H200: 256 blocks reach
    /// 355 GB/s all-reduce busbw at 1 GiB where 132 reach 310, as one block pushes while
    /// another on the same SM reduces; docs/performance.md, "Grid and blocks per SM"). The size thresholds
    /// come from the sweeps on 2, 3 and 4 x H200 (docs/performance.md, "Planner thresholds at four ranks").
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
            overlap_min_bytes: usize::MAX,
            overlap_chunks: 4,
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
    pub const WORDS: usize = 16;

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
            self.overlap_min_bytes as u64,
            self.overlap_chunks as u64,
        ]
    }

    /// The inverse of [`to_words`](Self::to_words); `None` for a wrong length or a value out
    /// of range.
    pub fn from_words(w: &[u64]) -> Option<Tuning> {
        let [b, p, bb, o, l, sp, d, ce, ce_more, ce_ar, pm, ps, own, ces, ov, ovc] =
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
            overlap_min_bytes: usize::try_from(ov).ok()?,
            overlap_chunks: usize::try_from(ovc).ok()?,
        })
    }

    /// Checks values that reach the kernels: `max_blocks` in `1..=`[`MAX_BLOCKS`] and at most
    /// `resident` (the blocks the GPU holds at once: more would wait for peers that cannot
    /// start), `piece_bytes` a multiple of 16 (it is the distance between blocks' regions of the
    /// scratch) from 1 KiB to 64 MiB, `block_bytes` nonzero, `ll_max_bytes` at most
    /// [`LL_MAX_BYTES`], `pipe_sub_bytes` a nonzero multiple of 16, `ce_streams` 1 or 2, `overlap_chunks` 1 to
    /// [`MAX_OVERLAP_CHUNKS`], and a
    /// workspace for `world` ranks that fits a `usize`.
    pub fn validate(&self, resident: u32, world: usize) -> Result<(), TuningError> {
        let most = MAX_BLOCKS.min(resident.max(1));
        if self.max_blocks == 0 || self.max_blocks > most {
            return Err(TuningError::MaxBlocks {
                max_blocks: self.max_blocks,
                most,
                resident,
            });
        }
        if !(1 << 10..=64 << 20).contains(&self.piece_bytes) || self.piece_bytes % 16 != 0 {
            return Err(TuningError::PieceBytes(self.piece_bytes));
        }
        if self.block_bytes == 0 {
            return Err(TuningError::BlockBytes);
        }
        if self.pipe_sub_bytes == 0 || self.pipe_sub_bytes % 16 != 0 {
            return Err(TuningError::PipeSubBytes(self.pipe_sub_bytes));
        }
        if !(1..=2).contains(&self.ce_streams) {
            return Err(TuningError::CeStreams(self.ce_streams));
        }
        if !(1..=MAX_OVERLAP_CHUNKS).contains(&self.overlap_chunks) {
            return Err(TuningError::OverlapChunks(self.overlap_chunks));
        }
        if self.ll_max_bytes > LL_MAX_BYTES {
            return Err(TuningError::LlMaxBytes(self.ll_max_bytes));
        }
        (self.max_blocks as usize)
            .checked_mul(self.piece_bytes)
            .and_then(|slot| slot.checked_mul(2 * world))
            .ok_or(TuningError::WorkspaceOverflow { world })?;
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

/// A [`Tuning`] value that would break the kernels ([`Tuning::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TuningError {
    /// `max_blocks` is zero, above the kernel's limit, or above what the GPU holds at once.
    #[error("max_blocks = {max_blocks} must be 1 to {most} (the kernel's limit {MAX_BLOCKS}, and the {resident} blocks this GPU holds at once)")]
    MaxBlocks {
        /// The value given.
        max_blocks: u32,
        /// The most allowed here.
        most: u32,
        /// Blocks the GPU holds at once.
        resident: u32,
    },
    /// `piece_bytes` is not a multiple of 16 from 1 KiB to 64 MiB.
    #[error("piece_bytes = {0} must be a multiple of 16 from 1 KiB to 64 MiB")]
    PieceBytes(usize),
    /// `block_bytes` is zero.
    #[error("block_bytes must be nonzero")]
    BlockBytes,
    /// `pipe_sub_bytes` is zero or not a multiple of 16.
    #[error("pipe_sub_bytes = {0} must be a nonzero multiple of 16")]
    PipeSubBytes(usize),
    /// `ce_streams` is not 1 or 2.
    #[error("ce_streams = {0} must be 1 or 2")]
    CeStreams(usize),
    /// `overlap_chunks` is not 1 to [`MAX_OVERLAP_CHUNKS`].
    #[error("overlap_chunks = {0} must be 1 to {MAX_OVERLAP_CHUNKS}")]
    OverlapChunks(usize),
    /// `ll_max_bytes` is above [`LL_MAX_BYTES`].
    #[error("ll_max_bytes = {0} is above LL_MAX_BYTES = {LL_MAX_BYTES}")]
    LlMaxBytes(usize),
    /// The workspace of `world` ranks would not fit a `usize`.
    #[error("the workspace size for {world} ranks overflows")]
    WorkspaceOverflow {
        /// The world size asked for.
        world: usize,
    },
}
