//! The NCCL-shaped calls, written once for every communicator type: [`Collectives`].
//!
//! A communicator implements one method, [`Collectives::queue`] (check, plan and queue one
//! [`Call`] on its buffers); the named calls (`all_reduce`, `broadcast`, ...) and their in-place
//! forms are built on it. [`Communicator`](crate::Communicator) (one host) and
//! [`MultiHostCommunicator`](crate::MultiHostCommunicator) (several hosts) both implement it, so
//! code written against `impl Collectives` runs on either.

use p2p_mem::{DeviceMemory, DeviceMemoryMut, Stream};

use crate::call::Buffers;
use crate::error::Result;
use crate::types::{Call, DataType, Op, RedOp};

/// A call's buffers, as [`Collectives::queue`] takes them.
pub enum CallBuffers<'a> {
    /// Out of place: reads `send`, writes `recv`. Buffers a rank does not use (the non-roots'
    /// `send` of a broadcast, `recv` of a reduce) are not touched.
    Apart {
        /// What the call reads.
        send: &'a dyn DeviceMemory,
        /// What the call writes.
        recv: &'a mut dyn DeviceMemoryMut,
    },
    /// In place in one buffer, as NCCL defines it: for all-gather this rank's input is its part
    /// (`buf[rank * count..]`) of the output; for reduce-scatter its result lands in its part
    /// of the input.
    InPlace(&'a mut dyn DeviceMemoryMut),
}

impl CallBuffers<'_> {
    /// The buffers as the check takes them (read-only views: the check only looks).
    pub(crate) fn given(&self) -> Buffers<'_> {
        match self {
            CallBuffers::Apart { send, recv } => Buffers::Apart {
                send: *send,
                recv: &**recv,
            },
            CallBuffers::InPlace(buf) => Buffers::InPlace(&**buf),
        }
    }
}

/// Writes a named call and its in-place form as [`Collectives::all_reduce`] and
/// [`Collectives::all_reduce_in_place`] are written out: from the two names, the [`Op`] with the
/// arguments it takes beyond `count` and `dtype`, and how they set the [`Call`].
macro_rules! named_calls {
    ($(
        $(#[$doc:meta])* $name:ident,
        $(#[$doc_in_place:meta])* $in_place:ident,
        $op:ident($($arg:ident: $ty:ty),*) $(.$set:ident($val:ident))*;
    )*) => {$(
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $name(&self, send: &impl DeviceMemory, recv: &mut impl DeviceMemoryMut, count: usize,
            dtype: DataType, $($arg: $ty,)* stream: &Stream) -> Result<()> {
            self.call(&Call::new(Op::$op, dtype, count)$(.$set($val))*, send, recv, stream)
        }

        named_calls!(@in_place $(#[$doc_in_place])* $in_place, $op($($arg: $ty),*) $(.$set($val))*);
    )*};
    (@in_place $(#[$doc:meta])* $in_place:ident,
        $op:ident($($arg:ident: $ty:ty),*) $(.$set:ident($val:ident))*) => {
        $(#[$doc])*
        fn $in_place(&self, buf: &mut impl DeviceMemoryMut, count: usize, dtype: DataType,
            $($arg: $ty,)* stream: &Stream) -> Result<()> {
            self.call_in_place(&Call::new(Op::$op, dtype, count)$(.$set($val))*, buf, stream)
        }
    };
}

/// NCCL's collectives on a communicator, each asynchronous on the stream it is given.
///
/// `count` follows NCCL ([`Op::buffer_lens`]): the whole buffer for all-reduce, broadcast and
/// reduce, one rank's part for all-gather, reduce-scatter and all-to-all. The buffers of a
/// reduction (all-reduce, reduce, reduce-scatter) must start at a multiple of their element's
/// size ([`Error::InvalidArgument`](crate::Error::InvalidArgument) otherwise, before anything is
/// queued); the collectives that only move data copy bytes and are not checked.
///
/// ```no_run
/// use p2p_collective::{Collectives, DataType, RedOp};
/// use p2p_mem::{DeviceBuffer, Stream};
///
/// /// Sums `grads` over every rank of `comm`, in place: one host or several alike.
/// fn sum_grads(comm: &impl Collectives, grads: &mut DeviceBuffer<f32>, stream: &Stream)
///     -> p2p_collective::Result<()> {
///     let n = grads.len();
///     comm.all_reduce_in_place(grads, n, DataType::F32, RedOp::Sum, stream)
/// }
/// ```
pub trait Collectives {
    /// Checks `call` on `buffers`, plans it and queues it on `stream`: what every named call
    /// below runs. Nothing is queued if the check fails.
    fn queue(&self, call: &Call, buffers: CallBuffers<'_>, stream: &Stream) -> Result<()>;

    /// Runs `call` out of place: reads `send`, writes `recv`.
    fn call(
        &self,
        call: &Call,
        send: &dyn DeviceMemory,
        recv: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        let comm = self;
        comm.queue(call, CallBuffers::Apart { send, recv }, stream)
    }

    /// Runs `call` in place in `buf` ([`CallBuffers::InPlace`]).
    fn call_in_place(
        &self,
        call: &Call,
        buf: &mut dyn DeviceMemoryMut,
        stream: &Stream,
    ) -> Result<()> {
        let comm = self;
        comm.queue(call, CallBuffers::InPlace(buf), stream)
    }

    /// All-reduce `count` elements of `send` into `recv` on every rank.
    fn all_reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call {
            op: Op::AllReduce,
            dtype,
            count,
            redop,
            root: 0,
        };
        self.call(&call, send, recv, stream)
    }

    named_calls!(@in_place
        /// All-reduce in place.
        all_reduce_in_place, AllReduce(redop: RedOp).redop(redop));

    // The other named calls are the same two functions, each pair from one line.
    named_calls! {
        /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
        broadcast,
        /// Broadcast in place: `root`'s `buf` into every rank's `buf`.
        broadcast_in_place,
        Broadcast(root: usize).root(root);

        /// Reduce every rank's `send` into `root`'s `recv`.
        reduce,
        /// Reduce in place into `root`'s `buf`.
        reduce_in_place,
        Reduce(redop: RedOp, root: usize).redop(redop).root(root);

        /// Gather every rank's `count` elements into every rank's `recv` (`world * count`), in
        /// rank order.
        all_gather,
        /// All-gather in place: this rank's input is `buf[rank * count..][..count]`.
        all_gather_in_place,
        AllGather();

        /// Reduce every rank's `send` (`world * count`) and give rank r part r (`count`) in
        /// `recv`.
        reduce_scatter,
        /// Reduce-scatter in place: the result lands in `buf[rank * count..][..count]`.
        reduce_scatter_in_place,
        ReduceScatter(redop: RedOp).redop(redop);

        /// Send part q (`count` elements) of `send` to rank q; receive rank p's part r into part
        /// p of `recv`.
        all_to_all,
        /// All-to-all in place (the communicator copies `buf` aside first).
        all_to_all_in_place,
        AllToAll();
    }
}
