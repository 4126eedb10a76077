use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use p2p_mem::fdpass::FdChannel;
use p2p_mem::wire::Writer;

use super::testing::*;
use super::*;
use crate::error::Result;

/// `assert!(matches!(value, pattern))`, showing the value (`Debug`) when it does not match.
macro_rules! assert_matches {
    ($value:expr, $($pattern:tt)+) => {
        assert!(matches!($value, $($pattern)+), "{:?}", $value)
    };
}

/// The environment `env` (`NAME=value`, separated by spaces), as `from_vars` reads it.
pub(super) fn vars(env: &str) -> impl Fn(&str) -> Option<String> + '_ {
    move |k| {
        env.split(' ')
            .find_map(|v| v.strip_prefix(k)?.strip_prefix('='))
            .map(str::to_string)
    }
}

/// A rendezvous in a test directory of its own.
fn rv(name: &str, rank: usize, world: usize) -> Rendezvous {
    let dir = std::env::temp_dir().join(format!("p2p-rvtest-{}-{name}", std::process::id()));
    Rendezvous {
        dir: Some(dir),
        timeout: Duration::from_secs(10),
        secret: Some(Secret::from_text("a test secret of some length").expect("secret")),
        ..Rendezvous::new(rank, world, format!("test/{name}"))
    }
}

/// [`rv`] with a time limit of `timeout`.
fn rv_within(name: &str, rank: usize, world: usize, timeout: Duration) -> Rendezvous {
    Rendezvous {
        timeout,
        ..rv(name, rank, world)
    }
}

/// Rank `rank` of the `world`-rank job `name` joins on a thread of its own.
fn spawn_join(name: &'static str, rank: usize, world: usize) -> JoinHandle<Result<Group>> {
    std::thread::spawn(move || Group::join(&rv(name, rank, world)))
}

fn join_all(name: &'static str, world: usize) -> Vec<JoinHandle<Result<Group>>> {
    (0..world).map(|r| spawn_join(name, r, world)).collect()
}

/// The group that the join on thread `h` made (`what`: who joins).
fn joined(h: JoinHandle<Result<Group>>, what: &str) -> Group {
    h.join().expect("thread").expect(what)
}

/// The error that the join on thread `h` ended with, as text (`what`: why it must fail).
fn join_error_on(h: JoinHandle<Result<Group>>, what: &str) -> String {
    h.join().expect("thread").expect_err(what).to_string()
}

/// Why joining as `r` fails, as text (`what`: why it must).
fn join_error(r: &Rendezvous, what: &str) -> String {
    Group::join(r).expect_err(what).to_string()
}

/// The join on thread `h` fails (`what`: why it must), saying `words`.
fn assert_join_fails(h: JoinHandle<Result<Group>>, what: &str, words: &str) {
    let e = join_error_on(h, what);
    assert!(e.contains(words), "{e}");
}

/// Rank `rank` of the `world`-rank job `name` joins by hand (no group), as a process that
/// holds the job's key: its link to rank 0 (`what`: that it joins).
fn join_by_hand(name: &str, rank: usize, world: usize, what: &str) -> FdChannel {
    let r = rv(name, rank, world);
    try_join(&r, &r, rank as u32, Duration::from_secs(5)).expect(what)
}

/// Rank 0 of the `world`-rank job `name` joins on a thread; rank `left` joins by hand and leaves
/// before rank 0 tells it that all joined. Rank 0's thread, 100 ms later.
fn rank_0_and_a_rank_that_left(
    name: &'static str,
    world: usize,
    left: usize,
) -> JoinHandle<Result<Group>> {
    let g0 = spawn_join(name, 0, world);
    drop(join_by_hand(
        name,
        left,
        world,
        &format!("rank {left} joins"),
    ));
    std::thread::sleep(Duration::from_millis(100));
    g0
}

/// The failure that `g` records within 2 s of `since` (polled every millisecond; `what`: who
/// must learn of it).
fn failure_since(g: &Group, since: Instant, what: &str) -> Failure {
    while g.failure().is_none() && since.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    g.failure().expect(what)
}

