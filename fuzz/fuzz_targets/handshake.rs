//! `p2p_transport::fuzzing::handshake` under libFuzzer: `cargo +nightly fuzz run handshake` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_transport::fuzzing::handshake(data));
