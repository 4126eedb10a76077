//! Safe GPU memory for p2p: the second layer, above `p2p-sys`.
//!
//! Everything that owns a GPU resource here frees it on `Drop`, in the right order, also when
//! construction fails half-way. Every error names the CUDA call, the device and (where there is
//! one) the peer.
//!
//! | type | what it is |
//! | --- | --- |
//! | [`Device`] | a GPU and its primary context; name, compute capability, PCI bus id, UUID, SMs |
//! | [`Stream`] | a non-blocking CUDA stream |
//! | [`Event`] | a CUDA event, for ordering across streams and timing |
//! | [`graph::Graph`], [`graph::GraphExec`] | CUDA graphs captured from a stream, replayed with one launch |
//! | [`DeviceBuffer`] | typed `cuMemAlloc` memory with host copies, memset and checked views |
//! | [`PinnedHostBuffer`] | page-locked host memory |
//! | [`P2pAttributes`], [`Device::enable_peer_access`] | peer access within a process |
//! | [`ipc::IpcMemHandle`], [`ipc::ImportedBuffer`], [`ipc::IpcEvent`] | legacy CUDA IPC |
//! | [`vmm::VmmBuffer`] | cuMem allocations shared as POSIX fds or fabric handles |
//! | [`shm::HostShared`] | host memory shared between processes (memfd), registered with CUDA |
//! | [`fdpass`] | fds over a Unix socket (`SCM_RIGHTS`), uid-checked |
//! | [`wire`] | the versioned byte format of every handle |
//! | [`abort::AbortHandle`] | the abort flag every kernel wait polls, and what a failed kernel writes there |
//!
//! ```no_run
//! use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
//! let (g0, g1) = (Device::new(0)?, Device::new(1)?);
//! g1.enable_peer_access(&g0)?;
//! let src = DeviceBuffer::from_host(&g0, &[1u32, 2, 3])?;
//! let mut dst = DeviceBuffer::<u32>::new(&g1, 3)?;
//! dst.copy_from_device(&src)?; // over NVLink where the GPUs have it
//! assert_eq!(dst.to_host_vec::<u32>()?, [1, 2, 3]);
//! # Ok::<(), p2p_mem::Error>(())
//! ```
//!
//! # Threads
//! `Device`, `Stream` and every buffer are `Send` and `Sync`: the driver API is thread-safe and
//! each call binds the device's context to the calling thread first. Shared references only
//! read; anything that writes device memory takes `&mut`.

// Feature badges on docs.rs (`--cfg docsrs`, nightly); nothing without the cfg.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod abort;
#[cfg(feature = "cudarc-0-17")]
pub mod cudarc_0_17;
#[cfg(feature = "cudarc-0-18")]
pub mod cudarc_0_18;
#[cfg(feature = "cudarc")]
pub mod cudarc_interop;
#[cfg(any(feature = "cudarc", feature = "cudarc-0-18", feature = "cudarc-0-17"))]
mod cudarc_views;
mod device;
mod error;
mod event;
pub mod fdpass;
#[doc(hidden)]
pub mod fuzzing;
pub mod graph;
pub mod ipc;
pub mod kernel;
mod memory;
mod peer_access;
pub mod shm;
mod sync_copy;
pub mod vmm;
mod wait;
pub mod wire;

pub use device::{format_uuid, Device, DeviceCopy, Stream};
pub use error::{Error, Result};
pub use event::Event;
pub use graph::{Graph, GraphExec};
pub use memory::{
    check_stream, copy_async, memset_async, write_u64_async, DeviceBuffer, DeviceMemory,
    DeviceMemoryMut, DeviceView, DeviceViewMut, ElementType, ExternalMemory, PinnedHostBuffer,
};
pub use peer_access::{check_peer_mappable, P2pAttributes};
pub use wait::in_thread_within;

/// How far past a wait's own time limit a host wait on a stream of ours goes
/// ([`Stream::synchronize_within`]): our kernels end by their time limit, an aborted one within
/// milliseconds, so a stream still busy after this holds other work. The communicators'
/// `synchronize` and the connections' waits use it.
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a synchronous operation of this crate with no limit of its own waits for the GPU
/// work it must follow, and then for itself, before it gives up with [`Error::Busy`]: the
/// synchronous copies and fills ([`DeviceMemory::copy_to_host`],
/// [`DeviceMemoryMut::copy_from_host`], [`DeviceMemoryMut::memset_u8`],
/// [`DeviceMemoryMut::copy_from_device`], ...) and an IPC event's `synchronize`. Long, since
/// that work is the caller's: the limit is there so that a kernel that never ends is an error,
/// not a hang. [`DeviceMemory::copy_range_to_host_within`] and the `synchronize_within`
/// methods take a limit of their own.
pub const HOST_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a `Drop` that frees GPU memory waits for the device to finish work that may still
/// use it ([`Device::synchronize_within`]); past it the memory is leaked (with an error log),
/// never freed under a running kernel. Our kernels all end within their own time limit.
pub const DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
