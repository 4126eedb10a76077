//! Warnings that ask the user to act (here: a misspelt `P2P_*` variable) are never lost: where
//! the program set up no `tracing` subscriber they are printed to stderr, and where it did they
//! go through its log only. Runs in CI (no GPU): the test runs itself again as a child process,
//! with and without a subscriber, and reads what the child printed.

use std::process::Command;

use p2p_transport::config::{log_is_heard, Config};

const TEST: &str = "a_misspelt_variable_is_warned_about_with_or_without_a_subscriber";

/// In the child: read the configuration leniently, as a library inside a user's program does.
fn child(role: &str) {
    // The program's own log, on stdout here, so that stderr shows only what p2p printed itself.
    let log = || {
        tracing_subscriber::fmt()
            .with_writer(std::io::stdout)
            .with_ansi(false)
    };
    match role {
        "logged" => log().init(),
        // The README's way, with P2P_DEBUG=error: the subscriber's filter hides warnings.
        "filtered" => {
            let vars = [("P2P_DEBUG".to_string(), "error".to_string())];
            let filter = Config::from_vars(vars).expect("valid").tracing_filter();
            log()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .init()
        }
        _ => {}
    }
    assert_eq!(log_is_heard(), role != "plain");
    // Twice, as the transport reads it again for every new pair of GPUs: stderr says it once.
    for _ in 0..2 {
        let cfg = Config::from_env_lenient().expect("an unknown variable is only a warning");
        assert_eq!(cfg, Config::default());
    }
}

/// Runs this test again as a child with `P2P_LEVLE` set; its stdout and stderr.
fn run_child(role: &str) -> (String, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("P2PTEST_ROLE", role);
    // Only the misspelt variable: the developer's own P2P_* settings must not change the outcome.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("P2P_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("P2P_LEVLE", "NVL");
    let out = cmd.output().expect("running the child");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn a_misspelt_variable_is_warned_about_with_or_without_a_subscriber() {
    if let Ok(role) = std::env::var("P2PTEST_ROLE") {
        return child(&role);
    }
    // No subscriber: one line on stderr that names the variable (read twice, printed once).
    let (_, stderr) = run_child("plain");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("p2p warning: "))
        .collect();
    assert_eq!(lines.len(), 1, "stderr:\n{stderr}");
    assert!(lines[0].contains("P2P_LEVLE"), "{}", lines[0]);
    // A subscriber: the warning is in the program's log (each time it is read), and p2p prints
    // nothing of its own.
    let (stdout, stderr) = run_child("logged");
    assert!(!stderr.contains("p2p warning:"), "stderr:\n{stderr}");
    let logged = stdout
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("P2P_LEVLE"))
        .count();
    assert_eq!(logged, 2, "stdout:\n{stdout}");
    // A subscriber filtered at error (P2P_DEBUG=error through Config::tracing_filter): hidden
    // from both, as asked.
    let (stdout, stderr) = run_child("filtered");
    assert!(!stderr.contains("P2P_LEVLE"), "stderr:\n{stderr}");
    assert!(!stdout.contains("P2P_LEVLE"), "stdout:\n{stdout}");
}

#[test]
fn a_scoped_subscriber_counts_as_heard() {
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || assert!(log_is_heard()));
    let none = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(none, || assert!(!log_is_heard()));
}
