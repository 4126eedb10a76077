//! A communicator over hosts (`MultiHostCommunicator`) on one machine posing as two hosts:
//! `p2p_collective::launch::launch_hosts` starts 4 ranks as 2 hosts of 2 on 4 GPUs (2 hosts of
//! 1 on 2 GPUs; `P2PTEST_WORLD`, `P2PTEST_HOSTS`) (each host its own GPUs,
//! `P2P_HOST_ID` and `NCCL_HOSTID`, so NCCL takes its network path between them). Every op,
//! type, reduction and count, byte-exact against the host's expectation; then the time of
//! all-reduce, all-gather and reduce-scatter beside NCCL's own communicator over the same
//! ranks and host ids; `send`/`recv` alone to a peer on either host; a rank's death on the
//! other host. Ignored in CI (GPUs and libnccl needed); `run.sh multihost` and `tests.sh
//! hosts` run them.
//! Under torchrun (`--nnodes 2`, one torchrun per simulated host) the same test body runs when
//! `RANK` is set.

mod common;

use std::time::Instant;

use common::counts;
use p2p_collective::verify::{compare, expected, in_place_input_offset, input, result_region};
use p2p_collective::{Call, Collectives, DataType, MultiHostCommunicator, Op, RedOp};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};

/// Ranks and hosts of the layout: `P2PTEST_WORLD` over `P2PTEST_HOSTS` (default 2 hosts; 4
/// ranks where 4 GPUs are visible, else 2: two hosts of one GPU).
fn layout() -> (usize, usize) {
    let get = |n: &str| std::env::var(n).ok().and_then(|v| v.parse().ok());
    let gpus = p2p_mem::Device::count().expect("this test needs 2 or more GPUs") as usize;
    assert!(gpus >= 2, "this test needs 2 or more GPUs, found {gpus}");
    let world = get("P2PTEST_WORLD").unwrap_or(if gpus >= 4 { 4 } else { 2 });
    (world, get("P2PTEST_HOSTS").unwrap_or(2))
}

/// Starts this test executable's `test` as the ranks of [`layout`]'s simulated hosts.
fn launch(test: &str) -> p2p_collective::launch::Outcome {
    let (world, hosts) = layout();
    common::launch_test(test, world, hosts)
}

/// In the launcher: start the ranks as simulated hosts. In a rank: run `body`.
fn launch_or_run(test: &str, body: impl FnOnce(MultiHostCommunicator, Stream)) {
    if std::env::var_os("RANK").is_some() {
        let comm = MultiHostCommunicator::from_env().expect("MultiHostCommunicator::from_env");
        let stream = Stream::new(comm.device()).expect("stream");
        body(comm, stream);
        return;
    }
    let out = launch(test);
    assert!(out.status.success(), "a rank failed: {out:?}");
}

/// One call on this rank (out of place, or in place as NCCL defines it), checked byte for byte
/// against the host's expectation. Returns the wrong elements.
fn run_case(
    comm: &MultiHostCommunicator,
    stream: &Stream,
    call: &Call,
    in_place: bool,
) -> Result<usize, String> {
    let (w, r) = (comm.world_size(), comm.rank());
    let size = call.dtype.size();
    let (in_len, out_len) = call.op.buffer_lens(call.count, w, r, call.root);
    let dev = comm.device();
    let e = |e: p2p_mem::Error| e.to_string();
    let host = input(call, w, r, in_len);
    let upload = |buf: &mut DeviceBuffer<u8>, at: usize| -> Result<(), String> {
        if !host.is_empty() {
            buf.slice_mut(at..at + host.len())
                .and_then(|mut v| v.copy_from_host(&host))
                .map_err(e)?;
        }
        Ok(())
    };
    let mut out =
        DeviceBuffer::<u8>::zeroed(dev, (in_len.max(out_len) * size).max(1)).map_err(e)?;
    out.memset_u8(0xff).map_err(e)?;
    let res = if in_place {
        upload(&mut out, in_place_input_offset(call, r) * size)?;
        comm.call_in_place(call, &mut out, stream)
    } else {
        let mut send = DeviceBuffer::<u8>::zeroed(dev, (in_len * size).max(1)).map_err(e)?;
        upload(&mut send, 0)?;
        comm.call(call, &send, &mut out, stream)
    };
    res.and_then(|()| comm.synchronize(stream))
        .map_err(|e| format!("rank {r}: {e}"))?;
    let (off, len) = result_region(call, w, r, in_place);
    let got = out.to_host_vec::<u8>().map_err(e)?;
    let (wrong, first) = compare(call.dtype, &got[off * size..(off + len) * size], |j| {
        expected(call, w, r, in_place, j)
    });
    if wrong > 0 {
        eprintln!("rank {r}: {call:?} in place {in_place}: {wrong} wrong, first {first:?}");
    }
    Ok(wrong)
}

