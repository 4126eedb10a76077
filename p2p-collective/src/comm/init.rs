//! Making communicators: in one process for several GPUs, or one process per GPU through the
//! rendezvous; and the checks and logs of init.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use p2p_mem::abort::AbortHandle;
use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
use p2p_mem::kernel as kernel_cache;
use p2p_mem::{Device, DeviceMemory};
use p2p_transport::config::Config;
use p2p_transport::peer::{self, LocalRegion, PairP2p, Sharing};
use p2p_transport::rendezvous::{Group, Rendezvous};

use crate::error::{Error, Result};
use crate::exchange::{decode_proposal, encode_proposal, Introduction};
use crate::plan::{Forced, Planner, Tuning, MAX_RANKS, THREADS};

use super::kernels::{init_failure, KernelLoad, Kernels, COLL_PARTS};
use super::workspace::{workspace_bytes, PeerMemory};
use super::{check_world, Communicator, Health, Job, Launcher, Options, Windows, Workspace};

impl Communicator {
    /// Compiles the collective kernels for `arch` (`"sm_90"` for H100 and H200, `"sm_80"` for
    /// A100; [`p2p_mem::kernel::arch_for`] names a device's) into the on-disk kernel cache
    /// ([`p2p_mem::kernel::cache_dir`]), with no GPU: it needs libnvrtc only. Run where the
    /// program will run (the same cache folder and the same NVRTC, which is part of the key),
    /// e.g. in a container's build step, and the first communicator there finds the kernels
    /// cached instead of compiling them (about 10 s on 16 cores: docs/performance.md, "The
    /// first compile and the kernel cache"). What is cached already is not compiled again. Returns how many of the
    /// [`COLL_PARTS`] it compiled (0: all were cached); an error where they are not all in the
    /// cache afterwards (no cache folder, or one that cannot be written). `p2p-bench kernels`
    /// runs it.
    ///
    /// ```no_run
    /// let compiled = p2p_collective::Communicator::precompile("sm_90")?;
    /// # Ok::<(), p2p_collective::Error>(())
    /// ```
    pub fn precompile(arch: &str) -> Result<usize> {
        Ok(kernel_cache::cache_all(&COLL_PARTS, arch)?)
    }

