//! The line from a launcher to its ranks: when a rank's process ends, the launcher tells the
//! others at once, so a rank waiting in the rendezvous for one that died before it joined fails
//! within milliseconds, naming it, instead of at the rendezvous time limit.
//!
//! A launcher (`p2p-bench launch`, the fault suite) makes [`Lines`] for its job, gives each rank
//! its end with [`Lines::attach`] (an inherited socket, named by [`FD_VAR`] and [`PID_VAR`]) and
//! calls [`Lines::tell_ended`] whenever a rank's process ends. A rank reads what it was told,
//! without waiting, with [`news`]; the rendezvous looks while it waits. A rank takes its end
//! only if it is the launcher's own child (so a process the rank starts in turn, which inherits
//! the variables, never reads its parent's line). Other launchers set nothing, and a rank that
//! never comes is found by the rendezvous time limit; torchrun's agent ends the whole job when a
//! worker fails.
//!
//! ```no_run
//! use p2p_transport::launch::Lines;
//! use std::process::Command;
//!
//! let mut lines = Lines::new(2)?;
//! let mut ranks = Vec::new();
//! for rank in 0..2 {
//!     let mut cmd = Command::new("./my-rank");
//!     cmd.env("RANK", rank.to_string()).env("WORLD_SIZE", "2").env("P2P_JOB_ID", "job-1");
//!     lines.attach(rank, &mut cmd)?;
//!     ranks.push(cmd.spawn()?);
//! }
//! // Later, when rank 1's process has ended:
//! let status = ranks[1].wait()?;
//! lines.tell_ended(1, ranks[1].id(), &status.to_string());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use p2p_mem::wire::{self, Reader, Writer};
use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::error::{Error, Result};

/// The variable that names a rank's end of its line (a file descriptor number).
pub const FD_VAR: &str = "P2P_LAUNCH_FD";
/// The variable that names the launcher's process id; the line is taken only from it.
pub const PID_VAR: &str = "P2P_LAUNCHER_PID";

/// The one kind of message on a line.
const ENDED: u16 = 1;
/// The longest account of how a rank ended that is sent.
const MAX_HOW: usize = 512;

/// What a launcher told a rank: rank `rank`, process `pid`, ended, `how` (its exit status in
/// words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The rank that ended.
    pub rank: usize,
    /// Its process id.
    pub pid: u32,
    /// How it ended, e.g. `signal: 9 (SIGKILL)` or `exit status: 3`.
    pub how: String,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} (pid {}) ended ({}), as the launcher reports",
            self.rank, self.pid, self.how
        )
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Rendezvous {
        rank: None,
        why: format!("the launcher's lines: {what}: {e}"),
    }
}

/// The launcher's side: one line to each rank.
#[derive(Debug)]
pub struct Lines {
    /// The launcher's end of each rank's line.
    ends: Vec<OwnedFd>,
    /// Each rank's end until [`attach`](Self::attach) hands it over.
    theirs: Vec<Option<OwnedFd>>,
}

impl Lines {
    /// A line for each of `world` ranks (a pair of connected Unix sockets each).
    pub fn new(world: usize) -> Result<Lines> {
        let mut ends = Vec::with_capacity(world);
        let mut theirs = Vec::with_capacity(world);
        for _ in 0..world {
            let (ours, rank_end) = net::socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
            .map_err(|e| io("socketpair", e))?;
            // A rank that stopped reading must never stall the launcher.
            rustix::io::ioctl_fionbio(&ours, true).map_err(|e| io("non-blocking", e))?;
            ends.push(ours);
            theirs.push(Some(rank_end));
        }
        Ok(Lines { ends, theirs })
    }

    /// Gives rank `rank` its end of the line: `cmd`'s process inherits it, named by
    /// [`FD_VAR`] and [`PID_VAR`]. Once per rank; `cmd` owns the end from then on (it is closed
    /// here when `cmd` is dropped).
    pub fn attach(&mut self, rank: usize, cmd: &mut Command) -> Result<()> {
        let end = self
            .theirs
            .get_mut(rank)
            .and_then(Option::take)
            .ok_or_else(|| io("attach", format!("rank {rank} has no line left to give")))?;
        let raw = end.as_raw_fd();
        cmd.env(FD_VAR, raw.to_string())
            .env(PID_VAR, std::process::id().to_string());
        // SAFETY: the closure runs in the child between fork and exec and only calls fcntl, which
        // is async-signal-safe; `end` (moved in) keeps the descriptor open until then.
        unsafe {
            cmd.pre_exec(move || {
                rustix::io::fcntl_setfd(&end, rustix::io::FdFlags::empty())
                    .map_err(std::io::Error::from)
            });
        }
        Ok(())
    }

