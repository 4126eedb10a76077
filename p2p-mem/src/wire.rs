//! The byte format handles travel in between processes.
//!
//! Every handle is a 32-byte header followed by a payload whose length is fixed by its kind:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `P2PH` |
//! | 4 | 2 | format version, little-endian (currently 1) |
//! | 6 | 2 | kind ([`HandleKind`]) |
//! | 8 | 4 | payload length |
//! | 12 | 16 | UUID of the exporting device |
//! | 28 | 4 | exporter's process id |
//! | 32 | n | payload |
//!
//! Decoding checks every field and returns a [`DecodeError`]; it never panics, whatever bytes it
//! is given (the tests feed it truncations, corruptions and random bytes).

/// The first four bytes of every encoded handle.
pub const MAGIC: [u8; 4] = *b"P2PH";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// The size of the fixed header.
pub const HEADER_LEN: usize = 32;

/// What an encoded handle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandleKind {
    /// A legacy CUDA IPC memory handle plus offset and length.
    IpcMem = 1,
    /// A legacy CUDA IPC event handle.
    IpcEvent = 2,
    /// The description of a cuMem allocation whose POSIX fd travels beside it.
    VmmFd = 3,
    /// A cuMem fabric handle plus the allocation's size.
    Fabric = 4,
}

impl HandleKind {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => HandleKind::IpcMem,
            2 => HandleKind::IpcEvent,
            3 => HandleKind::VmmFd,
            4 => HandleKind::Fabric,
            _ => return None,
        })
    }

    /// The exact payload length of this kind.
    pub fn payload_len(self) -> usize {
        match self {
            HandleKind::IpcMem => 64 + 8 + 8,
            HandleKind::IpcEvent => 64,
            HandleKind::VmmFd => 8 + 8,
            HandleKind::Fabric => 64 + 8 + 8,
        }
    }
}

/// Why bytes are not a valid handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header needs.
    #[error("{got} bytes is too short for a handle header ({HEADER_LEN} bytes)")]
    TooShort {
        /// How many bytes there were.
        got: usize,
    },
    /// The bytes do not start with `P2PH`.
    #[error("bad magic {0:02x?}: these bytes are not a p2p handle")]
    BadMagic([u8; 4]),
    /// Written by a newer or older p2p.
    #[error("handle format version {got}, but this build reads version {VERSION}: use the same p2p version in both processes")]
    UnsupportedVersion {
        /// The version in the bytes.
        got: u16,
    },
    /// A kind this build does not know.
    #[error("unknown handle kind {0}")]
    UnknownKind(u16),
    /// A valid handle of another kind than the caller asked for.
    #[error("expected a {expected:?} handle, got a {got:?} handle")]
    WrongKind {
        /// The kind asked for.
        expected: HandleKind,
        /// The kind found.
        got: HandleKind,
    },
    /// The payload length field does not match the kind.
    #[error("a {kind:?} handle has a {expected}-byte payload, the header says {declared}")]
    PayloadLength {
        /// The kind.
        kind: HandleKind,
        /// The length the kind requires.
        expected: usize,
        /// The length the header declares.
        declared: usize,
    },
    /// The bytes after the header are not as long as the header says.
    #[error("the header declares {declared} payload bytes but {actual} follow")]
    Length {
        /// The declared payload length.
        declared: usize,
        /// The bytes that actually follow the header.
        actual: usize,
    },
    /// A field inside the payload is invalid.
    #[error("invalid field: {0}")]
    Field(&'static str),
}

/// The decoded header and the payload it frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The handle's kind.
    pub kind: HandleKind,
    /// UUID of the exporting device.
    pub device_uuid: [u8; 16],
    /// Process id of the exporter.
    pub exporter_pid: u32,
    /// The payload, exactly `kind.payload_len()` bytes.
    pub payload: &'a [u8],
}

