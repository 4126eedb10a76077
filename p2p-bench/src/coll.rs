//! `p2p-bench coll`: every collective from 8 B to 1 GiB, ours beside NCCL's best, nccl-tests style.
//!
//! Ours and NCCL run in this process on the same GPUs and streams, timed the same way: CUDA
//! events on every rank's stream around `iters` back-to-back calls, the slowest rank's time,
//! median of `samples`. Eager (one launch per call from the host) and, up to
//! `graph_max_bytes`, CUDA graph (the same calls captured once, replayed). NCCL runs in each of
//! its modes ([`NcclMode`]: plain, symmetric windows, copy engine) with its own communicators
//! and, for the window modes, its own registered buffers; every row names the fastest NCCL mode
//! at that size and our time over it. Before timing, each implementation runs each call once on
//! exact inputs and every output element is checked (`#wrong`, as nccl-tests does; NCCL up to
//! `nccl_check_max_bytes`).

use p2p_collective::Collectives;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use p2p_collective::verify::{
    class, compare, expected, in_place_input_offset, input, result_region, Class,
};
use p2p_collective::{
    Access, Call, Communicator, DataType, Op, Options as CommOptions, Registration,
};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceMemoryMut};
use serde_json::{json, Value};

use crate::gate::Gate;
use crate::nccl::{Borrowed, Bufs, NcclGroup, NcclMode, P2P_SET};
use crate::p2p::{size_name, Stat};
use crate::progress::Progress;
use crate::timing;
use crate::watchdog::{OnFire, Watchdog};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Collectives to run.
    pub ops: Vec<Op>,
    /// Smallest size, bytes.
    pub min_bytes: usize,
    /// Largest size, bytes.
    pub max_bytes: usize,
    /// Samples per figure (median reported).
    pub samples: usize,
    /// Largest size also timed as a CUDA graph.
    pub graph_max_bytes: usize,
    /// How many GPUs (0: all).
    pub gpus: usize,
    /// Instead this many ranks on GPU 0 (0: one rank per GPU). Measures the kernels' own costs
    /// on a machine with one GPU, not the links; NCCL cannot run that way.
    pub share_gpu: usize,
    /// Also run NCCL.
    pub nccl: bool,
    /// Types for all-reduce (the other collectives run float).
    pub all_reduce_types: Vec<DataType>,
    /// Planner knobs for our communicators (`None`: the defaults), for tuning experiments.
    pub tuning: Option<p2p_collective::plan::Tuning>,
    /// Check every result before timing it (the `#wrong` columns).
    pub check: bool,
    /// NCCL's modes to run (each also needs NCCL 2.28 for its set-up).
    pub nccl_modes: Vec<NcclMode>,
    /// Largest size at which NCCL's results are checked too (ours are checked at every size).
    pub nccl_check_max_bytes: usize,
    /// Each size is this many times the one before (2 as nccl-tests' `-f 2`).
    pub factor: usize,
    /// Also run ours on buffers registered on every rank (`Communicator::register_all`), the
    /// counterpart of NCCL's symmetric windows.
    pub registered: bool,
    /// The longest one step may take (one implementation at one size and placement: its check,
    /// eager and graph timing). A step past it is aborted, reported at once, and its
    /// implementation skipped from there on.
    pub deadline: Duration,
    /// Rewritten after every row with everything measured so far (the final JSON's form,
    /// `"complete": false`), so a run that is killed keeps its rows.
    pub partial: Option<PathBuf>,
    /// Also time every graph without the gate (`graph_ungated`: each sample then holds the
    /// host's cost of launching every rank's graph), to show what the gate takes out.
    pub graph_ungated: bool,
    /// Run NCCL's all-to-all on the same buffers as its other collectives (as the benchmark
    /// once did; docs/performance.md, "How we measure"): reproduces NVIDIA/nccl issue 1859 (a
    /// ring collective after sends and receives on one registered buffer waits forever) where
    /// the NCCL has it.
    pub nccl_shared_p2p_buffers: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ops: Op::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 1 << 30,
            samples: 20,
            graph_max_bytes: 64 << 20,
            gpus: 0,
            share_gpu: 0,
            nccl: true,
            all_reduce_types: vec![DataType::F32, DataType::BF16],
            tuning: None,
            check: true,
            nccl_modes: NcclMode::ALL.to_vec(),
            nccl_check_max_bytes: 64 << 20,
            factor: 2,
            registered: true,
            deadline: Duration::from_secs(60),
            partial: None,
            graph_ungated: false,
            nccl_shared_p2p_buffers: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Imp {
    Ours,
    /// Ours on buffers registered on every rank: the direct kernels.
    OursRegistered,
    Nccl(NcclMode),
    /// An empty kernel per rank, launched as ours are: the floor under any one-kernel collective.
    Floor,
}

impl Imp {
    /// How the progress lines and errors name it.
    fn name(self) -> String {
        match self {
            Imp::Ours => "ours".into(),
            Imp::OursRegistered => "ours (registered)".into(),
            Imp::Nccl(m) => format!("NCCL {}", m.name()),
            Imp::Floor => "the empty kernel".into(),
        }
    }

    /// Its key in `host_us_per_call`.
    fn key(self) -> &'static str {
        match self {
            Imp::Nccl(m) => m.name(),
            _ => "ours",
        }
    }

    /// Whether `other` runs on the same communicators (an abort of one stops both).
    fn same_comms(self, other: Imp) -> bool {
        match (self, other) {
            (Imp::Nccl(a), Imp::Nccl(b)) => a == b,
            (Imp::Nccl(_), _) | (_, Imp::Nccl(_)) => false,
            _ => true,
        }
    }
}

struct Rank {
    timer: timing::Timer,
    /// Exact inputs for the whole buffer, built once per (type, pattern) and copied from.
    pristine: DeviceBuffer<u8>,
    input: DeviceBuffer<u8>,
    output: DeviceBuffer<u8>,
    /// Registered on every rank (ours on registered buffers), when measured.
    registered: Option<(DeviceBuffer<u8>, DeviceBuffer<u8>)>,
    /// NCCL's plain mode's buffers for all-to-all (its sends and receives), when kept apart.
    nccl_p2p: Option<(DeviceBuffer<u8>, DeviceBuffer<u8>)>,
}