#[test]
#[ignore = "needs 2+ GPUs and libnccl"]
fn gpu2_every_op_type_and_count_over_two_simulated_hosts() {
    launch_or_run(
        "gpu2_every_op_type_and_count_over_two_simulated_hosts",
        |comm, stream| {
            let (w, r) = (comm.world_size(), comm.rank());
            let l = comm.layout();
            println!(
                "rank {r}: host {} of {}, local rank {} of {}",
                l.host, l.hosts, l.local_rank, l.local_world
            );
            let mut counts = counts();
            counts.push(1000); // a count the host's ranks divide: all-reduce without NCCL's tail
            let (mut cases, mut wrong, mut refused) = (0, 0, 0);
            let started = Instant::now();
            for op in Op::ALL {
                for dtype in DataType::ALL {
                    let redops: &[RedOp] = if op.reduces() {
                        &RedOp::ALL
                    } else {
                        &[RedOp::Sum]
                    };
                    for &redop in redops {
                        let integer_avg = redop == RedOp::Avg
                            && matches!(dtype, DataType::I32 | DataType::I64 | DataType::U8);
                        for &count in &counts {
                            for root in [0, w - 1] {
                                if !matches!(op, Op::Broadcast | Op::Reduce) && root != 0 {
                                    continue;
                                }
                                let call = Call::new(op, dtype, count).redop(redop).root(root);
                                for in_place in [false, true] {
                                    match run_case(&comm, &stream, &call, in_place) {
                                        Ok(n) => wrong += n,
                                        Err(e) if integer_avg && e.contains("average of") => {
                                            refused += 1
                                        }
                                        Err(e) => panic!("{call:?} in place {in_place}: {e}"),
                                    }
                                    cases += 1;
                                }
                            }
                        }
                    }
                }
            }
            println!(
            "rank {r}: {cases} cases over {} hosts, {wrong} wrong, {refused} integer averages refused as documented, {:.1} s",
            l.hosts,
            started.elapsed().as_secs_f64()
        );
            assert_eq!(wrong, 0);
            assert!(refused > 0, "integer averages across hosts must be refused");
        },
    );
}

/// Rank `r`'s values for a send/recv of `n` elements: exact in f32.
fn ring_values(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (r * 1000 + i % 997) as f32).collect()
}

#[test]
#[ignore = "needs 2+ GPUs and libnccl"]
fn gpu2_send_and_recv_alone_reach_a_peer_on_either_host() {
    launch_or_run(
        "gpu2_send_and_recv_alone_reach_a_peer_on_either_host",
        |comm, stream| {
            let r = comm.rank();
            let l = *comm.layout();
            // The partner on the other host (host ^ 1, same local rank), then, with two or more
            // ranks a host, the partner on this host (local rank ^ 1): pairs that swap both
            // ways. Two hosts: the layouts this test runs (2 x 2, 2 x 1).
            assert_eq!(l.hosts, 2, "this test pairs two hosts");
            let mut partners = vec![l.rank_of(l.host ^ 1, l.local_rank)];
            if (l.local_rank ^ 1) < l.local_world {
                partners.push(l.rank_of(l.host, l.local_rank ^ 1));
            }
            let mut checked = 0;
            for &peer in &partners {
                for n in [1usize, 65537, 1 << 20] {
                    let send =
                        DeviceBuffer::from_host(comm.device(), &ring_values(r, n)).expect("upload");
                    let mut recv = DeviceBuffer::<f32>::zeroed(comm.device(), n).expect("alloc");
                    // Alone, not in a group: the lower rank of a pair sends first, the higher
                    // receives first, so the two single calls match in order.
                    let res = if r < peer {
                        comm.send(&send, n, DataType::F32, peer, &stream)
                            .and_then(|()| comm.recv(&mut recv, n, DataType::F32, peer, &stream))
                    } else {
                        comm.recv(&mut recv, n, DataType::F32, peer, &stream)
                            .and_then(|()| comm.send(&send, n, DataType::F32, peer, &stream))
                    };
                    res.and_then(|()| comm.synchronize(&stream))
                        .unwrap_or_else(|e| panic!("rank {r} with {peer}, {n} elements: {e}"));
                    let got = recv.to_host_vec::<f32>().expect("read");
                    assert!(
                        got == ring_values(peer, n),
                        "rank {r}: {n} elements from rank {peer} differ"
                    );
                    checked += 1;
                }
            }
            println!(
                "rank {r}: send/recv alone with ranks {partners:?} (host {} of {}): {checked} exchanges exact",
                l.host, l.hosts
            );
        },
    );
}

/// Microseconds per call of `f`, the median of 5 runs of `iters` calls, each run timed on the
/// host around a synchronize of every rank's stream (all ranks run the same sequence).
fn time_us(
    comm: &MultiHostCommunicator,
    stream: &Stream,
    iters: usize,
    mut f: impl FnMut(),
) -> f64 {
    for _ in 0..3 {
        f();
    }
    comm.synchronize(stream).expect("warm-up");
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            comm.synchronize(stream).expect("timed run");
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}

