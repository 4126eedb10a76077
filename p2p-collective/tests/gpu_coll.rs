//! Collectives on real GPUs, one process driving every GPU. Ignored in CI (no GPU there); the
//! bundle's run.sh runs them. `gpu2_*` need two GPUs with P2P.

mod common;

use p2p_collective::Collectives;
use std::time::{Duration, Instant};

use common::{counts, gpus, run_case, run_matrix, Local};
use p2p_collective::{
    Access, Algo, Call, Communicator, DataType, Error, Forced, Op, Options, Proto, RedOp,
    Registration,
};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Graph, GraphExec, Stream};
use p2p_testkit::Held;
use p2p_transport::config::Config;
use p2p_transport::peer::Sharing;

fn world() -> usize {
    std::env::var("P2PTEST_WORLD")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(2)
}

/// The options of the environment (`P2P_DISABLE=1` runs every test host-staged).
fn env_options() -> Options {
    Options::from_env().expect("the P2P_* settings")
}

/// The GPUs of the world and a communicator on each, with `options`.
fn world_comms(options: Options) -> (Vec<Device>, Vec<Communicator>) {
    let devices = gpus(world());
    let comms = Communicator::init_all_with(&devices, options).expect("init_all");
    (devices, comms)
}

fn locals(options: Options, max_count: usize) -> Vec<Local> {
    let (_devices, comms) = world_comms(options);
    comms
        .into_iter()
        .map(|c| Local::new(c, max_count))
        .collect()
}

/// Communicators on the first two of `devices`, with the short time limit.
fn short_pair(devices: &[Device]) -> Vec<Communicator> {
    Communicator::init_all_with(&devices[..2], short_timeout()).expect("init_all")
}

/// A new stream on each of `devices`.
fn new_streams(devices: &[Device]) -> Vec<Stream> {
    devices
        .iter()
        .map(|d| Stream::new(d).expect("stream"))
        .collect()
}

/// References to `bufs` as device memory, for `register_all`.
fn as_memory<T: DeviceMemory>(bufs: &[T]) -> Vec<&dyn DeviceMemory> {
    bufs.iter().map(|b| b as &dyn DeviceMemory).collect()
}

/// The work that `record` queues on `stream`, captured into a CUDA graph.
fn capture(stream: &Stream, record: impl FnOnce()) -> Graph {
    stream.begin_capture().expect("begin capture");
    record();
    stream.end_capture().expect("end capture")
}

/// Launches every rank's graph on its stream.
///
/// # Safety
/// What the graphs use is alive until their work has run.
unsafe fn launch_all(streams: &[Stream], graphs: &[GraphExec]) {
    for (g, s) in graphs.iter().zip(streams) {
        // SAFETY: forwarded from the caller.
        unsafe { g.launch(s) }.expect("replay");
    }
}

/// Element i of rank r's input in replay `replay` of the graph-replay tests: small integers, so
/// that sums in any type are exact.
fn input_value(i: usize, replay: u32, r: usize) -> f32 {
    ((i as u32 + replay * 7 + r as u32 * 3) % 50) as f32
}

/// `replays` replays of every rank's graph, each checked: before each, rank r's input set to
/// `input_value(_, replay, r)` and rank r's buffer of each set in `outputs` filled with 0xff
/// bytes; after it, `wrong(replay, r, got)` counts the wrong elements of rank r, `got[k]` its
/// buffer of set k read back, and the test fails unless every count is 0.
///
/// # Safety
/// What the graphs use is alive until this returns.
unsafe fn replay_checked(
    comms: &[Communicator],
    streams: &[Stream],
    graphs: &[GraphExec],
    ins: &mut [DeviceBuffer<f32>],
    outputs: &mut [&mut Vec<DeviceBuffer<f32>>],
    replays: u32,
    wrong: impl Fn(u32, usize, &[Vec<f32>]) -> usize,
) {
    for replay in 0..replays {
        for (r, input) in ins.iter_mut().enumerate() {
            let host: Vec<f32> = (0..input.len())
                .map(|i| input_value(i, replay, r))
                .collect();
            input.copy_from_host(&host).expect("input");
            for set in outputs.iter_mut() {
                set[r].memset_u8(0xff).expect("poison");
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { launch_all(streams, graphs) };
        for (r, (comm, stream)) in comms.iter().zip(streams).enumerate() {
            comm.synchronize(stream).expect("sync");
            let got: Vec<Vec<f32>> = outputs
                .iter()
                .map(|set| set[r].to_host_vec::<f32>().expect("read"))
                .collect();
            assert_eq!(wrong(replay, r, &got), 0, "replay {replay}, rank {r}");
        }
    }
}

/// Waits for every rank's stream.
fn synchronize_all(comms: &[Communicator], streams: &[Stream]) {
    for (c, s) in comms.iter().zip(streams) {
        c.synchronize(s).expect("sync");
    }
}

/// A wait with a time limit gave up at `limit` (not a second later), `took` after it began.
fn gave_up_at(limit: Duration, took: Duration) {
    assert!(
        took >= limit && took < limit + Duration::from_secs(1),
        "gave up after {took:?}, the limit is {limit:?}"
    );
}

fn matrix(ops: &[Op], options: Options) {
    matrix_up_to(ops, options, usize::MAX);
}

/// [`matrix`] over the counts up to `most`.
fn matrix_up_to(ops: &[Op], options: Options, most: usize) {
    matrix_of(
        ops,
        options,
        counts().into_iter().filter(|&c| c <= most).collect(),
    );
}

/// [`matrix`] over `counts`.
fn matrix_of(ops: &[Op], options: Options, counts: Vec<usize>) {
    let max = counts.iter().copied().max().unwrap_or(1);
    let mut ls = locals(options, max);
    run_matrix(&mut ls, ops, &counts).assert_exact("matrix");
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_all_reduce_matrix() {
    matrix(&[Op::AllReduce], env_options());
}

/// Every collective on buffers off a 16-byte boundary: views one element (input) and three
/// elements (output) into their allocations, so every region starts off a boundary, input and
/// output unlike for elements under 8 bytes, and most counts put ranks' parts off one too (the
/// `_shift` kernels, whose copies realign their words: docs/performance.md, "Unaligned copies
/// and reductions"). Then a reduction's buffer off its element's alignment is refused before
/// any launch.
/// `synchronize` on a stream that holds a user's kernel longer than the communicator's time
/// limit plus `SYNC_GRACE` returns `NotDrained` at that limit (it used to wait for as long as
/// the kernel ran), stops nothing, and a later `synchronize` succeeds once the kernel ends.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_synchronize_gives_up_at_its_limit_on_a_stream_held_by_other_work() {
    use p2p_mem::kernel::{LaunchConfig, Module, Source};
    const SPIN: Source = Source {
        name: "spin.cu",
        code: r#"extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"#,
        defines: &[],
        shipped: &[],
    };
    let options = Options {
        timeout: Duration::from_millis(200),
        ..env_options()
    };
    let ls = locals(options, 1024);
    let l = &ls[0];
    let limit = Duration::from_millis(200) + p2p_collective::comm::SYNC_GRACE;
    let spin = limit + Duration::from_secs(2);
    let module = Module::build(l.comm.device(), &SPIN).expect("the spin kernel");
    let f = module.function::<u64>("spin").expect("spin");
    let ns = spin.as_nanos() as u64;
    // SAFETY: spin(unsigned long long) takes one 8-byte value.
    unsafe { module.launch(&f, LaunchConfig::new(1, 1), &ns, &l.stream) }.expect("launch");
    let t = Instant::now();
    let e = l
        .comm
        .synchronize(&l.stream)
        .expect_err("the stream runs past the limit");
    let took = t.elapsed();
    assert!(matches!(e, Error::NotDrained { .. }), "{e:?}");
    assert!(e.to_string().contains("Nothing was stopped"), "{e}");
    gave_up_at(limit, took);
    // The kernel ends about 2 s later; the communicator was not aborted.
    l.comm.synchronize(&l.stream).expect("drained, and usable");
    l.comm.check().expect("no call failed");
}

/// Two ranks with a 200 ms time limit and the all-gather that runs on their registered outputs
/// (16 MiB a rank: on two ranks the direct kernel runs from 32 MiB of parts together,
/// `Tuning::direct_min_bytes` twice), asserted to be a plan on the window; then their outputs
/// registered, and the limit of `synchronize` (time limit + `SYNC_GRACE`). `None` where the
/// pair is host-staged (nothing can be registered).
///
/// # Safety
/// The caller deregisters the outputs before the `Local`s drop.
unsafe fn window_call() -> Option<(Vec<Local>, Call, Vec<Registration>, Duration)> {
    let timeout = Duration::from_millis(200);
    let options = Options {
        timeout,
        ..env_options()
    };
    let count = 1 << 22;
    let ls = locals(options, count);
    if !ls[0].comm.sharing().is_p2p() {
        eprintln!("host-staged: nothing can be registered, so there is nothing to deregister");
        return None;
    }
    let call = Call::new(Op::AllGather, DataType::F32, count);
    let access = Access {
        output: true,
        ..Access::NONE
    };
    let plan = ls[0].comm.plan_with(&call, access);
    assert!(plan.uses_windows(), "{plan:?} does not use the window");
    // SAFETY: forwarded from the caller.
    let regs = unsafe { register_outputs(&ls) };
    let limit = timeout + p2p_collective::comm::SYNC_GRACE;
    Some((ls, call, regs, limit))
}

/// `deregister` waits for this rank's calls on registered buffers, not for the whole GPU (it
/// used to be `cuCtxSynchronize`): with a call on the window held behind a kernel on the
/// call's stream it gives up at the limit of `synchronize` (time limit + `SYNC_GRACE`) with
/// `StillInUse`, the buffer still registered, and deregisters once the call has run; with
/// only another kernel held on the GPU (a user's, on a stream of its own) it returns at once.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_deregister_waits_for_the_calls_on_the_window_alone_and_at_most_its_limit() {
    // SAFETY: the outputs live in `ls`, and are deregistered below before it drops.
    let Some((mut ls, call, regs, limit)) = (unsafe { window_call() }) else {
        return;
    };

    // A call on the window, queued behind a held kernel on every rank's stream.
    let holds: Vec<Held> = ls.iter().map(|l| Held::on(&l.stream)).collect();
    for l in ls.iter_mut() {
        l.comm
            .call(&call, &l.input, &mut l.output, &l.stream)
            .expect("queued");
    }
    let t = Instant::now();
    let e = ls[0]
        .comm
        .deregister(regs[0])
        .expect_err("the call on the window has not run");
    let took = t.elapsed();
    assert!(matches!(e, Error::StillInUse { .. }), "{e:?}");
    assert!(e.to_string().contains("stays registered"), "{e}");
    gave_up_at(limit, took);
    holds.iter().for_each(Held::release);
    for l in &ls {
        l.comm.synchronize(&l.stream).expect("the call ran");
    }
    for (l, reg) in ls.iter().zip(&regs) {
        l.comm
            .deregister(*reg)
            .expect("deregistered once the call ran");
    }
    drop(holds);

    // Other work on the GPU, on a stream of its own: not waited for.
    // SAFETY: the outputs live in `ls`, and are deregistered below before it drops.
    let regs = unsafe { register_outputs(&ls) };
    for l in ls.iter_mut() {
        l.comm
            .call(&call, &l.input, &mut l.output, &l.stream)
            .expect("queued");
    }
    for l in &ls {
        l.comm.synchronize(&l.stream).expect("the call ran");
    }
    let (other, held) = Held::on_new_stream(ls[0].comm.device());
    let t = Instant::now();
    for (l, reg) in ls.iter().zip(&regs) {
        l.comm.deregister(*reg).expect("deregistered");
    }
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "deregister waited {:?} for a kernel that is not the communicator's",
        t.elapsed()
    );
    held.release_and_wait(&other);
}