    /// One communicator per GPU in `devices`, all in this process (like `ncclCommInitAll`):
    /// rank r is `devices[r]`. Options come from the `P2P_*` environment.
    ///
    /// Where every pair of GPUs has direct P2P the ranks reach each other's workspaces by plain
    /// pointer (peer access); where a pair has none, or with `P2P_DISABLE=1`, every workspace
    /// lives in pinned host memory instead (host-staged: correct, and slower). The choice and
    /// its reason are logged; [`sharing`](Self::sharing) says which.
    ///
    /// ```no_run
    /// use p2p_collective::{Collectives, Communicator, DataType, RedOp};
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Stream};
    /// let gpus = Device::all()?;
    /// let comms = Communicator::init_all(&gpus)?;
    /// let streams = gpus.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let mut bufs = gpus
    ///     .iter()
    ///     .map(|g| DeviceBuffer::from_host(g, &[1.0f32; 1024]))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// // Calls never block the host: issue every rank's from one thread, or one thread each.
    /// for ((comm, buf), stream) in comms.iter().zip(&mut bufs).zip(&streams) {
    ///     comm.all_reduce_in_place(buf, 1024, DataType::F32, RedOp::Sum, stream)?;
    /// }
    /// for (comm, stream) in comms.iter().zip(&streams) {
    ///     comm.synchronize(stream)?;
    /// }
    /// assert_eq!(bufs[0].to_host_vec::<f32>()?[0], gpus.len() as f32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn init_all(devices: &[Device]) -> Result<Vec<Communicator>> {
        Self::init_all_with(devices, Options::from_env()?)
    }

    /// As [`init_all`](Self::init_all), with explicit options.
    pub fn init_all_with(devices: &[Device], options: Options) -> Result<Vec<Communicator>> {
        let world = devices.len();
        check_world(world)?;
        let mut pairs = Vec::new();
        for a in devices {
            // Ranks on one GPU reach each other's memory without P2P: only pairs of GPUs.
            for b in devices.iter().filter(|b| *b != a) {
                pairs.push(PairP2p::probe(a, b)?);
            }
        }
        let uuids: Vec<[u8; 16]> = devices.iter().map(|d| *d.uuid()).collect();
        let share = warn_shared_gpus(&uuids, |r| Some(devices[r].ordinal()));
        if let Some(advice) = (share > 1).then(few_queues).flatten() {
            p2p_transport::warn_user!("{advice}");
        }
        peer::limit_to_level(&options.transport, &mut pairs)?;
        warn_unused_settings(&options.transport, true);
        let (sharing, why) = peer::choose(&options.transport, true, &pairs);
        if sharing == Sharing::Pointer {
            for (i, a) in devices.iter().enumerate() {
                for b in devices.iter().filter(|b| *b != a) {
                    a.enable_peer_access(b).map_err(|e| Error::InvalidArgument {
                        op: "init_all",
                        rank: i,
                        what: format!(
                            "GPU {} cannot enable peer access to GPU {} ({e}); P2P_DISABLE=1 runs the collectives through host memory instead (see `p2p-bench doctor`)",
                            a.ordinal(),
                            b.ordinal()
                        ),
                    })?;
                }
            }
        }
        let mut loaded = Vec::with_capacity(world);
        for d in devices {
            loaded.push(Kernels::for_device(d)?);
        }
        let sms = devices.iter().map(|d| d.sm_count()).min().unwrap_or(1);
        let per_sm = loaded.iter().map(|k| k.blocks_per_sm).min().unwrap_or(1);
        let tuning = options.tuning.unwrap_or_else(|| {
            warn_occupancy(per_sm);
            Tuning::for_device(sms, per_sm)
        });
        check_tuning(&tuning, sms, per_sm, world, 0, options.timeout)?;
        let tuning = tuning.shared_by(share);
        let bytes = workspace_bytes(world, &tuning);
        log_tuning(&tuning, bytes);
        let mut workspaces = Vec::with_capacity(world);
        for d in devices {
            workspaces.push(Arc::new(LocalRegion::allocate(d, bytes, sharing)?));
        }
        let abort = AbortHandle::new(&devices[0])?;
        let mut bases = [0u64; MAX_RANKS];
        for (r, w) in workspaces.iter().enumerate() {
            // Device pointers with peer access, or pinned host memory: both are UVA addresses
            // that every GPU of the process reaches.
            bases[r] = w.device_ptr();
        }
        log_sharing(
            devices
                .iter()
                .enumerate()
                .map(|(r, d)| format!("{r}[GPU {}]", d.ordinal()))
                .collect(),
            sharing,
            &why,
        );
        let mut comms = Vec::with_capacity(world);
        for (r, d) in devices.iter().enumerate() {
            let peers = workspaces
                .iter()
                .enumerate()
                .filter(|(p, _)| *p != r)
                .map(|(_, w)| PeerMemory::Local(w.clone()))
                .collect();
            comms.push(Communicator {
                rank: r,
                world,
                device: d.clone(),
                planner: Planner::new(world, options.forced, options.check, tuning),
                options: options.clone(),
                share,
                sharing,
                health: Health::new(abort.clone()),
                launcher: Launcher::new(d, loaded[r].clone(), share)?,
                windows: Windows::new(d)?,
                job: None,
                workspace: Workspace::new(bases, workspaces[r].clone(), peers),
            });
        }
        Ok(comms)
    }

    /// This process's rank of a communicator with one process per GPU, from the environment
    /// `p2p-bench launch` (and torchrun) set: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, the job's
    /// identity and secret (see [`Rendezvous::from_vars`]); the GPU is `LOCAL_RANK` (or the only
    /// visible one). A peer that dies later is reported by every call as
    /// [`Error::PeerFailed`] or [`Error::Unusable`], naming it.
    ///
    /// ```no_run
    /// // Run as `p2p-bench launch -n 2 -- ./my-program`.
    /// use p2p_collective::{Collectives, Communicator, DataType, RedOp};
    /// use p2p_mem::{DeviceBuffer, Stream};
    /// let comm = Communicator::from_env()?;
    /// let stream = Stream::new(comm.device())?;
    /// let mut buf = DeviceBuffer::from_host(comm.device(), &[comm.rank() as f32; 256])?;
    /// comm.all_reduce_in_place(&mut buf, 256, DataType::F32, RedOp::Max, &stream)?;
    /// comm.synchronize(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_env() -> Result<Communicator> {
        let rv = Rendezvous::from_env()?;
        let device = local_device(rv.rank, rv.local_rank)?;
        Self::init(&device, &rv, Options::from_env()?)
    }

    /// Joins the communicator described by `rv` with `device` as this rank's GPU. Returns once
    /// every rank has joined and mapped every other rank's workspace.
    ///
    /// The ranks share their workspaces as the peer layer chooses
    /// ([`p2p_transport::peer::choose`]): cuMem fds passed over Unix sockets by default, legacy
    /// IPC with `P2P_CUMEM=0`, pinned host memory with `P2P_DISABLE=1` or where a pair of GPUs
    /// has no P2P. Every rank proposes; the weakest proposal wins, so all ranks agree.
    pub fn init(device: &Device, rv: &Rendezvous, options: Options) -> Result<Communicator> {
        // A peer's death found by the group (in its exchanges or barriers) is this layer's
        // PeerFailed, like a death found anywhere else in init.
        Self::init_in_job(device, rv, options).map_err(|e| e.peer_failure_in("init"))
    }

    pub(super) fn init_in_job(
        device: &Device,
        rv: &Rendezvous,
        options: Options,
    ) -> Result<Communicator> {
        check_world(rv.world)?;
        let rank = rv.rank;
        // Join the job first: from then on a peer's death anywhere in init (or later) is
        // found at once through the group, not by a time limit.
        let abort = AbortHandle::new(device)?;
        // The kernels load (tens of milliseconds) while the ranks meet, so that a peer's death
        // during the load is found within a millisecond, not after it.
        let loading = KernelLoad::start(device);
        let group = Group::join(rv)?;
        group.watch(&abort);
        let kernels = loading.wait(&group, rank)?;
        let tuning = options.tuning.unwrap_or_else(|| {
            warn_occupancy(kernels.blocks_per_sm);
            Tuning::for_device(device.sm_count(), kernels.blocks_per_sm)
        });
        check_tuning(
            &tuning,
            device.sm_count(),
            kernels.blocks_per_sm,
            rv.world,
            rank,
            options.timeout,
        )?;
        // Workspace handles travel over Unix sockets (fds need them): one listener per rank in a
        // private directory, its path in the group's first exchange.
        let dir = PrivateDir::new("coll")?;
        let listener = FdListener::bind(&dir.path().join("ws"))?;
        let host = p2p_transport::rendezvous::host_id();
        let path = listener.path().to_string_lossy().into_owned();
        let planner = planner_words(&options);
        let blob = Introduction {
            host: host.clone(),
            path,
            uuid: *device.uuid(),
            tuning: tuning.to_words(),
            planner,
        }
        .encode();
        let all = group.all_gather(&blob)?;
        let fail = |why: String| Error::Bootstrap { rank, why };
        let mut paths = Vec::with_capacity(rv.world);
        let mut pairs = Vec::new();
        let mut uuids = Vec::with_capacity(rv.world);
        for (r, b) in all.iter().enumerate() {
            let Introduction {
                host: their_host,
                path: their_path,
                uuid,
                tuning: theirs,
                planner: their_planner,
            } = Introduction::decode(b)
                .ok_or_else(|| fail(format!("rank {r} sent a malformed introduction")))?;
            if their_planner != planner {
                return Err(fail(format!(
                    "rank {r} plans with {}, this rank with {}: every rank needs the same P2P_ALGO, P2P_PROTO and P2P_CHECK (Options::forced, Options::check), or ranks run different kernels for one call",
                    describe_planner_words(their_planner),
                    describe_planner_words(planner)
                )));
            }
            if theirs[..] != tuning.to_words()[..] {
                return Err(fail(format!(
                    "rank {r} plans with tuning {}, this rank with {tuning:?}: every rank needs the same GPU model and tuning",
                    Tuning::from_words(&theirs).map_or_else(|| format!("{theirs:?}"), |t| format!("{t:?}"))
                )));
            }
            if their_host != host {
                return Err(fail(format!(
                    "rank {r} runs on host {their_host:?}, this rank on {host:?}: process-per-GPU communicators need every rank on one host"
                )));
            }
            // Ranks on this rank's GPU reach its memory without P2P: only other GPUs are probed.
            if &uuid != device.uuid() {
                pairs.push(PairP2p::probe_uuid(device, &uuid)?);
            }
            uuids.push(uuid);
            paths.push(std::path::PathBuf::from(their_path));
        }
        // Every rank sees every UUID, so all divide the same tuning by the same share.
        let share = warn_shared_gpus(&uuids, |r| (r == rank).then(|| device.ordinal()));
        let tuning = tuning.shared_by(share);
        let bytes = workspace_bytes(rv.world, &tuning);
        log_tuning(&tuning, bytes);
        // Every rank proposes a sharing from its own view; the weakest wins everywhere.
        peer::limit_to_level(&options.transport, &mut pairs)?;
        if rank == 0 {
            warn_unused_settings(&options.transport, false);
        }
        let (mine, why) = peer::choose(&options.transport, false, &pairs);
        let proposals = group.all_gather(&encode_proposal(mine.code() as u16, &why))?;
        let (mut sharing, mut reason) = (mine, why);
        for (r, p) in proposals.iter().enumerate() {
            let (code, text) = decode_proposal(p)
                .ok_or_else(|| fail(format!("rank {r} sent a malformed proposal")))?;
            let theirs = u8::try_from(code)
                .ok()
                .and_then(Sharing::from_code)
                .ok_or_else(|| fail(format!("rank {r} proposed an unknown sharing")))?;
            if theirs.weaker(sharing) != sharing {
                sharing = theirs;
                reason = format!("rank {r}: {text}");
            }
        }
        let workspace = Arc::new(LocalRegion::allocate(device, bytes, sharing)?);
        let exported = workspace.export()?;
        // Send to every peer first (a connect completes in the listener's backlog), then take
        // every peer's: no rank waits on another in a cycle.
        let mut sent = Vec::with_capacity(rv.world);
        for (q, p) in paths.iter().enumerate() {
            if q != rank {
                let chan = FdChannel::connect(p).map_err(|e| {
                    fail(format!(
                        "connecting to rank {q}'s socket {}: {e}",
                        p.display()
                    ))
                })?;
                // Only rank q's process may receive this rank's memory: the socket's listener
                // (its pid, from the kernel) must be the process that authenticated as rank q
                // at the rendezvous, not one of the same user that put its own socket there.
                let (listener_pid, _) = chan.peer_cred().map_err(|e| {
                    fail(format!(
                        "reading who holds rank {q}'s socket {}: {e}",
                        p.display()
                    ))
                })?;
                listener_is_rank(q, listener_pid, group.pids()[q], p).map_err(fail)?;
                peer::send(&chan, rank, &exported)?;
                sent.push(chan);
            }
        }
        let mut bases = [0u64; MAX_RANKS];
        bases[rank] = workspace.device_ptr();
        let mut peers = Vec::new();
        let deadline = Instant::now() + options.timeout.max(Duration::from_secs(10));
        while peers.len() + 1 < rv.world {
            // Wait in short steps, so that a peer's death ends the wait at once.
            let chan = loop {
                if let Some(e) = init_failure(&group, rank) {
                    return Err(e);
                }
                if let Some(c) = listener
                    .accept_within(Duration::from_millis(5))
                    .map_err(|e| fail(format!("waiting for the peers' workspaces: {e}")))?
                {
                    break c;
                }
                if Instant::now() > deadline {
                    return Err(fail(
                        "the peers' workspaces did not arrive in time (are all ranks alive?)"
                            .into(),
                    ));
                }
            };
            // Only the job's ranks may hand this rank memory: the sender's pid (from the kernel)
            // must be the one that rank authenticated with at the rendezvous. A stranger's
            // connection is dropped, and the wait goes on.
            let pid = chan.peer_cred().map(|c| c.0).unwrap_or(0);
            let Some(r) =
                (0..rv.world).find(|&r| group.pids()[r] == pid && r != rank && bases[r] == 0)
            else {
                tracing::warn!(
                    rank,
                    "dropped a connection to this rank's workspace socket from pid {pid}, which is not a peer of this job"
                );
                continue;
            };
            let (from, e) = match peer::recv(&chan, sharing) {
                Ok(x) => x,
                Err(e) => return Err(fail(format!("rank {r}'s workspace: {e}"))),
            };
            if from != r {
                return Err(fail(format!(
                    "rank {r} (pid {pid}) sent its workspace under another rank's name"
                )));
            }
            let imported = peer::import(device, sharing, r, e)?;
            bases[r] = imported.device_ptr();
            peers.push(PeerMemory::Imported(imported));
        }
        log_sharing(
            vec![format!("{rank}[GPU {}]", device.ordinal())],
            sharing,
            &reason,
        );
        // Made before the barrier: a failure here stops this rank before its peers finish init.
        let launcher = Launcher::new(device, kernels, share)?;
        let windows = Windows::new(device)?;
        // Every rank has mapped every workspace before anyone's kernels write into them.
        group.barrier()?;
        drop(sent);
        Ok(Communicator {
            rank,
            world: rv.world,
            device: device.clone(),
            planner: Planner::new(rv.world, options.forced, options.check, tuning),
            options,
            share,
            sharing,
            health: Health::new(abort),
            launcher,
            windows,
            job: Some(Job {
                group,
                rendezvous: rv.clone(),
                splits: AtomicU64::new(0),
            }),
            workspace: Workspace::new(bases, workspace, peers),
        })
    }
}

