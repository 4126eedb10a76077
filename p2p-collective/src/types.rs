//! What a collective call is: its operation, element type, reduction and count ([`Call`]), as
//! the kernels, the signature check and NCCL know them.

use p2p_mem::DeviceCopy;
use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};

/// The element type of a collective's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// IEEE half precision (`half::f16`); reductions accumulate in f32.
    F16,
    /// bfloat16 (`half::bf16`); reductions accumulate in f32.
    BF16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
}

impl DataType {
    /// The data type of a typed buffer's elements, where they are one of the types below but
    /// `u8` (`None` for `u8`, which stands for raw bytes, and for any other type: arrays,
    /// structs, other integers).
    pub fn of_element(e: p2p_mem::ElementType) -> Option<DataType> {
        Some(if e.is::<f32>() {
            DataType::F32
        } else if e.is::<f64>() {
            DataType::F64
        } else if e.is::<half::f16>() {
            DataType::F16
        } else if e.is::<half::bf16>() {
            DataType::BF16
        } else if e.is::<i32>() {
            DataType::I32
        } else if e.is::<i64>() {
            DataType::I64
        } else {
            return None;
        })
    }

    /// Every type, in a fixed order.
    pub const ALL: [DataType; 7] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
            DataType::F16 | DataType::BF16 => 2,
            DataType::U8 => 1,
        }
    }

    /// The name nccl-tests prints, e.g. `float`, `half`, `bfloat16`.
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
            DataType::U8 => "uint8",
        }
    }

    /// The kernel that handles this type.
    pub(crate) fn kernel(self) -> &'static str {
        match self {
            DataType::F32 => "coll_f32",
            DataType::F64 => "coll_f64",
            DataType::F16 => "coll_f16",
            DataType::BF16 => "coll_bf16",
            DataType::I32 => "coll_i32",
            DataType::I64 => "coll_i64",
            DataType::U8 => "coll_u8",
        }
    }

    /// Its place in [`ALL`](Self::ALL): the collective program's part that holds its kernels,
    /// and its field in a call's signature.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// NCCL's type for it (the one mapping: the communicator over hosts and the benchmarks'
    /// NCCL both use it).
    pub fn nccl(self) -> ncclDataType_t {
        match self {
            DataType::F32 => ncclDataType_t::ncclFloat32,
            DataType::F64 => ncclDataType_t::ncclFloat64,
            DataType::F16 => ncclDataType_t::ncclFloat16,
            DataType::BF16 => ncclDataType_t::ncclBfloat16,
            DataType::I32 => ncclDataType_t::ncclInt32,
            DataType::I64 => ncclDataType_t::ncclInt64,
            DataType::U8 => ncclDataType_t::ncclUint8,
        }
    }

    /// The data type of a Rust element type: `DataType::of::<f32>()`.
    pub fn of<T: Element>() -> DataType {
        T::DATA_TYPE
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type collectives can reduce: `f32`, `f64`, `half::f16`, `half::bf16`, `i32`, `i64`, `u8`.
pub trait Element: DeviceCopy + sealed::Sealed {
    /// Its [`DataType`].
    const DATA_TYPE: DataType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = DataType::$d;
        }
    )* };
}
element!(f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i32 => I32, i64 => I64, u8 => U8);

/// How a reduction combines the ranks' elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (integer types divide with truncation).
    Avg,
}

impl RedOp {
    /// Every reduction.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::Avg => "avg",
        }
    }

    /// The code the kernels know it by (`enum RedOp` in coll_abi.h).
    pub(crate) fn code(self) -> i32 {
        match self {
            RedOp::Sum => crate::abi::R_SUM,
            RedOp::Prod => crate::abi::R_PROD,
            RedOp::Min => crate::abi::R_MIN,
            RedOp::Max => crate::abi::R_MAX,
            RedOp::Avg => crate::abi::R_AVG,
        }
    }

    /// Its place in [`ALL`](Self::ALL), its field in a call's signature.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// NCCL's reduction for it (the one mapping, as [`DataType::nccl`]).
    pub fn nccl(self) -> ncclRedOp_t {
        match self {
            RedOp::Sum => ncclRedOp_t::ncclSum,
            RedOp::Prod => ncclRedOp_t::ncclProd,
            RedOp::Min => ncclRedOp_t::ncclMin,
            RedOp::Max => ncclRedOp_t::ncclMax,
            RedOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }

    /// The inputs the checker ([`verify`](crate::verify)) gives this reduction: small integers
    /// that keep its result exact in every type and every order.
    pub fn inputs(self) -> crate::verify::Class {
        use crate::verify::Class;
        match self {
            RedOp::Sum => Class::Sum,
            RedOp::Prod => Class::Prod,
            RedOp::Min | RedOp::Max => Class::MinMax,
            RedOp::Avg => Class::Avg,
        }
    }

    /// `x` combined with `y`, on the checker's integers, as the kernels combine (`apply` of
    /// the reduction's functor in `kernels/coll/redop.cuh`).
    pub fn apply_exact(self, x: i64, y: i64) -> i64 {
        match self {
            RedOp::Sum | RedOp::Avg => x + y,
            RedOp::Prod => x * y,
            RedOp::Min => x.min(y),
            RedOp::Max => x.max(y),
        }
    }

    /// The result once the values of `n` ranks are combined into `x` (`finish` of the functor).
    pub fn finish_exact(self, x: i64, n: usize) -> i64 {
        match self {
            RedOp::Avg => x / n.max(1) as i64,
            _ => x,
        }
    }
}