/// Once a call on registered buffers was captured into a CUDA graph (whose replays nothing
/// records), `deregister` waits for the whole GPU instead, still with its limit: a kernel held
/// on another stream then makes it give up with `StillInUse` naming the graph; let go, it
/// deregisters.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_after_a_call_on_the_window_was_captured_deregister_waits_for_the_whole_gpu() {
    // SAFETY: the outputs live in `ls`, and are deregistered below before it drops.
    let Some((mut ls, call, regs, limit)) = (unsafe { window_call() }) else {
        return;
    };
    // Captured on rank 0 only, and never launched: nothing runs.
    {
        let l = &mut ls[0];
        drop(capture(&l.stream, || {
            l.comm
                .call(&call, &l.input, &mut l.output, &l.stream)
                .expect("captured");
        }));
    }
    let (_other, held) = Held::on_new_stream(ls[0].comm.device());
    let t = Instant::now();
    let e = ls[0].comm.deregister(regs[0]).expect_err("the GPU is busy");
    let took = t.elapsed();
    assert!(matches!(e, Error::StillInUse { .. }), "{e:?}");
    assert!(e.to_string().contains("graph"), "{e}");
    gave_up_at(limit, took);
    held.release();
    for (l, reg) in ls.iter().zip(&regs) {
        l.comm
            .deregister(*reg)
            .expect("deregistered once the GPU is idle");
    }
}

/// `check` reads the status words with a synchronous copy, which the driver orders after the
/// legacy default stream's work (anyone's: cudarc's default stream, say): held there, `check`
/// (and so `synchronize`) gives up after `SYNC_GRACE` with the memory layer's `Busy`, rather
/// than waiting as long as that work runs; let go, it reads them.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_check_waits_for_the_legacy_stream_at_most_its_grace() {
    let ls = locals(env_options(), 1024);
    let l = &ls[0];
    // SAFETY: the null handle is the legacy default stream of the GPU's primary context, alive
    // as long as the context.
    let legacy = unsafe { Stream::from_raw(l.comm.device(), std::ptr::null_mut()) };
    let held = Held::on(&legacy);
    let grace = p2p_collective::comm::SYNC_GRACE;
    let t = Instant::now();
    let e = l.comm.check().expect_err("the legacy stream is held");
    let took = t.elapsed();
    assert!(
        matches!(e.mem(), Some(p2p_mem::Error::Busy { .. })),
        "{e:?}"
    );
    assert!(
        took >= grace && took < grace + Duration::from_secs(1),
        "gave up after {took:?}, the grace is {grace:?}"
    );
    held.release_and_wait(&legacy);
    l.comm.check().expect("nothing failed");
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_a_typed_buffer_of_another_type_is_refused_before_anything_is_queued() {
    let ls = locals(env_options(), 1024);
    let l = &ls[0];
    let d = l.comm.device().clone();
    let send = DeviceBuffer::<f32>::zeroed(&d, 1024).expect("f32 buffer");
    let mut recv = DeviceBuffer::<f32>::zeroed(&d, 1024).expect("f32 buffer");
    let call = |dtype| Call {
        op: Op::AllReduce,
        dtype,
        count: 1024,
        redop: RedOp::Sum,
        root: 0,
    };
    // Same size, other type: refused, naming both.
    let e = l
        .comm
        .call(&call(DataType::I32), &send, &mut recv, &l.stream)
        .expect_err("f32 buffers reduced as i32");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(
        e.to_string().contains(
            "the send buffer holds f32 elements but the call says I32: pass DataType::F32"
        ),
        "{e}"
    );
    let e = l
        .comm
        .call_in_place(&call(DataType::I32), &mut recv, &l.stream)
        .expect_err("in place too");
    assert!(e.to_string().contains("in-place buffer holds f32"), "{e}");
    // Bytes stand for any type: the byte buffers of the matrices pass this check (and the
    // f32 call on f32 buffers passes it; it is not run here, as the other rank makes no call).
    assert!(l
        .comm
        .call(&call(DataType::I32), &l.input, &mut recv, &l.stream)
        .is_err_and(|e| !e.to_string().contains("send buffer holds")));
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_collectives_on_buffers_off_a_16_byte_boundary() {
    let counts: Vec<usize> = counts()
        .into_iter()
        .filter(|&c| c <= (1 << 20) + 3)
        .collect();
    let max = counts.iter().copied().max().unwrap_or(1);
    let mut ls = locals(env_options(), max);
    for l in &mut ls {
        l.skew = true;
    }
    run_matrix(&mut ls, &Op::ALL, &counts).assert_exact("off a 16-byte boundary");
    let l = &mut ls[0];
    let call = Call {
        op: Op::AllReduce,
        dtype: DataType::F32,
        count: 1024,
        redop: RedOp::Sum,
        root: 0,
    };
    let send = l.input.slice(2..).expect("view");
    let mut recv = l.output.slice_mut(..).expect("view");
    let e = l
        .comm
        .call(&call, &send, &mut recv, &l.stream)
        .expect_err("a send buffer 2 bytes into an f32 allocation");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("not a multiple of 4 bytes"), "{e}");
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_all_reduce_matrix_every_forced_algorithm() {
    for forced in [
        Forced::algo(Algo::TwoShot),
        Forced::algo(Algo::Ring),
        Forced::pair(Algo::OneShot, Proto::Ll),
        Forced::algo(Algo::Pipe),
    ] {
        eprintln!("{}", forced.describe());
        matrix(
            &[Op::AllReduce],
            Options {
                forced,
                ..env_options()
            },
        );
    }
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_broadcast_and_reduce_matrix() {
    matrix(&[Op::Broadcast, Op::Reduce], env_options());
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_all_gather_reduce_scatter_all_to_all_matrix() {
    matrix(
        &[Op::AllGather, Op::ReduceScatter, Op::AllToAll],
        env_options(),
    );
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_checking_mode_passes_matching_calls() {
    std::env::set_var("P2PTEST_COUNTS", "1,1023,65537");
    matrix(
        &Op::ALL,
        Options {
            check: true,
            ..env_options()
        },
    );
}

/// Each rank's calls from its own thread, many in a row without synchronising in between.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_ranks_on_their_own_threads_back_to_back() {
    let devices = gpus(world());
    let comms = Communicator::init_all_with(&devices, env_options()).expect("init_all");
    let n = comms.len();
    let count = 100_003;
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let stream = Stream::new(comm.device()).expect("stream");
                let start = vec![comm.rank() as f32 + 1.0; count];
                let mut buf = DeviceBuffer::from_host(comm.device(), &start).expect("buf");
                for _ in 0..50 {
                    comm.all_reduce_in_place(&mut buf, count, DataType::F32, RedOp::Avg, &stream)
                        .expect("call");
                    comm.all_reduce_in_place(&mut buf, count, DataType::F32, RedOp::Min, &stream)
                        .expect("call");
                }
                comm.synchronize(&stream).expect("sync");
                // The average of 1..=n is (n+1)/2 on every rank; min and avg keep it there.
                let got = buf.to_host_vec::<f32>().expect("read");
                let wrong = got.iter().filter(|&&x| x != (n as f32 + 1.0) / 2.0).count();
                assert_eq!(wrong, 0, "rank {}: {:?}", comm.rank(), &got[..4]);
            });
        }
    });
}

/// A stream and an input and output buffer of `len` f32 on each of `devices`.
fn streams_and_buffers(
    devices: &[Device],
    len: usize,
) -> (Vec<Stream>, Vec<DeviceBuffer<f32>>, Vec<DeviceBuffer<f32>>) {
    let streams = new_streams(devices);
    let buffers = |what| {
        devices
            .iter()
            .map(|d| DeviceBuffer::new(d, len).expect(what))
            .collect()
    };
    (streams, buffers("in"), buffers("out"))
}

/// A collective captured once in a CUDA graph and replayed with new inputs each time.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_graph_replay_with_changing_inputs() {
    graph_replay_with_changing_inputs(env_options(), false);
}

/// The same with the all-gather in place on a registered buffer (this rank's input copied into
/// its part first, in the graph) and the all-reduce into a registered output, the copy engines
/// moving both (`ce_min_bytes`, `ce_min_bytes_more_ranks` and `ce_all_reduce_min_bytes` 0, LL
/// off; the all-reduce by the copy engines on two ranks only): the copies, the flag writes, the
/// barrier kernels and the all-reduce's second stream replay in the graph.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_graph_replay_of_a_copy_engine_all_gather() {
    graph_replay_with_changing_inputs(copy_engine_options(1), true);
}

/// The same with the all-gather's copy split over two streams (`Tuning::ce_streams` 2): the
/// fork and join inside the capture.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_graph_replay_of_a_copy_engine_all_gather_on_two_streams() {
    graph_replay_with_changing_inputs(copy_engine_options(2), true);
}

/// The environment's options with every copy-engine plan at every size LL does not take, LL off
/// (70 001 floats per part would run LL), and `streams` for `Tuning::ce_streams`.
fn copy_engine_options(streams: usize) -> Options {
    let sms = gpus(1)[0].sm_count();
    let mut tuning = p2p_collective::plan::Tuning::for_device(sms, 2);
    tuning.ce_min_bytes = 0;
    tuning.ce_min_bytes_more_ranks = 0;
    tuning.ce_all_reduce_min_bytes = 0;
    tuning.ce_streams = streams;
    tuning.ll_max_bytes = 0;
    Options {
        tuning: Some(tuning),
        ..env_options()
    }
}