/// The settings besides the tuning that the planner reads, as the words that ranks of a
/// process-per-GPU communicator compare at start-up: what is forced (`P2P_ALGO`, `P2P_PROTO`:
/// each one more than its place in `Algo::ALL` / `Proto::ALL`, 0 for `auto`) and checking mode
/// (`P2P_CHECK`), which turns LL and the copy engines off.
pub(super) fn planner_words(options: &Options) -> [u64; 2] {
    let Forced { algo, proto } = options.forced;
    let algo = algo.map_or(0, |a| a.index() as u64 + 1);
    let proto = proto.map_or(0, |p| p.index() as u64 + 1);
    [algo | proto << 8, options.check as u64]
}

/// `planner_words` in words, e.g. `P2P_ALGO=ring P2P_PROTO=auto P2P_CHECK=0`.
pub(super) fn describe_planner_words([forced, check]: [u64; 2]) -> String {
    let pick = |code: u64, names: &[&'static str]| match code {
        0 => "auto",
        c => usize::try_from(c - 1)
            .ok()
            .and_then(|i| names.get(i).copied())
            .unwrap_or("(unknown)"),
    };
    let algos = crate::plan::Algo::ALL.map(|a| a.name());
    let protos = crate::plan::Proto::ALL.map(|p| p.name());
    format!(
        "P2P_ALGO={} P2P_PROTO={} P2P_CHECK={check}",
        pick(forced & 0xff, &algos),
        pick(forced >> 8 & 0xff, &protos)
    )
}

