//! NCCL through cudarc's bindings, driven the way nccl-tests drives it with one process and
//! several GPUs (one communicator per GPU made in one group, one group per call across ranks):
//! the comparison that `p2p-bench coll` runs in the same process, on the same streams, timed the
//! same way.
//!
//! NCCL 2.28 has three ways to run a collective inside a node ([`NcclMode`]), and a user who
//! cares picks the fastest, so the benchmark runs each and compares against the best:
//! plain (any buffers), symmetric windows (buffers from `ncclMemAlloc` registered with
//! `ncclCommWindowRegister(.., NCCL_WIN_COLL_SYMMETRIC)`, as nccl-tests `-R 2`) and copy-engine
//! collectives (the same windows with CTA policy ZERO, as nccl-tests `-x 2 -R 2`). Every
//! communicator is made as nccl-tests 2.19 makes it with NCCL 2.28: `ncclCommInitRankConfig`
//! with `nvlinkCentricSched = 1`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use p2p_collective::{DataType, Op, RedOp};
use p2p_mem::Device;
use p2p_sys::{check_nccl, nccl, Library};

/// `NCCL_API_MAGIC` of `nccl.h`.
const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF: i32 = i32::MIN;
/// `NCCL_WIN_COLL_SYMMETRIC`.
const WIN_COLL_SYMMETRIC: i32 = 0x01;
/// `NCCL_CTA_POLICY_ZERO`: no SMs; all-gather and all-to-all move data with copy engines.
const CTA_POLICY_ZERO: i32 = 0x02;
/// The `ncclConfig_t` layout these bindings carry (`NCCL_VERSION(2, 28, 0)`).
const CONFIG_VERSION: u32 = 22800;

/// One of NCCL's ways to run a collective inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclMode {
    /// Any buffers (`cudaMalloc`), NCCL's default kernels.
    Plain,
    /// Buffers from `ncclMemAlloc` registered as symmetric windows: NCCL's symmetric kernels.
    Symmetric,
    /// Symmetric windows with CTA policy ZERO: all-gather and all-to-all by the copy engines.
    CopyEngine,
}

impl NcclMode {
    /// Every mode, in the order the tables show them.
    pub const ALL: [NcclMode; 3] = [NcclMode::Plain, NcclMode::Symmetric, NcclMode::CopyEngine];

    /// The mode's name in the results (`plain`, `symmetric`, `copy_engine`).
    pub fn name(self) -> &'static str {
        match self {
            NcclMode::Plain => "plain",
            NcclMode::Symmetric => "symmetric",
            NcclMode::CopyEngine => "copy_engine",
        }
    }

    /// A short column label (`plain`, `sym`, `CE`).
    pub fn label(self) -> &'static str {
        match self {
            NcclMode::Plain => "plain",
            NcclMode::Symmetric => "sym",
            NcclMode::CopyEngine => "CE",
        }
    }

    /// The nccl-tests flags that select the mode.
    pub fn nccl_tests_flags(self) -> &'static str {
        match self {
            NcclMode::Plain => "",
            NcclMode::Symmetric => "-R 2",
            NcclMode::CopyEngine => "-x 2 -R 2",
        }
    }

    /// Whether NCCL 2.28 runs `op` differently in this mode: copy-engine collectives exist for
    /// all-gather and all-to-all only (other operations would measure the symmetric mode again).
    pub fn applies(self, op: Op) -> bool {
        match self {
            NcclMode::CopyEngine => matches!(op, Op::AllGather | Op::AllToAll),
            _ => true,
        }
    }

    /// Whether the mode needs buffers from `ncclMemAlloc` registered as windows.
    pub fn windows(self) -> bool {
        self != NcclMode::Plain
    }
}

