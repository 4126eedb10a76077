//! `p2p_transport::fuzzing::store_value` under libFuzzer: `cargo +nightly fuzz run store_value` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_transport::fuzzing::store_value(data));
