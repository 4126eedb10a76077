//! How the processes of one job find each other, prove they belong to it, and learn at once
//! when one of them dies.
//!
//! # The rendezvous
//! Every rank computes the same socket path from the job's identity ([`Rendezvous::job`]):
//! `<dir>/rv-<hash>.sock`, where `<dir>` is a directory only this user can enter
//! (`$P2P_RENDEZVOUS_DIR`, else `$XDG_RUNTIME_DIR/p2p-<uid>`, else `/tmp/p2p-<uid>`, created with
//! mode 0700 and refused if anyone else owns it or can enter it). Rank 0 listens there; the others
//! connect. The socket is a Unix `SOCK_SEQPACKET` socket: no TCP port is opened (so nothing
//! fights torchrun for `MASTER_PORT`), and the kernel tells each side the other's uid and pid
//! (`SO_PEERCRED`), which must match this user.
//!
//! Each connection then proves, both ways, that it knows the job's key: rank 0 sends a fresh
//! random challenge, the rank answers with its own challenge and an HMAC-SHA256 over both, its
//! rank and the world size, and rank 0 answers with an HMAC the rank checks before it trusts
//! anything rank 0 says. The key is derived from the job's identity and, if set, the job's secret
//! (`P2P_JOB_SECRET`, at least 16 characters; `p2p-bench launch` makes one for every job).
//! Without a secret, only the uid check and the job's identity keep strangers out: any process of
//! the same user that knows the identity could join.
//!
//! Rank 0 serves every connection in a thread of its own with a short deadline
//! ([`HANDSHAKE_TIMEOUT`]): a client that is silent, slow, speaks nonsense or fails the proof is
//! dropped with a log line and never delays or fails the real ranks. Every size field is bounded
//! before anything is allocated ([`p2p_mem::wire`] frames every message).
//!
//! # Liveness
//! After the rendezvous the connections stay open: a [`Group`] keeps one monitor thread that
//! polls them and the abort flags it was given. A peer process that dies (SIGKILL, a crash, an
//! exit without cleanup) closes its socket in the kernel at once; the monitor records a
//! [`Failure`] naming it, sets every abort flag (the kernels' waits end within microseconds),
//! and rank 0 relays the failure to every other rank. An abort on one rank (its flag set by the
//! user or by a failing kernel) reaches every rank the same way. A peer that says goodbye
//! ([`Group::close`]) before closing is not a failure.
//!
//! ```no_run
//! use p2p_transport::rendezvous::{Group, Rendezvous};
//! // RANK, WORLD_SIZE and MASTER_PORT (or P2P_JOB_ID) as torchrun or `p2p-bench launch` set them.
//! let rv = Rendezvous::from_env()?;
//! let group = Group::join(&rv)?;
//! let all = group.all_gather(format!("hello from {}", rv.rank).as_bytes())?;
//! assert_eq!(all.len(), rv.world);
//! # Ok::<(), p2p_transport::Error>(())
//! ```

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use p2p_mem::abort::AbortHandle;
use p2p_mem::fdpass::{self, FdChannel, FdListener};
use p2p_mem::wire::{self, Reader, Writer};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// How long a connecting process has to complete its half of the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many handshakes rank 0 serves at once; connections beyond are closed at once.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// The largest blob one rank may contribute to [`Group::all_gather`] in a small group; in a
/// larger one [`max_blob`] is less, as the table of all blobs must fit one socket message.
pub const MAX_BLOB: usize = 6 * 1024;

/// The largest blob one rank may contribute to [`Group::all_gather`] in a group of `world`
/// ranks: [`MAX_BLOB`], or less where `world` such blobs would not fit one socket message
/// (rank 0 sends them all in one table: its header and sequence number, then each blob with its
/// length). 1019 bytes at the largest world, [`MAX_WORLD`].
pub fn max_blob(world: usize) -> usize {
    let room = fdpass::MAX_MESSAGE - wire::MSG_HEADER_LEN - 4;
    (room / world.max(1)).saturating_sub(4).min(MAX_BLOB)
}
/// The most ranks a group holds.
pub const MAX_WORLD: usize = 64;
/// The shortest accepted `P2P_JOB_SECRET`.
pub const MIN_SECRET_LEN: usize = 16;
/// How much longer than its own time limit a rank that joined waits for rank 0's verdict (all
/// joined, or who did not): rank 0 keeps the time limit from its own start, which may come later
/// than this rank's. A rank 0 that dies is seen at once (its socket closes).
pub const VERDICT_GRACE: Duration = Duration::from_secs(1);
/// How often the monitor wakes to look at the abort flags.
const TICK: Duration = Duration::from_millis(5);

