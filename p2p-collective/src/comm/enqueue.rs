//! Checking a call and queueing it: the kernel plans and the copy-engine plans.

use p2p_mem::{check_stream, Device, DeviceMemory, DeviceMemoryMut, Stream};

use crate::error::{Error, Result};
use crate::plan::{self, Access, Kind, Plan, MAX_RANKS, THREADS};
use crate::types::{DataType, Op};

use super::*;

/// A region of a buffer, as a call sees it.
#[derive(Clone, Copy)]
pub(crate) struct Region<'a> {
    pub(crate) ptr: u64,
    pub(super) bytes: usize,
    pub(super) device: &'a Device,
}

/// Refuses a typed buffer whose elements are of another numeric type than `dtype` (a
/// `DeviceBuffer<f32>` reduced as `I32`): the sizes may agree while the results would be
/// garbage. Byte buffers (`u8`), other element types and untyped memory pass.
pub(crate) fn check_element(
    op: &'static str,
    rank: usize,
    dtype: DataType,
    which: &str,
    m: &(impl DeviceMemory + ?Sized),
) -> Result<()> {
    let Some(e) = m.element_type() else {
        return Ok(());
    };
    match DataType::of_element(e) {
        Some(d) if d != dtype => Err(Error::InvalidArgument {
            op,
            rank,
            what: format!(
                "the {which} buffer holds {} elements but the call says {dtype:?}: pass DataType::{d:?}, or a buffer of bytes (u8) to reinterpret memory",
                e.name
            ),
        }),
        _ => Ok(()),
    }
}

impl<'a> Region<'a> {
    /// The whole of `m`, checked to be usable on `stream` ([`check_stream`]).
    pub(crate) fn of<M: DeviceMemory + ?Sized>(m: &'a M, stream: &Stream) -> Result<Region<'a>> {
        check_stream(m, stream)?;
        Ok(Region {
            ptr: m.device_ptr(),
            bytes: m.byte_len(),
            device: m.device(),
        })
    }
}

impl Communicator {
    /// Runs `call` out of place: reads `send`, writes `recv`. Buffers a rank does not use
    /// (the non-roots' `send` of a broadcast, `recv` of a reduce) are not touched.
    ///
    /// The buffers of a reduction (all-reduce, reduce, reduce-scatter) must start at a multiple
    /// of their element's size ([`Error::InvalidArgument`] otherwise, before anything is
    /// queued); the collectives that only move data copy bytes and are not checked. Buffers or
    /// ranks' parts off a 16-byte boundary take kernels that realign their copies.
    pub fn call(
        &self,
        call: &Call,
        send: &dyn DeviceMemory,
        recv: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        let op = call.op.name();
        check_element(op, self.rank, call.dtype, "send", send)?;
        check_element(op, self.rank, call.dtype, "receive", &*recv)?;
        let input = Region::of(send, stream)?;
        let output = Region::of(recv, stream)?;
        self.enqueue(call, input, output, stream)
    }

    /// Runs `call` in place in `buf`, as NCCL defines it: for all-gather this rank's input is
    /// its part (`buf[rank * count..]`) of the output; for reduce-scatter its result lands in
    /// its part of the input.
    pub fn call_in_place(
        &self,
        call: &Call,
        buf: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        check_element(call.op.name(), self.rank, call.dtype, "in-place", &*buf)?;
        let (input, output) = self.in_place(call, Region::of(buf, stream)?);
        self.enqueue(call, input, output, stream)
    }

    /// The input and output regions of `call` run in place in `whole`.
    pub(crate) fn in_place<'a>(&self, call: &Call, whole: Region<'a>) -> (Region<'a>, Region<'a>) {
        // Saturating: a count too large for the buffer is refused by `check_call` afterwards.
        let part_off = self
            .rank
            .saturating_mul(call.count)
            .saturating_mul(call.dtype.size());
        let part = Region {
            ptr: whole.ptr.saturating_add(part_off as u64),
            bytes: whole.bytes.saturating_sub(part_off),
            device: whole.device,
        };
        match call.op {
            Op::AllGather => (part, whole),
            Op::ReduceScatter => (whole, part),
            _ => (whole, whole),
        }
    }

