//! The path model on every recorded or modelled machine in `fixtures/`.

use p2p_testkit::assert_contains;

use super::load;
use p2p_transport::topo::{
    render_matrix, render_p2p_matrix, render_paths, Connection, P2pMatrix, PathLevel, Topology,
    TopologyError,
};

/// A direct NVLink connection of `links` links of `generation`.
fn nvlink(links: u32, generation: u32) -> Connection {
    Connection::NvLink { links, generation }
}

#[test]
fn h200_pair_recorded_on_the_machine() {
    let t = load("h200x2-nv18.json");
    assert_eq!(t.gpus.len(), 2);
    assert!(
        t.source.starts_with("recorded by p2p-bench"),
        "{}",
        t.source
    );
    for (a, b) in [(0, 1), (1, 0)] {
        let p = t.path(a, b);
        assert_eq!(p.connection, nvlink(18, 4), "{a} -> {b}");
        assert_eq!(
            (p.level, p.hops, p.p2p, p.via),
            (PathLevel::Nvl, 1, true, None)
        );
        assert!((p.bandwidth_gbps - 478.125).abs() < 1e-9);
    }
    let m = render_matrix(&t);
    assert!(
        m.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("GPU0") && l.contains("NV18")),
        "{m}"
    );
}

/// Every ordered pair of `t` reaches the other through NVSwitches over 18 NVLink4 links (478
/// GB/s one way), the links shared by the GPU's `peers` peers.
fn every_pair_behind_a_switch(t: &Topology, peers: u32) {
    let paths = t.paths();
    assert_eq!(paths.len(), t.gpus.len() * (t.gpus.len() - 1));
    for p in &paths {
        let at = format!("{} -> {}", p.from, p.to);
        assert_eq!(
            p.connection,
            Connection::NvSwitch {
                links: 18,
                generation: 4
            },
            "{at}"
        );
        assert_eq!(
            (p.level, p.hops, p.p2p, p.via),
            (PathLevel::Nvl, 2, true, None),
            "{at}"
        );
        assert!((p.bandwidth_gbps - 478.125).abs() < 1e-9, "{at}");
        assert_eq!(p.shared_by, peers, "{at}");
        assert!(
            (p.concurrent_gbps - 478.125 / peers as f64).abs() < 1e-9,
            "{at}"
        );
    }
}

#[test]
fn dgx_h100_every_pair_through_nvswitch() {
    let t = load("dgx-h100-8gpu-nvswitch.json");
    // A GPU's 18 links carry its traffic to all 7 peers: one seventh each when all talk.
    every_pair_behind_a_switch(&t, 7);
    let some = t.concurrent_bandwidth(0, &[1, 2, 3]);
    assert!(
        some.iter().all(|b| (b - 478.125 / 3.0).abs() < 1e-9),
        "{some:?}"
    );
    assert!(
        render_paths(&t).contains("68.3 (1/7)"),
        "{}",
        render_paths(&t)
    );
    // nvidia-smi prints NV18 for every pair on an NVSwitch system.
    assert_eq!(render_matrix(&t).matches("NV18").count(), 56);
}

#[test]
fn a100_pcie_p2p_within_a_socket_only() {
    let t = load("a100-pcie-4gpu-2socket.json");
    let p = t.path(0, 1);
    assert_eq!(
        (p.connection, p.p2p, p.via),
        (Connection::Pcie(PathLevel::Pix), true, None)
    );
    assert!(
        (p.bandwidth_gbps - 31.504).abs() < 0.01,
        "{}",
        p.bandwidth_gbps
    );
    assert_eq!(t.path(2, 3).level, PathLevel::Pix);
    let p = t.path(0, 2);
    assert_eq!(
        (p.connection, p.p2p),
        (Connection::Pcie(PathLevel::Sys), false)
    );
    // No GPU has P2P to both sides: host-staged, no intermediate.
    assert_eq!(p.via, None);
    assert_contains(&p.reason, "cuDeviceCanAccessPeer = 0");
    assert!(p.bandwidth_gbps < t.path(0, 1).bandwidth_gbps);
    let m = render_matrix(&t);
    assert!(m.contains("PIX") && m.contains("SYS"), "{m}");
    let cuda = render_p2p_matrix(&t, P2pMatrix::Cuda);
    assert_eq!(cuda.matches("OK").count(), 4, "{cuda}");
    assert_eq!(
        render_p2p_matrix(&t, P2pMatrix::Read)
            .matches("CNS")
            .count(),
        8
    );
}

#[test]
fn nvlink_ring_relays_opposite_gpus_through_the_widest_neighbour() {
    let t = load("ring-4gpu-nvlink.json");
    let p = t.path(0, 1);
    assert_eq!((p.connection, p.hops, p.p2p), (nvlink(6, 3), 1, true));
    assert_eq!(p.bandwidth_gbps, 150.0);
    assert_eq!(t.path(3, 0).connection, nvlink(4, 3));
    // 0 and 2 share no link: via 1 (6 + 6 links) beats via 3 (4 + 4 links).
    let p = t.path(0, 2);
    assert_eq!(
        (p.connection, p.p2p, p.via, p.hops),
        (Connection::Pcie(PathLevel::Sys), false, Some(1), 2)
    );
    assert_eq!(p.bandwidth_gbps, 150.0);
    assert_eq!(t.path(2, 0).via, Some(1));
    // 1 -> 3: via 0 and via 2 are both limited by a 4-link leg: the tie goes to the lower index.
    let p = t.path(1, 3);
    assert_eq!((p.via, p.bandwidth_gbps), (Some(0), 100.0));
    let text = render_paths(&t);
    assert!(
        text.contains(
            "GPU0 -> GPU2  SYS       2      150.0           150.0  no          GPU1  cuDeviceCanAccessPeer = 0"
        ),
        "{text}"
    );
}