struct Harness<'a> {
    comms: &'a [Communicator],
    /// One group per NCCL mode that could be set up.
    nccl: &'a [NcclGroup],
    ranks: Vec<Rank>,
    /// Every rank's buffers as NCCL takes them, per group (the plain mode uses ours), built once.
    /// Per group, per buffer set (see [`P2P_SET`]).
    nccl_bufs: Vec<Vec<Vec<Bufs>>>,
    /// NCCL's all-to-all runs on buffers of its own (NVIDIA/nccl issue 1859).
    separate_p2p: bool,
    nccl_streams: Vec<p2p_sys::cuda::CUstream>,
    pristine_holds: Option<(DataType, Class)>,
    /// Per rank, loaded on first use.
    floor: Vec<crate::floor::EmptyKernel>,
    /// Holds every stream while a graph sample is queued.
    gate: Option<Gate>,
    /// Watches every step's deadline.
    watchdog: Watchdog,
    /// The NCCL group whose step runs now: its asynchronous errors end a wait.
    active: Option<usize>,
    /// The longest one wait may take.
    limit: Duration,
}

impl timing::Ranks for Harness<'_> {
    fn timers(&self) -> Vec<&timing::Timer> {
        self.ranks.iter().map(|r| &r.timer).collect()
    }

    fn comms(&self) -> &[Communicator] {
        self.comms
    }

    fn wait_limit(&self) -> Duration {
        self.limit
    }

    fn poll(&self) -> Result<(), String> {
        if self.watchdog.fired() {
            return Err("the watchdog aborted the step".into());
        }
        if let Some(g) = self.active {
            self.nccl[g]
                .async_error()
                .map_err(|e| format!("NCCL reports an error: {e}"))?;
        }
        Ok(())
    }

    fn gate(&self) -> Option<&Gate> {
        self.gate.as_ref()
    }
}

