//! The figures measured on the default reference machine, shown beside its plans.

use std::sync::OnceLock;

use serde::Serialize;

/// One call's figures on the reference machine: p2p on plain and on registered buffers and
/// NCCL's fastest mode, out of place, f32, the median time of a call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measured {
    /// `graph` (a CUDA graph's replay, up to 64 MiB) or `eager`.
    pub timing: &'static str,
    /// p2p on plain buffers, us.
    pub ours_us: f64,
    /// p2p on registered buffers, us (where measured).
    pub ours_registered_us: Option<f64>,
    /// NCCL's fastest mode, us.
    pub nccl_best_us: f64,
    /// Which mode that was (`plain`, `symmetric`, `copy_engine`).
    pub nccl_best_mode: &'static str,
}

/// One measured call: the collective, its size and the figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The collective (`all_reduce`, ...).
    pub op: &'static str,
    /// Bytes, as `p2p-bench coll` counts them.
    pub bytes: usize,
    /// The figures.
    pub figures: Measured,
}

/// `p2p-bench coll` on 4 x H200 behind an NVSwitch beside NCCL 2.28.3 (the file's header
/// says where the run lies).
const H200X4: &str = include_str!("h200x4.csv");

/// The default reference machine's samples (parsed once).
pub fn h200x4() -> &'static [Sample] {
    static ROWS: OnceLock<Vec<Sample>> = OnceLock::new();
    ROWS.get_or_init(|| parse(H200X4))
}

/// The built-in file's text (its tests count its lines).
#[cfg(test)]
pub(super) fn h200x4_text() -> &'static str {
    H200X4
}

/// The figures of `op` at `bytes` among `samples`.
pub fn find(samples: &[Sample], op: &str, bytes: usize) -> Option<Measured> {
    samples
        .iter()
        .find(|s| s.op == op && s.bytes == bytes)
        .map(|s| s.figures)
}

/// The samples of a file in `h200x4.csv`'s format: `#` comments, a header, then `op, bytes,
/// timing, ours_us, ours_registered_us, nccl_best_us, nccl_best_mode` (an empty
/// `ours_registered_us` where that was not measured). A line that does not parse is left out
/// (the built-in file's lines all parse: a test says so).
pub(super) fn parse(text: &'static str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("op,") && !l.is_empty())
        .filter_map(|l| {
            let f: Vec<&'static str> = l.split(',').collect();
            let [op, bytes, timing, ours, reg, nccl, mode] = f[..] else {
                return None;
            };
            Some(Sample {
                op,
                bytes: bytes.parse().ok()?,
                figures: Measured {
                    timing,
                    ours_us: ours.parse().ok()?,
                    ours_registered_us: reg.parse().ok(),
                    nccl_best_us: nccl.parse().ok()?,
                    nccl_best_mode: mode,
                },
            })
        })
        .collect()
}
