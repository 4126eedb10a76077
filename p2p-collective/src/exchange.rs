//! The byte formats of what one process-per-GPU rank sends the others through the rendezvous
//! group's exchanges: its introduction and its sharing proposal in `init`, its buffer in
//! `register`. Each is `wire`'s `Writer`/`Reader` in a fixed order, encoded and decoded here side
//! by side so the two cannot drift, and decoded without panicking whatever arrives (the group's
//! peers have authenticated, but their bytes are still checked: mutation tests below).

use p2p_mem::wire;

use crate::plan::Tuning;

/// The longest host name an introduction may carry.
const MAX_HOST: usize = 1024;
/// The longest socket path, proposal reason or refusal an exchange may carry.
const MAX_TEXT: usize = 4096;
/// The longest registration header (a legacy IPC handle is 112 bytes).
const MAX_HEADER: usize = 4096;

/// A rank's introduction in `init`: where it runs, where its workspace socket is, its GPU, and
/// the tuning and planner settings every rank must share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Introduction {
    /// The host name.
    pub host: String,
    /// The path of the rank's workspace socket.
    pub path: String,
    /// The rank's GPU.
    pub uuid: [u8; 16],
    /// `Tuning::to_words`.
    pub tuning: [u64; Tuning::WORDS],
    /// The planner settings' words (algorithm, check).
    pub planner: [u64; 2],
}

impl Introduction {
    pub fn encode(&self) -> Vec<u8> {
        self.tuning
            .iter()
            .chain(&self.planner)
            .fold(
                wire::Writer::new()
                    .text(&self.host)
                    .text(&self.path)
                    .bytes(&self.uuid),
                |w, x| w.u64(*x),
            )
            .finish()
    }

    /// An introduction of made-up values, for the tests and the fuzz targets' seeds.
    pub(crate) fn sample() -> Introduction {
        Introduction {
            host: "node-7".into(),
            path: "/run/user/1000/p2p-coll-abc/ws".into(),
            uuid: [7; 16],
            tuning: std::array::from_fn(|i| i as u64 * 3),
            planner: [1, 0],
        }
    }

    /// `None` for anything but an encoded introduction.
    pub fn decode(b: &[u8]) -> Option<Introduction> {
        let mut rd = wire::Reader::new(b);
        let host = rd.text(MAX_HOST)?.to_string();
        let path = rd.text(MAX_TEXT)?.to_string();
        let uuid = rd.array::<16>()?;
        let mut tuning = [0u64; Tuning::WORDS];
        for w in &mut tuning {
            *w = rd.u64()?;
        }
        let planner = [rd.u64()?, rd.u64()?];
        rd.end()?;
        Some(Introduction {
            host,
            path,
            uuid,
            tuning,
            planner,
        })
    }
}

/// A rank's sharing proposal in `init`: the sharing's code and why.
pub(crate) fn encode_proposal(code: u16, why: &str) -> Vec<u8> {
    wire::Writer::new().u16(code).text(why).finish()
}

/// `None` for anything but an encoded proposal.
pub(crate) fn decode_proposal(b: &[u8]) -> Option<(u16, String)> {
    let mut rd = wire::Reader::new(b);
    let code = rd.u16()?;
    let why = rd.text(MAX_TEXT)?.to_string();
    rd.end()?;
    Some((code, why))
}

/// What a rank sends in `register`: its buffer's size and export, or why it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Registration {
    /// The buffer's size in bytes and its exported handle.
    Exported { len: u64, header: Vec<u8> },
    /// Why this rank could not register its buffer.
    Refused(String),
}

impl Registration {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Registration::Exported { len, header } => {
                wire::Writer::new().u16(1).u64(*len).blob(header)
            }
            Registration::Refused(why) => wire::Writer::new().u16(0).text(why),
        }
        .finish()
    }

    /// `None` for anything but an encoded registration. A refusal whose reason is not readable
    /// is still a refusal.
    pub fn decode(b: &[u8]) -> Option<Registration> {
        let mut rd = wire::Reader::new(b);
        match rd.u16()? {
            1 => {
                let len = rd.u64()?;
                let header = rd.blob(MAX_HEADER)?.to_vec();
                rd.end()?;
                Some(Registration::Exported { len, header })
            }
            0 => Some(Registration::Refused(
                rd.text(MAX_TEXT)
                    .unwrap_or("(unreadable reason)")
                    .to_string(),
            )),
            _ => None,
        }
    }
}

/// What a rank asks for in `split`: which split of the parent this is (every rank counts its
/// own), its color (`None`: left out) and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitRequest {
    /// The parent's split count when this rank called.
    pub seq: u64,
    /// The child this rank joins, or none.
    pub color: Option<u32>,
    /// Where this rank goes among the child's ranks (by key, then by parent rank).
    pub key: i32,
}

impl SplitRequest {
    /// The first word of every split request: no other exchange starts with it, so a rank that
    /// made another call at this point is told apart from a malformed request.
    pub const TAG: u16 = 0x5350;