/// `ce`: register the all-gather's buffer and the all-reduce's output and run the all-gather
/// in place (the copy engines' paths when `options` lets them); else out of place on plain
/// buffers.
fn graph_replay_with_changing_inputs(options: Options, ce: bool) {
    let (devices, comms) = world_comms(options);
    let n = comms.len();
    let count = 70_001;
    let (streams, mut ins, mut outs) = streams_and_buffers(&devices, count);
    let mut gathered: Vec<DeviceBuffer<f32>> = devices
        .iter()
        .map(|d| DeviceBuffer::new(d, count * n).expect("gathered"))
        .collect();
    let ce = ce && comms[0].sharing().is_p2p();
    let regs = if ce {
        let refs: Vec<&Communicator> = comms.iter().collect();
        let mut regs = Vec::new();
        for bufs in [as_memory(&gathered), as_memory(&outs)] {
            // SAFETY: `gathered` and `outs` outlive the registrations, dropped below first.
            regs.extend(unsafe { Communicator::register_all(&refs, &bufs) }.expect("register_all"));
        }
        let access = Access {
            output: true,
            in_place: true,
            ..Access::NONE
        };
        let proto = |op, access| {
            comms[0]
                .plan_with(&Call::new(op, DataType::F32, count), access)
                .proto
        };
        assert_eq!(proto(Op::AllGather, access), Proto::CopyEngine);
        let out_of_place = Access {
            in_place: false,
            ..access
        };
        assert_eq!(
            proto(Op::AllReduce, out_of_place) == Proto::CopyEngine,
            n == 2
        );
        regs
    } else {
        Vec::new()
    };
    // Capture: all-reduce, then all-gather of the same input, twice each, per rank.
    let mut graphs = Vec::new();
    for r in 0..n {
        let graph = capture(&streams[r], || {
            for _ in 0..2 {
                comms[r]
                    .all_reduce(
                        &ins[r],
                        &mut outs[r],
                        count,
                        DataType::F32,
                        RedOp::Sum,
                        &streams[r],
                    )
                    .expect("capture all_reduce");
                if ce {
                    let part = gathered[r].device_ptr() + (r * count * 4) as u64;
                    // SAFETY: part r of `gathered[r]` and `ins[r]` are `count` floats each, on
                    // this stream's GPU, alive until the end of the test; the graph orders the copy
                    // before the all-gather that reads it.
                    unsafe {
                        p2p_mem::copy_async(part, ins[r].device_ptr(), count * 4, &streams[r])
                    }
                    .expect("capture the input copy");
                    comms[r]
                        .all_gather_in_place(&mut gathered[r], count, DataType::F32, &streams[r])
                        .expect("capture all_gather in place");
                } else {
                    comms[r]
                        .all_gather(&ins[r], &mut gathered[r], count, DataType::F32, &streams[r])
                        .expect("capture all_gather");
                }
            }
        });
        graphs.push(graph.instantiate().expect("instantiate"));
    }
    // Every rank's output holds the sum, and its gathered buffer every rank's input in order.
    let check = |replay, _r, got: &[Vec<f32>]| {
        let (out, g) = (&got[0], &got[1]);
        (0..count)
            .map(|i| {
                let want: f32 = (0..n).map(|p| input_value(i, replay, p)).sum();
                let parts = (0..n)
                    .filter(|&p| g[p * count + i] != input_value(i, replay, p))
                    .count();
                usize::from(out[i] != want) + parts
            })
            .sum()
    };
    // SAFETY: the captured calls use `comms`, `ins`, `outs` and `gathered`, all alive until
    // the end of the test.
    unsafe {
        replay_checked(
            &comms,
            &streams,
            &graphs,
            &mut ins,
            &mut [&mut outs, &mut gathered],
            20,
            check,
        )
    };
    // `register_all` gives one registration per rank, in rank order, per buffer set.
    for (i, reg) in regs.into_iter().enumerate() {
        comms[i % n].deregister(reg).expect("deregister");
    }
    eprintln!(
        "20 replays of a 4-collective graph on {n} ranks (copy-engine all-gather and all-reduce: {ce}): 0 wrong"
    );
}

fn short_timeout() -> Options {
    Options {
        timeout: Duration::from_millis(500),
        ..env_options()
    }
}

/// A rank whose peer never calls gets an error naming the peer, not a hang; later calls fail
/// at once.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_a_missing_peer_times_out_with_an_error_and_poisons_the_communicator() {
    let devices = gpus(2);
    let comms = short_pair(&devices);
    let stream = Stream::new(&devices[0]).expect("stream");
    let mut buf = DeviceBuffer::<f32>::zeroed(&devices[0], 4096).expect("buf");
    let t = Instant::now();
    comms[0]
        .all_reduce_in_place(&mut buf, 4096, DataType::F32, RedOp::Sum, &stream)
        .expect("enqueue");
    // A second call queued behind the stuck one must drain too.
    comms[0]
        .all_reduce_in_place(&mut buf, 4096, DataType::F32, RedOp::Sum, &stream)
        .expect("enqueue");
    let e = comms[0].synchronize(&stream).expect_err("must time out");
    assert_rank0_timed_out_on_rank1(&e, "all_reduce", t.elapsed());
    assert_unusable(&comms[0]);
}

/// A later call on `comm` is refused at once: an earlier failure made it unusable.
fn assert_unusable(comm: &Communicator) {
    let s = Stream::new(comm.device()).expect("stream");
    let mut b = DeviceBuffer::<f32>::zeroed(comm.device(), 16).expect("buf");
    let e = comm
        .all_reduce_in_place(&mut b, 16, DataType::F32, RedOp::Sum, &s)
        .expect_err("unusable");
    assert!(matches!(e, Error::Unusable { .. }), "{e:?}");
}

/// A copy-engine all-to-all or all-reduce whose peer never calls stops in its first barrier
/// with an error that names that collective (the barrier runs under the plan's own kind).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_a_missing_peer_in_a_copy_engine_call_is_named() {
    const N: usize = 1 << 16;
    for op in [Op::AllToAll, Op::AllReduce] {
        let devices = gpus(2);
        // Declared before the communicators, so dropped after them (and their registrations).
        let ins = devices[..2]
            .iter()
            .map(|d| DeviceBuffer::<f32>::zeroed(d, N))
            .collect::<Result<Vec<_>, _>>()
            .expect("inputs");
        let mut outs = devices[..2]
            .iter()
            .map(|d| DeviceBuffer::<f32>::zeroed(d, N))
            .collect::<Result<Vec<_>, _>>()
            .expect("outputs");
        let options = Options {
            timeout: Duration::from_millis(500),
            ..without_ll(|t| {
                t.ce_min_bytes = 0;
                t.ce_all_reduce_min_bytes = 0;
            })
        };
        let comms = Communicator::init_all_with(&devices[..2], options).expect("init_all");
        let refs: Vec<&Communicator> = comms.iter().collect();
        if !comms[0].sharing().is_p2p() {
            // Host-staged (P2P_DISABLE=1): registration is refused, so no copy-engine plan.
            // SAFETY: nothing is registered (the call fails); the buffers outlive it anyway.
            let e = unsafe { Communicator::register_all(&refs, &as_memory(&ins)) }
                .expect_err("host-staged");
            assert!(e.to_string().contains("no P2P"), "{e}");
            return;
        }
        for bufs in [&ins, &outs] {
            // SAFETY: the buffers outlive the communicators (declared before them).
            unsafe { Communicator::register_all(&refs, &as_memory(bufs)) }.expect("register_all");
        }
        let count = if op == Op::AllToAll { N / 2 } else { N };
        let call = Call::new(op, DataType::F32, count);
        let access = Access {
            input: true,
            output: true,
            ..Access::NONE
        };
        assert_eq!(
            comms[0].plan_with(&call, access).proto,
            Proto::CopyEngine,
            "{op}"
        );
        let stream = Stream::new(&devices[0]).expect("stream");
        let t = Instant::now();
        comms[0]
            .call(&call, &ins[0], &mut outs[0], &stream)
            .expect("enqueue");
        let e = comms[0].synchronize(&stream).expect_err("must time out");
        assert_rank0_timed_out_on_rank1(&e, op.name(), t.elapsed());
    }
}

/// `e` is rank 0's stall waiting for rank 1.
fn assert_rank0_stalled_on_rank1(e: &Error) {
    assert!(
        matches!(
            e,
            Error::Stalled {
                peer: 1,
                rank: 0,
                ..
            }
        ),
        "{e:?}"
    );
}

/// `e` says that `op` on rank 0 timed out waiting for rank 1, `took` after the call began.
fn assert_rank0_timed_out_on_rank1(e: &Error, op: &str, took: Duration) {
    eprintln!("{e} (after {took:?})");
    assert_rank0_stalled_on_rank1(e);
    let text = e.to_string();
    assert!(
        text.starts_with(op) && text.contains("timed out"),
        "{op}: {e}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// `abort()` from another thread ends a waiting collective at once.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_abort_from_another_thread_ends_a_stuck_call() {
    let devices = gpus(2);
    let options = Options {
        timeout: Duration::from_secs(120),
        ..env_options()
    };
    let comms = Communicator::init_all_with(&devices[..2], options).expect("init_all");
    let stream = Stream::new(&devices[0]).expect("stream");
    let mut buf = DeviceBuffer::<f32>::zeroed(&devices[0], 1 << 20).expect("buf");
    comms[0]
        .broadcast_in_place(&mut buf, 1 << 20, DataType::F32, 1, &stream)
        .expect("enqueue");
    let handle = comms[0].abort_handle();
    let t = Instant::now();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        handle.abort();
    });
    let e = comms[0].synchronize(&stream).expect_err("must be aborted");
    let took = t.elapsed();
    aborter.join().expect("aborter");
    eprintln!("{e} (after {took:?})");
    assert!(e.to_string().contains("was aborted"), "{e}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    for c in &comms {
        assert_unusable(c);
    }
}

/// In checking mode, ranks that disagree on the call fail with both calls named: the count (two
/// small calls, one of 4 KiB against one of 4 MiB, two large ones), the operation and the root.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_checking_mode_names_mismatched_calls() {
    let all_reduce = |count: usize| Mismatched::AllReduce(count);
    for (calls, words) in [
        (
            [all_reduce(1024), all_reduce(1000)],
            ["count 1024", "count 1000"],
        ),
        (
            [all_reduce(1024), all_reduce(1 << 20)],
            ["count 1024", "count 1048576"],
        ),
        (
            [all_reduce(1 << 20), all_reduce(1 << 19)],
            ["count 1048576", "count 524288"],
        ),
        (
            [all_reduce(4096), Mismatched::Broadcast(4096, 0)],
            ["all_reduce", "broadcast"],
        ),
        (
            [Mismatched::Broadcast(256, 0), Mismatched::Broadcast(256, 1)],
            ["root 0", "root 1"],
        ),
    ] {
        mismatched_calls_are_named(calls, words);
    }
}

/// One rank's call in `gpu2_checking_mode_names_mismatched_calls`: an f32 all-reduce of a count,
/// or a broadcast of a count from a root, in place.
#[derive(Debug, Clone, Copy)]
enum Mismatched {
    AllReduce(usize),
    Broadcast(usize, usize),
}

/// Ranks 0 and 1 of a fresh communicator in checking mode make `calls`; each fails with
/// `Error::Mismatch` whose text holds both `words`, and is unusable after.
fn mismatched_calls_are_named(calls: [Mismatched; 2], words: [&str; 2]) {
    let devices = gpus(2);
    let options = Options {
        check: true,
        ..short_timeout()
    };
    let comms = Communicator::init_all_with(&devices[..2], options).expect("init_all");
    let streams = new_streams(&devices[..2]);
    let mut bufs: Vec<DeviceBuffer<f32>> = devices[..2]
        .iter()
        .map(|d| DeviceBuffer::zeroed(d, 1 << 20).expect("buf"))
        .collect();
    for (r, call) in calls.into_iter().enumerate() {
        let (buf, s) = (&mut bufs[r], &streams[r]);
        match call {
            Mismatched::AllReduce(n) => {
                comms[r].all_reduce_in_place(buf, n, DataType::F32, RedOp::Sum, s)
            }
            Mismatched::Broadcast(n, root) => {
                comms[r].broadcast_in_place(buf, n, DataType::F32, root, s)
            }
        }
        .expect("enqueue");
    }
    for r in 0..2 {
        let e = comms[r].synchronize(&streams[r]).expect_err("mismatch");
        eprintln!("{calls:?}, rank {r}: {e}");
        assert!(matches!(e, Error::Mismatch { .. }), "{calls:?}: {e:?}");
        let text = e.to_string();
        assert!(
            text.contains(words[0]) && text.contains(words[1]),
            "{calls:?}: {text}"
        );
        assert_unusable(&comms[r]);
    }
}

