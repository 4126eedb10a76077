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
//! they are killed, so a crashed rank never leaves its peers waiting.
//!
//! Each rank runs in a process group of its own, and every stop is of the whole group: what a
//! rank started (a wrapper script's program that it did not `exec`, a helper it spawned) ends
//! with it, and whatever a rank left running in its group when the job ends is stopped too.
//! A rank also dies with the launcher (`PR_SET_PDEATHSIG`). Since the groups are the ranks'
//! own, Ctrl-C at a terminal reaches the launcher alone: give [`LaunchOptions::stop`] a flag
//! that a signal handler sets (as `p2p-bench launch` does) and the launcher stops every rank
//! (SIGTERM to each group, SIGKILL to what is left [`GRACE`] later). Every wait of the launcher
//! has a deadline except the job itself, which runs as long as it runs unless
//! [`LaunchOptions::time_limit`] says otherwise.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2p_transport::launch::Lines;
use rustix::process::{Pid, Signal};

/// How long the other ranks have to end by themselves after one failed, before they are killed.
pub const GRACE: Duration = Duration::from_secs(3);

/// How a launched job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The first failing rank's status, or the last rank's once all exited cleanly.
    pub status: ExitStatus,
    /// The first rank that failed, if one did.
    pub failed_rank: Option<usize>,
    /// The ranks that were still running [`GRACE`] after that and were killed, or that a stop
    /// ended.
    pub killed: usize,
    /// Why the launcher stopped the job itself, if it did.
    pub stopped: Option<Stopped>,
}

/// Why the launcher stopped a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The [`LaunchOptions::stop`] flag was set (a signal, in `p2p-bench launch`).
    Asked,
    /// The job ran past [`LaunchOptions::time_limit`].
    TimeLimit(Duration),
}

/// How to launch a job, beyond its ranks and program.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Pose as this many hosts ([`launch_hosts`]); 1 for one host.
    pub hosts: usize,
    /// Stop the job (every rank's group) once it has run this long.
    pub time_limit: Option<Duration>,
    /// Stop the job when this becomes true (polled every 5 ms): set it from a signal handler.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            hosts: 1,
            time_limit: None,
            stop: None,
        }
    }
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
    let opts = LaunchOptions {
        hosts,
        ..LaunchOptions::default()
    };
    launch_with(n, program, args, &opts)
}

/// [`launch`] with [`LaunchOptions`]: hosts to pose as, a time limit, a stop flag.
pub fn launch_with(
    n: usize,
    program: &str,
    args: &[String],
    opts: &LaunchOptions,
) -> std::io::Result<Outcome> {
    let hosts = opts.hosts;
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
        in_own_group(&mut cmd);
        let spawned = lines
            .attach(rank, &mut cmd)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|()| cmd.spawn());
        match spawned {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                stop(&mut children, Signal::KILL);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("starting rank {rank} ({program}): {e}"),
                ));
            }
        }
    }
    let groups: Vec<(usize, u32)> = children.iter().map(|(r, c)| (*r, c.id())).collect();
    let outcome = run(&mut children, &mut lines, opts);
    sweep(&groups);
    outcome
}

/// Waits for the ranks: the first failure (then the others' [`GRACE`]), a stop, or all done.
fn run(
    children: &mut Vec<(usize, Child)>,
    lines: &mut Lines,
    opts: &LaunchOptions,
) -> std::io::Result<Outcome> {
    let started = Instant::now();
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
                stop(children, Signal::KILL);
                return Ok(Outcome {
                    status,
                    failed_rank: Some(rank),
                    killed,
                    stopped: None,
                });
            }
        }
        let asked = opts
            .stop
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed));
        let why = match opts.time_limit {
            _ if asked => Some(Stopped::Asked),
            Some(limit) if started.elapsed() >= limit => Some(Stopped::TimeLimit(limit)),
            _ => None,
        };
        if let (Some(why), false) = (why, children.is_empty()) {
            tracing::warn!(
                "{why:?}: stopping the {} running rank(s) (SIGTERM, SIGKILL {GRACE:?} later)",
                children.len()
            );
            let killed = children.len();
            let status = stop(children, Signal::TERM);
            return Ok(Outcome {
                status: status.or(last).unwrap_or_else(killed_status),
                failed_rank: None,
                killed,
                stopped: Some(why),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    last.map(|status| Outcome {
        status,
        failed_rank: None,
        killed: 0,
        stopped: None,
    })
    .ok_or_else(|| std::io::Error::other("no rank reported an exit status"))
}

/// The status of a process ended by SIGKILL, for a stop whose ranks left none to report.
fn killed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(Signal::KILL.as_raw())
}

/// Makes `cmd`'s process the leader of a process group of its own, which dies with the
/// launcher.
fn in_own_group(cmd: &mut Command) {
    cmd.process_group(0);
    let launcher = Pid::from_raw(std::process::id() as i32);
    // SAFETY: the closure runs in the child between fork and exec and makes only raw system
    // calls (prctl, getppid), which are async-signal-safe; it allocates nothing.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The launcher may have died before the prctl: then nobody would stop this rank.
            if rustix::process::getppid() != launcher {
                return Err(std::io::Error::other(
                    "the launcher ended before the rank started",
                ));
            }
            Ok(())
        });
    }
}

