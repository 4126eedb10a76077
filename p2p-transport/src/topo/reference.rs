//! The reference machines: the recorded and modelled topologies of `fixtures/`, built into the
//! crate, so that a tool on a machine without GPUs can show what p2p would do on one.

use super::{Topology, TopologyError};

/// The reference machine a tool shows where it finds no GPU: 4 x H200 SXM behind an NVSwitch,
/// recorded on such a machine.
pub const DEFAULT: &str = "h200x4-nvswitch";

/// Every reference machine: its name and its topology's JSON (the format of
/// [`Topology::to_json`]).
pub const MACHINES: &[(&str, &str)] = &[
    (
        "h200x4-nvswitch",
        include_str!("../../fixtures/h200x4-nvswitch.json"),
    ),
    (
        "h200x2-nv18",
        include_str!("../../fixtures/h200x2-nv18.json"),
    ),
    (
        "dgx-h100-8gpu-nvswitch",
        include_str!("../../fixtures/dgx-h100-8gpu-nvswitch.json"),
    ),
    (
        "ring-4gpu-nvlink",
        include_str!("../../fixtures/ring-4gpu-nvlink.json"),
    ),
    (
        "a100-pcie-4gpu-2socket",
        include_str!("../../fixtures/a100-pcie-4gpu-2socket.json"),
    ),
    (
        "consumer-2gpu-no-p2p",
        include_str!("../../fixtures/consumer-2gpu-no-p2p.json"),
    ),
    (
        "single-h100",
        include_str!("../../fixtures/single-h100.json"),
    ),
];

/// The names of the reference machines, in [`MACHINES`]' order.
pub fn names() -> impl Iterator<Item = &'static str> {
    MACHINES.iter().map(|(name, _)| *name)
}

/// The reference machine `name`, or `None` where there is none of that name.
///
/// ```
/// let t = p2p_transport::topo::reference::machine("h200x4-nvswitch").unwrap().unwrap();
/// assert_eq!(t.gpus.len(), 4);
/// ```
pub fn machine(name: &str) -> Option<Result<Topology, TopologyError>> {
    MACHINES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, json)| Topology::from_json(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_machine_loads_and_the_default_is_one() {
        for (name, _) in MACHINES {
            let t = machine(name).expect("listed").expect("loads");
            assert!(!t.gpus.is_empty(), "{name}");
        }
        assert!(names().any(|n| n == DEFAULT));
        assert!(machine("no-such-machine").is_none());
    }

    #[test]
    fn every_fixture_is_a_reference_machine() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("fixtures")
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|f| f.strip_suffix(".json").map(str::to_string))
            .collect();
        files.sort();
        let mut listed: Vec<String> = names().map(str::to_string).collect();
        listed.sort();
        assert_eq!(files, listed);
    }
}
