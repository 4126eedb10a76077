//! The topology fixtures in `fixtures/` (recorded and modelled machines): the path model on
//! each (`paths`) and mode selection on each under every configuration override (`mode`), in
//! one test executable since both read the same fixtures. Runs in CI (no GPU).

mod mode;
mod paths;

use p2p_transport::topo::Topology;

/// The fixture `name`, checked to survive a round trip through JSON unchanged.
fn load(name: &str) -> Topology {
    // The bundle's run.sh points here at its copy of the fixtures (no source tree on GPU machines).
    let dir = std::env::var("P2PTEST_FIXTURES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures").into());
    let path = format!("{dir}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let t = Topology::from_json(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    // Every fixture survives a round trip unchanged.
    assert_eq!(
        Topology::from_json(&t.to_json())
            .map_err(|e| e.to_string())
            .as_ref(),
        Ok(&t),
        "{name} round trip"
    );
    t
}