/// Refuses tuning values the kernels cannot run with (see [`Tuning::validate`]).
pub(super) fn check_tuning(
    t: &Tuning,
    sms: i32,
    per_sm: i32,
    world: usize,
    rank: usize,
    timeout: Duration,
) -> Result<()> {
    if timeout.is_zero() || timeout > crate::settings::MAX_TIMEOUT {
        return Err(Error::InvalidArgument {
            op: "init",
            rank,
            what: format!(
                "Options::timeout = {timeout:?}: it must be above zero and at most {:?}",
                crate::settings::MAX_TIMEOUT
            ),
        });
    }
    let resident = (sms.max(1) as u32).saturating_mul(per_sm.max(1) as u32);
    t.validate(resident, world)
        .map_err(|what| Error::InvalidArgument {
            op: "init",
            rank,
            what: format!("Options::tuning: {what}"),
        })
}

/// The most ranks on any one GPU, from every rank's GPU UUID.
pub(super) fn most_ranks_on_one_gpu(uuids: &[[u8; 16]]) -> usize {
    uuids
        .iter()
        .map(|u| uuids.iter().filter(|v| *v == u).count())
        .max()
        .unwrap_or(1)
}

/// Where ranks share a GPU, says so (which ranks, on which GPU, and what it costs) and returns
/// the most ranks on one GPU. `ordinal(r)` is rank r's GPU as this process numbers it, or
/// `None` for a rank of another process: a group of ranks is named by its first rank this
/// process drives.
pub(super) fn warn_shared_gpus(
    uuids: &[[u8; 16]],
    ordinal: impl Fn(usize) -> Option<i32>,
) -> usize {
    let share = most_ranks_on_one_gpu(uuids);
    let mut named = Vec::new();
    for (r, u) in uuids.iter().enumerate() {
        let ranks: Vec<usize> = (0..uuids.len()).filter(|&q| uuids[q] == *u).collect();
        let Some(gpu) = ordinal(r) else { continue };
        if ranks.len() > 1 && !named.contains(u) {
            named.push(*u);
            p2p_transport::warn_user!(
                "ranks {ranks:?} share GPU {gpu}: their kernels run side by side (one process) or \
                 time-sliced (one process each), each rank with 1/{share} of the GPU's blocks; \
                 correct but slow, meant for development on fewer GPUs than ranks"
            );
        }
    }
    share
}

