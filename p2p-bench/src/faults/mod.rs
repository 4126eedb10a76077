//! The fault-injection suite (`p2p-bench faults`): process-per-GPU jobs in which one rank dies,
//! stalls or aborts at a random point, or strangers try to join, with the survivors' detection
//! times, hangs, wrong results, foreign joins and leaks measured.
//!
//! The orchestrator starts every rank of a trial as `p2p-bench fault-worker` with the
//! rendezvous environment (a fresh job id and secret per trial) and a plan in `FAULT_*`
//! variables. Workers make the trial's call (drawn per trial by the fault matrix, [`Shape`]:
//! every operation, type, size, algorithm and buffer placement) and check every element; the victim
//! injects its fault and says when (`dying`, a wall-clock time in ns, printed just before).
//! Survivors report when their call failed and with what error, then drop the communicator and
//! report their open fds and free GPU memory against the baseline taken before init. Each
//! worker writes one JSON object per line, prefixed `FAULT `, on stdout.
//!
//! Detection time = the survivor's error time - the victim's fault time (one host, one clock).
//! A trial that is still running 30 s after its start is a hang: its processes are killed.

pub mod shape;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use p2p_collective::Communicator;
use p2p_mem::Stream;
use p2p_transport::rendezvous::{testing, Rendezvous, Secret};
use serde_json::{json, Value};
use statrs::statistics::{Data, OrderStatistics};

pub use shape::{Calls, Shape};

/// What a trial injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No fault: the control trial (also the job the strangers attack).
    None,
    /// The victim is SIGKILLed before it joins the rendezvous.
    KillBeforeInit,
    /// SIGKILL at a random moment while the communicator is being made.
    KillDuringInit,
    /// SIGKILL while a collective runs.
    KillMidCollective,
    /// SIGSEGV while a collective runs.
    SegfaultMidCollective,
    /// SIGKILL between two calls.
    KillBetweenCalls,
    /// `_exit(3)` between two calls: no destructors, no goodbye.
    ExitBetweenCalls,
    /// SIGKILL while the communicator is being dropped.
    KillInDrop,
    /// `abort()` from another thread of the victim while a collective runs.
    AbortFromThread,
    /// SIGSTOP: the victim stops without dying (found by the kernels' time limit).
    Stall,
    /// A job without faults while a stranger process tries to join it, sends junk and forged
    /// handles.
    Strangers,
}

impl Kind {
    /// Every kind the suite runs, in its round-robin order.
    pub const ALL: [Kind; 10] = [
        Kind::KillMidCollective,
        Kind::KillBetweenCalls,
        Kind::KillDuringInit,
        Kind::SegfaultMidCollective,
        Kind::ExitBetweenCalls,
        Kind::AbortFromThread,
        Kind::KillInDrop,
        Kind::Strangers,
        Kind::Stall,
        Kind::KillBeforeInit,
    ];

    /// The kind's name in the results.
    pub fn name(self) -> &'static str {
        match self {
            Kind::None => "none",
            Kind::KillBeforeInit => "kill-before-init",
            Kind::KillDuringInit => "kill-during-init",
            Kind::KillMidCollective => "kill-mid-collective",
            Kind::SegfaultMidCollective => "segfault-mid-collective",
            Kind::KillBetweenCalls => "kill-between-calls",
            Kind::ExitBetweenCalls => "exit-between-calls",
            Kind::KillInDrop => "kill-in-drop",
            Kind::AbortFromThread => "abort-from-thread",
            Kind::Stall => "stall",
            Kind::Strangers => "strangers",
        }
    }

    fn from_name(n: &str) -> Option<Kind> {
        std::iter::once(Kind::None)
            .chain(Kind::ALL)
            .find(|k| k.name() == n)
    }

    /// Whether the victim's process ends (so detection should be quick).
    fn dies(self) -> bool {
        matches!(
            self,
            Kind::KillDuringInit
                | Kind::KillMidCollective
                | Kind::SegfaultMidCollective
                | Kind::KillBetweenCalls
                | Kind::ExitBetweenCalls
                | Kind::KillInDrop
                | Kind::KillBeforeInit
        )
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "FAULT {v}");
    let _ = out.flush();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn die(kind: Kind) {
    emit(json!({"event": "dying", "t": now_ns() as u64}));
    let me = rustix::process::getpid();
    match kind {
        Kind::SegfaultMidCollective => segfault(),
        Kind::ExitBetweenCalls => exit_now(3),
        _ => {
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        }
    }
    // Signals are delivered before kill() returns to the caller; this is never reached.
    std::thread::sleep(Duration::from_secs(60));
}

#[allow(unsafe_code)]
fn segfault() {
    // SAFETY: not safe at all, on purpose: a real invalid write, so the process dies of SIGSEGV
    // as a crashing program does (a signal sent with kill() would be caught and ignored by the
    // Rust runtime's stack-overflow handler).
    unsafe { std::ptr::null_mut::<u64>().write_volatile(1) }
}

#[allow(unsafe_code)]
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process at once, running no destructors or atexit handlers: the
    // point of the fault (a process that vanishes without cleaning up).
    unsafe { libc::_exit(code) }
}

/// The worker: one rank of a trial (`p2p-bench fault-worker`), configured by `FAULT_KIND`,
/// `FAULT_VICTIM`, `FAULT_DELAY_US` and `FAULT_ITERS` beside the rendezvous variables.
pub fn worker() -> i32 {
    let var = |n: &str| std::env::var(n).unwrap_or_default();
    let kind = Kind::from_name(&var("FAULT_KIND")).unwrap_or(Kind::None);
    if kind == Kind::Strangers && var("FAULT_STRANGER") == "1" {
        return stranger();
    }
    let rank: usize = var("RANK").parse().unwrap_or(0);
    let victim = kind != Kind::None
        && kind != Kind::Strangers
        && var("FAULT_VICTIM").parse::<usize>().ok() == Some(rank);
    let delay = Duration::from_micros(var("FAULT_DELAY_US").parse().unwrap_or(0));
    let iters: usize = var("FAULT_ITERS").parse().unwrap_or(6);
    match run_rank(kind, rank, victim, delay, iters) {
        Ok(()) => 0,
        Err(e) => {
            emit(json!({"event": "harness-error", "error": e}));
            1
        }
    }
}

