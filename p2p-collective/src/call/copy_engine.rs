//! The launch of a copy-engine plan (all-gather and all-to-all into registered outputs, the
//! all-reduce on two ranks): a barrier kernel (every rank has entered the call, so every buffer
//! is free), the copies (`cuMemcpyAsync` into the peers' registered outputs) on the caller's
//! stream and the communicator's second stream, then a second barrier, or for the all-reduce
//! the reduce kernel that waits for each chunk's flag.

use p2p_mem::Stream;

use crate::abi::CollArgs;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::plan::{self, Entry, Plan, MAX_RANKS, THREADS};
use crate::types::{Call, DataType, Op};

use super::check::Checked;
use super::kernel::{args, copy_own_part};

/// Launches the copy-engine plan `plan` of `call` on `stream`: barriers and copies.
pub(super) fn launch(
    comm: &Communicator,
    call: &Call,
    checked: &Checked<'_>,
    plan: &Plan,
    stream: &Stream,
) -> Result<()> {
    let peers = checked.peer_out.ok_or_else(|| Error::InvalidArgument {
        op: call.op.name(),
        rank: comm.rank,
        what: "a copy-engine plan without a registered output".into(),
    })?;
    let args = args(comm, call, checked, plan);
    // The barrier kernel has no data; it runs under the plan's own code, so that a failure in
    // a barrier names this collective.
    let barrier_args = CollArgs {
        count: 0,
        piece: 1,
        ..args
    };
    let barrier = || {
        comm.launcher.launch(
            Entry::CeBarrier,
            DataType::U8,
            (1, THREADS),
            &barrier_args,
            stream,
        )
    };
    let copies = Copies {
        comm,
        call,
        checked,
        peers,
    };
    // The peers wait for this rank's first barrier, its copies and its second barrier: the
    // caller stops every rank on an error queueing any of them.
    barrier().and_then(|()| match call.op {
        Op::AllReduce => copies.all_reduce(plan, &args, stream),
        _ => copies.parts(stream).and_then(|()| barrier()),
    })
}

/// The copies of one call, after its first barrier.
struct Copies<'a> {
    comm: &'a Communicator,
    call: &'a Call,
    checked: &'a Checked<'a>,
    /// Every rank's registered output, as this GPU addresses it.
    peers: [u64; MAX_RANKS],
}