#[test]
fn consumer_gpus_have_no_p2p_and_say_why() {
    let t = load("consumer-2gpu-no-p2p.json");
    let p = t.path(0, 1);
    assert_eq!(
        (p.connection, p.p2p, p.via, p.hops),
        (Connection::Pcie(PathLevel::Phb), false, None, 4)
    );
    assert_contains(&p.reason, "consumer GPUs usually have P2P disabled");
}

#[test]
fn a_single_gpu_has_no_paths() {
    let t = load("single-h100.json");
    assert!(t.paths().is_empty());
    let m = render_matrix(&t);
    assert_eq!(m.lines().filter(|l| l.starts_with("GPU")).count(), 1, "{m}");
    assert!(m.lines().nth(1).is_some_and(|l| l.contains(" X")), "{m}");
}

#[test]
fn malformed_topologies_are_rejected() {
    let t = load("single-h100.json");
    let mut bad = t.clone();
    bad.format = 99;
    let e = Topology::from_json(&bad.to_json()).expect_err("format 99");
    assert!(matches!(e, TopologyError::Format { found: 99 }), "{e:?}");
    assert!(e.to_string().contains("format 99"), "{e}");
    let mut bad = t.clone();
    bad.gpus[0].index = 3;
    let e = Topology::from_json(&bad.to_json()).expect_err("index 3");
    assert!(
        matches!(
            e,
            TopologyError::GpuIndex {
                position: 0,
                index: 3
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "GPU at position 0 has index 3");
    let e = Topology::from_json("{\"format\": 1}").expect_err("not a topology");
    assert!(matches!(e, TopologyError::Json(_)), "{e:?}");
    assert!(e.to_string().starts_with("not a p2p topology"), "{e}");
    let mut ring = load("ring-4gpu-nvlink.json");
    ring.gpus.truncate(2);
    let e = Topology::from_json(&ring.to_json()).expect_err("links to GPUs that are not there");
    assert!(
        matches!(
            e,
            TopologyError::LinkOutOfRange {
                remote: p2p_transport::topo::Remote::Gpu(2..),
                gpus: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("points at GPU Gpu("), "{e}");
    let mut ring = load("ring-4gpu-nvlink.json");
    for g in &mut ring.gpus {
        g.nvlinks.clear();
    }
    ring.gpus.truncate(2);
    let e = Topology::from_json(&ring.to_json()).expect_err("pairs of GPUs that are not there");
    assert!(
        matches!(e, TopologyError::PairOutOfRange { gpus: 2, .. }),
        "{e:?}"
    );
    assert!(e.to_string().ends_with("is out of range for 2 GPUs"), "{e}");
}

#[test]
fn unreported_nvlink_ends_are_inferred_from_nvml() {
    use p2p_transport::topo::Remote;
    // The ring with every far end hidden, as some VMs report it: GPU0 has 10 links and NVML says
    // NVLink P2P is OK to GPU1 and GPU3, so each gets an even share (an estimate).
    let mut t = load("ring-4gpu-nvlink.json");
    for g in &mut t.gpus {
        for l in &mut g.nvlinks {
            l.remote = Remote::Unresolved;
            l.remote_bus_id = "ffffffff:ff:ff.0".into();
        }
    }
    assert_eq!(t.connection(0, 1), nvlink(5, 3));
    assert_eq!(t.connection(0, 3), nvlink(5, 3));
    // NVML reports no NVLink P2P between opposite GPUs: still PCIe, still relayed.
    assert_eq!(t.connection(0, 2), Connection::Pcie(PathLevel::Sys));
    assert_eq!(t.path(0, 2).via, Some(1));
}

#[test]
fn h200x4_behind_an_nvswitch_recorded_on_the_machine() {
    // Recorded on 4 x H200 SXM behind an NVSwitch: the VM masks every link's far end
    // (ffffffff:ff:ff.0), and NVML's remote device type says NVSwitch. nvidia-smi prints NV18
    // for every pair; the model must too, with the 18 links shared by the three peers.
    let t = load("h200x4-nvswitch.json");
    assert_eq!(t.gpus.len(), 4);
    for g in &t.gpus {
        assert_eq!(g.nvlinks.len(), 18, "GPU{}", g.index);
        assert!(g
            .nvlinks
            .iter()
            .all(|l| l.remote_device_type.as_deref() == Some("switch")));
    }
    every_pair_behind_a_switch(&t, 3);
    // As nvidia-smi topo -m: NV18 in every off-diagonal cell (the old model said NV6).
    let m = render_matrix(&t);
    assert_eq!(m.matches("NV18").count(), 12, "{m}");
    assert!(!m.contains("NV6"), "{m}");
}
