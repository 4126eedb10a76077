//! Helpers shared by the transport's GPU tests.
#![allow(dead_code)]

use p2p_mem::Device;

/// All visible GPUs, or a panic naming how many the test needs: a GPU test that finds too few
/// GPUs fails, it never passes vacuously.
pub fn gpus(n: usize) -> Vec<Device> {
    let all = Device::all().unwrap_or_else(|e| panic!("this test needs {n} GPU(s): {e}"));
    assert!(
        all.len() >= n,
        "this test needs {n} GPU(s), found {}",
        all.len()
    );
    all
}

/// `n` pseudo-random bytes (xorshift64), different for every seed.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A seed that differs between runs (printed, so a failure can be replayed).
pub fn seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    eprintln!("seed = {s}");
    s
}
