//! The NCCL-shaped calls: one method per collective, out of place and in place, each pair
//! declared once below by what it adds to the call (its reduction, its root, both or neither).

use p2p_mem::{DeviceMemory, DeviceMemoryMut, Stream};

use crate::error::Result;
use crate::types::{DataType, Op, RedOp};

use super::*;

/// Declares, for each collective, the out-of-place method (`send` into `recv`) and the in-place
/// one (`buf`), both taking `count`, `dtype`, the collective's own arguments and the stream, and
/// queuing the [`Call`] that `call` builds from `Call::new(op, dtype, count)`.
macro_rules! collective_calls {
    // One method: its buffers, then `count`, `dtype`, the collective's own arguments and the
    // stream; it passes the call and the buffers to `self.$via`.
    (@method $(#[$attr:meta])* fn $name:ident($($buf:ident: $buf_ty:ty),+; $($arg:ident: $ty:ty),*)
        op: $op:expr, call: |$c:ident| $build:expr, via: $via:ident) => {
        $(#[$attr])*
        pub fn $name(
            &self,
            $($buf: $buf_ty,)+
            count: usize,
            dtype: DataType,
            $($arg: $ty,)*
            stream: &Stream,
        ) -> Result<()> {
            let $c = Call::new($op, dtype, count);
            self.$via(&$build, $($buf,)+ stream)
        }
    };
    ($(
        $(#[$doc:meta])* fn $name:ident;
        $(#[$doc_in_place:meta])* fn $in_place:ident;
        op: $op:expr, args: ($($arg:ident: $ty:ty),*), call: |$c:ident| $build:expr;
    )+) => {
        impl Communicator {
            $(
                collective_calls!(@method
                    $(#[$doc])*
                    #[allow(clippy::too_many_arguments)]
                    fn $name(send: &impl DeviceMemory, recv: &mut impl DeviceMemoryMut; $($arg: $ty),*)
                    op: $op, call: |$c| $build, via: call
                );
                collective_calls!(@method
                    $(#[$doc_in_place])*
                    fn $in_place(buf: &mut impl DeviceMemoryMut; $($arg: $ty),*)
                    op: $op, call: |$c| $build, via: call_in_place
                );
            )+
        }
    };
}

collective_calls! {
    /// All-reduce `count` elements of `send` into `recv` on every rank.
    fn all_reduce;
    /// All-reduce in place.
    fn all_reduce_in_place;
    op: Op::AllReduce, args: (redop: RedOp), call: |c| c.redop(redop);

    /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
    fn broadcast;
    /// Broadcast in place: `root`'s `buf` into every rank's `buf`.
    fn broadcast_in_place;
    op: Op::Broadcast, args: (root: usize), call: |c| c.root(root);

    /// Reduce every rank's `send` into `root`'s `recv`.
    fn reduce;
    /// Reduce in place into `root`'s `buf`.
    fn reduce_in_place;
    op: Op::Reduce, args: (redop: RedOp, root: usize), call: |c| c.redop(redop).root(root);

    /// Gather every rank's `count` elements into every rank's `recv` (`world * count`), in rank order.
    fn all_gather;
    /// All-gather in place: this rank's input is `buf[rank * count..][..count]`.
    fn all_gather_in_place;
    op: Op::AllGather, args: (), call: |c| c;

    /// Reduce every rank's `send` (`world * count`) and give rank r part r (`count`) in `recv`.
    fn reduce_scatter;
    /// Reduce-scatter in place: the result lands in `buf[rank * count..][..count]`.
    fn reduce_scatter_in_place;
    op: Op::ReduceScatter, args: (redop: RedOp), call: |c| c.redop(redop);

    /// Send part q (`count` elements) of `send` to rank q; receive rank p's part r into part p of `recv`.
    fn all_to_all;
    /// All-to-all in place.
    fn all_to_all_in_place;
    op: Op::AllToAll, args: (), call: |c| c;
}
