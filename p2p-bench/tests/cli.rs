//! The command-line tool as a user runs it: no GPU needed.

mod support;
use p2p_mem::fdpass::PrivateDir;
use support::{assert_fails, command, p2p_bench, p2p_bench_line};

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
        1,
        "p2p-bench faults: no GPU found",
    );
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
    assert!(!dir.exists(), "a report was written into {out}");
}

#[test]
fn kernels_without_a_gpu_or_a_target_exits_1_and_says_what_to_name() {
    let text = "): name the targets, e.g. --arch sm_90";
    assert_fails(&["kernels"], &[("CUDA_VISIBLE_DEVICES", "")], 1, text);
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
    assert!(out.contains("GPU0  X     PIX   SYS   SYS"), "{out}");
    assert!(out.contains("cuDeviceCanAccessPeer (CUDA)"));
    let (code, json, _) = p2p_bench(&["topo", "--load", fixture, "--json"], &[]);
    assert_eq!(code, 0);
    assert!(p2p_transport::topo::Topology::from_json(&json).is_ok_and(|t| t.gpus.len() == 4));
    let (code, _, err) = p2p_bench(&["topo", "--load", "/nonexistent.json"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent.json"), "{err}");
}

/// `p2p-bench launch -n n -- sh -c script`: its status, stdout and stderr.
fn launch_sh(n: usize, script: &str) -> (i32, String, String) {
    p2p_bench(
        &["launch", "-n", &n.to_string(), "--", "sh", "-c", script],
        &[],
    )
}

#[test]
fn launch_runs_every_rank_and_returns_a_failing_ranks_status() {
    let (code, out, err) = launch_sh(3, "echo rank=$RANK of $WORLD_SIZE");
    assert_eq!(code, 0, "{err}");
    for r in 0..3 {
        assert!(out.contains(&format!("rank={r} of 3")), "{out}");
    }
    let (code, _, err) = launch_sh(2, "[ $RANK = 1 ] && exit 7; exec sleep 20");
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("a rank failed"), "{err}");
}

/// Every command that needs a GPU answers its absence alike: one message, exit status 1 (what
/// `p2p-bench --help` lists), and nothing written.
#[test]
fn every_command_that_needs_a_gpu_says_so_alike() {
    let dir = std::env::temp_dir().join(format!("p2p-no-gpu-{}", std::process::id()));
    let out = dir.to_str().expect("a UTF-8 temporary path");
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["topo"],
        &["p2p", "--out", out],
        &["coll", "--out", out],
        &["sendrecv", "--out", out],
        &["host"],
        &["faults", "-n", "2", "--out", out],
        &["kernels"],
    ] {
        let (code, _, err) = p2p_bench(args, &[("CUDA_VISIBLE_DEVICES", "")]);
        assert_eq!(code, 1, "p2p-bench {args:?}: {err}");
        let text = format!("p2p-bench {}: no GPU found (", args[0]);
        assert!(err.contains(&text), "p2p-bench {args:?}: {err}");
    }
    assert!(!dir.exists(), "something was written into {out}");
}

