//! The nccl-tests style correctness matrix, shared by the one-process and the
//! process-per-GPU tests.
//!
//! Inputs are small integers (exact in every type, including bf16), built per reduction so
//! that every result is exact in any order: sums stay within +-120, products are powers of
//! two, averages divide exactly. Outputs are poisoned (0xFF bytes) first; every element of
//! every output is compared byte for byte with the host's expectation.
#![allow(dead_code)]

use std::time::Instant;

use p2p_collective::{Call, Communicator, DataType, Op, RedOp};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};

/// The counts the issue asks for.
pub const COUNTS: [usize; 7] = [0, 1, 7, 1023, 65537, (1 << 20) + 3, 64 << 20];

/// All visible GPUs, or a panic naming how many the test needs.
pub fn gpus(n: usize) -> Vec<Device> {
    let all = Device::all().unwrap_or_else(|e| panic!("this test needs {n} GPU(s): {e}"));
    assert!(
        all.len() >= n,
        "this test needs {n} GPU(s), found {}",
        all.len()
    );
    all.into_iter().take(n).collect()
}

/// Counts from `P2PTEST_COUNTS` (comma list), else [`COUNTS`].
pub fn counts() -> Vec<usize> {
    match std::env::var("P2PTEST_COUNTS") {
        Ok(v) => v.split(',').filter_map(|c| c.trim().parse().ok()).collect(),
        Err(_) => COUNTS.to_vec(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Sum,
    Prod,
    MinMax,
    Avg,
    Copy,
}

fn class(op: Op, redop: RedOp) -> Class {
    if !op.reduces() {
        return Class::Copy;
    }
    match redop {
        RedOp::Sum => Class::Sum,
        RedOp::Prod => Class::Prod,
        RedOp::Min | RedOp::Max => Class::MinMax,
        RedOp::Avg => Class::Avg,
    }
}

/// Element `j` of rank `r`'s input.
fn value(c: Class, dtype: DataType, r: usize, n: usize, j: usize) -> i64 {
    let (j, r) = (j as u64, r as u64);
    let unsigned = dtype == DataType::U8;
    match c {
        Class::Sum => {
            let v = ((j.wrapping_mul(7) + r * 13) % 31) as i64;
            if unsigned {
                v
            } else {
                v - 15
            }
        }
        Class::Prod => 1 + ((j + r) % 2) as i64,
        Class::MinMax => {
            let v = ((j.wrapping_mul(5) + r * 11) % 61) as i64;
            if unsigned {
                v
            } else {
                v - 30
            }
        }
        Class::Avg => 2 * (j % 5) as i64 + 2 * ((r + j) % n as u64) as i64,
        Class::Copy => ((j.wrapping_mul(3) + r * 17) % 101) as i64,
    }
}

fn reduce(redop: RedOp, n: usize, vals: impl Iterator<Item = i64>) -> i64 {
    let mut acc: Option<i64> = None;
    for v in vals {
        acc = Some(match (acc, redop) {
            (None, _) => v,
            (Some(a), RedOp::Sum | RedOp::Avg) => a + v,
            (Some(a), RedOp::Prod) => a * v,
            (Some(a), RedOp::Min) => a.min(v),
            (Some(a), RedOp::Max) => a.max(v),
        });
    }
    let a = acc.unwrap_or(0);
    if redop == RedOp::Avg {
        a / n as i64
    } else {
        a
    }
}

fn encode(dtype: DataType, v: i64, out: &mut [u8]) {
    match dtype {
        DataType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
        DataType::F16 => out.copy_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
        DataType::BF16 => out.copy_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
        DataType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DataType::I64 => out.copy_from_slice(&v.to_le_bytes()),
        DataType::U8 => out[0] = v as u8,
    }
}

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4)
        .min(32)
}

/// `len` elements of `dtype` made by `f`, built on every core.
fn build(dtype: DataType, len: usize, f: impl Fn(usize) -> i64 + Sync) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; len * size];
    let per = len.div_ceil(threads()).max(4096);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(per * size).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (k, e) in chunk.chunks_mut(size).enumerate() {
                    encode(dtype, f(ci * per + k), e);
                }
            });
        }
    });
    out
}