impl std::fmt::Display for RedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Every rank gets the reduction of every rank's input.
    AllReduce,
    /// Every rank gets the root's input.
    Broadcast,
    /// The root gets the reduction of every rank's input.
    Reduce,
    /// Every rank gets every rank's input, in rank order.
    AllGather,
    /// Rank r gets part r of the reduction of every rank's input.
    ReduceScatter,
    /// Rank r gets part r of every rank's input, in rank order.
    AllToAll,
}

impl Op {
    /// Every collective.
    pub const ALL: [Op; 6] = [
        Op::AllReduce,
        Op::Broadcast,
        Op::Reduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::AllToAll,
    ];

    /// The code the kernels know it by (`enum Op` in coll_abi.h).
    pub(crate) fn code(self) -> i32 {
        match self {
            Op::AllReduce => crate::abi::OP_ALLREDUCE,
            Op::Broadcast => crate::abi::OP_BROADCAST,
            Op::Reduce => crate::abi::OP_REDUCE,
            Op::AllGather => crate::abi::OP_ALLGATHER,
            Op::ReduceScatter => crate::abi::OP_REDUCESCATTER,
            Op::AllToAll => crate::abi::OP_ALLTOALL,
        }
    }

    /// Its place in [`ALL`](Self::ALL), its field in a call's code and signature.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The name, as nccl-tests' binaries are named: `all_reduce`, `broadcast`, ...
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllToAll => "all_to_all",
        }
    }

    /// Whether it combines elements with a [`RedOp`].
    pub fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::Reduce | Op::ReduceScatter)
    }

    /// Whether it has a root rank.
    pub fn rooted(self) -> bool {
        matches!(self, Op::Broadcast | Op::Reduce)
    }

    /// nccl-tests' bus-bandwidth factor for `world` ranks: busbw = algbw x factor.
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world.max(1) as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce => 1.0,
        }
    }

    /// (input, output) lengths in elements on `rank` for a call with `count`, in NCCL's
    /// convention: `count` is the per-rank output of reduce-scatter, the per-rank input of
    /// all-gather and the per-peer block of all-to-all. Buffers unused on a rank are 0.
    pub fn buffer_lens(
        self,
        count: usize,
        world: usize,
        rank: usize,
        root: usize,
    ) -> (usize, usize) {
        let all = count.saturating_mul(world);
        match self {
            Op::AllReduce => (count, count),
            Op::Broadcast => (if rank == root { count } else { 0 }, count),
            Op::Reduce => (count, if rank == root { count } else { 0 }),
            Op::AllGather => (count, all),
            Op::ReduceScatter => (all, count),
            Op::AllToAll => (all, all),
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One collective call, for [`Collectives::call`](crate::Collectives::call): what the named
/// methods build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The element type.
    pub dtype: DataType,
    /// Elements, in NCCL's convention (see [`Op::buffer_lens`]).
    pub count: usize,
    /// The reduction (ignored by operations that do not reduce).
    pub redop: RedOp,
    /// The root (ignored by operations without one).
    pub root: usize,
}

impl Call {
    /// `op` over `count` elements of `dtype`, with sum and root 0 until set otherwise.
    pub fn new(op: Op, dtype: DataType, count: usize) -> Call {
        Call {
            op,
            dtype,
            count,
            redop: RedOp::Sum,
            root: 0,
        }
    }

    /// The same call with reduction `redop`.
    pub fn redop(self, redop: RedOp) -> Call {
        Call { redop, ..self }
    }

    /// The same call with root `root`.
    pub fn root(self, root: usize) -> Call {
        Call { root, ..self }
    }

    /// The reduction the call means: its own for a reduction, `Sum` for the collectives that
    /// only move data (what the kernels and the call's signature take, so that ranks giving
    /// different ones where they mean nothing still agree).
    pub(crate) fn effective_redop(&self) -> RedOp {
        if self.op.reduces() {
            self.redop
        } else {
            RedOp::Sum
        }
    }

    /// The root the call means: its own for broadcast and reduce, 0 for the others.
    pub(crate) fn effective_root(&self) -> usize {
        if self.op.rooted() {
            self.root
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p_mem::ElementType;

    #[test]
    fn the_kernels_codes_are_the_places_in_all() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!((op.index(), op.code()), (i, i as i32), "{op}");
        }
        for (i, r) in RedOp::ALL.into_iter().enumerate() {
            assert_eq!((r.index(), r.code()), (i, i as i32), "{r}");
        }
    }

    #[test]
    fn every_type_and_reduction_has_nccls() {
        for t in DataType::ALL {
            assert_eq!(
                p2p_transport::nccl::element_bytes(t.nccl()).expect("a type NCCL knows"),
                t.size(),
                "{t:?}"
            );
        }
        let codes: Vec<_> = RedOp::ALL.map(|r| r.nccl().0).to_vec();
        assert_eq!(codes.len(), RedOp::ALL.len());
        assert!(codes
            .iter()
            .enumerate()
            .all(|(i, c)| !codes[..i].contains(c)));
    }

    #[test]
    fn typed_elements_map_to_their_data_type_and_bytes_to_none() {
        for d in DataType::ALL {
            let e = match d {
                DataType::F32 => ElementType::of::<f32>(),
                DataType::F64 => ElementType::of::<f64>(),
                DataType::F16 => ElementType::of::<half::f16>(),
                DataType::BF16 => ElementType::of::<half::bf16>(),
                DataType::I32 => ElementType::of::<i32>(),
                DataType::I64 => ElementType::of::<i64>(),
                DataType::U8 => ElementType::of::<u8>(),
            };
            let want = (d != DataType::U8).then_some(d);
            assert_eq!(DataType::of_element(e), want, "{d:?}");
        }
        assert_eq!(DataType::of_element(ElementType::of::<u32>()), None);
        assert_eq!(DataType::of_element(ElementType::of::<[f32; 4]>()), None);
    }
}
