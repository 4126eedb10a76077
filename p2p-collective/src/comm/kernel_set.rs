//! The collective kernels: their families, loading them once per GPU, and launching one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use p2p_mem::kernel::{Function, LaunchConfig, Module};

use crate::abi::P2pArgs;
use p2p_mem::{Device, Stream};

use crate::error::{Error, Result};
use crate::plan::{Kind, THREADS};
use crate::types::DataType;
use p2p_transport::rendezvous::Group;

use super::*;

/// The kernel families of `coll.cu`, each one entry point per type (`coll_f32`, `coll_f32_ll`,
/// ...): separate entry points give each family its own register allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// Through the scratch, step by step (`coll_<type>`).
    Steps = 0,
    /// Flags inside the data (`coll_<type>_ll`).
    Ll = 1,
    /// On registered buffers (`coll_<type>_direct`).
    Direct = 2,
    /// Broadcast and reduce split among the non-roots (`coll_<type>_split`).
    Split = 3,
    /// LL all-reduce on two ranks, its kind and world size compiled in (`coll_<type>_ll2`).
    Ll2 = 4,
    /// The copy-engine all-reduce's reduction (`coll_<type>_ce`).
    Ce = 5,
    /// The pipelined one-shot all-reduce (`coll_<type>_pipe`).
    Pipe = 6,
    /// All-gather, all-to-all and reduce-scatter through the scratch where a part or a buffer
    /// lies off a 16-byte boundary: copies that realign their words (`coll_<type>_shift`).
    Shift = 7,
}

impl Family {
    const ALL: [Family; 8] = [
        Family::Steps,
        Family::Ll,
        Family::Direct,
        Family::Split,
        Family::Ll2,
        Family::Ce,
        Family::Pipe,
        Family::Shift,
    ];

    /// The family that runs `kind` on `world` ranks; `off16`: a rank's part or a buffer of the
    /// call lies off a 16-byte boundary.
    pub(super) fn of(kind: Kind, world: usize, off16: bool) -> Family {
        if off16 && matches!(kind, Kind::AllGather | Kind::AllToAll | Kind::ReduceScatter) {
            Family::Shift
        } else if kind == Kind::AllReduceLl && world == 2 {
            Family::Ll2
        } else if kind.is_ll() {
            Family::Ll
        } else if kind == Kind::AllReduceCe {
            Family::Ce
        } else if kind == Kind::AllReducePipe {
            Family::Pipe
        } else if kind.is_direct() {
            Family::Direct
        } else if matches!(kind, Kind::BroadcastSplit | Kind::ReduceSplit) {
            Family::Split
        } else {
            Family::Steps
        }
    }

    pub(super) fn suffix(self) -> &'static str {
        match self {
            Family::Steps => "",
            Family::Ll => "_ll",
            Family::Direct => "_direct",
            Family::Split => "_split",
            Family::Ll2 => "_ll2",
            Family::Ce => "_ce",
            Family::Pipe => "_pipe",
            Family::Shift => "_shift",
        }
    }
}

/// A kernel taking the parameters `A`, and the module it is in (which launches it).
pub(crate) struct Kernel<'a, A> {
    pub(crate) module: &'a Module,
    pub(crate) function: &'a Function<A>,
}

impl<A> Clone for Kernel<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Kernel<'_, A> {}

/// The kernels of [`COLL_PARTS`] loaded on one device.
pub(crate) struct Kernels {
    /// One per part of [`COLL_PARTS`].
    pub(super) modules: Vec<Module>,
    /// `[family][type]`, in module `type`.
    pub(super) functions: [[Function<CollArgs>; 7]; 8],
    /// Send and recv (`p2p_sendrecv`), for every type, in the last module.
    pub(super) sendrecv: Function<P2pArgs>,
    /// Resident blocks per SM of `p2p_sendrecv`.
    pub(crate) sendrecv_blocks_per_sm: i32,
    /// Resident blocks per SM of the least-occupant kernel.
    pub(super) blocks_per_sm: i32,
}

/// The failure of a peer that `group` learnt of, as this rank's init reports it.
pub(super) fn init_failure(group: &Group, rank: usize) -> Option<Error> {
    group.failure().map(|f| Error::PeerFailed {
        op: "init".into(),
        failure: p2p_transport::PeerFailure {
            rank,
            peer: f.rank,
            why: f.why,
        },
    })
}

/// [`Kernels::build`] in a thread of its own, started before the rendezvous.
pub(super) struct KernelLoad {
    pub(super) device: Device,
    pub(super) done: Option<std::sync::mpsc::Receiver<Result<Arc<Kernels>>>>,
}

impl KernelLoad {
    pub(super) fn start(device: &Device) -> KernelLoad {
        let (tx, rx) = std::sync::mpsc::channel();
        let d = device.clone();
        let started = std::thread::Builder::new()
            .name("p2p-kernels".into())
            .spawn(move || {
                let _ = tx.send(Kernels::for_device(&d));
            });
        KernelLoad {
            device: device.clone(),
            // No thread: the kernels load in `wait`.
            done: started.ok().map(|_| rx),
        }
    }

    /// The kernels, once loaded; a failure of a peer that `group` learns of meanwhile ends the
    /// wait at once (the load itself, bounded work, finishes in its thread and stays in the
    /// process's cache). If the rendezvous fails, `self` is dropped unwaited: the load goes on
    /// the same way (a process that exits meanwhile exits with it under way).
    pub(super) fn wait(self, group: &Group, rank: usize) -> Result<Arc<Kernels>> {
        let Some(rx) = self.done else {
            return Kernels::for_device(&self.device);
        };
        loop {
            if let Some(e) = init_failure(group, rank) {
                return Err(e);
            }
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(kernels) => return kernels,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                // The thread ended without an answer (it panicked): load them here.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Kernels::for_device(&self.device)
                }
            }
        }
    }
}

