//! NCCL loaded at run time (`p2p_transport::nccl`, the inter-host half of issue 39's
//! communicators), on real GPUs in one process. Ignored in CI; the bundle's run.sh runs them.
//! Each needs libnccl.so.2 on the machine.

use std::time::Duration;

use p2p_mem::{DeviceBuffer, DeviceMemory, Stream};
use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};
use p2p_testkit::gpus;
use p2p_transport::nccl::{self, Collective, NcclComm};

const LIMIT: Duration = Duration::from_secs(60);

/// After `op` on every rank's stream: waits for the streams, then checks that the first `len`
/// elements of each rank `r`'s `recv` are `want(r)`.
fn check(
    streams: &[Stream],
    recv: &[DeviceBuffer<f32>],
    op: &str,
    len: usize,
    want: impl Fn(usize) -> Vec<f32>,
) {
    streams.iter().for_each(|s| s.synchronize().expect("sync"));
    for (r, buf) in recv.iter().enumerate() {
        assert_eq!(
            buf.to_host_vec::<f32>().expect("read")[..len],
            want(r)[..],
            "{op}, rank {r}"
        );
    }
}

/// Every rank's all-reduce, all-gather, reduce-scatter, broadcast and reduce of small integers in f32,
/// each result compared exactly; `n` ranks, one per GPU, in this process.
fn every_collective(n: usize) {
    let devices = gpus(n);
    let comms = NcclComm::init_all(&devices, LIMIT).expect("NCCL communicators");
    let streams: Vec<Stream> = devices
        .iter()
        .map(|d| Stream::new(d).expect("stream"))
        .collect();
    let count = 1000;
    let mine = |r: usize| -> Vec<f32> {
        (0..count)
            .map(|i| (r + 1) as f32 + (i % 7) as f32)
            .collect()
    };
    let send: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| DeviceBuffer::from_host(&devices[r], &mine(r)).expect("upload"))
        .collect();
    let mut recv: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| DeviceBuffer::zeroed(&devices[r], count * n).expect("alloc"))
        .collect();
    let f32t = ncclDataType_t::ncclFloat32;
    let sum = ncclRedOp_t::ncclSum;

    // One group of calls, one per rank, as NCCL needs for several ranks of one process.
    let group = |call: &mut dyn FnMut(usize)| {
        nccl::group(&comms, || {
            (0..n).for_each(&mut *call);
            Ok(())
        })
        .expect("the group")
    };

    // Rank r's part of `which` on `count` elements, failing the test with NCCL's name of it.
    let issue =
        |r: usize, which: Collective, from: &DeviceBuffer<f32>, into: &mut DeviceBuffer<f32>| {
            comms[r]
                .collective(which, from, into, count, f32t, &streams[r])
                .unwrap_or_else(|e| panic!("{}: {e}", which.name()))
        };
    group(&mut |r| issue(r, Collective::AllReduce(sum), &send[r], &mut recv[r]));
    let want: Vec<f32> = (0..count)
        .map(|i| (0..n).map(|r| mine(r)[i]).sum())
        .collect();
    check(&streams, &recv, "all_reduce", count, |_| want.clone());

    group(&mut |r| issue(r, Collective::AllGather, &send[r], &mut recv[r]));
    let gathered: Vec<f32> = (0..n).flat_map(mine).collect();
    check(&streams, &recv, "all_gather", count * n, |_| {
        gathered.clone()
    });

    // Reduce-scatter of every rank's gathered buffer: part r of the sum of n copies.
    let inputs: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| DeviceBuffer::from_host(&devices[r], &gathered).expect("upload"))
        .collect();
    group(&mut |r| issue(r, Collective::ReduceScatter(sum), &inputs[r], &mut recv[r]));
    check(&streams, &recv, "reduce_scatter", count, |r| {
        mine(r).iter().map(|x| x * n as f32).collect()
    });

    // Broadcast and reduce: the buffer only the root uses is one element elsewhere, as NCCL
    // allows (it reads the broadcast's send and writes the reduce's recv on the root only).
    let root = n - 1;
    let tiny: Vec<DeviceBuffer<f32>> = (0..n)
        .map(|r| DeviceBuffer::zeroed(&devices[r], 1).expect("alloc"))
        .collect();
    group(&mut |r| {
        let from = if r == root { &send[r] } else { &tiny[r] };
        issue(r, Collective::Broadcast { root }, from, &mut recv[r])
    });
    check(&streams, &recv, "broadcast", count, |_| mine(root));

    let mut tiny = tiny;
    group(&mut |r| {
        let into = if r == root {
            &mut recv[r]
        } else {
            &mut tiny[r]
        };
        issue(r, Collective::Reduce { red: sum, root }, &send[r], into)
    });
    streams.iter().for_each(|s| s.synchronize().expect("sync"));
    check(&streams[root..], &recv[root..], "reduce", count, |_| {
        want.clone()
    });
    for c in &comms {
        c.check().expect("no asynchronous error");
    }
}

#[test]
#[ignore = "needs a GPU and libnccl"]
fn gpu1_nccl_loaded_at_run_time_runs_every_collective_on_one_rank() {
    every_collective(1);
}

#[test]
#[ignore = "needs 2 GPUs and libnccl"]
fn gpu2_nccl_loaded_at_run_time_runs_every_collective_on_two_ranks() {
    every_collective(2);
}

#[test]
#[ignore = "needs a GPU and libnccl"]
fn gpu1_nccl_refuses_buffers_too_small_or_on_another_gpu() {
    let devices = gpus(1);
    let comms = NcclComm::init_all(&devices, LIMIT).expect("NCCL communicator");
    let stream = Stream::new(&devices[0]).expect("stream");
    let small = DeviceBuffer::<f32>::zeroed(&devices[0], 10).expect("alloc");
    let mut out = DeviceBuffer::<f32>::zeroed(&devices[0], 100).expect("alloc");
    let e = comms[0]
        .collective(
            Collective::AllReduce(ncclRedOp_t::ncclSum),
            &small,
            &mut out,
            100,
            ncclDataType_t::ncclFloat32,
            &stream,
        )
        .expect_err("10 elements cannot send 100");
    assert!(e.to_string().contains("must hold 400 bytes"), "{e}");
    let e = comms[0]
        .collective(
            Collective::Broadcast { root: 1 },
            &small,
            &mut out,
            10,
            ncclDataType_t::ncclFloat32,
            &stream,
        )
        .expect_err("root 1 of 1");
    assert!(e.to_string().contains("root 1"), "{e}");
}
