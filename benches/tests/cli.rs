//! The command-line tool as a user runs it: no GPU needed.

use std::process::Command;

fn p2p_bench(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    // The bundle's run.sh points these at its own copies (no build tree on GPU machines).
    let exe = std::env::var("P2PTEST_BENCH_EXE")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_p2p-bench").into());
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run p2p-bench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn a_bad_configuration_value_exits_2_naming_the_variable() {
    let (code, _, err) = p2p_bench(&["list"], &[("P2P_LEVEL", "NVLINK")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("P2P_LEVEL=\"NVLINK\" is not valid: accepted values are LOC, NVL"),
        "{err}"
    );
    let (code, _, err) = p2p_bench(&["topo"], &[("P2P_LEVLE", "NVL")]);
    assert_eq!(code, 2);
    assert!(err.contains("P2P_LEVLE is not a p2p setting"), "{err}");
}

#[test]
fn topo_loads_a_saved_topology() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../p2p-transport/fixtures/a100-pcie-4gpu-2socket.json"
    );
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
