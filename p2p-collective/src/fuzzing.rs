//! Entry points for fuzzing what this crate parses from another rank's bytes: the exchanges of
//! `init`, `register` and `split` (an introduction, a sharing proposal, a registration, a split
//! request). Each takes any bytes, never panics on them, and checks what the format promises; a
//! panic is a bug. `fuzz/` drives them with cargo-fuzz (libFuzzer), and `tests/fuzz.rs` for a
//! fixed time on stable. Not an API for programs.

use crate::exchange::{decode_proposal, encode_proposal, Introduction, Registration, SplitRequest};

/// Every exchange decoder on `data`: what one accepts re-encodes to the same bytes (a refused
/// registration excepted: its reason is kept even when unreadable, so it has no exact form).
pub fn exchange(data: &[u8]) {
    if let Some(i) = Introduction::decode(data) {
        assert_eq!(i.encode(), data, "an introduction re-encodes differently");
    }
    if let Some((code, why)) = decode_proposal(data) {
        assert_eq!(
            encode_proposal(code, &why),
            data,
            "a proposal re-encodes differently"
        );
    }
    if let Some(r @ Registration::Exported { .. }) = Registration::decode(data) {
        assert_eq!(r.encode(), data, "a registration re-encodes differently");
    }
    if let Some(s) = SplitRequest::decode(data) {
        assert_eq!(s.encode(), data, "a split request re-encodes differently");
    }
}

/// Valid inputs to start from: one of each exchange.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![
        Introduction::sample().encode(),
        encode_proposal(2, "the weakest sharing every pair allows"),
        Registration::Exported {
            len: 64 << 20,
            header: (0..112).map(|i| i as u8).collect(),
        }
        .encode(),
        Registration::Refused("pool memory".into()).encode(),
        SplitRequest {
            seq: 1,
            color: Some(2),
            key: 9,
        }
        .encode(),
    ]
}
