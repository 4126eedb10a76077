//! Collectives with one process per GPU: this test launches itself once per rank through
//! `p2p_collective::launch` (as `p2p-bench launch` does), and each process joins through the
//! environment (`Communicator::from_env`). Ignored in CI; the bundle's run.sh runs it.

mod common;

use common::{counts, launch_or_run, launch_or_run_comm, run_matrix, world, Local};
use p2p_collective::{Collectives, Communicator, Op};
use p2p_transport::peer::Sharing;

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_process_per_gpu_matrix() {
    launch_or_run_comm("gpu2_process_per_gpu_matrix", |comm, rank| {
        // Between processes: cuMem fds by default, legacy IPC with P2P_CUMEM=0, host memory
        // with P2P_DISABLE=1 or P2P_LEVEL=LOC (the GPU machines' pairs are NVLink, which every
        // other level allows; the bundle's scripts run all four).
        let cfg = p2p_transport::config::Config::from_env().expect("settings");
        let expected = if cfg.p2p_disable || cfg.p2p_level == p2p_transport::config::PathLevel::Loc
        {
            Sharing::HostStaged
        } else if !cfg.cumem {
            Sharing::LegacyIpc
        } else {
            Sharing::CuMem
        };
        assert_eq!(comm.sharing(), expected, "rank {rank}");
        eprintln!(
            "rank {rank}: workspaces shared via {}",
            comm.sharing().name()
        );
        let counts = counts();
        let max = counts.iter().copied().max().unwrap_or(1);
        let mut ls = vec![Local::new(comm, max)];
        run_matrix(&mut ls, &Op::ALL, &counts).assert_exact(&format!("rank {rank}"));
    });
}

/// Send/recv between processes: every type and count, a ring exchange with `send_recv` and a
/// plain `send` / `recv` pair, then groups (every rank to every rank, itself included, with an
/// all-reduce in the group), byte-exact, through the sharing the configuration gives.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_process_per_gpu_send_recv() {
    launch_or_run_comm("gpu2_process_per_gpu_send_recv", |comm, rank| {
        let counts = common::p2p_counts();
        let max = counts.iter().copied().max().unwrap_or(1);
        // Twice the largest count: the group matrix sends n + 1 messages per rank.
        let mut ls = vec![Local::new(comm, 2 * max)];
        // One after the other, each reported before the next runs.
        for what in ["send/recv", "groups"] {
            let s = if what == "groups" {
                common::run_p2p_group_matrix(&mut ls, &counts)
            } else {
                common::run_p2p_matrix(&mut ls, &counts)
            };
            s.assert_exact(&format!(
                "rank {rank}: {what} ({})",
                ls[0].comm.sharing().name()
            ));
        }
    });
}

/// Every collective on buffers each process registered (`Communicator::register`, through CUDA
/// IPC), LL off and the direct threshold lowered so that the direct kernels run wherever the
/// planner allows them (16-byte aligned parts).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_process_per_gpu_registered_matrix() {
    registered_matrix(
        "gpu2_process_per_gpu_registered_matrix",
        &Op::ALL,
        |t| t.direct_min_bytes = 0,
        false,
    );
}

/// The copy-engine plans (`ce_min_bytes`, `ce_min_bytes_more_ranks` and
/// `ce_all_reduce_min_bytes` 0: all-gather, all-to-all out of place, and on two ranks
/// all-reduce out of place) on buffers each process registered: `cuMemcpyAsync` into the
/// peers' buffers and stream writes into their flags, as this process maps them.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_process_per_gpu_copy_engine_matrix() {
    registered_matrix(
        "gpu2_process_per_gpu_copy_engine_matrix",
        &[Op::AllReduce, Op::AllGather, Op::AllToAll],
        |t| {
            t.ce_min_bytes = 0;
            t.ce_min_bytes_more_ranks = 0;
            t.ce_all_reduce_min_bytes = 0;
        },
        true,
    );
}

/// `ops` on registered input and output buffers in every process (test `name`, run under the
/// launcher), LL off and the tuning changed by `change`; with `ce`, first checks that an
/// all-gather (in and out of place), an all-to-all out of place and (on two ranks) an
/// all-reduce out of place are planned for the copy engines there.
fn registered_matrix(
    name: &str,
    ops: &[Op],
    change: fn(&mut p2p_collective::plan::Tuning),
    ce: bool,
) {
    launch_or_run(name, || {
        let rv = p2p_collective::Rendezvous::from_env().expect("rendezvous");
        let visible = p2p_mem::Device::count().expect("devices") as usize;
        let device = p2p_mem::Device::new(if visible == 1 { 0 } else { rv.local_rank } as i32)
            .expect("device");
        let mut tuning = p2p_collective::plan::Tuning::for_device(device.sm_count(), 2);
        tuning.ll_max_bytes = 0;
        change(&mut tuning);
        let options = p2p_collective::Options {
            tuning: Some(tuning),
            ..p2p_collective::Options::from_env().expect("settings")
        };
        let comm = Communicator::init(&device, &rv, options).expect("init");
        let rank = comm.rank();
        if !comm.sharing().is_p2p() {
            // Host-staged (P2P_DISABLE=1): registration is refused, saying why.
            let buf = p2p_mem::DeviceBuffer::<u8>::new(&device, 4096).expect("buffer");
            // SAFETY: nothing is registered (the call fails); the buffer outlives it anyway.
            let e = unsafe { comm.register(&buf) }.expect_err("host-staged");
            assert!(e.to_string().contains("no P2P"), "{e}");
            return;
        }
        let mut counts = counts();
        counts.extend([4096, 65536]); // parts 16-byte aligned: the direct kernels
        let max = counts.iter().copied().max().unwrap_or(1);
        let mut ls = vec![Local::new(comm, max)];
        // SAFETY: both buffers live in `ls` and are deregistered below, before it drops.
        let regs = unsafe {
            [
                ls[0].comm.register(&ls[0].input).expect("register input"),
                ls[0].comm.register(&ls[0].output).expect("register output"),
            ]
        };
        if ce {
            use p2p_collective::plan::{Access, Proto};
            // Whether the copy engines run the call.
            let ce = |op, in_place| {
                let call = p2p_collective::Call::new(op, p2p_collective::DataType::F32, 4096);
                let access = Access {
                    input: true,
                    output: true,
                    in_place,
                    unaligned: false,
                };
                ls[0].comm.plan_with(&call, access).proto == Proto::CopyEngine
            };
            assert!(ce(Op::AllGather, true));
            assert!(ce(Op::AllGather, false));
            let two = ls[0].comm.world_size() == 2;
            assert_eq!(ce(Op::AllReduce, false), two);
            assert!(ce(Op::AllToAll, false));
        }
        let s = run_matrix(&mut ls, ops, &counts);
        for reg in regs {
            ls[0].comm.deregister(reg).expect("deregister");
        }
        s.assert_exact(&format!("rank {rank}: registered ({name})"));
    });
}