/// The real rank `real` (rank 1) and rank 0, joining on thread `r0`, both join within `limit`.
fn real_ranks_join(
    real: &Rendezvous,
    r0: JoinHandle<Result<Group>>,
    limit: Duration,
) -> (Group, Group) {
    let start = Instant::now();
    let g1 = Group::join(real).expect("the real rank joins");
    let g0 = joined(r0, "rank 0 joins");
    assert!(start.elapsed() < limit, "{:?}", start.elapsed());
    (g0, g1)
}

#[test]
fn ranks_exchange_blobs_in_rank_order_and_part_cleanly() {
    let world = 4;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut g = Group::join(&rv("order", rank, world)).expect("join");
                let all = g
                    .all_gather(format!("rank {rank}").as_bytes())
                    .expect("gather");
                let again = g.all_gather(&[rank as u8; 100]).expect("gather 2");
                g.barrier().expect("barrier");
                assert_eq!(g.pids().len(), world);
                g.close();
                assert!(g.failure().is_none(), "{:?}", g.failure());
                (all, again)
            })
        })
        .collect();
    for h in handles {
        let (all, again) = h.join().expect("thread");
        let want: Vec<Vec<u8>> = (0..world)
            .map(|r| format!("rank {r}").into_bytes())
            .collect();
        assert_eq!(all, want);
        assert_eq!(again[3], vec![3u8; 100]);
    }
}

#[test]
fn a_missing_rank_is_named_after_the_time_limit() {
    let r = rv_within("missing", 0, 3, Duration::from_millis(300));
    let e = join_error(&r, "must time out");
    assert!(e.contains("ranks [1, 2] did not join"), "{e}");
}

/// Ranks 1 and 2 of a 4-rank job `name` join with time limit `limit`, each on a thread.
fn ranks_1_and_2(name: &'static str, limit: Duration) -> Vec<JoinHandle<Result<Group>>> {
    (1..3)
        .map(|r| std::thread::spawn(move || Group::join(&rv_within(name, r, 4, limit))))
        .collect()
}

/// Rank 0 gave up for want of rank 3 (`e0`), and ranks 1 and 2 heard why from it.
fn all_heard_rank_3_is_missing(e0: &str, others: Vec<JoinHandle<Result<Group>>>) {
    assert!(e0.contains("ranks [3] did not join"), "{e0}");
    for (r, g) in (1..3).zip(others) {
        let e = join_error_on(g, "stopped");
        assert!(
            e.contains("rank 0 stopped the rendezvous: ranks [3] did not join"),
            "rank {r}: {e}"
        );
    }
}

