//! One connection's proof, both ways, that it holds the job's key, and the framed messages of
//! the rendezvous.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::Mac;
use p2p_mem::fdpass::FdChannel;
use p2p_mem::wire::{self, Reader, Writer};

use super::*;

/// HMAC-SHA256 with `key` over `label` and each field, length-prefixed (so fields cannot be
/// shifted into one another). `None` only if the key were refused, which HMAC never does.
pub(super) fn hmac_of(key: &[u8; 32], label: &[u8], fields: &[&[u8]]) -> Option<HmacSha256> {
    let mut m = HmacSha256::new_from_slice(key).ok()?;
    m.update(label);
    for f in fields {
        m.update(&(f.len() as u32).to_le_bytes());
        m.update(f);
    }
    Some(m)
}

pub(super) fn mac(key: &[u8; 32], label: &[u8], fields: &[&[u8]]) -> [u8; 32] {
    hmac_of(key, label, fields).map_or([0; 32], |m| m.finalize().into_bytes().into())
}

pub(super) fn mac_ok(key: &[u8; 32], label: &[u8], fields: &[&[u8]], got: &[u8; 32]) -> bool {
    // `verify_slice` compares in constant time.
    hmac_of(key, label, fields).is_some_and(|m| m.verify_slice(got).is_ok())
}

pub(super) fn send(link: &FdChannel, kind: u16, payload: &[u8]) -> p2p_mem::Result<()> {
    link.send_msg(&wire::encode_message(kind, payload))
}

/// Rank 0 gives up the rendezvous: tells every rank that joined (`links`), and those whose
/// handshake has just completed (`also`: the rank at fault among them), why; they fail with
/// that reason, naming the rank at fault, rather than with rank 0's hang-up. Returns `why`.
pub(super) fn stop_rendezvous<'a>(
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

/// Why one connection of the rendezvous failed its handshake, or a rank's wait for rank 0's
/// word: what [`testing::try_join`](super::testing::try_join) returns, and what the
/// rendezvous's errors ([`Error::Rendezvous`](crate::Error::Rendezvous)) and rank 0's log
/// lines say after their context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The connection failed: connecting, sending, receiving, or the peer's credentials.
    #[error(transparent)]
    Link(#[from] p2p_mem::Error),
    /// The peer said nothing within the time limit.
    #[error("nothing arrived within {waited:?}")]
    Silent {
        /// How long this side waited.
        waited: Duration,
    },
    /// The bytes are not a framed message.
    #[error(transparent)]
    Malformed(#[from] wire::DecodeError),
    /// A message longer than its kind allows.
    #[error("a {len}-byte message of kind {kind} (at most {max})")]
    TooLong {
        /// The payload's length.
        len: usize,
        /// The message kind.
        kind: u16,
        /// The most that kind may carry.
        max: usize,
    },
    /// The other side refused, saying why (rank 0 stopping the rendezvous, or refusing a
    /// process that does not hold the job's key).
    #[error("refused: {why}")]
    Refused {
        /// The other side's reason, as it sent it.
        why: String,
    },
    /// A message of another kind than the protocol's next step.
    #[error("expected message kind {expected}, got {got}")]
    UnexpectedKind {
        /// The kind the protocol expects now.
        expected: u16,
        /// The kind that came.
        got: u16,
    },
    /// The launcher reported a rank ended while this rank waited for the others.
    #[error("launcher: {0}, before every rank joined")]
    Launcher(crate::launch::Ended),
    /// This process could not make a random challenge.
    #[error("the OS random source failed: {0}")]
    Random(#[source] std::io::Error),
    /// A connecting process's hello does not have the hello's fields.
    #[error("a malformed hello")]
    MalformedHello,
    /// A connecting process could not prove it holds the job's key.
    #[error("process {pid} claiming rank {rank} failed authentication")]
    Unauthenticated {
        /// Its process id (from the kernel).
        pid: u32,
        /// The rank it claimed.
        rank: u32,
    },
    /// Rank 0's welcome does not have the welcome's fields.
    #[error("a malformed welcome")]
    MalformedWelcome,
    /// The listener could not prove it holds the job's key.
    #[error("the listener could not prove it holds the job's key: not rank 0 of this job")]
    NotRank0,
}

/// A client's hello: its rank and world size, its nonce, and its proof of the key over both
/// nonces and the two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub rank: u32,
    pub world: u32,
    pub nonce: [u8; 32],
    pub mac: [u8; 32],
}

impl Hello {
    /// The hello in `b`, or `None` for anything else.
    pub(crate) fn parse(b: &[u8]) -> Option<Hello> {
        let mut r = Reader::new(b);
        let hello = Hello {
            rank: r.u32()?,
            world: r.u32()?,
            nonce: r.array::<32>()?,
            mac: r.array::<32>()?,
        };
        r.end()?;
        Some(hello)
    }

    /// The bytes [`parse`](Self::parse) reads.
    pub(crate) fn encode(&self) -> Vec<u8> {
        Writer::new()
            .u32(self.rank)
            .u32(self.world)
            .bytes(&self.nonce)
            .bytes(&self.mac)
            .finish()
    }
}

/// Receives one message of `kind` within `timeout`; anything else is an error.
pub(super) fn expect(
    link: &FdChannel,
    kind: u16,
    max: usize,
    timeout: Duration,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    let bytes = link
        .recv_msg_within(timeout)?
        .ok_or(HandshakeError::Silent { waited: timeout })?;
    reply(&bytes, kind, max)
}

/// The payload of `bytes` if it is a message of `kind` of at most `max` bytes; a refusal, a
/// message of another kind or a malformed one is an error.
pub(crate) fn reply(
    bytes: &[u8],
    kind: u16,
    max: usize,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    // A refusal carries its reason, so it may be longer than the message expected.
    let (k, p) = wire::decode_message(bytes, max.max(1024))?;
    if k != REFUSED && p.len() > max {
        return Err(HandshakeError::TooLong {
            len: p.len(),
            kind: k,
            max,
        });
    }
    if k == REFUSED {
        let why = Reader::new(p)
            .text(1024)
            .unwrap_or("(unreadable reason)")
            .to_string();
        return Err(HandshakeError::Refused { why });
    }
    if k != kind {
        return Err(HandshakeError::UnexpectedKind {
            expected: kind,
            got: k,
        });
    }
    Ok(p.to_vec())
}

/// As [`expect`] until `until`, but a few milliseconds at a time, looking between them at what
/// the launcher said (`news`): a rank it reports ended is an error at once.
pub(super) fn expect_hearing_launcher(
    link: &FdChannel,
    kind: u16,
    max: usize,
    until: Instant,
    news: impl Fn() -> Option<crate::launch::Ended>,
) -> std::result::Result<Vec<u8>, HandshakeError> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match expect(link, kind, max, left.clamp(TICK, 4 * TICK)) {
            Err(HandshakeError::Silent { .. }) if !left.is_zero() => {}
            // The other side is gone. If a launcher says a rank ended, that is the cause (the
            // other side may have left because it heard it first), so it is what this rank
            // reports; the news may arrive a moment after the socket closed.
            Err(e) => {
                return Err(match news_within(&news) {
                    Some(ended) => HandshakeError::Launcher(ended),
                    None => e,
                })
            }
            ok => return ok,
        }
        if let Some(ended) = news() {
            return Err(HandshakeError::Launcher(ended));
        }
    }
}

