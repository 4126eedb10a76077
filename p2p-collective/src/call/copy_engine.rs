//! The work of a copy-engine plan (all-gather and all-to-all into registered outputs, the
//! all-reduce on two ranks): a barrier kernel (every rank has entered the call, so every buffer
//! is free), the copies (`cuMemcpyAsync` into the peers' registered outputs) on the caller's
//! stream and the communicator's second stream, then a second barrier, or for the all-reduce
//! the reduce kernel that waits for each chunk's flag.
//!
//! On the success path the first barrier keeps every rank from copying before all have entered
//! the call, and the second keeps each rank's later work from starting before every copy into
//! its buffer has run. If the first barrier fails (a time limit, an abort, an earlier failure),
//! the copies still run: they stay inside the registered buffers, whose contents are then
//! undefined (documented on `Tuning::ce_min_bytes`), as after any failed collective.

use crate::comm::launcher::{Args, Lane, Step, Work};
use crate::error::{Error, Result};
use crate::plan::{self, Entry, MAX_RANKS, THREADS};
use crate::types::{DataType, Op};

use super::Planned;

/// The work of a planned call by the copy engines, into `work` (which holds its argument
/// block); `own` is its own part's copy (`args.rs`).
pub(super) fn copy_work(
    planned: &Planned<'_>,
    own: (u64, u64, usize),
    work: &mut Work,
) -> Result<()> {
    let (comm, call, checked) = (planned.comm, planned.call, &planned.checked);
    // Every rank registered an output of the same length (the window these addresses come
    // from), which stays mapped while registered.
    let peers = checked.peer_out.ok_or_else(|| Error::InvalidArgument {
        op: call.op.name(),
        rank: comm.rank,
        what: "a copy-engine plan without a registered output".into(),
    })?;
    let mut copies = Copies {
        rank: comm.rank,
        world: comm.world,
        seg: (call.count * call.dtype.size()) as u64,
        input: checked.args.input.ptr,
        all_to_all: call.op == Op::AllToAll,
        peers,
        work,
    };
    // The barrier kernel has no data; it runs under the plan's own code, so that a failure in
    // a barrier names this collective.
    let barrier = Step::Kernel {
        entry: Entry::CeBarrier,
        dtype: DataType::U8,
        grid: 1,
        threads: THREADS,
        args: Args::NoData,
        lane: Lane::Caller,
    };
    copies.work.push(barrier)?;
    if call.op == Op::AllReduce {
        let flags = |r: usize| comm.workspace.sync(r) + (crate::abi::CE_FLAGS_OFF * 8) as u64;
        let flags = (flags(comm.rank), flags(1 - comm.rank));
        copies.all_reduce(&planned.plan, flags, call.dtype.size())?;
    } else {
        let streams = comm.tuning().ce_streams;
        copies.parts(own, streams)?;
        copies.work.push(barrier)?;
    }
    Ok(())
}

/// The copies of one call, after its first barrier.
struct Copies<'w> {
    rank: usize,
    world: usize,
    /// Bytes of one rank's part.
    seg: u64,
    /// This rank's input.
    input: u64,
    /// Whether this rank sends each peer its own part of the input (else its whole input).
    all_to_all: bool,
    /// Every rank's registered output, as this GPU addresses it.
    peers: [u64; MAX_RANKS],
    work: &'w mut Work,
}