    pub fn encode(&self) -> Vec<u8> {
        wire::Writer::new()
            .u16(Self::TAG)
            .u64(self.seq)
            .u16(u16::from(self.color.is_some()))
            .u32(self.color.unwrap_or(0))
            .u32(self.key as u32)
            .finish()
    }

    /// `None` for anything but an encoded request.
    pub fn decode(b: &[u8]) -> Option<SplitRequest> {
        let mut rd = wire::Reader::new(b);
        if rd.u16()? != Self::TAG {
            return None;
        }
        let seq = rd.u64()?;
        let has = rd.u16()?;
        let color = rd.u32()?;
        let key = rd.u32()? as i32;
        rd.end()?;
        let color = match (has, color) {
            (0, 0) => None,
            (1, c) => Some(c),
            _ => return None,
        };
        Some(SplitRequest { seq, color, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p_testkit::Rng;

    /// Whether `decode` accepts `m`; where it does and `exact` holds for the value (false for
    /// registrations, whose refusal reads leniently), the value must re-encode to exactly `m`.
    fn accepts<T>(
        m: &[u8],
        decode: impl Fn(&[u8]) -> Option<T>,
        encode: impl Fn(&T) -> Vec<u8>,
        exact: impl Fn(&T) -> bool,
    ) -> bool {
        let Some(t) = decode(m) else {
            return false;
        };
        if exact(&t) {
            assert_eq!(encode(&t), m, "a decoded message re-encodes to its bytes");
        }
        true
    }

    /// A decoder under test, as [`accepts`] runs it.
    type Accepts<'a> = &'a dyn Fn(&[u8]) -> bool;

    /// Tries 30,000 mutations of `good` (no panic): how many were accepted and how many not.
    fn fuzz(good: &[u8], accepts: Accepts<'_>) -> (usize, usize) {
        let mut rng = Rng::new(good.len() as u64);
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..30_000 {
            if accepts(&rng.mutated(good)) {
                ok += 1;
            } else {
                refused += 1;
            }
        }
        (ok, refused)
    }

    fn introduction() -> Introduction {
        Introduction::sample()
    }

    #[test]
    fn every_exchange_round_trips() {
        let i = introduction();
        assert_eq!(Introduction::decode(&i.encode()), Some(i));
        let p = encode_proposal(3, "rank 1 has no P2P to rank 0");
        assert_eq!(
            decode_proposal(&p),
            Some((3, "rank 1 has no P2P to rank 0".into()))
        );
        for r in [
            Registration::Exported {
                len: 1 << 20,
                header: vec![5; 112],
            },
            Registration::Refused("pool memory".into()),
        ] {
            assert_eq!(Registration::decode(&r.encode()), Some(r));
        }
        assert_eq!(
            Registration::decode(&wire::Writer::new().u16(0).finish()),
            Some(Registration::Refused("(unreadable reason)".into()))
        );
        assert_eq!(
            Registration::decode(&wire::Writer::new().u16(2).finish()),
            None
        );
        for s in [
            SplitRequest {
                seq: 3,
                color: Some(7),
                key: -2,
            },
            SplitRequest {
                seq: 0,
                color: None,
                key: 5,
            },
        ] {
            assert_eq!(SplitRequest::decode(&s.encode()), Some(s));
            // A registration is not a split request, nor the other way round.
            assert_eq!(Registration::decode(&s.encode()), None);
        }
        let refused = Registration::Refused("pool memory".into()).encode();
        assert_eq!(SplitRequest::decode(&refused), None);
    }

    #[test]
    fn mutated_exchanges_are_refused_or_read_exactly() {
        let exported = Registration::Exported {
            len: 64 << 20,
            header: (0..112).map(|i| i as u8).collect(),
        };
        let request = SplitRequest {
            seq: 1,
            color: Some(2),
            key: 9,
        };
        let proposal = "the weakest sharing every pair allows";
        let cases: [(&str, Vec<u8>, Accepts<'_>); 4] = [
            ("introductions", introduction().encode(), &|m| {
                accepts(m, Introduction::decode, Introduction::encode, |_| true)
            }),
            ("proposals", encode_proposal(2, proposal), &|m| {
                accepts(
                    m,
                    decode_proposal,
                    |(c, w)| encode_proposal(*c, w),
                    |_| true,
                )
            }),
            ("registrations", exported.encode(), &|m| {
                let exact = |r: &Registration| matches!(r, Registration::Exported { .. });
                accepts(m, Registration::decode, Registration::encode, exact)
            }),
            ("split requests", request.encode(), &|m| {
                accepts(m, SplitRequest::decode, SplitRequest::encode, |_| true)
            }),
        ];
        for (what, good, accepts) in cases {
            let (ok, refused) = fuzz(&good, accepts);
            assert!(ok > 2_000 && refused > 10_000, "{what}: {ok} / {refused}");
        }
    }
}