fn run_rank(
    kind: Kind,
    rank: usize,
    victim: bool,
    delay: Duration,
    iters: usize,
) -> Result<(), String> {
    let world: usize = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    let shape = match std::env::var("FAULT_CALL") {
        Ok(words) => Shape::parse(&words)?,
        Err(_) => Shape::classic(),
    };
    let count = p2p_mem::Device::count().map_err(|e| e.to_string())? as usize;
    let device = p2p_mem::Device::new((rank % count.max(1)) as i32).map_err(|e| e.to_string())?;
    let stream = Stream::new(&device).map_err(|e| e.to_string())?;
    // The baseline: after the context and the call's buffers exist, before the communicator.
    let mut bufs = shape.buffers(&device, world, rank)?;
    stream.synchronize().map_err(|e| e.to_string())?;
    let fds0 = open_fds();
    let free0 = device.memory_info().map_err(|e| e.to_string())?.0;
    if victim && kind == Kind::KillBeforeInit {
        die(kind);
    }
    if victim && kind == Kind::KillDuringInit {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            die(kind);
        });
    }
    let t_init = Instant::now();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            emit(
                json!({"event": "error", "phase": "init", "t": now_ns() as u64, "error": e.to_string()}),
            );
            return leak_report(&device, fds0, free0, Vec::new(), world > count);
        }
    };
    emit(json!({"event": "init-done", "ms": t_init.elapsed().as_secs_f64() * 1e3}));
    let call_error = |i: usize, e: &dyn std::fmt::Display| {
        emit(
            json!({"event": "error", "phase": "call", "iter": i, "t": now_ns() as u64, "error": e.to_string()}),
        );
    };
    // A split communicator keeps every rank in its order, so that errors name the same ranks.
    let sub = if shape.split {
        match comm.split(Some(0), rank as i32) {
            Ok(sub) => sub,
            Err(e) => {
                call_error(0, &e);
                emit(
                    json!({"event": "calls-done", "t": now_ns() as u64, "wrong": 0, "failed": true}),
                );
                return leak_report(&device, fds0, free0, vec![comm], world > count);
            }
        }
    } else {
        None
    };
    let (wrong, failed) = {
        let on = sub.as_ref().unwrap_or(&comm);
        make_calls(
            kind,
            rank,
            victim,
            delay,
            iters,
            shape,
            on,
            &stream,
            &mut bufs,
            &call_error,
        )
    };
    emit(json!({"event": "calls-done", "t": now_ns() as u64, "wrong": wrong, "failed": failed}));
    if victim && kind == Kind::KillInDrop {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            die(kind);
        });
    }
    let comms = sub.into_iter().chain(std::iter::once(comm)).collect();
    leak_report(&device, fds0, free0, comms, world > count)
}

/// The trial's calls on `comm`: `iters` rounds of `shape`'s call, each checked, with the
/// victim's fault in the middle round (which, for the faults that land inside a call, queues
/// many calls so that the fault finds one running). Returns the wrong elements seen and
/// whether a call failed (reported through `call_error`).
#[allow(clippy::too_many_arguments)]
fn make_calls(
    kind: Kind,
    rank: usize,
    victim: bool,
    delay: Duration,
    iters: usize,
    shape: Shape,
    comm: &Communicator,
    stream: &Stream,
    bufs: &mut shape::Buffers,
    call_error: &dyn Fn(usize, &dyn std::fmt::Display),
) -> (usize, bool) {
    let mut calls = match Calls::new(shape, comm, stream, bufs) {
        Ok(c) => c,
        Err(e) => {
            call_error(0, &e);
            return (0, true);
        }
    };
    let bytes = shape
        .call
        .count
        .saturating_mul(shape.call.dtype.size())
        .max(1);
    let mut wrong = 0usize;
    for i in 0..iters {
        let fault_here = victim && i == iters / 2;
        if fault_here && matches!(kind, Kind::KillBetweenCalls | Kind::ExitBetweenCalls) {
            std::thread::sleep(delay);
            die(kind);
        }
        if fault_here && kind == Kind::Stall {
            std::thread::sleep(delay);
            emit(json!({"event": "dying", "t": now_ns() as u64}));
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::STOP,
            );
        }
        // Every rank makes the same calls: the fault round is long on all of them (about
        // 1 GiB of calls, 4 to 256 of them), and the victim's fault lands somewhere inside it.
        let heavy = i == iters / 2
            && matches!(
                kind,
                Kind::KillMidCollective | Kind::SegfaultMidCollective | Kind::AbortFromThread
            );
        let times = if heavy {
            ((1 << 30) / bytes).clamp(4, 256)
        } else {
            1
        };
        let result = calls.queue(times);
        if heavy && victim {
            let handle = comm.abort_handle();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if kind == Kind::AbortFromThread {
                    emit(json!({"event": "dying", "t": now_ns() as u64}));
                    handle.abort_because(
                        rank,
                        "the fault suite aborted this rank from another thread",
                    );
                } else {
                    die(kind);
                }
            });
        }
        if let Err(e) = result.and_then(|()| comm.synchronize(stream)) {
            call_error(i, &e);
            return (wrong, true);
        }
        match calls.wrong() {
            Ok(w) => wrong += w,
            Err(e) => {
                call_error(i, &e);
                return (wrong, true);
            }
        }
    }
    (wrong, false)
}

