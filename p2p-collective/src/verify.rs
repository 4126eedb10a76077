//! nccl-tests style verification: inputs that make every reduction exact, and a checker that
//! compares every output element byte for byte with the host's expectation.
//!
//! Inputs are small integers (exact in every type, bf16 included), chosen per reduction so
//! that results are exact in any order: sums stay within +-120 on up to 8 ranks, products are
//! powers of two, averages divide exactly. Used by the correctness tests and by
//! `p2p-bench coll` for its `#wrong` column.

use crate::types::{Call, DataType, Op, RedOp};

/// Which input pattern a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Sums: values in -15..=15 (0..=30 for u8).
    Sum,
    /// Products: 1 or 2.
    Prod,
    /// Minimum and maximum: -30..=30 (0..=60 for u8).
    MinMax,
    /// Averages: the sum over ranks is a multiple of the rank count.
    Avg,
    /// Copies: 0..=100, different on every rank.
    Copy,
}

/// The pattern for `op` with `redop`.
pub fn class(op: Op, redop: RedOp) -> Class {
    if op.reduces() {
        redop.inputs()
    } else {
        Class::Copy
    }
}

/// Element `j` of rank `r`'s input, of `n` ranks.
pub fn value(c: Class, dtype: DataType, r: usize, n: usize, j: usize) -> i64 {
    let (j, r) = (j as u64, r as u64);
    let unsigned = dtype == DataType::U8;
    match c {
        Class::Sum => {
            let v = (j.wrapping_mul(7).wrapping_add(r.wrapping_mul(13)) % 31) as i64;
            if unsigned {
                v
            } else {
                v - 15
            }
        }
        Class::Prod => 1 + (j.wrapping_add(r) % 2) as i64,
        Class::MinMax => {
            let v = (j.wrapping_mul(5).wrapping_add(r.wrapping_mul(11)) % 61) as i64;
            if unsigned {
                v
            } else {
                v - 30
            }
        }
        Class::Avg => 2 * (j % 5) as i64 + 2 * (r.wrapping_add(j) % n.max(1) as u64) as i64,
        Class::Copy => (j.wrapping_mul(3).wrapping_add(r.wrapping_mul(17)) % 101) as i64,
    }
}

/// `redop` over `vals` as the kernels compute it (exact for these inputs).
pub fn reduce(redop: RedOp, n: usize, vals: impl Iterator<Item = i64>) -> i64 {
    let acc = vals.reduce(|a, v| redop.apply_exact(a, v)).unwrap_or(0);
    redop.finish_exact(acc, n)
}

