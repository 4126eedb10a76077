//! `p2p_mem::fuzzing::handles` under libFuzzer: `cargo +nightly fuzz run handles` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_mem::fuzzing::handles(data));
