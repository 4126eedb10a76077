//! Running the command-line tool from a test.

use std::process::Command;

/// The `p2p-bench` executable, as a command to add arguments to.
pub fn command() -> Command {
    // The bundle's run.sh points this at its own copy (no build tree on GPU machines).
    let exe = std::env::var("P2PTEST_BENCH_EXE")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_p2p-bench").into());
    Command::new(exe)
}

/// Runs `p2p-bench` with `args` and extra environment: (exit code, stdout, stderr).
pub fn p2p_bench(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = command();
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

/// [`p2p_bench`] with the arguments of `line`, split at white space.
pub fn p2p_bench_line(line: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    p2p_bench(&line.split_whitespace().collect::<Vec<_>>(), env)
}

/// Runs `p2p-bench` and checks that it exits with `code`, its stderr containing `text`.
pub fn assert_fails(args: &[&str], env: &[(&str, &str)], code: i32, text: &str) {
    let (got, out, err) = p2p_bench(args, env);
    assert_eq!(got, code, "p2p-bench {args:?}: {out}{err}");
    assert!(err.contains(text), "p2p-bench {args:?}: {err}");
}
