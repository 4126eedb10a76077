//! The group: joining it, exchanging blobs, barriers, and the monitor that learns of a
//! failure.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use p2p_mem::abort::AbortHandle;
use p2p_mem::fdpass::{self, FdChannel, FdListener};
use p2p_mem::wire::{self, Reader, Writer};

use crate::error::{Error, PeerFailure, Result};

use super::handshake::*;
use super::*;

/// Why a group stopped: which rank failed and how it was found out.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The rank that failed (this rank's own, for a local abort).
    pub rank: usize,
    /// What happened, in words.
    pub why: String,
    /// When this process learnt of it.
    pub detected: Instant,
}

/// What a rank sent during an all-gather that breaks the protocol: the failure of that rank,
/// reported to every rank in these words.
#[derive(Debug, thiserror::Error)]
pub(super) enum GatherError {
    /// A message of another kind than the all-gather's (or a table from a rank other than 0).
    #[error("rank {from} sent message kind {kind} during an all-gather")]
    UnexpectedKind {
        /// The sender.
        from: usize,
        /// The kind it sent.
        kind: u16,
    },
    /// A rank's contribution does not have the message's fields.
    #[error("a malformed all-gather message")]
    MalformedMessage,
    /// Rank 0's table does not have the table's fields.
    #[error("a malformed all-gather table")]
    MalformedTable,
    /// A rank contributed to another all-gather than rank 0's (or twice to this one).
    #[error(
        "rank {from} is at all-gather #{theirs}, rank 0 at #{ours}: the ranks made different calls"
    )]
    OutOfStep {
        /// The sender.
        from: usize,
        /// Its all-gather number.
        theirs: u32,
        /// Rank 0's.
        ours: u32,
    },
    /// Rank 0 answered another all-gather than this rank's.
    #[error("rank 0 answered all-gather #{theirs}, this rank is at #{ours}")]
    TableOutOfStep {
        /// Rank 0's all-gather number.
        theirs: u32,
        /// This rank's.
        ours: u32,
    },
}

pub(super) struct State {
    pub(super) failure: Option<Failure>,
    /// Messages for the caller: (from rank, kind, payload).
    pub(super) inbox: VecDeque<(usize, u16, Vec<u8>)>,
    /// Peers that said goodbye: their hang-up is not a failure.
    pub(super) bye: Vec<bool>,
}

pub(super) struct Shared {
    pub(super) rank: usize,
    pub(super) world: usize,
    /// `links[r]`: the connection to rank `r` (rank 0 holds all, the others only rank 0's).
    pub(super) links: Vec<Option<Arc<FdChannel>>>,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    pub(super) stop: AtomicBool,
    pub(super) aborts: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `rank`'s failure (the first one wins), stops every kernel watching an abort flag
    /// of this group and, on rank 0, tells every other rank.
    fn fail(&self, rank: usize, why: String, relay_except: Option<usize>) {
        {
            let mut st = self.lock();
            if st.failure.is_some() {
                return;
            }
            tracing::error!(
                rank = self.rank,
                peer = rank,
                "rank {rank} failed: {why}; stopping this rank's work"
            );
            st.failure = Some(Failure {
                rank,
                why: why.clone(),
                detected: Instant::now(),
            });
        }
        self.cv.notify_all();
        for a in self.aborts.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            a.abort_because(rank, why.clone());
        }
        let msg = failure_report(rank, &why);
        for (r, link) in self.links.iter().enumerate() {
            if Some(r) == relay_except {
                continue;
            }
            if let Some(l) = link {
                // A peer that is gone cannot be told; the others can.
                let _ = l.send_msg(&msg);
            }
        }
    }
}

/// The connected ranks of one job, watched for failures (see the module docs).
pub struct Group {
    shared: Arc<Shared>,
    pids: Vec<u32>,
    timeout: Duration,
    seq: AtomicU32,
    monitor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.shared.rank)
            .field("world", &self.shared.world)
            .field("pids", &self.pids)
            .finish()
    }
}

