//! Starting N local processes as the ranks of one communicator (what `p2p-bench launch` does).
//!
//! Each child gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE`, as torchrun sets
//! them, plus the job's identity and a fresh secret (`P2P_JOB_ID`, `P2P_JOB_SECRET`, see
//! [`crate::rendezvous`]): only these children can join the job. No port is opened. If one
//! child fails, the others are killed, so a crashed rank never leaves its peers waiting. Children share the launcher's process group,
//! so Ctrl-C reaches every rank; what a rank itself started is not tracked.

use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// Runs `program args` as `n` ranks on this host; returns the first failing child's status,
/// or success once all have exited cleanly.
pub fn launch(n: usize, program: &str, args: &[String]) -> std::io::Result<ExitStatus> {
    let secret = crate::rendezvous::Secret::generate_text()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let job = format!(
        "launch-{}-{}",
        std::process::id(),
        &crate::rendezvous::Secret::generate_text()
            .map_err(|e| std::io::Error::other(e.to_string()))?[..16]
    );
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..n {
        let child = Command::new(program)
            .args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("P2P_JOB_ID", &job)
            .env("P2P_JOB_SECRET", &secret)
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                stop(&mut children);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("starting rank {rank} ({program}): {e}"),
                ));
            }
        }
    }
    let mut last = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait()? {
                Some(status) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() {
                        tracing::error!(rank, %status, "a rank failed; stopping the others");
                        stop(&mut children);
                        return Ok(status);
                    }
                    last = Some(status);
                }
                None => i += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    last.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no ranks to launch (n = 0)",
        )
    })
}

fn stop(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
    children.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_gets_the_launcher_environment_and_one_job_secret() {
        let dir = std::env::temp_dir().join(format!("p2p-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = format!(
            "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $P2P_JOB_ID $P2P_JOB_SECRET\" > {}/$RANK",
            dir.display()
        );
        let status = launch(3, "sh", &["-c".into(), script]).expect("launch");
        assert!(status.success());
        let mut jobs = Vec::new();
        for rank in 0..3 {
            let line = std::fs::read_to_string(dir.join(rank.to_string())).expect("written");
            let f: Vec<&str> = line.split_whitespace().collect();
            let r = rank.to_string();
            assert_eq!(&f[..4], &[&r[..], "3", &r[..], "3"]);
            assert_eq!(f[5].len(), 64, "a 256-bit secret in hex");
            jobs.push((f[4].to_string(), f[5].to_string()));
            // Every rank can build its rendezvous from this environment.
            let rv = crate::Rendezvous::from_vars(|k| match k {
                "RANK" => Some(r.clone()),
                "WORLD_SIZE" | "LOCAL_WORLD_SIZE" => Some("3".into()),
                "P2P_JOB_ID" => Some(f[4].to_string()),
                "P2P_JOB_SECRET" => Some(f[5].to_string()),
                _ => None,
            })
            .expect("rendezvous");
            assert!(rv.secret.is_some());
        }
        assert!(jobs.iter().all(|j| j == &jobs[0]), "{jobs:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failing_rank_stops_the_others_and_its_status_is_returned() {
        let start = std::time::Instant::now();
        let script = "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 30".to_string();
        let status = launch(3, "sh", &["-c".into(), script]).expect("launch");
        assert_eq!(status.code(), Some(3));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the sleepers were not stopped"
        );
    }
}
