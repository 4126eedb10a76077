//! Collectives over the p2p transport: communicators and our own CUDA kernels.
//!
//! **Status: not yet built.** This crate is the top layer of p2p and uses only
//! `p2p-transport` below it. It will hold communicators (one process driving several GPUs, or
//! one process per GPU) and broadcast, reduce, all-reduce, all-gather, reduce-scatter and
//! all-to-all. Nothing is exported yet.

#![forbid(unsafe_code)]

pub use p2p_transport;
