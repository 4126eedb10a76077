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
//!
//! Messages between ranks (the rendezvous, liveness and the communicators' exchanges) use a
//! second frame, [`encode_message`] / [`decode_message`]: magic `P2PM`, version (`u16`), kind
//! (`u16`), payload length (`u32`), payload; their fields are written with [`Writer`] and read
//! with [`Reader`], whose reads return `None` rather than panic.

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
    /// A message declares more payload than its protocol allows (refused before reading it).
    #[error("a message declares {declared} payload bytes, at most {max} are allowed")]
    TooLong {
        /// The declared payload length.
        declared: usize,
        /// The protocol's limit.
        max: usize,
    },
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
///
/// Every message between ranks is read through one (see [`decode_message`]); with
/// [`Writer`] it is the only place the project turns fields into bytes and back.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }
    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    /// A `u32`-length-prefixed byte string of at most `max` bytes (longer is `None`, checked
    /// before anything is taken).
    pub fn blob(&mut self, max: usize) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return None;
        }
        self.take(n)
    }
    /// A `u16`-length-prefixed UTF-8 string of at most `max` bytes.
    pub fn text(&mut self, max: usize) -> Option<&'a str> {
        let n = self.u16()? as usize;
        if n > max {
            return None;
        }
        std::str::from_utf8(self.take(n)?).ok()
    }
    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
    /// `Some(())` only if every byte was read: trailing bytes make a message invalid.
    pub fn end(&self) -> Option<()> {
        self.bytes.is_empty().then_some(())
    }
}

/// Builds the fields a [`Reader`] reads back, in the same encodings.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }
    /// Appends raw bytes (a fixed-size field).
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.bytes.extend_from_slice(b);
        self
    }
    /// Appends a little-endian `u16`.
    pub fn u16(self, v: u16) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian `u32`.
    pub fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a little-endian `u64`.
    pub fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Appends a `u32`-length-prefixed byte string (see [`Reader::blob`]).
    pub fn blob(self, b: &[u8]) -> Self {
        let n = u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.u32(n).bytes(&b[..n as usize])
    }
    /// Appends a `u16`-length-prefixed string, cut to 65535 bytes at a character boundary.
    pub fn text(self, t: &str) -> Self {
        self.text_within(t, u16::MAX as usize)
    }
    /// As [`text`](Self::text), cut to at most `max` bytes (and 65535) at a character
    /// boundary: for a reader that accepts no more ([`Reader::text`]'s `max`).
    pub fn text_within(self, t: &str, max: usize) -> Self {
        let mut n = t.len().min(max).min(u16::MAX as usize);
        while !t.is_char_boundary(n) {
            n -= 1;
        }
        self.u16(n as u16).bytes(&t.as_bytes()[..n])
    }
    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// The first four bytes of every message between ranks (rendezvous, liveness, the
/// communicators' exchanges).
pub const MSG_MAGIC: [u8; 4] = *b"P2PM";
/// The version of the message format this build writes and reads.
pub const MSG_VERSION: u16 = 1;
/// The size of a message header: magic, version, kind (`u16`), payload length (`u32`).
pub const MSG_HEADER_LEN: usize = 12;

/// Frames `payload` as a message of `kind` (the kind numbers belong to the protocol using it).
pub fn encode_message(kind: u16, payload: &[u8]) -> Vec<u8> {
    Writer::new()
        .bytes(&MSG_MAGIC)
        .u16(MSG_VERSION)
        .u16(kind)
        .blob(payload)
        .finish()
}