/// Wrong arguments are refused before anything is queued, and nothing is written.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_bad_arguments_are_refused_and_zero_counts_do_nothing() {
    let devices = gpus(2);
    let comms = Communicator::init_all_with(&devices[..2], env_options()).expect("init_all");
    let (g0, g1) = (&devices[0], &devices[1]);
    let s0 = Stream::new(g0).expect("stream");
    let small = DeviceBuffer::<f32>::zeroed(g0, 10).expect("buf");
    let mut out = DeviceBuffer::<f32>::zeroed(g0, 100).expect("buf");
    let on_g1 = DeviceBuffer::<f32>::zeroed(g1, 100).expect("buf");
    let msg = |r: Result<(), Error>| r.expect_err("must be refused").to_string();
    let e = msg(comms[0].all_reduce(&small, &mut out, 100, DataType::F32, RedOp::Sum, &s0));
    assert!(
        e.contains("send buffer holds 40 bytes") && e.contains("need 400"),
        "{e}"
    );
    // Ranks sharing one GPU (P2PTEST_SHARE_GPU=1) have no other GPU to name.
    let two_gpus = g0 != g1;
    if two_gpus {
        let e = msg(comms[0].all_reduce(&on_g1, &mut out, 100, DataType::F32, RedOp::Sum, &s0));
        assert!(e.contains("send buffer is on GPU 1"), "{e}");
    }
    let e = msg(comms[0].broadcast(
        &out.slice(..).expect("view"),
        &mut DeviceBuffer::<f32>::zeroed(g0, 100).expect("b"),
        100,
        DataType::F32,
        2,
        &s0,
    ));
    assert!(e.contains("root 2 is out of range"), "{e}");
    let e = msg(comms[0].all_gather(&small, &mut out, 60, DataType::F32, &s0));
    assert!(e.contains("send buffer"), "{e}");
    let e = msg(comms[0].all_gather(
        &out,
        &mut DeviceBuffer::<f32>::zeroed(g0, 150).expect("b"),
        100,
        DataType::F32,
        &s0,
    ));
    assert!(e.contains("recv buffer holds 600 bytes"), "{e}");
    if two_gpus {
        let s1 = Stream::new(g1).expect("stream");
        let e = msg(comms[0].all_reduce_in_place(&mut out, 100, DataType::F32, RedOp::Sum, &s1));
        assert!(e.contains("the stream is on GPU 1"), "{e}");
    }
    // Zero elements: a no-op on every rank, nothing written.
    out.memset_u8(0xab).expect("fill");
    comms[0]
        .all_reduce(&small, &mut out, 0, DataType::F32, RedOp::Sum, &s0)
        .expect("zero count");
    comms[0].synchronize(&s0).expect("sync");
    assert!(out
        .to_host_vec::<u8>()
        .expect("read")
        .iter()
        .all(|&b| b == 0xab));
    // After refusals the communicator still works.
    let mut ls: Vec<Local> = comms.into_iter().map(|c| Local::new(c, 4096)).collect();
    let (w, d) = run_case(
        &mut ls,
        &Call {
            op: Op::AllReduce,
            dtype: DataType::F32,
            count: 4096,
            redop: RedOp::Sum,
            root: 0,
        },
        false,
    );
    assert_eq!(w, 0, "{d}");
}

/// Inputs whose sums round: every rank must still get the same bits, and one-shot and
/// two-shot must equal the host's reduction in rank order (f32 arithmetic, f16 and bf16
/// accumulated in f32 and rounded once); ring, which reduces each part in its own fixed order,
/// must agree across ranks.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_rounding_inputs_give_bitwise_identical_results_on_every_rank() {
    let devices = gpus(world());
    let n = devices.len();
    let count = 300_007;
    let seed = 0x5eed_u64;
    // A float in [-1, 1) with a full mantissa, different on every rank and index.
    let val = |r: usize, i: usize| -> f32 {
        let mut x = seed ^ ((r as u64) << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 29;
        ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    };
    for forced in [
        Forced::algo(Algo::OneShot),
        Forced::algo(Algo::TwoShot),
        Forced::algo(Algo::Ring),
        Forced::pair(Algo::OneShot, Proto::Ll),
        Forced::algo(Algo::Pipe),
    ] {
        // LL carries at most 512 KiB.
        let ll = forced.proto == Some(Proto::Ll);
        let count = if ll { 60_001 } else { count };
        let name = forced.describe();
        let options = Options {
            forced,
            ..env_options()
        };
        let comms = Communicator::init_all_with(&devices, options).expect("init_all");
        let streams = new_streams(&devices);
        for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
            let host: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    (0..count)
                        .flat_map(|i| match dtype {
                            DataType::F32 => val(r, i).to_le_bytes().to_vec(),
                            DataType::F16 => half::f16::from_f32(val(r, i)).to_le_bytes().to_vec(),
                            _ => half::bf16::from_f32(val(r, i)).to_le_bytes().to_vec(),
                        })
                        .collect()
                })
                .collect();
            let mut bufs: Vec<DeviceBuffer<u8>> = devices
                .iter()
                .zip(&host)
                .map(|(d, h)| DeviceBuffer::from_host(d, h).expect("input"))
                .collect();
            for r in 0..n {
                comms[r]
                    .all_reduce_in_place(&mut bufs[r], count, dtype, RedOp::Sum, &streams[r])
                    .expect("all_reduce");
            }
            let mut outs = Vec::new();
            for r in 0..n {
                comms[r].synchronize(&streams[r]).expect("sync");
                outs.push(bufs[r].to_host_vec::<u8>().expect("read"));
            }
            for r in 1..n {
                let differ = outs[r]
                    .chunks(dtype.size())
                    .zip(outs[0].chunks(dtype.size()))
                    .filter(|(a, b)| a != b)
                    .count();
                assert_eq!(
                    differ, 0,
                    "{name} {dtype}: rank {r} differs from rank 0 in {differ} elements"
                );
            }
            if forced.algo != Some(Algo::Ring) {
                let size = dtype.size();
                let elem = |r: usize, i: usize| -> f32 {
                    let b = &host[r][i * size..(i + 1) * size];
                    match dtype {
                        DataType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                        DataType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                        _ => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                    }
                };
                let mut wrong = 0;
                for i in 0..count {
                    let mut acc = elem(0, i);
                    for r in 1..n {
                        acc += elem(r, i);
                    }
                    let want = match dtype {
                        DataType::F32 => acc.to_le_bytes().to_vec(),
                        DataType::F16 => half::f16::from_f32(acc).to_le_bytes().to_vec(),
                        _ => half::bf16::from_f32(acc).to_le_bytes().to_vec(),
                    };
                    wrong += (outs[0][i * size..(i + 1) * size] != want[..]) as usize;
                }
                assert_eq!(
                    wrong, 0,
                    "{name} {dtype}: {wrong} elements differ from the rank-order sum"
                );
            }
            eprintln!("{name} {dtype}: {n} ranks bitwise identical");
        }
    }
}

/// Many all-reduces of different sizes back to back, with no synchronisation in between, for
/// every algorithm: the grid changes from call to call, so a flag or scratch line left by an
/// earlier call of another size must never pass for the current one (the LL protocol's lines in
/// particular are reused by calls of every size up to 64 KiB).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_varying_sizes_back_to_back_for_every_algorithm() {
    let calls = 300usize;
    // Sizes from 1 element to 40,000 (160 KB), mostly LL-sized, in a fixed pseudo-random order.
    let sizes = pseudo_random(0x2545_f491_4f6c_dd1d, calls, |k, x| {
        let cap = if k % 5 == 0 { 40_000 } else { 16_384 };
        1 + (x % cap as u64) as usize
    });
    let forced = [
        Forced::AUTO,
        Forced::pair(Algo::OneShot, Proto::Ll),
        Forced::algo(Algo::OneShot),
        Forced::algo(Algo::TwoShot),
        Forced::algo(Algo::Ring),
        Forced::algo(Algo::Pipe),
    ];
    for forced in forced {
        let name = forced.describe();
        let options = Options {
            forced,
            ..env_options()
        };
        back_to_back(&name, options, &sizes, |_| false);
    }
}

/// All-reduces whose plans change kind, grid and piece from call to call (LL, one-shot at
/// several grids and over several rounds, the pipelined one-shot), some in place, back to back with no
/// synchronisation: block b's scratch region and step parity must stay its own whatever the
/// previous call's grid (a call on fewer blocks leaves the others' counters behind), and the
/// pipelined kernel's odd step count must hand the next call the other parity.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_calls_of_every_kind_and_grid_back_to_back() {
    // f32 elements: LL (4 KB, 400 KB), one-shot or pipelined (600 KB on 37 blocks, 1.2 MB on
    // 74, an odd count; 4 MB and 10 MB on 256), one-shot (20 MB: two rounds of 16 MiB).
    let shapes = [
        1_000usize,
        100_000,
        150_000,
        300_007,
        1 << 20,
        2_500_000,
        5_000_000,
    ];
    let sizes = pseudo_random(0x9e37_79b9_7f4a_7c15, 64, |_, x| {
        shapes[(x % shapes.len() as u64) as usize]
    });
    back_to_back("auto", env_options(), &sizes, |c| c % 3 == 1);
    // The same with the pipelined one-shot on (off by default until measured).
    let sms = gpus(1)[0].sm_count();
    let mut tuning = p2p_collective::plan::Tuning::for_device(sms, 2);
    tuning.pipe_max_bytes = 16 << 20;
    let options = Options {
        tuning: Some(tuning),
        ..env_options()
    };
    back_to_back("auto, pipelined", options, &sizes, |c| c % 3 == 1);
}

/// `n` values `pick(k, x_k)` from a xorshift sequence x_1, x_2, ... started at `seed`: a fixed
/// pseudo-random order.
fn pseudo_random(seed: u64, n: usize, mut pick: impl FnMut(usize, u64) -> usize) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|k| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pick(k, x)
        })
        .collect()
}