impl Copies<'_> {
    /// All-gather and all-to-all: this rank's part (its input; its part `q` of the input for an
    /// all-to-all) into part `rank` of every peer's output, one `cuMemcpyAsync` each (with
    /// `Tuning::ce_streams` 2, its second half on the side stream beside the first), and out of
    /// place its own part (`own`: destination, source, bytes) into its own output on the side
    /// stream, first there. The caller then queues a second barrier: every peer's copy into
    /// this rank's output has finished (each peer runs it after its copies).
    fn parts(&mut self, own: (u64, u64, usize), streams: usize) -> Result<()> {
        let seg = self.seg;
        // Out of place, this rank's own part is one more copy, on the side stream beside the
        // peers' (first there: a local copy, it ends long before the peer copies). (An
        // all-gather here is out of place with its buffers apart, or in place: the check makes
        // a partial overlap take no copy engines; an all-to-all in place is never planned here.)
        let copy_own = own.0 != own.1;
        // With two streams, each peer copy's second half goes on the side stream, from a 4 KiB
        // boundary.
        let half = if streams > 1 {
            seg / 2 / 4096 * 4096
        } else {
            seg
        };
        if !copy_own && half == seg {
            return self.copy_to_peers((0, seg), Lane::Caller);
        }
        self.work.push(Step::Fork)?;
        if copy_own {
            let (dst, src, bytes) = own;
            self.work.push(Step::Copy {
                dst,
                src,
                bytes,
                lane: Lane::Side,
            })?;
        }
        self.copy_to_peers((half, seg), Lane::Side)?;
        self.copy_to_peers((0, half), Lane::Caller)?;
        self.work.push(Step::Join)
    }

    /// Where this rank's part `q` starts: its input, or part q of it for an all-to-all.
    fn part(&self, q: usize) -> u64 {
        if self.all_to_all {
            self.input + q as u64 * self.seg
        } else {
            self.input
        }
    }

    /// Bytes `[lo, hi)` of this rank's part `q` into part `rank` of every peer q's output,
    /// staggered so that the ranks spread over their targets. Bytes [lo, hi) (hi <= seg) of
    /// part `rank` of rank q's output lie inside rank q's registered buffer (which holds this
    /// rank's whole output's length); they do not overlap this rank's source.
    fn copy_to_peers(&mut self, (lo, hi): (u64, u64), lane: Lane) -> Result<()> {
        let (me, world, seg) = (self.rank, self.world, self.seg);
        if lo >= hi {
            return Ok(());
        }
        debug_assert!(hi <= seg);
        for k in 1..world {
            let q = (me + k) % world;
            self.work.push(Step::Copy {
                dst: self.peers[q] + me as u64 * seg + lo,
                src: self.part(q) + lo,
                bytes: (hi - lo) as usize,
                lane,
            })?;
        }
        Ok(())
    }

    /// The all-reduce on two ranks: the reduce kernel on the side stream, then the input into
    /// the peer's output in [`plan::CE_CHUNKS`] chunks, each followed by a stream write of 1
    /// into the peer's flag for it (`flags`: this rank's CE flags and the peer's, in their sync
    /// areas), which the peer's reduce kernel waits for; the side stream clears this rank's
    /// flags after its kernel. No second barrier: this rank's call ends when every chunk of the
    /// peer's has landed and been reduced.
    ///
    /// The flags: on the success path the peer has written all of this rank's when the reduce
    /// kernel before the clearing ends, and writes them again only after the next call's
    /// barrier, which this rank enters after the clearing (the join orders it before anything
    /// later on the caller's stream). After a failed call (the kernel ended early) a peer's
    /// write may land after the clearing and leave a stale flag; a failure is permanent (the
    /// communicator refuses every later call), so no kernel reads it. The chunks lie inside this
    /// rank's input and the peer's registered output (both `units` elements); the call is out
    /// of place (the planner's condition), so they do not overlap.
    fn all_reduce(
        &mut self,
        plan: &plan::Plan,
        (mine, theirs): (u64, u64),
        size: usize,
    ) -> Result<()> {
        let peer = 1 - self.rank;
        self.work.push(Step::Fork)?;
        self.work.push(Step::Kernel {
            entry: Entry::CeReduce,
            dtype: plan.kernel_type,
            grid: plan.grid,
            threads: plan.threads,
            args: Args::Call,
            lane: Lane::Side,
        })?;
        self.work.push(Step::Zero {
            dst: mine,
            bytes: plan::CE_CHUNKS * 8,
            lane: Lane::Side,
        })?;
        for k in 0..plan::CE_CHUNKS {
            let (lo, hi) = plan::ce_chunk(k, plan.units, size);
            let off = lo * size as u64;
            self.work.push(Step::Copy {
                dst: self.peers[peer] + off,
                src: self.input + off,
                bytes: ((hi - lo) * size as u64) as usize,
                lane: Lane::Caller,
            })?;
            self.work.push(Step::Write {
                dst: theirs + 8 * k as u64,
                value: 1,
                lane: Lane::Caller,
            })?;
        }
        self.work.push(Step::Join)
    }
}