impl Kernels {
    /// This process's kernels for `device`: loaded by the first communicator on it and kept
    /// until the process exits, shared by every later one. Unloading a module does not give all
    /// of its GPU memory back (measured on H100, driver 580: about 1 MiB per load and unload
    /// of these modules, growing with every communicator made and dropped; perf-notes §50), so
    /// they are loaded once per GPU, as NCCL and the CUDA runtime load theirs. They keep the
    /// GPU's primary context retained until the process exits; resetting that context
    /// (`cuDevicePrimaryCtxReset`, `cudaDeviceReset`) after a communicator was made is not
    /// supported.
    pub(super) fn for_device(device: &Device) -> Result<Arc<Kernels>> {
        type Slot = Arc<Mutex<Option<Arc<Kernels>>>>;
        static LOADED: Mutex<Vec<(i32, Slot)>> = Mutex::new(Vec::new());
        let slot = {
            let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
            match loaded.iter().find(|(o, _)| *o == device.ordinal()) {
                Some((_, slot)) => slot.clone(),
                None => {
                    let slot = Slot::default();
                    loaded.push((device.ordinal(), slot.clone()));
                    slot
                }
            }
        };
        // One load per GPU, also when communicators on it are made at once in several threads.
        let mut kernels = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &*kernels {
            return Ok(k.clone());
        }
        let k = Arc::new(Kernels::build(device)?);
        *kernels = Some(k.clone());
        tracing::debug!(
            device = device.ordinal(),
            "loaded the collective kernels; kept for this process's later communicators"
        );
        Ok(k)
    }

    /// Compiles [`COLL_PARTS`] for `device`'s architecture (or finds them in the kernel cache,
    /// or in this process's memo: GPUs of one architecture share one compile) and loads them,
    /// one module per part.
    pub(super) fn build(device: &Device) -> Result<Kernels> {
        let modules = Module::build_all(device, &COLL_PARTS)?;
        let missing = |what: String| Error::InvalidArgument {
            op: "init",
            rank: 0,
            what,
        };
        if modules.len() != COLL_PARTS.len() {
            return Err(missing(format!(
                "{} modules for the {} parts of the collective kernels",
                modules.len(),
                COLL_PARTS.len()
            )));
        }
        let mut functions = Vec::with_capacity(Family::ALL.len());
        let mut blocks_per_sm = i32::MAX;
        for family in Family::ALL {
            let mut row = Vec::with_capacity(DataType::ALL.len());
            for d in DataType::ALL {
                let name = format!("{}{}", d.kernel(), family.suffix());
                let f = modules[d.index()].function(&name)?;
                blocks_per_sm = blocks_per_sm.min(f.max_blocks_per_sm(THREADS)?);
                row.push(f);
            }
            functions.push(row);
        }
        let functions = functions
            .into_iter()
            .map(<[Function<CollArgs>; 7]>::try_from)
            .collect::<std::result::Result<Vec<_>, _>>()
            .ok()
            .and_then(|rows| <[[Function<CollArgs>; 7]; 8]>::try_from(rows).ok())
            .ok_or_else(|| missing("the collective module is missing kernels".into()))?;
        let sendrecv = modules[crate::abi::COLL_PART_P2P].function("p2p_sendrecv")?;
        let sendrecv_blocks_per_sm = sendrecv.max_blocks_per_sm(THREADS)?;
        Ok(Kernels {
            modules,
            functions,
            sendrecv,
            sendrecv_blocks_per_sm,
            blocks_per_sm,
        })
    }

    /// The kernel of `family` for `dtype` ([`Family::of`] picks the family).
    pub(super) fn function(&self, family: Family, dtype: DataType) -> Kernel<'_, CollArgs> {
        Kernel {
            module: &self.modules[dtype.index()],
            function: &self.functions[family as usize][dtype.index()],
        }
    }

    /// `p2p_sendrecv`.
    pub(crate) fn sendrecv(&self) -> Kernel<'_, P2pArgs> {
        Kernel {
            module: &self.modules[crate::abi::COLL_PART_P2P],
            function: &self.sendrecv,
        }
    }
}

impl Communicator {
    /// Launches one collective kernel on `stream`: overlapped with the previous kernel on the
    /// stream (programmatic dependent launch), unless ranks share this GPU. There a kernel
    /// scheduled early would hold SM slots, waiting for its predecessor, that a peer rank's
    /// kernel on the same GPU needs to start: the predecessor waits for that peer, and the
    /// three would stall until the time limit (seen on one H100 with two ranks).
    #[allow(unsafe_code)]
    pub(super) fn launch(
        &self,
        Kernel { module, function }: Kernel<'_, CollArgs>,
        (grid, threads): (u32, u32),
        args: &CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        // Overlapping a kernel on a GPU that ranks share stalls them (see above).
        let config = LaunchConfig::new(grid, threads).overlapped(self.share <= 1);
        // SAFETY: `CollArgs` matches the kernel's one by-value parameter field for field. Its
        // pointers are this call's validated buffers (lengths checked against the plan), the
        // workspaces of every rank (alive while this communicator is, which synchronises
        // before freeing them) and the pinned abort flag (held by `self.abort`). The kernel
        // runs `griddepcontrol.wait` before touching any memory, as an overlapped launch
        // requires (and which a plain launch makes a no-op).
        unsafe { module.launch(function, config, args, stream) }?;
        Ok(())
    }
}
