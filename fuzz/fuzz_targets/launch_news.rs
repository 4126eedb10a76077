//! `p2p_transport::fuzzing::launch_news` under libFuzzer: `cargo +nightly fuzz run launch_news` from `fuzz/`'s parent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| p2p_transport::fuzzing::launch_news(data));
