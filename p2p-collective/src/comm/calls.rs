//! The NCCL-shaped calls: one method per collective, out of place and in place.

use p2p_mem::{DeviceMemory, DeviceMemoryMut, Stream};

use crate::error::Result;
use crate::types::{DataType, Op, RedOp};

use super::*;

impl Communicator {
    /// All-reduce `count` elements of `send` into `recv` on every rank.
    pub fn all_reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::AllReduce, dtype, count).redop(redop),
            send,
            recv,
            stream,
        )
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::AllReduce, dtype, count).redop(redop),
            buf,
            stream,
        )
    }

    /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
    pub fn broadcast(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::Broadcast, dtype, count).root(root),
            send,
            recv,
            stream,
        )
    }

    /// Broadcast in place: `root`'s `buf` into every rank's `buf`.
    pub fn broadcast_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::Broadcast, dtype, count).root(root),
            buf,
            stream,
        )
    }

    /// Reduce every rank's `send` into `root`'s `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::Reduce, dtype, count).redop(redop).root(root),
            send,
            recv,
            stream,
        )
    }

    /// Reduce in place into `root`'s `buf`.
    pub fn reduce_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::Reduce, dtype, count).redop(redop).root(root),
            buf,
            stream,
        )
    }

    /// Gather every rank's `count` elements into every rank's `recv` (`world * count`), in rank order.
    pub fn all_gather(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call(&Call::new(Op::AllGather, dtype, count), send, recv, stream)
    }

    /// All-gather in place: this rank's input is `buf[rank * count..][..count]`.
    pub fn all_gather_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(&Call::new(Op::AllGather, dtype, count), buf, stream)
    }

    /// Reduce every rank's `send` (`world * count`) and give rank r part r (`count`) in `recv`.
    pub fn reduce_scatter(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call(
            &Call::new(Op::ReduceScatter, dtype, count).redop(redop),
            send,
            recv,
            stream,
        )
    }

    /// Reduce-scatter in place: the result lands in `buf[rank * count..][..count]`.
    pub fn reduce_scatter_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        redop: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(
            &Call::new(Op::ReduceScatter, dtype, count).redop(redop),
            buf,
            stream,
        )
    }

    /// Send part q (`count` elements) of `send` to rank q; receive rank p's part r into part p of `recv`.
    pub fn all_to_all(
        &self,
        send: &impl DeviceMemory,
        recv: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call(&Call::new(Op::AllToAll, dtype, count), send, recv, stream)
    }

    /// All-to-all in place.
    pub fn all_to_all_in_place(
        &self,
        buf: &mut impl DeviceMemoryMut,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.call_in_place(&Call::new(Op::AllToAll, dtype, count), buf, stream)
    }
}