/// NCCL's version, e.g. `2.28.9`.
pub fn version() -> Result<String, String> {
    let v = version_code()?;
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

fn version_code() -> Result<i32, String> {
    p2p_sys::probe::require(Library::Nccl).map_err(|e| e.to_string())?;
    let mut v = 0;
    // SAFETY: libnccl is loaded (probed); `v` is an out-pointer.
    check_nccl("ncclGetVersion", unsafe { nccl::ncclGetVersion(&mut v) })
        .map_err(|e| e.to_string())?;
    Ok(v)
}

/// cudarc's name of NCCL's type for `d` (the mapping is the library's, `DataType::nccl`: the
/// same number).
fn dtype(d: DataType) -> nccl::ncclDataType_t {
    use nccl::ncclDataType_t::*;
    let all = [
        ncclInt8,
        ncclUint8,
        ncclInt32,
        ncclUint32,
        ncclInt64,
        ncclUint64,
        ncclFloat16,
        ncclFloat32,
        ncclFloat64,
        ncclBfloat16,
    ];
    all.into_iter()
        .find(|t| *t as u32 == d.nccl().0)
        .unwrap_or(ncclUint8)
}

/// cudarc's name of NCCL's reduction for `r` (the mapping is the library's, `RedOp::nccl`).
fn redop(r: RedOp) -> nccl::ncclRedOp_t {
    use nccl::ncclRedOp_t::*;
    let all = [ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg];
    all.into_iter()
        .find(|o| *o as u32 == r.nccl().0)
        .unwrap_or(ncclSum)
}

/// Marks a thread inside an NCCL call while it lives.
struct Inside<'a>(&'a AtomicBool);

