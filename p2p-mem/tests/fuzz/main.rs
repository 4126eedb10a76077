//! The parsers of another process's bytes under random input, in one test executable: the fuzz
//! targets of `p2p_mem::fuzzing`, each for a fixed time on stable (`P2PTEST_FUZZ_MS`, default
//! 1 s; `P2PTEST_SEED` replays a run; what cargo-fuzz runs longer from `fuzz/`), and every
//! handle decoder under random mutation of valid handles (`decoders`). Runs in CI (no GPU).

mod decoders;

p2p_testkit::fuzz_tests!(p2p_mem; handles, messages);