// Message kinds (the payload layouts are in the functions that write them).
const CHALLENGE: u16 = 1;
const HELLO: u16 = 2;
const WELCOME: u16 = 3;
const REFUSED: u16 = 4;
const READY: u16 = 5;
const GATHER: u16 = 10;
const TABLE: u16 = 11;
const FAIL: u16 = 12;
const BYE: u16 = 13;

type HmacSha256 = Hmac<Sha256>;

/// A job's secret: only processes that know it join the job. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from text (e.g. `P2P_JOB_SECRET`): at least [`MIN_SECRET_LEN`] characters.
    pub fn from_text(text: &str) -> Result<Secret> {
        if text.len() < MIN_SECRET_LEN {
            return Err(Error::Rendezvous {
                rank: None,
                why: format!(
                    "P2P_JOB_SECRET has {} characters; use at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 16`)",
                    text.len()
                ),
            });
        }
        Ok(Secret(Sha256::digest(text.as_bytes()).into()))
    }

    /// A fresh random secret as text (64 hex digits), for a launcher to hand to its ranks.
    pub fn generate_text() -> Result<String> {
        let bytes = random::<32>()?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Error::Rendezvous {
        rank: None,
        why: format!("the OS random source failed: {e}"),
    })?;
    Ok(b)
}

/// Where and as whom a process joins a job.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many processes join.
    pub world: usize,
    /// This process's rank among those on this host: its GPU ordinal by default.
    pub local_rank: usize,
    /// The job's identity: every rank of one job has the same, and no other job on this host
    /// does (see [`from_vars`](Self::from_vars) for how it is made from a launcher's variables).
    pub job: String,
    /// The job's secret, if the launcher gave one.
    pub secret: Option<Secret>,
    /// The directory of the rendezvous socket (`None`: the default, see the module docs).
    pub dir: Option<PathBuf>,
    /// How long to wait for the others.
    pub timeout: Duration,
}

impl Rendezvous {
    /// Rank `rank` of `world` in the job `job`, with no secret, the default directory and a
    /// 60 s time limit.
    pub fn new(rank: usize, world: usize, job: impl Into<String>) -> Rendezvous {
        Rendezvous {
            rank,
            world,
            local_rank: rank,
            job: job.into(),
            secret: None,
            dir: None,
            timeout: Duration::from_secs(60),
        }
    }

    /// From the variables torchrun and `p2p-bench launch` set (see
    /// [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<Rendezvous> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables read through `get`:
    /// - `RANK`, `WORLD_SIZE` (required), `LOCAL_RANK` (default `RANK`); `LOCAL_WORLD_SIZE`, if
    ///   set, must equal `WORLD_SIZE` (a job spans one host);
    /// - the job's identity: `P2P_JOB_ID` if set, else `MASTER_ADDR` (default `127.0.0.1`),
    ///   `MASTER_PORT`, `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT` (so a restarted
    ///   torchrun job never meets its previous attempt) and `WORLD_SIZE`; one of `P2P_JOB_ID` and
    ///   `MASTER_PORT` must be set. No port is opened: `MASTER_PORT` only names the job;
    /// - `P2P_JOB_SECRET`: the job's secret (optional, recommended);
    /// - `P2P_RENDEZVOUS_DIR`: where the socket lives (optional);
    /// - `P2P_RENDEZVOUS_TIMEOUT_MS`: how long to wait for the other ranks (default 60000).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let bad = |why: String| Error::Rendezvous { rank: None, why };
        let num = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| bad(format!("{name}={v:?} is not a whole number"))),
            }
        };
        let rank = num("RANK")?.ok_or_else(|| {
            bad("RANK is not set: start the processes with `p2p-bench launch -n N -- CMD` or torchrun".into())
        })?;
        let world = num("WORLD_SIZE")?.ok_or_else(|| bad("WORLD_SIZE is not set".into()))?;
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank);
        if world == 0 || rank >= world {
            return Err(bad(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        if world > MAX_WORLD {
            return Err(bad(format!("WORLD_SIZE={world} is above {MAX_WORLD}")));
        }
        if let Some(lw) = num("LOCAL_WORLD_SIZE")? {
            if lw != world {
                return Err(bad(format!(
                    "LOCAL_WORLD_SIZE={lw} but WORLD_SIZE={world}: p2p communicators span one host, so start one job per host"
                )));
            }
        }
        let job = match get("P2P_JOB_ID") {
            Some(id) if !id.is_empty() => format!("id:{id}/{world}"),
            _ => {
                let port = num("MASTER_PORT")?.ok_or_else(|| {
                    bad("neither P2P_JOB_ID nor MASTER_PORT is set: the ranks cannot tell which job they belong to".into())
                })?;
                format!(
                    "torch:{}:{port}/{}/{}/{world}",
                    get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
                    get("TORCHELASTIC_RUN_ID").unwrap_or_default(),
                    get("TORCHELASTIC_RESTART_COUNT").unwrap_or_default(),
                )
            }
        };
        let secret = match get("P2P_JOB_SECRET") {
            Some(s) => Some(Secret::from_text(&s)?),
            None => None,
        };
        let timeout = match num("P2P_RENDEZVOUS_TIMEOUT_MS")? {
            None => Duration::from_secs(60),
            Some(ms) if ms >= 1 && Duration::from_millis(ms as u64) <= crate::MAX_TIMEOUT => {
                Duration::from_millis(ms as u64)
            }
            Some(ms) => {
                return Err(bad(format!(
                    "P2P_RENDEZVOUS_TIMEOUT_MS={ms}: use 1 to 86400000 (one day)"
                )))
            }
        };
        Ok(Rendezvous {
            rank,
            world,
            local_rank,
            job,
            secret,
            dir: get("P2P_RENDEZVOUS_DIR").map(PathBuf::from),
            timeout,
        })
    }

    /// The socket rank 0 listens on.
    pub fn socket_path(&self) -> PathBuf {
        let dir = self.dir.clone().unwrap_or_else(default_dir);
        let h = Sha256::digest(self.job.as_bytes());
        let hex: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
        dir.join(format!("rv-{hex}.sock"))
    }

    /// The key both sides prove they hold: the job's identity and, if set, its secret.
    fn key(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"p2p rendezvous key v1\0");
        h.update(self.job.as_bytes());
        h.update([0u8]);
        if let Some(s) = &self.secret {
            h.update(s.0);
        }
        h.finalize().into()
    }
}

