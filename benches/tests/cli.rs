//! The command-line tool as a user runs it: no GPU needed.

mod support;
use support::{assert_fails, p2p_bench};

#[test]
fn a_bad_configuration_value_exits_2_naming_the_variable() {
    assert_fails(
        &["list"],
        &[("P2P_LEVEL", "NVLINK")],
        2,
        "P2P_LEVEL=\"NVLINK\" is not valid: accepted values are LOC, NVL",
    );
}

#[test]
fn an_unknown_setting_is_a_warning_as_in_the_library() {
    let (code, _, err) = p2p_bench(
        &["topo", "--load", "/nonexistent.json"],
        &[("P2P_LEVLE", "NVL")],
    );
    // The command itself fails on the missing file (exit 1), not on the variable (exit 2).
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "P2P_LEVLE is not a p2p setting (a typo?) and is ignored; the settings are: P2P_"
        ),
        "{err}"
    );
}

/// The collectives' settings reach the transport's reader from p2p-collective's own list (a
/// link-time slice): in a real program linked with it they are known, not typos.
#[test]
fn the_collectives_settings_are_known_in_a_linked_program() {
    let (code, _, err) = p2p_bench(
        &["topo", "--load", "/nonexistent.json"],
        &[
            ("P2P_ALGO", "ring"),
            ("P2P_CHECK", "1"),
            ("P2P_TIMEOUT_MS", "5000"),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("not a p2p setting"), "{err}");
    // And the list the warnings name holds them.
    let (_, _, err) = p2p_bench(
        &["topo", "--load", "/nonexistent.json"],
        &[("P2P_LEVLE", "NVL")],
    );
    assert!(
        err.contains("P2P_ALGO") && err.contains("P2P_TIMEOUT_MS"),
        "{err}"
    );
}

#[test]
fn faults_without_a_gpu_refuses_at_once_and_writes_no_report() {
    let dir = std::env::temp_dir().join(format!("p2p-faults-{}", std::process::id()));
    let out = dir.to_str().expect("a UTF-8 temporary path");
    let t = std::time::Instant::now();
    assert_fails(
        &["faults", "-n", "2", "--out", out],
        &[("CUDA_VISIBLE_DEVICES", "")],
        2,
        "p2p-bench faults: no GPU found",
    );
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
    assert!(!dir.exists(), "a report was written into {out}");
}

#[test]
fn kernels_without_a_gpu_or_a_target_exits_2_and_says_what_to_name() {
    let text = "no GPU found here: name the targets, e.g. --arch sm_90";
    assert_fails(&["kernels"], &[("CUDA_VISIBLE_DEVICES", "")], 2, text);
}

#[test]
fn topo_loads_a_saved_topology() {
    // The bundle's run.sh points P2PTEST_FIXTURES at its copy (no source tree on GPU machines).
    let dir = std::env::var("P2PTEST_FIXTURES").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../p2p-transport/fixtures").into()
    });
    let fixture = &format!("{dir}/a100-pcie-4gpu-2socket.json");
    let (code, out, err) = p2p_bench(&["topo", "--load", fixture], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("GPU0     X      PIX     SYS     SYS"), "{out}");
    assert!(out.contains("cuDeviceCanAccessPeer (CUDA)"));
    let (code, json, _) = p2p_bench(&["topo", "--load", fixture, "--json"], &[]);
    assert_eq!(code, 0);
    assert!(p2p_transport::topo::Topology::from_json(&json).is_ok_and(|t| t.gpus.len() == 4));
    let (code, _, err) = p2p_bench(&["topo", "--load", "/nonexistent.json"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent.json"), "{err}");
}

#[test]
fn launch_runs_every_rank_and_returns_a_failing_ranks_status() {
    let (code, out, err) = p2p_bench(
        &[
            "launch",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "echo rank=$RANK of $WORLD_SIZE",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    for r in 0..3 {
        assert!(out.contains(&format!("rank={r} of 3")), "{out}");
    }
    let (code, _, err) = p2p_bench(
        &[
            "launch",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "[ $RANK = 1 ] && exit 7; exec sleep 20",
        ],
        &[],
    );
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("a rank failed"), "{err}");
}

#[test]
fn coll_refuses_an_unknown_collective_by_name() {
    let (code, _, err) = p2p_bench(&["coll", "--ops", "allreduce"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("unknown collective \"allreduce\"") && err.contains("all_reduce"),
        "{err}"
    );
}
