//! `p2p_transport::fuzzing::group_message` under libFuzzer: `cargo +nightly fuzz run group_message` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_transport::fuzzing::group_message(data));