impl<'a> Inside<'a> {
    fn enter(flag: &'a AtomicBool) -> Inside<'a> {
        flag.store(true, Ordering::SeqCst);
        Inside(flag)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// One rank's buffers for a call: device addresses on that rank's GPU.
#[derive(Debug, Clone, Copy)]
pub struct Bufs {
    /// The send buffer.
    pub send: u64,
    /// The receive buffer.
    pub recv: u64,
}

/// One rank's symmetric-window buffers.
struct Window {
    send: *mut c_void,
    recv: *mut c_void,
    send_win: nccl::ncclWindow_t,
    recv_win: nccl::ncclWindow_t,
}

/// The buffer set of the operations NCCL runs as sends and receives (all-to-all), where a
/// group has two: NCCL 2.28 (up to 2.29.2, NVIDIA/nccl issue 1859) leaves the device copy of
/// a registered buffer's peer addresses zeroed when a ring collective reuses a registration
/// that sends and receives made, and the peers then wait forever for a null pointer. Keeping
/// the two kinds of calls on separate buffers avoids it (docs/performance.md, "How we
/// measure").
pub const P2P_SET: usize = 1;

/// One NCCL communicator per GPU in one mode, with the mode's buffers; all freed on `Drop`.
pub struct NcclGroup {
    mode: NcclMode,
    devices: Vec<Device>,
    comms: Vec<nccl::ncclComm_t>,
    /// Symmetric and copy-engine modes: each rank's registered send and receive buffers.
    windows: Vec<Window>,
    window_bytes: usize,
    /// Set once the communicators were aborted (by [`abort`](Self::abort) or by the watchdog
    /// through [`aborter`](Self::aborter)): they are gone, and nothing may use them again.
    aborted: Arc<AtomicBool>,
    /// Set while this thread is inside an NCCL call of the group (`issue`, `issue_p2p`): an
    /// abort from another thread is unsafe then (NCCL frees what the call uses).
    inside: Arc<AtomicBool>,
}

/// Aborts one mode's communicators from any thread (the benchmark's watchdog holds one while
/// a step of that mode runs): `ncclCommAbort` of each, which also ends a call blocked inside
/// NCCL and NCCL's kernels that wait. Each communicator is aborted once, whoever asks first.
pub struct Aborter {
    comms: Vec<(Device, usize)>,
    aborted: Arc<AtomicBool>,
    inside: Arc<AtomicBool>,
}

impl Aborter {
    /// Aborts the communicators, unless they were already; returns what each abort said. An
    /// error, aborting nothing, while the owner's thread is inside an NCCL call of the group:
    /// NCCL documents aborting a blocking communicator under a running call as unsafe.
    pub fn abort(&self) -> Result<Vec<String>, String> {
        if self.inside.load(Ordering::SeqCst) {
            return Err("the benchmark's thread is inside an NCCL call of these communicators, where aborting them is unsafe".into());
        }
        if self.aborted.swap(true, Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        let mut said = Vec::new();
        for (r, (d, comm)) in self.comms.iter().enumerate() {
            let _ = d.bind_to_thread();
            // SAFETY: the handle came from ncclCommInitRankConfig and is aborted once (the
            // flag above); NCCL documents ncclCommAbort as callable while another thread is
            // blocked in a call on the same communicator. The owner never uses it again.
            let rc = unsafe { nccl::ncclCommAbort(*comm as nccl::ncclComm_t) };
            if let Err(e) = check_nccl("ncclCommAbort", rc) {
                said.push(format!("rank {r}: {e}"));
            }
        }
        Ok(said)
    }
}

fn nccl_err(call: &str) -> impl Fn(p2p_sys::Error) -> String + '_ {
    move |e| format!("{call}: {e}")
}

impl NcclGroup {
    /// One communicator per device (rank r is `devices[r]`) in `mode`; for the modes with
    /// windows, also `sets` pairs of a send and a receive buffer of `window_bytes` per rank
    /// from `ncclMemAlloc`, registered as symmetric windows (set 0 for the collectives, set 1,
    /// if asked for, for the operations NCCL runs as sends and receives: see [`P2P_SET`]).
    pub fn init(
        devices: &[Device],
        mode: NcclMode,
        window_bytes: usize,
        sets: usize,
    ) -> Result<NcclGroup, String> {
        let v = version_code()?;
        if v < CONFIG_VERSION as i32 {
            return Err(format!(
                "NCCL {} is older than 2.28: this benchmark needs ncclCommInitRankConfig with the 2.28 config (CTA policy, symmetric windows)",
                version()?
            ));
        }
        let mut id = nccl::ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is an out-pointer to a unique-id struct.
        check_nccl("ncclGetUniqueId", unsafe { nccl::ncclGetUniqueId(&mut id) })
            .map_err(nccl_err("ncclGetUniqueId"))?;
        let mut config = nccl::ncclConfig_t {
            size: std::mem::size_of::<nccl::ncclConfig_t>(),
            magic: API_MAGIC,
            version: CONFIG_VERSION,
            blocking: UNDEF,
            cgaClusterSize: UNDEF,
            minCTAs: UNDEF,
            maxCTAs: UNDEF,
            netName: std::ptr::null(),
            splitShare: UNDEF,
            trafficClass: UNDEF,
            commName: std::ptr::null(),
            collnetEnable: UNDEF,
            CTAPolicy: if mode == NcclMode::CopyEngine {
                CTA_POLICY_ZERO
            } else {
                UNDEF
            },
            shrinkShare: UNDEF,
            nvlsCTAs: UNDEF,
            nChannelsPerNetPeer: UNDEF,
            nvlinkCentricSched: 1,
        };
        let n = devices.len() as i32;
        let mut group = NcclGroup {
            mode,
            devices: devices.to_vec(),
            comms: vec![std::ptr::null_mut(); devices.len()],
            windows: Vec::new(),
            window_bytes,
            aborted: Arc::new(AtomicBool::new(false)),
            inside: Arc::new(AtomicBool::new(false)),
        };
        group.grouped("ncclCommInitRankConfig", |r, d, comm| {
            d.bind_to_thread().map_err(|e| e.to_string())?;
            // SAFETY: `comm` is rank r's out-pointer, `id` came from ncclGetUniqueId and
            // `config` is a fully initialised 2.28 config; rank r's device is current.
            check_nccl("ncclCommInitRankConfig", unsafe {
                nccl::ncclCommInitRankConfig(comm, n, id, r as i32, &mut config)
            })
            .map_err(nccl_err("ncclCommInitRankConfig"))
        })?;
        let window_sets = if mode.windows() { sets.max(1) } else { 0 };
        for _ in 0..window_sets {
            let first = group.windows.len();
            for d in devices {
                d.bind_to_thread().map_err(|e| e.to_string())?;
                let mut w = Window {
                    send: std::ptr::null_mut(),
                    recv: std::ptr::null_mut(),
                    send_win: std::ptr::null_mut(),
                    recv_win: std::ptr::null_mut(),
                };
                // SAFETY: out-pointers; the device is current. Freed in Drop.
                let rc = unsafe { nccl::ncclMemAlloc(&mut w.send, window_bytes) };
                // SAFETY: as above.
                let rc2 = unsafe { nccl::ncclMemAlloc(&mut w.recv, window_bytes) };
                group.windows.push(w);
                check_nccl("ncclMemAlloc", rc).map_err(nccl_err("ncclMemAlloc"))?;
                check_nccl("ncclMemAlloc", rc2).map_err(nccl_err("ncclMemAlloc"))?;
            }
            let comms = group.comms.clone();
            let wins: Vec<(*mut c_void, *mut c_void)> = group.windows[first..]
                .iter()
                .map(|w| (w.send, w.recv))
                .collect();
            let mut handles = vec![(std::ptr::null_mut(), std::ptr::null_mut()); wins.len()];
            let registered = group.grouped("ncclCommWindowRegister", |r, d, _| {
                d.bind_to_thread().map_err(|e| e.to_string())?;
                let (send, recv) = wins[r];
                let (sw, rw) = &mut handles[r];
                // SAFETY: both buffers came from ncclMemAlloc on this rank's GPU with
                // `window_bytes` bytes; the handles are out-pointers.
                let rc = unsafe {
                    nccl::ncclCommWindowRegister(
                        comms[r],
                        send,
                        window_bytes,
                        sw,
                        WIN_COLL_SYMMETRIC,
                    )
                };
                check_nccl("ncclCommWindowRegister", rc)
                    .map_err(nccl_err("ncclCommWindowRegister"))?;
                // SAFETY: as above, for the receive buffer.
                let rc = unsafe {
                    nccl::ncclCommWindowRegister(
                        comms[r],
                        recv,
                        window_bytes,
                        rw,
                        WIN_COLL_SYMMETRIC,
                    )
                };
                check_nccl("ncclCommWindowRegister", rc).map_err(nccl_err("ncclCommWindowRegister"))
            });
            for (w, (sw, rw)) in group.windows[first..].iter_mut().zip(handles) {
                w.send_win = sw;
                w.recv_win = rw;
            }
            registered?;
        }
        Ok(group)
    }

    /// Runs `f(rank, device, &mut comm)` for every rank inside one NCCL group, as NCCL needs for
    /// collective set-up calls made by one thread for several GPUs.
    fn grouped(
        &mut self,
        what: &str,
        mut f: impl FnMut(usize, &Device, *mut nccl::ncclComm_t) -> Result<(), String>,
    ) -> Result<(), String> {
        // SAFETY: plain call; it only opens a group.
        check_nccl("ncclGroupStart", unsafe { nccl::ncclGroupStart() }).map_err(nccl_err(what))?;
        let mut result = Ok(());
        for (r, d) in self.devices.iter().enumerate() {
            let comm: *mut nccl::ncclComm_t = &mut self.comms[r];
            result = f(r, d, comm);
            if result.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above (also after an error, as NCCL requires).
        let end =
            check_nccl("ncclGroupEnd", unsafe { nccl::ncclGroupEnd() }).map_err(nccl_err(what));
        result.and(end)
    }

    /// The mode.
    pub fn mode(&self) -> NcclMode {
        self.mode
    }

    /// Whether the communicators were aborted (they are gone).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn usable(&self) -> Result<(), String> {
        if self.is_aborted() {
            return Err(format!(
                "NCCL's {} communicators were aborted",
                self.mode.name()
            ));
        }
        Ok(())
    }

    /// What aborts these communicators from another thread (see [`Aborter`]).
    pub fn aborter(&self) -> Aborter {
        Aborter {
            comms: self
                .devices
                .iter()
                .cloned()
                .zip(self.comms.iter().map(|c| *c as usize))
                .collect(),
            aborted: self.aborted.clone(),
            inside: self.inside.clone(),
        }
    }

    /// The first asynchronous error NCCL reports on any rank (`ncclCommGetAsyncError`), named
    /// by rank; `Ok` while none has (`ncclInProgress` counts as none).
    pub fn async_error(&self) -> Result<(), String> {
        self.usable()?;
        for (r, comm) in self.comms.iter().enumerate() {
            let mut state = nccl::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator (not aborted, checked above); `state` is an
            // out-pointer.
            let rc = unsafe { nccl::ncclCommGetAsyncError(*comm, &mut state) };
            check_nccl("ncclCommGetAsyncError", rc).map_err(|e| format!("rank {r}: {e}"))?;
            if !matches!(
                state,
                nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress
            ) {
                let e = check_nccl("NCCL's asynchronous error", state)
                    .err()
                    .map_or_else(|| format!("{state:?}"), |e| e.to_string());
                return Err(format!("rank {r}: {e}"));
            }
        }
        Ok(())
    }

    /// Every rank's registered send and receive buffers, `window_bytes` each (window modes
    /// only). They stay allocated until this group drops.
    pub fn window_bufs(&self) -> Option<Vec<Bufs>> {
        self.window_bufs_of(0)
    }

    /// As [`window_bufs`](Self::window_bufs), of buffer set `set` (`None` if the group has no
    /// such set).
    pub fn window_bufs_of(&self, set: usize) -> Option<Vec<Bufs>> {
        let n = self.devices.len();
        let ws = self.windows.get(set * n..(set + 1) * n)?;
        (!ws.is_empty()).then(|| {
            ws.iter()
                .map(|w| Bufs {
                    send: w.send as u64,
                    recv: w.recv as u64,
                })
                .collect()
        })
    }

    /// Queues one collective on every rank, in one NCCL group. `count` follows NCCL (the
    /// per-rank send count of all-gather, the per-rank receive count of reduce-scatter, the
    /// per-peer count of all-to-all). In place, `bufs[r].send` is ignored and NCCL's in-place
    /// addresses are derived from `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn issue(
        &self,
        op: Op,
        dt: DataType,
        red: RedOp,
        root: usize,
        count: usize,
        in_place: bool,
        bufs: &[Bufs],
        streams: &[p2p_sys::cuda::CUstream],
    ) -> Result<(), String> {
        self.in_group(|r, comm| {
            let size = dt.size() as u64;
            let (send, recv) = match (in_place, op) {
                (false, _) => (bufs[r].send, bufs[r].recv),
                (true, Op::AllGather) => {
                    (bufs[r].recv + r as u64 * count as u64 * size, bufs[r].recv)
                }
                (true, Op::ReduceScatter) => {
                    (bufs[r].recv, bufs[r].recv + r as u64 * count as u64 * size)
                }
                (true, _) => (bufs[r].recv, bufs[r].recv),
            };
            let (s, d) = (send as *const c_void, recv as *mut c_void);
            let stream = streams[r] as nccl::cudaStream_t;
            // SAFETY: the caller's buffers on rank r's GPU hold what `op` reads and writes for
            // `count` (the benchmark sizes them for the largest call); the stream is rank r's.
            let rc = unsafe {
                match op {
                    Op::AllReduce => {
                        nccl::ncclAllReduce(s, d, count, dtype(dt), redop(red), comm, stream)
                    }
                    Op::Broadcast => {
                        nccl::ncclBroadcast(s, d, count, dtype(dt), root as i32, comm, stream)
                    }
                    Op::Reduce => nccl::ncclReduce(
                        s,
                        d,
                        count,
                        dtype(dt),
                        redop(red),
                        root as i32,
                        comm,
                        stream,
                    ),
                    Op::AllGather => nccl::ncclAllGather(s, d, count, dtype(dt), comm, stream),
                    Op::ReduceScatter => {
                        nccl::ncclReduceScatter(s, d, count, dtype(dt), redop(red), comm, stream)
                    }
                    Op::AllToAll => nccl::ncclAlltoAll(s, d, count, dtype(dt), comm, stream),
                }
            };
            check_nccl(op.name(), rc).map_err(|e| e.to_string())
        })
    }

    /// Queues, in one NCCL group, what `queue(r, comm)` queues on each rank `r` (its
    /// communicator `comm`): every rank's, also after an error, and the group is closed also
    /// then (as NCCL requires). The first error, if any.
    fn in_group(
        &self,
        mut queue: impl FnMut(usize, nccl::ncclComm_t) -> Result<(), String>,
    ) -> Result<(), String> {
        self.usable()?;
        let _inside = Inside::enter(&self.inside);
        // SAFETY: plain call; it only opens a group.
        check_nccl("ncclGroupStart", unsafe { nccl::ncclGroupStart() })
            .map_err(|e| e.to_string())?;
        let mut result = Ok(());
        for (r, &comm) in self.comms.iter().enumerate() {
            let queued = queue(r, comm);
            if result.is_ok() {
                result = queued;
            }
        }
        // SAFETY: closes the group opened above (also after an error, as NCCL requires).
        let end =
            check_nccl("ncclGroupEnd", unsafe { nccl::ncclGroupEnd() }).map_err(|e| e.to_string());
        result.and(end)
    }
}

impl NcclGroup {
    /// Queues, in one NCCL group, rank r's point-to-point operations `ops[r]`:
    /// `(true, to, part)` sends part `part` of its send buffer (`bytes` each) to rank `to`,
    /// `(false, from, part)` receives from rank `from` into part `part` of its receive buffer.
    pub fn issue_p2p(
        &self,
        bytes: usize,
        bufs: &[Bufs],
        streams: &[p2p_sys::cuda::CUstream],
        ops: &[Vec<(bool, usize, usize)>],
    ) -> Result<(), String> {
        self.in_group(|r, comm| {
            let stream = streams[r] as nccl::cudaStream_t;
            let mut result = Ok(());
            for &(send, peer, part) in ops.get(r).into_iter().flatten() {
                let off = (part * bytes) as u64;
                let (u8s, peer) = (nccl::ncclDataType_t::ncclUint8, peer as i32);
                // SAFETY: rank r's buffers on its GPU hold every part the pattern uses (the
                // benchmark sizes them for the largest message times the parts); the stream is
                // rank r's.
                let rc = unsafe {
                    if send {
                        let buf = (bufs[r].send + off) as *const c_void;
                        nccl::ncclSend(buf, bytes, u8s, peer, comm, stream)
                    } else {
                        let buf = (bufs[r].recv + off) as *mut c_void;
                        nccl::ncclRecv(buf, bytes, u8s, peer, comm, stream)
                    }
                };
                if result.is_ok() {
                    let what = if send { "ncclSend" } else { "ncclRecv" };
                    result = check_nccl(what, rc).map_err(|e| e.to_string());
                }
            }
            result
        })
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if self.is_aborted() {
            // The communicators are gone; their windows stay mapped for as long as this
            // process lives (peers' aborted communicators may have imported them).
            return;
        }
        let report = |what: &'static str, rc| {
            if let Err(e) = check_nccl(what, rc) {
                eprintln!("releasing NCCL ({}): {e}", self.mode.name());
            }
        };
        if !self.windows.is_empty() && self.windows.iter().all(|w| !w.send_win.is_null()) {
            // SAFETY: opens a group for the collective deregistration below.
            report("ncclGroupStart", unsafe { nccl::ncclGroupStart() });
            for (i, w) in self.windows.iter().enumerate() {
                let r = i % self.devices.len();
                let _ = self.devices[r].bind_to_thread();
                // SAFETY: each window was registered once on this communicator.
                report("ncclCommWindowDeregister", unsafe {
                    nccl::ncclCommWindowDeregister(self.comms[r], w.send_win)
                });
                // SAFETY: as above.
                report("ncclCommWindowDeregister", unsafe {
                    nccl::ncclCommWindowDeregister(self.comms[r], w.recv_win)
                });
            }
            // SAFETY: closes the group.
            report("ncclGroupEnd", unsafe { nccl::ncclGroupEnd() });
        }
        for (i, w) in self.windows.iter().enumerate() {
            let _ = self.devices[i % self.devices.len()].bind_to_thread();
            for p in [w.send, w.recv] {
                if !p.is_null() {
                    // SAFETY: allocated by ncclMemAlloc, freed once, no longer registered.
                    report("ncclMemFree", unsafe { nccl::ncclMemFree(p) });
                }
            }
        }
        for c in self.comms.iter().filter(|c| !c.is_null()) {
            // SAFETY: each handle came from ncclCommInitRankConfig and is destroyed once.
            report("ncclCommDestroy", unsafe { nccl::ncclCommDestroy(*c) });
        }
    }
}

/// Device memory seen through the [`DeviceMemory`](p2p_mem::DeviceMemory) traits for as long as
/// its owner (a [`DeviceBuffer`](p2p_mem::DeviceBuffer) or an [`NcclGroup`]'s windows) is
/// borrowed: one type for every implementation's buffers in the benchmark.
pub struct Borrowed<'a> {
    mem: p2p_mem::ExternalMemory,
    _owner: std::marker::PhantomData<&'a ()>,
}