/// Sends `signal` to the process group of each rank in `pids` (each rank leads its own); a
/// group that has ended already is passed over.
fn signal_groups(pids: impl Iterator<Item = u32>, signal: Signal) {
    for pid in pids.filter_map(|p| Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Stops what the ranks left in their process groups after the job ended: a process a rank
/// started and did not wait for. Logged, since a rank should not leave any.
fn sweep(groups: &[(usize, u32)]) {
    for &(rank, pid) in groups {
        let Some(group) = Pid::from_raw(pid as i32) else {
            continue;
        };
        if rustix::process::kill_process_group(group, Signal::KILL).is_ok() {
            tracing::warn!(
                rank,
                "rank {rank} left processes running in its group (pgid {pid}) when the job ended: killed"
            );
        }
    }
}

/// How long [`stop`] waits for the ranks it killed to be reaped.
const REAP: Duration = Duration::from_secs(5);

/// Stops every rank in `children`, group and all, and reaps them: `signal` first (SIGTERM:
/// then [`GRACE`] to end before SIGKILL; SIGKILL: at once), waiting at most [`REAP`] after the
/// SIGKILL. A process that a kill does not end at once (in an uninterruptible wait on the
/// driver) is named in the log and left, rather than hold the launcher. Returns the first
/// status reaped.
fn stop(children: &mut Vec<(usize, Child)>, signal: Signal) -> Option<ExitStatus> {
    let mut first = None;
    let mut reap = |children: &mut Vec<(usize, Child)>, until: Instant, last: bool| {
        children.retain_mut(|(rank, c)| loop {
            match c.try_wait() {
                Ok(Some(status)) => {
                    first.get_or_insert(status);
                    return false;
                }
                Ok(None) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) if !last => return true,
                Ok(None) | Err(_) => {
                    tracing::error!(
                        rank = *rank,
                        pid = c.id(),
                        "rank {rank} (pid {}) was killed but has not ended within {REAP:?}: left running (look for it with ps; it may be stuck in the GPU driver)",
                        c.id()
                    );
                    return false;
                }
            }
        });
    };
    if signal != Signal::KILL {
        signal_groups(children.iter().map(|(_, c)| c.id()), signal);
        reap(children, Instant::now() + GRACE, false);
    }
    signal_groups(children.iter().map(|(_, c)| c.id()), Signal::KILL);
    reap(children, Instant::now() + REAP, true);
    children.clear();
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p_testkit::running;

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

    /// The pids that the ranks' scripts wrote into `dir` (one file a rank).
    fn written_pids(dir: &std::path::Path, ranks: usize) -> Vec<u32> {
        (0..ranks)
            .map(|r| {
                let text = std::fs::read_to_string(dir.join(format!("{r}.pid"))).expect("a pid");
                text.trim().parse().expect("a number")
            })
            .collect()
    }

    fn scratch(what: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("p2p-launch-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    /// A rank whose wrapper starts its program without `exec` (a shell that waits for it): the
    /// stop after another rank's failure ends the program too, not only the wrapper.
    #[test]
    fn a_wrapper_that_does_not_exec_is_stopped_with_its_program() {
        let dir = scratch("wrapper");
        let script = format!(
            "if [ \"$RANK\" = 1 ]; then echo $$ > {d}/1.pid; sleep 0.5; exit 3; fi; sleep 30 & echo $! > {d}/$RANK.pid; wait",
            d = dir.display()
        );
        let out = launch(2, "sh", &["-c".into(), script]).expect("launch");
        assert_eq!((out.failed_rank, out.status.code()), (Some(1), Some(3)));
        let pids = written_pids(&dir, 2);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !running(pids[0]),
            "rank 0's program (pid {}) outlived the job",
            pids[0]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a rank leaves running in its group after a clean exit is stopped when the job ends.
    #[test]
    fn what_a_rank_leaves_behind_is_stopped_when_the_job_ends() {
        let dir = scratch("leftover");
        let script = format!("sleep 30 & echo $! > {}/$RANK.pid; exit 0", dir.display());
        let out = launch(2, "sh", &["-c".into(), script]).expect("launch");
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(100));
        for pid in written_pids(&dir, 2) {
            assert!(
                !running(pid),
                "a rank's background process (pid {pid}) outlived the job"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The stop flag (a signal, in p2p-bench) ends every rank: SIGTERM first, SIGKILL for one
    /// that ignores it, [`GRACE`] later; the outcome says why.
    #[test]
    fn a_stop_flag_ends_every_rank_even_one_that_ignores_sigterm() {
        let flag = Arc::new(AtomicBool::new(false));
        let opts = LaunchOptions {
            stop: Some(flag.clone()),
            ..LaunchOptions::default()
        };
        let script = "if [ \"$RANK\" = 0 ]; then trap '' TERM; fi; sleep 30; exit 0".to_string();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::Relaxed);
        });
        let t = Instant::now();
        let out = launch_with(2, "sh", &["-c".into(), script], &opts).expect("launch");
        setter.join().expect("the setter");
        assert_eq!(
            (out.stopped, out.killed, out.failed_rank),
            (Some(Stopped::Asked), 2, None)
        );
        assert!(!out.status.success(), "{out:?}");
        let took = t.elapsed();
        assert!(took < GRACE + Duration::from_secs(4), "took {took:?}");
        assert!(took >= GRACE, "SIGKILL came before the grace: {took:?}");
    }

    /// A job past its time limit is stopped, and the outcome says so.
    #[test]
    fn a_job_past_its_time_limit_is_stopped() {
        let limit = Duration::from_millis(300);
        let opts = LaunchOptions {
            time_limit: Some(limit),
            ..LaunchOptions::default()
        };
        let t = Instant::now();
        let out =
            launch_with(2, "sh", &["-c".into(), "exec sleep 30".into()], &opts).expect("launch");
        assert_eq!(out.stopped, Some(Stopped::TimeLimit(limit)), "{out:?}");
        assert_eq!(out.killed, 2);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
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
