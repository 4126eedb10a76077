//! Point-to-point transport between GPUs: topology, configuration, mode selection and send/recv.
//!
//! **Status: not yet built.** This crate is the third layer of p2p and uses only `p2p-mem`
//! below it. It will hold topology discovery (NVML, PCIe, P2P attributes), the typed `Config`,
//! the choice between the direct-pointer, CUDA IPC, cuMem, intermediate-GPU and host-staged
//! modes, the copy-engine and SM-kernel data paths, and `send` / `recv` between ranks.
//! Nothing is exported yet; the memory it will move is already available from [`p2p_mem`].

#![forbid(unsafe_code)]

pub use p2p_mem;
