//! Entry points for fuzzing what this crate parses from another process's bytes: the handle
//! envelope and the four handle payloads (`wire`, `ipc`, `vmm`), and the framed messages of the
//! fd channel. Each takes any bytes, never panics on them, and checks what the format promises;
//! a panic is a bug. `fuzz/` drives them with cargo-fuzz (libFuzzer), and `tests/fuzz/` for a
//! fixed time on stable. Not an API for programs.

use crate::ipc::{IpcEventHandle, IpcMemHandle};
use crate::vmm::{FabricHandle, VmmHandle};
use crate::wire::{self, HandleKind};

const KINDS: [HandleKind; 4] = [
    HandleKind::IpcMem,
    HandleKind::IpcEvent,
    HandleKind::VmmFd,
    HandleKind::Fabric,
];

/// 1 if `decode` accepts `b`, which its handle must then re-encode to exactly, else 0.
fn accepts<H, E>(b: &[u8], decode: fn(&[u8]) -> Result<H, E>, encode: fn(&H) -> Vec<u8>) -> usize {
    match decode(b) {
        Ok(h) => {
            assert_eq!(encode(&h), b, "an accepted handle re-encodes differently");
            1
        }
        Err(_) => 0,
    }
}

/// The handle decoders on `data`: at most one accepts it, and what it accepts re-encodes to
/// the same bytes (no field dropped, no two encodings of one handle); the envelope decoder for
/// each kind and the message decoder return without panicking.
pub fn handles(data: &[u8]) {
    let accepted = accepts(data, IpcMemHandle::from_bytes, IpcMemHandle::to_bytes)
        + accepts(data, IpcEventHandle::from_bytes, IpcEventHandle::to_bytes)
        + accepts(data, VmmHandle::from_bytes, VmmHandle::to_bytes)
        + accepts(data, FabricHandle::from_bytes, FabricHandle::to_bytes);
    assert!(
        accepted <= 1,
        "{accepted} handle decoders accepted one input"
    );
    for kind in KINDS {
        let _ = wire::decode(data, kind);
    }
}

/// The fd channel's framing on `data`: a message it accepts re-encodes to the same bytes, and
/// its payload is within the limit.
pub fn messages(data: &[u8]) {
    if let Ok((kind, payload)) = wire::decode_message(data, crate::fdpass::MAX_MESSAGE) {
        assert!(payload.len() <= crate::fdpass::MAX_MESSAGE);
        assert_eq!(
            wire::encode_message(kind, payload),
            data,
            "an accepted message re-encodes differently"
        );
    }
}

/// Valid inputs to start from: one encoded handle of each kind, and a framed message.
pub fn seeds() -> Vec<Vec<u8>> {
    let sizes = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    let opaque = vec![0x5a; 64];
    let uuid = [7u8; 16];
    let mut v: Vec<Vec<u8>> = KINDS
        .iter()
        .map(|&kind| {
            let payload = match kind {
                HandleKind::IpcMem => [opaque.clone(), sizes(4096, 1 << 20)].concat(),
                HandleKind::IpcEvent => opaque.clone(),
                HandleKind::VmmFd => sizes(64 << 20, 2 << 20),
                HandleKind::Fabric => [opaque.clone(), sizes(64 << 20, 2 << 20)].concat(),
            };
            wire::encode(kind, &uuid, 4242, &payload)
        })
        .collect();
    v.push(wire::encode_message(3, b"a payload"));
    v
}
