//! Point-to-point transport between GPUs: the third layer of p2p, above `p2p-mem`.
//!
//! - [`topo`]: how the GPUs of a machine are joined ([`topo::Topology`], serializable to JSON),
//!   discovered from CUDA, NVML and sysfs, and the path model for every ordered pair.
//! - [`config`]: the typed [`Config`](config::Config), in code or from `P2P_*` variables.
//! - [`mode`]: the route (mode, read or write, engine) for every ordered pair of ranks, each
//!   choice logged with its reason.
//! - [`copy`]: the data paths within a process (copy engine, SM write and read, host-staged,
//!   relay) and [`Transport::copy_peer`], which follows mode selection.
//! - `conn` (only with the `conn` feature, for p2p's tools and tests): the transport's own
//!   send / recv channel through slot buffers, in one process or between two (legacy IPC,
//!   cuMem fds, fabric handles), with no hangs. Applications send and receive through
//!   `p2p-collective`'s communicators, the one public send/recv.
//! - [`peer`]: one way to reach a peer's memory (plain pointer, legacy IPC, cuMem fd, fabric,
//!   host-staged), chosen from the configuration and each pair's P2P; used by the
//!   communicators of `p2p-collective` (and by `conn`).
//! - [`kernels`]: the CUDA C++ sources, shipped compiled for sm_80 and sm_90 (else compiled by
//!   NVRTC for the device's architecture at first use).
//!
//! ```no_run
//! use p2p_mem::{Device, DeviceBuffer, Stream};
//! use p2p_transport::Transport;
//!
//! // Copy 4 MiB from GPU 0 to GPU 1 by whatever route mode selection picks for the pair
//! // (NVLink or PCIe P2P, a relay GPU, or host-staged), queued on a stream of GPU 0.
//! let t = Transport::new(Device::all()?);
//! let (g0, g1) = (t.device(0)?.clone(), t.device(1)?.clone());
//! let src = DeviceBuffer::<f32>::zeroed(&g0, 1 << 20)?;
//! let mut dst = DeviceBuffer::<f32>::new(&g1, 1 << 20)?;
//! let stream = Stream::new(&g0)?;
//! let route = t.copy_peer(&mut dst, &src, &stream)?;
//! println!("{route}"); // e.g. 0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)
//! stream.synchronize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Feature badges on docs.rs (`--cfg docsrs`, nightly); nothing without the cfg.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
#[cfg(feature = "conn")]
pub mod conn;
pub mod context;
pub mod copy;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod kernels;
pub mod launch;
pub mod mode;
pub mod nccl;
pub mod peer;
pub mod rendezvous;
pub mod topo;
mod util;

pub use context::Transport;
pub use error::{Error, PeerFailure, Result};
/// For [`warn_user!`]: `tracing` as the macro's own crate sees it, so that it expands in crates
/// that name `tracing` differently or not at all.
#[doc(hidden)]
pub use tracing as __tracing;
pub use util::{hostname, text_columns};

/// The longest time limit any wait of the transport accepts, and of the layers above (one day):
/// a connection's `timeout` (feature `conn`), a [`rendezvous::Rendezvous`]'s `timeout`
/// (`P2P_RENDEZVOUS_TIMEOUT_MS`). Longer ones are refused: the deadline computed from one could
/// overflow the clock's arithmetic, on the host or in a kernel.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(86_400);
