//! `p2p_mem::fuzzing::messages` under libFuzzer: `cargo +nightly fuzz run messages` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_mem::fuzzing::messages(data));