/// A process of the same user binds the job's rendezvous path and never accepts (its queue
/// full): rank 0's stale-socket probe and rank 1's connect each end by their limits with
/// errors that say so, instead of blocking for good.
#[test]
fn a_squatter_on_the_rendezvous_path_costs_each_rank_its_limit_not_a_hang() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let name = "squatted";
    let limit = Duration::from_millis(500);
    let rank = |r| rv_within(name, r, 2, limit);
    let path = rank(0).socket_path();
    let dir = path.parent().expect("a directory").to_path_buf();
    p2p_mem::fdpass::user_private_dir(&dir).expect("the rendezvous directory");
    let _ = std::fs::remove_file(&path);
    let socket = || {
        rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .expect("socket")
    };
    let addr = SocketAddrUnix::new(&path).expect("address");
    let squatter = socket();
    rustix::net::bind(&squatter, &addr).expect("bind");
    rustix::net::listen(&squatter, 0).expect("listen");
    let queued = socket();
    rustix::net::connect(&queued, &addr).expect("the one queued connection");
    let (tx, rx) = std::sync::mpsc::channel();
    for r in 0..2 {
        let (tx, rv) = (tx.clone(), rank(r));
        std::thread::spawn(move || {
            let t = Instant::now();
            let e = Group::join(&rv).err().map(|e| e.to_string());
            let _ = tx.send((r, t.elapsed(), e));
        });
    }
    for _ in 0..2 {
        let (r, took, e) = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("every rank returns (they blocked for good before)");
        let e = e.unwrap_or_else(|| panic!("rank {r} joined a squatted rendezvous"));
        let want = if r == 0 {
            "a live process listens there and accepts no connection"
        } else {
            "accepted no connection within"
        };
        assert!(e.contains(want), "rank {r}: {e}");
        // The limit, the probe's second and the verdict's grace, at most.
        assert!(took < Duration::from_secs(5), "rank {r} took {took:?}");
    }
    drop(squatter);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_ranks_that_joined_learn_which_rank_did_not() {
    let name = "missing-told";
    // Rank 0 gives up after 400 ms; ranks 1 and 2 would wait 5 s on their own.
    let r0 = rv_within(name, 0, 4, Duration::from_millis(400));
    let g0 = std::thread::spawn(move || Group::join(&r0));
    let t = Instant::now();
    let others = ranks_1_and_2(name, Duration::from_secs(5));
    let e0 = join_error_on(g0, "rank 3 never came");
    all_heard_rank_3_is_missing(&e0, others);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn ranks_started_before_rank_0_still_hear_who_did_not_join() {
    let name = "missing-late-0";
    let limit = Duration::from_millis(400);
    // Ranks 1 and 2 start 250 ms before rank 0, with the same time limit: theirs passes
    // before rank 0's, whose verdict they wait for (VERDICT_GRACE) rather than failing
    // with "nothing arrived".
    let others = ranks_1_and_2(name, limit);
    std::thread::sleep(Duration::from_millis(250));
    let r0 = rv_within(name, 0, 4, limit);
    let e0 = join_error(&r0, "rank 3 never came");
    all_heard_rank_3_is_missing(&e0, others);
}

#[test]
fn two_processes_with_one_rank_both_hear_why() {
    let name = "same-rank";
    let world = 3;
    let g0 = spawn_join(name, 0, world);
    let first = spawn_join(name, 1, world);
    std::thread::sleep(Duration::from_millis(200));
    // A second process claims rank 1: rank 0 stops, and tells both why (the second one
    // too, though it never joined).
    let e = join_error(&rv(name, 1, world), "rank 1 is taken");
    assert!(
        e.contains("rank 0 stopped the rendezvous") && e.contains("claims rank 1"),
        "{e}"
    );
    assert_join_fails(first, "stopped", "claims rank 1, which is taken");
    assert_join_fails(g0, "stopped", "do two processes have the same RANK?");
}

#[test]
fn a_rank_told_before_one_that_left_learns_which() {
    let name = "left-later";
    // Rank 2 of 3 joins by hand and leaves; rank 1 joins after it. Rank 0 tells rank 1 that
    // all joined, fails to tell rank 2, and reports rank 2 to rank 1.
    let g0 = rank_0_and_a_rank_that_left(name, 3, 2);
    let g1 = Group::join(&rv(name, 1, 3)).expect("rank 1 was told that all joined");
    let f = failure_since(&g1, Instant::now(), "rank 1 learns");
    assert_eq!(f.rank, 2);
    assert!(f.why.contains("left after joining"), "{}", f.why);
    assert_join_fails(g0, "rank 2 left", "telling rank 2 that all joined");
}

#[test]
fn a_rank_that_leaves_after_joining_is_named_to_the_others() {
    let name = "left";
    // Rank 1 of 3 joins by hand and leaves before rank 0 tells it that all joined.
    let g0 = rank_0_and_a_rank_that_left(name, 3, 1);
    let e2 = join_error(&rv(name, 2, 3), "rank 1 left");
    assert!(
        e2.contains("rank 0 stopped the rendezvous: rank 1") && e2.contains("left after joining"),
        "{e2}"
    );
    assert_join_fails(g0, "rank 1 left", "telling rank 1 that all joined");
}

#[test]
fn strangers_are_refused_and_never_delay_the_real_ranks() {
    let name = "strangers";
    let r0 = spawn_join(name, 0, 2);
    let real = rv(name, 1, 2);
    // Another job's secret, the right one but no secret at all, and another job's identity.
    let other_secret = Rendezvous {
        secret: Some(Secret::from_text("another secret, same job").expect("secret")),
        ..real.clone()
    };
    let no_secret = Rendezvous {
        secret: None,
        ..real.clone()
    };
    let other_job = Rendezvous {
        job: "test/another-job".into(),
        ..real.clone()
    };
    let t = Duration::from_secs(5);
    for key in [&other_secret, &no_secret, &other_job] {
        let e = try_join(&real, key, 1, t)
            .expect_err("a stranger must be refused")
            .to_string();
        assert!(e.contains("authentication failed"), "{e}");
    }
    // Silent clients, junk and early hang-ups, all at once.
    let path = real.socket_path();
    let silent: Vec<_> = (0..100)
        .filter_map(|_| connect_raw(&path, t).ok())
        .collect();
    for junk in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        &[0xff; 3000],
        &message(HELLO, &[1; 72]),
    ] {
        let l = connect_raw(&path, t).expect("connect");
        let _ = send_raw(&l, junk);
    }
    drop(connect_raw(&path, t));
    let (g0, g1) = real_ranks_join(&real, r0, Duration::from_secs(1));
    let other = std::thread::spawn(move || g1.all_gather(b"y").map(|a| a.len()));
    assert_eq!(g0.all_gather(b"x").expect("gather").len(), 2);
    assert_eq!(other.join().expect("thread").expect("gather"), 2);
    drop(silent);
}