/// Runs one f32 sum all-reduce per entry of `sizes` on every rank, all queued before any is
/// waited for (in place where `in_place(call)`), then checks every element of every result.
fn back_to_back(name: &str, options: Options, sizes: &[usize], in_place: impl Fn(usize) -> bool) {
    let devices = gpus(world());
    let n = devices.len();
    let calls = sizes.len();
    let value = |call: usize, rank: usize, i: usize| ((call * 7 + rank * 13 + i) % 97) as f32;
    let comms = Communicator::init_all_with(&devices, options).expect("init_all");
    let streams = new_streams(&devices);
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (c, &size) in sizes.iter().enumerate() {
        let mut row_in = Vec::new();
        let mut row_out = Vec::new();
        for (r, d) in devices.iter().enumerate() {
            let host: Vec<f32> = (0..size).map(|i| value(c, r, i)).collect();
            row_in.push(DeviceBuffer::from_host(d, &host).expect("input"));
            let len = if in_place(c) { 1 } else { size };
            let mut out = DeviceBuffer::<f32>::new(d, len).expect("output");
            out.memset_u8(0xff).expect("poison");
            row_out.push(out);
        }
        ins.push(row_in);
        outs.push(row_out);
    }
    let start = Instant::now();
    for c in 0..calls {
        for r in 0..n {
            let (op, dtype, sum) = (sizes[c], DataType::F32, RedOp::Sum);
            let result = if in_place(c) {
                comms[r].all_reduce_in_place(&mut ins[c][r], op, dtype, sum, &streams[r])
            } else {
                comms[r].all_reduce(&ins[c][r], &mut outs[c][r], op, dtype, sum, &streams[r])
            };
            result.expect("all_reduce");
        }
    }
    synchronize_all(&comms, &streams);
    let elapsed = start.elapsed();
    let mut wrong = 0usize;
    let mut first = String::new();
    for c in 0..calls {
        for r in 0..n {
            let got = if in_place(c) {
                ins[c][r].to_host_vec::<f32>().expect("read")
            } else {
                outs[c][r].to_host_vec::<f32>().expect("read")
            };
            for (i, &g) in got.iter().enumerate() {
                let want: f32 = (0..n).map(|p| value(c, p, i)).sum();
                if g != want {
                    if first.is_empty() {
                        first = format!(
                            "call {c} ({} elements, {:?}, in place {}), rank {r}, element {i}: got {g}, want {want}",
                            sizes[c],
                            comms[r].plan(&Call::new(Op::AllReduce, DataType::F32, sizes[c])).route(),
                            in_place(c)
                        );
                    }
                    wrong += 1;
                }
            }
        }
    }
    eprintln!("{name}: {calls} calls of varying size on {n} ranks in {elapsed:?}, {wrong} wrong");
    assert_eq!(wrong, 0, "{name}: {wrong} wrong elements; first: {first}");
}

/// Every collective kernel keeps two resident blocks per SM (the planner's grid): a kernel that
/// needs more registers silently halves the grid and costs up to 20 % at large sizes.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_collective_kernels_keep_two_blocks_per_sm() {
    let (devices, comms) = world_comms(env_options());
    let sms = devices[0].sm_count() as u32;
    // Ranks sharing a GPU (P2PTEST_SHARE_GPU=1) split its blocks.
    let share = comms[0].ranks_per_gpu() as u32;
    let want = (2 * sms).min(p2p_collective::plan::MAX_BLOCKS) / share;
    assert_eq!(
        comms[0].tuning().max_blocks,
        want,
        "{sms} SMs, {share} rank(s) per GPU: the kernels no longer fit two blocks per SM"
    );
}

/// Options with LL off and the given tuning changes, so that a matrix runs the path under test
/// at every count (LL would take the small ones).
fn without_ll(change: impl Fn(&mut p2p_collective::plan::Tuning)) -> Options {
    let sms = gpus(1)[0].sm_count();
    let mut tuning = p2p_collective::plan::Tuning::for_device(sms, 2);
    tuning.ll_max_bytes = 0;
    change(&mut tuning);
    Options {
        tuning: Some(tuning),
        ..env_options()
    }
}

/// Broadcast and reduce split among the non-roots (chosen on more than two ranks from
/// `split_min_bytes`; here at every count), every type, reduction and root.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_split_broadcast_and_reduce_matrix() {
    let options = without_ll(|t| t.split_min_bytes = 0);
    let n = world();
    if n > 2 {
        let comms = locals(options.clone(), 1);
        let call = Call::new(Op::Broadcast, DataType::F32, 1);
        assert_eq!(comms[0].comm.plan(&call).algo, Algo::Split);
    }
    matrix(&[Op::Broadcast, Op::Reduce], options);
}

/// The two-shot all-reduce, the split broadcast and reduce, and the one-shot all-gather,
/// reduce-scatter and all-to-all with their chunks' steps overlapped (`Tuning::overlap_min_bytes` 0, so at every count; pieces of 1 KiB and at least
/// three chunks, so that most counts run many chunks and a short last one): every count up to
/// 2^22 (above it, thousands of 1 KiB chunks add time, not cases), type, reduction and root, in
/// and out of place; the one-shot all-gather, reduce-scatter and all-to-all likewise, with
/// aligned counts added (the overlapped one-shot runs only on aligned parts); then two-shot
/// all-reduces replayed in a CUDA graph with changing inputs.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_overlapped_steps_matrix_and_graph_replay() {
    let overlapped = |t: &mut p2p_collective::plan::Tuning| {
        t.overlap_min_bytes = 0;
        t.overlap_chunks = 3;
        t.piece_bytes = 1 << 10;
        t.split_min_bytes = 0;
    };
    let two_shot = Options {
        forced: Forced::algo(Algo::TwoShot),
        ..without_ll(overlapped)
    };
    let comms = locals(two_shot.clone(), 1);
    let p = comms[0]
        .comm
        .plan(&Call::new(Op::AllReduce, DataType::F32, 100_000));
    assert!(
        p.overlap && p.algo == Algo::TwoShot && p.chunks >= 3,
        "{p:?}"
    );
    drop(comms);
    matrix_up_to(&[Op::AllReduce], two_shot.clone(), 1 << 22);
    if world() > 2 {
        let comms = locals(without_ll(overlapped), 1);
        for op in [Op::Broadcast, Op::Reduce] {
            let p = comms[0].comm.plan(&Call::new(op, DataType::F32, 100_000));
            assert!(p.overlap && p.algo == Algo::Split, "{op}: {p:?}");
        }
        drop(comms);
        matrix_up_to(
            &[Op::Broadcast, Op::Reduce],
            without_ll(overlapped),
            1 << 22,
        );
    }
    // One-shot all-gather, reduce-scatter and all-to-all: overlapped where every part lies on a
    // 16-byte boundary, so aligned counts beside the usual ones (which take the realigning
    // kernel, in turn).
    let comms = locals(without_ll(overlapped), 1);
    for op in [Op::AllGather, Op::ReduceScatter, Op::AllToAll] {
        let p = comms[0].comm.plan(&Call::new(op, DataType::F32, 65536));
        assert!(
            p.overlap && p.entry == p2p_collective::plan::Entry::OneShotOverlapped,
            "{op}: {p:?}"
        );
    }
    drop(comms);
    let mut scattered: Vec<usize> = counts().into_iter().filter(|&c| c <= 1 << 22).collect();
    scattered.extend([4096, 65536, 1 << 20]);
    matrix_of(
        &[Op::AllGather, Op::ReduceScatter, Op::AllToAll],
        without_ll(overlapped),
        scattered,
    );
    graph_replay_with_changing_inputs(two_shot, false);
}

/// All-gather and all-to-all through the scratch with the own part copied by the copy engine on
/// the communicator's second stream (`Tuning::ce_own_min_bytes`, here at every count): every
/// count, in place (nothing copied) and out of place; then replayed in a CUDA graph (the fork
/// and join of the second stream inside the capture).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_own_part_by_copy_engine_matrix_and_graph_replay() {
    let options = without_ll(|t| t.ce_own_min_bytes = 0);
    let comms = locals(options.clone(), 1);
    for op in [Op::AllGather, Op::AllToAll] {
        let plan = comms[0].comm.plan(&Call::new(op, DataType::F32, 1000));
        assert!(plan.own_by_copy_engine, "{op}: {plan:?}");
    }
    drop(comms);
    matrix(&[Op::AllGather, Op::AllToAll], options.clone());
    graph_replay_with_changing_inputs(options, false);
}

/// Every collective on buffers registered on every rank (`register_all`): the direct kinds
/// where the planner picks them (all-gather and reduce-scatter; all-reduce and all-to-all on
/// more than two ranks; parts 16-byte aligned, so counts 4096 and 65536 are added), the others
/// through the scratch, at every count, type, reduction, root, in and out of place. The size
/// threshold is lowered so that small counts go direct too.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_registered_buffers_matrix() {
    let n = world();
    registered_matrix(
        without_ll(|t| t.direct_min_bytes = 0),
        &Op::ALL,
        |op, plan, _| {
            // Broadcast and reduce have no direct kind.
            let direct = !op.rooted() && (n > 2 || matches!(op, Op::AllGather | Op::ReduceScatter));
            assert_eq!(plan.algo == Algo::Direct, direct, "{op}: {plan:?}");
        },
    );
}

/// The push all-reduce (forced) into registered outputs: every count, type and reduction, in
/// and out of place, with its steps in turn and then overlapped (pieces of 1 KiB, at least three
/// chunks, so that most counts run many chunks).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_push_all_reduce_registered_matrix() {
    forced_registered_matrix(Algo::Push, &[Op::AllReduce], true);
}

/// The split broadcast and reduce into registered outputs (forced), as the push all-reduce
/// above, every root too. On two ranks it cannot run (a split needs a non-root to forward to):
/// the calls run as planned and are checked all the same.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_split_into_outputs_registered_matrix() {
    forced_registered_matrix(Algo::SplitOut, &[Op::Broadcast, Op::Reduce], world() > 2);
}

/// The relayed broadcast, reduce and all-reduce into registered outputs (forced), as the split
/// into outputs above: cut into four chunks at least, then into pieces of 1 KiB (at least three
/// chunks), so that most counts run many chunks, each flagged on its own. On two ranks the
/// broadcast and reduce cannot run (planned as usual, checked all the same).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_relay_registered_matrix() {
    forced_registered_matrix(Algo::Relay, &[Op::AllReduce], true);
    forced_registered_matrix(Algo::Relay, &[Op::Broadcast, Op::Reduce], world() > 2);
}