/// Whether a job identity built from torchrun's variables holds a run id shaped like the random
/// UUID `torchrun --standalone` makes (`8-4-4-4-12` hex digits): a value only the job's processes
/// were given, which makes the key unguessable without reading their environment.
fn job_holds_random_run_id(job: &str) -> bool {
    let Some(rest) = job.strip_prefix("torch:") else {
        return false;
    };
    let Some(run_id) = rest.split('/').nth(1) else {
        return false;
    };
    let groups: Vec<&str> = run_id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn default_dir() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("p2p-{uid}"))
}

/// HMAC-SHA256 with `key` over `label` and each field, length-prefixed (so fields cannot be
/// shifted into one another). `None` only if the key were refused, which HMAC never does.
fn hmac_of(key: &[u8; 32], label: &[u8], fields: &[&[u8]]) -> Option<HmacSha256> {
    let mut m = HmacSha256::new_from_slice(key).ok()?;
    m.update(label);
    for f in fields {
        m.update(&(f.len() as u32).to_le_bytes());
        m.update(f);
    }
    Some(m)
}

fn mac(key: &[u8; 32], label: &[u8], fields: &[&[u8]]) -> [u8; 32] {
    hmac_of(key, label, fields).map_or([0; 32], |m| m.finalize().into_bytes().into())
}

fn mac_ok(key: &[u8; 32], label: &[u8], fields: &[&[u8]], got: &[u8; 32]) -> bool {
    // `verify_slice` compares in constant time.
    hmac_of(key, label, fields).is_some_and(|m| m.verify_slice(got).is_ok())
}

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

struct State {
    failure: Option<Failure>,
    /// Messages for the caller: (from rank, kind, payload).
    inbox: VecDeque<(usize, u16, Vec<u8>)>,
    /// Peers that said goodbye: their hang-up is not a failure.
    bye: Vec<bool>,
}

struct Shared {
    rank: usize,
    world: usize,
    /// `links[r]`: the connection to rank `r` (rank 0 holds all, the others only rank 0's).
    links: Vec<Option<Arc<FdChannel>>>,
    state: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
    aborts: Mutex<Vec<AbortHandle>>,
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
        let msg = wire::encode_message(FAIL, &Writer::new().u32(rank as u32).text(&why).finish());
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

fn send(link: &FdChannel, kind: u16, payload: &[u8]) -> p2p_mem::Result<()> {
    link.send_msg(&wire::encode_message(kind, payload))
}

/// Rank 0 gives up the rendezvous: tells every rank that joined (`links`), and those whose
/// handshake has just completed (`also`: the rank at fault among them), why; they fail with
/// that reason, naming the rank at fault, rather than with rank 0's hang-up. Returns `why`.
fn stop_rendezvous<'a>(
    links: &'a [Option<Arc<FdChannel>>],
    also: impl IntoIterator<Item = &'a FdChannel>,
    why: String,
) -> String {
    let refusal = Writer::new().text(&why).finish();
    for l in links.iter().flatten().map(|l| &**l).chain(also) {
        // A rank that is gone cannot be told; the others can.
        let _ = send(l, REFUSED, &refusal);
    }
    why
}