/// Encodes a header and payload. `payload` must be `kind.payload_len()` bytes (checked in debug).
pub fn encode(
    kind: HandleKind,
    device_uuid: &[u8; 16],
    exporter_pid: u32,
    payload: &[u8],
) -> Vec<u8> {
    debug_assert_eq!(payload.len(), kind.payload_len());
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(kind as u16).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(device_uuid);
    out.extend_from_slice(&exporter_pid.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes and validates a handle of the `expected` kind.
pub fn decode(bytes: &[u8], expected: HandleKind) -> Result<Envelope<'_>, DecodeError> {
    let mut r = Reader::new(bytes);
    let header = r
        .take(HEADER_LEN)
        .ok_or(DecodeError::TooShort { got: bytes.len() })?;
    let mut h = Reader::new(header);
    let magic = h
        .array::<4>()
        .ok_or(DecodeError::TooShort { got: bytes.len() })?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = h.u16().ok_or(DecodeError::TooShort { got: bytes.len() })?;
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion { got: version });
    }
    let raw_kind = h.u16().ok_or(DecodeError::TooShort { got: bytes.len() })?;
    let kind = HandleKind::from_u16(raw_kind).ok_or(DecodeError::UnknownKind(raw_kind))?;
    if kind != expected {
        return Err(DecodeError::WrongKind {
            expected,
            got: kind,
        });
    }
    let declared = h.u32().ok_or(DecodeError::TooShort { got: bytes.len() })? as usize;
    if declared != kind.payload_len() {
        return Err(DecodeError::PayloadLength {
            kind,
            expected: kind.payload_len(),
            declared,
        });
    }
    let device_uuid = h
        .array::<16>()
        .ok_or(DecodeError::TooShort { got: bytes.len() })?;
    let exporter_pid = h.u32().ok_or(DecodeError::TooShort { got: bytes.len() })?;
    let payload = r.rest();
    if payload.len() != declared {
        return Err(DecodeError::Length {
            declared,
            actual: payload.len(),
        });
    }
    Ok(Envelope {
        kind,
        device_uuid,
        exporter_pid,
        payload,
    })
}

/// A cursor over bytes whose reads return `None` instead of panicking past the end.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [7; 16];

    fn sample(kind: HandleKind) -> Vec<u8> {
        let payload: Vec<u8> = (0..kind.payload_len()).map(|i| i as u8).collect();
        encode(kind, &UUID, 4242, &payload)
    }

    #[test]
    fn every_kind_round_trips() {
        for kind in [
            HandleKind::IpcMem,
            HandleKind::IpcEvent,
            HandleKind::VmmFd,
            HandleKind::Fabric,
        ] {
            let bytes = sample(kind);
            assert_eq!(bytes.len(), HEADER_LEN + kind.payload_len());
            let env = decode(&bytes, kind).expect("valid");
            assert_eq!(env.kind, kind);
            assert_eq!(env.device_uuid, UUID);
            assert_eq!(env.exporter_pid, 4242);
            assert_eq!(env.payload, &bytes[HEADER_LEN..]);
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = sample(HandleKind::IpcMem);
        for n in 0..bytes.len() {
            let err = decode(&bytes[..n], HandleKind::IpcMem).expect_err("truncated");
            if n < HEADER_LEN {
                assert_eq!(err, DecodeError::TooShort { got: n });
            } else {
                assert_eq!(
                    err,
                    DecodeError::Length {
                        declared: 80,
                        actual: n - HEADER_LEN
                    }
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = sample(HandleKind::IpcEvent);
        bytes.push(0);
        assert_eq!(
            decode(&bytes, HandleKind::IpcEvent),
            Err(DecodeError::Length {
                declared: 64,
                actual: 65
            })
        );
    }

    #[test]
    fn each_corrupt_field_has_its_own_error() {
        let good = sample(HandleKind::VmmFd);
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(
            decode(&b, HandleKind::VmmFd),
            Err(DecodeError::BadMagic(*b"X2PH"))
        );
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(
            decode(&b, HandleKind::VmmFd),
            Err(DecodeError::UnsupportedVersion { got: 2 })
        );
        let mut b = good.clone();
        b[6] = 99;
        assert_eq!(
            decode(&b, HandleKind::VmmFd),
            Err(DecodeError::UnknownKind(99))
        );
        let mut b = good.clone();
        b[8] = 17;
        assert_eq!(
            decode(&b, HandleKind::VmmFd),
            Err(DecodeError::PayloadLength {
                kind: HandleKind::VmmFd,
                expected: 16,
                declared: 17
            })
        );
        assert_eq!(
            decode(&good, HandleKind::Fabric),
            Err(DecodeError::WrongKind {
                expected: HandleKind::Fabric,
                got: HandleKind::VmmFd
            })
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        // A fixed-seed xorshift: random, varied lengths and contents, reproducible.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = (next() % 128) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Keep a valid prefix half the time so later checks are reached too.
            if len >= 12 && next() % 2 == 0 {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4..6].copy_from_slice(&VERSION.to_le_bytes());
                bytes[6..8].copy_from_slice(&2u16.to_le_bytes());
            }
            if decode(&bytes, HandleKind::IpcEvent).is_ok() {
                accepted += 1;
            }
        }
        // Acceptance needs an exact 96-byte length and length field; random data almost never has it.
        assert!(accepted < 10, "{accepted} random inputs decoded");
    }

    #[test]
    fn reader_stops_at_the_end() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16(), Some(0x0201));
        assert_eq!(r.u16(), None);
        assert_eq!(r.array::<1>(), Some([3]));
        assert_eq!(r.u64(), None);
        assert_eq!(r.rest(), &[] as &[u8]);
    }
}