impl<'a> Borrowed<'a> {
    /// All of `buf`.
    pub fn buffer(buf: &'a p2p_mem::DeviceBuffer<u8>) -> Borrowed<'a> {
        use p2p_mem::DeviceMemory;
        // SAFETY: `buf` is live device memory of `byte_len` bytes on its device, and stays
        // allocated while it is borrowed for 'a.
        let mem = unsafe {
            p2p_mem::ExternalMemory::from_raw(buf.device(), buf.device_ptr(), buf.byte_len())
        };
        Borrowed {
            mem,
            _owner: std::marker::PhantomData,
        }
    }

    /// Bytes `range` of this region.
    pub fn slice(&self, range: impl std::ops::RangeBounds<usize>) -> p2p_mem::Result<Borrowed<'a>> {
        Ok(Borrowed {
            mem: self.mem.slice(range)?,
            _owner: std::marker::PhantomData,
        })
    }
}

// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl p2p_mem::DeviceMemory for Borrowed<'_> {
    fn device(&self) -> &Device {
        self.mem.device()
    }
    fn device_ptr(&self) -> p2p_sys::cuda::CUdeviceptr {
        self.mem.device_ptr()
    }
    fn byte_len(&self) -> usize {
        self.mem.byte_len()
    }
}

// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl p2p_mem::DeviceMemoryMut for Borrowed<'_> {}

