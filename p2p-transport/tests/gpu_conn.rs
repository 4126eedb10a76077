//! send / recv through connections, on real GPUs: in one process and between two processes
//! (legacy IPC and cuMem fds). Ignored in CI; the bundle's run.sh runs them. `gpu1_*` need one
//! GPU, `gpu2_*` two with P2P. Two-process tests re-run this executable with P2PTEST_ROLE set.

use p2p_testkit::{
    all_gpus as gpus, child_env as env, child_gpu, child_seed, fresh_seed as seed, parent_channel,
    random_u8 as random_bytes, role, spawn_connected,
};

use std::path::PathBuf;

use std::time::{Duration, Instant};

use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};
use p2p_transport::conn::{
    connect_in_process, connect_receiver, connect_sender, ConnOptions, Link, RecvConn, Sharing,
};
use p2p_transport::mode::{Direction, Engine};
use p2p_transport::rendezvous::{Group, Rendezvous, Secret};
use p2p_transport::Error;
use p2p_transport::Transport;

/// One end of a connection between processes.
fn link<'a>(
    transport: &'a Transport,
    device: &'a Device,
    chan: &'a FdChannel,
    sharing: Sharing,
    ranks: (usize, usize),
) -> Link<'a> {
    Link {
        transport,
        device,
        chan,
        sharing,
        ranks,
    }
}

const SIZES: [usize; 4] = [1, 4095, (1 << 20) + 3, 256 << 20];

/// How long a parent waits for its child process to connect.
const ACCEPT_LIMIT: Duration = Duration::from_secs(60);

/// At least `n` GPUs (every one there is) and a transport over them.
fn transport(n: usize) -> (Vec<Device>, Transport) {
    let g = gpus(n);
    let t = Transport::new(g.clone());
    (g, t)
}

/// The copy-engine shape: fewer, larger chunks, since each costs a wait and a flag write.
fn ce_options() -> ConnOptions {
    ConnOptions {
        engine: Engine::CopyEngine,
        slots: 32,
        slot_bytes: 4 << 20,
        ..ConnOptions::default()
    }
}

/// "sm", "ce", "sm-read" or "ce-read".
fn options_for(how: &str) -> ConnOptions {
    let base = if how.starts_with("ce") {
        ce_options()
    } else {
        ConnOptions::default()
    };
    let direction = if how.ends_with("-read") {
        Direction::Read
    } else {
        Direction::Write
    };
    ConnOptions { direction, ..base }
}

/// Every engine in both directions.
fn all_options() -> [ConnOptions; 4] {
    ["sm", "ce", "sm-read", "ce-read"].map(options_for)
}

/// Sends every size from `a` to `b` in one process, checking each message.
fn in_process(t: &Transport, a: &Device, b: &Device, opts: ConnOptions) {
    let (mut tx, mut rx) =
        connect_in_process(t, a, b, (a.ordinal() as usize, b.ordinal() as usize), opts)
            .expect("connect");
    let (sa, sb) = (
        Stream::new(a).expect("stream"),
        Stream::new(b).expect("stream"),
    );
    let s = seed();
    for (i, &n) in SIZES.iter().enumerate() {
        let msg = random_bytes(s + i as u64, n);
        let src = DeviceBuffer::from_host(a, &msg).expect("upload");
        let mut dst = DeviceBuffer::<u8>::new(b, n).expect("alloc");
        dst.memset_u8(0xee).expect("poison");
        rx.recv(&mut dst, &sb).expect("recv");
        tx.send(&src, &sa).expect("send");
        tx.wait(&sa).expect("send finished");
        rx.wait(&sb).expect("recv finished");
        let got = dst.to_host_vec::<u8>().expect("download");
        let wrong = got.iter().zip(&msg).filter(|(x, y)| x != y).count();
        assert_eq!(
            wrong,
            0,
            "GPU{} -> GPU{} message {i} of {n} bytes: {wrong} wrong",
            a.ordinal(),
            b.ordinal()
        );
    }
}