/// Ranks of one process that share a GPU need a hardware queue per stream; [`queue_advice`]
/// for this process's `CUDA_DEVICE_MAX_CONNECTIONS`.
pub(super) fn few_queues() -> Option<String> {
    queue_advice(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().as_deref())
}

/// What to do where `CUDA_DEVICE_MAX_CONNECTIONS` (`None`: unset) is below 32: with CUDA's
/// default of 8 hardware queues two ranks' streams can land on one, and a rank's kernel then
/// waits behind another rank's waiting kernel until the time limit.
pub(super) fn queue_advice(value: Option<&str>) -> Option<String> {
    let queues = value
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(8);
    (queues < 32).then(|| {
        format!(
            "ranks of this process share a GPU and CUDA_DEVICE_MAX_CONNECTIONS is {}: a rank's kernel can queue behind another rank's waiting one until the time limit; set it to 32 before the first CUDA call",
            value.map_or("unset (8 queues)".to_string(), |v| format!("{v:?}"))
        )
    })
}

/// The planner assumes two resident blocks per SM; fewer halves every grid (and large
/// collectives lose up to 20 %), so say so where it happens.
pub(super) fn warn_occupancy(blocks_per_sm: i32) {
    if blocks_per_sm < 2 {
        p2p_transport::warn_user!(
            "collective kernels fit {blocks_per_sm} block(s) of {THREADS} threads per SM, not 2: grids are halved and large collectives run slower"
        );
    }
}