/// Receives one message of `kind` within `timeout`; anything else is an error in words.
fn expect(
    link: &FdChannel,
    kind: u16,
    max: usize,
    timeout: Duration,
) -> std::result::Result<Vec<u8>, String> {
    let bytes = link
        .recv_msg_within(timeout)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("nothing arrived within {timeout:?}"))?;
    // A refusal carries its reason, so it may be longer than the message expected.
    let (k, p) = wire::decode_message(&bytes, max.max(1024)).map_err(|e| e.to_string())?;
    if k != REFUSED && p.len() > max {
        return Err(format!(
            "a {}-byte message of kind {k} (at most {max})",
            p.len()
        ));
    }
    if k == REFUSED {
        let why = Reader::new(p)
            .text(1024)
            .unwrap_or("(unreadable reason)")
            .to_string();
        return Err(format!("refused: {why}"));
    }
    if k != kind {
        return Err(format!("expected message kind {kind}, got {k}"));
    }
    Ok(p.to_vec())
}

/// As [`expect`] until `until`, but a few milliseconds at a time, looking between them at what
/// the launcher said (`news`): a rank it reports ended is an error at once.
fn expect_hearing_launcher(
    link: &FdChannel,
    kind: u16,
    max: usize,
    until: Instant,
    news: impl Fn() -> Option<crate::launch::Ended>,
) -> std::result::Result<Vec<u8>, String> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match expect(link, kind, max, left.clamp(TICK, 4 * TICK)) {
            Err(why) if why.starts_with("nothing arrived") && !left.is_zero() => {}
            other => return other,
        }
        if let Some(ended) = news() {
            return Err(format!("launcher: {ended}, before every rank joined"));
        }
    }
}

/// A rank's side of the handshake. `Err((true, _))`: worth trying again (nothing or a closed
/// connection before the challenge); `Err((false, _))`: refused or an impostor.
fn client_handshake(
    link: FdChannel,
    key: &[u8; 32],
    rank: usize,
    world: usize,
) -> std::result::Result<FdChannel, (bool, String)> {
    let nonce_s = expect(&link, CHALLENGE, 32, HANDSHAKE_TIMEOUT).map_err(|w| (true, w))?;
    let nonce_c = random::<32>().map_err(|e| (false, e.to_string()))?;
    let (rb, wb) = ((rank as u32).to_le_bytes(), (world as u32).to_le_bytes());
    let proof = mac(key, b"hello", &[&nonce_s, &nonce_c, &rb, &wb]);
    let hello = Writer::new()
        .u32(rank as u32)
        .u32(world as u32)
        .bytes(&nonce_c)
        .bytes(&proof)
        .finish();
    send(&link, HELLO, &hello).map_err(|e| (false, e.to_string()))?;
    let welcome = expect(&link, WELCOME, 32, HANDSHAKE_TIMEOUT).map_err(|w| (false, w))?;
    let theirs: [u8; 32] = welcome
        .as_slice()
        .try_into()
        .map_err(|_| (false, "a malformed welcome".to_string()))?;
    if !mac_ok(key, b"welcome", &[&nonce_c, &nonce_s, &rb, &wb], &theirs) {
        return Err((
            false,
            "the listener could not prove it holds the job's key: not rank 0 of this job".into(),
        ));
    }
    Ok(link)
}

/// A connection rank 0 accepted and authenticated.
struct Joined {
    rank: usize,
    world: usize,
    pid: u32,
    link: FdChannel,
}