/// Drops the communicators (a split one first) and reports the time, and the fds and GPU memory this process still
/// holds (whether memory comes back once the job's processes have exited is measured outside,
/// by the suite: see [`GpuWatch`]). Where ranks share a GPU (`shared`) the GPU's free memory
/// also moves with the other ranks' processes, so no GPU figure is reported (null).
fn leak_report(
    device: &p2p_mem::Device,
    fds0: usize,
    free0: usize,
    comms: Vec<Communicator>,
    shared: bool,
) -> Result<(), String> {
    let t = Instant::now();
    drop(comms);
    let drop_ms = t.elapsed().as_secs_f64() * 1e3;
    // This rank's workspace is also held by the peers' mappings of it (cuMem) until they drop
    // theirs or their process ends: wait up to 200 ms for the device's free memory to come
    // back, and report what did not (informative: the suite's verdict is measured outside).
    let t = Instant::now();
    let mut free1 = device.memory_info().map_err(|e| e.to_string())?.0;
    // Fds: a stranger's connection is closed by its handshake thread within HANDSHAKE_TIMEOUT
    // (2 s) of its arrival, so they may take up to that.
    loop {
        let mem_wait = free1 < free0 && !shared && t.elapsed() < Duration::from_millis(200);
        let fd_wait = open_fds() > fds0 && t.elapsed() < Duration::from_millis(2500);
        if !mem_wait && !fd_wait {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        free1 = device.memory_info().map_err(|e| e.to_string())?.0;
    }
    emit(json!({
        "event": "after-drop",
        "drop_ms": drop_ms,
        "mem_return_ms": t.elapsed().as_secs_f64() * 1e3,
        "fd_delta": open_fds() as i64 - fds0 as i64,
        "gpu_mem_delta": if shared { Value::Null } else { json!(free0 as i64 - free1 as i64) },
    }));
    Ok(())
}

/// A stranger: knows the job's id (so it finds the socket) but not its secret. For the job's
/// duration it tries to join as rank 1 without a secret and with a wrong one, sends junk and
/// forged messages, holds silent connections, and sends forged workspace handles with an fd to
/// every workspace socket it can find. Reports its attempts and how many were accepted.
fn stranger() -> i32 {
    let Ok(real) = Rendezvous::from_env() else {
        emit(json!({"event": "harness-error", "error": "stranger without a rendezvous"}));
        return 1;
    };
    let wrong = Rendezvous {
        secret: Secret::from_text("not the job's secret at all").ok(),
        ..real.clone()
    };
    let none = Rendezvous {
        secret: None,
        ..real.clone()
    };
    let until = Instant::now() + Duration::from_secs(4);
    let path = real.socket_path();
    let forged_handle = p2p_mem::wire::encode(
        p2p_mem::wire::HandleKind::VmmFd,
        &[0; 16],
        std::process::id(),
        &[0xff; 16],
    );
    // Four threads, each repeating every attack while the job runs; an attempt counts once it
    // reached a listening socket.
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (real, wrong, none, path, forged) = (
                real.clone(),
                wrong.clone(),
                none.clone(),
                path.clone(),
                forged_handle.clone(),
            );
            std::thread::spawn(move || {
                let (mut attempts, mut accepted) = (0u64, 0u64);
                let mut silent = Vec::new();
                let t = Duration::from_millis(20);
                while Instant::now() < until {
                    for key in [&wrong, &none] {
                        match testing::try_join(&real, key, 1 + (w % 2) as u32, t) {
                            Ok(_) => {
                                attempts += 1;
                                accepted += 1;
                            }
                            Err(e)
                                if e.to_string().contains("refused")
                                    || e.to_string().contains("prove") =>
                            {
                                attempts += 1
                            }
                            Err(_) => {}
                        }
                    }
                    if let Ok(l) = testing::connect_raw(&path, t) {
                        attempts += 1;
                        let _ = testing::send_raw(&l, &testing::message(2, &[7; 72]));
                    }
                    if let Ok(l) = testing::connect_raw(&path, t) {
                        attempts += 1;
                        let _ = testing::send_raw(&l, b"junk that is not a message");
                    }
                    if silent.len() < 16 {
                        if let Ok(l) = testing::connect_raw(&path, t) {
                            attempts += 1;
                            silent.push(l);
                        }
                    }
                    // Forged workspace handles, with an fd, to every workspace socket found.
                    if let Ok(null) = std::fs::File::open("/dev/null") {
                        for ws in workspace_sockets() {
                            if let Ok(ch) = p2p_mem::fdpass::FdChannel::connect(&ws) {
                                attempts += 1;
                                let mut msg = 1u32.to_le_bytes().to_vec();
                                msg.extend_from_slice(&forged);
                                use std::os::fd::AsFd;
                                let _ = ch.send_fd(&msg, null.as_fd());
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                (attempts, accepted)
            })
        })
        .collect();
    let (mut attempts, mut accepted) = (0u64, 0u64);
    for w in workers {
        if let Ok((a, b)) = w.join() {
            attempts += a;
            accepted += b;
        }
    }
    emit(json!({"event": "stranger", "attempts": attempts, "accepted": accepted}));
    0
}

/// Every `p2p-coll-*/ws` socket of this user in the temp directories.
fn workspace_sockets() -> Vec<std::path::PathBuf> {
    let mut bases = vec![std::env::temp_dir()];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        bases.push(x.into());
    }
    let mut out = Vec::new();
    for b in bases {
        if let Ok(rd) = std::fs::read_dir(&b) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("p2p-coll-") {
                    out.push(e.path().join("ws"));
                }
            }
        }
    }
    out
}

/// One trial's outcome.
#[derive(Debug, Clone)]
pub struct Trial {
    /// What was injected.
    pub kind: Kind,
    /// The call every rank made.
    pub shape: Shape,
    /// The ranks.
    pub world: usize,
    /// The rank that misbehaved.
    pub victim: usize,
    /// The random delay before the fault, µs.
    pub delay_us: u64,
    /// Per survivor: (rank, detection ms or None, error text, whether it names the victim).
    pub survivors: Vec<(usize, Option<f64>, String, bool)>,
    /// Whether the trial had to be killed at its time limit.
    pub hang: bool,
    /// Wrong elements seen by any rank.
    pub wrong: usize,
    /// Foreign connections accepted (strangers trials).
    pub foreign_accepted: u64,
    /// Injected faults this trial counts: 1 process fault, or the stranger's attempts.
    pub faults: u64,
    /// Survivors' fds not returned after dropping the communicator.
    pub fd_leak: i64,
    /// GPU bytes the survivors' processes still held after dropping the communicator (`None`
    /// where ranks shared a GPU: see `leak_report`). Returned when the process exits.
    pub held_in_process: Option<i64>,
    /// GPU bytes not back on the GPUs once every process of the trial had exited, read by the
    /// suite ([`GpuWatch`]); `None` if not measured.
    pub held_after_exit: Option<i64>,
    /// How long the GPUs' free memory took to come back after the last process exited, ms.
    pub return_ms: f64,
    /// Where the victim was when it died: before init finished or after.
    pub phase: String,
    /// Whether every rank exited.
    pub clean_exit: bool,
    /// The longest time a survivor took to drop its communicator, ms.
    pub drop_ms: f64,
    /// The longest communicator init of any rank, ms.
    pub init_ms: f64,
}

impl Trial {
    /// Whether the trial injected a process fault (a rank killed, crashing, exiting, stalled or
    /// aborted), as opposed to a stranger's attempts or none.
    pub fn process_fault(&self) -> bool {
        !matches!(self.kind, Kind::None | Kind::Strangers)
    }

    /// "ok" if every process exited cleanly within the trial's limit, else "FAILED".
    fn verdict(&self) -> &'static str {
        if self.clean_exit && !self.hang {
            "ok"
        } else {
            "FAILED"
        }
    }
}

/// Whether an error text names rank `r` (as "rank r" or in a list "[.., r, ..]").
fn names_rank(text: &str, r: usize) -> bool {
    text.contains(&format!("rank {r}"))
        || text.contains(&format!("[{r}]"))
        || text.contains(&format!("[{r},"))
        || text.contains(&format!(" {r}]"))
        || text.contains(&format!(" {r},"))
}

/// What a survivor's entry says when it finished its calls before the victim's fault.
const FINISHED_FIRST: &str = "(finished every call before the fault)";

/// Whether a survivor found the fault: its call failed, after the fault (a failure timed
/// before it is not this fault's detection).
fn found(s: &(usize, Option<f64>, String, bool)) -> bool {
    s.1.is_some_and(|ms| ms >= 0.0)
}

/// Whether a survivor had finished every call before the fault: it had nothing to find.
fn finished_first(s: &(usize, Option<f64>, String, bool)) -> bool {
    s.2 == FINISHED_FIRST
}

/// Whether a trial had a fault for its survivors to find: some survivor had not finished
/// before it.
fn has_something_to_find(t: &Trial) -> bool {
    t.survivors.len() == t.world - 1 && !t.survivors.iter().all(finished_first)
}

/// Whether a survivor's error came from the rendezvous time limit (the victim never joined).
fn by_rendezvous_limit(text: &str) -> bool {
    text.contains("did not join") || text.contains("did not answer")
}

/// Whether a survivor learnt of the victim's end from the launcher (the suite) while waiting in
/// the rendezvous.
fn by_launcher(text: &str) -> bool {
    text.contains("as the launcher reports")
}

/// The free memory of every GPU, read by the suite itself, outside the jobs: a baseline before
/// the first job, and again once each job's processes have all exited.
pub struct GpuWatch {
    devices: Vec<p2p_mem::Device>,
    baseline: Vec<usize>,
}