/// Logs how the ranks `who` (each as `rank[GPU ordinal]`) reach their peers, and why.
pub(super) fn log_sharing(who: Vec<String>, sharing: Sharing, why: &str) {
    tracing::info!(
        "ranks {} reach every peer via {} ({why})",
        who.join(", "),
        sharing.name()
    );
}

pub(super) fn log_tuning(t: &Tuning, workspace: usize) {
    tracing::info!(
        "collectives plan with up to {} blocks x {} threads, {} KiB pieces; workspace {} MiB per rank",
        t.max_blocks,
        THREADS,
        t.piece_bytes >> 10,
        workspace >> 20
    );
}

/// Transport settings that the collectives do not use, each with why: a user who sets one
/// expecting it to change the collectives is told so (once per communicator, by rank 0) instead
/// of being ignored silently.
pub(super) fn unused_settings(cfg: &Config, one_process: bool) -> Vec<String> {
    use p2p_transport::config::{ForcedMode, Switch};
    let mut out = Vec::new();
    if cfg.read != Switch::Auto {
        let v = if cfg.read == Switch::On { "on" } else { "off" };
        out.push(format!("P2P_READ={v} (the collective kernels read and write peer memory as each algorithm needs)"));
    }
    if cfg.use_copy_engine {
        out.push("P2P_USE_COPY_ENGINE=1 (the collectives move data with their own kernels; the copy engines only for large all-gathers and all-to-alls on registered buffers, Tuning::ce_min_bytes and ce_min_bytes_more_ranks)".into());
    }
    if !cfg.intermediate {
        out.push("P2P_INTERMEDIATE=0 (the collectives never relay through a third GPU)".into());
    }
    match cfg.force_mode {
        Some(ForcedMode::Intermediate) => out.push(
            "P2P_MODE=intermediate (the collectives never relay through a third GPU; without P2P they go host-staged)".into(),
        ),
        Some(ForcedMode::Direct) if !one_process => out.push(
            "P2P_MODE=direct (ranks in different processes share memory with cuMem fds or legacy IPC)".into(),
        ),
        Some(m @ (ForcedMode::Ipc | ForcedMode::CuMem)) if one_process => out.push(format!(
            "P2P_MODE={} (one process shares plain pointers: IPC handles cannot be opened in the process that made them)",
            if m == ForcedMode::Ipc { "ipc" } else { "cumem" }
        )),
        _ => {}
    }
    if cfg.direct_disable && one_process {
        out.push("P2P_DIRECT_DISABLE=1 (one process shares plain pointers: IPC handles cannot be opened in the process that made them)".into());
    }
    out
}

