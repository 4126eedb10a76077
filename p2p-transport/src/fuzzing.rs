//! Entry points for fuzzing what this crate parses from another process's bytes: the
//! launcher's news, a peer's export, the rendezvous handshake (a reply, a hello), a peer's
//! messages after the rendezvous, and values read back from the job's store. Each takes any
//! bytes, never panics on them, and checks what the format promises; a panic is a bug.
//! `fuzz/` drives them with cargo-fuzz (libFuzzer), and `tests/fuzz.rs` for a fixed time on
//! stable. Not an API for programs.

use p2p_mem::wire::{self, Writer};

use crate::rendezvous::{self, store, Hello, Incoming};

/// The launcher's news that a rank ended (`launch`): what it accepts re-encodes to the same
/// bytes.
pub fn launch_news(data: &[u8]) {
    if let Some(e) = crate::launch::decode(data) {
        assert_eq!(
            crate::launch::encode(e.rank, e.pid, &e.how),
            data,
            "accepted news re-encodes differently"
        );
    }
}

/// A peer's export of a buffer (`peer`): what it accepts re-encodes to the same bytes.
pub fn peer_export(data: &[u8]) {
    if let Ok((from, e)) = crate::peer::parse_export(data, None) {
        assert_eq!(
            crate::peer::export_message(from, &e.header),
            data,
            "an accepted export re-encodes differently"
        );
    }
}

/// The rendezvous handshake: a reply of each kind the client waits for, and rank 0's reading
/// of a hello (which re-encodes to the same bytes).
pub fn handshake(data: &[u8]) {
    for (kind, max) in [(rendezvous::CHALLENGE, 32), (rendezvous::WELCOME, 32)] {
        if let Ok(p) = rendezvous::handshake_reply(data, kind, max) {
            assert!(p.len() <= max, "a reply longer than its limit was accepted");
        }
    }
    if let Some(h) = Hello::parse(data) {
        assert_eq!(h.encode(), data, "an accepted hello re-encodes differently");
    }
}

/// A peer's message after the rendezvous, in a group of 4: a failure report names a rank of
/// the group.
pub fn group_message(data: &[u8]) {
    if let Incoming::Failed { who, .. } = Incoming::parse(data, 4) {
        assert!(who < 4, "a failure report named rank {who} of 4");
    }
}

/// A value read back from the job's store: opened with the job's key or refused, and any
/// payload sealed then opened comes back whole.
pub fn store_value(data: &[u8]) {
    let key = [9u8; 32];
    if let Some(opened) = store::open(&key, "fuzz", data) {
        assert_eq!(
            store::seal(&key, "fuzz", &opened).len(),
            data.len(),
            "an opened value's seal has another length"
        );
    }
    assert_eq!(
        store::open(&key, "fuzz", &store::seal(&key, "fuzz", data)).as_deref(),
        Some(data),
        "a sealed value did not open to itself"
    );
}

/// Valid inputs to start from, one or more per entry point.
pub fn seeds() -> Vec<Vec<u8>> {
    let hello = Hello {
        rank: 1,
        world: 4,
        nonce: [3; 32],
        mac: [4; 32],
    };
    vec![
        crate::launch::encode(2, 4242, "signal: 9 (SIGKILL)"),
        crate::peer::export_message(1, &[7; 64]),
        wire::encode_message(rendezvous::CHALLENGE, &[1; 32]),
        wire::encode_message(
            rendezvous::REFUSED,
            &Writer::new().text("not this job").finish(),
        ),
        hello.encode(),
        wire::encode_message(
            rendezvous::FAIL,
            &Writer::new().u32(2).text("its process ended").finish(),
        ),
        wire::encode_message(rendezvous::GATHER, b"a part"),
        wire::encode_message(rendezvous::BYE, &[]),
        store::seal(&[9; 32], "fuzz", b"a value"),
    ]
}
