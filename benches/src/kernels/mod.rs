//! The tools' own CUDA C++ kernels (the doctor's functional probe, the latency ping-pong);
//! compiled and launched through `p2p_mem::kernel`.

use p2p_mem::kernel::Source;

/// The doctor's functional test: `p2p_fill` and `p2p_copy` with 16-byte vector accesses.
pub const PROBE: Source = Source {
    name: "probe.cu",
    code: include_str!("probe.cu"),
    defines: &[],
};

/// The latency ping-pong: `p2p_pingpong`, flag stores through the peer mapping.
pub const LATENCY: Source = Source {
    name: "latency.cu",
    code: include_str!("latency.cu"),
    defines: &[],
};

/// Every kernel source of the tools (CI compiles each for sm_80 and sm_90).
pub const SOURCES: [Source; 3] = [PROBE, LATENCY, crate::floor::EMPTY];

/// The host's copy of `p2p_pattern` in `probe.cu`, for checking what the kernel wrote.
pub fn probe_pattern(i: u64, seed: u32) -> [u32; 4] {
    let v = seed ^ (i.wrapping_mul(2_654_435_761) as u32);
    [v, v.wrapping_add(1), v ^ 0x5a5a_5a5a, !v]
}