/// [`in_process`] with every engine in both directions, on each pair of GPUs (indices into the
/// first `n` or more) in turn.
fn in_process_with_every_option(n: usize, pairs: &[(usize, usize)]) {
    let (g, t) = transport(n);
    for opts in all_options() {
        for &(a, b) in pairs {
            in_process(&t, &g[a], &g[b], opts);
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_send_recv_in_process_odd_sizes_both_ways() {
    in_process_with_every_option(2, &[(0, 1), (1, 0)]);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_send_recv_on_one_gpu() {
    in_process_with_every_option(1, &[(0, 0)]);
}

/// `base` with a time limit of 300 ms, which [`assert_times_out`] expects.
fn within_300ms(base: ConnOptions) -> ConnOptions {
    ConnOptions {
        timeout: Duration::from_millis(300),
        ..base
    }
}

/// The receives queued on `rx` end in the 300 ms time-out (nobody sends), less than `limit`
/// after `t0` (`why`: why it must be that soon).
fn assert_times_out(rx: &mut RecvConn, s: &Stream, t0: Instant, limit: Duration, why: &str) {
    let e = rx.wait(s).expect_err("nobody sends");
    assert!(e.to_string().contains("timed out after 300ms"), "{e}");
    assert!(t0.elapsed() < limit, "took {:?}: {why}", t0.elapsed());
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_missing_peer_times_out_and_abort_stops_a_wait() {
    let (g, t) = transport(1);
    let opts = within_300ms(ConnOptions::default());
    let (_tx, mut rx) = connect_in_process(&t, &g[0], &g[0], (0, 1), opts).expect("connect");
    let s = Stream::new(&g[0]).expect("stream");
    let mut dst = DeviceBuffer::<u8>::new(&g[0], 1000).expect("alloc");
    rx.recv(&mut dst, &s).expect("queue recv");
    let e = rx.wait(&s).expect_err("nobody sends");
    assert!(
        matches!(
            e,
            // The receiving end of the pair (0, 1) is rank 1, waiting for rank 0.
            Error::Stalled {
                op: "recv",
                rank: 1,
                peer: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("timed out after 300ms waiting for the peer"),
        "{e}"
    );
    let e = rx
        .recv(&mut dst, &s)
        .expect_err("a failed connection refuses work");
    assert!(matches!(e, Error::Broken { .. }), "{e}");

    // Five receives queued before the wait, nobody sends: the first times out, the others find
    // the failure recorded and stop at once (one time limit in all, not five).
    let (_tx, mut rx) = connect_in_process(&t, &g[0], &g[0], (0, 1), opts).expect("connect");
    let t0 = Instant::now();
    for _ in 0..5 {
        rx.recv(&mut dst, &s).expect("queue recv");
    }
    let why = "the queued receives must drain after the first failure";
    assert_times_out(&mut rx, &s, t0, Duration::from_millis(1000), why);

    // Abort from another thread: a 30 s wait ends at once.
    let (_tx, mut rx) =
        connect_in_process(&t, &g[0], &g[0], (0, 1), ConnOptions::default()).expect("connect");
    let abort = rx.abort_handle();
    rx.recv(&mut dst, &s).expect("queue recv");
    let t0 = Instant::now();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        abort.abort();
    });
    let e = rx.wait(&s).expect_err("aborted");
    killer.join().expect("thread");
    assert!(e.to_string().contains("aborted"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "abort took {:?}",
        t0.elapsed()
    );
}

// ---- two processes ----------------------------------------------------------------------------

fn sharing_from(s: &str) -> Sharing {
    match s {
        "cumem" => Sharing::CuMem,
        "host" => Sharing::HostStaged,
        _ => Sharing::LegacyIpc,
    }
}

/// Parent: rank 0 on GPU 0 sends every size; the child, rank 1 on `child_gpu`, receives and checks.
fn sender_parent(test: &str, sharing: &str, child_gpu: i32, engine: &str) {
    let (g, t) = transport(child_gpu as usize + 1);
    let dir = PrivateDir::new("conn").expect("dir");
    let s = seed();
    let env = [
        ("P2PTEST_SEED", s.to_string()),
        ("P2PTEST_GPU", child_gpu.to_string()),
        ("P2PTEST_SHARING", sharing.into()),
        ("P2PTEST_ENGINE", engine.into()),
    ];
    let (_listener, mut child, chan) = spawn_connected(test, "receiver", &dir, &env, ACCEPT_LIMIT);
    let mut tx = connect_sender(
        link(&t, &g[0], &chan, sharing_from(sharing), (0, 1)),
        options_for(engine),
    )
    .expect("connect");
    let stream = Stream::new(&g[0]).expect("stream");
    for (i, &n) in SIZES.iter().enumerate() {
        let src = DeviceBuffer::from_host(&g[0], &random_bytes(s + i as u64, n)).expect("upload");
        tx.send(&src, &stream).expect("send");
        tx.wait(&stream).expect("send finished");
    }
    assert_eq!(
        chan.recv_msg().expect("the receiver's verdict"),
        b"all correct"
    );
    let status = child.wait().expect("wait for the child");
    assert!(status.success(), "the receiving process failed: {status}");
}

fn receiver_child() {
    let s = child_seed();
    let d = child_gpu();
    let t = Transport::new(vec![d.clone()]);
    let chan = parent_channel();
    let mut rx = connect_receiver(
        link(&t, &d, &chan, sharing_from(&env("P2PTEST_SHARING")), (1, 0)),
        options_for(&env("P2PTEST_ENGINE")),
    )
    .expect("connect");
    let stream = Stream::new(&d).expect("stream");
    for (i, &n) in SIZES.iter().enumerate() {
        let mut dst = DeviceBuffer::<u8>::new(&d, n).expect("alloc");
        dst.memset_u8(0xee).expect("poison");
        rx.recv(&mut dst, &stream).expect("recv");
        rx.wait(&stream).expect("recv finished");
        assert_eq!(
            dst.to_host_vec::<u8>().expect("download"),
            random_bytes(s + i as u64, n),
            "message {i} of {n} bytes"
        );
    }
    chan.send_msg(b"all correct").expect("reply");
}

macro_rules! two_process_test {
    ($name:ident, $ignore:literal, $sharing:literal, $gpu:literal, $engine:literal) => {
        #[test]
        #[ignore = $ignore]
        fn $name() {
            if role().as_deref() == Some("receiver") {
                return receiver_child();
            }
            sender_parent(stringify!($name), $sharing, $gpu, $engine);
        }
    };
}

two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_ipc,
    "needs a GPU",
    "ipc",
    0,
    "sm"
);
two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_cumem,
    "needs a GPU",
    "cumem",
    0,
    "sm"
);
two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_ipc_ce,
    "needs a GPU",
    "ipc",
    0,
    "ce"
);
two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_cumem_ce,
    "needs a GPU",
    "cumem",
    0,
    "ce"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_ipc,
    "needs 2 GPUs",
    "ipc",
    1,
    "sm"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_cumem,
    "needs 2 GPUs",
    "cumem",
    1,
    "sm"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_ipc_ce,
    "needs 2 GPUs",
    "ipc",
    1,
    "ce"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_cumem_ce,
    "needs 2 GPUs",
    "cumem",
    1,
    "ce"
);
two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_cumem_read,
    "needs a GPU",
    "cumem",
    0,
    "sm-read"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_cumem_read,
    "needs 2 GPUs",
    "cumem",
    1,
    "sm-read"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_ipc_read,
    "needs 2 GPUs",
    "ipc",
    1,
    "sm-read"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_cumem_ce_read,
    "needs 2 GPUs",
    "cumem",
    1,
    "ce-read"
);
two_process_test!(
    gpu1_send_recv_two_processes_one_gpu_host_staged,
    "needs a GPU",
    "host",
    0,
    "ce"
);
two_process_test!(
    gpu2_send_recv_two_processes_two_gpus_host_staged,
    "needs 2 GPUs",
    "host",
    1,
    "ce"
);

#[test]
#[ignore = "needs a GPU"]
fn gpu1_fabric_sharing_connects_or_is_refused_cleanly() {
    let g = gpus(1);
    let t = std::sync::Arc::new(Transport::new(g.clone()));
    let dir = PrivateDir::new("fabric").expect("dir");
    let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
    let client = FdChannel::connect(listener.path()).expect("connect");
    let server = listener.accept(Duration::from_secs(10)).expect("accept");
    let (t2, d2) = (t.clone(), g[0].clone());
    let sender = std::thread::spawn(move || {
        connect_sender(
            link(&t2, &d2, &client, Sharing::Fabric, (0, 1)),
            ConnOptions::default(),
        )
        .map(|_| ())
    });
    let received = connect_receiver(
        link(&t, &g[0], &server, Sharing::Fabric, (1, 0)),
        ConnOptions::default(),
    );
    drop(server); // a refused receiver closes its end, so the sender's wait ends at once
    let sent = sender.join().expect("sender thread");
    match received {
        Ok(_) => {
            sent.expect("the sender connects when the receiver did");
            eprintln!("fabric handles work here");
        }
        Err(Error::Mem(p2p_mem::Error::Unsupported { reason, .. })) => {
            eprintln!("fabric refused: {reason}");
            assert!(
                reason.contains("IMEX") || reason.contains("FABRIC_SUPPORTED"),
                "{reason}"
            );
            assert!(
                sent.is_err(),
                "the sender cannot connect to a refused receiver"
            );
        }
        Err(e) => panic!("fabric sharing failed with an unexpected error: {e}"),
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_copy_engine_connection_times_out_too() {
    let (g, t) = transport(1);
    let opts = within_300ms(ce_options());
    let (_tx, mut rx) = connect_in_process(&t, &g[0], &g[0], (0, 1), opts).expect("connect");
    let s = Stream::new(&g[0]).expect("stream");
    // Three chunks: the first wait times out, the later ones see the failure and return at once.
    let mut dst = DeviceBuffer::<u8>::new(&g[0], (8 << 20) + 1).expect("alloc");
    let t0 = Instant::now();
    rx.recv(&mut dst, &s).expect("queue recv");
    let why = "later waits must not each time out";
    assert_times_out(&mut rx, &s, t0, Duration::from_secs(5), why);
}

/// A peer process killed while this rank waits on a connection between processes: the job's
/// rendezvous group, watching the connection, ends the wait within a second with an error that
/// names the dead rank (without the group, only the 30 s time limit would).
#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_killed_peer_ends_a_watched_connection_wait() {
    const TEST: &str = "gpu1_a_killed_peer_ends_a_watched_connection_wait";
    if role().as_deref() == Some("doomed") {
        return doomed_sender();
    }
    let (g, t) = transport(1);
    let dir = PrivateDir::new("conn-live").expect("dir");
    let job = format!("conn-liveness-{}", std::process::id());
    let env = [
        ("P2PTEST_JOB", job.clone()),
        ("P2PTEST_DIR", dir.path().display().to_string()),
    ];
    let (_listener, mut child, chan) = spawn_connected(TEST, "doomed", &dir, &env, ACCEPT_LIMIT);
    let mut rx = connect_receiver(
        link(&t, &g[0], &chan, Sharing::LegacyIpc, (0, 1)),
        ConnOptions::default(),
    )
    .expect("connect");
    let mut rv = Rendezvous::new(0, 2, job);
    rv.dir = Some(dir.path().to_path_buf());
    rv.secret = Some(test_secret());
    let group = Group::join(&rv).expect("join");
    rx.watch(&group);
    let stream = Stream::new(&g[0]).expect("stream");
    let mut dst = DeviceBuffer::<u8>::new(&g[0], 1 << 20).expect("alloc");
    rx.recv(&mut dst, &stream).expect("queue a receive");
    // The child sends nothing: it says it is ready and is killed.
    assert_eq!(chan.recv_msg().expect("ready"), b"ready");
    child.kill().expect("kill the peer");
    let t0 = Instant::now();
    let e = rx.wait(&stream).expect_err("the peer died");
    let took = t0.elapsed();
    let _ = child.wait();
    eprintln!("{e} (after {took:?})");
    assert!(
        matches!(
            &e,
            Error::PeerFailed(f) if f.rank == 0 && f.peer == 1
        ),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(1), "found after {took:?}");
    // The connection refuses further work, naming the same rank.
    let again = rx.recv(&mut dst, &stream).expect_err("unusable");
    assert!(
        matches!(&again, Error::PeerFailed(f) if f.peer == 1),
        "{again:?}"
    );
}

fn doomed_sender() {
    let d = Device::new(0).expect("device");
    let t = Transport::new(vec![d.clone()]);
    let chan = parent_channel();
    let _tx = connect_sender(
        link(&t, &d, &chan, Sharing::LegacyIpc, (1, 0)),
        ConnOptions::default(),
    )
    .expect("connect");
    let mut rv = Rendezvous::new(1, 2, env("P2PTEST_JOB"));
    rv.dir = Some(PathBuf::from(env("P2PTEST_DIR")));
    rv.secret = Some(test_secret());
    let _group = Group::join(&rv).expect("join");
    chan.send_msg(b"ready").expect("ready");
    // Killed by the parent; never sends.
    std::thread::sleep(Duration::from_secs(120));
}

/// The secret both sides of the rendezvous test share (a job of two ranks needs one).
fn test_secret() -> Secret {
    Secret::from_text("the gpu_conn test's secret").expect("a secret")
}