#[test]
#[ignore = "needs 2+ GPUs and libnccl"]
fn gpu2_time_beside_nccl_on_the_same_hosts() {
    launch_or_run("gpu2_time_beside_nccl_on_the_same_hosts", |comm, stream| {
        use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};
        use p2p_transport::nccl::Collective;
        let (w, r) = (comm.world_size(), comm.rank());
        let nccl = comm.nccl_all();
        let f32t = ncclDataType_t::ncclFloat32;
        for bytes in [8 << 10, 256 << 10, 4 << 20, 64 << 20] {
            let n = bytes / 4;
            let dev = comm.device();
            let send = DeviceBuffer::<f32>::zeroed(dev, n * w).expect("send");
            let mut recv = DeviceBuffer::<f32>::zeroed(dev, n * w).expect("recv");
            let iters = if bytes >= 4 << 20 { 10 } else { 50 };
            let row = |name: &str, ours: f64, theirs: f64| {
                if r == 0 {
                    println!(
                        "multihost-bench {name} {bytes} B per rank: p2p over hosts {ours:.1} us, NCCL {theirs:.1} us, ratio {:.2}",
                        ours / theirs
                    );
                }
            };
            let sum = ncclRedOp_t::ncclSum;
            let cases = [
                (Op::AllReduce, n, Collective::AllReduce(sum)),
                (Op::AllGather, n / w, Collective::AllGather),
                (Op::ReduceScatter, n / w, Collective::ReduceScatter(sum)),
            ];
            for (op, count, theirs) in cases {
                let call = Call::new(op, DataType::F32, count).redop(RedOp::Sum);
                let ours = time_us(&comm, &stream, iters, || {
                    comm.call(&call, &send, &mut recv, &stream)
                        .unwrap_or_else(|e| panic!("{}: {e}", op.name()))
                });
                let theirs = time_us(&comm, &stream, iters, || {
                    nccl.collective(theirs, &send, &mut recv, count, f32t, &stream)
                        .unwrap_or_else(|e| panic!("{}: {e}", theirs.name()))
                });
                row(op.name(), ours, theirs);
            }
        }
    });
}

#[test]
#[ignore = "needs 2+ GPUs and libnccl"]
fn gpu2_a_rank_that_dies_on_the_other_host_is_found_by_every_survivor() {
    const TEST: &str = "gpu2_a_rank_that_dies_on_the_other_host_is_found_by_every_survivor";
    if std::env::var_os("RANK").is_none() {
        let (world, _) = layout();
        let out = launch(TEST);
        println!("launcher: {out:?}");
        assert_eq!(
            out.failed_rank,
            Some(world - 1),
            "the last rank, and only it, fails"
        );
        assert_eq!(
            out.killed,
            0,
            "every survivor reports the death and exits within {:?}",
            p2p_collective::launch::GRACE
        );
        return;
    }
    let comm = MultiHostCommunicator::from_env().expect("from_env");
    let stream = Stream::new(comm.device()).expect("stream");
    let (w, r) = (comm.world_size(), comm.rank());
    let n = 1 << 18;
    let send = DeviceBuffer::<f32>::zeroed(comm.device(), n).expect("send");
    let mut recv = DeviceBuffer::<f32>::zeroed(comm.device(), n).expect("recv");
    comm.all_reduce(&send, &mut recv, n, DataType::F32, RedOp::Sum, &stream)
        .and_then(|()| comm.synchronize(&stream))
        .expect("a call while every rank lives");
    if r == w - 1 {
        println!("rank {r}: exiting without a word");
        std::process::exit(17);
    }
    let t = Instant::now();
    for i in 0..100_000 {
        let res = comm
            .all_reduce(&send, &mut recv, n, DataType::F32, RedOp::Sum, &stream)
            .and_then(|()| comm.synchronize(&stream));
        if let Err(e) = res {
            println!(
                "rank {r}: found the failure after {:?} ({i} calls): {e}",
                t.elapsed()
            );
            use std::io::Write;
            let _ = std::io::stdout().flush();
            // Stop and free the communicator as a program that learnt its job is dead would
            // (abort: the NCCL communicators too, whatever they still run), then leave at
            // once: the launcher counts a survivor still running after its grace as not having
            // found it. The lines tell a hang in the clean-up from one before it.
            let freeing = Instant::now();
            comm.abort();
            println!("rank {r}: communicator aborted in {:?}", freeing.elapsed());
            let _ = std::io::stdout().flush();
            drop(comm);
            println!("rank {r}: communicator freed in {:?}", freeing.elapsed());
            let _ = std::io::stdout().flush();
            // Non-zero, as a program whose job died exits: under torchrun, a host whose
            // workers all exit 0 counts as done, and its agent then waits in its exit barrier
            // (five minutes) for the host whose worker failed, whose agent never comes. Under
            // `launch` the dead rank is still the first to fail (the survivors' abort takes
            // far longer than the launcher's 5 ms poll). `_exit`, not `exit`: an NCCL abort
            // left running past its limit in a helper thread must not meet NCCL's and CUDA's
            // exit handlers.
            // SAFETY: ends the process at once; stdout was flushed above.
            unsafe { libc::_exit(1) }
        }
    }
    panic!("rank {r}: no failure found after {:?}", t.elapsed());
}