impl Harness<'_> {
    fn issue(&mut self, imp: Imp, call: &Call, in_place: bool) -> Result<(), String> {
        match imp {
            Imp::Ours | Imp::OursRegistered => {
                for (comm, r) in self.comms.iter().zip(self.ranks.iter_mut()) {
                    let (input, output) = match (imp, &mut r.registered) {
                        (Imp::OursRegistered, Some((i, o))) => (&*i, o),
                        (Imp::OursRegistered, None) => return Err("no registered buffers".into()),
                        _ => (&r.input, &mut r.output),
                    };
                    let res = if in_place {
                        comm.call_in_place(call, output, &r.timer.stream)
                    } else {
                        comm.call(call, input, output, &r.timer.stream)
                    };
                    res.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Imp::Floor => {
                if self.floor.is_empty() {
                    self.floor = self
                        .ranks
                        .iter()
                        .map(|r| crate::floor::EmptyKernel::load(r.timer.stream.device()))
                        .collect::<Result<_, _>>()
                        .map_err(|e| e.to_string())?;
                }
                for (k, r) in self.floor.iter().zip(&self.ranks) {
                    k.launch(1, 512, &r.timer.stream)
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Imp::Nccl(mode) => {
                let g = self.group(mode)?;
                self.nccl[g].issue(
                    call.op,
                    call.dtype,
                    call.redop,
                    call.root,
                    call.count,
                    in_place,
                    &self.nccl_bufs[g][self.nccl_set(call.op)],
                    &self.nccl_streams,
                )
            }
        }
    }

    fn sync(&self) -> Result<(), String> {
        timing::Ranks::sync(self)
    }

    fn group(&self, mode: NcclMode) -> Result<usize, String> {
        self.nccl
            .iter()
            .position(|g| g.mode() == mode)
            .ok_or_else(|| format!("NCCL's {} mode is not set up", mode.name()))
    }

    /// The buffer set NCCL runs `op` on: [`P2P_SET`] for the operations it runs as sends and
    /// receives where the run keeps them apart, else 0.
    fn nccl_set(&self, op: Op) -> usize {
        if op == Op::AllToAll && self.separate_p2p {
            P2P_SET
        } else {
            0
        }
    }

    /// Rank `rank`'s (send, receive) buffers as `imp` uses them for `op`.
    fn buffers(
        &self,
        imp: Imp,
        op: Op,
        rank: usize,
    ) -> Result<(Borrowed<'_>, Borrowed<'_>), String> {
        let r = &self.ranks[rank];
        let ours = || (Borrowed::buffer(&r.input), Borrowed::buffer(&r.output));
        let set = self.nccl_set(op);
        match imp {
            Imp::OursRegistered => r
                .registered
                .as_ref()
                .map(|(i, o)| (Borrowed::buffer(i), Borrowed::buffer(o)))
                .ok_or_else(|| "no registered buffers".to_string()),
            Imp::Nccl(mode) if mode.windows() => {
                let g = self.group(mode)?;
                self.nccl[g]
                    .window_of(set, rank)
                    .ok_or_else(|| format!("NCCL's {} mode has no windows", mode.name()))
            }
            Imp::Nccl(_) if set == P2P_SET => r
                .nccl_p2p
                .as_ref()
                .map(|(i, o)| (Borrowed::buffer(i), Borrowed::buffer(o)))
                .ok_or_else(|| "no buffers for NCCL's sends and receives".to_string()),
            _ => Ok(ours()),
        }
    }

    /// Runs `call` once on exact inputs and counts wrong elements over every rank.
    fn check(&mut self, imp: Imp, call: &Call, in_place: bool) -> Result<usize, String> {
        let n = self.ranks.len();
        let size = call.dtype.size();
        let c = class(call.op, call.redop);
        let e = |e: p2p_mem::Error| e.to_string();
        if self.pristine_holds != Some((call.dtype, c)) {
            for (rank, r) in self.ranks.iter_mut().enumerate() {
                let len = r.pristine.len() / size;
                let host = input(call, n, rank, len);
                r.pristine
                    .slice_mut(..host.len())
                    .map_err(e)?
                    .copy_from_host(&host)
                    .map_err(e)?;
            }
            self.pristine_holds = Some((call.dtype, c));
        }
        for rank in 0..n {
            let (in_len, out_len) = call.op.buffer_lens(call.count, n, rank, call.root);
            let bytes = in_len * size;
            let (send, recv) = self.buffers(imp, call.op, rank)?;
            recv.slice(..in_len.max(out_len) * size)
                .map_err(e)?
                .memset_u8(0xff)
                .map_err(e)?;
            let (buf, off) = if in_place {
                (&recv, in_place_input_offset(call, rank) * size)
            } else {
                (&send, 0)
            };
            if bytes > 0 {
                let src = self.ranks[rank].pristine.slice(..bytes).map_err(e)?;
                buf.slice(off..off + bytes)
                    .map_err(e)?
                    .copy_from_device(&src)
                    .map_err(e)?;
            }
        }
        self.issue(imp, call, in_place)?;
        timing::Ranks::sync(self)?;
        let mut wrong = 0;
        for rank in 0..n {
            let (off, len) = result_region(call, n, rank, in_place);
            let (_, recv) = self.buffers(imp, call.op, rank)?;
            let got = recv
                .slice(off * size..(off + len) * size)
                .and_then(|v| v.to_host_vec::<u8>())
                .map_err(|e| e.to_string())?;
            wrong += compare(call.dtype, &got, |j| expected(call, n, rank, in_place, j)).0;
        }
        Ok(wrong)
    }

    /// Microseconds per call, the slowest rank, median over samples: eager, or with `iters`
    /// calls captured in one CUDA graph per rank (`graph`).
    fn time(
        &mut self,
        how: Timing,
        (imp, call, in_place): (Imp, &Call, bool),
        iters: usize,
        samples: usize,
    ) -> Result<Stat, String> {
        let issue = |h: &mut Self| h.issue(imp, call, in_place);
        match how {
            Timing::Eager => timing::eager(self, iters, samples, issue),
            Timing::Graph | Timing::GraphUngated => {
                let gated = how == Timing::Graph;
                let how = timing::Sampling {
                    iters,
                    samples,
                    gated,
                };
                timing::graph(self, how, issue)
            }
        }
    }

    /// Arms the watchdog for one step of `imp` (`what` names it): past the deadline, NCCL's
    /// communicators of that mode are aborted, or ours (their abort flag).
    fn arm(&mut self, imp: Imp, what: &str) {
        let on_fire: OnFire = match imp {
            Imp::Nccl(mode) => match self.group(mode) {
                Ok(g) => {
                    self.active = Some(g);
                    let aborter = self.nccl[g].aborter();
                    Box::new(move || match aborter.abort() {
                        Ok(said) => said
                            .iter()
                            .for_each(|e| eprintln!("p2p-bench coll: ncclCommAbort: {e}")),
                        Err(e) => {
                            // Nothing safe is left to do in this process: its rows so far
                            // are in the partial results.
                            eprintln!("p2p-bench coll: FATAL: {e}: the run ends (exit 3)");
                            std::process::exit(3);
                        }
                    })
                }
                Err(_) => Box::new(|| {}),
            },
            _ => {
                let handles: Vec<_> = self.comms.iter().map(|c| c.abort_handle()).collect();
                Box::new(move || handles.iter().for_each(|h| h.abort()))
            }
        };
        self.watchdog.arm(what, self.limit, on_fire);
    }

    /// Ends the step armed by [`arm`](Self::arm). `Ok` if it left everything usable; else why
    /// not: the watchdog fired, a stream is still busy, or NCCL reports an error. Then the
    /// step's implementation is aborted (if the watchdog had not) and the streams drained; an
    /// `Err` from the outer result means they could not be, and the run must end.
    fn disarm(&mut self, imp: Imp) -> Result<Result<(), String>, String> {
        let fired = self.watchdog.disarm();
        let group = self.active.take();
        let mut why = fired.map(|_| format!("past its limit of {} s", self.limit.as_secs()));
        if why.is_none() {
            let busy: Vec<usize> = (0..self.ranks.len())
                .filter(|&r| !self.ranks[r].timer.stream.is_idle().unwrap_or(false))
                .collect();
            if !busy.is_empty() {
                why = Some(format!("rank(s) {busy:?} still busy after the step"));
            }
        }
        if why.is_none() {
            if let Some(g) = group {
                why = self.nccl[g]
                    .async_error()
                    .err()
                    .map(|e| format!("NCCL: {e}"));
            }
        }
        let Some(why) = why else {
            return Ok(Ok(()));
        };
        match (imp, group) {
            (Imp::Nccl(_), Some(g)) => match self.nccl[g].aborter().abort() {
                Ok(said) => said
                    .iter()
                    .for_each(|e| eprintln!("p2p-bench coll: ncclCommAbort: {e}")),
                Err(e) => eprintln!("p2p-bench coll: {e}"),
            },
            _ => self.comms.iter().for_each(|c| c.abort()),
        }
        // Aborted kernels end within milliseconds; give them a few seconds.
        let drained = timing::sync_all(
            self.ranks.iter().map(|r| &r.timer.stream),
            &[],
            Duration::from_secs(10),
            || Ok(()),
        );
        match drained {
            Ok(()) => Ok(Err(why)),
            Err(e) => Err(format!(
                "{why}; after the abort the streams did not drain ({e}): the run ends here"
            )),
        }
    }

    /// Host microseconds to issue one call on one rank (enqueue only).
    fn host_cost_us(&mut self, imp: Imp, call: &Call) -> Result<f64, String> {
        let calls = 200;
        self.sync()?;
        let t = Instant::now();
        for _ in 0..calls {
            self.issue(imp, call, false)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / (calls * self.ranks.len()) as f64;
        self.sync()?;
        Ok(us)
    }
}

/// Sizes from `min` to `max`, each `factor` times the one before.
pub fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    std::iter::successors(Some(min.max(1)), |s| s.checked_mul(factor.max(2)))
        .take_while(|s| *s <= max)
        .collect()
}

/// Runs the benchmark; the JSON holds every row.
pub fn run(opts: &Options) -> Result<Value, String> {
    if opts.share_gpu > 0 && opts.nccl {
        return Err("NCCL cannot run with ranks sharing a GPU: add --no-nccl".into());
    }
    let devices = crate::rank_devices("coll", opts.gpus, opts.share_gpu)?;
    let n = devices.len();
    let mut comm_options = CommOptions::from_env().map_err(|e| e.to_string())?;
    comm_options.tuning = opts.tuning;
    let comms = Communicator::init_all_with(&devices, comm_options).map_err(|e| e.to_string())?;
    let buf_bytes = opts.max_bytes.max(64);
    let watchdog = Watchdog::start();
    let mut nccl_groups = Vec::new();
    let mut nccl_setup = json!({});
    if opts.nccl {
        for &mode in &opts.nccl_modes {
            // NCCL's set-up has no handle to abort yet: past the deadline the run ends.
            let what = format!("NCCL's {} set-up", mode.name());
            watchdog.arm(
                what.clone(),
                opts.deadline,
                Box::new(move || {
                    eprintln!("p2p-bench coll: {what} hung: the run ends (exit 3)");
                    std::process::exit(3);
                }),
            );
            let sets = if opts.nccl_shared_p2p_buffers { 1 } else { 2 };
            let made = NcclGroup::init(&devices, mode, buf_bytes, sets);
            watchdog.disarm();
            match made {
                Ok(g) => {
                    nccl_setup[mode.name()] = json!("ok");
                    nccl_groups.push(g);
                }
                Err(e) => {
                    eprintln!(
                        "coll: NCCL's {} mode could not be set up, skipping it: {e}",
                        mode.name()
                    );
                    nccl_setup[mode.name()] = json!({ "error": e });
                }
            }
        }
    }
    let nccl_version = crate::nccl::version().unwrap_or_else(|e| format!("unavailable ({e})"));
    let mut ranks = Vec::new();
    for d in &devices {
        let e = |e: p2p_mem::Error| e.to_string();
        ranks.push(Rank {
            timer: timing::Timer::new(d)?,
            pristine: DeviceBuffer::new(d, buf_bytes).map_err(e)?,
            input: DeviceBuffer::new(d, buf_bytes).map_err(e)?,
            output: DeviceBuffer::new(d, buf_bytes).map_err(e)?,
            registered: if opts.registered {
                Some((
                    DeviceBuffer::new(d, buf_bytes).map_err(e)?,
                    DeviceBuffer::new(d, buf_bytes).map_err(e)?,
                ))
            } else {
                None
            },
            nccl_p2p: if nccl_groups.iter().any(|g| g.mode() == NcclMode::Plain)
                && !opts.nccl_shared_p2p_buffers
                && opts.ops.contains(&Op::AllToAll)
            {
                Some((
                    DeviceBuffer::new(d, buf_bytes).map_err(e)?,
                    DeviceBuffer::new(d, buf_bytes).map_err(e)?,
                ))
            } else {
                None
            },
        });
    }
    let registrations = if opts.registered {
        register(&comms, &ranks)?
    } else {
        Vec::new()
    };
    let plain_bufs: Vec<Bufs> = ranks
        .iter()
        .map(|r| Bufs {
            send: r.input.device_ptr(),
            recv: r.output.device_ptr(),
        })
        .collect();
    let p2p_bufs: Vec<Bufs> = ranks
        .iter()
        .map(|r| match &r.nccl_p2p {
            Some((i, o)) => Bufs {
                send: i.device_ptr(),
                recv: o.device_ptr(),
            },
            None => Bufs {
                send: r.input.device_ptr(),
                recv: r.output.device_ptr(),
            },
        })
        .collect();
    let driver = p2p_sys::driver_version().unwrap_or(0);
    let mut results = json!({
        "benchmark": "coll",
        "date": crate::utc_now(),
        "commit": env!("P2PBUILD_COMMIT"),
        "host": p2p_transport::hostname(),
        "gpus": devices.iter().map(|d| json!({"ordinal": d.ordinal(), "name": d.name(), "pci_bus_id": d.pci_bus_id()})).collect::<Vec<_>>(),
        "world": n,
        "cuda_driver": format!("{}.{}", driver / 1000, driver % 1000 / 10),
        "nccl_version": nccl_version,
        "nccl_library": p2p_sys::probe::require(p2p_sys::Library::Nccl).unwrap_or("-"),
        "nccl_modes": nccl_setup,
        "nccl_env": {"NCCL_NVLS_ENABLE": std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()},
        "tuning": format!("{:?}", comms[0].tuning()),
        "options": {"samples": opts.samples, "min_bytes": opts.min_bytes, "max_bytes": opts.max_bytes, "graph_max_bytes": opts.graph_max_bytes, "nccl_check_max_bytes": opts.nccl_check_max_bytes, "deadline_s": opts.deadline.as_secs_f64(), "nccl_shared_p2p_buffers": opts.nccl_shared_p2p_buffers},
        "method": METHOD,
        "complete": false,
        "rows": [],
    });
    let mut h = Harness {
        comms: &comms,
        nccl: &nccl_groups,
        nccl_bufs: nccl_groups
            .iter()
            .map(|g| {
                let own = g.window_bufs().unwrap_or_else(|| plain_bufs.clone());
                let p2p = g
                    .window_bufs_of(P2P_SET)
                    .unwrap_or_else(|| p2p_bufs.clone());
                vec![own, p2p]
            })
            .collect(),
        separate_p2p: !opts.nccl_shared_p2p_buffers,
        nccl_streams: ranks.iter().map(|r| r.timer.stream.cu_stream()).collect(),
        ranks,
        pristine_holds: None,
        floor: Vec::new(),
        gate: Some(Gate::load(&devices).map_err(|e| format!("the timing gate: {e}"))?),
        watchdog,
        active: None,
        limit: opts.deadline,
    };
    let modes: Vec<NcclMode> = nccl_groups.iter().map(|g| g.mode()).collect();
    let mut jobs: Vec<(Op, DataType)> = Vec::new();
    for &op in &opts.ops {
        if op == Op::AllReduce {
            jobs.extend(opts.all_reduce_types.iter().map(|&d| (op, d)));
        } else {
            jobs.push((op, DataType::F32));
        }
    }
    let sizes = sizes(opts.min_bytes, opts.max_bytes, opts.factor);
    let total = jobs.len() * sizes.len();
    // On a terminal a progress bar (with the last row beside it); in a log one line per row.
    let progress = Progress::new(total);
    let say = |line: String| progress.say(&line);
    let mut rows = Vec::new();
    // Why an implementation is skipped from here on: it was aborted (ours, or NCCL's mode).
    let mut dead: Vec<(Imp, String)> = Vec::new();
    let mut ended: Option<String> = None;
    'jobs: for &(op, dtype) in &jobs {
        for &size_asked in &sizes {
            let Some(SizedCall {
                count,
                elems,
                bytes,
            }) = sized(op, dtype, size_asked, n)
            else {
                progress.step(&format!(
                    "{} {} {}: less than one element a rank, skipped",
                    op.name(),
                    dtype,
                    size_name(size_asked)
                ));
                continue;
            };
            let call = Call::new(op, dtype, count);
            let iters = timing::iters_for(bytes);
            let mut row = json!({
                "op": op.name(), "bytes": bytes, "count": elems, "type": dtype.name(),
                "redop": if op.reduces() { "sum" } else { "none" }, "root": if op.rooted() { 0 } else { -1 },
                "iters": iters, "plan": comms[0].plan(&call).route(),
            });
            if opts.registered {
                let access = Access {
                    input: true,
                    output: true,
                    ..Access::NONE
                };
                row["plan_registered"] = json!(comms[0].plan_with(&call, access).route());
            }
            let mut imps = vec![Imp::Ours];
            if opts.registered {
                imps.push(Imp::OursRegistered);
            }
            imps.extend(
                modes
                    .iter()
                    .filter(|m| m.applies(op))
                    .map(|&m| Imp::Nccl(m)),
            );
            for &imp in &imps {
                for in_place in [false, true] {
                    let place = if in_place { "in_place" } else { "out_of_place" };
                    let slot = figures_slot(&mut row, imp, place);
                    if matches!(imp, Imp::Nccl(_)) && in_place && op == Op::AllToAll {
                        // NCCL's all-to-all has no in-place form (its results are wrong when
                        // send and receive buffers are the same): not measured.
                        *slot = json!({"skipped": "NCCL has no in-place all-to-all"});
                        continue;
                    }
                    if let Some((_, why)) = dead.iter().find(|(d, _)| d.same_comms(imp)) {
                        *slot = json!({ "skipped": why });
                        continue;
                    }
                    let what = format!(
                        "{} {} {} {} {}",
                        imp.name(),
                        op.name(),
                        dtype,
                        size_name(bytes),
                        place.replace('_', " ")
                    );
                    let step = Step {
                        imp,
                        call: &call,
                        in_place,
                        bytes,
                        iters,
                    };
                    h.arm(imp, &what);
                    let (figures, errors) = step.measure(&mut h, opts, n);
                    *figures_slot(&mut row, imp, place) = figures;
                    for e in &errors {
                        say(format!("p2p-bench coll: {what}: {e}"));
                    }
                    match h.disarm(imp) {
                        Ok(Ok(())) => {}
                        Ok(Err(why)) => {
                            let whose = match imp {
                                Imp::Nccl(m) => format!("NCCL's {} communicators", m.name()),
                                _ => "our communicators".to_string(),
                            };
                            let reason = format!("{what}: {why}; {whose} were aborted");
                            say(format!(
                                "p2p-bench coll: ERROR {reason}, and are skipped from here on"
                            ));
                            figures_slot(&mut row, imp, place)["aborted"] = json!(reason);
                            dead.push((imp, reason));
                        }
                        Err(fatal) => {
                            say(format!("p2p-bench coll: FATAL {what}: {fatal}"));
                            figures_slot(&mut row, imp, place)["aborted"] = json!(fatal);
                            ended = Some(format!("{what}: {fatal}"));
                        }
                    }
                    if ended.is_some() {
                        break;
                    }
                }
                if ended.is_some() {
                    break;
                }
            }
            add_best(&mut row, &modes);
            progress.step(&format!(
                "{} {} {}: ours {} us, registered {} us, NCCL best {} us ({})",
                op.name(),
                dtype,
                size_name(bytes),
                fmt_us(&row["ours"]["out_of_place"]["eager"]),
                fmt_us(&row["ours_registered"]["out_of_place"]["eager"]),
                fmt_us(&row["nccl_best"]["out_of_place"]["eager"]),
                row["nccl_best"]["out_of_place"]["eager"]["mode"]
                    .as_str()
                    .unwrap_or("-"),
            ));
            rows.push(row);
            results["rows"] = json!(rows);
            write_partial(opts, &results, &say);
            if ended.is_some() {
                break 'jobs;
            }
        }
    }
    progress.finish();
    if let Some(why) = ended {
        // Work is still queued on some stream and may use any of the buffers, communicators
        // and windows: leak them all rather than free memory a kernel may still touch.
        results["incomplete"] = json!(why);
        std::mem::forget(h);
        std::mem::forget(registrations);
        std::mem::forget(nccl_groups);
        std::mem::forget(comms);
        return Ok(results);
    }
    // Host cost of issuing one call (8 KiB float all-reduce, eager).
    let small = Call::new(Op::AllReduce, DataType::F32, 2048);
    let mut host = json!({});
    let mut host_imps = vec![Imp::Ours];
    host_imps.extend(modes.iter().map(|&m| Imp::Nccl(m)));
    for imp in host_imps {
        host[imp.key()] = if let Some((_, why)) = dead.iter().find(|(d, _)| d.same_comms(imp)) {
            json!({ "skipped": why })
        } else {
            h.arm(imp, &format!("{} host cost", imp.name()));
            let measured = h.host_cost_us(imp, &small);
            match (h.disarm(imp), measured) {
                (Ok(Ok(())), Ok(us)) => json!(us),
                (Ok(Ok(())), Err(e)) | (Ok(Err(e)), _) | (Err(e), _) => json!({"error": e}),
            }
        };
    }
    // The floor: an empty kernel per rank, launched like ours (one block, programmatic
    // dependent launch), eager and in a graph. No one-kernel collective can beat it.
    let floor_call = Call::new(Op::AllReduce, DataType::F32, 1);
    let floor = {
        let fig = |s: Result<Stat, String>| match s {
            Ok(s) => json!({"us": s.median, "us_min": s.min, "us_max": s.max}),
            Err(e) => json!({"error": e}),
        };
        let eager = fig(h.time(
            Timing::Eager,
            (Imp::Floor, &floor_call, false),
            100,
            opts.samples,
        ));
        let graph = fig(h.time(
            Timing::Graph,
            (Imp::Floor, &floor_call, false),
            100,
            opts.samples.min(10),
        ));
        json!({"eager": eager, "graph": graph})
    };
    deregister(&comms, registrations)?;
    drop(h);
    results["host_us_per_call"] = host;
    results["floor_empty_kernel"] = floor;
    results["complete"] = json!(true);
    if let Some(p) = &opts.partial {
        let _ = std::fs::remove_file(p);
    }
    Ok(results)
}

/// How `coll` times a figure, as `Harness::time` runs it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timing {
    Eager,
    /// Graph replays behind the gate.
    Graph,
    /// Graph replays without the gate (the host's launch cost included).
    GraphUngated,
}

/// What the `method` field of the results says.
const METHOD: &str = "one process drives every GPU; CUDA events on each rank's stream around `iters` back-to-back calls after 3 warm-up calls; the slowest rank's time per call; median of `samples`. Graph: the `iters` calls captured once per rank, replayed once, then up to 10 samples of one replay each; a gate kernel holds every rank's stream until all the replays and events are queued, so the figure holds the GPUs' time and not the host's cost of launching the graphs (nccl-tests -G hides that cost behind back-to-back launches). NCCL: one communicator per GPU per mode (ncclCommInitRankConfig in one group, nvlinkCentricSched = 1 as nccl-tests sets it), one ncclGroupStart/End per call across ranks; plain on the same buffers as ours; symmetric windows (nccl-tests -R 2) and copy engine (-x 2 -R 2, all-gather and all-to-all only) on their own ncclMemAlloc buffers registered with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC). `best` is the fastest NCCL mode at each size, timing and placement; ours/best below 1 means we are faster. #wrong: one call on exact inputs, every output element of every rank compared. Every step (one implementation at one size and placement) has a deadline; a step past it, or one NCCL reports an asynchronous error for, is aborted (ncclCommAbort, or our abort flag) and that implementation skipped from there on (`aborted`, `skipped`).";

/// One implementation at one size and placement: its check, eager and graph timing.
struct Step<'c> {
    imp: Imp,
    call: &'c Call,
    in_place: bool,
    bytes: usize,
    iters: usize,
}