/// Elements of `got` that differ from `f`, and the first few, on every core.
fn compare(
    dtype: DataType,
    got: &[u8],
    f: impl Fn(usize) -> Option<i64> + Sync,
) -> (usize, Vec<String>) {
    let size = dtype.size();
    let len = got.len() / size;
    let per = len.div_ceil(threads()).max(4096);
    let results: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = got
            .chunks(per * size)
            .enumerate()
            .map(|(ci, chunk)| {
                let f = &f;
                s.spawn(move || {
                    let mut wrong = 0;
                    let mut first = Vec::new();
                    let mut want = [0u8; 8];
                    for (k, e) in chunk.chunks(size).enumerate() {
                        let j = ci * per + k;
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
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or((usize::MAX / 2, vec!["checker panicked".into()]))
            })
            .collect()
    });
    let wrong = results.iter().map(|r| r.0).sum();
    let first = results.into_iter().flat_map(|r| r.1).take(3).collect();
    (wrong, first)
}

/// One rank run by this process: its communicator, stream and two buffers big enough for the
/// largest count.
pub struct Local {
    pub comm: Communicator,
    pub stream: Stream,
    pub input: DeviceBuffer<u8>,
    pub output: DeviceBuffer<u8>,
}

impl Local {
    pub fn new(comm: Communicator, max_count: usize) -> Local {
        let n = comm.world_size();
        let bytes = (max_count * n * 8).max(64);
        let d = comm.device().clone();
        Local {
            stream: Stream::new(&d).expect("stream"),
            input: DeviceBuffer::new(&d, bytes).expect("input buffer"),
            output: DeviceBuffer::new(&d, bytes).expect("output buffer"),
            comm,
        }
    }
}

/// What the matrix found.
#[derive(Default)]
pub struct Summary {
    pub cases: usize,
    pub wrong: usize,
    pub failures: Vec<String>,
}

/// Runs `ops` x every type x every reduction x every root x in/out of place x `counts` on the
/// ranks in `locals` (all of them in one process, or this process's one).
pub fn run_matrix(locals: &mut [Local], ops: &[Op], counts: &[usize]) -> Summary {
    let n = locals[0].comm.world_size();
    let mut sum = Summary::default();
    for &op in ops {
        let t = Instant::now();
        let before = sum.cases;
        for &count in counts {
            for dtype in DataType::ALL {
                let redops: &[RedOp] = if op.reduces() {
                    &RedOp::ALL
                } else {
                    &[RedOp::Sum]
                };
                let roots: Vec<usize> = if op.rooted() {
                    (0..n).collect()
                } else {
                    vec![0]
                };
                for &redop in redops {
                    for &root in &roots {
                        for in_place in [false, true] {
                            let call = Call {
                                op,
                                dtype,
                                count,
                                redop,
                                root,
                            };
                            let (wrong, detail) = run_case(locals, &call, in_place);
                            sum.cases += 1;
                            sum.wrong += wrong;
                            if wrong > 0 {
                                let line = format!(
                                    "{op} {dtype} {redop} root {root} {} count {count}: {wrong} wrong {detail}",
                                    if in_place { "in place" } else { "out of place" }
                                );
                                eprintln!("WRONG {line}");
                                sum.failures.push(line);
                            }
                        }
                    }
                }
            }
        }
        eprintln!(
            "{:>15}: {} cases, counts {:?}, {:.1} s",
            op.name(),
            sum.cases - before,
            counts,
            t.elapsed().as_secs_f64()
        );
    }
    sum
}

/// Runs one call on every local rank and checks each output. Returns (#wrong, detail).
pub fn run_case(locals: &mut [Local], call: &Call, in_place: bool) -> (usize, String) {
    let n = locals[0].comm.world_size();
    let Call {
        op,
        dtype,
        count,
        redop,
        root,
    } = *call;
    let size = dtype.size();
    let c = class(op, redop);
    // Inputs.
    for l in locals.iter_mut() {
        let r = l.comm.rank();
        let (in_len, out_len) = op.buffer_lens(count, n, r, root);
        let host = build(dtype, in_len, |j| value(c, dtype, r, n, j));
        l.output.memset_u8(0xff).expect("poison");
        if in_place {
            let buf_len = in_len.max(out_len);
            let off = if op == Op::AllGather {
                r * count * size
            } else {
                0
            };
            if buf_len > 0 && !host.is_empty() {
                l.output
                    .slice_mut(off..off + host.len())
                    .expect("view")
                    .copy_from_host(&host)
                    .expect("input");
            }
        } else {
            l.input.memset_u8(0x00).expect("clear");
            if !host.is_empty() {
                l.input
                    .slice_mut(..host.len())
                    .expect("view")
                    .copy_from_host(&host)
                    .expect("input");
            }
        }
    }
    // The calls: every rank's from this one thread (they never block the host).
    for l in locals.iter_mut() {
        let res = if in_place {
            l.comm.call_in_place(call, &mut l.output, &l.stream)
        } else {
            l.comm.call(call, &l.input, &mut l.output, &l.stream)
        };
        if let Err(e) = res {
            return (1, format!("rank {}: {e}", l.comm.rank()));
        }
    }
    let mut wrong = 0;
    let mut detail = String::new();
    for l in locals.iter_mut() {
        if let Err(e) = l.comm.synchronize(&l.stream) {
            return (1, format!("rank {}: {e}", l.comm.rank()));
        }
        let r = l.comm.rank();
        let (in_len, out_len) = op.buffer_lens(count, n, r, root);
        // What this rank's result region holds, and what it should.
        let (off, len) = match (op, in_place) {
            (Op::ReduceScatter, true) => (r * count, count),
            (Op::Reduce, _) if r != root => (0, count),
            (_, true) => (0, in_len.max(out_len)),
            _ => (0, out_len),
        };
        if len == 0 {
            continue;
        }
        let got = l
            .output
            .slice((off * size)..(off + len) * size)
            .expect("view")
            .to_host_vec::<u8>()
            .expect("read back");
        let v = |p: usize, j: usize| value(c, dtype, p, n, j);
        let (w, first) = match op {
            Op::AllReduce => compare(dtype, &got, |k| {
                Some(reduce(redop, n, (0..n).map(|p| v(p, k))))
            }),
            Op::Broadcast => compare(dtype, &got, |k| Some(v(root, k))),
            Op::Reduce if r == root => compare(dtype, &got, |k| {
                Some(reduce(redop, n, (0..n).map(|p| v(p, k))))
            }),
            // Not the root: untouched (its own input in place, the poison otherwise).
            Op::Reduce => compare(dtype, &got, |k| if in_place { Some(v(r, k)) } else { None }),
            Op::AllGather => compare(dtype, &got, |j| Some(v(j / count, j % count))),
            Op::ReduceScatter => compare(dtype, &got, |k| {
                Some(reduce(redop, n, (0..n).map(|p| v(p, r * count + k))))
            }),
            Op::AllToAll => compare(dtype, &got, |j| Some(v(j / count, r * count + j % count))),
        };
        if w > 0 {
            detail += &format!("(rank {r}: {first:?}) ");
        }
        wrong += w;
    }
    (wrong, detail)
}
