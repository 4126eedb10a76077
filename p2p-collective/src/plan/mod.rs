//! Planning a call: which algorithm and protocol, how many blocks, how the data is cut.
//!
//! Pure arithmetic, tested on the host. A [`Plan`] has two axes: the [`Algo`] (how the bytes
//! travel between ranks) and the [`Proto`] (how each move is carried and signalled); what each
//! is and when it can run is `algo.rs`, when the planner picks which is `choose.rs`, how a call
//! is cut for its kernel is `shape.rs`, which kernel runs it is `entry.rs`. The stepped kernels
//! run `chunks` rounds; in each, block b of the grid handles `piece` elements starting at
//! `chunk * grid * piece + b * piece`. Every rank computes the same plan from the same call,
//! which keeps the per-block step counters in step across ranks.
//!
//! A new algorithm is a variant of [`Algo`] (with its arms in `algo.rs`), an arm in
//! `choose.rs` where the planner should pick it, and its kernel file
//! (`kernels/coll/algo/<name>.cuh`, whose entry point is named after it).

use crate::types::{Call, DataType, Op};

mod algo;
mod choose;
mod code;
mod entry;
mod shape;
#[cfg(test)]
mod tests;
mod tuning;
#[cfg(test)]
mod validate_tests;

pub use algo::{Algo, Forced, Proto};
pub use code::{describe, describe_code};
pub use entry::Entry;
pub use shape::ce_chunk;
pub use tuning::{Tuning, TuningError, MAX_OVERLAP_CHUNKS};

/// Largest all-reduce, in bytes, that can run LL (its lines take twice the data's size in
/// scratch); [`Tuning::ll_max_bytes`] is where the planner switches by default.
pub const LL_MAX_BYTES: usize = crate::abi::LL_MAX_BYTES;

/// Bytes of one (parity, source rank) slot of the LL region (`LL_SLOT_BYTES` in `coll_abi.h`).
pub const LL_SLOT_BYTES: usize = crate::abi::LL_SLOT_BYTES;

/// Chunks of a copy-engine all-reduce (see [`ce_chunk`]): 6 and 8 halving chunks measured the
/// same at 1 GiB on 2 x H200 and 6 better at 256 MiB; uniform chunks left a large last chunk
/// to reduce after every copy had landed (docs/performance.md, "The copy-engine all-reduce on
/// two ranks").
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
/// 16 blocks of 512 took 2.76 (one SM's stores into the peer are the limit: docs/performance.md,
/// "All-reduce, LL").
pub const LL2_PIECE: u64 = 128;

/// On two ranks a reduce-scatter on registered buffers reads its part from the peer's input
/// (the direct kernel) only while all parts together are smaller than this: on 2 x H200 the
/// read measured 324 / 330 / 333 GB/s busbw at 256 MiB / 512 MiB / 1 GiB against 312 / 330 /
/// 346 for the push through the scratch, as reads across the link are slower than writes.
pub const RS_DIRECT_MAX_BYTES_TWO_RANKS: usize = 1 << 30;

/// What the planner knows of a call's buffers: which ones peers can reach directly (every rank
/// registered them, [`Communicator::register`](crate::Communicator::register), so the kernel
/// reads peers' inputs and writes peers' outputs without staging), whether the call is in
/// place, and whether a part or a buffer lies off a 16-byte boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Every rank's input is registered.
    pub input: bool,
    /// Every rank's output is registered.
    pub output: bool,
    /// The call is in place, or its buffers overlap otherwise (an all-to-all in place cannot
    /// write into peers directly: a peer may still be reading the part it is about to
    /// receive).
    pub in_place: bool,
    /// A rank's part or one of the buffers lies off a 16-byte boundary (3 ranks of a
    /// power-of-two count, say): one-shot copies then realign their words
    /// ([`Entry::OneShotUnaligned`]).
    pub unaligned: bool,
}

impl Access {
    /// Plain buffers, apart and aligned: everything goes through the registered scratch.
    pub const NONE: Access = Access {
        input: false,
        output: false,
        in_place: false,
        unaligned: false,
    };
}