impl Step<'_> {
    /// The step's figures (the slot of the row) and the errors met, in order.
    fn measure(&self, h: &mut Harness<'_>, opts: &Options, n: usize) -> (Value, Vec<String>) {
        let Step {
            imp,
            call,
            in_place,
            bytes,
            iters,
        } = *self;
        let checked =
            opts.check && (!matches!(imp, Imp::Nccl(_)) || bytes <= opts.nccl_check_max_bytes);
        let wrong = if checked {
            h.check(imp, call, in_place)
        } else if opts.check {
            Err(format!(
                "NCCL checked up to {} only",
                size_name(opts.nccl_check_max_bytes)
            ))
        } else {
            Err("not checked (--no-check)".to_string())
        };
        let mut errors = Vec::new();
        if let Err(e) = &wrong {
            if checked {
                errors.push(format!("check: {e}"));
            }
        }
        let graphs = bytes <= opts.graph_max_bytes && !in_place;
        let eager = h.time(Timing::Eager, (imp, call, in_place), iters, opts.samples);
        // After a stall (the watchdog fired, or a wait ran out) the step ends here.
        let stalled = |h: &Harness<'_>, e: &Result<Stat, String>| {
            h.watchdog.fired() || e.as_ref().is_err_and(|e| e.starts_with(timing::STALLED))
        };
        let stuck = stalled(h, &eager);
        let graph = (graphs && !stuck).then(|| {
            h.time(
                Timing::Graph,
                (imp, call, in_place),
                iters,
                opts.samples.min(10),
            )
        });
        let stuck = stuck || graph.as_ref().is_some_and(|g| stalled(h, g));
        let ungated = (graphs && opts.graph_ungated && !stuck).then(|| {
            h.time(
                Timing::GraphUngated,
                (imp, call, in_place),
                iters,
                opts.samples.min(10),
            )
        });
        let op = call.op;
        let fig = |s: &Result<Stat, String>| match s {
            Ok(s) => {
                let algbw = bytes as f64 / (s.median * 1e3);
                json!({"us": s.median, "us_min": s.min, "us_max": s.max, "algbw": algbw, "busbw": algbw * op.bus_factor(n)})
            }
            Err(e) => json!({"error": e}),
        };
        let mut slot = json!({
            "wrong": match &wrong { Ok(w) => json!(w), Err(e) => json!({"error": e}) },
            "eager": fig(&eager),
        });
        if let Err(e) = &eager {
            errors.push(format!("eager: {e}"));
        }
        for (key, t) in [("graph", &graph), ("graph_ungated", &ungated)] {
            if let Some(t) = t {
                slot[key] = fig(t);
                if let Err(e) = t {
                    errors.push(format!("{key}: {e}"));
                }
            }
        }
        (slot, errors)
    }
}