impl Group {
    /// Joins the job: returns once every rank has joined and proved it belongs, or fails after
    /// `rv.timeout` naming the ranks that did not come.
    pub fn join(rv: &Rendezvous) -> Result<Group> {
        let rank = rv.rank;
        let fail = |why: String| Error::Rendezvous {
            rank: Some(rank),
            why,
        };
        if rv.world == 0 || rank >= rv.world || rv.world > MAX_WORLD {
            return Err(fail(format!(
                "rank {rank} of {} is not a valid place in a group of at most {MAX_WORLD}",
                rv.world
            )));
        }
        if rv.timeout.is_zero() || rv.timeout > crate::MAX_TIMEOUT {
            return Err(fail(format!(
                "a time limit of {:?}: use more than zero and at most {:?} (one day)",
                rv.timeout,
                crate::MAX_TIMEOUT
            )));
        }
        let path = rv.socket_path();
        if let Some(dir) = path.parent() {
            fdpass::user_private_dir(dir).map_err(|e| fail(e.to_string()))?;
        }
        let deadline = Instant::now() + rv.timeout;
        let key = rv.key();
        if rv.secret.is_none() && rv.world > 1 {
            if job_holds_random_run_id(&rv.job) {
                tracing::debug!(
                    rank,
                    "no P2P_JOB_SECRET: the job's key holds torchrun's random run id (TORCHELASTIC_RUN_ID)"
                );
            } else if rv.allow_no_secret {
                crate::warn_user!(
                    "rank {rank}: no P2P_JOB_SECRET, and the job's identity holds no random value (P2P_ALLOW_NO_SECRET is set), so another process of this user that knows the identity could join this job's rendezvous"
                );
            } else {
                return Err(fail(
                    "no P2P_JOB_SECRET, and the job's identity holds no random value, so another process of this user that knows the identity could join this job: export one P2P_JOB_SECRET to every rank (e.g. `export P2P_JOB_SECRET=$(openssl rand -hex 16)` before starting them), or start the job with `torchrun --standalone` (a random run id) or `p2p-bench launch` (a secret for every job); P2P_ALLOW_NO_SECRET=1 starts it without one".into(),
                ));
            }
        }
        // What the launcher says of its ranks is about the job it started: the one this
        // process's environment names (not another group the ranks make among themselves).
        let launched = Rendezvous::from_env().is_ok_and(|env| env.job == rv.job);
        let news =
            || crate::launch::news().filter(|e| launched && e.rank < rv.world && e.rank != rank);
        let mut links: Vec<Option<Arc<FdChannel>>> = (0..rv.world).map(|_| None).collect();
        let mut pids = vec![0u32; rv.world];
        pids[rank] = std::process::id();
        if rv.world == 1 {
            // Nobody to meet.
        } else if rank == 0 {
            let listener = FdListener::bind_replacing_stale(&path).map_err(|e| {
                fail(format!(
                    "listening on {}: {e} (is another job with the same identity running? set P2P_JOB_ID)",
                    path.display()
                ))
            })?;
            tracing::debug!(rank, "rendezvous at {}", path.display());
            let (tx, rx) = mpsc::channel::<std::result::Result<Joined, HandshakeError>>();
            let mut pending = 0usize;
            let mut joined = 1;
            while joined < rv.world {
                if let Some(ended) = news() {
                    let late: Vec<Joined> = rx.try_iter().filter_map(|r| r.ok()).collect();
                    return Err(fail(stop_rendezvous(
                        &links,
                        late.iter().map(|j| &j.link),
                        format!("{ended}, before every rank joined"),
                    )));
                }
                if Instant::now() > deadline {
                    let missing: Vec<usize> =
                        (1..rv.world).filter(|&r| links[r].is_none()).collect();
                    // Handshakes that completed since the last look are told too.
                    let late: Vec<Joined> = rx.try_iter().filter_map(|r| r.ok()).collect();
                    return Err(fail(stop_rendezvous(
                        &links,
                        late.iter().map(|j| &j.link),
                        format!(
                            "ranks {missing:?} did not join within {:?} at {}",
                            rv.timeout,
                            path.display()
                        ),
                    )));
                }
                match listener.accept_within(Duration::from_millis(5)) {
                    Ok(Some(link)) if pending >= MAX_PENDING_HANDSHAKES => {
                        tracing::warn!(
                            rank,
                            "rendezvous: {pending} handshakes already pending; closing a new connection from pid {:?}",
                            link.peer_cred().map(|c| c.0).ok()
                        );
                    }
                    Ok(Some(link)) => {
                        pending += 1;
                        let tx = tx.clone();
                        std::thread::Builder::new()
                            .name("p2p-rv-handshake".into())
                            .spawn(move || {
                                let _ = tx.send(serve_handshake(link, key));
                            })
                            .map_err(|e| fail(format!("starting a handshake thread: {e}")))?;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(rank, "rendezvous: refused a connection: {e}"),
                }
                while let Ok(result) = rx.try_recv() {
                    pending -= 1;
                    match result {
                        Err(why) => tracing::warn!(rank, "rendezvous: dropped a connection: {why}"),
                        Ok(j) => {
                            // An authenticated rank holds the job's key: a disagreement is the
                            // job's own misconfiguration, so it fails the rendezvous.
                            if j.world != rv.world {
                                return Err(fail(stop_rendezvous(
                                    &links,
                                    [&j.link],
                                    format!(
                                        "rank {} (pid {}) says WORLD_SIZE={}, rank 0 has {}",
                                        j.rank, j.pid, j.world, rv.world
                                    ),
                                )));
                            }
                            if j.rank == 0 || j.rank >= rv.world || links[j.rank].is_some() {
                                return Err(fail(stop_rendezvous(
                                    &links,
                                    [&j.link],
                                    format!(
                                        "pid {} claims rank {}, which is taken or out of range: do two processes have the same RANK?",
                                        j.pid, j.rank
                                    ),
                                )));
                            }
                            pids[j.rank] = j.pid;
                            links[j.rank] = Some(Arc::new(j.link));
                            joined += 1;
                        }
                    }
                }
            }
            // Nobody else may connect now; the socket goes with the listener.
            drop(listener);
            let ready = pids.iter().fold(Writer::new(), |w, p| w.u32(*p)).finish();
            for (r, l) in links.iter().enumerate() {
                let Some(l) = l else { continue };
                if let Err(e) = send(l, READY, &ready) {
                    // Rank r left after it joined. The ranks told before it are in the group
                    // now: a failure report names r to them; the others are refused, naming r.
                    let why = format!("rank {r} (pid {}) left after joining: {e}", pids[r]);
                    let report = failure_report(r, &why);
                    for told in links[..r].iter().flatten() {
                        let _ = told.send_msg(&report);
                    }
                    stop_rendezvous(&links[r + 1..], [], why);
                    return Err(fail(format!("telling rank {r} that all joined: {e}")));
                }
            }
        } else {
            let link = loop {
                // A listener that never takes the connection costs at most what is left.
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                let attempt = FdChannel::connect_within(&path, left)
                    .map_err(|e| (true, HandshakeError::Link(e)))
                    .and_then(|link| client_handshake(link, &key, rank, rv.world));
                match attempt {
                    Ok(link) => break link,
                    Err((false, why)) => {
                        // A closed socket mid-handshake may be rank 0 leaving because the
                        // launcher told it a rank ended: that rank is the cause to report.
                        return Err(fail(match news_within(news) {
                            Some(ended) => format!("{ended}, before every rank joined"),
                            None => format!("handshake with rank 0: {why}"),
                        }));
                    }
                    Err((true, why)) if Instant::now() > deadline => {
                        return Err(fail(format!(
                            "rank 0 did not answer at {} within {:?}: {why}",
                            path.display(),
                            rv.timeout
                        )))
                    }
                    // Not there yet, or closed before the challenge (rank 0 busy): again, unless
                    // the launcher says a rank will never come.
                    Err((true, _)) => {
                        if let Some(ended) = news() {
                            return Err(fail(format!("{ended}, before every rank joined")));
                        }
                        std::thread::sleep(Duration::from_millis(10))
                    }
                }
            };
            // Rank 0 answers by its own deadline (all joined, or who did not): wait for that
            // verdict a little past this rank's.
            let until = deadline + VERDICT_GRACE;
            let ready = expect_hearing_launcher(&link, READY, 4 * MAX_WORLD, until, news).map_err(|why| {
                fail(match why {
                    HandshakeError::Launcher(ended) => format!("{ended}, before every rank joined"),
                    HandshakeError::Refused { why } => {
                        format!(
                            "waiting for every rank to join: rank 0 stopped the rendezvous: {why}"
                        )
                    }
                    // Rank 0 is alive (its socket is open) but gave no verdict.
                    HandshakeError::Silent { .. } => format!(
                        "waiting for every rank to join: rank 0 gave no word (all joined, or who did not) within {:?} of this rank's start: it is still waiting (did it start more than {VERDICT_GRACE:?} after this rank, or with a longer P2P_RENDEZVOUS_TIMEOUT_MS?) or is stuck",
                        rv.timeout + VERDICT_GRACE
                    ),
                    why => format!("waiting for every rank to join: rank 0 failed or left: {why}"),
                })
            })?;
            let mut r = Reader::new(&ready);
            for p in pids.iter_mut() {
                *p = r
                    .u32()
                    .ok_or_else(|| fail("a short list of ranks from rank 0".into()))?;
            }
            links[0] = Some(Arc::new(link));
        }
        let shared = Arc::new(Shared {
            rank,
            world: rv.world,
            links,
            state: Mutex::new(State {
                failure: None,
                inbox: VecDeque::new(),
                bye: vec![false; rv.world],
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            aborts: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let monitor = std::thread::Builder::new()
            .name(format!("p2p-monitor-{rank}"))
            .spawn(move || monitor(&s))
            .map_err(|e| fail(format!("starting the monitor thread: {e}")))?;
        tracing::debug!(
            rank,
            world = rv.world,
            "joined the group; peer pids {pids:?}"
        );
        Ok(Group {
            shared,
            pids,
            timeout: rv.timeout,
            seq: AtomicU32::new(0),
            monitor: Some(monitor),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// How many ranks.
    pub fn world(&self) -> usize {
        self.shared.world
    }

    /// Every rank's process id (as the kernel reported it at connect), in rank order.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// The time limit of every exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets `abort` (with the reason) whenever the group learns of a failure, and reports
    /// `abort` being set on this rank to every other rank. Already failed: set at once.
    pub fn watch(&self, abort: &AbortHandle) {
        self.shared
            .aborts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(abort.clone());
        if let Some(f) = self.failure() {
            abort.abort_because(f.rank, f.why);
        }
    }

    /// The failure this group learnt of, if any.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.lock().failure.clone()
    }

    /// The error for `failure` as seen by this rank.
    fn failed(&self, f: Failure) -> Error {
        Error::PeerFailed(PeerFailure {
            rank: self.shared.rank,
            peer: f.rank,
            why: f.why,
        })
    }

    /// Reports a failure of this rank to every other rank (and to this rank's watched flags):
    /// they stop what they are doing and fail with `why`.
    pub fn abort(&self, why: &str) {
        self.shared.fail(self.shared.rank, why.to_string(), None);
    }

    /// Every rank's blob (at most [`max_blob`] of the world's size), in rank order. Fails at once
    /// if a rank fails, or after the time limit.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let sh = &self.shared;
        let rank = sh.rank;
        let limit = max_blob(sh.world);
        if mine.len() > limit {
            return Err(Error::Rendezvous {
                rank: Some(rank),
                why: format!(
                    "an all-gather blob of {} bytes (at most {limit} in a group of {})",
                    mine.len(),
                    sh.world
                ),
            });
        }
        if let Some(f) = self.failure() {
            return Err(self.failed(f));
        }
        if sh.world == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let deadline = Instant::now() + self.timeout;
        let fail = |why: String| Error::Rendezvous {
            rank: Some(rank),
            why,
        };
        if rank == 0 {
            let mut all: Vec<Option<Vec<u8>>> = (0..sh.world).map(|_| None).collect();
            all[0] = Some(mine.to_vec());
            let waited = self.wait(deadline, seq, |from, kind, p| {
                if kind != GATHER {
                    return Err(GatherError::UnexpectedKind { from, kind });
                }
                let mut r = Reader::new(p);
                let s = r.u32().ok_or(GatherError::MalformedMessage)?;
                let blob = r.blob(limit).ok_or(GatherError::MalformedMessage)?;
                r.end().ok_or(GatherError::MalformedMessage)?;
                if s != seq || all[from].is_some() {
                    return Err(GatherError::OutOfStep {
                        from,
                        theirs: s,
                        ours: seq,
                    });
                }
                all[from] = Some(blob.to_vec());
                Ok(all.iter().all(Option::is_some))
            });
            if let Err(e) = waited {
                let missing: Vec<usize> = (1..sh.world).filter(|&r| all[r].is_none()).collect();
                return Err(match e {
                    Error::Rendezvous { .. } => fail(format!(
                        "all-gather #{seq}: ranks {missing:?} did not come within {:?} (are they alive and making the same calls?)",
                        self.timeout
                    )),
                    e => e,
                });
            }
            let all: Vec<Vec<u8>> = all.into_iter().map(Option::unwrap_or_default).collect();
            let table = all
                .iter()
                .fold(Writer::new().u32(seq), |w, b| w.blob(b))
                .finish();
            for (r, l) in sh.links.iter().enumerate() {
                if let Some(l) = l {
                    if let Err(e) = send(l, TABLE, &table) {
                        // The ranks that got no table would wait until their time limit.
                        let why = format!("could not send the all-gather table to rank {r}: {e}");
                        sh.fail(rank, why.clone(), None);
                        return Err(fail(why));
                    }
                }
            }
            Ok(all)
        } else {
            let link = sh.links[0]
                .as_ref()
                .ok_or_else(|| fail("no connection to rank 0".into()))?;
            send(link, GATHER, &Writer::new().u32(seq).blob(mine).finish())
                .map_err(|e| fail(format!("to rank 0: {e}")))?;
            let mut table = None;
            let world = sh.world;
            self.wait(deadline, seq, |from, kind, p| {
                if kind != TABLE || from != 0 {
                    return Err(GatherError::UnexpectedKind { from, kind });
                }
                let mut r = Reader::new(p);
                let s = r.u32().ok_or(GatherError::MalformedTable)?;
                if s != seq {
                    return Err(GatherError::TableOutOfStep {
                        theirs: s,
                        ours: seq,
                    });
                }
                let mut all = Vec::with_capacity(world);
                for _ in 0..world {
                    all.push(r.blob(limit).ok_or(GatherError::MalformedTable)?.to_vec());
                }
                r.end().ok_or(GatherError::MalformedTable)?;
                table = Some(all);
                Ok(true)
            })?;
            table.ok_or_else(|| fail("no table from rank 0".into()))
        }
    }

    /// Returns once every rank has called it (or fails at once if a rank fails, or after the
    /// time limit).
    pub fn barrier(&self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    /// Takes inbox messages into `take` until it says done; fails on a failure, a protocol
    /// error (which is also reported to every rank) or the deadline.
    fn wait(
        &self,
        deadline: Instant,
        seq: u32,
        mut take: impl FnMut(usize, u16, &[u8]) -> std::result::Result<bool, GatherError>,
    ) -> Result<()> {
        let sh = &self.shared;
        let mut st = sh.lock();
        loop {
            if let Some(f) = st.failure.clone() {
                return Err(self.failed(f));
            }
            while let Some((from, kind, p)) = st.inbox.pop_front() {
                match take(from, kind, &p) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(why) => {
                        drop(st);
                        let why = why.to_string();
                        sh.fail(from, why.clone(), None);
                        return Err(Error::PeerFailed(PeerFailure {
                            rank: sh.rank,
                            peer: from,
                            why,
                        }));
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Rendezvous {
                    rank: Some(sh.rank),
                    why: format!(
                        "all-gather #{seq}: rank 0 did not answer within {:?} (are all ranks alive and making the same calls?)",
                        self.timeout
                    ),
                });
            }
            st = sh
                .cv
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Says goodbye to every peer (so closing is not taken for a failure) and stops the monitor.
    /// Dropping the group does this too.
    pub fn close(&mut self) {
        let sh = &self.shared;
        let bye = wire::encode_message(BYE, &[]);
        for l in sh.links.iter().flatten() {
            let _ = l.send_msg(&bye);
        }
        sh.stop.store(true, Ordering::SeqCst);
        if let Some(m) = self.monitor.take() {
            let _ = m.join();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.close();
    }
}

/// The monitor thread: reads every link, turns hang-ups into failures, relays failures (rank
/// 0), and reports this rank's abort flags being set.
pub(super) fn monitor(sh: &Shared) {
    let peers: Vec<(usize, Arc<FdChannel>)> = sh
        .links
        .iter()
        .enumerate()
        .filter_map(|(r, l)| l.clone().map(|l| (r, l)))
        .collect();
    let mut open: Vec<bool> = vec![true; peers.len()];
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    while !sh.stop.load(Ordering::SeqCst) {
        let live: Vec<usize> = (0..peers.len()).filter(|&i| open[i]).collect();
        let mut fds: Vec<rustix::event::PollFd<'_>> = live
            .iter()
            .map(|&i| rustix::event::PollFd::new(&peers[i].1, rustix::event::PollFlags::IN))
            .collect();
        let ready: Vec<bool> = match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
            Err(_) => vec![false; live.len()],
        };
        drop(fds);
        if live.is_empty() {
            std::thread::sleep(TICK);
        }
        for (k, &i) in live.iter().enumerate() {
            if !ready[k] {
                continue;
            }
            let (from, link) = (&peers[i].0, &peers[i].1);
            let from = *from;
            match link.recv_msg_within(Duration::ZERO) {
                Ok(None) => {}
                Ok(Some(bytes)) => dispatch(sh, from, &bytes),
                Err(e) => {
                    open[i] = false;
                    if sh.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let clean = sh.lock().bye[from];
                    if !clean {
                        let why = match e {
                            p2p_mem::Error::Closed(_) => format!(
                                "its process exited or closed its connection (pid {})",
                                link.peer_cred()
                                    .map(|c| c.0.to_string())
                                    .unwrap_or_else(|_| "?".into())
                            ),
                            e => format!("its connection broke: {e}"),
                        };
                        sh.fail(from, why, Some(from));
                    }
                }
            }
        }
        // This rank's own abort flags: set by the user or a failing kernel.
        let local = {
            let aborts = sh.aborts.lock().unwrap_or_else(|p| p.into_inner());
            aborts.iter().find(|a| a.is_aborted()).cloned()
        };
        if let Some(a) = local {
            if sh.lock().failure.is_none() {
                // Each read once, so that the rank and the reason come from one source.
                let (who, why) = match (a.reason(), a.kernel_failure()) {
                    (Some((r, why)), _) => (r, why),
                    (None, Some(f)) => (f.rank.unwrap_or(sh.rank), f.to_string()),
                    (None, None) => (sh.rank, "aborted by the user".into()),
                };
                sh.fail(who, why, None);
            }
        }
    }
}

/// The longest reason a failure report carries, in bytes; a longer one (reasons quote the
/// reasons of other ranks and layers) is cut to it on the sender's side.
const WHY_MAX: usize = 4096;

/// What a peer's message after the rendezvous says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A part of an exchange (`GATHER` or `TABLE`) and its payload.
    Data(u16, Vec<u8>),
    /// Rank `who` failed, and why (reported by the sender).
    Failed {
        /// The failed rank, below the world size.
        who: usize,
        /// Why.
        why: String,
    },
    /// The sender is leaving.
    Bye,
    /// Not a message a peer may send: why.
    Malformed(String),
}

impl Incoming {
    /// The message in `bytes` from a peer of a group of `world` ranks.
    pub(crate) fn parse(bytes: &[u8], world: usize) -> Incoming {
        let (kind, p) = match wire::decode_message(bytes, fdpass::MAX_MESSAGE) {
            Ok(x) => x,
            Err(e) => return Incoming::Malformed(format!("it sent a malformed message: {e}")),
        };
        match kind {
            GATHER | TABLE => Incoming::Data(kind, p.to_vec()),
            FAIL => {
                let mut r = Reader::new(p);
                match (r.u32(), r.text(WHY_MAX)) {
                    (Some(who), Some(why)) if (who as usize) < world => Incoming::Failed {
                        who: who as usize,
                        why: why.to_string(),
                    },
                    _ => Incoming::Malformed("it sent a malformed failure report".into()),
                }
            }
            BYE => Incoming::Bye,
            k => Incoming::Malformed(format!(
                "it sent message kind {k}, unknown after the rendezvous"
            )),
        }
    }
}

/// Handles one message from rank `from`.
pub(super) fn dispatch(sh: &Shared, from: usize, bytes: &[u8]) {
    match Incoming::parse(bytes, sh.world) {
        Incoming::Data(kind, p) => {
            sh.lock().inbox.push_back((from, kind, p));
            sh.cv.notify_all();
        }
        Incoming::Failed { who, why } => {
            let why = if who == from {
                why
            } else {
                format!("{why} (reported by rank {from})")
            };
            sh.fail(who, why, Some(from));
        }
        Incoming::Bye => {
            sh.lock().bye[from] = true;
        }
        Incoming::Malformed(why) => sh.fail(from, why, None),
    }
}

/// The message that tells a rank of the group that rank `rank` failed, and why.
fn failure_report(rank: usize, why: &str) -> Vec<u8> {
    let body = Writer::new()
        .u32(rank as u32)
        .text_within(why, WHY_MAX)
        .finish();
    wire::encode_message(FAIL, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_to_the_reports_limit_at_a_character() {
        let long = "a".repeat(WHY_MAX + 10);
        let p = Writer::new().u32(3).text_within(&long, WHY_MAX).finish();
        let mut r = Reader::new(&p);
        assert_eq!(
            (r.u32(), r.text(WHY_MAX)),
            (Some(3), Some(&long[..WHY_MAX]))
        );
        // 'a' then two-byte characters: byte WHY_MAX falls inside the last one.
        let wide = format!("a{}", "é".repeat(WHY_MAX / 2));
        let p = Writer::new().text_within(&wide, WHY_MAX).finish();
        let cut = Reader::new(&p).text(WHY_MAX).map(str::to_string);
        assert_eq!(cut.as_deref(), Some(&wide[..WHY_MAX - 1]));
    }
}
