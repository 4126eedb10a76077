//! Registered buffers (symmetric windows): registering, where a call's buffers lie in them,
//! and deregistering with a deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Instant;

use p2p_mem::{check_peer_mappable, Device, DeviceMemory, Stream};

use p2p_transport::peer::{self, PeerRegion, Sharing};

use crate::error::{Error, Result};
use crate::exchange;
use crate::plan::MAX_RANKS;

use super::{Communicator, SYNC_GRACE};

/// A communicator's registered buffers, and what deregistering must wait for.
pub(crate) struct Windows {
    table: RwLock<Vec<Window>>,
    /// Where the last call that used a window ends.
    pub(crate) calls: WindowCalls,
}

impl Windows {
    pub(crate) fn new(device: &Device) -> Result<Windows> {
        Ok(Windows {
            table: RwLock::new(Vec::new()),
            calls: WindowCalls::new(device)?,
        })
    }

    /// Every rank's address, on `world` ranks, of each of `ranges` (`(ptr, bytes)`) that lies in
    /// one registered buffer (at the same offset on every rank, as symmetric windows require),
    /// `None` for one that does not. One read of the table (the common case: empty).
    pub(crate) fn find<const N: usize>(
        &self,
        world: usize,
        ranges: [(u64, usize); N],
    ) -> [Option<[u64; MAX_RANKS]>; N] {
        let Ok(windows) = self.table.read() else {
            return [None; N];
        };
        if windows.is_empty() {
            return [None; N];
        }
        ranges.map(|(ptr, bytes)| {
            let w = windows
                .iter()
                .find(|w| ptr >= w.base && ptr + bytes as u64 <= w.base + w.len as u64)?;
            let off = ptr - w.base;
            let mut at = [0u64; MAX_RANKS];
            for (a, p) in at.iter_mut().zip(&w.peers).take(world) {
                *a = p + off;
            }
            Some(at)
        })
    }
}

/// A buffer registered on every rank: this rank's range, and where every rank's registered
/// buffer is as this GPU addresses it.
struct Window {
    id: u64,
    base: u64,
    len: usize,
    /// Rank r's buffer as this GPU addresses it (this rank's: `base`).
    peers: [u64; MAX_RANKS],
    /// Process per GPU: the peers' buffers mapped by the peer layer, held while registered.
    _mappings: Vec<PeerRegion>,
}

/// One registered buffer on one rank, from [`Communicator::register`] or
/// [`Communicator::register_all`]; [`Communicator::deregister`] ends it. Dropping it does not:
/// the registration lasts until deregistered or until the communicator is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    id: u64,
    rank: usize,
    ptr: u64,
    len: usize,
}

impl Registration {
    /// The registered buffer's device address on its rank.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len
    }
}

/// What [`Communicator::deregister`] knows of the calls that may still use a window: the
/// calls whose plans read or write the peers' registered buffers (the direct algorithm and
/// the copy engines; below the LL threshold, and on unregistered buffers, calls record
/// nothing). Calls on
/// one communicator run in order on the GPU (its documented rule), so the end of the last such
/// call is the end of them all: one event, recorded on the caller's stream after each, marks it.
pub(crate) struct WindowCalls {
    /// Recorded after the last eager call that used a window.
    done: p2p_mem::Event,
    /// A call that used a window was captured into a graph (its replays are not recorded here),
    /// or its event could not be recorded: from then on deregister waits for the whole GPU.
    untracked: AtomicBool,
}

impl WindowCalls {
    fn new(device: &Device) -> Result<WindowCalls> {
        Ok(WindowCalls {
            done: p2p_mem::Event::new(device)?,
            untracked: AtomicBool::new(false),
        })
    }

    /// After a call that used a window was queued on `stream`: its end is now the one to wait
    /// for. Never fails the call (it is queued): what cannot be recorded makes deregister wait
    /// for the whole GPU instead.
    pub(crate) fn queued(&self, rank: usize, stream: &Stream) {
        let recorded = match stream.is_capturing() {
            Ok(false) => self.done.record(stream).map(|()| true),
            Ok(true) => Ok(false),
            Err(e) => Err(e),
        };
        if !matches!(recorded, Ok(true)) && !self.untracked.swap(true, Ordering::Relaxed) {
            let why = match recorded {
                Err(e) => format!("its end could not be recorded ({e})"),
                _ => "it was captured into a graph, whose replays are not tracked".into(),
            };
            tracing::info!(
                rank,
                "a call on registered buffers: {why}; deregister waits for the whole GPU from now on"
            );
        }
    }
}

