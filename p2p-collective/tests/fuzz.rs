//! The fuzz target of `p2p_collective::fuzzing` for a fixed time on stable (`P2PTEST_FUZZ_MS`,
//! default 1 s; `P2PTEST_SEED` replays a run): what cargo-fuzz runs longer from `fuzz/`. Runs in
//! CI (no GPU).

use p2p_collective::fuzzing;
use p2p_testkit::fuzz;

#[test]
fn fuzz_exchange() {
    assert!(fuzz("exchange", &fuzzing::seeds(), fuzzing::exchange) > 1000);
}
