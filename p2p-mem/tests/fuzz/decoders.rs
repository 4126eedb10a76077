//! Every handle decoder (`from_bytes` of the four handle kinds) under random mutation of valid
//! handles: none panics, and every input one accepts re-encodes to exactly the same bytes, so
//! no field is silently dropped and no two encodings stand for one handle. The header is
//! fuzzed on its own in `wire`'s unit tests; this reaches the payload parsers behind it. In
//! well under a second.

use p2p_mem::ipc::{IpcEventHandle, IpcMemHandle};
use p2p_mem::vmm::{FabricHandle, VmmHandle};
use p2p_mem::wire::{encode, HandleKind};
use p2p_testkit::Rng;

const KINDS: [HandleKind; 4] = [
    HandleKind::IpcMem,
    HandleKind::IpcEvent,
    HandleKind::VmmFd,
    HandleKind::Fabric,
];

/// A valid encoded handle of `kind`, with random opaque bytes.
fn valid(kind: HandleKind, rng: &mut Rng) -> Vec<u8> {
    let opaque: Vec<u8> = (0..64).map(|_| rng.byte()).collect();
    let sizes = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    let payload = match kind {
        // raw handle, offset, length
        HandleKind::IpcMem => [opaque, sizes(4096, 1 << 20)].concat(),
        HandleKind::IpcEvent => opaque,
        // size, granularity
        HandleKind::VmmFd => sizes(64 << 20, 2 << 20),
        HandleKind::Fabric => [opaque, sizes(64 << 20, 2 << 20)].concat(),
        other => panic!("a kind this test does not know: {other:?}"),
    };
    let uuid: [u8; 16] = std::array::from_fn(|_| rng.byte());
    encode(kind, &uuid, rng.next_u64() as u32, &payload)
}

/// One random change: an edge value written into an 8-byte field (sizes, offsets) one time in
/// four, else the test kit's mutations (flipped bits, cuts, inserted or replaced bytes).
fn mutate(good: &[u8], rng: &mut Rng) -> Vec<u8> {
    if good.is_empty() || rng.below(4) != 0 {
        return rng.mutated(good);
    }
    let mut b = good.to_vec();
    let edges = [0, 1, 3, 4095, u64::MAX, u64::MAX - 4095, 1 << 63, 2 << 20];
    let at = rng.below(b.len().saturating_sub(7).max(1));
    let v = edges[rng.below(edges.len())].to_le_bytes();
    let n = v.len().min(b.len() - at);
    b[at..at + n].copy_from_slice(&v[..n]);
    b
}

/// 1 if `decode` accepts `b` (and then its handle must re-encode to exactly `b`), else 0.
fn accepts<H, E>(
    b: &[u8],
    decode: fn(&[u8]) -> Result<H, E>,
    encode: fn(&H) -> Vec<u8>,
    what: &str,
) -> usize {
    match decode(b) {
        Ok(h) => {
            assert_eq!(encode(&h), b, "{what} re-encoded differently");
            1
        }
        Err(_) => 0,
    }
}

/// How many of the four decoders accept `b`.
fn decode_all(b: &[u8]) -> usize {
    accepts(
        b,
        IpcMemHandle::from_bytes,
        IpcMemHandle::to_bytes,
        "IpcMemHandle",
    ) + accepts(
        b,
        IpcEventHandle::from_bytes,
        IpcEventHandle::to_bytes,
        "IpcEventHandle",
    ) + accepts(b, VmmHandle::from_bytes, VmmHandle::to_bytes, "VmmHandle")
        + accepts(
            b,
            FabricHandle::from_bytes,
            FabricHandle::to_bytes,
            "FabricHandle",
        )
}

#[test]
fn mutated_handles_are_refused_or_decode_to_exactly_what_they_say() {
    let mut rng = Rng::new(1);
    let (mut accepted, mut refused) = (0usize, 0usize);
    for kind in KINDS {
        let good = valid(kind, &mut rng);
        assert_eq!(
            decode_all(&good),
            1,
            "a valid {kind:?} handle decodes as its own kind only"
        );
        for _ in 0..25_000 {
            let b = mutate(&good, &mut rng);
            match decode_all(&b) {
                0 => refused += 1,
                1 => accepted += 1,
                n => panic!("{n} decoders accepted one input: {b:02x?}"),
            }
        }
    }
    // Both outcomes are reached: changes inside opaque bytes and ids are valid handles, changes
    // to the header, the sizes or the length are not (the counts are deterministic: fixed seed).
    assert!(accepted > 10_000, "accepted {accepted}");
    assert!(refused > 40_000, "refused {refused}");
}

#[test]
fn sizes_that_cannot_describe_memory_are_refused() {
    let mut rng = Rng::new(7);
    let with_sizes = |kind: HandleKind, a: u64, b: u64, rng: &mut Rng| {
        let mut good = valid(kind, rng);
        let n = good.len();
        good[n - 16..n - 8].copy_from_slice(&a.to_le_bytes());
        good[n - 8..].copy_from_slice(&b.to_le_bytes());
        good
    };
    // IPC memory: offset, length; an empty range or one past 2^64 is refused.
    assert!(IpcMemHandle::from_bytes(&with_sizes(HandleKind::IpcMem, 0, 0, &mut rng)).is_err());
    assert!(
        IpcMemHandle::from_bytes(&with_sizes(HandleKind::IpcMem, u64::MAX, 1, &mut rng)).is_err()
    );
    assert!(IpcMemHandle::from_bytes(&with_sizes(HandleKind::IpcMem, 0, 1, &mut rng)).is_ok());
    // cuMem: size, granularity; a zero size, a granularity not a power of two, or a size that
    // is not a multiple of it is refused, for fd and fabric handles alike.
    for kind in [HandleKind::VmmFd, HandleKind::Fabric] {
        let dec = |b: &[u8]| match kind {
            HandleKind::VmmFd => VmmHandle::from_bytes(b).is_ok(),
            _ => FabricHandle::from_bytes(b).is_ok(),
        };
        assert!(!dec(&with_sizes(kind, 0, 2 << 20, &mut rng)), "{kind:?}");
        assert!(
            !dec(&with_sizes(kind, 6 << 20, 3 << 20, &mut rng)),
            "{kind:?}"
        );
        assert!(
            !dec(&with_sizes(kind, (2 << 20) + 1, 2 << 20, &mut rng)),
            "{kind:?}"
        );
        assert!(!dec(&with_sizes(kind, 2 << 20, 0, &mut rng)), "{kind:?}");
        assert!(
            dec(&with_sizes(kind, 4 << 20, 2 << 20, &mut rng)),
            "{kind:?}"
        );
    }
}