#[test]
fn random_and_mutated_handshakes_never_get_in_or_stop_the_real_ranks() {
    let name = "fuzz";
    let r0 = spawn_join(name, 0, 2);
    let real = rv(name, 1, 2);
    let path = real.socket_path();
    let t = Duration::from_secs(5);
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for i in 0..300 {
        let Ok(l) = connect_raw(&path, t) else {
            continue;
        };
        let len = (next() % 200) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 2 == 0 {
            // A valid frame of a random kind around random bytes reaches the field checks.
            let kind = KINDS[(next() % KINDS.len() as u64) as usize];
            bytes = message(kind, &bytes);
            if i % 4 == 0 && bytes.len() > 12 {
                let at = (next() as usize) % bytes.len();
                bytes[at] ^= 1 << (next() % 8);
            }
        }
        // Send without waiting for the challenge, or after it.
        if i % 3 == 0 {
            let _ = l.recv_msg_within(Duration::from_millis(50));
        }
        let _ = send_raw(&l, &bytes);
    }
    let (g0, g1) = real_ranks_join(&real, r0, Duration::from_secs(2));
    let other = std::thread::spawn(move || g1.barrier().map(|()| g1.failure().is_none()));
    g0.barrier().expect("barrier");
    assert!(other.join().expect("thread").expect("barrier"));
    assert!(g0.failure().is_none());
}

