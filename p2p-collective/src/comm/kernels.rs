//! The collective program (`kernels/`: the interface header, `coll/` and its algorithms and
//! protocols), its parts, and its kernels loaded once per GPU.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use p2p_mem::kernel::{Function, Module, Source};
use p2p_mem::Device;
use p2p_transport::rendezvous::Group;

use crate::abi::{CollArgs, P2pArgs};
use crate::error::{Error, Result};
use crate::plan::{Entry, THREADS};
use crate::types::DataType;

/// The collective kernels (`coll_<type>_<entry>`, [`Entry`]) and the send/recv kernel
/// (`p2p_sendrecv`), in one program: every header of `src/kernels/coll/algo/` and
/// `src/kernels/coll/proto/` and `coll/p2p.cuh`, with what they include, flattened by
/// build.rs (`p2p_abigen::program`) into the one text NVRTC compiles. A new kernel file there
/// joins the program by itself.
pub const COLL: Source = Source {
    name: "coll.cu",
    code: include_str!(concat!(env!("OUT_DIR"), "/coll.cu")),
    defines: &[],
    shipped: SHIPPED,
};

/// [`COLL_PARTS`] compiled for sm_80 and sm_90 (`cargo xtask kernels`; see
/// `p2p_mem::kernel::shipped`): a communicator needs no compiler on those GPUs.
pub const SHIPPED: &[u8] = include_bytes!("../kernels/shipped.p2pk.zst");

/// [`COLL`] as the parts a communicator compiles, in parallel and cached each on its own: part
/// `k` < 7 holds the kernels of `DataType::ALL[k]`, the last part `p2p_sendrecv`. Compiled
/// whole, NVRTC takes about a minute on one thread; in parts on 16 cores, 8-11 s
/// (docs/performance.md, "The first compile and the kernel cache").
pub const COLL_PARTS: [Source; crate::abi::COLL_PARTS] = {
    const DEFINES: [&[&str]; 8] = [
        &["COLL_PART=0"],
        &["COLL_PART=1"],
        &["COLL_PART=2"],
        &["COLL_PART=3"],
        &["COLL_PART=4"],
        &["COLL_PART=5"],
        &["COLL_PART=6"],
        &["COLL_PART=7"],
    ];
    let mut parts = [COLL; crate::abi::COLL_PARTS];
    let mut k = 0;
    while k < parts.len() {
        parts[k].defines = DEFINES[k];
        k += 1;
    }
    parts
};
const _: () = assert!(crate::abi::COLL_PART_P2P == crate::abi::COLL_PARTS - 1);
const _: () = assert!(crate::abi::COLL_TYPES == DataType::ALL.len());

/// Bytes of the one argument block that every collective kernel launch passes by value (the
/// `CollArgs` of `coll_abi.h`): what the driver copies into each launch. For host-cost
/// experiments (`p2p-bench host` launches an empty kernel with a block of this size).
pub const KERNEL_ARGS_BYTES: usize = std::mem::size_of::<CollArgs>();

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
    modules: Vec<Module>,
    /// `[entry][type]` ([`Entry::index`], [`DataType::ALL`]), in module `type`.
    functions: Vec<Vec<Function<CollArgs>>>,
    /// Send and recv (`p2p_sendrecv`), for every type, in the last module.
    sendrecv: Function<P2pArgs>,
    /// Resident blocks per SM of `p2p_sendrecv`.
    pub(crate) sendrecv_blocks_per_sm: i32,
    /// Resident blocks per SM of the least-occupant kernel.
    pub(crate) blocks_per_sm: i32,
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
    device: Device,
    done: Option<std::sync::mpsc::Receiver<Result<Arc<Kernels>>>>,
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
    /// of these modules, growing with every communicator made and dropped; docs/performance.md,
    /// "Module loads and held memory"), so they are loaded once per GPU, as NCCL and the CUDA
    /// runtime load theirs. They keep the GPU's primary context retained until the process
    /// exits; resetting that context (`cuDevicePrimaryCtxReset`, `cudaDeviceReset`) after a
    /// communicator was made is not supported.
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
    /// one module per part, and every entry point of every type ([`Entry::all`]).
    fn build(device: &Device) -> Result<Kernels> {
        let modules = Module::build_all(device, &COLL_PARTS)?;
        if modules.len() != COLL_PARTS.len() {
            return Err(Error::InvalidArgument {
                op: "init",
                rank: 0,
                what: format!(
                    "{} modules for the {} parts of the collective kernels",
                    modules.len(),
                    COLL_PARTS.len()
                ),
            });
        }
        let mut functions = Vec::with_capacity(Entry::COUNT);
        let mut blocks_per_sm = i32::MAX;
        for entry in Entry::all() {
            let mut row = Vec::with_capacity(DataType::ALL.len());
            for d in DataType::ALL {
                let f = modules[d.index()].function(&kernel_name(entry, d))?;
                blocks_per_sm = blocks_per_sm.min(f.max_blocks_per_sm(THREADS)?);
                row.push(f);
            }
            functions.push(row);
        }
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

    /// The kernel of `entry` for `dtype`.
    pub(crate) fn function(&self, entry: Entry, dtype: DataType) -> Kernel<'_, CollArgs> {
        Kernel {
            module: &self.modules[dtype.index()],
            function: &self.functions[entry.index()][dtype.index()],
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

/// The name of the kernel of `entry` for `dtype`: `coll_<type>_<entry>` (`kernels/coll/entry.cuh`).
pub fn kernel_name(entry: Entry, dtype: DataType) -> String {
    format!("{}_{}", dtype.kernel(), entry.name())
}