#[test]
fn list_without_a_gpu_still_names_the_libraries_it_found() {
    let (code, out, err) = p2p_bench(&["list"], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert_eq!(code, 1, "{err}");
    assert!(out.starts_with("libraries:\n"), "{out}");
    let (code, json, err) = p2p_bench(&["list", "--json"], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert_eq!(code, 1, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("list --json prints JSON");
    assert!(
        doc["error"].is_string() && doc["gpus"] == serde_json::json!([]),
        "{doc}"
    );
}

#[test]
fn the_help_lists_the_exit_statuses() {
    let (code, out, _) = p2p_bench(&["--help"], &[]);
    assert_eq!(code, 0);
    for status in [
        "0  done",
        "1  could not do it: no GPU",
        "2  usage",
        "3  coll",
    ] {
        assert!(out.contains(status), "{status}: {out}");
    }
}

/// The collectives' settings are checked before any command, by p2p-collective's own reader,
/// as the transport's are by its own.
#[test]
fn a_bad_collective_setting_exits_2_naming_it() {
    for (var, value, accepted) in [
        (
            "P2P_TIMEOUT_MS",
            "abc",
            "a whole number of milliseconds, 1 to 86400000",
        ),
        ("P2P_ALGO", "fast", "auto or one of oneshot"),
        ("P2P_PROTO", "ring", "auto or one of ll"),
        ("P2P_CHECK", "maybe", "0, 1, true, false"),
    ] {
        let text = format!("{var}=\"{value}\" is not valid: accepted values are {accepted}");
        assert_fails(&["doctor"], &[(var, value)], 2, &text);
        assert_fails(&["list"], &[(var, value)], 2, &text);
    }
}

/// Writes `text` to `name` in `dir`: its path.
fn file_in(dir: &PrivateDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write a temporary file");
    path.to_str().expect("a UTF-8 temporary path").to_string()
}

#[test]
fn render_refuses_what_is_not_a_coll_results_file_and_writes_nothing() {
    let dir = PrivateDir::new("render-refuses").expect("a temporary folder");
    for (name, text, lacks) in [
        ("empty.json", "{}", "missing field `benchmark`"),
        ("list.json", "[1,2]", "it is an array, not a JSON object"),
        (
            "hosts.json",
            r#"{"benchmark": "hosts"}"#,
            "unknown variant `hosts`",
        ),
    ] {
        let path = file_in(&dir, name, text);
        assert_fails(&["render", &path], &[], 1, lacks);
        assert_fails(&["render", &path], &[], 1, &path);
        for ext in ["md", "svg"] {
            let written = std::path::Path::new(&path).with_extension(ext);
            assert!(!written.exists(), "{} was written", written.display());
        }
    }
}

/// Results files of two generations of `coll` (before and after registered buffers and the
/// `complete` mark), as `docs/results` holds them.
#[test]
fn render_draws_a_coll_results_file() {
    let dir = PrivateDir::new("render-draws").expect("a temporary folder");
    for (name, text) in [
        (
            "old.json",
            include_str!("../../docs/results/2026-11-22-4xh200-sweeps/baseline/sweep-ring-w2.json"),
        ),
        (
            "new.json",
            include_str!(
                "../../docs/results/2026-11-26-2xh100-hang-gate-table/probe/hang-default/coll-2026-11-26-2xh100-80gb-hbm3.json"
            ),
        ),
    ] {
        let path = file_in(&dir, name, text);
        let (code, _, err) = p2p_bench(&["render", &path], &[]);
        assert_eq!(code, 0, "{name}: {err}");
        let md = std::fs::read_to_string(std::path::Path::new(&path).with_extension("md"))
            .expect("render writes the table");
        assert!(md.starts_with("# p2p collectives beside NCCL"), "{md}");
        assert!(md.contains("\n| size | count | type |"), "{md}");
        let svg = std::fs::read_to_string(std::path::Path::new(&path).with_extension("svg"))
            .expect("render writes the plot");
        assert!(svg.starts_with("<svg"), "{svg}");
    }
}

/// `render --nccl-tests` prints p2p's figures in nccl-tests' columns, for scripts that parse
/// nccl-tests, and writes nothing.
#[test]
fn render_prints_nccl_tests_columns_and_writes_nothing() {
    let dir = PrivateDir::new("render-nccl-tests").expect("a temporary folder");
    let path = file_in(
        &dir,
        "ring.json",
        include_str!("../../docs/results/2026-11-22-4xh200-sweeps/baseline/sweep-ring-w2.json"),
    );
    for (flags, timing) in [
        (&["--nccl-tests"][..], "eager"),
        (&["--nccl-tests", "--graph"][..], "graph"),
    ] {
        let mut args = vec!["render"];
        args.extend(flags);
        args.push(&path);
        let (code, out, err) = p2p_bench(&args, &[]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(&format!("p2p's figures ({timing})")), "{out}");
        assert!(out.contains("# Collective: all_reduce\n"), "{out}");
        // The 64 KiB row: size, count, type, redop, root and two sides of four.
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("65536 "))
            .expect("the 64 KiB row");
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields.len(), 13, "{row}");
        assert_eq!(
            &fields[..5],
            ["65536", "16384", "float", "sum", "-1"],
            "{row}"
        );
        assert!(fields[5].parse::<f64>().is_ok_and(|us| us > 0.0), "{row}");
    }
    let written = std::fs::read_dir(dir.path()).expect("the folder").count();
    assert_eq!(written, 1, "only the results file");
    // --graph alone is a usage error.
    let (code, _, err) = p2p_bench(&["render", "--graph", &path], &[]);
    assert_eq!(code, 2, "{err}");
}

/// A reader that goes away (`p2p-bench topo --load F | head -1`) ends no command with a
/// panic: the command stops writing and exits with its own status. Its standard output is a
/// socket whose other end is closed before it starts, so every write meets `EPIPE`.
#[test]
fn a_closed_standard_output_is_no_panic() {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    let dir = std::env::var("P2PTEST_FIXTURES").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../p2p-transport/fixtures").into()
    });
    let fixture = format!("{dir}/dgx-h100-8gpu-nvswitch.json");
    let exe = std::env::var("P2PTEST_BENCH_EXE")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_p2p-bench").into());
    for (args, status) in [
        (&["topo", "--load", fixture.as_str()][..], 0),
        (&["topo", "--load", fixture.as_str(), "--json"], 0),
        (&["list"], 1),
        (&["--help"], 0),
    ] {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        drop(theirs);
        let out = std::process::Command::new(&exe)
            .args(args)
            .env("CUDA_VISIBLE_DEVICES", "")
            .stdout(std::process::Stdio::from(OwnedFd::from(ours)))
            .output()
            .expect("run p2p-bench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "p2p-bench {args:?}: {err}");
        assert_eq!(out.status.code(), Some(status), "p2p-bench {args:?}: {err}");
    }
}

