//! The transport's CUDA C++ kernels; the runtime that compiles, caches and launches them is
//! `p2p_mem::kernel`.
//!
//! Sources live beside this file and are embedded with `include_str!`, so the crate needs no
//! CUDA at build time. Every source is compiled for sm_80 and sm_90 in CI with libnvrtc from
//! PyPI, so a kernel that does not compile fails CI without a GPU (`tests/kernels.rs`).

pub use p2p_mem::kernel::{arch_for, compile, compile_cached, Function, Module, Source};

/// The doctor's functional test: `p2p_fill` and `p2p_copy` with 16-byte vector accesses.
pub const PROBE: Source = Source {
    name: "probe.cu",
    code: include_str!("probe.cu"),
};

/// The SM data path: `p2p_copy_bytes`, 16-byte vectors with a byte tail.
pub const COPY: Source = Source {
    name: "copy.cu",
    code: include_str!("copy.cu"),
};

/// The latency ping-pong: `p2p_pingpong`, flag stores through the peer mapping.
pub const LATENCY: Source = Source {
    name: "latency.cu",
    code: include_str!("latency.cu"),
};

/// Send/recv through slot buffers with ready/freed flags: `p2p_send`, `p2p_recv`.
pub const SENDRECV: Source = Source {
    name: "sendrecv.cu",
    code: include_str!("sendrecv.cu"),
};

/// Every kernel source in the crate (CI compiles each for sm_80 and sm_90).
pub const SOURCES: [Source; 4] = [PROBE, COPY, LATENCY, SENDRECV];

/// The host's copy of `p2p_pattern` in `probe.cu`, for checking what the kernel wrote.
pub fn probe_pattern(i: u64, seed: u32) -> [u32; 4] {
    let v = seed ^ (i.wrapping_mul(2_654_435_761) as u32);
    [v, v.wrapping_add(1), v ^ 0x5a5a_5a5a, !v]
}

/// The compiled send/recv kernels of one device.
pub(crate) struct SrKernels {
    pub(crate) module: Module,
    pub(crate) send: Function,
    pub(crate) recv: Function,
    pub(crate) wait: Function,
}

impl SrKernels {
    pub(crate) fn build(device: &p2p_mem::Device) -> p2p_mem::Result<SrKernels> {
        let module = Module::build(device, &SENDRECV)?;
        let send = module.function("p2p_send")?;
        let recv = module.function("p2p_recv")?;
        let wait = module.function("p2p_wait_flag")?;
        Ok(SrKernels {
            module,
            send,
            recv,
            wait,
        })
    }
}