/// Checks a message's header and returns its kind and payload. The payload length must match
/// the header exactly and be at most `max_payload` bytes.
pub fn decode_message(bytes: &[u8], max_payload: usize) -> Result<(u16, &[u8]), DecodeError> {
    let short = DecodeError::TooShort { got: bytes.len() };
    let mut r = Reader::new(bytes);
    let magic = r.array::<4>().ok_or(short.clone())?;
    if magic != MSG_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u16().ok_or(short.clone())?;
    if version != MSG_VERSION {
        return Err(DecodeError::UnsupportedVersion { got: version });
    }
    let kind = r.u16().ok_or(short.clone())?;
    let declared = r.u32().ok_or(short)? as usize;
    if declared > max_payload {
        return Err(DecodeError::TooLong {
            declared,
            max: max_payload,
        });
    }
    let payload = r.rest();
    if payload.len() != declared {
        return Err(DecodeError::Length {
            declared,
            actual: payload.len(),
        });
    }
    Ok((kind, payload))
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

    /// A fixed-seed xorshift for the fuzz tests: random, varied lengths and contents,
    /// reproducible.
    fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
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

    #[test]
    fn messages_round_trip_and_every_change_is_caught() {
        let payload = Writer::new()
            .u32(7)
            .text("héllo")
            .blob(&[1, 2, 3])
            .u64(9)
            .finish();
        let m = encode_message(5, &payload);
        assert_eq!(m.len(), MSG_HEADER_LEN + payload.len());
        let (kind, p) = decode_message(&m, 64).expect("valid");
        assert_eq!(kind, 5);
        let mut r = Reader::new(p);
        assert_eq!(r.u32(), Some(7));
        assert_eq!(r.text(16), Some("héllo"));
        assert_eq!(r.blob(3), Some(&[1u8, 2, 3][..]));
        assert_eq!(r.u64(), Some(9));
        assert_eq!(r.end(), Some(()));
        // Every truncation and every extension is refused.
        for n in 0..m.len() {
            assert!(decode_message(&m[..n], 64).is_err(), "truncated to {n}");
        }
        let mut longer = m.clone();
        longer.push(0);
        assert!(matches!(
            decode_message(&longer, 64),
            Err(DecodeError::Length { .. })
        ));
        // The limit is checked against the declared length.
        assert!(matches!(
            decode_message(&m, payload.len() - 1),
            Err(DecodeError::TooLong { .. })
        ));
        let mut bad = m.clone();
        bad[0] ^= 1;
        assert!(matches!(
            decode_message(&bad, 64),
            Err(DecodeError::BadMagic(_))
        ));
        let mut bad = m.clone();
        bad[4] = 9;
        assert!(matches!(
            decode_message(&bad, 64),
            Err(DecodeError::UnsupportedVersion { got: 9 })
        ));
    }

    #[test]
    fn length_prefixed_fields_are_bounded_before_they_are_taken() {
        let b = Writer::new().blob(&[0; 10]).finish();
        assert_eq!(Reader::new(&b).blob(9), None);
        assert_eq!(Reader::new(&b).blob(10).map(<[u8]>::len), Some(10));
        // A length field larger than the bytes present is None, not a panic.
        let lie = Writer::new().u32(u32::MAX).finish();
        assert_eq!(Reader::new(&lie).blob(usize::MAX), None);
        let t = Writer::new().text("abc").finish();
        assert_eq!(Reader::new(&t).text(2), None);
        let not_utf8 = Writer::new().u16(2).bytes(&[0xff, 0xfe]).finish();
        assert_eq!(Reader::new(&not_utf8).text(8), None);
        // Text is cut at a character boundary.
        let long = "é".repeat(40_000);
        let w = Writer::new().text(&long).finish();
        let got = Reader::new(&w).text(usize::MAX).expect("valid utf-8");
        assert!(got.len() <= u16::MAX as usize && long.starts_with(got));
    }

    #[test]
    fn random_messages_never_panic() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..50_000 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len >= MSG_HEADER_LEN && next() % 2 == 0 {
                bytes[..4].copy_from_slice(&MSG_MAGIC);
                bytes[4..6].copy_from_slice(&MSG_VERSION.to_le_bytes());
            }
            if let Ok((_, p)) = decode_message(&bytes, 1 << 20) {
                let mut r = Reader::new(p);
                let _ = (r.u32(), r.text(100), r.blob(100), r.u64(), r.end());
            }
        }
    }
}