/// How one call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The collective.
    pub op: Op,
    /// How the bytes travel between ranks.
    pub algo: Algo,
    /// How each move is carried and signalled.
    pub proto: Proto,
    /// The kernel that runs it (for the copy engines, the barrier around the copies).
    pub entry: Entry,
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
    /// per block; for the direct algorithm, elements per block of the rank's share.
    pub piece: u64,
    /// For [`Algo::Pipe`], elements per sub-piece (a whole number of 16-byte vectors); 0 for
    /// the others.
    pub sub: u64,
    /// An all-gather or all-to-all through the scratch, out of place, whose own part the copy
    /// engine copies on a second stream beside the kernel (see [`Tuning::ce_own_min_bytes`]).
    pub own_by_copy_engine: bool,
    /// Rounds over the data.
    pub chunks: u64,
    /// A two-shot or push all-reduce, split broadcast or reduce (either kind), or one-shot
    /// all-gather, reduce-scatter or all-to-all whose chunks' steps overlap: at step t stage k
    /// of chunk t - k, one barrier a step ([`Tuning::overlap_min_bytes`]).
    pub overlap: bool,
    /// Why this algorithm and protocol, for the log.
    pub reason: &'static str,
    /// Where an algorithm or protocol was forced and cannot run this call: why (the call runs
    /// as planned without it).
    pub refused: Option<&'static str>,
    /// The call's signature, which the kernels compare across ranks in checking mode (op,
    /// algorithm, protocol, type, reduction, root, count; [`describe`] reads it back).
    pub sig: u64,
}

impl Plan {
    /// Barrier steps each block takes (each a flag exchange with every peer, or for LL one
    /// exchange of lines).
    pub fn steps(&self, world: usize) -> u64 {
        let per_chunk = self
            .algo
            .steps_per_chunk(self.proto, world, self.piece, self.sub);
        // The kinds that write into the peers' outputs close with one barrier more (their
        // peers' writes have landed); the broadcasts into them open with one (every peer's
        // output is free). The relay's flags of its last chunk stand for its close; its
        // reduce's counter passes two steps more (its non-roots' flags to the root run one
        // ahead, and it ends on the last chunk's parity), its all-reduce's two a chunk
        // (`kernels/coll/algo/relay.cuh`).
        let closing = u64::from(matches!(self.algo, Algo::Push | Algo::SplitOut));
        let extra = match (self.algo, self.op) {
            (Algo::SplitOut | Algo::Relay, Op::Broadcast) => 1,
            // Two flags a chunk (pushed, then written into the outputs).
            (Algo::Relay, Op::AllReduce) => self.chunks,
            (Algo::Relay, _) => 2,
            _ => 0,
        };
        let stepped = if self.overlap {
            // chunks + stages - 1 steps, a barrier between each two.
            self.chunks.saturating_add(per_chunk).saturating_sub(1)
        } else {
            self.chunks.saturating_mul(per_chunk)
        };
        stepped.saturating_add(closing).saturating_add(extra)
    }

    /// Whether it reads or writes the peers' registered buffers (what
    /// [`Communicator::deregister`](crate::Communicator::deregister) waits for).
    pub fn uses_windows(&self) -> bool {
        matches!(
            self.algo,
            Algo::Direct | Algo::Push | Algo::SplitOut | Algo::Relay
        ) || self.proto == Proto::CopyEngine
    }

    /// The algorithm and protocol.
    pub fn path(&self) -> (Algo, Proto) {
        (self.algo, self.proto)
    }

    /// The algorithm and protocol, for logs and results: `oneshot/ll`, `split/simple`, ...
    pub fn route(&self) -> String {
        format!("{}/{}", self.algo.name(), self.proto.name())
    }

    /// The code the kernel records in its status words for this plan (its op, algorithm and
    /// protocol; [`describe_code`] reads it back). Never one of the send/recv codes, which
    /// are below 4096.
    pub fn code(&self) -> u64 {
        code::code(self.op, self.algo, self.proto)
    }
}

/// What a call is planned from besides the call: the world size, what is forced, and the
/// tuning. A communicator makes one at init and plans every call with it; a test or a tool
/// makes one as it likes (`Planner { world, forced, tuning }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planner {
    /// Ranks.
    pub world: usize,
    /// What is forced.
    pub forced: Forced,
    /// The planner's knobs.
    pub tuning: Tuning,
}

