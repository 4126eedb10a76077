//! The nccl-tests style correctness matrix, shared by the one-process and the
//! process-per-GPU tests.
//!
//! Inputs are small integers (exact in every type, including bf16), built per reduction so
//! that every result is exact in any order: sums stay within +-120, products are powers of
//! two, averages divide exactly. Outputs are poisoned (0xFF bytes) first; every element of
//! every output is compared byte for byte with the host's expectation.
#![allow(dead_code)]

use std::time::Instant;

use p2p_collective::verify::{compare, expected, in_place_input_offset, input, result_region};
use p2p_collective::{Call, Collectives, Communicator, DataType, Op, RedOp};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};

/// With `P2PTEST_LOG` set (a `tracing` filter such as `debug` or `p2p_collective=trace`),
/// the library's log lines go to stderr with their times, so that a test's log shows where a
/// slow or stuck run spent its time. Called by [`gpus`]; later calls do nothing.
pub fn log_to_stderr() {
    if let Ok(filter) = std::env::var("P2PTEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .try_init();
    }
}

/// The GPUs of `n` ranks in one process: the first `n` GPUs, or with `P2PTEST_SHARE_GPU=1`
/// every rank on GPU 0 (ranks sharing a GPU: the suites at any world size on a machine with
/// one GPU). The process-per-GPU tests share a GPU by themselves where one is visible.
pub fn gpus(n: usize) -> Vec<p2p_mem::Device> {
    log_to_stderr();
    if std::env::var("P2PTEST_SHARE_GPU").is_ok_and(|v| v == "1") {
        let one = p2p_testkit::gpus(1).remove(0);
        eprintln!("P2PTEST_SHARE_GPU=1: {n} ranks on GPU {}", one.ordinal());
        return vec![one; n];
    }
    p2p_testkit::gpus(n)
}

/// The counts the issue asks for.
pub const COUNTS: [usize; 7] = [0, 1, 7, 1023, 65537, (1 << 20) + 3, 64 << 20];

/// Counts from `P2PTEST_COUNTS` (comma list), else [`COUNTS`].
pub fn counts() -> Vec<usize> {
    match std::env::var("P2PTEST_COUNTS") {
        Ok(v) => v.split(',').filter_map(|c| c.trim().parse().ok()).collect(),
        Err(_) => COUNTS.to_vec(),
    }
}

/// One rank run by this process: its communicator, stream and two buffers big enough for the
/// largest count. With `skew`, the cases use the buffers from one element (input) and three
/// elements (output) past their start, not from it: every region then lies off a 16-byte
/// boundary (input and output unlike, for elements under 8 bytes), though on its element's.
pub struct Local {
    pub skew: bool,
    pub comm: Communicator,
    pub stream: Stream,
    pub input: DeviceBuffer<u8>,
    pub output: DeviceBuffer<u8>,
}

impl Local {
    pub fn new(comm: Communicator, max_count: usize) -> Local {
        let n = comm.world_size();
        // Room for the largest element's skew (three elements of 8 bytes) past the largest case.
        let bytes = (max_count * n * 8).max(64) + 32;
        let d = comm.device().clone();
        Local {
            stream: Stream::new(&d).expect("stream"),
            input: DeviceBuffer::new(&d, bytes).expect("input buffer"),
            output: DeviceBuffer::new(&d, bytes).expect("output buffer"),
            comm,
            skew: false,
        }
    }