impl Communicator {
    /// Registers `buf`, this rank's part of a symmetric window, for a communicator with one
    /// process per GPU: every rank calls it, in the same order, with a buffer of the same size.
    /// Returns once every rank has registered and mapped every other rank's buffer (through
    /// CUDA IPC). Afterwards, calls whose input or output lies in the window at the same offset
    /// on every rank read and write the peers' buffers directly, with no staging copy
    /// ([`Access`](crate::Access)); calls on other buffers keep going through the scratch.
    ///
    /// The buffer must come from `cuMemAlloc` (a [`DeviceBuffer`](p2p_mem::DeviceBuffer), `cudaMalloc`, PyTorch's
    /// caching allocator); memory from a stream-ordered pool (cudarc's `CudaSlice`) or cuMem
    /// VMM is refused with the reason, on every rank.
    ///
    /// # Safety
    /// Peers' kernels write into and read from `buf` for as long as it is registered: it must
    /// stay allocated until [`deregister`](Self::deregister) (or this communicator's drop) on
    /// every rank, and calls that use the window must use the same offsets on every rank, as
    /// with NCCL's symmetric windows (`P2P_CHECK=1` checks the calls, not the offsets).
    ///
    /// ```no_run
    /// # use p2p_collective::{Collectives, Communicator, DataType, RedOp};
    /// # use p2p_mem::{DeviceBuffer, Stream};
    /// let comm = Communicator::from_env()?;
    /// let stream = Stream::new(comm.device())?;
    /// let mut grads = DeviceBuffer::<f32>::zeroed(comm.device(), 1 << 24)?;
    /// // SAFETY: `grads` outlives the registration (deregistered below, on every rank).
    /// let reg = unsafe { comm.register(&grads)? };
    /// comm.all_reduce_in_place(&mut grads, 1 << 24, DataType::F32, RedOp::Sum, &stream)?;
    /// comm.synchronize(&stream)?;
    /// comm.deregister(reg)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[allow(unsafe_code)] // an unsafe contract (the buffer's lifetime); no unsafe inside
    pub unsafe fn register(&self, buf: &dyn DeviceMemory) -> Result<Registration> {
        let op = "register";
        self.health.usable(op, self.rank)?;
        let Some(group) = self.job.as_ref().map(|j| &j.group) else {
            return Err(Error::InvalidArgument {
                op,
                rank: self.rank,
                what: "this communicator drives every GPU of its process (init_all): register every rank's buffer at once with Communicator::register_all".into(),
            });
        };
        // Every rank learns every rank's outcome, so a refusal on one fails all of them at once
        // (nobody waits for a peer that gave up).
        let mine = self
            .check_registrable(buf)
            .and_then(|()| Ok(peer::export_memory(buf)?));
        let blob = match &mine {
            Ok(h) => exchange::Registration::Exported {
                len: buf.byte_len() as u64,
                header: h.header.clone(),
            },
            Err(e) => exchange::Registration::Refused(e.to_string()),
        }
        .encode();
        let all = group.all_gather(&blob)?;
        mine?;
        let fail = |why: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what: why,
        };
        let mut peers = [0u64; MAX_RANKS];
        let mut mappings = Vec::new();
        for (r, b) in all.iter().enumerate() {
            match exchange::Registration::decode(b) {
                Some(exchange::Registration::Exported { len, header }) => {
                    if len != buf.byte_len() as u64 {
                        return Err(fail(format!(
                            "rank {r} registered {len} bytes, this rank {}: every rank registers a buffer of the same size",
                            buf.byte_len()
                        )));
                    }
                    if r == self.rank {
                        peers[r] = buf.device_ptr();
                        continue;
                    }
                    let handle = peer::Exported { header, fd: None };
                    let imported = peer::import(&self.device, Sharing::LegacyIpc, r, handle)?;
                    peers[r] = imported.device_ptr();
                    mappings.push(imported);
                }
                Some(exchange::Registration::Refused(why)) => {
                    return Err(fail(format!(
                        "rank {r} could not register its buffer: {why}"
                    )))
                }
                None => return Err(fail(format!("rank {r} sent a malformed registration"))),
            }
        }
        Ok(self.add_window(buf, peers, mappings))
    }

    /// Registers one buffer per rank for the communicators of one process (made by
    /// [`init_all`](Self::init_all)): `bufs[r]` on `comms[r]` (communicators or references to
    /// them, in rank order), all the same size. The counterpart of [`register`](Self::register)
    /// for one process driving every GPU; returns one registration per rank.
    ///
    /// ```no_run
    /// use p2p_collective::{Collectives, Communicator, DataType, RedOp};
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Stream};
    ///
    /// let gpus = Device::all()?;
    /// let comms = Communicator::init_all(&gpus)?;
    /// let streams = gpus.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
    /// let n = 64 << 20;
    /// let mut grads = gpus
    ///     .iter()
    ///     .map(|g| DeviceBuffer::<f32>::zeroed(g, n))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let views: Vec<&dyn DeviceMemory> = grads.iter().map(|b| b as &dyn DeviceMemory).collect();
    /// // SAFETY: `grads` outlives the registrations (deregistered below, before it is dropped).
    /// let regs = unsafe { Communicator::register_all(&comms, &views)? };
    /// for ((comm, buf), stream) in comms.iter().zip(&mut grads).zip(&streams) {
    ///     comm.all_reduce_in_place(buf, n, DataType::F32, RedOp::Sum, stream)?;
    /// }
    /// for ((comm, stream), reg) in comms.iter().zip(&streams).zip(regs) {
    ///     comm.synchronize(stream)?;
    ///     comm.deregister(reg)?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// As for [`register`](Self::register): every buffer must stay allocated until it is
    /// deregistered on its rank (or the communicators are dropped).
    #[allow(unsafe_code)] // an unsafe contract (the buffers' lifetime); no unsafe inside
    pub unsafe fn register_all<C: std::borrow::Borrow<Communicator>>(
        comms: &[C],
        bufs: &[&dyn DeviceMemory],
    ) -> Result<Vec<Registration>> {
        let op = "register_all";
        let bad = |rank, what: String| Error::InvalidArgument { op, rank, what };
        let comms: Vec<&Communicator> = comms.iter().map(|c| c.borrow()).collect();
        let Some(first) = comms.first().copied() else {
            return Err(bad(0, "no communicators given".into()));
        };
        if comms.len() != first.world || bufs.len() != comms.len() {
            return Err(bad(
                0,
                format!(
                    "give every rank of the communicator ({}) and one buffer each: got {} communicators and {} buffers",
                    first.world,
                    comms.len(),
                    bufs.len()
                ),
            ));
        }
        let mut peers = [0u64; MAX_RANKS];
        for (r, (c, b)) in comms.iter().zip(bufs).enumerate() {
            if c.rank != r || c.job.is_some() || c.workspace.bases != first.workspace.bases {
                return Err(bad(
                    r,
                    "comms must be the communicators of one init_all, in rank order".into(),
                ));
            }
            c.health.usable(op, r)?;
            c.check_registrable(*b)?;
            if b.byte_len() != bufs[0].byte_len() {
                return Err(bad(
                    r,
                    format!(
                        "rank {r}'s buffer holds {} bytes, rank 0's {}: every rank registers a buffer of the same size",
                        b.byte_len(),
                        bufs[0].byte_len()
                    ),
                ));
            }
            peers[r] = b.device_ptr();
        }
        Ok(comms
            .iter()
            .zip(bufs)
            .map(|(c, b)| c.add_window(*b, peers, Vec::new()))
            .collect())
    }

    /// Ends a registration: waits for this rank's calls that may still use the window to
    /// finish, then forgets the window and unmaps the peers' buffers. Do it on every rank
    /// before the next call on that buffer, and before freeing it.
    ///
    /// The calls waited for are this rank's calls on registered buffers queued before, on
    /// whichever streams (those that read or write the peers' buffers: the direct and
    /// copy-engine plans); other work on the GPU is not waited for. Once a call on registered
    /// buffers was captured into a CUDA graph, whose replays cannot be told apart, the wait is
    /// for everything queued on the GPU instead. The wait has the limit of
    /// [`synchronize`](Self::synchronize) (the communicator's time limit plus [`SYNC_GRACE`]):
    /// past it, [`Error::StillInUse`], and the buffer stays registered (nothing was stopped:
    /// deregister again once the work has ended, or abort the communicator). In a communicator
    /// of one process per GPU, unmapping the peers' buffers then waits for the GPU as every
    /// mapping's `Drop` does (at most [`p2p_mem::DROP_WAIT`], polling; past it the mapping is
    /// left open, with an error logged, rather than pulled from under running work).
    pub fn deregister(&self, reg: Registration) -> Result<()> {
        if reg.rank != self.rank {
            return Err(Error::InvalidArgument {
                op: "deregister",
                rank: self.rank,
                what: format!("that registration belongs to rank {}", reg.rank),
            });
        }
        self.wait_windows_unused()?;
        let removed = {
            let mut windows = self
                .windows
                .table
                .write()
                .map_err(|_| Error::InvalidArgument {
                    op: "deregister",
                    rank: self.rank,
                    what: "the registration table's lock is poisoned".into(),
                })?;
            windows
                .iter()
                .position(|w| w.id == reg.id)
                .map(|i| windows.remove(i))
        };
        match removed {
            // Unmapped here, outside the table's lock: the mappings' own wait for the GPU
            // never holds up another thread's calls.
            Some(window) => {
                drop(window);
                Ok(())
            }
            None => Err(Error::InvalidArgument {
                op: "deregister",
                rank: self.rank,
                what: format!(
                    "{} bytes at {:#x} are not registered (deregistered twice?)",
                    reg.len, reg.ptr
                ),
            }),
        }
    }

    /// Waits, at most the limit of [`synchronize`](Self::synchronize), until no call queued so
    /// far on this rank can still use a window (see [`deregister`](Self::deregister)).
    fn wait_windows_unused(&self) -> Result<()> {
        let limit = self.options.timeout.saturating_add(SYNC_GRACE);
        let calls = &self.windows.calls;
        let whole_gpu = calls.untracked.load(Ordering::Relaxed);
        let t = Instant::now();
        let idle = if whole_gpu {
            self.device.synchronize_within(limit)?
        } else {
            calls.done.synchronize_within(limit)?
        };
        tracing::debug!(
            rank = self.rank,
            "deregister: {} {} after {:?}",
            if whole_gpu {
                "the whole GPU (a call on registered buffers was captured into a graph, or its end was not recorded)"
            } else {
                "the last call on registered buffers"
            },
            if idle { "done" } else { "still running" },
            t.elapsed()
        );
        if idle {
            return Ok(());
        }
        Err(Error::StillInUse {
            rank: self.rank,
            device: self.device.ordinal(),
            waited: limit,
            waited_for: if whole_gpu {
                "the work queued on its GPU (a call on registered buffers was captured into a graph, whose replays are not tracked, or its end was not recorded)"
            } else {
                "its last call on registered buffers (or the work queued before it on that call's stream)"
            },
        })
    }

    /// Checks one rank's buffer before registering it.
    fn check_registrable(&self, buf: &dyn DeviceMemory) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument {
            op: "register",
            rank: self.rank,
            what,
        };
        if buf.device() != &self.device {
            return Err(bad(format!(
                "the buffer is on GPU {}, this rank's GPU is {}",
                buf.device().ordinal(),
                self.device.ordinal()
            )));
        }
        if !self.sharing.is_p2p() {
            return Err(bad(format!(
                "registered buffers are read and written across the link, and this communicator's ranks have no P2P between them (they reach each other {}): unregistered buffers work, through host memory",
                self.sharing.name()
            )));
        }
        check_peer_mappable(buf).map_err(|e| bad(e.to_string()))?;
        let (lo, hi) = (buf.device_ptr(), buf.device_ptr() + buf.byte_len() as u64);
        let windows = self
            .windows
            .table
            .read()
            .map_err(|_| bad("the registration table's lock is poisoned".into()))?;
        if let Some(w) = windows
            .iter()
            .find(|w| lo < w.base + w.len as u64 && w.base < hi)
        {
            return Err(bad(format!(
                "{} bytes at {lo:#x} overlap a registered buffer ({} bytes at {:#x}): deregister it first",
                buf.byte_len(),
                w.len,
                w.base
            )));
        }
        Ok(())
    }

    fn add_window(
        &self,
        buf: &dyn DeviceMemory,
        peers: [u64; MAX_RANKS],
        mappings: Vec<PeerRegion>,
    ) -> Registration {
        // Unique in the process, not only in this communicator, so that `deregister` never takes
        // another communicator's registration for one of its own.
        static NEXT_WINDOW: AtomicU64 = AtomicU64::new(0);
        let id = NEXT_WINDOW.fetch_add(1, Ordering::Relaxed);
        let reg = Registration {
            id,
            rank: self.rank,
            ptr: buf.device_ptr(),
            len: buf.byte_len(),
        };
        tracing::info!(
            rank = self.rank,
            "registered {} bytes at {:#x}: calls on them read and write the peers' buffers directly",
            reg.len,
            reg.ptr
        );
        if let Ok(mut w) = self.windows.table.write() {
            w.push(Window {
                id,
                base: reg.ptr,
                len: reg.len,
                peers,
                _mappings: mappings,
            });
        }
        reg
    }
}