/// The relayed collectives (forced) captured in a CUDA graph on registered outputs and replayed
/// with changing inputs: a broadcast from rank 1, then a sum reduce into rank 0 over the same
/// outputs, then a sum all-reduce into other outputs, cut into 1 KiB pieces (about 70 chunks a
/// call), so that a replay's calls meet the flags the calls before them left. On two ranks the
/// broadcast and reduce plan as usual, checked all the same.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_relay_graph_replay() {
    let options = Options {
        forced: Forced::algo(Algo::Relay),
        ..without_ll(|t| {
            t.piece_bytes = 1 << 10;
            t.overlap_chunks = 3;
        })
    };
    let (devices, comms) = world_comms(options);
    let n = comms.len();
    let count = 70_001;
    let (streams, mut ins, mut outs) = streams_and_buffers(&devices, count);
    let (_, _, mut sums) = streams_and_buffers(&devices, count);
    let refs: Vec<&Communicator> = comms.iter().collect();
    let mut regs = Vec::new();
    for bufs in [as_memory(&outs), as_memory(&sums)] {
        // SAFETY: `outs` and `sums` outlive the registrations, deregistered below first.
        regs.extend(unsafe { Communicator::register_all(&refs, &bufs) }.expect("register_all"));
    }
    let registered = Access {
        output: true,
        ..Access::NONE
    };
    for op in [Op::Broadcast, Op::Reduce, Op::AllReduce] {
        let p = comms[0].plan_with(&Call::new(op, DataType::F32, count), registered);
        let relayed = n > 2 || op == Op::AllReduce;
        assert_eq!(p.algo == Algo::Relay, relayed, "{op}: {p:?}");
    }
    let mut graphs = Vec::new();
    for r in 0..n {
        let graph = capture(&streams[r], || {
            comms[r]
                .broadcast(&ins[r], &mut outs[r], count, DataType::F32, 1, &streams[r])
                .expect("capture broadcast");
            comms[r]
                .reduce(
                    &ins[r],
                    &mut outs[r],
                    count,
                    DataType::F32,
                    RedOp::Sum,
                    0,
                    &streams[r],
                )
                .expect("capture reduce");
            comms[r]
                .all_reduce(
                    &ins[r],
                    &mut sums[r],
                    count,
                    DataType::F32,
                    RedOp::Sum,
                    &streams[r],
                )
                .expect("capture all_reduce");
        });
        graphs.push(graph.instantiate().expect("instantiate"));
    }
    // Rank 0's output holds the sum, every other rank's what rank 1 broadcast; every rank's
    // `sums` the sum.
    let check = |replay, r, got: &[Vec<f32>]| {
        let (out, sum) = (&got[0], &got[1]);
        (0..count)
            .filter(|&i| {
                let total: f32 = (0..n).map(|p| input_value(i, replay, p)).sum();
                let want = if r == 0 {
                    total
                } else {
                    input_value(i, replay, 1)
                };
                out[i] != want || sum[i] != total
            })
            .count()
    };
    // SAFETY: the captured calls use `comms`, `ins`, `outs` and `sums`, all alive until the end
    // of the test.
    unsafe {
        replay_checked(
            &comms,
            &streams,
            &graphs,
            &mut ins,
            &mut [&mut outs, &mut sums],
            20,
            check,
        )
    };
    // `register_all` gives one registration per rank, in rank order, per buffer set.
    for (i, reg) in regs.into_iter().enumerate() {
        comms[i % n].deregister(reg).expect("deregister");
    }
    eprintln!("20 replays of a relayed broadcast, reduce and all-reduce on {n} ranks: 0 wrong");
}

/// `ops` on buffers registered on every rank with `algo` forced (`registered_matrix`), its steps
/// in turn and then overlapped (pieces of 1 KiB, at least three chunks; the relay, which has no
/// stages to overlap, is only cut finer); `runs`: whether `algo` can run them at this world size
/// (the plans are checked to be its, else not its).
fn forced_registered_matrix(algo: Algo, ops: &[Op], runs: bool) {
    for overlap in [false, true] {
        let tuned = without_ll(|t| {
            if overlap {
                t.overlap_min_bytes = 0;
                t.overlap_chunks = 3;
                t.piece_bytes = 1 << 10;
            }
        });
        let options = Options {
            forced: Forced::algo(algo),
            ..tuned
        };
        registered_matrix(options, ops, |op, plan, in_place| {
            for p in [plan, in_place] {
                if runs {
                    let overlaps = overlap && algo != Algo::Relay;
                    assert_eq!((p.algo, p.overlap), (algo, overlaps), "{op}: {p:?}");
                    assert!(p.uses_windows(), "{p:?}");
                } else {
                    assert_ne!(p.algo, algo, "{op}: {p:?}");
                }
            }
        });
    }
}

/// The copy-engine plans on registered buffers (`ce_min_bytes`, `ce_min_bytes_more_ranks` and
/// `ce_all_reduce_min_bytes` 0, so every count LL does not take), at every count, type and
/// reduction: all-gather in and out of place, all-to-all out of place (in place it runs the
/// kernels) on any world size, and all-reduce out of place on two ranks.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_copy_engine_matrix() {
    copy_engine_matrix(1);
}

/// The same with each copy of an all-gather or all-to-all split over two streams
/// (`Tuning::ce_streams` 2).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_copy_engine_matrix_on_two_streams() {
    copy_engine_matrix(2);
}

fn copy_engine_matrix(streams: usize) {
    let two = world() == 2;
    registered_matrix(
        copy_engine_options(streams),
        &[Op::AllReduce, Op::AllGather, Op::AllToAll],
        |op, out_of_place, in_place| {
            // Whether the copy engines run it, out of place and in place.
            let want = match op {
                Op::AllReduce => (two, false),
                Op::AllGather => (true, true),
                _ => (true, false),
            };
            let got = (
                out_of_place.proto == Proto::CopyEngine,
                in_place.proto == Proto::CopyEngine,
            );
            assert_eq!(got, want, "{op}: {out_of_place:?} {in_place:?}");
        },
    );
}

/// Every collective in `ops` on buffers registered on every rank (`register_all`) with
/// `options`, at every count (4096 and 65536 added: 16-byte aligned parts), type, reduction and
/// root, in and out of place; `expect(op, plan, plan in place)` checks the plans of a
/// registered 4096-element call first. Host-staged (`P2P_DISABLE=1`), checks that registration is refused instead.
fn registered_matrix(
    options: Options,
    ops: &[Op],
    expect: impl Fn(Op, &p2p_collective::plan::Plan, &p2p_collective::plan::Plan),
) {
    let mut counts = counts();
    counts.extend([4096, 65536]);
    let max = counts.iter().copied().max().unwrap_or(1);
    let Some((mut ls, regs)) = registered_locals(options, max) else {
        return;
    };
    let access = Access {
        input: true,
        output: true,
        ..Access::NONE
    };
    for &op in ops {
        let call = Call::new(op, DataType::F32, 4096);
        let in_place = Access {
            in_place: true,
            ..access
        };
        expect(
            op,
            &ls[0].comm.plan_with(&call, access),
            &ls[0].comm.plan_with(&call, in_place),
        );
    }
    let s = run_matrix(&mut ls, ops, &counts);
    deregister_locals(&ls, regs);
    s.assert_exact("registered");
}

/// Communicators with `options` and buffers of `max` elements on every rank, each rank's input
/// and output registered on every rank (inputs first); `None` where the communicators cannot
/// register (host-staged, `P2P_DISABLE=1`), after checking that registration is refused.
fn registered_locals(options: Options, max: usize) -> Option<(Vec<Local>, Vec<Registration>)> {
    let ls = locals(options, max);
    if !ls[0].comm.sharing().is_p2p() {
        assert_registration_refused(&ls);
        return None;
    }
    let regs: Vec<_> = [0, 1]
        .iter()
        .flat_map(|&pick| {
            let bufs: Vec<&dyn DeviceMemory> = ls
                .iter()
                .map(|l| {
                    if pick == 0 {
                        &l.input as &dyn DeviceMemory
                    } else {
                        &l.output
                    }
                })
                .collect();
            // SAFETY: the buffers live in `ls`; the caller deregisters them
            // (`deregister_locals`) before it drops `ls`.
            unsafe { register_locals(&ls, &bufs) }
        })
        .collect();
    Some((ls, regs))
}

/// Drops what `registered_locals` registered.
fn deregister_locals(ls: &[Local], regs: Vec<Registration>) {
    // `register_all` gives one registration per rank, in rank order, per buffer set.
    for (i, reg) in regs.into_iter().enumerate() {
        ls[i % ls.len()].comm.deregister(reg).expect("deregister");
    }
}

/// The relayed all-reduce, reduce and broadcast (forced) on registered buffers at 64 Mi f32
/// elements (256 MiB a buffer), in and out of place, sum, root 1, each against the host's
/// reference: the size the matrices leave out. Broadcast and reduce run the relay on more than
/// two ranks only.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_relay_at_64_mi_elements() {
    let count = 1 << 26;
    let options = Options {
        forced: Forced::algo(Algo::Relay),
        ..without_ll(|_| {})
    };
    let Some((mut ls, regs)) = registered_locals(options, count) else {
        return;
    };
    let n = ls.len();
    let registered = Access {
        input: true,
        output: true,
        ..Access::NONE
    };
    let mut sum = common::Summary::default();
    for op in [Op::AllReduce, Op::Reduce, Op::Broadcast] {
        for in_place in [false, true] {
            let call = Call {
                op,
                dtype: DataType::F32,
                count,
                redop: RedOp::Sum,
                root: 1 % n,
            };
            let access = Access {
                in_place,
                ..registered
            };
            let plan = ls[0].comm.plan_with(&call, access);
            let relayed = n > 2 || op == Op::AllReduce;
            assert_eq!(plan.algo == Algo::Relay, relayed, "{op}: {plan:?}");
            let (wrong, detail) = run_case(&mut ls, &call, in_place);
            sum.cases += 1;
            sum.wrong += wrong;
            if wrong > 0 {
                sum.failures
                    .push(format!("{op} in place {in_place}: {wrong} wrong {detail}"));
            }
        }
    }
    deregister_locals(&ls, regs);
    sum.assert_exact("relay at 64 Mi elements");
}

/// `register_all` of the outputs of `ls`.
///
/// # Safety
/// As `Communicator::register_all`.
unsafe fn register_outputs(ls: &[Local]) -> Vec<Registration> {
    let bufs: Vec<&dyn DeviceMemory> = ls.iter().map(|l| &l.output as &dyn DeviceMemory).collect();
    // SAFETY: forwarded from the caller.
    unsafe { register_locals(ls, &bufs) }
}

/// Host-staged (`P2P_DISABLE=1`): `register_all` of the inputs of `ls` is refused, saying why.
fn assert_registration_refused(ls: &[Local]) {
    let bufs: Vec<&dyn DeviceMemory> = ls.iter().map(|l| &l.input as &dyn DeviceMemory).collect();
    let comms: Vec<&Communicator> = ls.iter().map(|l| &l.comm).collect();
    // SAFETY: nothing is registered (the call fails); the buffers outlive it anyway.
    let e = unsafe { Communicator::register_all(&comms, &bufs) }.expect_err("host-staged");
    assert!(e.to_string().contains("no P2P"), "{e}");
}

/// `register_all` over the communicators inside `Local`s.
///
/// # Safety
/// As `Communicator::register_all`.
unsafe fn register_locals(ls: &[Local], bufs: &[&dyn DeviceMemory]) -> Vec<Registration> {
    let comms: Vec<&Communicator> = ls.iter().map(|l| &l.comm).collect();
    // SAFETY: forwarded from the caller.
    unsafe { Communicator::register_all(&comms, bufs) }.expect("register_all")
}

