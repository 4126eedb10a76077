//! The fuzz targets of `p2p_transport::fuzzing`, each for a fixed time on stable
//! (`P2PTEST_FUZZ_MS`, default 1 s; `P2PTEST_SEED` replays a run): what cargo-fuzz runs longer
//! from `fuzz/`. Runs in CI (no GPU).

use p2p_testkit::fuzz;
use p2p_transport::fuzzing;

#[test]
fn fuzz_launch_news() {
    assert!(fuzz("launch_news", &fuzzing::seeds(), fuzzing::launch_news) > 1000);
}

#[test]
fn fuzz_peer_export() {
    assert!(fuzz("peer_export", &fuzzing::seeds(), fuzzing::peer_export) > 1000);
}

#[test]
fn fuzz_handshake() {
    assert!(fuzz("handshake", &fuzzing::seeds(), fuzzing::handshake) > 1000);
}

#[test]
fn fuzz_group_message() {
    assert!(fuzz("group_message", &fuzzing::seeds(), fuzzing::group_message) > 1000);
}

#[test]
fn fuzz_store_value() {
    assert!(fuzz("store_value", &fuzzing::seeds(), fuzzing::store_value) > 1000);
}