/// The log goes to stderr in colour only on a terminal: a pipe gets plain text.
#[test]
fn launch_writes_no_colour_into_a_pipe() {
    let (code, _, err) = launch_sh(2, "[ $RANK = 1 ] && exit 3; exec sleep 20");
    assert_eq!(code, 3, "{err}");
    // The launcher's own log line (an ERROR through tracing) is there, without escapes.
    assert!(
        err.contains("ERROR") && err.contains("a rank failed"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
}

#[test]
fn plan_shows_a_reference_machine_with_its_measured_figures() {
    let (code, out, err) = p2p_bench_line("plan --machine h200x4-nvswitch --ops all_reduce", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("# p2p plan: h200x4-nvswitch"), "{out}");
    assert!(
        out.contains("## all_reduce") && !out.contains("## reduce\n"),
        "{out}"
    );
    assert!(
        out.contains("| 1 GiB ") && out.contains("NCCL best us"),
        "{out}"
    );
}

#[test]
fn plan_with_no_argument_shows_this_machine_or_the_reference_one() {
    let (code, out, err) = p2p_bench(&["plan", "--max-mib", "1"], &[]);
    assert_eq!(code, 0, "{err}");
    // With no GPU the tool says so and shows the default reference machine; with one, this
    // machine.
    assert!(
        (err.contains("no GPU here") && out.starts_with("# p2p plan: h200x4-nvswitch"))
            || out.starts_with("# p2p plan: this machine"),
        "{err}\n{out}"
    );
}

#[test]
fn plan_refuses_what_it_cannot_show_with_status_2() {
    assert_fails(
        &["plan", "--machine", "dgx-a100"],
        &[],
        2,
        "no reference machine \"dgx-a100\"; the reference machines: h200x4-nvswitch",
    );
    assert_fails(
        &["plan", "--machine", "h200x2-nv18", "--gpus", "4"],
        &[],
        2,
        "--gpus 4: h200x2-nv18 has 2 GPU(s)",
    );
    for cmd in ["plan", "coll"] {
        assert_fails(
            &[cmd, "--ops", "allreduce"],
            &[],
            2,
            "unknown collective \"allreduce\"; choose from all_reduce",
        );
    }
    assert_fails(
        &["plan", "--machine", "h200x4-nvswitch"],
        &[("P2P_ALGO", "fast")],
        2,
        "P2P_ALGO",
    );
}

#[test]
fn plan_follows_the_environment_and_the_knobs() {
    let (code, out, err) = p2p_bench(
        &[
            "plan",
            "--machine",
            "h200x4-nvswitch",
            "--ops",
            "reduce",
            "--min-bytes",
            "16777216",
            "--max-mib",
            "16",
            "--overlap-min-kib",
            "0",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["rows"][0]["route"], "split/simple", "{out}");
    assert_eq!(v["rows"][0]["overlap"], true, "{out}");
    // Knobs of their own: the figures measured under the defaults are not shown.
    assert!(v["rows"][0]["measured"].is_null(), "{out}");
    let (code, out, err) = p2p_bench(
        &[
            "plan",
            "--machine",
            "h200x4-nvswitch",
            "--ops",
            "all_reduce",
            "--json",
        ],
        &[("P2P_ALGO", "ring")],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let rows = v["rows"].as_array().expect("rows");
    assert!(rows.iter().any(|r| r["route"] == "ring/simple"), "{out}");
}

#[test]
fn a_bad_rendezvous_setting_exits_2_before_any_job_starts() {
    assert_fails(
        &["list"],
        &[("P2P_RENDEZVOUS_TIMEOUT_MS", "abc")],
        2,
        "P2P_RENDEZVOUS_TIMEOUT_MS=\"abc\" is not valid",
    );
    let (code, _, err) = p2p_bench(&["list"], &[("P2P_JOB_SECRET", "short")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("P2P_JOB_SECRET=\"<5 characters>\""), "{err}");
    assert!(!err.contains("short\""), "{err}");
}

/// Past `--time-limit` the launcher stops every rank and exits 124, saying so.
#[test]
fn launch_stops_a_job_past_its_time_limit() {
    let t = std::time::Instant::now();
    let (code, _, err) = p2p_bench_line("launch -n 2 --time-limit 300ms -- sleep 30", &[]);
    assert_eq!(code, 124, "{err}");
    assert!(err.contains("ran past its time limit (300ms)"), "{err}");
    assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
}

/// `p2p-bench launch -n 2 -- sh -c SCRIPT`, started and left running until each rank has written
/// the pid of its program to `DIR/RANK.pid` (`script(DIR)` gives the script).
struct TwoRanks {
    launcher: std::process::Child,
    dir: std::path::PathBuf,
    /// Each rank's program's pid, by rank.
    pids: Vec<u32>,
}

impl TwoRanks {
    fn start(tag: &str, script: impl Fn(&str) -> String, stderr: std::process::Stdio) -> TwoRanks {
        let dir = std::env::temp_dir().join(format!("p2p-cli-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let launcher = command()
            .args([
                "launch",
                "-n",
                "2",
                "--",
                "sh",
                "-c",
                &script(&dir.display().to_string()),
            ])
            .stderr(stderr)
            .spawn()
            .expect("run p2p-bench launch");
        let pid_file = |r: usize| dir.join(format!("{r}.pid"));
        let t = std::time::Instant::now();
        let read = |r: usize| -> Option<u32> {
            std::fs::read_to_string(pid_file(r))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let pids = loop {
            if let (Some(a), Some(b)) = (read(0), read(1)) {
                break vec![a, b];
            }
            assert!(t.elapsed().as_secs() < 10, "the ranks did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        TwoRanks {
            launcher,
            dir,
            pids,
        }
    }
}

/// SIGTERM (or Ctrl-C's SIGINT) to the launcher stops every rank, process group and all,
/// and the launcher exits 130: no rank is left running.
#[test]
fn launch_stopped_by_a_signal_stops_every_rank() {
    let script = |dir: &str| format!("sleep 30 & echo $! > {dir}/$RANK.pid; wait");
    let TwoRanks {
        launcher: child,
        dir,
        pids,
    } = TwoRanks::start("signal", script, std::process::Stdio::piped());
    let launcher = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(launcher, rustix::process::Signal::TERM).expect("SIGTERM");
    let out = child.wait_with_output().expect("the launcher ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("stopped by a signal: 2 rank(s) stopped"),
        "{err}"
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    for (r, pid) in pids.into_iter().enumerate() {
        assert!(
            !p2p_testkit::running(pid),
            "rank {r}'s program (pid {pid}) outlived the launcher"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher killed outright (SIGKILL: no handler runs) takes its ranks with it.
#[test]
fn launch_killed_outright_takes_its_ranks_with_it() {
    let script = |dir: &str| format!("echo $$ > {dir}/$RANK.pid; exec sleep 30");
    let TwoRanks {
        launcher: mut child,
        dir,
        pids,
    } = TwoRanks::start("pdeath", script, std::process::Stdio::null());
    child.kill().expect("SIGKILL the launcher");
    child.wait().expect("reap the launcher");
    let t = std::time::Instant::now();
    while pids.iter().any(|&p| p2p_testkit::running(p)) {
        assert!(
            t.elapsed().as_secs() < 5,
            "a rank outlived its launcher: {pids:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