/// What registration refuses, on every rank at once: buffers of different sizes, a buffer on
/// another GPU, an overlap with a registered buffer; and deregistering twice, or another
/// communicator's registration.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_registration_refuses_what_it_cannot_map() {
    // Registration needs P2P: this test is about its checks, so not from the environment.
    let (devices, comms) = world_comms(Options::default());
    let n = devices.len();
    let bufs: Vec<DeviceBuffer<u8>> = devices
        .iter()
        .enumerate()
        .map(|(r, d)| DeviceBuffer::new(d, 4096 + if r == 1 { 16 } else { 0 }).expect("buffer"))
        .collect();
    let refs = as_memory(&bufs);
    // SAFETY: every buffer outlives the communicators' use of it (each attempt is refused or
    // deregistered below).
    let e = unsafe { Communicator::register_all(&comms, &refs) }.expect_err("sizes differ");
    assert!(e.to_string().contains("same size"), "{e}");
    let same: Vec<DeviceBuffer<u8>> = devices
        .iter()
        .map(|d| DeviceBuffer::new(d, 4096).expect("buffer"))
        .collect();
    let mut swapped = as_memory(&same);
    swapped.swap(0, 1);
    // Ranks sharing one GPU (P2PTEST_SHARE_GPU=1): every buffer is on the right GPU.
    if devices[0] != devices[1] {
        // SAFETY: as above.
        let e = unsafe { Communicator::register_all(&comms, &swapped) }.expect_err("wrong GPU");
        assert!(e.to_string().contains("is on GPU"), "{e}");
    }
    let ok = as_memory(&same);
    // SAFETY: `same` outlives the registration (deregistered below).
    let regs = unsafe { Communicator::register_all(&comms, &ok) }.expect("register");
    assert_eq!(regs.len(), n);
    let halves: Vec<_> = same
        .iter()
        .map(|b| b.slice(1024..2048).expect("view"))
        .collect();
    let halves = as_memory(&halves);
    // SAFETY: refused before anything is mapped.
    let e = unsafe { Communicator::register_all(&comms, &halves) }.expect_err("overlap");
    assert!(e.to_string().contains("overlap"), "{e}");
    // Another communicator's registration is not one of this one's, though each is the first
    // its communicator made.
    let comms2 = Communicator::init_all_with(&devices, Options::default()).expect("init_all again");
    let other: Vec<DeviceBuffer<u8>> = devices
        .iter()
        .map(|d| DeviceBuffer::new(d, 4096).expect("buffer"))
        .collect();
    let other_refs = as_memory(&other);
    // SAFETY: `other` outlives the registration (deregistered below).
    let regs2 = unsafe { Communicator::register_all(&comms2, &other_refs) }.expect("register");
    let e = comms2[0]
        .deregister(regs[0])
        .expect_err("the first communicators' registration");
    assert!(e.to_string().contains("not registered"), "{e}");
    for (c, reg) in comms2.iter().zip(regs2.iter()) {
        c.deregister(*reg)
            .expect("deregister on the second communicators");
    }
    for (c, reg) in comms.iter().zip(regs.iter()) {
        c.deregister(*reg).expect("deregister");
    }
    let e = comms[0].deregister(regs[0]).expect_err("twice");
    assert!(e.to_string().contains("not registered"), "{e}");
    // A process-per-GPU registration on an init_all communicator says which call to use.
    // SAFETY: refused before anything is mapped.
    let e = unsafe { comms[0].register(&same[0]) }.expect_err("wrong API");
    assert!(e.to_string().contains("register_all"), "{e}");
}

/// 100 back-to-back calls of each collective (small: LL) captured in one CUDA graph per rank
/// and replayed twice with nothing between the calls, as the benchmark times them: a rank that
/// can run more than one call ahead (LL broadcast's root once could) overwrites lines its
/// peers have not read and stalls them. Roots rotate; every output is checked after.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_back_to_back_calls_under_graph_never_stall() {
    let n = world();
    let count = 1023;
    let options = Options {
        timeout: Duration::from_secs(5),
        ..env_options()
    };
    let mut ls = locals(options, count);
    for op in Op::ALL {
        for root in 0..if op.rooted() { n } else { 1 } {
            let call = Call::new(op, DataType::F32, count).root(root);
            assert_eq!(ls[0].comm.plan(&call).proto, Proto::Ll, "{op}");
            // One checked call sets the inputs (and checks the path once).
            let (wrong, detail) = run_case(&mut ls, &call, false);
            assert_eq!(wrong, 0, "{op} root {root}: {detail}");
            let mut graphs = Vec::new();
            for l in ls.iter_mut() {
                graphs.push(capture(&l.stream, || {
                    for _ in 0..100 {
                        l.comm
                            .call(&call, &l.input, &mut l.output, &l.stream)
                            .expect("capture");
                    }
                }));
            }
            let execs: Vec<_> = graphs
                .into_iter()
                .map(|g| g.instantiate().expect("instantiate"))
                .collect();
            for _ in 0..2 {
                for (g, l) in execs.iter().zip(&ls) {
                    // SAFETY: the captured calls use `ls`'s communicators and buffers, alive
                    // until the end of the test and synchronised before they are read.
                    unsafe { g.launch(&l.stream) }.expect("replay");
                }
            }
            for l in &ls {
                l.comm
                    .synchronize(&l.stream)
                    .unwrap_or_else(|e| panic!("{op} root {root}: {e}"));
                let r = l.comm.rank();
                let (off, len) = p2p_collective::verify::result_region(&call, n, r, false);
                if len == 0 {
                    continue;
                }
                let got = l
                    .output
                    .slice(off * 4..(off + len) * 4)
                    .expect("view")
                    .to_host_vec::<u8>()
                    .expect("read back");
                let (w, first) = p2p_collective::verify::compare(DataType::F32, &got, |j| {
                    p2p_collective::verify::expected(&call, n, r, false, j)
                });
                assert_eq!(w, 0, "{op} root {root} rank {r}: {first:?}");
            }
        }
    }
    eprintln!("200 back-to-back LL calls of every collective under graph on {n} ranks: 0 wrong");
}

/// The peer layer decides how ranks reach each other: plain pointers where every pair has P2P
/// (both machines here), host memory with `P2P_DISABLE=1`; the host-staged communicator gives
/// right results for every collective, and refuses registration saying why.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_sharing_follows_the_configuration() {
    let (devices, p2p) = world_comms(Options::default());
    assert_eq!(p2p[0].sharing(), Sharing::Pointer);
    drop(p2p);
    let host = Options {
        transport: Config {
            p2p_disable: true,
            ..Config::default()
        },
        ..Options::default()
    };
    let counts = [1, 1023, 65537];
    let mut ls: Vec<Local> = Communicator::init_all_with(&devices, host)
        .expect("init_all host-staged")
        .into_iter()
        .map(|c| Local::new(c, 65537))
        .collect();
    assert!(ls.iter().all(|l| l.comm.sharing() == Sharing::HostStaged));
    run_matrix(&mut ls, &Op::ALL, &counts).assert_exact("host-staged");
    assert_registration_refused(&ls);
}

/// Send/recv like the collectives: every type, every count (rings of each lane wrapped), a ring
/// exchange with `send_recv` and a plain `send` / `recv` pair; then groups like NCCL's: every
/// rank sends a message of its own size to every rank (itself included) and a second one to the
/// next rank, all in one group with an all-reduce. Byte-exact.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_send_recv_matrix() {
    let counts = common::p2p_counts();
    let max = counts.iter().copied().max().unwrap_or(1);
    // Twice the largest count: the group matrix sends n + 1 messages per rank.
    let mut ls = locals(env_options(), 2 * max);
    // One after the other, each reported before the next runs.
    for what in ["send/recv", "groups"] {
        let s = if what == "groups" {
            common::run_p2p_group_matrix(&mut ls, &counts)
        } else {
            common::run_p2p_matrix(&mut ls, &counts)
        };
        s.assert_exact(what);
    }
}

/// Replays every rank's graph `replays` times: each time fills rank r's input with
/// `input(k, r)`, poisons its output, replays, and compares every output element with
/// `want(k, r, j)`.
///
/// # Safety
/// The graphs may only use the communicators and the buffers given here, alive throughout.
unsafe fn replay_and_check(
    (comms, streams, graphs): (&[Communicator], &[Stream], &[p2p_mem::graph::GraphExec]),
    (ins, outs): (&mut [DeviceBuffer<f32>], &mut [DeviceBuffer<f32>]),
    replays: usize,
    input: impl Fn(usize, usize) -> Vec<f32>,
    want: impl Fn(usize, usize, usize) -> f32,
) {
    let n = comms.len();
    for k in 0..replays {
        for r in 0..n {
            ins[r].copy_from_host(&input(k, r)).expect("input");
            outs[r].memset_u8(0xff).expect("poison");
        }
        // SAFETY: the caller's contract: what the graphs use is alive, and synchronised
        // below before the host touches it again.
        unsafe { launch_all(streams, graphs) };
        for r in 0..n {
            comms[r].synchronize(&streams[r]).expect("sync");
            let got = outs[r].to_host_vec::<f32>().expect("read");
            let wrong = (0..got.len()).filter(|&j| got[j] != want(k, r, j)).count();
            assert_eq!(wrong, 0, "replay {k}, rank {r}");
        }
    }
}