/// Rewrites `opts.partial` (if set) with `results` as they stand; a failure is said, not fatal.
fn write_partial(opts: &Options, results: &Value, say: &impl Fn(String)) {
    let Some(path) = &opts.partial else {
        return;
    };
    let tmp = path.with_extension("json.tmp");
    let written = serde_json::to_vec_pretty(results)
        .map_err(|e| e.to_string())
        .and_then(|b| std::fs::write(&tmp, b).map_err(|e| e.to_string()))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| e.to_string()));
    if let Err(e) = written {
        say(format!(
            "p2p-bench coll: writing the partial results to {}: {e}",
            path.display()
        ));
    }
}

/// A call of one size as `coll` (and nccl-tests) count sizes: the whole buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizedCall {
    /// The call's count: a rank's part for all-gather, reduce-scatter and all-to-all.
    pub count: usize,
    /// Elements of the whole buffer that count moves.
    pub elems: usize,
    /// Its bytes.
    pub bytes: usize,
}

/// `op` of `dtype` at `bytes` on `world` ranks; `None` where that is less than one element a
/// rank's part. As nccl-tests, the parts round down: 3 ranks move a little less than asked.
pub fn sized(op: Op, dtype: DataType, bytes: usize, world: usize) -> Option<SizedCall> {
    let elems = bytes / dtype.size();
    let parts = matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll);
    let count = if parts { elems / world.max(1) } else { elems };
    let elems = if parts { count * world } else { count };
    (count > 0).then_some(SizedCall {
        count,
        elems,
        bytes: elems * dtype.size(),
    })
}