/// How long a rank whose peer's socket closed listens for its launcher's word on which rank
/// ended, before it reports the closed socket itself (the failure path only).
const NEWS_GRACE: Duration = Duration::from_millis(200);

/// After a peer's socket closed: the rank the launcher says ended, if it says so within
/// [`NEWS_GRACE`] (that rank's end is the cause; the peer may have left because it heard it
/// first). `None` after the grace where the launcher said nothing (or nothing launched the
/// job).
pub(super) fn news_within(
    news: impl Fn() -> Option<crate::launch::Ended>,
) -> Option<crate::launch::Ended> {
    let heard_by = Instant::now() + NEWS_GRACE;
    loop {
        if let Some(ended) = news() {
            return Some(ended);
        }
        if Instant::now() >= heard_by {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A rank's side of the handshake. `Err((true, _))`: worth trying again (nothing or a closed
/// connection before the challenge); `Err((false, _))`: refused or an impostor.
pub(super) fn client_handshake(
    link: FdChannel,
    key: &[u8; 32],
    rank: usize,
    world: usize,
) -> std::result::Result<FdChannel, (bool, HandshakeError)> {
    let nonce_s = expect(&link, CHALLENGE, 32, HANDSHAKE_TIMEOUT).map_err(|w| (true, w))?;
    let nonce_c = random::<32>().map_err(|e| (false, HandshakeError::Random(e)))?;
    let (rb, wb) = ((rank as u32).to_le_bytes(), (world as u32).to_le_bytes());
    let proof = mac(key, b"hello", &[&nonce_s, &nonce_c, &rb, &wb]);
    let hello = Hello {
        rank: rank as u32,
        world: world as u32,
        nonce: nonce_c,
        mac: proof,
    }
    .encode();
    send(&link, HELLO, &hello).map_err(|e| (false, e.into()))?;
    let welcome = expect(&link, WELCOME, 32, HANDSHAKE_TIMEOUT).map_err(|w| (false, w))?;
    let theirs: [u8; 32] = welcome
        .as_slice()
        .try_into()
        .map_err(|_| (false, HandshakeError::MalformedWelcome))?;
    if !mac_ok(key, b"welcome", &[&nonce_c, &nonce_s, &rb, &wb], &theirs) {
        return Err((false, HandshakeError::NotRank0));
    }
    Ok(link)
}

/// A connection rank 0 accepted and authenticated.
pub(super) struct Joined {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) pid: u32,
    pub(super) link: FdChannel,
}

/// Rank 0's side of one handshake (run in its own thread, within `HANDSHAKE_TIMEOUT`).
pub(super) fn serve_handshake(
    mut link: FdChannel,
    key: [u8; 32],
) -> std::result::Result<Joined, HandshakeError> {
    link.set_timeout(HANDSHAKE_TIMEOUT);
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let left = || deadline.saturating_duration_since(Instant::now());
    let (pid, _) = link.peer_cred()?;
    let nonce_s = random::<32>().map_err(HandshakeError::Random)?;
    send(&link, CHALLENGE, &nonce_s)?;
    let hello = expect(&link, HELLO, 128, left())?;
    let Hello {
        rank,
        world,
        nonce: nonce_c,
        mac: got,
    } = Hello::parse(&hello).ok_or(HandshakeError::MalformedHello)?;
    let (rb, wb) = (rank.to_le_bytes(), world.to_le_bytes());
    if !mac_ok(&key, b"hello", &[&nonce_s, &nonce_c, &rb, &wb], &got) {
        let _ = send(
            &link,
            REFUSED,
            &Writer::new()
                .text("authentication failed: this process does not hold the job's key (another job, or a different P2P_JOB_SECRET)")
                .finish(),
        );
        return Err(HandshakeError::Unauthenticated { pid, rank });
    }
    let proof = mac(&key, b"welcome", &[&nonce_c, &nonce_s, &rb, &wb]);
    send(&link, WELCOME, &proof)?;
    Ok(Joined {
        rank: rank as usize,
        world: world as usize,
        pid,
        link,
    })
}
