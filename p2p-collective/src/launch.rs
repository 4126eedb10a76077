//! Starting N local processes as the ranks of one communicator (what `p2p-bench launch` does).
//!
//! Each child gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE`, as torchrun sets
//! them, plus the job's identity and a fresh secret (`P2P_JOB_ID`, `P2P_JOB_SECRET`, see
//! [`crate::rendezvous`]): only these children can join the job. No port is opened.
//!
//! When a rank's process ends, the launcher tells the others at once over its line to each
//! ([`p2p_transport::launch`]): a rank still waiting in the rendezvous for one that died before
//! it joined fails within milliseconds, naming it. After a rank fails, the others have
//! [`GRACE`] to end by themselves (a communicator already tells them, naming the rank), then
//! they are killed, so a crashed rank never leaves its peers waiting. Children share the
//! launcher's process group, so Ctrl-C reaches every rank; what a rank itself started is not
//! tracked.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use p2p_transport::launch::Lines;

/// How long the other ranks have to end by themselves after one failed, before they are killed.
pub const GRACE: Duration = Duration::from_secs(3);

/// How a launched job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The first failing rank's status, or the last rank's once all exited cleanly.
    pub status: ExitStatus,
    /// The first rank that failed, if one did.
    pub failed_rank: Option<usize>,
    /// The ranks that were still running [`GRACE`] after that and were killed.
    pub killed: usize,
}

/// Runs `program args` as `n` ranks on this host; returns the first failing rank and its
/// status, or success once all have exited cleanly.
pub fn launch(n: usize, program: &str, args: &[String]) -> std::io::Result<Outcome> {
    launch_hosts(n, 1, program, args)
}