/// Writes `v` as one element of `dtype` into `out` (`dtype.size()` bytes; a shorter `out` gets
/// the element's first bytes, a longer one keeps its bytes past them).
pub fn encode(dtype: DataType, v: i64, out: &mut [u8]) {
    let mut b = [0u8; 8];
    match dtype {
        DataType::F32 => b[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::F64 => b.copy_from_slice(&(v as f64).to_le_bytes()),
        DataType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
        DataType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
        DataType::I32 => b[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DataType::I64 => b.copy_from_slice(&v.to_le_bytes()),
        DataType::U8 => b[0] = v as u8,
    }
    let n = out.len().min(dtype.size());
    out[..n].copy_from_slice(&b[..n]);
}

/// Elements per parallel task: large enough that rayon's scheduling costs nothing next to it.
const TASK: usize = 1 << 16;

/// `len` elements of `dtype` made by `f`, built on every core (rayon).
pub fn build(dtype: DataType, len: usize, f: impl Fn(usize) -> i64 + Sync) -> Vec<u8> {
    use rayon::prelude::*;
    let size = dtype.size();
    let mut out = vec![0u8; len * size];
    out.par_chunks_mut(TASK * size)
        .enumerate()
        .for_each(|(ci, chunk)| {
            for (k, e) in chunk.chunks_mut(size).enumerate() {
                encode(dtype, f(ci * TASK + k), e);
            }
        });
    out
}

/// Elements of `got` that differ from `f` (`None`: must still be the 0xFF poison), and the
/// first few, checked on every core (rayon).
pub fn compare(
    dtype: DataType,
    got: &[u8],
    f: impl Fn(usize) -> Option<i64> + Sync,
) -> (usize, Vec<String>) {
    use rayon::prelude::*;
    let size = dtype.size();
    let results: Vec<(usize, Vec<String>)> = got
        .par_chunks(TASK * size)
        .enumerate()
        .map(|(ci, chunk)| {
            let mut wrong = 0;
            let mut first = Vec::new();
            let mut want = [0u8; 8];
            for (k, e) in chunk.chunks(size).enumerate() {
                let j = ci * TASK + k;
                let ok = match f(j) {
                    Some(v) => {
                        encode(dtype, v, &mut want[..size]);
                        e == &want[..size]
                    }
                    None => e.iter().all(|&b| b == 0xff),
                };
                if !ok {
                    wrong += 1;
                    if first.len() < 3 {
                        first.push(format!("[{j}] = {e:02x?}, want {:?}", f(j)));
                    }
                }
            }
            (wrong, first)
        })
        .collect();
    let wrong = results.iter().map(|r| r.0).sum();
    let first = results.into_iter().flat_map(|r| r.1).take(3).collect();
    (wrong, first)
}

/// Rank `rank`'s exact input for `call` on `world` ranks: `len` elements of `call.dtype`
/// (its input's length from [`Op::buffer_lens`], or more), element `j` as [`value`] gives it.
pub fn input(call: &Call, world: usize, rank: usize, len: usize) -> Vec<u8> {
    let c = class(call.op, call.redop);
    build(call.dtype, len, |j| value(c, call.dtype, rank, world, j))
}

/// Where rank `rank`'s input starts, in elements, in the one buffer of an in-place call: its
/// own part for all-gather, the start otherwise.
pub fn in_place_input_offset(call: &Call, rank: usize) -> usize {
    if call.op == Op::AllGather {
        rank.saturating_mul(call.count)
    } else {
        0
    }
}

/// The region (offset, length, in elements) of the receive buffer (the one buffer in place)
/// that [`expected`] describes for `rank`: its result, or for a non-root's reduce the region
/// that must stay untouched.
pub fn result_region(call: &Call, world: usize, rank: usize, in_place: bool) -> (usize, usize) {
    let (in_len, out_len) = call.op.buffer_lens(call.count, world, rank, call.root);
    match (call.op, in_place) {
        (Op::ReduceScatter, true) => (rank.saturating_mul(call.count), call.count),
        (Op::Reduce, _) if rank != call.root => (0, call.count),
        (_, true) => (0, in_len.max(out_len)),
        _ => (0, out_len),
    }
}

/// What element `j` of rank `rank`'s result should be after `call` on `world` ranks, in the
/// layout of [`Op::buffer_lens`]'s output. `None`: untouched (a non-root's reduce output out of
/// place); `in_place` matters only for that case.
pub fn expected(call: &Call, world: usize, rank: usize, in_place: bool, j: usize) -> Option<i64> {
    let Call {
        op,
        dtype,
        count,
        redop,
        root,
    } = *call;
    let c = class(op, redop);
    let v = |p: usize, j: usize| value(c, dtype, p, world, j);
    match op {
        Op::AllReduce => Some(reduce(redop, world, (0..world).map(|p| v(p, j)))),
        Op::Broadcast => Some(v(root, j)),
        Op::Reduce if rank == root => Some(reduce(redop, world, (0..world).map(|p| v(p, j)))),
        Op::Reduce => in_place.then(|| v(rank, j)),
        // (A count of 0 has no elements; `max(1)` keeps any `j` from dividing by it.)
        Op::AllGather => Some(v(j / count.max(1), j % count.max(1))),
        Op::ReduceScatter => Some(reduce(
            redop,
            world,
            (0..world).map(|p| v(p, rank.wrapping_mul(count).wrapping_add(j))),
        )),
        Op::AllToAll => Some(v(
            j / count.max(1),
            rank.wrapping_mul(count).wrapping_add(j % count.max(1)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(dtype: DataType, b: &[u8]) -> f64 {
        match dtype {
            DataType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
            DataType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::I64 => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64,
            DataType::U8 => b[0] as f64,
        }
    }

    /// Every input and every expected result up to 8 ranks is exactly representable in every
    /// type, so `#wrong` can demand bitwise equality.
    #[test]
    fn inputs_and_results_are_exact_in_every_type_up_to_8_ranks() {
        let mut buf = [0u8; 8];
        for dtype in DataType::ALL {
            for op in Op::ALL {
                for redop in RedOp::ALL {
                    for world in 1..=8 {
                        let count = 97;
                        let call = Call {
                            op,
                            dtype,
                            count,
                            redop,
                            root: world - 1,
                        };
                        for rank in 0..world {
                            let (_, out_len) = op.buffer_lens(count, world, rank, call.root);
                            for j in 0..out_len.min(200) {
                                let Some(v) = expected(&call, world, rank, false, j) else {
                                    continue;
                                };
                                let e = &mut buf[..dtype.size()];
                                encode(dtype, v, e);
                                let back = decode(dtype, e);
                                let exact = if dtype == DataType::U8 {
                                    back == (v as u8) as f64
                                } else {
                                    back == v as f64
                                };
                                assert!(
                                    exact,
                                    "{op} {dtype} {redop} world {world}: {v} is not exact ({back})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn averages_divide_exactly_and_every_rank_contributes() {
        for world in 1..=8 {
            for j in 0..50 {
                let vals: Vec<i64> = (0..world)
                    .map(|r| value(Class::Avg, DataType::F32, r, world, j))
                    .collect();
                assert_eq!(vals.iter().sum::<i64>() % world as i64, 0);
            }
        }
        // Sums differ when any one rank's input differs: the pattern depends on the rank.
        let a: Vec<i64> = (0..4)
            .map(|r| value(Class::Sum, DataType::I32, r, 4, 3))
            .collect();
        assert!(a.windows(2).all(|w| w[0] != w[1]), "{a:?}");
    }

    #[test]
    fn the_expected_values_take_any_count_world_and_buffer() {
        // A count of 0 (a valid call that does nothing), a world of 0, and indices past any
        // buffer: answers, not a division by zero or an overflow.
        for op in [Op::AllGather, Op::AllToAll] {
            let call = Call::new(op, DataType::F32, 0);
            assert!(expected(&call, 2, 0, false, 0).is_some());
        }
        let avg = Call::new(Op::AllReduce, DataType::F32, 4).redop(RedOp::Avg);
        assert!(expected(&avg, 0, 0, false, 3).is_some());
        assert!(input(&avg, 0, 0, 4).len() == 16);
        let rs = Call::new(Op::ReduceScatter, DataType::I64, usize::MAX);
        assert!(expected(&rs, 2, 1, false, usize::MAX).is_some());
        // An element written into a slot of the wrong size: its first bytes, no panic.
        let mut short = [0u8; 2];
        encode(DataType::F64, 1, &mut short);
        assert_eq!(short, [0, 0]);
        let mut long = [9u8; 6];
        encode(DataType::I32, -1, &mut long);
        assert_eq!(long, [255, 255, 255, 255, 9, 9]);
        let mut none: [u8; 0] = [];
        encode(DataType::U8, 1, &mut none);
    }

    #[test]
    fn the_checker_counts_wrong_elements_and_poison() {
        let good = build(DataType::F32, 10, |j| j as i64);
        assert_eq!(compare(DataType::F32, &good, |j| Some(j as i64)).0, 0);
        let mut bad = good.clone();
        bad[4] ^= 1;
        let (wrong, first) = compare(DataType::F32, &bad, |j| Some(j as i64));
        assert_eq!(wrong, 1);
        assert!(first[0].starts_with("[1]"), "{first:?}");
        // `None` demands the 0xFF poison: untouched output.
        assert_eq!(compare(DataType::U8, &[0xff, 0xff, 0], |_| None).0, 1);
    }
}