impl NcclGroup {
    /// Rank r's registered send and receive buffers (window modes only).
    pub fn window(&self, r: usize) -> Option<(Borrowed<'_>, Borrowed<'_>)> {
        self.window_prefix(r, self.window_bytes)
    }

    /// Rank r's registered send and receive buffers of buffer set `set`.
    pub fn window_of(&self, set: usize, r: usize) -> Option<(Borrowed<'_>, Borrowed<'_>)> {
        if r >= self.devices.len() {
            return None;
        }
        self.window_at(set * self.devices.len() + r, self.window_bytes)
    }

    /// The first `len` bytes (at most the window's) of rank r's registered send and receive
    /// buffers (window modes only).
    pub fn window_prefix(&self, r: usize, len: usize) -> Option<(Borrowed<'_>, Borrowed<'_>)> {
        if r >= self.devices.len() {
            return None;
        }
        self.window_at(r, len)
    }

    /// The first `len` bytes of window pair `i` (rank `i % n` of set `i / n`).
    fn window_at(&self, i: usize, len: usize) -> Option<(Borrowed<'_>, Borrowed<'_>)> {
        let w = self.windows.get(i)?;
        let d = &self.devices[i % self.devices.len()];
        let len = len.min(self.window_bytes);
        let view = |p: *mut c_void| Borrowed {
            // SAFETY: the buffer came from ncclMemAlloc on rank r's GPU with `window_bytes`
            // bytes (`len` is no more) and is freed only when this group drops, after the
            // borrow ends.
            mem: unsafe { p2p_mem::ExternalMemory::from_raw(d, p as u64, len) },
            _owner: std::marker::PhantomData,
        };
        Some((view(w.send), view(w.recv)))
    }
}