#[test]
fn a_fake_rank0_cannot_feed_a_rank() {
    let real = rv("fake0", 1, 2);
    let impostor = Rendezvous {
        secret: None,
        ..real.clone()
    };
    let r = real.clone();
    let fake = std::thread::spawn(move || fake_rank0(&r, &impostor, 1, Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(50));
    let e = join_error(&real, "must refuse the impostor");
    // The impostor's welcome cannot carry a valid proof, or it refuses the hello.
    assert!(
        e.contains("could not prove") || e.contains("authentication failed"),
        "{e}"
    );
    fake.join().expect("thread").expect("fake");
}

#[test]
fn a_dead_peer_is_found_at_once_and_reported_to_every_rank() {
    let name = "dead";
    let world = 3;
    let [g0, g1] = [0, 1].map(|rank| spawn_join(name, rank, world));
    // Rank 2 joins by hand and then "dies": its socket closes without a goodbye.
    let link = join_by_hand(name, 2, world, "rank 2 joins");
    let (g0, g1) = (joined(g0, "rank 0"), joined(g1, "rank 1"));
    let died = Instant::now();
    drop(link);
    // Rank 1 learns through rank 0; its exchange fails at once, naming rank 2.
    let e = g1.all_gather(b"z").expect_err("must fail").to_string();
    assert!(e.contains("rank 2 failed"), "{e}");
    assert!(
        died.elapsed() < Duration::from_millis(500),
        "{:?}",
        died.elapsed()
    );
    let f0 = g0.failure().expect("rank 0 saw it");
    assert_eq!(f0.rank, 2);
    assert!(f0.why.contains("exited"), "{}", f0.why);
    let f1 = g1.failure().expect("rank 1 saw it");
    assert!(f1.why.contains("reported by rank 0"), "{}", f1.why);
}

#[test]
fn an_abort_on_one_rank_reaches_every_rank() {
    let handles = join_all("abort", 3);
    let groups: Vec<Group> = handles.into_iter().map(|h| joined(h, "join")).collect();
    groups[2].abort("the user gave up");
    let start = Instant::now();
    for g in &groups {
        let f = failure_since(g, start, "every rank learns");
        assert_eq!(f.rank, 2);
        assert!(f.why.contains("the user gave up"), "{}", f.why);
    }
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[test]
fn a_forged_failure_or_unknown_message_after_the_rendezvous_stops_the_group() {
    let name = "forged";
    let g0 = spawn_join(name, 0, 2);
    let link = join_by_hand(name, 1, 2, "join");
    let g0 = joined(g0, "rank 0");
    // A failure report that names a rank out of range is itself the sender's failure.
    send_raw(
        &link,
        &message(FAIL, &Writer::new().u32(77).text("x").finish()),
    )
    .expect("send");
    let f = failure_since(&g0, Instant::now(), "stopped");
    assert_eq!(f.rank, 1);
    assert!(f.why.contains("malformed"), "{}", f.why);
}

#[test]
fn oversized_blobs_are_refused_before_sending() {
    let g = Group::join(&rv("big", 0, 1)).expect("a group of one");
    assert!(g.all_gather(&vec![0; MAX_BLOB + 1]).is_err());
    assert_eq!(g.all_gather(&[1, 2]).expect("ok"), vec![vec![1, 2]]);
}

#[test]
fn the_largest_blobs_of_a_large_group_fit_one_table() {
    assert_eq!(max_blob(1), MAX_BLOB);
    assert_eq!(max_blob(MAX_WORLD), 1019);
    let world = 11;
    let limit = max_blob(world);
    assert!(limit < MAX_BLOB, "{limit}");
    let groups: Vec<Group> = join_all("wide", world)
        .into_iter()
        .map(|h| joined(h, "join"))
        .collect();
    // One byte too many: refused at once, on that rank, before anything is sent.
    let start = Instant::now();
    let e = groups[3]
        .all_gather(&vec![3; limit + 1])
        .expect_err("past the limit");
    assert!(e.to_string().contains("in a group of 11"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(1));
    // At the limit, rank 0's table of every blob fits one message.
    let handles: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, g)| std::thread::spawn(move || g.all_gather(&vec![r as u8; limit])))
        .collect();
    for h in handles {
        let all = h.join().expect("thread").expect("all-gather at the limit");
        assert_eq!(all.len(), world);
        for (r, b) in all.iter().enumerate() {
            assert!(b.len() == limit && b.iter().all(|&x| x == r as u8));
        }
    }
}

#[test]
fn a_time_limit_past_a_day_or_of_zero_is_refused_not_a_panic() {
    for timeout in [Duration::MAX, crate::MAX_TIMEOUT * 2, Duration::ZERO] {
        let r = rv_within("limits", 0, 1, timeout);
        let e = join_error(&r, "an unusable time limit");
        assert!(e.contains("one day"), "{e}");
    }
}

#[test]
fn only_torchruns_random_run_id_counts_as_a_random_part_of_the_job() {
    let job = |run_id: &str| {
        Rendezvous::from_vars(vars(&format!(
            "RANK=0 WORLD_SIZE=2 MASTER_PORT=29500 TORCHELASTIC_RUN_ID={run_id}"
        )))
        .expect("valid")
        .job
    };
    // What `torchrun --standalone` sets (uuid4).
    assert!(job_holds_random_run_id(&job(
        "3f2b8c1e-9a4d-4e1f-8b7a-0c5d6e7f8a9b"
    )));
    // torchrun's default `--rdzv-id`, a name, and P2P_JOB_ID jobs.
    assert!(!job_holds_random_run_id(&job("none")));
    assert!(!job_holds_random_run_id(&job("my-training-run-2026")));
    assert!(!job_holds_random_run_id(&job(
        "3f2b8c1e-9a4d-4e1f-8b7a-0c5d6e7f8a9"
    )));
    assert!(!job_holds_random_run_id(
        "id:3f2b8c1e-9a4d-4e1f-8b7a-0c5d6e7f8a9b/2"
    ));
}

#[test]
fn the_environment_names_the_job_and_is_checked() {
    let torchrun = |restart| {
        Rendezvous::from_vars(vars(&format!(
            "RANK=1 WORLD_SIZE=2 MASTER_PORT=29500 TORCHELASTIC_RUN_ID=abc \
             TORCHELASTIC_RESTART_COUNT={restart}"
        )))
        .expect("valid")
    };
    let r = torchrun(0);
    assert_eq!((r.rank, r.world, r.local_rank), (1, 2, 1));
    let restarted = torchrun(1);
    assert_ne!(r.socket_path(), restarted.socket_path());
    assert!(r.secret.is_none());
    for (env, what, words) in [
        (
            "RANK=0 WORLD_SIZE=2",
            "no job identity",
            "P2P_JOB_ID nor MASTER_PORT",
        ),
        (
            "RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 P2P_JOB_ID=j",
            "two hosts",
            "MultiHostCommunicator",
        ),
        (
            "RANK=0 WORLD_SIZE=2 P2P_JOB_ID=j P2P_JOB_SECRET=short",
            "short secret",
            "at least 16",
        ),
        (
            "RANK=2 WORLD_SIZE=2",
            "rank too big",
            "not below WORLD_SIZE",
        ),
    ] {
        let e = Rendezvous::from_vars(vars(env)).expect_err(what);
        assert!(e.to_string().contains(words), "{e}");
    }
    // The secret never shows in debug output.
    let with = Rendezvous::from_vars(vars(
        "RANK=0 WORLD_SIZE=2 P2P_JOB_ID=j P2P_JOB_SECRET=0123456789abcdef-secret",
    ))
    .expect("valid");
    assert!(!format!("{with:?}").contains("0123456789abcdef"));
}

#[test]
fn a_shared_directory_owned_by_someone_else_or_open_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("p2p-rvtest-{}-open", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let r = Rendezvous {
        dir: Some(dir.clone()),
        ..rv("open", 0, 2)
    };
    let e = join_error(&r, "must refuse");
    assert!(e.contains("not a private directory"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connected pair of channels in a private directory of its own.
fn channel_pair(
    name: &str,
) -> (
    p2p_mem::fdpass::PrivateDir,
    p2p_mem::fdpass::FdChannel,
    p2p_mem::fdpass::FdChannel,
) {
    use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
    let dir = PrivateDir::new(name).expect("dir");
    let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
    let a = FdChannel::connect(listener.path()).expect("connect");
    let b = listener.accept(Duration::from_secs(5)).expect("accept");
    (dir, a, b)
}

#[test]
fn each_way_a_handshake_message_is_wrong_has_its_reason() {
    let (_dir, a, b) = channel_pair("rv-expect");
    let t = Duration::from_millis(20);
    // What `b` makes of `bytes` from `a` when it expects a hello (`what`: why it is wrong).
    let answer = |bytes: &[u8], what: &str| {
        send_raw(&a, bytes).expect("send");
        expect(&b, HELLO, 32, t).expect_err(what)
    };
    let e = expect(&b, HELLO, 32, t).expect_err("silent");
    assert_matches!(e, HandshakeError::Silent { waited } if waited == t);
    assert_eq!(e.to_string(), "nothing arrived within 20ms");
    let e = answer(&message(HELLO, &[0; 33]), "too long");
    assert_matches!(
        e,
        HandshakeError::TooLong {
            len: 33,
            kind: HELLO,
            max: 32
        }
    );
    assert_eq!(e.to_string(), "a 33-byte message of kind 2 (at most 32)");
    let e = answer(&message(WELCOME, &[0; 32]), "another kind");
    assert_matches!(
        e,
        HandshakeError::UnexpectedKind {
            expected: HELLO,
            got: WELCOME
        }
    );
    assert_eq!(e.to_string(), "expected message kind 2, got 3");
    let go_away = Writer::new().text("go away").finish();
    let e = answer(&message(REFUSED, &go_away), "refused");
    assert_matches!(e, HandshakeError::Refused { ref why } if why == "go away");
    assert_eq!(e.to_string(), "refused: go away");
    let e = answer(b"junk that is not a message", "junk");
    assert_matches!(e, HandshakeError::Malformed(_));
    // A rank the launcher reports ended ends the wait at once, naming it.
    let ended = crate::launch::Ended {
        rank: 1,
        pid: 7,
        how: "signal: 9".into(),
    };
    let until = Instant::now() + Duration::from_secs(5);
    let e = expect_hearing_launcher(&b, READY, 32, until, || Some(ended.clone()))
        .expect_err("launcher");
    assert_matches!(e, HandshakeError::Launcher(ref x) if *x == ended);
    assert_eq!(
        e.to_string(),
        "launcher: rank 1 (pid 7) ended (signal: 9), as the launcher reports, before every rank joined"
    );
    drop(a);
    let e = expect(&b, HELLO, 32, t).expect_err("closed");
    assert_matches!(e, HandshakeError::Link(_));
}

#[test]
fn all_gather_protocol_errors_read_as_before() {
    use super::group::GatherError;
    let cases = [
        (
            GatherError::UnexpectedKind { from: 2, kind: 13 },
            "rank 2 sent message kind 13 during an all-gather",
        ),
        (
            GatherError::MalformedMessage,
            "a malformed all-gather message",
        ),
        (GatherError::MalformedTable, "a malformed all-gather table"),
        (
            GatherError::OutOfStep {
                from: 1,
                theirs: 4,
                ours: 5,
            },
            "rank 1 is at all-gather #4, rank 0 at #5: the ranks made different calls",
        ),
        (
            GatherError::TableOutOfStep { theirs: 6, ours: 5 },
            "rank 0 answered all-gather #6, this rank is at #5",
        ),
    ];
    for (e, words) in cases {
        assert_eq!(e.to_string(), words);
    }
}

#[test]
fn a_job_without_a_secret_or_a_random_identity_refuses_to_start_unless_allowed() {
    let bare = Rendezvous {
        secret: None,
        timeout: Duration::from_millis(300),
        ..rv("no-secret", 0, 2)
    };
    let e = join_error(&bare, "must refuse");
    assert!(
        e.contains("no P2P_JOB_SECRET") && e.contains("P2P_ALLOW_NO_SECRET=1"),
        "{e}"
    );
    // Allowed: it goes on to wait for rank 1, and fails only at its time limit.
    let allowed = Rendezvous {
        allow_no_secret: true,
        ..bare.clone()
    };
    let e = join_error(&allowed, "rank 1 never comes");
    assert!(!e.contains("no P2P_JOB_SECRET"), "{e}");
    // A job of one rank needs none; the setting is read from the environment.
    assert!(Group::join(&Rendezvous {
        allow_no_secret: false,
        ..rv_within("alone", 0, 1, Duration::from_secs(5))
    })
    .is_ok());
    let env = Rendezvous::from_vars(vars(
        "RANK=0 WORLD_SIZE=2 P2P_JOB_ID=j P2P_ALLOW_NO_SECRET=1",
    ))
    .expect("valid");
    assert!(env.allow_no_secret);
    let e = Rendezvous::from_vars(vars(
        "RANK=0 WORLD_SIZE=2 P2P_JOB_ID=j P2P_ALLOW_NO_SECRET=maybe",
    ))
    .expect_err("not a boolean");
    assert!(e.to_string().contains("P2P_ALLOW_NO_SECRET"), "{e}");
}
