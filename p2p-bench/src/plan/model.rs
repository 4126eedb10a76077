//! The plan view's cost model: what a plan should take on a machine, from the bytes it moves
//! over the links, the bytes it copies on the GPU, and its barrier steps (docs/performance.md,
//! "The plan view's model"). A first-order model, written down so that a plan can be held
//! against what was measured: it ignores contention inside a GPU, the blocks' drift and the
//! host's cost of a launch.

use p2p_collective::plan::{Algo, Plan, Proto};
use p2p_collective::Op;
use p2p_transport::topo::Topology;

/// What the model reads of a machine and its world.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Rates {
    /// Ranks.
    pub world: usize,
    /// GB/s one GPU can send to all its peers at once, the fewest of any rank: the links' raw
    /// rate times [`LINK_EFFICIENCY`].
    pub links_gbps: f64,
}

/// The share of the links' raw rate that a copy reaches: NCCL's ring reaches 370 GB/s of the
/// 478 an H200's 18 NVLinks carry (4 x H200 behind an NVSwitch).
pub const LINK_EFFICIENCY: f64 = 0.77;

/// GB/s of a GPU's own memory traffic (read and written bytes counted), H200's HBM3e at a copy.
pub const LOCAL_GBPS: f64 = 2500.0;

/// Microseconds of a call that moves nothing: the kernel's start and one signal's crossing
/// (the 8 B all-reduce measured 2.7 us under graph replay on 4 x H200).
pub const START_US: f64 = 2.5;

/// Microseconds the copy engines add: the two barrier kernels around the copies and the
/// engines' start.
pub const COPY_ENGINE_US: f64 = 10.0;

/// Microseconds of one barrier step over `world` ranks (2 on 4 ranks, 3 on 8).
pub fn barrier_us(world: usize) -> f64 {
    1.0 + world as f64 / 4.0
}

impl Rates {
    /// The rates of the first `world` GPUs of `t`; `None` with one rank (nothing crosses) or
    /// a pair the topology gives no bandwidth.
    pub fn of(t: &Topology, world: usize) -> Option<Rates> {
        if world < 2 {
            return None;
        }
        let paths = t.paths();
        let out_of = |i: usize| -> f64 {
            paths
                .iter()
                .filter(|p| p.from == i && p.to < world)
                .map(|p| p.concurrent_gbps.max(0.0))
                .sum()
        };
        let raw = (0..world).map(out_of).fold(f64::INFINITY, f64::min);
        (raw.is_finite() && raw > 0.0).then_some(Rates {
            world,
            links_gbps: raw * LINK_EFFICIENCY,
        })
    }
}

/// The bytes of one call as the model counts them, for the busiest rank: over its links (the
/// busier direction) and through its own memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Bytes that cross the rank's links one way.
    pub wire: f64,
    /// Bytes read and written in the rank's own memory.
    pub local: f64,
}

/// What `plan` moves for a call of `bytes` (the whole buffer, as `p2p-bench coll` and
/// nccl-tests count them: all the parts of all-gather, reduce-scatter and all-to-all) on
/// `world` ranks.
pub fn traffic(plan: &Plan, bytes: usize, world: usize) -> Traffic {
    let n = world as f64;
    let f = (n - 1.0) / n;
    let s = bytes as f64;
    let (wire, local) = match (plan.op, plan.algo) {
        // Each rank pushes everything to every peer, then reduces n inputs into one output.
        (Op::AllReduce, Algo::OneShot | Algo::Pipe) => ((n - 1.0) * s, (n + 1.0) * s),
        // A reduce-scatter then an all-gather, 2(n-1)/n of the data, the parts copied out.
        (Op::AllReduce, Algo::TwoShot) => (2.0 * f * s, 2.0 * f * s + (n + 1.0) * s / n),
        (Op::AllReduce, Algo::Ring) => (2.0 * f * s, 3.0 * f * s),
        // Writes only, straight into the outputs: no copy out.
        (Op::AllReduce, Algo::Push | Algo::Direct | Algo::Relay) => {
            (2.0 * f * s, (n + 1.0) * s / n)
        }
        // The root's links carry the whole buffer to (or from) every peer.
        (Op::Broadcast | Op::Reduce, Algo::OneShot | Algo::Direct) => ((n - 1.0) * s, 2.0 * s),
        // As the split, with no copy out of the scratch: the parts land in the outputs.
        (Op::Broadcast | Op::Reduce, Algo::SplitOut) => (2.0 * s, s),
        // Every rank's links carry the buffer about once each way, the second hop of chunk c
        // (the non-roots' forwards, or their reduced parts) under the first of chunk c + 1: one
        // chunk's second hop is left in the open.
        (Op::Broadcast | Op::Reduce, Algo::Relay) => {
            ((1.0 + 1.0 / plan.chunks.max(1) as f64) * s, s)
        }
        // The root sends each part once; the non-roots forward; the root copies out.
        (Op::Broadcast | Op::Reduce, _) => (2.0 * s, 2.0 * s),
        // Each rank's part to every peer (or part q to rank q), then copied out or reduced.
        (Op::ReduceScatter, _) => (f * s, (n + 1.0) * s / n),
        _ => (f * s, 2.0 * f * s),
    };
    // LL lines carry 8 data bytes in 16.
    let wire = if plan.proto == Proto::Ll {
        2.0 * wire
    } else {
        wire
    };
    Traffic { wire, local }
}

/// The modelled microseconds of `plan` for a call of `bytes` (as [`traffic`] counts them).
pub fn modelled_us(plan: &Plan, bytes: usize, rates: Rates) -> f64 {
    let Traffic { wire, local } = traffic(plan, bytes, rates.world);
    // GB/s is bytes per nanosecond: bytes / (GB/s) / 1000 is microseconds.
    let wire_us = wire / rates.links_gbps / 1000.0;
    let local_us = local / LOCAL_GBPS / 1000.0;
    // The relay's flags travel under its data: only its first and last (the broadcast's
    // opening barrier, the closing flags) are waited for in the open.
    let steps = if plan.algo == Algo::Relay {
        2.0
    } else {
        plan.steps(rates.world) as f64
    };
    match plan.proto {
        // The data carries its own flags: no barrier, one crossing.
        Proto::Ll => START_US + wire_us + local_us,
        Proto::CopyEngine => COPY_ENGINE_US + wire_us + local_us,
        Proto::Simple => {
            let moved = if plan.overlap {
                // The longer of the link and memory stages, the other hidden but for one
                // chunk's worth.
                let c = plan.chunks.max(1) as f64;
                wire_us.max(local_us) + wire_us.min(local_us) / c
            } else {
                wire_us + local_us
            };
            START_US + steps * barrier_us(rates.world) + moved
        }
    }
}