    /// Checks `call`'s arguments: its input and output lengths in elements, or `None` for a
    /// call with nothing to do (count 0).
    pub(crate) fn check_call(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
    ) -> Result<Option<(usize, usize)>> {
        let op = call.op.name();
        let bad = |what: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what,
        };
        if call.op.rooted() && call.root >= self.world {
            return Err(bad(format!(
                "root {} is out of range: there are {} ranks",
                call.root, self.world
            )));
        }
        if call.count == 0 {
            return Ok(None);
        }
        if call.count >= 1 << 40
            || call
                .count
                .checked_mul(self.world * call.dtype.size())
                .is_none()
        {
            return Err(bad(format!("count {} is too large", call.count)));
        }
        let (in_len, out_len) = call
            .op
            .buffer_lens(call.count, self.world, self.rank, call.root);
        let size = call.dtype.size() as u64;
        for (what, region, len) in [("send", input, in_len), ("recv", output, out_len)] {
            if len > 0 {
                self.check_region(op, what, region, len, call.dtype)?;
                // The reductions load whole elements: one off its element's alignment would
                // stop the kernel with a misaligned-address fault, which ends the context. (The
                // collectives that only move data copy bytes, at any address.)
                if call.op.reduces() && region.ptr % size != 0 {
                    return Err(bad(format!(
                        "the {what} buffer starts at {:#x}, not a multiple of {size} bytes (the size of {}): \
                         reductions need buffers aligned to their element type",
                        region.ptr, call.dtype
                    )));
                }
            }
        }
        Ok(Some((in_len, out_len)))
    }

    pub(crate) fn enqueue(
        &self,
        call: &Call,
        input: Region<'_>,
        output: Region<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let op = call.op.name();
        self.ready_on(op, stream)?;
        let Some((in_len, out_len)) = self.check_call(call, &input, &output)? else {
            return Ok(());
        };
        let size = call.dtype.size();
        let (forced, tuning) = self.planner_inputs();
        // One read of the registration table per call (the common case: empty).
        let (in_peers, out_peers) = match self.windows.read() {
            Ok(w) if !w.is_empty() => (
                self.peers_of(&w, input.ptr, in_len * size),
                self.peers_of(&w, output.ptr, out_len * size),
            ),
            _ => (None, None),
        };
        let overlap = input.ptr < output.ptr + (out_len * size) as u64
            && output.ptr < input.ptr + (in_len * size) as u64;
        // An all-gather is in place only with its input exactly this rank's part of the output
        // (the copy engines' plan copies no own part then). Any other overlap (undefined, as
        // in NCCL; only unsafe code can make one) takes the scratch path: the direct and
        // copy-engine plans assume separate buffers.
        let (in_place, partial) = match call.op {
            Op::AllGather => {
                let exact = input.ptr == output.ptr + (self.rank * in_len * size) as u64;
                (exact, overlap && !exact)
            }
            _ => (overlap, false),
        };
        let access = Access {
            input: in_peers.is_some() && !partial,
            output: out_peers.is_some() && !partial,
            in_place,
        };
        let p = plan::plan_with(
            call.op, call.dtype, call.count, self.world, forced, &tuning, access,
        );
        let redop = if call.op.reduces() {
            call.redop.code()
        } else {
            0
        };
        let root = if call.op.rooted() { call.root } else { 0 };
        let mut args = CollArgs {
            input: input.ptr,
            output: output.ptr,
            abort_flag: self.abort.device_ptr(),
            count: p.units,
            piece: p.piece,
            sub: p.sub,
            slot_bytes: self.tuning.slot_bytes() as u64,
            stride: self.tuning.piece_bytes as u64,
            timeout_ns: self
                .options
                .timeout
                .min(crate::settings::MAX_TIMEOUT)
                .as_nanos() as u64,
            sig: plan::signature(p.kind, call.dtype, redop, root, call.count),
            kind: p.kind as i32,
            redop,
            rank: self.rank as i32,
            nranks: self.world as i32,
            root: root as i32,
            check: self.options.check as i32,
            ..CollArgs::default()
        };
        for r in 0..self.world {
            args.sync[r] = self.bases[r];
            args.scratch[r] = self.bases[r] + SYNC_BYTES as u64;
        }
        if p.kind.is_direct() {
            args.peer_in = in_peers.unwrap_or_default();
            args.peer_out = out_peers.unwrap_or_default();
        }
        tracing::debug!(
            rank = self.rank,
            "{op} {} {} x {}: {:?}, {} blocks of {} threads x {} chunks ({}){}",
            call.dtype,
            call.count,
            size,
            p.kind,
            p.grid,
            p.threads,
            p.chunks,
            p.reason,
            if p.own_by_copy_engine && !partial {
                "; own part by the copy engine beside the kernel (out of place, large)"
            } else {
                ""
            }
        );
        // LL runs one 8-byte unit per thread: a piece larger than the block would drop units.
        debug_assert!(!p.kind.is_ll() || p.piece <= p.threads as u64, "{p:?}");
        if p.kind.is_ce() {
            let peers = out_peers.ok_or_else(|| Error::InvalidArgument {
                op,
                rank: self.rank,
                what: "a copy-engine plan without a registered output".into(),
            })?;
            let queued = self.enqueue_ce(call, &p, &input, &output, peers, &mut args, stream);
            // After the join: the side stream's copies are behind it on `stream` too.
            self.window_calls.queued(self.rank, stream);
            return queued;
        }
        // Parts or buffers off a 16-byte boundary (3 ranks of a power-of-two count, say): the
        // `_shift` kernels' copies realign their words there (perf-notes §44).
        let off16 = (call.count * size) % 16 != 0 || input.ptr % 16 != 0 || output.ptr % 16 != 0;
        let family = Family::of(p.kind, self.world, off16);
        if family == Family::Shift {
            tracing::debug!(
                rank = self.rank,
                "{op}: a part or a buffer lies off a 16-byte boundary: the kernel whose copies realign their words"
            );
        }
        let function = self.kernels.function(family, p.kernel_type);
        // A partial overlap (undefined; only unsafe code makes one) keeps the kernel's copy.
        let queued = if !p.own_by_copy_engine || partial {
            self.launch(function, (p.grid, p.threads), &args, stream)
        } else {
            self.launch_beside_own_copy(call, &input, &output, function, &p, &mut args, stream)
        };
        if p.kind.is_direct() {
            // It reads or writes the peers' registered buffers (`peer_in`, `peer_out`).
            self.window_calls.queued(self.rank, stream);
        }
        self.abort_on_error(op, queued)
    }

    /// After an error queueing a call's work: the peers may already be waiting for this rank's
    /// kernel (or barrier), so stop them now rather than at their time limit.
    pub(crate) fn abort_on_error(&self, op: &str, queued: Result<()>) -> Result<()> {
        if let Err(e) = &queued {
            self.abort.abort_because(
                self.rank,
                format!("queueing {op} failed, so its peers would wait for this rank: {e}"),
            );
        }
        queued
    }

    /// The kernel of an out-of-place all-gather or all-to-all through the scratch, with this
    /// rank's own part copied by the copy engine on the side stream beside it
    /// (`Plan::own_by_copy_engine`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_beside_own_copy(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
        function: Kernel<'_, CollArgs>,
        p: &Plan,
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        args.own_done = 1;
        let side = self.side.fork(stream)?;
        // The fork orders the copy after the caller's earlier work on `stream`; the kernel on
        // `stream` neither reads the destination nor writes the source (`own_done`).
        let queued = self
            .copy_own_part(call, input, output, side)
            .and_then(|()| self.launch(function, (p.grid, p.threads), args, stream));
        // Joined whatever happened, so that `stream` waits for the copy and a capture ends with
        // its fork joined.
        let joined = self.side.join(stream);
        queued.and(joined)
    }

    /// Queues on `side` the copy of this rank's own part of an out-of-place all-gather or
    /// all-to-all (its input; part `rank` of an all-to-all's input) into part `rank` of its
    /// output.
    pub(super) fn copy_own_part(
        &self,
        call: &Call,
        input: &Region<'_>,
        output: &Region<'_>,
        side: &Stream,
    ) -> Result<()> {
        let seg = (call.count * call.dtype.size()) as u64;
        let mine = self.rank as u64 * seg;
        let src = match call.op {
            Op::AllToAll => input.ptr + mine,
            _ => input.ptr,
        };
        // SAFETY: `check_call` found the input and output long enough for the call (an
        // all-to-all's input and output and an all-gather's output hold `world` parts of `seg`
        // bytes, an all-gather's input one), so both ranges lie inside them; they do not overlap
        // (the own part is copied only out of place, never for a partial overlap: `enqueue`).
        #[allow(unsafe_code)]
        let copied = unsafe { p2p_mem::copy_async(output.ptr + mine, src, seg as usize, side) };
        copied.map_err(Error::from)
    }

    /// A copy-engine plan (`Kind::is_ce`: all-gather and all-to-all on any world size, all-reduce
    /// on two ranks): a barrier kernel (every rank has entered
    /// the call, so every buffer is free), then [`queue_ce`](Self::queue_ce). The barriers are
    /// the direct kernel with no data.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue_ce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        output: &Region<'_>,
        peers: [u64; MAX_RANKS],
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        // The direct kernel with no data, under the plan's own kind (so that a failure in a
        // barrier names this collective).
        let barrier_args = CollArgs {
            kind: p.kind as i32,
            count: 0,
            piece: 1,
            peer_out: peers,
            ..*args
        };
        let barrier = self.kernels.function(Family::Direct, DataType::U8);
        let run_barrier = || self.launch(barrier, (1, THREADS), &barrier_args, stream);
        // The peers wait for this rank's first barrier, its copies and its second barrier: an
        // error queueing any of them stops every rank rather than leaving them to their time
        // limit.
        let queued = run_barrier()
            .and_then(|()| self.queue_ce(call, p, input, output, &peers, args, stream))
            .and_then(|()| {
                if p.kind == Kind::AllReduceCe {
                    Ok(())
                } else {
                    run_barrier()
                }
            });
        self.abort_on_error(call.op.name(), queued)
    }

    /// The work of [`enqueue_ce`](Self::enqueue_ce) after its first barrier, on the caller's
    /// stream and the side stream:
    /// - all-gather and all-to-all: this rank's part (its input; its part `q` of the input for
    ///   an all-to-all) into part `rank` of every peer's output, one `cuMemcpyAsync` each (with
    ///   `Tuning::ce_streams` 2, its second half on the side stream beside the first), and out
    ///   of place its own part into its own output on the side stream (first there); the
    ///   caller then queues a second barrier (every peer's copy into this rank's output
    ///   has finished: each peer runs it after its copies);
    /// - all-reduce (two ranks): the reduce kernel on the side stream, then the input into the
    ///   peer's output in [`plan::CE_CHUNKS`] chunks, each followed by a stream write of 1 into
    ///   the peer's flag for it, which the peer's reduce kernel waits for; the side stream
    ///   clears this rank's flags after its kernel. No second barrier: this rank's call ends
    ///   when every chunk of the peer's has landed and been reduced.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_ce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        output: &Region<'_>,
        peers: &[u64; MAX_RANKS],
        args: &mut CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        let me = self.rank;
        let seg = (call.count * call.dtype.size()) as u64;
        let part = |q: usize| match call.op {
            Op::AllToAll => input.ptr + q as u64 * seg,
            _ => input.ptr,
        };
        // Out of place, this rank's own part is one more copy, on the side stream beside the
        // peers' (first there: a local copy, it ends long before the peer copies).
        let own = p.kind != Kind::AllReduceCe && part(me) != output.ptr + me as u64 * seg;
        // With two streams, each peer copy's second half goes on the side stream
        // (`Tuning::ce_streams`), from a 4 KiB boundary.
        let half = if self.tuning.ce_streams > 1 {
            seg / 2 / 4096 * 4096
        } else {
            seg
        };
        if p.kind != Kind::AllReduceCe && !own && half == seg {
            return self.queue_ce_copies(seg, &part, peers, (0, seg), stream);
        }
        let side = self.side.fork(stream)?;
        let queued = if p.kind == Kind::AllReduceCe {
            self.queue_ce_all_reduce(call, p, input, peers, args, side, stream)
        } else {
            // (An all-gather here is out of place with its buffers apart: `enqueue` plans no
            // copy engines for a partial overlap; an all-to-all in place is never planned here.)
            let own_copied = if own {
                self.copy_own_part(call, input, output, side)
            } else {
                Ok(())
            };
            own_copied
                .and_then(|()| self.queue_ce_copies(seg, &part, peers, (half, seg), side))
                .and_then(|()| self.queue_ce_copies(seg, &part, peers, (0, half), stream))
        };
        // Joined whatever happened: the caller's stream must wait for whatever reached the side
        // stream (a reduce kernel writing the output, a copy reading the input), and a capture
        // must end with its fork joined.
        let joined = self.side.join(stream);
        queued.and(joined)
    }

    /// The copies of an all-gather or all-to-all by the copy engines: bytes `[lo, hi)` of this
    /// rank's part `q` (`part(q)`, `seg` bytes) into part `rank` of every peer q's output.
    #[allow(unsafe_code)]
    pub(super) fn queue_ce_copies(
        &self,
        seg: u64,
        part: &dyn Fn(usize) -> u64,
        peers: &[u64; MAX_RANKS],
        (lo, hi): (u64, u64),
        stream: &Stream,
    ) -> Result<()> {
        let me = self.rank;
        if lo >= hi {
            return Ok(());
        }
        debug_assert!(hi <= seg);
        // Staggered, so that the ranks spread over their targets.
        for k in 1..self.world {
            let q = (me + k) % self.world;
            // SAFETY: `check_call` found the source long enough for the call, and every rank
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
                    peers[q] + me as u64 * seg + lo,
                    part(q) + lo,
                    (hi - lo) as usize,
                    stream,
                )
            }?;
        }
        Ok(())
    }

    /// The all-reduce by the copy engines after its barrier: the reduce kernel and the clearing
    /// of this rank's flags on `side`, the chunk copies into the peer's output and the flag
    /// writes into the peer's sync area on `stream`.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    pub(super) fn queue_ce_all_reduce(
        &self,
        call: &Call,
        p: &Plan,
        input: &Region<'_>,
        peers: &[u64; MAX_RANKS],
        args: &mut CollArgs,
        side: &Stream,
        stream: &Stream,
    ) -> Result<()> {
        let (me, size) = (self.rank, call.dtype.size());
        let peer = 1 - me;
        let reduce = self
            .kernels
            .function(Family::of(p.kind, self.world, false), p.kernel_type);
        self.launch(reduce, (p.grid, p.threads), args, side)?;
        let flags = |r: usize| self.bases[r] + (crate::abi::CE_FLAGS_OFF * 8) as u64;
        // SAFETY: CE_CHUNKS words of this rank's own sync area (`coll_abi.h` keeps them inside
        // it: asserted at the top of this file). On the success path the peer has written all
        // of them when the reduce kernel before this memset ends, and writes them again only
        // after the next call's barrier, which this rank enters after this memset (the join
        // orders it before anything later on `stream`). After a failed call (the kernel ended
        // early) a peer's write may land after the memset and leave a stale flag; a failure is
        // permanent (the communicator refuses every later call), so no kernel reads it.
        unsafe { p2p_mem::memset_async(flags(me), 0, plan::CE_CHUNKS * 8, side) }?;
        for k in 0..plan::CE_CHUNKS {
            let (lo, hi) = plan::ce_chunk(k, p.units, size);
            let (off, len) = (lo * size as u64, ((hi - lo) * size as u64) as usize);
            // SAFETY: `check_call` found the input and output `units` elements long, and every
            // rank registered an output of the same length (the window `peers` came from), so
            // chunk k lies inside this rank's input and the peer's registered output, which
            // stays mapped while registered; the call is out of place (the planner's
            // condition), so they do not overlap. On the success path the barrier before kept
            // this rank from writing the peer's output before the peer entered the call; if
            // that barrier fails, the copies still run, inside the peer's registered output,
            // whose contents are then undefined (documented on `Tuning::ce_min_bytes`).
            unsafe { p2p_mem::copy_async(peers[peer] + off, input.ptr + off, len, stream) }?;
            // SAFETY: word k of the peer's CE flags, in its sync area, mapped here for as long
            // as this communicator lives; written after the copy in stream order (also after a
            // failed barrier: see the memset above for why a stale flag is harmless).
            unsafe { p2p_mem::write_u64_async(flags(peer) + 8 * k as u64, 1, stream) }?;
        }
        Ok(())
    }
}
