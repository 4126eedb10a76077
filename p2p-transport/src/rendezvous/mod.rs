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
//! # Across hosts
//! The socket above reaches only this host. What must cross hosts (NCCL's unique ids) goes
//! through torchrun's own c10d `TCPStore` at `MASTER_ADDR:MASTER_PORT`, so that p2p opens no
//! port of its own: [`store`] has a client of it, and seals what is put there with the job's
//! key so that a rank accepts only what a holder of the key put there ([`JobExchange`]; the
//! host layout is [`HostLayout`]).
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

mod exchange;
mod group;
mod handshake;
mod hosts;
mod identity;
pub mod store;
/// Test and fault-injection helpers: raw steps of the protocol, to play a stranger or a broken
/// rank against a real one. Not for production use.
pub mod testing;
#[cfg(test)]
mod tests;

pub use exchange::JobExchange;
// For `crate::fuzzing`: the parsers of what peers send during and after the rendezvous.
pub(crate) use group::Incoming;
pub use group::{Failure, Group};
pub use handshake::HandshakeError;
use handshake::*;
pub(crate) use handshake::{reply as handshake_reply, Hello};
pub use hosts::{host_id, HostLayout};
use identity::*;
pub use identity::{Rendezvous, Secret};

use std::time::Duration;

use hmac::Hmac;
use p2p_mem::fdpass;
use p2p_mem::wire;
use sha2::Sha256;

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
pub(crate) const CHALLENGE: u16 = 1;
pub(crate) const HELLO: u16 = 2;
pub(crate) const WELCOME: u16 = 3;
pub(crate) const REFUSED: u16 = 4;
const READY: u16 = 5;
pub(crate) const GATHER: u16 = 10;
pub(crate) const TABLE: u16 = 11;
pub(crate) const FAIL: u16 = 12;
pub(crate) const BYE: u16 = 13;

type HmacSha256 = Hmac<Sha256>;