/// An all-to-all written as a group, captured once in a CUDA graph and replayed with new
/// inputs; then groups the host refuses (a message to itself with no receive, too many
/// operations) queue nothing and leave the communicator usable.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_group_all_to_all_under_graph_and_refused_groups() {
    let (devices, comms) = world_comms(env_options());
    let n = comms.len();
    // f32 per pair: over 4 MiB, so every lane wraps its two slots within one replay and the
    // senders wait for the receivers inside the graph.
    let part = 1_100_003;
    let (streams, mut ins, mut outs) = streams_and_buffers(&devices, part * n);
    // Ranks sharing a GPU may have too few blocks for a group that receives from every other
    // rank: then check that it is refused instead (the rest needs such a group).
    let refused: Vec<bool> = comms
        .iter()
        .zip(&streams)
        .map(|(c, s)| common::group_to_all_refused(c, s).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    if refused.iter().any(|&r| r) {
        assert!(
            refused.iter().all(|&r| r),
            "refused on some ranks only: {refused:?}"
        );
        return;
    }
    let mut graphs = Vec::new();
    for r in 0..n {
        let mut recv_parts = Vec::new();
        let mut rest = outs[r].slice_mut(..).expect("out");
        for _ in 0..n {
            let (p, tail) = rest.split_at_mut(part).expect("split");
            recv_parts.push(p);
            rest = tail;
        }
        let send_parts: Vec<_> = (0..n)
            .map(|p| ins[r].slice(p * part..(p + 1) * part).expect("in"))
            .collect();
        let graph = capture(&streams[r], || {
            let mut g = comms[r].group(&streams[r]);
            for (p, v) in recv_parts.iter_mut().enumerate() {
                g.recv(v, part, DataType::F32, p).expect("recv");
            }
            for (p, v) in send_parts.iter().enumerate() {
                g.send(v, part, DataType::F32, p).expect("send");
            }
            g.launch().expect("capture the group");
        });
        graphs.push(graph.instantiate().expect("instantiate"));
    }
    // Rank r's part for rank p in replay k.
    let value =
        |k: usize, r: usize, p: usize, i: usize| ((i * 7 + k * 31 + r * 5 + p * 3) % 2000) as f32;
    // SAFETY: the captured groups use `comms`, `ins` and `outs`, which outlive the replays.
    unsafe {
        replay_and_check(
            (&comms, &streams, &graphs),
            (&mut ins, &mut outs),
            5,
            |k, r| {
                (0..n)
                    .flat_map(|p| (0..part).map(move |i| value(k, r, p, i)))
                    .collect()
            },
            |k, r, j| value(k, j / part, r, j % part),
        )
    };
    eprintln!("5 replays of an all-to-all group of {part} f32 per pair on {n} ranks: 0 wrong");
    // Refused before anything is queued.
    let a = DeviceBuffer::from_host(&devices[0], &[3.0f32; 64]).expect("buf");
    let mut g = comms[0].group(&streams[0]);
    g.send(&a, 64, DataType::F32, 0)
        .expect("a send to itself is added");
    let e = g.launch().expect_err("no receive from itself");
    eprintln!("{e}");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("to itself"), "{e}");
    let mut g = comms[0].group(&streams[0]);
    for _ in 0..=p2p_collective::p2p::MAX_GROUP_OPS {
        g.send(&a, 64, DataType::F32, 1).expect("added");
    }
    let e = g.launch().expect_err("too many");
    eprintln!("{e}");
    assert!(e.to_string().contains("at most"), "{e}");
    // Still usable: one more exchange with sizes that differ per direction.
    let mut b = DeviceBuffer::<f32>::zeroed(&devices[1], 64).expect("buf");
    let mut a_in = DeviceBuffer::<f32>::zeroed(&devices[0], 32).expect("buf");
    let b_out = DeviceBuffer::from_host(&devices[1], &[5.0f32; 32]).expect("buf");
    let mut g0 = comms[0].group(&streams[0]);
    g0.send(&a, 64, DataType::F32, 1).expect("send");
    g0.recv(&mut a_in, 32, DataType::F32, 1).expect("recv");
    g0.launch().expect("launch");
    let mut g1 = comms[1].group(&streams[1]);
    g1.recv(&mut b, 64, DataType::F32, 0).expect("recv");
    g1.send(&b_out, 32, DataType::F32, 0).expect("send");
    g1.launch().expect("launch");
    comms[0].synchronize(&streams[0]).expect("sync");
    comms[1].synchronize(&streams[1]).expect("sync");
    assert_eq!(a_in.to_host_vec::<f32>().expect("read"), vec![5.0f32; 32]);
    assert_eq!(b.to_host_vec::<f32>().expect("read"), vec![3.0f32; 64]);
    drop(comms);
    // Two messages to one peer received in the other order: a mismatch, by size (lane 0 meets
    // the small message where it expects the large) or by message number (lane 1 meets the
    // large message's second chunk where it expects the first message), whichever lane sees it
    // first.
    let comms = short_pair(&devices);
    let small = DeviceBuffer::<f32>::zeroed(&devices[0], 1 << 14).expect("buf");
    let large = DeviceBuffer::<f32>::zeroed(&devices[0], 1 << 15).expect("buf");
    let mut small_in = DeviceBuffer::<f32>::zeroed(&devices[1], 1 << 14).expect("buf");
    let mut large_in = DeviceBuffer::<f32>::zeroed(&devices[1], 1 << 15).expect("buf");
    let mut g0 = comms[0].group(&streams[0]);
    g0.send(&small, 1 << 14, DataType::F32, 1).expect("send");
    g0.send(&large, 1 << 15, DataType::F32, 1).expect("send");
    g0.launch().expect("launch");
    let mut g1 = comms[1].group(&streams[1]);
    g1.recv(&mut large_in, 1 << 15, DataType::F32, 0)
        .expect("recv");
    g1.recv(&mut small_in, 1 << 14, DataType::F32, 0)
        .expect("recv");
    g1.launch().expect("launch");
    let e = comms[1].synchronize(&streams[1]).expect_err("out of order");
    eprintln!("{e}");
    assert!(matches!(e, Error::Mismatch { peer: 0, .. }), "{e:?}");
    let _ = comms[0].synchronize(&streams[0]);
}

/// A ring exchange captured once in a CUDA graph and replayed with new inputs: the lanes'
/// counters live on the GPU, so every replay lines up.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_send_recv_graph_replay() {
    let (devices, comms) = world_comms(env_options());
    let n = comms.len();
    let count = 1_500_001; // 6 MB of f32: every lane wraps its ring
    let (streams, mut ins, mut outs) = streams_and_buffers(&devices, count);
    let mut graphs = Vec::new();
    for r in 0..n {
        let graph = capture(&streams[r], || {
            comms[r]
                .send_recv(
                    &ins[r],
                    (r + 1) % n,
                    &mut outs[r],
                    (r + n - 1) % n,
                    count,
                    DataType::F32,
                    &streams[r],
                )
                .expect("capture send_recv");
        });
        graphs.push(graph.instantiate().expect("instantiate"));
    }
    let value = |replay: usize, r: usize, i: usize| ((i * 3 + replay * 17 + r * 5) % 1000) as f32;
    // SAFETY: the captured calls use `comms`, `ins` and `outs`, which outlive the replays.
    unsafe {
        replay_and_check(
            (&comms, &streams, &graphs),
            (&mut ins, &mut outs),
            10,
            |k, r| (0..count).map(|i| value(k, r, i)).collect(),
            |k, r, i| value(k, (r + n - 1) % n, i),
        )
    };
    // A rough figure (host clock around 50 replays, after the checked ones): the benchmark
    // beside NCCL is not built yet.
    let t = Instant::now();
    for _ in 0..50 {
        // SAFETY: the captured calls use `comms`, `ins` and `outs`, alive until the end of the
        // test and synchronised below.
        unsafe { launch_all(&streams, &graphs) };
    }
    synchronize_all(&comms, &streams);
    let per = t.elapsed() / 50;
    eprintln!(
        "10 replays of a send_recv ring of {count} f32 on {n} ranks: 0 wrong; then {per:?} per exchange, {:.1} GB/s per direction",
        (count * 4) as f64 / per.as_secs_f64() / 1e9
    );
}

/// Queues rank 0's send of `sent` f32 of `src` to rank 1 and rank 1's receive of `wanted` f32
/// into `dst`, each on its rank's stream.
fn send_0_to_1(
    comms: &[Communicator],
    streams: [&Stream; 2],
    (src, sent): (&DeviceBuffer<f32>, usize),
    (dst, wanted): (&mut DeviceBuffer<f32>, usize),
) {
    comms[0]
        .send(src, sent, DataType::F32, 1, streams[0])
        .expect("send");
    comms[1]
        .recv(dst, wanted, DataType::F32, 0, streams[1])
        .expect("recv");
}

/// Rank 1's wait on `stream` fails (`what`: why it must) with a mismatch with rank 0 that names
/// the receive of `wanted` bytes and the send of `sent` bytes.
fn assert_sizes_mismatch(
    comm: &Communicator,
    stream: &Stream,
    what: &str,
    wanted: usize,
    sent: usize,
) {
    let e = comm.synchronize(stream).expect_err(what);
    eprintln!("{e}");
    assert!(matches!(e, Error::Mismatch { peer: 0, .. }), "{e:?}");
    assert!(
        e.to_string().contains(&format!("recv of {wanted} bytes"))
            && e.to_string().contains(&format!("send of {sent} bytes")),
        "{e}"
    );
}

/// Send/recv errors: bad arguments are refused before anything is queued; a receive of another
/// size than the send is a mismatch naming both sizes; a receive nobody sends to times out
/// naming the peer; afterwards the communicator refuses calls.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_send_recv_errors_are_named() {
    let devices = gpus(2);
    let stream0 = Stream::new(&devices[0]).expect("stream");
    let stream1 = Stream::new(&devices[1]).expect("stream");
    let comms = short_pair(&devices);
    let mut a = DeviceBuffer::<f32>::zeroed(&devices[0], 1000).expect("buf");
    let mut b = DeviceBuffer::<f32>::zeroed(&devices[1], 1000).expect("buf");
    // Bad arguments.
    let mut refused = vec![
        comms[0]
            .send(&a, 1000, DataType::F32, 2, &stream0)
            .expect_err("peer out of range"),
        comms[0]
            .send(&a, 1000, DataType::F32, 0, &stream0)
            .expect_err("self"),
        comms[0]
            .send(&a, 1001, DataType::F32, 1, &stream0)
            .expect_err("too small"),
    ];
    // Ranks sharing one GPU (P2PTEST_SHARE_GPU=1) have no other GPU to name.
    if devices[0] != devices[1] {
        refused.push(
            comms[0]
                .recv(&mut a, 10, DataType::F32, 1, &stream1)
                .expect_err("stream on GPU 1"),
        );
        refused.push(
            comms[0]
                .send(&b, 10, DataType::F32, 1, &stream0)
                .expect_err("buffer on GPU 1"),
        );
    }
    for e in refused {
        eprintln!("{e}");
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    }
    let streams = [&stream0, &stream1];
    // Zero counts still pair up: an empty message travels, so both sides agree.
    send_0_to_1(&comms, streams, (&a, 0), (&mut b, 0));
    comms[0].synchronize(&stream0).expect("send 0");
    comms[1].synchronize(&stream1).expect("recv 0");
    // A count of 0 against 100 is a mismatch, not a silent shift of later messages.
    send_0_to_1(&comms, streams, (&a, 0), (&mut b, 100));
    assert_sizes_mismatch(&comms[1], &stream1, "0 against 100", 400, 0);
    let again = comms[1]
        .recv(&mut b, 200, DataType::F32, 0, &stream1)
        .expect_err("unusable");
    assert!(matches!(again, Error::Unusable { .. }), "{again:?}");
    let _ = comms[0].synchronize(&stream0);
    drop(comms);
    // A sender larger than the inbox whose receiver expects less: the receiver names the sizes
    // and the sender, waiting for slots that are never freed, stops at once instead of at its
    // time limit.
    let comms = short_pair(&devices);
    // Twice the inbox, in f32 elements.
    let big_count = 2 * p2p_collective::p2p::INBOX_BYTES / 4;
    let big = DeviceBuffer::<f32>::zeroed(&devices[0], big_count).expect("buf");
    let mut half = DeviceBuffer::<f32>::zeroed(&devices[1], big_count / 2).expect("buf");
    send_0_to_1(
        &comms,
        streams,
        (&big, big_count),
        (&mut half, big_count / 2),
    );
    let (sent, wanted) = (big_count * 4, big_count * 2);
    assert_sizes_mismatch(&comms[1], &stream1, "mismatch", wanted, sent);
    let e = comms[0]
        .synchronize(&stream0)
        .expect_err("the sender is stopped");
    eprintln!("{e}");
    // The receiver's kernel stopped it, naming itself and the sender.
    assert!(
        e.to_string().contains(
            "rank 1's collective kernel found that rank 0 made a different (mismatched) call"
        ),
        "{e}"
    );
    drop(comms);
    // A small receive (its chunks travel as LL lines) against a large send (copied chunks):
    // the header of the first chunk names both sizes, whatever path each side takes.
    let comms = short_pair(&devices);
    let large = DeviceBuffer::<f32>::zeroed(&devices[0], 1 << 20).expect("buf");
    let mut small = DeviceBuffer::<f32>::zeroed(&devices[1], 1000).expect("buf");
    send_0_to_1(&comms, streams, (&large, 1 << 20), (&mut small, 1000));
    assert_sizes_mismatch(&comms[1], &stream1, "LL against copied", 4000, 4194304);
    let _ = comms[0].synchronize(&stream0);
    drop(comms);
    // A receive that nobody answers.
    let comms = short_pair(&devices);
    let t = Instant::now();
    comms[0]
        .recv(&mut a, 1000, DataType::F32, 1, &stream0)
        .expect("recv");
    let e = comms[0].synchronize(&stream0).expect_err("must time out");
    eprintln!("{e} (after {:?})", t.elapsed());
    assert_rank0_stalled_on_rank1(&e);
    assert!(
        e.to_string().contains("recv") && e.to_string().contains("timed out"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
}