impl Planner {
    /// The planner of a communicator of `world` ranks with `forced` and `tuning`; `check`
    /// (checking mode) turns LL off, since LL's lines carry no call signature (a forced LL then
    /// runs `Simple`). The stepped kernels carry it in their step signals, and the copy
    /// engines' plans in their barrier kernel's (a mismatch found there still lets the queued
    /// copies run, inside the registered buffers, as after any failed call).
    pub fn new(world: usize, forced: Forced, check: bool, tuning: Tuning) -> Planner {
        if !check {
            return Planner {
                world,
                forced,
                tuning,
            };
        }
        let proto = match forced.proto {
            Some(Proto::Ll) => Some(Proto::Simple),
            p => p,
        };
        Planner {
            world,
            forced: Forced { proto, ..forced },
            tuning: Tuning {
                ll_max_bytes: 0,
                ..tuning
            },
        }
    }

    /// The plan of `call`, with the buffers `access` describes.
    ///
    /// `count` follows NCCL (see [`Op::buffer_lens`]). A count of 0 plans too, though
    /// communicators never launch one (zero counts are no-ops).
    pub fn plan(&self, call: &Call, access: Access) -> Plan {
        plan_call(call, self.world, self.forced, &self.tuning, access)
    }
}

/// The plan of `call` on `world` ranks with `forced`, `tuning` and the buffers `access` says.
fn plan_call(call: &Call, world: usize, forced: Forced, tuning: &Tuning, access: Access) -> Plan {
    let (op, dtype, count) = (call.op, call.dtype, call.count);
    let world = world.max(1);
    // Bytes of one source's data: the whole buffer, or one rank's part. (Saturating: a count no
    // communicator accepts, 2^40 elements or more, still plans, as the largest size.)
    let seg_bytes = count.saturating_mul(dtype.size());
    let need = algo::Need {
        op,
        seg_bytes,
        world,
        access,
    };
    let (mut algo, proto, reason, refused) = choose::choose(need, forced, tuning);
    let kernel_type = if op.reduces() { dtype } else { DataType::U8 };
    let elem = kernel_type.size();
    if algo == Algo::Pipe && shape::pipe_shape(seg_bytes, elem, tuning).is_none() {
        // Never planned (`algo::fits`); the stepped one-shot covers any size.
        algo = Algo::OneShot;
    }
    let units = (seg_bytes / elem) as u64;
    // What one rank moves: the whole buffer for all-reduce, broadcast and reduce; its n parts
    // for the others.
    let bytes = match op {
        Op::AllGather | Op::ReduceScatter | Op::AllToAll => seg_bytes.saturating_mul(world),
        _ => seg_bytes,
    };
    // Stages to overlap: two-shot's and the split's three, the push all-reduce's and the split
    // into outputs' two; one-shot's two for the collectives that combine parts (aligned: the
    // realigning kernel runs in turn).
    let staged = match algo {
        Algo::TwoShot | Algo::Split | Algo::Push | Algo::SplitOut => true,
        Algo::OneShot => {
            matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll) && !access.unaligned
        }
        _ => false,
    };
    let overlap = staged && proto == Proto::Simple && seg_bytes >= tuning.overlap_min_bytes;
    // The relay's chunks pipeline through its flags, whatever the size: always cut into
    // `overlap_chunks` chunks at least (it has no stages to overlap).
    let s = shape::shape(
        op,
        (algo, proto, overlap || algo == Algo::Relay),
        (seg_bytes, bytes),
        units,
        elem,
        world,
        tuning,
    );
    let entry = Entry::of(op, (algo, proto), world, (access.unaligned, overlap));
    let own_by_copy_engine = (algo, proto) == (Algo::OneShot, Proto::Simple)
        && matches!(op, Op::AllGather | Op::AllToAll)
        && !access.in_place
        && bytes >= tuning.ce_own_min_bytes;
    Plan {
        op,
        algo,
        proto,
        entry,
        kernel_type,
        units,
        grid: s.grid,
        threads: s.threads,
        piece: s.piece,
        sub: s.sub,
        own_by_copy_engine,
        chunks: s.chunks,
        overlap,
        reason,
        refused,
        sig: code::signature((op, algo, proto), call),
    }
}