pub(super) fn warn_unused_settings(cfg: &Config, one_process: bool) {
    for what in unused_settings(cfg, one_process) {
        p2p_transport::warn_user!("not used by the collectives: {what}");
    }
}

/// The GPU of rank `rank`, `local_rank` on its host: GPU `local_rank`, or GPU 0 where a launcher
/// gave the process one GPU (`CUDA_VISIBLE_DEVICES`).
pub(crate) fn local_device(rank: usize, local_rank: usize) -> Result<Device> {
    let visible = Device::count()? as usize;
    let ordinal = if visible == 1 { 0 } else { local_rank };
    if ordinal >= visible {
        return Err(Error::Bootstrap {
            rank,
            why: format!(
                "LOCAL_RANK={local_rank} but this process sees {visible} GPU(s): start at most one rank per GPU"
            ),
        });
    }
    Ok(Device::new(ordinal as i32)?)
}

/// Whether the process listening on rank `q`'s workspace socket `path` (`listener_pid`) is rank
/// q's (`rank_pid`, as the rendezvous authenticated it); if not, why this rank refuses to send
/// it its memory.
fn listener_is_rank(
    q: usize,
    listener_pid: u32,
    rank_pid: u32,
    path: &std::path::Path,
) -> std::result::Result<(), String> {
    if listener_pid == rank_pid {
        return Ok(());
    }
    Err(format!(
        "rank {q}'s socket {} is held by pid {listener_pid}, not by rank {q}'s process (pid \
         {rank_pid}): this rank's memory is not sent to it; another process of this user replaced \
         the socket, or rank {q} restarted",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_goes_only_to_the_process_that_authenticated_as_the_rank() {
        let path = std::path::Path::new("/run/p2p/ws-1");
        assert_eq!(listener_is_rank(1, 4242, 4242, path), Ok(()));
        let why = listener_is_rank(1, 999, 4242, path).expect_err("a stranger's socket");
        assert!(
            why.contains("held by pid 999") && why.contains("(pid 4242)") && why.contains("ws-1"),
            "{why}"
        );
    }
}
