//! The words the kernels carry for a plan: its code, recorded in the status words when a call
//! fails, and the call's signature, compared across ranks in checking mode; each written here
//! once and read back into words for the errors that report them.

use crate::types::{Call, DataType, Op, RedOp};

use super::algo::{Algo, Proto};

/// The code of `op` by `(algo, proto)` (see [`Plan::code`]; the shifts are `coll_abi.h`'s).
pub(crate) fn code(op: Op, algo: Algo, proto: Proto) -> u64 {
    use crate::abi::{CODE_ALGO_SHIFT, CODE_OP_SHIFT, CODE_TAG};
    (CODE_TAG | op.index() << CODE_OP_SHIFT | algo.index() << CODE_ALGO_SHIFT | proto.index())
        as u64
}

/// The op, algorithm and protocol a status word's code names ([`Plan::code`](super::Plan::code)).
pub fn describe_code(code: u64) -> Option<(Op, Algo, Proto)> {
    use crate::abi::{CODE_ALGO_SHIFT, CODE_OP_SHIFT, CODE_TAG};
    let c = usize::try_from(code).ok()?;
    if c / CODE_TAG != 1 {
        return None;
    }
    let op = *Op::ALL.get((c >> CODE_OP_SHIFT) & 0xf)?;
    let algo = *Algo::ALL.get((c >> CODE_ALGO_SHIFT) & 0xf)?;
    let proto = *Proto::ALL.get(c & 0xf)?;
    Some((op, algo, proto))
}

/// The 64-bit signature of `call` run by `(op, algo, proto)`, which ranks compare in checking
/// mode: op, algorithm, protocol (9 bits), type (4), reduction (3), root (4), count (44). A
/// reduction or root the collective has none of is left out (0), so that ranks that give
/// different ones where they mean nothing still agree.
pub(crate) fn signature((op, algo, proto): (Op, Algo, Proto), call: &Call) -> u64 {
    let (redop, root) = (call.effective_redop(), call.effective_root());
    let (dtype, count) = (call.dtype, call.count);
    let head = op.index() | algo.index() << 3 | proto.index() << 7;
    (head as u64 & 0x1ff)
        | ((dtype.index() as u64 & 0xf) << 9)
        | ((redop.index() as u64 & 0x7) << 13)
        | ((root as u64 & 0xf) << 16)
        | ((count as u64 & ((1 << 44) - 1)) << 20)
}

/// A signature in words, e.g. `all_reduce (oneshot/simple) float sum, count 1024`.
pub fn describe(sig: u64) -> String {
    let field = |shift: u32, bits: u32| ((sig >> shift) & ((1 << bits) - 1)) as usize;
    let (Some(op), Some(algo), Some(proto)) = (
        Op::ALL.get(field(0, 3)),
        Algo::ALL.get(field(3, 4)),
        Proto::ALL.get(field(7, 2)),
    ) else {
        return format!("an unknown call (signature {sig:#x})");
    };
    let mut s = format!("{op} ({algo}/{proto})");
    if let Some(d) = DataType::ALL.get(field(9, 4)) {
        s += &format!(" {d}");
    }
    if op.reduces() {
        if let Some(r) = RedOp::ALL.get(field(13, 3)) {
            s += &format!(" {r}");
        }
    }
    if op.rooted() {
        s += &format!(" root {}", field(16, 4));
    }
    s + &format!(", count {}", sig >> 20)
}