/// [`launch`] with this machine posing as `hosts` hosts of `n / hosts` ranks each, for testing
/// jobs over hosts ([`crate::MultiHostCommunicator`]) on one machine: ranks are numbered host
/// by host as torchrun numbers them (`LOCAL_WORLD_SIZE`, `LOCAL_RANK`, `GROUP_RANK`), each host
/// gets its own GPUs (`CUDA_VISIBLE_DEVICES`: host h the h-th `n / hosts` of the GPUs this
/// process sees, or of its own `CUDA_VISIBLE_DEVICES`) and its own identity for p2p and NCCL
/// (`P2P_HOST_ID` and `NCCL_HOSTID`, so that NCCL too takes its network path between them).
pub fn launch_hosts(
    n: usize,
    hosts: usize,
    program: &str,
    args: &[String],
) -> std::io::Result<Outcome> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
    if n == 0 {
        return Err(invalid("no ranks to launch (n = 0)".into()));
    }
    if hosts == 0 || n % hosts != 0 {
        return Err(invalid(format!(
            "{n} ranks cannot be split evenly over {hosts} hosts"
        )));
    }
    let local = n / hosts;
    let gpus: Vec<String> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|g| g.trim().to_string()).collect(),
        _ => (0..n).map(|g| g.to_string()).collect(),
    };
    if hosts > 1 && gpus.len() < n {
        return Err(invalid(format!(
            "{hosts} hosts of {local} ranks need {n} GPUs; CUDA_VISIBLE_DEVICES names {}",
            gpus.len()
        )));
    }
    let secret = crate::rendezvous::Secret::generate_text()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let job = format!(
        "launch-{}-{}",
        std::process::id(),
        &crate::rendezvous::Secret::generate_text()
            .map_err(|e| std::io::Error::other(e.to_string()))?[..16]
    );
    let mut lines = Lines::new(n).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(program);
        let (host, local_rank) = (rank / local, rank % local);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("LOCAL_WORLD_SIZE", local.to_string())
            .env("P2P_JOB_ID", &job)
            .env("P2P_JOB_SECRET", &secret);
        if hosts > 1 {
            let id = format!("{job}-host-{host}");
            cmd.env("GROUP_RANK", host.to_string())
                .env(
                    "CUDA_VISIBLE_DEVICES",
                    gpus[host * local..][..local].join(","),
                )
                .env("P2P_HOST_ID", &id)
                .env("NCCL_HOSTID", &id);
        }
        let spawned = lines
            .attach(rank, &mut cmd)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|()| cmd.spawn());
        match spawned {
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
    let mut failed: Option<(usize, ExitStatus, Instant)> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait()? {
                Some(status) => {
                    let (rank, child) = children.remove(i);
                    lines.tell_ended(rank, child.id(), &status.to_string());
                    if !status.success() && failed.is_none() {
                        tracing::error!(
                            rank,
                            %status,
                            "a rank failed; the others have {GRACE:?} to end"
                        );
                        failed = Some((rank, status, Instant::now()));
                    }
                    last = Some(status);
                }
                None => i += 1,
            }
        }
        if let Some((rank, status, at)) = failed {
            if at.elapsed() >= GRACE || children.is_empty() {
                let killed = children.len();
                stop(&mut children);
                return Ok(Outcome {
                    status,
                    failed_rank: Some(rank),
                    killed,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    last.map(|status| Outcome {
        status,
        failed_rank: None,
        killed: 0,
    })
    .ok_or_else(|| std::io::Error::other("no rank reported an exit status"))
}

/// How long [`stop`] waits for the ranks it killed to be reaped.
const REAP: Duration = Duration::from_secs(5);

/// Kills every rank in `children` and reaps them, waiting at most [`REAP`] in all: a process
/// that a kill does not end at once (stuck in the kernel, in an uninterruptible wait on the
/// driver) is named in the log and left, rather than hold the launcher.
fn stop(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    let deadline = Instant::now() + REAP;
    for (rank, c) in children.iter_mut() {
        while let Ok(None) = c.try_wait() {
            if Instant::now() >= deadline {
                tracing::error!(
                    rank = *rank,
                    pid = c.id(),
                    "rank {rank} (pid {}) was killed but has not ended within {REAP:?}: left running (look for it with ps; it may be stuck in the GPU driver)",
                    c.id()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
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
        let out = launch(3, "sh", &["-c".into(), script]).expect("launch");
        assert!(out.status.success());
        assert_eq!(out.failed_rank, None);
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
        let out = launch(3, "sh", &["-c".into(), script]).expect("launch");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!((out.failed_rank, out.killed), (Some(1), 2));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the sleepers were not stopped"
        );
    }

    #[test]
    fn ranks_waiting_for_one_that_died_before_joining_hear_it_from_the_launcher_at_once() {
        // Every rank is this test binary again, running only the probe below, with a
        // rendezvous limit of 60 s: the survivors must fail long before it.
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("p2p-launch-news-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = format!(
            "P2P_RENDEZVOUS_TIMEOUT_MS=60000 P2P_LAUNCH_PROBE_DIR={} exec {} --exact launch::tests::probe_rank_joins --include-ignored",
            dir.display(),
            exe.display()
        );
        let start = std::time::Instant::now();
        let out = launch(3, "sh", &["-c".into(), script]).expect("launch");
        assert_eq!((out.failed_rank, out.status.code()), (Some(1), Some(3)));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "took {:?}",
            start.elapsed()
        );
        for rank in [0, 2] {
            let text = std::fs::read_to_string(dir.join(rank.to_string())).expect("a report");
            let (ms, why) = text.split_once(' ').expect("ms and error");
            let ms: f64 = ms.parse().expect("ms");
            assert!(
                why.contains("rank 1 (pid") && why.contains("ended"),
                "rank {rank}: {why}"
            );
            assert!(ms < 1000.0, "rank {rank} heard it after {ms} ms: {why}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// One rank of the test above (run by it in a child process; does nothing on its own):
    /// rank 1 exits before it joins, the others join and write how long their failure took.
    #[test]
    #[ignore = "a rank of ranks_waiting_for_one_that_died_before_joining_hear_it_from_the_launcher_at_once"]
    fn probe_rank_joins() {
        let Some(dir) = std::env::var_os("P2P_LAUNCH_PROBE_DIR") else {
            return;
        };
        let rv = crate::Rendezvous::from_env().expect("rendezvous");
        if rv.rank == 1 {
            std::process::exit(3);
        }
        let t = std::time::Instant::now();
        let e = match crate::rendezvous::Group::join(&rv) {
            Ok(_) => "joined".to_string(),
            Err(e) => e.to_string(),
        };
        let report = format!("{} {e}", t.elapsed().as_secs_f64() * 1e3);
        std::fs::write(std::path::Path::new(&dir).join(rv.rank.to_string()), report)
            .expect("report");
    }
}