impl Copies<'_> {
    /// All-gather and all-to-all: this rank's part (its input; its part `q` of the input for an
    /// all-to-all) into part `rank` of every peer's output, one `cuMemcpyAsync` each (with
    /// `Tuning::ce_streams` 2, its second half on the side stream beside the first), and out of
    /// place its own part into its own output on the side stream (first there). The caller then
    /// queues a second barrier: every peer's copy into this rank's output has finished (each
    /// peer runs it after its copies).
    fn parts(&self, stream: &Stream) -> Result<()> {
        let (comm, call) = (self.comm, self.call);
        let (me, seg) = (comm.rank, self.seg());
        let output = self.checked.args.output;
        // Out of place, this rank's own part is one more copy, on the side stream beside the
        // peers' (first there: a local copy, it ends long before the peer copies). (An
        // all-gather here is out of place with its buffers apart, or in place: the check makes
        // a partial overlap take no copy engines; an all-to-all in place is never planned here.)
        let own = self.part(me) != output.ptr + me as u64 * seg;
        // With two streams, each peer copy's second half goes on the side stream
        // (`Tuning::ce_streams`), from a 4 KiB boundary.
        let half = if comm.tuning().ce_streams > 1 {
            seg / 2 / 4096 * 4096
        } else {
            seg
        };
        if !own && half == seg {
            return self.to_peers((0, seg), stream);
        }
        let side = comm.launcher.fork(stream)?;
        let own_copied = if own {
            copy_own_part(comm, call, self.checked, side)
        } else {
            Ok(())
        };
        let queued = own_copied
            .and_then(|()| self.to_peers((half, seg), side))
            .and_then(|()| self.to_peers((0, half), stream));
        // Joined whatever happened: the caller's stream must wait for whatever reached the side
        // stream (a copy reading the input), and a capture must end with its fork joined.
        let joined = comm.launcher.join(stream);
        queued.and(joined)
    }

    /// Bytes of one rank's part.
    fn seg(&self) -> u64 {
        (self.call.count * self.call.dtype.size()) as u64
    }

    /// Where this rank's part `q` starts: its input, or part q of it for an all-to-all.
    fn part(&self, q: usize) -> u64 {
        let input = self.checked.args.input.ptr;
        match self.call.op {
            Op::AllToAll => input + q as u64 * self.seg(),
            _ => input,
        }
    }

    /// Bytes `[lo, hi)` of this rank's part `q` into part `rank` of every peer q's output,
    /// staggered so that the ranks spread over their targets.
    #[allow(unsafe_code)]
    fn to_peers(&self, (lo, hi): (u64, u64), stream: &Stream) -> Result<()> {
        let (me, world, seg) = (self.comm.rank, self.comm.world, self.seg());
        if lo >= hi {
            return Ok(());
        }
        debug_assert!(hi <= seg);
        for k in 1..world {
            let q = (me + k) % world;
            // SAFETY: the check found the source long enough for the call, and every rank
            // registered an output of the same length (the window `peers` came from, which
            // holds this rank's whole output), so bytes [lo, hi) (hi <= seg) of part `me` of
            // rank q's output lie inside rank q's registered buffer, which stays mapped while
            // registered; they do not overlap this rank's source. On the success path the
            // first barrier kept every rank from copying before all had entered the call, and
            // the second keeps each rank's later work from starting before every copy into its
            // buffer has run. If the first barrier fails (a time limit, an abort, an earlier
            // failure), the copies still run: they stay inside the registered buffers, whose
            // contents are then undefined (documented on `Tuning::ce_min_bytes`), as after any
            // failed collective.
            unsafe {
                p2p_mem::copy_async(
                    self.peers[q] + me as u64 * seg + lo,
                    self.part(q) + lo,
                    (hi - lo) as usize,
                    stream,
                )
            }?;
        }
        Ok(())
    }

    /// The all-reduce on two ranks: the reduce kernel on the side stream, then the input into
    /// the peer's output in [`plan::CE_CHUNKS`] chunks, each followed by a stream write of 1
    /// into the peer's flag for it, which the peer's reduce kernel waits for; the side stream
    /// clears this rank's flags after its kernel. No second barrier: this rank's call ends when
    /// every chunk of the peer's has landed and been reduced.
    fn all_reduce(&self, plan: &Plan, args: &CollArgs, stream: &Stream) -> Result<()> {
        let comm = self.comm;
        let side = comm.launcher.fork(stream)?;
        let queued = self.all_reduce_on(plan, args, side, stream);
        // Joined whatever happened: the caller's stream must wait for the reduce kernel writing
        // the output, and a capture must end with its fork joined.
        let joined = comm.launcher.join(stream);
        queued.and(joined)
    }

    #[allow(unsafe_code)]
    fn all_reduce_on(
        &self,
        plan: &Plan,
        args: &CollArgs,
        side: &Stream,
        stream: &Stream,
    ) -> Result<()> {
        let comm = self.comm;
        let (me, size) = (comm.rank, self.call.dtype.size());
        let peer = 1 - me;
        comm.launcher.launch(
            Entry::CeReduce,
            plan.kernel_type,
            (plan.grid, plan.threads),
            args,
            side,
        )?;
        let flags = |r: usize| comm.workspace.sync(r) + (crate::abi::CE_FLAGS_OFF * 8) as u64;
        // SAFETY: CE_CHUNKS words of this rank's own sync area (`coll_abi.h` keeps them inside
        // it: asserted in comm/workspace.rs). On the success path the peer has written all of
        // them when the reduce kernel before this memset ends, and writes them again only
        // after the next call's barrier, which this rank enters after this memset (the join
        // orders it before anything later on `stream`). After a failed call (the kernel ended
        // early) a peer's write may land after the memset and leave a stale flag; a failure is
        // permanent (the communicator refuses every later call), so no kernel reads it.
        unsafe { p2p_mem::memset_async(flags(me), 0, plan::CE_CHUNKS * 8, side) }?;
        let input = self.checked.args.input;
        for k in 0..plan::CE_CHUNKS {
            let (lo, hi) = plan::ce_chunk(k, plan.units, size);
            let (off, len) = (lo * size as u64, ((hi - lo) * size as u64) as usize);
            // SAFETY: the check found the input and output `units` elements long, and every
            // rank registered an output of the same length (the window `peers` came from), so
            // chunk k lies inside this rank's input and the peer's registered output, which
            // stays mapped while registered; the call is out of place (the planner's
            // condition), so they do not overlap. On the success path the barrier before kept
            // this rank from writing the peer's output before the peer entered the call; if
            // that barrier fails, the copies still run, inside the peer's registered output,
            // whose contents are then undefined (documented on `Tuning::ce_min_bytes`).
            unsafe { p2p_mem::copy_async(self.peers[peer] + off, input.ptr + off, len, stream) }?;
            // SAFETY: word k of the peer's CE flags, in its sync area, mapped here for as long
            // as this communicator lives; written after the copy in stream order (also after a
            // failed barrier: see the memset above for why a stale flag is harmless).
            unsafe { p2p_mem::write_u64_async(flags(peer) + 8 * k as u64, 1, stream) }?;
        }
        Ok(())
    }
}
