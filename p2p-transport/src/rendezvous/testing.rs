use std::path::Path;
use std::time::{Duration, Instant};

use p2p_mem::fdpass::{FdChannel, FdListener};

use crate::error::Result;

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
) -> std::result::Result<FdChannel, HandshakeError> {
    let link = connect_raw(&rv.socket_path(), timeout)?;
    client_handshake(link, &key_of.key(), claim_rank as usize, rv.world).map_err(|(_, w)| w)
}

/// Connects to `path` and returns the raw channel (to send junk, or nothing); the last
/// attempt's error once `timeout` has passed.
pub fn connect_raw(path: &Path, timeout: Duration) -> p2p_mem::Result<FdChannel> {
    let deadline = Instant::now() + timeout.min(crate::MAX_TIMEOUT);
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match FdChannel::connect_within(path, left) {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Sends `bytes` as one raw message.
pub fn send_raw(link: &FdChannel, bytes: &[u8]) -> p2p_mem::Result<()> {
    link.send_msg(bytes)
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
