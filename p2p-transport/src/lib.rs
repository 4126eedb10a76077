//! Point-to-point transport between GPUs: the third layer of p2p, above `p2p-mem`.
//!
//! Built so far:
//! - [`topo`]: how the GPUs of a machine are joined ([`topo::Topology`], serializable to JSON),
//!   discovered from CUDA, NVML and sysfs, and the path model for every ordered pair.
//! - [`config`]: the typed [`Config`](config::Config), in code or from `P2P_*` variables.
//! - [`doctor`]: whether P2P works between each pair, why not, and what to do, with a
//!   functional test through the peer mapping.
//! - [`kernels`]: CUDA C++ sources compiled by NVRTC for the device's architecture at run time.
//!
//! Mode selection (direct pointer, IPC, cuMem, intermediate GPU, host-staged), the copy-engine
//! and SM-kernel data paths, and `send` / `recv` between ranks are not built yet.

pub mod config;
pub mod conn;
pub mod copy;
pub mod doctor;
mod error;
pub mod kernels;
pub mod latency;
pub mod mode;
pub mod topo;
mod util;

pub use error::{Error, Result};
pub use util::{utc_from_unix, utc_now};
