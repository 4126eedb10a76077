//! Collectives over the p2p transport: communicators and our own CUDA kernels.
//!
//! The top layer of p2p. A [`Communicator`] is one rank: made for every GPU of this process
//! at once ([`Communicator::init_all`]), or one per process ([`Communicator::from_env`], with
//! the environment torchrun or `p2p-bench launch` sets). Its calls are NCCL's:
//! broadcast, reduce, all-reduce, all-gather, reduce-scatter and all-to-all, over
//! f32, f64, f16, bf16, i32, i64 and u8, with sum, prod, min, max and avg, in place or out of
//! place, asynchronous on a CUDA stream and capturable in a CUDA graph.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`comm`] | communicators, the calls, [`Options`] (`P2P_ALGO`, `P2P_CHECK`, `P2P_TIMEOUT_MS`) |
//! | [`plan`] | which algorithm, how many blocks, how the data is cut (host-side, tested in CI) |
//! | [`types`] | [`DataType`], [`RedOp`], [`Op`] |
//! | [`bootstrap`] | the TCP rendezvous of process-per-GPU communicators |
//! | [`launch`](mod@launch) | starting N local ranks with the rendezvous environment |
//! | [`verify`] | nccl-tests style exact inputs and the element-by-element checker |
//!
//! How the kernels work (`src/kernels/coll.cu`): every rank registers a workspace that its
//! peers write into directly; each step of a call pushes data into peers' scratch, then
//! exchanges per-block flags carrying monotonic step counters kept on the GPU (so a call
//! captured in a graph replays correctly), then reduces in rank order (every rank gets
//! bitwise-identical results; f16 and bf16 accumulate in f32). All-reduce runs one-shot,
//! two-shot or ring. Small calls of every collective run LL (flags inside the data: one
//! crossing, no fence); large broadcasts and reduces on more than two ranks split the data
//! among the non-roots. Buffers registered on every rank ([`Communicator::register`],
//! [`Communicator::register_all`]) are read and written by the peers directly, with no staging
//! through the scratch and one barrier at each end of the call instead of one per chunk. Every
//! wait polls an abort flag and has a time limit, so a missing peer is an error, not a hang.

#![deny(unsafe_code)]

pub mod bootstrap;
pub mod comm;
mod error;
pub mod launch;
pub mod plan;
pub mod types;
pub mod verify;

pub use comm::{Call, Communicator, Options, Registration};
pub use error::{Error, Result};
pub use p2p_transport;
pub use p2p_transport::config::Algorithm;
pub use plan::Access;
pub use types::{DataType, Element, Op, RedOp};