impl GpuWatch {
    /// Reads the baseline of every GPU (this process's own context on each is part of it).
    pub fn new() -> Result<GpuWatch, String> {
        let devices = (0..p2p_mem::Device::count().map_err(|e| e.to_string())?)
            .map(p2p_mem::Device::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let baseline = devices
            .iter()
            .map(|d| d.memory_info().map(|m| m.0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        Ok(GpuWatch { devices, baseline })
    }

    /// GPU bytes below the baseline now, summed over the GPUs.
    pub fn held(&self) -> Option<i64> {
        let mut held = 0i64;
        for (d, base) in self.devices.iter().zip(&self.baseline) {
            let free = d.memory_info().ok()?.0;
            held += (*base as i64 - free as i64).max(0);
        }
        Some(held)
    }

    /// Waits up to `limit` for every GPU to be back at its baseline: the bytes still held then,
    /// and how long it took, ms.
    pub fn settle(&self, limit: Duration) -> (Option<i64>, f64) {
        let t = Instant::now();
        loop {
            let held = self.held();
            if held.is_none_or(|h| h == 0) || t.elapsed() >= limit {
                return (held, t.elapsed().as_secs_f64() * 1e3);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs one trial with `world` ranks from executable `exe` and returns what happened.
#[allow(clippy::too_many_arguments)]
pub fn run_trial(
    exe: &str,
    kind: Kind,
    shape: Shape,
    world: usize,
    victim: usize,
    delay_us: u64,
    seq: usize,
    timeout_ms: u64,
    watch: Option<&GpuWatch>,
) -> Trial {
    let job = format!("faults-{}-{seq}", std::process::id());
    // Trial 0 is the job that compiles the kernels.
    let warm_up = seq == 0;
    let secret = Secret::generate_text().unwrap_or_else(|_| "fallback-secret-0123456789".into());
    // As a launcher does, the suite tells every rank when another's process ends (a victim
    // killed before it joined is then found at once, not at the rendezvous time limit).
    let mut lines = p2p_transport::launch::Lines::new(world).ok();
    let mut spawn = |rank: usize, stranger: bool| -> std::io::Result<Child> {
        let mut cmd = Command::new(exe);
        if !stranger {
            if let Some(l) = lines.as_mut() {
                l.attach(rank, &mut cmd)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
            }
        }
        cmd.arg("fault-worker")
            // The stranger claims a real rank's place.
            .env("RANK", if stranger { 1 } else { rank }.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("P2P_JOB_ID", &job)
            .env(
                "P2P_JOB_SECRET",
                if stranger {
                    "a stranger's guess, wrong"
                } else {
                    &secret
                },
            )
            .env("P2P_TIMEOUT_MS", timeout_ms.to_string())
            .env(
                "P2P_RENDEZVOUS_TIMEOUT_MS",
                if warm_up { "200000" } else { "3000" },
            )
            .env("FAULT_KIND", kind.name())
            .env("FAULT_CALL", shape.to_words())
            .env("P2P_ALGO", shape.algo.map_or("auto", |a| a.name()))
            .env("FAULT_VICTIM", victim.to_string())
            .env("FAULT_DELAY_US", delay_us.to_string())
            .env("FAULT_STRANGER", if stranger { "1" } else { "0" })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
    };
    let start = Instant::now();
    let mut children: Vec<(usize, Child)> = Vec::new();
    for r in 0..world {
        if let Ok(c) = spawn(r, false) {
            children.push((r, c));
        }
    }
    if kind == Kind::Strangers {
        if let Ok(c) = spawn(world, true) {
            children.push((world, c));
        }
    }
    // Each child's lines, read in threads so no pipe fills.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Value)>();
    for (r, c) in children.iter_mut() {
        if let Some(out) = c.stdout.take() {
            let tx = tx.clone();
            let r = *r;
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(j) = line.strip_prefix("FAULT ") {
                        if let Ok(v) = serde_json::from_str::<Value>(j) {
                            let _ = tx.send((r, v));
                        }
                    }
                }
            });
        }
    }
    drop(tx);
    // The first job compiles the kernels (tens of seconds on a fresh machine).
    let limit = Duration::from_secs(if warm_up { 240 } else { 30 });
    let mut hang = false;
    let mut events: Vec<(usize, Value)> = Vec::new();
    let mut told = vec![false; world + 1];
    loop {
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        let mut running = 0;
        for (r, c) in children.iter_mut() {
            let exited = c.try_wait().ok().flatten();
            if let (Some(status), Some(l)) = (exited, lines.as_ref()) {
                if *r < world && !told[*r] {
                    told[*r] = true;
                    l.tell_ended(*r, c.id(), &status.to_string());
                }
            }
            if exited.is_none() {
                // A stopped victim never exits by itself (and its mappings hold the others'
                // memory): once every other rank's calls have ended, end it.
                let others_done = events
                    .iter()
                    .filter(|(q, v)| *q != *r && v["event"] == "calls-done")
                    .count()
                    >= world - 1;
                if kind == Kind::Stall && *r == victim && others_done {
                    let _ = c.kill();
                    continue;
                }
                running += 1;
            }
        }
        if running == 0 {
            break;
        }
        if start.elapsed() > limit {
            hang = true;
            for (_, c) in children.iter_mut() {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut clean_exit = true;
    for (_, c) in children.iter_mut() {
        match c.wait() {
            Ok(s) if s.success() => {}
            _ => clean_exit = false,
        }
    }
    // Every process of the trial has exited: is the GPUs' memory back?
    let (held_after_exit, return_ms) = match watch {
        Some(w) => w.settle(Duration::from_secs(2)),
        None => (None, 0.0),
    };
    // Let the readers drain.
    std::thread::sleep(Duration::from_millis(20));
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let t = Trial {
        kind,
        shape,
        world,
        victim,
        delay_us,
        survivors: Vec::new(),
        hang,
        wrong: 0,
        foreign_accepted: 0,
        faults: 0,
        fd_leak: 0,
        held_in_process: Some(0),
        held_after_exit,
        return_ms,
        phase: String::new(),
        clean_exit,
        drop_ms: 0.0,
        init_ms: 0.0,
    };
    from_events(t, &events)
}

/// `t` (the trial's shape and what the suite measured) completed from what its processes
/// reported: each rank's events, by rank (the stranger's as rank `world`).
fn from_events(mut t: Trial, events: &[(usize, Value)]) -> Trial {
    let (kind, world, victim) = (t.kind, t.world, t.victim);
    let of = |r: usize, name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|(q, v)| *q == r && v["event"] == name)
            .map(|(_, v)| v)
            .collect()
    };
    let died_at = of(victim, "dying").first().and_then(|v| v["t"].as_u64());
    // A victim that had finished its own calls before its fault (a kill timed for init that
    // landed after the calls, a kill in the drop): the survivors' calls needed nothing more of
    // it, so a survivor that finished them had nothing to find.
    let victim_done_first = of(victim, "calls-done")
        .first()
        .and_then(|v| v["t"].as_u64())
        .zip(died_at)
        .is_some_and(|(done, died)| done < died);
    t.phase = if of(victim, "init-done").is_empty() {
        "before init returned"
    } else if victim_done_first {
        "after its calls"
    } else {
        "after init"
    }
    .to_string();
    // A process fault counts once the victim said it was injecting it.
    t.faults = u64::from(died_at.is_some());
    for r in 0..world {
        for v in of(r, "init-done") {
            t.init_ms = t.init_ms.max(v["ms"].as_f64().unwrap_or(0.0));
        }
        t.wrong += of(r, "calls-done")
            .iter()
            .filter_map(|v| v["wrong"].as_u64())
            .sum::<u64>() as usize;
        if r == victim && kind != Kind::None && kind != Kind::Strangers {
            continue;
        }
        for v in of(r, "after-drop") {
            t.drop_ms = t.drop_ms.max(v["drop_ms"].as_f64().unwrap_or(0.0));
            t.fd_leak += v["fd_delta"].as_i64().unwrap_or(0).max(0);
            t.held_in_process = match (t.held_in_process, v["gpu_mem_delta"].as_i64()) {
                (Some(sum), Some(d)) => Some(sum + d.max(0)),
                _ => None,
            };
        }
        if let Some(e) = of(r, "error").first() {
            let text = e["error"].as_str().unwrap_or("").to_string();
            let ms = match (e["t"].as_u64(), died_at) {
                (Some(te), Some(td)) => Some((te as f64 - td as f64) / 1e6),
                _ => None,
            };
            let names = names_rank(&text, victim);
            t.survivors.push((r, ms, text, names));
        } else if let Some(done) = of(r, "calls-done").first() {
            // A survivor that finished every call before the victim's fault had nothing left
            // to find.
            let before = victim_done_first
                || matches!((done["t"].as_u64(), died_at), (Some(d), Some(f)) if d < f);
            let what = if before { FINISHED_FIRST } else { "" };
            t.survivors.push((r, None, what.to_string(), false));
        }
    }
    if kind == Kind::Strangers {
        for v in of(world, "stranger") {
            t.foreign_accepted += v["accepted"].as_u64().unwrap_or(0);
            t.faults = v["attempts"].as_u64().unwrap_or(0);
        }
    }
    t
}

/// The `q`-th quantile of `v` (statrs's estimator, the median-unbiased R-8), or `None` for no
/// samples.
fn percentile(v: &[f64], q: f64) -> Option<f64> {
    (!v.is_empty()).then(|| Data::new(v.to_vec()).quantile(q))
}

/// How a suite is run.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Ranks per job.
    pub world: usize,
    /// Stop once this many process faults and this many stranger attempts were injected.
    pub faults: u64,
    /// ... and at least this many trials had a stranger at the job's door.
    pub stranger_trials: usize,
    /// At most this many trials.
    pub trials: usize,
    /// Stop starting trials after this long.
    pub budget: Duration,
    /// The collectives' time limit in the jobs (`P2P_TIMEOUT_MS`).
    pub timeout_ms: u64,
    /// Each trial's call drawn by the fault matrix ([`Shape::draw`]) up to this many bytes;
    /// `None`: every trial makes [`Shape::classic`]'s.
    pub matrix: Option<u64>,
}

/// Runs the suite: trials of every kind round robin until `faults` process faults and stranger
/// attempts were injected, `trials` ran or `budget` passed; returns the results as JSON and
/// Markdown. GPU memory and this process's fds are read before the first job and after every
/// job's processes have exited.
pub fn run_suite(exe: &str, o: &SuiteOptions) -> (Value, String) {
    let start = Instant::now();
    let world = o.world;
    let mut seed = (now_ns() as u64) | 1;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let watch = match GpuWatch::new() {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("GPU memory will not be measured outside the jobs: {e}");
            None
        }
    };
    let fds0 = open_fds();
    // The first job loads the kernels (and compiles them where none are shipped for this GPU);
    // the second measures how long making a communicator takes (the window kill-during-init
    // aims at).
    let compile = run_trial(
        exe,
        Kind::None,
        Shape::classic(),
        world,
        0,
        0,
        0,
        o.timeout_ms,
        watch.as_ref(),
    );
    eprintln!(
        "first job: {} ({:.1} s)",
        compile.verdict(),
        start.elapsed().as_secs_f64()
    );
    let warm = run_trial(
        exe,
        Kind::None,
        Shape::classic(),
        world,
        0,
        0,
        usize::MAX,
        o.timeout_ms,
        watch.as_ref(),
    );
    let init_us = (warm.init_ms * 1e3) as u64;
    eprintln!(
        "warm-up: {}; communicator init took {:.1} ms ({:.1} s)",
        warm.verdict(),
        warm.init_ms,
        start.elapsed().as_secs_f64()
    );
    let mut all: Vec<Trial> = Vec::new();
    let (mut process_faults, mut attempts, mut stranger_trials) = (0u64, 0u64, 0usize);
    let mut i = 0;
    while i < o.trials
        && start.elapsed() < o.budget
        && (process_faults < o.faults || attempts < o.faults || stranger_trials < o.stranger_trials)
    {
        let mut kind = Kind::ALL[i % Kind::ALL.len()];
        let strangers_done = attempts >= o.faults && stranger_trials >= o.stranger_trials;
        // Once enough strangers came, their turns go to process faults, and once enough
        // process faults were injected, theirs go to strangers.
        if kind == Kind::Strangers && strangers_done {
            kind = Kind::KillMidCollective;
        } else if kind != Kind::Strangers && process_faults >= o.faults && !strangers_done {
            kind = Kind::Strangers;
        }
        let victim = (rand() % world as u64) as usize;
        let delay_us = match kind {
            // Somewhere inside the communicator's init, as long as the warm-up's took.
            Kind::KillDuringInit => rand() % init_us.max(1),
            Kind::KillMidCollective | Kind::SegfaultMidCollective | Kind::AbortFromThread => {
                rand() % 3_000
            }
            Kind::KillInDrop => rand() % 2_000,
            _ => rand() % 50_000,
        };
        let shape = match o.matrix {
            Some(max_bytes) => Shape::draw(&mut rand, world, max_bytes),
            None => Shape::classic(),
        };
        let t = run_trial(
            exe,
            kind,
            shape,
            world,
            victim,
            delay_us,
            i + 1,
            o.timeout_ms,
            watch.as_ref(),
        );
        if t.hang {
            eprintln!("HANG: {t:?}");
        }
        i += 1;
        if t.process_fault() {
            process_faults += t.faults;
        } else {
            attempts += t.faults;
            stranger_trials += usize::from(kind == Kind::Strangers);
        }
        eprintln!(
            "[{i:>3}] {:<24} victim {} delay {:>6} us, {}: {}{}{}{}({:.0} s; {process_faults} process faults, {attempts} stranger attempts)",
            kind.name(),
            t.victim,
            t.delay_us,
            t.shape.to_words(),
            t.survivors
                .iter()
                .map(|s| format!(
                    "rank {} {}{} ",
                    s.0,
                    match s.1 {
                        Some(m) => format!("{m:.1} ms"),
                        None if found(s) => "done first".into(),
                        None => "-".into(),
                    },
                    if s.3 { "" } else { " (victim not named)" }
                ))
                .collect::<String>(),
            if t.hang { "HANG " } else { "" },
            if t.wrong > 0 { "WRONG " } else { "" },
            match t.held_after_exit {
                Some(h) if h > 0 => format!("HELD {h} B after exit "),
                _ => String::new(),
            },
            start.elapsed().as_secs_f64()
        );
        all.push(t);
    }
    // After the suite, measured outside the jobs: the GPUs' free memory and this process's fds.
    let (held_end, _) = watch
        .as_ref()
        .map_or((None, 0.0), |w| w.settle(Duration::from_secs(5)));
    let outside = Outside {
        gpu_bytes_held: held_end,
        fds_held: open_fds() as i64 - fds0 as i64,
    };
    let (mut json, mut md) = summarize(
        world,
        &all,
        warm.verdict() == "ok",
        o.timeout_ms,
        &outside,
        start.elapsed(),
    );
    json["targets"] = json!({
        "process_faults": o.faults, "stranger_attempts": o.faults,
        "stranger_trials": o.stranger_trials,
    });
    let short = short_of_targets(&json);
    if !short.is_empty() {
        md.push_str(&format!(
            "\nThe run ended (its budget or trial limit) before its targets: {}.\n",
            short.join("; ")
        ));
    }
    (json, md)
}

/// Which of the suite's targets (`json["targets"]`, set by [`run_suite`]) its results fall short
/// of, each in words; empty: all reached.
pub fn short_of_targets(json: &Value) -> Vec<String> {
    let mut short = Vec::new();
    for (key, what) in [
        ("process_faults", "process faults"),
        ("stranger_attempts", "stranger attempts"),
        ("stranger_trials", "trials with a stranger"),
    ] {
        let (got, want) = (
            json[key].as_u64().unwrap_or(0),
            json["targets"][key].as_u64(),
        );
        if let Some(want) = want.filter(|&w| got < w) {
            short.push(format!("{got} of {want} {what}"));
        }
    }
    short
}

/// What the suite measured itself after its last job.
#[derive(Debug, Clone, Copy)]
pub struct Outside {
    /// GPU bytes below the baseline taken before the first job (`None`: not measured).
    pub gpu_bytes_held: Option<i64>,
    /// This process's fds beyond those before the first job.
    pub fds_held: i64,
}

fn summarize(
    world: usize,
    all: &[Trial],
    warm_ok: bool,
    timeout_ms: u64,
    outside: &Outside,
    took: Duration,
) -> (Value, String) {
    let mut rows = Vec::new();
    let mut md = String::new();
    md.push_str(&format!(
        "# Fault injection, {world} ranks\n\nP2P_TIMEOUT_MS={timeout_ms}, P2P_RENDEZVOUS_TIMEOUT_MS=3000; the suite tells the ranks when one's process ends, as `p2p-bench launch` does; warm-up job {}; {:.0} s.\n\n",
        if warm_ok { "ok" } else { "FAILED" },
        took.as_secs_f64()
    ));
    md.push_str("| fault | trials | faults | detected by every survivor (of trials with a survivor still calling) | names the rank | detection median / p99 / max (ms) | by the launcher / by the rendezvous time limit | survivors' drop, max (ms) | hangs | wrong | foreign joins | fds leaked | GPU bytes held after exit | held in process after drop |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut totals = Totals::default();
    let mut dead_ms = Vec::new();
    for k in Kind::ALL {
        let ts: Vec<&Trial> = all.iter().filter(|t| t.kind == k).collect();
        if ts.is_empty() {
            continue;
        }
        let faults: u64 = ts.iter().map(|t| t.faults).sum();
        let ms: Vec<f64> = ts
            .iter()
            .flat_map(|t| t.survivors.iter().filter_map(|s| s.1))
            .collect();
        let survivors = || ts.iter().flat_map(|t| t.survivors.iter());
        let by_limit = survivors().filter(|s| by_rendezvous_limit(&s.2)).count();
        let by_launch = survivors().filter(|s| by_launcher(&s.2)).count();
        let drop_max = ts.iter().map(|t| t.drop_ms).fold(0.0, f64::max);
        // Of the trials with something to find (a survivor still calling at the fault): those
        // where every survivor that was found it, and named the victim.
        let to_find: Vec<&&Trial> = ts.iter().filter(|t| has_something_to_find(t)).collect();
        let detected = to_find
            .iter()
            .filter(|t| t.survivors.iter().all(|s| finished_first(s) || found(s)))
            .count();
        let named = to_find
            .iter()
            .filter(|t| t.survivors.iter().all(|s| finished_first(s) || s.3))
            .count();
        let hangs = ts.iter().filter(|t| t.hang).count();
        let wrong: usize = ts.iter().map(|t| t.wrong).sum();
        let foreign: u64 = ts.iter().map(|t| t.foreign_accepted).sum();
        let fds: i64 = ts.iter().map(|t| t.fd_leak).sum();
        let after_exit: Option<i64> = ts.iter().map(|t| t.held_after_exit).sum();
        let in_process: Option<i64> = ts.iter().map(|t| t.held_in_process).max().flatten();
        if k.dies() {
            // After it joined: a victim found by the rendezvous time limit or the launcher
            // (it died before it joined) is counted apart.
            dead_ms.extend(
                survivors()
                    .filter(|s| !by_rendezvous_limit(&s.2) && !by_launcher(&s.2))
                    .filter_map(|s| s.1),
            );
        }
        let (p50, p99, max) = (
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            percentile(&ms, 1.0),
        );
        let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
        let expects_detection = k.dies() || matches!(k, Kind::Stall | Kind::AbortFromThread);
        // Where nothing dies (strangers at the door, no fault), any error of a rank is a fault
        // of ours: a stranger that disrupts the job is a denial of service.
        let disrupted = if expects_detection {
            0
        } else {
            ts.iter()
                .filter(|t| {
                    t.survivors
                        .iter()
                        .any(|s| !s.2.is_empty() && !finished_first(s))
                })
                .count()
        };
        totals.disrupted += disrupted;
        let of = |n: usize| {
            if expects_detection {
                format!("{n}/{}", to_find.len())
            } else {
                "n/a".into()
            }
        };
        if expects_detection {
            totals.undetected += to_find.len() - detected.min(to_find.len());
        }
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} / {} | {by_launch} / {by_limit} | {:.0} | {} | {} | {} | {} | {} | {} |\n",
            k.name(),
            ts.len(),
            faults,
            of(detected),
            of(named),
            f(p50),
            f(p99),
            f(max),
            drop_max,
            hangs,
            wrong,
            foreign,
            fds,
            after_exit.map_or("not measured".into(), |m| m.to_string()),
            in_process.map_or("-".into(), |m| format!("{} MiB max", m >> 20)),
        ));
        if k == Kind::Strangers {
            totals.attempts += faults;
        } else {
            totals.process_faults += faults;
        }
        totals.hangs += hangs;
        totals.wrong += wrong;
        totals.foreign += foreign;
        totals.fds += fds;
        totals.after_exit = totals.after_exit.zip(after_exit).map(|(a, b)| a + b);
        rows.push(json!({
            "fault": k.name(), "trials": ts.len(), "faults": faults,
            "with_something_to_find": to_find.len(),
            "detected_by_every_survivor": detected, "names_the_rank": named,
            "detection_ms": {"median": p50, "p99": p99, "max": max},
            "by_launcher": by_launch, "by_rendezvous_time_limit": by_limit,
            "survivor_drop_ms_max": drop_max,
            "hangs": hangs, "wrong": wrong, "foreign_joins": foreign,
            "fds_leaked": fds, "gpu_bytes_held_after_exit": after_exit,
            "gpu_bytes_held_in_process_max": in_process,
            "trials_detail": ts.iter().map(|t| json!({
                "victim": t.victim, "delay_us": t.delay_us, "call": t.shape.to_words(),
                "hang": t.hang, "phase": t.phase,
                "clean_exit": t.clean_exit, "drop_ms": t.drop_ms,
                "held_after_exit": t.held_after_exit, "return_ms": t.return_ms,
                "held_in_process": t.held_in_process,
                "survivors": t.survivors.iter().map(|s| json!({"rank": s.0, "detection_ms": s.1, "error": s.2, "names_victim": s.3})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
    }
    let (p99, max) = (percentile(&dead_ms, 0.99), percentile(&dead_ms, 1.0));
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    md.push_str(&format!(
        "\nTotal: {} trials ({} with a stranger at the door), {} process faults and {} stranger attempts; {} faults not found by every survivor still calling; {} trials without a death where a rank failed anyway; dead peer (process ended after it joined) found at p99 {} ms, max {} ms; {} hangs, {} wrong elements, {} foreign joins, {} fds leaked in the ranks.\n",
        all.len(),
        all.iter().filter(|t| t.kind == Kind::Strangers).count(),
        totals.process_faults,
        totals.attempts,
        totals.undetected,
        totals.disrupted,
        f(p99),
        f(max),
        totals.hangs,
        totals.wrong,
        totals.foreign,
        totals.fds,
    ));
    let not_back = all
        .iter()
        .filter(|t| t.held_after_exit.is_some_and(|h| h > 0))
        .count();
    md.push_str(&format!(
        "\nMeasured by the suite outside the jobs: GPU memory after each trial's processes exited: {}; after the last: {}; this process's fds {} the first job.\n",
        match totals.after_exit {
            Some(0) => "back to the baseline every time".to_string(),
            Some(b) => format!("NOT back to the baseline after {not_back} trials ({b} bytes held, summed)"),
            None => "not measured after every trial".to_string(),
        },
        match outside.gpu_bytes_held {
            Some(0) => "back to the baseline".to_string(),
            Some(b) => format!("{b} bytes below the baseline"),
            None => "not measured".to_string(),
        },
        match outside.fds_held {
            0 => "as before".to_string(),
            n => format!("{n:+} against"),
        },
    ));
    let shapes: Vec<Shape> = all.iter().map(|t| t.shape).collect();
    let (matrix, matrix_md) = shape::tally(&shapes);
    md.push_str(&matrix_md);
    let summary = json!({
        "world": world, "trials": all.len(), "matrix": matrix,
        "process_faults": totals.process_faults, "stranger_attempts": totals.attempts,
        "dead_peer_detection_ms": {"p99": p99, "max": max},
        "undetected": totals.undetected, "disrupted": totals.disrupted,
        "stranger_trials": all.iter().filter(|t| t.kind == Kind::Strangers).count(),
        "hangs": totals.hangs, "wrong": totals.wrong, "foreign_joins": totals.foreign,
        "fds_leaked": totals.fds,
        "gpu_bytes_held_after_exit": totals.after_exit,
        "outside_after_suite": {"gpu_bytes_held": outside.gpu_bytes_held, "fds_held": outside.fds_held},
        "timeout_ms": timeout_ms, "warm_up_ok": warm_ok, "seconds": took.as_secs_f64(),
        "rows": rows,
    });
    (summary, md)
}

/// What in a suite's results (`summarize`'s JSON) fails it, each in words; empty: it passed.
/// Whatever was not measured fails too.
pub fn verdict(json: &Value) -> Vec<String> {
    let count = |k: &str| json[k].as_i64().unwrap_or(1);
    let mut failed = Vec::new();
    for (key, what) in [
        ("hangs", "hangs"),
        ("wrong", "wrong elements"),
        ("foreign_joins", "foreign joins"),
        ("undetected", "faults not found by every survivor"),
        ("disrupted", "trials without a death where a rank failed"),
        ("fds_leaked", "fds left open in the ranks after their drop"),
        (
            "gpu_bytes_held_after_exit",
            "GPU bytes not back after a trial's processes exited",
        ),
    ] {
        let n = count(key);
        if n != 0 {
            failed.push(format!("{n} {what}"));
        }
    }
    let outside = &json["outside_after_suite"];
    let held = outside["gpu_bytes_held"].as_i64().unwrap_or(1);
    if held != 0 {
        failed.push(format!(
            "{held} GPU bytes below the baseline after the suite"
        ));
    }
    let fds = outside["fds_held"].as_i64().unwrap_or(1);
    if fds != 0 {
        failed.push(format!(
            "the suite's own fds {fds:+} against before the first job"
        ));
    }
    if json["warm_up_ok"].as_bool() != Some(true) {
        failed.push("the warm-up job failed".into());
    }
    failed
}

/// The suite's totals over every kind.
#[derive(Debug)]
struct Totals {
    process_faults: u64,
    undetected: usize,
    disrupted: usize,
    attempts: u64,
    hangs: usize,
    wrong: usize,
    foreign: u64,
    fds: i64,
    after_exit: Option<i64>,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            process_faults: 0,
            undetected: 0,
            disrupted: 0,
            attempts: 0,
            hangs: 0,
            wrong: 0,
            foreign: 0,
            fds: 0,
            after_exit: Some(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(kind: Kind, held_after_exit: Option<i64>, faults: u64) -> Trial {
        Trial {
            kind,
            shape: Shape::classic(),
            world: 2,
            victim: 1,
            delay_us: 0,
            survivors: vec![(0, Some(1.0), "rank 1 failed".into(), true)],
            hang: false,
            wrong: 0,
            foreign_accepted: 0,
            faults,
            fd_leak: 0,
            held_in_process: Some(8 << 20),
            held_after_exit,
            return_ms: 0.0,
            phase: "after init".into(),
            clean_exit: true,
            drop_ms: 1.0,
            init_ms: 1.0,
        }
    }

    const CLEAN: Outside = Outside {
        gpu_bytes_held: Some(0),
        fds_held: 0,
    };

    #[test]
    fn percentiles_of_detection_times() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 0.5), Some(2.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 1.0), Some(3.0));
        let ms: Vec<f64> = (1..=100).map(f64::from).collect();
        let p99 = percentile(&ms, 0.99).expect("samples");
        assert!((99.0..=100.0).contains(&p99), "{p99}");
    }

    #[test]
    fn memory_held_after_exit_adds_up_and_an_unmeasured_trial_is_reported_as_such() {
        let measured = [
            trial(Kind::KillBetweenCalls, Some(4096), 1),
            trial(Kind::KillBetweenCalls, Some(0), 1),
        ];
        let (json, md) = summarize(2, &measured, true, 2000, &CLEAN, Duration::ZERO);
        assert_eq!(json["gpu_bytes_held_after_exit"], 4096);
        assert!(
            md.contains("NOT back to the baseline after 1 trials (4096 bytes held"),
            "{md}"
        );
        assert!(md.contains("| 8 MiB max |"), "{md}");
        let mixed = [
            trial(Kind::KillBetweenCalls, Some(4096), 1),
            trial(Kind::KillBetweenCalls, None, 1),
        ];
        let (json, md) = summarize(2, &mixed, true, 2000, &CLEAN, Duration::ZERO);
        assert!(json["gpu_bytes_held_after_exit"].is_null(), "{json}");
        assert!(md.contains("| not measured |"), "{md}");
        assert!(
            md.contains("exited: not measured after every trial"),
            "{md}"
        );
    }

    #[test]
    fn a_survivor_that_finished_before_the_fault_counts_as_found_and_a_silent_one_does_not() {
        // Finished first: nothing to find, in neither count. Silent, or failed before the
        // fault: not found.
        let mut first = trial(Kind::KillDuringInit, Some(0), 1);
        first.survivors = vec![(0, None, FINISHED_FIRST.into(), false)];
        let mut silent = trial(Kind::KillDuringInit, Some(0), 1);
        silent.survivors = vec![(0, None, String::new(), false)];
        let mut early = trial(Kind::KillDuringInit, Some(0), 1);
        early.survivors[0].1 = Some(-3.0);
        let found = trial(Kind::KillDuringInit, Some(0), 1);
        let (json, md) = summarize(
            2,
            &[first, silent, early, found],
            true,
            2000,
            &CLEAN,
            Duration::ZERO,
        );
        let row = &json["rows"][0];
        assert_eq!(row["with_something_to_find"], 3, "{json}");
        assert_eq!(row["detected_by_every_survivor"], 1, "{json}");
        assert_eq!(json["undetected"], 2, "{json}");
        assert!(md.contains("| 1/3 |"), "{md}");
    }

    #[test]
    fn process_faults_and_stranger_attempts_are_counted_apart() {
        let ts = [
            trial(Kind::KillMidCollective, Some(0), 1),
            trial(Kind::Stall, Some(0), 1),
            trial(Kind::Strangers, Some(0), 150),
        ];
        let held = Outside {
            gpu_bytes_held: Some(0),
            fds_held: 2,
        };
        let (json, md) = summarize(2, &ts, true, 2000, &held, Duration::ZERO);
        assert_eq!(json["process_faults"], 2);
        assert_eq!(json["stranger_attempts"], 150);
        assert!(
            md.contains("2 process faults and 150 stranger attempts"),
            "{md}"
        );
        assert!(md.contains("back to the baseline every time"), "{md}");
        assert!(md.contains("fds +2 against the first job"), "{md}");
        // Launcher-told and time-limit detections are not dead-peer detections.
        let mut before = trial(Kind::KillBeforeInit, Some(0), 1);
        before.survivors[0].2 =
            "rank 1 (pid 7) ended (signal: 9), as the launcher reports, before every rank joined"
                .into();
        before.survivors[0].1 = Some(900.0);
        let (json, _) = summarize(2, &[before], true, 2000, &CLEAN, Duration::ZERO);
        assert!(json["dead_peer_detection_ms"]["p99"].is_null(), "{json}");
        assert_eq!(json["rows"][0]["by_launcher"], 1);
    }

    fn event(name: &str, t: u64) -> Value {
        json!({"event": name, "t": t, "wrong": 0, "ms": 1.0})
    }

    /// A kill timed for init that landed after the victim's calls: the survivor that finished
    /// its calls after the death had nothing to find (the victim's part was in), and the trial
    /// is not counted undetected; one whose victim died mid-calls is.
    #[test]
    fn a_survivor_of_a_victim_that_had_finished_its_calls_had_nothing_to_find() {
        let base = || {
            let mut t = trial(Kind::KillDuringInit, Some(0), 0);
            t.survivors.clear();
            t
        };
        let late = [
            (1, event("init-done", 10)),
            (1, event("calls-done", 20)),
            (1, event("dying", 30)),
            (0, event("init-done", 10)),
            (0, event("calls-done", 35)),
        ];
        let t = from_events(base(), &late);
        assert_eq!((t.faults, t.phase.as_str()), (1, "after its calls"));
        assert!(finished_first(&t.survivors[0]), "{:?}", t.survivors);
        let mid = [
            (1, event("init-done", 10)),
            (1, event("dying", 30)),
            (0, event("init-done", 10)),
            (0, event("calls-done", 35)),
        ];
        let u = from_events(base(), &mid);
        assert_eq!(u.phase, "after init");
        let (json, _) = summarize(2, &[t, u], true, 2000, &CLEAN, Duration::ZERO);
        assert_eq!(json["undetected"], 1, "{json}");
    }

    #[test]
    fn a_run_short_of_its_targets_says_by_how_much() {
        let mut json =
            json!({"process_faults": 40, "stranger_attempts": 6693, "stranger_trials": 37});
        json["targets"] =
            json!({"process_faults": 40, "stranger_attempts": 40, "stranger_trials": 50});
        assert_eq!(short_of_targets(&json), ["37 of 50 trials with a stranger"]);
        json["stranger_trials"] = json!(50);
        assert!(short_of_targets(&json).is_empty());
    }

    /// The verdict fails on everything the suite measured wrong, each named: a stranger trial
    /// in which a rank failed, a kill in the drop that a survivor still calling missed, fds the
    /// suite itself kept; a clean run passes.
    #[test]
    fn the_verdict_names_every_failure_and_passes_a_clean_run() {
        let clean = [
            trial(Kind::KillMidCollective, Some(0), 1),
            trial(Kind::Strangers, Some(0), 40),
        ];
        let mut clean = clean.to_vec();
        clean[1].survivors = vec![
            (0, None, String::new(), false),
            (1, None, String::new(), false),
        ];
        let (json, _) = summarize(2, &clean, true, 2000, &CLEAN, Duration::ZERO);
        assert!(verdict(&json).is_empty(), "{:?} {json}", verdict(&json));
        let mut dos = trial(Kind::Strangers, Some(0), 40);
        dos.survivors = vec![(0, None, "rank 0: the handshake queue is full".into(), false)];
        let mut drop_miss = trial(Kind::KillInDrop, Some(0), 1);
        drop_miss.survivors = vec![(0, None, String::new(), false)];
        let fds = Outside {
            gpu_bytes_held: Some(0),
            fds_held: 3,
        };
        let (json, md) = summarize(2, &[dos, drop_miss], true, 2000, &fds, Duration::ZERO);
        let failed = verdict(&json).join("; ");
        assert!(
            failed.contains("1 trials without a death where a rank failed"),
            "{failed}"
        );
        assert!(
            failed.contains("1 faults not found by every survivor"),
            "{failed}"
        );
        assert!(failed.contains("the suite's own fds +3"), "{failed}");
        assert!(md.contains("(1 with a stranger at the door)"), "{md}");
        assert!(
            md.contains("1 trials without a death where a rank failed anyway"),
            "{md}"
        );
    }
}