/// A rank that is SIGKILLed after a good all-reduce: every survivor's next call fails within a
/// second with an error naming it (found through the rendezvous connection, not the kernels'
/// 30 s time limit), and the survivor's drop returns at once. Runs its own processes (the
/// launcher would stop the survivors when the victim dies).
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_a_killed_rank_is_reported_to_every_survivor_within_a_second() {
    const NAME: &str = "gpu2_a_killed_rank_is_reported_to_every_survivor_within_a_second";
    let world = world();
    let victim = world - 1;
    if let Ok(rank) = std::env::var("RANK") {
        let rank: usize = rank.parse().expect("RANK");
        let comm = Communicator::from_env().expect("from_env");
        let stream = p2p_mem::Stream::new(comm.device()).expect("stream");
        let n = 1 << 20;
        let mut buf =
            p2p_mem::DeviceBuffer::<f32>::from_host(comm.device(), &vec![1.0; n]).expect("buffer");
        let sum = |c: &Communicator, b: &mut p2p_mem::DeviceBuffer<f32>| {
            c.all_reduce_in_place(
                b,
                n,
                p2p_collective::DataType::F32,
                p2p_collective::RedOp::Sum,
                &stream,
            )
            .and_then(|()| c.synchronize(&stream))
        };
        sum(&comm, &mut buf).expect("the first all-reduce");
        if rank == victim {
            std::thread::sleep(std::time::Duration::from_millis(200));
            eprintln!("rank {rank}: killing myself");
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            unreachable!("SIGKILL does not return");
        }
        // The survivors are already waiting inside the next call when the victim dies.
        let t = std::time::Instant::now();
        let e = sum(&comm, &mut buf).expect_err("the victim is dead");
        let took = t.elapsed();
        eprintln!("rank {rank}: {e} (after {took:?})");
        assert!(
            e.to_string().contains(&format!("rank {victim} failed")),
            "{e}"
        );
        // 200 ms of the wait is the victim's sleep before it dies.
        assert!(took < std::time::Duration::from_millis(1200), "{took:?}");
        let t = std::time::Instant::now();
        drop(comm);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "drop took {:?}",
            t.elapsed()
        );
        return;
    }
    let children = spawn_ranks(NAME, "kill", |_| None);
    for (r, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait");
        if r == victim {
            assert!(!status.success(), "the victim must die");
        } else {
            assert!(status.success(), "survivor rank {r}: {status}");
        }
    }
}

/// Starts `world()` copies of this test executable running test `name` as the ranks of one job
/// (`tag` names it), each with the launcher's variables and `extra(rank)` set, if any.
fn spawn_ranks(
    name: &str,
    tag: &str,
    extra: impl Fn(usize) -> Option<(&'static str, &'static str)>,
) -> Vec<std::process::Child> {
    let world = world();
    let exe = std::env::current_exe().expect("current exe");
    let job = format!("test-{tag}-{}", std::process::id());
    (0..world)
        .map(|r| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([
                name,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("P2P_JOB_ID", &job)
            .env("P2P_JOB_SECRET", "a secret for this test only")
            .stdout(std::process::Stdio::null());
            if let Some((k, v)) = extra(r) {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect()
}

/// Ranks whose `P2P_ALGO` differs would run different kernels for one call (counters out of
/// step, wrong results with no error): every rank refuses at init, naming both settings.
#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_ranks_with_different_planner_settings_are_refused_at_init() {
    const NAME: &str = "gpu2_ranks_with_different_planner_settings_are_refused_at_init";
    if std::env::var_os("RANK").is_some() {
        let Err(e) = Communicator::from_env() else {
            panic!("init must refuse ranks that plan differently");
        };
        let msg = e.to_string();
        eprintln!("{msg}");
        assert!(
            msg.contains("P2P_ALGO=ring") && msg.contains("P2P_ALGO=auto"),
            "{msg}"
        );
        return;
    }
    let children = spawn_ranks(NAME, "planner", |r| {
        (r == 0).then_some(("P2P_ALGO", "ring"))
    });
    for (r, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("wait");
        assert!(status.success(), "rank {r}: {status}");
    }
}
