//! `p2p_collective::fuzzing::exchange` under libFuzzer: `cargo +nightly fuzz run exchange` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_collective::fuzzing::exchange(data));
