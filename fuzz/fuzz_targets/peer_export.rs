//! `p2p_transport::fuzzing::peer_export` under libFuzzer: `cargo +nightly fuzz run peer_export` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_transport::fuzzing::peer_export(data));
