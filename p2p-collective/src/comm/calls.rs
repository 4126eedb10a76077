//! The NCCL-shaped calls: one method per collective, out of place and in place, each pair
//! declared once below by what it adds to the call (its reduction, its root, both or neither).

use super::Communicator;

/// Declares, on `impl TYPE;` (a type with `call` and `call_in_place`, as [`Communicator`] and
/// [`MultiHostCommunicator`](crate::MultiHostCommunicator) have), for each collective, the
/// out-of-place method (`send` into `recv`) and the in-place one (`buf`), both taking `count`,
/// `dtype`, the collective's own arguments and the stream, and queuing the call that `call`
/// builds from `Call::new(op, dtype, count)` ([`Call`](super::Call)).
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
            dtype: $crate::types::DataType,
            $($arg: $ty,)*
            stream: &$crate::p2p_mem::Stream,
        ) -> $crate::error::Result<()> {
            let $c = $crate::comm::Call::new($op, dtype, count);
            self.$via(&$build, $($buf,)+ stream)
        }
    };
    (impl $target:ty; $(
        $(#[$doc:meta])* fn $name:ident;
        $(#[$doc_in_place:meta])* fn $in_place:ident;
        op: $op:expr, args: ($($arg:ident: $ty:ty),*), call: |$c:ident| $build:expr;
    )+) => {
        impl $target {
            $(
                $crate::comm::calls::collective_calls!(@method
                    $(#[$doc])*
                    #[allow(clippy::too_many_arguments)]
                    fn $name(send: &impl $crate::p2p_mem::DeviceMemory, recv: &mut impl $crate::p2p_mem::DeviceMemoryMut; $($arg: $ty),*)
                    op: $op, call: |$c| $build, via: call
                );
                $crate::comm::calls::collective_calls!(@method
                    $(#[$doc_in_place])*
                    fn $in_place(buf: &mut impl $crate::p2p_mem::DeviceMemoryMut; $($arg: $ty),*)
                    op: $op, call: |$c| $build, via: call_in_place
                );
            )+
        }
    };
}

/// Gives `$m!` (`collective_calls`) the collectives, with `impl $ty;` before them: the one list
/// of NCCL-shaped calls every communicator type offers.
macro_rules! with_collective_calls {
    ($m:ident, $ty:ty) => {
        $crate::comm::calls::$m! {
            impl $ty;
                /// All-reduce `count` elements of `send` into `recv` on every rank.
                fn all_reduce;
                /// All-reduce in place.
                fn all_reduce_in_place;
                op: $crate::types::Op::AllReduce, args: (redop: $crate::types::RedOp), call: |c| c.redop(redop);

                /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
                fn broadcast;
                /// Broadcast in place: `root`'s `buf` into every rank's `buf`.
                fn broadcast_in_place;
                op: $crate::types::Op::Broadcast, args: (root: usize), call: |c| c.root(root);

                /// Reduce every rank's `send` into `root`'s `recv`.
                fn reduce;
                /// Reduce in place into `root`'s `buf`.
                fn reduce_in_place;
                op: $crate::types::Op::Reduce, args: (redop: $crate::types::RedOp, root: usize), call: |c| c.redop(redop).root(root);

                /// Gather every rank's `count` elements into every rank's `recv` (`world * count`), in rank order.
                fn all_gather;
                /// All-gather in place: this rank's input is `buf[rank * count..][..count]`.
                fn all_gather_in_place;
                op: $crate::types::Op::AllGather, args: (), call: |c| c;

                /// Reduce every rank's `send` (`world * count`) and give rank r part r (`count`) in `recv`.
                fn reduce_scatter;
                /// Reduce-scatter in place: the result lands in `buf[rank * count..][..count]`.
                fn reduce_scatter_in_place;
                op: $crate::types::Op::ReduceScatter, args: (redop: $crate::types::RedOp), call: |c| c.redop(redop);

                /// Send part q (`count` elements) of `send` to rank q; receive rank p's part r into part p of `recv`.
                fn all_to_all;
                /// All-to-all in place.
                fn all_to_all_in_place;
                op: $crate::types::Op::AllToAll, args: (), call: |c| c;
        }
    };
}

pub(crate) use {collective_calls, with_collective_calls};

with_collective_calls!(collective_calls, Communicator);