    /// Tells every rank but `rank` that `rank`'s process (`pid`) ended, and how. Never waits: a
    /// rank whose line is full or closed is skipped.
    pub fn tell_ended(&self, rank: usize, pid: u32, how: &str) {
        let msg = encode(rank, pid, how);
        for (r, end) in self.ends.iter().enumerate() {
            if r != rank {
                let _ = net::send(end, &msg, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
            }
        }
    }
}

/// A rank's end of its line, once taken.
struct Line {
    fd: OwnedFd,
    /// The first rank the launcher said ended; kept, as a dead rank stays dead.
    heard: Mutex<Option<Ended>>,
}

static LINE: OnceLock<Option<Line>> = OnceLock::new();

/// What this rank's launcher said so far: the first rank it reported ended, or `None` (also
/// where the launcher gave no line). Never waits.
pub fn news() -> Option<Ended> {
    let line = LINE
        .get_or_init(|| take_line(|n| std::env::var(n).ok()))
        .as_ref()?;
    let mut heard = line.heard.lock().unwrap_or_else(|p| p.into_inner());
    while heard.is_none() {
        let mut buf = [0u8; 1024];
        match net::recv(&line.fd, &mut buf, RecvFlags::DONTWAIT) {
            // The launcher is gone: nothing more will come (and its exit is no rank's).
            Ok((0, _)) => break,
            Ok((n, _)) => *heard = decode(&buf[..n.min(buf.len())]),
            Err(_) => break,
        }
    }
    heard.clone()
}

/// The news that `rank`'s process `pid` ended, and `how` (cut to [`MAX_HOW`] bytes).
pub(crate) fn encode(rank: usize, pid: u32, how: &str) -> Vec<u8> {
    wire::encode_message(
        ENDED,
        &Writer::new()
            .u32(rank as u32)
            .u32(pid)
            .text_within(how, MAX_HOW)
            .finish(),
    )
}

/// The news in `bytes`, or `None` for anything else.
pub(crate) fn decode(bytes: &[u8]) -> Option<Ended> {
    let (kind, p) = wire::decode_message(bytes, MAX_HOW + 16).ok()?;
    if kind != ENDED {
        return None;
    }
    let mut r = Reader::new(p);
    let ended = Ended {
        rank: r.u32()? as usize,
        pid: r.u32()?,
        how: r.text(MAX_HOW)?.to_string(),
    };
    // Bytes after the reason are not news this format writes: refused, not ignored.
    r.end()?;
    Some(ended)
}

/// Takes this process's end of its line, if the variables name one that its parent, the
/// launcher, made; else `None`, with the reason at debug level.
fn take_line(get: impl Fn(&str) -> Option<String>) -> Option<Line> {
    let (fd, launcher) = (get(FD_VAR)?, get(PID_VAR)?);
    let parse = |v: &str| v.trim().parse::<u32>().ok();
    let (Some(fd), Some(launcher)) = (parse(&fd), parse(&launcher)) else {
        tracing::info!("{FD_VAR}={fd:?} {PID_VAR}={launcher:?} are not numbers: no launcher line (a rank that never joins is found by the rendezvous time limit)");
        return None;
    };
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    if parent != launcher || fd < 3 || fd > i32::MAX as u32 {
        tracing::info!(
            "not the launcher's child (parent {parent}, launcher {launcher}: started through a wrapper?) or fd {fd} is not a line: no launcher line (a rank that never joins is found by the rendezvous time limit)"
        );
        return None;
    }
    let raw = fd as RawFd;
    // SAFETY: the descriptor is only borrowed for the checks below, which fail harmlessly
    // (EBADF) if it is not open.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    let is_socket = rustix::fs::fstat(borrowed)
        .map(|s| rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Socket)
        .unwrap_or(false);
    let made_by_launcher = is_socket
        && p2p_mem::fdpass::peer_cred(borrowed)
            .is_ok_and(|(pid, uid)| pid == launcher && uid == rustix::process::getuid().as_raw());
    if !made_by_launcher {
        tracing::info!(
            "fd {fd} is not a socket the launcher (pid {launcher}) made: no launcher line (a rank that never joins is found by the rendezvous time limit)"
        );
        return None;
    }
    // Processes this rank starts must not inherit it.
    let _ = rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC);
    tracing::debug!("listening to the launcher (pid {launcher}) on fd {fd}");
    // SAFETY: the descriptor is open and is the launcher's line, handed to this process alone;
    // it is taken once (the `OnceLock`) and never closed elsewhere.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Some(Line {
        fd,
        heard: Mutex::new(None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_hears_which_rank_ended_and_how() {
        let mut lines = Lines::new(3).expect("lines");
        // Rank 2's end, read as a rank reads it.
        let mine = lines.theirs[2].take().expect("end");
        lines.tell_ended(1, 4242, "signal: 9 (SIGKILL)");
        let mut buf = [0u8; 1024];
        let (n, _) = net::recv(&mine, &mut buf, RecvFlags::DONTWAIT).expect("a message");
        let ended = decode(&buf[..n]).expect("decoded");
        assert_eq!(
            ended,
            Ended {
                rank: 1,
                pid: 4242,
                how: "signal: 9 (SIGKILL)".into()
            }
        );
        assert!(ended.to_string().contains("rank 1 (pid 4242) ended"));
        // Rank 1 itself is not told about itself.
        let theirs1 = lines.theirs[1].take().expect("end");
        assert!(net::recv(&theirs1, &mut buf, RecvFlags::DONTWAIT).is_err());
    }

    /// Found by the fuzz target `launch_news`: news with bytes after its reason was read as the
    /// news before them.
    #[test]
    fn news_with_bytes_after_its_reason_is_refused() {
        let good = encode(2, 4242, "sig");
        assert!(decode(&good).is_some());
        let (kind, p) = wire::decode_message(&good, 64).expect("a message");
        let longer = wire::encode_message(kind, &[p, b"nal: 9".as_slice()].concat());
        assert_eq!(decode(&longer), None);
    }

    #[test]
    fn a_long_account_in_any_script_is_cut_to_what_a_rank_reads() {
        let mut lines = Lines::new(2).expect("lines");
        let mine = lines.theirs[0].take().expect("end");
        let how = "é".repeat(MAX_HOW);
        lines.tell_ended(1, 1, &how);
        let mut buf = [0u8; 1024];
        let (n, _) = net::recv(&mine, &mut buf, RecvFlags::DONTWAIT).expect("a message");
        let ended = decode(&buf[..n]).expect("decoded");
        assert_eq!(ended.how, "é".repeat(MAX_HOW / 2));
    }

    #[test]
    fn a_line_is_taken_only_from_the_parent_that_made_it() {
        let lines = Lines::new(1).expect("lines");
        let fd = lines.theirs[0]
            .as_ref()
            .expect("end")
            .as_raw_fd()
            .to_string();
        // This test process's parent is not this process: refused, and the fd stays open.
        let me = std::process::id().to_string();
        assert!(take_line(|n| match n {
            FD_VAR => Some(fd.clone()),
            PID_VAR => Some(me.clone()),
            _ => None,
        })
        .is_none());
        // Not numbers, or missing: refused.
        assert!(take_line(|n| (n == FD_VAR).then(|| "x".to_string())).is_none());
        assert!(take_line(|_| None).is_none());
        assert!(lines.theirs[0]
            .as_ref()
            .is_some_and(|f| rustix::io::fcntl_getfd(f).is_ok()));
    }

    #[test]
    fn a_launched_child_takes_its_line_and_hears_of_another_rank() {
        // The child is this test binary again, running only the probe below.
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut lines = Lines::new(2).expect("lines");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            "launch::tests::probe_child_prints_its_news",
            "--nocapture",
            "--include-ignored",
        ])
        .env("P2P_LAUNCH_PROBE", "1")
        .stdout(std::process::Stdio::piped());
        lines.attach(0, &mut cmd).expect("attach");
        // Told before the child reads: the message waits in its line.
        lines.tell_ended(1, 777, "exit status: 3");
        let out = cmd.output().expect("child ran");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("NEWS rank 1 (pid 777) ended (exit status: 3)"),
            "{text}"
        );
    }

    /// Run by the test above in a child process; does nothing on its own.
    #[test]
    #[ignore = "a child process of a_launched_child_takes_its_line_and_hears_of_another_rank"]
    fn probe_child_prints_its_news() {
        if std::env::var_os("P2P_LAUNCH_PROBE").is_none() {
            return;
        }
        match news() {
            Some(e) => println!("NEWS {e}"),
            None => println!("NO NEWS"),
        }
    }
}