/// Where `imp`'s figures for `place` go in a row.
fn figures_slot<'r>(row: &'r mut Value, imp: Imp, place: &str) -> &'r mut Value {
    match imp {
        Imp::Nccl(m) => &mut row["nccl"][m.name()][place],
        Imp::OursRegistered => &mut row["ours_registered"][place],
        _ => &mut row["ours"][place],
    }
}

/// Registers every rank's pair of registered-mode buffers (`Communicator::register_all`).
#[allow(unsafe_code)]
fn register(comms: &[Communicator], ranks: &[Rank]) -> Result<Vec<Registration>, String> {
    let mut regs = Vec::new();
    for pick in [0, 1] {
        let bufs: Vec<&dyn DeviceMemory> = ranks
            .iter()
            .filter_map(|r| r.registered.as_ref())
            .map(|(i, o)| if pick == 0 { i as &dyn DeviceMemory } else { o })
            .collect();
        // SAFETY: the buffers live in `ranks`; `run` deregisters them (`deregister`) before it
        // drops the ranks.
        regs.extend(
            unsafe { Communicator::register_all(comms, &bufs) }.map_err(|e| e.to_string())?,
        );
    }
    Ok(regs)
}

/// Ends the registrations of [`register`] on their ranks.
fn deregister(comms: &[Communicator], regs: Vec<Registration>) -> Result<(), String> {
    for (i, reg) in regs.into_iter().enumerate() {
        comms[i % comms.len()]
            .deregister(reg)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Fills `row["nccl_best"][place][timing]` with the fastest NCCL mode's figure (and its name)
/// and `row["ratio"][place][timing]` (and `ratio_registered`) with our time over it.
fn add_best(row: &mut Value, modes: &[NcclMode]) {
    for place in ["out_of_place", "in_place"] {
        for timing in ["eager", "graph"] {
            let best = modes
                .iter()
                .filter_map(|m| {
                    let f = &row["nccl"][m.name()][place][timing];
                    Some((m.name(), f["us"].as_f64()?, f.clone()))
                })
                .min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((mode, us, mut fig)) = best {
                fig["mode"] = json!(mode);
                row["nccl_best"][place][timing] = fig;
                if let Some(ours) = row["ours"][place][timing]["us"].as_f64() {
                    row["ratio"][place][timing] = json!(ours / us);
                }
                if let Some(ours) = row["ours_registered"][place][timing]["us"].as_f64() {
                    row["ratio_registered"][place][timing] = json!(ours / us);
                }
            }
        }
    }
}

/// The (collective, type) pairs of `rows`, in first-seen order.
fn groups(rows: &[Value]) -> Vec<(String, String)> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for row in rows {
        let g = (
            row["op"].as_str().unwrap_or("").to_string(),
            row["type"].as_str().unwrap_or("").to_string(),
        );
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups
}

fn fmt_us(v: &Value) -> String {
    v.get("us")
        .and_then(Value::as_f64)
        .map_or("-".into(), |u| format!("{u:.1}"))
}

fn num(v: &Value, k: &str, digits: usize) -> String {
    v.get(k)
        .and_then(Value::as_f64)
        .map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn wrong(v: &Value) -> String {
    match v.get("wrong") {
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => "ERR".into(),
        None => "-".into(),
    }
}

fn ratio(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.2}"))
}

/// Every NCCL mode that appears in `rows`, in [`NcclMode::ALL`] order.
fn modes_in(rows: &[Value]) -> Vec<NcclMode> {
    NcclMode::ALL
        .into_iter()
        .filter(|m| rows.iter().any(|r| !r["nccl"][m.name()].is_null()))
        .collect()
}

/// The results as Markdown: one nccl-tests style table per collective and type.
pub fn render(r: &Value) -> String {
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let modes = modes_in(&rows);
    let host_nccl: Vec<String> = modes
        .iter()
        .map(|m| format!("{} {}", m.label(), num(&r["host_us_per_call"], m.name(), 2)))
        .collect();
    let mut s = format!(
        "# p2p collectives beside NCCL's best mode\n\n{} x {} | CUDA driver {} | NCCL {} ({}) | commit {} | {}\n\n{}\n\n\
         Host cost of issuing one call (8 KiB all-reduce, per rank): ours {} us; NCCL {} us.\n\n\
         Floor (an empty kernel per rank, launched as ours are): eager {} us, graph {} us per call.\n\n\
         Columns as nccl-tests: time in us, algbw and busbw in GB/s, #wrong elements. NCCL's modes:\n\
         `plain`, `sym` (symmetric windows, nccl-tests -R 2), `CE` (copy engine, -x 2 -R 2; all-gather\n\
         and all-to-all only). `best` is the fastest of them at that size; `ours/best` is our time over\n\
         it (below 1: we are faster). `registered`: ours on buffers registered on every rank\n\
         (`Communicator::register_all`, the counterpart of NCCL's windows). `graph`: the same calls\n\
         captured in a CUDA graph.\n",
        r["world"],
        r["gpus"][0]["name"].as_str().unwrap_or("?"),
        r["cuda_driver"].as_str().unwrap_or("?"),
        r["nccl_version"].as_str().unwrap_or("?"),
        r["nccl_library"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?"),
        r["method"].as_str().unwrap_or(""),
        num(&r["host_us_per_call"], "ours", 2),
        host_nccl.join(", "),
        num(&r["floor_empty_kernel"]["eager"], "us", 2),
        num(&r["floor_empty_kernel"]["graph"], "us", 2),
    );
    if let Some(why) = r["incomplete"].as_str() {
        s += &format!("\n**The run ended early**: {why}\n");
    } else if r["complete"] == json!(false) {
        s += "\n**Partial results**: the run had not finished when these rows were written.\n";
    }
    let aborted: Vec<&str> = rows
        .iter()
        .flat_map(|row| {
            let mut v = Vec::new();
            for who in ["ours", "ours_registered"] {
                for place in ["out_of_place", "in_place"] {
                    v.push(&row[who][place]["aborted"]);
                }
            }
            for m in NcclMode::ALL {
                for place in ["out_of_place", "in_place"] {
                    v.push(&row["nccl"][m.name()][place]["aborted"]);
                }
            }
            v.into_iter().filter_map(Value::as_str).collect::<Vec<_>>()
        })
        .collect();
    if !aborted.is_empty() {
        s += "\nAborted steps (each implementation named is skipped after its abort):\n\n";
        for a in aborted {
            s += &format!("- {a}\n");
        }
    }
    for (op, ty) in groups(&rows) {
        s += &format!("\n## {op} {ty}\n\n");
        let mode_cols: String = modes
            .iter()
            .map(|m| format!(" NCCL {} |", m.label()))
            .collect();
        let graph_cols: String = modes.iter().map(|m| format!(" {} |", m.label())).collect();
        s += &format!(
            "| size | count | type | redop | root | plan | time | algbw | busbw | #wrong | in-place time | busbw | #wrong | registered: plan | time | busbw | #wrong | in-place time | #wrong |{mode_cols} best | busbw | NCCL #wrong | in-place best | ours/best | registered/best | in-place ours/best | in-place registered/best | graph: ours | registered |{graph_cols} ours/best | registered/best |\n"
        );
        let ncols = 32 + 2 * modes.len();
        s += &format!("|{}\n", "---|".repeat(ncols));
        for row in rows
            .iter()
            .filter(|x| x["op"] == op.as_str() && x["type"] == ty.as_str())
        {
            let o = &row["ours"]["out_of_place"];
            let oi = &row["ours"]["in_place"];
            let g = &row["ours_registered"]["out_of_place"];
            let gi = &row["ours_registered"]["in_place"];
            let best = &row["nccl_best"];
            // Each NCCL mode's out-of-place time, as table cells.
            let mode_cells = |timing: &str| -> String {
                modes
                    .iter()
                    .map(|m| {
                        format!(
                            " {} |",
                            num(&row["nccl"][m.name()]["out_of_place"][timing], "us", 1)
                        )
                    })
                    .collect()
            };
            let (mode_times, graph_times) = (mode_cells("eager"), mode_cells("graph"));
            let nccl_wrong: u64 = modes
                .iter()
                .flat_map(|m| {
                    ["out_of_place", "in_place"]
                        .map(|p| row["nccl"][m.name()][p]["wrong"].as_u64().unwrap_or(0))
                })
                .sum();
            let nccl_checked = modes
                .iter()
                .any(|m| row["nccl"][m.name()]["out_of_place"]["wrong"].is_u64());
            let with_mode = |f: &Value| match f["mode"].as_str() {
                Some(m) => format!("{} ({})", num(f, "us", 1), m),
                None => "-".into(),
            };
            s += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{} {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{} {} | {} |\n",
                size_name(row["bytes"].as_u64().unwrap_or(0) as usize),
                row["count"],
                ty,
                row["redop"].as_str().unwrap_or(""),
                row["root"],
                row["plan"].as_str().unwrap_or(""),
                num(&o["eager"], "us", 1),
                num(&o["eager"], "algbw", 2),
                num(&o["eager"], "busbw", 2),
                wrong(o),
                num(&oi["eager"], "us", 1),
                num(&oi["eager"], "busbw", 2),
                wrong(oi),
                row["plan_registered"].as_str().unwrap_or("-"),
                num(&g["eager"], "us", 1),
                num(&g["eager"], "busbw", 2),
                wrong(g),
                num(&gi["eager"], "us", 1),
                wrong(gi),
                mode_times,
                with_mode(&best["out_of_place"]["eager"]),
                num(&best["out_of_place"]["eager"], "busbw", 2),
                if nccl_checked { nccl_wrong.to_string() } else { "-".into() },
                with_mode(&best["in_place"]["eager"]),
                ratio(&row["ratio"]["out_of_place"]["eager"]),
                ratio(&row["ratio_registered"]["out_of_place"]["eager"]),
                ratio(&row["ratio"]["in_place"]["eager"]),
                ratio(&row["ratio_registered"]["in_place"]["eager"]),
                num(&o["graph"], "us", 1),
                num(&g["graph"], "us", 1),
                graph_times,
                ratio(&row["ratio"]["out_of_place"]["graph"]),
                ratio(&row["ratio_registered"]["out_of_place"]["graph"]),
            );
        }
    }
    s
}

/// busbw against size, ours beside NCCL's, one panel per collective and type, as SVG (drawn by
/// plotters; a drawing error, which only a malformed result could cause, is logged and the
/// plot left as far as it got).
pub fn svg(r: &Value) -> String {
    let mut out = String::new();
    if let Err(e) = draw_svg(r, &mut out) {
        tracing::error!("drawing the busbw plot: {e}");
    }
    out
}

fn draw_svg(r: &Value, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let groups = groups(&rows);
    let (pw, ph, cols) = (420u32, 260u32, 2usize);
    let nrows = groups.len().div_ceil(cols).max(1);
    let size = (pw * cols as u32, ph * nrows as u32 + 40);
    let root = SVGBackend::with_string(out, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(40);
    let title = format!(
        "busbw (GB/s), eager, out of place: p2p (blue), p2p registered (green), NCCL {} best mode (orange), NCCL plain (grey); {} x {}, commit {}, {}",
        r["nccl_version"].as_str().unwrap_or("?"),
        r["world"],
        r["gpus"][0]["name"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?").chars().take(10).collect::<String>(),
    );
    top.draw(&Text::new(title, (10, 14), ("sans-serif", 12).into_font()))?;
    let panels = body.split_evenly((nrows, cols));
    for (panel, (op, ty)) in panels.iter().zip(&groups) {
        let pts_of = |f: &dyn Fn(&Value) -> &Value| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|x| x["op"] == op.as_str() && x["type"] == ty.as_str())
                .filter_map(|x| Some((x["bytes"].as_f64()?, f(x)["busbw"].as_f64()?)))
                .collect()
        };
        let ours = pts_of(&|x| &x["ours"]["out_of_place"]["eager"]);
        let theirs = pts_of(&|x| &x["nccl_best"]["out_of_place"]["eager"]);
        let plain = pts_of(&|x| &x["nccl"]["plain"]["out_of_place"]["eager"]);
        let registered = pts_of(&|x| &x["ours_registered"]["out_of_place"]["eager"]);
        let all: Vec<&(f64, f64)> = ours.iter().chain(&theirs).chain(&registered).collect();
        let xmin = all.iter().map(|p| p.0).fold(f64::MAX, f64::min).max(1.0);
        let xmax = all.iter().map(|p| p.0).fold(1.0, f64::max).max(xmin * 2.0);
        let ymax = all.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{op} {ty}"), ("sans-serif", 12))
            .margin(8)
            .x_label_area_size(20)
            .y_label_area_size(40)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| size_name(*x as usize).replace(' ', ""))
            .y_labels(5)
            .draw()?;
        for (p, color) in [
            (plain, RGBColor(0xbb, 0xbb, 0xbb)),
            (ours, RGBColor(0x1f, 0x77, 0xb4)),
            (registered, RGBColor(0x2c, 0xa0, 0x2c)),
            (theirs, RGBColor(0xff, 0x7f, 0x0e)),
        ] {
            if !p.is_empty() {
                chart.draw_series(LineSeries::new(p, color.stroke_width(2)))?;
            }
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(us: f64) -> Value {
        json!({"us": us, "busbw": 100.0 / us})
    }

    /// The plot has a panel per collective and type, with a line for each series measured.
    #[test]
    fn the_plot_draws_a_panel_per_group_and_a_line_per_series() {
        let row = |op: &str, bytes: u64, bw: f64| {
            let mut r = json!({"op": op, "type": "float", "bytes": bytes});
            r["ours"]["out_of_place"]["eager"] = json!({"busbw": bw});
            r["nccl_best"]["out_of_place"]["eager"] = json!({"busbw": bw * 0.9});
            r
        };
        let results = json!({"world": 4, "commit": "abc", "rows": [
            row("all_reduce", 8192, 10.0), row("all_reduce", 1 << 20, 200.0),
            row("all_gather", 8192, 12.0), row("all_gather", 1 << 20, 220.0),
        ]});
        let svg = svg(&results);
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("all_reduce float") && svg.contains("all_gather float"));
        // p2p in blue, NCCL in orange, in each of the two panels.
        assert_eq!(svg.matches("stroke=\"#1F77B4\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("stroke=\"#FF7F0E\"").count(), 2, "{svg}");
        assert!(svg.contains("commit abc"));
    }

    #[test]
    fn the_fastest_nccl_mode_is_the_one_we_are_compared_with() {
        let mut row = json!({"op": "all_gather", "type": "float", "bytes": 1024, "count": 256});
        row["ours"]["out_of_place"]["eager"] = fig(4.0);
        row["ours"]["out_of_place"]["graph"] = fig(2.0);
        row["ours_registered"]["out_of_place"]["eager"] = fig(2.5);
        row["nccl"]["plain"]["out_of_place"]["eager"] = fig(10.0);
        row["nccl"]["symmetric"]["out_of_place"]["eager"] = fig(5.0);
        row["nccl"]["copy_engine"]["out_of_place"]["eager"] = json!({"error": "capture failed"});
        row["nccl"]["plain"]["out_of_place"]["graph"] = fig(3.0);
        row["nccl"]["symmetric"]["out_of_place"]["graph"] = fig(4.0);
        add_best(&mut row, &NcclMode::ALL);
        let best = &row["nccl_best"]["out_of_place"];
        assert_eq!(best["eager"]["mode"], "symmetric");
        assert_eq!(best["graph"]["mode"], "plain");
        assert_eq!(row["ratio"]["out_of_place"]["eager"], 0.8);
        assert_eq!(row["ratio_registered"]["out_of_place"]["eager"], 0.5);
        assert!(
            (row["ratio"]["out_of_place"]["graph"]
                .as_f64()
                .unwrap_or(0.0)
                - 2.0 / 3.0)
                .abs()
                < 1e-12
        );
        // No NCCL figure in place: no best and no ratio there.
        assert!(row["nccl_best"]["in_place"].is_null());
        let report = render(&json!({"world": 2, "gpus": [{"name": "GPU"}], "rows": [row]}));
        assert!(report.contains("| 5.0 (symmetric) |"), "{report}");
        assert!(report.contains("| 0.80 | 0.50 |"), "{report}");
        assert!(report.contains("NCCL sym"), "{report}");
    }
}