    /// Byte offsets of a case's input and output regions in the buffers (see [`Local`]).
    fn offsets(&self, size: usize) -> (usize, usize) {
        if self.skew {
            (size, 3 * size)
        } else {
            (0, 0)
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

impl Summary {
    /// Prints `what: N cases, N wrong` and fails the test, listing the failures, unless some
    /// cases ran and none was wrong.
    pub fn assert_exact(&self, what: &str) {
        eprintln!("{what}: {} cases, {} wrong", self.cases, self.wrong);
        assert_eq!(
            self.wrong,
            0,
            "{what}: wrong results:\n{}",
            self.failures.join("\n")
        );
        assert!(self.cases > 0, "{what}: no case ran");
    }
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

/// Copies `host` into `buf` at byte `off` (nothing when `host` is empty).
pub fn upload(buf: &mut DeviceBuffer<u8>, off: usize, host: &[u8]) {
    if !host.is_empty() {
        buf.slice_mut(off..off + host.len())
            .expect("view")
            .copy_from_host(host)
            .expect("upload");
    }
}

/// Runs one call on every local rank and checks each output. Returns (#wrong, detail).
pub fn run_case(locals: &mut [Local], call: &Call, in_place: bool) -> (usize, String) {
    let n = locals[0].comm.world_size();
    let size = call.dtype.size();
    // Inputs.
    for l in locals.iter_mut() {
        let r = l.comm.rank();
        let (in_len, out_len) = call.op.buffer_lens(call.count, n, r, call.root);
        let host = input(call, n, r, in_len);
        let (ioff, ooff) = l.offsets(size);
        l.output.memset_u8(0xff).expect("poison");
        if in_place {
            if in_len.max(out_len) > 0 {
                upload(
                    &mut l.output,
                    ooff + in_place_input_offset(call, r) * size,
                    &host,
                );
            }
        } else {
            l.input.memset_u8(0x00).expect("clear");
            upload(&mut l.input, ioff, &host);
        }
    }
    // The calls: every rank's from this one thread (they never block the host).
    for l in locals.iter_mut() {
        let (ioff, ooff) = l.offsets(size);
        let mut out = l.output.slice_mut(ooff..).expect("output view");
        let res = if in_place {
            l.comm.call_in_place(call, &mut out, &l.stream)
        } else {
            let send = l.input.slice(ioff..).expect("input view");
            l.comm.call(call, &send, &mut out, &l.stream)
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
        // What this rank's result region holds, and what it should.
        let (off, len) = result_region(call, n, r, in_place);
        if len == 0 {
            continue;
        }
        let ooff = l.offsets(size).1;
        let got = l
            .output
            .slice((ooff + off * size)..ooff + (off + len) * size)
            .expect("view")
            .to_host_vec::<u8>()
            .expect("read back");
        let (w, first) = compare(call.dtype, &got, |j| expected(call, n, r, in_place, j));
        if w > 0 {
            detail += &format!("(rank {r}: {first:?}) ");
        }
        wrong += w;
    }
    (wrong, detail)
}

/// Counts for the send/recv matrix: the collectives' counts plus counts whose messages wrap
/// every lane's two-slot ring (more than 4 MiB) at every element size.
pub fn p2p_counts() -> Vec<usize> {
    let mut c = counts();
    c.extend([(1 << 20) + 3, 3_000_017]);
    c.sort_unstable();
    c.dedup();
    c
}

/// The bytes rank `from` sends in case `case` of the send/recv matrix.
pub fn p2p_message(case: u64, from: usize, bytes: usize) -> Vec<u8> {
    p2p_testkit::random_u8(case * 131 + from as u64 + 1, bytes)
}

/// NCCL-style send/recv on every rank in `locals` (all ranks of a process, or this process's
/// one), for every type and count: a ring exchange (`send_recv` to rank + 1, from rank - 1),
/// then a plain `send` from rank 0 and `recv` on rank 1. Outputs are poisoned first; every byte
/// is compared with the sender's.
pub fn run_p2p_matrix(locals: &mut [Local], counts: &[usize]) -> Summary {
    let mut s = Summary::default();
    let mut case = 0u64;
    for dtype in DataType::ALL {
        for &count in counts {
            for pair in [false, true] {
                case += 1;
                let bytes = count * dtype.size();
                for l in locals.iter_mut() {
                    let (rank, n) = (l.comm.rank(), l.comm.world_size());
                    l.output.memset_u8(0xff).expect("poison");
                    let mine = p2p_message(case, rank, bytes);
                    l.input
                        .slice_mut(..bytes)
                        .expect("input")
                        .copy_from_host(&mine)
                        .expect("upload");
                    let send = l.input.slice(..bytes).expect("input");
                    let mut recv = l.output.slice_mut(..bytes).expect("output");
                    let r = if !pair {
                        l.comm.send_recv(
                            &send,
                            (rank + 1) % n,
                            &mut recv,
                            (rank + n - 1) % n,
                            count,
                            dtype,
                            &l.stream,
                        )
                    } else if rank == 0 {
                        l.comm.send(&send, count, dtype, 1, &l.stream)
                    } else if rank == 1 {
                        l.comm.recv(&mut recv, count, dtype, 0, &l.stream)
                    } else {
                        Ok(())
                    };
                    r.unwrap_or_else(|e| panic!("rank {rank}: enqueue: {e}"));
                }
                for l in locals.iter() {
                    l.comm
                        .synchronize(&l.stream)
                        .unwrap_or_else(|e| panic!("rank {}: {e}", l.comm.rank()));
                }
                for l in locals.iter() {
                    let (rank, n) = (l.comm.rank(), l.comm.world_size());
                    let from = match (pair, rank) {
                        (false, _) => Some((rank + n - 1) % n),
                        (true, 1) => Some(0),
                        (true, _) => None,
                    };
                    let Some(from) = from else { continue };
                    s.cases += 1;
                    let got = if bytes == 0 {
                        Vec::new()
                    } else {
                        l.output
                            .slice(..bytes)
                            .expect("output")
                            .to_host_vec::<u8>()
                            .expect("download")
                    };
                    let want = p2p_message(case, from, bytes);
                    let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    // Nothing past the message was written.
                    let mut after = [0u8; 16];
                    let spill = if bytes + 16 <= l.output.len() {
                        l.output
                            .slice(bytes..bytes + 16)
                            .expect("tail")
                            .copy_to_host(&mut after)
                            .expect("download");
                        after.iter().filter(|&&b| b != 0xff).count()
                    } else {
                        0
                    };
                    if wrong + spill > 0 {
                        s.failures.push(format!(
                            "rank {rank}: {} {dtype} x {count} from rank {from}: {wrong} wrong bytes, {spill} written past the end",
                            if pair { "recv" } else { "send_recv" }
                        ));
                    }
                    s.wrong += wrong + spill;
                }
            }
        }
    }
    s
}

/// Elements rank `from` sends to rank `to` in case `count` of the group matrix: sizes differ
/// from pair to pair (all 0 when `count` is 0); `extra` is the size of the second message to
/// the next rank.
pub fn group_count(count: usize, from: usize, to: usize, n: usize) -> usize {
    if count == 0 {
        0
    } else {
        count + (from * n + to) % 3
    }
}

fn group_extra(count: usize) -> usize {
    if count == 0 {
        0
    } else {
        count / 2 + 1
    }
}

/// The bytes of message `k` (0: the one every pair exchanges, 1: the second to the next rank)
/// from `from` to `to` in case `case` of the group matrix.
pub fn group_message(case: u64, from: usize, to: usize, k: usize, bytes: usize) -> Vec<u8> {
    p2p_testkit::random_u8(case * 7919 + (from * 64 + to * 2 + k) as u64 + 1, bytes)
}

/// Whether a group on `comm` that receives from every other rank is refused (ranks sharing a
/// GPU: `Communicator::max_group_receive_peers` is below world - 1). If so, checks that such a
/// group is refused before anything is queued, with an error that names the limit: `Ok(true)`,
/// or `Err` describing what happened instead. `Ok(false)` where such a group fits.
pub fn group_to_all_refused(comm: &Communicator, stream: &Stream) -> Result<bool, String> {
    let (n, fit) = (comm.world_size(), comm.max_group_receive_peers());
    if n - 1 <= fit {
        return Ok(false);
    }
    let d = comm.device();
    let send = DeviceBuffer::<f32>::zeroed(d, n).map_err(|e| e.to_string())?;
    let mut recv = DeviceBuffer::<f32>::zeroed(d, n).map_err(|e| e.to_string())?;
    let mut views = Vec::new();
    let mut rest = recv.slice_mut(..).map_err(|e| e.to_string())?;
    for _ in 0..n {
        let (v, r) = rest.split_at_mut(1).map_err(|e| e.to_string())?;
        views.push(v);
        rest = r;
    }
    let sends = (0..n)
        .map(|p| send.slice(p..p + 1))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut g = comm.group(stream);
    for (p, v) in views.iter_mut().enumerate() {
        g.recv(v, 1, DataType::F32, p).map_err(|e| e.to_string())?;
    }
    for (p, v) in sends.iter().enumerate() {
        g.send(v, 1, DataType::F32, p).map_err(|e| e.to_string())?;
    }
    match g.launch() {
        Err(e @ p2p_collective::Error::InvalidArgument { .. })
            if e.to_string()
                .contains(&format!("receive from at most {fit} other ranks")) =>
        {
            eprintln!(
                "rank {}: a group receiving from all {} others is refused: {e}",
                comm.rank(),
                n - 1
            );
            Ok(true)
        }
        Err(e) => Err(format!(
            "rank {}: another error than the limit: {e}",
            comm.rank()
        )),
        Ok(()) => Err(format!(
            "rank {}: a group receiving from {} ranks was queued, above the limit of {fit}",
            comm.rank(),
            n - 1
        )),
    }
}

/// Where the ranks' groups cannot receive from every other rank (see [`group_to_all_refused`]),
/// the group matrix cannot run: checks instead, on every rank, that such a group is refused,
/// then that the communicator still works (a ring `send_recv` of one element each, compared),
/// one case per rank. `None` where the groups fit.
fn groups_refused(locals: &mut [Local]) -> Option<Summary> {
    let mut s = Summary::default();
    for l in locals.iter() {
        match group_to_all_refused(&l.comm, &l.stream) {
            Ok(false) => return None,
            Ok(true) => s.cases += 1,
            Err(e) => {
                s.wrong += 1;
                s.failures.push(e);
            }
        }
    }
    // Nothing was queued: a ring exchange still runs on every rank.
    for l in locals.iter_mut() {
        let (rank, n) = (l.comm.rank(), l.comm.world_size());
        upload(&mut l.input, 0, &[rank as u8 + 1; 4]);
        let send = l.input.slice(..4).expect("input");
        let mut recv = l.output.slice_mut(..4).expect("output");
        l.comm
            .send_recv(
                &send,
                (rank + 1) % n,
                &mut recv,
                (rank + n - 1) % n,
                4,
                DataType::U8,
                &l.stream,
            )
            .unwrap_or_else(|e| panic!("rank {rank}: the ring after the refusal: {e}"));
    }
    for l in locals.iter() {
        let (rank, n) = (l.comm.rank(), l.comm.world_size());
        l.comm
            .synchronize(&l.stream)
            .unwrap_or_else(|e| panic!("rank {rank}: the ring after the refusal: {e}"));
        let got = l
            .output
            .slice(..4)
            .expect("output")
            .to_host_vec::<u8>()
            .expect("read");
        if got != [((rank + n - 1) % n) as u8 + 1; 4] {
            s.wrong += 1;
            s.failures.push(format!(
                "rank {rank}: the ring after the refusal got {got:?}"
            ));
        }
    }
    Some(s)
}

/// NCCL-style groups on every rank in `locals`: in one group each rank sends a message of its
/// own size to every rank (itself included), a second one to the next rank, receives all of
/// them (adding the receives in descending peer order, so adding order across peers does not
/// matter while order within a peer does), and for f32 an all-reduce runs in the same group.
/// Outputs are poisoned first; every byte is compared, and nothing past the messages may be
/// written. `locals` must hold `(n + 1) * (max count + 2)` elements of 8 bytes.
pub fn run_p2p_group_matrix(locals: &mut [Local], counts: &[usize]) -> Summary {
    if let Some(s) = groups_refused(locals) {
        return s;
    }
    let mut s = Summary::default();
    let mut case = 0u64;
    for dtype in DataType::ALL {
        for &count in counts {
            case += 1;
            let size = dtype.size();
            let ar_count = 4096;
            let mut reduced = Vec::new();
            for l in locals.iter_mut() {
                let (rank, n) = (l.comm.rank(), l.comm.world_size());
                let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
                // What this rank sends: one message to every rank, then the extra to `next`.
                let mut sends: Vec<(usize, Vec<u8>)> = (0..n)
                    .map(|d| {
                        let bytes = group_count(count, rank, d, n) * size;
                        (d, group_message(case, rank, d, 0, bytes))
                    })
                    .collect();
                sends.push((
                    next,
                    group_message(case, rank, next, 1, group_extra(count) * size),
                ));
                let host: Vec<u8> = sends.iter().flat_map(|(_, m)| m.clone()).collect();
                assert!(host.len() + 16 <= l.input.len(), "locals too small");
                l.output.memset_u8(0xff).expect("poison");
                upload(&mut l.input, 0, &host);
                // Where each received message lands: from 0, 1, ..., n - 1, then the extra.
                let mut recv_lens: Vec<usize> = (0..n)
                    .map(|f| group_count(count, f, rank, n) * size)
                    .collect();
                recv_lens.push(group_extra(count) * size);
                let mut views = Vec::new();
                let mut rest = l.output.slice_mut(..).expect("output");
                for &len in &recv_lens {
                    let (v, r) = rest.split_at_mut(len).expect("split");
                    views.push(v);
                    rest = r;
                }
                let ar_in =
                    DeviceBuffer::from_host(l.comm.device(), &vec![(rank + 1) as f32; ar_count])
                        .expect("all-reduce input");
                let mut ar_out =
                    DeviceBuffer::<f32>::zeroed(l.comm.device(), ar_count).expect("all-reduce");
                let mut off = 0;
                let send_views: Vec<_> = sends
                    .iter()
                    .map(|(d, m)| {
                        off += m.len();
                        (*d, l.input.slice(off - m.len()..off).expect("input"))
                    })
                    .collect();
                {
                    let mut g = l.comm.group(&l.stream);
                    let mut refs: Vec<Option<&mut _>> = views.iter_mut().map(Some).collect();
                    for f in (0..n).rev() {
                        let v = refs[f].take().expect("view");
                        g.recv(v, recv_lens[f] / size, dtype, f).expect("recv");
                        if f == prev {
                            let v = refs[n].take().expect("view");
                            g.recv(v, recv_lens[n] / size, dtype, prev)
                                .expect("recv extra");
                        }
                    }
                    for (d, v) in &send_views {
                        g.send(v, v.len() / size, dtype, *d).expect("send");
                    }
                    if dtype == DataType::F32 {
                        g.call(
                            &Call::new(Op::AllReduce, DataType::F32, ar_count),
                            &ar_in,
                            &mut ar_out,
                        )
                        .expect("all-reduce in the group");
                    }
                    g.launch()
                        .unwrap_or_else(|e| panic!("rank {rank}: launch: {e}"));
                }
                reduced.push((ar_in, ar_out));
            }
            for l in locals.iter() {
                l.comm
                    .synchronize(&l.stream)
                    .unwrap_or_else(|e| panic!("rank {}: {e}", l.comm.rank()));
            }
            for (l, (_, ar_out)) in locals.iter().zip(&reduced) {
                let (rank, n) = (l.comm.rank(), l.comm.world_size());
                let prev = (rank + n - 1) % n;
                s.cases += 1;
                let mut want: Vec<u8> = (0..n)
                    .flat_map(|f| {
                        group_message(case, f, rank, 0, group_count(count, f, rank, n) * size)
                    })
                    .collect();
                want.extend(group_message(
                    case,
                    prev,
                    rank,
                    1,
                    group_extra(count) * size,
                ));
                let got = l
                    .output
                    .slice(..want.len() + 16)
                    .expect("output")
                    .to_host_vec::<u8>()
                    .expect("download");
                let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                let spill = got[want.len()..].iter().filter(|&&b| b != 0xff).count();
                let mut bad = wrong + spill;
                if dtype == DataType::F32 {
                    let sum = (n * (n + 1) / 2) as f32;
                    let ar = ar_out.to_host_vec::<f32>().expect("all-reduce");
                    bad += ar.iter().filter(|&&v| v != sum).count();
                }
                if bad > 0 {
                    s.failures.push(format!(
                        "rank {rank}: group of {dtype} x {count}: {wrong} wrong bytes, {spill} written past the end, {} wrong all-reduce elements",
                        bad - wrong - spill
                    ));
                }
                s.wrong += bad;
            }
        }
    }
    s
}

/// The ranks of the process-per-GPU tests: `P2PTEST_WORLD`, else 2.
pub fn world() -> usize {
    std::env::var("P2PTEST_WORLD")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(2)
}

/// In the launcher: start `world()` copies of this test. In a rank: run the matrix.
pub fn launch_or_run(test: &str, body: impl FnOnce()) {
    if std::env::var_os("RANK").is_some() {
        body();
        return;
    }
    let outcome = launch_test(test, world(), 1);
    assert!(outcome.status.success(), "a rank failed: {outcome:?}");
}

/// Starts this test executable's `test` alone (`--exact`, ignored tests included) as `world`
/// ranks, posing as `hosts` hosts when more than one (`launch::launch_hosts`).
pub fn launch_test(test: &str, world: usize, hosts: usize) -> p2p_collective::launch::Outcome {
    let exe = std::env::current_exe().expect("current exe");
    let args: Vec<String> = [
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    p2p_collective::launch::launch_hosts(world, hosts, &exe.to_string_lossy(), &args)
        .expect("launch")
}

/// As [`launch_or_run`], the rank's body given its communicator (from the environment) and
/// its rank.
pub fn launch_or_run_comm(test: &str, body: impl FnOnce(Communicator, usize)) {
    launch_or_run(test, || {
        let comm = Communicator::from_env().expect("from_env");
        let rank = comm.rank();
        body(comm, rank)
    })
}