/// Rank 0's side of one handshake (run in its own thread, within `HANDSHAKE_TIMEOUT`).
fn serve_handshake(mut link: FdChannel, key: [u8; 32]) -> std::result::Result<Joined, String> {
    link.set_timeout(HANDSHAKE_TIMEOUT);
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let left = || deadline.saturating_duration_since(Instant::now());
    let (pid, _) = link.peer_cred().map_err(|e| e.to_string())?;
    let nonce_s = random::<32>().map_err(|e| e.to_string())?;
    send(&link, CHALLENGE, &nonce_s).map_err(|e| e.to_string())?;
    let hello = expect(&link, HELLO, 128, left())?;
    let mut r = Reader::new(&hello);
    let fields = (|| {
        let rank = r.u32()?;
        let world = r.u32()?;
        let nonce_c = r.array::<32>()?;
        let got = r.array::<32>()?;
        r.end()?;
        Some((rank, world, nonce_c, got))
    })();
    let (rank, world, nonce_c, got) = fields.ok_or("a malformed hello")?;
    let (rb, wb) = (rank.to_le_bytes(), world.to_le_bytes());
    if !mac_ok(&key, b"hello", &[&nonce_s, &nonce_c, &rb, &wb], &got) {
        let _ = send(
            &link,
            REFUSED,
            &Writer::new()
                .text("authentication failed: this process does not hold the job's key (another job, or a different P2P_JOB_SECRET)")
                .finish(),
        );
        return Err(format!(
            "process {pid} claiming rank {rank} failed authentication"
        ));
    }
    let proof = mac(&key, b"welcome", &[&nonce_c, &nonce_s, &rb, &wb]);
    send(&link, WELCOME, &proof).map_err(|e| e.to_string())?;
    Ok(Joined {
        rank: rank as usize,
        world: world as usize,
        pid,
        link,
    })
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
            } else {
                crate::warn_user!(
                    "rank {rank}: no P2P_JOB_SECRET, and the job's identity holds no random value, so another process of this user that knows the identity could join this job's rendezvous: export one P2P_JOB_SECRET to every rank (e.g. `export P2P_JOB_SECRET=$(openssl rand -hex 16)` before starting them), or start the job with `torchrun --standalone` (a random run id) or `p2p-bench launch` (a secret for every job)"
                );
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
            let (tx, rx) = mpsc::channel::<std::result::Result<Joined, String>>();
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
                    let report = wire::encode_message(
                        FAIL,
                        &Writer::new().u32(r as u32).text(&why).finish(),
                    );
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
                    .map_err(|e| (true, e.to_string()))
                    .and_then(|link| client_handshake(link, &key, rank, rv.world));
                match attempt {
                    Ok(link) => break link,
                    Err((false, why)) => return Err(fail(format!("handshake with rank 0: {why}"))),
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
                if let Some(ended) = why.strip_prefix("launcher: ") {
                    return fail(ended.to_string());
                }
                fail(match why.strip_prefix("refused: ") {
                    Some(why) => {
                        format!(
                            "waiting for every rank to join: rank 0 stopped the rendezvous: {why}"
                        )
                    }
                    // Rank 0 is alive (its socket is open) but gave no verdict.
                    None if why.starts_with("nothing arrived") => format!(
                        "waiting for every rank to join: rank 0 gave no word (all joined, or who did not) within {:?} of this rank's start: it is still waiting (did it start more than {VERDICT_GRACE:?} after this rank, or with a longer P2P_RENDEZVOUS_TIMEOUT_MS?) or is stuck",
                        rv.timeout + VERDICT_GRACE
                    ),
                    None => format!("waiting for every rank to join: rank 0 failed or left: {why}"),
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
        Error::PeerFailed {
            rank: self.shared.rank,
            peer: f.rank,
            why: f.why,
        }
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
                    return Err(format!("rank {from} sent message kind {kind} during an all-gather"));
                }
                let mut r = Reader::new(p);
                let s = r.u32().ok_or("a malformed all-gather message")?;
                let blob = r.blob(limit).ok_or("a malformed all-gather message")?;
                r.end().ok_or("a malformed all-gather message")?;
                if s != seq || all[from].is_some() {
                    return Err(format!(
                        "rank {from} is at all-gather #{s}, rank 0 at #{seq}: the ranks made different calls"
                    ));
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
                    return Err(format!(
                        "rank {from} sent message kind {kind} during an all-gather"
                    ));
                }
                let mut r = Reader::new(p);
                let s = r.u32().ok_or("a malformed all-gather table")?;
                if s != seq {
                    return Err(format!(
                        "rank 0 answered all-gather #{s}, this rank is at #{seq}"
                    ));
                }
                let mut all = Vec::with_capacity(world);
                for _ in 0..world {
                    all.push(
                        r.blob(limit)
                            .ok_or("a malformed all-gather table")?
                            .to_vec(),
                    );
                }
                r.end().ok_or("a malformed all-gather table")?;
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
        mut take: impl FnMut(usize, u16, &[u8]) -> std::result::Result<bool, String>,
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
                        sh.fail(from, why.clone(), None);
                        return Err(Error::PeerFailed {
                            rank: sh.rank,
                            peer: from,
                            why,
                        });
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
fn monitor(sh: &Shared) {
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

/// Handles one message from rank `from`.
fn dispatch(sh: &Shared, from: usize, bytes: &[u8]) {
    let limit = fdpass::MAX_MESSAGE;
    let (kind, p) = match wire::decode_message(bytes, limit) {
        Ok(x) => x,
        Err(e) => {
            sh.fail(from, format!("it sent a malformed message: {e}"), None);
            return;
        }
    };
    match kind {
        GATHER | TABLE => {
            sh.lock().inbox.push_back((from, kind, p.to_vec()));
            sh.cv.notify_all();
        }
        FAIL => {
            let mut r = Reader::new(p);
            match (r.u32(), r.text(4096)) {
                (Some(who), Some(why)) if (who as usize) < sh.world => {
                    let why = if who as usize == from {
                        why.to_string()
                    } else {
                        format!("{why} (reported by rank {from})")
                    };
                    sh.fail(who as usize, why, Some(from));
                }
                _ => sh.fail(from, "it sent a malformed failure report".into(), None),
            }
        }
        BYE => {
            sh.lock().bye[from] = true;
        }
        k => sh.fail(
            from,
            format!("it sent message kind {k}, unknown after the rendezvous"),
            None,
        ),
    }
}

/// Test and fault-injection helpers: raw steps of the protocol, to play a stranger or a broken
/// rank against a real one. Not for production use.
pub mod testing {
    use super::*;

    /// Connects to `rv`'s socket as a process that knows `key_of` (a rendezvous whose key it
    /// uses: the same job for a real member, another job or secret for a stranger), claims
    /// `claim_rank`, and returns what rank 0 said: `Ok` if it was welcomed and rank 0 proved
    /// itself, `Err` with the reason otherwise.
    pub fn try_join(
        rv: &Rendezvous,
        key_of: &Rendezvous,
        claim_rank: u32,
        timeout: Duration,
    ) -> std::result::Result<FdChannel, String> {
        let link = connect_raw(&rv.socket_path(), timeout)?;
        client_handshake(link, &key_of.key(), claim_rank as usize, rv.world).map_err(|(_, w)| w)
    }

    /// Connects to `path` and returns the raw channel (to send junk, or nothing).
    pub fn connect_raw(path: &Path, timeout: Duration) -> std::result::Result<FdChannel, String> {
        let deadline = Instant::now() + timeout.min(crate::MAX_TIMEOUT);
        loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            match FdChannel::connect_within(path, left) {
                Ok(l) => return Ok(l),
                Err(e) if Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Sends `bytes` as one raw message.
    pub fn send_raw(link: &FdChannel, bytes: &[u8]) -> std::result::Result<(), String> {
        link.send_msg(bytes).map_err(|e| e.to_string())
    }

    /// A well-formed message of `kind` with `payload`.
    pub fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        wire::encode_message(kind, payload)
    }

    /// Listens at `rv`'s socket as a fake rank 0 that holds `key_of`'s key and answers every
    /// hello with a welcome (proved with that key): a real rank must refuse it unless the keys
    /// match. Serves `count` connections, then returns.
    pub fn fake_rank0(
        rv: &Rendezvous,
        key_of: &Rendezvous,
        count: usize,
        timeout: Duration,
    ) -> Result<()> {
        let path = rv.socket_path();
        if let Some(dir) = path.parent() {
            fdpass::user_private_dir(dir)?;
        }
        let listener = FdListener::bind_replacing_stale(&path)?;
        let key = key_of.key();
        for _ in 0..count {
            let Some(link) = listener.accept_within(timeout)? else {
                return Ok(());
            };
            let _ = serve_handshake(link, key);
        }
        Ok(())
    }

    /// The raw message kinds, for building forged messages.
    pub const KINDS: [u16; 9] = [
        CHALLENGE, HELLO, WELCOME, REFUSED, READY, GATHER, TABLE, FAIL, BYE,
    ];
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

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

    fn join_all(name: &'static str, world: usize) -> Vec<std::thread::JoinHandle<Result<Group>>> {
        (0..world)
            .map(|r| std::thread::spawn(move || Group::join(&rv(name, r, world))))
            .collect()
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
        let r = Rendezvous {
            timeout: Duration::from_millis(300),
            ..rv("missing", 0, 3)
        };
        let e = Group::join(&r).expect_err("must time out").to_string();
        assert!(e.contains("ranks [1, 2] did not join"), "{e}");
    }

    /// Ranks 1 and 2 of a 4-rank job `name` join with time limit `limit`, each on a thread.
    fn ranks_1_and_2(
        name: &'static str,
        limit: Duration,
    ) -> Vec<std::thread::JoinHandle<Result<Group>>> {
        (1..3)
            .map(|r| {
                std::thread::spawn(move || {
                    Group::join(&Rendezvous {
                        timeout: limit,
                        ..rv(name, r, 4)
                    })
                })
            })
            .collect()
    }

    /// Rank 0 gave up for want of rank 3 (`e0`), and ranks 1 and 2 heard why from it.
    fn all_heard_rank_3_is_missing(e0: &str, others: Vec<std::thread::JoinHandle<Result<Group>>>) {
        assert!(e0.contains("ranks [3] did not join"), "{e0}");
        for (r, g) in (1..3).zip(others) {
            let e = g.join().expect("t").expect_err("stopped").to_string();
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
        let rank = |r| Rendezvous {
            timeout: limit,
            ..rv(name, r, 2)
        };
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
        let r0 = Rendezvous {
            timeout: Duration::from_millis(400),
            ..rv(name, 0, 4)
        };
        let g0 = std::thread::spawn(move || Group::join(&r0));
        let t = Instant::now();
        let others = ranks_1_and_2(name, Duration::from_secs(5));
        let e0 = g0.join().expect("t").expect_err("rank 3 never came");
        all_heard_rank_3_is_missing(&e0.to_string(), others);
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
        let r0 = Rendezvous {
            timeout: limit,
            ..rv(name, 0, 4)
        };
        let e0 = Group::join(&r0).expect_err("rank 3 never came");
        all_heard_rank_3_is_missing(&e0.to_string(), others);
    }

    #[test]
    fn two_processes_with_one_rank_both_hear_why() {
        let name = "same-rank";
        let world = 3;
        let g0 = std::thread::spawn(move || Group::join(&rv(name, 0, world)));
        let first = std::thread::spawn(move || Group::join(&rv(name, 1, world)));
        std::thread::sleep(Duration::from_millis(200));
        // A second process claims rank 1: rank 0 stops, and tells both why (the second one
        // too, though it never joined).
        let e = Group::join(&rv(name, 1, world))
            .expect_err("rank 1 is taken")
            .to_string();
        assert!(
            e.contains("rank 0 stopped the rendezvous") && e.contains("claims rank 1"),
            "{e}"
        );
        let e = first.join().expect("t").expect_err("stopped").to_string();
        assert!(e.contains("claims rank 1, which is taken"), "{e}");
        let e0 = g0.join().expect("t").expect_err("stopped").to_string();
        assert!(e0.contains("do two processes have the same RANK?"), "{e0}");
    }

    #[test]
    fn a_rank_told_before_one_that_left_learns_which() {
        let name = "left-later";
        let world = 3;
        let g0 = std::thread::spawn(move || Group::join(&rv(name, 0, world)));
        // Rank 2 joins by hand and leaves; rank 1 joins after it. Rank 0 tells rank 1 that
        // all joined, fails to tell rank 2, and reports rank 2 to rank 1.
        let r2 = rv(name, 2, world);
        drop(try_join(&r2, &r2, 2, Duration::from_secs(5)).expect("rank 2 joins"));
        std::thread::sleep(Duration::from_millis(100));
        let g1 = Group::join(&rv(name, 1, world)).expect("rank 1 was told that all joined");
        let start = Instant::now();
        while g1.failure().is_none() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let f = g1.failure().expect("rank 1 learns");
        assert_eq!(f.rank, 2);
        assert!(f.why.contains("left after joining"), "{}", f.why);
        let e0 = g0.join().expect("t").expect_err("rank 2 left").to_string();
        assert!(e0.contains("telling rank 2 that all joined"), "{e0}");
    }

    #[test]
    fn a_rank_that_leaves_after_joining_is_named_to_the_others() {
        let name = "left";
        let world = 3;
        let g0 = std::thread::spawn(move || Group::join(&rv(name, 0, world)));
        // Rank 1 joins by hand and leaves before rank 0 tells it that all joined.
        let r1 = rv(name, 1, world);
        drop(try_join(&r1, &r1, 1, Duration::from_secs(5)).expect("rank 1 joins"));
        std::thread::sleep(Duration::from_millis(100));
        let e2 = Group::join(&rv(name, 2, world))
            .expect_err("rank 1 left")
            .to_string();
        assert!(
            e2.contains("rank 0 stopped the rendezvous: rank 1")
                && e2.contains("left after joining"),
            "{e2}"
        );
        let e0 = g0.join().expect("t").expect_err("rank 1 left").to_string();
        assert!(e0.contains("telling rank 1 that all joined"), "{e0}");
    }

    #[test]
    fn strangers_are_refused_and_never_delay_the_real_ranks() {
        let name = "strangers";
        let r0 = std::thread::spawn(move || Group::join(&rv(name, 0, 2)));
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
            let e = try_join(&real, key, 1, t).expect_err("a stranger must be refused");
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
        let start = Instant::now();
        let g1 = Group::join(&real).expect("the real rank joins");
        let g0 = r0.join().expect("thread").expect("rank 0 joins");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let other = std::thread::spawn(move || g1.all_gather(b"y").map(|a| a.len()));
        assert_eq!(g0.all_gather(b"x").expect("gather").len(), 2);
        assert_eq!(other.join().expect("thread").expect("gather"), 2);
        drop(silent);
    }

    #[test]
    fn random_and_mutated_handshakes_never_get_in_or_stop_the_real_ranks() {
        let name = "fuzz";
        let r0 = std::thread::spawn(move || Group::join(&rv(name, 0, 2)));
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
        let start = Instant::now();
        let g1 = Group::join(&real).expect("the real rank joins");
        let g0 = r0.join().expect("thread").expect("rank 0 joins");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
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
        let e = Group::join(&real)
            .expect_err("must refuse the impostor")
            .to_string();
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
        let g0 = std::thread::spawn(move || Group::join(&rv(name, 0, world)));
        let g1 = std::thread::spawn(move || Group::join(&rv(name, 1, world)));
        // Rank 2 joins by hand and then "dies": its socket closes without a goodbye.
        let r2 = rv(name, 2, world);
        let link = try_join(&r2, &r2, 2, Duration::from_secs(5)).expect("rank 2 joins");
        let (g0, g1) = (
            g0.join().expect("t").expect("rank 0"),
            g1.join().expect("t").expect("rank 1"),
        );
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
        let groups: Vec<Group> = handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("join"))
            .collect();
        groups[2].abort("the user gave up");
        let start = Instant::now();
        for g in &groups {
            while g.failure().is_none() && start.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let f = g.failure().expect("every rank learns");
            assert_eq!(f.rank, 2);
            assert!(f.why.contains("the user gave up"), "{}", f.why);
        }
        assert!(start.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn a_forged_failure_or_unknown_message_after_the_rendezvous_stops_the_group() {
        let name = "forged";
        let g0 = std::thread::spawn(move || Group::join(&rv(name, 0, 2)));
        let r1 = rv(name, 1, 2);
        let link = try_join(&r1, &r1, 1, Duration::from_secs(5)).expect("join");
        let g0 = g0.join().expect("t").expect("rank 0");
        // A failure report that names a rank out of range is itself the sender's failure.
        send_raw(
            &link,
            &message(FAIL, &Writer::new().u32(77).text("x").finish()),
        )
        .expect("send");
        let start = Instant::now();
        while g0.failure().is_none() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let f = g0.failure().expect("stopped");
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
            .map(|h| h.join().expect("thread").expect("join"))
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
            let r = Rendezvous {
                timeout,
                ..rv("limits", 0, 1)
            };
            let e = Group::join(&r).expect_err("an unusable time limit");
            assert!(e.to_string().contains("one day"), "{e}");
        }
    }

    #[test]
    fn only_torchruns_random_run_id_counts_as_a_random_part_of_the_job() {
        let job = |run_id: &str| {
            Rendezvous::from_vars(|k| match k {
                "RANK" => Some("0".into()),
                "WORLD_SIZE" => Some("2".into()),
                "MASTER_PORT" => Some("29500".into()),
                "TORCHELASTIC_RUN_ID" => Some(run_id.into()),
                _ => None,
            })
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
        let vars = |v: &'static [(&'static str, &'static str)]| {
            move |k: &str| v.iter().find(|(n, _)| *n == k).map(|(_, x)| x.to_string())
        };
        let r = Rendezvous::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
        ]))
        .expect("valid");
        assert_eq!((r.rank, r.world, r.local_rank), (1, 2, 1));
        let restarted = Rendezvous::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ]))
        .expect("valid");
        assert_ne!(r.socket_path(), restarted.socket_path());
        assert!(r.secret.is_none());
        let e = Rendezvous::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "2")]))
            .expect_err("no job identity");
        assert!(e.to_string().contains("P2P_JOB_ID nor MASTER_PORT"), "{e}");
        let e = Rendezvous::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("P2P_JOB_ID", "j"),
        ]))
        .expect_err("two hosts");
        assert!(e.to_string().contains("span one host"), "{e}");
        let e = Rendezvous::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("P2P_JOB_ID", "j"),
            ("P2P_JOB_SECRET", "short"),
        ]))
        .expect_err("short secret");
        assert!(e.to_string().contains("at least 16"), "{e}");
        let e = Rendezvous::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .expect_err("rank too big");
        assert!(e.to_string().contains("not below WORLD_SIZE"), "{e}");
        // The secret never shows in debug output.
        let with = Rendezvous::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("P2P_JOB_ID", "j"),
            ("P2P_JOB_SECRET", "0123456789abcdef-secret"),
        ]))
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
        let e = Group::join(&r).expect_err("must refuse").to_string();
        assert!(e.contains("not a private directory"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
