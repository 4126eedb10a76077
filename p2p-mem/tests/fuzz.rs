//! The fuzz targets of `p2p_mem::fuzzing`, each for a fixed time on stable (`P2PTEST_FUZZ_MS`,
//! default 1 s; `P2PTEST_SEED` replays a run): what cargo-fuzz runs longer from `fuzz/`. Runs
//! in CI (no GPU).

use p2p_mem::fuzzing;
use p2p_testkit::fuzz;

#[test]
fn fuzz_handles() {
    assert!(fuzz("handles", &fuzzing::seeds(), fuzzing::handles) > 1000);
}

#[test]
fn fuzz_messages() {
    assert!(fuzz("messages", &fuzzing::seeds(), fuzzing::messages) > 1000);
}
